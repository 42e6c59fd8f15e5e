-- A memory timeline of one training step, plain and with recompute_grad,
-- as a Chrome trace: open the file in https://ui.perfetto.dev (or
-- chrome://tracing) to see tensor/saved/variable bytes over time, and the
-- forward, backward and recompute phases.
--   build/moongrad examples/memory_timeline.lua [out.json]
local mg = mg or require "moongrad"

local path = arg and arg[1] or "memory_timeline.json"
local B, W, N = 1024, 256, 8

mg.random.seed(1)
local blocks = {}
for i = 1, N do          -- MLP blocks: W -> 4W -> W, as in a transformer
  blocks[i] = mg.nn.Sequential{mg.nn.Dense(4 * W, {activation = "tanh"}),
                               mg.nn.Dense(W, {activation = "tanh"})}
end
local x = mg.random.normal{B, W}
local model = mg.nn.Sequential(blocks)
model(x)                                                    -- build

local function step (wrap)
  local t = mg.tape()
  local h = x
  for _, b in ipairs(blocks) do h = wrap(b)(h) end
  local loss = mg.mean(h ^ 2)
  t:stop()
  local grads = t:gradient(loss, model.trainable_variables)
  for i, v in ipairs(model.trainable_variables) do v:assign_sub(grads[i] * 0.01) end
end

local peaks = {}
local function measured (name, wrap)
  return function()
    collectgarbage()
    mg.memory.reset_peak()
    local base = mg.memory.stats().current_bytes
    mg.memory.span(name, step, wrap)
    collectgarbage()
    local s = mg.memory.stats()
    peaks[name] = {total = s.peak_bytes - base, saved = s.peak_saved_bytes}
  end
end

local old = mg.memory.setpause(100, 0)                      -- exact peaks (slower)
local ok, err = mg.memory.trace(path, function()
  measured("plain step", function(b) return b end)()
  measured("recompute step", mg.recompute_grad)()
  return true
end)
mg.memory.setpause(old)
if not ok then error(err) end
print(("wrote %s"):format(path))
local p, r = peaks["plain step"], peaks["recompute step"]
print(("peak held by tapes: plain %.1f MiB, recompute %.1f MiB (%.1fx less)"):format(
  p.saved / 2^20, r.saved / 2^20, p.saved / r.saved))
print(("peak above the model, gradients included: plain %.1f MiB, recompute %.1f MiB (%.1fx less)"):format(
  p.total / 2^20, r.total / 2^20, p.total / r.total))

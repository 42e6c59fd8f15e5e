-- bench/policies.lua: recompute_grad's save policies on a chain of MLP
-- blocks (W -> 4W -> W, tanh), or of GPT blocks (pre-norm TransformerBlock,
-- causal, 4 heads): step time, bytes held by the tapes after the forward, and
-- the peak above the start, against the plain tape.
--   build/moongrad bench/policies.lua [width] [batch] [blocks] [repeats]
--   build/moongrad bench/policies.lua gpt [width] [batch] [blocks] [repeats]   (context 64)
local mg = mg or require "moongrad"

local gpt = arg and arg[1] == "gpt"
local a = gpt and 1 or 0
local W = tonumber(arg and arg[1 + a]) or (gpt and 256 or 512)
local B = tonumber(arg and arg[2 + a]) or (gpt and 32 or 512)
local N = tonumber(arg and arg[3 + a]) or (gpt and 4 or 8)
local REPEATS = tonumber(arg and arg[4 + a]) or 5
local T = 64

local median = require("bench.util").median

mg.random.seed(1)
local blocks, vars = {}, {}
for i = 1, N do
  blocks[i] = gpt and mg.nn.TransformerBlock(4, W, {causal = true})
              or mg.nn.Sequential{mg.nn.Dense(4 * W, {activation = "tanh"}), mg.nn.Dense(W, {activation = "tanh"})}
end
local x = gpt and mg.random.normal{B, T, W} or mg.random.normal{B, W}
do local h = x for _, b in ipairs(blocks) do h = b(h) end end
for _, b in ipairs(blocks) do for _, v in ipairs(b.trainable_variables) do vars[#vars + 1] = v end end

local function step (wrap)
  local t = mg.tape()
  local h = x
  for _, b in ipairs(blocks) do h = wrap(b)(h) end
  local loss = mg.mean(h ^ 2)
  t:stop()
  local held = t:saved_bytes()
  local grads = t:gradient(loss, vars)
  for i, v in ipairs(vars) do v:assign_sub(grads[i], 1e-3) end
  return held
end

local cases = {
  {"plain tape", function(b) return b end},
  {"policy nothing", function(b) return mg.recompute_grad(b, {policy = "nothing"}) end},
  {"policy dots", function(b) return mg.recompute_grad(b, {policy = "dots"}) end},
  {"policy everything", function(b) return mg.recompute_grad(b, {policy = "everything"}) end},
  gpt and {"policy: keep attention outputs", function(b)
     return mg.recompute_grad(b, {policy = function(op) return op == "scaled_dot_product_attention" end}) end}
  or {"policy: keep tanh outputs", function(b)
     return mg.recompute_grad(b, {policy = function(op) return op == "tanh" end}) end},
}

if gpt then
  print(("%s, %d threads; %d GPT blocks, width %d, 4 heads, context %d, batch %d; medians of %d steps"):format(
    mg.version, mg.get_num_threads(), N, W, T, B, REPEATS))
else
  print(("%s, %d threads; %d MLP blocks %d -> %d -> %d, batch %d; medians of %d steps"):format(
    mg.version, mg.get_num_threads(), N, W, 4 * W, W, B, REPEATS))
end
print(("%-28s %9s %7s %11s %7s %10s %7s"):format("", "step ms", "ratio", "tapes MiB", "ratio", "peak MiB", "ratio"))
local base
for _, c in ipairs(cases) do
  step(c[2])
  local times, held, peak = {}, 0, 0
  for k = 1, REPEATS do
    collectgarbage()
    collectgarbage()
    local start = mg.memory.stats().current_bytes
    mg.memory.reset_peak()
    local t0 = mg.clock()
    held = step(c[2])
    times[k] = (mg.clock() - t0) * 1000
    peak = math.max(peak, mg.memory.stats().peak_bytes - start)
  end
  local m = {ms = median(times), held = held, peak = peak}
  base = base or m
  print(("%-28s %9.1f %6.2fx %11.1f %6.2fx %10.1f %6.2fx"):format(c[1], m.ms, m.ms / base.ms,
    m.held / 2^20, m.held / base.held, m.peak / 2^20, m.peak / base.peak))
end

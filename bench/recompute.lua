-- bench/recompute.lua: time and memory of one training step (forward,
-- backward, SGD update) for a deep chain, plain and with each of moongrad's
-- memory savers, as ratios to plain.
--   build/moongrad bench/recompute.lua [width] [batch] [layers] [repeats]
-- Memory comes from moongrad's own counters: "held by tapes" is the peak of
-- bytes that tapes saved for backward (the activations), "peak" everything
-- above the model (activations, gradients, temporaries), measured with a
-- collection at every allocation so garbage does not blur it.
local mg = mg or require "moongrad"

local W = tonumber(arg and arg[1]) or 1024
local B = tonumber(arg and arg[2]) or 2048
local N = tonumber(arg and arg[3]) or 16
local REPEATS = tonumber(arg and arg[4]) or 5

local median = require("bench.util").median

local now = mg.clock

-- a chain: layers (callables), the variables to train, and the runners
local function chains ()
  mg.random.seed(1)
  local dense, blocks = {}, {}
  for i = 1, N do
    dense[i] = mg.nn.Dense(W, {activation = "tanh"})
    blocks[i] = mg.nn.Sequential{mg.nn.Dense(W, {activation = "tanh"}), mg.nn.Dense(W // 4, {activation = "tanh"})}
  end
  local rev = mg.nn.RevBlock(mg.nn.Dense(W // 2, {activation = "tanh"}),
                             mg.nn.Dense(W // 2, {activation = "tanh"}), {num_layers = N})
  return {
    {name = "dense+tanh", layers = dense, width = W},
    {name = "MLP block (W/4 -> W -> W/4)", layers = blocks, width = W // 4},
    rev = rev,
  }
end

local segments = math.max(1, math.floor(math.sqrt(N) + 0.5))

local function runners (layers, rev)
  return {
    {"plain", function(h) for _, l in ipairs(layers) do h = l(h) end return h end},
    {"recompute every layer", function(h) for _, l in ipairs(layers) do h = mg.recompute_grad(l)(h) end return h end},
    {("checkpoint_sequential(%d)"):format(segments), function(h) return mg.nn.checkpoint_sequential(layers, segments, h) end},
    rev and {"RevBlock", function(h) return rev(h) end} or nil,
  }
end

local function variables_of (layers)
  local vars = {}
  for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end end
  return vars
end

local function step (run, x, vars)
  local t = mg.tape()
  local loss = mg.mean(run(x) ^ 2)
  t:stop()
  local grads = t:gradient(loss, vars)
  for i, v in ipairs(vars) do v:assign_sub(grads[i] * 1e-3) end
end

local function report (chain, x, rev)
  local h = x
  for _, l in ipairs(chain.layers) do h = l(h) end    -- build before listing variables
  if rev then rev(x) end
  print(("\n%s x%d, width %d, batch %d  (one activation = %.1f MiB)"):format(
    chain.name, N, W, B, B * chain.width * 4 / 2^20))
  print(("%-28s %10s %8s %12s %8s %12s %8s"):format("", "step ms", "ratio", "tapes MiB", "ratio", "peak MiB", "ratio"))
  local base
  for _, r in ipairs(runners(chain.layers, rev)) do
    local name, run = r[1], r[2]
    local rvars = name == "RevBlock" and rev.trainable_variables or variables_of(chain.layers)
    step(run, x, rvars)                                -- warm up (and build)
    local times = {}
    for k = 1, REPEATS do
      collectgarbage()
      local t0 = now()
      step(run, x, rvars)
      times[k] = (now() - t0) * 1000
    end
    local old, oldmin = mg.memory.setpause(100, 0)
    collectgarbage()
    mg.memory.reset_peak()
    local before = mg.memory.stats()
    step(run, x, rvars)
    local s = mg.memory.stats()
    mg.memory.setpause(old, oldmin)
    local m = {ms = median(times), saved = s.peak_saved_bytes - before.saved_bytes,
               peak = s.peak_bytes - before.current_bytes}
    base = base or m
    print(("%-28s %10.1f %7.2fx %12.1f %7.2fx %12.1f %7.2fx"):format(name, m.ms, m.ms / base.ms,
      m.saved / 2^20, m.saved / base.saved, m.peak / 2^20, m.peak / base.peak))
  end
end

print(("%s, %d threads; medians of %d steps"):format(mg.version, mg.get_num_threads(), REPEATS))
local cs = chains()
mg.random.seed(2)
report(cs[1], mg.random.normal{B, W}, cs.rev)
report(cs[2], mg.random.normal{B, W // 4}, nil)

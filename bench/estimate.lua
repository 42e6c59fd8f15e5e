-- bench/estimate.lua: mg.memory.estimate against the measured peak of the
-- real step, on the bench's models (the MLP, a chain of 16 Dense(1024),
-- the Fashion-MNIST CNN, the GPT), plain, recomputed, under the "dots" save
-- policy and with bfloat16 saved-tensor hooks. Each step is a training step
-- (forward, loss, gradient, Adam's update). The measured peak is
-- mg.memory.stats().peak_bytes after mg.memory.reset_peak() at a settled
-- start, with the collector's default pacing (median of 3 steps) and with
-- the ideal one (a collection before every allocation: the live set).
--   build/moongrad bench/estimate.lua [quick]
local mg = mg or require "moongrad"
local util = require "bench.util"
local median = util.median
local nn = mg.nn

local quick = arg and arg[1] == "quick"

local function labels (n, k) return mg.cast(mg.random.uniform({n}, 1, k + 1) // 1, "int64") end
local XENT = mg.losses.SparseCategoricalCrossentropy{from_logits = true}

local MODELS = {
  {"MLP 784-1024-1024-10, batch 128", function()
    local d, b = quick and 64 or 1024, quick and 8 or 128
    return nn.Sequential{nn.Dense(d, "relu"), nn.Dense(d, "relu"), nn.Dense(10)}, mg.random.normal{b, 784},
           labels(b, 10), XENT
  end},
  {"chain 16 x Dense(1024, tanh), batch 512", function()
    local d, b, layers = quick and 64 or 1024, quick and 8 or 512, {}
    for i = 1, 16 do layers[i] = nn.Dense(d, "tanh") end
    return nn.Sequential(layers), mg.random.normal{b, d}, nil, function(_, p) return mg.mean(p * p) end
  end},
  {"CNN (Fashion-MNIST), batch 128", function()
    local b = quick and 4 or 128
    return nn.Sequential{nn.Conv2D(32, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
                         nn.Conv2D(64, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
                         nn.Flatten(), nn.Dense(128, "relu"), nn.Dense(10)},
           mg.random.normal{b, 28, 28, 1}, labels(b, 10), XENT
  end},
  {"GPT 4 x 256, batch 32 x 64", function()
    local model, ids, targets, S = util.gpt(quick)
    return model, ids, targets, function(y, p) return XENT(mg.reshape(y, {-1}), mg.reshape(p, {-1, S.V})) end
  end},
}

-- how the forward runs: plain, each layer recomputed, the dots policy, packed hooks
local WAYS = {
  {"plain", function(model) return function(x) return model(x) end end},
  {"recompute", function(model)
    local fs = {}
    for i, l in ipairs(model.layers) do fs[i] = mg.recompute_grad(function(h) return l(h) end) end
    return function(x) for _, f in ipairs(fs) do x = f(x) end return x end
  end},
  {"dots policy", function(model) return mg.recompute_grad(function(x) return model(x) end, {policy = "dots"}) end},
  {"bfloat16 hooks", function(model)
    return function(x) return mg.saved_tensors_hooks("bfloat16", function() return model(x) end) end
  end},
}

local function step_of (make, way)
  mg.random.seed(1)
  local model, x, y, loss_fn = make()
  model(x)
  local vars, opt, forward = model.trainable_variables, mg.optim.Adam{learning_rate = 1e-4}, way(model)
  return function()
    local t = mg.tape()
    local loss = loss_fn(y, forward(x))
    t:stop()
    opt:apply_gradients(t:gradient(loss, vars), vars)
  end
end

local function measured (step)
  collectgarbage()
  collectgarbage()
  mg.memory.reset_peak()
  step()
  return mg.memory.stats().peak_bytes
end

local mib = function(b) return b / 2^20 end
local name, isa = util.machine()
print(("## mg.memory.estimate against the measured peak (bench/estimate.lua)\n\n%s, %s; %s; %d threads.\n"):format(
  name, isa, os.date("%Y-%m-%d"), mg.get_num_threads()))
print("| model | forward | estimate MiB | ms | measured MiB (default pacing, median of 3) | ratio | measured MiB (ideal pacing) | ratio |")
print("|---|---|---|---|---|---|---|---|")
local worst, worst_ideal = 0, 0
for _, m in ipairs(MODELS) do
  for _, w in ipairs(WAYS) do
    local step = step_of(m[2], w[2])
    step()                                            -- the optimizer's slots exist, as in training
    local est = mg.memory.estimate(step)
    local ms = {}
    for r = 1, 3 do ms[r] = measured(step) end
    local old, oldmin = mg.memory.setpause(100, 0)
    local ideal = measured(step)
    mg.memory.setpause(old, oldmin)
    local real = median(ms)
    worst = math.max(worst, math.abs(est.peak_bytes / real - 1))
    worst_ideal = math.max(worst_ideal, math.abs(est.peak_bytes / ideal - 1))
    print(("| %s | %s | %.2f | %.1f | %.2f | %.3f | %.2f | %.3f |"):format(m[1], w[1], mib(est.peak_bytes),
      est.seconds * 1e3, mib(real), est.peak_bytes / real, mib(ideal), est.peak_bytes / ideal))
    step, est = nil, nil
    collectgarbage()
  end
end
print(("\nLargest difference from the measured peak: %.1f%% under the ideal pacing, %.1f%% under the default "
       .. "pacing, whose garbage allowance the estimate does not count (target: within 5%%)."):format(
       100 * worst_ideal, 100 * worst))

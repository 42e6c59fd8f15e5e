-- bench/timeliness.lua: how close the memory peak stays to the live set.
-- For each case, one training step (forward, gradient, SGD update) runs
-- three ways: with the library's default collector pacing, with the
-- ideal (a full collection before every allocation: the peak is then the
-- live set), and with the old pacing (setpause(200, 16 MiB), the default
-- before the timeliness work). Prints default peak / ideal peak and the
-- step time against the old pacing. The cases: bench/recompute.lua's chains,
-- then the models of the training examples (train_fashion_mnist's CNN,
-- char_gpt's GPT), plain and with recompute_grad.
--   build/moongrad bench/timeliness.lua [width] [batch] [layers] [repeats]
local mg = mg or require "moongrad"

local W = tonumber(arg and arg[1]) or 1024
local B = tonumber(arg and arg[2]) or 512
local N = tonumber(arg and arg[3]) or 16
local REPEATS = tonumber(arg and arg[4]) or 5

local median = require("bench.util").median

-- Each case builds its own model when it runs, and drops it after: a
-- training script holds one model, and a full collection walks the whole
-- Lua heap (all ten models at once made each one cost 3x more).
local function vars_of (layers)
  local out = {}
  for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do out[#out + 1] = v end end
  return out
end

local function plain (layers) return function(h) for _, l in ipairs(layers) do h = l(h) end return h end end
local function every (layers)
  return function(h) for _, l in ipairs(layers) do h = mg.recompute_grad(l)(h) end return h end
end

-- a chain case: wrap(layers) runs them, on a (B, width) input
local function chain (name, make, width, wrap)
  return {name, function()
    mg.random.seed(1)
    local layers = {}
    for i = 1, N do layers[i] = make() end
    local x = mg.random.normal{B, width}
    plain(layers)(x)                                    -- builds the variables
    return wrap(layers), x, vars_of(layers)
  end}
end

local function dense () return mg.nn.Dense(W, {activation = "tanh"}) end
local function block ()
  return mg.nn.Sequential{mg.nn.Dense(W, {activation = "tanh"}), mg.nn.Dense(W // 4, {activation = "tanh"})}
end
local segments = math.max(1, math.floor(math.sqrt(N) + 0.5))

local function revblock ()
  mg.random.seed(1)
  local rev = mg.nn.RevBlock(mg.nn.Dense(W // 2, {activation = "tanh"}),
                             mg.nn.Dense(W // 2, {activation = "tanh"}), {num_layers = N})
  local x = mg.random.normal{B, W}
  rev(x)
  return rev, x, rev.trainable_variables
end

-- the training examples' models, at their sizes
local function cnn (recompute)
  local nn = mg.nn
  mg.random.seed(2)
  local function conv_block (filters)
    local b = nn.Sequential{nn.Conv2D(filters, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2)}
    return recompute and mg.recompute_grad(b) or b
  end
  local model = nn.Sequential{conv_block(32), conv_block(64), nn.Flatten(), nn.Dense(128, "relu"), nn.Dense(10)}
  local images = mg.random.uniform{128, 28, 28, 1}
  model(images)
  return model, images, model.trainable_variables
end

local function gpt (recompute)
  local nn = mg.nn
  mg.random.seed(2)
  local V, T, width = 28, 32, 128
  local layers = {nn.Embedding(V, width), nn.PositionalEmbedding(T)}
  for _ = 1, 4 do
    local b = nn.TransformerBlock(4, width, {causal = true})
    layers[#layers + 1] = recompute and mg.recompute_grad(b) or b
  end
  layers[#layers + 1] = nn.LayerNorm()
  layers[#layers + 1] = nn.Dense(V)
  local model = nn.Sequential(layers)
  local tokens = mg.cast(mg.random.uniform({64, T}, 1, V + 1) // 1, "int64")
  model(tokens)
  return model, tokens, model.trainable_variables
end

local cases = {
  chain("dense+tanh, plain", dense, W, plain),
  chain("dense+tanh, recompute every layer", dense, W, every),
  chain("dense+tanh, checkpoint_sequential", dense, W,
        function(layers) return function(h) return mg.nn.checkpoint_sequential(layers, segments, h) end end),
  {"dense+tanh, RevBlock", revblock},
  chain("MLP block, plain", block, W // 4, plain),
  chain("MLP block, recompute every layer", block, W // 4, every),
  {"CNN (fashion_mnist), plain", function() return cnn(false) end},
  {"CNN (fashion_mnist), recompute", function() return cnn(true) end},
  {"GPT (char_gpt), plain", function() return gpt(false) end},
  {"GPT (char_gpt), recompute", function() return gpt(true) end},
}

local function step (run, x, vars)
  local t = mg.tape()
  local loss = mg.mean(run(x) ^ 2)
  t:stop()
  local grads = t:gradient(loss, vars)
  for i, v in ipairs(vars) do v:assign_sub(grads[i], 1e-3) end
end

-- one timed step under a pacing: milliseconds, and the peak above the start
local function one_step (case, pause, min_bytes)
  local old, oldmin = mg.memory.setpause(pause, min_bytes)
  step(case[2], case[3], case[4])     -- the pacing learns the step (setpause starts it afresh)
  collectgarbage()
  collectgarbage()
  local before = mg.memory.stats()
  mg.memory.reset_peak()
  local t0 = mg.clock()
  step(case[2], case[3], case[4])
  local ms = (mg.clock() - t0) * 1000
  local after = mg.memory.stats()
  mg.memory.setpause(old, oldmin)
  return ms, after.peak_bytes - before.current_bytes, (after.collection_seconds - before.collection_seconds) * 1000
end

-- median step times and the largest peaks under each pacing; the pacings
-- take turns step by step, so that a slow moment of the machine falls on all
local function measure (case, pacings)
  step(case[2], case[3], case[4])                  -- warm up
  local times, peaks, gcs = {}, {}, {}
  for k = 1, REPEATS do
    for i, p in ipairs(pacings) do
      local ms, peak, gc_ms = one_step(case, p[1], p[2])
      times[i], gcs[i] = times[i] or {}, gcs[i] or {}
      times[i][k], gcs[i][k] = ms, gc_ms
      peaks[i] = math.max(peaks[i] or 0, peak)
    end
  end
  local out = {}
  for i = 1, #pacings do out[i] = {median(times[i]), peaks[i], median(gcs[i])} end
  return out
end

print(("%s, %d threads; width %d, batch %d, %d layers; medians of %d steps"):format(
  mg.version, mg.get_num_threads(), W, B, N, REPEATS))
-- cost: the step time against the old pacing's, medians of alternating
-- steps (noisy on a shared machine); gc cost: the collector's extra CPU time
-- (stats().collection_seconds, the pacing's young and full collections)
-- against the old pacing's, over the old step: the same figure, without
-- the machine's noise
print(("%-36s %9s %9s %7s %10s %9s %9s %7s %9s %8s"):format("case", "peak MiB", "ideal", "ratio", "old ratio",
                                                       "step ms", "old ms", "cost", "gc ms", "gc cost"))
local default_pause, default_min = mg.memory.setpause(200, 16 << 20)
mg.memory.setpause(default_pause, default_min)
for _, c in ipairs(cases) do
  local case = {c[1], c[2]()}
  local r = measure(case, {{default_pause, default_min}, {100, 0}, {200, 16 << 20}})
  case = nil                                          -- the next case's heap holds its own model only
  collectgarbage()
  local ms, peak, ideal, old_ms, old_peak = r[1][1], r[1][2], r[2][2], r[3][1], r[3][2]
  print(("%-36s %9.1f %9.1f %6.2fx %9.2fx %9.1f %9.1f %6.2fx %9.1f %7.3fx"):format(c[1], peak / 2^20,
    ideal / 2^20, peak / ideal, old_peak / ideal, ms, old_ms, ms / old_ms, r[1][3], 1 + (r[1][3] - r[3][3]) / old_ms))
end

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

local function chains ()
  mg.random.seed(1)
  local dense, blocks = {}, {}
  for i = 1, N do
    dense[i] = mg.nn.Dense(W, {activation = "tanh"})
    blocks[i] = mg.nn.Sequential{mg.nn.Dense(W, {activation = "tanh"}), mg.nn.Dense(W // 4, {activation = "tanh"})}
  end
  local rev = mg.nn.RevBlock(mg.nn.Dense(W // 2, {activation = "tanh"}),
                             mg.nn.Dense(W // 2, {activation = "tanh"}), {num_layers = N})
  local segments = math.max(1, math.floor(math.sqrt(N) + 0.5))
  local function plain (layers) return function(h) for _, l in ipairs(layers) do h = l(h) end return h end end
  local function every (layers)
    return function(h) for _, l in ipairs(layers) do h = mg.recompute_grad(l)(h) end return h end
  end
  local function vars (layers)
    local out = {}
    for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do out[#out + 1] = v end end
    return out
  end
  local x1, x2 = mg.random.normal{B, W}, mg.random.normal{B, W // 4}
  plain(dense)(x1)
  plain(blocks)(x2)
  rev(x1)
  return {
    {"dense+tanh, plain", plain(dense), x1, vars(dense)},
    {"dense+tanh, recompute every layer", every(dense), x1, vars(dense)},
    {"dense+tanh, checkpoint_sequential", function(h) return mg.nn.checkpoint_sequential(dense, segments, h) end,
     x1, vars(dense)},
    {"dense+tanh, RevBlock", rev, x1, rev.trainable_variables},
    {"MLP block, plain", plain(blocks), x2, vars(blocks)},
    {"MLP block, recompute every layer", every(blocks), x2, vars(blocks)},
  }
end

-- the training examples' models, at their sizes, plain and recomputed
local function examples ()
  local nn = mg.nn
  mg.random.seed(2)
  local function conv_block (filters)
    return nn.Sequential{nn.Conv2D(filters, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2)}
  end
  local b1, b2 = conv_block(32), conv_block(64)
  local head = {nn.Flatten(), nn.Dense(128, "relu"), nn.Dense(10)}
  local cnn = nn.Sequential{b1, b2, head[1], head[2], head[3]}
  local rcnn = nn.Sequential{mg.recompute_grad(b1), mg.recompute_grad(b2), head[1], head[2], head[3]}
  local images = mg.random.uniform{128, 28, 28, 1}
  cnn(images)
  local V, T, width = 28, 32, 128
  local blocks = {}
  for k = 1, 4 do blocks[k] = nn.TransformerBlock(4, width, {causal = true}) end
  local function gpt_of (wrap)
    local layers = {nn.Embedding(V, width), nn.PositionalEmbedding(T)}
    for k = 1, 4 do layers[#layers + 1] = wrap(blocks[k]) end
    layers[#layers + 1] = nn.LayerNorm()
    layers[#layers + 1] = nn.Dense(V)
    return layers
  end
  local layers, rlayers = gpt_of(function(b) return b end), gpt_of(mg.recompute_grad)
  for k, l in ipairs(layers) do if k <= 2 or k > 6 then rlayers[k] = l end end
  local gpt, rgpt = nn.Sequential(layers), nn.Sequential(rlayers)
  local tokens = mg.cast(mg.random.uniform({64, T}, 1, V + 1) // 1, "int64")
  gpt(tokens)
  return {
    {"CNN (fashion_mnist), plain", cnn, images, cnn.trainable_variables},
    {"CNN (fashion_mnist), recompute", rcnn, images, cnn.trainable_variables},
    {"GPT (char_gpt), plain", gpt, tokens, gpt.trainable_variables},
    {"GPT (char_gpt), recompute", rgpt, tokens, gpt.trainable_variables},
  }
end

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
local cases = chains()
for _, case in ipairs(examples()) do cases[#cases + 1] = case end
for _, case in ipairs(cases) do
  local r = measure(case, {{default_pause, default_min}, {100, 0}, {200, 16 << 20}})
  local ms, peak, ideal, old_ms, old_peak = r[1][1], r[1][2], r[2][2], r[3][1], r[3][2]
  print(("%-36s %9.1f %9.1f %6.2fx %9.2fx %9.1f %9.1f %6.2fx %9.1f %7.3fx"):format(case[1], peak / 2^20,
    ideal / 2^20, peak / ideal, old_peak / ideal, ms, old_ms, ms / old_ms, r[1][3], 1 + (r[1][3] - r[3][3]) / old_ms))
end

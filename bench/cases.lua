-- bench/cases.lua: one measurement of moongrad, printed as "<value>"
-- (or "<value> <value>"), for bench/bench.lua to compare with PyTorch's.
--   build/moongrad bench/cases.lua op <size> <tape:0|1>     -> us per a + b
--   build/moongrad bench/cases.lua seed                      -> us per seed chain + gradient
--   build/moongrad bench/cases.lua seed_floor [dir]          -> the same on bench/lua_floor.c, built as
--                                                              dir/lua_floor.so (default build/): Lua's share
--   build/moongrad bench/cases.lua mlp <batch>               -> ms per training step
--   build/moongrad bench/cases.lua fit_small                 -> ms per step of fit: 20 -> 256 -> 10, batch 32, Adam
--   build/moongrad bench/cases.lua ckpt <plain|every> <width> <batch> <layers> [reps=3]
--                                                            -> ms per step, peak RSS MiB, peak counter MiB
--   build/moongrad bench/cases.lua matmul <n>                -> GFLOPS
-- Threads come from OMP_NUM_THREADS.
local mg = mg or require "moongrad"

local case = arg[1]

local median = require("bench.util").median

-- median seconds of `reps` timings of fn, after one warm-up call
local function timed (reps, fn)
  fn()
  local ts = {}
  for r = 1, reps do
    local t0 = mg.clock()
    fn()
    ts[r] = mg.clock() - t0
  end
  return median(ts)
end

local function rss_mib (field)
  for line in io.lines("/proc/self/status") do
    local v = line:match("^" .. field .. ":%s+(%d+) kB")
    if v then return tonumber(v) / 1024 end
  end
end

local cases = {}

-- With a tape, a new one every 1000 ops, the length of a training step's:
-- a tape keeps every node until its gradient, and one of 10^5 ops would
-- time the growth of its id map past the caches (PyTorch frees each node
-- with its result here).
function cases.op (size, tape)
  local n, per_tape = 100000, 1000
  local a, b = mg.ones{tonumber(size)}, mg.ones{tonumber(size)}
  local s = timed(5, function()
    for _ = 1, n // per_tape do
      local t = tape == "1" and mg.tape() or nil
      if t then t:watch(a) end
      for _ = 1, per_tape do local _ = a + b end
      if t then t:stop() end
    end
  end)
  return s / n * 1e6
end

-- lib: moongrad, or bench/lua_floor.c's module (the same calls, which make
-- boxes and nothing more: Lua's own share of the chain)
local function seed_chain (lib)
  local y = lib.Variable(1.0)
  local function f (x) return x * y end
  local n = 10000
  local s = timed(5, function()
    for _ = 1, n do
      local t = lib.tape()
      local r = lib.constant(1.0)
      for _ = 1, 4 do r = f(r) end
      t:stop()
      local _ = t:gradient(r, {y})
    end
  end)
  return s / n * 1e6
end

function cases.seed () return seed_chain(mg) end

function cases.seed_floor (dir)
  package.cpath = (dir or "build") .. "/?.so;" .. package.cpath
  return seed_chain(require "lua_floor")
end

-- the 784-1024-1024-10 MLP with ReLU, softmax cross-entropy and SGD
function cases.mlp (batch)
  batch = tonumber(batch)
  mg.random.seed(0)
  local model = mg.nn.Sequential{mg.nn.Dense(1024, {activation = "relu"}),
                                 mg.nn.Dense(1024, {activation = "relu"}), mg.nn.Dense(10)}
  local x = mg.random.normal{batch, 784}
  local labels = mg.cast(mg.random.uniform({batch}, 0, 10) // 1, "int64")
  model(x)
  local vars = model.trainable_variables
  local onehot = mg.cast(mg.equal(mg.expand_dims(labels, 2), mg.arange(10, "int64")), "float32")
  local function step ()
    local t = mg.tape()
    local logits = model(x)
    local loss = -mg.mean(mg.sum(onehot * mg.log_softmax(logits), 2))
    t:stop()
    local grads = t:gradient(loss, vars)
    for i, v in ipairs(vars) do v:assign_sub(grads[i], 0.01) end
  end
  return timed(20, step) * 1e3
end

-- a small model's fit, as a newcomer writes it: 20 -> 256 -> 10, batch 32,
-- Adam, 100 steps an epoch; the median epoch over 5, per step
function cases.fit_small ()
  mg.random.seed(0)
  local steps = 100
  local x = mg.random.normal{32 * steps, 20}
  local y = mg.cast(mg.random.uniform({32 * steps}, 0, 10) // 1 + 1, "int64")
  local model = mg.nn.Sequential{mg.nn.Dense(256, "relu"), mg.nn.Dense(10)}
  model:compile{optimizer = mg.optim.Adam{learning_rate = 1e-3},
                loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}}
  return timed(5, function() model:fit(x, y, {epochs = 1, batch_size = 32, verbose = 0}) end) / steps * 1e3
end

-- 16 layers of tanh(x @ W): plain, or layers 2..16 under recompute_grad
function cases.ckpt (mode, width, batch, layers, reps)
  width, batch, layers, reps = tonumber(width), tonumber(batch), tonumber(layers), tonumber(reps) or 3
  mg.random.seed(0)
  local ws = {}
  for i = 1, layers do ws[i] = mg.Variable(mg.random.normal({width, width}, 0, 1 / math.sqrt(width))) end
  local x = mg.random.normal{batch, width}
  local function layer (i) return function(h) return mg.tanh(mg.matmul(h, ws[i])) end end
  local fs = {}
  for i = 1, layers do fs[i] = (mode == "every" and i > 1) and mg.recompute_grad(layer(i)) or layer(i) end
  local function step ()
    local t = mg.tape()
    local h = x
    for i = 1, layers do h = fs[i](h) end
    local loss = mg.mean(h)
    t:stop()
    local g = t:gradient(loss, ws)
    for i, w in ipairs(ws) do w:assign_sub(g[i], 0.01) end
  end
  collectgarbage()
  local rss0 = rss_mib("VmRSS")
  mg.memory.reset_peak()
  local c0 = mg.memory.stats().current_bytes
  local s = timed(reps, step)
  return ("%.3f %.1f %.1f"):format(s * 1e3, rss_mib("VmHWM") - rss0,
                                   (mg.memory.stats().peak_bytes - c0) / 2^20)
end

function cases.matmul (n)
  n = tonumber(n)
  local a, b = mg.random.normal{n, n}, mg.random.normal{n, n}
  local reps = n <= 256 and 200 or (n <= 1024 and 20 or 5)
  local s = timed(5, function() for _ = 1, reps do local _ = mg.matmul(a, b) end end) / reps
  return 2 * n ^ 3 / s / 1e9
end

local fn = cases[case]
if not fn then error("cases.lua: unknown case '" .. tostring(case) .. "'") end
local result = fn(table.unpack(arg, 2))
print(type(result) == "number" and ("%.4f"):format(result) or result)

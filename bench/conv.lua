-- bench/conv.lua: one training step of a convolution (forward, then the
-- gradients of filters, bias and, past the first layer, the input, for a
-- given dy) at the layer shapes of a Fashion-MNIST CNN, batch 128, next to
-- PyTorch (bench/conv_peer.py) at 1 and 2 threads. moongrad is NHWC (its
-- only layout); PyTorch runs NCHW and channels_last and the faster counts.
-- Each round runs a fresh moongrad process and a fresh PyTorch process in
-- turn; a figure is the median over rounds of each process's median step.
--   build/moongrad bench/conv.lua [rounds] [reps]    (default 5 rounds of 9 steps)
--   build/moongrad bench/conv.lua quick              (tiny sizes, one round, no peer: a smoke test)
--   build/moongrad bench/conv.lua worker THREADS REPS [quick]   (one process's medians)  (THREADS a count or "auto")
local mg = mg or require "moongrad"

local PY = "/usr/bin/python3"
local median = require("bench.util").median

-- the cases: keep in step with conv_peer.py
local CONVS = {   -- name, {H, W, Cin}, Cout, kernel, padding, whether x needs a gradient
  {"conv 28x28x1 -> 32, 3x3 same (first layer)", {28, 28, 1}, 32, 3, "same", false},
  {"conv 28x28x1 -> 32, 3x3 valid (first layer)", {28, 28, 1}, 32, 3, "valid", false},
  {"conv 14x14x32 -> 64, 3x3 same", {14, 14, 32}, 64, 3, "same", true},
  {"conv 13x13x32 -> 64, 3x3 valid", {13, 13, 32}, 64, 3, "valid", true},
}
local POOLS = {{"max_pool 2x2 of 26x26x32", {26, 26, 32}}}
local CNN = "CNN step: conv32-pool-conv64-pool-dense128-dense10, SGD"

-- {========================== a worker ==========================

local function worker (threads, reps, quick)
  mg.set_num_threads(threads)
  local N = quick and 4 or 128
  local function timed (fn)
    fn()
    fn()
    local ts = {}
    for r = 1, reps do
      local t0 = mg.clock()
      fn()
      ts[r] = mg.clock() - t0
    end
    return median(ts)
  end
  mg.random.seed(0)
  for _, c in ipairs(CONVS) do
    local name, hwc, cout, k, padding, needs_x = table.unpack(c)
    local x = mg.random.normal{N, hwc[1], hwc[2], hwc[3]}
    local w = mg.Variable(mg.random.normal({k, k, hwc[3], cout}, 0, 0.1))
    local b = mg.Variable(mg.zeros{cout})
    local opts = {padding = padding}
    local dy = mg.random.normal(mg.conv2d(x, w, b, opts).shape)
    local srcs = needs_x and {x, w, b} or {w, b}
    local s = timed(function()
      local t = mg.tape()
      if needs_x then t:watch(x) end
      local y = mg.conv2d(x, w, b, opts)
      t:stop()
      return t:gradient(y, srcs, dy)
    end)
    print(("%s\t%.4f"):format(name, s * 1e3))
  end
  for _, c in ipairs(POOLS) do
    local name, hwc = table.unpack(c)
    local x = mg.random.normal{N, hwc[1], hwc[2], hwc[3]}
    local dy = mg.random.normal{N, hwc[1] // 2, hwc[2] // 2, hwc[3]}
    local s = timed(function()
      local t = mg.tape()
      t:watch(x)
      local y = mg.max_pool2d(x)
      t:stop()
      return t:gradient(y, x, dy)
    end)
    print(("%s\t%.4f"):format(name, s * 1e3))
  end
  -- the Fashion-MNIST CNN of PEER-FIGURES.md (valid 3x3 convolutions): one
  -- SGD step, forward, cross-entropy, backward, update
  local nn = mg.nn
  local model = nn.Sequential{nn.Conv2D(32, 3, {activation = "relu"}), nn.MaxPool2D(2),
                              nn.Conv2D(64, 3, {activation = "relu"}), nn.MaxPool2D(2), nn.Flatten(),
                              nn.Dense(128, "relu"), nn.Dense(10)}
  local x = mg.random.normal{N, 28, 28, 1}
  local labels = mg.cast(mg.random.uniform({N}, 1, 11) // 1, "int64")
  model(x)
  local vars = model.trainable_variables
  local s = timed(function()
    local t = mg.tape()
    local loss = nn.softmax_cross_entropy(model(x), labels)
    t:stop()
    local g = t:gradient(loss, vars)
    for i, v in ipairs(vars) do v:assign_sub(g[i], 0.01) end
  end)
  print(("%s\t%.4f"):format(CNN, s * 1e3))
  io.stdout:flush()
end

if arg and arg[1] == "worker" then
  worker(tonumber(arg[2]) or arg[2], tonumber(arg[3]), arg[4] == "quick")
  return
end

-- }=============================================================


-- {========================== the driver ========================

local quick = arg and arg[1] == "quick"
local ROUNDS = quick and 1 or tonumber(arg and arg[1]) or 5
local REPS = quick and 1 or tonumber(arg and arg[2]) or 9
local BIN = arg and arg[-1] or "build/moongrad"

local has_torch = false
if not quick then
  local p = io.popen(PY .. " -c 'import torch' 2>/dev/null && echo yes")
  has_torch = p:read("a"):match("yes") ~= nil
  p:close()
end

-- runs cmd; adds each "<case>\t<ms>[\t<layout>]" line to into[case] (a list of ms)
local function collect (cmd, into, layouts)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  p:close()
  local n = 0
  for line in out:gmatch("[^\n]+") do
    local name, ms, layout = line:match("^(.-)\t([%d.]+)\t?(%S*)$")
    if name then
      into[name] = into[name] or {}
      table.insert(into[name], tonumber(ms))
      if layout ~= "" then
        layouts[name] = layouts[name] or {}
        layouts[name][layout] = (layouts[name][layout] or 0) + 1
      end
      n = n + 1
    end
  end
  if n == 0 then error("bench/conv.lua: no figures from: " .. cmd .. "\n" .. out) end
end

local function cpu ()
  local f = io.open("/proc/cpuinfo")
  local info = f and f:read("a") or ""
  if f then f:close() end
  local model = info:match("model name%s*:%s*([^\n]+)") or "unknown CPU"
  return model .. (info:find("avx512f") and ", AVX-512" or info:find("avx2") and ", AVX2" or "")
end

print(("### Convolution and pooling steps on %s"):format(cpu()))
print()
print(("%s vs PyTorch, conv2d and max_pool training steps, batch %d, %s"):format(mg.version,
      quick and 4 or 128, cpu()))
print(("medians over %d round%s of %d steps (each round: a fresh moongrad process, then a fresh PyTorch one)%s")
      :format(ROUNDS, ROUNDS > 1 and "s" or "", REPS, (quick or has_torch) and "" or "; PyTorch not available"))
print("moongrad: NHWC with HWIO filters (oneDNN's jit kernels read NHWC directly); PyTorch: its faster layout")
print()
print(("| %-56s | %7s | %11s | %11s | %6s | %6s |"):format("step (forward + backward)", "threads", "moongrad",
      "PyTorch", "layout", "ratio"))
print(("|%s|%s|%s|%s|%s|%s|"):format(("-"):rep(58), ("-"):rep(9), ("-"):rep(13), ("-"):rep(13), ("-"):rep(8),
      ("-"):rep(8)))
local names = {}
for _, c in ipairs(CONVS) do names[#names + 1] = c[1] end
for _, c in ipairs(POOLS) do names[#names + 1] = c[1] end
names[#names + 1] = CNN
for _, threads in ipairs(quick and {1} or {1, 2}) do
  local ours, theirs, layouts = {}, {}, {}
  for _ = 1, ROUNDS do
    collect(("OMP_NUM_THREADS=%d %s bench/conv.lua worker %d %d%s"):format(threads, BIN, threads, REPS,
            quick and " quick" or ""), ours, {})
    if has_torch then
      collect(("OMP_NUM_THREADS=%d %s bench/conv_peer.py %d %d"):format(threads, PY, threads, REPS), theirs, layouts)
    end
  end
  for _, name in ipairs(names) do
    local m = median(ours[name])
    local t = theirs[name] and median(theirs[name])
    local lay = "-"
    if layouts[name] then
      local best = 0
      for k, v in pairs(layouts[name]) do if v > best then lay, best = k, v end end
    end
    print(("| %-56s | %7d | %8.2f ms | %s | %6s | %6s |"):format(name, threads, m,
          t and ("%8.2f ms"):format(t) or ("%11s"):format("-"), lay, t and ("%.2fx"):format(m / t) or "-"))
  end
end

-- }=============================================================

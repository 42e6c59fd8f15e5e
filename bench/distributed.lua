-- bench/distributed.lua: mg.distributed on this machine (shared memory, Open
-- MPI's vader transport), the figures bench/SCALING.md fits its model to:
--   1. allreduce (sum, float32) on 2 ranks, 4 B to 64 MiB: time per call,
--      algorithm bandwidth (bytes / time) and bus bandwidth (x 2(p-1)/p, what
--      each rank's link carries in a ring), through mg.distributed.allreduce on a
--      variable (in place; with its shape check) and through the fused path
--      DistributedOptimizer takes (allreduce_many: pack, reduce, views);
--   2. training steps through fit of the Fashion-MNIST CNN
--      (examples/train_fashion_mnist.lua's, batch 128) and of bench/gpt.lua's GPT
--      (4 blocks, width 256, batch 32 x 64 tokens), on random data of the
--      datasets' shapes: 1 process at 1 and 2 threads, 2 processes of 1 thread
--      at half the batch each (the same global batch) and at the whole batch
--      each (twice the global batch), and the allreduce of one step's gradients.
-- Each round runs every case as a fresh mpirun; a figure is the median over
-- rounds of each run's median step.
--   build/moongrad bench/distributed.lua [rounds] [steps]      (default 3 rounds, 12 timed steps)
--   mpirun -np 2 build/moongrad bench/distributed.lua allreduce
--   mpirun -np P build/moongrad bench/distributed.lua step MODEL BATCH THREADS STEPS
local mg = mg or require "moongrad"
local median = require("bench.util").median

-- {========================== workers ==========================

local function allreduce_worker ()
  local dist = mg.distributed
  local rank, size = dist.init()
  local mpi = require "moongrad.mpi"
  mg.set_num_threads(1)
  local rows = {}
  local bytes = 4
  while bytes <= 64 * 2^20 do
    local n = math.tointeger(bytes // 4)
    local v = mg.Variable(mg.ones({n}))
    local t = mg.ones({n})
    local reps = math.max(3, math.min(400, math.tointeger(5e7 // bytes)))
    local function time (f)
      for _ = 1, 3 do f() end
      local samples = {}
      for _ = 1, 5 do
        dist.barrier()
        local t0 = mg.clock()
        for _ = 1, reps do f() end
        samples[#samples + 1] = (mg.clock() - t0) / reps
      end
      return median(samples)
    end
    local plain = time(function() dist.allreduce(v) end)
    local fused = time(function() mpi.allreduce_many({t}, "sum", 1, 1 / size, 1 << 30) end)
    rows[#rows + 1] = {bytes, plain, fused}
    bytes = bytes * 4
  end
  if rank == 0 then
    for _, r in ipairs(rows) do print(("%d %.9g %.9g"):format(r[1], r[2], r[3])) end
  end
end

local model_of, data_of = require("bench.util").dist_model, require("bench.util").dist_data

-- prints rank 0's median step (s), the median allreduce of one step's
-- gradients (s), the parameter count and their bytes
local function step_worker (name, batch, threads, steps)
  local dist = mg.distributed
  local rank, size = dist.init()
  mg.set_num_threads(threads)
  local model = model_of(name)
  local warm = 3
  local x, y = data_of(name, (warm + steps) * batch * size)
  model:compile{optimizer = mg.optim.Adam{learning_rate = 1e-3},
                loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}}
  model(x:slice({1, batch}))
  local stamps = {}
  model:fit(x, y, {epochs = 1, batch_size = batch, shuffle = false, verbose = 0, distributed = true,
                   callbacks = {mg.callbacks.LambdaCallback{on_batch_end = function() stamps[#stamps + 1] = mg.clock() end}}})
  local times = {}
  for i = warm + 1, #stamps do times[#times + 1] = stamps[i] - stamps[i - 1] end
  local grads, params = {}, 0
  for i, v in ipairs(model.trainable_variables) do
    grads[i] = v:value()
    params = params + v:numel()
  end
  local mpi = require "moongrad.mpi"
  local ar = {}
  for i = 1, 12 do
    dist.barrier()
    local t0 = mg.clock()
    mpi.allreduce_many(grads, "sum", 1, 1 / size, 64 << 20)
    if i > 2 then ar[#ar + 1] = mg.clock() - t0 end
  end
  if rank == 0 then print(("%.9g %.9g %d %d"):format(median(times), median(ar), params, params * 4)) end
end

if arg and arg[1] == "allreduce" then return allreduce_worker() end
if arg and arg[1] == "step" then
  return step_worker(arg[2], tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5]))
end

-- }=============================================================


-- {========================== driver ===========================

local ROUNDS = tonumber(arg and arg[1]) or 3
local STEPS = tonumber(arg and arg[2]) or 12
local BIN = arg and arg[-1] or "build/moongrad"
local MPIRUN = "mpirun --allow-run-as-root --oversubscribe --bind-to none -np %d " .. BIN .. " bench/distributed.lua "

local sh = require("bench.util").sh

local cpu = sh("lscpu | sed -n 's/^Model name: *//p' | head -1"):gsub("%s+$", "")
local isa = sh("grep -m1 -o -w avx512f /proc/cpuinfo"):match("avx512f") and "AVX-512" or "AVX2"
local cores = tonumber(sh("nproc"))
local ompi = sh("mpirun --version 2>/dev/null | head -1"):gsub("%s+$", "")
print(("### mg.distributed on %s (%s, %d cores), %s, shared memory, %s"):format(cpu, isa, cores, ompi,
      os.date("!%Y-%m-%d %H:%M UTC")))
print()

-- allreduce: median over rounds of each size
local by_size, order = {}, {}
for _ = 1, ROUNDS do
  for line in sh(MPIRUN:format(2) .. "allreduce 2>&1"):gmatch("[^\n]+") do
    local b, p, f = line:match("^(%d+) (%S+) (%S+)$")
    if b then
      b = tonumber(b)
      if not by_size[b] then by_size[b] = {{}, {}}; order[#order + 1] = b end
      table.insert(by_size[b][1], tonumber(p))
      table.insert(by_size[b][2], tonumber(f))
    end
  end
end
local function human (b)
  if b >= 2^20 then return ("%d MiB"):format(b // 2^20) end
  if b >= 1024 then return ("%d KiB"):format(b // 1024) end
  return ("%d B"):format(b)
end
print(("allreduce, sum of float32, 2 ranks, median of %d rounds (busbw = bytes x 2(p-1)/p / time)"):format(ROUNDS))
print()
print("| bytes | allreduce(v) us | algbw GB/s | busbw GB/s | fused path us | fused busbw GB/s |")
print("|---:|---:|---:|---:|---:|---:|")
for _, b in ipairs(order) do
  local p, f = median(by_size[b][1]), median(by_size[b][2])
  print(("| %s | %.1f | %.3f | %.3f | %.1f | %.3f |"):format(human(b), p * 1e6, b / p / 1e9, b / p / 1e9, f * 1e6,
                                                           b / f / 1e9))
end
print()

local cases = {
  {"cnn", "1 process, 1 thread, batch 128", 1, 128, 1},
  {"cnn", "1 process, 2 threads, batch 128", 1, 128, 2},
  {"cnn", "2 processes x 1 thread, batch 64 each (global 128)", 2, 64, 1},
  {"cnn", "2 processes x 1 thread, batch 128 each (global 256)", 2, 128, 1},
  {"gpt", "1 process, 1 thread, batch 32", 1, 32, 1},
  {"gpt", "1 process, 2 threads, batch 32", 1, 32, 2},
  {"gpt", "2 processes x 1 thread, batch 16 each (global 32)", 2, 16, 1},
  {"gpt", "2 processes x 1 thread, batch 32 each (global 64)", 2, 32, 1},
}
local res = {}
for _ = 1, ROUNDS do
  for i, c in ipairs(cases) do
    local out = sh(MPIRUN:format(c[3]) .. ("step %s %d %d %d 2>&1"):format(c[1], c[4], c[5], STEPS))
    local s, a, params, bytes = out:match("(%S+) (%S+) (%d+) (%d+)")
    if not s then error("case " .. c[2] .. " failed:\n" .. out) end
    res[i] = res[i] or {step = {}, ar = {}}
    table.insert(res[i].step, tonumber(s))
    table.insert(res[i].ar, tonumber(a))
    res[i].params, res[i].bytes = tonumber(params), tonumber(bytes)
  end
end
print(("training steps through fit, median of %d rounds of %d steps (random data of the datasets' shapes, Adam)"):format(
      ROUNDS, STEPS))
print()
print("| model | case | step ms | samples/s | gradients' allreduce ms |")
print("|---|---|---:|---:|---:|")
for i, c in ipairs(cases) do
  local s = median(res[i].step)
  local samples = c[4] * c[3]
  local ar = c[3] > 1 and ("%.2f"):format(median(res[i].ar) * 1e3) or "-"
  local label = c[1] == "cnn" and ("Fashion-MNIST CNN (%d params, %.2f MB)"):format(res[i].params, res[i].bytes / 1e6)
                or ("GPT (%d params, %.2f MB)"):format(res[i].params, res[i].bytes / 1e6)
  print(("| %s | %s | %.1f | %.0f | %s |"):format(label, c[2], s * 1e3, samples / s, ar))
end

-- }=============================================================

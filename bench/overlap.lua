-- bench/overlap.lua: how much of the gradients' communication the backward
-- hides (opt:minimize, mpi.gradient: buckets sent with MPI_Iallreduce as the
-- walk makes them) on 2 ranks of this machine, for the Fashion-MNIST CNN
-- and the GPT of bench/gpt.lua (bench/distributed.lua's models and batches).
-- Each timed step runs the forward and the loss, then either
--   after:    tape:gradient, then the fused allreduce of every gradient
--             (DistributedOptimizer:apply_gradients' path), or
--   overlap:  mpi.gradient (the walk with buckets going out as they fill),
-- and no update (the same weights every step, so both see the same work).
-- Communication after the backward is C (the allreduce's time); the exposed
-- part of the overlapped run is E (the time its end waited: stats().waited);
-- hidden share = 1 - E / C. The backward's own time in each is shown too:
-- the ranks progress MPI between nodes, and on 2 cores each rank's share of
-- the copying is its own CPU time, hidden from the wait only.
--   build/moongrad bench/overlap.lua [rounds] [steps]          (default 3 rounds, 10 steps)
--   mpirun -np 2 build/moongrad bench/overlap.lua worker MODEL BATCH FUSION STEPS
local mg = mg or require "moongrad"
local util = require "bench.util"
local median = util.median

local model_of, data_of = util.dist_model, util.dist_data

-- prints: backward after (s), allreduce after (s), overlapped gradient call
-- (s), its exposed wait (s), buckets, gradient bytes (medians over steps)
local function worker (name, batch, fusion, steps)
  local dist = mg.distributed
  local rank, size = dist.init()
  local mpi = require "moongrad.mpi"
  mg.set_num_threads(1)
  local model = model_of(name)
  local x, y = data_of(name, batch)
  model(x)
  local vars = model.trainable_variables
  local loss_fn = mg.losses.SparseCategoricalCrossentropy{from_logits = true}
  local bytes = 0
  for _, v in ipairs(vars) do bytes = bytes + v:numel() * 4 end
  local function forward ()
    local t = mg.tape()
    local loss = loss_fn(y, model(x))
    t:stop()
    return t, loss
  end
  local r = {back = {}, ar = {}, call = {}, wait = {}}
  local buckets
  for i = 1, steps + 3 do
    dist.barrier()
    local t, loss = forward()
    local t0 = mg.clock()
    local grads = t:gradient(loss, vars)
    local t1 = mg.clock()
    mpi.allreduce_many(grads, "sum", 1, 1 / size, fusion)
    local t2 = mg.clock()
    grads = nil
    dist.barrier()
    t, loss = forward()
    local before = dist.stats()
    local t3 = mg.clock()
    mpi.gradient(t, loss, vars, "allreduce", 1, 1 / size, fusion, "bench")
    local t4 = mg.clock()
    local after = dist.stats()
    buckets = after.calls - before.calls - 2             -- the agreement and the presence flags
    if i > 3 then
      table.insert(r.back, t1 - t0)
      table.insert(r.ar, t2 - t1)
      table.insert(r.call, t4 - t3)
      table.insert(r.wait, after.waited - before.waited)
    end
  end
  if rank == 0 then
    print(("%.9g %.9g %.9g %.9g %d %d"):format(median(r.back), median(r.ar), median(r.call), median(r.wait), buckets,
                                                bytes))
  end
end

if arg and arg[1] == "worker" then
  return worker(arg[2], tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5]))
end

local ROUNDS = tonumber(arg and arg[1]) or 3
local STEPS = tonumber(arg and arg[2]) or 10
local BIN = arg and arg[-1] or "build/moongrad"
local MPIRUN = "mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 " .. BIN .. " bench/overlap.lua "
local sh = util.sh

local cpu = sh("lscpu | sed -n 's/^Model name: *//p' | head -1"):gsub("%s+$", "")
local isa = sh("grep -m1 -o -w avx512f /proc/cpuinfo"):match("avx512f") and "AVX-512" or "AVX2"
print(("### overlap of the gradients' allreduce with the backward, 2 ranks x 1 thread, %s (%s), %s"):format(cpu, isa,
      os.date("!%Y-%m-%d %H:%M UTC")))
print()
local cases = {{"cnn", 64}, {"gpt", 16}}
local fusions = {256 * 1024, 1024 * 1024, 4 * 1024 * 1024}
local res = {}
for _ = 1, ROUNDS do
  for _, c in ipairs(cases) do
    for _, f in ipairs(fusions) do
      local out = sh(MPIRUN .. ("worker %s %d %d %d 2>&1"):format(c[1], c[2], f, STEPS))
      local b, a, call, w, k, bytes = out:match("(%S+) (%S+) (%S+) (%S+) (%d+) (%d+)")
      if not b then error(("case %s %d failed:\n%s"):format(c[1], f, out)) end
      local key = c[1] .. f
      res[key] = res[key] or {b = {}, a = {}, call = {}, w = {}}
      table.insert(res[key].b, tonumber(b))
      table.insert(res[key].a, tonumber(a))
      table.insert(res[key].call, tonumber(call))
      table.insert(res[key].w, tonumber(w))
      res[key].k, res[key].bytes = tonumber(k), tonumber(bytes)
    end
  end
end
print(("median of %d rounds of %d steps; C: the allreduce after the backward, E: what the overlapped call "
       .. "waited for at its end"):format(ROUNDS, STEPS))
print()
print("| model | bucket | buckets | backward, then allreduce ms | C ms | overlapped call ms | E ms | hidden share 1 - E/C | step saved ms |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for _, c in ipairs(cases) do
  for _, f in ipairs(fusions) do
    local r = res[c[1] .. f]
    local b, a, call, w = median(r.b), median(r.a), median(r.call), median(r.w)
    local label = c[1] == "cnn" and ("Fashion-MNIST CNN, batch %d/rank (%.2f MB)"):format(c[2], r.bytes / 1e6)
                  or ("GPT, batch %d/rank (%.2f MB)"):format(c[2], r.bytes / 1e6)
    print(("| %s | %d KiB | %d | %.2f | %.2f | %.2f | %.2f | %.0f%% | %.2f |"):format(label, f // 1024, r.k,
          (b + a) * 1e3, a * 1e3, call * 1e3, w * 1e3, (1 - w / a) * 100, (b + a - call) * 1e3))
  end
end

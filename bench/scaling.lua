-- bench/scaling.lua: the alpha-beta model of ring allreduce, fitted to what
-- bench/distributed.lua measured, and its predictions (bench/SCALING.md).
--   build/moongrad bench/distributed.lua > out.md; build/moongrad bench/scaling.lua out.md [gamma_GBps]
-- Ring allreduce of n bytes on p ranks (reduce-scatter, then allgather):
--   T(n, p) = 2 (p - 1) alpha + 2 (p - 1) / p * n * beta + (p - 1) / p * n * gamma
-- alpha: the cost of one message; beta: seconds per byte on a rank's link;
-- gamma: seconds per byte to reduce (add) what arrives. On 2 ranks of shared
-- memory T = 2 alpha + n (beta + gamma / 2): alpha from the smallest sizes,
-- the slope from a least-squares line over the sizes from 256 KiB up. The
-- predictions add n * delta, the copies of DistributedOptimizer's fusion path
-- (fitted to the measured allreduce of a training step's gradients).
local path = assert(arg[1], "usage: bench/scaling.lua <bench/distributed.lua's output> [gamma GB/s]")
local GAMMA_GBPS = tonumber(arg[2]) or 10           -- measured: one thread adds float32 at about this

local sizes, times, steps = {}, {}, {}
for line in io.lines(path) do
  local num, unit, us = line:match("^| (%d+) (%a+) | ([%d.]+) |")
  if num then
    local mult = unit == "MiB" and 2^20 or unit == "KiB" and 1024 or 1
    sizes[#sizes + 1], times[#times + 1] = tonumber(num) * mult, tonumber(us) * 1e-6
  end
  local name, mb, what, step, ar = line:match("^| (%a[%w%- ]-) %(%d+ params, ([%d.]+) MB%) | ([^|]-) | ([%d.]+) | [%d.]+ | ([%d.%-]+) |")
  if name then
    steps[#steps + 1] = {model = name, mb = tonumber(mb), case = what, ms = tonumber(step), ar_ms = tonumber(ar)}
  end
end
assert(#sizes > 4, "no allreduce table in " .. path)

-- alpha: half the median of the sizes up to 256 B (2 messages on 2 ranks)
local small = {}
for i, n in ipairs(sizes) do if n <= 256 then small[#small + 1] = times[i] end end
table.sort(small)
local alpha_shm = small[(#small + 1) // 2] / 2
-- slope: least squares of T - 2 alpha against n over the large sizes
local sxx, sxy = 0, 0
for i, n in ipairs(sizes) do
  if n >= 256 * 1024 then
    sxx, sxy = sxx + n * n, sxy + n * (times[i] - 2 * alpha_shm)
  end
end
local slope = sxy / sxx                              -- beta + gamma / 2 on 2 ranks
local gamma = 1 / (GAMMA_GBPS * 1e9)
local beta_shm = math.max(slope - gamma / 2, 0)
print(("Fitted on 2 ranks of shared memory: alpha = %.2f us, beta + gamma/2 = %.3f ns/byte (%.2f GB/s); "
       .. "with gamma = %.3f ns/byte (%g GB/s), beta = %.3f ns/byte (%.2f GB/s)"):format(alpha_shm * 1e6, slope * 1e9,
       1 / slope / 1e9, gamma * 1e9, GAMMA_GBPS, beta_shm * 1e9, beta_shm > 0 and 1 / beta_shm / 1e9 or math.huge))
-- delta: what DistributedOptimizer's path adds per byte (packing into the
-- fusion buffer, the result's allocation and copy), from the 2-process rows'
-- allreduce of one step's gradients against the in-place model
local deltas = {}
for _, st in ipairs(steps) do
  if st.ar_ms then
    local n = st.mb * 1e6
    deltas[#deltas + 1] = (st.ar_ms * 1e-3 - (2 * alpha_shm + n * slope)) / n
  end
end
table.sort(deltas)
local delta = #deltas > 0 and math.max(deltas[(#deltas + 1) // 2], 0) or 0
print(("DistributedOptimizer's copies add delta = %.3f ns/byte (median of %d training runs' gradient allreduce "
       .. "against the in-place fit)"):format(delta * 1e9, #deltas))
print()
print("| bytes | measured us | model us | model / measured |")
print("|---:|---:|---:|---:|")
for i, n in ipairs(sizes) do
  local m = 2 * alpha_shm + n * slope
  print(("| %d | %.1f | %.1f | %.2f |"):format(n, times[i] * 1e6, m * 1e6, m / times[i]))
end
print()

local function ring (n, p, alpha, beta)
  return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma + n * delta
end
-- the logs' two small calls per step (shape check + sum: recursive doubling)
local function small_calls (p, alpha) return 2 * math.ceil(math.log(p, 2)) * alpha end

local NETS = {{"10 Gbit/s Ethernet, TCP", 10, 25e-6}, {"25 Gbit/s Ethernet, TCP", 25, 15e-6},
              {"100 Gbit/s InfiniBand/RoCE", 100, 3e-6}}
local RANKS = {8, 64, 512}

-- one line per model: the 1-process 1-thread step and the gradients' bytes
local models = {}
for _, s in ipairs(steps) do
  if s.case:find("^1 process, 1 thread") and not models[s.model] then
    models[s.model] = {ms = s.ms, mb = s.mb}
    models[#models + 1] = s.model
  end
end
print("Weak scaling (each rank keeps its batch): efficiency = compute / (compute + allreduce), no overlap; "
      .. "allreduce = the ring + delta + the logs' two small calls")
print()
local head = "| model (step on 1 rank, gradients) | network |"
local rule = "|---|---|"
for _, p in ipairs(RANKS) do head = head .. (" %d ranks: allreduce ms, efficiency |"):format(p); rule = rule .. "---:|" end
print(head)
print(rule)
for _, name in ipairs(models) do
  local m = models[name]
  for _, net in ipairs(NETS) do
    local beta = 8 / (net[2] * 1e9)
    local row = ("| %s (%.0f ms, %.2f MB) | %s |"):format(name, m.ms, m.mb, net[1])
    for _, p in ipairs(RANKS) do
      local t = ring(m.mb * 1e6, p, net[3], beta) + small_calls(p, net[3])
      row = row .. (" %.1f, %.0f%% |"):format(t * 1e3, 100 * m.ms / (m.ms + t * 1e3))
    end
    print(row)
  end
end
print()
print("The same with a rank 10x faster at computing (a many-core socket or an accelerator; the step / 10):")
print()
print(head)
print(rule)
for _, name in ipairs(models) do
  local m = models[name]
  for _, net in ipairs(NETS) do
    local beta = 8 / (net[2] * 1e9)
    local row = ("| %s (%.1f ms, %.2f MB) | %s |"):format(name, m.ms / 10, m.mb, net[1])
    for _, p in ipairs(RANKS) do
      local t = ring(m.mb * 1e6, p, net[3], beta) + small_calls(p, net[3])
      row = row .. (" %.1f, %.0f%% |"):format(t * 1e3, 100 * (m.ms / 10) / (m.ms / 10 + t * 1e3))
    end
    print(row)
  end
end

-- bench/gemm.lua: mg.matmul against the raw libraries on every GEMM shape a
-- training step makes (forward x @ W, input gradient dout @ W^T, weight
-- gradient x^T @ dout) for the MLP 784-1024-1024-10 at batches 1, 32, 128,
-- the 1024x2048 tanh chain and a width-256 transformer, at 1 and 2 threads.
-- GFLOPS, the median over alternating fresh processes of each one's median
-- (default 3 rounds); "best" is the fastest of oneDNN's dnnl_sgemm, oneDNN's
-- matmul primitive (made once) and OpenBLAS' cblas_sgemm (its OpenMP build,
-- with the core type bench/run.sh sets: util.openblas_core), called directly from C (bench/gemm_shapes.c), and the ratio is mg.matmul /
-- best (target >= 0.9).
--   build/moongrad bench/gemm.lua [rounds]   (needs build/gemm_shapes: make bench builds it)
--   build/moongrad bench/gemm.lua worker THREADS M N K TA TB   (one mg.matmul figure)
local mg = mg or require "moongrad"
local median = require("bench.util").median

-- {=========================== the cases ==========================

-- M, N, K of the product and whether A and B are transposed views
local function step_shapes (batch, fan_in, fan_out)
  return {
    {batch, fan_out, fan_in, "N", "N", "x @ W"},
    {batch, fan_in, fan_out, "N", "T", "dout @ W^T"},
    {fan_in, fan_out, batch, "T", "N", "x^T @ dout"},
  }
end

local CASES = {}
local function add (title, list)
  for _, s in ipairs(list) do CASES[#CASES + 1] = {title, table.unpack(s)} end
end
for _, b in ipairs{1, 32, 128} do
  add("MLP batch " .. b .. ", 784->1024", step_shapes(b, 784, 1024))
  add("MLP batch " .. b .. ", 1024->1024", step_shapes(b, 1024, 1024))
  add("MLP batch " .. b .. ", 1024->10", step_shapes(b, 1024, 10))
end
add("chain 1024x2048", step_shapes(1024, 2048, 2048))
add("GPT 32x64 tokens, 256->768", step_shapes(2048, 256, 768))
add("GPT 32x64 tokens, 1024->256", step_shapes(2048, 1024, 256))

-- }=============================================================


-- {=========================== a worker ===========================

local function worker (threads, m, n, k, ta, tb)
  mg.set_num_threads(threads)
  mg.random.seed(0)
  -- a transposed operand is a transposed view of a contiguous tensor, as
  -- the gradient rules make them
  local a = ta == "T" and mg.transpose(mg.random.normal{k, m}) or mg.random.normal{m, k}
  local b = tb == "T" and mg.transpose(mg.random.normal{n, k}) or mg.random.normal{k, n}
  local function call () return mg.matmul(a, b) end
  call()
  local t0 = mg.clock()
  call()
  local one = mg.clock() - t0
  local reps = one > 0.02 and 1 or math.floor(0.02 / math.max(one, 1e-7)) + 1
  local ts = {}
  for r = 1, 7 do
    t0 = mg.clock()
    for _ = 1, reps do call() end
    ts[r] = (mg.clock() - t0) / reps
  end
  print(("%.2f"):format(2 * m * n * k / median(ts) / 1e9))
end

if arg and arg[1] == "worker" then
  worker(tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5]), arg[6], arg[7])
  return
end

-- }=============================================================


-- {=========================== the table ==========================

local BIN = arg and arg[-1] or "build/moongrad"
local sh = require("bench.util").sh
local function exists (path) local f = io.open(path) if f then f:close() end return f ~= nil end
if not exists("build/gemm_shapes") then error("bench/gemm.lua: build/gemm_shapes is missing (make bench builds it)", 0) end

local cpu, isa = require("bench.util").machine()
print(("### GEMM shapes on %s (%s), %s"):format(cpu, isa, os.date("!%Y-%m-%d %H:%M UTC")))
print(("OpenBLAS runs its %s kernels (OPENBLAS_CORETYPE=%s)."):format(sh("build/gemm_shapes core"):gsub("%s+$", ""),
                                                                   os.getenv("OPENBLAS_CORETYPE") or "unset"))
print()
print("| threads | case | M x N x K | product | mg.matmul | oneDNN sgemm | oneDNN matmul | OpenBLAS | best | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|")
local ROUNDS = tonumber(arg and arg[1]) or 3
local worst = math.huge
for _, threads in ipairs{1, 2} do
  for _, c in ipairs(CASES) do
    local title, m, n, k, ta, tb, what = table.unpack(c)
    local dims = ("%d %d %d %s %s"):format(m, n, k, ta, tb)
    local mine, d, o, p = {}, {}, {}, {}
    for r = 1, ROUNDS do                         -- alternating fresh processes
      mine[r] = tonumber(sh(("%s bench/gemm.lua worker %d %s"):format(BIN, threads, dims)))
      local dr, orr, pr = sh(("build/gemm_shapes %d %s"):format(threads, dims)):match("([%d.]+) ([%d.]+) ([%d.]+)")
      d[r], o[r], p[r] = tonumber(dr), tonumber(orr), tonumber(pr)
    end
    mine, d, o, p = median(mine), median(d), median(o), median(p)
    local best = math.max(d, o, p)
    worst = math.min(worst, mine / best)
    print(("| %d | %s | %dx%dx%d | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2fx |"):format(
      threads, title, m, n, k, what, mine, d, p, o, best, mine / best))
    io.stdout:flush()
  end
end
print(("worst ratio: %.2fx (target >= 0.90x)"):format(worst))

-- }=============================================================

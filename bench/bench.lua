-- bench/bench.lua: moongrad side by side with PyTorch (and the machine's
-- sgemm ceiling), each case run as fresh processes, alternating moongrad
-- and PyTorch, several rounds; medians and ratios to stdout and to this
-- machine's section of bench/RESULTS.md.   build/moongrad bench/bench.lua [rounds]
local mg = mg or require "moongrad"

local ROUNDS = tonumber(arg and arg[1]) or 5
local BIN = os.getenv("MOONGRAD_BIN") or "build/moongrad"
local PY = "/usr/bin/python3"

local function sh (cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

local has_torch = select(2, sh(PY .. " -c 'import torch'"))
local has_ceiling = select(2, sh("test -x build/gemm_ceiling"))

local function run (cmd)
  local out, ok = sh(cmd)
  if not ok then error("bench: `" .. cmd .. "` failed:\n" .. out) end
  local vals = {}
  for v in out:gmatch("[-%d.]+") do vals[#vals + 1] = tonumber(v) end
  return vals
end

local median = require("bench.util").median

-- runs the commands in turn, `rounds` times; returns the median of each value
local function alternate (cmds, rounds)
  local got = {}
  for _ = 1, rounds do
    for name, cmd in pairs(cmds) do
      got[name] = got[name] or {}
      for i, v in ipairs(run(cmd)) do
        got[name][i] = got[name][i] or {}
        table.insert(got[name][i], v)
      end
    end
  end
  local med = {}
  for name, cols in pairs(got) do
    med[name] = {}
    for i, col in ipairs(cols) do med[name][i] = median(col) end
  end
  return med
end

local function mgcmd (threads, args) return ("OMP_NUM_THREADS=%d %s bench/cases.lua %s"):format(threads, BIN, args) end
local function pycmd (threads, args) return ("OMP_NUM_THREADS=%d %s bench/torch_peer.py %s"):format(threads, PY, args) end

local rows = {}
local function row (case, mgv, torchv, unit, target, lower_is_better)
  local ratio = torchv and mgv / torchv or nil
  rows[#rows + 1] = {case = case, mg = mgv, torch = torchv, unit = unit, ratio = ratio, target = target}
  print(("%-46s %10.3f %10s %-7s %8s   %s"):format(case, mgv, torchv and ("%.3f"):format(torchv) or "-", unit,
        ratio and ("%.2fx"):format(ratio) or "-", target or ""))
  local _ = lower_is_better
end

print(("moongrad vs PyTorch, medians of %d alternating rounds%s"):format(ROUNDS,
      has_torch and "" or " (PyTorch not available: the peer is skipped)"))
print(("%-46s %10s %10s %-7s %8s   %s"):format("case", "moongrad", "PyTorch", "unit", "ratio", "target"))

local function case (name, args, threads, rounds, unit, target, torch_threads)
  local cmds = {mg = mgcmd(threads, args)}
  if has_torch then cmds.torch = pycmd(torch_threads or threads, args) end
  local m = alternate(cmds, rounds or ROUNDS)
  row(name, m.mg[1], m.torch and m.torch[1], unit, target)
  return m
end

-- (a) per-op overhead
for _, size in ipairs({1, 1000}) do
  for _, tape in ipairs({0, 1}) do
    case(("a + b, %d element%s, %s"):format(size, size > 1 and "s" or "", tape == 1 and "recording tape" or "no tape"),
         ("op %d %d"):format(size, tape), 1, nil, "us/op", tape == 0 and "<= 0.20x" or "<= 0.25x")
  end
end

-- (b) the seed chain
case("seed chain: 4 x (x * y), then gradient", "seed", 1, nil, "us/iter", "<= 0.10x")
if select(2, sh("test -f build/lua_floor.so")) then    -- (make bench builds it)
  row("seed chain, Lua's own share (bench/lua_floor.c)", alternate({mg = mgcmd(1, "seed_floor")}, ROUNDS).mg[1], nil,
      "us/iter")
end

-- (c) MLP training step, each side at its best thread count
for _, batch in ipairs({32, 128}) do
  local best = {}
  for _, threads in ipairs({1, 2}) do
    local cmds = {mg = mgcmd(threads, "mlp " .. batch)}
    if has_torch then cmds.torch = pycmd(threads, "mlp " .. batch) end
    local m = alternate(cmds, ROUNDS)
    for side, v in pairs(m) do
      if not best[side] or v[1] < best[side].v then best[side] = {v = v[1], threads = threads} end
    end
    row(("MLP 784-1024-1024-10 step, batch %d, %d thread%s"):format(batch, threads, threads > 1 and "s" or ""),
        m.mg[1], m.torch and m.torch[1], "ms", threads == 1 and "<= 0.80x" or nil)
  end
  row(("MLP step, batch %d, each at its best (mg %d, torch %s thr)"):format(batch, best.mg.threads,
      best.torch and best.torch.threads or "-"), best.mg.v, best.torch and best.torch.v, "ms", "<= 0.50x")
end

-- (d) recompute chain vs torch.utils.checkpoint: 16 x tanh(x @ W), width 1024, batch 2048
local ck = {}
for _, mode in ipairs({"plain", "every"}) do
  local cmds = {mg = mgcmd(2, "ckpt " .. mode .. " 1024 2048 16")}
  if has_torch then cmds.torch = pycmd(2, "ckpt " .. mode .. " 1024 2048 16") end
  ck[mode] = alternate(cmds, math.max(1, ROUNDS // 2))
  local label = mode == "plain" and "plain" or "recompute layers 2..16"
  row("chain 16 x tanh(x@W) 1024x2048, " .. label .. ": step", ck[mode].mg[1], ck[mode].torch and ck[mode].torch[1], "ms",
      "<= 0.80x")
  row("chain ..., " .. label .. ": peak RSS above start", ck[mode].mg[2], ck[mode].torch and ck[mode].torch[2], "MiB")
  row("chain ..., " .. label .. ": moongrad's counters, peak", ck[mode].mg[3], nil, "MiB")
end
local mg_over = ck.every.mg[1] / ck.plain.mg[1]
local torch_over = has_torch and ck.every.torch[1] / ck.plain.torch[1] or nil
row("recompute time overhead (every / plain)", mg_over, torch_over, "x", "<= PyTorch's")

-- (e) matmul against the machine's ceiling
for _, n in ipairs({256, 1024, 2048}) do
  local cmds = {mg = mgcmd(2, "matmul " .. n)}
  if has_torch then cmds.torch1 = pycmd(1, "matmul " .. n); cmds.torch2 = pycmd(2, "matmul " .. n) end
  if has_ceiling then
    cmds.dnnl = ("OMP_NUM_THREADS=2 build/gemm_ceiling dnnl %d"):format(n)
    cmds.openblas = ("OPENBLAS_NUM_THREADS=2 build/gemm_ceiling openblas %d"):format(n)
  end
  local m = alternate(cmds, ROUNDS)
  local torch_best = m.torch1 and math.max(m.torch1[1], m.torch2[1])
  row(("matmul %d, 2 threads (GFLOPS; ratio: higher is better)"):format(n), m.mg[1], torch_best, "GFLOPS")
  if m.dnnl then
    local ceiling = math.max(m.dnnl[1], m.openblas[1])
    row(("matmul %d vs ceiling (oneDNN %.0f, OpenBLAS %.0f)"):format(n, m.dnnl[1], m.openblas[1]),
        m.mg[1], ceiling, "GFLOPS", ">= 0.90x")
  end
end

-- this machine's section of bench/RESULTS.md: bench/results/<cpu>-<isa>.md
-- (bench/run.sh appends the other benchmarks' tables, and bench/assemble.lua
-- puts every machine's section together)
local util = require("bench.util")
local machine, isa = util.machine()
local cores = sh("nproc"):gsub("\n", "")
local torch_version = has_torch and sh(PY .. " -c 'import torch; print(torch.__version__)'"):gsub("\n", "") or "absent"
local path = util.results_path()
local f = assert(io.open(path, "w"))
f:write(("## %s, %s (%s cores)\n\n"):format(machine, isa, cores))
f:write(("Measured %s, %s, PyTorch %s (Debian python3-torch), oneDNN 2.6 (Debian libdnnl-dev), OpenBLAS 0.3.21 " ..
  "(Debian's OpenMP build), every process with OPENBLAS_CORETYPE=%s (PyTorch's products go to OpenBLAS).\n"):format(
  os.date("!%Y-%m-%d %H:%M UTC"), mg.version, torch_version, os.getenv("OPENBLAS_CORETYPE") or "unset"))
f:write(("Command: `make bench`. `bench/bench.lua %d`: every figure is the median of %d rounds; " ..
  "each round runs moongrad and PyTorch as fresh processes, one after the other. Ratios are moongrad / PyTorch " ..
  "(lower is better) except for GFLOPS.\n\n"):format(ROUNDS, ROUNDS))
f:write("| case | moongrad | PyTorch | unit | ratio | target |\n|---|---|---|---|---|---|\n")
for _, r in ipairs(rows) do
  f:write(("| %s | %.3f | %s | %s | %s | %s |\n"):format(r.case, r.mg, r.torch and ("%.3f"):format(r.torch) or "-",
    r.unit, r.ratio and ("%.2fx"):format(r.ratio) or "-", r.target or ""))
end
f:close()
print("\nwrote " .. path)

-- bench/gpt.lua: one training step of a GPT (4 pre-norm blocks, width 256,
-- 4 heads, context 64, batch 32, 64 tokens; AdamW) next to the same model in
-- PyTorch (bench/gpt_peer.py), plainly and with each block recomputed
-- (recompute_grad here, torch.utils.checkpoint there), at 1 and 2 threads.
-- moongrad also runs with attention as plain ops ({fused = false}: batched
-- matmul, masked softmax, matmul) to show what the fused primitive pays.
-- Each round runs every case as a fresh process, moongrad's and PyTorch's in
-- turn; a figure is the median over rounds of each process's median step.
-- Memory, per process: the peak of moongrad's counters above what was live
-- before the steps (the model and the optimizer's slots), what the tape
-- holds after the forward (PyTorch: the bytes its autograd graph saves,
-- counted through saved_tensors_hooks; plain only), and the peak RSS above
-- the same point for both (VmHWM, reset through /proc/self/clear_refs).
--   build/moongrad bench/gpt.lua [rounds] [reps] [threads]   (default 3 rounds of 5 steps, threads 1,2)
--   build/moongrad bench/gpt.lua quick                        (tiny sizes, one round, no peer: a smoke test)
--   build/moongrad bench/gpt.lua worker MODE THREADS REPS [quick]
local mg = mg or require "moongrad"

local PY = "/usr/bin/python3"
local median = require("bench.util").median

-- keep in step with gpt_peer.py
local SIZES = {B = 32, T = 64, D = 256, H = 4, L = 4, V = 64}
local QUICK = {B = 2, T = 8, D = 16, H = 2, L = 2, V = 11}

-- {========================== a worker ==========================

local function rss_mib (field)
  local f = io.open("/proc/self/status")
  local s = f and f:read("a") or ""
  if f then f:close() end
  return (tonumber(s:match(field .. ":%s*(%d+)")) or 0) / 1024
end

local function reset_hwm ()
  local f = io.open("/proc/self/clear_refs", "w")
  if f then f:write("5"); f:close() end
end

local function worker (mode, threads, reps, quick)
  mg.set_num_threads(threads)
  local S, nn = quick and QUICK or SIZES, mg.nn
  mg.random.seed(0)
  local layers = {nn.Embedding(S.V, S.D), nn.PositionalEmbedding(S.T)}
  for _ = 1, S.L do
    local b = nn.TransformerBlock(S.H, S.D, {causal = true, fused = mode ~= "ops"})
    layers[#layers + 1] = mode == "recompute" and mg.recompute_grad(b) or b
  end
  layers[#layers + 1] = nn.LayerNorm()
  layers[#layers + 1] = nn.Dense(S.V)
  local model = nn.Sequential(layers)
  local ids = mg.cast(mg.random.uniform({S.B, S.T}, 1, S.V + 1) // 1, "int64")
  local targets = mg.cast(mg.random.uniform({S.B, S.T}, 1, S.V + 1) // 1, "int64")
  model(ids)
  local vars = model.trainable_variables
  local opt = mg.optim.AdamW{learning_rate = 1e-4}
  opt:build(vars)
  local held
  local function step ()
    local t = mg.tape()
    local loss = mg.losses.sparse_categorical_crossentropy(targets, model(ids), {from_logits = true})
    t:stop()
    held = held or t:saved_bytes()
    opt:apply_gradients(t:gradient(loss, vars), vars)
  end
  collectgarbage()
  reset_hwm()
  mg.memory.reset_peak()
  local rss0, c0 = rss_mib("VmRSS"), mg.memory.stats().current_bytes
  step()
  step()
  local ts = {}
  for r = 1, reps do
    local t0 = mg.clock()
    step()
    ts[r] = mg.clock() - t0
  end
  print(("step\t%.3f"):format(median(ts) * 1e3))
  print(("held\t%.2f"):format(held / 2^20))
  print(("peak\t%.2f"):format((mg.memory.stats().peak_bytes - c0) / 2^20))
  print(("rss\t%.2f"):format(rss_mib("VmHWM") - rss0))
  io.stdout:flush()
end

if arg and arg[1] == "worker" then
  worker(arg[2], tonumber(arg[3]), tonumber(arg[4]), arg[5] == "quick")
  return
end

-- }=============================================================


-- {========================== the driver ========================

local quick = arg and arg[1] == "quick"
local ROUNDS = quick and 1 or tonumber(arg and arg[1]) or 3
local REPS = quick and 1 or tonumber(arg and arg[2]) or 5
local THREADS = {}
for n in ((not quick and arg and arg[3]) or (quick and "1" or "1,2")):gmatch("%d+") do THREADS[#THREADS + 1] = tonumber(n) end
local BIN = arg and arg[-1] or "build/moongrad"

local has_torch = false
if not quick then
  local p = io.popen(PY .. " -c 'import torch' 2>/dev/null && echo yes")
  has_torch = p:read("a"):match("yes") ~= nil
  p:close()
end

-- runs cmd; adds each "<key>\t<number>" line to into[key]
local function collect (cmd, into)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  p:close()
  local n = 0
  for line in out:gmatch("[^\n]+") do
    local key, v = line:match("^(%a+)\t([%d.%-]+)$")
    if key then
      into[key] = into[key] or {}
      table.insert(into[key], tonumber(v))
      n = n + 1
    end
  end
  if n == 0 then error("bench/gpt.lua: no figures from: " .. cmd .. "\n" .. out) end
end

local function cpu ()
  local f = io.open("/proc/cpuinfo")
  local info = f and f:read("a") or ""
  if f then f:close() end
  local model = info:match("model name%s*:%s*([^\n]+)") or "unknown CPU"
  return model .. (info:find("avx512f") and ", AVX-512" or info:find("avx2") and ", AVX2" or "")
end

local S = quick and QUICK or SIZES
print(("%s vs PyTorch: one GPT training step (%d blocks, width %d, %d heads, context %d, batch %d, vocab %d, AdamW), %s")
      :format(mg.version, S.L, S.D, S.H, S.T, S.B, S.V, cpu()))
print(("medians over %d round%s of %d steps (each round: every case as a fresh process, moongrad's and PyTorch's in turn)%s")
      :format(ROUNDS, ROUNDS > 1 and "s" or "", REPS, (quick or has_torch) and "" or "; PyTorch not available"))
print()

local function fmt (v, unit) return v and ("%.1f %s"):format(v, unit) or "-" end
local function ratio (a, b) return a and b and b > 0 and ("%.2fx"):format(a / b) or "-" end

print("| case | threads | moongrad | PyTorch | ratio |")
print("|---|---|---|---|---|")
for _, threads in ipairs(THREADS) do
  local mg_runs, torch_runs = {}, {}
  for _, mode in ipairs({"plain", "recompute", "ops"}) do mg_runs[mode] = {} end
  for _, mode in ipairs({"plain", "recompute"}) do torch_runs[mode] = {} end
  for _ = 1, ROUNDS do
    for _, mode in ipairs({"plain", "recompute", "ops"}) do
      collect(("OMP_NUM_THREADS=%d %s bench/gpt.lua worker %s %d %d%s"):format(threads, BIN, mode, threads, REPS,
              quick and " quick" or ""), mg_runs[mode])
      if has_torch and mode ~= "ops" then
        collect(("OMP_NUM_THREADS=%d %s bench/gpt_peer.py %s %d %d"):format(threads, PY, mode, threads, REPS),
                torch_runs[mode])
      end
    end
  end
  local function m (runs, key) return runs[key] and median(runs[key]) end
  local function row (name, a, b, unit)
    print(("| %s | %d | %s | %s | %s |"):format(name, threads, fmt(a, unit), fmt(b, unit), ratio(a, b)))
  end
  local mp, mr, mo = mg_runs.plain, mg_runs.recompute, mg_runs.ops
  local tp, tr = torch_runs.plain, torch_runs.recompute
  row("step, plain", m(mp, "step"), m(tp, "step"), "ms")
  row("step, recompute per block", m(mr, "step"), m(tr, "step"), "ms")
  print(("| recompute / plain, time | %d | %s | %s | |"):format(threads, ratio(m(mr, "step"), m(mp, "step")),
        ratio(m(tr, "step"), m(tp, "step"))))
  row("step, attention as plain ops (moongrad)", m(mo, "step"), nil, "ms")
  row("held by the tape after the forward, plain", m(mp, "held"), m(tp, "held"), "MiB")
  row("held by the tape after the forward, recompute", m(mr, "held"), nil, "MiB")
  row("held by the tape, attention as plain ops", m(mo, "held"), nil, "MiB")
  print(("| plain / recompute, held | %d | %s | | |"):format(threads, ratio(m(mp, "held"), m(mr, "held"))))
  row("peak above the model (counters), plain", m(mp, "peak"), nil, "MiB")
  row("peak above the model (counters), recompute", m(mr, "peak"), nil, "MiB")
  print(("| plain / recompute, peak (counters) | %d | %s | | |"):format(threads, ratio(m(mp, "peak"), m(mr, "peak"))))
  row("peak RSS above the model, plain", m(mp, "rss"), m(tp, "rss"), "MiB")
  row("peak RSS above the model, recompute", m(mr, "rss"), m(tr, "rss"), "MiB")
  print(("| plain / recompute, peak RSS | %d | %s | %s | |"):format(threads, ratio(m(mp, "rss"), m(mr, "rss")),
        ratio(m(tp, "rss"), m(tr, "rss"))))
end

-- }=============================================================

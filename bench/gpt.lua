-- bench/gpt.lua: one training step of a GPT (4 pre-norm blocks, width 256,
-- 4 heads, context 64, batch 32, 64 tokens; AdamW) next to the same model in
-- PyTorch (bench/gpt_peer.py), plainly and with each block recomputed
-- (recompute_grad here, torch.utils.checkpoint there), or every block but
-- the last (whose activations the backward needs at once), at 1 and 2
-- threads; it prints a section of bench/RESULTS.md, with the issue's targets.
-- moongrad also runs with attention as plain ops ({fused = false}: batched
-- matmul, masked softmax, matmul) to show what the fused primitive pays.
-- Each round runs every case as a fresh process, moongrad's and PyTorch's in
-- turn; a figure is the median over rounds of each process's median step.
-- Memory, per process: the peak of moongrad's counters above what was live
-- after two warm-up steps (the model and AdamW's slots), the activations at
-- their peak (the bytes tapes save, peak_saved_bytes: recompute's target),
-- what the tape holds after the forward (PyTorch: the bytes its autograd
-- graph saves, counted through saved_tensors_hooks; plain only), and the
-- peak RSS above the model before the first step, so with the slots the
-- first step makes, for both (VmHWM, reset through /proc/self/clear_refs).
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
  for i = 1, S.L do
    local b = nn.TransformerBlock(S.H, S.D, {causal = true, fused = mode ~= "ops"})
    local wrap = mode == "recompute" or (mode == "recompute_but_last" and i < S.L)
    layers[#layers + 1] = wrap and mg.recompute_grad(b) or b
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
  local rss0 = rss_mib("VmRSS")
  step()
  step()
  -- the counters' baseline: the model and the optimizer's slots (AdamW
  -- makes them at its first step, PyTorch's too), the two warm-up steps' garbage collected
  collectgarbage()
  mg.memory.reset_peak()
  local c0 = mg.memory.stats().current_bytes
  local ts = {}
  for r = 1, reps do
    local t0 = mg.clock()
    step()
    ts[r] = mg.clock() - t0
  end
  print(("step\t%.3f"):format(median(ts) * 1e3))
  print(("held\t%.2f"):format(held / 2^20))
  print(("peak\t%.2f"):format((mg.memory.stats().peak_bytes - c0) / 2^20))
  print(("saved\t%.2f"):format(mg.memory.stats().peak_saved_bytes / 2^20))
  print(("rss\t%.2f"):format(rss_mib("VmHWM") - rss0))
  io.stdout:flush()
end

if arg and arg[1] == "worker" then
  worker(arg[2], tonumber(arg[3]) or arg[3], tonumber(arg[4]), arg[5] == "quick")
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
local MG_MODES = {"plain", "recompute", "recompute_but_last", "ops"}
local TORCH_MODES = {"plain", "recompute", "recompute_but_last"}

-- every case at every thread count, fresh processes in turn, ROUNDS times
local runs = {}                          -- runs[threads][side][mode][key] = list
for _, threads in ipairs(THREADS) do
  runs[threads] = {mg = {}, torch = {}}
  for _, mode in ipairs(MG_MODES) do runs[threads].mg[mode] = {} end
  for _, mode in ipairs(TORCH_MODES) do runs[threads].torch[mode] = {} end
end
for _ = 1, ROUNDS do
  for _, threads in ipairs(THREADS) do
    for _, mode in ipairs(MG_MODES) do
      collect(("OMP_NUM_THREADS=%d %s bench/gpt.lua worker %s %d %d%s"):format(threads, BIN, mode, threads, REPS,
              quick and " quick" or ""), runs[threads].mg[mode])
      if has_torch and runs[threads].torch[mode] then
        collect(("OMP_NUM_THREADS=%d %s bench/gpt_peer.py %s %d %d"):format(threads, PY, mode, threads, REPS),
                runs[threads].torch[mode])
      end
    end
  end
end

local function m (threads, side, mode, key)
  local r = runs[threads][side][mode]
  return r and r[key] and median(r[key])
end
local function fmt (v, unit) return v and ("%.1f %s"):format(v, unit) or "-" end
local function ratio (a, b) return a and b and b > 0 and ("%.2fx"):format(a / b) or "-" end

local model, isa = require("bench.util").machine()
local torch_version = "-"
if has_torch then
  local p = io.popen(PY .. " -c 'import torch; print(torch.__version__)'")
  torch_version = p:read("a"):gsub("%s+$", "")
  p:close()
end
local cores = 0
do
  local f = io.open("/proc/cpuinfo")
  for _ in (f and f:read("a") or ""):gmatch("processor%s*:") do cores = cores + 1 end
  if f then f:close() end
end
print(("### GPT training step on %s (%s, %d cores)"):format(model, isa, cores))
print()
print(("Measured %s, %s, PyTorch %s (Debian python3-torch). Command: `build/moongrad bench/gpt.lua %d %d` "
       .. "(bench/gpt.lua, bench/gpt_peer.py). One training step (forward, cross-entropy, backward, AdamW) of a GPT: "
       .. "%d pre-norm blocks, width %d, %d heads, context %d, batch %d, vocabulary %d; moongrad's attention is "
       .. "the fused scaled_dot_product_attention, PyTorch's nanoGPT's plain ops (1.13 has no fused one). "
       .. "Recompute: each block under recompute_grad / torch.utils.checkpoint (use_reentrant=False); \"but the "
       .. "last\": every block but the last, whose activations the backward needs at once. Every figure is the "
       .. "median over %d rounds of each process's median of %d steps; each round runs every case as a fresh "
       .. "process, moongrad's and PyTorch's in turn. Ratios are moongrad / PyTorch unless the row says otherwise.")
      :format(os.date("!%Y-%m-%d %H:%M UTC"), mg.version, torch_version, ROUNDS, REPS, S.L, S.D, S.H, S.T, S.B, S.V,
              ROUNDS, REPS))
print()
print("| case | threads | moongrad | PyTorch | ratio |")
print("|---|---|---|---|---|")
for _, threads in ipairs(THREADS) do
  local function row (name, key, mode, unit, torch_too)
    local a = m(threads, "mg", mode, key)
    local b = torch_too and m(threads, "torch", mode, key) or nil
    print(("| %s | %d | %s | %s | %s |"):format(name, threads, fmt(a, unit), fmt(b, unit), ratio(a, b)))
  end
  local function own (name, key, a_mode, b_mode)    -- a ratio within each library
    print(("| %s | %d | %s | %s | |"):format(name, threads, ratio(m(threads, "mg", a_mode, key), m(threads, "mg", b_mode, key)),
          ratio(m(threads, "torch", a_mode, key), m(threads, "torch", b_mode, key))))
  end
  row("step, plain", "step", "plain", "ms", true)
  row("step, recompute every block", "step", "recompute", "ms", true)
  row("step, recompute every block but the last", "step", "recompute_but_last", "ms", true)
  row("step, attention as plain ops (fused=false)", "step", "ops", "ms")
  own("time: recompute every block / plain", "step", "recompute", "plain")
  own("time: recompute but the last / plain", "step", "recompute_but_last", "plain")
  row("held by the tape after the forward, plain", "held", "plain", "MiB", true)
  row("held, recompute every block", "held", "recompute", "MiB")
  row("held, recompute but the last", "held", "recompute_but_last", "MiB")
  row("held, attention as plain ops", "held", "ops", "MiB")
  own("held: plain / recompute every block", "held", "plain", "recompute")
  row("activations at their peak (bytes tapes save), plain", "saved", "plain", "MiB")
  row("activations at their peak, recompute every block", "saved", "recompute", "MiB")
  row("activations at their peak, recompute but the last", "saved", "recompute_but_last", "MiB")
  own("activations at their peak: plain / recompute every block", "saved", "plain", "recompute")
  row("peak above the model and AdamW's slots (counters), plain", "peak", "plain", "MiB")
  row("peak (counters), recompute every block", "peak", "recompute", "MiB")
  row("peak (counters), recompute but the last", "peak", "recompute_but_last", "MiB")
  own("peak (counters): plain / recompute every block", "peak", "plain", "recompute")
  own("peak (counters): plain / recompute but the last", "peak", "plain", "recompute_but_last")
  row("peak RSS above the model, plain", "rss", "plain", "MiB", true)
  row("peak RSS, recompute every block", "rss", "recompute", "MiB", true)
  row("peak RSS, recompute but the last", "rss", "recompute_but_last", "MiB", true)
  own("peak RSS: plain / recompute every block", "rss", "plain", "recompute")
end

-- the issue's targets, each library at its faster thread count
local function best (side, mode)
  local v, at
  for _, threads in ipairs(THREADS) do
    local x = m(threads, side, mode, "step")
    if x and (not v or x < v) then v, at = x, threads end
  end
  return v, at
end
local mp, mt = best("mg", "plain")
local tp, tt = best("torch", "plain")
print()
print("| target | measured | met |")
print("|---|---|---|")
local function target (name, v, ok) print(("| %s | %s | %s |"):format(name, v, ok == nil and "-" or ok and "yes" or "no")) end
target(("plain step <= 0.70x PyTorch's, each at its faster thread count (moongrad %s, PyTorch %s)"):format(
  mt and mt .. " thr" or "-", tt and tt .. " thr" or "-"), ratio(mp, tp), mp and tp and mp / tp <= 0.70)
if mt then
  for _, mode in ipairs({"recompute", "recompute_but_last"}) do
    local label = mode == "recompute" and "every block" or "every block but the last"
    local held = m(mt, "mg", "plain", "held") / m(mt, "mg", mode, "held")
    local saved = m(mt, "mg", "plain", "saved") / m(mt, "mg", mode, "saved")
    local peak = m(mt, "mg", "plain", "peak") / m(mt, "mg", mode, "peak")
    local time = m(mt, "mg", mode, "step") / m(mt, "mg", "plain", "step")
    target(("recompute %s: held by the tape after the forward >= 3x less"):format(label), ("%.2fx"):format(held), held >= 3)
    target(("recompute %s: peak activation memory (bytes tapes save, at their peak) >= 3x less"):format(label),
           ("%.2fx"):format(saved), saved >= 3)
    target(("recompute %s: whole step's peak above the model and slots (activations, gradients, temporaries; "
            .. "not a target)"):format(label), ("%.2fx less"):format(peak), nil)
    target(("recompute %s: step time <= 1.35x plain (%d thr)"):format(label, mt), ("%.2fx"):format(time), time <= 1.35)
  end
end

-- }=============================================================

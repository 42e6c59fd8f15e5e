-- bench/autocast.lua: bfloat16 autocast against float32 and PyTorch's CPU
-- autocast (torch.autocast("cpu", dtype=torch.bfloat16)), in one run:
--  1. the GEMM shapes of a training step in bfloat16: mg.matmul of bfloat16
--     operands (transposed views as the gradients make them) against
--     oneDNN's own bfloat16 matmul primitive called from C
--     (bench/gemm_bf16_ceiling.c, bfloat16 output as mg.matmul gives) and
--     torch.matmul on bfloat16; target >= 0.9x the ceiling over 1 MFLOP;
--  2. training steps (forward, loss, gradient, optimizer update) of the MLP
--     784-1024-1024-10 (batch 128), the Fashion-MNIST CNN (batch 128) and the
--     bench's GPT (4 blocks, width 256, batch 32 x 64 tokens), moongrad in
--     float32 and under mg.autocast("bfloat16"), PyTorch in float32 and under
--     its autocast (bench/autocast_peer.py), with the issue's targets.
-- Each round runs moongrad and PyTorch in turn in fresh processes; a figure
-- is the median over rounds of each process's median. Threads: 2 (fixed, as
-- PyTorch's torch.set_num_threads).
--   build/moongrad bench/autocast.lua [rounds]     (default 3)
--   build/moongrad bench/autocast.lua ROUNDS steps (the training steps alone)
--   build/moongrad bench/autocast.lua quick        (tiny sizes, one round, no peer: a smoke test)
--   build/moongrad bench/autocast.lua worker step MODEL REPS [quick] | worker gemm M N K TA TB
local mg = mg or require "moongrad"
local util = require "bench.util"
local median, sh = util.median, util.sh

local PY, THREADS = "/usr/bin/python3", 2

-- {=========================== the models ========================

local nn = mg.nn

local function mlp (quick)
  local d, b = quick and 16 or 1024, quick and 4 or 128
  local model = nn.Sequential{nn.Dense(d, "relu"), nn.Dense(d, "relu"), nn.Dense(10)}
  local x = mg.random.normal{b, 784}
  local y = mg.cast(mg.random.uniform({b}, 1, 11) // 1, "int64")
  return model, x, y, mg.optim.Adam{learning_rate = 1e-4}
end

local function cnn (quick)
  local c1, c2, b = quick and 2 or 32, quick and 4 or 64, quick and 4 or 128
  local model = nn.Sequential{
    nn.Conv2D(c1, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
    nn.Conv2D(c2, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
    nn.Flatten(), nn.Dense(128, "relu"), nn.Dense(10)}
  local x = mg.random.normal{b, 28, 28, 1}
  local y = mg.cast(mg.random.uniform({b}, 1, 11) // 1, "int64")
  return model, x, y, mg.optim.Adam{learning_rate = 1e-4}
end

local function gpt (quick)
  local model, ids, targets = util.gpt(quick)
  return model, ids, targets, mg.optim.AdamW{learning_rate = 1e-4}
end

local MODELS = {mlp = mlp, cnn = cnn, gpt = gpt}

-- }=============================================================


-- {=========================== workers ===========================

-- median ms of a step in float32 and under autocast, in this process
local function step_worker (name, reps, quick)
  mg.set_num_threads(THREADS)
  mg.random.seed(0)
  local model, x, y, opt = MODELS[name](quick)
  model(x)
  local vars = model.trainable_variables
  local loss_fn = mg.losses.SparseCategoricalCrossentropy{from_logits = true}
  local function step (dtype)
    local t = mg.tape()
    local loss = mg.mixed_precision.run(dtype, function() return loss_fn(y, model(x)) end)
    t:stop()
    opt:apply_gradients(t:gradient(loss, vars), vars)
  end
  for _, mode in ipairs{{"float32", false}, {"autocast", "bfloat16"}} do
    step(mode[2])
    step(mode[2])
    local ts = {}
    for r = 1, reps do
      local t0 = mg.clock()
      step(mode[2])
      ts[r] = mg.clock() - t0
    end
    print(("%s\t%.3f"):format(mode[1], median(ts) * 1e3))
  end
end

-- GFLOPS of mg.matmul on bfloat16 operands (transposed views where asked)
local function gemm_worker (m, n, k, ta, tb)
  mg.set_num_threads(THREADS)
  local a = mg.cast(ta == "T" and mg.random.normal{k, m} or mg.random.normal{m, k}, "bfloat16")
  local b = mg.cast(tb == "T" and mg.random.normal{n, k} or mg.random.normal{k, n}, "bfloat16")
  if ta == "T" then a = mg.transpose(a) end
  if tb == "T" then b = mg.transpose(b) end
  for _ = 1, 2 do mg.matmul(a, b) end
  local t0 = mg.clock()
  mg.matmul(a, b)
  local reps = math.max(1, math.floor(0.02 / math.max(mg.clock() - t0, 1e-7)))
  local ts = {}
  for r = 1, 7 do
    t0 = mg.clock()
    for _ = 1, reps do mg.matmul(a, b) end
    ts[r] = (mg.clock() - t0) / reps
  end
  print(("%.2f"):format(2 * m * n * k / median(ts) / 1e9))
end

if arg and arg[1] == "worker" then
  if arg[2] == "step" then
    step_worker(arg[3], tonumber(arg[4]), arg[5] == "quick")
  else
    gemm_worker(tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5]), arg[6], arg[7])
  end
  return
end

-- }=============================================================


-- {=========================== the run ===========================

local quick = arg and arg[1] == "quick"
local steps_only = arg and arg[2] == "steps"
local rounds = quick and 1 or tonumber(arg and arg[1]) or 3
local ME = (arg and arg[-1] or "build/moongrad") .. " bench/autocast.lua worker "
local have_torch = not quick and sh(PY .. " -c 'import torch' 2>/dev/null && echo yes"):match("yes")
local model_name, isa = util.machine()
local bf16_isa = mg.autocast_isa()

local function numbers (out)
  local r = {}
  for k, v in out:gmatch("(%w+)\t([%d.]+)") do r[k] = tonumber(v) end
  return r
end

print(("## bfloat16 autocast against float32 and PyTorch's autocast (bench/autocast.lua)\n\n"
       .. "%s, %s, bfloat16 products on %s; %d threads; %s, %d round%s.\n"):format(
  model_name, isa, bf16_isa or "no bfloat16 instructions (emulated: slower than float32)", THREADS,
  os.date("%Y-%m-%d"), rounds, rounds == 1 and "" or "s"))
if not bf16_isa then print("This CPU has no avx512_bf16 or AMX: the figures below say nothing of autocast's speed.\n") end

-- 1. GEMM shapes
local SHAPES = {
  {"MLP b128 784->1024", 128, 1024, 784}, {"MLP b128 1024->1024", 128, 1024, 1024},
  {"chain 1024x2048", 1024, 2048, 2048}, {"GPT 2048 tok 256->768", 2048, 768, 256},
  {"GPT 2048 tok 1024->256", 2048, 256, 1024},
}
local ceiling_ok = not quick and sh("test -x build/gemm_bf16_ceiling && echo yes"):match("yes")
if steps_only then SHAPES = {} end
print("| shape | M x N x K, op | mg.matmul GFLOPS | oneDNN bf16 ceiling | ratio | torch bf16 | target |")
print("|---|---|---|---|---|---|---|")
for _, s in ipairs(SHAPES) do
  local name, batch, fan_out, fan_in = table.unpack(s)
  local ops = {{batch, fan_out, fan_in, "N", "N", "x @ W"}, {batch, fan_in, fan_out, "N", "T", "dout @ W^T"},
               {fan_in, fan_out, batch, "T", "N", "x^T @ dout"}}
  for _, o in ipairs(ops) do
    local m, n, k, ta, tb, what = table.unpack(o)
    if quick then m, n, k = math.min(m, 16), math.min(n, 16), math.min(k, 16) end
    local mine, ceil, peer = {}, {}, {}
    for r = 1, rounds do
      mine[r] = tonumber(sh(("%s gemm %d %d %d %s %s"):format(ME, m, n, k, ta, tb)))
      if ceiling_ok then
        ceil[r] = tonumber(sh(("build/gemm_bf16_ceiling %d %d %d %d %s %s"):format(THREADS, m, n, k, ta, tb)):match("^(%S+)"))
      end
      if have_torch then
        peer[r] = tonumber(sh(("%s bench/autocast_peer.py gemm %d %d %d %d %s %s"):format(PY, THREADS, m, n, k, ta, tb)))
      end
    end
    local g, c, p = median(mine), #ceil > 0 and median(ceil), #peer > 0 and median(peer)
    local big = 2 * m * n * k > 1e6
    print(("| %s | %dx%dx%d %s | %.0f | %s | %s | %s | %s |"):format(name, m, n, k, what, g,
      c and ("%.0f"):format(c) or "-", c and ("%.2fx"):format(g / c) or "-", p and ("%.0f"):format(p) or "-",
      big and (c and (g / c >= 0.9 and ">= 0.9x: met" or ">= 0.9x: NOT met") or ">= 0.9x") or "(under 1 MFLOP)"))
  end
end

-- 2. training steps
local TARGETS = {gpt = {0.5, 0.8}, cnn = {nil, 0.7}, mlp = {}}
print("\n| step | mg float32 ms | mg autocast ms | torch float32 ms | torch autocast ms | "
      .. "mg autocast / torch float32 | mg autocast / torch autocast | targets |")
print("|---|---|---|---|---|---|---|---|")
for _, name in ipairs{"mlp", "cnn", "gpt"} do
  local m32, m16, t32, t16 = {}, {}, {}, {}
  for r = 1, rounds do
    local mine = numbers(sh(("%s step %s %d %s"):format(ME, name, quick and 2 or 10, quick and "quick" or "")))
    m32[r], m16[r] = mine.float32, mine.autocast
    if have_torch then
      local peer = numbers(sh(("%s bench/autocast_peer.py %s %d %d"):format(PY, name, THREADS, 10)))
      t32[r], t16[r] = peer.float32, peer.autocast
    end
  end
  local a, b = median(m32), median(m16)
  local c, d = #t32 > 0 and median(t32), #t16 > 0 and median(t16)
  local tg, want = TARGETS[name], {}
  if tg[1] then want[#want + 1] = ("<= %.1fx torch float32: %s"):format(tg[1], c and (b / c <= tg[1] and "met" or "NOT met") or "-") end
  if tg[2] then want[#want + 1] = ("<= %.1fx torch autocast: %s"):format(tg[2], d and (b / d <= tg[2] and "met" or "NOT met") or "-") end
  print(("| %s | %.1f | %.1f | %s | %s | %s | %s | %s |"):format(name:upper(), a, b,
    c and ("%.1f"):format(c) or "-", d and ("%.1f"):format(d) or "-",
    c and ("%.2fx"):format(b / c) or "-", d and ("%.2fx"):format(b / d) or "-", table.concat(want, "; ")))
end

-- }=============================================================

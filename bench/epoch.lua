-- bench/epoch.lua: one training epoch of examples/train_fashion_mnist.lua's
-- CNN on Fashion-MNIST through fit (469 batches of 128, Adam), next to the
-- same model in PyTorch (bench/epoch_peer.py, at its faster layout), at 1
-- and 2 threads. Each round runs a fresh moongrad process and a fresh
-- PyTorch process in turn; a figure is the median over rounds.
--   build/moongrad bench/epoch.lua [rounds] [steps]   (default 3 rounds of the full epoch)
-- A third row trains under bfloat16 autocast (fit{mixed_precision}) at 2
-- threads, beside PyTorch's torch.autocast("cpu", dtype=torch.bfloat16).
--   build/moongrad bench/epoch.lua worker THREADS [steps|all] [bf16]
local mg = mg or require "moongrad"
local median = require("bench.util").median
local nn = mg.nn

local function worker (threads, steps, bf16)
  mg.set_num_threads(threads)
  local train = mg.data.fashion_mnist()
  local x, y = (train.x / 255):reshape{-1, 28, 28, 1}, train.y
  if steps then x, y = x:slice({1, steps * 128}), y:slice({1, steps * 128}) end
  mg.random.seed(0)
  local model = nn.Sequential{
    nn.Conv2D(32, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
    nn.Conv2D(64, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
    nn.Flatten(), nn.Dense(128, "relu"), nn.Dense(10)}
  model:compile{optimizer = mg.optim.Adam{learning_rate = 1e-3},
                loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}}
  model(x:slice({1, 128}))                            -- build, and the GEMM choices
  local t0 = mg.clock()
  model:fit(x, y, {epochs = 1, batch_size = 128, verbose = 0, mixed_precision = bf16 and "bfloat16" or false})
  print(("%.3f"):format(mg.clock() - t0))
end

if arg and arg[1] == "worker" then
  worker(tonumber(arg[2]), tonumber(arg[3]), arg[4] == "bf16")
  return
end

local ROUNDS = tonumber(arg and arg[1]) or 3
local STEPS = tonumber(arg and arg[2])
local BIN = arg and arg[-1] or "build/moongrad"
local sh = require("bench.util").sh
local images = mg.data.debian_file("dataset-fashion-mnist", "usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
local labels = mg.data.debian_file("dataset-fashion-mnist", "usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz")
local has_torch = sh("/usr/bin/python3 -c 'import torch' 2>/dev/null && echo yes"):match("yes") ~= nil
local cpu = sh("lscpu | sed -n 's/^Model name: *//p' | head -1"):gsub("%s+$", "")
local isa = sh("grep -m1 -o -w avx512f /proc/cpuinfo"):match("avx512f") and "AVX-512" or "AVX2"
print(("### One Fashion-MNIST epoch%s on %s (%s), median of %d rounds"):format(
  STEPS and (" (" .. STEPS .. " batches)") or "", cpu, isa, ROUNDS))
print("| threads | moongrad s | PyTorch s (layout) | ratio |")
print("|---|---|---|---|")
for _, row in ipairs{{1}, {2}, {2, "bf16"}} do
  local threads, bf16 = row[1], row[2]
  local mine, theirs, layout = {}, {}, "-"
  for r = 1, ROUNDS do
    mine[r] = tonumber(sh(("%s bench/epoch.lua worker %d %s %s"):format(BIN, threads, STEPS or "all", bf16 or "")))
    if has_torch then
      local s, l = sh(("%s/usr/bin/python3 bench/epoch_peer.py %d %s %s %s"):format(bf16 and "AUTOCAST=1 " or "",
        threads, images, labels, STEPS or "")):match("([%d.]+)\t(%S+)")
      theirs[r], layout = tonumber(s), l
    end
  end
  local m, t = median(mine), has_torch and median(theirs) or nil
  print(("| %d%s | %.2f | %s | %s%s |"):format(threads, bf16 and ", bfloat16 autocast (both)" or "", m,
    t and ("%.2f (%s)"):format(t, layout) or "-", t and ("%.2fx"):format(m / t) or "-",
    bf16 and t and (m / t <= 0.6 and " (target <= 0.6x: met)" or " (target <= 0.6x: NOT met)") or ""))
  io.stdout:flush()
end

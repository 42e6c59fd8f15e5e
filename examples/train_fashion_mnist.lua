-- Fashion-MNIST (Zalando's 70,000 28x28 grey images of clothes, 10 classes)
-- classified by a small CNN trained with fit: conv-pool-conv-pool-dense.
--   build/moongrad examples/train_fashion_mnist.lua [--recompute] [--bf16] [--epochs N] [curves.png]
-- --bf16 trains with fit{mixed_precision = "bfloat16"}: products in bfloat16,
-- weights and updates in float32.
-- --recompute runs each conv block (conv + pool) under recompute_grad: the
-- tape keeps only the blocks' inputs, and the conv and pool are run again
-- for the gradient. Either way the example first measures one training
-- step, plain and recomputed, with mg.memory's counters: what the tape
-- holds after the forward (recompute keeps 4.6x less), and the step's peak
-- (higher recomputed: this model is two blocks, and the gradient of the
-- first one, the largest, needs its activations back at the very end).
-- The data come from Debian's dataset-fashion-mnist; without the package
-- installed, mg.data fetches it with no root (apt-get download + dpkg-deb -x
-- into ~/.cache/moongrad/debs); nothing else touches the network.
local mg = mg or require "moongrad"
local nn = mg.nn

local recompute, epochs, plot_path, bf16 = false, 8, nil, false
local argv = arg or {}
local i = 1
while i <= #argv do
  local a = argv[i]
  if a == "--recompute" then recompute = true
  elseif a == "--bf16" then bf16 = true
  elseif a == "--epochs" then i = i + 1; epochs = math.tointeger(tonumber(argv[i])) or error("--epochs needs a number", 0)
  elseif a:sub(1, 2) == "--" then error("unknown option " .. a .. " (use --recompute, --bf16, --epochs N)", 0)
  else plot_path = a end
  i = i + 1
end

local train, test = mg.data.fashion_mnist()
-- NHWC images in 0..1, one channel
local function images (part) return (part.x / 255):reshape{-1, 28, 28, 1} end
local x_train, y_train, x_test, y_test = images(train), train.y, images(test), test.y
print(("%d training and %d test images of 28x28 pixels"):format(x_train.shape[1], x_test.shape[1]))

mg.random.seed(7)                                     -- the weights and the shuffles
local function conv_block (filters)
  return nn.Sequential{nn.Conv2D(filters, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2)}
end
local block1, block2 = conv_block(32), conv_block(64)
local head = {nn.Flatten(), nn.Dense(128, "relu"), nn.Dense(10)}
-- the same layers (the same variables) plain, and with the conv blocks recomputed
local function model_of (wrap)
  return nn.Sequential{wrap(block1), wrap(block2), head[1], head[2], head[3]}
end
local plain, recomputed = model_of(function(b) return b end), model_of(mg.recompute_grad)

-- {===================== memory of one step ====================

local loss_fn = mg.losses.SparseCategoricalCrossentropy{from_logits = true}
local xb, yb = x_train:slice({1, 128}) * 1, y_train:slice({1, 128})   -- a batch of its own, as fit's
plain(xb)                                             -- build the layers

-- one step's forward and gradient (no update): what the tape holds once the
-- forward is done, and the step's peak above what was live before it
local function step_memory (model)
  local old = mg.memory.setpause(100, 0)              -- exact peaks for the measure
  collectgarbage()
  mg.memory.reset_peak()
  local base = mg.memory.stats().current_bytes
  local t = mg.tape()
  local loss = loss_fn(yb, model(xb))
  t:stop()
  local held = t:saved_bytes()
  local grads = t:gradient(loss, model.trainable_variables)
  local peak = mg.memory.stats().peak_bytes - base
  t, loss, grads = nil, nil, nil
  collectgarbage()
  mg.memory.setpause(old)
  return held, peak
end

local p_held, p_peak = step_memory(plain)
local r_held, r_peak = step_memory(recomputed)
local MiB = 2 ^ 20
print(("one step, batch 128: the tape holds %.1f MiB plain, %.1f MiB recomputed (%.1fx less)")
      :format(p_held / MiB, r_held / MiB, p_held / r_held))
print(("                     the step peaks %.1f MiB plain, %.1f MiB recomputed (%.2fx)")
      :format(p_peak / MiB, r_peak / MiB, r_peak / p_peak))

-- }=============================================================

local model = recompute and recomputed or plain
print((recompute and "training with the conv blocks under recompute_grad" or "training plainly")
      .. (bf16 and (", products in bfloat16 (%s)"):format(mg.autocast_isa() or "emulated") or ""))
model:compile{optimizer = mg.optim.Adam{learning_rate = 1e-3}, loss = loss_fn, metrics = {"accuracy"}}
local t0 = mg.clock()
local history = model:fit(x_train, y_train, {epochs = epochs, batch_size = 128,
                                             mixed_precision = bf16 and "bfloat16" or false})
print(("trained %d epochs in %.0f s"):format(epochs, mg.clock() - t0))
if plot_path then print("curves: " .. history:plot(plot_path)) end

local result = model:evaluate(x_test, y_test, {verbose = 0})
print(("test loss: %.4f"):format(result.loss))
print(("test accuracy: %.4f"):format(result.accuracy))

-- examples/loss_scale.lua: float16 training with a dynamic loss scale
-- (Keras' LossScaleOptimizer, PyTorch's GradScaler), and why it is needed.
--
--   build/moongrad examples/loss_scale.lua [steps]
--
-- float16's least subnormal is 6e-8: a gradient below it rounds to zero.
-- Here a loss averaged over a large batch gives each output a gradient of
-- about 1e-8, which float16 products lose entirely; scaled by the
-- LossScaleOptimizer (2^15 at the start) the same gradients survive, and the
-- run trains as float32 does. float16 products run widened on CPUs (this
-- oneDNN has no float16 kernels), so this shows float16's numerics, not
-- its speed: for speed, use bfloat16 (docs/mixed-precision.md).
local mg = mg or require "moongrad"
local nn = mg.nn

local steps = tonumber(arg and arg[1]) or 60
mg.mixed_precision.emulate_float16(true)   -- allowed without AVX512-FP16, for its numerics

-- a regression whose loss is summed over 4096 outputs and scaled down by 1e9
-- (a stand-in for a mean over a very large batch): its gradients are tiny
mg.random.seed(1)
local x = mg.random.normal{256, 16}
local y = mg.matmul(x, mg.random.normal{16, 16})
local function make_model ()
  mg.random.seed(2)
  local m = nn.Sequential{nn.Dense(64, "relu"), nn.Dense(16)}
  m(x)
  return m
end
local function loss_fn (model) return mg.sum((mg.cast(model(x), "float32") - y) ^ 2) * 1e-9 end

-- one run of `steps` Adam steps; precision "float32", "float16" or "float16+scale"
local function train (precision)
  local model = make_model()
  local vars = model.trainable_variables
  local opt = mg.optim.Adam{learning_rate = 1e-2}
  if precision == "float16+scale" then opt = mg.optim.LossScaleOptimizer(opt, {dynamic_growth_steps = 20}) end
  local zero_grads, loss = 0, nil
  for _ = 1, steps do
    local t = mg.tape()
    loss = precision == "float32" and loss_fn(model) or mg.autocast("float16", loss_fn, model)
    local scaled = precision == "float16+scale" and opt:scale_loss(loss) or loss
    t:stop()
    local grads = t:gradient(scaled, vars)
    if mg.max(mg.abs(grads[1])):item() == 0 then zero_grads = zero_grads + 1 end
    opt:apply_gradients(grads, vars)
  end
  return loss:item() * 1e9, zero_grads, opt
end

print(("%d Adam steps of a 16-64-16 regression whose gradients are ~1e-8 (loss at the start %.1f):\n"):format(
  steps, loss_fn(make_model()):item() * 1e9))
print(("%-15s %14s %28s"):format("precision", "final loss", "steps layer 1's gradient is 0"))
local l32 = train("float32")
print(("%-15s %14.1f %28s"):format("float32", l32, "0"))
local l16, z16 = train("float16")
print(("%-15s %14.1f %28d"):format("float16", l16, z16))
local ls, zs, opt = train("float16+scale")
print(("%-15s %14.1f %28d"):format("float16+scale", ls, zs))
print(("\nloss scale at the end: %g (%d steps skipped for overflow)"):format(opt.loss_scale, opt.skipped_steps))
print(("float16 with the loss scale ends within %.2f%% of float32; without it the first layer's gradients\n"
       .. "are all zero at every step and the loss barely moves (%.1f%%)"):format(
  100 * math.abs(ls - l32) / l32, 100 * (1 - l16 / loss_fn(make_model()):item() / 1e9)))

-- tf.recompute_grad's documented Keras example, in moongrad.
--   build/moongrad examples/seed_keras.lua
-- The model is wrapped whole; each gradient call re-runs it four times, and
-- the wrapper still answers for the model's fields (`.variables`), which
-- TensorFlow's cannot.
local mg = mg or require "moongrad"
local tape, constant, recompute_grad = mg.tape, mg.constant, mg.recompute_grad

local function print_running_and_return(x)
  mg.print("running")
  return x
end

local model = mg.nn.Sequential{
  mg.nn.Lambda(print_running_and_return),
  mg.nn.Dense(2),
}

local model_recompute = recompute_grad(model)

local t = tape{persistent = true}
local r = constant({{1, 2}})
for _ = 1, 4 do r = model_recompute(r) end          -- running x4
t:stop()

local grad = t:gradient(r, model.variables)         -- running x4

-- Alternatively, use the __wrapped__ attribute to access the original model object.
grad = t:gradient(r, model_recompute.__wrapped__.variables)   -- running x4
return grad

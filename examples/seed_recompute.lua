-- tf.recompute_grad's documented example, in moongrad.
--   build/moongrad examples/seed_recompute.lua      (or: make demo)
-- With recompute_grad the tape keeps only each call's input, so the
-- gradient re-runs my_function: "running" prints four times more.
local mg = mg or require "moongrad"
local Variable, tape, constant, recompute_grad = mg.Variable, mg.tape, mg.constant, mg.recompute_grad

local y = Variable(1.0)

local function my_function(x)
  mg.print("running")
  return x * y
end

local my_function_recompute = recompute_grad(my_function)

local t = tape()
local r = constant(1.0)
for _ = 1, 4 do r = my_function_recompute(r) end   -- running x4
t:stop()
local grad = t:gradient(r, {y})                    -- running x4 (the recompute)

-- Without recompute_grad, the tape contains all intermediate steps, and no
-- recomputation is performed.
t = tape()
r = constant(1.0)
for _ = 1, 4 do r = my_function(r) end             -- running x4
t:stop()
grad = t:gradient(r, {y})                          -- prints nothing
return grad

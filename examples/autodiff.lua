-- The basics of TensorFlow's "Introduction to gradients and automatic
-- differentiation" guide, in moongrad.   build/moongrad examples/autodiff.lua
local mg = mg or require "moongrad"

local function show (label, v)
  print(label, (tostring(v):gsub("\n", "  ")))
end

-- Computing gradients: a tape records the ops, gradient() walks them back.
local x = mg.Variable(3.0)
local t = mg.tape()
local y = x ^ 2
t:stop()
show("dy/dx of x^2 at 3:", t:gradient(y, x))                     -- 6

-- Gradients with respect to a model's variables, answered in their structure.
local w = mg.Variable(mg.random.normal({3, 2}), {name = "w"})
local b = mg.Variable(mg.zeros{2}, {name = "b"})
local xs = mg.constant({{1, 2, 3}})
t = mg.tape{persistent = true}
local out = mg.matmul(xs, w) + b
local loss = mg.mean(out ^ 2)
t:stop()
local grads = t:gradient(loss, {w = w, b = b})
show("dloss/dw:", grads.w)
show("dloss/db:", grads.b)

-- Controlling what the tape watches: constants need watch(); variables
-- that are not trainable are never watched.
local c = mg.constant(3.0)
local frozen = mg.Variable(2.0, {trainable = false})
t = mg.tape()
t:watch(c)
y = c * c * frozen
t:stop()
local g = t:gradient(y, {c, frozen})
show("d/dc:", g[1])                                               -- 12
print("d/dfrozen:", g[2])                                          -- nil

-- Intermediate results: the gradient with respect to something computed.
x = mg.constant(3.0)
t = mg.tape{persistent = true}
t:watch(x)
y = x * x
local z = y * y
t:stop()
show("dz/dy:", t:gradient(z, y))                                  -- 18
show("dz/dx:", t:gradient(z, x))                                  -- 108

-- Non-scalar targets: the gradient of their sum.
x = mg.constant(2.0)
t = mg.tape()
t:watch(x)
y = mg.stack({x * 3, x ^ 2})
t:stop()
show("d(3x + x^2)/dx:", t:gradient(y, x))                         -- 7

-- Control flow is just Lua: only the branch taken is recorded.
x = mg.constant(1.0)
local v0, v1 = mg.Variable(2.0), mg.Variable(2.0)
t = mg.tape{persistent = true}
t:watch(x)
local result = x:item() > 0 and v0 * 1 or v1 * 1
t:stop()
local dv = t:gradient(result, {v0, v1})
show("d/dv0:", dv[1])
print("d/dv1:", dv[2])                                             -- nil

-- Higher orders: nest tapes.
x = mg.Variable(1.0)
local outer = mg.tape()
local inner = mg.tape()
y = x ^ 3
inner:stop()
local dy = inner:gradient(y, x)
outer:stop()
show("d2y/dx2 of x^3 at 1:", outer:gradient(dy, x))               -- 6

-- Jacobians.
x = mg.constant({-1, -1 / 3, 1 / 3, 1})
t = mg.tape()
t:watch(x)
y = mg.sigmoid(x)
t:stop()
show("jacobian of sigmoid (diagonal):", t:jacobian(y, x))

-- Custom gradients: a numerically stable log(1 + e^x).
local log1pexp = mg.custom_gradient(function(v)
  local e = mg.exp(v)
  return mg.log(1 + e), function(dy) return dy * (1 - 1 / (1 + e)) end
end)
x = mg.constant(100.0)
t = mg.tape()
t:watch(x)
y = log1pexp(x)
t:stop()
show("stable gradient at 100:", t:gradient(y, x))                 -- 1

-- Checking gradients against finite differences.
print("gradcheck:", mg.test.gradcheck(function(v) return mg.tanh(v) * v end,
                                      {mg.random.normal({4}, 0, 1, "float64")}))

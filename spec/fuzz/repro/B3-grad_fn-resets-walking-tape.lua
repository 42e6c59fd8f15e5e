-- B: a custom gradient's grad_fn resets (or __gc's) the tape whose gradient
-- is running: the node being walked is freed under the walk.
-- heap-use-after-free custom_backward_body src/autodiff/custom.c:54 (shipped asan build too)
local x = mg.ones{2}
local t = mg.tape({persistent = true})
local g = mg.custom_gradient(function(a)
  return a * 2, function(dy) t:reset(); return dy * 2 end
end)
t:watch(x)
local y = mg.tanh(g(mg.exp(x)))
t:stop()
print(pcall(t.gradient, t, y, x))

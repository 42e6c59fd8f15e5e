-- B: a grad_fn that asks the (non-persistent) tape being walked for another
-- gradient; with a second tape watching too, the inner walk frees a node the
-- outer walk still uses. heap-use-after-free custom_free src/autodiff/custom.c:28
-- (Without the second tape the re-entry recurses until "C stack overflow": a
-- non-persistent tape does not refuse a second gradient while its first runs.)
local x, s = mg.random.normal({0, 1}), mg.random.normal({})
local c = mg.random.normal({3, 1, 1})
local other = mg.tape({persistent = true})
other:watch(s)
local t = mg.tape()
local g = mg.custom_gradient(function(a)
  local y = a:transpose() + c
  return y, function(dy) t:gradient(y, a); return dy end
end)
t:watch(s)
local y = g(x, s)
print(pcall(t.gradient, t, y, {x, s, s}))

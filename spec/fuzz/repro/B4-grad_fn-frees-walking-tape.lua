-- B: as B3 with __gc on the tape being walked (non-persistent tape).
-- heap-use-after-free custom_backward_body src/autodiff/custom.c:54
local x = mg.ones{2}
local t = mg.tape()
local g = mg.custom_gradient(function(a)
  return a * 2, function(dy) getmetatable(t).__gc(t); return dy * 2 end
end)
t:watch(x)
local y = g(x)
t:stop()
print(pcall(t.gradient, t, y, x))

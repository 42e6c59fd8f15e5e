-- L: gradcheck called a right tape wrong where f's outputs are large: the
-- finite differences round to a few ulps of the output over 2 eps (1e5 at
-- eps 1e-6 leaves 1e-4), which passed atol + rtol (fuzz seed 605780413:
-- tape 1.3e-10, exactly 0 in truth, against differences -3.5e-4)
mg.random.seed(5)
local f = function(x) return mg.prod(mg.log_softmax(mg.cumsum(x), -1), 1) end
for _ = 1, 4 do
  local x = mg.slice(mg.random.normal({6, 8}, 0, 1, 'float64'), {6, 1, -2}, {8, 1, -2})
  assert(mg.test.gradcheck(f, {x}, {atol = 1e-5, rtol = 1e-3}))
end

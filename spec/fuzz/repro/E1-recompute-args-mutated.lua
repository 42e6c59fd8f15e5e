-- E: recompute_grad keeps the caller's argument table by reference, so
-- emptying it before the gradient leaves the backward with fewer leaves than
-- the node has inputs; it passes a NULL source to mg_tape_gradient.
-- ubsan src/autodiff/tape.c:647 walk <- mg_tape_gradient <- recompute_backward_body (recompute.c:163)
local w = mg.Variable(2.0)
local x = mg.ones{3}
local g = mg.recompute_grad(function(args)
  local s = w * 1
  for _, v in ipairs(args) do s = s + mg.sum(v) end
  return s
end)
local t = mg.tape()
t:watch(x)
local args = {x}
local y = g(args)
t:stop()
args[1] = nil               -- (or table.insert, or a metatable on args)
print(t:gradient(y, x))

-- A: a tape resurrected by a finalizer after its own __gc ran, then printed.
-- ubsan src/autodiff/tape.c:529 <- tape_tostring (ltape.c)
local saved
do
  local t = mg.tape({persistent = true})
  setmetatable({}, {__gc = function() saved = t end})
end
collectgarbage()
print(tostring(saved))

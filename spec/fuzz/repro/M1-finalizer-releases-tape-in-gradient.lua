-- M: a finalizer released what an interrupted C function was using. Finalizers
-- run at any allocation; this one called a tape's __gc while that tape's
-- gradient had fetched it (the full collection before a gradient ran it):
-- heap-use-after-free mg_tape_check_usable (fuzz seed 683090721, CI).
-- The same held for an op's arguments (tensors, variables) and for
-- mg.dispose or a <close> in a finalizer. Releases inside a finalizer are now
-- a Lua error, except Lua's own finalization of the object itself.
local x = mg.constant({1, 2})
local t = mg.tape{persistent = true}
t:watch(x)
local y = mg.sum(x * x)
t:stop()
for _ = 1, 50 do
  setmetatable({}, {__gc = function() pcall(getmetatable(t).__gc, t) end})
  assert(t:gradient(y, x))
end
local z = mg.ones{100}
for _ = 1, 200 do
  setmetatable({}, {__gc = function() pcall(getmetatable(z).__gc, z); pcall(mg.dispose, z) end})
  for _ = 1, 20 do local _ = mg.tanh(z) end
end
assert(z:sum():item() == 100)

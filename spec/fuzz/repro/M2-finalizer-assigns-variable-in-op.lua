-- M: a finalizer changed a variable while an op was reading its value. An op
-- reads a variable's value without a reference of its own; the young
-- collection an op runs before it makes its result box ran this finalizer,
-- whose assign replaced the value (not its own: a view shares its storage)
-- and freed the old one under the op: heap-use-after-free in binary()
-- (found while moving the collection there, 2026-11-27). Changing a variable
-- inside a finalizer is now a Lua error, as releasing one is.
local v = mg.Variable(mg.ones{64})
local other = mg.ones{64} * 3
local view
for _ = 1, 2000 do
  view = v:value():reshape{8, 8}
  setmetatable({}, {__gc = function() pcall(function() v:assign(other) end) end})
  local r = v * 2
  assert(r:sum():item() == 128)
end
assert(view:sum():item() == 64)

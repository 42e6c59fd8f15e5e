-- H: assign_add on an int64 variable added in int64_t, where + wraps
-- everywhere else (in uint64_t): UBSan signed integer overflow
-- src/variable.c:136 (axpy), and a scale beyond int64 converted first
local v = mg.Variable(mg.constant({math.mininteger, 1}, "int64"))
v:assign_add(-2)
assert(v:value():totable()[1] == math.maxinteger - 1)
assert(not pcall(function() v:assign_add(mg.constant(1, "int64"), 1e300) end))

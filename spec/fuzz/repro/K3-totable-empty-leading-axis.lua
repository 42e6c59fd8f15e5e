-- K: totable of a tensor whose leading axis is empty and which has two
-- more axes counted its nested tables dividing by the product so far, 0:
-- ubsan division by zero src/lua/ltensor.c:191
assert(#mg.zeros{0, 3, 2}:totable() == 0)

-- D: Variable{name = <number>}: luaL_checkstring converts the number to a new
-- string on the stack, lua_pop drops it, the collection run by
-- mgL_pushconstant frees it, then mg_variable_new strdup()s it.
-- heap-use-after-free strdup <- mg_variable_new src/variable.c:36 <- l_variable (lvariable.c:55)
mg.memory.setpause(100, 0)                 -- collect at every allocation
local v = mg.Variable({1, 2}, {name = 5})

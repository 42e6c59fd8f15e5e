-- F: recompute_grad's f read a variable and then gave a bad result: the
-- luaL_error raised by flatten_results skips mg_watcher_free.
-- leak: add_variable src/autodiff/tape.c:257 <- watcher_add <- mg_record_ex
local w = mg.Variable(1.0)
local g = mg.recompute_grad(function() return w * 1, "x" end)
local t = mg.tape()
print(pcall(g))

-- A: the same without calling __gc by hand: at lua_close the tape (created
-- last) is finalized before the table whose finalizer uses it.
-- ubsan src/autodiff/tape.c:190 drop_record <- mg_tape_reset <- l_reset (ltape.c:89)
local t
setmetatable({}, {__gc = function() t:reset() end})
t = mg.tape()

-- A: a tape used after its __gc ran (by hand here; also by finalizer order or
-- resurrection, see A2): every method dereferences the NULL mg_tape.
-- ubsan src/autodiff/tape.c:156 deactivate <- mg_tape_stop <- l_stop (ltape.c:57)
local t = mg.tape()
getmetatable(t).__gc(t)
t:stop()          -- also :reset() tape.c:190, :record() 234, :watch() 240/267,
                  -- :stop_recording() 225, :gradient() tape.c:697 (check_usable)

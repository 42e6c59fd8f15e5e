-- B: the C side holds the mg_tape* across a Lua callback that frees it.
-- heap-use-after-free in mg_tape_resume (tape.c:230) <- l_stop_recording (ltape.c:276).
-- Seen only when mg_small_alloc's free lists are bypassed (see FINDINGS.md);
-- the shipped asan build reuses the block and stays silent.
local t = mg.tape()
t:stop_recording(function() getmetatable(t).__gc(t) end)

-- B: as B1, through record: heap-use-after-free in deactivate (tape.c:156)
-- <- mg_tape_stop <- l_record (ltape.c); only with free lists bypassed.
local t = mg.tape()
t:stop()
t:record(function() getmetatable(t).__gc(t) end)

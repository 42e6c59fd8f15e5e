-- B: a pack hook that runs the collector lets go of a tape whose Lua value
-- was already garbage; the tape, held only while the op was recorded, freed
-- its new node when let go, and recording read the node after:
-- asan heap-use-after-free src/autodiff/tape.c:503 mg_record_ex
local x = mg.ones{2}
do
  local t = mg.tape()
  t:watch(x)
end                                   -- the tape is garbage, still recording
mg.saved_tensors_hooks(function(v) collectgarbage(); collectgarbage(); return v end, function(v) return v end,
                       function() for _ = 1, 3 do local _ = mg.relu(x) * x end end)
collectgarbage()

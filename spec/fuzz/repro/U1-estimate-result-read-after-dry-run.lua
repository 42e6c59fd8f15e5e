-- U (valgrind on the x86-64-v3 build, uninitialised value in tostring): a
-- float result of mg.memory.estimate's dry run, kept in an upvalue, was used
-- after the estimate: its memory was never written, and round, reshape,
-- assign and tostring read it. Now every read past the dry run is an error
-- naming it, and printing shows "(no values: ...)".
local kept
mg.memory.estimate(function()
  local x = mg.random.normal({2}, 0, 1, "float64")
  local t = mg.tape({persistent = true})
  t:watch(x)
  local y = x
  for _ = 1, 6 do y = y + x end
  kept = t:gradient(y, x)
end)
print(tostring(kept))
local ok, err = pcall(function() return mg.round(mg.expand_dims(kept, -1)) end)
print(ok, err)
if ok or not tostring(err):find("computed in a dry run", 1, true) then
  io.stderr:write("FUZZ-WRONG: dry-run-result-read\n")
end

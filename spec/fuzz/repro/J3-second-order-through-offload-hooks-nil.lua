-- J (silently wrong, or at least undocumented): under saved_tensors_hooks
-- {offload=} or "float16", a second-order gradient is nil (unconnected)
-- instead of 6x; identity Lua hooks and the plain tape give {6, 12}.
local x = mg.constant({1, 2}, 'float64')
local g2 = mg.saved_tensors_hooks({offload = os.getenv("FUZZ_TMP") or "/tmp"}, function()
  local outer = mg.tape(); outer:watch(x)
  local t = mg.tape(); t:watch(x); local y = mg.sum(x * x * x); t:stop()
  local s = mg.sum(t:gradient(y, x))
  outer:stop()
  return outer:gradient(s, x)
end)
print(g2)
if g2 == nil then io.stderr:write("FUZZ-WRONG: second-order-through-hooks (nil, expected {6, 12})\n") end

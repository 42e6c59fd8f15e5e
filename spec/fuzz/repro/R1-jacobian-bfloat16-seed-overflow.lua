-- R (ASan, use-after-poison in jacobian.c one_hot): a jacobian of a float16
-- or bfloat16 target wrote its one-hot seeds as doubles, 8 bytes into a
-- buffer of 2-byte elements: past the seed's end (into the alignment slack
-- AddressSanitizer poisons). Now written in the target's dtype.
for _, dt in ipairs{"float16", "bfloat16"} do
  local x = mg.cast(mg.constant({1, 2, 3}), dt)
  local t = mg.tape()
  t:watch(x)
  local y = x * x
  t:stop()
  local j = mg.cast(t:jacobian(y, x, {unconnected = 'zero'}), "float64"):totable()
  print(dt, j[1][1], j[2][2], j[3][3])
  if j[1][1] ~= 2 or j[2][2] ~= 4 or j[3][3] ~= 6 or j[1][2] ~= 0 then
    io.stderr:write("FUZZ-WRONG: jacobian-low-precision\n")
  end
end

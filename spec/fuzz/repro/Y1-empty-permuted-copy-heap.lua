-- Y (review of the tiled copy; a release build aborted "malloc(): invalid size",
-- ASan: use-after-poison in tiled_copy): a contiguous copy of a permuted view
-- whose unit-stride axis and last axis had 16 elements or more (32 before this
-- session) but another axis 0 copied one plane into an empty destination.
for _, c in ipairs{{{0, 16, 16}, {1, 3, 2}}, {{16, 0, 16}, {3, 2, 1}}, {{0, 40, 40}, {1, 3, 2}}} do
  for _, dt in ipairs{"float32", "bfloat16", "float64"} do
    local p = mg.transpose(mg.zeros(c[1], dt), c[2])
    local r = mg.reshape(p, {0})
    if r.shape[1] ~= 0 then io.stderr:write("FUZZ-WRONG: empty-permuted-copy\n") end
  end
end

-- H: int64 sum overflow is UB: src/ops/reduce.c:95 (reduce_i64). Elementwise
-- int64 + and * wrap (computed in uint64, elementwise.c:106); sum and matmul do not.
mg.constant({math.maxinteger, 1}, "int64"):sum()

-- K: std of a float16 view reads it as double:
-- ubsan load of misaligned address for type 'const double' src/ops/maths.c:695
mg.std(mg.cast(mg.ones{4, 1}, "float16")[-1])

-- H: index math.mininteger becomes maxinteger after the 1-based shift (which
-- wraps), and the error message adds 1: ubsan src/ops/shape.c:392 (check_indices)
mg.gather(mg.ones{4}, {math.mininteger})

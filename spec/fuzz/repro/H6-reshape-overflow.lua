-- H: ubsan src/ops/shape.c:47 (known *= shape[i], before the element count is checked)
mg.reshape(mg.constant(1), {(1 << 32) + 1, 1 << 32})

-- H: a huge slice step: ubsan signed overflow src/ops/shape.c:207
-- (strides[i] = x->strides[i] * step[i]) <- mg_slice
mg.ones{3, 3}:slice({-1, 1, -(1 << 62)})

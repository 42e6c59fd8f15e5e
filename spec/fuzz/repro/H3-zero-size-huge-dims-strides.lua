-- H: a shape with a 0 dimension has 0 elements, so mg_shape_numel lets any
-- other dimension through, and the strides overflow.
-- ubsan src/tensor.c:55 mg_contiguous_strides <- mg_empty <- mg_full
mg.zeros{0, 1 << 62, 4}

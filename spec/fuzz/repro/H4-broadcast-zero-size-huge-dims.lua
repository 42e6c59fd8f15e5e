-- H: the same through broadcast_to, then an op: ubsan src/tensor.c:122
-- (numel product in mg_tensor_view)
local b = mg.broadcast_to(mg.constant(1), {0, math.maxinteger, math.maxinteger})
local _ = b // mg.swapaxes(b, 1, -1)

-- N: max_pool2d's backward, SAME padding with stride = window (pt = pl = 0,
-- pb > 0): the tiled loop wrote the clipped taps past dx's end.
-- asan use-after-poison pool_bwd_ref src/ops/conv.c (the storage's alignment
-- slack, poisoned since; before that only the optimised build aborted, in free())
local x = mg.Variable(mg.random.normal({2, 1, 2, 2}, 0, 1, "float64"))
local t = mg.tape()
local y = mg.max_pool2d(x, {pool_size = {2, 1}, padding = "same"})
local l = mg.sum(y * y)
t:stop()
t:gradient(l, x)

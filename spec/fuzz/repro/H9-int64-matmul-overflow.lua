-- H: int64 matmul overflow is UB: src/ops/matmul.c:56 (gemm_i64)
local x = mg.constant({{math.maxinteger}}, "int64")
mg.matmul(x, x)

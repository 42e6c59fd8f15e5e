-- M: a product with no rows crashed in oneDNN. A Dense layer on a (2, 0, 3)
-- input makes a (0, 3) @ (3, 5) product; the GEMM calibration timed its new
-- candidate, oneDNN's matmul primitive, on it, and oneDNN divided by the
-- zero size while making the primitive (SIGFPE; found by CI's fuzz,
-- 2026-11-27). mg_sgemm now answers products with a zero size itself.
for _, way in ipairs{"auto", "dnnl", "openblas", "dnnl-ct", "dnnl-matmul", "openblas-gemv", "openblas-ger"} do
  mg.gemm.use(way)
  for _, s in ipairs{{0, 3, 5}, {2, 0, 5}, {2, 3, 0}, {0, 0, 0}} do
    local m, k, n = s[1], s[2], s[3]
    local c = mg.matmul(mg.ones{m, k}, mg.ones{k, n})
    assert(c.shape[1] == m and c.shape[2] == n, way)
    assert(c:sum():item() == 0, way)
    local t = mg.matmul(mg.transpose(mg.ones{k, m}), mg.transpose(mg.ones{n, k}))
    assert(t.shape[1] == m and t.shape[2] == n, way)
  end
end
mg.gemm.use("auto")
local y = mg.nn.Dense(5)(mg.ones{2, 0, 3})
assert(y.shape[1] == 2 and y.shape[2] == 0 and y.shape[3] == 5)

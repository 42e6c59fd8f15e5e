-- AB (found by review, session 29): under bfloat16 autocast a recompute_grad
-- block whose bfloat16 output was read outside the block and inside it again
-- got the outside's float32 gradient sum rounded to bfloat16 before its re-run
-- added the inside's, then rounded again: one bfloat16 ulp off the plain tape.
local F = function(t) return mg.cast(t, "float32") end
local x = mg.random.normal{6, 16}
local w = mg.Variable(mg.random.normal{16, 16} * 0.3)
local function f (a) local h = mg.dense(a, w, nil, "relu"); return h, mg.gelu(h) end
local function run (wrap)
  local t = mg.tape()
  t:watch(x)
  local l = mg.autocast("bfloat16", function()
    local h, g = wrap(f)(x)
    return mg.sum(F(h) ^ 2) + mg.sum(F(h) * 3) + mg.sum(F(g))
  end)
  t:stop()
  return t:gradient(l, {x, w})
end
local a, b = run(function(g) return g end), run(mg.recompute_grad)
for i = 1, 2 do
  if mg.max(mg.abs(F(a[i]) - F(b[i]))):item() ~= 0 then
    io.stderr:write("FUZZ-WRONG: recompute-autocast-double-rounding " .. i .. "\n")
  end
end
-- the mirror case (second review): a bfloat16 input read twice inside and once outside
local function g2 (a) return mg.dense(a, w, nil, "relu") + mg.dense(a, w) end
local function run2 (wrap)
  local t = mg.tape()
  local l = mg.autocast("bfloat16", function()
    local a = mg.dense(x, w, nil, "relu")
    return mg.sum(F(wrap(g2)(a))) + mg.sum(F(mg.dense(a, w)) ^ 2)
  end)
  t:stop()
  return t:gradient(l, {w})[1]
end
local p2, r2 = run2(function(g) return g end), run2(mg.recompute_grad)
if mg.max(mg.abs(F(p2) - F(r2))):item() ~= 0 then
  io.stderr:write("FUZZ-WRONG: recompute-autocast-double-rounding input\n")
end

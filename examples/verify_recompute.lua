-- A recomputed block that is not the same function twice, and how verify finds it.
--   build/moongrad examples/verify_recompute.lua
-- The block scales its output by a warm-up factor that grows with a call
-- counter kept in Lua. recompute_grad runs the block again in the backward
-- pass, the counter moves once more, and the re-run computes other values:
-- the gradient would be another function's. verify = true says which op
-- differs and where; counting only outside re-runs (is_recomputing) fixes it.
local mg = mg or require "moongrad"
local nn = mg.nn

mg.random.seed(1)
local dense = nn.Dense(16, "tanh")
local calls = 0
local function block (x, guard)
  if not (guard and mg.is_recomputing()) then calls = calls + 1 end
  local warmup = math.min(1, calls / 10)          -- the hidden state
  return dense(x) * warmup
end

local x = mg.random.normal{8, 16}
local function gradient (f)
  local t = mg.tape()
  local loss = mg.sum(f(x) ^ 2)
  t:stop()
  return t:gradient(loss, dense.trainable_variables)
end

-- 1. the bug: the re-run sees calls + 1
local buggy = mg.recompute_grad(function(v) return block(v, false) end, {verify = true})
local ok, err = pcall(gradient, buggy)
print("verified, unguarded: " .. (ok and "passed" or "failed"))
print("  " .. (tostring(err):gsub("^.-in the backward of 'recompute_grad': ", "")))

-- 2. the fix: the counter moves in the first run only; verified, and the
-- gradients are the plain tape's to the bit
local fixed = mg.recompute_grad(function(v) return block(v, true) end, {verify = true})
calls = 0
local g_fixed = gradient(fixed)
calls = 0
local g_plain = gradient(function(v) return block(v, true) end)
local same = true
for i = 1, #g_plain do same = same and mg.sum(mg.cast(mg.not_equal(g_plain[i], g_fixed[i]), "int64")):item() == 0 end
print("verified, guarded: passed; gradients equal to the plain tape's: " .. tostring(same))

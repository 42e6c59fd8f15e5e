-- J (silently wrong): recompute_grad with a save policy that keeps the scalar
-- products gives a wrong gradient. f(x) = m^3 with m = sum(2x): the gradient is
-- 3 m^2 * 2 = 864 per entry at x = {1, 2, 3}; the plain tape says so, the
-- recomputed one does not. (Found by the recompute-vs-plain oracle.)
local x = mg.constant({1, 2, 3}, 'float64')
local function f(x) local m = mg.sum(x * 2); return (m * m) * m end
local keep = function(op, shape) return op == "mul" and #shape == 0 end
local t1 = mg.tape(); t1:watch(x); local a = f(x); t1:stop()
local t2 = mg.tape(); t2:watch(x); local b = mg.recompute_grad(f, {policy = keep})(x); t2:stop()
local g1, g2 = t1:gradient(a, x), t2:gradient(b, x)
print("plain", g1, "recomputed", g2)
if mg.max(mg.abs(g1 - g2)):item() > 1e-9 then io.stderr:write("FUZZ-WRONG: recompute-gradient (policy keeping scalar muls)\n") end

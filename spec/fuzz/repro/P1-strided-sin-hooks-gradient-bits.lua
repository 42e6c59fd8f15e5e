-- P (silently different, the optimised build only): sin's gradient, cos(x),
-- of a strided view through saved_tensors_hooks (which give back a
-- contiguous copy) differed in the last bit from the plain tape's: the
-- contiguous loop called libmvec's vector cos, the strided one scalar libm.
-- The sanitizer build does not vectorise, so only FUZZ_BIN=build/moongrad
-- shows it.
local x = mg.slice(mg.random.normal({64}, 0, 1, 'float64'), {64, 1, -2})
local function f(v) return mg.expand_dims(mg.sin(v), 1) end
local t1 = mg.tape(); t1:watch(x); local a = f(x); t1:stop()
local t2 = mg.tape(); t2:watch(x); local b = mg.saved_tensors_hooks(function(t) return t * 1 end, function(t) return t end, f, x); t2:stop()
local g1, g2 = t1:gradient(a, x), t2:gradient(b, x)
local differ = mg.sum(mg.cast(mg.not_equal(g1, g2), "int64")):item()
print("elements that differ", differ)
if differ > 0 then io.stderr:write("FUZZ-WRONG: hooks-gradient (layout-dependent bits)\n") end

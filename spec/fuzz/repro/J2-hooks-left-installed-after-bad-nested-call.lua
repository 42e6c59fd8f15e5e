-- J (silently wrong, state left half-updated): a nested saved_tensors_hooks
-- call that fails its argument check (here the kind is `print`, and no fn)
-- leaves the outer float16 hooks installed after everything has returned, so
-- every later tape keeps float16 activations: the gradient of sum(tanh(x)) is
-- off in the 4th digit. (An error raised by fn itself unwinds correctly.)
print(pcall(mg.saved_tensors_hooks, 'float16', function() mg.saved_tensors_hooks(print, function() end) end))
local x = mg.constant({0.3, 0.7}, 'float64')
local t = mg.tape(); t:watch(x); local y = mg.sum(mg.tanh(x)); t:stop()
local g, want = t:gradient(y, x), 1 - mg.tanh(x) ^ 2
print(g, want)
if mg.max(mg.abs(g - want)):item() > 1e-12 then io.stderr:write("FUZZ-WRONG: hooks-left-installed\n") end

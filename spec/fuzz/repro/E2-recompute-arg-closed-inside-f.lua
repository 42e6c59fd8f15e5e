-- E: f releases (<close>, or __gc by hand) a tensor that is its argument;
-- recompute_call then reads the box's NULL tensor.
-- ubsan src/lua/lcallback.c:35 among <- mgL_rehead <- recompute_call (recompute.c:236)
local x = mg.ones{4}
local g = mg.recompute_grad(function(a) local z <close> = x; return a * 1 end)
local t = mg.tape()
g(x)

-- B: a saved_tensors_hooks pack function (called while an op is being
-- recorded) releases another recording tape: the op then appends its node to
-- the freed tape. heap-use-after-free append src/autodiff/tape.c:414
local other = mg.tape()
local x = mg.Variable({1, 2})
local t = mg.tape()
mg.saved_tensors_hooks(function(p) getmetatable(other).__gc(other); return p end,
                       function(p) return p end,
                       function() return mg.tanh(x) end)

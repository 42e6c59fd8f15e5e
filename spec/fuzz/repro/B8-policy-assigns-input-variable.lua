-- B: a Lua save policy is asked from inside an op's recording (mg_record_ex);
-- if it assigns the variable whose value is that op's input, the value tensor
-- is freed under the recording. heap-use-after-free mg_record_ex
-- src/autodiff/tape.c:452 (freed by mg_variable_assign <- l_assign)
local v = mg.Variable({{1, 2}, {3, 4}})
local t = mg.tape()
local g = mg.recompute_grad(function(x) return x[1] end,
                            {policy = function() v:assign(v); return true end})
g(v)

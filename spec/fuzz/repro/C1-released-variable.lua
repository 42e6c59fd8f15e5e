-- C: a variable used after its __gc ran: mgL_checkvariable returns the NULL
-- mg_variable. ubsan src/variable.c:69 mg_variable_peek <- l_assign (lvariable.c:76);
-- also v.shape (variable_index), v:assign_sub (variable.c:124), v:value()
-- (tape.c:349 via mg_variable_read), optimizers' apply_gradients.
local v = mg.Variable({1, 2})
getmetatable(v).__gc(v)
v:assign({3, 4})

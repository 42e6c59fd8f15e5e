-- G: a finalizer that runs inside lua_close makes a tensor; Lua 5.4 marks no
-- object for finalization while the state closes, so its mg_tensor leaks.
-- leak: mg_tensor_view src/tensor.c:105 <- mg_empty <- binary (elementwise.c:219)
local x = mg.ones{2}
setmetatable({}, {__gc = function() x = x + 1 end})

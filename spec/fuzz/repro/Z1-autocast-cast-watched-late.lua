-- Z (found while caching activations' casts under autocast): a variable (or a
-- tensor) cast to bfloat16 in an autocast region before a tape watched it kept
-- that unrecorded cast in the region's cache; the tape's later products read it
-- and the gradient with respect to it was nil ("the target was not recorded").
local v = mg.Variable(mg.random.normal{4, 4}, {trainable = false})
local x = mg.random.normal{3, 4}
for _, which in ipairs{"variable", "tensor"} do
  local g = mg.autocast("bfloat16", function()
    local t = mg.tape{warn = false}
    mg.matmul(x, v)                               -- cast while the tape follows neither
    local watched = which == "variable" and v or x
    t:watch(watched)
    local loss = mg.sum(mg.cast(mg.matmul(x, v), "float32"))
    t:stop()
    return t:gradient(loss, watched)
  end)
  if g == nil then io.stderr:write("FUZZ-WRONG: autocast-cast-watched-late " .. which .. "\n") end
end

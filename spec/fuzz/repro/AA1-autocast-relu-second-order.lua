-- AA (found while letting the walk write bfloat16 gradients in place): under
-- autocast, conv2d's relu took its gradient as a mask on the bfloat16 bits, a
-- kernel no tape records, even while an outer tape recorded the backward: the
-- second order through it lost the path from the seed (w's gradient 87% off,
-- the dense layer's nil).
local x = mg.random.normal{2, 6, 6, 2}
local w = mg.Variable(mg.random.normal{3, 3, 2, 3} * 0.5)
local w2 = mg.Variable(mg.random.normal{27, 4} * 0.3)
local g = mg.autocast("bfloat16", function()
  local outer = mg.tape()
  outer:watch(x)
  local inner = mg.tape()
  inner:watch(x)
  local y = mg.max_pool2d(mg.conv2d(x, w, nil, {padding = "same", activation = "relu"}))
  local loss = mg.sum(mg.cast(mg.dense(mg.reshape(y, {2, 27}), w2, nil, "relu"), "float32") ^ 2)
  inner:stop()
  local pen = mg.sum(mg.cast(inner:gradient(loss, x), "float32") ^ 2)
  outer:stop()
  return outer:gradient(pen, {w, w2})
end)
if g[1] == nil or g[2] == nil then io.stderr:write("FUZZ-WRONG: autocast-relu-second-order nil\n") end

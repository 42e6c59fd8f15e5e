--- moongrad.callbacks: the callbacks of fit (Keras' keras.callbacks):
-- EarlyStopping, LambdaCallback, TerminateOnNaN, ProgbarLogger, History,
-- ModelCheckpoint (mg.checkpoint.callback: a training checkpoint after
-- each epoch) and BackupAndRestore (resume after a crash, from moongrad.checkpoint). They are defined in moongrad.fit, which documents the callback
-- protocol, and moongrad.checkpoint.
-- @module moongrad.callbacks
local fit = require "moongrad.fit"

local callbacks = {}
for name, cls in pairs(fit.callbacks) do callbacks[name] = cls end

-- from moongrad.checkpoint, looked up on first use (it is another module's)
local from_checkpoint = {ModelCheckpoint = "callback", BackupAndRestore = "BackupAndRestore"}

return setmetatable(callbacks, {__index = function(t, name)
  local key = from_checkpoint[name]
  if not key then return nil end
  local ok, checkpoint = pcall(require, "moongrad.checkpoint")
  local value = ok and type(checkpoint) == "table" and rawget(checkpoint, key) or nil
  if value ~= nil then rawset(t, name, value) end
  return value
end})

--- moongrad.optim: optimizers that update variables from their gradients.
--   local opt = mg.optim.Adam{learning_rate = 1e-3}
--   opt:apply_gradients(grads, vars)        -- grads[i] is the gradient of vars[i]
-- A nil gradient (an unconnected variable) is skipped. Updates run outside
-- any tape's view: they are not recorded.
-- @module moongrad.optim
local mg = require "moongrad"

local optim = {}

local function check_pairs (grads, vars, who)
  if type(grads) ~= "table" or type(vars) ~= "table" then
    error(who .. ": apply_gradients(grads, vars) takes two lists", 3)
  end
  if #grads ~= #vars then
    error(("%s: %d gradients for %d variables"):format(who, #grads, #vars), 3)
  end
end

--- SGD{learning_rate=0.01, momentum=0, nesterov=false}
local SGD = {}
SGD.__index = SGD
optim.SGD = SGD
setmetatable(SGD, {__call = function(_, opts)
  opts = opts or {}
  return setmetatable({learning_rate = opts.learning_rate or 0.01, momentum = opts.momentum or 0,
                       nesterov = opts.nesterov or false, slots = setmetatable({}, {__mode = "k"}),
                       iterations = 0}, SGD)
end})

function SGD:apply_gradients (grads, vars)
  check_pairs(grads, vars, "SGD")
  local lr, mu = self.learning_rate, self.momentum
  for i = 1, #vars do
    local g, v = grads[i], vars[i]
    if g ~= nil then
      if mu == 0 then
        v:assign_sub(g, lr)                                   -- one pass, in place
      else
        local m = self.slots[v]
        m = m and m * mu + g or g
        self.slots[v] = m
        v:assign_sub(self.nesterov and g + m * mu or m, lr)
      end
    end
  end
  self.iterations = self.iterations + 1
end

--- Adam{learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-7} (Kingma & Ba)
local Adam = {}
Adam.__index = Adam
optim.Adam = Adam
setmetatable(Adam, {__call = function(_, opts)
  opts = opts or {}
  return setmetatable({learning_rate = opts.learning_rate or 1e-3, beta1 = opts.beta1 or 0.9,
                       beta2 = opts.beta2 or 0.999, epsilon = opts.epsilon or 1e-7,
                       m = setmetatable({}, {__mode = "k"}), v = setmetatable({}, {__mode = "k"}),
                       iterations = 0}, Adam)
end})

function Adam:apply_gradients (grads, vars)
  check_pairs(grads, vars, "Adam")
  self.iterations = self.iterations + 1
  local t, b1, b2 = self.iterations, self.beta1, self.beta2
  local step = self.learning_rate * math.sqrt(1 - b2 ^ t) / (1 - b1 ^ t)
  for i = 1, #vars do
    local g, var = grads[i], vars[i]
    if g ~= nil then
      local m = (self.m[var] or mg.zeros_like(g)) * b1 + g * (1 - b1)
      local v = (self.v[var] or mg.zeros_like(g)) * b2 + g * g * (1 - b2)
      self.m[var], self.v[var] = m, v
      var:assign_sub(m / (mg.sqrt(v) + self.epsilon), step)
    end
  end
end

return optim

-- A layer of your own, Keras' way: Layer:subclass, variables made in
-- build(input_shape) once the input's shape is known, the arithmetic in call.
-- Then a model of it that builds before its first call, trains with fit, and
-- saves and loads its weights.
--
--   build/moongrad examples/custom_layer.lua
local mg = require "moongrad"
local nn = mg.nn

-- y = x @ w + b, then a learned per-feature gate: sigmoid(g) * y
local GatedDense = nn.Layer:subclass("GatedDense")

function GatedDense:init (units)
  self.units = units                          -- no variables yet: the input's width is unknown
end

-- called once, before the first call, with the input's shape ({batch, features});
-- or by hand, model:build{nil, features}
function GatedDense:build (input_shape)
  local features = input_shape[#input_shape]
  self.w = self:add_variable("w", nn.glorot_uniform({features, self.units}))
  self.b = self:add_variable("b", mg.zeros({self.units}))
  self.g = self:add_variable("g", mg.zeros({self.units}))
end

function GatedDense:call (x)
  return mg.sigmoid(self.g) * (mg.matmul(x, self.w) + self.b)
end

mg.random.seed(7)
local x = mg.random.normal({256, 8})
local y = mg.sum(x * x, 2, true)              -- a target to regress: the squared norm

-- input_shape (the batch axis left out) builds the model at once
local model = nn.Sequential({GatedDense(32), nn.Dense(32, "relu"), GatedDense(1)}, {input_shape = {8}})
print(("built before the first call: %d variables, %d numbers"):format(#model.variables,
      (function() local n = 0 for _, v in ipairs(model.variables) do n = n + v:numel() end return n end)()))

model:compile{loss = "mse", optimizer = mg.optim.Adam{learning_rate = 0.01}}
local history = model:fit(x, y, {epochs = 30, batch_size = 32, verbose = 0})
local losses = history.history.loss
local first, last = losses[1], losses[#losses]
print(("loss %.3f -> %.3f"):format(first, last))
assert(last < first / 4, "the model did not learn")

-- a fresh model takes the weights without running first
local path = os.tmpname()
model:save_weights(path)
local copy = nn.Sequential({GatedDense(32), nn.Dense(32, "relu"), GatedDense(1)})
copy:build({nil, 8})
copy:load_weights(path)
os.remove(path)
local diff = mg.max(mg.abs(copy(x) - model(x))):item()
print(("the copy predicts the same: max difference %g"):format(diff))
assert(diff == 0)

-- sublayers kept in a table by name (a dict) are the layer's own, as Keras
-- tracks dicts: both towers' weights train and save
local TwoTower = nn.Layer:subclass("TwoTower")
function TwoTower:init (units)
  self.towers = {left = nn.Dense(units, "relu"), right = nn.Dense(units, "tanh")}
  self.head = nn.Dense(1)
end
function TwoTower:call (x)
  return self.head(self.towers.left(x) * self.towers.right(x))
end

local towers = TwoTower(16)
towers:compile{loss = "mse", optimizer = mg.optim.Adam{learning_rate = 0.01}}
local tl = towers:fit(x, y, {epochs = 30, batch_size = 32, verbose = 0}).history.loss
print(("two towers: %d variables, loss %.3f -> %.3f"):format(#towers.variables, tl[1], tl[#tl]))
assert(#towers.variables == 6 and tl[#tl] < tl[1] / 4, "the towers did not learn")

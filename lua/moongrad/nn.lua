--- moongrad.nn: layers and models in the Keras style, dropout, and the
-- memory-saving blocks (checkpoint_sequential, RevBlock).
--
-- A layer is a callable table: `layer(x)` runs `layer:call(x)`, building its
-- variables on the first call from the input's shape. `layer.variables`
-- lists its variables and those of the layers inside it, in creation order;
-- `layer.trainable_variables` only the trainable ones.
-- @module moongrad.nn
local mg = require "moongrad"

local nn = {}

-- {========================== classes ==========================

local function lookup (cls, k)
  while cls do
    local v = rawget(cls, k)
    if v ~= nil then return v end
    cls = rawget(cls, "__parent")
  end
end

local properties = {}

local function class (name, parent)
  local cls = {__name = "moongrad.nn." .. name, __parent = parent}
  cls.__index = function(self, k)
    local prop = properties[k]
    if prop then return prop(self) end
    return lookup(cls, k)
  end
  cls.__call = function(self, ...) return self:call(...) end
  cls.__tostring = function(self) return self:describe() end
  return cls
end

local counters = {}

local function auto_name (base)
  local n = counters[base] or 0
  counters[base] = n + 1
  return n == 0 and base or (base .. "_" .. n)
end

-- }=============================================================


-- {=========================== Layer ===========================

local Layer = class("Layer")
nn.Layer = Layer

--- Makes obj (a table) a layer of class cls.
local function new_layer (cls, obj, base)
  obj = obj or {}
  obj._vars, obj._layers = {}, {}
  obj.name = obj.name or auto_name(base)
  return setmetatable(obj, cls)
end

--- Creates a variable owned by this layer.
function Layer:add_variable (name, init, opts)
  opts = opts or {}
  local v = mg.Variable(init, {name = self.name .. "/" .. name, trainable = opts.trainable ~= false})
  self._vars[#self._vars + 1] = v
  return v
end

--- Registers a sublayer (or a callable) whose variables this layer owns too.
function Layer:track (layer)
  if type(layer) == "table" then self._layers[#self._layers + 1] = layer end
  return layer
end

local function collect (layer, out, seen)
  for _, v in ipairs(rawget(layer, "_vars") or {}) do
    if not seen[v] then seen[v] = true; out[#out + 1] = v end
  end
  for _, sub in ipairs(rawget(layer, "_layers") or {}) do
    local ok, vars = pcall(function() return sub.variables end)
    if ok and type(vars) == "table" then
      for _, v in ipairs(vars) do
        if not seen[v] then seen[v] = true; out[#out + 1] = v end
      end
    end
  end
  return out
end

function properties.variables (self) return collect(self, {}, {}) end

function properties.trainable_variables (self)
  local out = {}
  for _, v in ipairs(collect(self, {}, {})) do if v.trainable then out[#out + 1] = v end end
  return out
end

function properties.non_trainable_variables (self)
  local out = {}
  for _, v in ipairs(collect(self, {}, {})) do if not v.trainable then out[#out + 1] = v end end
  return out
end

function Layer:describe ()
  return ("%s '%s'"):format(getmetatable(self).__name, self.name)
end

function Layer:call ()
  error(("%s: call is not defined"):format(self:describe()), 2)
end

-- }=============================================================


-- {======================= initializers ========================
-- Initial values come from the initializers' stream (seeded by
-- mg.random.seed too): building a layer lazily, maybe inside a
-- recompute_grad forward, never shifts the main stream that dropout masks
-- are drawn from and that recompute replays.

--- Glorot (Xavier) uniform: U(-l, l), l = sqrt(6 / (fan_in + fan_out)).
function nn.glorot_uniform (shape, dtype)
  local fan_in, fan_out = shape[#shape - 1] or shape[1], shape[#shape]
  local limit = math.sqrt(6 / (fan_in + fan_out))
  return mg.random.with_init_stream(mg.random.uniform, shape, -limit, limit, dtype)
end

-- }=============================================================


-- {=========================== layers ==========================

local activations = {
  tanh = mg.tanh, relu = mg.relu, sigmoid = mg.sigmoid, softmax = mg.softmax,
  linear = function(x) return x end,
}

local function activation_of (a)
  if a == nil or type(a) == "function" then return a end
  local f = activations[a]
  if not f then error(("unknown activation '%s' (use tanh, relu, sigmoid, softmax or linear)"):format(tostring(a)), 3) end
  return f
end

--- Dense(units, {activation=, use_bias=true, name=}): y = activation(x @ kernel + bias).
-- The kernel (in, units) is glorot-uniform and the bias zero, built on the first call.
local Dense = class("Dense", Layer)
nn.Dense = Dense

function Dense.new (units, opts)
  if math.type(units) ~= "integer" or units < 1 then
    error("Dense: units must be a positive integer, got " .. tostring(units), 2)
  end
  opts = opts or {}
  local self = new_layer(Dense, {name = opts.name, units = units,
                                 activation = activation_of(opts.activation),
                                 use_bias = opts.use_bias ~= false}, "dense")
  return self
end
setmetatable(Dense, {__call = function(_, ...) return Dense.new(...) end})

function Dense:build (x)
  local fan_in = x.shape[#x.shape]
  if not fan_in then error(self:describe() .. ": input must have at least 1 dimension", 3) end
  local dtype = x.dtype == "float64" and "float64" or "float32"
  self.kernel = self:add_variable("kernel", nn.glorot_uniform({fan_in, self.units}, dtype))
  if self.use_bias then self.bias = self:add_variable("bias", mg.zeros({self.units}, dtype)) end
end

function Dense:call (x)
  if not rawget(self, "kernel") then self:build(x) end
  local y = mg.matmul(x, self.kernel)
  if self.bias then y = y + self.bias end
  if self.activation then y = self.activation(y) end
  return y
end

function Dense:describe ()
  return ("moongrad.nn.Dense '%s' (units=%d)"):format(self.name, self.units)
end

--- Lambda(fn): a layer that calls fn.
local Lambda = class("Lambda", Layer)
nn.Lambda = Lambda
setmetatable(Lambda, {__call = function(_, fn, opts)
  if type(fn) ~= "function" then error("Lambda: a function expected, got " .. type(fn), 2) end
  return new_layer(Lambda, {fn = fn, name = opts and opts.name}, "lambda")
end})

function Lambda:call (...) return self.fn(...) end

--- Sequential{layer, ...}: runs the layers in order.
local Sequential = class("Sequential", Layer)
nn.Sequential = Sequential
setmetatable(Sequential, {__call = function(_, layers, opts)
  if type(layers) ~= "table" then error("Sequential: a list of layers expected, got " .. type(layers), 2) end
  local self = new_layer(Sequential, {layers = {}, name = opts and opts.name}, "sequential")
  for i, l in ipairs(layers) do
    if type(l) ~= "function" and not (type(l) == "table" and getmetatable(l) and getmetatable(l).__call) then
      error(("Sequential: layer %d is a %s, not callable"):format(i, type(l)), 2)
    end
    self:add(l)
  end
  return self
end})

function Sequential:add (layer)
  self.layers[#self.layers + 1] = layer
  self:track(layer)
  return self
end

function Sequential:call (x, ...)
  for _, layer in ipairs(self.layers) do x = layer(x, ...) end
  return x
end

function Sequential:describe ()
  local parts = {}
  for i, l in ipairs(self.layers) do
    parts[i] = "  " .. (type(l) == "table" and tostring(l) or tostring(l)):gsub("\n", "\n  ")
  end
  return ("moongrad.nn.Sequential '%s' {\n%s\n}"):format(self.name, table.concat(parts, "\n"))
end

-- }=============================================================


-- {==================== dropout, batch norm ====================

--- dropout(x, rate): zeroes each entry with probability rate and scales the
-- rest by 1/(1-rate). The mask comes from mg.random, so recompute_grad replays it.
function nn.dropout (x, rate)
  if type(rate) ~= "number" or rate < 0 or rate >= 1 then
    error("dropout: rate must be a number in [0, 1), got " .. tostring(rate), 2)
  end
  if rate == 0 then return x end
  local dtype = x.dtype
  local keep = mg.greater_equal(mg.random.uniform(x.shape, 0, 1, dtype), rate)
  return x * (mg.cast(keep, dtype) / (1 - rate))
end

--- Dropout(rate): dropout while training (layer.training, or the call's
-- second argument), the identity otherwise.
local Dropout = class("Dropout", Layer)
nn.Dropout = Dropout
setmetatable(Dropout, {__call = function(_, rate, opts)
  nn.dropout(mg.zeros{0}, rate)                       -- checks rate
  return new_layer(Dropout, {rate = rate, training = true, name = opts and opts.name}, "dropout")
end})

function Dropout:call (x, training)
  if training == nil then training = self.training end
  if not training then return x end
  return nn.dropout(x, self.rate)
end

--- BatchNorm{momentum=0.99, epsilon=1e-3}: normalizes over every axis but
-- the last. While training it uses the batch's statistics and moves its
-- running averages, but not while recompute_grad re-runs it
-- (mg.is_recomputing()), so the averages move once per step.
local BatchNorm = class("BatchNorm", Layer)
nn.BatchNorm = BatchNorm
setmetatable(BatchNorm, {__call = function(_, opts)
  opts = opts or {}
  return new_layer(BatchNorm, {momentum = opts.momentum or 0.99, epsilon = opts.epsilon or 1e-3,
                               training = true, name = opts.name}, "batch_norm")
end})

function BatchNorm:build (x)
  local n, dtype = x.shape[#x.shape], x.dtype
  self.gamma = self:add_variable("gamma", mg.ones({n}, dtype))
  self.beta = self:add_variable("beta", mg.zeros({n}, dtype))
  self.moving_mean = self:add_variable("moving_mean", mg.zeros({n}, dtype), {trainable = false})
  self.moving_variance = self:add_variable("moving_variance", mg.ones({n}, dtype), {trainable = false})
  self.updates = 0
end

function BatchNorm:call (x, training)
  if not rawget(self, "gamma") then self:build(x) end
  if training == nil then training = self.training end
  local mean, var
  if training then
    local axes = {}
    for i = 1, x.ndim - 1 do axes[i] = i end
    mean = mg.mean(x, axes)
    var = mg.mean((x - mean) ^ 2, axes)
    if not mg.is_recomputing() then
      local m = self.momentum
      self.moving_mean:assign(self.moving_mean * m + mean * (1 - m))
      self.moving_variance:assign(self.moving_variance * m + var * (1 - m))
      self.updates = self.updates + 1
    end
  else
    mean, var = self.moving_mean, self.moving_variance
  end
  return (x - mean) / mg.sqrt(var + self.epsilon) * self.gamma + self.beta
end

-- }=============================================================


-- {=========================== losses ==========================

--- softmax_cross_entropy(logits, labels): the mean over the batch of
-- -log softmax(logits)[label]; logits (B, C), labels (B) int64, 1-based.
function nn.softmax_cross_entropy (logits, labels)
  if not mg.is_tensor(labels) or labels.dtype ~= "int64" then
    error("softmax_cross_entropy: labels must be an int64 tensor of class numbers (1-based)", 2)
  end
  local classes = logits.shape[#logits.shape]
  if mg.min(labels):item() < 1 or mg.max(labels):item() > classes then
    error(("softmax_cross_entropy: labels must be in 1..%d"):format(classes), 2)
  end
  local onehot = mg.cast(mg.equal(mg.expand_dims(labels, -1), mg.arange(1, classes + 1, 1, "int64")), logits.dtype)
  return -mg.mean(mg.sum(onehot * mg.log_softmax(logits, -1), -1))
end

--- mean_squared_error(y, target)
function nn.mean_squared_error (y, target)
  return mg.mean((y - target) ^ 2)
end

-- }=============================================================


-- {================== memory-saving blocks =====================

--- checkpoint_sequential(layers, segments, x): runs the layers in order, in
-- `segments` groups; every group but the last runs under recompute_grad, so
-- the tape keeps only the groups' inputs (PyTorch's checkpoint_sequential).
-- With segments = sqrt(#layers) the activations held are O(sqrt(#layers)).
function nn.checkpoint_sequential (layers, segments, x)
  if type(layers) == "table" and getmetatable(layers) == Sequential then layers = layers.layers end
  if type(layers) ~= "table" or #layers == 0 then
    error("checkpoint_sequential: a non-empty list of layers expected", 2)
  end
  if math.type(segments) ~= "integer" or segments < 1 then
    error("checkpoint_sequential: segments must be a positive integer, got " .. tostring(segments), 2)
  end
  local n = #layers
  local size = math.ceil(n / segments)
  local first = 1
  while first <= n do
    local last = math.min(first + size - 1, n)
    local a, b = first, last
    local function run (h)
      for i = a, b do h = layers[i](h) end
      return h
    end
    x = last < n and mg.recompute_grad(run)(x) or run(x)
    first = last + 1
  end
  return x
end

local function callables (v, n, what)
  if type(v) == "table" and not getmetatable(v) then
    if #v ~= n then error(("RevBlock: %s has %d functions for %d layers"):format(what, #v, n), 3) end
    return v
  end
  local list = {}
  for i = 1, n do list[i] = v end
  return list
end

--- RevBlock(f, g, {num_layers=1}): reversible residual layers (RevNet; TF1's
-- rev_block). Each layer maps (x1, x2) to y1 = x1 + f(x2), y2 = x2 + g(y1).
-- The backward pass rebuilds each layer's inputs from its outputs
-- (x2 = y2 - g(y1), x1 = y1 - f(x2)) instead of keeping them, so the tape
-- holds nothing per layer. f and g are callables (shared by every layer)
-- or lists of num_layers callables. Call it as block(x1, x2) -> y1, y2, or
-- block(x) with x split in halves along its last axis -> concatenated y.
local RevBlock = class("RevBlock", Layer)
nn.RevBlock = RevBlock
setmetatable(RevBlock, {__call = function(_, f, g, opts)
  local n = opts and opts.num_layers or 1
  if math.type(n) ~= "integer" or n < 1 then error("RevBlock: num_layers must be a positive integer", 2) end
  local self = new_layer(RevBlock, {num_layers = n, name = opts and opts.name}, "rev_block")
  self.f, self.g = callables(f, n, "f"), callables(g, n, "g")
  local seen = {}
  for i = 1, n do
    for _, h in ipairs({self.f[i], self.g[i]}) do
      if not seen[h] then seen[h] = true; self:track(h) end
    end
  end
  self._step = mg.custom_gradient(function(x1, x2) return self:_forward(x1, x2) end)
  return self
end})

function RevBlock:_forward (x1, x2)
  for i = 1, self.num_layers do
    local y1 = x1 + self.f[i](x2)
    x2 = x2 + self.g[i](y1)
    x1 = y1
  end
  local y1, y2 = x1, x2
  return y1, y2, function(dy1, dy2, variables)
    return self:_backward(y1, y2, dy1, dy2, variables or {})
  end
end

-- gradient of h(x) seeded with dy, with respect to x and the variables
local function vjp (h, x, dy, variables)
  local t = mg.tape()
  t:watch(x)
  local out = h(x)
  t:stop()
  local g = t:gradient(out, {x, variables}, dy, {unconnected = "zero"})
  return out, g[1], g[2]
end

function RevBlock:_backward (y1, y2, dy1, dy2, variables)
  local dvars = {}
  local function add_vars (gs)
    for k, gk in ipairs(gs) do dvars[k] = dvars[k] and dvars[k] + gk or gk end
  end
  for i = self.num_layers, 1, -1 do
    local gy1, dz, dgv = vjp(self.g[i], y1, dy2, variables)      -- through y2 = x2 + g(y1)
    local x2 = y2 - gy1
    local dy1_total = dy1 + dz
    add_vars(dgv)
    local fx2, dx2f, dfv = vjp(self.f[i], x2, dy1_total, variables)   -- through y1 = x1 + f(x2)
    local x1 = y1 - fx2
    add_vars(dfv)
    dy1, dy2 = dy1_total, dy2 + dx2f
    y1, y2 = x1, x2
  end
  return dy1, dy2, dvars
end

function RevBlock:call (x1, x2)
  if x2 ~= nil then return self._step(x1, x2) end
  local n, d = x1.ndim, x1.shape[x1.ndim]
  if d == nil or d % 2 ~= 0 then
    error(("RevBlock: the last dimension (%s) must be even to split in halves"):format(tostring(d)), 2)
  end
  local spec = {}                                   -- nil for every axis but the last
  spec[n] = {1, d // 2}
  local h1 = mg.slice(x1, table.unpack(spec, 1, n))
  spec[n] = {d // 2 + 1, d}
  local h2 = mg.slice(x1, table.unpack(spec, 1, n))
  local y1, y2 = self._step(h1, h2)
  return mg.concat({y1, y2}, -1)
end

-- }=============================================================

return nn

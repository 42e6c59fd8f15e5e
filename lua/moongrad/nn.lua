--- moongrad.nn: layers and models in the Keras style (dense, convolution and
-- pooling on NHWC images, reshaping, normalization), summary(), dropout, and
-- the memory-saving blocks (checkpoint_sequential, RevBlock).
--
-- A layer is a callable table: `layer(x)` runs `layer:call(x)`, building its
-- variables on the first call from the input's shape. `layer.variables`
-- lists its variables and those of the layers inside it, in creation order;
-- `layer.trainable_variables` only the trainable ones. Training, checkpoints,
-- the reversible and the transformer layers load on first use (see
-- EXTENSIONS at the end).
-- @module moongrad.nn
local mg = require "moongrad"
local check = require "moongrad.check"
local layer = require "moongrad.layer"

local fail, show = check.fail, check.show

local nn = {}

-- {========================== classes ==========================
-- moongrad.layer holds the Layer class and what every layer shares

local Layer = layer.Layer
nn.Layer = Layer
nn.glorot_uniform = layer.glorot_uniform
nn.dropout = layer.dropout

local class, new_layer, classes, unwrap = layer.class, layer.new, layer.classes, layer.unwrap
local check_input = layer.check_input

-- }=============================================================


-- {======================= initializers ========================
-- (layer.lua's: they draw from the initializers' stream)

local initializers = {glorot_uniform = layer.glorot_uniform, he_uniform = layer.he_uniform,
                      zeros = function(shape, dtype) return mg.zeros(shape, dtype) end}
local initializer_names = {"glorot_uniform", "he_uniform", "zeros"}

local initializer_rule = check.rule("an initializer name or a function(shape, dtype)",
                                    function(v) return type(v) == "string" or check.is_callable(v) end)

-- the initializer named or given for layer `who`: a function(shape, dtype)
-- drawing from the initializers' stream
local function initializer_of (who, init)
  if type(init) == "string" then
    return initializers[init] or check.unknown(who, "kernel_initializer", init, initializer_names)
  end
  return function(shape, dtype) return mg.random.with_init_stream(init, shape, dtype) end
end

-- }=============================================================


-- {======================= layer inputs ========================

local optional_boolean = check.rule("true, false or nil", function(v) return v == nil or type(v) == "boolean" end)

-- }=============================================================


-- {=========================== layers ==========================

-- the activations mg.dense applies in its own pass (by function, so a layer
-- given mg.relu itself fuses too); every other name (layer.activations) runs after it
local fused_activations = {[mg.tanh] = "tanh", [mg.relu] = "relu", [mg.sigmoid] = "sigmoid",
                           [layer.activations.linear] = "linear"}
local activation_rule, activation_of = layer.activation_rule, layer.activation_of

--- Dense(units, {activation=, use_bias=true, name=}): y = activation(x @ kernel + bias).
-- The kernel (in, units) is glorot-uniform and the bias zero, built on the first call.
-- Dense(units, activation [, opts]) works too: Keras users write Dense(3, "relu"),
-- the activation being Keras' second positional argument.
local Dense = class("Dense", Layer)
nn.Dense = Dense

local DENSE_OPTIONS = {{"activation", activation_rule}, {"use_bias", check.boolean, true}, {"name", check.string}}

function Dense.__new (units, activation, opts)
  check.value("Dense", "units", units, check.positive_integer)
  if type(activation) == "table" and not check.is_callable(activation) then
    if opts ~= nil then fail("Dense", "options given twice; write Dense(units [, activation] [, options])") end
    activation, opts = nil, activation
  elseif activation ~= nil then
    check.value("Dense", "argument 2", activation, check.rule("an activation (a name or a function) or "
                .. "an options table", activation_rule.test))
  end
  opts = check.options("Dense", opts, DENSE_OPTIONS)
  if activation ~= nil and opts.activation ~= nil then
    fail("Dense", "activation given twice (argument 2 and option 'activation')")
  end
  return new_layer(Dense, {name = opts.name, units = units, use_bias = opts.use_bias,
                           activation = activation_of("Dense", activation or opts.activation)}, "dense")
end

--- dense:build(input_shape [, dtype]): makes the kernel (in, units) and the
-- bias for inputs whose last axis is input_shape's last (float32 by default);
-- the first call does it with the input's shape and dtype
function Dense:build (input_shape, dtype)
  local fan_in = layer.last_size("Dense:build", input_shape)
  dtype = layer.weights_dtype(dtype)
  self.kernel = self:add_variable("kernel", nn.glorot_uniform({fan_in, self.units}, dtype))
  if self.use_bias then self.bias = self:add_variable("bias", mg.zeros({self.units}, dtype)) end
  self.built = true
end

function Dense:call (x)
  check_input("Dense", x, 1, rawget(self, "kernel"))
  if not rawget(self, "kernel") then self:build(x.shape, x.dtype) end
  local act = self.activation
  local fused = act == nil and "linear" or fused_activations[act]
  if fused then return mg.dense(x, self.kernel, self.bias, fused) end
  -- another activation (softmax, a function): the product and bias in one op, then it
  local y = mg.dense(x, self.kernel, self.bias)
  x = nil                 -- let go at once: an input held across the activation grows old (see mg._layer_call)
  return act(y)
end

function Dense:describe ()
  return ("moongrad.nn.Dense '%s' (units=%d, activation=%s)"):format(self.name, self.units,
                                                                      layer.activation_label(self.activation))
end

local NAME_ONLY = {{"name", check.string}}

--- Lambda(fn, {name=}): a layer that calls fn.
local Lambda = class("Lambda", Layer)
nn.Lambda = Lambda
function Lambda.__new (fn, opts)
  check.value("Lambda", "fn", fn, check.callable)
  opts = check.options("Lambda", opts, NAME_ONLY)
  return new_layer(Lambda, {fn = fn, name = opts.name}, "lambda")
end

function Lambda:call (...) return self.fn(...) end

-- layer `what` of a container: callable, and not a layer class (Sequential{Dense})
local function check_layer (who, what, l)
  local name = classes[l]
  if name then fail(who, "%s is the class %s, not a layer; call it: %s(...)", what, name, name) end
  if not check.is_callable(l) then fail(who, "%s is %s, not callable", what, check.kind(l)) end
end

-- a plain list of layers (not a layer itself: Sequential(Dense(2)) forgot the
-- braces); returns its length
local function check_layers (who, layers, write)
  if type(layers) ~= "table" or check.is_callable(layers) or check.kind(layers) ~= "a table" then
    fail(who, "a list of layers expected, got %s%s", check.kind(layers),
         check.is_callable(layers) and "; write " .. write or "")
  end
  local n = check.list(who, layers, "the list of layers", "layer %d")
  for i = 1, n do check_layer(who, ("layer %d"):format(i), layers[i]) end
  return n
end

--- Sequential{layer, ...}: runs the layers in order.
local Sequential = class("Sequential", Layer)
nn.Sequential = Sequential
local SEQUENTIAL_OPTIONS = {{"name", check.string}, {"input_shape", layer.sample_shape}}

--- Sequential{layers...}, {name=, input_shape=}: the layers one after the
-- other; with input_shape (Keras' Input(shape=...): the batch axis left
-- out) it builds at once, so that load_weights, restore and summary work
-- before the first call
function Sequential.__new (layers, opts)
  local n = check_layers("Sequential", layers, "Sequential{...}")
  opts = check.options("Sequential", opts, SEQUENTIAL_OPTIONS)
  local self = new_layer(Sequential, {layers = {}, name = opts.name}, "sequential")
  for i = 1, n do self:add(layers[i]) end
  if opts.input_shape then
    self:build(layer.with_batch(opts.input_shape))
  end
  return self
end

function Sequential:add (layer)
  check.self("Sequential:add", self, Sequential, "model:add(layer)")
  check_layer("Sequential:add", "layer", layer)
  self.layers[#self.layers + 1] = layer
  self:track(layer)
  return self
end

function Sequential:call (x, ...)
  local around = Sequential._around           -- a memory plan's (moongrad.planner), while one runs
  if around then return around(self, x, ...) end
  return Sequential._run(self, 1, #self.layers, x, ...)
end

-- layers first..last on x, one after the other (a plan runs them by segments)
function Sequential._run (self, first, last, x, ...)
  for i = first, last do
    local layer = self.layers[i]
    x = layer(x, ...)
    if type(layer) == "function" and mg.is_tensor(x) then     -- layers note their own (note_shape)
      local shapes = rawget(self, "_fn_shapes") or {}
      shapes[i] = x.shape
      self._fn_shapes = shapes
    end
  end
  return x
end

function Sequential:describe ()
  local parts = {}
  for i, l in ipairs(self.layers) do
    parts[i] = "  " .. tostring(l):gsub("\n", "\n  ")
  end
  local size = "not built yet"
  if rawget(self, "_output_shape") ~= nil then
    local n = 0
    for _, v in ipairs(self.variables) do n = n + v:numel() end
    size = ("%d parameters"):format(n)
  end
  return ("moongrad.nn.Sequential '%s' (%d layers, %s) {\n%s\n}"):format(self.name, #self.layers, size,
                                                                          table.concat(parts, "\n"))
end

-- }=============================================================


-- {================= convolution and pooling ===================
-- Images are NHWC, (batch, height, width, channels), as TensorFlow has them.

local function is_size (v) return math.type(v) == "integer" and v >= 1 end

local pair_rule = check.rule("a positive integer or a pair {height, width} of them", function(v)
  if is_size(v) then return true end
  if type(v) ~= "table" or getmetatable(v) ~= nil then return false end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  return n == 2 and is_size(v[1]) and is_size(v[2])
end)

local padding_rule = check.rule("'valid' or 'same'", function(v)
  return type(v) == "string" and (v:lower() == "valid" or v:lower() == "same")
end)

local function pair (v) return type(v) == "table" and {v[1], v[2]} or {v, v} end

-- x must be a float tensor (batch, height, width, channels)
local function check_image (who, x)
  check.float_tensor(who, "input", x)
  if x.ndim ~= 4 then
    fail(who, "input must have 4 dimensions (batch, height, width, channels), got shape %s", check.shape(x.shape))
  end
end

--- Conv2D(filters, kernel_size, {strides=1, padding="valid", dilation_rate=1,
-- activation=, use_bias=true, kernel_initializer="glorot_uniform", name=}):
-- y = activation(conv2d(x, kernel) + bias) on NHWC images. kernel_size,
-- strides and dilation_rate are an integer or a {height, width} pair; the
-- kernel (KH,KW,Cin,filters) is built on the first call from the input's
-- channels (glorot-uniform with Keras' fans, or "he_uniform", "zeros", or a
-- function(shape, dtype)), the bias is zero.
local Conv2D = class("Conv2D", Layer)
nn.Conv2D = Conv2D

local CONV2D_OPTIONS = {{"strides", pair_rule, 1}, {"padding", padding_rule, "valid"}, {"dilation_rate", pair_rule, 1},
                        {"activation", activation_rule}, {"use_bias", check.boolean, true},
                        {"kernel_initializer", initializer_rule, "glorot_uniform"}, {"name", check.string}}

function Conv2D.__new (filters, kernel_size, opts)
  check.value("Conv2D", "filters", filters, check.positive_integer)
  check.value("Conv2D", "kernel_size", kernel_size, pair_rule)
  opts = check.options("Conv2D", opts, CONV2D_OPTIONS)
  local self = new_layer(Conv2D, {name = opts.name, filters = filters, kernel_size = pair(kernel_size),
                                  strides = pair(opts.strides), padding = opts.padding:lower(),
                                  dilation_rate = pair(opts.dilation_rate), use_bias = opts.use_bias,
                                  activation = activation_of("Conv2D", opts.activation)}, "conv2d")
  self._init = initializer_of("Conv2D", opts.kernel_initializer)
  self._opts = {strides = self.strides, padding = self.padding, dilation_rate = self.dilation_rate}
  local fused = self.activation == nil and "linear" or fused_activations[self.activation]
  if fused then                                  -- the activation in conv2d's own op, as Dense's
    self._opts_act = {strides = self.strides, padding = self.padding, dilation_rate = self.dilation_rate,
                      activation = fused}
  end
  return self
end

--- conv:build(input_shape [, dtype]): makes the kernel (KH, KW, channels,
-- filters) for NHWC inputs of input_shape (float32 by default)
function Conv2D:build (input_shape, dtype)
  local channels = layer.last_size("Conv2D:build", input_shape)
  local shape = {self.kernel_size[1], self.kernel_size[2], channels, self.filters}
  dtype = layer.weights_dtype(dtype)
  local k = self._init(shape, dtype)
  if not (check.is_array(k) and check.same_shape(k.shape, shape) and k.dtype == dtype) then
    fail("Conv2D", "kernel_initializer gave %s for shape %s %s", show(k), check.shape(shape), dtype)
  end
  self.kernel = self:add_variable("kernel", k)
  if self.use_bias then self.bias = self:add_variable("bias", mg.zeros({self.filters}, dtype)) end
  self.built = true
end

function Conv2D:call (x)
  check_image("Conv2D", x)
  local k = self.kernel
  if k == nil then
    self:build(x.shape, x.dtype)
  elseif not layer.fits(x.dtype, k.dtype) then
    fail("Conv2D", "input is %s, the layer was built for %s", x.dtype, k.dtype)
  elseif x.shape[4] ~= k.shape[3] then
    fail("Conv2D", "input has %d channels, the layer was built for %d", x.shape[4], k.shape[3])
  end
  if self._opts_act then return mg.conv2d(x, self.kernel, self.bias, self._opts_act) end
  local y = mg.conv2d(x, self.kernel, self.bias, self._opts)
  x = nil                 -- as in Dense:call
  return self.activation(y)
end

function Conv2D:describe ()
  return ("moongrad.nn.Conv2D '%s' (filters=%d, kernel_size=%dx%d, activation=%s)"):format(self.name,
    self.filters, self.kernel_size[1], self.kernel_size[2], layer.activation_label(self.activation))
end

local POOL_OPTIONS = {{"pool_size", pair_rule}, {"strides", pair_rule}, {"padding", padding_rule, "valid"},
                      {"name", check.string}}

-- a pooling layer class: MaxPool2D([pool_size] [, {strides=, padding=, name=}])
local function pool_class (name, base, op)
  local cls = class(name, Layer)
  nn[name] = cls
  function cls.__new (pool_size, opts)
    if type(pool_size) == "table" and not pair_rule.test(pool_size) and pool_size[1] == nil then
      if opts ~= nil then fail(name, "options given twice; write %s([pool_size] [, options])", name) end
      pool_size, opts = nil, pool_size                       -- MaxPool2D{pool_size = 3}
    end
    if pool_size ~= nil then check.value(name, "pool_size", pool_size, pair_rule) end
    opts = check.options(name, opts, POOL_OPTIONS)
    if pool_size ~= nil and opts.pool_size ~= nil then
      fail(name, "pool_size given twice (argument 1 and option 'pool_size')")
    end
    local size = pair(pool_size or opts.pool_size or 2)
    local strides = opts.strides and pair(opts.strides) or size
    local self = new_layer(cls, {name = opts.name, pool_size = size, strides = strides,
                                 padding = opts.padding:lower()}, base)
    self._opts = {pool_size = size, strides = strides, padding = self.padding}
    return self
  end
  cls.call = function(self, x)
    check_image(name, x)
    return op(x, self._opts)
  end
  cls.describe = function(self)
    return ("moongrad.nn.%s '%s' (pool_size=%dx%d)"):format(name, self.name, self.pool_size[1], self.pool_size[2])
  end
  return cls
end

--- MaxPool2D([pool_size=2] [, {strides=pool_size, padding="valid", name=}]): the
-- maximum of each window. AvgPool2D: the mean (padding not counted, as Keras).
pool_class("MaxPool2D", "max_pooling2d", mg.max_pool2d)
pool_class("AvgPool2D", "average_pooling2d", mg.avg_pool2d)

--- GlobalAveragePooling2D{keepdims=false, name=}: the mean over height and
-- width, (N,H,W,C) -> (N,C) (or (N,1,1,C) with keepdims).
local GlobalAveragePooling2D = class("GlobalAveragePooling2D", Layer)
nn.GlobalAveragePooling2D = GlobalAveragePooling2D

local GAP_OPTIONS = {{"keepdims", check.boolean, false}, {"name", check.string}}

function GlobalAveragePooling2D.__new (opts)
  opts = check.options("GlobalAveragePooling2D", opts, GAP_OPTIONS)
  return new_layer(GlobalAveragePooling2D, {keepdims = opts.keepdims, name = opts.name}, "global_average_pooling2d")
end

function GlobalAveragePooling2D:call (x)
  check_image("GlobalAveragePooling2D", x)
  return mg.mean(x, {2, 3}, self.keepdims)
end

-- }=============================================================


-- {========================= reshaping =========================

--- Flatten{name=}: (N, ...) -> (N, the product of the rest).
local Flatten = class("Flatten", Layer)
nn.Flatten = Flatten

function Flatten.__new (opts)
  opts = check.options("Flatten", opts, NAME_ONLY)
  return new_layer(Flatten, {name = opts.name}, "flatten")
end

function Flatten:call (x)
  check_input("Flatten", x, 1)
  local shape, size = x.shape, 1
  for i = 2, #shape do size = size * shape[i] end
  return mg.reshape(x, {shape[1], size})
end

--- Reshape(target_shape, {name=}): (N, ...) -> (N, target_shape...); one entry
-- of target_shape may be -1 (worked out from the others).
local Reshape = class("Reshape", Layer)
nn.Reshape = Reshape

local target_rule = check.rule("a positive integer or -1", function(v) return is_size(v) or v == -1 end)

function Reshape.__new (target, opts)
  if type(target) ~= "table" or check.kind(target) ~= "a table" then
    fail("Reshape", "target_shape must be a list of sizes (the batch axis left out), got %s", show(target))
  end
  local n, unknown = check.list("Reshape", target, "target_shape", "target_shape[%d]"), 0
  for i = 1, n do
    check.value("Reshape", ("target_shape[%d]"):format(i), target[i], target_rule)
    if target[i] == -1 then unknown = unknown + 1 end
  end
  if unknown > 1 then fail("Reshape", "target_shape may have one -1, got %d", unknown) end
  opts = check.options("Reshape", opts, NAME_ONLY)
  return new_layer(Reshape, {target_shape = table.move(target, 1, n, 1, {}), name = opts.name}, "reshape")
end

function Reshape:call (x)
  check_input("Reshape", x, 1)
  local shape, size, known, out = x.shape, 1, 1, {x.shape[1]}
  for i = 2, #shape do size = size * shape[i] end
  for i, d in ipairs(self.target_shape) do
    out[i + 1] = d
    if d ~= -1 then known = known * d end
  end
  local fits, free = known == size, false
  for i, d in ipairs(self.target_shape) do
    if d == -1 then
      fits, free = known > 0 and size % known == 0, true
      out[i + 1] = fits and size // known or -1
    end
  end
  if not fits then
    fail("Reshape", "cannot reshape %s into (None,%s): %d values per sample, the target holds %s%d",
         check.shape(shape), table.concat(self.target_shape, ","), size, free and "a multiple of " or "", known)
  end
  return mg.reshape(x, out)
end

-- }=============================================================


-- {========================== summary ==========================

local LINE, POSITIONS = 65, {29, 55, 65}      -- Keras' columns for a sequential model

-- one row as Keras' print_row writes it: each field cut at its column, a
-- space before the next (trailing spaces dropped)
local function row (fields)
  local line = ""
  for i, f in ipairs(fields) do
    if i > 1 then line = line:sub(1, -2) .. " " end
    line = (line .. f):sub(1, POSITIONS[i])
    line = line .. (" "):rep(POSITIONS[i] - #line)
  end
  return (line:gsub("%s+$", ""))
end

local function with_commas (n)
  local s = tostring(n)
  while true do
    local k
    s, k = s:gsub("^(%d+)(%d%d%d)", "%1,%2")
    if k == 0 then return s end
  end
end

local function shape_text (s)
  if s == "multiple" then return s end
  local parts = {"None"}
  for i = 2, #s do parts[i] = tostring(s[i]) end
  return #parts == 1 and "(None,)" or "(" .. table.concat(parts, ", ") .. ")"
end

local function count (vars)
  local n = 0
  for _, v in ipairs(vars) do
    local size = 1
    for _, d in ipairs(v.shape) do size = size * d end
    n = n + size
  end
  return n
end

-- the summary's rows: {name, type, shape (or nil: unknown), params}
local function summary_rows (self)
  local list = getmetatable(self) == Sequential and self.layers or {self}
  local fn_shapes = rawget(self, "_fn_shapes") or {}
  local rows = {}
  for i, l in ipairs(list) do
    local inner = unwrap(l)
    local is_layer = type(inner) == "table" and classes[getmetatable(inner)] ~= nil
    rows[i] = {name = is_layer and inner.name or type(inner), type = is_layer and classes[getmetatable(inner)] or type(inner),
               shape = is_layer and rawget(inner, "_output_shape") or fn_shapes[i],
               params = is_layer and count(inner.variables) or 0}
  end
  return rows
end

local SUMMARY_OPTIONS = {{"input_shape", layer.sample_shape}, {"print_fn", check.callable}}

--- model:summary{input_shape=, print_fn=print}: prints Keras' table of the
-- layers (name and type, output shape with None for the batch, parameters)
-- and the totals, one line at a time through print_fn, and returns the text.
-- The shapes are those of the last call; a model that never ran needs
-- input_shape (without the batch axis) for one build pass on ones, run with
-- every `training` flag off.
function Layer:summary (opts)
  local who = "summary"
  opts = check.options(who, opts, SUMMARY_OPTIONS)
  local rows = summary_rows(self)
  local unknown = false
  for _, r in ipairs(rows) do unknown = unknown or r.shape == nil end
  if unknown and opts.input_shape then
    layer.build_pass(self, layer.with_batch(opts.input_shape, 1))
    rows = summary_rows(self)
  elseif unknown then
    fail(who, "'%s' has not run yet, so its output shapes are unknown; call it on a batch first, or give "
         .. "the input shape without the batch axis: model:summary{input_shape = {28, 28, 1}}", self.name)
  end
  local lines = {('Model: "%s"'):format(self.name), ("_"):rep(LINE), row{"Layer (type)", "Output Shape", "Param #"},
                 ("="):rep(LINE)}
  for i, r in ipairs(rows) do
    lines[#lines + 1] = row{("%s (%s)"):format(r.name, r.type), shape_text(r.shape), with_commas(r.params)}
    lines[#lines + 1] = (i == #rows and "=" or "_"):rep(LINE)
  end
  if #rows == 0 then lines[#lines + 1] = ("="):rep(LINE) end
  local total, trainable = count(self.variables), count(self.trainable_variables)
  lines[#lines + 1] = "Total params: " .. with_commas(total)
  lines[#lines + 1] = "Trainable params: " .. with_commas(trainable)
  lines[#lines + 1] = "Non-trainable params: " .. with_commas(total - trainable)
  lines[#lines + 1] = ("_"):rep(LINE)
  local out = opts.print_fn or print
  for _, l in ipairs(lines) do out(l) end
  return table.concat(lines, "\n") .. "\n"
end

-- }=============================================================


-- {==================== dropout, batch norm ====================

-- dropout(x, rate) is moongrad.layer's (nn.dropout)

--- Dropout(rate, {training=true, name=}): dropout while training (layer.training,
-- or the call's second argument), the identity otherwise.
local Dropout = class("Dropout", Layer)
nn.Dropout = Dropout

local DROPOUT_OPTIONS = {{"training", check.boolean, true}, {"name", check.string}}

function Dropout.__new (rate, opts)
  check.value("Dropout", "rate", rate, check.fraction)
  opts = check.options("Dropout", opts, DROPOUT_OPTIONS)
  return new_layer(Dropout, {rate = rate, training = opts.training, name = opts.name}, "dropout")
end

function Dropout:call (x, training)
  check_input("Dropout", x, 0)
  check.value("Dropout", "training (argument 2)", training, optional_boolean)
  if training == nil then training = self.training end
  if not training then return x end
  return nn.dropout(x, self.rate)
end

--- BatchNorm{momentum=0.99, epsilon=1e-3, training=true, name=}: normalizes
-- over every axis but the last: features of (N, F), channels of NHWC images
-- (over batch, height and width, as Keras' BatchNormalization after a Conv2D). While training it uses the batch's statistics
-- and moves its running averages, but not while recompute_grad re-runs it
-- (mg.is_recomputing()), so the averages move once per step. Training is one
-- custom gradient that saves x alone (ctx:save, so the tape counts it) where
-- the ops would keep x - mean and the normalized x; its backward computes the
-- statistics again from x with ops, so second-order gradients are exact.
local BatchNorm = class("BatchNorm", Layer)
nn.BatchNorm = BatchNorm

local BATCHNORM_OPTIONS = {{"momentum", check.unit, 0.99}, {"epsilon", check.positive, 1e-3},
                           {"training", check.boolean, true}, {"name", check.string}}

function BatchNorm.__new (opts)
  opts = check.options("BatchNorm", opts, BATCHNORM_OPTIONS)
  return new_layer(BatchNorm, {momentum = opts.momentum, epsilon = opts.epsilon,
                               training = opts.training, name = opts.name}, "batch_norm")
end

--- bn:build(input_shape [, dtype]): makes the statistics and the scale and
-- shift of input_shape's last axis (float32 by default)
function BatchNorm:build (input_shape, dtype)
  local n = layer.last_size("BatchNorm:build", input_shape)
  dtype = layer.weights_dtype(dtype)
  self.gamma = self:add_variable("gamma", mg.ones({n}, dtype))
  self.beta = self:add_variable("beta", mg.zeros({n}, dtype))
  self.moving_mean = self:add_variable("moving_mean", mg.zeros({n}, dtype), {trainable = false})
  self.moving_variance = self:add_variable("moving_variance", mg.ones({n}, dtype), {trainable = false})
  self.updates = 0
  self.built = true
end

-- the batch's mean and (biased) variance over every axis but the last
local function batch_moments (x)
  local axes = {}
  for i = 1, x.ndim - 1 do axes[i] = i end
  local mean = mg.mean(x, axes)
  return mean, mg.mean((x - mean) ^ 2, axes), axes
end

-- y = x_hat * gamma + beta, x_hat = (x - mean) * inv_std with the batch's
-- statistics. The backward, for N values per channel:
--   dbeta = sum(dy), dgamma = sum(dy * x_hat),
--   dx = gamma * inv_std * (dy - dbeta / N - x_hat * dgamma / N)
local function batch_norm_train (ctx, x, gamma, beta, epsilon, stats)
  local mean, var = batch_moments(x)
  stats.mean, stats.var = mean, var
  ctx:save(x, gamma)                     -- gamma's value now, as the plain tape would keep it
  local y = (x - mean) / mg.sqrt(var + epsilon) * gamma + beta
  return y, function(dy)
    local xs, g = ctx:saved()
    local m, v, axes = batch_moments(xs)
    local inv_std = 1 / mg.sqrt(v + epsilon)
    local x_hat = (xs - m) * inv_std
    local n = xs:numel() // xs.shape[xs.ndim]
    local dbeta = mg.sum(dy, axes)
    local dgamma = mg.sum(dy * x_hat, axes)
    local dx = ctx:needs_input_grad(1) and (dy - dbeta / n - x_hat * (dgamma / n)) * (g * inv_std) or nil
    return dx, dgamma, dbeta
  end
end

local batch_norm_op = mg.custom_gradient(batch_norm_train, {context = true})

function BatchNorm:call (x, training)
  check_input("BatchNorm", x, 2, rawget(self, "gamma"))
  check.value("BatchNorm", "training (argument 2)", training, optional_boolean)
  if not rawget(self, "gamma") then self:build(x.shape, x.dtype) end
  if training == nil then training = self.training end
  if not training then
    return (x - self.moving_mean) / mg.sqrt(self.moving_variance + self.epsilon) * self.gamma + self.beta
  end
  local stats = {}
  local y = batch_norm_op(x, self.gamma, self.beta, self.epsilon, stats)
  -- an empty batch has no statistics (its mean is NaN): the moving ones stay, as PyTorch's
  if not mg.is_recomputing() and x:numel() > 0 then
    local m = self.momentum
    self.moving_mean:assign(self.moving_mean * m + stats.mean * (1 - m))
    self.moving_variance:assign(self.moving_variance * m + stats.var * (1 - m))
    if not mg.memory.dry_running() then self.updates = self.updates + 1 end   -- a dry run's assigns write nothing
  end
  return y
end

-- }=============================================================


-- {=========================== losses ==========================

--- softmax_cross_entropy(logits, labels): the mean over the batch of
-- -sum(p * log_softmax(logits)) over the last axis. logits (B, C); labels
-- either int64 class numbers (B), 1-based, or probabilities p (B, C) (one-hot
-- or soft) of the logits' dtype. (moongrad.losses holds the one definition.)
function nn.softmax_cross_entropy (logits, labels)
  return require("moongrad.losses").softmax_cross_entropy(logits, labels)
end

local HALF = {bfloat16 = true, float16 = true}

--- mean_squared_error(y, target): mean((y - target)^2), PyTorch's mse_loss
-- order; y and target of one shape and dtype (no broadcasting: a (3) and a
-- (3,1) would give a (3,3)), or a half one (a product's output under
-- autocast) with a float32 one: in float32, as the other losses.
function nn.mean_squared_error (y, target)
  local who = "mean_squared_error"
  check.float_tensor(who, "y", y)
  check.float_tensor(who, "target", target)
  local function float32_or_half (dt) return dt == "float32" or HALF[dt] end
  if y.dtype ~= target.dtype and not (float32_or_half(y.dtype) and float32_or_half(target.dtype)) then
    fail(who, "y is %s but target is %s; cast one", y.dtype, target.dtype)
  end
  if not check.same_shape(y.shape, target.shape) then
    fail(who, "y has shape %s but target has shape %s; they must match exactly", check.shape(y.shape),
         check.shape(target.shape))
  end
  return mg.mean((y - target) ^ 2)
end

-- }=============================================================


-- {================== memory-saving blocks =====================

--- checkpoint_sequential(layers, segments, x): runs the layers in order, in
-- `segments` groups; every group but the last runs under recompute_grad, so
-- the tape keeps only the groups' inputs (PyTorch's checkpoint_sequential).
-- With segments = sqrt(#layers) the activations held are O(sqrt(#layers)).
-- It takes one input, as PyTorch's: several go in one table, which the first
-- layer takes apart (any value passes through recompute_grad).
function nn.checkpoint_sequential (layers, segments, x, ...)
  local who = "checkpoint_sequential"
  local extra = select("#", ...)
  if extra > 0 then
    fail(who, "takes one input (x, argument 3), got %d more argument%s; pass several inputs as one "
         .. "table, for the first layer to take apart", extra, extra == 1 and "" or "s")
  end
  if getmetatable(layers) == Sequential then layers = layers.layers end
  local n = check_layers(who, layers, "checkpoint_sequential({layer, ...}, segments, x)")
  if n == 0 then fail(who, "the list of layers is empty") end
  check.value(who, "segments", segments, check.positive_integer)
  if segments > n then fail(who, "segments (%d) must be at most the number of layers (%d)", segments, n) end
  if x == nil then fail(who, "x (argument 3) is nil") end
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

-- }=============================================================


-- {================= extensions, loaded on first use =================

-- Training (compile, fit, ...) and checkpoints (save_weights, load_weights)
-- are methods of every layer; the reversible layers and the transformer's
-- are classes. Each lives in a module of its own, loaded when a script
-- first uses one of its names: every full collection walks every Lua
-- object the library has made, and these four modules are more than half
-- of them (190 of 350 KiB). Loading them all made each full collection of
-- the MLP step (bench/cases.lua) take 0.23 ms, against 0.10 without.
-- A module gives its methods as module.layer_methods[name], its classes as
-- module[name]; none of them changes nn or Layer itself.
local EXTENSIONS = {   -- module -> the methods it gives every layer, the classes it adds to nn
  ["moongrad.fit"] = {methods = {"compile", "fit", "evaluate", "predict", "train_step", "test_step"}},
  ["moongrad.checkpoint"] = {methods = {"save_weights", "load_weights"}},
  ["moongrad.reversible"] = {classes = {"RecomputeLayer", "ReversibleLayer", "RevBlock", "AffineCoupling",
                                        "InvertibleLinear"}},
  ["moongrad.transformer"] = {classes = {"Embedding", "PositionalEmbedding", "LayerNorm", "MultiHeadAttention",
                                         "TransformerBlock"}},
}
local installed = {}       -- module -> true, or "loading" while it loads
local stand_ins = {}       -- method name -> its stand-in

-- Loads module once and copies its methods into Layer, its classes into
-- nn. A method or class the script set itself before (Layer.predict =
-- mine) stays the script's.
local function extend (module)
  if installed[module] then return end
  local e = EXTENSIONS[module]
  installed[module] = "loading"
  local ok, m = pcall(require, module)
  installed[module] = ok or nil
  if not ok then error(m, 0) end
  for _, name in ipairs(e.methods or {}) do
    if rawget(Layer, name) == stand_ins[name] then Layer[name] = check.guard(m.layer_methods[name]) end
  end
  for _, name in ipairs(e.classes or {}) do
    if rawget(nn, name) == nil then rawset(nn, name, m[name]) end
  end
end

-- a method stands in for its module's until the first call, which loads it
-- (extend replaces the stand-in) and tail-calls it, so errors still
-- name the caller's line
local function stand_in (module, name)
  local function method (...)
    extend(module)
    local f = rawget(Layer, name)
    if f == method or f == nil then error(("nn: %s gives no Layer.%s"):format(module, name)) end
    return Layer[name](...)
  end
  stand_ins[name] = check.guard(method)
  return stand_ins[name]
end

-- nn's metatable loads a class on first access; its keys name the classes
-- still to come, so the REPL completes them
local class_module = {}
local lazy = {__index = function(_, k)
  local module = class_module[k]
  if module then
    extend(module)
    return rawget(nn, k)
  end
end}
for module, e in pairs(EXTENSIONS) do
  for _, name in ipairs(e.methods or {}) do Layer[name] = stand_in(module, name) end
  for _, name in ipairs(e.classes or {}) do class_module[name], lazy[name] = module, true end
end
-- for the specs: the list, and a way to load them all now
lazy.__extensions = EXTENSIONS
lazy.__load_extensions = function() for module in pairs(EXTENSIONS) do extend(module) end end
setmetatable(nn, lazy)

-- }=============================================================

return check.export(nn)          -- errors name the user's line (moongrad.check)

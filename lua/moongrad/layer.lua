--- moongrad.layer: what every layer shares — the Layer class, the classes
-- derived from it (layer.class, Layer:subclass), variable tracking, the
-- call that notes output shapes, input checks, the initializers' fans and
-- dropout. mg.nn, moongrad.transformer and moongrad.reversible build their
-- layers on it; mg.nn re-exports what is public (nn.Layer, nn.glorot_uniform,
-- nn.dropout), so this module is not API itself.
--
-- A layer is a callable table: `layer(x)` runs `layer:call(x)` (mg._layer_call,
-- which notes the output's shape for summary()). `layer.variables` lists its
-- variables and those of the layers inside it, in creation order;
-- `layer.trainable_variables` only the trainable ones.
-- @module moongrad.layer
local mg = require "moongrad"
local check = require "moongrad.check"
local class = require "moongrad.class"

local fail, show = check.fail, check.show

local layer = {}

-- {========================== classes ==========================

local properties = {}
local classes = {}        -- class -> short name, to catch Sequential{Dense}: a class, not a layer
layer.classes = classes

--- layer.note_shape(self, ...): returns its arguments after self; a layer
-- remembers the shape of what its last call returned, for summary()
local function note_shape (self, y, ...)
  if select("#", ...) > 0 and mg.is_tensor((...)) then
    rawset(self, "_output_shape", "multiple")
  elseif mg.is_tensor(y) then
    rawset(self, "_output_shape", y.shape)
  end
  return y, ...
end
layer.note_shape = note_shape

--- layer.class(name, parent): a layer class "moongrad.nn.<name>" deriving
-- from parent (moongrad.class's idiom), whose instances also have the
-- properties variables, trainable_variables and non_trainable_variables
function layer.class (name, parent)
  local cls = class("moongrad.nn." .. name, parent)
  classes[cls] = name
  cls.__index = function(self, k)
    local prop = properties[k]
    if prop then return prop(self) end
    return cls[k]
  end
  return cls
end

--- layer.is_layer(v): whether v is an instance of a layer class
function layer.is_layer (v)
  return type(v) == "table" and classes[getmetatable(v)] ~= nil
end

local counters = {}

local function auto_name (base)
  local n = counters[base] or 0
  counters[base] = n + 1
  return n == 0 and base or (base .. "_" .. n)
end

-- }=============================================================


-- {=========================== Layer ===========================

local Layer = layer.class("Layer")
Layer.built = false                     -- until it builds (Keras' layer.built)
layer.Layer = Layer
Layer.__call = mg._layer_call             -- self:call(...), then note_shape's note (in C: see there)
Layer.__tostring = function(self) return self:describe() end

--- layer.new(cls, obj, base): makes obj (a table) a layer of class cls,
-- named obj.name or after base ("dense", "dense_1", ...)
local function new_layer (cls, obj, base)
  obj = obj or {}
  obj._vars, obj._layers = {}, {}
  obj.name = obj.name or auto_name(base)
  return setmetatable(obj, cls)
end
layer.new = new_layer

local VARIABLE_OPTIONS = {{"trainable", check.boolean, true}}

--- Creates a variable owned by this layer: add_variable(name, init, {trainable=true}).
function Layer:add_variable (name, init, opts)
  check.value("Layer:add_variable", "name", name, check.string)
  opts = check.options("Layer:add_variable", opts, VARIABLE_OPTIONS)
  local v = mg.Variable(init, {name = self.name .. "/" .. name, trainable = opts.trainable})
  self._vars[#self._vars + 1] = v
  return v
end

--- layer.unwrap(l): the layer inside a recompute_grad wrapper (a userdata), or l itself
local function unwrap (l)
  if type(l) == "userdata" then
    local ok, inner = pcall(function() return l.__wrapped__ end)
    if ok and inner ~= nil then return inner end
  end
  return l
end
layer.unwrap = unwrap

--- Registers a sublayer (or a callable) whose variables this layer owns too;
-- a layer under recompute_grad is the layer's own.
function Layer:track (layer)
  local inner = unwrap(layer)
  if type(inner) == "table" then self._layers[#self._layers + 1] = inner end
  return layer
end

local function is_list (v) return type(v) == "table" and getmetatable(v) == nil end
local track_value

--- layer.refresh(l): what l's lists (plain tables in the fields that were
-- assigned one) hold now becomes l's own too, as Keras tracks lists: a list
-- filled after it was assigned (`self.blocks = {}`, then `self.blocks[i] =
-- ...`), or replaced (the field read now, by name: nothing piles up). The
-- variables and layers (l itself aside) not yet l's are appended, in the
-- lists' order; everything that walks a layer's variables or sublayers
-- calls it first. O(what l holds).
function layer.refresh (l)
  local fields = rawget(l, "_list_fields")
  if not fields then return end
  local have, seen = {}, {}
  for _, v in ipairs(rawget(l, "_vars")) do have[v] = true end
  for _, v in ipairs(rawget(l, "_layers")) do have[v] = true end
  for _, k in ipairs(fields) do
    local v = rawget(l, k)
    if is_list(v) then track_value(l, v, seen, have) end
  end
end

-- l's variables, then its sublayers' (each layer walked once: a layer a
-- sublayer holds in a list or dict, its parent say, is no cycle)
local function collect (l, out, seen)
  if seen[l] then return out end
  seen[l] = true
  layer.refresh(l)
  for _, v in ipairs(rawget(l, "_vars") or {}) do
    if not seen[v] then seen[v] = true; out[#out + 1] = v end
  end
  for _, sub in ipairs(rawget(l, "_layers") or {}) do
    if rawget(sub, "_vars") or rawget(sub, "_layers") then
      collect(sub, out, seen)
    else                                  -- a callable table with variables of its own
      local vars = sub.variables          -- (its own error is the user's to see)
      if type(vars) == "table" then
        for _, v in ipairs(vars) do
          if not seen[v] then seen[v] = true; out[#out + 1] = v end
        end
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
  check.fail(self:describe(), "call is not defined")
end

-- }=============================================================


-- {======================== activations ========================
-- Every activation of the library by name, in every layer that takes one,
-- as Keras accepts them; a name takes Keras' defaults (leaky_relu's
-- negative slope 0.2, where mg.leaky_relu's own default is PyTorch's 0.01).

local identity = function(x) return x end
layer.activations = {
  linear = identity, tanh = mg.tanh, relu = mg.relu, sigmoid = mg.sigmoid, softplus = mg.softplus,
  softmax = function(x) return mg.softmax(x) end, log_softmax = function(x) return mg.log_softmax(x) end,
  gelu = function(x) return mg.gelu(x) end, gelu_tanh = function(x) return mg.gelu(x, "tanh") end,
  silu = mg.silu, swish = mg.silu, elu = function(x) return mg.elu(x) end,
  leaky_relu = function(x) return mg.leaky_relu(x, 0.2) end, exponential = mg.exp,
}
layer.activation_names = {}
for name in pairs(layer.activations) do layer.activation_names[#layer.activation_names + 1] = name end
table.sort(layer.activation_names)

layer.activation_rule = check.rule("an activation name or a function",
                                   function(v) return type(v) == "string" or check.is_callable(v) end)

--- layer.activation_label(f): the name activation function f goes by, for
-- describe ("linear" for none, "custom" for a function of one's own)
function layer.activation_label (f)
  if f == nil then return "linear" end
  for _, name in ipairs(layer.activation_names) do
    if layer.activations[name] == f then return name end
  end
  return "custom"
end

--- layer.activation_of(who, a): the function of activation a (a name or a
-- function; nil stays nil)
function layer.activation_of (who, a)
  if a == nil or check.is_callable(a) then return a end
  return layer.activations[a] or check.unknown(who, "activation", a, layer.activation_names)
end

-- }=============================================================


-- {=========================== build ===========================
-- Keras' contract: a layer makes its variables in build(input_shape), once,
-- before its first call; `layer.built` says it did. mg.nn's layers build
-- themselves on their first call (from the input's shape and dtype) or when
-- asked; a model (or any layer without a build of its own) builds by one
-- pass on zeros; a Layer:subclass with a build of its own has it called
-- with the shape of the first call's input.

local size_rule = check.rule("an integer >= 0", function(v) return math.type(v) == "integer" and v >= 0 end)
local size_or_nil = check.rule("an integer >= 0 (or nil for the batch)", function(v)
  return v == nil or (math.type(v) == "integer" and v >= 0)
end)

--- layer.sample_shape: the rule for a shape without its batch axis ({28, 28, 1}):
-- Sequential's and summary's input_shape
layer.sample_shape = check.rule("a list of sizes, the batch axis left out ({28, 28, 1})", function(v)
  if type(v) ~= "table" or #v == 0 then return false end
  for k, d in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 or k > #v or math.type(d) ~= "integer" or d < 0 then return false end
  end
  return true
end)

--- layer.with_batch(sample_shape [, batch]): the shape with a batch axis in
-- front (nil: any, as Keras' None)
function layer.with_batch (sample_shape, batch)
  local shape = {batch}
  for i, d in ipairs(sample_shape) do shape[i + 1] = d end
  return shape
end

-- input_shape as a list of its entries: a table whose first entry (the
-- batch) may be nil, as Keras' (None, 20); its length and entries checked
local function shape_of (who, input_shape)
  if type(input_shape) ~= "table" then
    fail(who, "input_shape must be a table of sizes, the batch first (nil allowed: {nil, 20}), got %s",
         show(input_shape))
  end
  local n = 0
  for k in pairs(input_shape) do
    if math.type(k) ~= "integer" or k < 1 then
      fail(who, "input_shape must be a list of sizes, got the key %s", show(k))
    end
    if k > n then n = k end
  end
  for i = 1, n do
    check.value(who, ("input_shape[%d]"):format(i), input_shape[i], i == 1 and size_or_nil or size_rule)
  end
  return n
end

--- layer.last_size(who, input_shape): input_shape's last entry (the features)
function layer.last_size (who, input_shape)
  local n = shape_of(who, input_shape)
  if n == 0 or input_shape[n] == nil then
    fail(who, "input_shape must give the features (its last entry), got %s", n == 0 and "an empty table" or "nil")
  end
  return input_shape[n]
end

--- layer.build_pass(model, shape [, dtype]): runs model once on ones of
-- shape and dtype (a nil batch is 1; float32, or int64 for token ids), every
-- `training` flag off, so that every layer builds
function layer.build_pass (self, input_shape, dtype)
  local n = shape_of("build", input_shape)
  local shape = {}
  for i = 1, n do shape[i] = input_shape[i] or 1 end
  layer.training_off(self, self, mg.ones(shape, dtype))     -- ones: a valid token id too
end

--- layer.training_off(model, f, ...): f(...) with every `training` flag in
-- model and its sublayers off (no dropout drawn, no statistics moved), and
-- put back after, even when f fails; f's results
function layer.training_off (model, f, ...)
  local flags, seen = {}, {}
  local function walk (l)
    l = unwrap(l)
    if type(l) ~= "table" or seen[l] then return end
    seen[l] = true
    if type(rawget(l, "training")) == "boolean" then flags[l] = l.training; l.training = false end
    if rawget(l, "_vars") then layer.refresh(l) end
    for _, sub in ipairs(rawget(l, "_layers") or {}) do walk(sub) end
  end
  walk(model)
  local out = table.pack(pcall(f, ...))
  for l, v in pairs(flags) do l.training = v end
  if not out[1] then error(out[2], 0) end
  return table.unpack(out, 2, out.n)
end

--- model:build(input_shape [, dtype]): makes every variable before the
-- first call (Keras' model.build): input_shape with the batch first, nil
-- allowed ({nil, 28, 28, 1}), dtype the input's ("int64" for token ids);
-- load_weights, restore and summary then work on it
function Layer:build (input_shape, dtype)
  layer.build_pass(self, input_shape, dtype)
  self.built = true
end

-- what a subclass's first call runs before call (mg._layer_call, or
-- RecomputeLayer's __call): build with the shape of the first argument (a
-- list of shapes when it is a list of tensors), and its dtype after it
function Layer:_build_first (x)
  rawset(self, "_build_pending", nil)
  local shape, dtype
  if mg.is_tensor(x) then
    shape, dtype = x.shape, x.dtype
  elseif type(x) == "table" and getmetatable(x) == nil then
    shape = {}
    for i, t in ipairs(x) do
      if mg.is_tensor(t) then shape[i], dtype = t.shape, dtype or t.dtype end
    end
  end
  -- float32 weights for autocast's bfloat16; for real in a dry run (mg.memory.estimate): they are kept
  mg.memory._computing(self.build, self, shape, dtype and layer.weights_dtype(dtype))
end

-- }=============================================================

-- {===================== Layer:subclass ======================

local function snake (name)
  return (name:gsub("(%l)(%u)", "%1_%2"):gsub("(%u)(%u%l)", "%1_%2"):lower())
end

-- A table of DATA_MIN entries or more none of which could hold a variable or
-- a layer (a vocabulary, a list of numbers) is data: remembered as such and
-- not scanned again each time the layer's variables are asked for (fit asks
-- every step). A table that small or with holders is scanned every time.
local DATA_MIN = 1024
local data_tables = setmetatable({}, {__mode = "k"})
local warned = setmetatable({}, {__mode = "k"})     -- tables warned about once

local function holds (v) local t = type(v); return t == "table" or t == "userdata" end

-- the keys of t whose values may hold variables or layers, in an order that
-- does not depend on the table's hashing: the list part (ipairs'), then the
-- other numbers, the strings and the booleans, each sorted (false first), so
-- variables and checkpoint names come in one order in every process; how
-- many of them are the list part's; the keys of other types (tables,
-- userdata: no order to sort them by); and how many entries t has
local function holder_keys (t)
  local n = 0
  while rawget(t, n + 1) ~= nil do n = n + 1 end
  local list, nums, strs, odd, bools, count = {}, {}, {}, {}, {}, 0
  for k, v in next, t do
    count = count + 1
    if holds(v) then
      local kt = type(k)
      if math.type(k) == "integer" and k >= 1 and k <= n then list[#list + 1] = k
      elseif kt == "number" then nums[#nums + 1] = k
      elseif kt == "string" then strs[#strs + 1] = k
      elseif kt == "boolean" then bools[k and 2 or 1] = true
      else odd[#odd + 1] = k end
    end
  end
  table.sort(list)
  table.sort(nums)
  table.sort(strs)
  local nlist = #list
  for _, k in ipairs(nums) do list[#list + 1] = k end
  for _, k in ipairs(strs) do list[#list + 1] = k end
  if bools[1] then list[#list + 1] = false end
  if bools[2] then list[#list + 1] = true end
  return list, nlist, odd, count
end

-- the layer v is (itself, or under recompute_grad), or nil
local function layer_of (v)
  if mg.is_tensor(v) then return nil end          -- (the common case in lists: no pcall)
  local inner = unwrap(v)
  if type(inner) == "table" and classes[getmetatable(inner)] then return inner end
  return nil
end

-- what a field assigned on an instance of a subclass holds: a variable, a
-- layer (or a layer under recompute_grad), or a list of them (what it
-- holds later too: layer.refresh), or a table of them by name (a dict),
-- becomes the instance's own, as Keras tracks attributes, lists and dicts;
-- with `have` (layer.refresh's: what self owns), only what it does not own
-- yet. `by_name`: v sits under a dict's key, where a layer self already
-- owns (an alias, `{encoder = self.encoder}`) is not counted again (a
-- list's aliases are, as before dicts were tracked: checkpoint names stay)
function track_value (self, v, seen, have, by_name)
  if v == self then return end                  -- (self.me = self: nothing to own)
  if mg.is_variable(v) then
    if have then
      if have[v] then return end
      have[v] = true
    else
      for _, w in ipairs(rawget(self, "_vars")) do if w == v then return end end
    end
    local vars = rawget(self, "_vars")
    vars[#vars + 1] = v
  elseif is_list(v) then
    seen = seen or {}
    if seen[v] or data_tables[v] then return end   -- (a list that holds itself; data)
    seen[v] = true
    local keys, nlist, odd, count = holder_keys(v)
    if #keys == 0 and #odd == 0 and count >= DATA_MIN then data_tables[v] = true end
    for i, key in ipairs(keys) do track_value(self, v[key], seen, have, i > nlist) end
    for _, key in ipairs(odd) do
      local x = v[key]
      if not warned[v] and (mg.is_variable(x) or layer_of(x)) then
        warned[v] = true
        io.stderr:write(("moongrad: warning: %s: a variable or layer under a key of type %s is not tracked "
          .. "(its order would differ from run to run): use string or number keys\n"):format(
          tostring(self.name), type(key)))
      end
    end
  else
    local inner = layer_of(v)
    if inner == nil or inner == self then return end
    if have then
      if have[inner] then return end
      have[inner] = true
    elseif by_name then
      for _, l in ipairs(rawget(self, "_layers")) do if l == inner then return end end
    end
    self:track(v)
  end
end

local function track_on_assign (self, k, v)
  rawset(self, k, v)
  if k == "name" then return end
  if is_list(v) then                            -- its field, for layer.refresh
    local fields = rawget(self, "_list_fields")
    if not fields then fields = {}; rawset(self, "_list_fields", fields) end
    local known = false
    for _, f in ipairs(fields) do if f == k then known = true end end
    if not known then fields[#fields + 1] = k end
  end
  track_value(self, v)
end

-- A subclass's own build, looked up on an instance, comes wrapped: once it
-- returns the layer is built (`built` true, no build before the first call
-- any more), whether the first call or the user ran it.
local marked = setmetatable({}, {__mode = "k"})     -- a build -> its wrapper

local function with_build_marked (index)
  return function(self, k)
    local v = index(self, k)
    if k ~= "build" or v == Layer.build or type(v) ~= "function" then return v end
    local w = marked[v]
    if w == nil then
      w = function(obj, ...)
        rawset(obj, "_build_pending", nil)
        local r = table.pack(v(obj, ...))
        rawset(obj, "built", true)
        return table.unpack(r, 1, r.n)
      end
      marked[v] = w
    end
    return w
  end
end

--- Layer:subclass(name): a new layer class deriving from this one (Keras'
-- `class MyLayer(Layer)`). Define its methods (`call`, and `init(...)` if
-- the constructor takes arguments); `MyLayer(...)` makes an instance named
-- after the class (`my_layer`, `my_layer_1`, ...) and calls `self:init(...)`.
-- Variables and layers assigned to fields of the instance (in init or
-- later, in a lazy build) are its own: they are in its `variables`.
function Layer.subclass (parent, name)
  check.value("Layer:subclass", "name", name, check.string)
  if not name:match("^[%a_][%w_]*$") then
    fail("Layer:subclass", "name must be an identifier (letters, digits, _), got %s", show(name))
  end
  local cls = layer.class(name, parent)     -- with parent's __call (RecomputeLayer's, say)
  cls.__newindex = track_on_assign
  cls.__index = with_build_marked(cls.__index)
  local base = snake(name)
  function cls.__new (...)
    local obj = new_layer(cls, {}, base)
    local init = obj.init
    if init then
      init(obj, ...)
    elseif select("#", ...) > 0 then
      fail(name, "the constructor takes no arguments (define %s:init(...) to take some)", name)
    end
    if obj.build ~= Layer.build and not rawget(obj, "built") then rawset(obj, "_build_pending", true) end
    return obj
  end
  return cls
end

--- layer.abstract(cls, what): cls is a base class, made by subclass(), not
-- called; calling it says so (what: the methods a subclass defines)
function layer.abstract (cls, what)
  local name = classes[cls]
  function cls.__new ()
    fail(name, "%s is a base class: make one with mg.nn.%s:subclass(name) and define %s", name, name, what)
  end
end

layer.abstract(Layer, "call")

-- }============================================================


-- {======================= initializers ========================
-- Initial values come from the initializers' stream (seeded by
-- mg.random.seed too): building a layer lazily, maybe inside a
-- recompute_grad forward, never shifts the main stream that dropout masks
-- are drawn from and that recompute replays.


-- the checks of an initializer's arguments; returns (fan_in, fan_out) as
-- Keras computes them: a conv kernel (KH,KW,Cin,Cout) counts its receptive
-- field, fan_in = KH*KW*Cin and fan_out = KH*KW*Cout
local function fans (who, shape, dtype)
  if type(shape) ~= "table" or check.kind(shape) ~= "a table" then
    fail(who, "shape must be a list of sizes, got %s", show(shape))
  end
  local n = check.list(who, shape, "shape", "shape[%d]")
  for i = 1, n do
    check.value(who, ("shape[%d]"):format(i), shape[i], size_rule)
  end
  if dtype ~= nil and dtype ~= "float32" and dtype ~= "float64" then
    fail(who, "dtype must be 'float32' or 'float64', got %s", show(dtype))
  end
  local receptive = 1
  for i = 1, n - 2 do receptive = receptive * shape[i] end
  local fan_in, fan_out = (shape[n - 1] or shape[1]), shape[n]
  if not fan_in or fan_in + fan_out == 0 then
    fail(who, "shape must have at least 1 dimension and a nonzero fan, got %s", check.shape(shape))
  end
  return fan_in * receptive, fan_out * receptive
end

--- Glorot (Xavier) uniform: U(-l, l), l = sqrt(6 / (fan_in + fan_out)).
function layer.glorot_uniform (shape, dtype)
  local fan_in, fan_out = fans("glorot_uniform", shape, dtype)
  local limit = math.sqrt(6 / (fan_in + fan_out))
  return mg.random.with_init_stream(mg.random.uniform, shape, -limit, limit, dtype)
end

-- He uniform (for relu layers): U(-l, l), l = sqrt(6 / fan_in)
function layer.he_uniform (shape, dtype)
  local fan_in = fans("he_uniform", shape, dtype)
  local limit = fan_in > 0 and math.sqrt(6 / fan_in) or 0
  return mg.random.with_init_stream(mg.random.uniform, shape, -limit, limit, dtype)
end

-- }=============================================================


-- {======================= layer inputs ========================

--- Checks x for layer `who`: a float tensor with at least min_ndim axes and,
-- once built (like is a variable of the layer), like's dtype and last axis.
local HALF = {float16 = true, bfloat16 = true}

--- weights_dtype(dtype) -> the dtype a layer built for inputs of dtype keeps
-- its variables in: float32 for autocast's bfloat16 and float16 inputs
-- (master weights), and when none is given
function layer.weights_dtype (dtype)
  if dtype == nil or HALF[dtype] then return "float32" end
  return dtype
end

--- fits(x_dtype, w_dtype): may an input of x_dtype meet variables of w_dtype?
-- (the same dtype, or a half input of float32 weights, as under autocast)
function layer.fits (x_dtype, w_dtype)
  return x_dtype == w_dtype or (HALF[x_dtype] and w_dtype == "float32") or false
end

function layer.check_input (who, x, min_ndim, like)
  check.float_tensor(who, "input", x)
  if x.ndim < min_ndim then
    fail(who, "input must have at least %d dimension%s, got shape %s", min_ndim,
         min_ndim == 1 and "" or "s", check.shape(x.shape))
  end
  if not like then return end
  if not layer.fits(x.dtype, like.dtype) then fail(who, "input is %s, the layer was built for %s", x.dtype, like.dtype) end
  local width, want = x.shape[x.ndim], like.shape[1]
  if width ~= want then
    fail(who, "input has %d features (its last axis), the layer was built for %d", width, want)
  end
end

-- }=============================================================


-- {========================== dropout ==========================

--- dropout(x, rate): zeroes each entry with probability rate and scales the
-- rest by 1/(1-rate). The mask comes from mg.random, so recompute_grad replays it.
function layer.dropout (x, rate)
  check.float_tensor("dropout", "x", x)
  check.value("dropout", "rate", rate, check.fraction)
  if rate == 0 then return x end
  local dtype = (x.dtype == "bfloat16" or x.dtype == "float16") and "float32" or x.dtype   -- autocast's: in float32
  local keep = mg.greater_equal(mg.random.uniform(x.shape, 0, 1, dtype), rate)
  return x * (mg.cast(keep, dtype) / (1 - rate))
end

-- }=============================================================

return check.export(layer)          -- errors name the user's line (moongrad.check)

--- moongrad.losses: loss functions with Keras' names and argument order.
--   local loss = mg.losses.sparse_categorical_crossentropy(y_true, y_pred, {from_logits = true})
--   model:compile{loss = "sparse_categorical_crossentropy", ...}           -- by name
--   model:compile{loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}}
--
-- The target comes first, the prediction second, as in Keras
-- (`loss(y_true, y_pred)`); compile calls a loss function that way too.
-- Every loss takes an options table:
--   from_logits = false   y_pred holds probabilities (the crossentropies); with true,
--                         logits, and the loss goes through log_softmax / softplus,
--                         which stays finite at logits of 1e4. With false, values
--                         outside [0, 1] are an error (they are logits).
--   reduction = "mean"    "mean", "sum" or "none" (the unreduced losses: one per
--                         element for mse, mae and binary_crossentropy, one per row
--                         for categorical_crossentropy, one per label for sparse_...)
--   mask = nil            weights of the unreduced losses' shape (bool, int64 or float):
--                         0 drops an entry; "mean" divides by the mask's sum (0 when
--                         that is 0), so padded positions of a sequence do not count
--   label_smoothing = 0   (the crossentropies) mixes the target with the uniform one
--
-- Class numbers are 1-based int64, as everywhere in moongrad: sparse labels for
-- logits (B, C) are (B) (or (B,1)), for (B, T, C) logits (B, T).
--
-- softmax_cross_entropy(logits, labels) is mg.nn's loss of that name (logits first,
-- labels int64 or probabilities), here too so that losses live in one place.
-- @module moongrad.losses
local mg = require "moongrad"
local check = require "moongrad.check"
local class = require "moongrad.class"

local fail, show = check.fail, check.show

local losses = {}

local EPSILON = 1e-7          -- Keras' backend epsilon: probabilities are clipped to [eps, 1 - eps]

-- {========================== options ==========================

local reduction_rule = check.rule("'mean', 'sum' or 'none'", function(v)
  return v == "mean" or v == "sum" or v == "none"
end)
local mask_rule = check.rule("a tensor of weights (bool, int64 or float)", function(v)
  return v == nil or check.is_array(v)
end)
local smoothing_rule = check.rule("a number in [0, 1]", check.unit.test)

local BASE = {{"reduction", reduction_rule, "mean"}, {"mask", mask_rule}}
local PROBS = {{"from_logits", check.boolean, false}, {"reduction", reduction_rule, "mean"}, {"mask", mask_rule},
               {"label_smoothing", smoothing_rule, 0}}

-- }=============================================================


-- {=========================== checks ==========================

-- y_pred, in float32 when it came from autocast's bfloat16 (losses compute in float32)
local HALF = {float16 = true, bfloat16 = true}
local function check_pred (who, y_pred, what)
  check.float_tensor(who, what or "y_pred", y_pred)
  if HALF[y_pred.dtype] then return mg.cast(y_pred, "float32") end
  return y_pred
end

-- y_true of y_pred's shape and float dtype (int64 and bool are cast when ints_ok)
local function same_shape (who, y_true, y_pred, ints_ok)
  if not check.is_array(y_true) then fail(who, "y_true must be a tensor, got %s", show(y_true)) end
  if HALF[y_true.dtype] and y_pred.dtype == "float32" then y_true = mg.cast(y_true, "float32") end   -- as y_pred's
  local dt = y_true.dtype
  if dt ~= y_pred.dtype then
    if ints_ok and (dt == "int64" or dt == "bool") then
      y_true = mg.cast(y_true, y_pred.dtype)
    elseif dt == "float32" or dt == "float64" or HALF[dt] then
      fail(who, "y_true is %s but y_pred is %s; cast one", dt, y_pred.dtype)
    else
      fail(who, "y_true must be a float tensor%s, got %s", ints_ok and " (or 0/1 in int64 or bool)" or "", dt)
    end
  end
  if not check.same_shape(y_true.shape, y_pred.shape) then
    fail(who, "y_true has shape %s but y_pred has shape %s; they must match exactly", check.shape(y_true.shape),
         check.shape(y_pred.shape))
  end
  return y_true
end

-- probabilities must lie in [0, 1]: values outside are logits given without
-- from_logits. A NaN is neither (min and max are NaN then): it passes, and
-- the loss is NaN, as from logits (fit warns and goes on)
local function check_probabilities (who, y_pred)
  if y_pred:numel() == 0 then return end
  local lo, hi = mg.min(y_pred):item(), mg.max(y_pred):item()
  if lo < 0 or hi > 1 then
    fail(who, "y_pred has values outside [0, 1] (min %.4g, max %.4g), so it is not probabilities; "
         .. "for logits pass {from_logits = true}", lo, hi)
  end
end

-- the one-entry-per-position weights of shape `shape`, in dtype
local function check_mask (who, mask, shape, dtype)
  if mask == nil then return nil end
  if not check.same_shape(mask.shape, shape) then
    fail(who, "mask has shape %s but the unreduced loss has shape %s", check.shape(mask.shape), check.shape(shape))
  end
  if mask.dtype ~= dtype then mask = mg.cast(mask, dtype) end
  return mask
end

-- reduces the unreduced losses l (weighted by mask)
local function reduce (l, mask, reduction)
  if mask then l = l * mask end
  if reduction == "none" then return l end
  if reduction == "sum" then return mg.sum(l) end
  if not mask then return mg.mean(l) end
  local total = mg.sum(mask)
  return mg.sum(l) / mg.where(mg.equal(total, 0), 1, total)         -- 0 (not NaN) when all is masked
end

local function without_last (shape) return table.move(shape, 1, #shape - 1, 1, {}) end

--- Checks int64 class numbers for logits of shape `shape` and returns them
-- (a trailing axis of 1 squeezed when `squeeze`). names = {labels =, logits =}
-- words the messages (mg.nn's "labels"/"the logits'" or Keras' "y_true"/"y_pred's").
local function class_numbers (who, labels, shape, names, squeeze, mask)
  local want, got = without_last(shape), labels.shape
  if squeeze and #got == #shape and got[#got] == 1 and check.same_shape(without_last(got), want) then
    labels, got = mg.squeeze(labels, -1), want
  end
  if not check.same_shape(got, want) then
    local hint = #got == #shape and got[#got] == 1 and check.same_shape(without_last(got), want)
    fail(who, "%s must have shape %s (%s shape %s without its last axis), got %s%s", names.labels,
         check.shape(want), names.logits, check.shape(shape), check.shape(got), hint and "; squeeze the last axis" or "")
  end
  local checked = labels
  if mask then checked = mg.where(mg.not_equal(mask, 0), labels, 1) end     -- masked labels may be anything
  if checked:numel() > 0 then
    local count = shape[#shape]
    local lo, hi = mg.min(checked):item(), mg.max(checked):item()
    if lo < 1 or hi > count then
      fail(who, "%s must be class numbers in 1..%d (1-based), got %d%s", names.labels, count, lo < 1 and lo or hi,
           (lo == 0 and hi < count) and "; add 1 to 0-based labels" or "")
    end
  end
  return checked
end

-- log-probabilities along the last axis, from logits or from probabilities
local function log_probs (who, y_pred, from_logits)
  if from_logits then return mg.log_softmax(y_pred, -1) end
  check_probabilities(who, y_pred)
  local p = y_pred / mg.sum(y_pred, -1, true)
  return mg.log(mg.clamp(p, EPSILON, 1 - EPSILON))
end

-- }=============================================================


-- {=========================== losses ==========================

--- mean_squared_error(y_true, y_pred [, {reduction=, mask=}]): mean((y_pred - y_true)^2).
-- y_true and y_pred of one shape and dtype (no broadcasting: a (3) and a (3,1) would give (3,3)).
function losses.mean_squared_error (y_true, y_pred, opts)
  local who = "mean_squared_error"
  y_pred = check_pred(who, y_pred)
  y_true = same_shape(who, y_true, y_pred)
  opts = check.options(who, opts, BASE)
  local l = (y_pred - y_true) ^ 2
  return reduce(l, check_mask(who, opts.mask, l.shape, l.dtype), opts.reduction)
end

--- mean_absolute_error(y_true, y_pred [, {reduction=, mask=}]): mean(|y_pred - y_true|).
function losses.mean_absolute_error (y_true, y_pred, opts)
  local who = "mean_absolute_error"
  y_pred = check_pred(who, y_pred)
  y_true = same_shape(who, y_true, y_pred)
  opts = check.options(who, opts, BASE)
  local l = mg.abs(y_pred - y_true)
  return reduce(l, check_mask(who, opts.mask, l.shape, l.dtype), opts.reduction)
end

--- binary_crossentropy(y_true, y_pred [, {from_logits=false, label_smoothing=0, reduction=, mask=}]):
-- -(y log p + (1 - y) log(1 - p)) per element. y_true: y_pred's shape, float
-- (soft targets allowed), or 0/1 as int64 or bool. From logits x it is
-- softplus(x) - x y, exact and finite for any x.
function losses.binary_crossentropy (y_true, y_pred, opts)
  local who = "binary_crossentropy"
  y_pred = check_pred(who, y_pred)
  y_true = same_shape(who, y_true, y_pred, true)
  opts = check.options(who, opts, PROBS)
  local eps = opts.label_smoothing
  if eps > 0 then y_true = y_true * (1 - eps) + 0.5 * eps end
  local l
  if opts.from_logits then
    l = mg.softplus(y_pred) - y_pred * y_true
  else
    check_probabilities(who, y_pred)
    local p = mg.clamp(y_pred, EPSILON, 1 - EPSILON)
    l = -(y_true * mg.log(p) + (1 - y_true) * mg.log(1 - p))
  end
  return reduce(l, check_mask(who, opts.mask, l.shape, l.dtype), opts.reduction)
end

--- categorical_crossentropy(y_true, y_pred [, {from_logits=false, label_smoothing=0, reduction=, mask=}]):
-- -sum(y_true * log p) over the last axis. y_true: one-hot or soft targets of
-- y_pred's shape and dtype (int64 class numbers go to sparse_categorical_crossentropy).
function losses.categorical_crossentropy (y_true, y_pred, opts)
  local who = "categorical_crossentropy"
  y_pred = check_pred(who, y_pred)
  if y_pred.ndim == 0 then fail(who, "y_pred must have a class axis (at least 1 dimension), got shape ()") end
  if check.is_array(y_true) and y_true.dtype == "int64" then
    fail(who, "y_true is int64; class numbers go to sparse_categorical_crossentropy, one-hot targets here")
  end
  y_true = same_shape(who, y_true, y_pred)
  opts = check.options(who, opts, PROBS)
  local eps = opts.label_smoothing
  if eps > 0 then y_true = y_true * (1 - eps) + eps / y_pred.shape[y_pred.ndim] end
  local l = -mg.sum(y_true * log_probs(who, y_pred, opts.from_logits), -1)
  return reduce(l, check_mask(who, opts.mask, l.shape, l.dtype), opts.reduction)
end

local KERAS_NAMES = {labels = "y_true", logits = "y_pred's"}

--- sparse_categorical_crossentropy(y_true, y_pred [, {from_logits=false, label_smoothing=0, reduction=, mask=}]):
-- -log p[y_true] over the last axis of y_pred. y_true: int64 class numbers 1..C
-- of y_pred's shape without its last axis ((B) for (B, C), (B, T) for (B, T, C);
-- a trailing axis of 1 is squeezed). Under a mask, labels where the mask is 0
-- may hold anything (a padding id).
function losses.sparse_categorical_crossentropy (y_true, y_pred, opts)
  local who = "sparse_categorical_crossentropy"
  y_pred = check_pred(who, y_pred)
  local shape = y_pred.shape
  if #shape == 0 then fail(who, "y_pred must have a class axis (at least 1 dimension), got shape ()") end
  if not check.is_array(y_true) or y_true.dtype ~= "int64" then
    fail(who, "y_true must be int64 class numbers (1-based), got %s%s", check.is_array(y_true) and y_true.dtype
         or show(y_true), check.is_array(y_true) and y_true.dtype:find("^float") and
         check.same_shape(y_true.shape, shape) and "; one-hot targets go to categorical_crossentropy" or "")
  end
  opts = check.options(who, opts, PROBS)
  local mask_shape = without_last(shape)
  local mask = check_mask(who, opts.mask, mask_shape, y_pred.dtype)
  local labels = class_numbers(who, y_true, shape, KERAS_NAMES, true, mask)
  local logp = log_probs(who, y_pred, opts.from_logits)
  local l = -mg.squeeze(mg.take_along_axis(logp, mg.expand_dims(labels, -1), -1), -1)
  local eps = opts.label_smoothing
  if eps > 0 then l = l * (1 - eps) - mg.mean(logp, -1) * eps end
  return reduce(l, mask, opts.reduction)
end

local NN_NAMES = {labels = "labels", logits = "the logits'"}

--- softmax_cross_entropy(logits, labels): mg.nn's loss (logits first): the mean
-- over the batch of -sum(p * log_softmax(logits)) over the last axis; labels
-- int64 class numbers (1-based) shaped like the logits without their last
-- axis, or probabilities p of the logits' shape and dtype.
function losses.softmax_cross_entropy (logits, labels)
  local who = "softmax_cross_entropy"
  logits = check_pred(who, logits, "logits")
  local shape = logits.shape
  if #shape == 0 then fail(who, "logits must have a class axis (at least 1 dimension), got shape ()") end
  if not check.is_array(labels) then
    fail(who, "labels must be a tensor of int64 class numbers or of probabilities, got %s", show(labels))
  end
  local logp = mg.log_softmax(logits, -1)
  if HALF[labels.dtype] and logits.dtype == "float32" then labels = mg.cast(labels, "float32") end   -- as logits'
  if labels.dtype == "int64" then
    labels = class_numbers(who, labels, shape, NN_NAMES, false)
    return -mg.mean(mg.take_along_axis(logp, mg.expand_dims(labels, -1), -1))
  elseif labels.dtype ~= logits.dtype then
    fail(who, "labels must be int64 class numbers or %s probabilities (the logits' dtype), got %s",
         logits.dtype, labels.dtype)
  elseif not check.same_shape(labels.shape, shape) then
    fail(who, "%s labels are probabilities and must have the logits' shape %s, got %s "
         .. "(class numbers must be int64)", labels.dtype, check.shape(shape), check.shape(labels.shape))
  end
  return -mg.mean(mg.sum(labels * logp, -1))
end

-- }=============================================================


-- {================= loss objects, names, get ==================

local classes = {
  {"MeanSquaredError", "mean_squared_error", BASE},
  {"MeanAbsoluteError", "mean_absolute_error", BASE},
  {"BinaryCrossentropy", "binary_crossentropy", PROBS},
  {"CategoricalCrossentropy", "categorical_crossentropy", PROBS},
  {"SparseCategoricalCrossentropy", "sparse_categorical_crossentropy", PROBS},
}

--- Keras' loss classes: mg.losses.SparseCategoricalCrossentropy{from_logits = true}
-- is a callable object: loss(y_true, y_pred [, mask]) with those options.
-- obj.name is the function's name ("sparse_categorical_crossentropy"), obj.from_logits its setting.
for _, c in ipairs(classes) do
  local class_name, fn_name, spec = c[1], c[2], c[3]
  local fn = losses[fn_name]
  local cls = class("moongrad.losses." .. class_name)
  cls.__call = function(self, y_true, y_pred, mask)
    local o = {reduction = self.reduction, mask = mask}
    if spec == PROBS then o.from_logits, o.label_smoothing = self.from_logits, self.label_smoothing end
    return fn(y_true, y_pred, o)
  end
  cls.__tostring = function(self) return ("moongrad.losses.%s(from_logits=%s)"):format(class_name,
                                                                                         tostring(self.from_logits)) end
  local object_spec = {}
  for _, o in ipairs(spec) do if o[1] ~= "mask" then object_spec[#object_spec + 1] = o end end
  object_spec[#object_spec + 1] = {"name", check.string}
  function cls.__new (opts)
    opts = check.options(class_name, opts, object_spec)
    return setmetatable({name = opts.name or fn_name, reduction = opts.reduction, from_logits = opts.from_logits or false,
                         label_smoothing = opts.label_smoothing or 0, fn = fn}, cls)
  end
  losses[class_name] = cls
end

local aliases = {mse = "mean_squared_error", mae = "mean_absolute_error", bce = "binary_crossentropy"}
local names = {"mean_squared_error", "mean_absolute_error", "binary_crossentropy", "categorical_crossentropy",
               "sparse_categorical_crossentropy", "mse", "mae"}

--- get(spec): the loss function, its name and whether it takes logits, for
-- compile: a name ("mse", "sparse_categorical_crossentropy", ...), a loss
-- object, or any function(y_true, y_pred) returning a scalar tensor.
function losses.get (spec, who)
  who = who or "losses.get"
  if type(spec) == "string" then
    local name = aliases[spec] or spec
    local fn = rawget(losses, name)
    if type(fn) ~= "function" or name == "get" or name == "softmax_cross_entropy" then
      check.unknown(who, "loss", spec, names)
    end
    return fn, name, false
  end
  local mt = getmetatable(spec)
  if type(mt) == "table" and type(rawget(mt, "__name")) == "string" and mt.__name:find("^moongrad%.losses%.") then
    return spec, spec.name, spec.from_logits
  end
  check.value(who, "loss", spec, check.rule("a loss name or a function(y_true, y_pred)", check.is_callable))
  return spec, "loss", false
end

-- }=============================================================

--- (internal) the sparse metrics check their labels as the losses do
function losses._class_numbers (who, y_true, shape)
  return class_numbers(who, y_true, shape, KERAS_NAMES, true)
end

return check.export(losses)          -- errors name the user's line (moongrad.check)

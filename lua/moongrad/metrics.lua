--- moongrad.metrics: metrics with Keras' names and argument order (y_true, y_pred).
-- Each returns a scalar float64 tensor: the mean over the batch.
--   mg.metrics.sparse_categorical_accuracy(labels, logits)   -- labels int64 1..C
--   model:compile{..., metrics = {"accuracy"}}               -- by name
-- compile resolves "accuracy" (or "acc") by the loss, as Keras does: binary,
-- categorical or sparse categorical accuracy; with a from_logits binary loss
-- the threshold is 0 (a logit of 0 is a probability of 1/2).
-- @module moongrad.metrics
local mg = require "moongrad"
local check = require "moongrad.check"

local fail, show = check.fail, check.show

local metrics = {}

local function pred (who, y_pred)
  check.float_tensor(who, "y_pred", y_pred)
  if y_pred.ndim == 0 then fail(who, "y_pred must have at least 1 dimension, got shape ()") end
  return y_pred
end

local function tensor (who, what, v)
  if not check.is_array(v) then fail(who, "%s must be a tensor, got %s", what, show(v)) end
  return v
end

local function mismatch (who, y_true, y_pred, want)
  fail(who, "y_true has shape %s; for y_pred of shape %s it must be %s", check.shape(y_true.shape),
       check.shape(y_pred.shape), want)
end

local function without_last (shape) return table.move(shape, 1, #shape - 1, 1, {}) end

--- sparse_categorical_accuracy(y_true, y_pred): mean(argmax(y_pred, -1) == y_true);
-- y_true int64 class numbers (1-based) of y_pred's shape without its last axis
-- (a trailing axis of 1 is squeezed).
function metrics.sparse_categorical_accuracy (y_true, y_pred)
  local who = "sparse_categorical_accuracy"
  pred(who, y_pred)
  tensor(who, "y_true", y_true)
  if y_true.dtype ~= "int64" then fail(who, "y_true must be int64 class numbers (1-based), got %s", y_true.dtype) end
  y_true = require("moongrad.losses")._class_numbers(who, y_true, y_pred.shape)   -- as the loss checks them
  return mg.mean(mg.equal(mg.argmax(y_pred, -1), y_true))
end

--- categorical_accuracy(y_true, y_pred): mean(argmax(y_pred) == argmax(y_true)),
-- y_true one-hot (or soft) of y_pred's shape.
function metrics.categorical_accuracy (y_true, y_pred)
  local who = "categorical_accuracy"
  pred(who, y_pred)
  tensor(who, "y_true", y_true)
  if not check.same_shape(y_true.shape, y_pred.shape) then mismatch(who, y_true, y_pred, "the same shape") end
  return mg.mean(mg.equal(mg.argmax(y_pred, -1), mg.argmax(y_true, -1)))
end

local BINARY = {{"threshold", check.rule("a finite number", function(v)
  return type(v) == "number" and v > -math.huge and v < math.huge end), 0.5}}

--- binary_accuracy(y_true, y_pred [, {threshold=0.5}]): mean((y_pred > threshold) == (y_true > 0.5)),
-- y_true of y_pred's shape (float, int64 0/1 or bool).
function metrics.binary_accuracy (y_true, y_pred, opts)
  local who = "binary_accuracy"
  pred(who, y_pred)
  tensor(who, "y_true", y_true)
  opts = check.options(who, opts, BINARY)
  if not check.same_shape(y_true.shape, y_pred.shape) then mismatch(who, y_true, y_pred, "the same shape") end
  local dt = y_true.dtype
  local truth = dt == "bool" and y_true or mg.greater(y_true, dt == "int64" and 0 or 0.5)
  return mg.mean(mg.equal(mg.greater(y_pred, opts.threshold), truth))
end

--- accuracy(y_true, y_pred): picks the kind from the shapes and dtypes:
-- int64 labels without y_pred's last axis: sparse categorical; the same shape
-- with a last axis of 1 (or no axis): binary; the same shape otherwise: categorical.
function metrics.accuracy (y_true, y_pred)
  local who = "accuracy"
  pred(who, y_pred)
  tensor(who, "y_true", y_true)
  if check.same_shape(y_true.shape, y_pred.shape) then
    local last = y_pred.shape[y_pred.ndim]
    if last == 1 or y_true.dtype == "bool" then return metrics.binary_accuracy(y_true, y_pred) end
    return metrics.categorical_accuracy(y_true, y_pred)
  end
  if y_true.dtype == "int64" then return metrics.sparse_categorical_accuracy(y_true, y_pred) end
  mismatch(who, y_true, y_pred, "int64 class numbers shaped " .. check.shape(without_last(y_pred.shape))
           .. " or targets shaped like y_pred")
end

--- mean_squared_error and mean_absolute_error as metrics.
function metrics.mean_squared_error (y_true, y_pred)
  return mg.cast(require("moongrad.losses").mean_squared_error(y_true, y_pred), "float64")
end

function metrics.mean_absolute_error (y_true, y_pred)
  return mg.cast(require("moongrad.losses").mean_absolute_error(y_true, y_pred), "float64")
end

local PERPLEXITY = {{"from_logits", check.boolean, false}, {"mask", check.rule("a tensor of weights or nil",
  function(v) return v == nil or check.is_array(v) end)}}

--- perplexity(y_true, y_pred [, {from_logits=false, mask=}]): exp of the mean
-- sparse crossentropy (keras_nlp's Perplexity); y_true int64 class numbers of
-- y_pred's shape without its last axis, (B, T) for (B, T, V); mask (B, T) weights
-- the positions (0: padding). Under fit the epoch's figure is the mean of the
-- batches' perplexities, at least exp(loss); exp of the loss is the exact one.
function metrics.perplexity (y_true, y_pred, opts)
  local who = "perplexity"
  pred(who, y_pred)
  opts = check.options(who, opts, PERPLEXITY)
  local l = require("moongrad.losses").sparse_categorical_crossentropy(y_true, y_pred, opts)
  return mg.exp(mg.cast(l, "float64"))
end

local aliases = {acc = "accuracy", mse = "mean_squared_error", mae = "mean_absolute_error"}
local names = {"accuracy", "binary_accuracy", "categorical_accuracy", "sparse_categorical_accuracy",
               "mean_squared_error", "mean_absolute_error", "perplexity", "acc", "mse", "mae"}

local by_loss = {binary_crossentropy = "binary_accuracy", categorical_crossentropy = "categorical_accuracy",
                 sparse_categorical_crossentropy = "sparse_categorical_accuracy"}

--- get(spec [, loss_name, from_logits]): the metric function for compile: a
-- name or a function(y_true, y_pred) returning a number or a scalar tensor.
-- "accuracy" resolves by the loss as Keras does.
function metrics.get (spec, loss_name, from_logits, who)
  who = who or "metrics.get"
  if type(spec) == "string" then
    local name = aliases[spec] or spec
    if name == "accuracy" and by_loss[loss_name] then
      local kind = by_loss[loss_name]
      if kind == "binary_accuracy" and from_logits then
        return function(y_true, y_pred) return metrics.binary_accuracy(y_true, y_pred, {threshold = 0}) end
      end
      return metrics[kind]
    end
    if name == "perplexity" then           -- from logits when the loss is
      return function(y_true, y_pred) return metrics.perplexity(y_true, y_pred, {from_logits = from_logits}) end
    end
    local fn = rawget(metrics, name)
    if type(fn) ~= "function" or name == "get" then check.unknown(who, "metric", spec, names) end
    return fn
  end
  return check.value(who, "metric", spec, check.rule("a metric name or a function(y_true, y_pred)", check.is_callable))
end

return check.export(metrics)          -- errors name the user's line (moongrad.check)

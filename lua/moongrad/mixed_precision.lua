-- mixed_precision.lua — Keras' dtype policies on mg.autocast: "mixed_bfloat16"
-- runs a model's products in bfloat16 with float32 variables (master weights)
-- in fit, evaluate and predict; "float32" runs everything in float32.
--
--   mg.mixed_precision.set_global_policy("mixed_bfloat16")   -- every model
--   model.dtype_policy = "mixed_bfloat16"                    -- one model
--   model:fit(x, y, {mixed_precision = "bfloat16"})          -- one fit
--
-- Direct calls, model(x), run as written: wrap them in mg.autocast.

local mg = require "moongrad"
local check = require "moongrad.check"

local mixed_precision = {}

-- policy name -> the dtype autocast runs products in (false: off)
local POLICIES = {mixed_bfloat16 = "bfloat16", mixed_float16 = "float16", float32 = false}

local global = "float32"

local function check_policy (who, name)
  if POLICIES[name] == nil then
    check.fail(who, "unknown policy %s (mixed_bfloat16, mixed_float16 or float32)",
               type(name) == "string" and ("'" .. name .. "'") or ("of type " .. type(name)))
  end
  return name
end

--- set_global_policy(name): the policy of every model that sets none
-- ("mixed_bfloat16", "mixed_float16", "float32"); returns the previous one.
-- mixed_float16 is refused on a CPU without AVX512-FP16 (see emulate_float16);
-- fit under it scales the loss (a LossScaleOptimizer around the optimizer).
function mixed_precision.set_global_policy (name)
  check_policy("set_global_policy", name)
  if POLICIES[name] == "float16" then mg.autocast("float16", function() end) end   -- the refusal, with its reason
  local was = global
  global = name
  return was
end

--- emulate_float16(on) -> the previous setting: allow float16 autocast on a
-- CPU without AVX512-FP16. Its products run widened to float32 and round
-- to float16 on every CPU (this oneDNN has no float16 kernels): float16's
-- numerics (to reproduce a GPU run's overflow, or test a loss scale), not
-- its speed, and the tape keeps float32 copies.
function mixed_precision.emulate_float16 (on)
  check.value("emulate_float16", "on", on, check.boolean)
  return mg._autocast_emulate_float16(on)
end

mixed_precision.LossScaleOptimizer = require("moongrad.optim").LossScaleOptimizer

--- global_policy() -> the policy name models use by default
function mixed_precision.global_policy () return global end

--- autocast_dtype(model, asked) -> the dtype a fit/evaluate/predict of model
-- runs products in, or false: asked (fit's mixed_precision: a dtype name or
-- false) first, then model.dtype_policy, then the global policy
function mixed_precision.autocast_dtype (model, asked)
  if asked ~= nil then return asked end
  local own = type(model) == "table" and rawget(model, "dtype_policy") or nil
  if own ~= nil then return POLICIES[check_policy("dtype_policy", own)] end
  return POLICIES[global]
end

--- run(dtype, fn, ...) -> fn(...) under mg.autocast(dtype), or as it is when dtype is false
function mixed_precision.run (dtype, fn, ...)
  if not dtype then return fn(...) end
  return mg.autocast(dtype, fn, ...)
end

return check.export(mixed_precision)          -- errors name the user's line (moongrad.check)

--- moongrad.schedules: learning-rate schedules (Keras' keras.optimizers.schedules),
-- also reachable as mg.optim.schedules. A schedule is a callable object:
-- schedule(step) is the learning rate for step `step`, the number of
-- optimizer steps already taken (0 for the first update, as Keras counts).
-- Give one as an optimizer's learning_rate; plain functions(step) work too.
--   local lr = mg.schedules.LinearWarmup{warmup_steps = 100,
--     after = mg.schedules.CosineDecay{initial_learning_rate = 1e-3, decay_steps = 900}}
--   local opt = mg.optim.AdamW{learning_rate = lr}
-- LinearWarmup composes: the schedule it hands over to starts counting at 0
-- when the warmup ends.
-- @module moongrad.schedules
local check = require "moongrad.check"
local class = require "moongrad.class"

local fail = check.fail

local schedules = {}

local function schedule_class (name)
  local cls = class("moongrad.schedules." .. name)
  cls.__call = function(self, step) return self:value(step) end
  cls.__tostring = function(self)
    local parts = {}
    for _, k in ipairs(self._fields) do parts[#parts + 1] = ("%s=%s"):format(k, tostring(self[k])) end
    return ("moongrad.schedules.%s{%s}"):format(name, table.concat(parts, ", "))
  end
  schedules[name] = cls
  return cls
end

local step_rule = check.rule("a number >= 0", function(v) return type(v) == "number" and v >= 0 end)

local function check_step (who, step) check.value(who, "step", step, step_rule) end

local function new (cls, who, opts, spec)
  local o = check.options(who, opts, spec)
  for _, s in ipairs(spec) do
    if s.required and o[s[1]] == nil then fail(who, "option '%s' is required", s[1]) end
  end
  o._fields = {}
  for i, s in ipairs(spec) do o._fields[i] = s[1] end
  return setmetatable(o, cls)
end

local schedule_rule = check.rule("a positive number or a schedule", function(v)
  return (type(v) == "number" and v > 0 and v < math.huge) or check.is_callable(v)
end)

--- ExponentialDecay{initial_learning_rate=, decay_steps=, decay_rate=, staircase=false}:
-- initial_learning_rate * decay_rate ^ (step / decay_steps), the exponent floored when staircase.
local ExponentialDecay = schedule_class("ExponentialDecay")
local EXP = {{"initial_learning_rate", check.positive, required = true},
             {"decay_steps", check.positive, required = true},
             {"decay_rate", check.positive, required = true}, {"staircase", check.boolean, false}}

function ExponentialDecay.__new (opts)
  return new(ExponentialDecay, "ExponentialDecay", opts, EXP)
end

function ExponentialDecay:value (step)
  check_step("ExponentialDecay", step)
  local p = step / self.decay_steps
  if self.staircase then p = math.floor(p) end
  return self.initial_learning_rate * self.decay_rate ^ p
end

--- CosineDecay{initial_learning_rate=, decay_steps=, alpha=0, warmup_steps=0, warmup_target=nil}:
-- Keras' (3) schedule. Without warmup: the rate falls along half a cosine from
-- initial_learning_rate to alpha * initial_learning_rate over decay_steps, then
-- stays. With warmup_target, it first rises linearly from initial_learning_rate
-- to warmup_target over warmup_steps, then decays from warmup_target.
local CosineDecay = schedule_class("CosineDecay")
local COS = {{"initial_learning_rate", check.nonnegative, required = true},
             {"decay_steps", check.positive, required = true},
             {"alpha", check.unit, 0}, {"warmup_steps", check.nonnegative, 0}, {"warmup_target", check.positive}}

function CosineDecay.__new (opts)
  local self = new(CosineDecay, "CosineDecay", opts, COS)
  if self.warmup_steps > 0 and self.warmup_target == nil then
    fail("CosineDecay", "warmup_steps needs warmup_target (the rate the warmup reaches)")
  end
  return self
end

function CosineDecay:value (step)
  check_step("CosineDecay", step)
  local peak, w = self.initial_learning_rate, self.warmup_steps
  if self.warmup_target then
    if step < w then return peak + (self.warmup_target - peak) * step / w end
    peak, step = self.warmup_target, step - w
  end
  local t = math.min(step, self.decay_steps) / self.decay_steps
  return peak * ((1 - self.alpha) * 0.5 * (1 + math.cos(math.pi * t)) + self.alpha)
end

--- LinearWarmup{warmup_steps=, after=, initial_learning_rate=0}: rises linearly
-- from initial_learning_rate to after's first rate over warmup_steps, then is
-- after(step - warmup_steps). after: a number (constant) or a schedule.
local LinearWarmup = schedule_class("LinearWarmup")
local WARM = {{"warmup_steps", check.positive_integer, required = true},
              {"after", schedule_rule, required = true}, {"initial_learning_rate", check.nonnegative, 0}}

function LinearWarmup.__new (opts)
  return new(LinearWarmup, "LinearWarmup", opts, WARM)
end

local function at (s, step) if type(s) == "number" then return s end return s(step) end

function LinearWarmup:value (step)
  check_step("LinearWarmup", step)
  local w = self.warmup_steps
  if step >= w then return at(self.after, step - w) end
  local a = self.initial_learning_rate
  return a + (at(self.after, 0) - a) * step / w
end

--- PiecewiseConstantDecay{boundaries=, values=}: values[i] for the first i with
-- step <= boundaries[i], values[#boundaries + 1] past the last (Keras' rule: a
-- step equal to a boundary still takes the earlier value).
local PiecewiseConstantDecay = schedule_class("PiecewiseConstantDecay")
local list_rule = check.rule("a list of numbers", function(v)
  if type(v) ~= "table" or getmetatable(v) ~= nil then return false end
  for i = 1, #v do if type(v[i]) ~= "number" then return false end end
  return true
end)
local PIECE = {{"boundaries", list_rule, required = true}, {"values", list_rule, required = true}}

function PiecewiseConstantDecay.__new (opts)
  local who = "PiecewiseConstantDecay"
  local self = new(PiecewiseConstantDecay, who, opts, PIECE)
  local b, v = self.boundaries, self.values
  check.list(who, b, "boundaries", "boundaries[%d]")
  check.list(who, v, "values", "values[%d]")
  if #v ~= #b + 1 then fail(who, "values needs one entry more than boundaries (%d), got %d", #b, #v) end
  for i = 2, #b do
    if not (b[i] > b[i - 1]) then fail(who, "boundaries must increase, got %s after %s", b[i], b[i - 1]) end
  end
  for i = 1, #v do
    if not (v[i] >= 0 and v[i] < math.huge) then fail(who, "values[%d] must be a finite number >= 0, got %s", i,
                                                       check.show(v[i])) end
  end
  self.boundaries, self.values = table.move(b, 1, #b, 1, {}), table.move(v, 1, #v, 1, {})
  return self
end

function PiecewiseConstantDecay:value (step)
  check_step("PiecewiseConstantDecay", step)
  for i, b in ipairs(self.boundaries) do
    if step <= b then return self.values[i] end
  end
  return self.values[#self.values]
end

return check.export(schedules)          -- errors name the user's line (moongrad.check)

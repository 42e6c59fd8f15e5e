--- moongrad.optim: optimizers that update variables from their gradients.
--   local opt = mg.optim.Adam{learning_rate = 1e-3}
--   opt:apply_gradients(grads, vars)        -- grads[i] is the gradient of vars[i]
--   opt:apply_gradients({{g1, v1}, {g2, v2}})   -- Keras' list of pairs, the same
-- A nil gradient (an unconnected variable) is skipped: grads may have holes.
-- Every pair is checked before any variable or slot moves, so a bad call
-- leaves the optimizer and the variables as they were. Updates run outside
-- any tape's view: they are not recorded.
-- @module moongrad.optim
local mg = require "moongrad"
local check = require "moongrad.check"

local fail, show = check.fail, check.show

local optim = {}

-- {================== checking apply_gradients ==================

-- grads and vars from Keras' list of {gradient, variable} pairs
local function split_pairs (who, list)
  local grads, vars = {}, {}
  for i = 1, check.list(who, list, "the list of pairs", "pair %d") do
    local p = list[i]
    if type(p) ~= "table" or check.kind(p) ~= "a table" or p[2] == nil then
      fail(who, "pair %d must be {gradient, variable}, got %s", i, show(p))
    end
    grads[i], vars[i] = p[1], p[2]
  end
  grads.n = #vars
  return grads, vars
end

local function is_pair_list (t)
  return type(t) == "table" and type(t[1]) == "table" and check.kind(t[1]) == "a table"
end

-- the number of gradients grads holds for n variables: keys 1..n (holes are
-- nil gradients), or table.pack's count n
local function check_grads (who, grads, n)
  if type(grads) ~= "table" or check.kind(grads) ~= "a table" then
    fail(who, "gradients must be a list, got %s", show(grads))
  end
  local count = math.type(grads.n) == "integer" and grads.n
  if count and count ~= n then fail(who, "%d gradients for %d variables", count, n) end
  local top = 0
  for k in pairs(grads) do
    if not (count and k == "n") then
      if math.type(k) ~= "integer" or k < 1 then
        fail(who, "the list of gradients has a key %s; entries go at positions 1, 2, ...", show(k))
      end
      top = math.max(top, k)
    end
  end
  if top > n then fail(who, "%d gradients for %d variables", top, n) end
end

-- gradient i for variable v, checked: nil, or a tensor of v's shape and dtype
local function check_pair (who, g, v, i)
  if not mg.is_variable(v) then fail(who, "variables[%d] is %s, not a Variable", i, check.kind(v)) end
  if g == nil then return nil end
  if not check.is_array(g) then fail(who, "gradients[%d] is %s, not a tensor", i, check.kind(g)) end
  if v.dtype ~= "float32" and v.dtype ~= "float64" then
    fail(who, "variables[%d] is %s; only float variables can be trained", i, v.dtype)
  end
  if g.dtype ~= v.dtype then fail(who, "gradients[%d] is %s but variables[%d] is %s", i, g.dtype, i, v.dtype) end
  if not check.same_shape(g.shape, v.shape) then
    fail(who, "gradients[%d] has shape %s but variables[%d] has shape %s", i, check.shape(g.shape), i,
         check.shape(v.shape))
  end
  return mg.is_variable(g) and g:value() or g
end

--- The checked (grads, vars, n) of apply_gradients(grads, vars), or of
-- apply_gradients(pairs); raises naming the optimizer before anything moves.
local function updates (who, grads, vars)
  if vars == nil and is_pair_list(grads) then grads, vars = split_pairs(who, grads) end
  if type(vars) ~= "table" or check.kind(vars) ~= "a table" then
    fail(who, "apply_gradients(grads, variables) takes two lists (or one list of {gradient, variable} "
         .. "pairs), got variables = %s", show(vars))
  end
  local n = check.list(who, vars, "the list of variables", "variables[%d]")
  check_grads(who, grads, n)
  local checked = {}
  for i = 1, n do checked[i] = check_pair(who, grads[i], vars[i], i) end
  return checked, vars, n
end

-- }=============================================================


-- {============================ SGD ============================

--- SGD{learning_rate=0.01, momentum=0, nesterov=false, name=}; SGD(0.1) is
-- SGD{learning_rate = 0.1}, as Keras' first positional argument.
local SGD = {__name = "moongrad.optim.SGD"}
SGD.__index = SGD
optim.SGD = SGD

local SGD_OPTIONS = {{"learning_rate", check.positive, 0.01}, {"momentum", check.fraction, 0},
                     {"nesterov", check.boolean, false}, {"name", check.string}}

-- opts, with a number first argument taken as the learning rate
local function options (who, spec, lr, opts)
  if type(lr) ~= "number" then return check.options(who, lr, spec) end
  check.value(who, "learning_rate", lr, check.positive)
  if type(opts) == "table" and rawget(opts, "learning_rate") ~= nil then
    fail(who, "learning_rate given twice (argument 1 and an option)")
  end
  local o = check.options(who, opts, spec)
  o.learning_rate = lr
  return o
end

local function check_nesterov (who, self)
  if self.nesterov and self.momentum == 0 then fail(who, "nesterov needs a momentum above 0") end
end

setmetatable(SGD, {__call = function(_, lr, opts)
  local o = options("SGD", SGD_OPTIONS, lr, opts)
  check_nesterov("SGD", o)
  return setmetatable({learning_rate = o.learning_rate, momentum = o.momentum, nesterov = o.nesterov,
                       name = o.name or "SGD", slots = setmetatable({}, {__mode = "k"}), iterations = 0}, SGD)
end})

function SGD:apply_gradients (grads, vars)
  check.self("SGD", self, SGD, "opt:apply_gradients(grads, vars)")
  check.fields("SGD", self, SGD_OPTIONS)
  check_nesterov("SGD", self)
  local gs, vs, n = updates("SGD", grads, vars)
  local lr, mu = self.learning_rate, self.momentum
  for i = 1, n do
    local g, v = gs[i], vs[i]
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

-- }=============================================================


-- {============================ Adam ===========================

--- Adam{learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-7, name=}
-- (Kingma & Ba). beta_1 and beta_2, Keras' spellings, are accepted too.
local Adam = {__name = "moongrad.optim.Adam"}
Adam.__index = Adam
optim.Adam = Adam

local ADAM_OPTIONS = {{"learning_rate", check.positive, 1e-3}, {"beta1", check.fraction, 0.9, alias = "beta_1"},
                      {"beta2", check.fraction, 0.999, alias = "beta_2"}, {"epsilon", check.positive, 1e-7},
                      {"name", check.string}}

setmetatable(Adam, {__call = function(_, lr, opts)
  local o = options("Adam", ADAM_OPTIONS, lr, opts)
  return setmetatable({learning_rate = o.learning_rate, beta1 = o.beta1, beta2 = o.beta2, epsilon = o.epsilon,
                       name = o.name or "Adam", m = setmetatable({}, {__mode = "k"}),
                       v = setmetatable({}, {__mode = "k"}), iterations = 0}, Adam)
end})

function Adam:apply_gradients (grads, vars)
  check.self("Adam", self, Adam, "opt:apply_gradients(grads, vars)")
  check.fields("Adam", self, ADAM_OPTIONS)
  local gs, vs, n = updates("Adam", grads, vars)
  self.iterations = self.iterations + 1
  local t, b1, b2 = self.iterations, self.beta1, self.beta2
  local step = self.learning_rate * math.sqrt(1 - b2 ^ t) / (1 - b1 ^ t)
  for i = 1, n do
    local g, var = gs[i], vs[i]
    if g ~= nil then
      local m = (self.m[var] or mg.zeros_like(g)) * b1 + g * (1 - b1)
      local v = (self.v[var] or mg.zeros_like(g)) * b2 + g * g * (1 - b2)
      self.m[var], self.v[var] = m, v
      var:assign_sub(m / (mg.sqrt(v) + self.epsilon), step)
    end
  end
end

-- }=============================================================

return optim

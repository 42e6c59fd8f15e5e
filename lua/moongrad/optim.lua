--- moongrad.optim: optimizers that update variables from their gradients.
--   local opt = mg.optim.Adam{learning_rate = 1e-3}
--   opt:apply_gradients(grads, vars)        -- grads[i] is the gradient of vars[i]
--   opt:apply_gradients({{g1, v1}, {g2, v2}})   -- Keras' list of pairs, the same
-- A nil gradient (an unconnected variable) is skipped: grads may have holes.
-- A variable given twice in one call is an error, as PyTorch refuses a
-- parameter in two groups (sum its gradients and give it once).
-- Every pair is checked before any variable or slot moves, so a bad call
-- leaves the optimizer and the variables as they were. Updates run outside
-- any tape's view: they are not recorded.
--
-- SGD, Adam, AdamW and RMSprop share these options:
--   learning_rate     a positive number, or a schedule (mg.schedules, or any
--                     function(step) -> rate) read at opt.iterations, the
--                     number of steps taken (0 at the first update, as Keras)
--   weight_decay = 0  L2 decay added to the gradient (g + wd * w), as PyTorch's
--                     SGD, Adam and RMSprop; AdamW's is decoupled (w -= lr * wd * w)
--   clipnorm          each gradient is scaled to a norm of at most clipnorm
--   clipvalue         each gradient entry is clipped to [-clipvalue, clipvalue]
--   global_clipnorm   all gradients are scaled together to a global norm of at
--                     most global_clipnorm (at most one of the three clips); an
--                     infinite norm scales them by 0, as PyTorch's clip_grad_norm_
--                     (Keras' clip_by_global_norm makes them NaN)
--   name
-- Clipping comes first, then the weight decay, then the update.
--
-- State for checkpoints: opt:get_state() returns plain tables of tensors,
--   {optimizer = "Adam", iterations = 12, slots = {m = {t1, t2, ...}, v = {...}}}
-- with slots[name][i] for the i-th variable (zeros for a variable not yet
-- updated); opt:set_state(state) restores it exactly. The variables are the
-- ones the optimizer has seen, in the order it first saw them (the lists given
-- to apply_gradients), or those given: opt:get_state(vars), opt:set_state(state,
-- vars), opt:build(vars) to fix the order before the first step (a fresh
-- optimizer being restored needs one of these).
-- @module moongrad.optim
local mg = require "moongrad"
local check = require "moongrad.check"
local class = require "moongrad.class"

local fail, show = check.fail, check.show

local optim = {}

optim.schedules = require "moongrad.schedules"

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
  check.distinct_variables(who, vars, n)
  return checked, vars, n
end

-- }=============================================================


-- {==================== the shared machinery ====================

local lr_rule = check.rule("a positive finite number or a schedule", function(v)
  return (type(v) == "number" and v > 0 and v < math.huge) or check.is_callable(v)
end)
local optional_positive = check.rule("a positive finite number", function(v)
  return v == nil or (type(v) == "number" and v > 0 and v < math.huge)
end)

-- options every optimizer takes after its own
local function common (weight_decay)
  return {{"weight_decay", check.nonnegative, weight_decay or 0}, {"clipnorm", optional_positive},
          {"clipvalue", optional_positive}, {"global_clipnorm", optional_positive}, {"name", check.string}}
end

local function spec_of (own, weight_decay)
  local spec = table.move(own, 1, #own, 1, {})
  return table.move(common(weight_decay), 1, 5, #spec + 1, spec)
end

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

-- the settings a user may have changed by hand since the last call
local function check_settings (self, who, spec)
  check.fields(who, self, spec)
  local clips = (self.clipnorm and 1 or 0) + (self.clipvalue and 1 or 0) + (self.global_clipnorm and 1 or 0)
  if clips > 1 then fail(who, "clipnorm, clipvalue and global_clipnorm: give at most one") end
  local extra = getmetatable(self).check
  if extra then extra(self, who) end
end

local Optimizer = {}          -- the methods every optimizer class gets, called as method(cls, self, ...)

--- The learning rate of the next step: the number, or the schedule at opt.iterations.
function Optimizer.get_learning_rate (cls, self)
  local who = cls.who
  check.self(who .. ":get_learning_rate", self, cls, "opt:get_learning_rate()")
  local lr = self.learning_rate
  if type(lr) == "number" then return lr end
  local ok, value = pcall(lr, self.iterations)
  if not ok then fail(who, "the learning-rate schedule failed at step %d: %s", self.iterations, tostring(value)) end
  if type(value) ~= "number" or not (value >= 0 and value < math.huge) then
    fail(who, "the learning-rate schedule gave %s at step %d; it must be a finite number >= 0", show(value),
         self.iterations)
  end
  return value
end

--- opt:minimize(loss, vars, tape): one step on tape's gradient of loss for
-- vars, as Keras' minimize(loss, var_list, tape); the same as
-- opt:apply_gradients(tape:gradient(loss, vars), vars). The distributed
-- wrappers' minimize reduces the gradients while the backward runs.
function Optimizer.minimize (cls, self, loss, vars, tape)
  local who = cls.who .. ":minimize"
  check.self(who, self, cls, "opt:minimize(loss, vars, tape)")
  check.minimize_args(who, loss, vars, tape)
  return self:apply_gradients(tape:gradient(loss, vars), vars)
end

-- registers vars (in order of first sight): the variables get_state describes
local function register (self, vars, n)
  local known, list = self._index, self._variables
  for i = 1, n do
    local v = vars[i]
    if not known[v] then
      list[#list + 1] = v
      known[v] = #list
    end
  end
end

--- opt:build(vars): fixes the variables (and their order) that get_state and
-- set_state describe, as Keras' optimizer.build(var_list).
function Optimizer.build (cls, self, vars)
  local who = cls.who
  check.self(who .. ":build", self, cls, "opt:build(variables)")
  if type(vars) ~= "table" or check.kind(vars) ~= "a table" then
    fail(who .. ":build", "variables must be a list of Variables, got %s", show(vars))
  end
  local n = check.list(who .. ":build", vars, "the list of variables", "variables[%d]")
  for i = 1, n do
    if not mg.is_variable(vars[i]) then fail(who .. ":build", "variables[%d] is %s, not a Variable", i, check.kind(vars[i])) end
  end
  register(self, vars, n)
  return self
end

-- the gradients after clipping (clipnorm, clipvalue, global_clipnorm)
local function clip (self, gs, n)
  local c = self.clipnorm
  if c then
    for i = 1, n do
      local g = gs[i]
      if g ~= nil then
        local norm = mg.norm(g):item()
        if norm > c then gs[i] = g * (c / norm) end
      end
    end
  elseif self.clipvalue then
    c = self.clipvalue
    for i = 1, n do if gs[i] ~= nil then gs[i] = mg.clamp(gs[i], -c, c) end end
  elseif self.global_clipnorm then
    c = self.global_clipnorm
    local sq = 0
    for i = 1, n do if gs[i] ~= nil then sq = sq + mg.sum(mg.cast(gs[i], "float64") ^ 2):item() end end
    local norm = math.sqrt(sq)
    if norm > c then                                   -- Keras' clip_by_global_norm: g * c / max(norm, c)
      for i = 1, n do if gs[i] ~= nil then gs[i] = gs[i] * (c / norm) end end
    end
  end
end

-- the slot tables of this optimizer: slot name -> (variable -> tensor)
local function slot_table (self, name)
  local t = self._slots[name]
  if not t then
    t = setmetatable({}, {__mode = "k"})
    self._slots[name] = t
  end
  return t
end

-- the slots of vs as they are: a function that puts them back (the
-- variables keep their values by themselves in a dry run)
local function keep_state (self, vs, n)
  local was = {}
  for name, t in pairs(self._slots) do
    local slots = {}
    for i = 1, n do slots[i] = t[vs[i]] or false end
    was[name] = slots
  end
  return function()
    for name, t in pairs(self._slots) do
      local slots = was[name]
      for i = 1, n do t[vs[i]] = slots and slots[i] or nil end
    end
  end
end

local function apply_gradients (cls, self, grads, vars)
  local who = cls.who
  check.self(who, self, cls, "opt:apply_gradients(grads, vars)")
  check_settings(self, who, cls.spec)
  local gs, vs, n = updates(who, grads, vars)
  local lr = self:get_learning_rate()
  register(self, vs, n)
  clip(self, gs, n)
  local wd = self.weight_decay
  local function steps ()
    for i = 1, n do
      local g, v = gs[i], vs[i]
      if g ~= nil then
        if wd > 0 and not cls.decoupled then g = g + v:value() * wd end
        cls.update(self, v, g, lr)
      end
    end
  end
  if mg.memory.dry_running() then                  -- a dry run (mg.memory.estimate) changes nothing
    local put_back = keep_state(self, vs, n)
    local ok, err = pcall(steps)
    put_back()
    if not ok then error(err, 0) end
    return
  end
  steps()
  self.iterations = self.iterations + 1
end

-- the loss_scale and good_steps of a LossScaleOptimizer's state, checked
-- (nil when the state has neither)
local scale_rule = check.rule("a positive finite number", function(v)
  return type(v) == "number" and v > 0 and v < math.huge
end)
local function check_loss_scale (who, state)
  if state.loss_scale == nil and state.good_steps == nil then return nil end
  if state.loss_scale ~= nil then check.value(who, "state.loss_scale", state.loss_scale, scale_rule) end
  if state.good_steps ~= nil and not (math.type(state.good_steps) == "integer" and state.good_steps >= 0) then
    fail(who, "state.good_steps must be an integer >= 0, got %s", show(state.good_steps))
  end
  return {loss_scale = state.loss_scale, good_steps = state.good_steps}
end

local state_rule = check.rule("a table {optimizer =, iterations =, slots = {...}}", function(v)
  return type(v) == "table" and getmetatable(v) == nil
end)

local function variables_for (self, who, vars)
  if vars == nil then return self._variables, #self._variables end
  if type(vars) ~= "table" or check.kind(vars) ~= "a table" then
    fail(who, "variables must be a list of Variables, got %s", show(vars))
  end
  local n = check.list(who, vars, "the list of variables", "variables[%d]")
  for i = 1, n do
    if not mg.is_variable(vars[i]) then fail(who, "variables[%d] is %s, not a Variable", i, check.kind(vars[i])) end
  end
  return vars, n
end

--- opt:get_state([vars]): {optimizer =, iterations =, slots = {name = {tensor per variable}}}.
function Optimizer.get_state (cls, self, vars)
  local who = cls.who .. ":get_state"
  check.self(who, self, cls, "opt:get_state()")
  local vs, n = variables_for(self, who, vars)
  local slots = {}
  for _, name in ipairs(cls.slot_names(self)) do
    local t, list = slot_table(self, name), {}
    for i = 1, n do list[i] = t[vs[i]] or mg.zeros_like(vs[i]:value()) end
    slots[name] = list
  end
  return {optimizer = cls.who, iterations = self.iterations, slots = slots}
end

--- opt:set_state(state [, vars]): restores what get_state returned; the whole
-- state is checked against the variables before anything changes.
function Optimizer.set_state (cls, self, state, vars)
  local who = cls.who .. ":set_state"
  check.self(who, self, cls, "opt:set_state(state)")
  check.value(who, "state", state, state_rule)
  if state.optimizer ~= nil and state.optimizer ~= cls.who then
    fail(who, "the state is %s's, not %s's", show(state.optimizer), cls.who)
  end
  local iterations = state.iterations
  if math.type(iterations) ~= "integer" then
    if type(iterations) == "number" and math.tointeger(iterations) then
      iterations = math.tointeger(iterations)
    else
      fail(who, "state.iterations must be an integer >= 0, got %s", show(iterations))
    end
  end
  if iterations < 0 then fail(who, "state.iterations must be an integer >= 0, got %d", iterations) end
  local vs, n = variables_for(self, who, vars)
  if vars == nil and n == 0 and next(state.slots or {}) ~= nil then
    fail(who, "the optimizer has no variables yet; give them: opt:set_state(state, model.trainable_variables)")
  end
  local slots = state.slots
  if type(slots) ~= "table" then fail(who, "state.slots must be a table of slot lists, got %s", show(slots)) end
  local names, want = cls.slot_names(self), {}
  for _, name in ipairs(names) do want[name] = true end
  for name in pairs(slots) do
    if not want[name] then
      fail(who, "state.slots has '%s', which %s does not keep (its slots: %s)", tostring(name), cls.who,
           #names > 0 and table.concat(names, ", ") or "none with these settings")
    end
  end
  for _, name in ipairs(names) do
    local list = slots[name]
    if type(list) ~= "table" then fail(who, "state.slots.%s is missing", name) end
    if #list ~= n then fail(who, "state.slots.%s has %d tensors for %d variables", name, #list, n) end
    for i = 1, n do
      local t, v = list[i], vs[i]
      if not check.is_array(t) or t.dtype ~= v.dtype or not check.same_shape(t.shape, v.shape) then
        fail(who, "state.slots.%s[%d] must be a %s tensor of shape %s (variable '%s'), got %s", name, i, v.dtype,
             check.shape(v.shape), v.name, show(t))
      end
    end
  end
  local scale = check_loss_scale(who, state)
  register(self, vs, n)
  for _, name in ipairs(names) do
    local t = slot_table(self, name)
    for i = 1, n do
      local s = slots[name][i]
      t[vs[i]] = mg.keep(mg.is_variable(s) and s:value() or s)
    end
  end
  self.iterations = iterations
  rawset(self, "_loss_scale_state", scale)   -- a LossScaleOptimizer's, for the next one made around this
  return self
end

-- a class named `who` with option spec `spec`; update(self, var, grad, lr)
-- does one variable's step, slot_names(self) lists the slots kept
local function optimizer_class (who, spec, def)
  local cls = class("moongrad.optim." .. who)
  cls.who, cls.spec = who, spec
  for k, v in pairs(def) do cls[k] = v end
  for k, method in pairs(Optimizer) do cls[k] = function(...) return method(cls, ...) end end
  cls.apply_gradients = function(...) return apply_gradients(cls, ...) end
  cls.__tostring = function(self) return ("moongrad.optim.%s (learning_rate=%s, iterations=%d)"):format(who,
    tostring(self.learning_rate), self.iterations) end
  function cls.__new (lr, opts)
    local o = options(who, spec, lr, opts)
    local self = setmetatable({iterations = 0, _slots = {}, _variables = {}, _index = setmetatable({}, {__mode = "k"})},
                              cls)
    for _, s in ipairs(spec) do self[s[1]] = o[s[1]] end
    self.name = o.name or who
    check_settings(self, who, spec)
    if cls.init then cls.init(self) end
    return self
  end
  optim[who] = cls
  return cls
end

-- }=============================================================


-- {============================ SGD ============================

--- SGD{learning_rate=0.01, momentum=0, nesterov=false, weight_decay=0, clip..., name=};
-- SGD(0.1) is SGD{learning_rate = 0.1}, as Keras' first positional argument.
-- PyTorch's rule: buf = momentum * buf + g; w -= lr * buf (nesterov: lr * (g + momentum * buf)).
-- Its slot is "momentum" (opt.slots[var]).
optimizer_class("SGD", spec_of({{"learning_rate", lr_rule, 0.01}, {"momentum", check.fraction, 0},
                                {"nesterov", check.boolean, false}}), {
  init = function(self) self.slots = slot_table(self, "momentum") end,
  check = function(self, who)
    if self.nesterov and self.momentum == 0 then fail(who, "nesterov needs a momentum above 0") end
  end,
  slot_names = function(self) return self.momentum > 0 and {"momentum"} or {} end,
  update = function(self, v, g, lr)
    local mu = self.momentum
    if mu == 0 then
      v:assign_sub(g, lr)                                     -- one pass, in place
    else                                                      -- one pass too (mg._momentum)
      local slots = slot_table(self, "momentum")
      slots[v] = mg.keep(mg._momentum(v, g, slots[v], mu, lr, self.nesterov))  -- state: it outlives a tidy step
    end
  end,
})

-- }=============================================================


-- {======================== Adam, AdamW ========================

-- Kingma & Ba's step, in Keras' form (epsilon outside the bias correction):
-- m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
-- w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + epsilon)
-- All in one pass over w, g, m and v (mg._adam, the numbers of these ops run one by
-- one): the decay, m, v, then w; new m and v tensors, w in place.
local function adam_update (self, var, g, lr)
  local t, b1, b2 = self.iterations + 1, self.beta1, self.beta2
  local decay = getmetatable(self).decoupled and lr * self.weight_decay or 0
  local ms, vs = slot_table(self, "m"), slot_table(self, "v")
  local m, v = mg._adam(var, g, ms[var], vs[var], lr * math.sqrt(1 - b2 ^ t) / (1 - b1 ^ t), b1, b2,
                        self.epsilon, decay)
  ms[var], vs[var] = mg.keep(m, v)
end

local function adam_spec (weight_decay)
  return spec_of({{"learning_rate", lr_rule, 1e-3}, {"beta1", check.fraction, 0.9, alias = "beta_1"},
                  {"beta2", check.fraction, 0.999, alias = "beta_2"}, {"epsilon", check.positive, 1e-7}},
                 weight_decay)
end

local function adam_init (self) self.m, self.v = slot_table(self, "m"), slot_table(self, "v") end
local function adam_slots () return {"m", "v"} end

--- Adam{learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-7, weight_decay=0, clip..., name=}
-- (Kingma & Ba). beta_1 and beta_2, Keras' spellings, are accepted too. Its
-- weight_decay is L2 (added to the gradient), as PyTorch's Adam; use AdamW
-- for decoupled decay. Slots "m" and "v" (opt.m[var], opt.v[var]).
optimizer_class("Adam", adam_spec(0), {init = adam_init, slot_names = adam_slots, update = adam_update})

--- AdamW{..., weight_decay=0.01}: Adam with decoupled weight decay (Loshchilov &
-- Hutter): w -= lr * weight_decay * w before each Adam step, lr the scheduled
-- rate, as PyTorch's AdamW.
optimizer_class("AdamW", adam_spec(0.01), {decoupled = true, init = adam_init, slot_names = adam_slots,
                                           update = adam_update})

-- }=============================================================


-- {========================== RMSprop ==========================

--- RMSprop{learning_rate=0.001, rho=0.9, momentum=0, epsilon=1e-7, centered=false,
-- weight_decay=0, clip..., name=}, Keras' rule: v = rho v + (1 - rho) g^2 (centered:
-- minus the square of a = rho a + (1 - rho) g); step = lr g / sqrt(v + epsilon);
-- with momentum, buf = momentum buf + step and w -= buf, else w -= step.
-- Slots "velocity", "momentum" (momentum > 0), "average_gradient" (centered).
optimizer_class("RMSprop", spec_of({{"learning_rate", lr_rule, 1e-3}, {"rho", check.fraction, 0.9},
                                    {"momentum", check.fraction, 0}, {"epsilon", check.positive, 1e-7},
                                    {"centered", check.boolean, false}}), {
  slot_names = function(self)
    local names = {"velocity"}
    if self.momentum > 0 then names[#names + 1] = "momentum" end
    if self.centered then names[#names + 1] = "average_gradient" end
    return names
  end,
  -- in one pass over w, g and the slots (mg._rmsprop: the numbers of the rule
  -- written op by op); new slot tensors, w in place
  update = function(self, var, g, lr)
    local vs, as, bs = slot_table(self, "velocity"), slot_table(self, "average_gradient"), slot_table(self, "momentum")
    local v, a, b = mg._rmsprop(var, g, vs[var], as[var], bs[var], lr, self.rho, self.epsilon, self.momentum,
                                self.centered)
    vs[var] = mg.keep(v)
    if a then as[var] = mg.keep(a) end
    if b then bs[var] = mg.keep(b) end
  end,
})

-- }=============================================================


-- {===================== optimizer wrappers ====================

--- The __index of an optimizer wrapper: cls's own methods, else the wrapped
-- optimizer's (self.optimizer) fields and methods (learning_rate, iterations,
-- get_state, ...), a method called on the wrapper getting the inner one as self.
function optim._forwarding_index (cls)
  return function(self, k)
    local m = rawget(cls, k)
    if m ~= nil then return m end
    local inner = rawget(self, "optimizer")
    local v = inner[k]
    if type(v) ~= "function" then return v end
    return function(first, ...)
      if first == self then return v(inner, ...) end
      return v(first, ...)
    end
  end
end

--- apply_gradients' arguments: Keras' list of {gradient, variable} pairs as two lists
function optim._split_pairs (grads, vars)
  if vars == nil and type(grads) == "table" then
    local list = grads
    grads, vars = {n = #list}, {}
    for i, p in ipairs(list) do
      if type(p) == "table" then grads[i], vars[i] = p[1], p[2] end
    end
  end
  return grads, vars
end

local function is_optimizer (opt)
  local ok, method = pcall(function() return opt.apply_gradients end)
  return ok and check.is_callable(method)
end

-- }=============================================================


-- {==================== LossScaleOptimizer =====================

--- LossScaleOptimizer(opt [, {initial_scale = 2^15, dynamic = true,
-- dynamic_growth_steps = 2000}]): Keras' loss scaling for float16 training
-- (PyTorch's GradScaler). float16 gradients underflow to zero below 6e-8 and
-- overflow above 65504; scaling the loss by opt.loss_scale scales every
-- gradient the tape makes by it, and apply_gradients divides them back
-- before opt's update. With dynamic = true a step whose gradients hold an
-- infinity or a NaN is skipped and the scale halved (down to 1); after
-- dynamic_growth_steps finite steps in a row it doubles. The loop:
--   local t = mg.tape()
--   local loss = mg.autocast("float16", function() return loss_fn(y, model(x)) end)
--   local scaled = opt:scale_loss(loss)             -- while the tape records
--   t:stop()
--   opt:apply_gradients(t:gradient(scaled, vars), vars)   -- false: skipped
-- fit{mixed_precision = "float16"} does this itself. Everything else
-- (learning_rate, iterations, slots) is opt's.
local LossScaleOptimizer = class("moongrad.optim.LossScaleOptimizer")
LossScaleOptimizer.__index = optim._forwarding_index(LossScaleOptimizer)
function LossScaleOptimizer.__newindex (self, k, v) rawget(self, "optimizer")[k] = v end

local LOSS_SCALE = {{"initial_scale", scale_rule, 2 ^ 15}, {"dynamic", check.boolean, true},
                    {"dynamic_growth_steps", check.positive_integer, 2000}, {"name", check.string}}
-- the inner optimizer's options, which Keras too refuses on the wrapper
local INNER = {"learning_rate", "weight_decay", "clipnorm", "clipvalue", "global_clipnorm"}

function LossScaleOptimizer.__new (opt, opts)
  local who = "LossScaleOptimizer"
  if not is_optimizer(opt) then
    fail(who, "the optimizer must be an optimizer (mg.optim.Adam{...}), got %s", show(opt))
  end
  if getmetatable(opt) == LossScaleOptimizer then fail(who, "the optimizer scales its loss already") end
  local mt = getmetatable(opt)
  if type(mt) == "table" and type(rawget(mt, "__name")) == "string" and mt.__name:find("^moongrad%.distributed%.") then
    fail(who, "%s inside would let each rank skip steps on its own gradients; put the loss scale inside it: "
              .. "DistributedOptimizer(LossScaleOptimizer(opt))", tostring(opt))
  end
  for _, k in ipairs(INNER) do
    if type(opts) == "table" and opts[k] ~= nil then
      fail(who, "%s is an option of the inner optimizer: set it there (%s)", k, tostring(opt))
    end
  end
  local o = check.options(who, opts, LOSS_SCALE)
  return setmetatable({optimizer = opt, loss_scale = o.initial_scale, initial_scale = o.initial_scale,
                       dynamic = o.dynamic, dynamic_growth_steps = o.dynamic_growth_steps, good_steps = 0,
                       skipped_steps = 0, name = o.name or "LossScaleOptimizer"}, LossScaleOptimizer)
end

function LossScaleOptimizer.__tostring (self)
  return ("moongrad.optim.LossScaleOptimizer (%s, loss_scale=%g)"):format(tostring(self.optimizer), self.loss_scale)
end

--- opt:scale_loss(loss) -> loss * opt.loss_scale (Keras 3's name; call it
-- while the tape records); loss a tensor or a number. get_scaled_loss is
-- Keras 2's name for it.
function LossScaleOptimizer.scale_loss (self, loss)
  check.self("LossScaleOptimizer:scale_loss", self, LossScaleOptimizer, "opt:scale_loss(loss)")
  if not (check.is_array(loss) or type(loss) == "number") then
    fail("LossScaleOptimizer:scale_loss", "loss must be a tensor or a number, got %s", show(loss))
  end
  return loss * self.loss_scale                 -- (a half loss: in float32, as half arithmetic is)
end
LossScaleOptimizer.get_scaled_loss = LossScaleOptimizer.scale_loss

-- grads times 1 / scale (exact for the powers of two the dynamic scale takes);
-- nil holes kept
local function unscaled (grads, n, scale)
  local out = {n = n}
  for i = 1, n do
    local g = grads[i]
    if g ~= nil then out[i] = (mg.is_variable(g) and g:value() or g) * (1 / scale) end
  end
  return out
end

--- opt:get_unscaled_gradients(grads) -> the list with each gradient divided by
-- the loss scale (Keras 2's name); apply_gradients does it itself.
function LossScaleOptimizer.get_unscaled_gradients (self, grads)
  local who = "LossScaleOptimizer:get_unscaled_gradients"
  check.self(who, self, LossScaleOptimizer, "opt:get_unscaled_gradients(grads)")
  if type(grads) ~= "table" or getmetatable(grads) ~= nil then fail(who, "grads must be a list, got %s", show(grads)) end
  local n = grads.n or #grads
  for i = 1, n do
    if grads[i] ~= nil and not check.is_array(grads[i]) then
      fail(who, "grads[%d] is %s, not a tensor", i, check.kind(grads[i]))
    end
  end
  return unscaled(grads, n, self.loss_scale)
end

-- do all these gradients hold finite numbers only? (g * 0 is 0 for a
-- finite entry and NaN for an infinite or NaN one; its sum cannot overflow)
local function all_finite (grads, n)
  for i = 1, n do
    local g = grads[i]
    if g ~= nil then
      local z = mg.sum(g * 0):item()
      if z ~= z then return false end
    end
  end
  return true
end

--- opt:apply_gradients(grads, vars): grads (of the scaled loss) divided by
-- the loss scale, then opt's update; true when applied. With dynamic scaling
-- a gradient holding an infinity or a NaN skips the update (false), halves
-- the scale and restarts the count of good steps; dynamic_growth_steps good
-- steps in a row double it. The pairs form works as opt's.
function LossScaleOptimizer.apply_gradients (self, grads, vars)
  local who = "LossScaleOptimizer"
  check.self(who, self, LossScaleOptimizer, "opt:apply_gradients(grads, vars)")
  local gs, vs, n = updates(who, grads, vars)               -- checked whatever the values
  local finite = not self.dynamic or mg.memory.dry_running() or all_finite(gs, n)
  if not finite then
    if self.loss_scale <= 1 and not rawget(self, "_warned") then
      rawset(self, "_warned", true)
      io.stderr:write("LossScaleOptimizer: the gradients hold an infinity or a NaN at loss scale 1: "
                      .. "the model itself diverges (mg.debug.check_numerics(true) names the op)\n")
    end
    -- halved, not below 1 (Keras 2's floor); a scale chosen below 1 keeps halving
    local s = self.loss_scale
    self.loss_scale = s >= 1 and math.max(s / 2, 1) or s / 2
    self.good_steps = 0
    self.skipped_steps = self.skipped_steps + 1
    return false
  end
  self.optimizer:apply_gradients(unscaled(gs, n, self.loss_scale), vs)
  if self.dynamic and not mg.memory.dry_running() then
    self.good_steps = self.good_steps + 1
    if self.good_steps >= self.dynamic_growth_steps then
      self.loss_scale = self.loss_scale * 2
      self.good_steps = 0
    end
  end
  return true
end

--- opt:minimize(loss, vars, tape): apply_gradients(tape:gradient(loss, vars),
-- vars), loss being the scaled one (opt:scale_loss while the tape recorded)
function LossScaleOptimizer.minimize (self, loss, vars, tape)
  local who = "LossScaleOptimizer:minimize"
  check.self(who, self, LossScaleOptimizer, "opt:minimize(loss, vars, tape)")
  check.minimize_args(who, loss, vars, tape)
  return self:apply_gradients(tape:gradient(loss, vars), vars)
end

--- opt:get_state([vars]): opt's state, with loss_scale and good_steps
function LossScaleOptimizer.get_state (self, vars)
  check.self("LossScaleOptimizer:get_state", self, LossScaleOptimizer, "opt:get_state()")
  local state = self.optimizer:get_state(vars)
  state.loss_scale, state.good_steps = self.loss_scale, self.good_steps
  return state
end

--- opt:set_state(state [, vars]): restores what get_state returned
function LossScaleOptimizer.set_state (self, state, vars)
  local who = "LossScaleOptimizer:set_state"
  check.self(who, self, LossScaleOptimizer, "opt:set_state(state)")
  if type(state) == "table" then check_loss_scale(who, state) end
  local inner = {}
  for k, v in pairs(type(state) == "table" and state or {}) do
    if k ~= "loss_scale" and k ~= "good_steps" then inner[k] = v end
  end
  self.optimizer:set_state(type(state) == "table" and inner or state, vars)
  if state.loss_scale ~= nil then self.loss_scale = state.loss_scale end
  if state.good_steps ~= nil then self.good_steps = state.good_steps end
  return self
end

optim.LossScaleOptimizer = LossScaleOptimizer

--- A loss scale a checkpoint restored into scaler's optimizer (set_state
-- of a plain optimizer keeps it) goes on in scaler
function optim._resume_loss_scale (scaler)
  local inner = rawget(scaler, "optimizer")
  local st = type(inner) == "table" and rawget(inner, "_loss_scale_state")
  if not st then return end
  if st.loss_scale then scaler.loss_scale = st.loss_scale end
  if st.good_steps then scaler.good_steps = st.good_steps end
  rawset(inner, "_loss_scale_state", nil)
end

--- The loss scaler an optimizer (or a distributed wrapper of one) is, or nil
function optim._loss_scaler (opt)
  while type(opt) == "table" do
    if getmetatable(opt) == LossScaleOptimizer then return opt end
    opt = rawget(opt, "optimizer")
  end
  return nil
end

-- }=============================================================


--- get(spec): an optimizer for compile: an optimizer object (anything with
-- apply_gradients), or a name ("sgd", "adam", "adamw", "rmsprop") for one with
-- the default settings.
local by_name = {sgd = "SGD", adam = "Adam", adamw = "AdamW", rmsprop = "RMSprop"}

function optim.get (spec, who)
  who = who or "optim.get"
  if type(spec) == "string" then
    local name = by_name[spec:lower()]
    if not name then check.unknown(who, "optimizer", spec, {"sgd", "adam", "adamw", "rmsprop"}) end
    return optim[name]()
  end
  if not is_optimizer(spec) then
    fail(who, "optimizer must be an optimizer (mg.optim.Adam{...}) or its name ('adam', 'sgd', ...), got %s", show(spec))
  end
  return spec
end

return check.export(optim)          -- errors name the user's line (moongrad.check)

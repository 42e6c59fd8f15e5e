--- moongrad.fit: Keras-style training for every layer and model:
--   model:compile{optimizer = "adam", loss = "sparse_categorical_crossentropy", metrics = {"accuracy"}}
--   local history = model:fit(x, y, {epochs = 5, batch_size = 32, validation_split = 0.1})
--   model:evaluate(x_test, y_test)      --> {loss = 0.09, accuracy = 0.97}
--   model:predict(x_test)               --> the outputs, batch by batch, concatenated
-- and the callbacks (mg.callbacks: EarlyStopping, LambdaCallback, TerminateOnNaN,
-- ProgbarLogger, History).
--
-- Numbers are 1-based as everywhere in moongrad: epochs count 1..epochs,
-- batches 1..steps. fit{initial_epoch = 2, epochs = 5} runs epochs 3, 4, 5.
--
-- The callback protocol. A callback is a table (or an object) with any of
-- these methods, called with a colon (self first), in the order of the list:
--   cb:set_model(model)                  before training: the model being fit
--   cb:set_params(params)                {epochs=, steps=, verbose=, metrics = {"loss", ..., "val_loss", ...}}
--   cb:on_train_begin(logs)              logs = {}
--   cb:on_epoch_begin(epoch, logs)       logs = {}
--   cb:on_batch_begin(batch, logs)       logs = {}
--   cb:on_batch_end(batch, logs)         logs: the epoch's running means so far {loss =, accuracy =, ...}
--   cb:on_epoch_end(epoch, logs)         logs: the epoch's means, and val_loss, val_... with validation;
--                                        callbacks may add entries (History, last, records them)
--   cb:on_train_end(logs)                logs: the last epoch's
-- Setting model.stop_training = true (in any hook) stops training: after the
-- current batch (the epoch still ends: validation, on_epoch_end), or after the
-- current epoch. fit sets it to false when it starts. A plain table whose key
-- starting with "on_" is not one of the hooks is an error (a typo would never run).
-- The list fit uses is: the progress bar (unless a ProgbarLogger is given or
-- verbose = 0), the given callbacks, then the History that fit returns.
--
-- Shuffling and resuming. With shuffle (the default) each epoch visits the
-- training samples in the order mg.random.permutation draws from the seed
-- mix(seed, epoch): seed is fit's seed= option, or else the seed of mg.random's
-- state when fit starts (what mg.random.seed(s) set). The order depends on
-- (seed, epoch) alone, and drawing it leaves mg.random's stream where it was
-- (dropout masks come from that stream). So fit{initial_epoch = 2, epochs = 5}
-- on a model whose weights, optimizer state (opt:get_state/set_state) and
-- mg.random state are those at the end of epoch 2 gives epochs 3 to 5 bit for
-- bit as the uninterrupted run.
--
-- Inference mode. evaluate, predict and the validation pass set every layer
-- of the model that has a boolean `training` field (Dropout, BatchNorm) to
-- false while they run, and restore it after (PyTorch's model.eval()); the
-- model is called with one argument.
-- @module moongrad.fit
local mg = require "moongrad"
local check = require "moongrad.check"
local mixed_precision = require "moongrad.mixed_precision"
local class = require "moongrad.class"
local layer_mod = require "moongrad.layer"
local optim = require "moongrad.optim"

local fail, show = check.fail, check.show

local fit = {}

-- {========================== classes ==========================

local callbacks = {}
fit.callbacks = callbacks

local function callback_class (name)
  local cls = class("moongrad.callbacks." .. name)
  callbacks[name] = cls
  return cls
end

-- }=============================================================


-- {======================= inference mode ======================

-- the layers of model (itself included) that have a boolean `training` field
local function training_layers (layer, seen, out)
  if seen[layer] then return out end
  seen[layer] = true
  if type(layer) == "userdata" then                      -- a recompute_grad wrapper
    local ok, inner = pcall(function() return layer.__wrapped__ end)
    if ok and inner ~= nil then training_layers(inner, seen, out) end
    return out
  end
  if type(layer) ~= "table" then return out end
  if type(rawget(layer, "training")) == "boolean" then out[#out + 1] = layer end
  if rawget(layer, "_vars") then layer_mod.refresh(layer) end
  for _, key in ipairs({"_layers", "layers"}) do
    local subs = rawget(layer, key)
    if type(subs) == "table" then
      for _, sub in ipairs(subs) do training_layers(sub, seen, out) end
    end
  end
  return out
end

--- Runs fn(...) with every `training` flag of the model false; restores them after.
function fit.inference (model, fn, ...)
  local layers = training_layers(model, {}, {})
  local saved = {}
  for i, l in ipairs(layers) do saved[i] = l.training; l.training = false end
  local result = table.pack(pcall(fn, ...))
  for i, l in ipairs(layers) do l.training = saved[i] end
  if not result[1] then error(result[2], 0) end
  return table.unpack(result, 2, result.n)
end

-- }=============================================================


-- {=========================== checks ==========================

local function is_plain (v) return type(v) == "table" and getmetatable(v) == nil end

-- x or y: a tensor with a first (sample) axis
local function check_data (who, what, v)
  if not check.is_array(v) then fail(who, "%s must be a tensor, got %s", what, show(v)) end
  if v.ndim == 0 then fail(who, "%s must have a first axis of samples, got shape ()", what) end
  return mg.is_variable(v) and v:value() or v
end

-- the inputs x: a 1-D x is N samples of one feature, (N, 1), as Keras's
-- expand_1d (else a layer would take it for one sample of N features)
local function check_inputs (who, what, x)
  x = check_data(who, what, x)
  return x.ndim == 1 and x:reshape{-1, 1} or x
end

local function check_pair (who, x, y, what_x, what_y)
  x = check_inputs(who, what_x, x)
  y = check_data(who, what_y, y)
  if x.shape[1] ~= y.shape[1] then
    fail(who, "%s has %d samples but %s has %d (their first axes must match)", what_x, x.shape[1], what_y, y.shape[1])
  end
  return x, y
end

local hooks = {"set_model", "set_params", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
               "on_batch_begin", "on_batch_end"}
local is_hook = {}
for _, h in ipairs(hooks) do is_hook[h] = true end

local function check_callbacks (who, list)
  if list == nil then return {} end
  if not is_plain(list) then fail(who, "option 'callbacks' must be a list of callbacks, got %s", show(list)) end
  local n = check.list(who, list, "the list of callbacks", "callbacks[%d]")
  for i = 1, n do
    local cb = list[i]
    if type(cb) ~= "table" then
      fail(who, "callbacks[%d] must be a callback (a table with on_epoch_end, ... methods), got %s", i, show(cb))
    end
    for _, h in ipairs(hooks) do
      local f = cb[h]
      if f ~= nil and not check.is_callable(f) then fail(who, "callbacks[%d].%s must be a function, got %s", i, h, show(f)) end
    end
    if is_plain(cb) then
      for k in pairs(cb) do
        if type(k) == "string" and k:find("^on_") and not is_hook[k] then
          local guess = check.closest(k, hooks)
          fail(who, "callbacks[%d] has '%s', which is not a hook (%sknown: %s)", i, k,
               guess and ("did you mean '%s'? "):format(guess) or "", table.concat(hooks, ", ", 3))
        end
      end
    end
  end
  return table.move(list, 1, n, 1, {})
end

local function call (cbs, hook, ...)
  for _, cb in ipairs(cbs) do
    local f = cb[hook]
    if f ~= nil then f(cb, ...) end
  end
end

local verbose_rule = check.rule("0, 1, 2 or 'auto'", function(v) return v == 0 or v == 1 or v == 2 or v == "auto" end)
local split_rule = check.rule("a number in [0, 1)", check.fraction.test)
local validation_rule = check.rule("a list {x, y} of tensors", function(v)
  return is_plain(v) and check.is_array(v[1]) and check.is_array(v[2])
end)

-- }=============================================================


-- {========================== compile ==========================

local function loss_rule_test (v) return type(v) == "string" or check.is_callable(v) end
local metrics_rule = check.rule("a list of metric names and functions", function(v)
  return type(v) == "string" or check.is_callable(v) or is_plain(v)
end)
local optimizer_rule = check.rule("an optimizer or its name", function(v)
  return type(v) == "string" or type(v) == "table"
end)

local COMPILE = {{"optimizer", optimizer_rule, "rmsprop"}, {"loss", check.rule("a loss name or a function(y_true, y_pred)",
                 loss_rule_test)}, {"metrics", metrics_rule}}

--- model:compile{optimizer="rmsprop", loss=, metrics={}}: what fit trains with.
-- optimizer: an optimizer (mg.optim.Adam{...}) or a name ("adam", "sgd",
-- "adamw", "rmsprop"); loss: a name of mg.losses ("mse",
-- "sparse_categorical_crossentropy", ...), a loss object
-- (mg.losses.SparseCategoricalCrossentropy{from_logits = true}) or a
-- function(y_true, y_pred) returning a scalar tensor; metrics: a list of
-- names ("accuracy", "mae", ...) and functions(y_true, y_pred); name = fn
-- entries name a function's column (unnamed functions are metric_1, ...).
-- Sets model.optimizer.
local function compile (self, opts)
  local who = "compile"
  opts = check.options(who, opts, COMPILE)
  local optimizer = optim.get(opts.optimizer, who)
  local c = {metrics = {}}
  if opts.loss ~= nil then
    c.loss, c.loss_name, c.from_logits = require("moongrad.losses").get(opts.loss, who)
  end
  local metrics = require "moongrad.metrics"
  local list = opts.metrics
  if list ~= nil and not is_plain(list) then list = {list} end
  local seen = {loss = true}
  local function add (name, spec)
    if seen[name] then fail(who, "two metrics are named '%s'; name them apart: metrics = {other_name = fn}", name) end
    seen[name] = true
    c.metrics[#c.metrics + 1] = {name, metrics.get(spec, c.loss_name, c.from_logits, who)}
  end
  if list then
    local n = 0
    for k in pairs(list) do
      if math.type(k) == "integer" and k >= 1 then n = math.max(n, k)
      elseif type(k) ~= "string" then fail(who, "metrics has a key %s; give a list, or name = fn entries", show(k)) end
    end
    for i = 1, n do
      local m = list[i]
      if m == nil then fail(who, "metric %d is nil (a hole in the list)", i) end
      local name = type(m) == "string" and m or (type(m) == "table" and type(m.name) == "string" and m.name)
                   or ("metric_%d"):format(i)
      add(name, m)
    end
    local named = {}
    for k in pairs(list) do if type(k) == "string" then named[#named + 1] = k end end
    table.sort(named)
    for _, k in ipairs(named) do add(k, list[k]) end
  end
  self._compiled = c
  self.optimizer = optimizer
  return self
end

local function compiled (self, who)
  local c = rawget(self, "_compiled")
  if not c then fail(who, "the model is not compiled; call model:compile{optimizer =, loss =} first") end
  return c
end

-- the metric columns' names: loss, then the metrics in compile's order
local function metric_names (c)
  local names = {"loss"}
  for _, m in ipairs(c.metrics) do names[#names + 1] = m[1] end
  return names
end

local function number_of (who, what, v)
  if check.is_array(v) then
    if v:numel() ~= 1 then fail(who, "%s gave a tensor of shape %s; it must give one number", what, check.shape(v.shape)) end
    return (mg.is_variable(v) and v:value() or v):item()
  end
  if type(v) ~= "number" then fail(who, "%s gave %s; it must give a number or a one-element tensor", what, show(v)) end
  return v
end

-- the loss and the metrics of one batch, as numbers
local function batch_logs (self, c, who, loss, y, y_pred)
  local logs = {loss = number_of(who, "the loss", loss)}
  for _, m in ipairs(c.metrics) do logs[m[1]] = number_of(who, ("metric '%s'"):format(m[1]), m[2](y, y_pred)) end
  return logs
end

-- }=============================================================


-- {==================== train_step, test_step ==================

-- the dtype products run in for this model now (fit's mixed_precision, the
-- model's dtype_policy, the global policy), or false
local function autocast_of (self)
  local d = rawget(self, "_autocast")
  if d == nil then d = mixed_precision.autocast_dtype(self) end
  return d
end

--- model:train_step(x, y): one step on a batch: forward (under recompute_grad
-- when fit was asked to), the loss, its gradients, the optimizer's update.
-- Returns the batch's logs {loss =, <metric> =} (numbers). Override it for a
-- custom step (fit averages whatever it returns, weighted by batch size).
local function train_step (self, x, y)
  local who = "fit"
  local c = compiled(self, who)
  if not c.loss then fail(who, "the model was compiled without a loss; compile{loss = ...} or override train_step") end
  local forward = rawget(self, "_train_forward") or self
  local t = mg.tape()
  local ok, y_pred, loss = pcall(mixed_precision.run, autocast_of(self), function()   -- products in bfloat16 when mixed
    local out = forward(x)
    return out, c.loss(y, out)
  end)
  local scaler = rawget(self, "_loss_scaler")
  local scaled = ok and scaler and check.is_array(loss) and scaler:scale_loss(loss) or loss   -- on the tape
  t:stop()
  if not ok then error(y_pred, 0) end
  if not check.is_array(loss) then fail(who, "the loss gave %s; it must give a scalar tensor", show(loss)) end
  local vars, opt = self.trainable_variables, self.optimizer
  local ok_m, minimize = pcall(function() return opt.minimize end)
  if ok_m and check.is_callable(minimize) then
    opt:minimize(scaled, vars, t)                    -- distributed: gradients sent while the backward runs
  else
    opt:apply_gradients(t:gradient(scaled, vars), vars)
  end
  return batch_logs(self, c, who, loss, y, y_pred)
end

--- model:test_step(x, y): the logs of one batch, without training (evaluate
-- and validation call it in inference mode).
local function test_step (self, x, y)
  local who = "evaluate"
  local c = compiled(self, who)
  if not c.loss then fail(who, "the model was compiled without a loss") end
  local y_pred, loss = mixed_precision.run(autocast_of(self), function()
    local out = self(x)
    return out, c.loss(y, out)
  end)
  return batch_logs(self, c, who, loss, y, y_pred)
end

-- }=============================================================


-- {=========================== batches ==========================

-- rows a..b of t (a view)
local function rows (t, a, b) return t:slice({a, b}) end

-- batch i of size bs from n samples, in `order` (an int64 permutation) or in
-- order; or samples a..b when given (a rank's share of a distributed batch)
local function batch (x, y, i, bs, n, order, a, b)
  if not a then a, b = (i - 1) * bs + 1, math.min(i * bs, n) end
  if order then
    local idx = order:slice({a, b})
    return mg.gather(x, idx), y and mg.gather(y, idx), b - a + 1
  end
  return rows(x, a, b), y and rows(y, a, b), b - a + 1
end

-- running means of batch logs, weighted by batch size
local function meter ()
  local sums, seen, order = {}, 0, {}
  local m = {}
  function m.add (logs, size)
    for k, v in pairs(logs) do
      if sums[k] == nil then sums[k] = 0; order[#order + 1] = k end
      sums[k] = sums[k] + v * size
    end
    seen = seen + size
  end
  function m.means ()
    local out = {}
    for _, k in ipairs(order) do out[k] = sums[k] / seen end
    return out
  end
  return m
end

-- runs test_step over x, y in batches, in inference mode; the means
local function evaluate_batches (self, x, y, bs, on_batch)
  local n = x.shape[1]
  local steps = (n + bs - 1) // bs
  local m = meter()
  fit.inference(self, function()
    for i = 1, steps do
      local xb, yb, size = batch(x, y, i, bs, n)
      m.add(self:test_step(xb, yb), size)
      if on_batch then on_batch(i, m.means()) end
    end
  end)
  return m.means()
end

-- }=============================================================


-- {========================= callbacks =========================

--- History: records the logs of each epoch; fit returns it (and sets model.history).
--   history.history.loss[i], history.history.val_accuracy[i], ...: per epoch
--   history.epoch: the epoch numbers (1-based; 3, 4, 5 for a run resumed at 2)
--   history.params: {epochs =, steps =, verbose =, metrics =}
--   history:plot([path] [, opts]): the curves (see mg.plot)
local History = callback_class("History")

function History.__new () return setmetatable({history = {}, epoch = {}, params = {}}, History) end

function History:set_model (model) self.model = model end
function History:set_params (params) self.params = params end

function History:on_epoch_end (epoch, logs)
  self.epoch[#self.epoch + 1] = epoch
  local keys = {}
  for k in pairs(logs) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local list = self.history[k]
    if not list then list = {}; self.history[k] = list end
    list[#list + 1] = logs[k]
  end
end

--- history:plot([path] [, {title=, ...}]): the loss curves (and the metrics'
-- in a second panel) against the epoch, by mg.plot: to a PNG or SVG file at
-- path, or as text (returned) without one.
function History:plot (path, opts)
  check.self("History:plot", self, History, "history:plot(path)")
  if type(path) == "table" and opts == nil then path, opts = nil, path end
  return require("moongrad.plot").history(self, path, opts)
end

function History:__tostring ()
  local keys = {}
  for k in pairs(self.history) do keys[#keys + 1] = k end
  table.sort(keys)
  return ("moongrad.callbacks.History (%d epochs: %s)"):format(#self.epoch, table.concat(keys, ", "))
end

--- ProgbarLogger{out=io.stdout, tty=<detected>, verbose=1}: the progress bar
-- fit shows ("Epoch 1/5", then the Keras bar); give one in callbacks to
-- choose where it writes (fit then adds none of its own).
local ProgbarLogger = callback_class("ProgbarLogger")
local PROGBAR = {{"out", check.rule("a file or an object with write and flush methods", function(v)
                  return type(v) == "userdata" or type(v) == "table" end)}, {"tty", check.boolean},
                 {"verbose", check.rule("1 or 2", function(v) return v == 1 or v == 2 end), 1}}

function ProgbarLogger.__new (opts)
  opts = check.options("ProgbarLogger", opts, PROGBAR)
  return setmetatable({out = opts.out or io.stdout, tty = opts.tty, verbose = opts.verbose}, ProgbarLogger)
end

function ProgbarLogger:set_params (params) self.params = params end

-- logs as a list of pairs in the params' column order, then any others by name
local function in_order (names, logs)
  local list, done = {}, {}
  for _, k in ipairs(names or {}) do
    if logs[k] ~= nil then list[#list + 1] = {k, logs[k]}; done[k] = true end
  end
  local rest = {}
  for k in pairs(logs) do if not done[k] and type(k) == "string" then rest[#rest + 1] = k end end
  table.sort(rest)
  for _, k in ipairs(rest) do list[#list + 1] = {k, logs[k]} end
  return list
end

function ProgbarLogger:start (steps)
  self.bar = mg.progress(steps, {out = self.out, tty = self.tty, verbose = self.verbose})
  self.last = 0
end

function ProgbarLogger:on_epoch_begin (epoch)
  local p = self.params or {}
  if p.epochs then
    self.out:write(("Epoch %d/%d\n"):format(epoch, p.epochs))
    self.out:flush()                                  -- a log shows which epoch is running
  end
  self:start(p.steps or 0)
end

function ProgbarLogger:on_batch_end (b, logs)
  self.last = b
  self.bar:update(b, in_order((self.params or {}).metrics, logs))
end

function ProgbarLogger:on_epoch_end (_, logs)
  if self.last < self.bar.total then self.bar:stop() end
  self.bar:finish(in_order((self.params or {}).metrics, logs))
end

--- EarlyStopping{monitor="val_loss", min_delta=0, patience=0, mode="auto",
-- baseline=nil, restore_best_weights=false, start_from_epoch=0, verbose=0}:
-- stops training when `monitor` has not improved by more than min_delta for
-- patience epochs (Keras' rule). mode "auto" maximises names with "acc" or
-- "auc" in them, minimises the others. With restore_best_weights the model
-- ends with the variables of its best epoch, whether training stopped early
-- or ran every epoch. A monitor missing from the logs is an error naming the
-- ones there (no validation data for val_loss, a typo).
local EarlyStopping = callback_class("EarlyStopping")
local EARLY = {{"monitor", check.string, "val_loss"}, {"min_delta", check.nonnegative, 0},
               {"patience", check.rule("an integer >= 0", function(v) return math.type(v) == "integer" and v >= 0 end), 0},
               {"mode", check.rule("'auto', 'min' or 'max'", function(v) return v == "auto" or v == "min" or v == "max" end),
                "auto"},
               {"baseline", check.rule("a finite number", function(v) return type(v) == "number" and v == v
                 and math.abs(v) < math.huge end)},
               {"restore_best_weights", check.boolean, false},
               {"start_from_epoch", check.rule("an integer >= 0", function(v) return math.type(v) == "integer" and v >= 0 end), 0},
               {"verbose", check.rule("0 or 1", function(v) return v == 0 or v == 1 end), 0}}

function EarlyStopping.__new (opts)
  local o = check.options("EarlyStopping", opts, EARLY)
  if o.mode == "auto" then o.mode = (o.monitor:find("acc") or o.monitor:find("auc")) and "max" or "min" end
  return setmetatable(o, EarlyStopping)
end

function EarlyStopping:set_model (model) self.model = model end

local function snapshot (model)
  local values = {}
  for i, v in ipairs(model.variables) do values[i] = v:value() end
  return values
end

local function restore (model, values)
  for i, v in ipairs(model.variables) do if values[i] then v:assign(values[i]) end end
end

function EarlyStopping:on_train_begin ()
  self.wait, self.stopped_epoch, self.best_epoch, self.best_weights, self.seen = 0, nil, nil, nil, 0
  self.best = self.mode == "min" and math.huge or -math.huge
end

function EarlyStopping:improves (current, reference)
  if self.mode == "min" then return current < reference - self.min_delta end
  return current > reference + self.min_delta
end

function EarlyStopping:on_epoch_end (epoch, logs)
  local current = logs[self.monitor]
  if current == nil then
    local names = {}
    for k in pairs(logs) do names[#names + 1] = k end
    table.sort(names)
    fail("EarlyStopping", "monitor '%s' is not in the logs (they have: %s)%s", self.monitor, table.concat(names, ", "),
         self.monitor:find("^val_") and "; fit needs validation_data or validation_split for it" or "")
  end
  if epoch <= self.start_from_epoch then return end
  self.seen = self.seen + 1
  self.last_epoch = epoch
  if self.restore_best_weights and not self.best_weights then self.best_weights = snapshot(self.model) end
  self.wait = self.wait + 1
  if self:improves(current, self.best) then
    self.best, self.best_epoch = current, epoch
    if self.restore_best_weights then self.best_weights = snapshot(self.model) end
    if self.baseline == nil or self:improves(current, self.baseline) then self.wait = 0 end
    return
  end
  if self.wait >= self.patience and self.seen > 1 then
    self.stopped_epoch = epoch
    self.model.stop_training = true
  end
end

function EarlyStopping:on_train_end ()
  if self.stopped_epoch and self.verbose > 0 then io.stdout:write(("Epoch %d: early stopping\n"):format(self.stopped_epoch)) end
  if self.restore_best_weights and self.best_weights and self.best_epoch and self.best_epoch ~= self.last_epoch then
    if self.verbose > 0 then
      io.stdout:write(("Restoring model weights from the end of the best epoch: %d.\n"):format(self.best_epoch))
    end
    restore(self.model, self.best_weights)
  end
end

--- LambdaCallback{on_epoch_begin=, on_epoch_end=, on_batch_begin=, on_batch_end=,
-- on_train_begin=, on_train_end=}: plain functions, called as fn(epoch, logs),
-- fn(batch, logs), fn(logs) (no self).
local LambdaCallback = callback_class("LambdaCallback")
local LAMBDA = {}
for _, h in ipairs(hooks) do
  if h:find("^on_") then LAMBDA[#LAMBDA + 1] = {h, check.callable} end
end

function LambdaCallback.__new (opts)
  local o = check.options("LambdaCallback", opts, LAMBDA)
  local self = setmetatable({}, LambdaCallback)
  for _, s in ipairs(LAMBDA) do
    local fn = o[s[1]]
    if fn then self[s[1]] = function(_, ...) return fn(...) end end
  end
  return self
end

--- TerminateOnNaN{verbose=1}: stops training at the first batch whose loss is
-- NaN or infinite ("Batch 3: invalid loss, terminating training").
local TerminateOnNaN = callback_class("TerminateOnNaN")

function TerminateOnNaN.__new (opts)
  local o = check.options("TerminateOnNaN", opts, {{"verbose", check.rule("0 or 1", function(v)
    return v == 0 or v == 1 end), 1}})
  return setmetatable({verbose = o.verbose}, TerminateOnNaN)
end

function TerminateOnNaN:set_model (model) self.model = model end

function TerminateOnNaN:on_batch_end (b, logs)
  local loss = logs.loss
  if loss and (loss ~= loss or math.abs(loss) == math.huge) then
    if self.verbose > 0 then io.stdout:write(("Batch %d: invalid loss, terminating training\n"):format(b)) end
    self.model.stop_training = true
  end
end

-- }=============================================================


-- {=================== fit, evaluate, predict ==================

local function invalid (loss)
  if mg.is_tensor(loss) and loss:numel() == 1 then loss = loss:item() end
  return type(loss) == "number" and (loss ~= loss or math.abs(loss) == math.huge)
end

-- a loss gone NaN or infinite says so once, on stderr, unless a
-- TerminateOnNaN is there to stop (training goes on, as Keras' does)
local function warn_nan (cbs, epoch, b)
  for _, cb in ipairs(cbs) do if getmetatable(cb) == TerminateOnNaN then return true end end
  io.stderr:write(("fit: the loss is not a finite number at epoch %d, batch %d; training goes on. "
    .. "callbacks = {mg.callbacks.TerminateOnNaN()} stops there; mg.debug.check_numerics(true) "
    .. "names the first op that made a NaN or an infinity\n"):format(epoch, b))
  return true
end

local batch_size_rule = check.positive_integer
local epoch_rule = check.rule("an integer >= 0", function(v) return math.type(v) == "integer" and v >= 0 end)

-- the LossScaleOptimizer fit{mixed_precision = "float16"} put around each
-- optimizer: its scale goes on from one fit to the next
local loss_scalers = setmetatable({}, {__mode = "k"})

-- fit's mixed_precision: the dtype products run in, or false (float32)
local precision_rule = check.rule('"bfloat16", "float16", "float32" or false', function(v)
  return v == false or v == "bfloat16" or v == "float16" or v == "float32"
end)

local FIT = {{"epochs", check.positive_integer, 1}, {"batch_size", batch_size_rule, 32},
             {"validation_data", validation_rule}, {"validation_split", split_rule, 0},
             {"validation_batch_size", batch_size_rule}, {"shuffle", check.boolean, true},
             {"callbacks", check.rule("a list of callbacks", is_plain)}, {"recompute", check.boolean, false},
             {"verbose", verbose_rule, "auto"}, {"initial_epoch", epoch_rule, 0}, {"seed", check.integer},
             {"distributed", check.boolean, false}, {"mixed_precision", precision_rule},
             {"shard", check.rule("0, 1 or 2 (ZeRO's stage)", function(v) return v == 0 or v == 1 or v == 2 end), 0},
             {"memory_budget", check.rule('bytes or a size like "2 GiB"', function(v)
               return (type(v) == "number" and v > 0) or type(v) == "string" end)}}

local function has_progbar (cbs)
  for _, cb in ipairs(cbs) do if getmetatable(cb) == ProgbarLogger then return true end end
  return false
end

-- a training step, under the memory plan fit{memory_budget} made on the
-- first batch (mg.memory.plan: what each stretch of the model keeps,
-- recomputes or packs)
local function planned_step (self, xb, yb, o)
  if not o.memory_budget then return self:train_step(xb, yb) end
  local plan = rawget(self, "_memory_plan")
  if not plan then
    -- the optimizer's slots made now, as the zeros its first step would make:
    -- the plan is for the steps that hold them, all but the first
    local function step () return self:train_step(xb, yb) end
    local opt, vars = self.optimizer, self.trainable_variables
    if #vars == 0 then mg.memory.estimate(step); vars = self.trainable_variables end   -- builds the model
    if opt.get_state and opt.set_state and #vars > 0 then opt:set_state(opt:get_state(vars), vars) end
    local ok, p = pcall(mg.memory.plan, step, {budget = o.memory_budget})
    if not ok then fail("fit", "memory_budget: %s", (tostring(p):gsub("^.-memory%.plan: ", ""))) end
    plan = p
    rawset(self, "_memory_plan", plan)
  end
  return mg.memory.with_plan(plan, self.train_step, self, xb, yb)
end

local function run_fit (self, x, y, o, c)
  local who = "fit"
  local n = x.shape[1]
  local xv, yv
  if o.validation_data then
    xv, yv = check_pair(who, o.validation_data[1], o.validation_data[2], "validation_data[1]", "validation_data[2]")
  elseif o.validation_split > 0 then
    local keep = math.floor(n * (1 - o.validation_split))     -- Keras: the last samples, before shuffling
    if keep < 1 or keep >= n then
      fail(who, "validation_split %s of %d samples leaves %d for training and %d for validation; both need one", o.validation_split,
           n, keep, n - keep)
    end
    xv, yv = rows(x, keep + 1, n), rows(y, keep + 1, n)
    x, y, n = rows(x, 1, keep), rows(y, 1, keep), keep
  end
  local bs = o.batch_size
  local steps = (n + bs - 1) // bs
  local verbose = o.verbose == "auto" and 1 or o.verbose
  -- distributed: each global batch (bs samples per rank) is cut among the ranks;
  -- the gradients and the logs are the whole batch's (moongrad.distributed)
  local dist, rank, nranks = o.distributed and require("moongrad.distributed")
  if dist then
    rank, nranks = dist.rank(), dist.size()
    steps = dist.steps(n, bs, nranks)
    if rank ~= 0 then verbose = 0 end                 -- the progress bar on rank 0 only
    dist.broadcast_variables(self.variables)          -- rank 0's weights everywhere
    dist.broadcast_optimizer_state(self.optimizer, self.trainable_variables)   -- and its optimizer's slots
    self.optimizer:mark_synced(self.trainable_variables)
  end
  local names = metric_names(c)
  local columns = table.move(names, 1, #names, 1, {})
  if xv then for _, k in ipairs(names) do columns[#columns + 1] = "val_" .. k end end

  local cbs = check_callbacks(who, o.callbacks)
  if verbose > 0 and not has_progbar(cbs) then table.insert(cbs, 1, ProgbarLogger{verbose = verbose}) end
  local history = History()
  cbs[#cbs + 1] = history
  local input_shape = x.shape
  input_shape[1] = nil                                -- for a callback that builds the model (a nil batch)
  local params = {epochs = o.epochs, steps = steps, verbose = verbose, metrics = columns,
                  input_shape = input_shape, input_dtype = x.dtype}
  for _, cb in ipairs(cbs) do
    if cb.set_model then cb:set_model(self) end
    if cb.set_params then cb:set_params(params) end
  end

  self.stop_training = false
  self.history = history
  local logs, warned_nan = {}, false
  -- the order of epoch e: mg.data.permutation(n, seed, e), as a Dataset shuffles
  local permutation = o.shuffle and require("moongrad.data").permutation
  call(cbs, "on_train_begin", {})
  -- after on_train_begin: a callback that restores a run (BackupAndRestore)
  -- puts back mg.random's state, and says the epoch it had reached
  local seed = o.seed or mg.random.get_state().seed
  if dist then seed = dist.seed_of(seed) end          -- one order of the samples for every rank
  local start = rawget(self, "_resume_epoch") or o.initial_epoch
  rawset(self, "_resume_epoch", nil)
  for epoch = start + 1, o.epochs do
    call(cbs, "on_epoch_begin", epoch, {})
    local order = permutation and permutation(n, seed, epoch) or nil
    local m = meter()
    for i = 1, steps do
      call(cbs, "on_batch_begin", i, {})
      local xb, yb, size, step_logs
      if dist then
        local a, b, len = dist.shard(i, bs, nranks, rank, n)
        xb, yb = batch(x, y, i, bs, n, order, a, b)
        self.optimizer.grad_scale = (b - a + 1) * nranks / len   -- this rank's share of the batch
        step_logs = planned_step(self, xb, yb, o)
        if not is_plain(step_logs) then fail(who, "train_step must return a table of logs, got %s", show(step_logs)) end
        step_logs, size = dist.average_logs(step_logs, b - a + 1, len), len
      else
        xb, yb, size = batch(x, y, i, bs, n, order)
        step_logs = planned_step(self, xb, yb, o)
      end
      if not is_plain(step_logs) then fail(who, "train_step must return a table of logs, got %s", show(step_logs)) end
      m.add(step_logs, size)
      if not warned_nan and invalid(step_logs.loss) then warned_nan = warn_nan(cbs, epoch, i) end
      call(cbs, "on_batch_end", i, m.means())
      if self.stop_training then break end
    end
    logs = m.means()
    if xv then
      local val = check.within("fit: validation_data", evaluate_batches, self, xv, yv, o.validation_batch_size or bs)
      for k, v in pairs(val) do logs["val_" .. k] = v end
    end
    call(cbs, "on_epoch_end", epoch, logs)
    if self.stop_training then break end
  end
  call(cbs, "on_train_end", logs)
  return history
end

--- model:fit(x, y [, {epochs=1, batch_size=32, validation_data={x, y} | validation_split=0,
-- validation_batch_size=, shuffle=true, callbacks={}, recompute=false, verbose="auto",
-- initial_epoch=0, seed=, distributed=false, shard=0}]): trains on x, y (tensors whose first axes are the
-- samples) and returns a History (history.history.loss, ...). recompute runs
-- the model's forward under mg.recompute_grad (the tape keeps only the input).
-- verbose: 0 silent, 1 the progress bar, 2 one line per epoch. distributed
-- trains data-parallel on the ranks of mg.distributed: batch_size samples per
-- rank, gradients and logs averaged over the ranks (moongrad.distributed);
-- shard = 1 or 2 shards the optimizer's state (and with 2 the gradients) over
-- them, as ZeRO (mg.distributed.ShardedOptimizer).
local function fit_method (self, x, y, opts)
  local who = "fit"
  local c = compiled(self, who)
  x, y = check_pair(who, x, y, "x", "y")
  local o = check.options(who, opts, FIT)
  if o.validation_data and o.validation_split > 0 then fail(who, "give validation_data or validation_split, not both") end
  if x.shape[1] == 0 then fail(who, "x has no samples") end
  if o.shard > 0 and not o.distributed then fail(who, "shard = %d needs distributed = true", o.shard) end
  if o.recompute and o.memory_budget then
    fail(who, "give recompute or memory_budget, not both (the budget's plan chooses what to recompute)")
  end
  if o.initial_epoch >= o.epochs then
    fail(who, "initial_epoch (%d) must be below epochs (%d): epochs is the last epoch's number, not a count",
         o.initial_epoch, o.epochs)
  end
  rawset(self, "_train_forward", o.recompute and mg.recompute_grad(self) or nil)
  local precision = o.mixed_precision
  if precision == "float32" then precision = false end
  precision = mixed_precision.autocast_dtype(self, precision)
  if precision then mg.autocast(precision, function() end) end   -- refused here, not after an epoch
  rawset(self, "_autocast", precision)
  local optimizer = self.optimizer
  local scaler = optim._loss_scaler(optimizer)
  if precision == "float16" and not scaler then      -- as Keras' compile under mixed_float16
    if rawget(optimizer, "optimizer") ~= nil then
      fail(who, 'mixed_precision = "float16" with %s: the loss scale must sit inside it '
                .. "(DistributedOptimizer(LossScaleOptimizer(opt))), or compile with the plain optimizer and "
                .. "fit{distributed = true}", tostring(optimizer))
    end
    scaler = loss_scalers[optimizer] or optim.LossScaleOptimizer(optimizer)
    loss_scalers[optimizer] = scaler                 -- its scale goes on from one fit to the next
    optim._resume_loss_scale(scaler)                 -- or from a checkpoint restored into the optimizer
    self.optimizer = scaler
  end
  rawset(self, "_loss_scaler", scaler)
  if o.distributed then                              -- for this fit: gradients averaged over the ranks
    local dist = require "moongrad.distributed"
    if not dist.is_initialized() then
      fail(who, "distributed = true needs mg.distributed.init() first (and the program started with mpirun)")
    end
    self.optimizer = o.shard > 0 and dist.ShardedOptimizer(self.optimizer, {stage = o.shard})
                     or dist.DistributedOptimizer(self.optimizer)   -- around the loss scale, if any
  end
  rawset(self, "_memory_plan", nil)
  local ok, history = pcall(check.within, who, run_fit, self, x, y, o, c)   -- errors say "fit: "
  rawset(self, "_memory_plan", nil)
  rawset(self, "_train_forward", nil)
  rawset(self, "_autocast", nil)
  rawset(self, "_loss_scaler", nil)
  self.optimizer = optimizer
  if not ok then error(history, 0) end
  return history
end

local EVALUATE = {{"batch_size", batch_size_rule, 32}, {"verbose", verbose_rule, "auto"}}

--- model:evaluate(x, y [, {batch_size=32, verbose="auto"}]): the loss and the
-- metrics over x, y in inference mode, as a table {loss =, accuracy =, ...}
-- (Keras' return_dict form). verbose 1 draws a bar, 2 one line, 0 nothing.
local function evaluate (self, x, y, opts)
  local who = "evaluate"
  local c = compiled(self, who)
  x, y = check_pair(who, x, y, "x", "y")
  local o = check.options(who, opts, EVALUATE)
  if x.shape[1] == 0 then fail(who, "x has no samples") end
  local verbose = o.verbose == "auto" and 1 or o.verbose
  local steps = (x.shape[1] + o.batch_size - 1) // o.batch_size
  local bar
  if verbose > 0 then
    bar = ProgbarLogger{verbose = verbose}
    bar:set_params({steps = steps, verbose = verbose, metrics = metric_names(c)})
    bar:start(steps)
  end
  local logs = check.within(who, evaluate_batches, self, x, y, o.batch_size,
                            bar and function(i, running) bar:on_batch_end(i, running) end)
  if bar then bar:on_epoch_end(nil, logs) end
  return logs
end

local PREDICT = {{"batch_size", batch_size_rule, 32}, {"verbose", verbose_rule, 0}}

--- model:predict(x [, {batch_size=32, verbose=0}]): the model's outputs for x,
-- batch by batch in inference mode, concatenated along the first axis.
local function predict (self, x, opts)
  local who = "predict"
  x = check_inputs(who, "x", x)
  local o = check.options(who, opts, PREDICT)
  local n = x.shape[1]
  if n == 0 then fail(who, "x has no samples") end
  local bs = o.batch_size
  local steps = (n + bs - 1) // bs
  local verbose = o.verbose == "auto" and 1 or o.verbose
  local bar = verbose > 0 and mg.progress(steps, {verbose = verbose}) or nil
  local outs = {}
  check.within(who, fit.inference, self, function()
    for i = 1, steps do
      local xb = batch(x, nil, i, bs, n)
      local out = mixed_precision.run(autocast_of(self), self, xb)
      if not check.is_array(out) then fail(who, "the model gave %s; predict needs a tensor", show(out)) end
      outs[i] = mg.is_variable(out) and out:value() or out
      if outs[i].dtype == "bfloat16" then outs[i] = outs[i]:cast("float32") end   -- a mixed policy's outputs
      if bar then bar:update(i) end
    end
  end)
  if bar then bar:finish() end
  return #outs == 1 and outs[1] or mg.concat(outs, 1)
end

-- }=============================================================

--- the methods of every layer (mg.nn copies them into Layer on first use)
fit.layer_methods = {compile = compile, fit = fit_method, evaluate = evaluate, predict = predict,
                     train_step = train_step, test_step = test_step}

return check.export(fit)          -- errors name the user's line (moongrad.check)

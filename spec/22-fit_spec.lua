-- compile, fit, evaluate, predict, the callbacks, resuming, and the examples
-- that train through fit.
local mg = require "moongrad"
local h = require "helpers"
local nn = mg.nn

local function err (fn, msg) assert.has_error(fn, msg) end

-- a writer that keeps what is written
local function sink ()
  local out = {buf = {}}
  function out:write (...) for _, s in ipairs({...}) do self.buf[#self.buf + 1] = s end return self end
  function out:flush () end
  function out:text () return table.concat(self.buf) end
  return out
end

local function untimed (s)
  return (s:gsub(" %- %d+s %d+[mu]?s/step", " - Ts T/step"):gsub(" %- %d+s %- %d+[mu]?s/step", " - Ts - T/step"))
end

local quiet = {verbose = 0}

-- three separable blobs: x (60, 2), labels (60) 1..3
local function blobs (n)
  n = n or 60
  local centers = mg.constant({{-3, 0}, {3, 0}, {0, 3}})
  local labels = mg.cast(mg.arange(n) % 3, "int64") + 1
  return mg.gather(centers, labels) + mg.random.normal({n, 2}, 0, 0.5), labels
end

local function classifier (dropout)
  return nn.Sequential{nn.Dense(16, "tanh"), nn.Dropout(dropout or 0), nn.Dense(3)}
end

local function compiled (model, opt)
  return model:compile{optimizer = opt or mg.optim.Adam{learning_rate = 0.05},
                       loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}, metrics = {"accuracy"}}
end

describe("fit", function()
  before_each(function() mg.random.seed(1) end)

  it("trains: the loss falls, the history has one entry per epoch", function()
    local x, y = blobs()
    local model = compiled(classifier())
    local history = model:fit(x, y, {epochs = 5, batch_size = 16, verbose = 0})
    local loss = history.history.loss
    assert.equal(5, #loss)
    assert.is_true(loss[5] < loss[1] / 2, table.concat(loss, " "))
    assert.same({1, 2, 3, 4, 5}, history.epoch)
    assert.same({"accuracy", "loss"}, (function()
      local keys = {}
      for k in pairs(history.history) do keys[#keys + 1] = k end
      table.sort(keys)
      return keys
    end)())
    assert.same({epochs = 5, steps = 4, verbose = 0, metrics = {"loss", "accuracy"}, input_shape = {nil, 2},
                 input_dtype = "float32"}, history.params)   -- the input, for a callback that builds the model
    assert.equal(history, model.history)
    assert.equal(model.optimizer, rawget(model, "optimizer"))
    assert.is_true(model:evaluate(x, y, quiet).accuracy > 0.9)
  end)

  it("names optimizers, losses and metrics as Keras does", function()
    local x = mg.random.normal({20, 3})
    local y = mg.matmul(x, mg.constant({{1}, {-2}, {0.5}})) + 1
    local model = nn.Sequential{nn.Dense(1)}
    model:compile{optimizer = "sgd", loss = "mse", metrics = {"mae", double = function(t, p) return 2 end}}
    assert.equal("SGD", model.optimizer.name)
    local history = model:fit(x, y, {epochs = 3, verbose = 0})
    assert.same({2, 2, 2}, history.history.double)
    assert.equal(3, #history.history.mae)
    for _, name in ipairs({"adam", "AdamW", "rmsprop"}) do
      assert.equal(mg.optim[({adam = "Adam", AdamW = "AdamW", rmsprop = "RMSprop"})[name]],
                   getmetatable(model:compile{optimizer = name, loss = "mse"}.optimizer))
    end
    model:compile{loss = function(t, p) return mg.mean(mg.abs(t - p)) end, metrics = {function() return 1 end}}
    assert.equal("RMSprop", model.optimizer.name)                     -- Keras' default
    assert.same({1}, model:fit(x, y, quiet).history.metric_1)
  end)

  it("validation_split holds out the last samples (before shuffling); validation_data too", function()
    local x, y = blobs(50)
    local model = compiled(classifier())
    local history = model:fit(x, y, {epochs = 1, batch_size = 8, validation_split = 0.2, verbose = 0})
    assert.equal(5, history.params.steps)                             -- 40 samples for training
    local held = model:evaluate(x:slice({41, 50}), y:slice({41, 50}), {batch_size = 8, verbose = 0})
    assert.equal(held.loss, history.history.val_loss[1])
    assert.equal(held.accuracy, history.history.val_accuracy[1])
    history = model:fit(x, y, {epochs = 1, validation_data = {x:slice({1, 7}), y:slice({1, 7})}, verbose = 0,
                               validation_batch_size = 4})
    assert.equal(model:evaluate(x:slice({1, 7}), y:slice({1, 7}), {batch_size = 4, verbose = 0}).loss,
                 history.history.val_loss[1])
    assert.same({"loss", "accuracy", "val_loss", "val_accuracy"}, history.params.metrics)
  end)

  it("shuffles by (seed, epoch) alone and leaves mg.random's stream where it was", function()
    local x = mg.arange(10):reshape{10, 1}
    local y = mg.zeros{10, 1}
    local model = nn.Sequential{nn.Dense(1)}
    model:compile{optimizer = "sgd", loss = "mse"}
    local seen = {}
    model.train_step = function(_, xb) seen[#seen + 1] = xb:totable()[1][1]; return {loss = 0} end
    local before = mg.random.get_state()
    model:fit(x, y, {epochs = 3, batch_size = 10, verbose = 0, seed = 7})
    assert.same(before, mg.random.get_state())
    for e = 1, 3 do assert.equal(mg.data.permutation(10, 7, e):totable()[1] - 1, seen[e]) end
    assert.is_false(seen[1] == seen[2] and seen[2] == seen[3])
    -- the default seed is mg.random's: the same orders after mg.random.seed(7)
    mg.random.seed(7)
    local again = seen
    seen = {}
    model:fit(x, y, {epochs = 3, batch_size = 10, verbose = 0})
    assert.same(again, seen)
    -- shuffle = false: in order
    seen = {}
    model:fit(x, y, {epochs = 2, batch_size = 4, shuffle = false, verbose = 0})
    assert.same({0, 4, 8, 0, 4, 8}, seen)
  end)

  it("resumed at initial_epoch, gives the uninterrupted run's curve bit for bit", function()
    local x, y = blobs(48)
    local function new_model ()
      mg.random.seed(3)
      local m = compiled(classifier(0.3), mg.optim.AdamW{learning_rate = 0.02})
      m(x:slice({1, 2}))                                              -- build (the initializers' stream)
      mg.random.seed(3)
      return m
    end
    local whole = new_model():fit(x, y, {epochs = 4, batch_size = 10, validation_split = 0.25, verbose = 0})
    -- the first two epochs, then what a checkpoint keeps: weights, optimizer state, mg.random's state
    local first = new_model()
    local part = first:fit(x, y, {epochs = 2, batch_size = 10, validation_split = 0.25, verbose = 0})
    local weights = {}
    for i, v in ipairs(first.variables) do weights[i] = v:value() end
    local opt_state = first.optimizer:get_state(first.trainable_variables)
    local rng = mg.random.get_state()
    -- a fresh model and optimizer, restored, continue at epoch 3
    mg.random.seed(99)
    local second = new_model()
    for i, v in ipairs(second.variables) do v:assign(weights[i]) end
    second.optimizer:set_state(opt_state, second.trainable_variables)
    mg.random.set_state(rng)
    local rest = second:fit(x, y, {epochs = 4, batch_size = 10, validation_split = 0.25, verbose = 0,
                                   initial_epoch = 2})
    assert.same({3, 4}, rest.epoch)
    for _, k in ipairs({"loss", "accuracy", "val_loss", "val_accuracy"}) do
      assert.same(whole.history[k], {part.history[k][1], part.history[k][2], rest.history[k][1], rest.history[k][2]})
    end
  end)

  it("recompute = true trains exactly as without (dropout masks replayed)", function()
    local x, y = blobs(30)
    local histories = {}
    for i, recompute in ipairs({false, true}) do
      mg.random.seed(5)
      local model = compiled(classifier(0.5))
      histories[i] = model:fit(x, y, {epochs = 2, batch_size = 10, recompute = recompute, verbose = 0}).history.loss
      assert.is_nil(rawget(model, "_train_forward"))
    end
    assert.same(histories[1], histories[2])
  end)

  it("evaluate and predict run in inference mode (dropout off), batch by batch", function()
    local x, y = blobs(25)
    local model = compiled(classifier(0.9))
    model:fit(x, y, {epochs = 1, verbose = 0})
    local out = model:predict(x, {batch_size = 7})
    assert.same({25, 3}, out.shape)
    h.assert_close(out, model(x, false), 1e-6)
    assert.is_true(model.layers[2].training)                         -- restored afterwards
    local a = model:evaluate(x, y, {batch_size = 4, verbose = 0})
    local b = model:evaluate(x, y, {batch_size = 25, verbose = 0})
    h.assert_close(a.loss, b.loss, 1e-6)
    assert.equal(a.accuracy, b.accuracy)
    -- a failing forward still restores the flags
    local bad = nn.Sequential{nn.Dropout(0.5), nn.Lambda(function() error("boom", 0) end)}
    bad:compile{loss = "mse"}
    err(function() bad:predict(x) end, "boom")
    assert.is_true(bad.layers[1].training)
  end)

  it("a 1-D x is N samples of one feature (Keras' expand_1d), in fit, evaluate and predict", function()
    local x = mg.constant({-2, -1, 1, 2, 3})
    local y = mg.constant({-4, -2, 2, 4, 6})
    local model = nn.Sequential{nn.Dense(1)}
    model:compile{optimizer = "sgd", loss = "mse"}
    model:fit(x, mg.reshape(y, {5, 1}), {epochs = 2, batch_size = 2, verbose = 0})
    local out = model:predict(mg.constant({1, 2, 3}))
    assert.same({3, 1}, out.shape)                                  -- 3 samples, not 1 of 3 features
    h.assert_close(out, model(mg.constant({{1}, {2}, {3}})), 0)
    assert.same({5, 1}, model:predict(x, {batch_size = 2}).shape)
    assert.is_number(model:evaluate(x, mg.reshape(y, {5, 1}), {verbose = 0}).loss)
  end)

  it("writes Keras' lines into a pipe: Epoch i/n, then the final bar", function()
    local x, y = blobs(30)
    local model = compiled(classifier())
    local out = sink()
    model:fit(x, y, {epochs = 2, batch_size = 16, validation_split = 0.2,
                     callbacks = {mg.callbacks.ProgbarLogger{out = out, tty = false}}})
    local lines = {}
    for line in untimed(out:text()):gmatch("[^\n]*\n") do lines[#lines + 1] = line end
    assert.equal(4, #lines)
    assert.equal("Epoch 1/2\n", lines[1])
    assert.truthy(lines[2]:find("^2/2 %[==============================%] %- Ts T/step %- loss: %d%.%d%d%d%d %- "
                                .. "accuracy: %d%.%d%d%d%d %- val_loss: %d%.%d%d%d%d %- val_accuracy: %d%.%d%d%d%d\n$"),
                  lines[2])
    assert.equal("Epoch 2/2\n", lines[3])
    assert.is_nil(out:text():find("\r", 1, true))
    -- verbose = 2: the short line
    out = sink()
    model:fit(x, y, {epochs = 1, callbacks = {mg.callbacks.ProgbarLogger{out = out, verbose = 2}}})
    assert.truthy(untimed(out:text()):find("^Epoch 1/1\n1/1 %- Ts %- T/step %- loss: [%d.]+ %- accuracy: [%d.]+\n$"))
  end)

  it("on a terminal, redraws each batch and writes the final line once", function()
    local x, y = blobs(40)
    local model = compiled(classifier())
    local out = sink()
    local bar = mg.callbacks.ProgbarLogger{out = out, tty = true}
    model:fit(x, y, {epochs = 1, batch_size = 10, callbacks = {bar}})
    local text = untimed(out:text())
    assert.truthy(text:find("^Epoch 1/1\n\r1/4 %[======>"))
    local _, finals = text:gsub("4/4 %[=+%] %- Ts T/step", "")
    assert.equal(1, finals)
    assert.equal("\n", text:sub(-1))
  end)
end)

describe("callbacks", function()
  before_each(function() mg.random.seed(2) end)

  it("are called in order, with 1-based epochs and batches and running logs", function()
    local x, y = blobs(20)
    local model = compiled(classifier())
    local events = {}
    local function recorder (tag)
      local cb = {}
      for _, hook in ipairs({"on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_batch_begin",
                             "on_batch_end"}) do
        cb[hook] = function(self, a, logs)
          assert.equal(cb, self)
          local what = type(a) == "number" and ("%s %s(%d)"):format(tag, hook, a) or ("%s %s"):format(tag, hook)
          if (hook == "on_epoch_end" or hook == "on_batch_end") then
            assert.is_number(logs.loss)
            assert.is_number(logs.accuracy)
          end
          events[#events + 1] = what
        end
      end
      cb.set_model = function(_, m) events[#events + 1] = tag .. " set_model"; assert.equal(model, m) end
      cb.set_params = function(_, p) events[#events + 1] = ("%s set_params %d %d"):format(tag, p.epochs, p.steps) end
      return cb
    end
    model:fit(x, y, {epochs = 3, initial_epoch = 1, batch_size = 10, verbose = 0,
                     callbacks = {recorder("a"), recorder("b")}})
    local want = {"a set_model", "a set_params 3 2", "b set_model", "b set_params 3 2", "a on_train_begin",
                  "b on_train_begin"}
    for epoch = 2, 3 do
      want[#want + 1] = ("a on_epoch_begin(%d)"):format(epoch)
      want[#want + 1] = ("b on_epoch_begin(%d)"):format(epoch)
      for b = 1, 2 do
        for _, hook in ipairs({"on_batch_begin", "on_batch_end"}) do
          want[#want + 1] = ("a %s(%d)"):format(hook, b)
          want[#want + 1] = ("b %s(%d)"):format(hook, b)
        end
      end
      want[#want + 1] = ("a on_epoch_end(%d)"):format(epoch)
      want[#want + 1] = ("b on_epoch_end(%d)"):format(epoch)
    end
    want[#want + 1] = "a on_train_end"
    want[#want + 1] = "b on_train_end"
    assert.same(want, events)
  end)

  it("LambdaCallback calls plain functions; stop_training stops after the batch", function()
    local x, y = blobs(40)
    local model = compiled(classifier())
    local batches, epochs = {}, {}
    local cb = mg.callbacks.LambdaCallback{
      on_batch_end = function(b, logs)
        batches[#batches + 1] = b
        if b == 2 then model.stop_training = true end
        assert.is_number(logs.loss)
      end,
      on_epoch_end = function(e, logs) epochs[#epochs + 1] = e; assert.is_number(logs.loss) end,
    }
    local history = model:fit(x, y, {epochs = 5, batch_size = 10, verbose = 0, callbacks = {cb}})
    assert.same({1, 2}, batches)
    assert.same({1}, epochs)                                      -- the epoch still ends
    assert.same({1}, history.epoch)
    assert.is_false(model:fit(x, y, {epochs = 1, verbose = 0}).history.loss == nil)   -- reset at the start
  end)

  -- a model whose train_step reports a scripted loss per epoch and writes the
  -- epoch into its one variable, to follow what EarlyStopping restores
  local function scripted (losses)
    local model = nn.Sequential{nn.Dense(1, {use_bias = false})}
    model(mg.ones{1, 1})
    model:compile{optimizer = "sgd", loss = "mse"}
    local epoch = 0
    model.train_step = function(self)
      epoch = epoch + 1
      self.variables[1]:assign(mg.full({1, 1}, epoch))
      return {loss = losses[epoch], accuracy = 1 - losses[epoch]}
    end
    return model
  end

  it("EarlyStopping stops after patience epochs without improvement and restores the best weights", function()
    local x, y = mg.ones{4, 1}, mg.ones{4, 1}
    local model = scripted({5, 3, 3.5, 4, 2.9999, 1, 1})
    local history = model:fit(x, y, {epochs = 7, batch_size = 4, verbose = 0, callbacks = {
      mg.callbacks.EarlyStopping{monitor = "loss", patience = 2, min_delta = 0.01, restore_best_weights = true}}})
    assert.same({1, 2, 3, 4}, history.epoch)                        -- 3.5 and 4 do not improve on 3
    assert.same({{2}}, model.variables[1]:value():totable())        -- epoch 2's weights
    -- mode max for accuracy (auto); min_delta swallows 2.9999 vs 3
    model = scripted({5, 3, 3.5, 4, 2.9999, 1, 1})
    history = model:fit(x, y, {epochs = 7, batch_size = 4, verbose = 0, callbacks = {
      mg.callbacks.EarlyStopping{monitor = "accuracy", patience = 3, min_delta = 0.01}}})
    assert.same({1, 2, 3, 4, 5}, history.epoch)
    -- restore_best_weights when training ran every epoch: the best was epoch 6
    model = scripted({5, 3, 3.5, 4, 2.9999, 1, 1.5})
    model:fit(x, y, {epochs = 7, batch_size = 4, verbose = 0, callbacks = {
      mg.callbacks.EarlyStopping{monitor = "loss", patience = 5, restore_best_weights = true}}})
    assert.same({{6}}, model.variables[1]:value():totable())
  end)

  it("EarlyStopping names what the logs have when its monitor is missing", function()
    local x, y = blobs(10)
    local model = compiled(classifier())
    err(function() model:fit(x, y, {verbose = 0, callbacks = {mg.callbacks.EarlyStopping()}}) end,
        "fit: EarlyStopping: monitor 'val_loss' is not in the logs (they have: accuracy, loss); "
        .. "fit needs validation_data or validation_split for it")
    err(function() mg.callbacks.EarlyStopping{patience = -1} end,
        "EarlyStopping: option 'patience' must be an integer >= 0, got -1")
    err(function() mg.callbacks.EarlyStopping{mode = "up"} end,
        "EarlyStopping: option 'mode' must be 'auto', 'min' or 'max', got 'up'")
  end)

  it("TerminateOnNaN stops at the first batch whose loss is not finite", function()
    local x, y = mg.ones{30, 1}, mg.ones{30, 1}
    local model = nn.Sequential{nn.Dense(1)}
    model:compile{optimizer = "sgd", loss = "mse"}
    local n = 0
    model.train_step = function() n = n + 1; return {loss = n == 2 and 0 / 0 or 1} end
    local history = model:fit(x, y, {epochs = 3, batch_size = 10, verbose = 0,
                                     callbacks = {mg.callbacks.TerminateOnNaN{verbose = 0}}})
    assert.equal(2, n)
    assert.same({1}, history.epoch)
  end)

  it("a loss gone NaN says so once on stderr, and training goes on", function()
    local out, code = h.run(h.bin .. [[ -e '
      local model = mg.nn.Sequential{mg.nn.Dense(1)}
      model:compile{optimizer = "sgd", loss = "mse"}
      local n = 0
      model.train_step = function() n = n + 1; return {loss = n >= 2 and 0 / 0 or 1} end
      model:fit(mg.ones{30, 1}, mg.ones{30, 1}, {epochs = 2, batch_size = 10, verbose = 0})
      print("steps", n)' 2>&1]])
    assert.equal(0, code, out)
    local _, count = out:gsub("fit: the loss is not a finite number at epoch 1, batch 2; training goes on", "")
    assert.equal(1, count, out)
    assert.truthy(out:find("TerminateOnNaN()", 1, true), out)
    assert.truthy(out:find("steps\t6", 1, true), out)
  end)

  it("mg.callbacks lists fit's callbacks and the checkpoint one", function()
    for _, name in ipairs({"EarlyStopping", "LambdaCallback", "TerminateOnNaN", "ProgbarLogger", "History"}) do
      assert.is_table(mg.callbacks[name])
    end
    local checkpoint = require "moongrad.checkpoint"
    assert.equal(checkpoint.callback, mg.callbacks.ModelCheckpoint)
  end)
end)

describe("compile and fit check their arguments", function()
  local x, y = mg.ones{6, 2}, mg.constant({1, 2, 3, 1, 2, 3}, "int64")
  local function model () return compiled(classifier()) end

  it("compile", function()
    local m = classifier()
    local cases = {
      {function() m:compile{loss = "sparse_categorical_crossentropi"} end, "compile: unknown loss "
        .. "'sparse_categorical_crossentropi' (did you mean 'sparse_categorical_crossentropy'? known: mean_squared_error, "
        .. "mean_absolute_error, binary_crossentropy, categorical_crossentropy, sparse_categorical_crossentropy, mse, mae)"},
      {function() m:compile{loss = "mse", metrics = {"acuracy"}} end, "compile: unknown metric 'acuracy' (did you mean "
        .. "'accuracy'? known: accuracy, binary_accuracy, categorical_accuracy, sparse_categorical_accuracy, "
        .. "mean_squared_error, mean_absolute_error, perplexity, acc, mse, mae)"},
      {function() m:compile{loss = "mse", optimizer = "adamax"} end,
       "compile: unknown optimizer 'adamax' (did you mean 'adam'? known: sgd, adam, adamw, rmsprop)"},
      {function() m:compile{loss = "mse", optimizer = {}} end, "compile: optimizer must be an optimizer "
        .. "(mg.optim.Adam{...}) or its name ('adam', 'sgd', ...), got a table"},
      {function() m:compile{loss = 3} end, "compile: option 'loss' must be a loss name or a function(y_true, y_pred), got 3"},
      {function() m:compile{los = "mse"} end,
       "compile: unknown option 'los' (did you mean 'loss'? known: optimizer, loss, metrics)"},
      {function() m:compile{loss = "mse", metrics = {"mae", "mae"}} end,
       "compile: two metrics are named 'mae'; name them apart: metrics = {other_name = fn}"},
      {function() m:fit(x, y) end, "fit: the model is not compiled; call model:compile{optimizer =, loss =} first"},
      {function() m:evaluate(x, y) end,
       "evaluate: the model is not compiled; call model:compile{optimizer =, loss =} first"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
  end)

  it("errors raised inside fit, evaluate and predict say so first", function()
    local function mse_model (loss)
      local m = nn.Sequential{nn.Dense(2)}
      m:compile{optimizer = "sgd", loss = loss or "mse"}
      m(mg.ones{1, 3})
      return m
    end
    local m, xs, ys, q = mse_model(), mg.ones{8, 3}, mg.ones{8, 2}, {verbose = 0}
    local function val (vx, vy) return {verbose = 0, validation_data = {vx, vy}} end
    local cases = {
      {function() m:fit(xs, mg.ones{8, 5}, q) end,
       "fit: mean_squared_error: y_true has shape (8,5) but y_pred has shape (8,2); they must match exactly"},
      {function() m:fit(mg.ones{8, 4}, ys, q) end, "fit: Dense: input has 4 features (its last axis), the layer was built for 3"},
      {function() m:fit(mg.ones({8, 3}, "int64"), ys, q) end, "fit: Dense: input must be a float tensor, got int64"},
      {function() m:fit(xs, mg.zeros({8, 2}, "int64"), q) end, "fit: mean_squared_error: y_true must be a float tensor, got int64"},
      {function() m:fit(xs, ys, val(mg.ones{4, 5}, mg.ones{4, 2})) end,
       "fit: validation_data: Dense: input has 5 features (its last axis), the layer was built for 3"},
      {function() m:fit(xs, ys, val(mg.ones{4, 3}, mg.ones{4, 7})) end,
       "fit: validation_data: mean_squared_error: y_true has shape (4,7) but y_pred has shape (4,2); they must match exactly"},
      {function() mse_model("sparse_categorical_crossentropy"):fit(xs, ys, q) end,
       "fit: sparse_categorical_crossentropy: y_true must be int64 class numbers (1-based), got float32; one-hot targets "
       .. "go to categorical_crossentropy"},
      {function() m:fit(xs, ys, {verbose = 0, callbacks = {mg.callbacks.EarlyStopping{monitor = "val_los"}}}) end,
       "fit: EarlyStopping: monitor 'val_los' is not in the logs (they have: loss); fit needs validation_data or "
       .. "validation_split for it"},
      {function() m:evaluate(xs, mg.ones{8, 5}, q) end,
       "evaluate: mean_squared_error: y_true has shape (8,5) but y_pred has shape (8,2); they must match exactly"},
      {function() m:predict(mg.ones{8, 4}) end, "predict: Dense: input has 4 features (its last axis), the layer was built for 3"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
    -- the user's own error, from a callback, is theirs: its message and line unchanged
    local line = debug.getinfo(1, "l").currentline + 1
    local mine = {on_epoch_end = function() error("mine") end}
    local ok, e = pcall(function() m:fit(xs, ys, {verbose = 0, callbacks = {mine}}) end)
    assert.is_false(ok)
    assert.equal(("%s:%d: mine"):format(debug.getinfo(1, "S").short_src, line), e)
  end)

  it("fit, evaluate and predict", function()
    local m = model()
    local cases = {
      {function() m:fit(x, y, {epoch = 3}) end, "fit: unknown option 'epoch' (did you mean 'epochs'? known: epochs, "
        .. "batch_size, validation_data, validation_split, validation_batch_size, shuffle, callbacks, recompute, "
        .. "verbose, initial_epoch, seed, distributed, mixed_precision, shard, memory_budget)"},
      {function() m:fit(x, y, {batch_size = 0}) end, "fit: option 'batch_size' must be a positive integer, got 0"},
      {function() m:fit(x, y, {validation_split = 1}) end, "fit: option 'validation_split' must be a number in [0, 1), got 1"},
      {function() m:fit(x, y, {validation_split = 0.9}) end, "fit: validation_split 0.9 of 6 samples leaves 0 for "
        .. "training and 6 for validation; both need one"},
      {function() m:fit(x, y, {validation_split = 0.5, validation_data = {x, y}}) end,
       "fit: give validation_data or validation_split, not both"},
      {function() m:fit(x, y, {validation_data = {x}}) end,
       "fit: option 'validation_data' must be a list {x, y} of tensors, got a table"},
      {function() m:fit(x, y:slice({1, 5})) end, "fit: x has 6 samples but y has 5 (their first axes must match)"},
      {function() m:fit({1, 2}, y) end, "fit: x must be a tensor, got a table"},
      {function() m:fit(x, mg.constant(1)) end, "fit: y must have a first axis of samples, got shape ()"},
      {function() m:fit(x, y, {epochs = 2, initial_epoch = 2}) end,
       "fit: initial_epoch (2) must be below epochs (2): epochs is the last epoch's number, not a count"},
      {function() m:fit(x, y, {verbose = 3}) end, "fit: option 'verbose' must be 0, 1, 2 or 'auto', got 3"},
      {function() m:fit(x, y, {callbacks = {{on_epoch_ned = print}}}) end, "fit: callbacks[1] has 'on_epoch_ned', "
        .. "which is not a hook (did you mean 'on_epoch_end'? known: on_train_begin, on_train_end, on_epoch_begin, "
        .. "on_epoch_end, on_batch_begin, on_batch_end)"},
      {function() m:fit(x, y, {callbacks = {{on_epoch_end = 3}}}) end,
       "fit: callbacks[1].on_epoch_end must be a function, got 3"},
      {function() m:fit(x, y, {callbacks = {print}}) end,
       "fit: callbacks[1] must be a callback (a table with on_epoch_end, ... methods), got a function"},
      {function() m:fit(x, mg.constant({1, 2, 3, 1, 2, 4}, "int64"), quiet) end,
       "fit: sparse_categorical_crossentropy: y_true must be class numbers in 1..3 (1-based), got 4"},
      {function() m:evaluate(x, y, {batch_size = -1}) end, "evaluate: option 'batch_size' must be a positive integer, got -1"},
      {function() m:predict(mg.zeros{0, 2}) end, "predict: x has no samples"},
      {function() m:predict(x, {verbos = 1}) end,
       "predict: unknown option 'verbos' (did you mean 'verbose'? known: batch_size, verbose)"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
  end)
end)

describe("examples that train with fit", function()
  it("train_mlp.lua: one line per epoch into a pipe, no carriage returns", function()
    local out, code = h.run(h.bin .. " examples/train_mlp.lua 3 | cat")
    assert.equal(0, code, out)
    assert.truthy(out:find("Epoch 3/3\n10/10 [==============================] - ", 1, true), out)
    assert.is_nil(out:find("\r", 1, true))
    local _, bars = out:gsub("10/10 %[", "")
    assert.equal(3, bars)
    local acc = tonumber(out:match("accuracy ([%d.]+)\n$"))
    assert.is_true(acc and acc > 0.85, out)
  end)

  it("a rank of mpirun writes plain lines though its stdout is a pseudo-terminal", function()
    -- Open MPI gives each rank a pty whatever mpirun's stdout is (`mpirun ... > log`);
    -- script(1) gives one here, with and without mpirun's variables
    if os.execute("command -v script >/dev/null 2>&1") ~= true then pending("script(1) not found") return end
    local prog = os.tmpname() .. ".lua"
    local f = assert(io.open(prog, "w"))
    f:write([[
local m = mg.nn.Sequential{mg.nn.Dense(1)}
m:compile{optimizer = "sgd", loss = "mse"}
m:fit(mg.ones(8, 2), mg.ones(8, 1), {epochs = 2, batch_size = 2})
]])
    f:close()
    local function on_a_pty (env)
      local log = os.tmpname()
      local _, code = h.run(("%s script -qec '%s %s' /dev/null > %s"):format(env, h.bin, prog, log))
      local out = assert(io.open(log, "rb")):read("a")
      os.remove(log)
      assert.equal(0, code, out)
      return out
    end
    assert.truthy(on_a_pty(""):find("\r[^\n]"))                   -- a terminal: redrawn in place
    for _, env in ipairs{"OMPI_COMM_WORLD_SIZE=1", "PMIX_RANK=0", "PMI_RANK=0"} do
      local out = on_a_pty(env)
      assert.is_nil(out:find("\r[^\n]", 1), out)                   -- the pty's own \r\n line ends only
      local _, bars = out:gsub("4/4 %[", "")
      assert.equal(2, bars, out)                                     -- one line per epoch
    end
    os.remove(prog)
  end)

  it("train_digits.lua reaches 97% on the digits' test split", function()
    local out, code = h.run(h.bin .. " examples/train_digits.lua")
    if code ~= 0 and out:find("package python3-sklearn is not installed", 1, true) then
      pending("python3-sklearn is not installed and could not be fetched: " .. out:sub(-200))
      return
    end
    assert.equal(0, code, out)
    local last = out:match("([^\n]*)\n$")
    local acc = tonumber(last:match("^test accuracy: (0%.%d%d%d%d)$"))
    assert.is_true(acc ~= nil and acc >= 0.97, out)
  end)

  it("train_fashion_mnist.lua learns in one epoch, and measures what recompute saves", function()
    -- the full run (8 epochs, over 90%) is in docs/training.md; one epoch here
    local out, code = h.run(h.bin .. " examples/train_fashion_mnist.lua --recompute --epochs 1 | cat")
    if code ~= 0 and out:find("package dataset-fashion-mnist is not installed", 1, true) then
      pending("dataset-fashion-mnist is not installed and could not be fetched: " .. out:sub(-200))
      return
    end
    assert.equal(0, code, out)
    local plain, rec = out:match("the tape holds ([%d.]+) MiB plain, ([%d.]+) MiB recomputed")
    assert.is_true(plain ~= nil and tonumber(plain) > 3 * tonumber(rec), out)
    assert.truthy(out:find("training with the conv blocks under recompute_grad", 1, true), out)
    assert.falsy(out:find("\r", 1, true), "a pipe gets no redraws")
    local acc = tonumber(out:match("test accuracy: (0%.%d%d%d%d)\n$"))
    assert.is_true(acc ~= nil and acc >= 0.8, out)
  end)
end)

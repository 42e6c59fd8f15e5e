-- The pure-Lua parts (mg.nn, mg.optim, mg.progress, mg.test) check their
-- arguments: options tables, positional misuse, losses' shapes, optimizers'
-- pairs, layers' inputs. Every message names the function.
local mg = require "moongrad"
local nn = mg.nn

local function err (fn, msg) assert.has_error(fn, msg) end

local function f64 (data) return mg.constant(data, "float64") end

-- {====================== options tables =======================

-- the options every optimizer has after its own
local CLIPS = "weight_decay, clipnorm, clipvalue, global_clipnorm, name"

-- every entry point that takes an options table: who, a call with opts, the known names
local with_options = {
  {"Dense", function(o) return nn.Dense(3, nil, o) end, "activation, use_bias, name"},
  {"Conv2D", function(o) return nn.Conv2D(2, 3, o) end, "strides, padding, dilation_rate, activation, use_bias, kernel_initializer, name"},
  {"MaxPool2D", function(o) return nn.MaxPool2D(2, o) end, "pool_size, strides, padding, name"},
  {"AvgPool2D", function(o) return nn.AvgPool2D(2, o) end, "pool_size, strides, padding, name"},
  {"GlobalAveragePooling2D", function(o) return nn.GlobalAveragePooling2D(o) end, "keepdims, name"},
  {"Flatten", function(o) return nn.Flatten(o) end, "name"},
  {"Reshape", function(o) return nn.Reshape({-1}, o) end, "name"},
  {"Lambda", function(o) return nn.Lambda(mg.tanh, o) end, "name"},
  {"Sequential", function(o) return nn.Sequential({}, o) end, "name, input_shape"},
  {"Dropout", function(o) return nn.Dropout(0.5, o) end, "training, name"},
  {"BatchNorm", function(o) return nn.BatchNorm(o) end, "momentum, epsilon, training, name"},
  {"RevBlock", function(o) return nn.RevBlock(mg.tanh, mg.tanh, o) end, "num_layers, name, f_side_input, g_side_input"},
  {"AffineCoupling", function(o) return nn.AffineCoupling(mg.tanh, o) end, "swap, clamp, name"},
  {"InvertibleLinear", function(o) return nn.InvertibleLinear(o) end, "name"},
  {"Embedding", function(o) return nn.Embedding(5, 3, o) end, "embeddings_initializer, dtype, name"},
  {"PositionalEmbedding", function(o) return nn.PositionalEmbedding(4, o) end, "initializer, name"},
  {"LayerNorm", function(o) return nn.LayerNorm(o) end, "epsilon, center, scale, name"},
  {"MultiHeadAttention", function(o) return nn.MultiHeadAttention(2, 4, o) end,
   "causal, dropout, use_bias, fused, training, name"},
  {"TransformerBlock", function(o) return nn.TransformerBlock(2, 4, o) end,
   "mlp_dim, causal, dropout, activation, epsilon, fused, training, name"},
  {"Layer:add_variable", function(o) return nn.Dense(2):add_variable("w", mg.ones{2}, o) end, "trainable"},
  {"SGD", function(o) return mg.optim.SGD(o) end, "learning_rate, momentum, nesterov, " .. CLIPS},
  {"Adam", function(o) return mg.optim.Adam(o) end, "learning_rate, beta1, beta2, epsilon, " .. CLIPS},
  {"AdamW", function(o) return mg.optim.AdamW(o) end, "learning_rate, beta1, beta2, epsilon, " .. CLIPS},
  {"RMSprop", function(o) return mg.optim.RMSprop(o) end, "learning_rate, rho, momentum, epsilon, centered, " .. CLIPS},
  {"LossScaleOptimizer", function(o) return mg.optim.LossScaleOptimizer(mg.optim.SGD(), o) end,
   "initial_scale, dynamic, dynamic_growth_steps, name"},
  {"progress", function(o) return mg.progress(3, o) end, "label, out, tty, width, interval, unit, verbose"},
  {"gradcheck", function(o) return mg.test.gradcheck(mg.tanh, {f64{0.5}}, o) end, "eps, atol, rtol, seed"},
}

-- the public functions and classes that take no options table
local without_options = {
  Layer = true, dropout = true, glorot_uniform = true, softmax_cross_entropy = true,
  mean_squared_error = true, checkpoint_sequential = true, get = true, schedules = true,
  RecomputeLayer = true, ReversibleLayer = true,
}

describe("options tables", function()
  it("the table below covers every constructor and function of mg.nn and mg.optim", function()
    local listed = {}
    for _, e in ipairs(with_options) do listed[e[1]] = true end
    for _, module in ipairs({nn, mg.optim}) do
      for name in pairs(module) do
        local internal = name:sub(1, 1) == "_"
        assert.is_true(listed[name] or without_options[name] or internal, name .. " is in neither list")
      end
    end
  end)

  for _, e in ipairs(with_options) do
    local who, call, known = e[1], e[2], e[3]
    it(who .. " rejects unknown keys, values without names and non-tables", function()
      err(function() call({bogus_key = 1}) end, ("%s: unknown option 'bogus_key' (known: %s)"):format(who, known))
      err(function() call({[1] = 0.5}) end, who .. ": options are named (name = value), got a value at [1]")
      err(function() call(true) end, who .. ": options must be a table {name = value, ...}, got true")
      err(function() call(nn.Dense(2)) end,
          who .. ": options must be a table {name = value, ...}, got a Dense layer")
      assert.has_no_error(function() call(nil) end)
      assert.has_no_error(function() call({}) end)
    end)
  end

  it("suggest the closest known name for a typo or another library's spelling", function()
    local cases = {
      {function() mg.optim.SGD{learning_rat = 0.5} end, "SGD: unknown option 'learning_rat' "
        .. "(did you mean 'learning_rate'? known: learning_rate, momentum, nesterov, "
        .. "weight_decay, clipnorm, clipvalue, global_clipnorm, name)"},
      {function() mg.optim.SGD{lr = 0.5} end, "SGD: unknown option 'lr' "
        .. "(did you mean 'learning_rate'? known: learning_rate, momentum, nesterov, "
        .. "weight_decay, clipnorm, clipvalue, global_clipnorm, name)"},
      {function() mg.optim.SGD{Momentum = 0.5} end, "SGD: unknown option 'Momentum' "
        .. "(did you mean 'momentum'? known: learning_rate, momentum, nesterov, "
        .. "weight_decay, clipnorm, clipvalue, global_clipnorm, name)"},
      {function() mg.optim.Adam{betta1 = 0.5} end, "Adam: unknown option 'betta1' "
        .. "(did you mean 'beta1'? known: learning_rate, beta1, beta2, epsilon, "
        .. "weight_decay, clipnorm, clipvalue, global_clipnorm, name)"},
      {function() mg.optim.Adam{eps = 1e-8} end, "Adam: unknown option 'eps' "
        .. "(did you mean 'epsilon'? known: learning_rate, beta1, beta2, epsilon, "
        .. "weight_decay, clipnorm, clipvalue, global_clipnorm, name)"},
      {function() mg.optim.Adam{amsgrad = true} end, "Adam: unknown option 'amsgrad' "
        .. "(known: learning_rate, beta1, beta2, epsilon, "
        .. "weight_decay, clipnorm, clipvalue, global_clipnorm, name)"},
      {function() nn.Dense(3, {activaton = "relu"}) end, "Dense: unknown option 'activaton' "
        .. "(did you mean 'activation'? known: activation, use_bias, name)"},
      {function() nn.Dense(3, {use_bais = false}) end, "Dense: unknown option 'use_bais' "
        .. "(did you mean 'use_bias'? known: activation, use_bias, name)"},
      {function() nn.Dense(3, {kernel_initializer = "zeros"}) end, "Dense: unknown option "
        .. "'kernel_initializer' (known: activation, use_bias, name)"},
      {function() nn.BatchNorm{momentun = 0.5} end, "BatchNorm: unknown option 'momentun' "
        .. "(did you mean 'momentum'? known: momentum, epsilon, training, name)"},
      {function() nn.RevBlock(mg.tanh, mg.tanh, {num_layer = 3}) end, "RevBlock: unknown option "
        .. "'num_layer' (did you mean 'num_layers'? known: num_layers, name, f_side_input, g_side_input)"},
      {function() nn.Sequential({}, {nme = "x"}) end, "Sequential: unknown option 'nme' "
        .. "(did you mean 'name'? known: name, input_shape)"},
      {function() mg.progress(10, {lable = "x"}) end, "progress: unknown option 'lable' "
        .. "(did you mean 'label'? known: label, out, tty, width, interval, unit, verbose)"},
      {function() mg.test.gradcheck(mg.tanh, {f64{1}}, {epsilon = 1}) end, "gradcheck: unknown option "
        .. "'epsilon' (did you mean 'eps'? known: eps, atol, rtol, seed)"},
      {function() nn.Dense(2):add_variable("w", 1, {trainble = false}) end, "Layer:add_variable: "
        .. "unknown option 'trainble' (did you mean 'trainable'? known: trainable)"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
  end)

  it("accept Keras' beta_1 and beta_2, but not both spellings at once", function()
    local opt = mg.optim.Adam{beta_1 = 0.8, beta2 = 0.99}
    assert.equal(0.8, opt.beta1)
    assert.equal(0.99, opt.beta2)
    err(function() mg.optim.Adam{beta1 = 0.5, beta_1 = 0.5} end,
        "Adam: options 'beta1' and 'beta_1' are the same option; give one")
    err(function() mg.optim.Adam{beta_2 = 1} end, "Adam: option 'beta_2' must be a number in [0, 1), got 1")
  end)

  it("check the values' types and ranges (NaN included)", function()
    local nan, inf = 0 / 0, math.huge
    local LR = "SGD: option 'learning_rate' must be a positive finite number or a schedule, got "
    local cases = {
      {function() mg.optim.SGD{learning_rate = 0} end, LR .. "0"},
      {function() mg.optim.SGD{learning_rate = -1} end, LR .. "-1"},
      {function() mg.optim.SGD{learning_rate = nan} end, LR .. "nan"},
      {function() mg.optim.SGD{learning_rate = inf} end, LR .. "inf"},
      {function() mg.optim.SGD{learning_rate = "0.1"} end, LR .. "'0.1'"},
      {function() mg.optim.SGD{momentum = 1} end, "SGD: option 'momentum' must be a number in [0, 1), got 1"},
      {function() mg.optim.SGD{momentum = -0.1} end, "SGD: option 'momentum' must be a number in [0, 1), got -0.1"},
      {function() mg.optim.SGD{momentum = nan} end, "SGD: option 'momentum' must be a number in [0, 1), got nan"},
      {function() mg.optim.SGD{nesterov = "yes"} end, "SGD: option 'nesterov' must be true or false, got 'yes'"},
      {function() mg.optim.SGD{nesterov = true} end, "SGD: nesterov needs a momentum above 0"},
      {function() mg.optim.Adam{beta1 = 1} end, "Adam: option 'beta1' must be a number in [0, 1), got 1"},
      {function() mg.optim.Adam{beta2 = nan} end, "Adam: option 'beta2' must be a number in [0, 1), got nan"},
      {function() mg.optim.Adam{epsilon = 0} end, "Adam: option 'epsilon' must be a positive finite number, got 0"},
      {function() mg.optim.Adam{name = 3} end, "Adam: option 'name' must be a string, got 3"},
      {function() nn.Dropout(1) end, "Dropout: rate must be a number in [0, 1), got 1"},
      {function() nn.Dropout(nan) end, "Dropout: rate must be a number in [0, 1), got nan"},
      {function() nn.Dropout(-0.5) end, "Dropout: rate must be a number in [0, 1), got -0.5"},
      {function() nn.Dropout("0.5") end, "Dropout: rate must be a number in [0, 1), got '0.5'"},
      {function() nn.Dropout(0.5, {training = "no"}) end, "Dropout: option 'training' must be true or false, got 'no'"},
      {function() nn.dropout(mg.ones{2}, nan) end, "dropout: rate must be a number in [0, 1), got nan"},
      {function() nn.BatchNorm{momentum = 1.5} end, "BatchNorm: option 'momentum' must be a number in [0, 1], got 1.5"},
      {function() nn.BatchNorm{epsilon = -1} end, "BatchNorm: option 'epsilon' must be a positive finite number, got -1"},
      {function() nn.RevBlock(mg.tanh, mg.tanh, {num_layers = 0}) end,
       "RevBlock: option 'num_layers' must be a positive integer, got 0"},
      {function() nn.RevBlock(mg.tanh, mg.tanh, {num_layers = 2.5}) end,
       "RevBlock: option 'num_layers' must be a positive integer, got 2.5"},
      {function() nn.Dense(2.5) end, "Dense: units must be a positive integer, got 2.5"},
      {function() nn.Dense("3") end, "Dense: units must be a positive integer, got '3'"},
      {function() nn.Dense(3, {use_bias = 0}) end, "Dense: option 'use_bias' must be true or false, got 0"},
      {function() nn.Dense(3, {activation = 1}) end,
       "Dense: option 'activation' must be an activation name or a function, got 1"},
      {function() nn.Dense(3, {activation = "rleu"}) end,
       "Dense: unknown activation 'rleu' (did you mean 'relu'? known: elu, exponential, gelu, gelu_tanh, leaky_relu, linear, log_softmax, relu, sigmoid, silu, softmax, softplus, swish, tanh)"},
      {function() mg.test.gradcheck(mg.tanh, {f64{1}}, {eps = 0}) end,
       "gradcheck: option 'eps' must be a positive finite number, got 0"},
      {function() mg.test.gradcheck(mg.tanh, {f64{1}}, {atol = -1}) end,
       "gradcheck: option 'atol' must be a finite number >= 0, got -1"},
      {function() mg.test.gradcheck(mg.tanh, {f64{1}}, {rtol = nan}) end,
       "gradcheck: option 'rtol' must be a finite number >= 0, got nan"},
      {function() mg.test.gradcheck(mg.tanh, {f64{1}}, {seed = 1.5}) end,
       "gradcheck: option 'seed' must be an integer, got 1.5"},
      {function() mg.progress(3, {label = 3}) end, "progress: option 'label' must be a string, got 3"},
      {function() mg.progress(3, {out = 42}) end,
       "progress: option 'out' must be a file or an object with write and flush methods, got 42"},
      {function() nn.Dense(2):add_variable("w", 1, {trainable = "no"}) end,
       "Layer:add_variable: option 'trainable' must be true or false, got 'no'"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
  end)

  it("re-check an optimizer's settings when they were changed by hand", function()
    local v = mg.Variable({1.0})
    local opt = mg.optim.SGD{learning_rate = 0.1}
    opt.learning_rate = nil
    err(function() opt:apply_gradients({mg.constant({1.0})}, {v}) end,
        "SGD: learning_rate must be a positive finite number or a schedule, got nil")
    local adam = mg.optim.Adam()
    adam.beta1 = 1
    err(function() adam:apply_gradients({mg.constant({1.0})}, {v}) end, "Adam: beta1 must be a number in [0, 1), got 1")
    assert.equal(1, v:value():item())
  end)
end)

-- }=============================================================


-- {===================== positional misuse =====================

describe("positional arguments", function()
  it("Dense(units, activation [, opts]) is Keras' positional form", function()
    local x = mg.ones{2, 3}
    assert.same({2, 4}, nn.Dense(4, "relu")(x).shape)
    assert.same({2, 4}, nn.Dense(4, mg.tanh, {name = "t"})(x).shape)
    assert.equal("t", nn.Dense(4, "tanh", {name = "t"}).name)
    err(function() nn.Dense(3, "relu", {activation = "tanh"}) end,
        "Dense: activation given twice (argument 2 and option 'activation')")
    err(function() nn.Dense(3, 5) end,
        "Dense: argument 2 must be an activation (a name or a function) or an options table, got 5")
    err(function() nn.Dense(3, {}, {}) end, "Dense: options given twice; write Dense(units [, activation] [, options])")
    err(function() nn.Dense(3, "mish") end,
        "Dense: unknown activation 'mish' (known: elu, exponential, gelu, gelu_tanh, leaky_relu, linear, log_softmax, relu, sigmoid, silu, softmax, softplus, swish, tanh)")
  end)

  it("Sequential takes a list with no holes, of callables only", function()
    local hole = nil
    local cases = {
      {function() nn.Sequential(nn.Dense(2)) end,
       "Sequential: a list of layers expected, got a Dense layer; write Sequential{...}"},
      {function() nn.Sequential(mg.tanh) end, "Sequential: a list of layers expected, got a function; write Sequential{...}"},
      {function() nn.Sequential(42) end, "Sequential: a list of layers expected, got a number"},
      {function() nn.Sequential() end, "Sequential: a list of layers expected, got nil"},
      {function() nn.Sequential{nn.Dense(4), hole, nn.Dense(1)} end, "Sequential: layer 2 is nil (a hole in the list)"},
      {function() nn.Sequential{hole, nn.Dense(1)} end, "Sequential: layer 1 is nil (a hole in the list)"},
      {function() nn.Sequential{nn.Dense(2), extra = nn.Dense(3)} end,
       "Sequential: the list of layers has a key 'extra'; entries go at positions 1, 2, ..."},
      {function() nn.Sequential{[0] = nn.Dense(3)} end,
       "Sequential: the list of layers has a key 0; entries go at positions 1, 2, ..."},
      {function() nn.Sequential{nn.Dense} end, "Sequential: layer 1 is the class Dense, not a layer; call it: Dense(...)"},
      {function() nn.Sequential{42} end, "Sequential: layer 1 is a number, not callable"},
      {function() nn.Sequential{mg.tanh, {}} end, "Sequential: layer 2 is a table, not callable"},
      {function() nn.Sequential{mg.tanh}:add(3) end, "Sequential:add: layer is a number, not callable"},
      {function() nn.Sequential{}:add() end, "Sequential:add: layer is nil, not callable"},
      {function() nn.Sequential{}:add(mg.optim.SGD()) end, "Sequential:add: layer is an SGD optimizer, not callable"},
      {function() nn.Sequential.add(nn.Dense(2)) end,
       "Sequential:add: call it as a method, with a colon (model:add(layer)), got self = a Dense layer"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
    local m = nn.Sequential{}:add(nn.Dense(2)):add(mg.tanh)
    assert.equal(2, #m.layers)
  end)

  it("optimizers take the learning rate first, as Keras does, and an options table only", function()
    assert.equal(0.5, mg.optim.SGD(0.5, {momentum = 0.9}).learning_rate)
    err(function() mg.optim.SGD(0.5, {learning_rate = 0.1}) end, "SGD: learning_rate given twice (argument 1 and an option)")
    err(function() mg.optim.SGD(-1) end, "SGD: learning_rate must be a positive finite number, got -1")
    err(function() mg.optim.Adam("fast") end, "Adam: options must be a table {name = value, ...}, got 'fast'")
    err(function() mg.optim.Adam{0.001} end, "Adam: options are named (name = value), got a value at [1]")
    err(function() nn.BatchNorm(0.5) end, "BatchNorm: options must be a table {name = value, ...}, got 0.5")
  end)
end)

-- }=============================================================


-- {=========================== losses ==========================

describe("losses check shapes and dtypes", function()
  local logits = f64{{1, 2, 3}, {3, 2, 1}}
  it("softmax_cross_entropy", function()
    local sce = nn.softmax_cross_entropy
    local cases = {
      {mg.constant({3}, "int64"),
       "labels must have shape (2) (the logits' shape (2,3) without its last axis), got (1)"},
      {mg.constant({{3}, {1}}, "int64"),
       "labels must have shape (2) (the logits' shape (2,3) without its last axis), got (2,1); squeeze the last axis"},
      {mg.constant({{1, 2}, {3, 1}}, "int64"),
       "labels must have shape (2) (the logits' shape (2,3) without its last axis), got (2,2)"},
      {mg.constant({0, 2}, "int64"), "labels must be class numbers in 1..3 (1-based), got 0; add 1 to 0-based labels"},
      {mg.constant({1, 4}, "int64"), "labels must be class numbers in 1..3 (1-based), got 4"},
      {mg.constant({-1, 2}, "int64"), "labels must be class numbers in 1..3 (1-based), got -1"},
      {mg.constant({1, 2}, "float32"),
       "labels must be int64 class numbers or float64 probabilities (the logits' dtype), got float32"},
      {mg.ones({2}, "bool"), "labels must be int64 class numbers or float64 probabilities (the logits' dtype), got bool"},
      {f64{1, 2}, "float64 labels are probabilities and must have the logits' shape (2,3), got (2) "
        .. "(class numbers must be int64)"},
      {f64{{1, 0}, {0, 1}}, "float64 labels are probabilities and must have the logits' shape (2,3), got (2,2) "
        .. "(class numbers must be int64)"},
      {{1, 2}, "labels must be a tensor of int64 class numbers or of probabilities, got a table"},
      {nil, "labels must be a tensor of int64 class numbers or of probabilities, got nil"},
    }
    for _, c in ipairs(cases) do err(function() sce(logits, c[1]) end, "softmax_cross_entropy: " .. c[2]) end
    err(function() sce(mg.constant({{1, 2}}, "int64"), mg.constant({1}, "int64")) end,
        "softmax_cross_entropy: logits must be a float tensor, got int64")
    err(function() sce(f64(1), mg.constant({}, "int64")) end,
        "softmax_cross_entropy: logits must have a class axis (at least 1 dimension), got shape ()")
    err(function() sce("logits", mg.constant({1}, "int64")) end,
        "softmax_cross_entropy: logits must be a float tensor, got 'logits'")
    assert.has_no_error(function() sce(mg.zeros({0, 3}, "float64"), mg.zeros({0}, "int64")) end)   -- no labels
  end)

  it("mean_squared_error: same shape and dtype, no broadcasting", function()
    local mse = nn.mean_squared_error
    local cases = {
      {mg.ones{2, 3}, mg.ones{3}, "y has shape (2,3) but target has shape (3); they must match exactly"},
      {mg.ones{3}, mg.ones{3, 1}, "y has shape (3) but target has shape (3,1); they must match exactly"},
      {mg.ones{1}, mg.ones{}, "y has shape (1) but target has shape (); they must match exactly"},
      {mg.ones{3}, f64{1, 2, 3}, "y is float32 but target is float64; cast one"},
      {mg.ones{3}, 0, "target must be a float tensor, got 0"},
      {mg.ones({3}, "int64"), mg.ones{3}, "y must be a float tensor, got int64"},
      {nil, mg.ones{3}, "y must be a float tensor, got nil"},
    }
    for _, c in ipairs(cases) do err(function() mse(c[1], c[2]) end, "mean_squared_error: " .. c[3]) end
  end)
end)

-- }=============================================================


-- {========================= optimizers ========================

describe("optimizers' apply_gradients", function()
  for _, name in ipairs({"SGD", "Adam"}) do
    local make = mg.optim[name]
    it(name .. " checks every pair before it moves anything", function()
      local a, b = mg.Variable({1.0, 2.0}), mg.Variable({3.0})
      local g = mg.constant({1.0, 1.0})
      local cases = {
        {{mg.constant({1.0}), nil}, {a, b}, "gradients[1] has shape (1) but variables[1] has shape (2)"},
        {{g, mg.constant({1.0, 1.0})}, {a, b}, "gradients[2] has shape (2) but variables[2] has shape (1)"},
        {{g, mg.constant(1.0)}, {a, b}, "gradients[2] has shape () but variables[2] has shape (1)"},
        {{g, f64{1}}, {a, b}, "gradients[2] is float64 but variables[2] is float32"},
        {{g, 1}, {a, b}, "gradients[2] is a number, not a tensor"},
        {{g, g}, {a, mg.constant({1.0, 1.0})}, "variables[2] is a tensor, not a Variable"},
        {{g}, {a, "b"}, "variables[2] is a string, not a Variable"},
        {{g, nil, g}, {a, b}, "3 gradients for 2 variables"},
        {table.pack(g), {a, b}, "1 gradients for 2 variables"},
        {{g}, {a, nil, b}, "variables[2] is nil (a hole in the list)"},
        {{v = g}, {v = a}, "the list of variables has a key 'v'; entries go at positions 1, 2, ..."},
        {{v = g}, {a}, "the list of gradients has a key 'v'; entries go at positions 1, 2, ..."},
        {g, {a}, "gradients must be a list, got a tensor (2) float32"},
        {{g}, nil, "apply_gradients(grads, variables) takes two lists (or one list of {gradient, variable} pairs), "
          .. "got variables = nil"},
        {{{g, a}, {g}}, nil, "pair 2 must be {gradient, variable}, got a table"},
        {{mg.ones({1}, "int64")}, {mg.Variable(mg.ones({1}, "int64"))},
         "variables[1] is int64; only float variables can be trained"},
      }
      local opt = make(name == "SGD" and {learning_rate = 0.1, momentum = 0.9} or nil)
      opt:apply_gradients({g, mg.constant({1.0})}, {a, b})
      local before = {a:value():totable(), b:value():totable(), opt.iterations}
      local slots = name == "SGD" and {opt.slots[a], opt.slots[b]} or {opt.m[a], opt.v[a], opt.m[b], opt.v[b]}
      for _, c in ipairs(cases) do
        err(function() opt:apply_gradients(c[1], c[2]) end, name .. ": " .. c[3])
      end
      err(function() opt.apply_gradients({g}, {a}) end, name .. ": call it as a method, with a colon "
          .. "(opt:apply_gradients(grads, vars)), got self = a table")
      assert.same(before, {a:value():totable(), b:value():totable(), opt.iterations})
      local now = name == "SGD" and {opt.slots[a], opt.slots[b]} or {opt.m[a], opt.v[a], opt.m[b], opt.v[b]}
      for i = 1, #slots do assert.equal(slots[i], now[i]) end
    end)

    it(name .. " skips nil gradients, wherever they are", function()
      local a, b, c = mg.Variable({1.0}), mg.Variable({1.0}), mg.Variable({1.0})
      local opt = make()
      opt:apply_gradients({nil, mg.constant({1.0})}, {a, b, c})
      assert.same({1}, a:value():totable())
      assert.is_true(b:value():item() < 1)
      assert.same({1}, c:value():totable())
      opt:apply_gradients(table.pack(nil, nil, nil), {a, b, c})
      opt:apply_gradients({{nil, a}, {mg.constant({1.0}), c}})
      assert.same({1}, a:value():totable())
      assert.is_true(c:value():item() < 1)
    end)
  end
end)

-- }=============================================================


-- {======================== layer inputs =======================

describe("layers check their inputs", function()
  it("Dense", function()
    err(function() nn.Dense(3)("x") end, "Dense: input must be a float tensor, got 'x'")
    err(function() nn.Dense(3)(nil) end, "Dense: input must be a float tensor, got nil")
    err(function() nn.Dense(3)({{1, 2}}) end, "Dense: input must be a float tensor, got a table")
    err(function() nn.Dense(3)(mg.ones({1, 2}, "int64")) end, "Dense: input must be a float tensor, got int64")
    err(function() nn.Dense(3)(mg.ones({1, 2}, "bool")) end, "Dense: input must be a float tensor, got bool")
    err(function() nn.Dense(3)(mg.constant(1)) end, "Dense: input must have at least 1 dimension, got shape ()")
    local d = nn.Dense(3)
    d(mg.ones{1, 2})
    err(function() d(mg.ones{1, 4}) end, "Dense: input has 4 features (its last axis), the layer was built for 2")
    err(function() d(mg.ones({1, 2}, "float64")) end, "Dense: input is float64, the layer was built for float32")
    err(function() nn.Sequential{nn.Dense(3), nn.Dense(2)}(mg.ones({1, 2}, "int64")) end,
        "Dense: input must be a float tensor, got int64")
    assert.same({3}, d(mg.Variable({1.0, 2.0})).shape)     -- a Variable is read like a tensor
  end)

  it("Dropout, dropout and BatchNorm", function()
    err(function() nn.Dropout(0.5)(3) end, "Dropout: input must be a float tensor, got 3")
    err(function() nn.Dropout(0.5)(mg.ones{2}, "yes") end,
        "Dropout: training (argument 2) must be true, false or nil, got 'yes'")
    err(function() nn.dropout(3, 0.5) end, "dropout: x must be a float tensor, got 3")
    err(function() nn.dropout(mg.ones({2}, "int64"), 0.5) end, "dropout: x must be a float tensor, got int64")
    err(function() nn.BatchNorm()(mg.ones{4}) end, "BatchNorm: input must have at least 2 dimensions, got shape (4)")
    err(function() nn.BatchNorm()(mg.ones({2, 2}, "int64")) end, "BatchNorm: input must be a float tensor, got int64")
    err(function() nn.BatchNorm()(mg.ones{2, 2}, 1) end,
        "BatchNorm: training (argument 2) must be true, false or nil, got 1")
    local bn = nn.BatchNorm()
    bn(mg.random.normal{4, 3})
    err(function() bn(mg.ones{4, 5}) end, "BatchNorm: input has 5 features (its last axis), the layer was built for 3")
    assert.is_false(nn.Dropout(0.5, {training = false}).training)
  end)

  it("RevBlock, checkpoint_sequential and Lambda", function()
    local x = mg.ones{2, 4}
    local cases = {
      {function() nn.RevBlock(mg.tanh, nil) end, "RevBlock: g must be a function (or a callable table) or a list of them, got nil"},
      {function() nn.RevBlock(nil, mg.tanh) end, "RevBlock: f must be a function (or a callable table) or a list of them, got nil"},
      {function() nn.RevBlock(mg.tanh, 3) end, "RevBlock: g must be a function (or a callable table) or a list of them, got 3"},
      {function() nn.RevBlock({mg.tanh}, mg.tanh, {num_layers = 2}) end, "RevBlock: f has 1 functions for 2 layers"},
      {function() nn.RevBlock({mg.tanh, 3}, mg.tanh) end, "RevBlock: f[2] must be a function (or a callable table), got 3"},
      {function() nn.RevBlock(mg.tanh, {mg.tanh, nil, mg.tanh}) end, "RevBlock: g[2] is nil (a hole in the list)"},
      {function() nn.RevBlock(mg.tanh, mg.tanh)("x") end, "RevBlock: input must be a float tensor, got 'x'"},
      {function() nn.RevBlock(mg.tanh, mg.tanh)(x, 2) end, "RevBlock: x2 must be a float tensor, got 2"},
      {function() nn.RevBlock(function(h) return mg.sum(h, -1) end, mg.tanh)(x) end,
       "RevBlock: f of layer 1 gave a tensor (2) float32 for a half of shape (2,2); it must keep the shape"},
      {function() nn.checkpoint_sequential({mg.tanh, "oops"}, 1, x) end, "checkpoint_sequential: layer 2 is a string, not callable"},
      {function() nn.checkpoint_sequential({mg.tanh, mg.tanh}, 0, x) end,
       "checkpoint_sequential: segments must be a positive integer, got 0"},
      {function() nn.checkpoint_sequential({mg.tanh, mg.tanh}, 1.5, x) end,
       "checkpoint_sequential: segments must be a positive integer, got 1.5"},
      {function() nn.checkpoint_sequential({mg.tanh, mg.tanh}, 3, x) end,
       "checkpoint_sequential: segments (3) must be at most the number of layers (2)"},
      {function() nn.checkpoint_sequential({}, 1, x) end, "checkpoint_sequential: the list of layers is empty"},
      {function() nn.checkpoint_sequential(nn.Dense(2), 1, x) end, "checkpoint_sequential: a list of layers expected, "
        .. "got a Dense layer; write checkpoint_sequential({layer, ...}, segments, x)"},
      {function() nn.checkpoint_sequential({mg.tanh}, 1) end, "checkpoint_sequential: x (argument 3) is nil"},
      {function() nn.Lambda(42) end, "Lambda: fn must be a function (or a callable table), got 42"},
      {function() nn.glorot_uniform({3, "4"}) end, "glorot_uniform: shape[2] must be an integer >= 0, got '4'"},
      {function() nn.glorot_uniform({3, 4}, "int64") end, "glorot_uniform: dtype must be 'float32' or 'float64', got 'int64'"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
    local three = nn.RevBlock({mg.tanh, mg.tanh, mg.tanh}, mg.tanh)     -- num_layers from the list
    assert.equal(3, three.num_layers)
    assert.same({2, 4}, nn.checkpoint_sequential(nn.Sequential{mg.tanh, mg.tanh}, 2, x).shape)
  end)
end)

-- }=============================================================


-- {=================== progress and gradcheck ==================

describe("progress and gradcheck check their arguments", function()
  local sink = {write = function() end, flush = function() end}
  it("progress", function()
    local bar = mg.progress(3, {out = sink})
    local cases = {
      {function() bar:update(nil) end, "progress:update: step must be a non-negative integer, got nil"},
      {function() bar:update(-1) end, "progress:update: step must be a non-negative integer, got -1"},
      {function() bar:update(1.5) end, "progress:update: step must be a non-negative integer, got 1.5"},
      {function() bar:update("2") end, "progress:update: step must be a non-negative integer, got '2'"},
      {function() bar:update(1, 5) end, "progress:update: values must be a table {name = value, ...}, got 5"},
      {function() bar:update(1, {0.5}) end, "progress:update: values are named (name = value), got a value at [1]"},
      {function() bar:update(1, {loss = mg.ones{2}}) end,
       "progress:update: value 'loss' is a tensor of shape (2); give a number or a one-element tensor"},
      {function() bar.update(2) end, "progress:update: call it as a method, with a colon (bar:update(i)), got self = 2"},
      {function() bar:finish("done") end, "progress:finish: values must be a table {name = value, ...}, got 'done'"},
      {function() mg.progress("3") end, "progress: the number of steps must be a non-negative integer, got '3'"},
      {function() mg.progress(2.5) end, "progress: the number of steps must be a non-negative integer, got 2.5"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
    bar:update(2.0, {loss = mg.constant(0.5)})
    bar:finish()
  end)

  it("gradcheck", function()
    local gradcheck = mg.test.gradcheck
    local cases = {
      {function() gradcheck(42, {f64{1}}) end, "gradcheck: f must be a function (or a callable table), got 42"},
      {function() gradcheck(mg.tanh, f64{1}) end, "gradcheck: inputs must be a list of tensors, got a tensor (1) float64"},
      {function() gradcheck(mg.tanh, {mg.ones{2}}) end,
       "gradcheck: input 1 is float32; finite differences need float64 (use mg.cast(x, 'float64'))"},
      {function() gradcheck(mg.tanh, {mg.Variable(mg.ones{2})}) end,
       "gradcheck: input 1 is float32; finite differences need float64 (use mg.cast(x, 'float64'))"},
      {function() gradcheck(mg.abs, {mg.ones({2}, "int64")}) end,
       "gradcheck: no float64 tensor among the inputs; there is nothing to check (use mg.cast(x, 'float64'))"},
      {function() gradcheck(mg.add, {f64{1}, nil, f64{2}}) end, "gradcheck: input 2 is nil (a hole in the list)"},
      {function() gradcheck(function() return 1 end, {f64{1}}) end, "gradcheck: f must return a tensor, got a number"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
    -- table.pack's n passes nil inputs through
    assert.is_true(gradcheck(function(a, b, c) return a * (b or 1) + c end, table.pack(f64{1, 2}, nil, f64{3, 4})))
  end)
end)

-- }=============================================================


-- {========================= positions =========================

describe("argument errors", function()
  it("point at the caller's line, however deep inside the modules they are found", function()
    local here = "15%-lua_args_spec%.lua:%d+: "
    local calls = {
      function() mg.optim.SGD{lr = 1} end,
      function() nn.Sequential{nn.Dense(2), nn.Dense(3)}(mg.ones({1, 2}, "int64")) end,
      function() nn.Dense(3, {activation = "mish"}) end,
      function() mg.optim.SGD():apply_gradients({mg.ones{2}}, {mg.Variable({1.0})}) end,
      function() mg.progress(2):update(-1) end,
    }
    for i, call in ipairs(calls) do
      local ok, msg = pcall(call)
      assert.is_false(ok)
      assert.truthy(msg:find(here), ("call %d: %s"):format(i, msg))
    end
  end)
end)

-- }=============================================================

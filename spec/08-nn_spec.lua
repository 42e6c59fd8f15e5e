-- mg.nn: layers, variables, dropout, batch norm, losses.
local mg = require "moongrad"
local h = require "helpers"
local nn = mg.nn

describe("layers", function()
  before_each(function() mg.random.seed(3) end)

  it("Dense builds lazily: glorot-uniform kernel, zero bias, the input's dtype", function()
    local d = nn.Dense(4)
    assert.same({}, d.variables)
    local y = d(mg.ones{2, 3})
    assert.same({2, 4}, y.shape)
    assert.same({3, 4}, d.kernel.shape)
    assert.same({0, 0, 0, 0}, d.bias:totable())
    local limit = math.sqrt(6 / 7)
    assert.is_true(mg.max(mg.abs(d.kernel)):item() <= limit)
    assert.equal(2, #d.trainable_variables)
    assert.equal("float64", nn.Dense(2)(mg.ones({1, 3}, "float64")).dtype)
    assert.truthy(d.kernel.name:find("/kernel$"))
  end)

  it("initial values are reproducible from the seed", function()
    mg.random.seed(9)
    local a = nn.Dense(3)
    a(mg.ones{1, 2})
    mg.random.seed(9)
    local b = nn.Dense(3)
    b(mg.ones{1, 2})
    assert.same(a.kernel:totable(), b.kernel:totable())
  end)

  it("Dense computes activation(x @ kernel + bias)", function()
    local d = nn.Dense(2, {activation = "relu"})
    local x = mg.constant({{1, -2}})
    d(x)
    d.kernel:assign({{1, 0}, {0, 1}})
    d.bias:assign({0.5, 0.5})
    assert.same({{1.5, 0}}, d(x):totable())
    assert.has_error(function() nn.Dense(2, {activation = "mish"}) end,
      "Dense: unknown activation 'mish' (known: elu, exponential, gelu, gelu_tanh, leaky_relu, linear, log_softmax, relu, sigmoid, silu, softmax, softplus, swish, tanh)")
    assert.has_error(function() nn.Dense(0) end, "Dense: units must be a positive integer, got 0")
  end)

  it("Dense takes the activation as its second argument, as Keras does", function()
    local x = mg.constant({{1, -2}})
    for _, a in ipairs({"relu", mg.relu}) do
      local d = nn.Dense(2, a, {use_bias = false})
      d(x)
      d.kernel:assign({{1, 0}, {0, 1}})
      assert.same({{1, 0}}, d(x):totable())
      assert.is_nil(d.bias)
    end
  end)

  it("Sequential runs layers in order and lists their variables", function()
    local m = nn.Sequential{nn.Dense(3), nn.Lambda(function(x) return x * 2 end), nn.Dense(1)}
    assert.same({5, 1}, m(mg.ones{5, 4}).shape)
    assert.equal(4, #m.variables)
    assert.equal(4, #m.trainable_variables)
    assert.has_error(function() nn.Sequential{42} end, "Sequential: layer 1 is a number, not callable")
    assert.truthy(tostring(m):find("moongrad.nn.Sequential", 1, true))
  end)

  it("a layer's call holds its input no longer than the layer does, and notes the output's shape", function()
    -- a wrapper that kept its arguments would keep every layer's input
    -- alive across the layer's ops: old garbage, found by full collections only
    local weak = setmetatable({}, {__mode = "v"})
    local freed
    local l = nn.Lambda(function(x)
      weak[1] = x
      x = nil
      collectgarbage()
      collectgarbage()
      freed = weak[1] == nil
      return mg.ones{2, 3}
    end)
    l(mg.ones{4})
    assert.is_true(freed)
    assert.same({2, 3}, rawget(l, "_output_shape"))
    local two = nn.Lambda(function(x) return x, x end)
    two(mg.ones{1})
    assert.equal("multiple", rawget(two, "_output_shape"))
    assert.has_error(function() nn.Dense.__call(42) end)    -- not a layer: an error, not a crash
    local gen = nn.Lambda(function(x) return coroutine.yield(x) * 2 end)   -- a layer may yield
    local co = coroutine.wrap(function() return gen(mg.ones{2}) end)
    assert.same({1, 1}, co():totable())
    assert.same({6, 6}, co(mg.full({2}, 3)):totable())
    assert.same({2}, rawget(gen, "_output_shape"))
  end)

  it("gradients reach every layer's variables", function()
    local m = nn.Sequential{nn.Dense(3, {activation = "tanh"}), nn.Dense(1)}
    local x = mg.random.normal{4, 2}
    m(x)
    local t = mg.tape()
    local loss = mg.mean(m(x) ^ 2)
    t:stop()
    local g = t:gradient(loss, m.trainable_variables)
    for i, v in ipairs(m.trainable_variables) do assert.same(v.shape, g[i].shape) end
  end)

  it("a layer under recompute_grad inside Sequential is still the model's, and trains", function()
    local block = nn.Sequential{nn.Dense(3, {activation = "tanh"}), nn.Dense(3)}
    local m = nn.Sequential{mg.recompute_grad(block), nn.Dense(1)}
    local x = mg.random.normal{4, 2}
    m(x)
    assert.equal(6, #m.trainable_variables)
    assert.equal(block.trainable_variables[1], m.trainable_variables[1])
    m:compile{optimizer = mg.optim.SGD{learning_rate = 0.1}, loss = "mean_squared_error"}
    local before = block.trainable_variables[1]:value() * 1
    m:fit(x, mg.ones{4, 1}, {epochs = 1, verbose = 0})
    assert.is_true(mg.max(mg.abs(block.trainable_variables[1]:value() - before)):item() > 0)
  end)
end)

describe("dropout", function()
  it("zeroes about rate of the entries and scales the rest", function()
    mg.random.seed(1)
    local y = nn.dropout(mg.ones{10000}, 0.25)
    local kept = mg.sum(mg.cast(mg.greater(y, 0), "float32")):item()
    assert.is_true(math.abs(kept / 10000 - 0.75) < 0.02)
    h.assert_close(mg.max(y), 1 / 0.75, 1e-6)
    assert.has_error(function() nn.dropout(mg.ones{2}, 1) end, "dropout: rate must be a number in [0, 1), got 1")
  end)

  it("the Dropout layer is the identity when not training", function()
    local d = nn.Dropout(0.5)
    local x = mg.ones{100}
    assert.same(x:totable(), d(x, false):totable())
    d.training = false
    assert.same(x:totable(), d(x):totable())
  end)
end)

describe("BatchNorm", function()
  it("normalizes with batch statistics while training, running ones after", function()
    local bn = nn.BatchNorm{momentum = 0}
    local x = mg.constant({{1, 10}, {3, 30}})
    local y = bn(x)
    h.assert_close(y, {{-1, -1}, {1, 1}}, 1e-3)
    assert.same({2, 20}, bn.moving_mean:totable())
    h.assert_close(bn(x, false), y, 1e-3)
    assert.equal(2, #bn.trainable_variables)
    assert.equal(2, #bn.non_trainable_variables)
  end)

  it("leaves its moving statistics as they were after an empty batch (as PyTorch)", function()
    local bn = nn.BatchNorm{momentum = 0.5}
    bn(mg.constant({{1, 10}, {3, 30}}))
    local mean, var, updates = bn.moving_mean:totable(), bn.moving_variance:totable(), bn.updates
    assert.same({0, 2}, bn(mg.zeros{0, 2}).shape)
    assert.same(mean, bn.moving_mean:totable())
    assert.same(var, bn.moving_variance:totable())
    assert.equal(updates, bn.updates)
  end)
end)

describe("losses", function()
  it("softmax_cross_entropy matches its definition and gradchecks", function()
    local logits = mg.constant({{2, 1, 0}, {0, 0, 3}}, "float64")
    local labels = mg.constant({1, 3}, "int64")
    local function ce (row, k)
      local z = 0
      for _, v in ipairs(row) do z = z + math.exp(v) end
      return -(row[k] - math.log(z))
    end
    h.assert_close(nn.softmax_cross_entropy(logits, labels), (ce({2, 1, 0}, 1) + ce({0, 0, 3}, 3)) / 2, 1e-12)
    assert.is_true(mg.test.gradcheck(function(l) return nn.softmax_cross_entropy(l, labels) end,
                                     {mg.random.normal({2, 3}, 0, 1, "float64")}))
    assert.has_error(function() nn.softmax_cross_entropy(logits, mg.constant({1, 4}, "int64")) end,
                     "softmax_cross_entropy: labels must be class numbers in 1..3 (1-based), got 4")
    assert.has_error(function() nn.softmax_cross_entropy(logits, mg.constant({1, 2})) end,
      "softmax_cross_entropy: labels must be int64 class numbers or float64 probabilities (the logits' dtype), "
      .. "got float32")
  end)

  it("softmax_cross_entropy takes probabilities of the logits' shape too", function()
    local logits = mg.random.normal({3, 4}, 0, 1, "float64")
    local labels = mg.constant({4, 1, 2}, "int64")
    local onehot = mg.constant({{0, 0, 0, 1}, {1, 0, 0, 0}, {0, 1, 0, 0}}, "float64")
    h.assert_close(nn.softmax_cross_entropy(logits, onehot), nn.softmax_cross_entropy(logits, labels), 1e-12)
    local soft = mg.full({3, 4}, 0.25, "float64")
    h.assert_close(nn.softmax_cross_entropy(logits, soft), -mg.mean(mg.mean(mg.log_softmax(logits, -1), -1)), 1e-12)
  end)

  it("mean_squared_error", function()
    assert.equal(2.5, nn.mean_squared_error(mg.constant({1, 2}), mg.constant({2, 4})):item())
    assert.has_error(function() nn.mean_squared_error(mg.constant({1, 2, 3}), mg.constant({{1}, {2}, {3}})) end,
                     "mean_squared_error: y has shape (3) but target has shape (3,1); they must match exactly")
  end)
end)

describe("nn's extensions", function()
  -- training, checkpoints, the reversible and the transformer layers load on
  -- first use (each full collection walks every object the library made)
  local script = [[
    local nn = mg.nn
    local function keys (t) local k = {} for n, v in pairs(t) do k[n] = v end return k end
    local before_nn, before_layer = keys(nn), keys(nn.Layer)
    assert(rawget(nn, "RevBlock") == nil and package.loaded["moongrad.fit"] == nil, "loaded at once")
    -- a first call through a stand-in reports the caller's line
    local ok, err = pcall(function() nn.Sequential{nn.Dense(1)}:compile(42) end)
    print("error: " .. tostring(err))
    local extensions = getmetatable(nn).__extensions
    getmetatable(nn).__load_extensions()
    local added, replaced = {}, {}
    for n in pairs(keys(nn)) do if before_nn[n] == nil then added[n] = true end end
    for n, v in pairs(keys(nn.Layer)) do if before_layer[n] ~= v then replaced[n] = true end end
    for module, e in pairs(extensions) do
      for _, n in ipairs(e.classes or {}) do assert(added[n], n); added[n] = nil end
      for _, n in ipairs(e.methods or {}) do assert(replaced[n], n); replaced[n] = nil end
    end
    for n in pairs(added) do print("unlisted class " .. n) end
    for n in pairs(replaced) do print("unlisted method " .. n) end
    print("done")
  ]]

  it("load on first use, and list exactly the names each one installs", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(script)
    f:close()
    local out, code = h.run(h.bin .. " " .. path .. " 2>&1")
    os.remove(path)
    assert.equal(0, code, out)
    assert.truthy(out:find("\ndone\n$"), out)
    assert.falsy(out:find("unlisted"), out)
    assert.truthy(out:find("error: " .. path:gsub("%p", "%%%0") .. ":6: compile"), out)
  end)

  it("keep what a script set before they loaded", function()
    local out, code = h.run(h.bin .. [[ -e '
      local mine = function() return "mine" end
      mg.nn.Layer.predict = mine
      rawset(mg.nn, "LayerNorm", "my LayerNorm")
      getmetatable(mg.nn).__load_extensions()
      print(mg.nn.Layer.predict == mine, mg.nn.LayerNorm, type(mg.nn.Layer.fit), type(mg.nn.TransformerBlock))' 2>&1]])
    assert.equal(0, code, out)
    assert.equal("true\tmy LayerNorm\tfunction\ttable\n", out)
  end)
end)

describe("a layer's description", function()
  it("names its activation: by the name it goes by, linear without one, custom for a function", function()
    local nn = mg.nn
    assert.equal("moongrad.nn.Dense 'h' (units=3, activation=relu)", nn.Dense(3, "relu", {name = "h"}):describe())
    assert.equal("moongrad.nn.Dense 'o' (units=2, activation=linear)", nn.Dense(2, {name = "o"}):describe())
    assert.equal("moongrad.nn.Dense 's' (units=2, activation=silu)", nn.Dense(2, "swish", {name = "s"}):describe())
    assert.equal("moongrad.nn.Dense 'f' (units=2, activation=custom)",
                 nn.Dense(2, function(x) return x * 2 end, {name = "f"}):describe())
    assert.equal("moongrad.nn.Conv2D 'c' (filters=4, kernel_size=3x3, activation=tanh)",
                 nn.Conv2D(4, 3, {activation = "tanh", name = "c"}):describe())
  end)
end)

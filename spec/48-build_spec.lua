-- Keras' build contract (issue 30, items 1 and 3): a Layer:subclass's own
-- build(input_shape) runs once, before the first call, with the input's
-- shape; models and layers build before any data (model:build,
-- Sequential's input_shape), so weights load into a fresh model.
local h = require "helpers"
local mg = require "moongrad"
local nn = mg.nn

-- a weight-owning layer that counts its builds and notes the shape it got
local function dense_class (base, name, dtype)
  dtype = dtype or "float64"
  local L = (base or nn.Layer):subclass(name or "MyDense")
  function L:init (units) self.units = units; self.builds = 0 end
  function L:build (input_shape)
    self.builds = self.builds + 1
    self.shape_seen = input_shape
    self.w = self:add_variable("w", mg.random.normal({input_shape[#input_shape], self.units}, 0, 0.1, dtype))
    self.b = self:add_variable("b", mg.zeros({self.units}, dtype))
  end
  function L:call (x) return mg.tanh(mg.matmul(x, self.w) + self.b) end
  return L
end

describe("Layer:subclass with a build of its own", function()
  it("builds once, before the first call, with the input's shape", function()
    local L = dense_class()
    local l = L(3)
    assert.is_false(l.built)                                  -- Keras: False until built
    assert.same({}, l.variables)
    local y = l(mg.ones({4, 5}, "float64"))
    assert.same({4, 3}, y.shape)
    assert.is_true(l.built)
    assert.same({4, 5}, l.shape_seen)
    assert.equal(2, #l.variables)
    l(mg.ones({2, 5}, "float64"))
    assert.equal(1, l.builds)
    assert.equal(2, #l.variables)
  end)

  it("built by hand (the batch nil), it does not build again at its first call", function()
    local l = dense_class()(2)
    l:build({nil, 7})
    assert.is_true(l.built)
    assert.same({7, 2}, l.w.shape)
    l(mg.ones({1, 7}, "float64"))
    assert.equal(1, l.builds)
  end)

  it("gives the plain gradients, and so do RecomputeLayer and ReversibleLayer subclasses", function()
    local x = mg.random.normal({5, 6}, 0, 1, "float64")
    local plain = dense_class()(4)
    local recomputed = dense_class(nn.RecomputeLayer, "MyRecomputed")(4)
    plain(x)
    recomputed(x)                                              -- built by its first call
    recomputed.w:assign(plain.w)
    for _, l in ipairs{plain, recomputed} do
      local t = mg.tape()
      t:watch(x)
      local loss = mg.sum(l(x) ^ 2)
      t:stop()
      l.grads = t:gradient(loss, {x, table.unpack(l.trainable_variables)})
    end
    assert.equal(1, recomputed.builds)
    for i = 1, 3 do h.assert_close(recomputed.grads[i], plain.grads[i], 0) end

    local Rev = nn.ReversibleLayer:subclass("MyCoupling")       -- y1 = x1, y2 = x2 + x1 @ w
    function Rev:build (shape) self.w = self:add_variable("w", mg.random.normal({shape[2], shape[2]}, 0, 0.1, "float64")) end
    function Rev:forward (x1, x2) return x1, x2 + mg.matmul(x1, self.w) end
    function Rev:inverse (y1, y2) return y1, y2 - mg.matmul(y1, self.w) end
    local r = Rev()
    local a, b = mg.ones({2, 3}, "float64"), mg.ones({2, 3}, "float64")
    local t = mg.tape()
    t:watch(a)
    local y1, y2 = r(a, b)
    local g = t:gradient(mg.sum(y2), r.w)
    assert.is_true(r.built)
    assert.same({3, 3}, g.shape)
    h.assert_close(g, mg.full({3, 3}, 2, "float64"), 0)
  end)
end)

describe("models that build before their first call", function()
  it("model:build{nil, n} makes every variable, and the weights load into it", function()
    mg.random.seed(1)
    local a = nn.Sequential{nn.Dense(4, "relu"), dense_class(nil, nil, "float32")(2)}
    a:build({nil, 3})
    assert.is_true(a.built)
    assert.equal(4, #a.variables)
    local path = os.tmpname()
    a:save_weights(path)
    local b = nn.Sequential{nn.Dense(4, "relu"), dense_class(nil, nil, "float32")(2)}
    b:build({nil, 3})
    b:load_weights(path)
    os.remove(path)
    local x = mg.random.normal({5, 3})
    h.assert_close(b(mg.cast(x, "float32")), a(mg.cast(x, "float32")), 0)
  end)

  it("Sequential's input_shape (the batch left out) builds at once, and summary needs no call", function()
    local m = nn.Sequential({nn.Dense(8), nn.Dense(1)}, {input_shape = {5}})
    assert.equal(4, #m.variables)
    assert.same({5, 8}, m.layers[1].kernel.shape)
    assert.truthy(m:summary{print_fn = function() end}:find("Total params: 57", 1, true))
  end)

  it("Dense, Conv2D and BatchNorm build from a shape, float32 unless told", function()
    local d = nn.Dense(3)
    d:build({nil, 6}, "float64")
    assert.same({6, 3}, d.kernel.shape)
    assert.equal("float64", d.kernel.dtype)
    local c = nn.Conv2D(4, 3)
    c:build({nil, 8, 8, 2})
    assert.same({3, 3, 2, 4}, c.kernel.shape)
    assert.equal("float32", c.kernel.dtype)
    local bn = nn.BatchNorm()
    bn:build({10, 7})
    assert.same({7}, bn.gamma.shape)
  end)

  it("a model of token ids builds with the input's dtype", function()
    local gpt = nn.Sequential{nn.Embedding(50, 8), nn.Dense(50)}
    gpt:build({nil, 12}, "int64")
    assert.equal(3, #gpt.variables)
    assert.same({2, 12, 50}, gpt(mg.ones({2, 12}, "int64")).shape)
  end)

  it("bad shapes are errors that say what a shape is", function()
    local m = nn.Sequential{nn.Dense(2)}
    assert.has_error(function() m:build("x") end,
      "build: input_shape must be a table of sizes, the batch first (nil allowed: {nil, 20}), got 'x'")
    assert.has_error(function() m:build({nil, -1}) end,
      "build: input_shape[2] must be an integer >= 0, got -1")
    assert.has_error(function() nn.Dense(2):build({}) end,
      "Dense:build: input_shape must give the features (its last entry), got an empty table")
    assert.has_error(function() nn.Sequential({nn.Dense(2)}, {input_shape = {}}) end,
      "Sequential: option 'input_shape' must be a list of sizes, the batch axis left out ({28, 28, 1}), got a table")
  end)

  it("restoring into a model that never ran says how to build it", function()
    local path = os.tmpname()
    local a = nn.Sequential{nn.Dense(2)}
    a(mg.ones({1, 3}))
    a:save_weights(path)
    local ok, err = pcall(function() nn.Sequential{nn.Dense(2)}:load_weights(path) end)
    os.remove(path)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("build it first: model:build{nil, 20}", 1, true), err)
  end)

  it("examples/custom_layer.lua trains a model of its own layers and reloads it", function()
    local out, code = h.run(h.bin .. " examples/custom_layer.lua")
    assert.equal(0, code, out)
    assert.truthy(out:find("built before the first call: 8 variables", 1, true), out)
    assert.truthy(out:find("the copy predicts the same: max difference 0", 1, true), out)
  end)
end)

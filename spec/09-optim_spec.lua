-- mg.optim and mg.progress.
local mg = require "moongrad"
local h = require "helpers"

local function minimize (opt, steps)
  local v = mg.Variable({3.0, -2.0})
  for _ = 1, steps do
    local t = mg.tape()
    local loss = mg.sum((v - 1) ^ 2)
    t:stop()
    opt:apply_gradients({t:gradient(loss, v)}, {v})
  end
  return v
end

describe("optimizers", function()
  it("SGD takes plain gradient steps", function()
    local v = mg.Variable({1.0})
    local opt = mg.optim.SGD{learning_rate = 0.1}
    opt:apply_gradients({mg.constant({2.0})}, {v})
    h.assert_close(v, {0.8}, 1e-6)
    assert.equal(1, opt.iterations)
  end)

  it("SGD with momentum, and Adam, reach the minimum", function()
    h.assert_close(minimize(mg.optim.SGD{learning_rate = 0.05, momentum = 0.9}, 200), {1, 1}, 1e-3)
    h.assert_close(minimize(mg.optim.Adam{learning_rate = 0.05}, 500), {1, 1}, 1e-3)
  end)

  it("Adam's first step is learning_rate in the gradient's sign", function()
    local v = mg.Variable({0.0, 0.0})
    mg.optim.Adam{learning_rate = 0.5}:apply_gradients({mg.constant({3.0, -0.1})}, {v})
    h.assert_close(v, {-0.5, 0.5}, 1e-3)
  end)

  it("skip nil gradients and check their arguments", function()
    local a, b = mg.Variable(1.0), mg.Variable(1.0)
    mg.optim.SGD{learning_rate = 1}:apply_gradients({nil, mg.constant(1.0)}, {a, b})
    assert.equal(1, a:value():item())
    assert.equal(0, b:value():item())
    mg.optim.SGD{learning_rate = 1}:apply_gradients({mg.constant(1.0)}, {a, b})   -- b's gradient: nil
    assert.equal(0, a:value():item())
    assert.equal(0, b:value():item())
    mg.optim.SGD():apply_gradients({}, {a})                                       -- every gradient nil
    assert.has_error(function() mg.optim.SGD():apply_gradients({a, a}, {a}) end, "SGD: 2 gradients for 1 variables")
    assert.has_error(function() mg.optim.SGD():apply_gradients(table.pack(nil), {a, b}) end,
                     "SGD: 1 gradients for 2 variables")
  end)

  it("take Keras' list of {gradient, variable} pairs", function()
    local a, b = mg.Variable({1.0, 2.0}), mg.Variable(5.0)
    mg.optim.SGD{learning_rate = 0.5}:apply_gradients({{mg.constant({2.0, 2.0}), a}, {nil, b}})
    assert.same({0, 1}, a:value():totable())
    assert.equal(5, b:value():item())
  end)

  it("accept Keras' beta_1 and beta_2 for Adam, and a positional learning rate", function()
    local opt = mg.optim.Adam{beta_1 = 0.5, beta_2 = 0.75}
    assert.equal(0.5, opt.beta1)
    assert.equal(0.75, opt.beta2)
    assert.equal(0.25, mg.optim.SGD(0.25).learning_rate)
    assert.equal(0.9, mg.optim.Adam(0.5, {beta_1 = 0.9}).beta1)
  end)
end)

describe("progress", function()
  it("draws a bar with counts, time and values", function()
    local out = {buf = {}}
    function out:write (...) for _, s in ipairs({...}) do self.buf[#self.buf + 1] = s end end
    function out:flush () end
    local bar = mg.progress(4, {label = "fit", out = out})
    bar:update(2, {loss = 0.5})
    bar:finish({loss = 0.25})
    local text = table.concat(out.buf)
    assert.truthy(text:find("fit [===============               ] 2/4", 1, true))
    assert.truthy(text:find("fit [==============================] 4/4", 1, true))
    assert.truthy(text:find("loss 0.25", 1, true))
    assert.equal("\n", text:sub(-1))
    assert.has_error(function() mg.progress(-1) end,
                     "progress: the number of steps must be a non-negative integer, got -1")
  end)
end)

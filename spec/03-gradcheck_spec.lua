-- Every differentiable op against float64 central differences (mg.test.gradcheck).
local mg = require "moongrad"

local gradcheck = mg.test.gradcheck

-- float64 inputs; seeded so failures reproduce
local function rnd (shape, lo, hi)
  return mg.random.uniform(shape, lo or -1, hi or 1, "float64")
end

local function check (f, ...)
  assert.is_true(gradcheck(f, {...}))
end

describe("gradcheck", function()
  before_each(function() mg.random.seed(1234) end)

  it("is a public helper that catches a wrong gradient", function()
    local wrong = mg.custom_gradient(function(x)
      return x * x, function(dy) return dy * x end        -- should be 2 * dy * x
    end)
    assert.has_error(function() gradcheck(wrong, {rnd({3}, 1, 2)}) end)
    assert.has_error(function() gradcheck(mg.exp, {mg.ones{2}}) end,
      "gradcheck: input 1 is float32; finite differences need float64 (use mg.cast(x, 'float64'))")
  end)

  it("passes a right tape on large outputs, where finite differences round (the fuzz's 605780413)", function()
    -- each row of log_softmax ignores a shift, so d/dx of a row's first cumsum
    -- input is exactly 0; the products reach 1e5, whose rounding over 2 eps
    -- leaves about 1e-4 in the differences
    local f = function(x) return mg.prod(mg.log_softmax(mg.cumsum(x), -1), 1) end
    mg.random.seed(5)
    for _ = 1, 4 do assert.is_true(gradcheck(f, {mg.random.normal({3, 4}, 0, 1, "float64") * 2})) end
    -- and still catches a wrong gradient of the same size
    local wrong = mg.custom_gradient(function(x)
      local y = f(x)
      return y, function(dy) return mg.ones_like(x) * mg.sum(dy) * 1e-3 end
    end)
    assert.has_error(function() gradcheck(wrong, {mg.random.normal({3, 4}, 0, 1, "float64") * 2}) end)
  end)

  describe("binary ops, with broadcasting", function()
    local shapes = {{{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}}, {{3}, {}}, {{4, 1, 3}, {2, 1}}}
    for _, op in ipairs({"add", "sub", "mul", "div", "maximum", "minimum"}) do
      it(op, function()
        for _, s in ipairs(shapes) do
          local a, b = rnd(s[1]), rnd(s[2])
          if op == "div" then b = rnd(s[2], 0.5, 2) end
          if op == "maximum" or op == "minimum" then b = b + 0.01 end   -- away from ties
          check(mg[op], a, b)
        end
      end)
    end

    it("pow, in base and exponent", function()
      check(mg.pow, rnd({2, 3}, 0.5, 2), rnd({2, 3}))
      check(mg.pow, rnd({2, 3}, 0.5, 2), rnd({3}))
      check(function(x) return x ^ 3 end, rnd({4}))
      check(function(x) return 2 ^ x end, rnd({4}))
      -- x ^ 2's own backward (dout * 2x, over dout when the walk spares it),
      -- first and second order, through a broadcast dout (mean's) and a fresh one
      check(function(x) return x ^ 2 end, rnd({2, 3}))
      check(function(x) return mg.mean(x ^ 2) end, rnd({2, 3}))
      check(function(x, w) return mg.sum((x ^ 2) * w) end, rnd({2, 3}), rnd({2, 3}))
      check(function(x) return x ^ mg.constant({{2}}, "float64") end, rnd({3}))   -- a (1,1) exponent: summed back
      check(function(x, w)                               -- d/dw of the gradient of sum((x * w) ^ 2)
        local t = mg.tape()
        t:watch(x)
        local y = mg.sum((x * w) ^ 2)
        t:stop()
        return t:gradient(y, x)
      end, rnd({2, 3}), rnd({2, 3}, 0.5, 1.5))
    end)

    it("operators with Lua numbers", function()
      check(function(x) return (1 - x) * 3 / 2 + x / 4 - (-x) end, rnd({3}))
    end)
  end)

  describe("unary ops", function()
    it("exp log sqrt", function()
      check(mg.softplus, rnd({2, 3}, -30, 30))
      check(mg.silu, rnd({2, 3}, -4, 4))
      check(mg.exp, rnd({2, 3}))
      check(mg.log, rnd({2, 3}, 0.5, 3))
      check(mg.sqrt, rnd({2, 3}, 0.5, 3))
    end)

    it("elu and leaky_relu, with their alpha (away from 0)", function()
      local x = mg.constant({{-2.5, -0.7, 0.4}, {1.3, -0.05, 2.2}}, "float64")
      check(mg.elu, x)
      check(function(v) return mg.elu(v, 0.3) end, x)
      check(mg.leaky_relu, x)
      check(function(v) return mg.leaky_relu(v, 0.2) end, x)
    end)

    it("abs relu (away from 0)", function()
      local x = mg.constant({{-1.5, -0.3, 0.4}, {0.7, -2, 1}}, "float64")
      check(mg.abs, x)
      check(mg.relu, x)
    end)

    it("relu's backward (relu_grad) differentiates again", function()
      local x = mg.constant({{-1.5, -0.3, 0.4}, {0.7, -2, 1}}, "float64")
      check(function(v, w)                        -- d/dw of the gradient of sum(relu(v) * w)
        local t = mg.tape()
        t:watch(v)
        local y = mg.sum(mg.relu(v * w) * w)
        t:stop()
        return t:gradient(y, v)
      end, x, rnd({2, 3}, 0.5, 1.5))
    end)

    it("tanh's and sigmoid's backwards (tanh_grad, sigmoid_grad) and their second derivatives", function()
      check(mg.tanh_grad, rnd({2, 3}), rnd({2, 3}, -0.9, 0.9))
      check(mg.sigmoid_grad, rnd({2, 3}), rnd({2, 3}, 0.1, 0.9))
      check(mg.tanh_grad, rnd({2, 3}), rnd({3}, -0.9, 0.9))      -- broadcasting: summed back
      check(mg.sigmoid_grad, rnd({3}), rnd({2, 3}, 0.1, 0.9))
      for _, f in ipairs{mg.tanh, mg.sigmoid} do   -- d/dw of the gradient of sum(f(v * w) * w)
        check(function(v, w)
          local t = mg.tape()
          t:watch(v)
          local y = mg.sum(f(v * w) * w)
          t:stop()
          return t:gradient(y, v)
        end, rnd({2, 3}), rnd({2, 3}, 0.5, 1.5))
      end
    end)

    it("neg tanh sigmoid", function()
      check(mg.neg, rnd({5}))
      check(mg.tanh, rnd({2, 3}, -2, 2))
      check(mg.sigmoid, rnd({2, 3}, -3, 3))
    end)

    it("softmax and log_softmax along each axis", function()
      local x = rnd({3, 4}, -2, 2)
      for _, axis in ipairs({1, 2, -1}) do
        check(function(v) return mg.softmax(v, axis) end, x)
        check(function(v) return mg.log_softmax(v, axis) end, x)
      end
      check(function(v) return mg.softmax(v, 2) end, rnd({2, 3, 4}))
    end)

    it("where, in both branches", function()
      local cond = mg.constant({{true, false, true}, {false, false, true}})
      check(function(a, b) return mg.where(cond, a, b) end, rnd({2, 3}), rnd({3}))
      check(function(a) return mg.where(cond, a, 0) end, rnd({2, 3}))
    end)
  end)

  describe("reductions over each axis", function()
    local x = mg.constant({{{0.1, 0.9, 0.3, 0.6}, {0.5, 0.2, 0.8, 0.4}, {0.7, 0.35, 0.15, 0.05}},
                           {{0.95, 0.25, 0.45, 0.65}, {0.85, 0.55, 0.12, 0.33}, {0.22, 0.77, 0.66, 0.44}}},
                          "float64")   -- distinct values: max/min have one winner
    for _, op in ipairs({"sum", "mean", "max", "min"}) do
      it(op, function()
        check(function(v) return mg[op](v) end, x)
        for _, axis in ipairs({1, 2, 3, -1}) do
          check(function(v) return mg[op](v, axis) end, x)
          check(function(v) return mg[op](v, axis, true) end, x)
        end
        check(function(v) return mg[op](v, {1, 3}) end, x)
      end)
    end

    it("max shares the gradient among ties, as TensorFlow", function()
      local v = mg.constant({1, 3, 3}, "float64")
      local t = mg.tape()
      t:watch(v)
      local m = mg.max(v)
      t:stop()
      assert.same({0, 0.5, 0.5}, t:gradient(m, v):totable())
    end)
  end)

  describe("matmul", function()
    it("2-D, batched, broadcast batch, vectors, transposed views", function()
      check(mg.matmul, rnd({2, 3}), rnd({3, 4}))
      check(mg.matmul, rnd({2, 2, 3}), rnd({2, 3, 4}))
      check(mg.matmul, rnd({2, 2, 3}), rnd({3, 4}))
      check(mg.matmul, rnd({3, 1, 2, 3}), rnd({2, 3, 2}))
      check(mg.matmul, rnd({3}), rnd({3, 2}))
      check(mg.matmul, rnd({2, 3}), rnd({3}))
      check(mg.matmul, rnd({3}), rnd({3}))
      check(function(a, b) return mg.matmul(a:transpose(), b) end, rnd({3, 2}), rnd({3, 4}))
    end)
  end)

  describe("movement ops", function()
    it("identity (gradient dout); stop_gradient is a constant to the tape", function()
      local x = rnd({3, 2}, -1, 1)
      check(function(v) return mg.identity(v) * v end, x)
      check(function(v) return v:identity():sum(1) end, x)
      local t = mg.tape()
      t:watch(x)
      local y = mg.sum(x * mg.stop_gradient(x))
      t:stop()
      assert.same(x:totable(), t:gradient(y, x):totable())   -- d(x * c)/dx = c = x
      assert.is_nil((function() local t2 = mg.tape{warn = false}; t2:watch(x); local z = mg.sum(mg.stop_gradient(x)); t2:stop(); return t2:gradient(z, x) end)())
    end)

    it("reshape, transpose, swapaxes, expand_dims, squeeze, broadcast_to", function()
      local x, w = rnd({2, 3, 4}), rnd({3, 4, 2})
      check(function(v) return v:reshape{4, -1} end, x)
      check(function(v) return v:transpose() end, x)
      check(function(v) return v:transpose({2, 3, 1}) * w end, x)
      check(function(v) return mg.swapaxes(v, 1, 2) end, x)
      check(function(v) return mg.expand_dims(v, 2) end, x)
      check(function(v) return mg.squeeze(v) end, rnd({1, 3, 1}))
      check(function(v) return mg.broadcast_to(v, {2, 3, 4}) end, rnd({3, 1}))
    end)

    it("slice (steps, negative steps, picked indices) and x[i]", function()
      local x = rnd({4, 5})
      check(function(v) return v:slice({2, 3}, {1, 5, 2}) end, x)
      check(function(v) return v:slice({nil, nil, -1}, -2) end, x)
      check(function(v) return v[3] end, x)
    end)

    it("concat and stack along each axis", function()
      local a, b = rnd({2, 3}), rnd({2, 3})
      for _, axis in ipairs({1, 2}) do
        check(function(p, q) return mg.concat({p, q, p}, axis) end, a, b)
      end
      for _, axis in ipairs({1, 2, 3}) do
        check(function(p, q) return mg.stack({p, q}, axis) end, a, b)
      end
    end)

    it("gather, with repeated indices (its adjoint is scatter_add)", function()
      local x = rnd({4, 3})
      check(function(v) return mg.gather(v, {2, 4, 2}) end, x)
      check(function(v) return mg.gather(v, {{3, 1}, {1, 1}}, 2) end, x)
      -- scatter_add's own gradient: differentiate the gradient of gather
      check(function(v)
        local t = mg.tape()
        t:watch(v)
        local y = mg.sum(mg.gather(v, {2, 4, 2}) * mg.gather(v, {1, 2, 3}))
        t:stop()
        return t:gradient(y, v)
      end, x)
    end)
  end)

  it("cast passes the gradient back in the input's dtype", function()
    local x = mg.constant({1, 2}, "float64")
    local t = mg.tape()
    t:watch(x)
    local y = mg.sum(mg.cast(x, "float32") * 3)
    t:stop()
    local g = t:gradient(y, x)
    assert.equal("float64", g.dtype)
    assert.same({3, 3}, g:totable())
    check(function(v) return mg.cast(mg.cast(v, "float64") * v, "float64") end, rnd({3}))
  end)

  it("composite expressions (a small network)", function()
    local w1, w2 = rnd({3, 4}), rnd({4, 2})
    check(function(x, a, b)
      local h = mg.tanh(mg.matmul(x, a) + 0.1)
      return mg.mean(mg.log_softmax(mg.matmul(h, b)), 2)
    end, rnd({5, 3}), w1, w2)
  end)
end)

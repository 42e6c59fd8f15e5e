-- More maths and reductions (src/ops/maths.c, src/lua/lmaths.c): values
-- against hand-computed and well-known results, edge cases, float64
-- gradchecks, second orders and the error messages.
local mg = require "moongrad"
local h = require "helpers"

local c = mg.constant
local close = h.assert_close
local gradcheck = mg.test.gradcheck
local inf, nan = math.huge, 0 / 0

local function rnd (shape, lo, hi)
  return mg.random.uniform(shape, lo or -1, hi or 1, "float64")
end

local function check (f, ...)
  assert.is_true(gradcheck(f, {...}))
end

-- d/dv of sum(f(v)), recorded, so that gradcheck checks the second derivative
local function grad_of (f)
  return function(v) return h.grad(f, v) end
end

-- the gradient of sum(f(x) * w) (w: ones by default) with respect to x
local function grad (f, x, w)
  local t = mg.tape()
  t:watch(x)
  local y = f(x)
  if w then y = y * w end
  y = mg.sum(y)
  t:stop()
  return t:gradient(y, x)
end

local function fails (f, msg) assert.has_error(f, msg) end

describe("more maths", function()
  before_each(function() mg.random.seed(1818) end)

  describe("isfinite isnan isinf", function()
    it("sort every dtype's entries, on views and empty tensors too", function()
      for _, dt in ipairs{"float32", "float64", "float16", "bfloat16"} do
        local x = mg.cast(c{1, nan, inf, -inf, 0, -3e38}, dt)
        assert.same({true, false, false, false, true, dt ~= "float16"}, mg.isfinite(x):totable(), dt)
        assert.same({false, true, false, false, false, false}, mg.isnan(x):totable(), dt)
        assert.same({false, false, true, true, false, dt == "float16"}, mg.isinf(x):totable(), dt)  -- 3e38: inf in float16
        assert.same({false, true}, x:slice({4, 2, -2}):isnan():totable())                        -- a negative-step view
      end
      assert.same({true, true}, mg.isfinite(c({1, 2}, "int64")):totable())
      assert.same({false}, mg.isinf(c({true}, "bool")):totable())
      assert.same({false}, mg.isnan(c({7}, "int64")):totable())
      assert.same({true}, mg.isfinite(c{3e38}):totable())                  -- large, finite: x - x is 0
      assert.same({0, 3}, mg.isnan(mg.zeros{0, 3}).shape)
      assert.equal("bool", mg.isfinite(c(1)).dtype)
      fails(function() mg.isfinite(3) end, "bad argument #1 to 'isfinite' (moongrad.Tensor expected, got number)")
      fails(function() mg.isnan(c{1}, 2) end)
    end)

    it("record nothing a backward keeps, and pass check_numerics on what they exist to find", function()
      local v = mg.Variable(mg.random.normal{100, 100})
      local t = mg.tape()
      local y = v * 2
      local before = mg.memory.stats().saved_bytes
      local a, b, d = mg.isinf(y), mg.isfinite(y), mg.isnan(y)
      assert.equal(before, mg.memory.stats().saved_bytes)
      t:stop()
      local was = mg.debug.check_numerics(true)
      local ok, r = pcall(mg.isfinite, c{1, inf})
      local ok2, r2 = pcall(mg.isinf, mg.cast(c{1, 1e5}, "float16"))
      mg.debug.check_numerics(was)
      assert.is_true(ok, tostring(r))
      assert.same({true, false}, r:totable())
      assert.is_true(ok2, tostring(r2))
      assert.same({false, true}, r2:totable())
    end)
  end)

  describe("sin cos log1p expm1 erf", function()
    it("give the well-known values, in the input's dtype", function()
      local x = c({0, math.pi / 6, math.pi / 2, math.pi}, "float64")
      close(mg.sin(x), {0, 0.5, 1, 0}, 1e-15)
      close(mg.cos(x), {1, math.sqrt(3) / 2, 0, -1}, 1e-15)
      close(mg.sin(c({0.5, -2})), {math.sin(0.5), math.sin(-2)}, 1e-6)
      assert.equal("float32", mg.cos(c({1})).dtype)
      -- log1p and expm1 keep the digits that log(1 + x) and exp(x) - 1 lose
      close(mg.log1p(c({1e-10, -0.5, 1}, "float64")), {9.999999999500001e-11, -math.log(2), math.log(2)}, 1e-15)
      close(mg.expm1(c({1e-10, -0.5, 1}, "float64")), {1.00000000005e-10, -0.3934693402873666, math.exp(1) - 1}, 1e-15)
      close(mg.log1p(c({1e-7})), {9.9999995e-8}, 1e-6)
      close(mg.erf(c({0, 0.5, 1, 2, -3}, "float64")),
            {0, 0.5204998778130465, 0.8427007929497149, 0.9953222650189527, -0.9999779095030014}, 1e-15)
      close(mg.erf(c({0.5})), {0.5204998778130465}, 1e-6)
    end)

    it("at the edges: infinities, NaN, -1 for log1p, empty and 0-d tensors", function()
      close(mg.erf(c({inf, -inf, nan})), {1, -1, nan})
      close(mg.expm1(c({inf, -inf, nan}, "float64")), {inf, -1, nan})
      close(mg.log1p(c({-1, -2, inf}, "float64")), {-inf, nan, inf})
      close(mg.sin(c({inf, nan})), {nan, nan})
      for _, f in ipairs({mg.sin, mg.cos, mg.log1p, mg.expm1, mg.erf}) do
        assert.same({0}, f(mg.zeros{0}).shape)
        assert.same({}, f(c(0.25)).shape)
      end
      close(mg.cos(c(0.25, "float64")):item(), math.cos(0.25), 1e-15)   -- (libmvec's cos: within 4 ulp)
    end)

    it("are methods of tensors and variables", function()
      local x = c({0.1, 0.2}, "float64")
      close(x:sin(), mg.sin(x))
      close(mg.Variable(x):erf(), mg.erf(x))
    end)

    it("gradcheck in float64", function()
      check(mg.sin, rnd({2, 3}, -4, 4))
      check(mg.cos, rnd({2, 3}, -4, 4))
      check(mg.log1p, rnd({2, 3}, -0.9, 3))
      check(mg.expm1, rnd({2, 3}, -3, 3))
      check(mg.erf, rnd({2, 3}, -2, 2))
      check(function(v) return mg.sin(v) * mg.cos(v) end, rnd({4}))
    end)

    it("have exact derivatives: cos, -sin, 1 / (1 + x), e^x, 2/sqrt(pi) e^(-x^2)", function()
      local x = c({-1.5, 0, 0.3, 2}, "float64")
      close(grad(mg.sin, x), mg.cos(x), 1e-15)
      close(grad(mg.cos, x), -mg.sin(x), 1e-15)
      close(grad(mg.log1p, x), 1 / (1 + x), 1e-15)
      close(grad(mg.expm1, x), mg.exp(x), 1e-15)
      close(grad(mg.erf, x), 2 / math.sqrt(math.pi) * mg.exp(-x * x), 1e-15)
    end)

    it("differentiate twice (nested tapes)", function()
      local x = rnd({5}, -2, 2)
      check(grad_of(mg.sin), x)
      check(grad_of(mg.erf), x)
      check(grad_of(mg.log1p), rnd({5}, 0, 2))
      close(grad(grad_of(mg.sin), x), -mg.sin(x), 1e-12)       -- sin'' = -sin
      close(grad(grad_of(mg.expm1), x), mg.exp(x), 1e-12)
    end)

    it("refuse integers and booleans", function()
      fails(function() return mg.sin(c({1}, "int64")) end, "sin: not defined for int64 tensors; cast to float first")
      fails(function() return mg.erf(c({true})) end, "erf: not defined for bool tensors; cast them first")
      fails(function() return mg.log1p() end, "bad argument #1 to 'log1p' (moongrad.Tensor expected, got no value)")
    end)
  end)

  describe("floor ceil round", function()
    it("round halves to even, as NumPy and PyTorch", function()
      local x = c({0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 2.4, -2.6})
      close(mg.round(x), {0, 2, 2, 0, -2, -2, 0, 2, -3})
      assert.equal(-inf, 1 / mg.round(c(-0.5)):item())           -- -0, as in C and NumPy
      local big = c({2 ^ 52 + 1, 0.5000000000000001, 1e300, -inf, nan}, "float64")
      close(mg.round(big), {2 ^ 52 + 1, 1, 1e300, -inf, nan}, 0)
    end)

    it("floor and ceil, with -0, infinities and NaN kept", function()
      local x = c({-1.5, -0.5, 0, 0.5, 1, 2.7, inf, -inf, nan}, "float64")
      close(mg.floor(x), {-2, -1, 0, 0, 1, 2, inf, -inf, nan}, 0)
      close(mg.ceil(x), {-1, 0, 0, 1, 1, 3, inf, -inf, nan}, 0)
      assert.equal(-inf, 1 / mg.ceil(c(-0.5)):item())
      assert.equal("float32", mg.floor(c({1.5})).dtype)
      assert.same({0, 2}, mg.ceil(mg.zeros{0, 2}).shape)
    end)

    it("agree with math.floor, math.ceil and a half-to-even rule at every magnitude", function()
      local function half_even (v)
        local f = math.floor(v)
        local d = v - f                                       -- exact below 2^52
        if d ~= 0.5 then return d < 0.5 and f or f + 1 end
        return f % 2 == 0 and f or f + 1
      end
      for _, dt in ipairs({"float32", "float64"}) do
        local vals = {}
        for e = -3, 60 do
          for _, frac in ipairs({0, 0.25, 0.5, 0.75, 0.123, 0.999}) do
            local v = (1 + frac) * 2 ^ e
            for _, w in ipairs({v, -v, v + 0.5, -v - 0.5}) do vals[#vals + 1] = w end
          end
        end
        local x = mg.cast(c(vals, "float64"), dt)               -- what dt can hold
        local xs = x:totable()
        local fl, ce, ro = mg.floor(x):totable(), mg.ceil(x):totable(), mg.round(x):totable()
        for i, v in ipairs(xs) do
          assert.equal(math.floor(v) + 0.0, fl[i], ("floor(%.17g) %s"):format(v, dt))
          assert.equal(math.ceil(v) + 0.0, ce[i], ("ceil(%.17g) %s"):format(v, dt))
          assert.equal(half_even(v) + 0.0, ro[i], ("round(%.17g) %s"):format(v, dt))
        end
      end
    end)

    it("leave int64 tensors as they are, exactly", function()
      local x = c({math.maxinteger, -3, 0}, "int64")
      for _, f in ipairs({mg.floor, mg.ceil, mg.round}) do
        local y = f(x)
        assert.equal("int64", y.dtype)
        assert.same({math.maxinteger, -3, 0}, y:totable())
      end
      fails(function() return mg.round(c({true})) end, "round: not defined for bool tensors; cast them first")
    end)

    it("are not differentiable: no gradient (TensorFlow's None), as sign and //", function()
      local x = c({0.3, 1.7, -2.2}, "float64")
      for _, f in ipairs({mg.floor, mg.ceil, mg.round}) do
        local t = mg.tape{persistent = true, warn = false}
        t:watch(x)
        local y = f(x)
        t:stop()
        assert.is_nil(t:gradient(y, x))
        assert.same({0, 0, 0}, t:gradient(y, x, nil, {unconnected = "zero"}):totable())
        -- the derivative is 0 wherever it exists, so finite differences agree
        check(function(v) return v * 2 + f(v) end, x)
        check(f, x)
      end
      -- the straight-through trick still works through a custom gradient
      local ste = mg.custom_gradient(function(v) return mg.round(v), function(dy) return dy end end)
      close(grad(ste, x), {1, 1, 1})
    end)
  end)

  describe("clamp and clip_by_value", function()
    local x = c({-1, 0, 0.5, 1, 2, nan}, "float64")

    it("clamp to [lo, hi] with numbers, NaN kept; clip_by_value is the same", function()
      close(mg.clamp(x, 0, 1), {0, 0, 0.5, 1, 1, nan}, 0)
      close(mg.clip_by_value(x, 0, 1), {0, 0, 0.5, 1, 1, nan}, 0)
      close(x:clamp(0, 1), {0, 0, 0.5, 1, 1, nan}, 0)
      close(x:clip_by_value(0, 1), {0, 0, 0.5, 1, 1, nan}, 0)
      assert.equal("float64", mg.clamp(x, 0, 1).dtype)
    end)

    it("one-sided with nil; lo > hi gives hi everywhere (as NumPy and PyTorch)", function()
      close(mg.clamp(x, nil, 0.5), {-1, 0, 0.5, 0.5, 0.5, nan}, 0)
      close(mg.clamp(x, 0.5), {0.5, 0.5, 0.5, 1, 2, nan}, 0)
      close(mg.clamp(x, 1, 0), {0, 0, 0, 0, 0, nan}, 0)
      close(mg.clamp(c({-inf, inf}), -3, 3), {-3, 3})
    end)

    it("a NaN bound gives NaN", function()
      close(mg.clamp(c({0.5}), nan, 1), {nan})
      close(mg.clamp(c({0.5}), 0, nan), {nan})
    end)

    it("bounds may be tensors; all three broadcast", function()
      local m = c({{1, 5, 9}, {-4, 0, 4}})
      local lo, hi = c({0, 2, 3}), c({{2}, {1}})
      local y = mg.clamp(m, lo, hi)
      assert.same({2, 3}, y.shape)
      assert.same({{1, 2, 2}, {0, 1, 1}}, y:totable())    -- lo > hi gives hi
      assert.same({2, 3}, mg.clamp(c({1, 2, 3}), c({{0}, {2}}), 2.5).shape)
      assert.same({{1, 2, 2.5}, {2, 2, 2.5}}, mg.clamp(c({1, 2, 3}), c({{0}, {2}}), 2.5):totable())
    end)

    it("on int64, exactly, and on empty and 0-d tensors", function()
      local i = c({math.mininteger, -5, 7, math.maxinteger}, "int64")
      assert.same({-3, -3, 7, 9}, mg.clamp(i, -3, 9):totable())
      assert.same({math.mininteger, -5, 7, 9}, mg.clamp(i, nil, 9):totable())
      assert.same({-3, -3, 7, math.maxinteger}, mg.clamp(i, -3):totable())
      assert.equal("int64", mg.clamp(i, -3).dtype)
      assert.same({0}, mg.clamp(mg.zeros{0}, 0, 1).shape)
      assert.equal(1, mg.clamp(c(3), 0, 1):item())
    end)

    it("gives the gradient as PyTorch, ties included", function()
      -- torch.clamp(x, lo, hi) with lo, hi tensors, then .backward()
      local function grads (xv, lov, hiv)
        local xs, los, his = c(xv, "float64"), c(lov, "float64"), c(hiv, "float64")
        local t = mg.tape()
        t:watch({xs, los, his})
        local y = mg.clamp(xs, los, his)
        t:stop()
        local g = t:gradient(y, {xs, los, his}, nil, {unconnected = "zero"})
        return g[1]:totable(), g[2]:totable(), g[3]:totable()
      end
      local xs = {-1, 0, 0.5, 1, 2, nan}
      local gx, glo, ghi = grads(xs, {0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1})
      assert.same({0, 1, 1, 1, 0, 0}, gx)                    -- ties at lo and hi go to x
      assert.same({1, 0, 0, 0, 0, 0}, glo)
      assert.same({0, 0, 0, 0, 1, 0}, ghi)
      gx, glo, ghi = grads(xs, {1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0})
      assert.same({0, 0, 0, 0, 0, 0}, gx)                    -- lo > hi: all to hi
      assert.same({0, 0, 0, 0, 0, 0}, glo)
      assert.same({1, 1, 1, 1, 1, 1}, ghi)
      gx, glo, ghi = grads(xs, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1})
      assert.same({0, 0, 0, 1, 0, 0}, gx)                    -- lo == hi, as PyTorch
      assert.same({0, 0, 0, 0, 0, 0}, glo)
      assert.same({0, 0, 0, 0, 1, 0}, ghi)
      -- one-sided: x gets it where x >= lo (ties too), lo where x < lo
      local v = c(xs, "float64")
      assert.same({0, 1, 1, 1, 1, 0}, grad(function(u) return mg.clamp(u, 0) end, v):totable())
      assert.same({1, 1, 1, 1, 0, 0}, grad(function(u) return mg.clamp(u, nil, 1) end, v):totable())
    end)

    it("gradcheck, with broadcast tensor bounds (away from ties)", function()
      local lo, hi = c({-0.5, 0.1, -0.2}, "float64"), c({{0.4}, {0.6}}, "float64")
      local xv = c({{-0.9, 0.35, 0.05}, {0.75, 0.3, -0.45}}, "float64")
      check(mg.clamp, xv, lo, hi)
      check(function(v) return mg.clamp(v, -0.3, 0.3) end, rnd({3, 4}))
      check(function(v) return mg.clip_by_value(v, nil, 0.2) end, rnd({5}))
      check(function(v, a) return mg.clamp(v, a) end, xv, lo)
    end)

    it("differentiates again (a piecewise-linear gradient: its own gradient is 0)", function()
      check(grad_of(function(v) return mg.clamp(v, -0.3, 0.3) * v end), c({-0.5, -0.1, 0.2, 0.6}, "float64"))
    end)

    it("errors name clamp (or clip_by_value) and the mismatch", function()
      fails(function() return mg.clamp(mg.ones{2}) end, "clamp: lo and hi are both nil (give at least one bound)")
      fails(function() return mg.clip_by_value(mg.ones{2}, nil, nil) end,
            "clip_by_value: lo and hi are both nil (give at least one bound)")
      fails(function() return mg.clamp(mg.ones{2}, "a", 1) end,
            "bad argument #2 to 'clamp' (moongrad.Tensor or number expected, got string)")
      fails(function() return mg.clamp(nil, 0, 1) end,
            "bad argument #1 to 'clamp' (moongrad.Tensor expected, got nil)")
      fails(function() return mg.clamp(mg.ones{2}, c({0}, "float64"), 1) end,
            "clamp: dtypes differ: x is float32, lo is float64, hi is float32")
      fails(function() return mg.clamp(mg.ones{2, 3}, mg.zeros{4}, 1) end,
            "clamp: shapes do not broadcast: (2,3) and lo (4) (dimension 2: 3 vs 4)")
      fails(function() return mg.clamp(mg.ones{2, 3}, 0, mg.ones{2, 2}) end,
            "clamp: shapes do not broadcast: (2,3) and hi (2,2) (dimension 2: 3 vs 2)")
      fails(function() return mg.clamp(c({1}, "int64"), 0.5, 2) end, "clamp: cannot convert 0.5 to int64")
      fails(function() return mg.clip_by_value(c({true}), false, true) end, "clamp: not defined for bool tensors")
    end)

    it("leaks nothing when it fails", function()
      local before = h.live()
      for _ = 1, 3 do
        pcall(mg.clamp, mg.ones{2, 3}, mg.zeros{4})
        pcall(mg.clamp, mg.ones{2}, c({0}, "float64"))
        pcall(mg.clamp, c({1}, "int64"), 0.5)
      end
      assert.equal(before, h.live())
    end)
  end)

  describe("prod", function()
    local m = c({{1, 2, 3}, {4, 5, 6}})

    it("over all axes, an axis, a list of axes, with keepdims", function()
      assert.equal(720, mg.prod(m):item())
      assert.same({6, 120}, mg.prod(m, 2):totable())
      assert.same({4, 10, 18}, mg.prod(m, 1):totable())
      assert.same({{4, 10, 18}}, m:prod(-2, true):totable())
      assert.equal(720, mg.prod(m, {1, 2}):item())
      local x = rnd({2, 3, 4}, 0.5, 1.5)
      close(mg.prod(x, {1, 3}), mg.prod(mg.prod(x, 3), 1), 1e-12)
    end)

    it("of nothing is 1; of a 0-d tensor is itself; NaN and zeros propagate", function()
      assert.equal(1, mg.prod(mg.zeros{0}):item())
      assert.same({1, 1}, mg.prod(mg.zeros{2, 0}, 2):totable())
      assert.same({0}, mg.prod(mg.zeros{2, 0}, 1).shape)
      assert.equal(-2.5, mg.prod(c(-2.5)):item())
      close(mg.prod(c({2, nan, 0})), {nan})
      assert.equal(0, mg.prod(c({3, 0, 7})):item())
      close(mg.prod(c({inf, 0})), {nan})                      -- inf * 0, as IEEE
    end)

    it("on int64 exactly (wrapping as NumPy) and bool as int64", function()
      assert.equal(3 << 53, mg.prod(c({3, 1 << 52, 2}, "int64")):item())
      assert.equal(0, mg.prod(c({1 << 62, 4}, "int64")):item())       -- 2^64 wraps to 0
      assert.equal("int64", mg.prod(c({true, true})).dtype)
      assert.equal(0, mg.prod(c({true, false})):item())
    end)

    it("has the right gradient with zeros in the input (no division by zero)", function()
      local function g (v) return grad(mg.prod, c(v, "float64")):totable() end
      assert.same({60, 40, 30, 24}, g({2, 3, 4, 5}))
      assert.same({0, 30, 0, 0}, g({2, 0, 3, 5}))             -- one zero: only it gets the product of the others
      assert.same({0, 0, 0, 0}, g({2, 0, 3, 0}))              -- two zeros: all zero
      assert.same({1}, g({0}))
      -- along an axis, with a zero in one row only
      local x = c({{0, 2, 3}, {4, 5, 6}, {0, 0, 1}}, "float64")
      assert.same({{6, 0, 0}, {30, 24, 20}, {0, 0, 0}}, grad(function(v) return mg.prod(v, 2) end, x):totable())
      assert.same({{0, 0, 6}, {0, 0, 3}, {0, 10, 18}}, grad(function(v) return mg.prod(v, 1) end, x):totable())
    end)

    it("gradcheck over each axis, keepdims and lists, with and without zeros", function()
      local x = rnd({2, 3, 4}, 0.5, 1.5)
      check(mg.prod, x)
      for _, axis in ipairs({1, 2, 3, -1}) do
        check(function(v) return mg.prod(v, axis) end, x)
        check(function(v) return mg.prod(v, axis, true) end, x)
      end
      check(function(v) return mg.prod(v, {1, 3}) end, x)
      -- a product is a polynomial: central differences are exact at 0 too
      check(function(v) return mg.prod(v, 2) end, c({{0, 1.5, -2}, {0.5, 0, 0}, {0, 0.7, 1.1}}, "float64"))
    end)

    it("differentiates twice: the hessian with one zero, as PyTorch's", function()
      local x = c({2, 0, 3, 5}, "float64")
      local outer = mg.tape()
      outer:watch(x)
      local inner = mg.tape()
      inner:watch(x)
      local p = mg.prod(x)
      inner:stop()
      local g = inner:gradient(p, x)
      outer:stop()
      assert.same({{0, 15, 0, 0}, {15, 0, 10, 6}, {0, 10, 0, 0}, {0, 6, 0, 0}}, outer:jacobian(g, x):totable())
      check(grad_of(mg.prod), rnd({4}, 0.5, 2))
      check(grad_of(function(v) return mg.prod(v, 1) end), c({{0, 2}, {3, 0.5}, {1.5, 2}}, "float64"))
    end)
  end)

  describe("logsumexp", function()
    local x = c({{0.3, -1.2, 2.0}, {0.7, 0.1, -0.4}}, "float64")

    it("matches log(sum(exp(x))), over all, each axis and lists, with keepdims", function()
      close(mg.logsumexp(x, 2), {2.2016712449527907, 1.3321664402303957}, 1e-15)
      close(mg.logsumexp(x, 1), {1.2130152523999524, 0.34100845383299216, 2.08683615215395}, 1e-15)
      close(mg.logsumexp(x), {2.5517357323045364}, 1e-15)
      close(mg.logsumexp(x, {1, 2}), {2.5517357323045364}, 1e-15)
      assert.same({2, 1}, x:logsumexp(2, true).shape)
      local y = rnd({3, 4, 5}, -3, 3)
      close(mg.logsumexp(y, 2), mg.log(mg.sum(mg.exp(y), 2)), 1e-13)
      close(mg.logsumexp(y:cast("float32"), 3), mg.log(mg.sum(mg.exp(y), 3)), 1e-6)
    end)

    it("is stable: no overflow, no underflow, and the infinities right", function()
      close(mg.logsumexp(c({1000, 1000}, "float64")), {1000 + math.log(2)}, 1e-15)
      close(mg.logsumexp(c({-1000, -1000})), {-1000 + math.log(2)}, 1e-6)
      close(mg.logsumexp(c({{1000}, {1000}}), 1), {1000 + math.log(2)}, 1e-6)   -- along columns too
      close(mg.logsumexp(c({-inf, -inf})), {-inf})
      close(mg.logsumexp(c({inf, 1})), {inf})
      close(mg.logsumexp(c({{-inf, 0}, {-inf, 0}}), 1), {-inf, math.log(2)}, 1e-6)
      close(mg.logsumexp(c({nan, 1})), {nan})
      close(mg.logsumexp(mg.zeros{0}), {-inf})                -- log of an empty sum
      close(mg.logsumexp(c(2.5)), {2.5})
    end)

    it("gives float64 for int64 and bool", function()
      local y = mg.logsumexp(c({0, 0}, "int64"))
      assert.equal("float64", y.dtype)
      close(y, {math.log(2)}, 1e-15)
    end)

    it("has the softmax for its gradient; gradcheck and second order", function()
      close(grad(function(v) return mg.logsumexp(v, 2) end, x), mg.softmax(x, 2), 1e-15)
      for _, axis in ipairs({1, 2, -1}) do
        check(function(v) return mg.logsumexp(v, axis) end, x)
        check(function(v) return mg.logsumexp(v, axis, true) end, x)
      end
      check(mg.logsumexp, rnd({2, 3, 2}, -3, 3))
      check(function(v) return mg.logsumexp(v, {1, 3}) end, rnd({2, 3, 2}, -3, 3))
      check(function(v) return mg.logsumexp(v * 300, 2) end, x)   -- shifted, no overflow in the gradient
      check(grad_of(function(v) return mg.logsumexp(v, 1) end), x)
    end)
  end)

  describe("var and std", function()
    local x = c({{0.3, -1.2, 2.0}, {0.7, 0.1, -0.4}}, "float64")

    it("default to ddof = 0 (NumPy, TensorFlow's reduce_variance)", function()
      assert.equal(1.25, mg.var(c({1, 2, 3, 4})):item())
      close(mg.std(c({1, 2, 3, 4}, "float64")), {math.sqrt(1.25)}, 1e-15)
      close(mg.var(x, 2), {1.708888888888889, 0.20222222222222222}, 1e-14)
      close(mg.std(x, 2), {1.307244770075172, 0.4496912521077347}, 1e-14)
      close(mg.var(x), {1.163 * 5 / 6}, 1e-14)
    end)

    it("take ddof or unbiased in an options table, last", function()
      close(mg.var(c({1, 2, 3, 4}), {ddof = 1}), {5 / 3}, 1e-6)
      close(mg.var(x, 1, {unbiased = true}), {0.08, 0.845, 2.88}, 1e-14)
      close(mg.var(x, 1, false, {ddof = 1}), {0.08, 0.845, 2.88}, 1e-14)
      close(x:std(1, true, {ddof = 1}), {{math.sqrt(0.08), math.sqrt(0.845), math.sqrt(2.88)}}, 1e-14)
      close(mg.var(x, nil, nil, {ddof = 0.5}), {1.163 * 5 / 5.5}, 1e-14)
      close(mg.var(x, {unbiased = true}), {1.163}, 1e-14)   -- PyTorch's default
    end)

    it("over lists of axes (the axes merged) and with keepdims", function()
      local y = rnd({3, 4, 5})
      local merged = y:transpose({2, 1, 3}):reshape{4, 15}
      close(mg.var(y, {1, 3}), mg.var(merged, 2), 1e-14)
      close(mg.std(y, {3, 1}, true, {ddof = 1}), mg.std(merged, 2, false, {ddof = 1}):reshape{1, 4, 1}, 1e-14)
      close(mg.var(y, {1, 2, 3}), mg.var(y), 1e-14)
      close(mg.var(y, {}), mg.zeros_like(y), 0)              -- over no axes: each element alone
      close(mg.var(y, {2}, true), mg.var(y, 2, true), 0)
    end)

    it("at the edges: one element, empty, constant, int64", function()
      close(mg.var(c({3})), {0})
      close(mg.var(c({3}), {ddof = 1}), {nan})                -- 0 / 0, as NumPy
      close(mg.var(c({3, 5}), {ddof = 3}), {inf})             -- n - ddof < 0 divides by 0
      close(mg.var(mg.zeros{0}), {nan})
      assert.same({0}, mg.std(mg.zeros{2, 0}, 1).shape)
      close(mg.std(c({7, 7, 7})), {0})
      local i = mg.var(c({1, 2, 3, 4}, "int64"))
      assert.equal("float64", i.dtype)
      assert.equal(1.25, i:item())
      close(mg.var(c({1e9 + 1, 1e9 + 2, 1e9 + 3}, "float64")), {2 / 3}, 1e-9)   -- two passes: no cancellation
    end)

    it("gradcheck over axes, keepdims, lists and ddof", function()
      local y = rnd({2, 3, 4})
      for _, f in ipairs({mg.var, mg.std}) do
        check(function(v) return f(v) end, y)
        for _, axis in ipairs({1, 2, 3}) do
          check(function(v) return f(v, axis) end, y)
          check(function(v) return f(v, axis, true, {ddof = 1}) end, y)
        end
        check(function(v) return f(v, {1, 3}, {ddof = 1}) end, y)
      end
    end)

    it("differentiate twice", function()
      local y = rnd({3, 4})
      check(grad_of(function(v) return mg.var(v, 2) end), y)
      check(grad_of(function(v) return mg.std(v, 1, false, {ddof = 1}) end), y)
    end)

    it("std has gradient 0 on a constant slice (no NaN), as PyTorch", function()
      local g = grad(function(v) return mg.std(v, 2) end, c({{2, 2, 2}, {1, 2, 3}}, "float64"))
      close(g, {{0, 0, 0}, {-1 / math.sqrt(6), 0, 1 / math.sqrt(6)}}, 1e-15)
    end)

    it("check their options", function()
      fails(function() return mg.var(mg.ones{2}, {ddof = -1}) end,
            "bad argument #2 to 'var' (option 'ddof' must be a finite number >= 0, got -1)")
      fails(function() return mg.std(mg.ones{2}, 1, {ddof = 0 / 0}) end,
            "bad argument #3 to 'std' (option 'ddof' must be a finite number >= 0, got NaN)")
      fails(function() return mg.var(mg.ones{2}, {ddof = "1"}) end,
            "bad argument #2 to 'var' (option 'ddof' must be a number, got string)")
      fails(function() return mg.var(mg.ones{2}, {dof = 1}) end,
            "bad argument #2 to 'var' (unknown option 'dof' (did you mean 'ddof'?); known: ddof, unbiased)")
      fails(function() return mg.var(mg.ones{2}, {ddof = 1, unbiased = true}) end,
            "bad argument #2 to 'var' (give ddof or unbiased, not both)")
      fails(function() return mg.var(mg.ones{2}, 1, 1) end,
            "bad argument #3 to 'var' (keepdims must be a boolean, got number)")
      fails(function() return mg.var(mg.ones{2}, 2) end,
            "bad argument #2 to 'var' (axis 2 is out of range for 1 dimensions (use 1..1 or -1..-1))")
      fails(function() return mg.std(mg.ones{2, 2}, {1, 1}) end, "bad argument #2 to 'std' (axes must be distinct)")
      fails(function() return mg.std(mg.ones{2, 2}, {1, 2.5}) end,
            "bad argument #2 to 'std' (axis 2 in the list is 2.5, not an integer)")
      fails(function() return mg.var(mg.ones{2}, 1, {ddof = 1}, true) end,     -- options come last
            "bad argument #3 to 'var' (keepdims must be a boolean, got table)")
    end)
  end)

  describe("norm", function()
    it("L2 by default, ord 1 and math.huge (inf); axes, lists, keepdims", function()
      assert.equal(5, mg.norm(c({3, 4})):item())
      assert.equal(7, mg.norm(c({3, -4}), {ord = 1}):item())
      assert.equal(4, mg.norm(c({3, -4}), {ord = math.huge}):item())
      local x = c({{0.3, -1.2, 2.0}, {0.7, 0.1, -0.4}}, "float64")
      close(mg.norm(x, 2), {2.351595203260969, 0.812403840463596}, 1e-15)
      close(x:norm(1, true, {ord = 1}), {{1.0, 1.3, 2.4}}, 1e-15)
      close(mg.norm(x, -1, {ord = math.huge}), {2, 0.7}, 0)
      local y = rnd({3, 4, 5})
      close(mg.norm(y, {1, 3}), mg.sqrt(mg.sum(y * y, {1, 3})), 1e-14)
      close(mg.norm(y, {1, 3}, true, {ord = 1}), mg.sum(mg.abs(y), {1, 3}, true), 1e-14)
      close(mg.norm(y, {1, 3}, {ord = math.huge}), mg.max(mg.abs(y), {1, 3}), 0)
    end)

    it("at the edges: zeros, empty, NaN, large float32", function()
      assert.equal(0, mg.norm(mg.zeros{3}):item())
      assert.equal(0, mg.norm(mg.zeros{0}):item())
      assert.equal(0, mg.norm(mg.zeros{0}, {ord = 1}):item())
      close(mg.norm(c({1, nan, 2}), {ord = math.huge}), {nan})
      close(mg.norm(c({nan, 1, 2})), {nan})
      close(mg.norm(c({3e30, 4e30})), {5e30}, 1e-6)          -- squares in double: no overflow
      assert.equal("float64", mg.norm(c({3, 4}, "int64")).dtype)
    end)

    it("has gradient 0 at 0 (no NaN), for every ord", function()
      for _, ord in ipairs({1, 2, math.huge}) do
        local g = grad(function(v) return mg.norm(v, {ord = ord}) end, mg.zeros({3}, "float64"))
        assert.same({0, 0, 0}, g:totable())
      end
      local g = grad(function(v) return mg.norm(v, 2) end, c({{0, 0}, {3, 4}}, "float64"))
      close(g, {{0, 0}, {0.6, 0.8}}, 1e-15)
      -- the second derivative at 0 is no NaN either
      local t2 = grad(grad_of(function(v) return mg.norm(v) end), mg.zeros({2}, "float64"))
      assert.same({0, 0}, t2:totable())
    end)

    it("shares the inf-norm's gradient among ties, with the sign (as PyTorch)", function()
      assert.same({0, -0.5, 0.5}, grad(function(v) return mg.norm(v, {ord = math.huge}) end,
                                       c({1, -3, 3}, "float64")):totable())
      assert.same({-1, 0, 1}, grad(function(v) return mg.norm(v, {ord = 1}) end, c({-2, 0, 5}, "float64")):totable())
    end)

    it("gradcheck for each ord, over axes and lists; second order for L2", function()
      local y = c({{0.3, -1.2, 2.0, 0.45}, {0.7, 0.1, -0.4, -0.9}, {1.5, -0.25, 0.6, 0.05}}, "float64")
      for _, ord in ipairs({1, 2, math.huge}) do
        check(function(v) return mg.norm(v, {ord = ord}) end, y)
        check(function(v) return mg.norm(v, 1, {ord = ord}) end, y)
        check(function(v) return mg.norm(v, 2, true, {ord = ord}) end, y)
      end
      check(function(v) return mg.norm(v, {1, 2}) end, rnd({2, 3, 2}))
      check(grad_of(function(v) return mg.norm(v, 2) end), y)
    end)

    it("checks ord", function()
      fails(function() return mg.norm(mg.ones{2}, {ord = 3}) end,
            "bad argument #2 to 'norm' (option 'ord' must be 1, 2 or math.huge, got 3)")
      fails(function() return mg.norm(mg.ones{2}, 1, {ord = -math.huge}) end,
            "bad argument #3 to 'norm' (option 'ord' must be 1, 2 or math.huge, got -math.huge)")
      fails(function() return mg.norm(mg.ones{2}, {ord = "fro"}) end,
            "bad argument #2 to 'norm' (option 'ord' must be a number, got string)")
      fails(function() return mg.norm(mg.ones{2}, {p = 2}) end,
            "bad argument #2 to 'norm' (unknown option 'p'; known: ord)")
      fails(function() return mg.norm(mg.zeros{2, 0}, 2, {ord = math.huge}) end,
            "norm: the inf-norm of an empty axis is not defined (a max of nothing)")
    end)
  end)

  describe("cumsum", function()
    local m = c({{1, 2, 3}, {4, 5, 6}})

    it("along an axis, or the flattened tensor without one (as NumPy)", function()
      assert.same({{1, 3, 6}, {4, 9, 15}}, mg.cumsum(m, 2):totable())
      assert.same({{1, 2, 3}, {5, 7, 9}}, m:cumsum(1):totable())
      assert.same({{1, 3, 6}, {4, 9, 15}}, mg.cumsum(m, -1):totable())
      assert.same({1, 3, 6, 10, 15, 21}, mg.cumsum(m):totable())
    end)

    it("exclusive and reverse, as TensorFlow's", function()
      assert.same({{0, 1, 3}, {0, 4, 9}}, mg.cumsum(m, 2, {exclusive = true}):totable())
      assert.same({{6, 5, 3}, {15, 11, 6}}, mg.cumsum(m, 2, {reverse = true}):totable())
      assert.same({{5, 3, 0}, {11, 6, 0}}, mg.cumsum(m, 2, {exclusive = true, reverse = true}):totable())
      assert.same({{4, 5, 6}, {0, 0, 0}}, mg.cumsum(m, 1, {exclusive = true, reverse = true}):totable())
      assert.same({21, 20, 18, 15, 11, 6}, mg.cumsum(m, {reverse = true}):totable())
    end)

    it("on int64 exactly, bool as int64, empty and 0-d tensors", function()
      local i = mg.cumsum(c({math.maxinteger - 2, 1, 1}, "int64"))
      assert.same({math.maxinteger - 2, math.maxinteger - 1, math.maxinteger}, i:totable())
      assert.same({1, 1, 2}, mg.cumsum(c({true, false, true})):totable())
      assert.equal("int64", mg.cumsum(c({true})).dtype)
      assert.same({0, 3}, mg.cumsum(mg.zeros{0, 3}, 1).shape)
      assert.same({0}, mg.cumsum(mg.zeros{0, 3}).shape)
      assert.same({2.5}, mg.cumsum(c(2.5)):totable())          -- flattened: 1-D
      assert.same({4, 3}, mg.cumsum(mg.ones{4, 3}, 2).shape)
    end)

    it("accumulates float32 in double", function()
      local x = mg.full({1e6}, 0.1)
      close(mg.cumsum(x)[1e6], {1e5}, 1e-6)
      close(mg.cumsum(mg.full({1e6, 2}, 0.1), 1)[1e6], {1e5, 1e5}, 1e-6)    -- columns too
    end)

    it("has the reverse cumsum for its gradient", function()
      local x, w = c({{1, 2, 3}, {4, 5, 6}}, "float64"), c({{1, 10, 100}, {2, 20, 200}}, "float64")
      assert.same({{111, 110, 100}, {222, 220, 200}}, grad(function(v) return mg.cumsum(v, 2) end, x, w):totable())
      assert.same({{110, 100, 0}, {220, 200, 0}},
                  grad(function(v) return mg.cumsum(v, 2, {exclusive = true}) end, x, w):totable())
      assert.same({{1, 11, 111}, {2, 22, 222}},
                  grad(function(v) return mg.cumsum(v, 2, {reverse = true}) end, x, w):totable())
    end)

    it("gradcheck along each axis, flattened, exclusive, reverse; second order", function()
      local x = rnd({2, 3, 4})
      for _, axis in ipairs({1, 2, 3, -1}) do
        check(function(v) return mg.cumsum(v, axis) end, x)
        check(function(v) return mg.cumsum(v, axis, {exclusive = true, reverse = true}) end, x)
        check(function(v) return mg.cumsum(v, axis, {reverse = true}) end, x)
      end
      check(function(v) return mg.cumsum(v) end, x)
      check(function(v) return mg.cumsum(v, {exclusive = true}) end, x)
      check(grad_of(function(v) return mg.cumsum(v * v, 2) end), rnd({2, 3}))
    end)

    it("checks its arguments", function()
      fails(function() return mg.cumsum(m, 3) end,
            "bad argument #2 to 'cumsum' (axis 3 is out of range for 2 dimensions (use 1..2 or -2..-1))")
      fails(function() return mg.cumsum(c(1), 1) end,
            "bad argument #2 to 'cumsum' (axis 1 is out of range for a 0-d tensor)")
      fails(function() return mg.cumsum(m, {revrese = true}) end,
            "bad argument #2 to 'cumsum' (unknown option 'revrese' (did you mean 'reverse'?); known: exclusive, reverse)")
      fails(function() return mg.cumsum(m, 1, {reverse = 1}) end,
            "bad argument #3 to 'cumsum' (option 'reverse' must be a boolean, got number)")
      fails(function() return mg.cumsum(m, "1") end,
            "bad argument #2 to 'cumsum' (axis expected (an integer), got string)")
    end)
  end)

  describe("large inputs (threaded, columns cut in chunks)", function()
    it("agree with composites of the older ops along each axis", function()
      for _, shape in ipairs({{600, 700}, {3, 400, 300}}) do
        local x = rnd(shape, 0.5, 1.5)
        for axis = 1, #shape do
          local mean = mg.mean(x, axis, true)
          close(mg.var(x, axis), mg.mean((x - mean) ^ 2, axis), 1e-10)
          close(mg.std(x, axis, {ddof = 1}), mg.sqrt(mg.sum((x - mean) ^ 2, axis) / (shape[axis] - 1)), 1e-10)
          close(mg.prod(x, axis), mg.exp(mg.sum(mg.log(x), axis)), 1e-9)
          close(mg.logsumexp(x, axis), mg.log(mg.sum(mg.exp(x), axis)), 1e-12)
          close(mg.norm(x, axis), mg.sqrt(mg.sum(x * x, axis)), 1e-12)
          close(mg.norm(x, axis, {ord = 1}), mg.sum(mg.abs(x), axis), 1e-12)
          close(mg.norm(x, axis, {ord = math.huge}), mg.max(mg.abs(x), axis), 0)
          local cs = mg.cumsum(x, axis, {reverse = true})
          close(mg.sum(x, axis), cs:slice(table.unpack(axis == 1 and {1} or axis == 2 and {nil, 1} or {nil, nil, 1})), 1e-12)
        end
      end
      local f = mg.cast(rnd({700, 600}), "float32")
      close(mg.var(f, 1), mg.var(mg.cast(f, "float64"), 1), 1e-6)
      close(mg.logsumexp(f, 2), mg.logsumexp(mg.cast(f, "float64"), 2), 1e-6)
    end)
  end)

  describe("the registry", function()
    it("lists each op once, with a kind and a one-line doc", function()
      local kinds = {sin = "unary", cos = "unary", log1p = "unary", expm1 = "unary", erf = "unary",
                     floor = "unary", ceil = "unary", round = "unary", clamp = "other", prod = "reduce",
                     logsumexp = "reduce", var = "other", std = "other", norm = "other", cumsum = "other"}
      local seen = {}
      for _, op in ipairs(mg.ops()) do
        if kinds[op.name] then
          assert.is_nil(seen[op.name], op.name)
          seen[op.name] = true
          assert.equal(kinds[op.name], op.kind, op.name)
          assert.truthy(#op.doc > 0 and not op.doc:find("\n"), op.name)
        end
      end
      for name in pairs(kinds) do
        assert.is_true(seen[name], name)
        assert.is_function(mg[name], name)
        assert.is_function(mg.ones{1}[name], name)
      end
      assert.is_function(mg.clip_by_value)
    end)

    it("every new op works on a variable's value", function()
      local v = mg.Variable(c({0.2, 0.4}, "float64"))
      close(v:clamp(0.3), {0.3, 0.4})
      close(v:cumsum(), {0.2, 0.6}, 1e-15)
      close(v:norm({ord = 1}), {0.6}, 1e-15)
      close(mg.var(v), {0.01}, 1e-14)
      local t = mg.tape()
      local y = mg.logsumexp(v) + mg.prod(v)
      t:stop()
      close(t:gradient(y, v), mg.softmax(v:value()) + c({0.4, 0.2}, "float64"), 1e-15)
    end)
  end)

  describe("tanh_grad and sigmoid_grad", function()
    it("give the activations' backwards from their outputs", function()
      local d, y = mg.constant({0.5, -2, 3}, "float64"), mg.constant({0.2, -0.7, 0.9}, "float64")
      close(mg.tanh_grad(d, y), d * (1 - y * y), 1e-15)
      close(mg.sigmoid_grad(d, y), d * y * (1 - y), 1e-15)
    end)

    it("name what is wrong", function()
      assert.has_error(function() mg.tanh_grad(mg.ones{2}, mg.ones({2}, "float64")) end,
                       "tanh_grad: dtypes differ: float32 , float64")
      assert.has_error(function() mg.sigmoid_grad(mg.ones{2, 3}, mg.ones{4}) end,
                       "sigmoid_grad: shapes do not broadcast: (2,3) , (4) (dimension 2: 3 vs 4)")
      assert.has_error(function() mg.sigmoid_grad(mg.constant({1, 2}, "int64"), mg.constant({1, 2}, "int64")) end,
                       "sigmoid_grad: not defined for int64 tensors; cast to float first")
      assert.has_error(function() mg.tanh_grad(mg.ones{2}, nil) end,
                       "bad argument #2 to 'tanh_grad' (moongrad.Tensor or number expected, got nil)")
    end)
  end)
end)

-- libm's vector variants (libmvec) may differ from scalar libm in the last
-- bit: an element's value must not depend on where it sits (a strided view,
-- a loop's tail, a thread's chunk), or a gradient through a contiguous copy
-- (saved-tensor hooks, spilling) differs from the plain tape's
describe("elementwise maths gives the same bits whatever the layout", function()
  local function same_bits (a, b, what)
    assert.are.same(a.shape, b.shape, what)
    local differ = mg.sum(mg.cast(mg.not_equal(a, b), "int64")):item()
    assert.are.equal(0, differ, what .. ": " .. differ .. " elements differ")
  end
  local function contiguous (v) return v * 1 end   -- (a copy: x * 1 is x exactly)
  local unary = {"exp", "log", "tanh", "sin", "cos", "log1p", "expm1", "erf", "sigmoid", "softplus", "silu", "elu",
                 "sqrt", "abs"}
  for _, dt in ipairs{"float32", "float64"} do
    it(dt .. ": strided views, transposes and short tails against contiguous copies", function()
      mg.random.seed(11)
      local base = mg.abs(mg.random.normal({67, 45}, 0, 1.5, dt)) + 0.01   -- (positive: log, sqrt)
      local views = {
        mg.slice(base, {1, 67, 2}),                      -- every other row
        mg.transpose(base),                              -- columns
        mg.slice(base, {67, 1, -3}, {45, 1, -2}),        -- backwards in both
        mg.slice(base, {1, 3}, {1, 5}),                  -- shorter than a vector block
      }
      for _, name in ipairs(unary) do
        for k, v in ipairs(views) do
          same_bits(mg[name](v), mg[name](contiguous(v)), ("%s of view %d"):format(name, k))
        end
      end
      for k, v in ipairs(views) do
        local e = contiguous(v) * 0 + 1.7
        same_bits(v ^ 1.7, contiguous(v) ^ 1.7, "pow of view " .. k)
        same_bits(v ^ e, contiguous(v) ^ contiguous(e), "pow, tensor exponent, of view " .. k)
      end
    end)
  end
end)

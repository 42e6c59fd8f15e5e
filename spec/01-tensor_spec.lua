-- Tensors: construction, dtypes, reading values out, views and tostring.
local mg = require "moongrad"
local h = require "helpers"

describe("constructors", function()
  it("constant builds from numbers and nested tables, float32 by default", function()
    local a = mg.constant({{1, 2}, {3, 4}})
    assert.same({2, 2}, a.shape)
    assert.equal("float32", a.dtype)
    assert.equal(2, a.ndim)
    assert.same({{1, 2}, {3, 4}}, a:totable())
    local s = mg.constant(1.5)
    assert.same({}, s.shape)
    assert.equal(0, s.ndim)
    assert.equal(1.5, s:item())
  end)

  it("names a dtype as the second argument", function()
    local a = mg.constant({1, 2, 3}, "int64")
    assert.equal("int64", a.dtype)
    assert.equal(math.type(a[1]:item()), "integer")
    assert.equal("float64", mg.tensor({0.1}, "float64").dtype)
    assert.equal(0.1, mg.tensor({0.1}, "float64")[1]:item())   -- exact in float64
  end)

  it("says its bytes: itemsize and nbytes, as PyTorch's, on tensors and variables", function()
    local sizes = {float32 = 4, float64 = 8, bfloat16 = 2, float16 = 2, int64 = 8, bool = 1}
    for dtype, size in pairs(sizes) do
      local t = mg.zeros({3, 5}, dtype)
      assert.equal(size, t.itemsize)
      assert.equal(15 * size, t.nbytes)
      assert.equal(0, mg.zeros({0, 4}, dtype).nbytes)
    end
    local v = mg.Variable(mg.ones({2, 2}, "float64"))
    assert.same({8, 32}, {v.itemsize, v.nbytes})
    assert.equal(8, mg.ones({2, 4}):slice(nil, {1, 1}).nbytes)      -- a view (2,1): its own elements
  end)

  it("makes bool tensors from booleans", function()
    local b = mg.constant({true, false})
    assert.equal("bool", b.dtype)
    assert.same({true, false}, b:totable())
  end)

  it("keeps int64 values exactly, beyond 2^53", function()
    local big = math.maxinteger - 1
    assert.equal(big, mg.constant({big}, "int64")[1]:item())
  end)

  it("handles empty tables and zero-sized shapes", function()
    assert.same({0}, mg.constant({}).shape)
    local z = mg.zeros{0, 3}
    assert.same({0, 3}, z.shape)
    assert.equal(0, z:numel())
    assert.equal(0, mg.sum(z):item())
  end)

  it("zeros, ones, full, *_like, eye, arange", function()
    assert.same({{0, 0, 0}, {0, 0, 0}}, mg.zeros{2, 3}:totable())
    assert.same({}, mg.zeros{0, 3, 2}:totable())
    assert.same({{}, {}}, mg.zeros{2, 0, 4}:totable())
    assert.same({{1, 1}}, mg.ones(1, 2):totable())
    assert.equal("int64", mg.ones({2}, "int64").dtype)
    assert.same({7, 7}, mg.full({2}, 7):totable())
    assert.same({true, true}, mg.full({2}, true):totable())
    local x = mg.constant({{1, 2}}, "float64")
    assert.equal("float64", mg.zeros_like(x).dtype)
    assert.same({{1, 1}}, mg.ones_like(x):totable())
    assert.same({{1, 0, 0}, {0, 1, 0}}, mg.eye(2, 3):totable())
    assert.same({0, 1, 2, 3}, mg.arange(4):totable())
    assert.same({2, 4, 6}, mg.arange(2, 8, 2):totable())
    assert.same({5, 4, 3}, mg.arange(5, 2, -1, "int64"):totable())
    assert.equal("int64", mg.arange(3, "int64").dtype)
  end)
end)

describe("values out", function()
  it("item reads a one-element tensor as a Lua value", function()
    assert.equal(3, mg.constant({{3}}):item())
    assert.equal(true, mg.constant(true):item())
    assert.equal("integer", math.type(mg.constant(3, "int64"):item()))
  end)

  it("x[i] indexes the first axis (1-based, negative from the end)", function()
    local a = mg.constant({{1, 2}, {3, 4}, {5, 6}})
    assert.same({3, 4}, a[2]:totable())
    assert.same({5, 6}, a[-1]:totable())
    assert.equal(6, a[3][2]:item())
    assert.equal(3, #a)
  end)

  it("totable round-trips through constant", function()
    local a = mg.random.normal({2, 3, 4})
    h.assert_close(mg.constant(a:totable()), a, 0)
  end)
end)

describe("views", function()
  it("reshape, transpose and slice share storage", function()
    local a = mg.arange(12):reshape{3, 4}
    local pair = mg.constant({1, 2})
    local before = mg.memory.stats().allocations
    local r = a:reshape{4, 3}
    local t = a:transpose()
    local s = a:slice({2, 3}, {1, 4, 2})
    local e = mg.expand_dims(a, 1)
    local b = mg.broadcast_to(pair, {3, 2})
    assert.equal(before, mg.memory.stats().allocations)
    assert.same({{4, 6}, {8, 10}}, s:totable())
    assert.same({0, 4, 8}, t[1]:totable())
    assert.same({1, 3, 4}, e.shape)
    assert.same({{1, 2}, {1, 2}, {1, 2}}, b:totable())
    assert.same({{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}}, r:totable())
  end)

  it("reshape of a non-contiguous view copies", function()
    local t = mg.arange(6):reshape{2, 3}:transpose()
    assert.same({0, 3, 1, 4, 2, 5}, t:reshape{6}:totable())
    assert.same({3, 2}, t:reshape{-1, 2}.shape)
  end)

  it("copies permuted views of every dtype and size (tiled transposes, threads on large planes) value for value", function()
    mg.random.seed(3)
    math.randomseed(11)
    for trial = 1, 40 do
      local nd = 2 + trial % 3
      local shape, perm = {}, {}
      for i = 1, nd do shape[i], perm[i] = math.random(1, 40), i end
      if trial % 10 == 0 then shape[1], shape[nd] = 700, 500 end     -- a plane over the threads' threshold
      for i = nd, 2, -1 do
        local j = math.random(1, i)
        perm[i], perm[j] = perm[j], perm[i]
      end
      local n = 1
      for i = 1, nd do n = n * shape[i] end
      for _, dt in ipairs{"bfloat16", "float32", "float64", "int64", "bool"} do
        local x = mg.random.normal(shape)
        x = dt == "bool" and mg.greater(x, 0) or mg.cast(x * 100, dt)
        local p = mg.transpose(x, perm)
        local copied = mg.reshape(p, {n})                  -- a copy: tiled where p's unit stride is inside
        local walked = dt == "bool" and mg.logical_not(mg.logical_not(p)) or p + mg.zeros({}, dt)   -- the iterator's
        assert.are.equal(0, mg.sum(mg.cast(mg.not_equal(copied, mg.reshape(walked, {n})), "int64")):item(),
                         dt .. " " .. table.concat(shape, "x") .. " perm " .. table.concat(perm, ","))
      end
    end
  end)

  it("copies permuted views with an empty axis (one plane was copied into nothing: heap corruption)", function()
    for _, c in ipairs{{{0, 16, 16}, {1, 3, 2}}, {{16, 0, 16}, {3, 2, 1}}, {{16, 16, 0}, {2, 1, 3}}, {{0, 32, 33}, {1, 3, 2}}} do
      local p = mg.transpose(mg.zeros(c[1]), c[2])
      assert.same({0}, mg.reshape(p, {0}).shape)
    end
  end)

  it("slices with negative indices and steps", function()
    local v = mg.arange(6)
    assert.same({5, 4, 3, 2, 1, 0}, v:slice({nil, nil, -1}):totable())
    assert.same({4, 5}, v:slice({-2, -1}):totable())
    assert.same({}, v:slice({4, 3}):totable())
    local m = mg.arange(6):reshape{2, 3}
    assert.same({3, 4, 5}, m:slice(2):totable())          -- an index drops the axis
    assert.same({1, 4}, m:slice(nil, 2):totable())
  end)

  it("copies of permuted, flipped and broadcast views hold the right elements, every dtype", function()
    -- the copy walks tiles when the source's unit stride is on another axis
    local function flat (t, out)
      out = out or {}
      if type(t) ~= "table" then out[#out + 1] = t return out end
      for _, v in ipairs(t) do flat(v, out) end
      return out
    end
    local cases = {
      {{33, 70}, {2, 1}}, {{64, 64}, {2, 1}}, {{3, 40, 50}, {1, 3, 2}}, {{40, 3, 50}, {3, 2, 1}},
      {{40, 50, 3}, {2, 3, 1}}, {{2, 35, 3, 37}, {4, 3, 1, 2}}, {{2, 35, 3, 37}, {1, 4, 3, 2}},
    }
    for _, dt in ipairs{"float32", "float64", "int64", "float16", "bool"} do
      for _, c in ipairs(cases) do
        local n = 1
        for _, d in ipairs(c[1]) do n = n * d end
        local v = mg.arange(n):reshape(c[1]):cast(dt):transpose(c[2])
        assert.same(flat(v:totable()), v:reshape{-1}:totable(), dt)
        local f = mg.flip(v, 1)
        assert.same(flat(f:totable()), f:reshape{-1}:totable(), dt)
        local as64 = v:cast(dt == "bool" and "int64" or "float64")   -- strided and converted
        assert.same(flat(v:cast("float64"):totable()), flat(as64:cast("float64"):totable()), dt)
      end
    end
    local b = mg.broadcast_to(mg.arange(40):reshape{40, 1}, {40, 40})
    assert.same(flat(b:totable()), mg.transpose(b):transpose():reshape{-1}:totable())
  end)

  it("tensors are immutable", function()
    local a = mg.ones{2}
    assert.has_error(function() a.x = 1 end,
                     "tensors are immutable (use a mg.Variable for state that changes)")
  end)
end)

describe("tostring", function()
  it("shows values with shape and dtype", function()
    assert.equal("{{1.0, 2.0},\n {3.0, 4.0}}\nmoongrad.Tensor(2,2) float32",
                 tostring(mg.constant({{1, 2}, {3, 4}})))
    assert.equal("{1, 2, 3}\nmoongrad.Tensor(3) int64", tostring(mg.constant({1, 2, 3}, "int64")))
    assert.equal("2.5000\nmoongrad.Tensor() float32", tostring(mg.constant(2.5)))
    assert.equal("{ true, false}\nmoongrad.Tensor(2) bool", tostring(mg.constant({true, false})))
    assert.equal("{}\nmoongrad.Tensor(0) float32", tostring(mg.zeros{0}))
  end)

  it("aligns columns and uses one format per tensor", function()
    assert.equal("{  0.5000, 100.2500}\nmoongrad.Tensor(2) float32",
                 tostring(mg.constant({0.5, 100.25})))
    assert.equal("{1.0000e-05, 2.0000e+00}\nmoongrad.Tensor(2) float64",
                 tostring(mg.constant({1e-5, 2}, "float64")))
    assert.equal("{nan, inf, 1.0}\nmoongrad.Tensor(3) float32",
                 tostring(mg.constant({0 / 0, 1 / 0, 1})):gsub("%-nan", "nan"))
  end)

  it("abbreviates large tensors with ...", function()
    local s = tostring(mg.arange(2000))
    assert.equal("{   0.0,    1.0,    2.0, ..., 1997.0, 1998.0, 1999.0}\nmoongrad.Tensor(2000) float32", s)
    local m = tostring(mg.zeros{100, 100})
    assert.truthy(m:find("...,\n", 1, true))
    assert.truthy(m:find("moongrad.Tensor(100,100) float32", 1, true))
  end)

  it("blank lines separate the blocks of 3-d tensors", function()
    assert.equal("{{{0, 1}},\n\n {{2, 3}}}\nmoongrad.Tensor(2,1,2) int64",
                 tostring(mg.arange(4, "int64"):reshape{2, 1, 2}))
  end)

  it("wraps long rows at 80 columns", function()
    local s = tostring(mg.arange(40))
    for line in s:gmatch("[^\n]+") do assert.is_true(#line <= 80) end
  end)
end)

describe("mg.print", function()
  it("prints strings and tensor values, like tf.print", function()
    local out = h.run_moongrad("-", "mg.print('running', mg.constant({1, 2}), 3)")
    assert.equal("running {1.0, 2.0} 3\n", out)
  end)
end)

-- Ops, forward: values against hand-computed (or NumPy-known) results.
local mg = require "moongrad"
local h = require "helpers"

local c = mg.constant

describe("elementwise arithmetic", function()
  local a = c({{1, 2, 3}, {4, 5, 6}})

  it("+ - * / ^ and unary minus, with tensors and Lua numbers", function()
    assert.same({{2, 4, 6}, {8, 10, 12}}, (a + a):totable())
    assert.same({{0, 1, 2}, {3, 4, 5}}, (a - 1):totable())
    assert.same({{9, 8, 7}, {6, 5, 4}}, (10 - a):totable())
    assert.same({{2, 4, 6}, {8, 10, 12}}, (2 * a):totable())
    assert.same({{0.5, 1, 1.5}, {2, 2.5, 3}}, (a / 2):totable())
    assert.same({{1, 4, 9}, {16, 25, 36}}, (a ^ 2):totable())
    assert.same({{2, 4, 8}, {16, 32, 64}}, (2 ^ a):totable())
    assert.same({{-1, -2, -3}, {-4, -5, -6}}, (-a):totable())
    assert.same({{0, 0, 1}, {1, 1, 2}}, (a // 3):totable())
    assert.same({{1, 2, 0}, {1, 2, 0}}, (a % 3):totable())
  end)

  it("floor division and modulo follow Lua's signs", function()
    local x = c({-7, 7, -7, 7}, "int64")
    local y = c({2, -2, -2, 2}, "int64")
    assert.same({-7 // 2, 7 // -2, -7 // -2, 7 // 2}, (x // y):totable())
    assert.same({-7 % 2, 7 % -2, -7 % -2, 7 % 2}, (x % y):totable())
    local xf, yf = mg.cast(x, "float64"), mg.cast(y, "float64")
    assert.same({-7 // 2, 7 // -2, -7 // -2, 7 // 2}, (xf // yf):totable())
    assert.same({-7 % 2.0, 7 % -2.0, -7 % -2.0, 7 % 2.0}, (xf % yf):totable())
  end)

  it("broadcasts by NumPy's rules", function()
    local row, col = c({10, 20, 30}), c({{1}, {2}})
    assert.same({{11, 21, 31}, {12, 22, 32}}, (row + col):totable())
    assert.same({{11, 22, 33}, {14, 25, 36}}, (a + row):totable())
    assert.same({2, 3}, (mg.ones{1, 3} * mg.ones{2, 1}).shape)
    assert.same({4, 2, 3}, (mg.ones{4, 1, 3} + mg.ones{2, 1}).shape)
    assert.same({{2, 3, 4}, {5, 6, 7}}, (a + c(1)):totable())
  end)

  it("works on strided views", function()
    local t = a:transpose()
    assert.same({{2, 8}, {4, 10}, {6, 12}}, (t + t):totable())
    assert.same({{1, 16}, {4, 25}, {9, 36}}, (t * t):totable())
  end)

  it("int64 keeps integers; int64 / int64 gives float64", function()
    local i = c({7, 8}, "int64")
    assert.equal("int64", (i + 1).dtype)
    assert.equal("float64", (i / 2).dtype)
    assert.same({3.5, 4}, (i / 2):totable())
    assert.same({49, 64}, (i ^ 2):totable())
  end)

  it("maximum and minimum", function()
    assert.same({3, 5}, mg.maximum(c({1, 5}), c({3, 2})):totable())
    assert.same({1, 2}, mg.minimum(c({1, 5}), c({3, 2})):totable())
    assert.same({{0, 0}, {1, 2}}, mg.maximum(c({{-1, -2}, {1, 2}}), 0):totable())
  end)
end)

describe("elementwise maths", function()
  local x = c({0.5, 1, 2}, "float64")

  it("exp log sqrt abs sign", function()
    h.assert_close(mg.exp(x), {math.exp(0.5), math.exp(1), math.exp(2)}, 1e-12)
    h.assert_close(mg.log(x), {math.log(0.5), 0, math.log(2)}, 1e-12)
    h.assert_close(mg.sqrt(x), {math.sqrt(0.5), 1, math.sqrt(2)}, 1e-12)
    assert.same({3, 0, 2}, mg.abs(c({-3, 0, 2})):totable())
    assert.same({-1, 0, 1}, mg.sign(c({-3, 0, 2})):totable())
    assert.same({-1, 0, 1}, mg.sign(c({-3, 0, 2}, "int64")):totable())
  end)

  it("tanh sigmoid relu", function()
    local function sig (v) return 1 / (1 + math.exp(-v)) end
    local function tanh (v) return (math.exp(v) - math.exp(-v)) / (math.exp(v) + math.exp(-v)) end
    h.assert_close(mg.tanh(x), {tanh(0.5), tanh(1), tanh(2)}, 1e-12)
    h.assert_close(mg.sigmoid(x), {sig(0.5), sig(1), sig(2)}, 1e-12)
    assert.same({0, 0, 2}, mg.relu(c({-1, 0, 2})):totable())
    assert.same({1, 0}, mg.sigmoid(c({1000, -1000})):totable())
  end)

  it("float32 maths is accurate to float32 precision", function()
    local v = mg.random.uniform({1000}, -5, 5)
    local v64 = mg.cast(v, "float64")
    h.assert_close(mg.exp(v), mg.exp(v64), 1e-6)
    h.assert_close(mg.tanh(v), mg.tanh(v64), 1e-6)
  end)

  it("large tensors give the same results as small ones (parallel paths)", function()
    local big = mg.random.normal({300, 400})
    local s = mg.exp(big) + big * 2
    h.assert_close(s[123], mg.exp(big[123]) + big[123] * 2, 1e-6)
  end)
end)

describe("comparisons and where", function()
  local a, b = c({1, 2, 3}), c({3, 2, 1})

  it("give bool tensors", function()
    assert.same({false, true, false}, mg.equal(a, b):totable())
    assert.same({true, false, true}, mg.not_equal(a, b):totable())
    assert.same({true, false, false}, mg.less(a, b):totable())
    assert.same({true, true, false}, mg.less_equal(a, b):totable())
    assert.same({false, false, true}, mg.greater(a, b):totable())
    assert.same({false, true, true}, mg.greater_equal(a, 2):totable())
    assert.equal("bool", mg.less(a, b).dtype)
  end)

  it("logical ops on bools", function()
    local p, q = c({true, true, false}), c({true, false, false})
    assert.same({true, false, false}, mg.logical_and(p, q):totable())
    assert.same({true, true, false}, mg.logical_or(p, q):totable())
    assert.same({false, false, true}, mg.logical_not(p):totable())
  end)

  it("where picks and broadcasts", function()
    assert.same({1, 2, 1}, mg.where(mg.less_equal(a, b), a, b):totable())
    assert.same({{1, 0}, {1, 0}}, mg.where(c({true, false}), mg.ones{2, 2}, 0):totable())
  end)

  it("== is identity; < on tensors says what to use", function()
    assert.is_true(a == a)
    assert.is_false(a == c({1, 2, 3}))
    assert.has_error(function() return a < b end,
      "attempt to compare tensors with '<' or '<=' (Lua wants one boolean); use mg.less, mg.less_equal, mg.greater ... for elementwise comparison")
  end)
end)

describe("reductions", function()
  local a = c({{1, 5, 3}, {4, 2, 6}})

  it("sum and mean over all, one axis, several axes, keepdims", function()
    assert.equal(21, mg.sum(a):item())
    assert.same({5, 7, 9}, mg.sum(a, 1):totable())
    assert.same({9, 12}, mg.sum(a, 2):totable())
    assert.same({9, 12}, mg.sum(a, -1):totable())
    assert.same({{9}, {12}}, mg.sum(a, 2, true):totable())
    assert.equal(3.5, mg.mean(a):item())
    assert.same({2.5, 3.5, 4.5}, mg.mean(a, 1):totable())
    assert.same({21}, mg.sum(a:reshape{1, 2, 3}, {2, 3}):totable())
    assert.same({{{{2}, {2}, {2}}}}, mg.sum(mg.ones{2, 1, 3, 1}, {1, 2, 4}, true):totable())
    assert.same({{{{6}}}}, mg.sum(mg.ones{2, 1, 3, 1}, {1, 3}, true):totable())
    assert.same({3}, mg.sum(mg.ones{2, 1, 3, 1}, {1, 2, 4}).shape)
  end)

  it("max, min, argmax, argmin (1-based)", function()
    assert.equal(6, mg.max(a):item())
    assert.same({4, 5, 6}, mg.max(a, 1):totable())
    assert.same({1, 2}, mg.min(a, 2):totable())
    assert.same({2, 1, 2}, mg.argmax(a, 1):totable())
    assert.same({1, 2}, mg.argmin(a, 2):totable())
    assert.equal(6, mg.argmax(a):item())
    assert.equal("int64", mg.argmax(a, 1).dtype)
  end)

  it("sums long float32 rows accurately", function()
    local n = 1000000
    assert.equal(n, mg.sum(mg.ones{n}):item())
    h.assert_close(mg.sum(mg.full({n}, 0.1)), 100000, 1e-6)
  end)

  it("int64 sums stay integers; bool sums count; mean of ints is float64", function()
    assert.equal(6, mg.sum(c({1, 2, 3}, "int64")):item())
    assert.equal("int64", mg.sum(c({1, 2, 3}, "int64")).dtype)
    assert.equal(2, mg.sum(c({true, false, true})):item())
    assert.equal("float64", mg.mean(c({1, 2}, "int64")).dtype)
  end)

  it("reduces strided views and middle axes", function()
    local x = mg.arange(24):reshape{2, 3, 4}
    assert.same({{12, 15, 18, 21}, {48, 51, 54, 57}}, mg.sum(x, 2):totable())
    assert.same({{{60, 66, 72, 78}}}, mg.sum(x:transpose({2, 1, 3}), {1, 2}, true):totable())
    assert.same({12, 20, 28}, mg.sum(x:transpose({3, 2, 1})[1], 2):totable())
  end)
end)

describe("matmul", function()
  it("2-D products", function()
    local a, b = c({{1, 2}, {3, 4}, {5, 6}}), c({{1, 0, 2}, {0, 1, 3}})
    assert.same({{1, 2, 8}, {3, 4, 18}, {5, 6, 28}}, mg.matmul(a, b):totable())
  end)

  it("transposed views give the same as copies", function()
    local a, b = mg.random.normal({5, 7}), mg.random.normal({5, 3})
    local at = a:transpose()
    h.assert_close(mg.matmul(at, b), mg.matmul(at:reshape{-1}:reshape{7, 5}, b), 1e-5)
    h.assert_close(mg.matmul(b:transpose(), a), mg.matmul(a:transpose(), b):transpose(), 1e-5)
  end)

  it("a few rows times a transposed matrix (the backward's dout @ W^T path)", function()
    local x, w = mg.random.normal({4, 50}), mg.random.normal({60, 50})
    local wt = w:transpose()
    local copy = wt:reshape{-1}:reshape{50, 60}                -- contiguous
    h.assert_close(mg.matmul(x, wt), mg.matmul(x, copy), 1e-5)
    h.assert_close(mg.matmul(x:transpose():reshape{-1}:reshape{50, 4}:transpose(), wt),
                   mg.matmul(x, copy), 1e-5)                   -- transposed A too
  end)

  it("batched and broadcast over leading dimensions", function()
    local a = mg.random.normal({4, 2, 3})
    local b = mg.random.normal({3, 5})
    local r = mg.matmul(a, b)
    assert.same({4, 2, 5}, r.shape)
    h.assert_close(r[3], mg.matmul(a[3], b), 1e-5)
    local bb = mg.random.normal({4, 3, 5})
    h.assert_close(mg.matmul(a, bb)[2], mg.matmul(a[2], bb[2]), 1e-5)
    assert.same({2, 4, 2, 5}, mg.matmul(mg.ones{2, 1, 2, 3}, mg.ones{4, 3, 5}).shape)
  end)

  it("vectors as in NumPy", function()
    local m, v = c({{1, 2}, {3, 4}}), c({1, 1})
    assert.same({3, 7}, mg.matmul(m, v):totable())
    assert.same({4, 6}, mg.matmul(v, m):totable())
    assert.equal(2, mg.matmul(v, v):item())
  end)

  it("float64 and int64 through the C kernel", function()
    local a = c({{1, 2}, {3, 4}}, "int64")
    assert.same({{7, 10}, {15, 22}}, mg.matmul(a, a):totable())
    local x = mg.random.normal({20, 30}, 0, 1, "float64")
    local y = mg.random.normal({30, 10}, 0, 1, "float64")
    h.assert_close(mg.cast(mg.matmul(x, y), "float32"),
                   mg.matmul(mg.cast(x, "float32"), mg.cast(y, "float32")), 1e-4)
  end)

  it("matches a reference at a size where threads and blocking kick in", function()
    local n = 300
    local a, b = mg.random.normal({n, n}), mg.random.normal({n, n})
    local ref = mg.matmul(mg.cast(a, "float64"), mg.cast(b, "float64"))
    h.assert_close(mg.matmul(a, b), mg.cast(ref, "float32"), 1e-4)
  end)
end)

describe("shape ops", function()
  it("reshape with -1, expand_dims, squeeze", function()
    local x = mg.arange(6)
    assert.same({2, 3}, x:reshape{2, -1}.shape)
    assert.same({2, 3}, x:reshape(2, 3).shape)
    assert.same({1, 6}, mg.expand_dims(x, 1).shape)
    assert.same({6, 1}, mg.expand_dims(x, -1).shape)
    assert.same({6}, mg.squeeze(x:reshape{1, 6, 1}).shape)
    assert.same({6, 1}, mg.squeeze(x:reshape{1, 6, 1}, 1).shape)
  end)

  it("transpose with a permutation, swapaxes", function()
    local x = mg.arange(24):reshape{2, 3, 4}
    assert.same({4, 3, 2}, x:transpose().shape)
    assert.same({3, 2, 4}, x:transpose({2, 1, 3}).shape)
    assert.equal(x[2][3][4]:item(), x:transpose({3, 1, 2})[4][2][3]:item())
    assert.same({4, 3, 2}, mg.swapaxes(x, 1, 3).shape)
  end)

  it("concat and stack", function()
    local a, b = c({{1, 2}}), c({{3, 4}})
    assert.same({{1, 2}, {3, 4}}, mg.concat({a, b}):totable())
    assert.same({{1, 2, 3, 4}}, mg.concat({a, b}, 2):totable())
    assert.same({{{1, 2}}, {{3, 4}}}, mg.stack({a, b}):totable())
    assert.same({1, 2, 2}, mg.stack({a, b}, 2).shape)
    assert.same({1, 2, 2}, mg.stack({a, b}, -1).shape)
    local many = {}
    for i = 1, 5000 do many[i] = c(i) end
    assert.same({5000}, mg.stack(many).shape)
  end)

  it("gather along an axis with 1-based indices", function()
    local x = c({{1, 2}, {3, 4}, {5, 6}})
    assert.same({{5, 6}, {1, 2}}, mg.gather(x, {3, 1}):totable())
    assert.same({{2}, {4}, {6}}, mg.gather(x, c({2}, "int64"), 2):totable())
    assert.same({2, 2, 2}, mg.gather(x, c({{1, 2}, {3, 3}}, "int64")).shape)
  end)

  it("cast between dtypes", function()
    assert.same({1, -2, 0}, mg.cast(c({1.7, -2.7, 0.2}), "int64"):totable())
    assert.same({true, false}, mg.cast(c({2, 0}), "bool"):totable())
    assert.same({1, 0}, mg.cast(c({true, false}), "float32"):totable())
  end)
end)

describe("softmax", function()
  it("softmax and log_softmax along an axis, stable for large inputs", function()
    local x = c({{1, 2, 3}, {1000, 1000, 1000}}, "float64")
    local e = {math.exp(1), math.exp(2), math.exp(3)}
    local z = e[1] + e[2] + e[3]
    h.assert_close(mg.softmax(x), {{e[1] / z, e[2] / z, e[3] / z}, {1 / 3, 1 / 3, 1 / 3}}, 1e-12)
    h.assert_close(mg.log_softmax(x)[1], {1 - math.log(z), 2 - math.log(z), 3 - math.log(z)}, 1e-12)
    h.assert_close(mg.sum(mg.softmax(x, 1), 1), {1, 1, 1}, 1e-12)
  end)

  it("agrees with its definition on rows longer than the kernel's 16 lanes, -inf, NaN and +inf", function()
    for _, n in ipairs({16, 37, 64}) do
      local x = mg.random.uniform({5, n}, -3, 3, "float64") + mg.reshape(mg.arange(5, "float64") * 300, {5, 1})
      local e = mg.exp(x - mg.max(x, 2, true))
      local want = e / mg.sum(e, 2, true)
      h.assert_close(mg.softmax(x), want, 1e-12)
      h.assert_close(mg.log_softmax(x), mg.log(want), 1e-10)
      h.assert_close(mg.softmax(mg.cast(x, "float32")), want, 1e-5)
      h.assert_close(mg.softmax(mg.swapaxes(x, 1, 2), 1), mg.swapaxes(want, 1, 2), 1e-12)   -- columns
      assert.is_true(mg.test.gradcheck(function(v) return mg.log_softmax(v) * mg.softmax(v) end,
                                       {mg.random.uniform({2, n}, -2, 2, "float64")}))
    end
    local inf, nan = math.huge, 0 / 0
    local row = {}
    for j = 1, 20 do row[j] = j end
    row[3], row[17] = -inf, -inf
    local y = mg.softmax(c({row}, "float64")):totable()[1]
    assert.equal(0, y[3])
    assert.equal(0, y[17])
    h.assert_close(mg.sum(c({y}, "float64")), 1, 1e-12)
    row[5] = nan
    for _, v in ipairs(mg.softmax(c({row}, "float64")):totable()[1]) do assert.is_true(v ~= v) end
    row[5] = inf
    for _, v in ipairs(mg.log_softmax(c({row}, "float64")):totable()[1]) do assert.is_true(v ~= v) end
  end)
end)

describe("threads", function()
  it("elementwise results do not depend on the thread count (chunks of whole vector blocks)", function()
    local was, mode = mg.get_num_threads()
    for _, dt in ipairs({"float32", "float64"}) do
      for _, n in ipairs({262145, 600001}) do
        mg.random.seed(5)
        local x, y = mg.random.normal({n}, 0, 1, dt), mg.random.normal({n}, 0, 1, dt)
        local function run (threads)
          mg.set_num_threads(threads)
          return {mg.tanh(x), mg.exp(x), mg.sigmoid(x), mg.log(mg.abs(x) + 1), mg.sin(x), mg.gelu(x), x * y + x}
        end
        local one, two = run(1), run(2)
        for i = 1, #one do
          assert.equal(0, mg.sum(mg.cast(mg.not_equal(one[i], two[i]), "int64")):item())
        end
      end
    end
    mg.set_num_threads(mode == "auto" and "auto" or was)
  end)
end)

describe("random", function()
  it("is reproducible from a seed, and its state can be saved and restored", function()
    mg.random.seed(42)
    local a = mg.random.normal{5}
    local state = mg.random.get_state()
    local b = mg.random.uniform{5}
    mg.random.seed(42)
    assert.same(a:totable(), mg.random.normal{5}:totable())
    mg.random.set_state(state)
    assert.same(b:totable(), mg.random.uniform{5}:totable())
  end)

  it("draws have the right moments and bounds", function()
    mg.random.seed(7)
    local n = mg.random.normal({200000}, 2, 3)
    h.assert_close(mg.mean(n), 2, 0.02)
    h.assert_close(mg.sqrt(mg.mean((n - 2) ^ 2)), 3, 0.02)
    local u = mg.random.uniform({100000}, -1, 1)
    assert.is_true(mg.min(u):item() >= -1)
    assert.is_true(mg.max(u):item() < 1)
    h.assert_close(mg.mean(u), 0, 0.02)
  end)

  it("permutation shuffles 1..n", function()
    local p = mg.random.permutation(10):totable()
    table.sort(p)
    assert.same({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, p)
  end)

  it("normal and uniform take mg.zeros' shapes, with its errors, and keep mean/std, low/high after a table", function()
    -- called by field, so that the message names them (not tail calls: those give '?')
    local by_name = {normal = function(...) local r = mg.random.normal(...) return r end,
                     uniform = function(...) local r = mg.random.uniform(...) return r end}
    for _, f in ipairs{"normal", "uniform"} do
      local draw = by_name[f]
      assert.same({2, 3}, draw(2, 3).shape)                       -- every number first is a size
      assert.same({2, 3, 1}, draw(2, 3, 1).shape)
      assert.same({2, 3}, draw({2, 3}).shape)
      assert.same({4}, draw(4).shape)
      assert.equal("float64", draw(2, 3, "float64").dtype)
      assert.equal("float64", draw({2, 3}, "float64").dtype)
      assert.equal("float64", draw({2, 3}, 0, 1, "float64").dtype)
      for _, bad in ipairs{{{2, -3}, "dimension 2 is negative (-3)"}, {{2, 3.5}, "dimension 2 is 3.5, not an integer"},
                           {{"a"}, "shape expected (a table of sizes), got string"}} do
        local arg = bad[1][2] and 2 or 1
        assert.has_error(function() draw(table.unpack(bad[1])) end, ("bad argument #%d to '%s' (%s)"):format(arg, f, bad[2]))
        assert.has_error(function() local z = mg.zeros(table.unpack(bad[1])) return z end, ("bad argument #%d to 'zeros' (%s)"):format(arg, bad[2]))
      end
      assert.has_error(function() draw({2}, 0, 1, "float32", 5) end,
                       ("bad argument #5 to '%s' (unexpected number: it takes at most 4 arguments)"):format(f))
    end
    mg.random.seed(5)
    local n = mg.random.normal({100000}, 3, 0.5)                  -- after a table: mean, stddev
    h.assert_close(mg.mean(n), 3, 0.01)
    local u = mg.random.uniform({1000}, 5, 6)                      -- low, high
    assert.is_true(mg.min(u):item() >= 5 and mg.max(u):item() < 6)
  end)

  it("randint(low, high, shape) draws int64 values low..high-1, as torch.randint", function()
    mg.random.seed(6)
    local r = mg.random.randint(-2, 3, 100, 50)
    assert.equal("int64", r.dtype)
    assert.same({100, 50}, r.shape)
    local seen = {}
    for _, row in ipairs(r:totable()) do for _, v in ipairs(row) do seen[v] = (seen[v] or 0) + 1 end end
    for v = -2, 2 do assert.is_true(seen[v] > 800, v) end         -- each of the 5 values about 1000 times
    assert.is_nil(seen[3])                                         -- high is not drawn
    assert.same({3}, mg.random.randint(0, 1, {3}).shape)
    assert.same({0, 0, 0}, mg.random.randint(0, 1, {3}):totable())
    assert.same({}, mg.random.randint(0, 10, {}).shape)            -- a 0-d draw
    local s = mg.random.get_state()
    local a = mg.random.randint(0, 100, 8)
    mg.random.set_state(s)
    assert.same(a:totable(), mg.random.randint(0, 100, 8):totable())
    assert.has_error(function() mg.random.randint(3, 3, 2) end,
                     "bad argument #2 to 'randint' (high (3) must be above low (3); high is not drawn)")
    assert.has_error(function() mg.random.randint(0.5, 3, 2) end, "bad argument #1 to 'randint' (low is 0.5, not an integer)")
    assert.has_error(function() mg.random.randint(0, 3) end,
                     "bad argument #3 to 'randint' (shape expected (a table of sizes), got no value)")
    assert.has_error(function() mg.random.randint(0, 3, 2, -1) end, "bad argument #4 to 'randint' (dimension 2 is negative (-1))")
    assert.has_error(function() mg.random.randint(0, 3, 2, "int64") end,
                     "bad argument #4 to 'randint' (unexpected string: it takes at most 3 arguments)")
    assert.has_error(function() mg.random.randint(0, 2 ^ 62 // 1, 2) end,
                     "bad argument #2 to 'randint' (high - low must be at most 2^53, got 0 .. 4611686018427387904)")
  end)
end)

describe("pow's square (x ^ 2, in every loss and norm)", function()
  -- same values bit for bit: NaN equal to NaN, -0 not to 0
  local function same (a, b)
    assert.same(a.shape, b.shape)
    local function walk (u, v)
      if type(u) == "table" then for i = 1, #u do walk(u[i], v[i]) end return end
      if u ~= u then assert.is_true(v ~= v) return end
      assert.equal(u, v)
      if u == 0 then assert.equal(1 / u, 1 / v) end
    end
    walk(a:totable(), b:totable())
  end
  it("is x * x bit for bit, strided, with NaN, infinities and -0, and other exponents still libm's", function()
    for _, dt in ipairs{"float32", "float64"} do
      mg.random.seed(3)
      local x = mg.random.normal({64, 33}, 0, 1e3, dt)
      local specials = mg.constant({0 / 0, 1 / 0, -1 / 0, -0.0, 0, 1e-30, 3.5e19}, dt)
      for _, v in ipairs{x, x:transpose(), specials} do
        same(v ^ 2, v * v)
        same(v ^ 1, v)
      end
      h.assert_close(mg.constant({2, 3}, dt) ^ 3, mg.constant({8, 27}, dt), 1e-6)
      assert.same({0, 3}, (mg.zeros({0, 3}, dt) ^ mg.zeros({0, 3}, dt)).shape)   -- no exponent to read
      assert.same({0, 3}, (mg.zeros({0, 3}, dt) ^ 2).shape)
      h.assert_close(mg.constant({4, 9}, dt) ^ mg.constant({2, 0.5}, dt), mg.constant({16, 3}, dt), 1e-6)
    end
  end)

  it("has the gradient of x * x bit for bit, in place or not, and keeps only x on the tape", function()
    mg.random.seed(4)
    local x, w = mg.random.normal({128, 65}), mg.random.normal({128, 65})
    local function grad (f)
      local t = mg.tape()
      t:watch(x)
      local y = f()
      t:stop()
      local saved = t:saved_bytes()
      return t:gradient(y, x), saved
    end
    -- a fresh dout (mul's, which the walk may write over) and a broadcast one (mean's)
    local g1, s1 = grad(function() return mg.sum((x ^ 2) * w) end)
    local g2 = grad(function() return mg.sum((x * x) * w) end)
    same(g1, g2)
    local g3, s3 = grad(function() return mg.mean(x ^ 2) end)
    same(g3, (grad(function() return mg.mean(x * x) end)))
    local small = 64                                   -- the exponent and a sum's scalars
    assert.is_true(s3 >= x.nbytes and s3 < x.nbytes + small)   -- x, not x ^ 2: the exponent needs no gradient
    assert.is_true(s1 >= x.nbytes + w.nbytes and s1 < x.nbytes + w.nbytes + small)   -- and w, for the product's gradient
    -- an exponent that wants a gradient keeps the result too
    local e = mg.constant(2.0)
    local t = mg.tape()
    t:watch(x)
    t:watch(e)
    local y = mg.sum(x ^ e)
    t:stop()
    assert.is_true(t:saved_bytes() >= 2 * x.nbytes and t:saved_bytes() < 2 * x.nbytes + small)
    local gx, ge = table.unpack(t:gradient(y, {x, e}))
    same(gx, (grad(function() return mg.sum(x * x) end)))
    -- x ^ e * log(x) where x > 0, 0 elsewhere (TensorFlow's)
    h.assert_close(ge, mg.sum(mg.where(mg.greater(x, mg.constant(0.0)), x * x * mg.log(mg.abs(x)), mg.zeros_like(x))), 1e-3)
  end)

  it("holds one x-sized temporary in the backward of mean(x ^ 2), none when dout is the walk's", function()
    mg.random.seed(5)
    local x = mg.random.normal({512, 512})
    local function backward_peak (f) return h.gradient_peak(x, f) end
    -- dout broadcast from mean's scalar: 2x, then dout * 2x (the result)
    assert.is_true(backward_peak(function() return mg.mean(x ^ 2) end) <= 2 * x.nbytes + 4096)
    -- dout a fresh product's (the walk's alone): written over, no temporary beside it
    local w = mg.random.normal({512, 512})
    assert.is_true(backward_peak(function() return mg.sum((x ^ 2) * w) end) <= x.nbytes + 4096)
  end)
end)

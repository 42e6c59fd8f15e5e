-- Indexing, sorting and rearranging: sort argsort topk, take_along_axis
-- put_along_axis gather, flip tile repeat_interleave pad tril triu
-- masked_fill, where with numbers, einsum. Values against hand-computed
-- results, edge cases, exact error texts, float64 gradchecks.
local mg = require "moongrad"
local h = require "helpers"
local c = mg.constant

local NaN = 0 / 0

local function fails (f, msg) assert.has_error(f, msg) end
local function same (want, t) assert.same(want, t:totable()) end
local function check (f, ...) assert.is_true(mg.test.gradcheck(f, {...})) end
local function rnd (shape, lo, hi) return mg.random.uniform(shape, lo or -1, hi or 1, "float64") end

-- the values of a 1-D tensor, NaN as the string "nan" (so assert.same can compare)
local function shown (t)
  local out = {}
  for i, v in ipairs(t:totable()) do out[i] = v ~= v and "nan" or v end
  return out
end

local grad = h.grad        -- the gradient of sum(f(x)) at x, from a fresh tape

describe("sort, argsort and topk", function()
  it("sort gives values and 1-based int64 indices, stably", function()
    local v, i = mg.sort(c({3, 1, 2, 1, 3}))
    same({1, 1, 2, 3, 3}, v)
    same({2, 4, 3, 1, 5}, i)
    assert.equal("int64", i.dtype)
    v, i = c({3, 1, 2, 1, 3}):sort({descending = true})     -- ties keep their order both ways
    same({3, 3, 2, 1, 1}, v)
    same({1, 5, 3, 2, 4}, i)
  end)

  it("NaN sorts above every number: last ascending (as NumPy), first descending", function()
    local x = c({2, NaN, -math.huge, 0, math.huge, -1}, "float64")
    local v, i = mg.sort(x)
    assert.same({-math.huge, -1, 0, 2, math.huge, "nan"}, shown(v))
    same({3, 6, 4, 1, 5, 2}, i)
    v = mg.sort(x, {descending = true})
    assert.same({"nan", math.huge, 2, 0, -1, -math.huge}, shown(v))
    assert.same({1, 2, "nan"}, shown(mg.sort(c({NaN, 2, 1}))))        -- float32 too
  end)

  it("-0 and 0 are equal (stable order), and come back bit for bit", function()
    local v, i = mg.sort(c({0, -0.0, -1, 0}, "float64"))
    same({3, 1, 2, 4}, i)
    assert.equal(-math.huge, 1 / v:totable()[3])           -- the -0 kept its sign
  end)

  it("along any axis, int64 and bool, with argsort", function()
    local x = c({{3, 1, 2}, {0, 5, 4}})
    local v, i = mg.sort(x, 1)
    same({{0, 1, 2}, {3, 5, 4}}, v)
    same({{2, 1, 1}, {1, 2, 2}}, i)
    same({{2, 3, 1}, {1, 3, 2}}, mg.argsort(x))             -- last axis by default
    same({{1, 2, 2}, {2, 1, 1}}, x:argsort(-2, {descending = true}))
    v, i = mg.sort(c({5, -7, 3, math.mininteger, math.maxinteger}, "int64"))
    same({math.mininteger, -7, 3, 5, math.maxinteger}, v)
    v, i = mg.sort(c({true, false, true, false}))
    same({false, false, true, true}, v)
    same({2, 4, 1, 3}, i)
  end)

  it("long rows (the radix path) agree with a plain stable sort", function()
    mg.random.seed(5)
    local x = mg.random.uniform({1000}, 0, 50, "float64") // 1       -- many ties
    local v, i = mg.sort(x)
    local xs, ref = x:totable(), {}
    for k = 1, #xs do ref[k] = k end
    table.sort(ref, function(a, b) return xs[a] < xs[b] or (xs[a] == xs[b] and a < b) end)
    same(ref, i)
    local vs = v:totable()
    for k = 2, #vs do assert.is_true(vs[k - 1] <= vs[k]) end
    local f = mg.cast(x, "float32") - 25
    same(mg.argsort(f):totable(), i)                           -- float32 keys order as float64
  end)

  it("edge cases: 0-d, size-0 dimensions, one entry", function()
    local v, i = mg.sort(c(4))
    assert.equal(4, v:item())
    assert.equal(1, i:item())
    assert.same({}, v.shape)
    v, i = mg.sort(mg.zeros{2, 0})
    assert.same({2, 0}, v.shape)
    assert.same({2, 0}, i.shape)
    v, i = mg.sort(mg.zeros{0, 3}, 1)
    assert.same({0, 3}, i.shape)
    same({1}, select(2, mg.sort(c({7}))))
  end)

  it("topk: the k largest, best first; ties go to the first positions", function()
    local x = c({5, 1, 4, 1, 5, 9, 2, 6})
    local v, i = mg.topk(x, 3)
    same({9, 6, 5}, v)
    same({6, 8, 1}, i)
    v, i = x:topk(3, {largest = false})
    same({1, 1, 2}, v)
    same({2, 4, 7}, i)
    v, i = mg.topk(x, 3, {sorted = false})                     -- in their order in x
    same({5, 9, 6}, v)
    same({1, 6, 8}, i)
    v, i = mg.topk(c({{1, 3}, {4, 2}, {0, 5}}), 2, 1)
    same({{4, 5}, {1, 3}}, v)
    same({{2, 3}, {1, 1}}, i)
    v, i = mg.topk(c({NaN, 1, 3}), 1)                          -- NaN is the largest, as PyTorch
    assert.same({"nan"}, shown(v))
  end)

  it("topk: k = 0 and k = n; small k on long rows (the heap path) matches sort", function()
    local v, i = mg.topk(c({{1, 2, 3}}), 0)
    assert.same({1, 0}, v.shape)
    assert.same({1, 0}, i.shape)
    same({{2, 1, 3}}, select(2, mg.topk(c({{2, 3, 1}}), 3)))
    same({{1, 2, 3}}, select(2, mg.topk(c({{2, 3, 1}}), 3, {sorted = false})))
    mg.random.seed(9)
    local x = mg.random.uniform({3, 2000}, 0, 100, "float64") // 1
    for _, largest in ipairs({true, false}) do
      local tv, ti = mg.topk(x, 7, {largest = largest})
      local sv, si = mg.sort(x, {descending = largest})
      same(si:slice(nil, {1, 7}):totable(), ti)
      same(sv:slice(nil, {1, 7}):totable(), tv)
      local _, ui = mg.topk(x, 7, {largest = largest, sorted = false})
      same(mg.sort(ti):totable(), ui)
    end
  end)

  it("errors name the function and the mismatch", function()
    fails(function() return mg.topk(c({{1, 2, 3}}), 5) end, "topk: k = 5 is larger than dimension 2 of size 3")
    fails(function() return mg.topk(c({1, 2}), -1) end, "topk: k = -1 is negative")
    fails(function() return mg.topk(c(1), 1) end, "topk: needs at least 1 dimension, got a 0-d tensor")
    fails(function() return mg.topk(c({1}), 1.5) end, "bad argument #2 to 'topk' (k is 1.5, not an integer)")
    fails(function() return mg.topk(c({1}), 1, {largets = true}) end,
          "bad argument #3 to 'topk' (unknown option 'largets' (did you mean 'largest'?); known: largest, sorted)")
    fails(function() return mg.sort(c({1}), {descending = 1}) end,
          "bad argument #2 to 'sort' (option 'descending' must be a boolean, got number)")
    fails(function() return mg.sort(c({{1}}), 3) end,
          "bad argument #2 to 'sort' (axis 3 is out of range for 2 dimensions (use 1..2 or -2..-1))")
    fails(function() return mg.argsort("x") end, "bad argument #1 to 'argsort' (moongrad.Tensor expected, got string)")
  end)
end)

describe("take_along_axis and put_along_axis", function()
  local x = c({{10, 11, 12}, {20, 21, 22}})

  it("take_along_axis picks entry by entry, 1-based, negative from the end", function()
    same({{12, 10}, {20, 22}}, mg.take_along_axis(x, c({{3, 1}, {1, 3}}, "int64"), 2))
    same({{12, 10}, {22, 20}}, x:take_along_axis({{-1, 1}}, 2))          -- broadcast over rows
    same({{20, 11, 22}}, mg.take_along_axis(x, {{2, 1, -1}}, 1))
    local v = c({{3, 1, 2}, {9, 7, 8}})
    same(mg.sort(v):totable(), mg.take_along_axis(v, mg.argsort(v), 2))  -- as NumPy's idiom
    assert.same({2, 0}, mg.take_along_axis(x, mg.zeros({1, 0}, "int64"), 2).shape)
  end)

  it("put_along_axis writes (the last wins) or adds", function()
    same({{10, 0, 12}, {0, 21, 22}}, mg.put_along_axis(x, {{2}, {1}}, 0, 2))
    same({{7, 11, 12}, {7, 21, 22}}, mg.put_along_axis(x, {{1, 1}}, c({{5, 7}}), 2))
    same({{22, 11, 12}, {32, 21, 22}}, mg.put_along_axis(x, {{1, 1}}, c({{5, 7}}), 2, {mode = "add"}))
    same({{10, 11, 13}, {20, 21, 23}}, x:put_along_axis({{-1}}, 1, 2, {mode = "add"}))
    same({3, 0, 1}, mg.put_along_axis(c({0, 0, 0}, "int64"), {1, 3, 1, 1}, c({1, 1, 1, 1}, "int64"), 1,
                                      {mode = "add"}))
  end)

  it("errors", function()
    fails(function() return mg.take_along_axis(x, {1, 2}, 2) end,
          "take_along_axis: indices have 1 dimensions and x has 2; they must have as many")
    fails(function() return mg.take_along_axis(x, {{4}}, 2) end,
          "take_along_axis: index 4 is out of bounds for dimension 2 of size 3 (use 1..3 or -3..-1)")
    fails(function() return mg.take_along_axis(x, {{-4}}, 2) end,
          "take_along_axis: index -4 is out of bounds for dimension 2 of size 3 (use 1..3 or -3..-1)")
    fails(function() return mg.take_along_axis(x, {{0}}, 2) end,
          "take_along_axis: index 0 is out of range (indices start at 1; negative ones count from the end)")
    fails(function() return mg.take_along_axis(x, {{1}, {1}, {1}}, 2) end,
          "take_along_axis: indices (3,1) do not broadcast against x (2,3) outside axis 2")
    fails(function() return mg.take_along_axis(x, c({{1}}), 2) end,
          "bad argument #2 to 'take_along_axis' (indices must be int64, got float32)")
    fails(function() return mg.take_along_axis(x, {{1}}) end,
          "bad argument #3 to 'take_along_axis' (axis expected (an integer), got no value)")
    fails(function() return mg.take_along_axis(c(1), c(1, "int64"), nil) end,
          "bad argument #3 to 'take_along_axis' (axis expected (an integer), got nil)")
    fails(function() return mg.put_along_axis(x, {{1}}, c({1}, "float64"), 2) end,
          "put_along_axis: dtypes differ: x is float32, values are float64")
    fails(function() return mg.put_along_axis(x, {{1, 2}}, mg.ones{3}, 2) end,
          "put_along_axis: values (3) do not broadcast to the indices' shape (2,2)")
    fails(function() return mg.put_along_axis(x, {{1}, {1}, {1}}, 1, 2) end,
          "put_along_axis: indices (3,1) do not fit x (2,3) outside axis 2")
    fails(function() return mg.put_along_axis(x, {{1}}, 1, 2, {mode = "max"}) end,
          "bad argument #5 to 'put_along_axis' (unknown mode 'max' (use 'set' or 'add'))")
  end)
end)

describe("gather", function()
  it("accepts negative indices, counting from the end, and keeps its slices", function()
    local x = c({{1, 2}, {3, 4}, {5, 6}})
    same({{5, 6}, {1, 2}}, mg.gather(x, {-1, 1}))
    same({{2, 1}, {4, 3}, {6, 5}}, mg.gather(x, {-1, -2}, 2))
    same({{2, 2}}, c({1, 2, 3}):gather(c({{-2, 2}}, "int64")))
    fails(function() return mg.gather(x, {-4}) end, "gather: index -4 is out of bounds for dimension 1 of size 3 (use 1..3 or -3..-1)")
    fails(function() return mg.gather(x, {0}) end,
          "gather: index 0 is out of range (indices start at 1; negative ones count from the end)")
    local v = rnd({3, 2})
    same({{0, 0}, {2, 2}, {2, 2}}, grad(function(t) return mg.gather(t, {-1, 2, 3, -2}) end, v))
  end)
end)

describe("flip, tile, repeat_interleave, pad", function()
  local x = c({{1, 2, 3}, {4, 5, 6}})

  it("flip reverses along the given axes (a view), every axis without", function()
    same({{3, 2, 1}, {6, 5, 4}}, mg.flip(x, 2))
    same({{4, 5, 6}, {1, 2, 3}}, x:flip(-2))
    same({{6, 5, 4}, {3, 2, 1}}, mg.flip(x))
    same({{6, 5, 4}, {3, 2, 1}}, mg.flip(x, {1, 2}))
    same({{1, 2, 3}, {4, 5, 6}}, mg.flip(x, {}))
    assert.same({0, 2}, mg.flip(mg.zeros{0, 2}).shape)
    assert.equal(5, mg.flip(c(5)):item())
    fails(function() return mg.flip(x, {1, 1}) end, "flip: axis 1 is given twice")
    fails(function() return mg.flip(x, 3) end,
          "bad argument #2 to 'flip' (axis 3 is out of range for 2 dimensions (use 1..2 or -2..-1))")
  end)

  it("tile repeats the whole tensor, as NumPy's tile", function()
    same({{1, 2, 3, 1, 2, 3}, {4, 5, 6, 4, 5, 6}}, mg.tile(x, {1, 2}))
    same({{1, 2, 3}, {4, 5, 6}, {1, 2, 3}, {4, 5, 6}}, x:tile{2, 1})
    same({1, 2, 1, 2, 1, 2}, mg.tile(c({1, 2}), 3))
    assert.same({2, 2, 3}, mg.tile(x, {2, 1, 1}).shape)             -- reps longer: x gets leading 1s
    assert.same({2, 6}, mg.tile(x, 2).shape)                        -- reps shorter: leading 1s
    assert.same({0, 3}, mg.tile(x, {0, 1}).shape)
    same({7, 7}, mg.tile(c(7), 2))
    fails(function() return mg.tile(x, {-1, 1}) end, "tile: repetition 1 is negative (-1)")
    fails(function() return mg.tile(x, {1.5}) end, "bad argument #2 to 'tile' (reps entry 1 is 1.5, not an integer)")
  end)

  it("repeat_interleave repeats each entry (np.repeat; Lua's `repeat` is a keyword)", function()
    same({1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6}, mg.repeat_interleave(x, 2))   -- flattened without an axis
    same({{1, 1, 2, 2, 3, 3}, {4, 4, 5, 5, 6, 6}}, x:repeat_interleave(2, 2))
    same({{1, 2, 3}, {4, 5, 6}, {4, 5, 6}}, mg.repeat_interleave(x, {1, 2}, 1))
    same({{2, 3, 3}, {5, 6, 6}}, mg.repeat_interleave(x, {0, 1, 2}, -1))
    -- counts as an int64 tensor (torch's), 1-d, strided or 0-d
    same({{2, 3, 3}, {5, 6, 6}}, mg.repeat_interleave(x, mg.tensor({0, 1, 2}, "int64"), 2))
    same({{1, 2, 3}, {4, 5, 6}, {4, 5, 6}},
         mg.repeat_interleave(x, mg.tensor({9, 1, 7, 2}, "int64"):slice({2, 4, 2}), 1))
    same({1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6}, mg.repeat_interleave(x, mg.tensor(2, "int64")))
    fails(function() return mg.repeat_interleave(x, mg.tensor{1, 2}, 1) end,
          "bad argument #2 to 'repeat_interleave' (repeats as a tensor must be int64 of 0 or 1 dimensions, got float32 with 1)")
    fails(function() return mg.repeat_interleave(x, "2", 1) end,
          "bad argument #2 to 'repeat_interleave' (repeats expected (an integer, a list of integers or an int64 tensor), got string)")
    assert.same({2, 0}, mg.repeat_interleave(x, 0, 2).shape)
    fails(function() return mg.repeat_interleave(x, {1, 2}, 2) end,
          "repeat_interleave: 2 repeat counts given for dimension 2 of size 3 (give one, or one per entry)")
    fails(function() return mg.repeat_interleave(x, -1, 2) end, "repeat_interleave: repeats = -1 is negative")
    fails(function() return mg.repeat_interleave(x, {1, -1}, 1) end, "repeat_interleave: repeats entry 2 is negative (-1)")
    fails(function() return mg.repeat_interleave(x, math.maxinteger, 1) end, "repeat_interleave: the result has too many elements")
  end)

  it("pad: constant (any value), reflect, symmetric, edge, wrap", function()
    same({{0, 0, 0, 0, 0}, {0, 1, 2, 3, 0}, {0, 4, 5, 6, 0}}, mg.pad(x, {{1, 0}, {1, 1}}))
    same({{9, 1, 2, 3}, {9, 4, 5, 6}}, x:pad({{0, 0}, {1, 0}}, {value = 9}))
    local r = c({1, 2, 3})
    same({3, 2, 1, 2, 3, 2, 1}, mg.pad(r, {{2, 2}}, {mode = "reflect"}))
    same({2, 1, 1, 2, 3, 3, 2}, mg.pad(r, {{2, 2}}, {mode = "symmetric"}))
    same({1, 1, 1, 2, 3, 3, 3}, mg.pad(r, {{2, 2}}, {mode = "edge"}))
    same({2, 3, 1, 2, 3, 1, 2}, mg.pad(r, {{2, 2}}, {mode = "wrap"}))
    same({2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2}, mg.pad(r, 5, {mode = "reflect"}))   -- wider than x
    same({{2, 1, 2, 3, 2}, {5, 4, 5, 6, 5}, {2, 1, 2, 3, 2}}, mg.pad(x, {{0, 1}, {1, 1}}, {mode = "reflect"}))
    same({true, false, true}, mg.pad(c({false}), 1, {value = true}))
    same({7, 1, 7}, mg.pad(c({1}, "int64"), 1, {value = 7}))
    assert.same({2, 0}, mg.pad(mg.zeros{0, 0}, {{1, 1}, {0, 0}}).shape)
    assert.equal(3, mg.pad(c(3), {}):item())
  end)

  it("pad errors", function()
    fails(function() return mg.pad(x, {{1, 1}}) end,
          "bad argument #2 to 'pad' (1 {before, after} pair given for 2 dimensions)")
    fails(function() return mg.pad(x, {{1, 1}, {1}}) end,
          "bad argument #2 to 'pad' (the padding of dimension 2 must be a {before, after} pair)")
    fails(function() return mg.pad(x, {{1, 1}, {0, -1}}) end,
          "pad: padding of dimension 2 is negative (0 before, -1 after)")
    fails(function() return mg.pad(x, 1, {mode = "mirror"}) end,
          "bad argument #3 to 'pad' (unknown mode 'mirror' (use constant, reflect, symmetric, edge or wrap))")
    fails(function() return mg.pad(x, 1, {mode = "edge", value = 1}) end,
          "bad argument #3 to 'pad' (option 'value' applies to mode 'constant' only, not 'edge')")
    fails(function() return mg.pad(mg.zeros{0}, 1, {mode = "reflect"}) end,
          "pad: mode 'reflect' cannot pad dimension 1, which has no entries")
    fails(function() return mg.pad(c({1}, "int64"), 1, {value = 0.5}) end,
          "bad argument #3 to 'pad' (option 'value' for an int64 tensor is 0.5, not an integer)")
    fails(function() return mg.pad(x, 1, {vaule = 1}) end,
          "bad argument #3 to 'pad' (unknown option 'vaule' (did you mean 'value'?); known: mode, value)")
  end)
end)

describe("tril, triu, masked_fill, where", function()
  local sq = c({{1, 2, 3}, {4, 5, 6}, {7, 8, 9}})

  it("tril and triu keep a triangle of the last two axes (batched)", function()
    same({{1, 0, 0}, {4, 5, 0}, {7, 8, 9}}, mg.tril(sq))
    same({{0, 2, 3}, {0, 0, 6}, {0, 0, 0}}, sq:triu(1))
    same({{1, 2, 0}, {4, 5, 6}, {7, 8, 9}}, mg.tril(sq, 1))
    same({{0, 0, 0}, {4, 0, 0}, {7, 8, 0}}, mg.tril(sq, -1))
    same({{1, 2, 3, 4}, {0, 6, 7, 8}}, mg.triu(c({{1, 2, 3, 4}, {5, 6, 7, 8}})))
    local b = mg.tril(mg.ones({2, 2, 2}, "int64"))
    same({{{1, 0}, {1, 1}}, {{1, 0}, {1, 1}}}, b)
    same({{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}, mg.tril(sq, -math.maxinteger))
    same(sq:totable(), mg.tril(sq, math.maxinteger))
    fails(function() return mg.tril(c({1, 2})) end, "tril: needs at least 2 dimensions, got 1")
    fails(function() return mg.triu(sq, 0.5) end, "bad argument #2 to 'triu' (k is 0.5, not an integer)")
  end)

  it("masked_fill puts a value where the mask is true (mask broadcasts)", function()
    local m = c({true, false, true})
    same({{-1, 2, -1}, {-1, 5, -1}, {-1, 8, -1}}, mg.masked_fill(sq, m, -1))
    same({{0, 2, 0}, {0, 5, 0}, {0, 8, 0}}, sq:masked_fill(m, c(0)))
    same({5, 2}, mg.masked_fill(c({1, 2}, "int64"), c({true, false}), 5))
    fails(function() return mg.masked_fill(sq, c({1, 0, 1}), 0) end, "masked_fill: mask must be a bool tensor, got float32")
    fails(function() return mg.masked_fill(c({1, 2}), c({{true}, {false}}), 0) end,
          "masked_fill: mask (2,1) does not broadcast to x's shape (2)")
    fails(function() return mg.masked_fill(sq, m, c({1, 2})) end,
          "masked_fill: value must be a 0-d tensor (one number), got shape (2)")
    fails(function() return mg.masked_fill(c({1}, "int64"), c({true}), 1.5) end, "masked_fill: cannot convert 1.5 to int64")
    fails(function() return mg.masked_fill(sq, m, "x") end,
          "bad argument #3 to 'masked_fill' (moongrad.Tensor or number expected, got string)")
  end)

  it("where takes Lua numbers and booleans for either branch", function()
    local cond = c({true, false, true})
    local y = mg.where(cond, 1, 2)
    same({1, 2, 1}, y)
    assert.equal("float32", y.dtype)
    same({10, 0, 30}, mg.where(cond, c({10, 20, 30}, "float64"), 0))
    assert.equal("float64", mg.where(cond, 0, c({1}, "float64")).dtype)
    same({7, 2, 7}, mg.where(cond, 7, c({1, 2, 3}, "int64")))
    same({true, false, true}, mg.where(cond, true, false))
    same({{5, 1}, {5, 1}}, mg.where(c({true, false}), 5, c({{1}, {1}})))
    fails(function() return mg.where(cond, 1.5, c({1}, "int64")) end, "where: cannot convert 1.5 to int64")
    fails(function() return mg.where(cond, "a", 1) end,
          "bad argument #2 to 'where' (moongrad.Tensor or number expected, got string)")
  end)
end)

describe("einsum", function()
  mg.random.seed(3)
  local a, b = rnd({2, 3}), rnd({3, 4})

  it("contractions as matmul, transposes, traces, sums and outer products", function()
    h.assert_close(mg.einsum("ij,jk->ik", a, b), mg.matmul(a, b), 1e-12)
    h.assert_close(mg.einsum("ij,jk", a, b), mg.matmul(a, b), 1e-12)             -- implicit output
    local p, q = rnd({2, 3, 4}), rnd({2, 4, 5})
    h.assert_close(mg.einsum("bij,bjk->bik", p, q), mg.matmul(p, q), 1e-12)
    local qq, kk = rnd({2, 2, 3, 4}), rnd({2, 2, 5, 4})
    h.assert_close(mg.einsum("bhqd,bhkd->bhqk", qq, kk), mg.matmul(qq, mg.swapaxes(kk, -1, -2)), 1e-12)
    h.assert_close(mg.einsum("ij->ji", a), mg.transpose(a), 0)
    h.assert_close(mg.einsum("ij->", a), mg.sum(a), 1e-12)
    local m = c({{1, 2, 3}, {4, 5, 6}, {7, 8, 9}})
    same({1, 5, 9}, mg.einsum("ii->i", m))
    assert.equal(15, mg.einsum("ii", m):item())
    assert.equal(15, mg.einsum("ii->", m):item())
    same({{0, 0, 0}, {1, 2, 3}}, mg.einsum("i,j->ij", c({0, 1}), c({1, 2, 3})))
    same({14, 77}, mg.einsum("bi,bi->b", c({{1, 2, 3}, {4, 5, 6}}), c({{1, 2, 3}, {4, 5, 6}})))
    assert.same({2, 5}, mg.einsum("ij,kj->ik", a, rnd({5, 3})).shape)
    h.assert_close(mg.einsum("ab,b->a", a, c({1, 1, 1}, "float64")), mg.sum(a, 2), 1e-12)
    h.assert_close(mg.einsum("ij,ij->ij", c({{1, 2}}), c({{1, 1}, {2, 2}})), c({{1, 2}, {2, 4}}), 0)   -- 1 broadcasts
    assert.same({3, 5}, mg.einsum("ji,jk->ik", rnd({4, 3}), rnd({4, 5})).shape)
    same({{0}}, mg.einsum("ij,jk->ik", mg.zeros{1, 0}, mg.zeros{0, 1}))
  end)

  it("errors: malformed specs, mismatched sizes, repeated output letters, ellipsis", function()
    fails(function() return mg.einsum("ij,jk->ik", a) end, "einsum: 'ij,jk->ik' names 2 operands, got 1")
    fails(function() return mg.einsum("ij,jk,kl->il", a, b, b) end, "einsum: at most 2 operands are supported, got 3")
    fails(function() return mg.einsum("ij,jk->ik", a, rnd({4, 4})) end,
          "einsum: letter 'j' has size 3 in operand 1 but 4 in operand 2")
    fails(function() return mg.einsum("ijk,jk->ik", a, b) end, "einsum: operand 1 has 2 dimensions, but 'ijk' names 3")
    fails(function() return mg.einsum("ij->ii", a) end, "einsum: letter 'i' appears twice in the output")
    fails(function() return mg.einsum("ij->k", a) end, "einsum: output letter 'k' appears in no operand")
    fails(function() return mg.einsum("...ij->ij", a) end,
          "einsum: ellipsis ('...') is not supported; name every axis with a letter")
    fails(function() return mg.einsum("i j;k", a) end,
          "einsum: unexpected character ';' in 'i j;k' (letters, ',' and '->' only)")
    fails(function() return mg.einsum("ij->i->j", a) end, "einsum: '->' appears twice in 'ij->i->j'")
    fails(function() return mg.einsum("ii->i", a) end,
          "einsum: letter 'i' has sizes 2 and 3 in operand 1 (a repeated letter takes a diagonal)")
    fails(function() return mg.einsum("ij,jk->ik", a, mg.cast(b, "float32")) end,
          "einsum: dtypes differ: float64 and float32")
    fails(function() return mg.einsum("ij") end, "bad argument #2 to 'einsum' (moongrad.Tensor expected, got no value)")
    fails(function() return mg.einsum(a, a) end, "bad argument #1 to 'einsum' (string expected, got moongrad.Tensor)")
  end)
end)

describe("gradients (float64 gradchecks)", function()
  before_each(function() mg.random.seed(77) end)

  it("sort and topk values: the gradient goes back where each value came from", function()
    local x = rnd({3, 5})
    check(function(v) return (mg.sort(v)) end, x)
    check(function(v) return (mg.sort(v, 1, {descending = true})) end, x)
    check(function(v) return (mg.topk(v, 2)) end, x)
    check(function(v) return (mg.topk(v, 2, 1, {largest = false, sorted = false})) end, x)
    check(function(v) return (mg.topk(v, 1, {largest = false})) end, rnd({4, 200}))     -- the heap path
    check(function(v) return (mg.sort(v)) end, rnd({}))
    same({{0, 1, 1}}, grad(function(v) return (mg.topk(v, 2)) end, c({{1, 3, 2}}, "float64")))
  end)

  it("take_along_axis and put_along_axis (set and add)", function()
    local x = rnd({3, 4})
    local idx = c({{4, 1, 1}, {2, 2, -1}, {3, 1, 4}}, "int64")
    check(function(v) return mg.take_along_axis(v, idx, 2) end, x)
    check(function(v) return mg.take_along_axis(v, {{1, 3, -1, 2}}, 1) end, x)   -- broadcast indices
    check(function(v, w) return mg.put_along_axis(v, idx, w, 2) end, x, rnd({3, 3}))
    check(function(v, w) return mg.put_along_axis(v, idx, w, 2, {mode = "add"}) end, x, rnd({3, 3}))
    check(function(v, w) return mg.put_along_axis(v, {{2}, {1}, {3}}, w, 2) end, x, rnd({1}))   -- values broadcast
    check(function(v) return mg.take_along_axis(v, {{2, 4}, {1, 1}, {-1, 3}}, 2) end, rnd({1, 4}))  -- x broadcast
  end)

  it("flip, tile, repeat_interleave, pad (every mode), tril, triu", function()
    local x = rnd({2, 3})
    check(function(v) return mg.flip(v, 2) * v end, x)
    check(function(v) return mg.tile(v, {2, 1, 3}) end, x)
    check(function(v) return mg.tile(v, 2) end, rnd({3}))
    check(function(v) return mg.repeat_interleave(v, {2, 0, 3}, 2) end, x)
    check(function(v) return mg.repeat_interleave(v, 2) end, x)
    for _, mode in ipairs({"constant", "reflect", "symmetric", "edge", "wrap"}) do
      check(function(v) return mg.pad(v, {{1, 4}, {2, 3}}, {mode = mode}) end, x)
    end
    check(function(v) return mg.tril(v, 1) end, rnd({2, 3, 3}))
    check(function(v) return mg.triu(v, -1) end, rnd({3, 4}))
  end)

  it("masked_fill, to x and to a 0-d value", function()
    local m = c({{true, false, false}, {false, true, false}})
    check(function(v, f) return mg.masked_fill(v, m, f) end, rnd({2, 3}), rnd({}))
    check(function(v) return mg.masked_fill(v, c({false, true, false}), 3) end, rnd({2, 3}))
  end)

  it("einsum, for several specs", function()
    for _, s in ipairs({{"ij,jk->ik", {2, 3}, {3, 4}}, {"bhqd,bhkd->bhqk", {1, 2, 3, 2}, {1, 2, 4, 2}},
                        {"i,j->ij", {3}, {2}}, {"bi,bi->b", {2, 3}, {2, 3}}, {"ij,ij->ij", {1, 3}, {2, 3}},
                        {"iij,jk->ki", {2, 2, 3}, {3, 2}}}) do
      check(function(p, q) return mg.einsum(s[1], p, q) end, rnd(s[2]), rnd(s[3]))
    end
    for _, s in ipairs({"ij->ji", "ii->i", "ij->", "ii", "ij->j"}) do
      check(function(p) return mg.einsum(s, p) end, rnd({3, 3}))
    end
  end)

  it("second order: through sort, take_along_axis, pad and einsum", function()
    local function second (f, x)                 -- d/dx of sum(grad of sum(f(x)^3))
      return function(v)
        local t = mg.tape()
        t:watch(v)
        local y = mg.sum(f(v) ^ 3)
        t:stop()
        return t:gradient(y, v)
      end, x
    end
    check(second(function(v) return (mg.sort(v)) end, rnd({2, 4})))
    check(second(function(v) return mg.take_along_axis(v, {{2, 2, 1}}, 2) end, rnd({2, 3})))
    check(second(function(v) return mg.pad(v, {{2, 1}}, {mode = "reflect"}) end, rnd({3})))
    check(second(function(v) return mg.einsum("ij,jk->ik", v, v) end, rnd({3, 3})))
  end)
end)

describe("the registry", function()
  it("has one row per new op, reachable as mg.f (and x:f() but einsum)", function()
    local rows = {}
    for _, op in ipairs(mg.ops()) do rows[op.name] = op end
    local x = mg.ones{2, 2}
    for _, name in ipairs({"sort", "argsort", "topk", "take_along_axis", "put_along_axis", "flip", "tile",
                           "repeat_interleave", "pad", "tril", "triu", "masked_fill", "einsum"}) do
      assert.equal("other", rows[name].kind, name)
      assert.is_string(rows[name].doc, name)
      assert.is_function(mg[name], name)
      if name ~= "einsum" then assert.is_function(x[name], name) end
    end
    assert.same({{2, 1}}, (mg.Variable(c({{1, 2}})):flip(2)):totable())     -- variables have the methods
  end)

  it("bench/ops_index.lua runs (tiny sizes, no timing asserted)", function()
    local out, code = h.run(h.bin .. " bench/ops_index.lua quick")
    assert.equal(0, code, out)
    for _, op in ipairs({"sort 1M", "topk", "einsum", "tile", "pad", "flip", "take_along_axis", "masked_fill"}) do
      assert.truthy(out:find("| " .. op, 1, true), op)
    end
  end)

  it("failed calls leave nothing behind", function()
    local before = h.settled()
    for _ = 1, 20 do
      pcall(mg.topk, mg.ones{3}, 4)
      pcall(mg.take_along_axis, mg.ones{2, 2}, {{3}}, 2)
      pcall(mg.put_along_axis, mg.ones{2, 2}, {{1}}, mg.ones({1}, "float64"), 2)
      pcall(mg.einsum, "ij,jk->ik", mg.ones{2, 3}, mg.ones{4, 4})
      pcall(mg.pad, mg.zeros{0}, 1, {mode = "wrap"})
      pcall(mg.repeat_interleave, mg.ones{2}, {1, -1}, 1)
    end
    local after = h.settled()
    assert.equal(before.live_tensors, after.live_tensors)
    assert.equal(before.current_bytes, after.current_bytes)
  end)
end)

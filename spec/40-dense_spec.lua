-- mg.dense(x, w, b, activation): the fully connected layer as one op. Its
-- numbers are those of matmul, + and the activation bit for bit (float32
-- and float64, every activation, 1-D to 3-D and strided inputs, zero
-- sizes); float64 gradchecks of first and second order; nn.Dense runs on
-- it; the tape keeps one node's worth (x, w, y); a memory budget rebuilds
-- it; a save policy keeps it; its errors name the mismatch.
local mg = require "moongrad"
local h = require "helpers"

local ACTS = {"linear", "relu", "tanh", "sigmoid"}

local function rnd (shape, dtype) return mg.random.uniform(shape, -2, 2, dtype or "float64") end

-- act(x @ w + b) from the separate ops
local function ref (x, w, b, act)
  local y = mg.matmul(x, w)
  if b then y = y + b end
  if act ~= "linear" then y = mg[act](y) end
  return y
end

local function same_bits (a, b)
  assert.same(a.shape, b.shape)
  assert.equal(a.dtype, b.dtype)
  assert.equal(0, mg.sum(mg.cast(mg.not_equal(a, b), "int64")):item())
end

local function check (f, ...) assert.is_true(mg.test.gradcheck(f, {...})) end

describe("dense", function()
  before_each(function() mg.random.seed(40) end)

  it("gives the numbers of matmul, + and the activation, bit for bit", function()
    for _, dt in ipairs{"float32", "float64"} do
      local w, b = rnd({7, 5}, dt), rnd({5}, dt)
      local inputs = {rnd({7}, dt), rnd({6, 7}, dt), rnd({2, 3, 7}, dt), mg.transpose(rnd({7, 6}, dt)),
                      mg.swapaxes(rnd({3, 2, 7}, dt), 1, 2), rnd({300, 7}, dt)}
      for _, act in ipairs(ACTS) do
        for _, x in ipairs(inputs) do
          same_bits(mg.dense(x, w, b, act), ref(x, w, b, act))
          same_bits(mg.dense(x, w, nil, act), ref(x, w, nil, act))
        end
      end
      same_bits(mg.dense(inputs[2], w, b), ref(inputs[2], w, b, "linear"))
      same_bits(inputs[2]:dense(w, b, "relu"), ref(inputs[2], w, b, "relu"))
    end
  end)

  it("runs rows longer than a pass' block and the 1024-wide layers of the benchmarks", function()
    local x, w, b = rnd({33, 700}, "float32"), rnd({700, 5000}, "float32"), rnd({5000}, "float32")
    same_bits(mg.dense(x, w, b, "relu"), ref(x, w, b, "relu"))
    x, w, b = rnd({128, 784}, "float32"), rnd({784, 1024}, "float32"), rnd({1024}, "float32")
    same_bits(mg.dense(x, w, b, "tanh"), ref(x, w, b, "tanh"))
  end)

  it("handles zero sizes: no rows, no inputs (the bias alone), no outputs", function()
    same_bits(mg.dense(mg.ones{0, 3}, mg.ones{3, 2}, mg.ones{2}, "relu"), mg.zeros{0, 2})
    same_bits(mg.dense(mg.ones{2, 0}, mg.ones{0, 2}, mg.constant({1, -1}), "relu"), mg.constant({{1, 0}, {1, 0}}))
    same_bits(mg.dense(mg.ones{2, 3}, mg.ones{3, 0}, mg.ones{0}, "tanh"), mg.zeros{2, 0})
    same_bits(mg.dense(mg.ones{2, 4, 0}, mg.ones{0, 3}), mg.zeros{2, 4, 3})
  end)

  it("passes float64 gradchecks for every activation, with and without a bias", function()
    for _, act in ipairs(ACTS) do
      check(function(x, w, b) return mg.dense(x, w, b, act) end, rnd{4, 3}, rnd{3, 2}, rnd{2})
      check(function(x, w) return mg.dense(x, w, nil, act) end, rnd{2, 2, 3}, rnd{3, 4})
      check(function(x, w, b) return mg.dense(x, w, b, act) end, rnd{3}, rnd{3, 2}, rnd{2})
      check(function(x, w, b) return mg.dense(mg.transpose(x), w, b, act) end, rnd{3, 4}, rnd{3, 2}, rnd{2})
    end
  end)

  it("passes second-order gradchecks (a tape that records the backward)", function()
    local seed = rnd{4, 2}
    for _, act in ipairs(ACTS) do
      check(function(x, w, b)
        local t = mg.tape()
        t:watch({x, w, b})
        local y = mg.sum(mg.dense(x, w, b, act) * seed)
        local g = t:gradient(y, {x, w, b})
        return g[1] * 2 + mg.sum(g[2]) + mg.sum(g[3])
      end, rnd{4, 3}, rnd{3, 2}, rnd{2})
    end
  end)

  it("gives the gradients of the separate ops, and only those asked for", function()
    local x, w, b, seed = rnd({2, 5, 6}, "float32"), rnd({6, 3}, "float32"), rnd({3}, "float32"), rnd({2, 5, 3}, "float32")
    for _, act in ipairs(ACTS) do
      local fused = h.grads(function(a, c, d) return mg.dense(a, c, d, act) end, {x, w, b}, seed)
      local plain = h.grads(function(a, c, d) return ref(a, c, d, act) end, {x, w, b}, seed)
      for i = 1, 3 do h.assert_close(fused[i], plain[i], 1e-5) end
      local only_w = h.grads(function(c) return mg.dense(x, c, b, act) end, {w}, seed)
      h.assert_close(only_w[1], plain[2], 1e-5)
    end
  end)

  it("is what nn.Dense runs, fused for its named activations and mg.relu itself", function()
    local x = rnd({4, 6}, "float32")
    for _, act in ipairs{"relu", "tanh", "sigmoid", "linear", "softmax", mg.relu, function(y) return y * 2 end} do
      for _, use_bias in ipairs{true, false} do
        local layer = mg.nn.Dense(3, {activation = act, use_bias = use_bias})
        local y = layer(x)
        local z = mg.matmul(x, layer.kernel)
        if use_bias then z = z + layer.bias end
        if type(act) == "function" then z = act(z) elseif act ~= "linear" then z = mg[act](z) end
        same_bits(y, z)
      end
    end
  end)

  it("keeps x and y on the tape (w is a variable's), not the sum before the activation; linear keeps x", function()
    local x, w, b = rnd({256, 64}, "float32"), mg.Variable(rnd({64, 64}, "float32")), mg.Variable(rnd({64}, "float32"))
    local w2 = rnd({64, 64}, "float32")                  -- a plain tensor: kept by the tape
    -- what the dense node saved, and the gradients of w and b the tape gives from it
    local function saved (f)
      local before = mg.memory.stats().saved_bytes
      local t = mg.tape()
      local y = f()
      local s = mg.memory.stats().saved_bytes - before
      local loss = mg.sum(y)                             -- recorded: the backward runs on what was saved
      t:stop()
      local g = t:gradient(loss, {w, b})
      return s, g[1], g[2]
    end
    local s, gw, gb = saved(function() return mg.dense(x, w, b, "relu") end)
    assert.equal(256 * 64 * 2 * 4, s)
    assert.is_not_nil(gw); assert.is_not_nil(gb)
    local want = h.grads(function(c, d) return ref(x, c, d, "relu") end, {w:value(), b:value()},
                         mg.ones({256, 64}, "float32"))
    h.assert_close(gw, want[1], 1e-4)
    h.assert_close(gb, want[2], 1e-4)
    s, gw, gb = saved(function() return mg.dense(x, w, b) end)
    assert.equal(256 * 64 * 4, s)
    assert.is_not_nil(gw); assert.is_not_nil(gb)
    -- only b is followed: y alone (x and w2 serve the gradients of w2 and x)
    s, gw, gb = saved(function() return mg.dense(x, w2, b, "tanh") end)
    assert.equal(256 * 64 * 4, s)
    assert.is_nil(gw)                                    -- w is not in this layer
    assert.is_not_nil(gb)
  end)

  it("keeps what the wanted gradients need: x for w's, w for x's (PyTorch's needs_input_grad)", function()
    local x, w = rnd({256, 64}, "float32"), rnd({64, 32}, "float32")
    local function saved (watch)
      local t = mg.tape()
      for _, v in ipairs(watch) do t:watch(v) end
      local _ = mg.dense(x, w)
      t:stop()
      return t:saved_bytes()
    end
    assert.equal(64 * 32 * 4, saved{x})
    assert.equal(256 * 64 * 4, saved{w})
    assert.equal(256 * 64 * 4 + 64 * 32 * 4, saved{x, w})
  end)

  it("is rebuilt under a memory budget, with the plain gradients bit for bit", function()
    mg.random.seed(3)
    local layers, x = {}, mg.random.normal{256, 64}
    for i = 1, 8 do layers[i] = mg.nn.Dense(64, "tanh") end
    local vars
    local function grads (budget)
      local was = mg.memory.budget(budget)
      local t = mg.tape()
      local y = x
      for _, l in ipairs(layers) do y = l(y) end
      local loss = mg.mean(y ^ 2)
      t:stop()
      if not vars then
        vars = {}
        for _, l in ipairs(layers) do vars[#vars + 1] = l.kernel; vars[#vars + 1] = l.bias end
      end
      local g = t:gradient(loss, vars)
      mg.memory.budget(was)
      return g
    end
    collectgarbage()
    local start = mg.memory.stats().current_bytes
    mg.memory.reset_peak()
    local plain = grads()
    local peak = mg.memory.stats().peak_bytes - start
    local before = mg.memory.stats()
    collectgarbage()
    local budgeted = grads(mg.memory.stats().current_bytes + math.floor(peak * 0.5))
    assert.is_true(mg.memory.stats().rematerialisations > before.rematerialisations)
    for i = 1, #plain do same_bits(budgeted[i], plain[i]) end
  end)

  it("is kept by the 'dots' save policy of recompute_grad", function()
    local w, b = mg.Variable(rnd({8, 8})), mg.Variable(rnd({8}))
    local f = mg.recompute_grad(function(x) return mg.dense(mg.dense(x, w, b, "tanh"), w, b, "relu") end,
                                {policy = "dots"})
    local x = rnd{4, 8}
    local t = mg.tape()
    local y = mg.sum(f(x))
    t:stop()
    local g = t:gradient(y, {w, b})
    local t2 = mg.tape()
    local y2 = mg.sum(mg.dense(mg.dense(x, w, b, "tanh"), w, b, "relu"))
    t2:stop()
    local g2 = t2:gradient(y2, {w, b})
    same_bits(g[1], g2[1])
    same_bits(g[2], g2[2])
  end)

  it("writes an activation's backward over the output gradient the walk spares it", function()
    local x = mg.Variable(rnd({256, 64}, "float32"))
    local bytes = 256 * 64 * 4
    local function run (keep_middle)
      local t = mg.tape()
      local a = mg.tanh(x)
      local b = mg.relu(a)
      local c = mg.sigmoid(b)
      local y = mg.sum(mg.dense(c, mg.ones{64, 64}, nil, "tanh"))
      t:stop()
      local before = mg.memory.stats().allocated_bytes
      local g = t:gradient(y, keep_middle and {x, b} or {x})
      return g[1], mg.memory.stats().allocated_bytes - before
    end
    local g, alloc = run(false)
    local g2, alloc2 = run(true)
    same_bits(g, g2)
    -- sum's backward gives a broadcast view: dense's rule writes the first
    -- tensor (and dense's dx the second); sigmoid, relu and tanh then reuse it
    assert.is_true(alloc < 3 * bytes, alloc)
    -- asked for, b's gradient is the caller's: relu's rule leaves it alone
    assert.is_true(alloc2 >= alloc + bytes, alloc2 .. " " .. alloc)
    assert.is_true(mg.test.gradcheck(function(v)
      return mg.dense(mg.sigmoid(mg.relu(mg.tanh(v))), mg.ones({4, 2}, "float64"), nil, "tanh")
    end, {rnd{3, 4}}))
  end)

  it("reuses no gradient buffer while a save policy counts ops (recompute's two runs make the same ops)", function()
    local x = mg.constant({{0.5, -1.0, 2.0}, {1.5, 0.25, -0.5}}, "float64")
    local w1 = mg.constant({{1, -1}, {0.5, 2}, {-1, 1}}, "float64")
    local w2 = mg.constant({{2, 1}, {-0.5, 1}, {1, -2}}, "float64")
    local function f (v)                      -- an inner gradient, as a gradient penalty has
      local t = mg.tape()
      t:watch(v)
      local b = mg.dense(v, w1, nil, "relu")
      local a = mg.relu(mg.matmul(v, w2))
      local l = mg.sum(b) + mg.sum(a * a)
      t:stop()
      return t:gradient(l, v) * v
    end
    local plain = h.grad(f, x)
    for _, policy in ipairs{"nothing", "everything", function(name) return name == "relu_grad" end,
                            function(name) return name == "add" or name == "mul" end} do
      same_bits(h.grad(mg.recompute_grad(f, {policy = policy}), x), plain)
    end
  end)

  it("gives a persistent tape the same gradients twice (y is dropped only by a walk's last visit)", function()
    local x, w, b = rnd{5, 4}, mg.Variable(rnd{4, 3}), mg.Variable(rnd{3})
    local t = mg.tape{persistent = true}
    local y = mg.sum(mg.dense(mg.dense(x, w:value() * 1 + w, nil, "sigmoid"), mg.ones({3, 3}, "float64"), b, "relu"))
    t:stop()
    local g1, g2 = t:gradient(y, {w, b}), t:gradient(y, {w, b})
    same_bits(g1[1], g2[1])
    same_bits(g1[2], g2[2])
  end)

  it("names the mismatch", function()
    local x = mg.ones{2, 3}
    assert.has_error(function() mg.dense(x, mg.ones{4, 5}) end, "dense: inner dimensions differ: x (2,3) @ w (4,5)")
    assert.has_error(function() mg.dense(x, mg.ones{3, 5}, mg.ones{4}) end,
                     "dense: b has shape (4), expected (5) (w's columns)")
    assert.has_error(function() mg.dense(x, mg.ones{3, 5}, mg.ones{1, 5}) end,
                     "dense: b has shape (1,5), expected (5) (w's columns)")
    assert.has_error(function() mg.dense(x, mg.ones{3, 5}, nil, "gelu") end,
                     "dense: unknown activation 'gelu' (linear, relu, tanh or sigmoid)")
    assert.has_error(function() mg.dense(x, mg.ones{3}) end, "dense: w must be a matrix (in, out), got shape (3)")
    assert.has_error(function() mg.dense(mg.ones({2, 3}, "int64"), mg.ones{3, 5}) end,
                     "dense: x must be float32, float64, bfloat16 or float16, got int64")
    assert.has_error(function() mg.dense(x, mg.ones({3, 5}, "float64")) end,
                     "dense: dtypes differ: x is float32, w is float64")
    assert.has_error(function() mg.dense(x, mg.ones{3, 5}, mg.ones({5}, "float64")) end,
                     "dense: dtypes differ: x is float32, b is float64")
    assert.has_error(function() mg.dense(mg.constant(1), mg.ones{1, 5}) end,
                     "dense: x must have at least 1 dimension, got a 0-d tensor")
    assert.has_error(function() mg.dense(nil, mg.ones{3, 5}) end,
                     "bad argument #1 to 'dense' (moongrad.Tensor expected, got nil)")
    assert.has_error(function() mg.dense(x, mg.ones{3, 5}, nil, mg.relu) end,
                     "bad argument #4 to 'dense' (string expected, got function)")
    assert.has_error(function() mg.dense(x, mg.ones{3, 5}, nil, "relu\0x") end,
                     "bad argument #4 to 'dense' (the activation name holds a zero byte)")
    assert.has_error(function() mg.dense(mg.zeros{2 ^ 31, 0}, mg.zeros{0, 2 ^ 31}) end,
                     "dense: tensor: shape (2147483648,2147483648) has too many elements to allocate")
    assert.has_error(function() mg.dense(x, mg.ones{3, 5}, nil, "relu", 1) end,
                     "bad argument #5 to 'dense' (nothing may follow the activation)")
  end)
end)

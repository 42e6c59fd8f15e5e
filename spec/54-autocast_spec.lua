-- Automatic mixed precision: mg.autocast("bfloat16", ...) runs products in
-- bfloat16 (float32 accumulation), everything else in float32; gradients
-- come back in the variables' dtype; memory-saving paths under autocast
-- give autocast's plain-tape gradients.
local mg = require "moongrad"
local h = require "spec.helpers"

-- ||a - b|| / ||b||, as a number (any float dtypes)
local function rel_err (a, b)
  a, b = mg.cast(a, "float64"), mg.cast(b, "float64")
  local d = mg.sqrt(mg.sum((a - b) ^ 2)):item()
  local n = mg.sqrt(mg.sum(b ^ 2)):item()
  return n == 0 and d or d / n
end

-- the gradients of loss_fn's scalar with respect to vars, under autocast when dtype is given
local function grads (loss_fn, vars, dtype)
  local t = mg.tape()
  local loss = dtype and mg.autocast(dtype, loss_fn) or loss_fn()
  t:stop()
  return t:gradient(loss, vars), loss
end

local function same_bits (a, b)
  assert.are.equal(a.dtype, b.dtype)
  assert.are.equal(0, mg.sum(mg.cast(mg.not_equal(a, b), "int64")):item(), "bits differ")
end

describe("autocast", function()
  before_each(function() mg.random.seed(11) end)

  it("runs products in bfloat16 and leaves the rest in float32", function()
    local a, b = mg.random.normal{8, 16}, mg.random.normal{16, 4}
    local y32 = mg.matmul(a, b)
    local y, s, r = mg.autocast("bfloat16", function()
      local p = mg.matmul(a, b)
      return p, mg.sum(p), mg.relu(p)
    end)
    assert.are.equal("bfloat16", y.dtype)
    assert.are.equal("float32", s.dtype)            -- reductions in float32
    assert.are.equal("float32", r.dtype)            -- elementwise ops in float32
    assert.is_true(rel_err(y, y32) < 1e-2)
    assert.are.equal("float32", mg.matmul(a, b).dtype)   -- the region is closed
    local img = mg.random.normal{2, 6, 6, 3}
    local c = mg.autocast("bfloat16", mg.conv2d, img, mg.random.normal{3, 3, 3, 4})
    assert.are.equal("bfloat16", c.dtype)
    local e = mg.autocast("bfloat16", mg.conv2d, mg.zeros{0, 6, 6, 3}, mg.ones{3, 3, 3, 4})   -- an empty batch
    assert.same({0, 4, 4, 4}, e.shape)
    assert.is_nil(mg.autocast_dtype())
  end)

  -- PyTorch's TestAutocastCPU: an op under autocast gives, to the bit, what it
  -- gives outside with its float inputs cast by hand to the dtype its list
  -- says (bfloat16 for products; float32 for the rest, and for joins of a
  -- bfloat16 with a float32 tensor, which autocast promotes to the widest)
  it("gives what casting the inputs by hand gives, to the bit (PyTorch's autocast lists)", function()
    local function bf (x) return mg.cast(x, "bfloat16") end
    local function f32 (x) return mg.cast(x, "float32") end
    local a, b, bias = mg.random.normal{6, 5}, mg.random.normal{5, 4}, mg.random.normal{4}
    local img, k = mg.random.normal{2, 5, 5, 3}, mg.random.normal{3, 3, 3, 4}
    local q, kk, v = mg.random.normal{2, 3, 4, 8}, mg.random.normal{2, 3, 5, 8}, mg.random.normal{2, 3, 5, 8}
    local products = {
      matmul = {function(x, y) return mg.matmul(x, y) end, {a, b}},
      dense = {function(x, y, z) return mg.dense(x, y, z, "relu") end, {a, b, bias}, {false, false, true}},
      conv2d = {function(x, w) return mg.conv2d(x, w, {padding = "same"}) end, {img, k}},
      einsum = {function(x, y) return mg.einsum("ij,jk->ik", x, y) end, {a, b}},
      attention = {function(x, y, z) return mg.scaled_dot_product_attention(x, y, z, {causal = true}) end, {q, kk, v}},
      transposed_conv = {function(d, w) return mg.conv2d_backward_input(d, w, {2, 5, 5, 3}, {padding = "same"}) end,
                         {mg.random.normal{2, 5, 5, 4}, k}},
      conv_filter = {function(x, d) return mg.conv2d_backward_filter(x, d, {3, 3, 3, 4}, {padding = "same"}) end,
                     {img, mg.random.normal{2, 5, 5, 4}}},
    }
    for name, case in pairs(products) do
      local f, args, keep = case[1], case[2], case[3] or {}
      local auto = mg.autocast("bfloat16", f, table.unpack(args))
      -- where the CPU has no bfloat16 products attention runs float32 as it is
      local widened = name == "attention" and mg.autocast_isa() == nil
      local by_hand = {}
      for i, x in ipairs(args) do by_hand[i] = (keep[i] or widened) and x or bf(x) end
      assert.are.equal(widened and "float32" or "bfloat16", auto.dtype, name)
      same_bits(auto, f(table.unpack(by_hand)))
    end
    -- a product's bfloat16 output into the float32 list: the op on its float32 widening
    local p16 = bf(mg.matmul(a, b))
    local other = mg.random.normal{6, 4}
    local float32_ops = {
      softmax = function(x) return mg.softmax(x) end,
      log_softmax = function(x) return mg.log_softmax(x) end,
      layer_norm = function(x) return mg.layer_norm(x) end,
      sum = function(x) return mg.sum(x, 2) end,
      mean = function(x) return mg.mean(x) end,
      exp = function(x) return mg.exp(x) end,
      tanh = function(x) return mg.tanh(x) end,
      add = function(x) return x + other end,
      mse = function(x) return mg.losses.mean_squared_error(other, x) end,
      mse_half_targets = function(x) return mg.losses.mean_squared_error(x, other) end,
      nn_mse = function(x) return mg.nn.mean_squared_error(other, x) end,
      nn_mse_half_first = function(x) return mg.nn.mean_squared_error(x, other) end,
      cross_entropy = function(x)
        return mg.losses.sparse_categorical_crossentropy(mg.tensor({1, 2, 3, 4, 1, 2}, "int64"), x, {from_logits = true})
      end,
      concat = function(x) return mg.concat({x, other}, 2) end,
      stack = function(x) return mg.stack({other, x}) end,
      where = function(x) return mg.where(mg.greater(other, 0), x, other) end,
      masked_fill = function(x) return mg.masked_fill(x, mg.greater(other, 0), mg.tensor(3.5)) end,
      soft_labels = function(x)
        return mg.nn.softmax_cross_entropy(other, mg.softmax(x))   -- probabilities of the product's
      end,
      half_soft_labels = function(x) return mg.nn.softmax_cross_entropy(other, x) end,   -- bfloat16 labels
    }
    for name, f in pairs(float32_ops) do
      local auto = mg.autocast("bfloat16", f, p16)
      assert.are.equal("float32", auto.dtype, name)
      same_bits(auto, f(f32(p16)))
    end
  end)

  it("joins a half tensor with a float32 one in float32, gradients back in each one's dtype", function()
   for _, pair in ipairs{{"bfloat16", "float32"}, {"float16", "float32"}, {"bfloat16", "float16"}} do
    local p16 = mg.cast(mg.random.normal{3, 4}, pair[1])
    local x = mg.cast(mg.random.normal{3, 4}, pair[2])
    local cond = mg.greater(mg.random.normal{3, 4}, 0)
    local joins = {
      concat = function(a, b) return mg.concat({a, b}, 1) end,
      stack = function(a, b) return mg.stack({b, a}, 2) end,
      where = function(a, b) return mg.where(cond, a, b) end,
    }
    for name, join in pairs(joins) do
      local w = mg.random.normal(join(p16, x).shape)        -- a weight per entry: every gradient entry differs
      local function grads_of (a)
        local t = mg.tape()
        t:watch(a); t:watch(x)
        local y = join(a, x)
        local loss = mg.sum(y * w)
        t:stop()
        return y, t:gradient(loss, {a, x})
      end
      local y, g = grads_of(p16)
      local x32 = mg.cast(x, "float32")
      local function grads32 (a)                            -- both widened by hand
        local t = mg.tape()
        t:watch(a); t:watch(x32)
        local loss = mg.sum(join(a, x32) * w)
        t:stop()
        return join(a, x32), t:gradient(loss, {a, x32})
      end
      local y2, g2 = grads32(mg.cast(p16, "float32"))
      assert.are.equal("float32", y.dtype, name)
      assert.are.equal(pair[1], g[1].dtype, name)
      assert.are.equal(pair[2], g[2].dtype, name)
      same_bits(y, y2)
      same_bits(g[1], mg.cast(g2[1], pair[1]))
      same_bits(g[2], mg.cast(g2[2], pair[2]))
    end
   end
  end)

  it("adds a bfloat16 tensor to a float32 one as casting it first does, to the bit, either order, broadcast", function()
    local x = mg.random.normal{6, 5, 8}
    for _, shape in ipairs({{6, 5, 8}, {5, 8}, {1}, {6, 1, 8}}) do
      local hb = mg.cast(mg.random.normal(shape) * 100, "bfloat16")
      local want = x + mg.cast(hb, "float32")
      same_bits(want, x + hb)
      same_bits(want, hb + x)
      local t = mg.tape()
      t:watch({x, hb})
      local l = mg.sum((hb + x) * mg.random.normal{6, 5, 8})
      t:stop()
      local g = t:gradient(l, {x, hb})
      assert.are.equal("float32", g[1].dtype)
      assert.are.equal("bfloat16", g[2].dtype)
      assert.are.same(shape, g[2].shape)
    end
    local odd = mg.ones{4} + mg.cast(mg.tensor{0 / 0, math.huge, -math.huge, 1e38}, "bfloat16")
    assert.is_true(odd[1]:item() ~= odd[1]:item())                     -- NaN stays NaN
    same_bits(mg.slice(odd, {2, 4}), mg.tensor{math.huge, -math.huge, 1 + mg.cast(mg.tensor{1e38}, "bfloat16")[1]:item()})
  end)

  it("has a <close> form, nests, and can be turned off inside", function()
    local a = mg.random.normal{4, 4}
    do
      local ac <close> = mg.autocast("bfloat16")
      assert.are.equal("bfloat16", mg.autocast_dtype())
      assert.are.equal("bfloat16", mg.matmul(a, a).dtype)
      mg.autocast(false, function()
        assert.is_nil(mg.autocast_dtype())
        assert.are.equal("float32", mg.matmul(a, a).dtype)
      end)
      assert.are.equal("bfloat16", mg.matmul(a, a).dtype)
      assert.matches("open", tostring(ac))
    end
    assert.is_nil(mg.autocast_dtype())
  end)

  it("closes its region when the function fails", function()
    local ok, err = pcall(mg.autocast, "bfloat16", function() error("boom") end)
    assert.is_false(ok)
    assert.matches("boom", err)
    assert.is_nil(mg.autocast_dtype())
  end)

  it("names the mistake", function()
    local function msg (...) local ok, e = pcall(...); assert.is_false(ok); return e end
    assert.matches("autocast: dtype must be bfloat16, float16 or float32 %(off%), got int64",
                   msg(mg.autocast, "int64", function() end))
    assert.matches('"bfloat16", "float16", "float32" or false expected, got number', msg(mg.autocast, 42))
    assert.matches("conv2d: dtypes differ: input is bfloat16, filters is float32",
                   msg(mg.conv2d, mg.cast(mg.ones{1, 4, 4, 1}, "bfloat16"), mg.ones{3, 3, 1, 1}))
    assert.matches("max_pool2d_backward: dtypes differ: input is bfloat16, dy is float32",
                   msg(mg.max_pool2d_backward, mg.cast(mg.ones{1, 4, 4, 1}, "bfloat16"), mg.ones{1, 2, 2, 1},
                       {pool_size = {2, 2}}))
    assert.matches("matmul: dtypes differ: bfloat16 @ float32",
                   msg(mg.matmul, mg.cast(mg.ones{2, 2}, "bfloat16"), mg.ones{2, 2}))
    local outer = mg.autocast("bfloat16")
    local inner = mg.autocast(false)
    assert.matches("autocast: regions must close innermost first", msg(outer.close, outer))
    inner:close()
    outer:close()
    outer:close()                                   -- closing twice does nothing
    assert.is_nil(mg.autocast_dtype())
    assert.matches("fit: option 'mixed_precision' must be", msg(function()
      local m = mg.nn.Sequential{mg.nn.Dense(1)}
      m:compile{optimizer = "sgd", loss = "mse"}
      m:fit(mg.ones{4, 2}, mg.ones{4, 1}, {mixed_precision = "half", verbose = 0})
    end))
  end)

  it("says once where the CPU has no bfloat16 instructions, and still computes (AVX-512, AVX2)", function()
    for _, isa in ipairs{"AVX512_CORE", "AVX2"} do    -- AVX2: oneDNN has no bfloat16 kernels at all
      local out, code = h.run("ONEDNN_MAX_CPU_ISA=" .. isa .. " " .. h.bin .. [[ -e '
        local a = mg.ones{4, 4}
        print(mg.autocast_isa())
        for _ = 1, 3 do assert(mg.autocast("bfloat16", mg.matmul, a, mg.transpose(a))[1][1]:item() == 4) end
        local w, k = mg.Variable(mg.ones{4, 3}), mg.Variable(mg.ones{3, 3, 2, 5})
        local t = mg.tape()
        local l = mg.autocast("bfloat16", function()
          return mg.sum(mg.dense(a, w, nil, "relu")) + mg.sum(mg.conv2d(mg.ones{1, 5, 5, 2}, k))
        end)
        local g = t:gradient(l, {w, k})
        assert(g[1].dtype == "float32" and g[1][1][1]:item() == 4 and g[2][2][2][1][1]:item() == 9)
        local y = mg.autocast("bfloat16", mg.dense, a, w, mg.Variable(mg.tensor{-5, 1, 0}), "relu")
        assert(y.dtype == "bfloat16" and y[2][1]:item() == 0 and y[2][2]:item() == 5 and y[2][3]:item() == 4)
        local q = mg.cast(mg.ones{1, 2, 3, 4}, "bfloat16")
        assert(mg.scaled_dot_product_attention(q, q, q).dtype == "float32")   -- widened: no bfloat16 products
        assert(mg.gelu(q).dtype == "float32")']])
      assert.are.equal(0, code, isa .. ": " .. out)
      assert.matches("nil", out)
      local _, warnings = out:gsub("warning: autocast: this CPU has no bfloat16 dot products", "")
      assert.are.equal(1, warnings, out)
    end
  end)

  it("names the ISA bfloat16 products run on, or nil", function()
    local isa = mg.autocast_isa()
    assert.is_true(isa == nil or isa == "avx512_core_bf16" or isa == "avx512_core_amx")
    assert.is_nil(mg.autocast_isa("float16"))
  end)

  describe("gradients against float32 within bfloat16's reach", function()
    -- each product, its gradients under autocast vs float32 (relative norm error)
    local cases = {
      {"matmul 2-D", {{16, 32}, {32, 8}}, function(a, b) return mg.matmul(a, b) end},
      {"matmul batched", {{3, 8, 16}, {3, 16, 4}}, function(a, b) return mg.matmul(a, b) end},
      {"matmul broadcast", {{2, 3, 8, 16}, {16, 5}}, function(a, b) return mg.matmul(a, b) end},
      {"matmul transposed view", {{16, 8}, {4, 16}},
       function(a, b) return mg.matmul(mg.transpose(a), mg.transpose(b)) end},
      {"matmul vectors", {{16}, {16, 6}}, function(a, b) return mg.matmul(a, b) end},
      {"dense relu", {{10, 24}, {24, 12}, {12}}, function(x, w, b) return mg.dense(x, w, b, "relu") end},
      {"dense tanh", {{2, 5, 24}, {24, 12}, {12}}, function(x, w, b) return mg.dense(x, w, b, "tanh") end},
      {"dense sigmoid no bias", {{10, 24}, {24, 12}}, function(x, w) return mg.dense(x, w, nil, "sigmoid") end},
      {"dense linear", {{10, 24}, {24, 12}, {12}}, function(x, w, b) return mg.dense(x, w, b) end},
      {"einsum", {{4, 8, 16}, {16, 6}}, function(a, b) return mg.einsum("bij,jk->bik", a, b) end},
      {"conv2d with bias", {{4, 12, 12, 3}, {3, 3, 3, 8}, {8}}, function(x, w, b) return mg.conv2d(x, w, b) end},
      {"conv2d strided, same", {{2, 9, 9, 4}, {3, 3, 4, 6}},
       function(x, w) return mg.conv2d(x, w, nil, {strides = {2, 2}, padding = "same"}) end},
      {"conv2d dilated, 1x1 after", {{1, 9, 9, 2}, {3, 3, 2, 4}, {1, 1, 4, 5}}, function(x, w, v)
        return mg.conv2d(mg.relu(mg.conv2d(x, w, nil, {dilation_rate = {2, 2}})), v)
      end},
      {"conv2d tanh in one op", {{4, 10, 10, 3}, {3, 3, 3, 6}, {6}},
       function(x, w, b) return mg.conv2d(x, w, b, {strides = 2, activation = "tanh"}) end},
      {"conv2d sigmoid in one op, max pooled", {{4, 10, 10, 3}, {3, 3, 3, 6}, {6}}, function(x, w, b)
        return mg.max_pool2d(mg.conv2d(x, w, b, {padding = "same", activation = "sigmoid"}), {pool_size = 3, strides = 2})
      end},
      {"a small CNN", {{4, 10, 10, 2}, {3, 3, 2, 6}, {6}, {54, 5}}, function(x, w, b, d)
        local h_ = mg.max_pool2d(mg.relu(mg.conv2d(x, w, b, {padding = "same"})), {pool_size = {2, 2}})
        return mg.dense(mg.reshape(mg.avg_pool2d(h_, {pool_size = {2, 2}, padding = "same"}), {4, -1}), d)
      end},
      {"attention projections", {{2, 6, 16}, {16, 16}, {16, 16}, {16, 16}}, function(x, wq, wk, wv)
        return mg.scaled_dot_product_attention(mg.matmul(x, wq), mg.matmul(x, wk), mg.matmul(x, wv), nil,
                                               {causal = true})
      end},
    }
    for _, case in ipairs(cases) do
      local name, shapes, f = case[1], case[2], case[3]
      it(name, function()
        local vars = {}
        for i, s in ipairs(shapes) do vars[i] = mg.Variable(mg.random.normal(s) * 0.5) end
        local target = mg.random.normal(mg.autocast("bfloat16", f, table.unpack(vars)).shape)
        local function loss () return mg.mean((f(table.unpack(vars)) - target) ^ 2) end
        local g32, l32 = grads(loss, vars)
        local g16, l16 = grads(loss, vars, "bfloat16")
        assert.are.equal("float32", l16.dtype)
        assert.is_true(math.abs(l16:item() - l32:item()) <= 2e-2 * math.abs(l32:item()))
        for i = 1, #vars do
          assert.are.equal("float32", g16[i].dtype)        -- master weights' dtype
          local e = rel_err(g16[i], g32[i])
          assert.is_true(e < 3e-2, ("%s: gradient %d is %.4f off"):format(name, i, e))
        end
      end)
    end
  end)

  it("gives conv2d's relu the separate ops' values and gradients, in bfloat16, and max pools bfloat16", function()
    local vars = {mg.Variable(mg.random.normal{4, 9, 9, 3}), mg.Variable(mg.random.normal{3, 3, 3, 5}),
                  mg.Variable(mg.random.normal{5})}
    local seed = mg.random.normal{4, 9, 9, 5}
    local function run (f)
      local t = mg.tape()
      local y = mg.autocast("bfloat16", f, table.unpack(vars))
      local loss = mg.sum(mg.cast(y, "float32") * seed)
      t:stop()
      return y, t:gradient(loss, vars)
    end
    local fused, g1 = run(function(x, w, b) return mg.conv2d(x, w, b, {padding = "same", activation = "relu"}) end)
    local apart, g2 = run(function(x, w, b) return mg.relu(mg.conv2d(x, w, b, {padding = "same"})) end)
    assert.are.equal("bfloat16", fused.dtype)
    assert.are.equal(0, mg.sum(mg.cast(mg.not_equal(mg.cast(fused, "float32"), apart), "int64")):item())
    for i = 1, 3 do assert.are.equal(0, mg.sum(mg.cast(mg.not_equal(g1[i], g2[i]), "int64")):item(), i) end
    assert.are.equal("bfloat16", mg.autocast("bfloat16", mg.max_pool2d, fused).dtype)
  end)

  it("sums bfloat16 into float32 as it is: float32's sums of the widened values, to the bit, any thread count", function()
    -- the bias gradients: columns of 100,000 rows, summed in parallel over column ranges
    local threads = mg.get_num_threads()
    for _, shape in ipairs({{20000, 33}, {4000, 70}, {100, 1}, {5, 7, 64}, {2, 600, 40}, {0, 4}}) do
      local x = mg.cast(mg.random.normal(shape), "bfloat16")
      local x32 = mg.cast(x, "float32")
      for axis = 1, #shape do
        local s = mg.sum(x, axis)
        assert.are.equal("float32", s.dtype)
        same_bits(s, mg.sum(x32, axis))
        mg.set_num_threads(1)
        local one = mg.sum(x, axis)
        local one32 = mg.sum(x32, axis)
        mg.set_num_threads(threads)
        same_bits(one, s)
        same_bits(one32, s)
      end
      same_bits(mg.sum(x), mg.sum(x32))
      local t = mg.tape()
      t:watch(x)
      local y = mg.sum(mg.sum(x, 1) * 3)
      t:stop()
      local g = t:gradient(y, x)
      assert.are.equal("bfloat16", g.dtype)
      same_bits(mg.cast(g, "float32"), mg.full(shape, 3))
    end
  end)

  it("runs attention's core on bfloat16 q, k, v: float32's values and gradients within reach, masks, second order", function()
    local bf = function(t) return mg.cast(t, "bfloat16") end
    local f32 = function(t) return mg.cast(t, "float32") end
    local q, k, v = bf(mg.random.normal{2, 3, 5, 8}), bf(mg.random.normal{2, 3, 7, 8}), bf(mg.random.normal{2, 3, 7, 6})
    local mask = mg.greater(mg.random.normal{2, 1, 5, 7}, -0.3)
    mask = mg.logical_and(mask, mg.reshape(mg.tensor({true, false, true, true, true}), {1, 1, 5, 1}))  -- row 2: nothing
    local seed = mg.random.normal{2, 3, 5, 6}
    for _, opts in ipairs({{mask = mask}, {causal = true}, {}}) do
      local y = mg.scaled_dot_product_attention(q, k, v, opts)
      local y32 = mg.scaled_dot_product_attention(f32(q), f32(k), f32(v), opts)
      -- bfloat16 where the CPU has bfloat16 products; float32 (widened) where it has not
      assert.are.equal(mg.autocast_isa() and "bfloat16" or "float32", y.dtype)
      assert.is_true(rel_err(y, y32) < 2e-2)
      if opts.mask then      -- a row with nothing to attend to is 0, as in float32
        assert.are.equal(0, mg.max(mg.abs(f32(mg.slice(y, {1, 2}, {1, 3}, {2, 2})))):item())
      end
      local function g (a, b, c)
        local t = mg.tape()
        t:watch({a, b, c})
        local l = mg.sum(f32(mg.scaled_dot_product_attention(a, b, c, opts)) * seed)
        t:stop()
        return t:gradient(l, {a, b, c})
      end
      local g16, g32 = g(q, k, v), g(f32(q), f32(k), f32(v))
      for i = 1, 3 do
        assert.are.equal("bfloat16", g16[i].dtype)
        assert.is_true(rel_err(g16[i], g32[i]) < 3e-2, i)
      end
      -- second order: a tape that records the backward (its public ops, in float32)
      local function gg (a)
        local t1 = mg.tape()
        t1:watch(a)
        local t2 = mg.tape()
        t2:watch(a)
        local l = mg.sum(f32(mg.scaled_dot_product_attention(a, k, v, opts)) * seed)
        t2:stop()
        local d = t2:gradient(l, a)
        local s = mg.sum(f32(d) ^ 2)
        t1:stop()
        return t1:gradient(s, a)
      end
      local h16, h32 = gg(q), gg(f32(q))
      assert.is_true(rel_err(h16, h32) < 5e-2)
    end
  end)

  it("gives dense's weight and bias gradients in one call: the product's and the column sums', within one rounding", function()
    -- oneDNN's inner product backward_weights where no tape records the backward; the
    -- transposed matmul and mg.sum otherwise (a recording tape): the same numbers
    for _, dims in ipairs({{64, 32, 48}, {3, 5, 7}, {130, 256, 64}, {2, 1, 1}}) do
      local rows, K, N = table.unpack(dims)
      local x = mg.random.normal{rows, K}
      local w, b = mg.Variable(mg.random.normal{K, N}), mg.Variable(mg.random.normal{N})
      local seed = mg.random.normal{rows, N}
      for _, act in ipairs({"linear", "relu"}) do
        local function run (outer)
          local t0 = outer and mg.tape() or nil
          local t = mg.tape()
          local l = mg.autocast("bfloat16", function() return mg.sum(mg.cast(mg.dense(x, w, b, act), "float32") * seed) end)
          t:stop()
          local g = t:gradient(l, {w, b})
          if t0 then t0:stop() end
          return g
        end
        local fused, ops = run(false), run(true)
        assert.are.equal("float32", fused[1].dtype)
        assert.are.equal("float32", fused[2].dtype)
        -- by hand: the bfloat16 gradient of the output, its product with x and its sums
        local xb = mg.cast(x, "bfloat16")
        local y = mg.dense(xb, mg.cast(w:value(), "bfloat16"), b:value(), act)
        local gy = mg.cast(seed, "bfloat16")
        if act == "relu" then gy = mg.cast(mg.where(mg.greater(mg.cast(y, "float32"), 0), mg.cast(gy, "float32"), 0), "bfloat16") end
        local dw = mg.cast(mg.matmul(mg.transpose(xb), gy), "float32")
        local db = mg.sum(gy, 1)
        for _, g in ipairs({fused, ops}) do
          local err = mg.max(mg.abs(g[1] - dw) / (mg.abs(dw) + 1e-3)):item()
          assert.is_true(err <= 2 ^ -7, ("%s %s: %g"):format(act, table.concat(dims, "x"), err))
          h.assert_close(g[2], db, 1e-5)
        end
      end
    end
  end)

  it("adds dense's bias and relu inside the bfloat16 product, rounded once (the float32 sums', rounded)", function()
    -- small integers: every sum is exact in float32 whatever the order, so the
    -- one rounding to bfloat16 (sums past 256 round) is all that can differ
    local x = mg.floor(mg.random.uniform({37, 50}, -6, 6))
    local w = mg.Variable(mg.floor(mg.random.uniform({50, 21}, -6, 6)))
    local b = mg.Variable(mg.floor(mg.random.uniform({21}, -300, 300)))
    for _, act in ipairs({"linear", "relu"}) do
      for _, bias in ipairs({b, false}) do
        local want = mg.matmul(x, w:value()) + (bias and b:value() or 0)
        if act == "relu" then want = mg.relu(want) end
        local y = mg.autocast("bfloat16", mg.dense, x, w, bias or nil, act)
        local yt = mg.autocast("bfloat16", mg.dense, mg.transpose(mg.transpose(x) + 0), w, bias or nil, act)
        assert.are.equal("bfloat16", y.dtype)
        same_bits(y, mg.cast(want, "bfloat16"))
        same_bits(yt, y)
      end
    end
  end)

  it("attention's bfloat16 products over whole chunks of the batch agree with the entry-by-entry loop", function()
    -- 4-D q, k, v take one oneDNN matmul per product and chunk (several chunks
    -- here: 20 x 8 entries of 128 x 128 scores); 5-D ones (and broadcast
    -- batches) the per-entry loop: the same products, within bfloat16's rounding
    local bf = function(t) return mg.cast(t, "bfloat16") end
    local q, k, v = bf(mg.random.normal{20, 8, 128, 8}), bf(mg.random.normal{20, 8, 96, 8}), bf(mg.random.normal{20, 8, 96, 4})
    local mask = mg.greater(mg.random.normal{20, 1, 128, 96}, -1)
    local seed = mg.random.normal{20, 8, 128, 4}
    local function run (a, b, c, m, opts, s)
      local t = mg.tape()
      t:watch({a, b, c})
      opts.mask = m
      local y = mg.scaled_dot_product_attention(a, b, c, opts)
      local l = mg.sum(mg.cast(y, "float32") * s)
      t:stop()
      return y, t:gradient(l, {a, b, c})
    end
    local r5 = function(t) return mg.reshape(t, {1, table.unpack(t.shape)}) end
    for _, opts in ipairs({{}, {causal = true}, {masked = true}}) do
      local m = opts.masked and mask or nil
      local y4, g4 = run(q, k, v, m, {causal = opts.causal}, seed)
      local y5, g5 = run(r5(q), r5(k), r5(v), m and r5(m), {causal = opts.causal}, r5(seed))
      assert.is_true(rel_err(y4, mg.reshape(y5, y4.shape)) < 1e-2)
      for i = 1, 3 do assert.is_true(rel_err(g4[i], mg.reshape(g5[i], g4[i].shape)) < 2e-2, i) end
    end
    -- the output and the gradients are laid out (batch, time, heads, features): swapping
    -- heads and time back, then joining the heads, copies nothing (as PyTorch's fused attention)
    local y = mg.scaled_dot_product_attention(q, k, v)
    collectgarbage()
    local before = mg.memory.stats().current_bytes
    local joined = mg.reshape(mg.swapaxes(y, 2, 3), {20, 128, 32})
    if mg.autocast_isa() then assert.are.equal(before, mg.memory.stats().current_bytes) end
    same_bits(mg.reshape(joined, {20, 128, 8, 4}), mg.swapaxes(y, 2, 3))
    -- a batch broadcast along heads (stride 0): the loop, same numbers as the copy
    local kb = mg.broadcast_to(mg.slice(k, {1, 20}, {1, 1}), k.shape)
    local yb = mg.scaled_dot_product_attention(q, kb, v)
    assert.is_true(rel_err(yb, mg.scaled_dot_product_attention(q, kb + mg.cast(mg.zeros(k.shape), "bfloat16"), v)) < 1e-2)
  end)

  it("keeps attention's bfloat16 weights for the backward when no larger than q: the same gradients, the bytes counted, dry runs too", function()
    local bf = function(t) return mg.cast(t, "bfloat16") end
    local r5 = function(t) return mg.reshape(t, {1, table.unpack(t.shape)}) end
    local mask = mg.greater(mg.random.normal{4, 1, 16, 12}, -0.5)
    -- 12 keys of 16 features: the weights (12 a query) are kept; the 5-D call takes the
    -- per-entry loop, which computes them again in the backward
    local q, k, v = bf(mg.random.normal{4, 4, 16, 16}), bf(mg.random.normal{4, 4, 12, 16}), bf(mg.random.normal{4, 4, 12, 8})
    local seed = mg.random.normal{4, 4, 16, 8}
    local function run (a, b, c, m, opts, s)
      local t = mg.tape()
      t:watch({a, b, c})
      opts.mask = m
      local l = mg.sum(mg.cast(mg.scaled_dot_product_attention(a, b, c, opts), "float32") * s)
      t:stop()
      local saved = t:saved_bytes()
      return saved, t:gradient(l, {a, b, c})
    end
    local weights = mg.autocast_isa() and 4 * 4 * 16 * 12 * 2 or 0     -- float32 attention keeps none
    for _, opts in ipairs({{}, {causal = true}, {masked = true}}) do
      local m = opts.masked and mask or nil
      local s4, g4 = run(q, k, v, m, {causal = opts.causal}, seed)
      local s5, g5 = run(r5(q), r5(k), r5(v), m and r5(m), {causal = opts.causal}, r5(seed))
      assert.are.equal(s5 + weights, s4)
      for i = 1, 3 do assert.is_true(rel_err(g4[i], mg.reshape(g5[i], g4[i].shape)) < 2e-2, i) end
      -- a tape recording the backward (second order) takes the public ops: the same gradients
      local t1 = mg.tape()
      t1:watch(q)
      local _, g2 = run(q, k, v, m, {causal = opts.causal}, seed)
      t1:stop()
      for i = 1, 3 do assert.is_true(rel_err(g2[i], g4[i]) < 2e-2, i) end
    end
    -- more keys than features: computed again, nothing kept
    local kl, vl = bf(mg.random.normal{4, 4, 20, 16}), bf(mg.random.normal{4, 4, 20, 8})
    local sl = run(q, kl, vl, nil, {}, seed)
    local sl5 = run(r5(q), r5(kl), r5(vl), nil, {}, r5(seed))
    assert.are.equal(sl5, sl)
    -- kept or computed again, the same bits: recompute_grad's policies (one keeps the output
    -- and skips the forward in its re-run, so nothing is kept), and a saved-tensor hook that
    -- gives the weights back in other strides (found by review: read as laid out before)
    local function grads (policy)
      local f = mg.recompute_grad(function(a, b, c) return mg.scaled_dot_product_attention(a, b, c, {causal = true}) end,
                                  {policy = policy})
      local t = mg.tape()
      t:watch({q, k, v})
      local l = mg.sum(mg.cast(f(q, k, v), "float32") * seed)
      t:stop()
      return t:gradient(l, {q, k, v})
    end
    local ref = grads("nothing")
    for _, policy in ipairs({"dots", "everything", "output"}) do
      local g = grads(policy)
      for i = 1, 3 do same_bits(ref[i], g[i]) end
    end
    local function pack (t)           -- the same values, stored with the last two axes swapped
      if t.ndim ~= 4 then return t end
      return mg.transpose(mg.cast(mg.cast(mg.transpose(t, {1, 2, 4, 3}), "float32"), t.dtype), {1, 2, 4, 3})
    end
    local function hooked (hook)
      local t = mg.tape()
      t:watch({q, k, v})
      local f = function() return mg.sum(mg.cast(mg.scaled_dot_product_attention(q, k, v), "float32") * seed) end
      local l = hook and mg.saved_tensors_hooks(pack, function(p) return p end, f) or f()
      t:stop()
      return t:gradient(l, {q, k, v})
    end
    local plain, strided = hooked(false), hooked(true)
    for i = 1, 3 do same_bits(plain[i], strided[i]) end
    -- a dry run (mg.memory.estimate) counts the kept weights as the real step does
    local function step ()
      local t = mg.tape()
      t:watch({q, k, v})
      local l = mg.sum(mg.cast(mg.scaled_dot_product_attention(q, k, v, {causal = true}), "float32") * seed)
      t:stop()
      local saved = t:saved_bytes()
      return t:gradient(l, {q, k, v}), saved
    end
    local est = mg.memory.estimate(step)
    local _, saved = step()
    assert.are.equal(saved, est.peak_saved_bytes)
    assert.are.equal(run(r5(q), r5(k), r5(v), nil, {causal = true}, r5(seed)) + weights, saved)
  end)

  it("runs gelu on bfloat16 as it is (float32 inside): float32's values and gradients, rounded; keeps gelu'(x) for the backward", function()
    local x = mg.cast(mg.random.normal{64, 33} * 3, "bfloat16")
    local seed = mg.random.normal{64, 33}
    local x32 = mg.cast(x, "float32")
    for _, approx in ipairs({false, true}) do
      local y, y32 = mg.gelu(x, approx), mg.gelu(x32, approx)
      assert.are.equal(mg.autocast_isa() and "bfloat16" or "float32", y.dtype)
      -- one rounding to bfloat16: within 2^-8 of float32's, relative (absolute near 0)
      local err = mg.abs(mg.cast(y, "float32") - y32) / (mg.abs(y32) + 1e-2)
      assert.is_true(mg.max(err):item() < 2 ^ -8, approx)
      local function g (a)
        local t = mg.tape()
        t:watch(a)
        local l = mg.sum(mg.cast(mg.gelu(a, approx), "float32") * seed)
        t:stop()
        return t:gradient(l, a)
      end
      local g16, g32 = g(x), g(x32)
      assert.are.equal("bfloat16", g16.dtype)
      assert.is_true(rel_err(g16, g32) < 1e-2, approx)
      local function gg (a)        -- second order: public ops in float32
        local t1 = mg.tape()
        t1:watch(a)
        local t2 = mg.tape()
        t2:watch(a)
        local l = mg.sum(mg.cast(mg.gelu(a, approx), "float32") * seed)
        t2:stop()
        local s = mg.sum(mg.cast(t2:gradient(l, a), "float32") ^ 2)
        t1:stop()
        return t1:gradient(s, a)
      end
      assert.is_true(rel_err(gg(x), gg(x32)) < 2e-2, approx)
    end
    -- while one tape records (and cannot record the backward), gelu'(x) is kept in place
    -- of x, the same bytes, and the backward is a product: the same bits as computing it
    -- from x (a persistent tape keeps x), the same under recompute_grad; odd lengths too
    for _, n in ipairs({33, 1000, 70001}) do
      local xs, sd = mg.cast(mg.random.normal{n} * 3, "bfloat16"), mg.random.normal{n}
      local function run (persistent, approx)
        local t = mg.tape{persistent = persistent}
        t:watch(xs)
        local y = mg.gelu(xs, approx)
        local l = mg.sum(mg.cast(y, "float32") * sd)
        t:stop()
        local saved = t:saved_bytes()
        return y, t:gradient(l, xs), saved
      end
      for _, approx in ipairs({false, true}) do
        local y1, g1, s1 = run(false, approx)
        local y2, g2, s2 = run(true, approx)
        same_bits(y1, y2)
        same_bits(g1, g2)
        assert.are.equal(s2, s1)
        same_bits(y1, mg.gelu(xs, approx))                  -- no tape: the same values
        local t = mg.tape()
        t:watch(xs)
        local f = mg.recompute_grad(function(a) return mg.gelu(mg.gelu(a, approx), approx) end)
        local l = mg.sum(mg.cast(f(xs), "float32") * sd)
        t:stop()
        local t2 = mg.tape()
        t2:watch(xs)
        local l2 = mg.sum(mg.cast(mg.gelu(mg.gelu(xs, approx), approx), "float32") * sd)
        t2:stop()
        same_bits(t:gradient(l, xs), t2:gradient(l2, xs))
      end
    end
    -- in a transformer block under autocast: the MLP's hidden activations stay bfloat16
    local block = mg.nn.TransformerBlock(2, 16, {causal = true})
    local xs = mg.random.normal{2, 5, 16}
    block(xs)
    local t = mg.tape()
    local l = mg.autocast("bfloat16", function() return mg.mean(block(xs) ^ 2) end)
    t:stop()
    local g16 = t:gradient(l, block.trainable_variables)
    local g32 = grads(function() return mg.mean(block(xs) ^ 2) end, block.trainable_variables)
    for i = 1, #g16 do        -- the key bias' gradient is 0 (softmax ignores a shift): rounding on both sides
      assert.are.equal("float32", g16[i].dtype)
      local n32 = mg.sqrt(mg.sum(g32[i] ^ 2)):item()
      local d = mg.sqrt(mg.sum((g16[i] - g32[i]) ^ 2)):item()
      assert.is_true(d < 5e-2 * math.max(n32, 1e-2), i)
    end
  end)

  -- the walk writes a bfloat16 gradient over itself where nothing else sees it
  -- (a relu's mask, gelu's product): as float32's do, so no fresh buffer per op
  it("masks relu's bfloat16 gradients in place where the walk may, the same bits as not; second order through relu kept", function()
    local x = mg.random.normal{4, 8, 8, 3}
    local w = mg.Variable(mg.random.normal{3, 3, 3, 6} * 0.4)
    local b = mg.Variable(mg.random.normal{6} * 0.1)
    local w2 = mg.Variable(mg.random.normal{4 * 4 * 6, 5} * 0.2)
    local b2 = mg.Variable(mg.random.normal{5} * 0.1)
    local vars = {w, b, w2, b2}
    local seen = {}
    local function forward ()
      local y = mg.conv2d(x, w, b, {padding = "same", activation = "relu"})
      local p = mg.max_pool2d(y)
      seen.y, seen.p = y, p
      local z = mg.dense(mg.reshape(p, {4, 96}), w2, b2, "relu")
      return mg.sum(mg.cast(z, "float32") ^ 2)
    end
    local function run (extra, outer)
      local o = outer and mg.tape() or nil
      local t = mg.tape()
      local l = mg.autocast("bfloat16", forward)
      t:stop()
      local targets = {table.unpack(vars)}
      for _, e in ipairs(extra or {}) do targets[#targets + 1] = seen[e] end
      local g = t:gradient(l, targets)
      if o then o:stop() end
      return g
    end
    local plain = run()
    -- asking for the pooled image's and the conv's gradient too: the walk may not write
    -- over them, and the variables' gradients are the same bits
    local asked = run({"y", "p"})
    for i = 1, 4 do same_bits(plain[i], asked[i]) end
    assert.are.equal("bfloat16", asked[5].dtype)
    same_bits(asked[5], mg.max_pool2d_backward(seen.y, asked[6]))    -- relu's mask not applied to it
    local zeros_masked = mg.sum(mg.cast(mg.logical_and(mg.equal(seen.y, 0), mg.not_equal(asked[5], 0)), "int64")):item()
    assert.is_true(zeros_masked > 0)                 -- (windows of zeros send their gradient to a zero)
    -- a tape recording the backward: relu's gradient as a public op, the same bits at the convolution
    local recorded = run(nil, true)
    same_bits(plain[1], recorded[1])
    same_bits(plain[2], recorded[2])
    for i = 3, 4 do assert.is_true(rel_err(recorded[i], plain[i]) < 1e-2, i) end
    -- second order through conv2d's and dense's relu under autocast: float32's, within reach
    -- (the mask on the bits is no op a tape records: an outer tape saw no path from the seed)
    local function penalty (ac)
      local t1 = mg.tape()
      t1:watch(x)
      local t2 = mg.tape()
      t2:watch(x)
      local l = ac and mg.autocast("bfloat16", forward) or forward()
      t2:stop()
      local s = mg.sum(mg.cast(t2:gradient(l, x), "float32") ^ 2)
      t1:stop()
      return t1:gradient(s, vars)
    end
    local g16, g32 = penalty(true), penalty(false)
    for i = 1, 4 do
      assert.is_not_nil(g16[i], i)
      assert.is_true(rel_err(g16[i], g32[i]) < 0.1, i)
    end
    -- gelu's bfloat16 gradient goes over its output's too, unless that one was asked for
    local xs, sd = mg.cast(mg.random.normal{1000} * 3, "bfloat16"), mg.random.normal{1000}
    local function gelu_grads (ask_y)
      local t = mg.tape()
      t:watch(xs)
      local y = mg.gelu(xs)
      local l = mg.sum(mg.cast(y, "float32") * sd)
      t:stop()
      return t:gradient(l, ask_y and {xs, y} or {xs})
    end
    local g1, g2 = gelu_grads(false), gelu_grads(true)
    same_bits(g1[1], g2[1])
    same_bits(g2[2], mg.cast(sd, "bfloat16"))
  end)

  it("takes products' bfloat16 results everywhere float32 goes: gather's gradient, sort, topk, dropout, attention's plain path", function()
    local x = mg.cast(mg.random.normal{4, 6}, "bfloat16")
    local x32 = mg.cast(x, "float32")
    local function grad (f, a)
      local t = mg.tape()
      t:watch(a)
      local l = mg.sum(mg.cast(f(a), "float32") * mg.cast(mg.arange(1, 1 + f(a):numel()), "float32"):reshape(f(a).shape))
      t:stop()
      return t:gradient(l, a)
    end
    for _, f in ipairs({function(a) return mg.gather(a, {1, 3, 3}, 1) end, function(a) return (mg.sort(a, 2)) end,
                        function(a) return (mg.topk(a, 2, 2)) end, function(a) return mg.take_along_axis(a, mg.argsort(a, 2), 2) end}) do
      same_bits(mg.cast(f(x), "float32"), f(x32))
      local g, g32 = grad(f, x), grad(f, x32)
      assert.are.equal("bfloat16", g.dtype)
      same_bits(mg.cast(g, "float32"), g32)                     -- exact: the gradient moves values
    end
    mg.random.seed(5)
    local d = mg.nn.dropout(x, 0.5)
    mg.random.seed(5)
    same_bits(d, mg.nn.dropout(x32, 0.5))                         -- the same mask, in float32
    -- a transformer block with dropout runs attention's plain ops (masked softmax) under autocast
    local block = mg.nn.TransformerBlock(2, 16, {causal = true, dropout = 0.2})
    local xs = mg.random.normal{2, 5, 16}
    block(xs)
    local t = mg.tape()
    local l = mg.autocast("bfloat16", function() return mg.mean(block(xs) ^ 2) end)
    t:stop()
    for _, g in ipairs(t:gradient(l, block.trainable_variables)) do assert.are.equal("float32", g.dtype) end
    local m = mg.nn.Sequential{mg.nn.Dense(16, "relu"), mg.nn.Dropout(0.3), mg.nn.Dense(3)}
    m:compile{optimizer = "adam", loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}}
    local h_ = m:fit(mg.random.normal{32, 8}, mg.cast(mg.random.uniform({32}, 1, 4) // 1, "int64"),
                     {epochs = 2, verbose = 0, mixed_precision = "bfloat16"})
    assert.is_true(h_.history.loss[2] == h_.history.loss[2])
  end)

  it("gives gradients to float32 tensors a tape watches, in float32", function()
    local x = mg.random.normal{4, 8}
    local w = mg.random.normal{8, 3}
    local t = mg.tape()
    t:watch(x)
    local y = mg.autocast("bfloat16", function() return mg.sum(mg.matmul(x, w)) end)
    local g = t:gradient(y, x)
    assert.are.equal("float32", g.dtype)
    h.assert_close(g, mg.broadcast_to(mg.sum(w, 2), {8}):reshape{1, 8} * mg.ones{4, 1}, 3e-2)
  end)

  it("casts a variable once per region, however often it is read", function()
    local x = mg.Variable(mg.random.normal{64, 64})
    local w = mg.Variable(mg.random.normal{64, 64})
    mg.autocast("bfloat16", function()
      local a = mg.matmul(x, w)
      collectgarbage()                              -- earlier tests' garbage goes now, not during the count
      collectgarbage()
      local before = mg.memory.stats().current_bytes
      local b = mg.matmul(x, w)                     -- no new casts: only the output
      assert.are.equal(64 * 64 * 2, mg.memory.stats().current_bytes - before)
      same_bits(a, b)
    end)
  end)

  it("sees a variable's new value after an assign inside the region", function()
    local w = mg.Variable(mg.ones{4, 4})
    local x = mg.ones{1, 4}
    mg.autocast("bfloat16", function()
      assert.are.equal(4, mg.matmul(x, w)[1][1]:item())
      w:assign(mg.full({4, 4}, 2))
      assert.are.equal(8, mg.matmul(x, w)[1][1]:item())
    end)
  end)

  it("connects a cached cast to a tape that starts inside the region", function()
    local w = mg.Variable(mg.random.normal{8, 8})
    local x = mg.random.normal{2, 8}
    mg.autocast("bfloat16", function()
      mg.matmul(x, w)                               -- cast with no tape recording
      local t = mg.tape()
      local y = mg.sum(mg.matmul(x, w))
      local g = t:gradient(y, w)
      assert.is_not_nil(g)
      assert.are.equal("float32", g.dtype)
    end)
  end)

  it("casts an activation once for the products that read it in a row: one saved copy, the same gradients", function()
    local x0 = mg.random.normal{64, 32}
    local ws = {mg.Variable(mg.random.normal{32, 16}), mg.Variable(mg.random.normal{32, 16}),
                mg.Variable(mg.random.normal{32, 16})}
    -- q, k, v of one float32 activation (a layer norm's output), and its cast made by hand for each
    local function run (by_hand)
      local t = mg.tape()
      t:watch(x0)
      local loss = mg.autocast("bfloat16", function()
        local x = mg.tanh(x0)
        local y = 0
        for i = 1, 3 do
          local xi = by_hand and mg.cast(x, "bfloat16") or x
          y = y + mg.sum(mg.cast(mg.matmul(xi, ws[i]), "float32") ^ 2) * i
        end
        return y
      end)
      t:stop()
      local saved = t:saved_bytes()
      local g = t:gradient(loss, {x0, ws[1], ws[2], ws[3]})
      return saved, g
    end
    local s_auto, g_auto = run(false)
    local s_hand, g_hand = run(true)
    assert.are.equal(2 * 64 * 32 * 2, s_hand - s_auto)          -- two bfloat16 copies of x fewer
    for i = 1, 4 do
      assert.are.equal(g_hand[i].dtype, g_auto[i].dtype)
      h.assert_close(g_auto[i], g_hand[i], 1e-6)               -- the same three gradients, summed
    end
    -- an activation read again after another one was cast: cast again, still right
    mg.autocast("bfloat16", function()
      local a, b = mg.random.normal{4, 8}, mg.random.normal{4, 8}
      local w = mg.random.normal{8, 8}
      local r1, r2, r3 = mg.matmul(a, w), mg.matmul(b, w), mg.matmul(a, w)
      same_bits(r1, r3)
      same_bits(r2, mg.matmul(mg.cast(b, "bfloat16"), mg.cast(w, "bfloat16")))
    end)
  end)

  it("connects a tensor or variable a tape begins to watch after its cast in the region", function()
    local v = mg.Variable(mg.random.normal{4, 4}, {trainable = false})
    local x = mg.random.normal{3, 4}
    local function late (watched)
      return mg.autocast("bfloat16", function()
        local t = mg.tape()
        mg.matmul(x, v)                             -- cast while the tape follows neither
        t:watch(watched)
        local loss = mg.sum(mg.cast(mg.matmul(x, v), "float32"))
        t:stop()
        return t:gradient(loss, watched)
      end)
    end
    local gv, gx = late(v), late(x)
    assert.is_not_nil(gv)
    assert.is_not_nil(gx)
    local xb, vb = mg.cast(mg.cast(x, "bfloat16"), "float32"), mg.cast(mg.cast(v:value(), "bfloat16"), "float32")
    h.assert_close(gv, mg.matmul(mg.transpose(xb), mg.ones{3, 4}), 1e-2)
    h.assert_close(gx, mg.matmul(mg.ones{3, 4}, mg.transpose(vb)), 1e-2)
  end)

  it("is deterministic: the same program gives the same bits", function()
    local w = mg.Variable(mg.random.normal{48, 48})
    local x = mg.random.normal{32, 48}
    local function loss () return mg.mean(mg.dense(mg.dense(x, w, nil, "relu"), w) ^ 2) end
    local g1 = grads(loss, {w}, "bfloat16")
    local g2 = grads(loss, {w}, "bfloat16")
    same_bits(g1[1], g2[1])
  end)

  describe("memory-saving paths under autocast give autocast's plain gradients", function()
    local function mlp ()
      mg.random.seed(7)
      local ws = {}
      for i = 1, 4 do ws[i] = mg.Variable(mg.random.normal{32, 32} * 0.2) end
      local x = mg.random.normal{16, 32}
      local block = function(h_, w) return mg.dense(h_, w, nil, "tanh") end
      return ws, x, block
    end

    it("recompute_grad re-runs under the autocast of its call (bit for bit)", function()
      local ws, x, block = mlp()
      local rblock = mg.recompute_grad(block)
      local function plain () local y = x; for i = 1, 4 do y = block(y, ws[i]) end return mg.sum(y) end
      local function rec () local y = x; for i = 1, 4 do y = rblock(y, ws[i]) end return mg.sum(y) end
      local gp = grads(plain, ws, "bfloat16")
      local gr = grads(rec, ws, "bfloat16")
      for i = 1, 4 do same_bits(gr[i], gp[i]) end
      -- a bfloat16 output read outside the block and inside it again: the gradients from
      -- outside reach the re-run as their float32 sum, rounded once with the inside's (found
      -- by review: rounded twice, one bfloat16 ulp off)
      local F = function(t) return mg.cast(t, "float32") end
      local xs, w = mg.random.normal{6, 16}, mg.Variable(mg.random.normal{16, 16} * 0.3)
      local function f (a) local h = mg.dense(a, w, nil, "relu"); return h, mg.gelu(h) end
      local function run (wrap)
        return grads(function()
          local h, g = wrap(f)(xs)
          return mg.sum(F(h) ^ 2) + mg.sum(F(h) * 3) + mg.sum(F(g))
        end, {w}, "bfloat16")
      end
      same_bits(run(mg.recompute_grad)[1], run(function(g) return g end)[1])
      -- the mirror case: a bfloat16 input read twice inside the block and once outside;
      -- the re-run's float32 sum goes back to the outer walk unrounded
      local function g2 (a) return mg.dense(a, w, nil, "relu") + mg.dense(a, w) end
      local function run2 (wrap)
        return grads(function()
          local a = mg.dense(xs, w, nil, "relu")
          return mg.sum(F(wrap(g2)(a))) + mg.sum(F(mg.dense(a, w)) ^ 2)
        end, {w}, "bfloat16")
      end
      same_bits(run2(mg.recompute_grad)[1], run2(function(g) return g end)[1])
    end)

    it("a checkpointed loop re-runs its steps under the call's autocast", function()
      local ws, x, block = mlp()
      local function plain ()
        local y = x
        for _ = 1, 6 do y = mg.cast(block(y, ws[1]), "float32") end
        return mg.sum(y)
      end
      local function looped ()
        -- a loop keeps its state's dtype: the step gives float32 back
        local y = mg.checkpoint_loop(function(s) return mg.cast(block(s, ws[1]), "float32") end, x, 6,
                                     {snapshots = 2})
        return mg.sum(y)
      end
      local gp = grads(plain, {ws[1]}, "bfloat16")
      local gl = grads(looped, {ws[1]}, "bfloat16")
      same_bits(gl[1], gp[1])
    end)

    it("saved_tensors_hooks('bfloat16') and a memory budget give the same gradients", function()
      local ws, x, block = mlp()
      local function plain () local y = x; for i = 1, 4 do y = block(y, ws[i]) end return mg.sum(y) end
      local gp = grads(plain, ws, "bfloat16")
      local gh = grads(function() return mg.saved_tensors_hooks("bfloat16", plain) end, ws, "bfloat16")
      for i = 1, 4 do same_bits(gh[i], gp[i]) end
      -- a budget over a wider chain, whose activations outweigh its weights
      local wide, xw = {}, mg.random.normal{512, 64}
      for i = 1, 12 do wide[i] = mg.Variable(mg.random.normal{64, 64} * 0.15) end
      local function chain () local y = xw; for i = 1, 12 do y = block(y, wide[i]) end return mg.sum(y) end
      collectgarbage()
      mg.memory.reset_peak()
      local base = mg.memory.stats().current_bytes
      local gw = grads(chain, wide, "bfloat16")
      local peak = mg.memory.stats().peak_bytes
      collectgarbage()
      local was = mg.memory.budget(math.floor(base + 0.8 * (peak - base)))   -- below the plain step's peak
      local evicted = mg.memory.stats().evictions
      local ok, gb = pcall(grads, chain, wide, "bfloat16")
      evicted = mg.memory.stats().evictions - evicted
      mg.memory.budget(was)
      assert.is_true(ok, tostring(gb))
      assert.is_true(evicted > 0, "the budget evicted nothing")
      for i = 1, 12 do same_bits(gb[i], gw[i]) end
    end)

    it("a reversible block rebuilds its inputs under the call's autocast", function()
      mg.random.seed(4)
      local blk = mg.nn.RevBlock(mg.nn.Dense(8, "tanh"), mg.nn.Dense(8, "tanh"))
      local x = mg.random.normal{16, 16}
      blk(x)
      local vars = blk.trainable_variables
      local function run (plain)
        local t = mg.tape()
        t:watch(x)
        local loss = mg.autocast("bfloat16", function()
          return mg.sum(mg.tanh(plain and blk:forward(x) or blk(x)))
        end)
        t:stop()
        return t:gradient(loss, {x, vars})
      end
      local gp, gr = run(true), run(false)
      assert.is_true(rel_err(gr[1], gp[1]) < 1e-5)
      for i = 1, #vars do assert.is_true(rel_err(gr[2][i], gp[2][i]) < 1e-5, i) end
    end)

    it("saves bfloat16 copies: the tape holds about half the bytes", function()
      local ws = mlp()
      local x = mg.random.normal{512, 32}
      local function step (dtype)
        mg.memory.reset_peak()
        local t = mg.tape()
        local y = mg.autocast(dtype or false, function()
          local a = x
          for i = 1, 4 do a = mg.dense(a, ws[i], nil, "relu") end
          return mg.sum(a)
        end)
        local saved = t:saved_bytes()
        t:gradient(y, ws)
        return saved
      end
      local s32, s16 = step(), step("bfloat16")
      assert.is_true(s16 < 0.6 * s32, ("saved %d bytes under autocast, %d in float32"):format(s16, s32))
    end)
  end)

  describe("fit{mixed_precision} and policies", function()
    local function data ()
      mg.random.seed(3)
      local x = mg.random.normal{256, 12}
      local y = mg.argmax(mg.matmul(x, mg.random.normal{12, 3}), 2)
      return x, y
    end
    local function model ()
      mg.random.seed(5)
      local m = mg.nn.Sequential{mg.nn.Dense(32, "relu"), mg.nn.Dense(3)}
      m:compile{optimizer = "adam", loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true},
                metrics = {"accuracy"}}
      return m
    end

    it("trains as float32 does, within bfloat16's reach, with float32 weights", function()
      local x, y = data()
      local m32, m16 = model(), model()
      local h32 = m32:fit(x, y, {epochs = 4, verbose = 0, shuffle = false})
      local h16 = m16:fit(x, y, {epochs = 4, verbose = 0, shuffle = false, mixed_precision = "bfloat16"})
      local l32, l16 = h32.history.loss[4], h16.history.loss[4]
      assert.is_true(math.abs(l16 - l32) < 0.02 * l32, ("%g vs %g"):format(l16, l32))
      for _, v in ipairs(m16.trainable_variables) do assert.are.equal("float32", v.dtype) end
      assert.are.equal("float32", m16:predict(x).dtype)
    end)

    it("follows the model's dtype_policy and the global policy", function()
      local x, y = data()
      local m = model()
      m:fit(x, y, {epochs = 1, verbose = 0})
      local l32 = m:evaluate(x, y, {verbose = 0}).loss
      m.dtype_policy = "mixed_bfloat16"
      local l16 = m:evaluate(x, y, {verbose = 0}).loss
      assert.are_not.equal(l32, l16)                  -- products ran in bfloat16
      assert.is_true(math.abs(l16 - l32) < 0.02 * l32)
      m.dtype_policy = nil
      local was = mg.mixed_precision.set_global_policy("mixed_bfloat16")
      assert.are.equal("float32", was)
      assert.are.equal("mixed_bfloat16", mg.mixed_precision.global_policy())
      local lg = m:evaluate(x, y, {verbose = 0}).loss
      mg.mixed_precision.set_global_policy("float32")
      assert.are.equal(l16, lg)
      assert.has_error(function() mg.mixed_precision.set_global_policy("fast") end,
                       "set_global_policy: unknown policy 'fast' (mixed_bfloat16, mixed_float16 or float32)")
    end)

    it("builds layers first called under autocast with float32 weights", function()
      local layers = {mg.nn.Dense(4), mg.transformer.LayerNorm(), mg.transformer.MultiHeadAttention(2, 4)}
      local x = mg.random.normal{2, 3, 8}
      mg.autocast("bfloat16", function()
        layers[1](x)
        layers[2](mg.matmul(x, mg.ones{8, 8}))
        layers[3](x)
      end)
      for _, l in ipairs(layers) do
        for _, v in ipairs(l.variables) do assert.are.equal("float32", v.dtype) end
      end
    end)
  end)

  describe("float16: emulated products and loss scaling", function()
    -- does this CPU have AVX512-FP16 (where float16 autocast needs no opt-in)?
    local function cpu_fp16 ()
      local f = io.open("/proc/cpuinfo")
      local text = f and f:read("a") or ""
      if f then f:close() end
      return text:find("avx512_fp16", 1, true) ~= nil
    end
    local was
    before_each(function() was = mg.mixed_precision.emulate_float16(true) end)
    after_each(function() mg.mixed_precision.emulate_float16(was) end)

    it("is refused without AVX512-FP16 unless emulation is asked for, saying why", function()
      mg.mixed_precision.emulate_float16(false)
      if cpu_fp16() then
        assert.are.equal("float16", mg.autocast("float16", mg.autocast_dtype))
      else
        local ok, err = pcall(mg.autocast, "float16", function() end)
        assert.is_false(ok)
        assert.truthy(err:find("autocast: float16 needs a CPU with AVX512-FP16, and this one has none", 1, true), err)
        assert.truthy(err:find("mixed_precision.emulate_float16(true)", 1, true), err)
        assert.has_error(function() mg.mixed_precision.set_global_policy("mixed_float16") end)
        assert.are.equal("float32", mg.mixed_precision.global_policy())
      end
      assert.is_false(mg.mixed_precision.emulate_float16(true))
      assert.are.equal("float16", mg.autocast("float16", mg.autocast_dtype))
      assert.has_error(function() mg.mixed_precision.emulate_float16("yes") end,
                       "emulate_float16: on must be true or false, got 'yes'")
    end)

    it("gives each product what casting by hand gives, to the bit, and float32 gradients", function()
      local function f16 (t) return mg.cast(mg.cast(t, "float16"), "float32") end
      local x, w, b = mg.random.normal{6, 5}, mg.Variable(mg.random.normal{5, 4}), mg.random.normal{4}
      local img, flt = mg.random.normal{2, 5, 5, 3}, mg.Variable(mg.random.normal{3, 3, 3, 4})
      local q, k, v = mg.random.normal{2, 3, 4}, mg.random.normal{2, 5, 4}, mg.random.normal{2, 5, 4}
      local cases = {   -- name, the product of p under autocast, p, the same by hand (casts recorded)
        {"matmul", function(p) return mg.matmul(x, p) end, w, function(p) return mg.matmul(f16(x), f16(p)) end},
        {"dense", function(p) return mg.dense(x, p, b, "relu") end, w,
         function(p) return mg.dense(f16(x), f16(p), b, "relu") end},
        {"einsum", function(p) return mg.einsum("ij,jk->ik", x, p) end, w,
         function(p) return mg.matmul(f16(x), f16(p)) end},
        {"conv2d", function(p) return mg.conv2d(img, p, nil, {padding = "same"}) end, flt,
         function(p) return mg.conv2d(f16(img), f16(p), nil, {padding = "same"}) end},
        {"attention", function(p) return mg.scaled_dot_product_attention(q, p, v) end, mg.Variable(k),
         function(p) return mg.scaled_dot_product_attention(f16(q), f16(p), f16(v)) end},
      }
      for _, c in ipairs(cases) do
        local name, fn, p, by_hand = c[1], c[2], c[3], c[4]
        local t = mg.tape()
        local y = mg.autocast("float16", fn, p)
        local loss = mg.sum(y * y)
        t:stop()
        assert.are.equal("float16", y.dtype, name)
        local t2 = mg.tape()
        local y2 = mg.cast(by_hand(p), "float16")
        local loss2 = mg.sum(y2 * y2)
        t2:stop()
        same_bits(y, y2)
        local g = t:gradient(loss, p)
        assert.are.equal("float32", g.dtype, name)
        same_bits(g, t2:gradient(loss2, p))
      end
      -- float16 operands outside autocast compute the same way
      same_bits(mg.matmul(mg.cast(x, "float16"), mg.cast(w:value(), "float16")),
                mg.cast(mg.matmul(f16(x), f16(w:value())), "float16"))
    end)

    it("loses gradients below float16's range without a loss scale, and keeps them with one", function()
      local x, w = mg.random.normal{16, 8}, mg.Variable(mg.random.normal{8, 4})
      local function g_at (scale)
        local t = mg.tape()
        local y = mg.autocast("float16", mg.matmul, x, w)
        local loss = mg.sum(y) * 1e-8 * scale              -- dy = 1e-8: below float16's least subnormal
        t:stop()
        return t:gradient(loss, w) / scale
      end
      local t = mg.tape()
      local exact = mg.sum(mg.matmul(x, w)) * 1e-8
      t:stop()
      local want = t:gradient(exact, w)
      assert.are.equal(0, mg.max(mg.abs(g_at(1))):item())   -- all underflowed
      assert.is_true(rel_err(g_at(2 ^ 15), want) < 2e-3)
    end)

    it("a LossScaleOptimizer in float32 trains exactly as its optimizer alone (powers of two scale exactly)", function()
      local function run (scaled)
        mg.random.seed(7)
        local w = mg.Variable(mg.random.normal{4, 3})
        local x, y = mg.random.normal{8, 4}, mg.random.normal{8, 3}
        local opt = mg.optim.Adam{learning_rate = 0.01}
        if scaled then opt = mg.optim.LossScaleOptimizer(opt, {initial_scale = 2 ^ 10, dynamic_growth_steps = 3}) end
        for _ = 1, 10 do
          local t = mg.tape()
          local loss = mg.mean((mg.matmul(x, w) - y) ^ 2)
          if scaled then loss = opt:scale_loss(loss) end
          t:stop()
          opt:minimize(loss, {w}, t)
        end
        return w:value(), opt
      end
      local plain = run(false)
      local scaled, opt = run(true)
      same_bits(plain, scaled)
      assert.are.equal(2 ^ 13, opt.loss_scale)          -- three doublings in ten good steps
      assert.are.equal(10, opt.iterations)
    end)

    it("skips a step whose gradients overflow, leaving variables and slots as they were", function()
      local w = mg.Variable(mg.constant{1, 2})
      local opt = mg.optim.LossScaleOptimizer(mg.optim.Adam(), {initial_scale = 2})
      opt:apply_gradients({mg.constant{1, 1}}, {w})
      local before, m = w:value() * 1, opt.m[w] * 1
      assert.is_false(opt:apply_gradients({mg.constant{1, 0 / 0}}, {w}))
      same_bits(before, w:value())
      same_bits(m, opt.m[w])
      assert.are.equal(1, opt.loss_scale)
      assert.are.equal(1, opt.skipped_steps)
      -- at scale 1 the scale stays at 1 (and says once that the model itself diverges)
      assert.is_false(opt:apply_gradients({mg.constant{1 / 0, 1}}, {w}))
      assert.are.equal(1, opt.loss_scale)
      -- gradients with holes (nil for an unconnected variable) and the pairs form
      local v = mg.Variable(mg.constant{3})
      assert.is_true(opt:apply_gradients({nil, mg.constant{2}, n = 2}, {w, v}))
      assert.is_true(opt:apply_gradients({{mg.constant{2, 2}, w}}))
      assert.has_error(function() opt:scale_loss("x") end,
                       "LossScaleOptimizer:scale_loss: loss must be a tensor or a number, got 'x'")
      assert.has_error(function() opt.scale_loss(3, mg.ones{}) end)
    end)

    it("re-runs (recompute, loops) replay float16 after emulation is switched off again", function()
      local w = mg.Variable(mg.random.normal{8, 8})
      local x = mg.random.normal{4, 8}
      local f = mg.recompute_grad(function(a) return mg.tanh(mg.matmul(a, w)) end)
      local t = mg.tape()
      local y = mg.autocast("float16", function() return mg.sum(f(x)) end)
      mg.mixed_precision.emulate_float16(false)
      t:stop()
      local g = t:gradient(y, w)
      mg.mixed_precision.emulate_float16(true)
      local t2 = mg.tape()
      local y2 = mg.autocast("float16", function() return mg.sum(mg.tanh(mg.matmul(x, w))) end)
      t2:stop()
      same_bits(g, t2:gradient(y2, w))
    end)

    it("LossScaleOptimizer: a half loss scales in float32; checks come before the values; floors", function()
      local opt = mg.optim.LossScaleOptimizer(mg.optim.SGD(0.1), {initial_scale = 2 ^ 16})
      assert.are.equal(655360, opt:scale_loss(mg.cast(mg.constant(10), "float16")):item())   -- not inf
      local w = mg.Variable(mg.constant{1, 2})
      local function says (grads, vars, text)
        local ok, err = pcall(opt.apply_gradients, opt, grads, vars)
        assert.is_false(ok)
        assert.truthy(tostring(err):find(text, 1, true), tostring(err))
      end
      says({mg.constant{1, 1, 1 / 0}}, {w}, "LossScaleOptimizer: gradients[1] has shape (3) but variables[1] has shape (2)")
      says({mg.constant{1 / 0, 1}}, {"w"}, "LossScaleOptimizer: variables[1] is a string, not a Variable")
      says({mg.constant({8, 8}, "int64")}, {w}, "LossScaleOptimizer: gradients[1] is int64 but variables[1] is float32")
      assert.are.equal(2 ^ 16, opt.loss_scale)         -- nothing moved
      local low = mg.optim.LossScaleOptimizer(mg.optim.SGD(0.1), {initial_scale = 0.5})
      low:apply_gradients({mg.constant{1 / 0, 1}}, {w})
      assert.are.equal(0.25, low.loss_scale)           -- a scale chosen below 1 keeps halving
      assert.has_error(function() mg.optim.LossScaleOptimizer(mg.distributed.DistributedOptimizer(mg.optim.SGD())) end)
    end)

    it("a checkpoint's loss scale, restored into the plain optimizer, goes on in the next float16 fit", function()
      local lso = mg.optim.LossScaleOptimizer(mg.optim.SGD(0.1), {initial_scale = 2 ^ 11})
      local w = mg.Variable(mg.constant{1, 2})
      lso:apply_gradients({mg.constant{1, 1}}, {w})
      local state = lso:get_state()
      local x, y = mg.random.normal{16, 2}, mg.random.normal{16, 1}
      local m = mg.nn.Sequential{mg.nn.Dense(1)}
      m:compile{optimizer = mg.optim.SGD(0.01), loss = "mse"}
      m(x)
      local seen
      m.optimizer:set_state({optimizer = "SGD", iterations = 1, slots = {}, loss_scale = state.loss_scale,
                             good_steps = state.good_steps}, {})
      m:fit(x, y, {epochs = 1, batch_size = 16, verbose = 0, mixed_precision = "float16",
                   callbacks = {mg.callbacks.LambdaCallback{on_epoch_end = function() seen = m.optimizer.loss_scale end}}})
      assert.are.equal(2 ^ 11, seen)
      assert.has_error(function() m.optimizer:set_state({optimizer = "SGD", iterations = 0, slots = {}, loss_scale = -1}, {}) end,
                       "SGD:set_state: state.loss_scale must be a positive finite number, got -1")
    end)

    it("fit{mixed_precision = 'float16'} scales the loss itself and trains as float32 does", function()
      mg.random.seed(3)
      local x = mg.random.normal{256, 12}
      local y = mg.argmax(mg.matmul(x, mg.random.normal{12, 3}), 2)
      local function model ()
        mg.random.seed(5)
        local m = mg.nn.Sequential{mg.nn.Dense(32, "relu"), mg.nn.Dense(3)}
        m:compile{optimizer = mg.optim.Adam(), loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}}
        return m
      end
      local m32, m16 = model(), model()
      local h32 = m32:fit(x, y, {epochs = 4, verbose = 0, shuffle = false})
      local opt = m16.optimizer
      local h16 = m16:fit(x, y, {epochs = 4, verbose = 0, shuffle = false, mixed_precision = "float16"})
      local l32, l16 = h32.history.loss[4], h16.history.loss[4]
      assert.is_true(math.abs(l16 - l32) < 0.02 * l32, ("%g vs %g"):format(l16, l32))
      assert.are.equal(opt, m16.optimizer)              -- the wrapper was fit's alone
      assert.are.equal(32, opt.iterations)             -- no step skipped at these values
      for _, v in ipairs(m16.trainable_variables) do assert.are.equal("float32", v.dtype) end
    end)
  end)
end)

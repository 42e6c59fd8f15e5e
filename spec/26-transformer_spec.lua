-- Transformers: the fused ops (layer_norm, gelu, scaled_dot_product_attention)
-- against plain-ops references, float64 gradchecks (first and second order),
-- the fused backward kernels against the op-built ones, float32 against
-- float64; the layers (Embedding, PositionalEmbedding, LayerNorm,
-- MultiHeadAttention, TransformerBlock), their errors, recompute per block,
-- sequence losses and perplexity; examples/char_gpt.lua in its tiny setting.
local mg = require "moongrad"
local h = require "helpers"
local nn = mg.nn

local function check (f, ...) assert.is_true(mg.test.gradcheck(f, {...})) end
local function rnd (shape, lo, hi) return mg.random.uniform(shape, lo or -1, hi or 1, "float64") end
local function f32 (x) return mg.cast(x, "float32") end
local function f64 (x) return mg.cast(x, "float64") end

-- the gradient of sum(f(xs...) * seed) with respect to each of xs; under
-- an outer recording tape (nested = true) the backward rules take their
-- op-built form, else their fused kernels
local function grads (f, xs, seed, nested)
  local function inner () return h.grads(f, xs, seed) end
  if not nested then return inner() end
  local outer = mg.tape()
  outer:watch(xs)
  local g = inner()
  outer:stop()
  return g
end

-- layer_norm by its definition
local function ln_ref (x, g, b, eps)
  local mu = mg.mean(x, -1, true)
  local var = mg.mean((x - mu) ^ 2, -1, true)
  local y = (x - mu) / mg.sqrt(var + (eps or 1e-5))
  if g then y = y * g end
  if b then y = y + b end
  return y
end

-- attention by its definition: softmax of the masked scores, 0 where masked
local function attention_ref (q, k, v, mask, causal, scale)
  local nd, Tq, Tk = q.ndim, q.shape[q.ndim - 1], k.shape[k.ndim - 1]
  local s = mg.matmul(q, mg.swapaxes(k, -2, -1)) * (scale or 1 / math.sqrt(q.shape[nd]))
  if causal then
    local c = mg.less_equal(mg.reshape(mg.arange(1, Tk + 1, 1, "int64"), {1, Tk}),
                            mg.reshape(mg.arange(1, Tq + 1, 1, "int64"), {Tq, 1}))
    mask = mask and mg.logical_and(mask, c) or c
  end
  local p = mg.softmax(mask and mg.where(mask, s, -1e300) or s, -1)
  if mask then p = mg.where(mask, p, 0) end
  return mg.matmul(p, v)
end

describe("layer_norm", function()
  before_each(function() mg.random.seed(26) end)

  it("normalizes the last axis, with and without gamma and beta", function()
    local x, g, b = rnd({2, 3, 5}, -3, 3), rnd({5}), rnd({5})
    h.assert_close(mg.layer_norm(x, g, b), ln_ref(x, g, b), 1e-12)
    h.assert_close(mg.layer_norm(x), ln_ref(x), 1e-12)
    h.assert_close(mg.layer_norm(x, nil, b), ln_ref(x, nil, b), 1e-12)
    h.assert_close(x:layer_norm(g, {epsilon = 0.1}), ln_ref(x, g, nil, 0.1), 1e-12)
    local y = mg.layer_norm(x)
    h.assert_close(mg.mean(y, -1), mg.zeros({2, 3}, "float64"), 1e-12)
    h.assert_close(f32(x):layer_norm(f32(g), f32(b)), mg.layer_norm(x, g, b), 1e-5)
  end)

  it("passes float64 gradchecks, first and second order", function()
    local x, g, b = rnd({3, 4}, -2, 2), rnd({4}), rnd({4})
    check(function(x_, g_, b_) return mg.layer_norm(x_, g_, b_) end, x, g, b)
    check(function(x_) return mg.layer_norm(x_) end, rnd({2, 2, 6}))
    check(function(x_, b_) return mg.layer_norm(x_, nil, b_, {epsilon = 0.5}) end, x, b)
    local seed = rnd({3, 4})
    check(function(x_, g_) return grads(function(a, c) return mg.layer_norm(a, c, b) end, {x_, g_}, seed)[1] end, x, g)
  end)

  it("gives the same gradients from its fused kernel and from ops", function()
    local x, g, b, seed = rnd({4, 3, 8}, -2, 2), rnd({8}), rnd({8}), rnd({4, 3, 8})
    local f = function(a, c, d) return mg.layer_norm(a, c, d) end
    local fused, ops = grads(f, {x, g, b}, seed), grads(f, {x, g, b}, seed, true)
    for i = 1, 3 do h.assert_close(fused[i], ops[i], 1e-12) end
    local x32, seed32 = f32(x), f32(seed)
    local g32 = grads(function(a) return mg.layer_norm(a, f32(g), f32(b)) end, {x32}, seed32)
    h.assert_close(g32[1], fused[1], 1e-4)
  end)

  it("agrees with its definition on rows longer than the kernel's 16 lanes, with a tail", function()
    for _, D in ipairs({16, 37, 256}) do
      local x, g, b, seed = rnd({3, 2, D}, -2, 2) + 50, rnd({D}), rnd({D}), rnd({3, 2, D})
      h.assert_close(mg.layer_norm(x, g, b), ln_ref(x, g, b), 1e-11)
      h.assert_close(mg.layer_norm(x, nil, b), ln_ref(x, nil, b), 1e-11)
      h.assert_close(f32(x):layer_norm(f32(g), f32(b)), ln_ref(x, g, b), 1e-3)
      for _, f in ipairs({function(a, c, d) return mg.layer_norm(a, c, d) end,
                          function(a, _, d) return mg.layer_norm(a, nil, d) end}) do
        local fused, ops = grads(f, {x, g, b}, seed), grads(f, {x, g, b}, seed, true)
        for i = 1, 3 do
          if ops[i] then h.assert_close(fused[i], ops[i], 1e-10) end
        end
        local g32 = grads(function(a, c, d) return f(a, c, d) end, {f32(x), f32(g), f32(b)}, f32(seed))
        for i = 1, 3 do
          if ops[i] then h.assert_close(g32[i], ops[i], 2e-3) end
        end
      end
    end
  end)

  it("computes bfloat16 x, gamma and beta in float32, as autocast does; their gradients in bfloat16", function()
    local function bf (t) return mg.cast(t, "bfloat16") end
    local x, g, b = bf(mg.random.normal{3, 8}), bf(mg.random.normal{8}), bf(mg.random.normal{8})
    local seed = mg.random.normal{3, 8}
    local t = mg.tape()
    for _, v in ipairs{x, g, b} do t:watch(v) end
    local y = mg.layer_norm(x, g, b)
    local l = mg.sum(y * seed)
    t:stop()
    local f32 = function(v) return mg.cast(v, "float32") end
    assert.are.equal("float32", y.dtype)
    assert.are.equal(0, mg.max(mg.abs(y - mg.layer_norm(f32(x), f32(g), f32(b)))):item())
    for _, d in ipairs(t:gradient(l, {x, g, b})) do assert.are.equal("bfloat16", d.dtype) end
  end)

  it("names the mismatch", function()
    local x = mg.ones{2, 4}
    assert.has_error(function() mg.layer_norm(x, mg.ones{3}) end,
                     "layer_norm: gamma has shape (3), expected (4) (x's last axis)")
    assert.has_error(function() mg.layer_norm(x, nil, mg.ones({4}, "float64")) end,
                     "layer_norm: dtypes differ: x is float32, beta is float64")
    assert.has_error(function() mg.layer_norm(mg.ones({4}, "int64")) end,
                     "layer_norm: x must be float32 or float64, got int64")
    assert.has_error(function() mg.layer_norm(mg.ones({2, 4}, "float64"), mg.ones({4}, "bfloat16")) end,
                     "layer_norm: dtypes differ: x is float64, gamma is bfloat16")
    assert.has_error(function() mg.layer_norm(mg.ones({2, 4}, "bfloat16"), mg.ones({4}, "float64")) end,
                     "layer_norm: dtypes differ: x is bfloat16, gamma is float64")
    assert.has_error(function() mg.layer_norm(mg.constant(1)) end,
                     "layer_norm: x must have at least 1 dimension (the features), got a 0-d tensor")
    assert.has_error(function() mg.layer_norm(x, {epsilon = -1}) end,
                     "bad argument #2 to 'layer_norm' (option 'epsilon' must be a finite number >= 0, got -1)")
    assert.has_error(function() mg.layer_norm(x, {eps = 1}) end)
  end)
end)

describe("gelu", function()
  before_each(function() mg.random.seed(27) end)

  it("is x * Phi(x), or the tanh approximation", function()
    local x = rnd({50}, -6, 6)
    h.assert_close(mg.gelu(x), x * 0.5 * (1 + mg.erf(x / math.sqrt(2))), 1e-14)
    local u = math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)
    h.assert_close(mg.gelu(x, "tanh"), 0.5 * x * (1 + mg.tanh(u)), 1e-14)
    h.assert_close(x:gelu(true), mg.gelu(x, {approximate = "tanh"}), 0)
    h.assert_close(mg.gelu(x, false), mg.gelu(x, "none"), 0)
    h.assert_close(f32(x):gelu(), mg.gelu(x), 1e-6)
    h.assert_close(f32(x):gelu("tanh"), mg.gelu(x, "tanh"), 1e-6)
  end)

  it("passes float64 gradchecks, first and second order, fused and op-built alike", function()
    local x = rnd({3, 7}, -4, 4)
    check(function(a) return mg.gelu(a) end, x)
    check(function(a) return mg.gelu(a, "tanh") end, x)
    local seed = rnd({3, 7})
    for _, approx in ipairs({false, true}) do
      local f = function(a) return mg.gelu(a, approx) end
      h.assert_close(grads(f, {x}, seed)[1], grads(f, {x}, seed, true)[1], 1e-13)
      check(function(a) return grads(f, {a}, seed)[1] end, x)
    end
  end)

  it("writes its backward, and layer_norm's, over the output gradient the walk spares it", function()
    local x, g, b = mg.Variable(f32(rnd({128, 64}))), mg.Variable(f32(rnd({64}))), mg.Variable(f32(rnd({64})))
    local bytes = 128 * 64 * 4
    local function run (keep_middle)
      local t = mg.tape()
      local a = mg.layer_norm(x, g, b)
      local m = mg.gelu(a)
      local y = mg.gelu(mg.layer_norm(m) * 1.5, true)
      t:stop()
      local seed = mg.full({128, 64}, 0.25)
      local before = mg.memory.stats().allocated_bytes
      local gr = t:gradient(y, keep_middle and {x, m} or {x}, {seed})
      return gr, mg.memory.stats().allocated_bytes - before
    end
    local gr, alloc = run(false)
    local gr2, alloc2 = run(true)
    assert.equal(0, mg.sum(mg.cast(mg.not_equal(gr[1], gr2[1]), "int64")):item())
    -- the seed is the caller's, so the last gelu makes the first (128, 64)
    -- tensor and the product's rule the second; layer_norm, gelu and
    -- layer_norm then write over them
    assert.is_true(alloc < 3 * bytes, alloc)
    -- asked for, m's gradient is the caller's: the first gelu's rule leaves it alone
    assert.is_true(alloc2 >= alloc + bytes, alloc2 .. " " .. alloc)
    -- and the numbers are the op-built rules'
    local ops = grads(function(v) return mg.gelu(mg.layer_norm(mg.gelu(mg.layer_norm(v, g, b))) * 1.5, true) end,
                      {x}, mg.full({128, 64}, 0.25), true)
    h.assert_close(gr[1], ops[1], 1e-4)
  end)

  it("names the mismatch", function()
    assert.has_error(function() mg.gelu(mg.ones({2}, "int64")) end, "gelu: x must be float32 or float64, got int64")
    assert.has_error(function() mg.gelu(mg.ones{2}, "erf") end,
                     "bad argument #2 to 'gelu' (approximate must be false, true, 'none' or 'tanh', got 'erf')")
  end)
end)

describe("scaled_dot_product_attention", function()
  before_each(function() mg.random.seed(28) end)

  local function qkv (B, H, Tq, Tk, dk, dv)
    return rnd({B, H, Tq, dk}, -2, 2), rnd({B, H, Tk, dk}, -2, 2), rnd({B, H, Tk, dv})
  end

  it("equals the plain ops: softmax(q k^T / sqrt(d)) v, causal, masked, scaled", function()
    local q, k, v = qkv(2, 3, 5, 5, 4, 6)
    local sdpa = mg.scaled_dot_product_attention
    h.assert_close(sdpa(q, k, v), attention_ref(q, k, v), 1e-12)
    h.assert_close(sdpa(q, k, v, {causal = true}), attention_ref(q, k, v, nil, true), 1e-12)
    h.assert_close(sdpa(q, k, v, {scale = 0.3}), attention_ref(q, k, v, nil, false, 0.3), 1e-12)
    local mask = mg.greater(mg.random.uniform({2, 1, 5, 5}), 0.4)
    h.assert_close(sdpa(q, k, v, {mask = mask}), attention_ref(q, k, v, mask), 1e-12)
    h.assert_close(q:scaled_dot_product_attention(k, v, {mask = mask, causal = true}),
                   attention_ref(q, k, v, mask, true), 1e-12)
    local q2, k2, v2 = qkv(2, 3, 4, 7, 4, 2)               -- cross-attention: 4 queries, 7 keys
    local pad = mg.less(mg.arange(1, 8, 1, "int64"), mg.constant({{5}, {8}}, "int64")):reshape{2, 1, 1, 7}
    h.assert_close(sdpa(q2, k2, v2, {mask = pad}), attention_ref(q2, k2, v2, pad), 1e-12)
    h.assert_close(sdpa(f32(q), f32(k), f32(v), {mask = mask}), attention_ref(q, k, v, mask), 1e-5)
  end)

  it("reads heads split by a transpose in place, and 3-D or 2-D inputs", function()
    local x = rnd({2, 6, 12}, -2, 2)                       -- (B, T, H*dh), 3 heads of 4
    local heads = mg.swapaxes(mg.reshape(x, {2, 6, 3, 4}), 2, 3)
    local copy = heads * 1
    h.assert_close(mg.scaled_dot_product_attention(heads, heads, heads, {causal = true}),
                   attention_ref(copy, copy, copy, nil, true), 1e-12)
    local q, k, v = rnd({5, 3}), rnd({4, 3}), rnd({4, 2})
    h.assert_close(mg.scaled_dot_product_attention(q, k, v), attention_ref(q, k, v), 1e-12)
  end)

  it("gives zeros, and zero gradients, to a query with nothing to attend to", function()
    local q, k, v = qkv(1, 1, 3, 3, 2, 2)
    local mask = mg.constant({{true, false, false}, {false, false, false}, {true, true, false}})
    local y = mg.scaled_dot_product_attention(q, k, v, {mask = mask})
    h.assert_close(y[1][1][2], mg.zeros({2}, "float64"), 0)
    local g = grads(function(a, b, c) return mg.scaled_dot_product_attention(a, b, c, {mask = mask}) end,
                    {q, k, v}, rnd({1, 1, 3, 2}))
    h.assert_close(g[1][1][1][2], mg.zeros({2}, "float64"), 0)
    h.assert_close(g[3][1][1][3], mg.zeros({2}, "float64"), 0)        -- key 3 is never attended to
  end)

  it("passes float64 gradchecks, first and second order", function()
    local q, k, v = qkv(2, 2, 4, 4, 3, 2)
    local mask = mg.greater(mg.random.uniform({2, 1, 1, 4}), 0.3)
    check(function(a, b, c) return mg.scaled_dot_product_attention(a, b, c) end, q, k, v)
    check(function(a, b, c) return mg.scaled_dot_product_attention(a, b, c, {causal = true, mask = mask}) end, q, k, v)
    local q2, k2, v2 = qkv(1, 2, 3, 5, 2, 3)
    check(function(a, b, c) return mg.scaled_dot_product_attention(a, b, c, {scale = 0.7}) end, q2, k2, v2)
    local seed = rnd({2, 2, 4, 2})
    local f = function(a, b, c) return mg.scaled_dot_product_attention(a, b, c, {causal = true}) end
    check(function(a, b, c) return grads(f, {a, b, c}, seed)[1] end, q, k, v)
  end)

  it("gives the plain ops' gradients, from its fused kernel and from ops", function()
    local q, k, v = qkv(2, 3, 6, 6, 4, 5)
    local mask = mg.greater(mg.random.uniform({2, 1, 6, 6}), 0.3)
    local seed = rnd({2, 3, 6, 5})
    local f = function(a, b, c) return mg.scaled_dot_product_attention(a, b, c, {causal = true, mask = mask}) end
    local ref = grads(function(a, b, c) return attention_ref(a, b, c, mask, true) end, {q, k, v}, seed)
    local fused, ops = grads(f, {q, k, v}, seed), grads(f, {q, k, v}, seed, true)
    for i = 1, 3 do
      h.assert_close(fused[i], ref[i], 1e-12)
      h.assert_close(ops[i], ref[i], 1e-12)
    end
    local g32 = grads(f, {f32(q), f32(k), f32(v)}, f32(seed))
    for i = 1, 3 do h.assert_close(g32[i], ref[i], 1e-4) end
  end)

  it("agrees with the plain ops on rows longer than the kernel's 16 lanes, causal with Tq ~= Tk", function()
    for _, sz in ipairs({{37, 37}, {20, 37}, {40, 19}, {16, 16}}) do
      local Tq, Tk = sz[1], sz[2]
      local q, k, v = qkv(2, 2, Tq, Tk, 5, 3)
      local mask = mg.greater(mg.random.uniform({2, 1, Tq, Tk}), 0.2)
      local seed = rnd({2, 2, Tq, 3})
      for _, opt in ipairs({{}, {causal = true}, {mask = mask}, {causal = true, mask = mask}}) do
        local f = function(a, b, c) return mg.scaled_dot_product_attention(a, b, c, opt) end
        local r = function(a, b, c) return attention_ref(a, b, c, opt.mask, opt.causal) end
        h.assert_close(f(q, k, v), r(q, k, v), 1e-12)
        h.assert_close(f(f32(q), f32(k), f32(v)), r(q, k, v), 1e-5)
        local ref, fused = grads(r, {q, k, v}, seed), grads(f, {q, k, v}, seed)
        local g32 = grads(f, {f32(q), f32(k), f32(v)}, f32(seed))
        for i = 1, 3 do
          h.assert_close(fused[i], ref[i], 1e-11)
          h.assert_close(g32[i], ref[i], 1e-4)
        end
      end
    end
  end)

  it("propagates a NaN or inf score as the plain ops do: NaN where attended, 0 where masked", function()
    local function nan_at (t) return mg.cast(mg.not_equal(t, t), "int64") end
    local function same (a, b)                 -- NaN in the same places, equal elsewhere
      assert.same(nan_at(b):totable(), nan_at(a):totable())
      h.assert_close(mg.where(mg.not_equal(a, a), 0, a), mg.where(mg.not_equal(b, b), 0, b), 1e-11)
    end
    local q, k, v = qkv(1, 2, 6, 6, 3, 2)
    local mask = mg.greater(mg.random.uniform({1, 1, 6, 6}), 0.3)
    local seed = rnd({1, 2, 6, 2})
    local function poke (t, idx, x)            -- t with one entry set to x
      local c = t:totable()
      c[idx[1]][idx[2]][idx[3]][idx[4]] = x
      return mg.tensor(c, "float64")
    end
    local cases = {
      {poke(poke(q, {1, 1, 2, 1}, 0 / 0), {1, 1, 2, 2}, 0 / 0), k, v},   -- a query of NaN scores
      {q, poke(k, {1, 2, 4, 3}, 0 / 0), v},                              -- a key every query sees as NaN
      {poke(q, {1, 1, 5, 1}, math.huge), k, v},                          -- +inf and -inf scores
    }
    for _, c in ipairs(cases) do
      for _, opt in ipairs({{}, {causal = true}, {mask = mask}, {causal = true, mask = mask}}) do
        local f = function(a, b, d) return mg.scaled_dot_product_attention(a, b, d, opt) end
        local r = function(a, b, d) return attention_ref(a, b, d, opt.mask, opt.causal) end
        same(f(c[1], c[2], c[3]), r(c[1], c[2], c[3]))
        local ref, fused, ops = grads(r, c, seed), grads(f, c, seed), grads(f, c, seed, true)
        for i = 1, 3 do
          same(fused[i], ref[i])
          same(ops[i], ref[i])
        end
      end
    end
  end)

  it("keeps only q, k and v on the tape", function()
    local q, k, v = f32(rnd({2, 4, 32, 8})), f32(rnd({2, 4, 32, 8})), f32(rnd({2, 4, 32, 8}))
    local t = mg.tape()
    t:watch({q, k, v})
    mg.scaled_dot_product_attention(q, k, v, {causal = true})
    t:stop()
    assert.equal(3 * 2 * 4 * 32 * 8 * 4, t:saved_bytes())
  end)

  it("names the mismatch", function()
    local q, k, v = mg.ones{2, 3, 4}, mg.ones{2, 5, 4}, mg.ones{2, 5, 6}
    local sdpa = mg.scaled_dot_product_attention
    assert.has_error(function() sdpa(q, mg.ones{2, 5, 3}, v) end,
                     "scaled_dot_product_attention: q and k must have the same last axis (features), got (2,3,4) and (2,5,3)")
    assert.has_error(function() sdpa(q, k, mg.ones{2, 4, 6}) end,
                     "scaled_dot_product_attention: k and v must have as many positions (their axis 2), got (2,5,4) and (2,4,6)")
    assert.has_error(function() sdpa(q, mg.ones{3, 5, 4}, v) end,
                     "scaled_dot_product_attention: q and k must have the same batch dimensions, got (2,3,4) and (3,5,4)")
    assert.has_error(function() sdpa(q, k, v, {mask = mg.ones{3, 5}}) end,
                     "scaled_dot_product_attention: mask must be bool (true: attend), got float32")
    assert.has_error(function() sdpa(q, k, v, {mask = mg.greater(mg.ones{4, 5}, 0)}) end,
                     "scaled_dot_product_attention: mask of shape (4,5) does not broadcast to the attention weights' shape (2,3,5)")
    assert.has_error(function() sdpa(q, k, mg.ones({2, 5, 6}, "float64")) end,
                     "scaled_dot_product_attention: dtypes differ: q is float32, v is float64")
    assert.has_error(function() sdpa(mg.ones{4}, k, v) end,
                     "scaled_dot_product_attention: q must have at least 2 dimensions (..., positions, features), got shape (4)")
    assert.has_error(function() mg.scaled_dot_product_attention(q, k, v, {scale = 0}) end,
                     "bad argument #4 to 'scaled_dot_product_attention' (option 'scale' must be a finite number > 0, got 0)")
    assert.has_error(function() sdpa(q, k, v, {casual = true}) end)
  end)
end)

describe("transformer layers", function()
  before_each(function() mg.random.seed(29) end)

  it("Embedding gathers rows, adds the gradients of repeated ids, and checks the ids", function()
    local emb = nn.Embedding(5, 3, {dtype = "float64"})
    local ids = mg.constant({{1, 5, 1}, {2, 2, 2}}, "int64")
    local y = emb(ids)
    assert.same({2, 3, 3}, y.shape)
    h.assert_close(y[1][2], emb.embeddings[5], 0)
    local t = mg.tape()
    local l = mg.sum(emb(ids))
    t:stop()
    local g = t:gradient(l, emb.embeddings)
    h.assert_close(mg.sum(g, 2), mg.constant({6, 9, 0, 0, 3}, "float64"), 0)
    assert.has_error(function() emb(mg.constant({0, 1}, "int64")) end,
                     "Embedding: ids must be token numbers in 1..5 (1-based), got 0; add 1 to 0-based ids")
    assert.has_error(function() emb(mg.constant({6}, "int64")) end,
                     "Embedding: ids must be token numbers in 1..5 (1-based), got 6")
    assert.has_error(function() emb(mg.ones{2}) end, "Embedding: ids must be an int64 tensor of token numbers 1..5, got float32")
    assert.has_error(function() nn.Embedding(0, 3) end, "Embedding: input_dim must be a positive integer, got 0")
  end)

  it("PositionalEmbedding adds a vector per position, up to sequence_length", function()
    local pe = nn.PositionalEmbedding(4)
    local x = mg.zeros{2, 3, 5}
    local y = pe(x)
    h.assert_close(y[2], pe.embeddings:slice({1, 3}), 0)
    assert.has_error(function() pe(mg.zeros{1, 5, 5}) end,
                     "PositionalEmbedding: the input has 5 positions, the layer holds 4 (its sequence_length)")
    assert.has_error(function() pe(mg.zeros{1, 2, 6}) end,
                     "PositionalEmbedding: input has 6 features (its last axis), the layer was built for 5")
  end)

  it("LayerNorm builds gamma and beta from the last axis", function()
    local ln = nn.LayerNorm{epsilon = 1e-3}
    local x = rnd({4, 6}, -5, 5)
    h.assert_close(ln(x), ln_ref(x, nil, nil, 1e-3), 1e-12)
    -- layer_norm, or layer_norm_<n> after other LayerNorms in this process
    local function base (v) return (v.name:match("[%w_]+/%w+$"):gsub("^layer_norm_%d+/", "layer_norm/")) end
    assert.same({"layer_norm/gamma", "layer_norm/beta"}, {base(ln.variables[1]), base(ln.variables[2])})
    assert.equal(0, #nn.LayerNorm{center = false, scale = false}(x).shape - 2)
    assert.has_error(function() ln(rnd({4, 5})) end,
                     "LayerNorm: input has 5 features (its last axis), the layer was built for 6")
    assert.has_error(function() nn.LayerNorm{epsilon = -1} end,
                     "LayerNorm: option 'epsilon' must be a finite number >= 0, got -1")
  end)

  it("MultiHeadAttention: the fused op and the plain ops agree, values and gradients", function()
    local x, seed = rnd({2, 5, 8}), rnd({2, 5, 8})
    local fused = nn.MultiHeadAttention(2, 8, {causal = true})
    local plain = nn.MultiHeadAttention(2, 8, {causal = true, fused = false})
    fused(x)
    plain(x)
    for i, v in ipairs(plain.variables) do v:assign(fused.variables[i]) end
    h.assert_close(fused(x), plain(x), 1e-12)
    local gf = grads(function(a) return fused(a) end, {x}, seed)
    local gp = grads(function(a) return plain(a) end, {x}, seed)
    h.assert_close(gf[1], gp[1], 1e-12)
    local function var_grads (layer)
      local t = mg.tape()
      local l = mg.sum(layer(x) * seed)
      t:stop()
      return t:gradient(l, layer.variables)
    end
    local vf, vp = var_grads(fused), var_grads(plain)
    assert.equal(8, #vf)
    for i = 1, #vf do h.assert_close(vf[i], vp[i], 1e-12) end
    check(function(a) return fused(a) end, x)
  end)

  it("MultiHeadAttention: causal positions see only the past; padding and cross-attention masks", function()
    local mha = nn.MultiHeadAttention(2, 8, {causal = true})
    local x = rnd({1, 6, 8})
    local y1 = mha(x)
    local x2 = mg.concat({x:slice(nil, {1, 3}), rnd({1, 3, 8})}, 2)
    h.assert_close(mha(x2):slice(nil, {1, 3}), y1:slice(nil, {1, 3}), 1e-12)
    local cross = nn.MultiHeadAttention(4, 8)
    local q, kv = rnd({2, 3, 8}), rnd({2, 5, 6})
    local pad = mg.constant({{true, true, true, false, false}, {true, true, true, true, true}})
    local y = cross(q, kv, {mask = pad})
    assert.same({2, 3, 8}, y.shape)
    local kv2 = mg.concat({kv:slice(nil, {1, 3}), rnd({2, 2, 6})}, 2)    -- the padding changes, not the output
    h.assert_close(cross(q, kv2, {mask = pad})[1], y[1], 1e-12)
    assert.has_error(function() cross(q, kv, {mask = mg.ones{2, 5}}) end,
                     "MultiHeadAttention: option 'mask' must be a bool tensor (true: attend) or nil, got a tensor (2,5) float32")
    assert.has_error(function() cross(q, kv, {mask = mg.greater(mg.ones{2, 4}, 0)}) end,
                     "MultiHeadAttention: mask must be (batch, keys) = (2,5), (batch, queries, keys) = (2,3,5) or "
                     .. "(batch, heads, queries, keys), got (2,4)")
    assert.has_error(function() nn.MultiHeadAttention(3, 8) end,
                     "MultiHeadAttention: dim (8) must be a multiple of heads (3): each head gets dim / heads features")
    assert.has_error(function() mha(rnd({2, 8})) end,
                     "MultiHeadAttention: query must have 3 dimensions (batch, time, features), got shape (2,8)")
  end)

  it("TransformerBlock: pre-norm residuals, gradchecks, dropout only while training", function()
    local block = nn.TransformerBlock(2, 4, {causal = true, mlp_dim = 6})
    local x = rnd({2, 3, 4})
    check(function(a) return block(a) end, x)
    assert.equal(2 * 4 + 4 * (4 * 4 + 4) + 2 * 4 + (4 * 6 + 6) + (6 * 4 + 4), 0 + (function()
      local n = 0
      for _, v in ipairs(block.variables) do n = n + v:numel() end
      return n
    end)())
    local drop = nn.TransformerBlock(2, 8, {dropout = 0.5})
    local x8 = f32(rnd({2, 4, 8}))
    local a, b = drop(x8), drop(x8)
    assert.is_true(mg.max(mg.abs(a - b)):item() > 0)
    drop.training = false
    h.assert_close(drop(x8), drop(x8), 0)
    h.assert_close(drop(x8, {training = false}), drop(x8), 0)
    assert.has_error(function() block(rnd({2, 3, 5})) end,
                     "TransformerBlock: input has 5 features (its last axis), the layer was built for 4")
    assert.has_error(function() nn.TransformerBlock(2, 4, {activation = "mish"}) end,
                     "TransformerBlock: unknown activation 'mish' (known: elu, exponential, gelu, gelu_tanh, leaky_relu, linear, log_softmax, relu, sigmoid, silu, softmax, softplus, swish, tanh)")
  end)

  it("a GPT: summary, recompute per block gives the same gradients with less held", function()
    local function gpt (wrap, blocks)
      local layers = {nn.Embedding(11, 16), nn.PositionalEmbedding(8)}
      for _, b in ipairs(blocks) do layers[#layers + 1] = wrap(b) end
      layers[#layers + 1] = nn.LayerNorm()
      layers[#layers + 1] = nn.Dense(11)
      return nn.Sequential(layers)
    end
    local blocks = {nn.TransformerBlock(2, 16, {causal = true}), nn.TransformerBlock(2, 16, {causal = true})}
    local plain = gpt(function(b) return b end, blocks)
    local ids = mg.cast(mg.random.uniform({4, 8}, 1, 12) // 1, "int64")
    local targets = mg.cast(mg.random.uniform({4, 8}, 1, 12) // 1, "int64")
    plain(ids)
    local recomputed = gpt(mg.recompute_grad, blocks)
    recomputed.layers[1], recomputed.layers[2] = plain.layers[1], plain.layers[2]
    recomputed.layers[5], recomputed.layers[6] = plain.layers[5], plain.layers[6]
    local vars = plain.trainable_variables
    local function step (model)
      local t = mg.tape()
      local loss = mg.losses.sparse_categorical_crossentropy(targets, model(ids), {from_logits = true})
      t:stop()
      local held = t:saved_bytes()
      return t:gradient(loss, vars), held
    end
    local gp, held_p = step(plain)
    local gr, held_r = step(recomputed)
    for i = 1, #gp do h.assert_close(gr[i], gp[i], 0) end
    assert.is_true(held_r * 2 < held_p)
    local lines = {}
    plain:summary{print_fn = function(l) lines[#lines + 1] = l end}
    assert.truthy(lines[5]:find("^embedding%S* %(Embedding%)%s+%(None, 8, 16%)%s+176$"))
    assert.truthy(lines[9]:find("^transformer_block%S* %(Transfo"), lines[9])
  end)

  it("trains through fit with a masked sequence loss and perplexity", function()
    local model = nn.Sequential{nn.Embedding(6, 8), nn.PositionalEmbedding(5),
                                nn.TransformerBlock(2, 8, {causal = true}), nn.Dense(6)}
    local x = mg.cast(mg.random.uniform({32, 5}, 1, 7) // 1, "int64")
    local y = mg.concat({x:slice(nil, {2, 5}), mg.ones({32, 1}, "int64")}, 2)     -- the next token
    model:compile{optimizer = mg.optim.Adam{learning_rate = 1e-2},
                  loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}, metrics = {"perplexity"}}
    local before = model:evaluate(x, y, {verbose = 0})
    model:fit(x, y, {epochs = 30, batch_size = 8, verbose = 0})
    local after = model:evaluate(x, y, {verbose = 0})
    assert.is_true(after.loss < 0.5 * before.loss)
    assert.is_true(math.abs(after.perplexity - math.exp(after.loss)) < 0.2 * after.perplexity)
  end)
end)

describe("sequence losses", function()
  before_each(function() mg.random.seed(30) end)

  it("sparse crossentropy over (B, T, V) with a mask, and perplexity", function()
    local logits, labels = rnd({2, 3, 4}, -3, 3), mg.constant({{1, 4, 2}, {3, 3, 9}}, "int64")
    local mask = mg.constant({{1, 1, 1}, {1, 1, 0}}, "float64")
    local loss = mg.losses.sparse_categorical_crossentropy(labels, logits, {from_logits = true, mask = mask})
    local lp, sum = mg.log_softmax(logits, -1):totable(), 0
    for b, row in ipairs({{1, 4, 2}, {3, 3}}) do
      for t, c in ipairs(row) do sum = sum - lp[b][t][c] end
    end
    h.assert_close(loss, sum / 5, 1e-12)
    h.assert_close(mg.metrics.perplexity(labels, logits, {from_logits = true, mask = mask}), math.exp(sum / 5), 1e-12)
    check(function(l) return mg.losses.sparse_categorical_crossentropy(labels, l, {from_logits = true, mask = mask}) end,
          logits)
    assert.has_error(function() mg.metrics.perplexity(labels, logits, {from_logit = true}) end)
  end)
end)

describe("examples/char_gpt.lua", function()
  it("trains a tiny GPT and ends with the validation losses", function()
    local out, code = h.run(h.bin .. " examples/char_gpt.lua --tiny")
    assert.equal(0, code, out)
    assert.truthy(out:find("bigram %(counted%): validation loss %d%.%d+"), out)
    assert.truthy(out:find("the tape holds [%d.]+ MiB plain, [%d.]+ MiB recomputed"), out)
    assert.truthy(out:find("20 sampled words: "), out)
    assert.truthy(out:find("\nval loss: %d%.%d%d%d%d %(bigram %d%.%d%d%d%d%)\n$"), out)
  end)
end)

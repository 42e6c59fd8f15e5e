-- Convolution and pooling (NHWC): mg.conv2d, mg.max_pool2d, mg.avg_pool2d
-- and their backward ops against hand-computed values and a direct Lua
-- loop; float32 (oneDNN) against float64 (the C reference); float64
-- gradchecks, second order; exact errors; the layers (Conv2D, MaxPool2D,
-- AvgPool2D, GlobalAveragePooling2D, Flatten, Reshape, BatchNorm on
-- images), summary's table, and a small CNN that learns.
local mg = require "moongrad"
local h = require "helpers"
local nn = mg.nn

local function check (f, ...) assert.is_true(mg.test.gradcheck(f, {...})) end
local function rnd (shape, lo, hi) return mg.random.uniform(shape, lo or -1, hi or 1, "float64") end
local function f32 (x) return mg.cast(x, "float32") end

-- x = 1..16 as a (1,4,4,1) image
local function ramp (dtype) return mg.arange(1, 17, 1, dtype or "float32"):reshape{1, 4, 4, 1} end

-- the (1,H,W,1) image as rows of numbers
local function plane (y)
  local out = {}
  for i, r in ipairs(y:totable()[1]) do
    out[i] = {}
    for j, px in ipairs(r) do out[i][j] = px[1] end
  end
  return out
end

-- conv2d by its definition, in Lua: x (N,H,W,C), w (KH,KW,C,O) as nested
-- tables; o = {sh, sw, dh, dw, top, left, OH, OW}
local function lua_conv (x, w, b, o)
  local sh, sw, dh, dw, top, left, OH, OW = table.unpack(o)
  local H, W, C = #x[1], #x[1][1], #x[1][1][1]
  local KH, KW, O = #w, #w[1], #w[1][1][1]
  local out = {}
  for n = 1, #x do
    out[n] = {}
    for i = 1, OH do
      out[n][i] = {}
      for j = 1, OW do
        local px = {}
        for k = 1, O do
          local s = b and b[k] or 0
          for u = 1, KH do
            for v = 1, KW do
              local r, c = (i - 1) * sh + (u - 1) * dh - top + 1, (j - 1) * sw + (v - 1) * dw - left + 1
              if r >= 1 and r <= H and c >= 1 and c <= W then
                for ch = 1, C do s = s + x[n][r][c][ch] * w[u][v][ch][k] end
              end
            end
          end
          px[k] = s
        end
        out[n][i][j] = px
      end
    end
  end
  return out
end

local grads = h.grads          -- the gradient of sum(f(xs...) * seed) for each of xs

describe("conv2d", function()
  before_each(function() mg.random.seed(21) end)

  it("computes hand-worked examples: valid, strides, same, dilation, bias", function()
    local x, ones2, ones3 = ramp(), mg.ones{2, 2, 1, 1}, mg.ones{3, 3, 1, 1}
    assert.same({{14, 18, 22}, {30, 34, 38}, {46, 50, 54}}, plane(mg.conv2d(x, ones2)))
    assert.same({{14, 22}, {46, 54}}, plane(mg.conv2d(x, ones2, {strides = 2})))
    assert.same({{14, 24, 30, 22}, {33, 54, 63, 45}, {57, 90, 99, 69}, {46, 72, 78, 54}},
                plane(mg.conv2d(x, ones3, {padding = "same"})))
    -- TensorFlow's SAME with stride 2 on 4 pixels pads 0 before, 1 after
    assert.same({{54, 45}, {72, 54}}, plane(mg.conv2d(x, ones3, {padding = "same", strides = 2})))
    assert.same({{24, 28}, {40, 44}}, plane(mg.conv2d(x, ones2, {dilation_rate = 2})))
    assert.same({{15, 23}, {47, 55}}, plane(mg.conv2d(x, ones2, mg.ones{1}, {strides = {2, 2}})))
    -- explicit pads: {{top, bottom}, {left, right}}
    local padded = plane(mg.conv2d(x, ones2, {padding = {{1, 0}, {1, 1}}}))       -- 4x5
    assert.same({{1, 3, 5, 7, 4}, {6, 14, 18, 22, 12}}, {padded[1], padded[2]})
    assert.equal(4, #padded)
    assert.same({1, 3, 3, 6}, mg.conv2d(mg.ones{1, 5, 7, 2}, mg.ones{2, 3, 2, 6}, {strides = {2, 3}, padding = 1})
                                 .shape)
  end)

  it("matches its definition on channels, strides, pads and dilation (float32 and float64)", function()
    local cases = {
      {{2, 5, 6, 3}, {3, 2, 3, 4}, {}, {1, 1, 1, 1, 0, 0, 3, 5}},
      {{1, 6, 5, 2}, {3, 3, 2, 3}, {strides = {2, 1}, padding = "same"}, {2, 1, 1, 1, 0, 1, 3, 5}},   -- 1 row after
      {{2, 7, 7, 1}, {2, 3, 1, 2}, {dilation_rate = {2, 1}, padding = {{1, 2}, {0, 1}}}, {1, 1, 2, 1, 1, 0, 8, 6}},
      {{1, 4, 5, 3}, {1, 1, 3, 5}, {strides = 2}, {2, 2, 1, 1, 0, 0, 2, 3}},
    }
    for _, c in ipairs(cases) do
      local x, w, b = rnd(c[1]), rnd(c[2]), rnd({c[2][4]})
      local want = lua_conv(x:totable(), w:totable(), b:totable(), c[4])
      h.assert_close(mg.conv2d(x, w, b, c[3]), want, 1e-12)
      h.assert_close(mg.conv2d(f32(x), f32(w), f32(b), c[3]), want, 1e-5)
    end
  end)

  it("float32 (oneDNN) agrees with the float64 reference, gradients too", function()
    for _, o in ipairs({{}, {padding = "same"}, {strides = 2, padding = "same"}, {dilation_rate = 2},
                        {strides = {1, 2}, padding = {{2, 0}, {1, 1}}}}) do
      local x, w, b = rnd{3, 9, 8, 5}, rnd{3, 3, 5, 7}, rnd{7}
      local seed = rnd(mg.conv2d(x, w, b, o).shape)
      local f = function(xx, ww, bb) return mg.conv2d(xx, ww, bb, o) end
      h.assert_close(f32(f(x, w, b)), f32(f(f32(x), f32(w), f32(b))), 1e-5)
      local g64 = grads(f, {x, w, b}, seed)
      local g32 = grads(f, {f32(x), f32(w), f32(b)}, f32(seed))
      for i = 1, 3 do h.assert_close(g32[i], f32(g64[i]), 1e-4) end
    end
  end)

  it("float32 and bfloat16 1x1 filters with strides: oneDNN's few-channel bug is avoided (oneDNN#6035)", function()
    -- oneDNN's strided 1x1 weight gradient wrote past its workspace for
    -- fewer input channels than its block (wrong, run to run different dw)
    for _, c in ipairs{1, 3, 8, 12, 16, 24} do
      for _, o in ipairs{{strides = 2}, {strides = {1, 2}, padding = "same"}, {strides = {3, 1}}} do
        local x, w = rnd{4, 5, 8, c}, rnd{1, 1, c, 8}
        local seed = rnd(mg.conv2d(x, w, nil, o).shape)
        local f = function(xx, ww) return mg.conv2d(xx, ww, nil, o) end
        local g64 = grads(f, {x, w}, seed)
        for _ = 1, 3 do
          local g32 = grads(f, {f32(x), f32(w)}, f32(seed))
          for i = 1, 2 do h.assert_close(g32[i], f32(g64[i]), 1e-4) end
        end
        local g16 = grads(f, {mg.cast(x, "bfloat16"), mg.cast(w, "bfloat16")}, mg.cast(seed, "bfloat16"))
        h.assert_close(mg.cast(g16[2], "float32"), f32(g64[2]), 0.1)
      end
    end
  end)

  it("gradchecks in float64: input, filters and bias under every geometry", function()
    for _, o in ipairs({{}, {padding = "same"}, {strides = 2}, {strides = {2, 1}, padding = "same"},
                        {dilation_rate = 2}, {dilation_rate = {1, 2}, padding = "same"},
                        {padding = {{1, 2}, {0, 1}}, strides = {1, 2}}}) do
      check(function(x, w, b) return mg.conv2d(x, w, b, o) end, rnd{2, 5, 6, 3}, rnd{3, 2, 3, 2}, rnd{2})
    end
    check(function(x, w) return mg.conv2d(x, w) end, rnd{1, 4, 4, 2}, rnd{1, 1, 2, 3})     -- no bias, 1x1
  end)

  it("its backward ops are public, equal the tape's gradients and gradcheck", function()
    local o = {strides = 2, padding = "same"}
    local x, w = rnd{2, 7, 6, 3}, rnd{3, 3, 3, 4}
    local dy = rnd(mg.conv2d(x, w, o).shape)
    local g = grads(function(a, b) return mg.conv2d(a, b, o) end, {x, w}, dy)
    h.assert_close(mg.conv2d_backward_input(dy, w, x.shape, o), g[1], 1e-12)
    h.assert_close(mg.conv2d_backward_filter(x, dy, w.shape, o), g[2], 1e-12)
    check(function(d, ww) return mg.conv2d_backward_input(d, ww, x.shape, o) end, dy, w)
    check(function(xx, d) return mg.conv2d_backward_filter(xx, d, w.shape, o) end, x, dy)
  end)

  it("applies an activation in the same op: the separate ops' numbers, to the bit, and their gradients", function()
    local function same_bits (a, b) assert.are.equal(0, mg.sum(mg.cast(mg.not_equal(a, b), "int64")):item()) end
    for _, dt in ipairs{"float32", "float64"} do
      for _, act in ipairs{"relu", "tanh", "sigmoid"} do
        for _, o in ipairs({{padding = "same"}, {strides = 2}, {dilation_rate = 2, padding = {{1, 0}, {2, 1}}}}) do
          local x, w, b = mg.cast(rnd{3, 9, 8, 5}, dt), mg.cast(rnd{3, 3, 5, 7}, dt), mg.cast(rnd{7}, dt)
          local fo = {activation = act}
          for k, v in pairs(o) do fo[k] = v end
          local fused = function(xx, ww, bb) return mg.conv2d(xx, ww, bb, fo) end
          local apart = function(xx, ww, bb) return mg[act](mg.conv2d(xx, ww, bb, o)) end
          same_bits(fused(x, w, b), apart(x, w, b))
          local seed = mg.cast(rnd(fused(x, w, b).shape), dt)
          local g1, g2 = grads(fused, {x, w, b}, seed), grads(apart, {x, w, b}, seed)
          for i = 1, 3 do same_bits(g1[i], g2[i]) end
          if dt == "float64" then check(fused, rnd{2, 5, 6, 3}, rnd{3, 2, 3, 7}, rnd{7}) end
        end
      end
    end
    same_bits(mg.conv2d(ramp(), mg.ones{2, 2, 1, 1}, {activation = "linear"}), mg.conv2d(ramp(), mg.ones{2, 2, 1, 1}))
  end)

  it("its activation differentiates twice, and Conv2D runs it in the convolution's op", function()
    for _, act in ipairs{"relu", "tanh", "sigmoid"} do
      local w0 = rnd{2, 3, 2, 3}
      check(function(x, w)
        local t = mg.tape()
        t:watch({x, w})
        local y = mg.sum(mg.conv2d(x, w, {padding = "same", activation = act}) * 0.5)
        t:stop()
        local g = t:gradient(y, {x, w})
        return mg.sum(g[1] ^ 2) + mg.sum(g[2] * w0)
      end, rnd{2, 4, 5, 2}, rnd{2, 3, 2, 3})
    end
    local layer = nn.Conv2D(4, 3, {padding = "same", activation = "relu"})
    local x = mg.random.normal{2, 6, 6, 3}
    layer(x)
    local t = mg.tape()
    local y = layer(x)
    t:stop()
    assert.truthy(tostring(t):find("1 ops", 1, true), tostring(t))             -- one node, not two
    h.assert_close(y, mg.relu(mg.conv2d(x, layer.kernel, layer.bias, {padding = "same"})), 0)
  end)

  it("has second derivatives (its gradient differentiates again)", function()
    local o = {padding = "same", strides = {1, 2}}
    local w0 = rnd{2, 3, 2, 3}
    check(function(x, w)                  -- d/d(x, w) of the gradient of sum(tanh(conv) * seed)
      local t = mg.tape()
      t:watch({x, w})
      local y = mg.sum(mg.tanh(mg.conv2d(x, w, o)) * 0.5)
      t:stop()
      local g = t:gradient(y, {x, w})
      return mg.sum(g[1] ^ 2) + mg.sum(g[2] * w0)
    end, rnd{2, 4, 5, 2}, rnd{2, 3, 2, 3})
  end)

  it("takes views (any strides), empty batches, no input channels", function()
    local nchw = rnd{2, 3, 5, 6}                                   -- an NCHW tensor seen as NHWC
    local x, w, b = mg.transpose(nchw, {1, 3, 4, 2}), rnd{3, 3, 3, 2}, rnd{2}
    assert.same({2, 5, 6, 3}, x.shape)
    h.assert_close(mg.conv2d(x, w, b), mg.conv2d(x:reshape{-1}:reshape{2, 5, 6, 3}, w, b), 1e-12)
    h.assert_close(mg.conv2d(f32(x), f32(w), f32(b)), f32(mg.conv2d(x, w, b)), 1e-5)
    assert.same({0, 3, 4, 2}, mg.conv2d(mg.zeros({0, 5, 6, 3}, "float64"), w, b).shape)
    local bias = mg.constant({1, 2})
    assert.same({{1, 2}}, mg.conv2d(mg.zeros{1, 3, 3, 0}, mg.zeros{3, 3, 0, 2}, bias):reshape{1, 2}:totable())
    assert.same({1, 2, 2, 0}, mg.max_pool2d(mg.zeros{1, 4, 4, 0}).shape)
    local g = grads(function(v, ww) return mg.conv2d(v, ww) end, {mg.zeros({0, 5, 6, 3}, "float64"), w}, 1)
    assert.same({0, 5, 6, 3}, g[1].shape)
    h.assert_close(g[2], mg.zeros({3, 3, 3, 2}, "float64"), 0)
  end)

  it("a save policy of recompute_grad sees conv2d as a dot ('dots' keeps it)", function()
    local x, w = rnd{1, 5, 5, 2}, mg.Variable(rnd{3, 3, 2, 2})
    local seen = {}
    local f = function(v) return mg.relu(mg.conv2d(v, w, {padding = "same"})) end
    local g = mg.recompute_grad(f, {policy = function(op) seen[op] = true; return op == "conv2d" end})
    local plain = grads(f, {x, w}, 1)
    local kept = grads(g, {x, w}, 1)
    assert.is_true(seen.conv2d)
    h.assert_close(kept[1], plain[1], 0)
    h.assert_close(kept[2], plain[2], 0)
    local dots = grads(mg.recompute_grad(f, {policy = "dots"}), {x, w}, 1)
    h.assert_close(dots[2], plain[2], 0)
  end)

  it("names the mismatch in its errors", function()
    local x, w = mg.ones{1, 5, 5, 3}, mg.ones{3, 3, 4, 2}
    assert.has_error(function() mg.conv2d(x, w) end, "conv2d: input has 3 channels, the filters expect 4")
    assert.has_error(function() mg.conv2d(mg.ones{5, 5, 3}, w) end,
                     "conv2d: input must have 4 dimensions (N,H,W,C), got shape (5,5,3)")
    assert.has_error(function() mg.conv2d(x, mg.ones{3, 3, 3}) end,
                     "conv2d: filters must have 4 dimensions (KH,KW,Cin,Cout), got shape (3,3,3)")
    assert.has_error(function() mg.conv2d(x, mg.ones({3, 3, 3, 2}, "float64")) end,
                     "conv2d: dtypes differ: input is float32, filters is float64")
    assert.has_error(function() mg.conv2d(x, mg.ones{3, 3, 3, 2}, mg.ones{3}) end,
                     "conv2d: bias has shape (3), the filters have 2 output channels (expected (2))")
    assert.has_error(function() mg.conv2d(mg.ones({1, 5, 5, 3}, "int64"), mg.ones({3, 3, 3, 2}, "int64")) end,
                     "conv2d: input must be float32, bfloat16, float16 or float64, got int64")
    assert.has_error(function() mg.conv2d(x, mg.ones{6, 3, 3, 2}) end,
                     "conv2d: the window's height (6, dilated: 6) is larger than the padded input's (5)")
    assert.has_error(function() mg.conv2d(x, mg.ones{3, 3, 3, 2}, {dilation_rate = 3}) end,
                     "conv2d: the window's height (3, dilated: 7) is larger than the padded input's (5)")
    assert.has_error(function() mg.conv2d(x, mg.ones{3, 3, 3, 2}, {strides = 0}) end,
                     "bad argument #3 to 'conv2d' (option 'strides' must be 1 to 2^30, got 0)")
    assert.has_error(function() mg.conv2d(x, mg.ones{3, 3, 3, 2}, {padding = "full"}) end,
                     "bad argument #3 to 'conv2d' (option 'padding' must be 'valid', 'same', an integer, "
                     .. "{height, width} or {{top, bottom}, {left, right}}, got 'full')")
    assert.has_error(function() mg.conv2d(x, mg.ones{3, 3, 3, 2}, {stride = 2}) end,
                     "bad argument #3 to 'conv2d' (unknown option 'stride' (did you mean 'strides'?); known: strides, "
                     .. "padding, dilation_rate, activation)")
    assert.has_error(function() mg.conv2d(x, mg.ones{3, 3, 3, 2}, {activation = "swish"}) end,
                     "conv2d: unknown activation 'swish' (linear, relu, tanh or sigmoid)")
    assert.has_error(function() mg.conv2d(x, mg.ones{3, 3, 3, 2}, {activation = mg.relu}) end,
                     "bad argument #3 to 'conv2d' (option 'activation' must be a string (linear, relu, tanh or "
                     .. "sigmoid), got function)")
    assert.has_error(function() mg.conv2d_backward_input(mg.ones{1, 3, 3, 2}, mg.ones{3, 3, 3, 2}, {1, 5, 5, 3},
                                                         {activation = "relu"}) end,
                     "bad argument #4 to 'conv2d_backward_input' (unknown option 'activation'; known: strides, "
                     .. "padding, dilation_rate)")
    assert.has_error(function() mg.conv2d_backward_input(mg.ones{1, 3, 3, 2}, mg.ones{3, 3, 3, 2}, {1, 6, 6, 3}) end,
                     "conv2d_backward_input: dy has shape (1,3,3,2), the convolution of input_shape (1,6,6,3) "
                     .. "gives (1,4,4,2)")
    assert.has_error(function() mg.conv2d_backward_filter(x, mg.ones{1, 3, 3, 2}, {3, 3}) end,
                     "bad argument #3 to 'conv2d_backward_filter' (filter_shape must have 4 sizes, got 2)")
  end)
end)

describe("pooling", function()
  before_each(function() mg.random.seed(22) end)

  it("max and mean of windows, by hand; the mean leaves padding out (TensorFlow's SAME)", function()
    local x = ramp()
    assert.same({{6, 8}, {14, 16}}, plane(mg.max_pool2d(x)))
    assert.same({{3.5, 5.5}, {11.5, 13.5}}, plane(x:avg_pool2d{pool_size = 2}))
    assert.same({{11, 12}, {15, 16}}, plane(mg.max_pool2d(x, {pool_size = 3, strides = 2, padding = "same"})))
    assert.same({{6, 7.5}, {12, 13.5}}, plane(mg.avg_pool2d(x, {pool_size = 3, strides = 2, padding = "same"})))
    assert.same({{3.5, 4.5, 5.5, 6}, {7.5, 8.5, 9.5, 10}, {11.5, 12.5, 13.5, 14}, {13.5, 14.5, 15.5, 16}},
                plane(mg.avg_pool2d(x, {pool_size = 2, strides = 1, padding = "same"})))
    assert.same({1, 2, 1, 3}, mg.max_pool2d(mg.ones{1, 5, 4, 3}, {pool_size = {2, 3}}).shape)
  end)

  it("float32 (oneDNN) agrees with the float64 reference, gradients too", function()
    for _, o in ipairs({{}, {pool_size = 3, strides = 2, padding = "same"}, {pool_size = {2, 3}, strides = 1},
                        {pool_size = 3, strides = {1, 2}}}) do
      for _, f in ipairs({mg.max_pool2d, mg.avg_pool2d}) do
        local x = rnd{2, 7, 8, 5}
        local seed = rnd(f(x, o).shape)
        local g = function(v) return f(v, o) end
        h.assert_close(f32(g(x)), g(f32(x)), 1e-6)
        h.assert_close(grads(g, {f32(x)}, f32(seed))[1], f32(grads(g, {x}, seed)[1]), 1e-5)
      end
    end
  end)

  it("max pools bfloat16 as it is: float32's maxima and gradients, rounded, to the bit (ties and NaN too)", function()
    local function same_bits (a, b)
      assert.are.equal(a.dtype, b.dtype)
      assert.are.same(a.shape, b.shape)
      assert.are.equal(0, mg.sum(mg.cast(mg.not_equal(mg.cast(a, "float32"), mg.cast(b, "float32")), "int64")):item())
    end
    local bf = function(v) return mg.cast(v, "bfloat16") end
    for _, o in ipairs({{}, {pool_size = 3, strides = 2, padding = "same"}, {pool_size = {2, 3}, strides = 1},
                        {pool_size = 2, padding = "same"}, {pool_size = 3, strides = {1, 2}}}) do
      local x = bf(mg.floor(mg.random.normal{2, 7, 9, 5} * 2) / 2)       -- many ties
      local x32 = mg.cast(x, "float32")
      local y = mg.max_pool2d(x, o)
      assert.are.equal("bfloat16", y.dtype)
      same_bits(y, bf(mg.max_pool2d(x32, o)))
      local dy = bf(mg.random.normal(y.shape))
      same_bits(mg.max_pool2d_backward(x, dy, o), bf(mg.max_pool2d_backward(x32, mg.cast(dy, "float32"), o)))
      local g = grads(function(v) return mg.max_pool2d(v, o) end, {x}, dy)[1]
      same_bits(g, bf(mg.max_pool2d_backward(x32, mg.cast(dy, "float32"), o)))
    end
    local nan = bf(mg.tensor{{{{1}, {0 / 0}}, {{2}, {3}}}})
    assert.are.equal(mg.max_pool2d(mg.cast(nan, "float32")):item() ~= mg.max_pool2d(mg.cast(nan, "float32")):item(),
                     mg.max_pool2d(nan):item() ~= mg.max_pool2d(nan):item())
  end)

  it("a NaN in a window is its maximum wherever it sits, and takes the gradient (the last NaN: PyTorch's)", function()
    local nan = 0 / 0
    for _, dt in ipairs{"float32", "float64", "bfloat16"} do
      local function t (v) return mg.cast(mg.tensor(v, "float64"), dt) end
      for _, case in ipairs{
        {{1, nan, 2, 3}, {0, 1, 0, 0}}, {{nan, 1, 2, 3}, {1, 0, 0, 0}}, {{1, 2, 3, nan}, {0, 0, 0, 1}},
        {{nan, 1, nan, 3}, {0, 0, 1, 0}}, {{1, 2, 4, 3}, {0, 0, 1, 0}},
      } do
        local x = mg.reshape(t(case[1]), {1, 2, 2, 1})
        local y = mg.max_pool2d(x)
        local want_nan = case[2] ~= nil and (case[1][1] ~= case[1][1] or case[1][2] ~= case[1][2] or
                                             case[1][3] ~= case[1][3] or case[1][4] ~= case[1][4])
        local v = mg.cast(y, "float64"):item()
        assert.are.equal(want_nan, v ~= v, dt)
        local g = grads(function(u) return mg.max_pool2d(u) end, {x}, mg.ones_like(y))[1]
        assert.same(case[2], mg.cast(mg.reshape(g, {4}), "float64"):totable(), dt)
      end
      -- overlapping windows and SAME padding: the other backward loop and its argmax
      local x = mg.reshape(t{1, 2, 3, 4, nan, 6, 7, 8, 9}, {1, 3, 3, 1})
      local o = {pool_size = 2, strides = 1, padding = "same"}
      local y = mg.cast(mg.max_pool2d(x, o), "float64"):totable()
      assert.is_true(y[1][1][1][1] ~= y[1][1][1][1] and y[1][2][2][1] ~= y[1][2][2][1])   -- windows holding x[2][2]
      assert.are.equal(6, y[1][1][3][1])
      assert.are.equal(9, y[1][2][3][1])
      local g = mg.cast(grads(function(u) return mg.max_pool2d(u, o) end, {x}, mg.ones_like(mg.max_pool2d(x, o)))[1],
                        "float64")
      assert.same({0, 0, 0, 0, 4, 1, 0, 1, 3}, mg.reshape(g, {9}):totable(), dt)
    end
  end)

  it("gradchecks in float64 (random values: no ties) and second order", function()
    for _, o in ipairs({{}, {pool_size = 3, strides = 2, padding = "same"}, {pool_size = {2, 3}, strides = 1}}) do
      check(function(x) return mg.max_pool2d(x, o) end, rnd{2, 5, 6, 3})
      check(function(x) return mg.avg_pool2d(x, o) end, rnd{2, 5, 6, 3})
      local x = rnd{2, 5, 6, 3}
      local dy = rnd(mg.max_pool2d(x, o).shape)
      check(function(d) return mg.max_pool2d_backward(x, d, o) end, dy)
      check(function(d) return mg.avg_pool2d_backward(d, x.shape, o) end, dy)
      for _, f in ipairs({mg.max_pool2d, mg.avg_pool2d}) do      -- d/dw of the gradient of sum(f(v) * w)
        check(function(w)
          local t = mg.tape()
          t:watch(x)
          local y = mg.sum(f(x, o) * w)
          t:stop()
          return t:gradient(y, x) * x
        end, dy)
      end
    end
  end)

  -- max_pool2d's gradient by its definition, in Lua, for TensorFlow's SAME
  -- padding: each dy to its window's first maximum, the window clipped
  local function lua_max_pool_bwd (x, dy, kh, kw, sh, sw)
    local H, W = #x[1], #x[1][1]
    local OH, OW = #dy[1], #dy[1][1]
    local pt = math.max((OH - 1) * sh + kh - H, 0) // 2
    local pl = math.max((OW - 1) * sw + kw - W, 0) // 2
    local dx = {}
    for n = 1, #x do
      dx[n] = {}
      for i = 1, H do
        dx[n][i] = {}
        for j = 1, W do
          dx[n][i][j] = {}
          for c = 1, #x[1][1][1] do dx[n][i][j][c] = 0 end
        end
      end
      for i = 1, OH do
        for j = 1, OW do
          for c = 1, #x[1][1][1] do
            local bi, bj
            for u = 1, kh do
              for v = 1, kw do
                local r, q = (i - 1) * sh + u - pt, (j - 1) * sw + v - pl
                if r >= 1 and r <= H and q >= 1 and q <= W and (not bi or x[n][r][q][c] > x[n][bi][bj][c]) then
                  bi, bj = r, q
                end
              end
            end
            dx[n][bi][bj][c] = dx[n][bi][bj][c] + dy[n][i][j][c]
          end
        end
      end
    end
    return dx
  end

  it("stride = window with SAME padding that overhangs the image: dx stays inside (issue 27)", function()
    -- pt = pl = 0 with pb or pr > 0: the windows tile the image but the last
    -- ones hang over its bottom and right; the tiled loop wrote their clipped taps past dx
    for _, case in ipairs({{{2, 1, 2, 2}, {2, 1}}, {{1, 1, 2, 2}, {2, 1}}, {{2, 5, 7, 3}, {2, 2}},
                           {{1, 5, 8, 2}, {3, 3}}, {{1, 1, 1, 4}, {5, 5}}, {{2, 3, 4, 1}, {1, 3}},
                           {{1, 6, 5, 2}, {2, 2}}}) do
      local o = {pool_size = case[2], padding = "same"}
      for _, dt in ipairs({"float64", "float32"}) do
        local x = mg.cast(rnd(case[1]), dt)
        local dy = mg.cast(rnd(mg.max_pool2d(x, o).shape), dt)
        local want = lua_max_pool_bwd(x:totable(), dy:totable(), case[2][1], case[2][2], case[2][1], case[2][2])
        for _ = 1, 3 do h.assert_close(mg.max_pool2d_backward(x, dy, o), want, 1e-6) end
        h.assert_close(grads(function(v) return mg.max_pool2d(v, o) end, {x}, dy)[1], want, 1e-6)
      end
      check(function(v) return mg.max_pool2d(v, o) end, rnd(case[1]))
    end
  end)

  it("2x2 windows of stride 2 (their own vectorised loops): the first maximum, any channel count, odd sizes", function()
    -- ties everywhere (values from a few integers), an uncovered last row and
    -- column (odd H and W), channel counts around the vector widths
    for _, dt in ipairs({"float64", "float32", "bfloat16"}) do
      for _, shape in ipairs({{2, 5, 7, 1}, {1, 4, 4, 3}, {2, 7, 5, 17}, {1, 3, 9, 40}, {3, 6, 6, 64}}) do
        local x = mg.cast(mg.floor(mg.random.uniform(shape, 0, 3)), dt)
        local dy = mg.cast(mg.round(rnd{shape[1], shape[2] // 2, shape[3] // 2, shape[4]} * 8), dt)
        local want = lua_max_pool_bwd(mg.cast(x, "float64"):totable(), mg.cast(dy, "float64"):totable(), 2, 2, 2, 2)
        local got = mg.cast(mg.max_pool2d_backward(x, dy), "float64")
        assert.same(want, got:totable(), dt)
        local g = grads(function(v) return mg.max_pool2d(v) end, {x}, dy)[1]
        assert.same(want, mg.cast(g, "float64"):totable(), dt)
        local y = mg.cast(mg.max_pool2d(x), "float64"):totable()
        local xs = mg.cast(x, "float64"):totable()
        for n = 1, shape[1] do
          for i = 1, shape[2] // 2 do
            for j = 1, shape[3] // 2 do
              for c = 1, shape[4] do
                local m = math.max(xs[n][2 * i - 1][2 * j - 1][c], xs[n][2 * i - 1][2 * j][c],
                                   xs[n][2 * i][2 * j - 1][c], xs[n][2 * i][2 * j][c])
                assert.are.equal(m, y[n][i][j][c])
              end
            end
          end
        end
      end
    end
  end)

  it("max_pool2d_backward sends each dy to its window's maximum", function()
    local x = mg.constant({{1, 5}, {3, 2}}):reshape{1, 2, 2, 1}
    assert.same({{0, 7}, {0, 0}}, plane(mg.max_pool2d_backward(x, mg.full({1, 1, 1, 1}, 7))))
    assert.same({{1, 1}, {1, 1}}, plane(mg.avg_pool2d_backward(mg.full({1, 1, 1, 1}, 4), {1, 2, 2, 1})))
  end)

  it("names the mismatch in its errors", function()
    assert.has_error(function() mg.max_pool2d(mg.ones{4, 4, 1}) end,
                     "max_pool2d: input must have 4 dimensions (N,H,W,C), got shape (4,4,1)")
    assert.has_error(function() mg.avg_pool2d(mg.ones{1, 1, 4, 1}) end,
                     "avg_pool2d: the window's height (2, dilated: 2) is larger than the padded input's (1)")
    assert.has_error(function() mg.max_pool2d(mg.ones{1, 4, 4, 1}, {padding = 1}) end,
                     "bad argument #2 to 'max_pool2d' (option 'padding' must be 'valid' or 'same', got number)")
    assert.has_error(function() mg.max_pool2d(mg.ones{1, 4, 4, 1}, {pool_size = {2, 0}}) end,
                     "bad argument #2 to 'max_pool2d' (option 'pool_size' must be 1 to 2^30, got 0)")
    assert.has_error(function() mg.max_pool2d_backward(mg.ones{1, 4, 4, 1}, mg.ones{1, 3, 3, 1}) end,
                     "max_pool2d_backward: dy has shape (1,3,3,1), the convolution of the input (1,4,4,1) gives "
                     .. "(1,2,2,1)")
  end)
end)

describe("image layers", function()
  before_each(function() mg.random.seed(23) end)

  it("Conv2D builds lazily: glorot-uniform kernel with Keras' fans, zero bias", function()
    local c = nn.Conv2D(8, 3, {padding = "same", activation = "relu"})
    assert.same({}, c.variables)
    local y = c(mg.random.normal{2, 6, 6, 2})
    assert.same({2, 6, 6, 8}, y.shape)
    assert.same({3, 3, 2, 8}, c.kernel.shape)
    assert.same({8}, c.bias.shape)
    assert.equal(2, #c.trainable_variables)
    local limit = math.sqrt(6 / (9 * 2 + 9 * 8))
    assert.is_true(mg.max(mg.abs(c.kernel)):item() <= limit)
    assert.is_true(mg.max(mg.abs(c.kernel)):item() > limit * 0.8)
    assert.is_true(mg.min(y):item() >= 0)
    assert.equal("float64", nn.Conv2D(2, {1, 2}, {use_bias = false})(mg.ones({1, 3, 3, 1}, "float64")).dtype)
    local k = nn.Conv2D(1, 2, {kernel_initializer = "zeros", strides = 2})
    assert.same({1, 2, 2, 1}, k(mg.ones{1, 4, 5, 3}).shape)
    assert.same(0, mg.max(mg.abs(k.kernel)):item())
  end)

  it("Conv2D checks its arguments and inputs", function()
    assert.has_error(function() nn.Conv2D(0, 3) end, "Conv2D: filters must be a positive integer, got 0")
    assert.has_error(function() nn.Conv2D(2, {3, 0}) end,
                     "Conv2D: kernel_size must be a positive integer or a pair {height, width} of them, got a table")
    assert.has_error(function() nn.Conv2D(2, 3, {padding = "full"}) end,
                     "Conv2D: option 'padding' must be 'valid' or 'same', got 'full'")
    assert.has_error(function() nn.Conv2D(2, 3, {kernel_initializer = "ones"}) end,
                     "Conv2D: unknown kernel_initializer 'ones' (known: glorot_uniform, he_uniform, zeros)")
    local c = nn.Conv2D(2, 3)
    assert.has_error(function() c(mg.ones{5, 5, 1}) end,
                     "Conv2D: input must have 4 dimensions (batch, height, width, channels), got shape (5,5,1)")
    c(mg.ones{1, 5, 5, 1})
    assert.has_error(function() c(mg.ones{1, 5, 5, 3}) end, "Conv2D: input has 3 channels, the layer was built for 1")
  end)

  it("pools, global average pooling, Flatten and Reshape have no variables and the right shapes", function()
    local x = mg.random.normal{2, 6, 6, 3}
    for _, l in ipairs({nn.MaxPool2D(), nn.AvgPool2D(3, {strides = 1, padding = "same"}), nn.MaxPool2D{pool_size = {3, 2}},
                        nn.GlobalAveragePooling2D(), nn.Flatten(), nn.Reshape({3, -1})}) do
      l(x)
      assert.same({}, l.variables)
    end
    assert.same({2, 3, 3, 3}, nn.MaxPool2D()(x).shape)
    assert.same({2, 6, 6, 3}, nn.AvgPool2D(3, {strides = 1, padding = "same"})(x).shape)
    assert.same({2, 2, 3, 3}, nn.MaxPool2D{pool_size = {3, 2}}(x).shape)
    h.assert_close(nn.GlobalAveragePooling2D()(x), mg.mean(mg.mean(x, 2), 2), 1e-6)
    assert.same({2, 1, 1, 3}, nn.GlobalAveragePooling2D{keepdims = true}(x).shape)
    assert.same({2, 108}, nn.Flatten()(x).shape)
    assert.same({2, 3, 36}, nn.Reshape({3, -1})(x).shape)
    assert.same({2, 12, 9}, nn.Reshape({12, 9})(x).shape)
    assert.has_error(function() nn.Reshape({5, 5})(x) end,
                     "Reshape: cannot reshape (2,6,6,3) into (None,5,5): 108 values per sample, the target holds 25")
    assert.has_error(function() nn.Reshape({5, -1})(x) end,
                     "Reshape: cannot reshape (2,6,6,3) into (None,5,-1): 108 values per sample, the target holds "
                     .. "a multiple of 5")
    assert.has_error(function() nn.MaxPool2D(2, {pool_size = 2}) end,
                     "MaxPool2D: pool_size given twice (argument 1 and option 'pool_size')")
  end)

  it("BatchNorm normalizes images per channel (over batch, height and width)", function()
    local bn = nn.BatchNorm{momentum = 0}
    local x = mg.random.normal{4, 3, 3, 2} * mg.constant({1, 10}) + mg.constant({0, 5})
    local y = bn(x)
    h.assert_close(mg.mean(y, {1, 2, 3}), {0, 0}, 1e-5)
    h.assert_close(mg.mean(y ^ 2, {1, 2, 3}), {1, 1}, 1e-2)
    assert.same({2}, bn.gamma.shape)
    h.assert_close(bn.moving_mean, mg.mean(x, {1, 2, 3}), 1e-6)
  end)

  it("summary prints Keras' table: names, types, output shapes, parameters, totals", function()
    local m = nn.Sequential({nn.Conv2D(4, 3, {name = "conv"}), nn.MaxPool2D(2, {name = "pool"}),
                             nn.BatchNorm{name = "norm"}, nn.Flatten{name = "flat"}, nn.Dense(3, {name = "out"})},
                            {name = "tiny"})
    assert.has_error(function() m:summary() end,
                     "summary: 'tiny' has not run yet, so its output shapes are unknown; call it on a batch first, "
                     .. "or give the input shape without the batch axis: model:summary{input_shape = {28, 28, 1}}")
    local lines = {}
    local text = m:summary{input_shape = {8, 8, 1}, print_fn = function(l) lines[#lines + 1] = l end}
    assert.equal(table.concat(lines, "\n") .. "\n", text)
    assert.equal([[
Model: "tiny"
_________________________________________________________________
Layer (type)                 Output Shape              Param #
=================================================================
conv (Conv2D)                (None, 6, 6, 4)           40
_________________________________________________________________
pool (MaxPool2D)             (None, 3, 3, 4)           0
_________________________________________________________________
norm (BatchNorm)             (None, 3, 3, 4)           16
_________________________________________________________________
flat (Flatten)               (None, 36)                0
_________________________________________________________________
out (Dense)                  (None, 3)                 111
=================================================================
Total params: 167
Trainable params: 159
Non-trainable params: 8
_________________________________________________________________
]], text)
    assert.same({0, 0, 0, 0}, m.layers[3].moving_mean:totable())     -- the build pass ran with training off
  end)

  it("every failing allocation in a CNN step (float32 and float64) is a Lua error, and nothing leaks", function()
    for _, dtype in ipairs({"float32", "float64"}) do
      mg.random.seed(5)
      local model = nn.Sequential{nn.Conv2D(3, 3, {activation = "relu", padding = "same"}), nn.MaxPool2D(2),
                                  nn.Conv2D(2, 2, {strides = 2}), nn.AvgPool2D(1), nn.Flatten(), nn.Dense(2)}
      local x = mg.random.normal({2, 8, 8, 2}, 0, 1, dtype)
      model(x)
      local function step ()
        local t = mg.tape()
        local loss = mg.sum(model(x) ^ 2)
        t:stop()
        local g = t:gradient(loss, model.trainable_variables)
        return loss:item(), #g
      end
      local failures, base, after, expected = h.oom_sweep(step, 10000)
      assert.is_true(failures > 20, "only " .. failures .. " allocations were tried")
      assert.equal(base.current_bytes, after.current_bytes)
      assert.equal(base.live_tensors, after.live_tensors)
      assert.equal(expected, step())
    end
  end)

  it("a small CNN learns a toy task (the loss goes down)", function()
    -- label 1 when the bright square is in the left half, 2 in the right
    local n, xs, labels = 32, {}, {}
    for i = 1, n do
      local img, left = {}, i % 2 == 1
      local r0, c0 = (i * 7) % 5 + 1, left and (i % 2) + 1 or (i % 2) + 5
      for r = 1, 8 do
        img[r] = {}
        for c = 1, 8 do
          local on = r >= r0 and r < r0 + 3 and c >= c0 and c < c0 + 3
          img[r][c] = {on and 1 or 0}
        end
      end
      xs[i], labels[i] = img, left and 1 or 2
    end
    local x, y = mg.constant(xs), mg.constant(labels, "int64")
    local model = nn.Sequential{nn.Conv2D(4, 3, {activation = "relu", padding = "same"}), nn.MaxPool2D(2),
                                nn.Conv2D(4, 3, {activation = "relu"}), nn.GlobalAveragePooling2D(), nn.Dense(2)}
    local first, last
    for step = 1, 30 do
      local t = mg.tape()
      local loss = nn.softmax_cross_entropy(model(x), y)
      t:stop()
      local g = t:gradient(loss, model.trainable_variables)
      for i, v in ipairs(model.trainable_variables) do v:assign_sub(g[i], 0.5) end
      first, last = first or loss:item(), loss:item()
    end
    assert.is_true(last < 0.7 * first, ("loss %g -> %g"):format(first, last))
  end)
end)

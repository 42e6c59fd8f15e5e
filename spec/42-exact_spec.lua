-- Exact gradients through the memory-saving transforms (issue 27): tensors a
-- recomputed function or a loop's step closes over, aliases, custom
-- gradients inside recompute, higher orders. Each case runs one program
-- plainly and through the transform and compares the gradients (float64).
local mg = require "moongrad"
local h = require "helpers"

local c = mg.constant
local TOL = 1e-12

-- run(wrap) returns a list of gradients; the wrapped and the plain run must
-- agree entry by entry. The plain run must give every entry, except those
-- listed in nils (indices of unconnected gradients), which must be nil in
-- both: nil for nil would otherwise pass having compared nothing.
local function agree (run, wrap, nils)
  local state = mg.random.get_state()
  local function flat (...)
    local out = {n = 0}
    local function add (v)
      if type(v) == "table" and not mg.is_tensor(v) then
        for i = 1, #v do add(v[i]) end
      else
        out.n = out.n + 1
        out[out.n] = v
      end
    end
    for i = 1, select("#", ...) do add((select(i, ...))) end
    return out
  end
  local with = flat(run(wrap or mg.recompute_grad))
  mg.random.set_state(state)
  local without = flat(run(function(f) return f end))
  assert.equal(without.n, with.n)
  local unconnected = {}
  for _, i in ipairs(nils or {}) do unconnected[i] = true end
  local some = 0
  for i = 1, without.n do
    if unconnected[i] then
      assert.is_nil(without[i], "entry " .. i .. " of the plain run should be nil")
    else
      assert.is_not_nil(without[i], "entry " .. i .. " of the plain run is nil")
    end
    if without[i] == nil then
      assert.is_nil(with[i], "entry " .. i .. " should be nil")
    else
      assert.is_not_nil(with[i], "entry " .. i .. " is nil")
      h.assert_close(with[i], without[i], TOL)
      some = some + 1
    end
  end
  assert.is_true(some > 0)
  return with
end

describe("recompute_grad: tensors the function closes over", function()
  it("gets the gradient through a closed-over tensor computed from the source", function()
    agree(function(wrap)
      local x = c({1.5, -2.0, 0.25}, "float64")
      local t = mg.tape()
      t:watch(x)
      local k = x * 2                               -- outside the function
      local f = wrap(function(a) return mg.sin(a * k) end)
      local y = mg.sum(f(mg.exp(x)))
      t:stop()
      return t:gradient(y, x)
    end)
  end)

  it("the issue's case: x reaches the block only through the closure", function()
    local g = agree(function(wrap)
      local x = mg.Variable(c({0.7, -1.3}, "float64"))
      local t = mg.tape()
      local k = x * 2
      local f = wrap(function(a) return a * k end)
      local y = mg.sum(f(c({3, 4}, "float64")))
      t:stop()
      return t:gradient(y, x)
    end)
    assert.same({6, 8}, g[1]:totable())
  end)

  it("a watched constant closed over, a variable's derived tensor, and the argument aliasing the closure", function()
    agree(function(wrap)
      local v = mg.Variable(c({{0.5, -0.25}, {1.0, 2.0}}, "float64"))
      local k = c({0.3, 0.9}, "float64")
      local t = mg.tape()
      t:watch(k)
      local vk = v * 3
      local f = wrap(function(a) return mg.tanh(mg.matmul(vk, a) + k) * a end)
      local y = mg.sum(f(k))                         -- the argument is the closed-over k too
      t:stop()
      return t:gradient(y, {k, v})
    end)
  end)

  it("a tensor no tape follows stays a constant, and an untouched closure changes nothing", function()
    agree(function(wrap)
      local x = c({2.0, 3.0}, "float64")
      local k = c({5.0, 7.0}, "float64")             -- not watched: a constant
      local t = mg.tape()
      t:watch(x)
      local f = wrap(function(a) return a * k end)
      local y = mg.sum(f(x))
      t:stop()
      return t:gradient(y, x)
    end)
  end)

  it("a closed-over tensor returned as it is", function()
    agree(function(wrap)
      local x = c({1.0, -1.0}, "float64")
      local t = mg.tape()
      t:watch(x)
      local k = mg.exp(x)
      local f = wrap(function(a) return a * 2, k end)
      local p, q = f(x)
      local y = mg.sum(p * q)
      t:stop()
      return t:gradient(y, x)
    end)
  end)

  it("nested: the inner block closes over the outer block's intermediate and the outer closure", function()
    agree(function(wrap)
      local x = c({0.4, -0.6, 1.1}, "float64")
      local t = mg.tape()
      t:watch(x)
      local k = mg.sin(x)
      local outer = wrap(function(a)
        local m = a * k
        local inner = wrap(function(b) return mg.exp(b * m) + k end)
        return inner(a) * m
      end)
      local y = mg.sum(outer(x * 0.5))
      t:stop()
      return t:gradient(y, x)
    end)
  end)

  it("second and third order through a closure (nested tapes)", function()
    agree(function(wrap)
      local x = c({0.3, -0.8}, "float64")
      local t1 = mg.tape(); t1:watch(x)
      local t2 = mg.tape(); t2:watch(x)
      local t3 = mg.tape(); t3:watch(x)
      local k = mg.exp(x)
      local f = wrap(function(a) return mg.sin(a * k) end)
      local y = mg.sum(f(x))
      t3:stop()
      local g1 = t3:gradient(y, x)
      local s1 = mg.sum(g1 * g1)
      t2:stop()
      local g2 = t2:gradient(s1, x)
      local s2 = mg.sum(g2)
      t1:stop()
      return g1, g2, t1:gradient(s2, x)
    end)
  end)

  it("a persistent tape asked twice, and a save policy", function()
    for _, policy in ipairs{"nothing", "dots", "everything", "output"} do
      agree(function(wrap)
        local x = c({{0.1, 0.2}, {0.3, 0.4}}, "float64")
        local w = c({{1.0, -1.0}, {0.5, 2.0}}, "float64")
        local t = mg.tape{persistent = true}
        t:watch(x); t:watch(w)
        local ww = w * w
        local f = wrap == mg.recompute_grad and mg.recompute_grad(function(a) return mg.tanh(mg.matmul(a, ww)) end,
                                                                   {policy = policy})
                  or function(a) return mg.tanh(mg.matmul(a, ww)) end
        local y = mg.sum(f(x))
        t:stop()
        local a = t:gradient(y, {x, w})
        local b = t:gradient(y, w)
        return a[1], a[2], b
      end)
    end
  end)

  it("a layer closing over a tensor in checkpoint_sequential", function()
    agree(function(wrap)
      local x = c({{0.5, -0.5, 1.5}}, "float64")
      local k = c({0.2, 0.4, 0.6}, "float64")
      local t = mg.tape()
      t:watch(k)
      local kk = k * k
      local layers = {
        mg.nn.Lambda(function(a) return mg.tanh(a * kk) end),
        mg.nn.Lambda(function(a) return a + kk end),
        mg.nn.Lambda(function(a) return mg.exp(a) * k end),
      }
      local y
      if wrap == mg.recompute_grad then y = mg.nn.checkpoint_sequential(layers, 2, x)
      else y = x; for _, l in ipairs(layers) do y = l(y) end end
      local loss = mg.sum(y)
      t:stop()
      return t:gradient(loss, k)
    end)
  end)

  it("dropout in the block draws the same mask in the re-run, closure or not", function()
    agree(function(wrap)
      mg.random.seed(7)
      local x = c({{1, 2, 3, 4}}, "float64")
      local t = mg.tape()
      t:watch(x)
      local k = x * x
      local f = wrap(function(a) return mg.nn.dropout(a * k, 0.5) end)
      local y = mg.sum(f(x))
      t:stop()
      return t:gradient(y, x)
    end)
  end)
end)

describe("custom_gradient inside recompute_grad", function()
  -- TensorFlow's documented example (tf.custom_gradient)
  local log1pexp = mg.custom_gradient(function(x)
    local e = mg.exp(x)
    return mg.log(1 + e), function(dy) return dy * (1 - 1 / (1 + e)) end
  end)

  local function three_orders (wrap)
    local x = c({0.5, -1.0, 2.0}, "float64")
    local f = wrap(log1pexp)
    local t1 = mg.tape(); t1:watch(x)
    local t2 = mg.tape(); t2:watch(x)
    local t3 = mg.tape(); t3:watch(x)
    local y = mg.sum(f(x))
    t3:stop()
    local g1 = t3:gradient(y, x)
    local s1 = mg.sum(g1)
    t2:stop()
    local g2 = t2:gradient(s1, x)
    local s2 = mg.sum(g2)
    t1:stop()
    return g1, g2, t1:gradient(s2, x)
  end

  it("gives the plain gradient to third order (log1pexp)", function()
    local g = agree(three_orders)
    -- and the analytic ones: sigmoid, its derivative, its second
    local x = c({0.5, -1.0, 2.0}, "float64")
    local s = mg.sigmoid(x)
    h.assert_close(g[1], s, 1e-12)
    h.assert_close(g[2], s * (1 - s), 1e-12)
    h.assert_close(g[3], s * (1 - s) * (1 - 2 * s), 1e-12)
  end)

  it("a first order gradient, on a non-persistent tape", function()
    agree(function(wrap)
      local x = c({0.5, -1.0, 2.0}, "float64")
      local t = mg.tape(); t:watch(x)
      local y = mg.sum(wrap(log1pexp)(x * 3))
      t:stop()
      return t:gradient(y, x)
    end)
  end)

  it("a custom gradient with a context, and one closing over a tensor from outside the block", function()
    local scale = mg.custom_gradient(function(ctx, a)
      ctx:save(a)
      return a * 3, function(dy) return dy * 3 end
    end, {context = true})
    agree(function(wrap)
      local x = c({0.5, -1.0}, "float64")
      local t = mg.tape(); t:watch(x)
      local k = mg.exp(x)
      local f = wrap(function(a) return log1pexp(scale(a) * k) end)
      local y = mg.sum(f(x))
      t:stop()
      return t:gradient(y, x)
    end)
  end)
end)

describe("checkpoint_loop: tensors the step reads besides its state", function()
  local function loop_or_plain (wrap, step, s0, n)
    if wrap == mg.recompute_grad then return mg.checkpoint_loop(step, s0, n, {snapshots = 2}) end
    local s = s0
    for i = 1, n do s = step(s, i) end
    return s
  end

  it("the initial state read inside the step (the issue's case)", function()
    agree(function(wrap)
      local x = c({0.3, -0.7}, "float64")
      local t = mg.tape(); t:watch(x)
      local s0 = x * 2
      local s = loop_or_plain(wrap, function(s, i) return mg.tanh(s * s0 + 0.1 * i) end, s0, 5)
      local y = mg.sum(s * s)
      t:stop()
      return t:gradient(y, x)
    end)
  end)

  it("a closed-over tensor, a variable and a table state, each read by every step", function()
    agree(function(wrap)
      local v = mg.Variable(c({0.9, 1.1}, "float64"))
      local x = c({0.3, -0.7}, "float64")
      local t = mg.tape(); t:watch(x)
      local k = mg.exp(x)
      local step = function(s, i) return {a = mg.sin(s.a * k + s.b), b = s.b * v + 0.01 * i} end
      local s = loop_or_plain(wrap, step, {a = x, b = k * 0.5}, 7)
      local y = mg.sum(s.a * s.b)
      t:stop()
      return t:gradient(y, {x, v})
    end)
  end)
end)

describe("a persistent tape that is still recording records its own gradient (TensorFlow)", function()
  it("gives d2y/dx2 and d3y/dx3 from one tape (testHigherOrderGradient)", function()
    local x = c(3.0, "float64")
    local t = mg.tape{persistent = true, warn = false}   -- d3's gradient is nil on purpose
    t:watch(x)
    local y = x * x * x
    local dy = t:gradient(y, x)
    local d2 = t:gradient(dy, x)
    t:stop()
    local d3 = t:gradient(d2, x)
    assert.equal(27, dy:item())
    assert.equal(18, d2:item())
    assert.equal(6, d3:item())
    assert.is_nil(t:gradient(d3, x))          -- taken after the stop: not recorded
  end)

  it("through recompute_grad and a variable too", function()
    local v = mg.Variable(c({0.5, -1.5}, "float64"))
    local f = mg.recompute_grad(function(a) return mg.sin(a * v) end)
    local t = mg.tape{persistent = true}
    local y = mg.sum(f(v))
    local g = t:gradient(y, v)
    local s = mg.sum(g)
    local g2 = t:gradient(s, v)
    t:stop()
    local x = v:value()                        -- d/dv sum(sin(v^2)) = 2v cos(v^2)
    h.assert_close(g, 2 * x * mg.cos(x * x), 1e-12)
    h.assert_close(g2, 2 * mg.cos(x * x) - 4 * x * x * mg.sin(x * x), 1e-12)
  end)

  it("a non-persistent tape does not record the gradient it gives, and then refuses a second", function()
    local x = c(2.0, "float64")
    local t = mg.tape{warn = false}        -- dy is not recorded: the second call would warn, then raise
    t:watch(x)
    local dy = t:gradient(x * x, x)
    assert.equal(4, dy:item())
    assert.has_error(function() t:gradient(dy, x) end,
                     "tape:gradient: a non-persistent tape can only compute one gradient; create it with mg.tape{persistent=true} to call it again")
  end)
end)

describe("a node saves only what the wanted gradients need (needs_input_grad)", function()
  local x = mg.random.normal({32, 16}, 0, 1, "float64")
  local y = mg.random.normal({32, 16}, 0, 1, "float64")
  local w = mg.random.normal({16, 8}, 0, 1, "float64")
  local B = 32 * 16 * 8                          -- bytes of x (and y)
  local function saved (op, watch)
    local t = mg.tape()
    for _, v in ipairs(watch) do t:watch(v) end
    local _ = op()
    t:stop()
    return t:saved_bytes()
  end

  it("x * y keeps y for x's gradient and x for y's", function()
    assert.equal(B, saved(function() return x * y end, {x}))
    assert.equal(B, saved(function() return x * y end, {y}))
    assert.equal(2 * B, saved(function() return x * y end, {x, y}))
  end)

  it("matmul, dense and conv2d keep the other operand only", function()
    local WB = 16 * 8 * 8
    assert.equal(WB, saved(function() return mg.matmul(x, w) end, {x}))
    assert.equal(B, saved(function() return mg.matmul(x, w) end, {w}))
    assert.equal(B + WB, saved(function() return mg.dense(x, w) end, {x, w}))
    local img = mg.random.normal({2, 5, 5, 3}, 0, 1, "float64")
    local f = mg.random.normal({3, 3, 3, 4}, 0, 1, "float64")
    assert.equal(3 * 3 * 3 * 4 * 8, saved(function() return mg.conv2d(img, f) end, {img}))
    assert.equal(2 * 5 * 5 * 3 * 8, saved(function() return mg.conv2d(img, f) end, {f}))
  end)

  it("a / b keeps b for a's gradient, b and the quotient for b's", function()
    assert.equal(B, saved(function() return x / y end, {x}))
    assert.equal(2 * B, saved(function() return x / y end, {y}))
  end)

  it("layer_norm keeps gamma only for x's gradient", function()
    local g = mg.random.normal({16}, 0, 1, "float64")
    assert.equal(B, saved(function() return mg.layer_norm(x, g) end, {g}))
    assert.equal(B + 16 * 8, saved(function() return mg.layer_norm(x, g) end, {x}))
  end)

  it("the gradients stay exact, to second order", function()
    for _, watch in ipairs{{1}, {2}, {1, 2}} do
      local a, b = mg.constant({1.5, -2.0}, "float64"), mg.constant({0.5, 3.0}, "float64")
      local src = {a, b}
      local t1, t2 = mg.tape(), mg.tape()
      for _, i in ipairs(watch) do t1:watch(src[i]); t2:watch(src[i]) end
      local z = mg.sum(a * b * a / b) + mg.sum(mg.matmul(mg.reshape(a, {1, 2}), mg.reshape(b, {2, 1})))
      t2:stop()
      local g = t2:gradient(z, src[watch[1]])
      local s = mg.sum(g * g)
      t1:stop()
      local g2 = t1:gradient(s, src[watch[1]])
      -- z = sum(a^2) + a.b: dz/da = 2a + b, dz/db = a
      if watch[1] == 1 then
        h.assert_close(g, 2 * a + b, 1e-12)
        h.assert_close(g2, 4 * (2 * a + b), 1e-12)
      else
        h.assert_close(g, a, 1e-12)
        if g2 then assert.same({0, 0}, g2:totable()) end   -- a is constant here: d/db of a is 0
      end
    end
  end)

  it("an input watched only after the op ran gets no gradient through it, as in PyTorch", function()
    local a, b = mg.constant({1, 2}, "float64"), mg.constant({3, 4}, "float64")
    local t = mg.tape{persistent = true}
    t:watch(a)
    local z = mg.sum(a * b)
    t:watch(b)
    assert.same({3, 4}, t:gradient(z, a):totable())
    assert.is_nil(t:gradient(z, b))
    t:stop()
  end)
end)

describe("reversible layers: side inputs and tensors the functions close over", function()
  local nn = mg.nn

  it("RevBlock's f_side_input and g_side_input, and a closed-over tensor, get the plain gradients", function()
    mg.random.seed(11)
    local W = 8
    local fd, gd = nn.Dense(W // 2, "tanh"), nn.Dense(W // 2)
    local fs = mg.random.normal({3, W // 2}, 0, 1, "float64")
    local gs = mg.random.normal({3, W // 2}, 0, 1, "float64")
    local k = mg.random.normal({W // 2}, 0, 1, "float64")
    local f = function(x, side) return fd(x) * side[1] end
    local g = function(y, side) return gd(y) + side[1] * k end
    local block = nn.RevBlock(f, g, {num_layers = 3, f_side_input = {fs}, g_side_input = {gs}})
    local x = mg.random.normal({3, W}, 0, 1, "float64")
    local function run (rev)
      local t = mg.tape()
      t:watch({x, fs, gs, k})
      local y
      if rev then y = block(x)
      else
        local x1, x2 = x:slice(nil, {1, W // 2}), x:slice(nil, {W // 2 + 1, W})
        for _ = 1, 3 do x1 = x1 + f(x2, {fs}); x2 = x2 + g(x1, {gs}) end
        y = mg.concat({x1, x2}, -1)
      end
      local loss = mg.sum(y * y)
      t:stop()
      local wrt = {x, fs, gs, k}
      for _, v in ipairs(fd.variables) do wrt[#wrt + 1] = v end
      for _, v in ipairs(gd.variables) do wrt[#wrt + 1] = v end
      return t:gradient(loss, wrt)
    end
    local plain = run(false)
    block(x)                                   -- built
    local rev = run(true)
    for i = 1, #plain do h.assert_close(rev[i], plain[i], 1e-10) end
  end)

  it("side inputs must be lists of tensors", function()
    assert.has_error(function() nn.RevBlock(nn.Dense(2), nn.Dense(2), {f_side_input = mg.ones{2}}) end,
                     "RevBlock: option 'f_side_input' must be a list of tensors, got a tensor (2) float32")
  end)
end)

describe("ctx:saved() gives back what ctx:save was given", function()
  it("the same tensor objects while they live, nil for a forgotten one", function()
    local seen
    local f = mg.custom_gradient(function(ctx, a, b)
      local e = mg.exp(a)
      ctx:save(a, e, b)
      return e * b, function(dy)
        local sa, se, sb = ctx:saved()
        seen = {sa == a, se == e, sb == b}
        return dy * se * sb, dy * se
      end
    end, {context = true})
    local a, b = c({0.5, 1.0}, "float64"), c({2.0, 3.0}, "float64")
    local t = mg.tape()
    t:watch({a, b})
    local y = mg.sum(f(a, b))
    t:stop()
    local g = t:gradient(y, {a, b})
    assert.same({true, true, true}, seen)
    h.assert_close(g[1], mg.exp(a) * b, 1e-12)
    h.assert_close(g[2], mg.exp(a), 1e-12)
  end)
end)

describe("what cannot be exact is an error naming the tensor", function()
  it("a re-run that computes something else, with outputs of the same shapes", function()
    local runs = 0
    local f = mg.recompute_grad(function(x)
      runs = runs + 1
      if runs == 1 then return mg.sin(mg.exp(mg.sin(x))) end
      return mg.exp(mg.sin(x))
    end)
    local x = c({0.5, 1.5}, "float64")
    local t = mg.tape()
    t:watch(x)
    local y = mg.sum(f(x))
    t:stop()
    local ok, err = pcall(t.gradient, t, y, x)
    assert.is_false(ok)
    assert.matches("the recomputed function gave output 1 other values than its first run", err, 1, true)
  end)

  it("is_recomputing changing side effects only, dropout and a float32 block are not flagged", function()
    local count = mg.Variable(0.0, {trainable = false})
    local f = mg.recompute_grad(function(x)
      if not mg.is_recomputing() then count:assign(count + 1) end
      return mg.nn.dropout(mg.tanh(mg.matmul(x, x)), 0.3)
    end)
    local x = mg.random.normal{64, 64}
    local t = mg.tape()
    t:watch(x)
    local y = mg.sum(f(x))
    t:stop()
    assert.is_not_nil(t:gradient(y, x))
    assert.equal(1, count:value():item())
  end)

  it("a closure that holds another tensor when the gradient re-runs the block", function()
    local x = c({1.0, 2.0}, "float64")
    local t = mg.tape()
    t:watch(x)
    local k = x * 2
    local f = mg.recompute_grad(function(a) return a * k end)
    local y = mg.sum(f(x))
    k = x * 3
    t:stop()
    assert.has_error(function() t:gradient(y, x) end,
                     "tape:gradient: in the backward of 'recompute_grad': the recomputed function did not read "
                     .. "again the (2) float64 tensor it closed over in its first run (a closure that now holds "
                     .. "another tensor?); it must read the same tensors each run")
  end)

  it("a custom gradient with a context inside the block keeps its closure a constant, as plainly", function()
    agree(function(wrap)
      local x = c({1.0, 2.0}, "float64")
      local t = mg.tape()
      t:watch(x)
      local k = x * 5
      local cg = mg.custom_gradient(function(_, a) return a * k, function(dy) return dy * k end end,
                                    {context = true})
      local y = mg.sum(wrap(function(a) return cg(a) end)(x))
      t:stop()
      return t:gradient(y, x)
    end)
  end)
end)

describe("an input the outputs do not reach stays unconnected (nil), as on the plain tape", function()
  it("recompute_grad: an argument the function does not use, and one used by another path", function()
    agree(function(wrap)
      local a, b = c({1.0, 2.0}, "float64"), c({3.0, -1.0}, "float64")
      local t = mg.tape{persistent = true}
      t:watch(a); t:watch(b)
      local f = wrap(function(p, q) return p * 2 end)
      local y = mg.sum(f(a, b))
      local z = mg.sum(f(a, b) * b)                 -- b reaches z, not through f
      t:stop()
      return t:gradient(y, a), t:gradient(y, b), t:gradient(z, b)
    end, nil, {2})                                  -- y does not reach b
    local a, b = c({1.0, 2.0}, "float64"), c({3.0, -1.0}, "float64")
    local t = mg.tape()
    t:watch(b)
    local y = mg.sum(mg.recompute_grad(function(p, q) return p end)(a, b))
    t:stop()
    assert.is_nil(t:gradient(y, b))
    t = mg.tape{persistent = true}
    t:watch(b)
    local out = mg.recompute_grad(function(p, q) return p * 2 end)(a, b)
    local z = mg.sum(out * b)
    t:stop()
    h.assert_close(t:gradient(z, b), a * 2, TOL)    -- only the path outside f
    assert.same({0.0, 0.0}, t:gradient(mg.sum(out), b, nil, {unconnected = "zero"}):totable())
  end)

  it("checkpoint_sequential and checkpoint_loop: a part of the state the result does not use", function()
    local x, w = c({0.5, -1.5}, "float64"), c({2.0, 3.0}, "float64")
    local t = mg.tape{warn = false}        -- y depends on nothing watched: nil on purpose
    t:watch(w)
    local y = mg.sum(mg.checkpoint_loop(function(s, i) return s * 1.5 end, x, 3, {snapshots = 1}))
    t:stop()
    assert.is_nil(t:gradient(y, w))
  end)

  it("custom_gradient: a grad_fn that gives nil for an input leaves it unconnected, as in TensorFlow", function()
    local f = mg.custom_gradient(function(p, q)
      return p * q, function(dy) return dy * q, nil end
    end)
    local a, b = c({1.0, 2.0}, "float64"), c({3.0, 4.0}, "float64")
    local t = mg.tape{persistent = true}
    t:watch(a); t:watch(b)
    local y = mg.sum(f(a, b))
    local z = mg.sum(f(a, b) + b * b)
    t:stop()
    local g = t:gradient(y, {a, b})
    h.assert_close(g[1], b, TOL)
    assert.is_nil(g[2])
    h.assert_close(t:gradient(z, b), b * 2, TOL)
  end)
end)

describe("recompute_grad: the gradient at one output through the others, as the plain tape", function()
  local function fn (x)
    local y = mg.cos(mg.sin(x))
    local w = y * x
    local z = mg.cos(mg.sin(y)) + w * 2
    return y, z, w
  end

  it("d z / d y between two outputs, with and without their own seeds, and x besides", function()
    agree(function(wrap)
      local x = c({0.3, -1.2, 2.0}, "float64")
      local t = mg.tape{persistent = true}
      t:watch(x)
      local y, z, w = wrap(fn)(x)
      local L = mg.sum(z * 3) + mg.sum(y * y) + mg.sum(w)
      local sy = mg.sum(y)                          -- recorded: d sum(y) / d y = 1
      t:stop()
      return t:gradient(z, y), t:gradient(z, {y, w}), t:gradient(L, {y, w, x}),
             t:gradient(sy, y), t:gradient(z, x)
    end)
  end)

  it("to second order through a tape recording the first", function()
    agree(function(wrap)
      local x = c({0.3, -1.2, 2.0}, "float64")
      local outer = mg.tape()
      outer:watch(x)
      local inner = mg.tape()
      inner:watch(x)
      local y, z = wrap(fn)(x)
      local s = mg.sum(z)
      inner:stop()
      local gy = inner:gradient(s, y)
      local s2 = mg.sum(gy * gy)                    -- recorded by outer: the second order
      outer:stop()
      return gy, outer:gradient(s2, x)
    end)
  end)

  it("jacobian of one output w.r.t. another", function()
    agree(function(wrap)
      local x = c({0.3, -1.2}, "float64")
      local t = mg.tape()
      t:watch(x)
      local y, z = wrap(fn)(x)
      t:stop()
      return t:jacobian(z, y)
    end)
  end)
end)

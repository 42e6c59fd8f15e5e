-- Tapes (tf.GradientTape), variables, custom gradients, higher orders.
local mg = require "moongrad"
local h = require "helpers"

local c = mg.constant
local function f64 (v) return mg.constant(v, "float64") end

describe("Variable", function()
  it("holds a value, a name and a trainable flag", function()
    local v = mg.Variable({1, 2}, {name = "w", dtype = "float64"})
    assert.equal("w", v.name)
    assert.is_true(v.trainable)
    assert.same({2}, v.shape)
    assert.equal("float64", v.dtype)
    assert.same({1, 2}, v:value():totable())
    assert.equal("Variable", mg.Variable(0).name)
    assert.is_false(mg.Variable(0, {trainable = false}).trainable)
  end)

  it("assign, assign_add, assign_sub; ops read it like a tensor", function()
    local v = mg.Variable({1, 2})
    v:assign({5, 6})
    assert.same({5, 6}, v:value():totable())
    v:assign_add(mg.ones{2})
    v:assign_sub(0.5)
    assert.same({5.5, 6.5}, v:value():totable())
    assert.same({11, 13}, (v * 2):totable())
    assert.same({5.5, 6.5}, v:totable())
    assert.equal(12, mg.sum(v):item())
  end)

  it("assign never changes a value someone kept (copy on write)", function()
    local v = mg.Variable({1, 2})
    local kept = v:value()
    v:assign({3, 4})
    assert.same({1, 2}, kept:totable())
    assert.same({3, 4}, v:value():totable())
  end)

  it("assign_add/assign_sub take a scale and update in one pass", function()
    local v = mg.Variable({1, 2, 3})
    v:assign_sub(mg.constant({10, 20, 30}), 0.1)
    h.assert_close(v, {0, 0, 0}, 1e-6)
    v:assign_add(2, 3)                                   -- a number broadcasts
    assert.same({6, 6, 6}, v:totable())
    assert.equal(v, v:assign_add(0))                     -- returns the variable
    local i = mg.Variable({1, 2}, {dtype = "int64"})
    i:assign_add({3, 4}, 2)
    assert.same({7, 10}, i:totable())
    assert.has_error(function() i:assign_add({1, 1}, 0.5) end, "assign_add: cannot scale an int64 variable by 0.5")
    assert.has_error(function() v:assign_sub({1, 2}) end, "assign_add: shape (2) does not match the variable's (3)")
  end)

  it("an update never changes a value a tape saved (copy on write)", function()
    local w = mg.Variable({2.0})
    local x = mg.constant({3.0})
    local t = mg.tape()
    local y = x * w                                      -- mul saves w's value
    t:stop()
    w:assign_sub({1.0})                                  -- w is now 1, the tape's copy still 2
    assert.same({1}, w:totable())
    assert.same({3}, t:gradient(y, w):totable())         -- dy/dw = x
    local t2 = mg.tape()
    local z = w * w
    t2:stop()
    w:assign_add({10}, 1)
    assert.same({2}, t2:gradient(z, w):totable())        -- 2 * (w = 1 when recorded)
  end)

  it("assign checks shape and dtype", function()
    local v = mg.Variable({1, 2})
    assert.has_error(function() v:assign({1, 2, 3}) end, "assign: shape (3) does not match the variable's (2)")
    assert.has_error(function() v:assign(mg.constant({1, 2}, "float64")) end,
                     "assign: dtype float64 does not match the variable's float32")
  end)

  it("prints its name, shape and dtype", function()
    assert.equal("{1.0, 2.0}\nmoongrad.Variable 'w' (2) float32",
                 tostring(mg.Variable({1, 2}, {name = "w"})))
  end)
end)

describe("tape", function()
  it("gives dy/dx for a watched tensor", function()
    local x = c(3)
    local t = mg.tape()
    t:watch(x)
    local y = x * x
    t:stop()
    assert.equal(6, t:gradient(y, x):item())
  end)

  it("watches trainable variables it sees read, and only those", function()
    local w, frozen = mg.Variable(2.0), mg.Variable(3.0, {trainable = false})
    local t = mg.tape()
    local y = w * frozen
    t:stop()
    local g = t:gradient(y, {w, frozen})
    assert.equal(3, g[1]:item())
    assert.is_nil(g[2])
    assert.same({w}, t:watched_variables())
  end)

  it("with watch_accessed_variables=false watches only what it is told", function()
    local a, b = mg.Variable(2.0), mg.Variable(3.0)
    local t = mg.tape{watch_accessed_variables = false}
    t:watch(a)
    local y = a * b
    t:stop()
    local g = t:gradient(y, {a, b})
    assert.equal(3, g[1]:item())
    assert.is_nil(g[2])
  end)

  it("sums over a non-scalar target, and over a list of targets", function()
    local x = f64({1, 2, 3})
    local t = mg.tape{persistent = true}
    t:watch(x)
    local y = x * x
    local z = mg.sum(x)
    t:stop()
    assert.same({2, 4, 6}, t:gradient(y, x):totable())
    assert.same({3, 5, 7}, t:gradient({y, z}, x):totable())
  end)

  it("answers in the structure of the sources", function()
    local a, b, c2 = mg.Variable(1.0), mg.Variable(2.0), mg.Variable(3.0)
    local t = mg.tape()
    local y = a * b * c2
    t:stop()
    local g = t:gradient(y, {first = a, rest = {b, {c2}}})
    assert.equal(6, g.first:item())
    assert.equal(3, g.rest[1]:item())
    assert.equal(2, g.rest[2][1]:item())
  end)

  it("gives nil for unconnected sources, or zeros when asked", function()
    local x, z = c(1), c({1, 2})
    local t = mg.tape{persistent = true}
    t:watch({x, z})
    local y = x * 2
    t:stop()
    local g = t:gradient(y, {x, z})
    assert.equal(2, g[1]:item())
    assert.is_nil(g[2])
    assert.same({0, 0}, t:gradient(y, {x, z}, nil, {unconnected = "zero"})[2]:totable())
    assert.same({0, 0}, t:gradient(y, {x, z}, {unconnected = "zero"})[2]:totable())
  end)

  it("never differentiates integer tensors", function()
    local i = c({1, 2}, "int64")
    local x = c({1, 2})
    local t = mg.tape{persistent = true}
    t:watch({i, x})
    local y = mg.cast(i, "float32") * x
    t:stop()
    assert.is_nil(t:gradient(y, i))
    assert.same({0, 0}, t:gradient(y, i, {unconnected = "zero"}):totable())
    assert.same({1, 2}, t:gradient(y, x):totable())
  end)

  it("sums a gradient in place only where nothing else can see the sum", function()
    -- the walk adds into its own sums; never into a seed the caller holds,
    -- a target's gradient given twice, or while a tape records the walk
    local x = f64({1, 2, 3})
    local s1, s2 = f64({1, 1, 1}), f64({10, 10, 10})
    local t = mg.tape{persistent = true}
    t:watch(x)
    local y = x * 2
    t:stop()
    assert.same({22, 22, 22}, t:gradient({y, y}, x, {s1, s2}):totable())
    assert.same({1, 1, 1}, s1:totable())
    assert.same({10, 10, 10}, s2:totable())
    local g1 = t:gradient(y, x)                           -- an earlier answer stays as it was
    local g2 = t:gradient({y, y}, x)
    assert.same({2, 2, 2}, g1:totable())
    assert.same({4, 4, 4}, g2:totable())
    local v = mg.Variable(mg.constant(2.0, "float64"))    -- read four times: three sums
    local outer = mg.tape()
    local inner = mg.tape()
    local z = v * v * v * v
    inner:stop()
    local dz = inner:gradient(z, v)                      -- 4 v^3, summed while outer records
    outer:stop()
    assert.equal(32, dz:item())
    assert.equal(48, outer:gradient(dz, v):item())       -- 12 v^2: the sums were recorded
  end)

  it("sums large gradients in place too, on every thread", function()
    -- x feeds four ops: its gradient is three sums of (300, 1000) tensors,
    -- past the size where kernels split across threads
    local x = mg.Variable(mg.random.normal{300, 1000})
    local bytes = 300 * 1000 * 4
    local t = mg.tape()
    local y = mg.sum(mg.tanh(x) + mg.sigmoid(x) + mg.relu(x) + x * 2)
    t:stop()
    local before = mg.memory.stats().allocated_bytes
    local g = t:gradient(y, {x})[1]
    local alloc = mg.memory.stats().allocated_bytes - before
    -- the four ops' gradients, and no tensor for their sums
    assert.is_true(alloc < 5 * bytes, alloc)
    local v = x:value()
    local s = mg.sigmoid(v)
    local want = (1 - mg.tanh(v) ^ 2) + s * (1 - s) + mg.cast(mg.greater(v, 0), "float32") + 2
    assert.equal(0, mg.sum(mg.cast(mg.greater(mg.abs(g - want), 1e-5), "int64")):item())
  end)

  it("writes a product's input gradient over the output gradient the walk spares it", function()
    local x = mg.Variable(mg.random.normal{200, 100})
    local a, b = mg.random.normal{200, 100}, mg.constant(1.5)
    local seed = mg.random.normal{200, 100}
    local bytes = 200 * 100 * 4
    local function run (keep)
      local t = mg.tape()
      local m = x * a
      local y = (m * b) * a
      t:stop()
      local before = mg.memory.stats().allocated_bytes
      local g = t:gradient(y, keep and {x, m} or {x}, {seed})
      return g[1], mg.memory.stats().allocated_bytes - before
    end
    local g, alloc = run(false)
    local g2, alloc2 = run(true)
    assert.equal(0, mg.sum(mg.cast(mg.not_equal(g, g2), "int64")):item())
    h.assert_close(g, seed * a * 1.5 * a, 1e-6)
    -- the seed is the caller's: the last product's rule makes one tensor,
    -- the two before write over it (a scalar operand, then a tensor)
    assert.is_true(alloc < 2 * bytes, alloc)
    -- asked for, m's gradient is the caller's: x's product leaves it alone
    assert.is_true(alloc2 >= alloc + bytes, alloc2 .. " " .. alloc)
  end)

  it("weights the targets by output_gradients", function()
    local x = c({1, 2})
    local t = mg.tape()
    t:watch(x)
    local y = x * x
    t:stop()
    assert.same({20, 400}, t:gradient(y, x, c({10, 100})):totable())
  end)

  it("a persistent tape answers many times; a plain one frees what it held", function()
    local x = c({1, 2, 3})
    local p = mg.tape{persistent = true}
    p:watch(x)
    local y = mg.tanh(x)
    p:stop()
    local g1, g2 = p:gradient(y, x), p:gradient(y, x)
    assert.same(g1:totable(), g2:totable())

    local t = mg.tape{warn = false}       -- the refused second call would warn before raising
    t:watch(x)
    local z = mg.tanh(x)
    t:stop()
    assert.is_true(t:saved_bytes() > 0)
    t:gradient(z, x)
    assert.equal(0, t:saved_bytes())
    assert.has_error(function() t:gradient(z, x) end,
      "tape:gradient: a non-persistent tape can only compute one gradient; create it with mg.tape{persistent=true} to call it again")
  end)

  it("records nothing after stop(), or after a <close> scope", function()
    local x = c(2)
    local t = mg.tape{warn = false}       -- late's gradient is nil on purpose
    t:watch(x)
    local y = x * x
    t:stop()
    local late = y * x
    assert.is_nil(t:gradient(late, x))          -- as TensorFlow: unconnected, not an error
    local t2
    do
      local tc <close> = mg.tape()
      t2 = tc
      tc:watch(x)
      y = x * 3
    end
    assert.is_false(t2:is_recording())
    assert.equal(3, t2:gradient(y, x):item())
  end)

  it("record(fn) resumes and stop_recording(fn) pauses", function()
    local x = c(2)
    local t = mg.tape{persistent = true, warn = false}   -- b's gradient is nil on purpose
    t:watch(x)
    local a = x * x
    local b = t:stop_recording(function() return a * 10 end)
    t:stop()
    local d = t:record(function() return a * x end)
    assert.equal(4, t:gradient(a, x):item())
    assert.is_nil(t:gradient(b, x))              -- recorded nowhere: unconnected
    assert.equal(12, t:gradient(d, x):item())
  end)

  it("several tapes record at once, each what it watches", function()
    local x, y = c(2), c(5)
    local tx, ty = mg.tape(), mg.tape()
    tx:watch(x)
    ty:watch(y)
    local z = x * y
    tx:stop()
    ty:stop()
    assert.equal(5, tx:gradient(z, x):item())
    assert.equal(2, ty:gradient(z, y):item())
  end)

  it("reset forgets everything recorded", function()
    local x = c(2)
    local t = mg.tape{persistent = true, warn = false}   -- nil on purpose: reset forgot y
    t:watch(x)
    local y = x * x
    t:reset()
    assert.equal(0, t:saved_bytes())
    assert.is_nil(t:gradient(y, x))
  end)

  it("gradients flow through views and variables read twice", function()
    local w = mg.Variable({{1, 2}, {3, 4}})
    local t = mg.tape()
    local y = mg.sum(w[1] * w:transpose()[2]) + mg.sum(w * w)
    t:stop()
    -- y = w11*w12 + w12*w22 + sum(w^2); dy/dw12 = w11 + w22 + 2 w12
    assert.same({{4, 9}, {6, 10}}, t:gradient(y, w):totable())
  end)
end)

describe("what tapes save", function()
  it("tanh keeps its output, mul its inputs, add nothing", function()
    local x = c(mg.ones{1000})                             -- 4000 bytes
    local t = mg.tape{persistent = true}
    t:watch(x)
    local a = x + 1
    assert.equal(0, t:saved_bytes())
    local y = mg.tanh(a)
    assert.equal(4000, t:saved_bytes())                   -- y, not a
    local z = y * a
    assert.equal(8000, t:saved_bytes())                   -- y (again) and a
    local _ = mg.exp(z)
    assert.equal(12000, t:saved_bytes())                  -- exp's output joins
    t:stop()
  end)

  it("saved bytes show in mg.memory.stats and go when the tape goes", function()
    collectgarbage()
    local before = mg.memory.stats().saved_bytes
    local x = c(mg.ones{1000})
    local t, y = h.record(mg.exp, x)
    assert.equal(before + 4000, mg.memory.stats().saved_bytes)
    t:gradient(y, x)
    assert.equal(before, mg.memory.stats().saved_bytes)
  end)

  it("a dropped tape frees everything", function()
    local before = h.live()
    do
      local x = mg.random.normal{10, 10}
      local t = mg.tape{persistent = true}
      t:watch(x)
      local y = mg.softmax(mg.matmul(x, x))
      t:stop()
      local _ = t:gradient(y, x)
    end
    assert.equal(before, h.live())
  end)
end)

describe("higher-order gradients", function()
  it("d2/dx2 and d3/dx3 of x^3 from nested tapes", function()
    local x = f64(2)
    local t3 = mg.tape()
    t3:watch(x)
    local t2 = mg.tape()
    t2:watch(x)
    local t1 = mg.tape()
    t1:watch(x)
    local y = x ^ 3
    t1:stop()
    local dy = t1:gradient(y, x)          -- 3x^2 = 12
    t2:stop()
    local d2y = t2:gradient(dy, x)        -- 6x = 12
    t3:stop()
    local d3y = t3:gradient(d2y, x)       -- 6
    assert.equal(12, dy:item())
    assert.equal(12, d2y:item())
    assert.equal(6, d3y:item())
  end)

  it("second derivatives of the maths ops match closed forms", function()
    local function d2 (f, v)
      local x = f64(v)
      local outer = mg.tape()
      outer:watch(x)
      local inner = mg.tape()
      inner:watch(x)
      local y = f(x)
      inner:stop()
      local g = inner:gradient(y, x)
      outer:stop()
      return outer:gradient(g, x):item()
    end
    local v = 0.7
    local th = (math.exp(v) - math.exp(-v)) / (math.exp(v) + math.exp(-v))
    local s = 1 / (1 + math.exp(-v))
    h.assert_close(d2(mg.exp, v), math.exp(v), 1e-12)
    h.assert_close(d2(mg.log, v), -1 / v ^ 2, 1e-12)
    h.assert_close(d2(mg.sqrt, v), -0.25 * v ^ -1.5, 1e-12)
    h.assert_close(d2(mg.tanh, v), -2 * th * (1 - th ^ 2), 1e-12)
    h.assert_close(d2(mg.sigmoid, v), s * (1 - s) * (1 - 2 * s), 1e-12)
    h.assert_close(d2(function(x) return 1 / x end, v), 2 / v ^ 3, 1e-12)
  end)

  it("a Hessian-vector product of an MLP loss matches finite differences", function()
    mg.random.seed(3)
    local x = mg.random.normal({4, 3}, 0, 1, "float64")
    local w1 = mg.Variable(mg.random.normal({3, 5}, 0, 0.5, "float64"))
    local w2 = mg.Variable(mg.random.normal({5, 2}, 0, 0.5, "float64"))
    local vec = mg.random.normal({3, 5}, 0, 1, "float64")
    local function loss ()
      return mg.mean(mg.log_softmax(mg.matmul(mg.tanh(mg.matmul(x, w1)), w2)) ^ 2)
    end
    local outer = mg.tape()
    local inner = mg.tape()
    local l = loss()
    inner:stop()
    local g = inner:gradient(l, w1)
    local gv = mg.sum(g * vec)
    outer:stop()
    local hv = outer:gradient(gv, w1)
    -- (grad(w1 + eps v) - grad(w1 - eps v)) / 2 eps
    local eps = 1e-5
    local function grad_at (delta)
      local saved = w1:value()
      w1:assign(saved + delta)
      local t = mg.tape()
      local ll = loss()
      t:stop()
      local gg = t:gradient(ll, w1)
      w1:assign(saved)
      return gg
    end
    local fd = (grad_at(vec * eps) - grad_at(vec * -eps)) / (2 * eps)
    h.assert_close(hv, fd, 1e-6)
  end)
end)

describe("jacobians", function()
  it("jacobian of an elementwise map is diagonal", function()
    local x = f64({1, 2, 3})
    local t = mg.tape()
    t:watch(x)
    local y = x * x
    t:stop()
    assert.same({{2, 0, 0}, {0, 4, 0}, {0, 0, 6}}, t:jacobian(y, x):totable())
  end)

  it("jacobian of a float16 or bfloat16 target: its one-hot seeds written in the target's dtype", function()
    -- (they were written as doubles, 8 bytes into 2-byte elements: past the seed's end)
    for _, dt in ipairs{"float16", "bfloat16"} do
      local x = mg.cast(c({1, 2, 3}), dt)
      local t = mg.tape()
      t:watch(x)
      local y = x * x
      t:stop()
      assert.same({{2, 0, 0}, {0, 4, 0}, {0, 0, 6}}, mg.cast(t:jacobian(y, x), "float64"):totable())
    end
  end)

  it("jacobian shapes are target shape then source shape", function()
    local x = mg.random.normal({2, 3}, 0, 1, "float64")
    local w = mg.random.normal({3, 4}, 0, 1, "float64")
    local t = mg.tape()
    t:watch(x)
    local y = mg.matmul(x, w)
    t:stop()
    local j = t:jacobian(y, x)
    assert.same({2, 4, 2, 3}, j.shape)
    h.assert_close(j[1][2][1], mg.transpose(w)[2], 1e-12)    -- dy[1,2]/dx[1,:] = w[:,2]
    h.assert_close(j[1][2][2], {0, 0, 0}, 0)
  end)

  it("batch_jacobian keeps the batch dimension", function()
    local x = mg.random.normal({5, 3}, 0, 1, "float64")
    local w = mg.random.normal({3, 2}, 0, 1, "float64")
    local t = mg.tape{persistent = true}
    t:watch(x)
    local y = mg.tanh(mg.matmul(x, w))
    t:stop()
    local bj = t:batch_jacobian(y, x)
    assert.same({5, 2, 3}, bj.shape)
    local full = t:jacobian(y, x)
    h.assert_close(bj[4], full[4]:slice(nil, 4), 1e-12)
  end)

  it("unconnected jacobians are nil, or zeros when asked", function()
    local x, z = f64({1, 2}), f64({3})
    local t = mg.tape{persistent = true}
    t:watch({x, z})
    local y = x * 2
    t:stop()
    assert.is_nil(t:jacobian(y, z))
    assert.same({{0}, {0}}, t:jacobian(y, z, {unconnected = "zero"}):totable())
  end)

  it("a jacobian with no elements is an empty tensor of TensorFlow's shape, never nil", function()
    local x, xb = f64({1, 2, 3}), f64({{1, 2, 3}, {4, 5, 6}})
    local e, eb, e0 = mg.zeros({0}, "float64"), mg.zeros({2, 0}, "float64"), mg.zeros({0, 2}, "float64")
    local t = mg.tape{persistent = true}
    t:watch({x, xb, e, eb, e0})
    local y0 = mg.zeros({0}, "float64") * mg.sum(x)          -- empty targets, connected to x
    local y20 = mg.zeros({2, 0}, "float64") * mg.sum(xb)
    local y = x * x                                           -- e and eb: empty and unconnected
    local yb = xb * 2
    local y0b = mg.matmul(e0, mg.ones({2, 3}, "float64"))     -- batch 0: (0, 3)
    t:stop()
    local function empty (want, j)
      assert.is_not_nil(j)
      assert.same(want, j.shape)
      assert.equal("float64", j.dtype)
      assert.equal(0, j:numel())
    end
    empty({0, 3}, t:jacobian(y0, x))                          -- y.shape ++ x.shape
    empty({2, 0, 2, 3}, t:jacobian(y20, xb))
    empty({3, 0}, t:jacobian(y, e))                           -- an empty source
    empty({3, 2, 0}, t:jacobian(y, eb))
    empty({0, 0}, t:jacobian(y0, e))
    empty({0, 3}, t:jacobian(y0, x, {unconnected = "zero"}))
    empty({2, 0, 3}, t:batch_jacobian(y20, xb))               -- (batch, y rest, x rest)
    empty({2, 3, 0}, t:batch_jacobian(yb, eb))
    empty({0, 3, 2}, t:batch_jacobian(y0b, e0))
    local j = t:jacobian(y0, {x, e})                          -- in a list too
    empty({0, 3}, j[1])
    empty({0, 0}, j[2])
    -- a non-persistent tape answers once, empty or not
    local once = mg.tape()
    once:watch(x)
    local z = mg.zeros({0}, "float64") * mg.sum(x)
    once:stop()
    empty({0, 3}, once:jacobian(z, x))
    assert.has_error(function() once:jacobian(z, x) end, "tape:jacobian: a non-persistent tape can only compute "
                     .. "one gradient; create it with mg.tape{persistent=true} to call it again")
  end)

  -- dy_i/dx_k of f at args by args[s], by central differences: rows y's
  -- elements, columns args[s]'s elements (both flattened)
  local function flat (x) return mg.reshape(x, {-1}):totable() end
  local function fd_jacobian (f, args, s)
    local eps, base, rows = 1e-6, flat(args[s]), {}
    for k = 1, #base do
      local function at (d)
        local v = table.move(base, 1, #base, 1, {})
        v[k] = v[k] + d
        local a = table.move(args, 1, #args, 1, {})
        a[s] = mg.reshape(f64(v), args[s].shape)
        return flat(f(table.unpack(a)))
      end
      local up, down = at(eps), at(-eps)
      for i = 1, #up do
        rows[i] = rows[i] or {}
        rows[i][k] = (up[i] - down[i]) / (2 * eps)
      end
    end
    return rows
  end

  it("a list or nested table of sources answers in that structure (TensorFlow's tape.jacobian(y, [x, w]))", function()
    local function f (x, w, b) return mg.tanh(mg.sum(w * x, {2}) + b) * x[1] end
    local x0, w0, b0 = f64({0.5, -1, 2}), f64({{0.1, 0.2, -0.3}, {0.4, -0.5, 0.6}}), f64({0.3, -0.2})
    local x, w, b = mg.Variable(x0, {name = "x"}), mg.Variable(w0, {name = "w"}), mg.Variable(b0, {name = "b"})
    local u = f64({7})                                        -- watched, unconnected
    local t = mg.tape{persistent = true}
    t:watch(u)
    local y = f(x, w, b)
    t:stop()
    local j = t:jacobian(y, {x, {weights = {w = w, b = b}, none = u}})
    assert.same({2, 3}, j[1].shape)
    assert.same({2, 2, 3}, j[2].weights.w.shape)
    assert.same({2, 2}, j[2].weights.b.shape)
    assert.is_nil(j[2].none)                                  -- unconnected: nil, in its place
    local args = {x0, w0, b0}
    for s, got in ipairs({j[1], j[2].weights.w, j[2].weights.b}) do   -- float64, against central differences
      h.assert_close(mg.reshape(got, {2, -1}), fd_jacobian(f, args, s), 1e-6)
    end
    h.assert_close(j[2].weights.w, t:jacobian(y, w), 0)        -- the same as one source at a time
    local g = t:gradient(y, {x, w, b})                          -- summed over y: the gradient
    h.assert_close(mg.sum(j[1], {1}), g[1], 1e-12)
    h.assert_close(mg.sum(j[2].weights.w, {1}), g[2], 1e-12)
    local z = t:jacobian(y, {u, x}, {unconnected = "zero"})
    assert.same({{0}, {0}}, z[1]:totable())
    h.assert_close(z[2], j[1], 0)
    local twice = t:jacobian(y, {x, x})                         -- a source twice: its jacobian twice
    h.assert_close(twice[1], j[1], 0)
    h.assert_close(twice[2], j[1], 0)
    assert.same({}, t:jacobian(y, {}))
  end)

  it("batch_jacobian takes one source, as TensorFlow's, and says so for a table", function()
    local x = f64({{1, 2}, {3, 4}})
    local t = mg.tape{persistent = true}
    t:watch(x)
    local y = x * x
    t:stop()
    assert.same({{{2, 0}, {0, 4}}, {{6, 0}, {0, 8}}}, t:batch_jacobian(y, x):totable())  -- TF's docstring example
    assert.has_error(function() t:batch_jacobian(y, {x}) end, "tape:batch_jacobian: source must be one tensor or "
                     .. "variable, got a table (it takes one source, as TensorFlow's; t:jacobian takes several)")
  end)
end)

describe("custom_gradient", function()
  it("uses the given gradient (TensorFlow's log1pexp example)", function()
    local log1pexp = mg.custom_gradient(function(x)
      local e = mg.exp(x)
      return mg.log(1 + e), function(dy) return dy * (1 - 1 / (1 + e)) end
    end)
    local x = c(100)
    local t, y = h.record(log1pexp, x)
    assert.equal(1, t:gradient(y, x):item())         -- the naive gradient is nan
  end)

  it("passes the variables f read and takes their gradients", function()
    local w = mg.Variable(3.0)
    local seen
    local f = mg.custom_gradient(function(x)
      return x * w, function(dy, variables)
        seen = variables
        return dy * w, {dy * x * 10}
      end
    end)
    local x = c(2)
    local t, y = h.record(f, x)
    local g = t:gradient(y, {x, w})
    assert.equal(3, g[1]:item())
    assert.equal(20, g[2]:item())
    assert.equal(w, seen[1])                          -- the very Variable object
  end)

  it("handles several outputs and outputs without gradient", function()
    local f = mg.custom_gradient(function(a, b)
      return a + b, a * b, function(d1, d2) return d1 + d2 * b, d1 + d2 * a end
    end)
    local a, b = c(2), c(5)
    local t = mg.tape{persistent = true}
    t:watch({a, b})
    local s, p = f(a, b)
    t:stop()
    assert.equal(7, s:item())
    assert.equal(10, p:item())
    local g = t:gradient({s, p}, {a, b})
    assert.same({6, 3}, {g[1]:item(), g[2]:item()})
    g = t:gradient(s, {a, b})                          -- d2 comes in as zeros
    assert.same({1, 1}, {g[1]:item(), g[2]:item()})
  end)

  it("can itself be differentiated again", function()
    local cube = mg.custom_gradient(function(x)
      return x * x * x, function(dy) return dy * 3 * x * x end
    end)
    local x = f64(2)
    local outer = mg.tape()
    outer:watch(x)
    local inner = mg.tape()
    inner:watch(x)
    local y = cube(x)
    inner:stop()
    local g = inner:gradient(y, x)
    outer:stop()
    assert.equal(12, g:item())
    assert.equal(12, outer:gradient(g, x):item())
  end)

  it("an identity function still gets a node of its own", function()
    local ident = mg.custom_gradient(function(x) return x, function(dy) return dy * 2 end end)
    local x = c(1)
    local t, y = h.record(ident, x)
    assert.equal(2, t:gradient(y, x):item())
  end)

  it("errors in grad_fn come out of gradient with their text", function()
    local bad = mg.custom_gradient(function(x) return x * 2, function() return "oops" end end)
    local x = c(1)
    local t, y = h.record(bad, x)
    assert.has_error(function() t:gradient(y, x) end,
      "tape:gradient: in the backward of 'custom_gradient': grad_fn must return tensors or nil, got a string for input 1")
    assert.has_error(function() mg.custom_gradient(function(x2) return x2 end)(c(1)) end,
      "custom_gradient: f must return its outputs and then a gradient function")
  end)
end)

describe("tape errors", function()
  it("name the problem", function()
    local x = c({1, 2})
    local t = mg.tape{persistent = true}
    t:watch(x)
    local y = x * 2
    t:stop()
    assert.has_error(function() t:gradient(y, {x, "w"}) end,
      "tape:gradient: sources[2] is a string, not a tensor or variable")
    assert.has_error(function() t:gradient(y, x, c({1, 2, 3})) end,
      "tape:gradient: output_gradients[1] has shape (3), its target has (2)")
    assert.has_error(function() t:gradient(nil, x) end,
      "bad argument #1 to 'gradient' (moongrad.Tensor expected, got nil)")
    assert.has_error(function() t:gradient(y) end,
      "bad argument #2 to 'gradient' (sources expected (a tensor, a variable or a table of them), got nil)")
    assert.has_error(function() t:gradient(y, x, nil, {unconnected = "zeros"}) end,
      "bad argument #4 to 'gradient' (unconnected must be \"none\" or \"zero\", got \"zeros\")")
    -- the tape still works after all of that
    assert.same({2, 2}, t:gradient(y, x):totable())
  end)
end)

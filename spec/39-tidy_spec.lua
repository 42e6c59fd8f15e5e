-- mg.tidy and mg.dispose free tensors at a known point (TF.js's tidy and
-- dispose), and the library's own re-runs (recompute_grad, ctx:recompute,
-- RevBlock's backward) free what they make when they end: the bytes go
-- at once, with no collection in between.
local mg = require "moongrad"
local h = require "helpers"

local function bytes () return mg.memory.stats().tensor_bytes end

local function fails (f, text)
  local ok, err = pcall(f)
  assert.is_false(ok, "expected an error")
  assert.truthy(tostring(err):find(text, 1, true), ("expected %q in %q"):format(text, tostring(err)))
end

describe("mg.tidy", function()
  local old, oldmin
  -- no collection at all while these run: what goes, goes by tidy
  before_each(function() collectgarbage(); collectgarbage(); collectgarbage("stop"); old, oldmin = mg.memory.setpause(100000, 1 << 40) end)
  after_each(function() mg.memory.setpause(old, oldmin); collectgarbage("restart") end)

  it("releases every tensor made inside but its results", function()
    local x = mg.ones{256, 256}                           -- 256 KiB
    local before = bytes()
    local y = mg.tidy(function()
      local a = x * 2
      local b = mg.tanh(a) + 1
      local _ = b * b
      return b
    end)
    assert.equal(before + 256 * 1024, bytes())            -- only the result is left
    h.assert_close(y, mg.tanh(mg.full({256, 256}, 2)) + 1, 0)
    assert.equal(1, (x * 1):sum():item() / (256 * 256))   -- x, made before, untouched
  end)

  it("keeps the tensors in tables among the results, and passes the extra arguments", function()
    local before = bytes()
    local r, n = mg.tidy(function(k)
      local a, b = mg.ones{16} * k, mg.ones{16} * (k + 1)
      local _ = a + b
      return {a = a, list = {b}}, 7
    end, 3)
    assert.equal(before + 2 * 64, bytes())
    assert.equal(7, n)
    assert.equal(48, r.a:sum():item())
    assert.equal(64, r.list[1]:sum():item())
  end)

  it("passes what an inner tidy keeps to the outer one", function()
    local before = bytes()
    local kept
    local out = mg.tidy(function()
      kept = mg.tidy(function() local t = mg.ones{8} * 5; return t + 1 end)   -- kept by the inner
      return mg.ones{8} * 2
    end)
    assert.equal(before + 32, bytes())                    -- the outer released the inner's result
    fails(function() return kept + 1 end, "tensor has been released")
    assert.equal(16, out:sum():item())
  end)

  it("releases on an error too, and raises the error as it was", function()
    local before = bytes()
    local ok, err = pcall(mg.tidy, function() local _ = mg.ones{64} * 2; error({code = 7}) end)
    assert.is_false(ok)
    assert.equal(7, err.code)
    assert.equal(before, bytes())
    -- a tensor in the error value stays usable
    local ok2, err2 = pcall(mg.tidy, function() error({t = mg.ones{4} * 3}) end)
    assert.is_false(ok2)
    assert.equal(12, err2.t:sum():item())
  end)

  it("a tensor kept elsewhere (an upvalue) is released: using it is an error, not a crash", function()
    local stash
    mg.tidy(function() stash = mg.ones{4} * 2 end)
    fails(function() return stash * 2 end, "tensor has been released")
    fails(function() return tostring(stash) end, "tensor has been released")
  end)

  it("does not change gradients: the tape keeps what it saved", function()
    local w = mg.Variable(mg.random.normal({8, 8}, 0, 1, "float64"))
    local x = mg.random.normal({4, 8}, 0, 1, "float64")
    local function run (wrap)
      local t = mg.tape()
      local loss = wrap(function() return mg.sum(mg.tanh(mg.matmul(mg.tanh(mg.matmul(x, w)), w)) ^ 2) end)
      t:stop()
      return t:gradient(loss, {w})[1]
    end
    local plain = run(function(f) return f() end)
    local tidied = run(mg.tidy)
    h.assert_close(tidied, plain, 0)
  end)

  it("mg.keep takes tensors out of every open scope: an optimizer's slots outlive a tidy step", function()
    local kept
    mg.tidy(function() mg.tidy(function() kept = mg.keep(mg.ones{3} * 2) end) end)
    assert.equal(6, kept:sum():item())
    local x, y = mg.random.normal{8, 4}, mg.random.normal{8, 2}
    local function train (wrap, opt_class, opts)
      mg.random.seed(9)
      local model = mg.nn.Dense(2)
      model(x)
      local vars, opt = model.trainable_variables, opt_class(opts)
      local loss
      for _ = 1, 3 do
        loss = wrap(function()
          local t = mg.tape()
          local l = mg.mean((model(x) - y) ^ 2)
          t:stop()
          opt:apply_gradients(t:gradient(l, vars), vars)
          return l:item()
        end)
      end
      return loss
    end
    for _, case in ipairs({{mg.optim.Adam, {learning_rate = 0.01}}, {mg.optim.SGD, {learning_rate = 0.01, momentum = 0.9}},
                           {mg.optim.RMSprop, {learning_rate = 0.01, momentum = 0.5, centered = true}}}) do
      assert.equal(train(function(f) return f() end, case[1], case[2]), train(mg.tidy, case[1], case[2]))
    end
  end)

  it("checks its argument", function()
    fails(function() mg.tidy() end, "function expected")
    fails(function() mg.tidy(42) end, "function expected")
  end)
end)

describe("mg.dispose", function()
  before_each(function() collectgarbage(); collectgarbage() end)

  it("frees a tensor's bytes now; a second dispose does nothing", function()
    local x = mg.ones{128, 128} * 2
    collectgarbage()
    local before = bytes()
    mg.dispose(x)
    assert.equal(before - 64 * 1024, bytes())
    mg.dispose(x)
    fails(function() return x + 1 end, "tensor has been released")
  end)

  it("takes several tensors, nil and nested tables (cycles too)", function()
    local a, b, c = mg.ones{10} * 1, mg.ones{10} * 2, mg.ones{10} * 3
    local t = {a, {b = b}}
    t[3] = t
    collectgarbage()
    local before = bytes()
    mg.dispose(t, nil, c)
    assert.equal(before - 3 * 40, bytes())
  end)

  it("drops one reference: a view, or a tape that saved the tensor, keeps it", function()
    local x = mg.random.normal({3, 4}, 0, 1, "float64")
    local v = mg.Variable(x)
    local t = mg.tape()
    local y = mg.tanh(v * 1)
    local view = y:slice({1, 2})
    mg.dispose(y)
    local loss = mg.sum(view ^ 2) + mg.sum(mg.tanh(v * 1))
    t:stop()
    local g = t:gradient(loss, {v})[1]
    local th = mg.tanh(x)
    local d = 1 - th ^ 2
    local mask = mg.concat({mg.ones({2, 4}, "float64"), mg.zeros({1, 4}, "float64")}, 1)
    h.assert_close(g, d * (2 * th * mask + 1), 1e-12)
  end)

  it("refuses what is not a tensor, naming the argument", function()
    fails(function() mg.dispose(mg.ones{2}, 5) end, "dispose: argument 2 is a number; it takes tensors or tables of them")
    fails(function() mg.dispose(mg.Variable(mg.ones{2})) end, "dispose: argument 1 is a Variable")
    fails(function() mg.dispose("x") end, "dispose: argument 1 is a string")
  end)
end)

describe("the collector before a gradient keeps to its share", function()
  it("many small gradients with a big Lua heap do not pay a full collection each", function()
    local heap = {}
    for i = 1, 300000 do heap[i] = {i} end
    local x = mg.Variable(mg.ones{4})
    local before = mg.memory.stats().full_collections
    for _ = 1, 200 do
      local t = mg.tape()
      local l = mg.sum(x:value() * x:value())
      t:stop()
      t:gradient(l, {x})
    end
    local fulls = mg.memory.stats().full_collections - before
    assert.is_true(fulls < 60, fulls .. " full collections for 200 gradients")
    assert.equal(300000, #heap)
  end)
end)

describe("the library's re-runs free what they make", function()
  it("recompute_grad: a tensor the re-run stashed is released when it ends", function()
    local stash = {}
    local f = mg.recompute_grad(function(v)
      local hidden = mg.tanh(v * 2)
      stash[#stash + 1] = hidden                       -- first run, then the re-run
      return mg.sum(hidden)
    end)
    local x = mg.Variable(mg.ones({4}, "float64"))
    local t = mg.tape()
    local y = f(x)
    t:stop()
    local g = t:gradient(y, {x})[1]
    h.assert_close(g, mg.full({4}, 2 * (1 - math.tanh(2) ^ 2), "float64"), 1e-12)
    assert.equal(2, #stash)
    assert.equal(4, stash[1]:numel())                  -- the first run is the user's
    fails(function() return stash[2] + 1 end, "tensor has been released")
  end)

  it("nested recompute_grad still gets its arguments back", function()
    local w = mg.Variable(mg.random.normal({4, 4}, 0, 0.5, "float64"))
    local inner = mg.recompute_grad(function(v) return mg.tanh(mg.matmul(v, w)) end)
    local outer = mg.recompute_grad(function(v) return inner(inner(v)) * 2 end)
    local x = mg.random.normal({3, 4}, 0, 1, "float64")
    local function grads (run)
      local t = mg.tape()
      t:watch(x)
      local y = mg.sum(run(x))
      t:stop()
      return t:gradient(y, {x, w})
    end
    local a = grads(outer)
    local b = grads(function(v) local u = mg.tanh(mg.matmul(mg.tanh(mg.matmul(v, w)), w)) return u * 2 end)
    h.assert_close(a[1], b[1], 1e-12)
    h.assert_close(a[2], b[2], 1e-12)
  end)

  it("a recompute_grad result is f's own tensor box, not a second one", function()
    local kept
    local f = mg.recompute_grad(function(v) kept = v * 3; return kept end)
    local x = mg.Variable(mg.ones{2})
    local t = mg.tape()
    local y = f(x)
    t:stop()
    assert.equal(kept, y)
  end)

  it("RevBlock's backward keeps the live set: the peak is the ideal one", function()
    mg.random.seed(5)
    local block = mg.nn.RevBlock(mg.nn.Dense(64, {activation = "tanh"}), mg.nn.Dense(64, {activation = "tanh"}),
                                 {num_layers = 8})
    local x = mg.random.normal{32, 128}
    block(x)
    local vars = block.trainable_variables
    local function peak ()
      local t = mg.tape()
      local loss = mg.mean(block(x) ^ 2)
      t:stop()
      collectgarbage()
      collectgarbage()
      mg.memory.reset_peak()
      local base = mg.memory.stats().current_bytes
      local g = t:gradient(loss, vars)
      return mg.memory.stats().peak_bytes - base, g
    end
    local default, g1 = peak()
    local old, oldmin = mg.memory.setpause(100, 0)
    local ideal, g2 = peak()
    mg.memory.setpause(old, oldmin)
    for i = 1, #g1 do h.assert_close(g1[i], g2[i], 0) end
    assert.is_true(default <= 1.15 * ideal, ("default %d, ideal %d"):format(default, ideal))
  end)
end)

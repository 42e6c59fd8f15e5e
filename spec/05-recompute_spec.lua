-- recompute_grad: the seed behaviour exactly, gradients equal to the plain
-- computation, RNG replay, state updated once, and the blocks built on it.
local mg = require "moongrad"
local h = require "helpers"

local c = mg.constant

-- runs fn(wrap) twice, with wrap = recompute_grad and wrap = identity, and
-- asserts that the gradients it returns are equal (bit for bit unless tol)
local function same_gradients (fn, tol)
  local function flat (v, out)
    out = out or {}
    if mg.is_tensor(v) then out[#out + 1] = v
    elseif type(v) == "table" then for _, x in ipairs(v) do flat(x, out) end end
    return out
  end
  local state = mg.random.get_state()
  local with = flat(fn(mg.recompute_grad))
  mg.random.set_state(state)
  local without = flat(fn(function(f) return f end))
  assert.equal(#without, #with)
  assert.is_true(#with > 0)
  for i = 1, #with do
    if tol then h.assert_close(with[i], without[i], tol)
    else assert.same(without[i]:totable(), with[i]:totable()) end
  end
end

describe("the seed examples print exactly what the documentation shows", function()
  local function lines (n) return ("running\n"):rep(n) end

  it("examples/seed_recompute.lua", function()
    local out, code = h.run(h.bin .. " examples/seed_recompute.lua")
    assert.equal(0, code)
    assert.equal(lines(12), out)
  end)

  it("examples/seed_keras.lua", function()
    local out, code = h.run(h.bin .. " examples/seed_keras.lua")
    assert.equal(0, code)
    assert.equal(lines(12), out)
  end)

  it("prints in the documented order: forward x4, then gradient x4 (and none without recompute)", function()
    local log = {}
    local y = mg.Variable(1.0)
    local function my_function (x)
      log[#log + 1] = "running"
      return x * y
    end
    local function chain (f)
      local t = mg.tape()
      local r = c(1.0)
      for _ = 1, 4 do r = f(r) end
      t:stop()
      log[#log + 1] = "gradient"
      local g = t:gradient(r, {y})
      log[#log + 1] = "done"
      return g
    end
    local g1 = chain(mg.recompute_grad(my_function))
    assert.same({"running", "running", "running", "running", "gradient",
                 "running", "running", "running", "running", "done"}, log)
    log = {}
    local g2 = chain(my_function)
    assert.same({"running", "running", "running", "running", "gradient", "done"}, log)
    assert.equal(4, g1[1]:item())           -- d(y^4)/dy at 1
    assert.same(g2[1]:totable(), g1[1]:totable())
  end)

  it("the Keras form gives the Dense kernel and bias gradients, as without recompute", function()
    local function run (wrap)
      mg.random.seed(11)
      local model = mg.nn.Sequential{mg.nn.Lambda(function(x) return x end), mg.nn.Dense(2)}
      local m = wrap(model)
      local t = mg.tape{persistent = true}
      local r = c({{1, 2}})
      for _ = 1, 4 do r = m(r) end
      t:stop()
      local g1 = t:gradient(r, model.variables)
      local g2 = t:gradient(r, m.__wrapped__ and m.__wrapped__.variables or model.variables)
      assert.same(g1[1]:totable(), g2[1]:totable())
      assert.same({2, 2}, g1[1].shape)
      assert.same({2}, g1[2].shape)
      return g1
    end
    same_gradients(run, 1e-6)
  end)
end)

describe("recompute_grad", function()
  before_each(function() mg.random.seed(5) end)

  it("g(...) equals f(...), g.__wrapped__ is f, other fields come from f", function()
    local f = function(x) return mg.tanh(x) * 2 end
    local g = mg.recompute_grad(f)
    assert.equal(f, g.__wrapped__)
    local x = mg.random.normal{3}
    assert.same(f(x):totable(), g(x):totable())
    local model = mg.nn.Dense(3)
    local gm = mg.recompute_grad(model)
    gm(mg.ones{1, 2})
    assert.equal(2, #gm.variables)
    assert.equal(model.kernel, gm.kernel)
    assert.is_nil(g.anything)
  end)

  it("the tape holds one node with only the arguments", function()
    local x = mg.random.normal{64, 64}
    local w = mg.Variable(mg.random.normal{64, 64})
    local f = function(v) return mg.tanh(mg.matmul(mg.tanh(mg.matmul(v, w)), w)) end
    local t1 = mg.tape()
    t1:watch(x)
    f(x)
    t1:stop()
    local t2 = mg.tape()
    t2:watch(x)
    mg.recompute_grad(f)(x)
    t2:stop()
    assert.equal(64 * 64 * 4 * 3, t1:saved_bytes())     -- x, and two tanh outputs
    assert.equal(64 * 64 * 4, t2:saved_bytes())         -- x only
  end)

  it("gradients equal the plain ones: functions, several arguments, variables", function()
    same_gradients(function(wrap)
      local w = mg.Variable(mg.random.normal({3, 3}, 0, 1, "float64"))
      local a, b = mg.random.normal({2, 3}, 0, 1, "float64"), mg.random.normal({3}, 0, 1, "float64")
      local f = wrap(function(x, y) return mg.tanh(mg.matmul(x, w) + y) * y end)
      local t = mg.tape()
      t:watch({a, b})
      local out = mg.sum(f(a, b) ^ 2)
      t:stop()
      return t:gradient(out, {a, b, w})
    end)
  end)

  it("a tensor passed twice, and nested tables of tensors in and out", function()
    same_gradients(function(wrap)
      local x = mg.random.normal({4}, 0, 1, "float64")
      local f = wrap(function(p, q, tbl)
        return {sum = p * q + tbl.k[1], prod = {mg.exp(tbl.k[2]) * p}}, p
      end)
      local t = mg.tape()
      t:watch(x)
      local out, same = f(x, x, {k = {x * 2, x}})
      assert.same(x:totable(), same:totable())
      local y = mg.sum(out.sum) + mg.sum(out.prod[1])
      t:stop()
      return t:gradient(y, x)
    end)
  end)

  it("callable tables (layers and models) and their variables", function()
    same_gradients(function(wrap)
      mg.random.seed(21)
      local model = mg.nn.Sequential{mg.nn.Dense(8, {activation = "tanh"}), mg.nn.Dense(2)}
      local x = mg.random.normal{5, 4}
      model(x)                                            -- build
      local m = wrap(model)
      local t = mg.tape()
      local loss = mg.mean(m(x) ^ 2)
      t:stop()
      return t:gradient(loss, model.trainable_variables)
    end, 1e-6)
  end)

  it("nested recompute_grad", function()
    same_gradients(function(wrap)
      local w = mg.Variable(mg.random.normal({4, 4}, 0, 0.5, "float64"))
      local inner = wrap(function(v) return mg.tanh(mg.matmul(v, w)) end)
      local outer = wrap(function(v) return inner(inner(v)) * 2 end)
      local x = mg.random.normal({3, 4}, 0, 1, "float64")
      local t = mg.tape()
      t:watch(x)
      local y = mg.sum(outer(x))
      t:stop()
      return t:gradient(y, {x, w})
    end)
  end)

  it("persistent tapes recompute on each gradient call", function()
    local runs = 0
    local f = mg.recompute_grad(function(v) runs = runs + 1; return v * v end)
    local x = c(3)
    local t = mg.tape{persistent = true}
    t:watch(x)
    local y = f(x)
    t:stop()
    assert.equal(1, runs)
    assert.equal(6, t:gradient(y, x):item())
    assert.equal(6, t:gradient(y, x):item())
    assert.equal(3, runs)
  end)

  it("second order through a recomputed function equals second order without", function()
    same_gradients(function(wrap)
      local w = mg.Variable(mg.random.normal({3, 3}, 0, 0.5, "float64"))
      local f = wrap(function(v) return mg.sigmoid(mg.matmul(v, w)) ^ 2 end)
      local x = mg.random.normal({2, 3}, 0, 1, "float64")
      local outer = mg.tape()
      outer:watch(x)
      local inner = mg.tape()
      inner:watch(x)
      local y = mg.sum(f(x))
      inner:stop()
      local g = inner:gradient(y, x)
      local gw = mg.sum(g * g)
      outer:stop()
      return outer:gradient(gw, {x, w})
    end, 1e-12)
  end)

  it("is transparent when no tape records", function()
    local runs = 0
    local f = mg.recompute_grad(function(v) runs = runs + 1; return v + 1 end)
    assert.same({2, 3}, f(c({1, 2})):totable())
    assert.equal(1, runs)
  end)

  it("lets go of what f captured as soon as its node goes: a reset tape, a collected result", function()
    local function live ()
      collectgarbage()
      collectgarbage()
      return mg.memory.stats().tensor_bytes
    end
    local before = live()
    local function run (reset)
      local big = mg.random.normal({256, 256})       -- 256 KiB, captured by f and passed in
      local t = mg.tape()
      local y = mg.recompute_grad(function(_) return mg.tanh(big) end)(big)
      t:stop()
      if reset then t:reset() end
      return mg.is_tensor(y)
    end
    assert.is_true(run(true))
    assert.are.equal(before, live())
    assert.is_true(run(false))                       -- the tape and the result collected
    assert.are.equal(before, live())
  end)

  it("its re-run's backward takes the walk's own output gradient: no copy beside it at its peak", function()
    -- the backward of a recomputed block peaks at what its re-run saves plus
    -- the plain block's working set: the output gradient the walk hands it
    -- is the re-run walk's seed, which its first rule may write over
    mg.random.seed(9)
    local x, w, c = mg.random.normal({512, 256}), mg.random.normal({256, 256}), mg.random.normal({512, 256})
    local block = function(h) for _ = 1, 4 do h = mg.tanh(mg.matmul(h, w)) end return h end
    -- a fresh dout (mul's), as the next block's would be
    local function backward (f) return h.gradient_peak(x, function() return mg.sum(f(x) * c) end) end
    local release = h.hold_threads()                 -- same bits: one thread count for both
    local plain_peak, plain_saved, plain_g = backward(block)
    local peak, saved, g = backward(mg.recompute_grad(block))
    release()
    h.assert_close(g, plain_g, 0)
    -- beyond the plain backward's working set, the re-run holds what the
    -- plain tape saved and the recomputed one did not, and its forward's
    -- in-flight product; a copy of the output gradient beside it would be
    -- one activation more (what this measured before the handover)
    local act = x.nbytes
    local bound = plain_peak + (plain_saved - saved) + 2 * act
    assert.is_true(peak < bound, ("peak %d, at most %d"):format(peak, bound))
    -- a re-run that fails with the gradient handed over lets it go
    local runs = 0
    local bad = mg.recompute_grad(function(v)
      runs = runs + 1
      if runs > 1 then error("boom in the re-run", 0) end
      return block(v)
    end)
    collectgarbage()
    collectgarbage()
    local live = mg.memory.stats().current_bytes
    assert.has_error(function() backward(bad) end, "tape:gradient: in the backward of 'recompute_grad': boom in the re-run")
    collectgarbage()
    collectgarbage()
    assert.equal(live, mg.memory.stats().current_bytes)
  end)

  it("gradients can be gradchecked through it", function()
    local w = mg.random.normal({3, 2}, 0, 1, "float64")
    local f = mg.recompute_grad(function(x, v) return mg.tanh(mg.matmul(x, v)) end)
    assert.is_true(mg.test.gradcheck(f, {mg.random.normal({4, 3}, 0, 1, "float64"), w}))
  end)
end)

describe("randomness and state under recompute", function()
  it("dropout masks replay: gradients equal bit for bit", function()
    same_gradients(function(wrap)
      mg.random.seed(99)
      local w = mg.Variable(mg.random.normal{16, 16})
      local f = wrap(function(v) return mg.nn.dropout(mg.tanh(mg.matmul(v, w)), 0.5) end)
      local x = mg.random.normal{8, 16}
      local t = mg.tape()
      local y = mg.sum(f(f(x)))
      t:stop()
      return t:gradient(y, w)
    end)
  end)

  it("the global stream after a gradient is as if no recompute happened", function()
    local function run (wrap)
      mg.random.seed(3)
      local f = wrap(function(v) return mg.nn.dropout(v, 0.3) end)
      local x = mg.random.normal{10}
      local t, y = h.record(f, x)
      t:gradient(y, x)
      return mg.random.normal{5}
    end
    local a = run(mg.recompute_grad)
    local b = run(function(f) return f end)
    assert.same(b:totable(), a:totable())
  end)

  it("a Dropout layer built lazily inside recompute does not shift the masks", function()
    same_gradients(function(wrap)
      mg.random.seed(8)
      local model = mg.nn.Sequential{mg.nn.Dense(6), mg.nn.Dropout(0.5), mg.nn.Dense(3)}
      local m = wrap(model)
      local x = mg.random.normal{4, 5}
      local t = mg.tape()
      local y = mg.sum(m(x))
      t:stop()
      return t:gradient(y, model.variables)
    end)
  end)

  it("is_recomputing is true only during the re-run", function()
    local seen = {}
    local f = mg.recompute_grad(function(v)
      seen[#seen + 1] = mg.is_recomputing()
      return v * 2
    end)
    local x = c(1)
    local t, y = h.record(f, x)
    assert.is_false(mg.is_recomputing())
    t:gradient(y, x)
    assert.same({false, true}, seen)
  end)

  it("the TF1 form passes {is_recomputing=} to f", function()
    local flags = {}
    local f = mg.recompute_grad(function(v, opts)
      flags[#flags + 1] = opts.is_recomputing
      return v * 3
    end, {pass_is_recomputing = true})
    local x = c(1)
    local t, y = h.record(f, x)
    assert.equal(3, t:gradient(y, x):item())
    assert.same({false, true}, flags)
  end)

  it("a batch-norm running statistic moves once per forward, not again on recompute", function()
    local bn = mg.nn.BatchNorm{momentum = 0.5}
    local f = mg.recompute_grad(bn)
    local x = mg.constant({{1, 2}, {3, 6}})
    local t = mg.tape()
    local y = mg.sum(f(x) * mg.constant({1, 2}))
    t:stop()
    assert.equal(1, bn.updates)
    assert.same({1, 2}, bn.moving_mean:totable())          -- 0.5 * 0 + 0.5 * {2, 4}
    local g = t:gradient(y, bn.trainable_variables)
    assert.equal(1, bn.updates)
    assert.same({1, 2}, bn.moving_mean:totable())
    assert.same({0, 0}, g[1]:totable())                      -- d/dgamma: sum of normalized x
    assert.same({2, 4}, g[2]:totable())                      -- d/dbeta
  end)
end)

describe("checkpoint_sequential and RevBlock", function()
  it("checkpoint_sequential gives the plain gradients", function()
    same_gradients(function(wrap)
      mg.random.seed(4)
      local layers = {}
      for i = 1, 9 do layers[i] = mg.nn.Dense(6, {activation = "tanh"}) end
      local x = mg.random.normal({3, 6}, 0, 1, "float64")
      local checkpointed = wrap == mg.recompute_grad
      local t = mg.tape()
      t:watch(x)
      local y
      if checkpointed then
        y = mg.nn.checkpoint_sequential(layers, 3, mg.cast(x, "float32"))
      else
        y = mg.cast(x, "float32")
        for _, l in ipairs(layers) do y = l(y) end
      end
      local total = mg.sum(y)
      t:stop()
      local vars = {}
      for _, l in ipairs(layers) do vars[#vars + 1] = l.kernel; vars[#vars + 1] = l.bias end
      return t:gradient(total, vars)
    end, 1e-6)
  end)

  it("RevBlock matches the plain computation to float32 tolerance", function()
    mg.random.seed(12)
    local f = mg.nn.Sequential{mg.nn.Dense(8, {activation = "tanh"})}
    local g = mg.nn.Sequential{mg.nn.Dense(8, {activation = "relu"})}
    local block = mg.nn.RevBlock(f, g, {num_layers = 3})
    local x1, x2 = mg.random.normal{4, 8}, mg.random.normal{4, 8}
    f(x1); g(x1)                                              -- build
    local function plain (a, b)
      for _ = 1, 3 do
        local y1 = a + f(b)
        b = b + g(y1)
        a = y1
      end
      return a, b
    end
    local vars = block.trainable_variables
    assert.equal(4, #vars)
    local t1 = mg.tape()
    t1:watch({x1, x2})
    local y1, y2 = block(x1, x2)
    local l1 = mg.sum(y1 * y1) + mg.sum(y2 * 3)
    t1:stop()
    local got = t1:gradient(l1, {x1, x2, vars})
    local t2 = mg.tape()
    t2:watch({x1, x2})
    local p1, p2 = plain(x1, x2)
    local l2 = mg.sum(p1 * p1) + mg.sum(p2 * 3)
    t2:stop()
    local want = t2:gradient(l2, {x1, x2, vars})
    h.assert_close(y1, p1, 1e-6)
    h.assert_close(got[1], want[1], 1e-4)
    h.assert_close(got[2], want[2], 1e-4)
    for k = 1, 4 do h.assert_close(got[3][k], want[3][k], 1e-4) end
  end)

  it("RevBlock on one tensor splits its last axis in halves", function()
    mg.random.seed(2)
    local block = mg.nn.RevBlock(mg.nn.Dense(3), mg.nn.Dense(3))
    local x = mg.random.normal{2, 6}
    local y = block(x)
    assert.same({2, 6}, y.shape)
    assert.has_error(function() block(mg.ones{2, 5}) end,
                     "RevBlock: the last dimension (5) must be even to split in halves")
  end)
end)

describe("recompute_grad errors", function()
  it("name the problem", function()
    assert.has_error(function() mg.recompute_grad(42) end,
      "bad argument #1 to 'recompute_grad' (f must be callable (a function, or a table with __call), got number)")
    local x = c(1)
    local t = mg.tape()
    t:watch(x)
    -- results of any type pass through (spec/41-nontensor_spec.lua): no tensor, nothing recorded
    assert.equal("no", mg.recompute_grad(function() return "no" end)(x))
    assert.equal(0, select("#", mg.recompute_grad(function() end)(x)))
    local calls = 0
    local shifty = mg.recompute_grad(function(v)
      calls = calls + 1
      return calls == 1 and v * 2 or mg.stack({v, v})
    end)
    local y = shifty(x)
    t:stop()
    assert.has_error(function() t:gradient(y, x) end,
      "tape:gradient: in the backward of 'recompute_grad': the recomputed function gave output 1 as (2) float32, the first run gave () float32 (it must be deterministic)")
  end)

  it("an error while recomputing names where it happened, and frees the tape", function()
    local runs = 0
    local f = mg.recompute_grad(function(v)
      runs = runs + 1
      if runs > 1 then error("boom in the re-run", 0) end
      return v * 2
    end)
    local x = c(1)
    local t, y = h.record(f, x)
    assert.has_error(function() t:gradient(y, x) end,
      "tape:gradient: in the backward of 'recompute_grad': boom in the re-run")
    assert.equal(0, t:saved_bytes())
    assert.is_false(mg.is_recomputing())
  end)

  it("an error inside f leaves the tapes recording", function()
    local x = c(2)
    local t = mg.tape()
    t:watch(x)
    assert.has_error(function() mg.recompute_grad(function() error("boom") end)(x) end)
    assert.is_true(t:is_recording())
    local y = x * x
    t:stop()
    assert.equal(4, t:gradient(y, x):item())
  end)
end)

describe("recompute_grad's save policies", function()
  mg.random.seed(5)
  local blocks, vars = {}, {}
  for i = 1, 3 do
    blocks[i] = mg.nn.Sequential{mg.nn.Dense(16, {activation = "tanh"}), mg.nn.Dense(8, {activation = "tanh"})}
  end
  local x = mg.random.normal{4, 8}
  do local h = x for _, b in ipairs(blocks) do h = b(h) end end
  for _, b in ipairs(blocks) do for _, v in ipairs(b.trainable_variables) do vars[#vars + 1] = v end end

  -- gradients, what the tape held, and the bytes the gradient allocated
  local function run (policy)
    local t = mg.tape()
    local h = x
    for _, b in ipairs(blocks) do
      h = (policy == nil and b or mg.recompute_grad(b, {policy = policy}))(h)
    end
    local loss = mg.sum(h ^ 2)
    t:stop()
    local held = t:saved_bytes()
    local before = mg.memory.stats().allocated_bytes
    local g = t:gradient(loss, vars)
    return g, held, mg.memory.stats().allocated_bytes - before
  end

  it("give the plain tape's gradients, whatever they keep", function()
    local ref = run(nil)
    local asked = {}
    for _, policy in ipairs{"nothing", "dots", "everything", "output",
                            function(op, shape, dtype) asked[#asked + 1] = {op, #shape, dtype}; return op == "tanh" end} do
      local g = run(policy)
      for i = 1, #ref do h.assert_close(g[i], ref[i], 0) end      -- the same ops, bit for bit
    end
    assert.is_true(#asked > 0)
    assert.same("float32", asked[1][3])
  end)

  it("keep what they say, and the re-run takes it instead of computing it again", function()
    local _, plain_held = run(nil)
    local _, nothing_held, nothing_alloc = run("nothing")
    local _, dots_held, dots_alloc = run("dots")
    local _, everything_held = run("everything")
    assert.equal(plain_held, everything_held)           -- everything: the plain tape
    assert.is_true(nothing_held < dots_held)             -- dots keeps the matmul outputs ...
    assert.is_true(dots_alloc < nothing_alloc)           -- ... and the re-run skips them
  end)

  it("\"output\" keeps the block's result: the re-run stops short of the last op", function()
    local _, nothing_held, nothing_alloc = run("nothing")
    local _, output_held, output_alloc = run("output")
    local last = 4 * 8 * 4                               -- a block's result: 4x8 float32
    assert.equal(nothing_held, output_held)              -- held anyway: the next block's input, h^2's
    assert.equal(nothing_alloc - #blocks * last, output_alloc)   -- each re-run skips its last op
  end)

  it("\"output\" keeps nothing when the result is not the last op's", function()
    local v = mg.constant({{1, 2}, {3, 4}})
    local function f (a) local y = a * 2; local _ = mg.tanh(a); return y end   -- a later op's output is dropped
    local t = mg.tape()
    t:watch(v)
    local plain = mg.recompute_grad(f)(v)
    local held = t:saved_bytes()
    local y = mg.recompute_grad(f, {policy = "output"})(v)
    assert.equal(held, t:saved_bytes())                  -- only v, which both hold: not tanh's output
    local loss = mg.sum(y * y) + mg.sum(plain)
    t:stop()
    h.assert_close(t:gradient(loss, v), mg.constant({{10, 18}, {26, 34}}), 0)   -- 8v + 2
  end)

  it("reject unknown policies, and a failing policy fails the call", function()
    assert.has_error(function() mg.recompute_grad(mg.tanh, {policy = "dot"}) end,
      "bad argument #2 to 'recompute_grad' (option 'policy' must be \"nothing\", \"dots\", \"everything\", \"output\" or a function, got \"dot\")")
    local f = mg.recompute_grad(function(v) return mg.tanh(v) * 2 end, {policy = function() error("no", 0) end})
    local t = mg.tape()
    t:watch(x)
    assert.has_error(function() f(x) end, "recompute_grad: the policy failed: no")
    t:stop()
  end)

  it("give the exact gradient whichever ops of a kind they keep, nested or not", function()
    -- f(x) = m^3 with m = sum(2x): three muls, only the scalar ones kept;
    -- the re-run must hand each op its own kept output (ordinal per kind)
    local x = mg.constant({1, 2, 3}, "float64")
    local function f (v) local m = mg.sum(v * 2); return (m * m) * m end
    local want = 3 * 12 ^ 2 * 2
    local policies = {
      function(op, shape) return op == "mul" and #shape == 0 end,
      function(op, shape) return op == "mul" and #shape == 1 end,
      function(op) return op == "sum" end,
      function(op, shape) return #shape == 0 end,
      "everything", "nothing",
    }
    local function nested (p) return function(v) return mg.recompute_grad(f, {policy = p})(v) * 1 end end
    for i, p in ipairs(policies) do
      for _, g in ipairs{mg.recompute_grad(f, {policy = p}), mg.recompute_grad(nested(p), {policy = p})} do
        local t = mg.tape()
        t:watch(x)
        local y = g(x)
        t:stop()
        assert.same({want, want, want}, t:gradient(y, x):totable(), "policy " .. i)
      end
    end
  end)

  it("a recompute with a policy inside one with a policy: the outer runs count the same ops", function()
    -- the outer's first run (tapes paused) runs the inner f as it is; its re-run
    -- must too, or the outer's own exp takes the inner exp's kept output
    local x = mg.constant({0.1, 0.2, 0.3}, "float64")
    local inner = mg.recompute_grad(function(u) return mg.exp(u) end, {policy = "dots"})
    local function g (v) return inner(v) + mg.exp(v * 2) end
    local want = h.grad(g, x)
    for _, p in ipairs{function(op) return op == "exp" end, "dots", "nothing", function() return true end} do
      h.assert_close(h.grad(mg.recompute_grad(g, {policy = p}), x), want, 0)
    end
  end)

  it("asks a Lua policy with each op's name, output shape, dtype and whether \"dots\" would keep it", function()
    local w = mg.Variable(mg.random.normal({5, 3}, 0, 1, "float64"))
    local asked = {}
    local f = mg.recompute_grad(function(v) return mg.tanh(mg.matmul(v, w)) end,
                                {policy = function(op, shape, dtype, product)
                                   asked[#asked + 1] = {op, table.concat(shape, "x"), dtype, product}
                                   return product
                                 end})
    local x = mg.random.normal({4, 5}, 0, 1, "float64")
    local t = mg.tape()
    local y = mg.sum(f(x))
    t:stop()
    assert.are.same({{"matmul", "4x3", "float64", true}, {"tanh", "4x3", "float64", false}}, asked)
    h.assert_close(t:gradient(y, w), h.grad(function() return mg.tanh(mg.matmul(x, w)) end, w), 0)
  end)

  it("a maths op's kept output (sin, erf ...) is taken by the re-run, as tanh's is", function()
    local x = mg.random.normal({64, 64}, 0, 1, "float64")
    local function grad_alloc (keep)
      local f = mg.recompute_grad(function(v) return mg.exp(mg.sin(v)) end,
                                  {policy = function(op) return op == keep end})
      local t = mg.tape()
      t:watch(x)
      local y = mg.sum(f(x))
      t:stop()
      local held = t:saved_bytes()
      local before = mg.memory.stats().allocated_bytes
      local g = t:gradient(y, x)
      return g, held, mg.memory.stats().allocated_bytes - before
    end
    local g0, held0, alloc0 = grad_alloc("none")
    local g1, held1, alloc1 = grad_alloc("sin")
    h.assert_close(g1, g0, 0)
    assert.equal(held0 + 64 * 64 * 8, held1)             -- sin's output kept ...
    assert.is_true(alloc1 < alloc0, alloc1 .. " >= " .. alloc0)   -- ... and not computed again
  end)

  -- every op runs through the dispatcher: whatever a policy keeps, the
  -- re-run takes instead of computing it again (and its gradient is the plain one)
  it("any op's kept output is taken by the re-run, not computed again", function()
    local x = mg.random.normal({48, 40}, 0, 1, "float64")
    local lo, hi = mg.constant(-0.5, "float64"), mg.constant(0.5, "float64")
    local cases = {
      where = function(v) return mg.where(mg.greater(v, 0), v, v * 0.5) end,
      clamp = function(v) return mg.clamp(v, lo, hi) end,
      softmax = function(v) return mg.softmax(v, 2) end,
      log_softmax = function(v) return mg.log_softmax(v, 2) end,
      logsumexp = function(v) return mg.logsumexp(v, 2, true) end,
      cumsum = function(v) return mg.cumsum(v, 2) end,
      layer_norm = function(v) return mg.layer_norm(v) end,
      concat = function(v) return mg.concat({v, v}, 1) end,
      tile = function(v) return mg.tile(v, {2, 1}) end,
      pad = function(v) return mg.pad(v, {{1, 1}, {0, 2}}) end,
      sum = function(v) return mg.sum(v, 1, true) end,
      var = function(v) return mg.var(v, 2, true) end,
    }
    for name, op in pairs(cases) do
      local function grad_alloc (keep)
        local f = mg.recompute_grad(function(v) return mg.exp(op(mg.sin(v))) end,
                                    {policy = function(o) return o == keep end})
        local t = mg.tape()
        t:watch(x)
        local y = mg.sum(f(x))
        t:stop()
        local before = mg.memory.stats().allocated_bytes
        local g = t:gradient(y, x)
        return g, mg.memory.stats().allocated_bytes - before
      end
      local g0, alloc0 = grad_alloc("none")
      local g1, alloc1 = grad_alloc(name)
      h.assert_close(g1, g0, 0)
      assert.is_true(alloc1 < alloc0, name .. ": " .. alloc1 .. " >= " .. alloc0)
    end
  end)

  it("a gradient taken inside the block runs the same ops in the first run and the re-run", function()
    -- the first run walks with no tape recording, the re-run under its
    -- local tape: a walk's shortcuts (a gradient written over, x ^ 2's
    -- two-op backward) are off in both, so kept outputs and verify's log
    -- match op for op
    local x = mg.constant({0.5, -1.0, 2.0})
    local function square_penalty (a)                -- d/da sum(a^2), cubed: 8 a^3
      local t = mg.tape()
      t:watch(a)
      local y = mg.sum(a ^ 2)
      t:stop()
      return t:gradient(y, a) ^ 3
    end
    local function tanh_penalty (a)
      local t = mg.tape()
      t:watch(a)
      local y = mg.sum(mg.tanh(a * 3) * a)
      t:stop()
      return t:gradient(y, a) * a
    end
    for _, block in ipairs{square_penalty, tanh_penalty} do
      local want = h.grad(function(a) return mg.sum(block(a)) end, x)
      for _, opts in ipairs{{policy = "output"}, {policy = function(name) return name == "pow" end},
                            {policy = "nothing"}, {verify = true}, {verify = true, policy = "dots"}} do
        local f = mg.recompute_grad(block, opts)
        h.assert_close(h.grad(function(a) return mg.sum(f(a)) end, x), want, 0)
      end
    end
    h.assert_close(h.grad(function(a) return mg.sum(square_penalty(a)) end, x), {6, 24, 96}, 0)
  end)

  it("a policy's own ops are not asked about", function()
    local asked = 0
    local f = mg.recompute_grad(function(v) return mg.tanh(v) * 2 end,
                                {policy = function(op) asked = asked + 1; return mg.sum(x):item() > 0 end})
    local t = mg.tape()
    t:watch(x)
    local y = f(x)
    t:stop()
    assert.equal(2, asked)
    assert.is_true(mg.is_tensor(t:gradient(y, x)))
  end)
end)

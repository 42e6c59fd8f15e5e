-- Recompute and reversible layers (the seeds' AbstractRecomputeWrapper):
-- custom gradient contexts that save what the tapes count, loop depth,
-- Layer:subclass, RecomputeLayer, ReversibleLayer and the layers built on it
-- (RevBlock, AffineCoupling, InvertibleLinear), BatchNorm on ctx:save.
local mg = require "moongrad"
local h = require "helpers"
local nn = mg.nn

local function f64 (shape, sd) return mg.random.normal(shape, 0, sd or 1, "float64") end

-- the largest absolute difference between two tensors or nested lists of them
local function max_diff (a, b)
  if mg.is_tensor(a) or mg.is_variable(a) then return mg.max(mg.abs(a - b)):item() end
  local m = 0
  assert.equal(#b, #a)
  for i = 1, #a do m = math.max(m, max_diff(a[i], b[i])) end
  return m
end

local function variables_of (layers)
  local vars = {}
  for _, l in ipairs(layers) do
    for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end
  end
  return vars
end

-- {==================== custom gradient contexts ====================

describe("custom_gradient with a context", function()
  local function exp_saving ()
    return mg.custom_gradient(function(ctx, x)
      local y = mg.exp(x)
      ctx:save(y, nil, x)
      return y, function(dy)
        local a, hole, b = ctx:saved()
        assert(hole == nil and b:numel() == x:numel())
        return dy * a
      end
    end, {context = true})
  end

  it("counts what ctx:save keeps, in the tape and the saved role, until the node goes", function()
    local f = exp_saving()
    local x = mg.random.normal{256, 256}                   -- 256 KiB
    local base = h.settled()
    local t = mg.tape()
    t:watch(x)
    local loss = mg.sum(f(x))
    t:stop()
    local s = h.settled()
    assert.equal(2 * 262144, t:saved_bytes())              -- exp(x) and x
    assert.equal(base.saved_bytes + 2 * 262144, s.saved_bytes)
    local g = t:gradient(loss, x)
    h.assert_close(g, mg.exp(x), 1e-6)
    assert.equal(base.saved_bytes, h.settled().saved_bytes)   -- let go with the node
  end)

  it("lets go with a persistent tape's reset, and forget() lets go of one at once", function()
    local kept
    local f = mg.custom_gradient(function(ctx, x)
      kept = ctx
      ctx:save(x * 2, x * 3)
      return x * 4, function(dy) return dy * 4 end
    end, {context = true})
    local x = mg.random.normal{128, 128}                   -- 64 KiB
    local t = mg.tape{persistent = true}
    t:watch(x)
    local y = f(x)
    t:stop()
    assert.equal(2 * 65536, t:saved_bytes())
    assert.is_true(kept:is_recorded())
    kept:forget(1)
    assert.equal(65536, t:saved_bytes())
    local a, b = kept:saved()
    assert.is_nil(a)
    h.assert_close(b, x * 3)
    assert.equal("moongrad.CustomContext (2 saved, recorded)", tostring(kept))
    t:reset()
    assert.equal(0, t:saved_bytes())
    assert.is_false(kept:is_recorded())
    assert.has_error(function() kept:saved() end,
      "ctx:saved: what this call saved is gone (no tape recorded the call, or its tape let go of it)")
    assert.is_not_nil(y)
  end)

  it("keeps nothing when no tape records the call", function()
    local f = exp_saving()
    local base = h.settled()
    local y = f(mg.ones{64, 64})
    assert.equal(base.saved_bytes, h.settled().saved_bytes)
    assert.same({64, 64}, y.shape)
  end)

  it("without a context the forward is recorded (TensorFlow's form): what its ops keep is counted", function()
    local f = mg.custom_gradient(function(x)
      local y = mg.exp(x)
      return y, function(dy) return dy * y end
    end)
    local x = mg.random.normal{64, 64}
    local t = mg.tape()
    t:watch(x)
    local loss = mg.sum(f(x))
    t:stop()
    assert.equal(64 * 64 * 4, t:saved_bytes())              -- exp keeps y, for a second order
    h.assert_close(t:gradient(loss, x), mg.exp(x), 1e-6)
  end)

  it("needs_input_grad says which gradients the walk wants", function()
    local seen
    local f = mg.custom_gradient(function(ctx, a, b)
      return a * b, function(dy)
        seen = {ctx:needs_input_grad(1), ctx:needs_input_grad(2)}
        return dy * b, dy * a
      end
    end, {context = true})
    local a, b = mg.random.normal{3}, mg.random.normal{3}
    local t = mg.tape()
    t:watch(a)
    local y = mg.sum(f(a, b))
    t:stop()
    t:gradient(y, a)
    assert.same({true, false}, seen)
  end)

  it("ctx:recompute runs as a re-run: is_recomputing, the call's random state", function()
    local drawn, again, flags
    local f = mg.custom_gradient(function(ctx, x)
      drawn = mg.random.uniform{4}
      return x * drawn, function(dy)
        local before = mg.random.get_state()
        again, flags = ctx:recompute(function(n) return mg.random.uniform{n}, mg.is_recomputing() end, 4)
        assert.same(before, mg.random.get_state())        -- the stream goes on as if nothing ran
        return dy * again
      end
    end, {context = true})
    local x = mg.ones{4}
    local t = mg.tape()
    t:watch(x)
    local y = mg.sum(f(x))
    t:stop()
    assert.is_false(mg.is_recomputing())
    local g = t:gradient(y, x)
    assert.same(drawn:totable(), again:totable())
    assert.is_true(flags)
    assert.same(drawn:totable(), g:totable())
    assert.has_error(function()
      local t2 = mg.tape()
      t2:watch(x)
      local z = mg.sum(mg.custom_gradient(function(ctx, v)
        return v * 1, function(dy) return ctx:recompute(error, "from fn") end
      end, {context = true})(x))
      t2:stop()
      t2:gradient(z, x)
    end, "tape:gradient: in the backward of 'custom_gradient': from fn")
  end)

  it("names misuse", function()
    local ctx
    local f = mg.custom_gradient(function(c, x) ctx = c; return x * 2, function(dy) return dy * 2 end end,
                                 {context = true})
    local x = mg.ones{2}
    f(x)
    assert.has_error(function() ctx:save(x) end, "ctx:save: only while the custom gradient's forward runs")
    assert.has_error(function() ctx:needs_input_grad(1) end,
      "ctx:needs_input_grad: only while the custom gradient's backward runs")
    assert.has_error(function() ctx:forget(1) end, "bad argument #1 to 'forget' (index 1 is out of range (0 saved))")
    assert.has_error(function()
      mg.custom_gradient(function(c, v) c:save(v, "no"); return v, function(d) return d end end, {context = true})(x)
    end, "ctx:save: argument 2 is a string, not a tensor (or nil)")
    assert.has_error(function() mg.custom_gradient(mg.exp, {contxt = true}) end,
      "bad argument #2 to 'custom_gradient' (unknown option 'contxt' (did you mean 'context'?); known: context, captures, rereads)")
    assert.has_error(function() mg.custom_gradient(mg.exp, {rereads = true}) end,
      "custom_gradient: rereads = true needs context = true (without a context the forward is recorded, and what it closes over gets its gradient through it)")
  end)

  it("with rereads, refuses a backward after a variable the forward read was assigned", function()
    local w = mg.Variable(mg.constant({0.5, -1}, "float64"), {name = "w"})
    local f = mg.custom_gradient(function(ctx, x)
      ctx:save(x)
      return x * w, function(dy, vars) return dy * w, {dy * ctx:saved()} end
    end, {context = true, rereads = true})
    local x = mg.constant({2, 3}, "float64")
    local t = mg.tape({persistent = true})
    t:watch(x)
    local loss = mg.sum(f(x))
    t:stop()
    assert.are.same({2, 3}, t:gradient(loss, w):totable())
    w:assign(w:value() * 2)
    local ok, e = pcall(t.gradient, t, loss, w)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("custom_gradient: variable 'w' was assigned after the forward", 1, true), e)
  end)
end)

-- }===================================================================


-- {============================ loops ==============================

describe("is_in_loop", function()
  it("is true inside mg.in_loop, nested, and false again after an error", function()
    assert.is_false(mg.is_in_loop())
    local inside, nested = mg.in_loop(function(a)
      return mg.is_in_loop() and a, mg.in_loop(mg.is_in_loop)
    end, "yes")
    assert.equal("yes", inside)
    assert.is_true(nested)
    assert.is_false(mg.is_in_loop())
    assert.has_error(function() mg.in_loop(error, "boom") end, "boom")
    assert.is_false(mg.is_in_loop())
  end)

  it("holds in the backward of a custom gradient, and the re-run of a recompute, called in a loop", function()
    local custom_saw, rerun_saw = nil, {}
    local f = mg.custom_gradient(function(x)
      return x * 2, function(dy) custom_saw = mg.is_in_loop(); return dy * 2 end
    end)
    local g = mg.recompute_grad(function(x) rerun_saw[#rerun_saw + 1] = mg.is_in_loop(); return x * 3 end)
    local x = mg.ones{2}
    local t = mg.tape()
    t:watch(x)
    local y = mg.in_loop(function() return mg.sum(g(f(x))) end)
    t:stop()
    assert.is_false(mg.is_in_loop())
    t:gradient(y, x)
    assert.is_true(custom_saw)
    assert.same({true, true}, rerun_saw)
  end)
end)

-- }===================================================================


-- {=========================== subclasses ===========================

describe("Layer:subclass", function()
  it("makes a layer class whose fields track variables and layers", function()
    local Block = nn.Layer:subclass("MyBlock")
    function Block:init (units)
      self.inner = nn.Dense(units)
      self.scale = mg.Variable(mg.ones{units})
      self.more = {nn.Dense(units), nn.Dense(units)}
    end
    function Block:call (x) return self.more[2](self.more[1](self.inner(x))) * self.scale end
    local b = Block(3)
    assert.equal("my_block", b.name:match("^(my_block)"))
    local y = b(mg.ones{2, 3})
    assert.same({2, 3}, y.shape)
    assert.equal(7, #b.variables)                          -- scale, 3 kernels, 3 biases
    local Plain = nn.Layer:subclass("Plain")
    assert.has_error(function() Plain(1) end,
      "Plain: the constructor takes no arguments (define Plain:init(...) to take some)")
    assert.has_error(function() nn.Layer:subclass("my block") end,
      "Layer:subclass: name must be an identifier (letters, digits, _), got 'my block'")
  end)
end)

-- }===================================================================


-- {========================= RecomputeLayer =========================

describe("RecomputeLayer", function()
  local Block = nn.RecomputeLayer:subclass("Block")
  function Block:init () self.a, self.b = nn.Dense(16, "tanh"), nn.Dense(8) end
  function Block:call (x)
    self.calls = (rawget(self, "calls") or 0) + 1
    self.seen = self.seen or {}
    self.seen[#self.seen + 1] = {self:is_recomputing(), self:is_in_loop()}
    return self.b(self.a(x))
  end

  it("runs call under recompute: held inputs only, the same gradients, call again in the backward", function()
    mg.random.seed(3)
    local block = Block()
    local x = f64{4, 8}
    block(x)
    rawset(block, "calls", 0)
    rawset(block, "seen", {})
    local vars = block.trainable_variables
    assert.equal(4, #vars)
    local t = mg.tape()
    t:watch(x)
    local y = mg.in_loop(function() return mg.sum(mg.tanh(block(x))) end)
    t:stop()
    assert.equal(1, block.calls)
    local got = t:gradient(y, {x, vars})
    assert.equal(2, block.calls)
    assert.same({{false, true}, {true, true}}, block.seen)
    local t2 = mg.tape()
    t2:watch(x)
    local y2 = mg.sum(mg.tanh(block:call(x)))
    t2:stop()
    local want = t2:gradient(y2, {x, vars})
    assert.equal(0, max_diff(got, want))
  end)

  it("holds only its inputs, and takes a policy", function()
    local block = Block()
    local x = mg.random.normal{512, 8}
    local t = mg.tape()
    t:watch(x)
    local y = block(x)
    t:stop()
    assert.equal(512 * 8 * 4, t:saved_bytes())
    block.policy = "everything"
    local t2 = mg.tape()
    t2:watch(x)
    block(x)
    t2:stop()
    assert.is_true(t2:saved_bytes() > 512 * 8 * 4)
    assert.is_not_nil(y)
  end)

  it("is a base class", function()
    assert.has_error(function() nn.RecomputeLayer() end,
      "RecomputeLayer: RecomputeLayer is a base class: make one with mg.nn.RecomputeLayer:subclass(name) and define call")
    assert.has_error(function() nn.ReversibleLayer() end,
      "ReversibleLayer: ReversibleLayer is a base class: make one with mg.nn.ReversibleLayer:subclass(name) and define forward and inverse")
  end)
end)

-- }===================================================================


-- {========================= reversible layers =======================

-- a user layer with the default backward: y = x * exp(a)
local Scale = nn.ReversibleLayer:subclass("Scale")
function Scale:forward (x)
  if not rawget(self, "a") then self.a = mg.Variable(mg.random.normal({x.shape[x.ndim]}, 0, 0.3, x.dtype)) end
  return x * mg.exp(self.a)
end
function Scale:inverse (y) return y * mg.exp(-self.a) end

-- the layers of a mixed flow on D features, each called with (x, logdet) when two
local function mixed_chain (D)
  return {
    {nn.InvertibleLinear(), 2},
    {nn.AffineCoupling(nn.Sequential{nn.Dense(16, "tanh"), nn.Dense(D)}), 2},
    {Scale(), 1},
    {nn.RevBlock(nn.Dense(D // 2, "tanh"), nn.Dense(D // 2, "tanh")), 1},
    {nn.AffineCoupling(nn.Sequential{nn.Dense(16, "tanh"), nn.Dense(D)}, {swap = true}), 2},
    {nn.InvertibleLinear(), 2},
  }
end

-- runs the chain reversibly, or plainly (forward called directly, the same
-- ops on the ordinary tape); returns the gradients of a loss, the tape's
-- bytes after the forward pass, the output
local function run_chain (chain, x, plainly, opts)
  opts = opts or {}
  local t = mg.tape{persistent = opts.persistent}
  t:watch(x)
  local hx, ld = x, mg.zeros({x.shape[1]}, x.dtype)
  local outs = {}
  for i, e in ipairs(chain) do
    local l, two = e[1], e[2] == 2
    local call = plainly and function(...) return l:forward(...) end or l
    if two then hx, ld = call(hx, ld) else hx = call(hx) end
    outs[i] = hx
  end
  local loss = (opts.loss or function(o) return mg.sum(mg.tanh(o[#o])) end)(outs) - mg.sum(ld)
  t:stop()
  local bytes = t:saved_bytes()
  local vars = variables_of((function() local ls = {} for i, e in ipairs(chain) do ls[i] = e[1] end return ls end)())
  local g = t:gradient(loss, {x, vars}, nil, {unconnected = "zero"})
  local g2 = opts.persistent and t:gradient(loss, {x, vars}, nil, {unconnected = "zero"}) or nil
  return g, bytes, hx, g2
end

describe("reversible layers", function()
  it("each gradient-checks in float64 (finite differences)", function()
    mg.random.seed(5)
    local x = f64{3, 6}
    local ld = f64{3}
    local cases = {
      {nn.RevBlock(nn.Dense(3, "tanh"), nn.Dense(3, "tanh"), {num_layers = 2}), false},
      {nn.AffineCoupling(nn.Dense(6, "tanh")), true},
      {nn.AffineCoupling(nn.Dense(6, "tanh"), {swap = true, clamp = false}), true},
      {nn.InvertibleLinear(), true},
      {Scale(), false},
    }
    for _, c in ipairs(cases) do
      local layer, logdet = c[1], c[2]
      if logdet then
        mg.test.gradcheck(function(a, b) local y, l = layer(a, b); return mg.concat({y, mg.expand_dims(l, 2)}, 2) end, {x, ld})
      else
        mg.test.gradcheck(function(a) return layer(a) end, {x})
      end
    end
  end)

  it("a chain of every kind gives the plain computation's gradients, float64 to 1e-10", function()
    mg.random.seed(6)
    local chain = mixed_chain(6)
    local x = f64{7, 6}
    run_chain(chain, x, true)                                    -- build
    local got, bytes, y = run_chain(chain, x, false)
    local want, plain_bytes, y2 = run_chain(chain, x, true)
    assert.is_true(max_diff(got, want) < 1e-10, "max difference " .. max_diff(got, want))
    assert.equal(0, max_diff(y, y2))
    -- the reversible chain keeps its last outputs (and the loss's own bytes)
    assert.is_true(bytes < plain_bytes / 10, ("%d vs %d"):format(bytes, plain_bytes))
    local back = y
    for i = #chain, 1, -1 do back = chain[i][1]:inverse(back) end
    assert.is_true(max_diff(back, x) < 1e-12)
  end)

  it("gives right gradients for any walk: an intermediate loss, a persistent tape, a layer in between", function()
    mg.random.seed(7)
    local chain = mixed_chain(6)
    local x = f64{5, 6}
    run_chain(chain, x, true)
    local losses = {
      function(o) return mg.sum(o[2] ^ 2) end,                     -- the layers after it unused
      function(o) return mg.sum(o[3] ^ 2) + mg.sum(mg.tanh(o[6])) end,
    }
    for _, loss in ipairs(losses) do
      local want = run_chain(chain, x, true, {loss = loss})
      for _, persistent in ipairs({false, true}) do
        local got, _, _, again = run_chain(chain, x, false, {loss = loss, persistent = persistent})
        assert.is_true(max_diff(got, want) < 1e-10)
        if again then assert.is_true(max_diff(again, want) < 1e-10) end
      end
    end
    -- a Dense between two RevBlocks saves its input: the RevBlock before it keeps its output
    local r1, r2 = nn.RevBlock(nn.Dense(3, "tanh"), nn.Dense(3)), nn.RevBlock(nn.Dense(3), nn.Dense(3, "tanh"))
    local d = nn.Dense(6, "tanh")
    local between = {{r1, 1}, {d, 1}, {r2, 1}}
    d.forward = function(_, v) return d(v) end
    local got, bytes = run_chain(between, x, false)
    local want = run_chain(between, x, true)
    assert.is_true(max_diff(got, want) < 1e-10)
    local act = 5 * 6 * 8
    assert.equal(4 * act, bytes)                                 -- r1's output, d's tanh's, r2's; the loss's tanh
  end)

  it("refuses a gradient after a variable a layer read was assigned (its inverse would rebuild other inputs)", function()
    mg.random.seed(9)
    local x = f64{4, 6}
    local opt = mg.optim.SGD{learning_rate = 0.1}
    local ld = mg.zeros({4}, "float64")
    for _, c in ipairs{
      {function() return nn.RevBlock(nn.Dense(3, "tanh", {name = "f_dense"}), nn.Dense(3, "tanh"), {num_layers = 2}) end,
       function(l) return l(x) end},
      {function() return nn.AffineCoupling(nn.Dense(6, "tanh", {name = "f_dense"})) end,
       function(l) return (l(x, ld)) end},
    } do
      local layer, call = c[1](), c[2]
      call(layer)
      local kernel
      for _, v in ipairs(layer.trainable_variables) do if v.name:find("f_dense") then kernel = kernel or v end end
      local t = mg.tape({persistent = true})
      t:watch(x)
      local y = call(layer)
      local loss = mg.sum(mg.tanh(y))
      t:stop()
      local vars = layer.trainable_variables
      local g = t:gradient(loss, vars)                   -- before the write: fine
      opt:apply_gradients(g, vars)                       -- an optimizer step between the forward and a gradient
      local ok, e = pcall(t.gradient, t, loss, {x, vars})
      assert.is_false(ok)
      assert.truthy(tostring(e):find("variable '" .. kernel.name .. "' was assigned after the forward", 1, true), e)
    end
  end)

  it("4 and 16 separate RevBlocks hold the same bytes after the forward pass; the plain tape grows", function()
    mg.random.seed(8)
    local B, W = 1024, 512                                       -- one activation: 2 MiB
    local act = B * W * 4
    local x = mg.random.normal{B, W}
    local old, oldmin = mg.memory.setpause(100, 0)
    local held, tape = {}, {}
    for _, n in ipairs({4, 16}) do
      local blocks = {}
      for i = 1, n do blocks[i] = nn.RevBlock(nn.Dense(W // 2, "tanh"), nn.Dense(W // 2, "tanh")) end
      local hx = x
      for i = 1, n do hx = blocks[i](hx) end                      -- build
      for _, plainly in ipairs({false, true}) do
        hx = nil
        local base = h.settled()
        local t = mg.tape()
        t:watch(x)
        hx = x
        for i = 1, n do
          hx = plainly and mg.concat({blocks[i]:forward(hx:slice(nil, {1, W // 2}), hx:slice(nil, {W // 2 + 1, W}))}, -1)
                        or blocks[i](hx)
        end
        t:stop()
        local key = (plainly and "plain" or "reversible") .. n
        held[key] = h.settled().current_bytes - base.current_bytes
        tape[key] = t:saved_bytes()
      end
    end
    mg.memory.setpause(old, oldmin)
    assert.equal(act, held.reversible4)                          -- the output, which is all the tape keeps
    assert.equal(held.reversible4, held.reversible16)
    assert.equal(act, tape.reversible4)
    assert.equal(tape.reversible4, tape.reversible16)
    assert.is_true(held.plain16 >= 16 * act, "plain 16: " .. held.plain16)
    assert.is_true(held.plain16 > 3.5 * held.plain4)
  end)

  it("float32 chains match the plain tape to round-off that grows with depth", function()
    local errs = {}
    for _, n in ipairs({4, 16}) do
      mg.random.seed(4)
      local chain = {}
      for i = 1, n do chain[i] = {nn.RevBlock(nn.Dense(32, "tanh"), nn.Dense(32, "tanh")), 1} end
      local x = mg.random.normal{256, 64}
      run_chain(chain, x, true)
      local got = run_chain(chain, x, false)
      local want = run_chain(chain, x, true)
      errs[n] = max_diff(got[1], want[1]) / mg.max(mg.abs(want[1])):item()
    end
    assert.is_true(errs[4] < 2e-6, "depth 4: " .. errs[4])          -- measured 3.5e-7
    assert.is_true(errs[16] < 2e-5, "depth 16: " .. errs[16])       -- measured 2.0e-6
  end)

  it("RevBlock replays dropout when it rebuilds, and BatchNorm inside moves its averages once", function()
    mg.random.seed(9)
    local bn = nn.BatchNorm()
    local f = nn.Sequential{nn.Dense(4, "tanh"), nn.Dropout(0.3)}
    local g = nn.Sequential{nn.Dense(4), bn, nn.Dropout(0.5)}
    local chain = {{nn.RevBlock(f, g, {num_layers = 3}), 1}, {nn.RevBlock(g, f, {num_layers = 2}), 1}}
    local x = f64{5, 8}
    run_chain(chain, x, true)
    mg.random.seed(11)
    local got = run_chain(chain, x, false)
    local state, updates = mg.random.get_state(), bn.updates
    mg.random.seed(11)
    local want = run_chain(chain, x, true)
    assert.same(state, mg.random.get_state())
    assert.equal(5, bn.updates - updates)                        -- g runs 3 + 2 times a forward pass, never moves them in a backward
    assert.is_true(max_diff(got, want) < 1e-10)
  end)

  it("log-determinants: InvertibleLinear's is log|det W|, AffineCoupling's the sum of its log-scales", function()
    mg.random.seed(10)
    local lin = nn.InvertibleLinear()
    local x = f64{4, 3, 3}                                       -- 4 samples of 3 positions, 3 channels
    local y, ld = lin(x, mg.zeros({4}, "float64"))
    local w = lin:weight():totable()
    local det = w[1][1] * (w[2][2] * w[3][3] - w[2][3] * w[3][2]) - w[1][2] * (w[2][1] * w[3][3] - w[2][3] * w[3][1])
              + w[1][3] * (w[2][1] * w[3][2] - w[2][2] * w[3][1])
    assert.is_true(math.abs(math.abs(det) - 1) < 1e-12)          -- a rotation to start with
    lin.log_s:assign(f64({3}, 0.5))
    y, ld = lin(x, mg.zeros({4}, "float64"))
    w = lin:weight():totable()
    det = w[1][1] * (w[2][2] * w[3][3] - w[2][3] * w[3][2]) - w[1][2] * (w[2][1] * w[3][3] - w[2][3] * w[3][1])
        + w[1][3] * (w[2][1] * w[3][2] - w[2][2] * w[3][1])
    h.assert_close(ld, mg.full({4}, 3 * math.log(math.abs(det)), "float64"), 1e-12)
    h.assert_close(mg.matmul(x, lin:weight()), y, 1e-12)
    local net = nn.Dense(4)                                      -- 1 feature conditions the other 2
    local cp = nn.AffineCoupling(net, {clamp = false})
    local z = f64{5, 3}
    local yz, ldz = cp(z, mg.zeros({5}, "float64"))
    local s = net(z:slice(nil, {1, 1})):slice(nil, {1, 2})
    h.assert_close(ldz, mg.sum(s, 2), 1e-12)
    h.assert_close(yz:slice(nil, {1, 1}), z:slice(nil, {1, 1}))
  end)

  it("names bad input", function()
    local x = mg.ones{2, 4}
    assert.has_error(function() nn.AffineCoupling(nn.Dense(3))(x) end,
      "AffineCoupling: net must give 2 x 2 = 4 features (s and t) for the 2 transformed ones, got a tensor (2,3) float32")
    assert.has_error(function() nn.AffineCoupling(nn.Dense(4))(x, mg.zeros{3}) end,
      "AffineCoupling: logdet must have shape (2) (one per sample of the batch), got (3)")
    assert.has_error(function() nn.AffineCoupling(nn.Dense(4))(mg.ones{4}) end,
      "AffineCoupling: input must be (batch, ..., features) with at least 2 features, got shape (4)")
    assert.has_error(function() nn.AffineCoupling(3) end,
      "AffineCoupling: net must be a function (or a callable table), got 3")
    local lin = nn.InvertibleLinear()
    lin(x)
    assert.has_error(function() lin(mg.ones{2, 3}) end,
      "InvertibleLinear: input is float32 with 3 channels (its last axis), the layer was built for float32 with 4")
    local Broken = nn.ReversibleLayer:subclass("Broken")
    function Broken:forward () end
    assert.has_error(function() Broken()(x) end, "Broken: forward returned nothing; it must return tensors")
    assert.has_error(function() Scale()("x") end, "Scale: input must be a float tensor, got 'x'")
    local Half = nn.ReversibleLayer:subclass("Half")
    function Half:forward (v) return v * 2 end
    local t = mg.tape()
    t:watch(x)
    local y = mg.sum(Half()(x))
    t:stop()
    assert.has_error(function() t:gradient(y, x) end,
      "tape:gradient: in the backward of 'custom_gradient': Half: inverse is not defined")
  end)
end)

-- }===================================================================


-- {============================ BatchNorm ============================

describe("BatchNorm on ctx:save", function()
  it("keeps x alone and gives the plain gradients, second order too", function()
    mg.random.seed(12)
    local bn = nn.BatchNorm()
    local x = mg.random.normal({6, 3, 3, 4}, 0.5, 2, "float64")
    bn(x)
    bn.gamma:assign(f64({4}, 0.3) + 1)
    bn.beta:assign(f64{4})
    local w = f64{6, 3, 3, 4}
    local function plain (v)
      local mean = mg.mean(v, {1, 2, 3})
      local var = mg.mean((v - mean) ^ 2, {1, 2, 3})
      return (v - mean) / mg.sqrt(var + bn.epsilon) * bn.gamma + bn.beta
    end
    local function grads (f)
      local t1 = mg.tape()
      t1:watch(x)
      local t2 = mg.tape()
      t2:watch(x)
      local y = f(x)
      local held = t2:saved_bytes()
      local loss = mg.sum(mg.tanh(y) * w)
      t2:stop()
      local g = t2:gradient(loss, {x, bn.gamma, bn.beta})
      local z = mg.sum(g[1] * g[1])
      t1:stop()
      return g, t1:gradient(z, {x, bn.gamma}), held
    end
    local g1, hess1, held1 = grads(function(v) return bn(v) end)
    local g2, hess2, held2 = grads(plain)
    assert.is_true(max_diff(g1, g2) < 1e-12)
    assert.is_true(max_diff(hess1, hess2) < 1e-12)
    assert.equal(x:numel() * 8, held1)                            -- x alone
    assert.is_true(held2 >= 2 * x:numel() * 8)                    -- x - mean and the normalized x
    mg.test.gradcheck(function(v) return bn(v) end, {x})
  end)
end)

-- }===================================================================


describe("out of memory in a reversible training step", function()
  it("is an error at every allocation, and the counters come back", function()
    mg.random.seed(13)
    local chain = {
      {nn.InvertibleLinear(), 2},
      {nn.AffineCoupling(nn.Dense(4, "tanh")), 2},
      {nn.RevBlock(nn.Dense(2, "tanh"), nn.Sequential{nn.Dense(2), nn.BatchNorm()}, {num_layers = 2}), 1},
    }
    local x = mg.random.normal{6, 4}
    run_chain(chain, x, false)                                   -- build
    local function step ()
      local g = run_chain(chain, x, false)
      return #g[2]
    end
    local failures, base, after, expected = h.oom_sweep(step, 2000)
    assert.is_true(failures > 50, "only " .. failures .. " allocations were tried")
    assert.equal(base.current_bytes, after.current_bytes)
    assert.equal(base.live_tensors, after.live_tensors)
    assert.is_false(mg.is_recomputing())
    assert.is_false(mg.is_in_loop())
    assert.equal(expected, step())
  end)
end)

describe("examples/reversible_flow.lua", function()
  it("fits two moons and holds the same bytes at 4 and 32 layers", function()
    local out, code = h.run(h.bin .. " examples/reversible_flow.lua 120")
    assert.equal(0, code, out)
    local first = tonumber(out:match("step +1  negative log%-likelihood ([%d.]+)"))
    local last = tonumber(out:match("step +120  negative log%-likelihood ([%d.]+)"))
    assert.is_true(last < first, out)
    local r4 = out:match(" 4 layers:  reversible +([%d.]+) KiB")
    local r32 = out:match("32 layers:  reversible +([%d.]+) KiB")
    assert.is_not_nil(r4, out)
    assert.equal(r4, r32)
  end)

  it("InvertibleLinear on zero channels gives zero channels back (and logdet unchanged)", function()
    local l = mg.nn.InvertibleLinear()
    local x = mg.zeros({2, 0}, "float64")
    local y, ld = l(x, mg.constant({0.5, 1.5}, "float64"))
    assert.same({2, 0}, y.shape)
    assert.same({0.5, 1.5}, ld:totable())
    assert.same({2, 0}, l:inverse(y).shape)
    local l3 = mg.nn.InvertibleLinear()
    assert.same({2, 3, 0}, l3(mg.zeros({2, 3, 0})).shape)
  end)
end)

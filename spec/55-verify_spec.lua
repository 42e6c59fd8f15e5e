-- recompute_grad(f, {verify = true}) and mg.debug.verify_recompute(on): the
-- re-run of a recomputed function must compute the very bytes its first run
-- did, op by op, or the gradient fails naming the op and the line.
local mg = require "moongrad"
local h = require "spec.helpers"

local function has (text, err) assert.is_truthy(tostring(err):find(text, 1, true), tostring(err)) end

local function same_bits (a, b)
  assert.are.equal(a.dtype, b.dtype)
  assert.are.same(a.shape, b.shape)
  assert.are.equal(0, mg.sum(mg.cast(mg.not_equal(a, b), "int64")):item(), "bits differ")
end

-- d sum(f(x) * w) / d x, w: on the plain tape, or through g
local function grad_of (g, x, w)
  local t = mg.tape()
  t:watch(x)
  local y = g(x)
  local loss = mg.sum(y * w)
  t:stop()
  return t:gradient(loss, {x})[1]
end

local function block (x)
  local a = mg.tanh(mg.matmul(x, mg.transpose(x)))
  return mg.matmul(mg.softmax(a, -1), x) + mg.relu(x)
end

describe("recompute verify", function()
  before_each(function() mg.random.seed(3) end)
  after_each(function() mg.debug.verify_recompute(false) end)

  it("gives the plain tape's gradients, bit for bit, when the re-run matches", function()
    local x, w = mg.random.normal({6, 5}, 0, 1, "float64"), mg.random.normal({6, 5}, 0, 1, "float64")
    local plain = grad_of(block, x, w)
    local verified = grad_of(mg.recompute_grad(block, {verify = true}), x, w)
    same_bits(plain, verified)
  end)

  it("names the first op whose values differ, and the line of that op", function()
    local k = 1
    local f = mg.recompute_grad(function(x)
      k = k + 1                                   -- state outside the function, changed by each run
      local y = mg.exp(x)
      return y * k                                -- the op that differs
    end, {verify = true})
    local x = mg.random.normal{4}
    local ok, err = pcall(grad_of, f, x, mg.ones{4})
    assert.is_false(ok)
    err = tostring(err)
    has("recompute_grad: verify: the re-run's op 2 (mul, (4) float32) computed other values than in the "
        .. "first run", err)
    assert.matches("55%-verify_spec%.lua:4%d: recompute_grad: verify", err)     -- the line of the mul
  end)

  it("catches a random number drawn outside mg.random", function()
    local f = mg.recompute_grad(function(x) return x * mg.tensor{math.random()} end, {verify = true})
    local ok, err = pcall(grad_of, f, mg.random.normal{3}, mg.ones{3})
    assert.is_false(ok)
    has("computed other values", err)
  end)

  it("keeps mg.random's draws, which the re-run replays", function()
    local f = function(x) return mg.nn.dropout(x, 0.5) * 2 end
    local x, w = mg.random.normal{50}, mg.random.normal{50}
    mg.random.seed(9)
    local plain = grad_of(f, x, w)
    mg.random.seed(9)
    same_bits(plain, grad_of(mg.recompute_grad(f, {verify = true}), x, w))
  end)

  it("says when the re-run runs another op, more ops or fewer", function()
    local function run (body)
      local ok, err = pcall(grad_of, mg.recompute_grad(body, {verify = true}), mg.random.normal{3}, mg.ones{3})
      assert.is_false(ok)
      return tostring(err)
    end
    has("the re-run's op 1 is sin, (3) float32 where the first run's was cos, (3) float32",
        run(function(x) return mg.is_recomputing() and mg.sin(x) or mg.cos(x) end))
    has("the re-run ran more ops than the first run's 1: op 2 (neg",
        run(function(x) local y = mg.exp(x); return mg.is_recomputing() and -y or y end))
    has("the re-run ran 1 ops, the first run 2 (the next was 2, neg)",
        run(function(x) local y = mg.exp(x); return mg.is_recomputing() and y or -y end))
  end)

  it("refuses a re-run that assigns a variable, and takes one guarded by is_recomputing", function()
    local count = mg.Variable(0.0, {name = "calls", trainable = false})
    local function body (guard)
      return function(x)
        if not (guard and mg.is_recomputing()) then count:assign(mg.ones{}) end   -- the same values each run
        return mg.sin(x)
      end
    end
    local x = mg.random.normal{3}
    local ok, err = pcall(grad_of, mg.recompute_grad(body(false), {verify = true}), x, mg.ones{3})
    assert.is_false(ok)
    has("recompute_grad: verify: the re-run assigned variable 'calls': state would change twice", err)
    count:assign(mg.zeros{})
    h.assert_close(mg.cos(x), grad_of(mg.recompute_grad(body(true), {verify = true}), x, mg.ones{3}))
    assert.are.equal(1, count:value():item())                  -- assigned by the first run alone
  end)

  it("verifies every recompute_grad while mg.debug.verify_recompute is on", function()
    local k = 0
    local f = mg.recompute_grad(function(x) k = k + 1; return x * k end)
    assert.is_false(mg.debug.verify_recompute(true))
    local ok, err = pcall(grad_of, f, mg.random.normal{3}, mg.ones{3})
    assert.is_false(ok)
    has("recompute_grad: verify: the re-run's op 1 (mul", err)
    assert.is_true(mg.debug.verify_recompute(false))
    ok, err = pcall(grad_of, f, mg.random.normal{3}, mg.ones{3})  -- unverified: the outputs' sums alone
    has("the recomputed function gave output 1 other values than its first run", err)
    assert.has_error(function() mg.debug.verify_recompute("on") end)
  end)

  it("leaves nothing open after a failed check: the next recompute runs as usual", function()
    local k = 0
    local bad = mg.recompute_grad(function(x) k = k + 1; return x * k end, {verify = true})
    assert.is_false(pcall(grad_of, bad, mg.random.normal{3}, mg.ones{3}))
    local x, w = mg.random.normal{4, 4}, mg.random.normal{4, 4}
    same_bits(grad_of(block, x, w), grad_of(mg.recompute_grad(block), x, w))
    same_bits(grad_of(block, x, w), grad_of(mg.recompute_grad(block, {verify = true}), x, w))
  end)

  it("composes with nesting, save policies, views, autocast and several outputs", function()
    local x, w = mg.random.normal{6, 6}, mg.random.normal{6, 6}
    local inner = mg.recompute_grad(function(a) return mg.tanh(mg.matmul(a, a)) end, {verify = true})
    local nested = function(a) return inner(mg.transpose(a)) + mg.sin(a):slice({1, 6}, {1, 6}) end
    same_bits(grad_of(nested, x, w), grad_of(mg.recompute_grad(nested, {verify = true}), x, w))
    same_bits(grad_of(block, x, w), grad_of(mg.recompute_grad(block, {verify = true, policy = "dots"}), x, w))
    local two = function(a) return mg.exp(a), mg.transpose(a) * 2 end
    local t = mg.tape()
    t:watch(x)
    local p, q = mg.recompute_grad(two, {verify = true})(x)
    local loss = mg.sum(p * w) + mg.sum(q)
    t:stop()
    local g = t:gradient(loss, {x})[1]
    h.assert_close(mg.exp(x) * w + 2, g)
    local auto = function(a) return mg.autocast("bfloat16", block, a) end
    same_bits(grad_of(auto, x, w), grad_of(mg.recompute_grad(auto, {verify = true}), x, w))
  end)

  it("takes the same tensor twice and non-tensor arguments (a table is re-read as it was at the call)", function()
    local x, w = mg.random.normal({5, 4}, 0, 1, "float64"), mg.random.normal({5, 4}, 0, 1, "float64")
    local function f (a, b, k, opts) return mg.tanh(a * b) * k + (opts.shift and a or 0) end
    local twice = function(a) return f(a, a, 3, {shift = true}) end
    local verified = mg.recompute_grad(f, {verify = true})
    same_bits(grad_of(twice, x, w), grad_of(function(a) return verified(a, a, 3, {shift = true}) end, x, w))
    local g = mg.recompute_grad(function(a, o) o.k = (o.k or 1) + 1; return a * o.k end, {verify = true})
    local opts = {}
    same_bits(w * 2, grad_of(function(a) return g(a, opts) end, x, w))
  end)

  it("checks its option", function()
    assert.has_error(function() mg.recompute_grad(block, {verify = "yes"}) end,
                     "bad argument #2 to 'recompute_grad' (option 'verify' must be a boolean, got string)")
  end)
end)

describe("recompute verify in layers", function()
  it("RecomputeLayer takes a verify field, and the global switch reaches checkpoint_sequential", function()
    local Leaky = mg.nn.RecomputeLayer:subclass("Leaky")
    local calls = 0
    function Leaky:init () self.dense = mg.nn.Dense(4) end
    function Leaky:call (x) calls = calls + 1; return self.dense(x) * calls end   -- differs in the re-run
    local layer = Leaky()
    local x = mg.random.normal{2, 3}
    local function grad ()
      local t = mg.tape()
      local loss = mg.sum(layer(x))
      t:stop()
      return t:gradient(loss, layer.trainable_variables)
    end
    assert.has_error(grad, nil)                      -- the outputs' sums differ too: caught either way
    layer.verify = true
    local ok, err = pcall(grad)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("verify: the re-run's op", 1, true), tostring(err))
    local layers = {mg.nn.Dense(3, "tanh"), mg.nn.Dense(3, "tanh"), mg.nn.Dense(3)}
    local function seq_grad ()
      local t = mg.tape()
      local loss = mg.sum(mg.nn.checkpoint_sequential(layers, 2, x))
      t:stop()
      local vars = {}
      for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end end
      return t:gradient(loss, vars)
    end
    local plain = seq_grad()
    mg.debug.verify_recompute(true)
    local verified = seq_grad()                      -- deterministic layers: verified, same bits
    mg.debug.verify_recompute(false)
    for i = 1, #plain do assert.are.equal(0, mg.sum(mg.cast(mg.not_equal(plain[i], verified[i]), "int64")):item()) end
  end)
end)

describe("examples/verify_recompute.lua", function()
  it("finds the hidden state and shows the fix", function()
    local out, code = h.run(h.bin .. " examples/verify_recompute.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("examples/verify_recompute.lua:17: recompute_grad: verify: the re-run's op 2 (mul, (8,16) float32)", 1, true), out)
    assert.truthy(out:find("gradients equal to the plain tape's: true", 1, true), out)
  end)
end)

describe("recompute verify under a memory budget", function()
  it("composes with it: evictions happen, the gradients are the plain ones (a rebuild is no op of the re-run)", function()
    mg.random.seed(5)
    local layers = {}
    for i = 1, 6 do layers[i] = mg.nn.Dense(64, "tanh") end
    local x = mg.random.normal{256, 64}
    local function stack (y)
      for i = 1, 6 do y = layers[i](mg.tanh(y) * 1.5) end
      return y
    end
    local verified = mg.recompute_grad(stack, {verify = true})
    local function forward (verify)
      local y = (verify and verified or stack)(x)
      return mg.sum(y * y)
    end
    forward(false)
    local vars = {}
    for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end end
    local function grads (verify, budget)
      collectgarbage()
      local was = mg.memory.budget(budget and mg.memory.stats().current_bytes + budget)
      local ok, g = pcall(function()
        local t = mg.tape()
        local loss = forward(verify)
        t:stop()
        return t:gradient(loss, vars)
      end)
      local evictions = mg.memory.stats().evictions
      mg.memory.budget(was)
      assert(ok, tostring(g))
      return g, evictions
    end
    local plain = grads(false)
    local g, evictions = grads(true, 256 * 64 * 4 * 14)  -- room for a few activations: rebuilds happen
    assert.is_true(evictions > 0, "no eviction: the budget did not bind")
    for i = 1, #plain do h.assert_close(plain[i], g[i], 1e-5) end
  end)
end)

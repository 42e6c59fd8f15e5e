-- The cases of PyTorch's TestCheckpoint (test/test_utils.py), ported to
-- moongrad's mg.nn.checkpoint_sequential and recompute_grad. The stored copy
-- of test_utils.py this port was made from is an early one (three cases:
-- test_checkpoint_trigger, test_checkpoint_valid, test_checkpoint); the later
-- TestCheckpoint cases are not ported yet. torch's requires_grad/.backward()
-- become a tape that watches the input and a gradient call; float64.
local mg = require "moongrad"
local h = require "helpers"

local function model ()
  mg.random.seed(11)
  local layers = {mg.nn.Dense(50), mg.nn.Lambda(mg.relu), mg.nn.Dense(20), mg.nn.Lambda(mg.relu),
                  mg.nn.Dense(5), mg.nn.Lambda(mg.relu)}
  local x = mg.random.normal({1, 100}, 0, 1, "float64")
  local v = x
  for _, l in ipairs(layers) do v = l(v) end              -- build
  local params = {}
  for _, l in ipairs(layers) do
    for _, p in ipairs(l.trainable_variables or {}) do params[#params + 1] = p end
  end
  return layers, params, x
end

describe("test/test_utils.py TestCheckpoint", function()
  -- test/test_utils.py: TestCheckpoint.test_checkpoint_trigger
  it("test_checkpoint_trigger", function()
    local modules = {}
    for i = 1, 10 do
      local m = {counter = 0}
      setmetatable(m, {__call = function(self, input_var)
        self.counter = self.counter + 1
        return input_var * 1
      end})
      modules[i] = m
    end
    for _, m in ipairs(modules) do assert.equal(0, m.counter) end
    local input_var = mg.random.normal({3, 4}, 0, 1, "float64")
    local t = mg.tape()
    t:watch(input_var)
    local out = mg.nn.checkpoint_sequential(modules, 2, input_var)
    local loss = mg.sum(out)
    t:stop()
    for _, m in ipairs(modules) do assert.equal(1, m.counter) end
    assert.is_not_nil(t:gradient(loss, input_var))
    for i = 1, 5 do assert.equal(2, modules[i].counter) end
    for i = 6, 10 do assert.equal(1, modules[i].counter) end
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_valid
  it("test_checkpoint_valid (differs on purpose: torch's reentrant checkpoint refuses create_graph; " ..
     "moongrad's second order through it equals the plain one)", function()
    local layers, _, input_var = model()
    local function second_order (run)
      local outer = mg.tape()
      outer:watch(input_var)
      local inner = mg.tape()
      inner:watch(input_var)
      local out = run(input_var)
      inner:stop()
      local g = inner:gradient(out, input_var, mg.ones({1, 5}, "float64"))
      local s = mg.sum(g * g)
      outer:stop()
      return outer:gradient(s, input_var, nil, {unconnected = "zero"})
    end
    local want = second_order(function(v) for _, l in ipairs(layers) do v = l(v) end return v end)
    local got = second_order(function(v) return mg.nn.checkpoint_sequential(layers, 2, v) end)
    h.assert_close(got, want, 1e-12)
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint
  it("test_checkpoint", function()
    local layers, params, x = model()
    local function run (f)
      local t = mg.tape()
      t:watch(x)
      local out = f(x)
      local loss = mg.sum(out)
      t:stop()
      local wrt = {x}
      for _, p in ipairs(params) do wrt[#wrt + 1] = p end
      local g = t:gradient(loss, wrt)
      for i = 1, #wrt do assert.is_not_nil(g[i]) end
      return out, g
    end
    local out_not, grads_not = run(function(v) for _, l in ipairs(layers) do v = l(v) end return v end)
    -- checkpointed model by passing the list of modules
    local out_ck, grads_ck = run(function(v) return mg.nn.checkpoint_sequential(layers, 2, v) end)
    assert.same(out_not:totable(), out_ck:totable())
    for i = 1, #grads_not do assert.same(grads_not[i]:totable(), grads_ck[i]:totable()) end
    -- checkpointed by passing the Sequential itself
    local seq = mg.nn.Sequential(layers)
    local ok = pcall(mg.nn.checkpoint_sequential, seq, 2, x)
    if ok then
      local out_seq, grads_seq = run(function(v) return mg.nn.checkpoint_sequential(seq, 2, v) end)
      assert.same(out_not:totable(), out_seq:totable())
      for i = 1, #grads_not do assert.same(grads_not[i]:totable(), grads_seq[i]:totable()) end
    end
    assert.is_true(ok, "checkpoint_sequential takes a Sequential too, as torch's does")
  end)
end)

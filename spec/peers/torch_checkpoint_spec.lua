-- The cases of PyTorch's TestCheckpoint (test/test_utils.py), ported to
-- moongrad's mg.nn.checkpoint_sequential and recompute_grad: every case of the
-- class in the stored copy, in its order. torch's requires_grad/.backward()
-- become a tape that watches the input and a gradient call;
-- checkpoint(fn, ...) is mg.recompute_grad(fn)(...); float64. torch runs most
-- cases for use_reentrant True and False: moongrad has one recompute, which
-- behaves as the non-reentrant one (it refuses nothing the plain tape allows).
local mg = require "moongrad"
local h = require "helpers"

local known = os.getenv("MOONGRAD_PEERS_KNOWN") and it or pending

local function f64 (v) return mg.constant(v, "float64") end

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

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_module_list
  it("test_checkpoint_module_list (a layer holding a list of layers; no nn.ModuleList: its list is the list)", function()
    local layers, params, x = model()
    local ModuleListNet = setmetatable({module_list = layers}, {__call = function(self, input)
      for _, layer in ipairs(self.module_list) do input = layer(input) end
      return input
    end})
    local function run (f)
      local t = mg.tape()
      t:watch(x)
      local out = f(x)
      local loss = mg.sum(out)
      t:stop()
      local wrt = {x}
      for _, p in ipairs(params) do wrt[#wrt + 1] = p end
      return out, t:gradient(loss, wrt)
    end
    local out_not, grads_not = run(ModuleListNet)
    for _, list in ipairs{{table.unpack(ModuleListNet.module_list)}, ModuleListNet.module_list} do
      local out_ck, grads_ck = run(function(v) return mg.nn.checkpoint_sequential(list, 2, v) end)
      assert.same(out_not:totable(), out_ck:totable())
      for i = 1, #grads_not do assert.same(grads_not[i]:totable(), grads_ck[i]:totable()) end
    end
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_sequential_deprecated_multiple_args
  it("test_checkpoint_sequential_deprecated_multiple_args", function()
    local Two = function(a, b) return a, b end
    local model_ = mg.nn.Sequential{mg.nn.Lambda(Two)}
    local a = mg.random.normal({1, 100}, 0, 1, "float64")
    local b = mg.random.normal({1, 100}, 0, 1, "float64")
    assert.has_error(function() mg.nn.checkpoint_sequential(model_, 1, a, b) end,
      "checkpoint_sequential: takes one input (x, argument 3), got 1 more argument; " ..
      "pass several inputs as one table, for the first layer to take apart")
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_sequential_deprecated_no_args
  it("test_checkpoint_sequential_deprecated_no_args", function()
    local model_ = mg.nn.Sequential{mg.nn.Lambda(function() end)}
    assert.has_error(function() mg.nn.checkpoint_sequential(model_, 1) end,
      "checkpoint_sequential: x (argument 3) is nil")
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_rng_cpu
  it("test_checkpoint_rng_cpu", function()
    for _ = 1, 5 do
      local inp = mg.random.normal({20000}, 0, 1, "float64")
      local phase1 = mg.nn.Dropout(0.5)
      local phase2 = mg.nn.Dropout(0.5)
      local function run_fn (input) return phase2(input) end
      local state = mg.random.get_state()

      local t = mg.tape()
      t:watch(inp)
      local out = phase1(inp)
      out = mg.recompute_grad(run_fn)(out)
      local loss = mg.sum(out)
      t:stop()
      local grad_with_checkpointing = t:gradient(loss, inp)

      mg.random.set_state(state)

      t = mg.tape()
      t:watch(inp)
      out = phase1(inp)
      out = run_fn(out)
      loss = mg.sum(out)
      t:stop()
      local grad_no_checkpointing = t:gradient(loss, inp)

      assert.same(grad_no_checkpointing:totable(), grad_with_checkpointing:totable())
    end
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_rng_gpu
  pending("test_checkpoint_rng_gpu: needs an accelerator; moongrad runs on the CPU")

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_not_preserve_rng_state_and_without_reentrant
  pending("test_checkpoint_not_preserve_rng_state_and_without_reentrant: needs an accelerator, and " ..
          "moongrad's recompute always replays the random state (no preserve_rng_state=False)")

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_non_tensor
  it("test_checkpoint_non_tensor", function()
    local function run_fn (tensor1, tensor2)
      if tensor2 == nil then return tensor1 end
      return tensor1 + tensor2
    end
    local input_var = mg.random.normal({1, 100}, 0, 1, "float64")
    local t = mg.tape()
    t:watch(input_var)
    local out = mg.recompute_grad(run_fn)(input_var, nil)
    local loss = mg.sum(out)
    t:stop()
    assert.same(mg.ones({1, 100}, "float64"):totable(), t:gradient(loss, input_var):totable())
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_non_tensor_inputs_outputs
  it("test_checkpoint_non_tensor_inputs_outputs", function()
    local function foo (t1, t2, scale, t3)
      local t4 = t1 + t2 * t3
      local t5 = t1 * t2 + t3
      t4 = t4 * scale
      t5 = t5 * scale
      return scale, t4, nil, true, t5, "bar", t1
    end
    local t1 = mg.random.uniform({10}, 0, 1, "float64")
    local t2 = mg.random.uniform({10}, 0, 1, "float64")
    local t3 = mg.random.uniform({10}, 0, 1, "float64")
    local scale = math.random(0, 10)
    local t = mg.tape{warn = false}          -- the refused second call would warn before raising
    t:watch({t1, t2})
    local res = table.pack(mg.recompute_grad(foo)(t1, t2, scale, t3))
    local loss = {mg.sum(res[2]), mg.sum(res[5]), mg.sum(res[7])}
    t:stop()
    assert.equal(7, res.n)
    assert.equal(scale, res[1])
    assert.same(((t1 + t2 * t3) * scale):totable(), res[2]:totable())
    assert.is_nil(res[3])
    assert.is_true(res[4])
    assert.same(((t1 * t2 + t3) * scale):totable(), res[5]:totable())
    assert.equal("bar", res[6])
    assert.same(t1:totable(), res[7]:totable())
    -- Validate running backward.
    local g = t:gradient(loss, {t1, t2})
    assert.has_error(function() t:gradient(loss, {t1, t2}) end,
      "tape:gradient: a non-persistent tape can only compute one gradient; " ..
      "create it with mg.tape{persistent=true} to call it again")
    -- Run without checkpoint and validate we receive same grads.
    local t_ = mg.tape()
    t_:watch({t1, t2})
    res = table.pack(foo(t1, t2, scale, t3))
    loss = {mg.sum(res[2]), mg.sum(res[5]), mg.sum(res[7])}
    t_:stop()
    local want = t_:gradient(loss, {t1, t2})
    assert.same(want[1]:totable(), g[1]:totable())
    assert.same(want[2]:totable(), g[2]:totable())
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_no_tensors
  it("test_checkpoint_no_tensors", function()
    local function foo (t1, t2, scale, t3)
      local t4 = t1 + t2 * t3
      local t5 = t1 * t2 + t3
      t4 = t4 * scale
      t5 = t5 * scale
      return scale, t4, nil, true, t5, "bar", t1
    end
    local t1, t2, t3 = math.random(), math.random(), math.random()
    local scale = math.random(0, 10)
    local res = table.pack(mg.recompute_grad(foo)(t1, t2, scale, t3))
    assert.equal(7, res.n)
    assert.equal(scale, res[1])
    assert.equal((t1 + t2 * t3) * scale, res[2])
    assert.is_nil(res[3])
    assert.is_true(res[4])
    assert.equal((t1 * t2 + t3) * scale, res[5])
    assert.equal("bar", res[6])
    assert.equal(t1, res[7])
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_partial_grad
  it("test_checkpoint_partial_grad (first half)", function()
    local function run_fn (tensor1, tensor2) return tensor1, tensor2 end
    local input_var = mg.random.normal({1, 4}, 0, 1, "float64")
    local input_var2 = mg.random.normal({1, 4}, 0, 1, "float64")
    local t = mg.tape()
    t:watch(input_var)
    local out = {mg.recompute_grad(run_fn)(input_var, input_var2)}
    local loss = mg.sum(out[1])
    t:stop()
    assert.same(mg.ones({1, 4}, "float64"):totable(), t:gradient(loss, input_var):totable())
  end)
  -- (torch's reentrant checkpoint raises "none of output has requires_grad=True"; moongrad
  -- gives the plain tape's answer on purpose, nil for an argument the output does not use)
  it("test_checkpoint_partial_grad (second half): nil, as the plain tape, for an argument the " ..
     "output does not use", function()
    local function run_fn2 (tensor1, tensor2) return tensor1 end
    local input_var = mg.random.normal({1, 4}, 0, 1, "float64")
    local input_var2 = mg.random.normal({1, 4}, 0, 1, "float64")
    local t = mg.tape()
    t:watch(input_var2)
    local out = mg.recompute_grad(run_fn2)(input_var, input_var2)
    local loss = mg.sum(out)
    t:stop()
    assert.is_nil(t:gradient(loss, input_var2))
  end)

  -- test/test_utils.py: TestCheckpoint.test_checkpointing_without_reentrant_early_free
  pending("test_checkpointing_without_reentrant_early_free: needs an accelerator's memory counter and " ..
          "hooks on tensors (register_hook), which moongrad lacks")

  -- test/test_utils.py: TestCheckpoint.test_get_device_states_recursive
  pending("test_get_device_states_recursive: several GPUs and device RNG states; moongrad runs on the CPU")

  -- test/test_utils.py: TestCheckpoint.test_infer_device_state_recursive_meta
  pending("test_infer_device_state_recursive_meta: meta device tensors; moongrad has no devices")

  -- test/test_utils.py: TestCheckpoint.test_infer_device_state_recursive_multi_gpu
  pending("test_infer_device_state_recursive_multi_gpu: several GPUs; moongrad runs on the CPU")

  -- test/test_utils.py: TestCheckpoint.test_checkpoint_preserves_device_context
  pending("test_checkpoint_preserves_device_context: torch.device() contexts; moongrad has no devices")
end)

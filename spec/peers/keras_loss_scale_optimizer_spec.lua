-- The cases of Keras 3's LossScaleOptimizerTest
-- (keras/src/optimizers/loss_scale_optimizer_test.py), ported to
-- mg.optim.LossScaleOptimizer, in the stored copy's order. Keras'
-- optimizer.apply(grads, vars) is apply_gradients(grads, vars),
-- backend.Variable is mg.Variable, ops.array a float32 tensor. Not ported:
-- the stateless variants (JAX's stateless_apply: moongrad's optimizers update
-- in place), test_apply_with_no_vars (apply_gradients always names its
-- variables), test_finite_step_with_inner_loss_scale and _with_overwrite
-- (Keras 3 options moongrad's optimizers do not have: loss_scale_factor,
-- overwrite_with_gradient), test_deserialization_backwards_compatibility
-- (Keras configs). Where moongrad differs on purpose, the case says so.
local mg = require "moongrad"

local SGD, LSO = mg.optim.SGD, mg.optim.LossScaleOptimizer
local inf = math.huge

local function close (t, want, tol)
  local got = t:totable()
  assert.equals(#want, #got)
  for i = 1, #want do
    assert(math.abs(got[i] - want[i]) <= (tol or 1e-6), ("entry %d: %s, want %s"):format(i, got[i], want[i]))
  end
end

local function fails (f, text)
  local ok, err = pcall(f)
  assert.is_false(ok)
  assert.truthy(tostring(err):find(text, 1, true), tostring(err))
end

describe("keras LossScaleOptimizerTest", function()
  it("test_config: the inner optimizer's settings read through the wrapper", function()
    local opt = LSO(SGD{learning_rate = 0.5, momentum = 0.06, nesterov = true, weight_decay = 0.004})
    assert.equals(0.5, opt.learning_rate)
    assert.equals(0.06, opt.momentum)
    assert.is_true(opt.nesterov)
    assert.equals(0.004, opt.weight_decay)
  end)

  it("test_finite_step", function()
    local opt = LSO(SGD{learning_rate = 0.5})
    local grads = {mg.constant{1.0, 6.0, 7.0, 2.0} * opt.initial_scale}
    local vars = {mg.Variable(mg.constant{1.0, 2.0, 3.0, 4.0})}
    assert.is_true(opt:apply_gradients(grads, vars))
    close(vars[1]:value(), {0.5, -1.0, -0.5, 3.0}, 1e-4)
  end)

  it("test_infinite_step", function()
    local opt = LSO(SGD{learning_rate = 0.5})
    local grads = {mg.constant{inf, inf, inf, inf}}
    local vars = {mg.Variable(mg.constant{1.0, 2.0, 3.0, 4.0})}
    assert.is_false(opt:apply_gradients(grads, vars))
    close(vars[1]:value(), {1.0, 2.0, 3.0, 4.0}, 1e-4)
  end)

  it("test_downscaling", function()
    local opt = LSO(SGD{learning_rate = 0.5}, {initial_scale = 400.0})
    local vars = {mg.Variable(mg.constant{1.0, 2.0, 3.0, 4.0})}
    opt:build(vars)
    local grads = {mg.constant{inf, inf, inf, inf}}
    for _ = 1, 4 do opt:apply_gradients(grads, vars) end
    assert.equals(25.0, opt:scale_loss(1.0))
  end)

  it("test_upscaling", function()
    local opt = LSO(SGD{learning_rate = 0.5}, {initial_scale = 2.0, dynamic_growth_steps = 2})
    local vars = {mg.Variable(mg.constant{1.0, 2.0, 3.0, 4.0})}
    opt:build(vars)
    local grads = {mg.constant{1.0, 6.0, 7.0, 2.0}}
    for _ = 1, 8 do opt:apply_gradients(grads, vars) end
    assert.equals(32.0, opt:scale_loss(1.0))
  end)

  it("test_iterations_update", function()
    local opt = LSO(SGD{learning_rate = 0.5})
    local vars = {mg.Variable(mg.constant{1.0, 2.0, 3.0, 4.0})}
    opt:build(vars)
    local grads = {mg.constant{1.0, 6.0, 7.0, 2.0}}
    assert.equals(0, opt.iterations)
    for i = 1, 3 do
      opt:apply_gradients(grads, vars)
      assert.equals(i, opt.iterations)
    end
  end)

  it("test_serialization: name, initial_scale and dynamic_growth_steps kept; the state round-trips", function()
    local opt = LSO(SGD{learning_rate = 0.5}, {initial_scale = 3.0, dynamic_growth_steps = 2, name = "test_opt"})
    assert.equals("test_opt", opt.name)
    assert.equals(3.0, opt.initial_scale)
    assert.equals(2, opt.dynamic_growth_steps)
    local vars = {mg.Variable(mg.constant{1.0, 2.0})}
    opt:apply_gradients({mg.constant{1, 1}}, vars)
    local state = opt:get_state()
    assert.equals(3.0, state.loss_scale)
    assert.equals(1, state.good_steps)
    local again = LSO(SGD{learning_rate = 0.5}, {initial_scale = 3.0, dynamic_growth_steps = 2})
    again:set_state(state, vars)
    assert.equals(1, again.good_steps)
    assert.equals(1, again.iterations)
    again:apply_gradients({mg.constant{1, 1}}, vars)
    assert.equals(6.0, again.loss_scale)           -- the second good step in a row doubles it
  end)

  it("test_init_dynamic_arg: dynamic = false is a fixed scale (Keras 2's; Keras 3 refuses it)", function()
    local opt = LSO(SGD{learning_rate = 0.5}, {dynamic = false, initial_scale = 4})
    local vars = {mg.Variable(mg.constant{1.0})}
    for _ = 1, 3 do assert.is_true(opt:apply_gradients({mg.constant{4.0}}, vars)) end
    assert.equals(4, opt.loss_scale)
    close(vars[1]:value(), {-0.5})
  end)

  it("test_init_unsupported_arg", function()
    fails(function() LSO(SGD{learning_rate = 0.5}, {foo = true}) end, "LossScaleOptimizer: unknown option 'foo'")
  end)

  it("test_init_base_optimizer_unsupported_args", function()
    for _, k in ipairs{"weight_decay", "clipnorm", "global_clipnorm", "clipvalue"} do
      fails(function() LSO(SGD{learning_rate = 0.5}, {[k] = 0.5}) end,
            "LossScaleOptimizer: " .. k .. " is an option of the inner optimizer: set it there")
    end
  end)
end)

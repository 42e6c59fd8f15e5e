-- mg.optim (SGD, Adam, AdamW, RMSprop; clipping; state), mg.schedules and
-- mg.progress (Keras' bar, on a terminal and into a pipe).
local mg = require "moongrad"
local h = require "helpers"

local function f64 (data) return mg.constant(data, "float64") end

local function quote (s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function minimize (opt, steps)
  local v = mg.Variable({3.0, -2.0})
  for _ = 1, steps do
    local t = mg.tape()
    local loss = mg.sum((v - 1) ^ 2)
    t:stop()
    opt:apply_gradients({t:gradient(loss, v)}, {v})
  end
  return v
end

-- runs opt on one float64 variable (init) with the given gradients, one step each
local function steps (opt, init, grads)
  local v = mg.Variable(f64(init))
  for _, g in ipairs(grads) do opt:apply_gradients({f64(g)}, {v}) end
  return v:value():totable()
end

describe("optimizers", function()
  it("SGD takes plain gradient steps", function()
    local v = mg.Variable({1.0})
    local opt = mg.optim.SGD{learning_rate = 0.1}
    opt:apply_gradients({mg.constant({2.0})}, {v})
    h.assert_close(v, {0.8}, 1e-6)
    assert.equal(1, opt.iterations)
  end)

  it("SGD with momentum, and Adam, AdamW and RMSprop, reach the minimum", function()
    h.assert_close(minimize(mg.optim.SGD{learning_rate = 0.05, momentum = 0.9}, 200), {1, 1}, 1e-3)
    h.assert_close(minimize(mg.optim.SGD{learning_rate = 0.05, momentum = 0.9, nesterov = true}, 200), {1, 1}, 1e-3)
    h.assert_close(minimize(mg.optim.Adam{learning_rate = 0.05}, 500), {1, 1}, 1e-3)
    h.assert_close(minimize(mg.optim.AdamW{learning_rate = 0.05, weight_decay = 0}, 500), {1, 1}, 1e-3)
    h.assert_close(minimize(mg.optim.RMSprop{learning_rate = 0.01}, 600), {1, 1}, 2e-2)
  end)

  it("Adam's first step is learning_rate in the gradient's sign", function()
    local v = mg.Variable({0.0, 0.0})
    mg.optim.Adam{learning_rate = 0.5}:apply_gradients({mg.constant({3.0, -0.1})}, {v})
    h.assert_close(v, {-0.5, 0.5}, 1e-3)
  end)

  it("skip nil gradients and check their arguments", function()
    local a, b = mg.Variable(1.0), mg.Variable(1.0)
    mg.optim.SGD{learning_rate = 1}:apply_gradients({nil, mg.constant(1.0)}, {a, b})
    assert.equal(1, a:value():item())
    assert.equal(0, b:value():item())
    mg.optim.SGD{learning_rate = 1}:apply_gradients({mg.constant(1.0)}, {a, b})   -- b's gradient: nil
    assert.equal(0, a:value():item())
    assert.equal(0, b:value():item())
    mg.optim.SGD():apply_gradients({}, {a})                                       -- every gradient nil
    assert.has_error(function() mg.optim.SGD():apply_gradients({a, a}, {a}) end, "SGD: 2 gradients for 1 variables")
    assert.has_error(function() mg.optim.SGD():apply_gradients(table.pack(nil), {a, b}) end,
                     "SGD: 1 gradients for 2 variables")
    for _, name in ipairs({"AdamW", "RMSprop"}) do
      assert.has_error(function() mg.optim[name]():apply_gradients({mg.ones{2}}, {mg.Variable({1.0})}) end,
                       name .. ": gradients[1] has shape (2) but variables[1] has shape (1)")
    end
  end)

  it("refuse a variable given twice in one step, before anything moves (as PyTorch)", function()
    local makers = {
      SGD = function() return mg.optim.SGD{learning_rate = 0.1} end,
      ["SGD with momentum"] = function() return mg.optim.SGD{learning_rate = 0.1, momentum = 0.9, nesterov = true} end,
      Adam = function() return mg.optim.Adam{learning_rate = 0.1} end,
      AdamW = function() return mg.optim.AdamW{learning_rate = 0.1} end,
      RMSprop = function() return mg.optim.RMSprop{learning_rate = 0.1, momentum = 0.5, centered = true} end,
    }
    for label, make in pairs(makers) do
      local opt, who = make(), label:match("^%a+")
      local v, a = mg.Variable({1.0, 2.0}, {name = "w", dtype = "float64"}), mg.Variable(3.0, {dtype = "float64"})
      opt:apply_gradients({f64({0.5, -0.5}), f64(1)}, {v, a})           -- slots exist
      local before, a_before, state = v:value():totable(), a:value():item(), opt:get_state({v, a})
      local g1, g2 = f64({1, 2}), f64({3, 4})
      local said = who .. ": variables[2] is variables[1] again ('w'); give each variable once, with the sum of "
                   .. "its gradients"
      assert.has_error(function() opt:apply_gradients({{g1, v}, {g2, v}}) end, said, label)
      assert.has_error(function() opt:apply_gradients({g1, f64(1), g2}, {v, a, v}) end,
                       (said:gsub("%[2%] is", "[3] is")), label)
      assert.has_error(function() opt:apply_gradients({nil, g2}, {v, v}) end, said, label)   -- nil or not
      assert.same(before, v:value():totable(), label)                   -- nothing moved
      assert.equal(a_before, a:value():item(), label)
      assert.equal(1, opt.iterations, label)
      local now = opt:get_state({v, a})
      for name, list in pairs(state.slots) do
        for i = 1, 2 do assert.same(list[i]:totable(), now.slots[name][i]:totable(), label .. " " .. name) end
      end
      -- the advice works: the summed gradient once is one ordinary step
      local twin = make()
      local w = mg.Variable(f64(before))
      twin:set_state(state, {w, mg.Variable(f64(a_before))})
      opt:apply_gradients({{g1 + g2, v}})
      twin:apply_gradients({f64({4, 6})}, {w})
      assert.same(w:value():totable(), v:value():totable(), label)
    end
    local v = mg.Variable(f64({1.0, 2.0}))
    mg.optim.SGD{learning_rate = 0.5}:apply_gradients({{f64({1, 2}) + f64({3, 4}), v}})
    assert.same({-1, -1}, v:value():totable())                          -- w - lr (g1 + g2)
    local built = mg.optim.Adam():build({v, v})                          -- build may repeat: it registers once
    assert.equal(1, #built:get_state().slots.m)
  end)

  it("minimize(loss, vars, tape) is apply_gradients(tape:gradient(loss, vars), vars), as Keras'", function()
    for _, make in ipairs({function() return mg.optim.SGD{learning_rate = 0.1, momentum = 0.9} end,
                           function() return mg.optim.Adam{learning_rate = 0.1} end}) do
      local a, b = mg.Variable(mg.tensor{1, -2}), mg.Variable(mg.tensor{1, -2})
      local o1, o2 = make(), make()
      for _ = 1, 3 do
        local t1 = mg.tape()
        local l1 = mg.sum(mg.sin(a) * a)
        t1:stop()
        o1:minimize(l1, {a}, t1)
        local t2 = mg.tape()
        local l2 = mg.sum(mg.sin(b) * b)
        t2:stop()
        o2:apply_gradients(t2:gradient(l2, {b}), {b})
      end
      assert.same(b:value():totable(), a:value():totable())
    end
    local opt, v = mg.optim.SGD(), mg.Variable(mg.ones(2))
    assert.has_error(function() opt:minimize(mg.sum(v), {v}) end,
      "SGD:minimize: minimize(loss, vars, tape) needs the tape that recorded the loss (mg.tape()), got nil")
    assert.has_error(function() opt:minimize("loss", {v}, mg.tape()) end, "SGD:minimize: the loss must be a tensor, got 'loss'")
    assert.has_error(function() opt:minimize(mg.sum(v), {v, 3}, mg.tape()) end,
      "SGD:minimize: variable 2 must be a Variable, got 3")
    assert.has_error(function() opt:minimize(mg.sum(v), v, mg.tape()) end,
      "SGD:minimize: vars must be a list of Variables ({w, b}), got a Variable (2) float32")
  end)

  it("take Keras' list of {gradient, variable} pairs", function()
    local a, b = mg.Variable({1.0, 2.0}), mg.Variable(5.0)
    mg.optim.SGD{learning_rate = 0.5}:apply_gradients({{mg.constant({2.0, 2.0}), a}, {nil, b}})
    assert.same({0, 1}, a:value():totable())
    assert.equal(5, b:value():item())
  end)

  it("accept Keras' beta_1 and beta_2 for Adam, and a positional learning rate", function()
    local opt = mg.optim.Adam{beta_1 = 0.5, beta_2 = 0.75}
    assert.equal(0.5, opt.beta1)
    assert.equal(0.75, opt.beta2)
    assert.equal(0.25, mg.optim.SGD(0.25).learning_rate)
    assert.equal(0.9, mg.optim.Adam(0.5, {beta_1 = 0.9}).beta1)
    assert.equal(0.01, mg.optim.AdamW().weight_decay)
    assert.equal(0.5, mg.optim.RMSprop(0.5).learning_rate)
  end)
end)

describe("optimizer steps match their formulas", function()
  it("SGD: momentum, nesterov, weight decay (PyTorch's rules)", function()
    -- buf = 0.9 buf + g; w -= 0.1 buf: w 1 -> 0.9 (buf 1) -> 0.61 (buf 2.9)
    h.assert_close(steps(mg.optim.SGD{learning_rate = 0.1, momentum = 0.9}, {1}, {{1}, {2}}), {0.61}, 1e-12)
    -- nesterov: w -= 0.1 (g + 0.9 buf): 1 - 0.1 * 1.9 = 0.81; 0.81 - 0.1 * (2 + 0.9 * 2.9) = 0.349
    h.assert_close(steps(mg.optim.SGD{learning_rate = 0.1, momentum = 0.9, nesterov = true}, {1}, {{1}, {2}}),
                   {0.349}, 1e-12)
    -- L2 weight decay: g + 0.1 w = 2 + 0.1 = 2.1; w = 1 - 0.1 * 2.1
    h.assert_close(steps(mg.optim.SGD{learning_rate = 0.1, weight_decay = 0.1}, {1}, {{2}}), {0.79}, 1e-12)
  end)

  it("Adam, Adam with L2 decay, AdamW (decoupled)", function()
    local lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-7
    local function adam (w, gs, wd, decoupled)
      local m, v = 0, 0
      for t, g in ipairs(gs) do
        if decoupled then w = w - lr * wd * w elseif wd then g = g + wd * w end
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        w = w - lr * math.sqrt(1 - b2 ^ t) / (1 - b1 ^ t) * m / (math.sqrt(v) + eps)
      end
      return w
    end
    h.assert_close(steps(mg.optim.Adam{learning_rate = lr}, {1}, {{2}, {-1}}), {adam(1, {2, -1})}, 1e-12)
    h.assert_close(steps(mg.optim.Adam{learning_rate = lr, weight_decay = 0.5}, {1}, {{2}, {-1}}),
                   {adam(1, {2, -1}, 0.5)}, 1e-12)
    h.assert_close(steps(mg.optim.AdamW{learning_rate = lr, weight_decay = 0.5}, {1}, {{2}, {-1}}),
                   {adam(1, {2, -1}, 0.5, true)}, 1e-12)
    -- AdamW's decay applies where the gradient is 0 too: w (1 - lr wd), and Adam's step of a zero m is 0
    h.assert_close(steps(mg.optim.AdamW{learning_rate = lr, weight_decay = 0.5}, {2}, {{0}}), {2 * (1 - 0.05)}, 1e-12)
  end)

  it("Adam's step runs in one pass with the numbers of the separate ops, bit for bit", function()
    -- the rule written with the ops, as the optimizer ran it before its fused step
    local function by_ops (var, g, m, v, t, lr, b1, b2, eps, wd)
      if wd > 0 then var:assign_sub(var:value(), lr * wd) end
      m = (m or mg.zeros_like(g)) * b1 + g * (1 - b1)
      v = (v or mg.zeros_like(g)) * b2 + g * g * (1 - b2)
      var:assign_sub(m / (mg.sqrt(v) + eps), lr * math.sqrt(1 - b2 ^ t) / (1 - b1 ^ t))
      return m, v
    end
    mg.random.seed(9)
    for _, dtype in ipairs{"float32", "float64"} do
      for _, shape in ipairs{{1}, {3, 5}, {70000}, {600, 500}} do     -- the last two on several threads
        for _, wd in ipairs{0, 0.25} do
          local w0 = mg.random.normal(shape, 0, 1, dtype)
          local fused, ops = mg.Variable(w0 + 0), mg.Variable(w0 + 0)
          local opt = mg.optim.AdamW{learning_rate = 0.01, weight_decay = wd, epsilon = 1e-7}
          local m, v
          for t = 1, 3 do
            local g = mg.random.normal(shape, 0, 1, dtype)
            opt:apply_gradients({g}, {fused})
            m, v = by_ops(ops, g, m, v, t, 0.01, 0.9, 0.999, 1e-7, wd)
          end
          for _, pair in ipairs{{fused:value(), ops:value()}, {opt.m[fused], m}, {opt.v[fused], v}} do
            assert.equal(0, mg.sum(mg.cast(mg.not_equal(pair[1], pair[2]), "int64")):item())
          end
        end
      end
    end
  end)

  it("SGD with momentum (and Nesterov) steps in one pass with the separate ops' numbers, bit for bit", function()
    mg.random.seed(10)
    for _, dtype in ipairs{"float32", "float64"} do
      for _, shape in ipairs{{1}, {3, 5}, {70000}, {600, 500}} do
        for _, nesterov in ipairs{false, true} do
          local w0 = mg.random.normal(shape, 0, 1, dtype)
          local fused, ops = mg.Variable(w0 + 0), mg.Variable(w0 + 0)
          local opt = mg.optim.SGD{learning_rate = 0.01, momentum = 0.9, nesterov = nesterov}
          local m
          for _ = 1, 3 do
            local g = mg.random.normal(shape, 0, 1, dtype)
            opt:apply_gradients({g}, {fused})
            m = m and m * 0.9 + g or g                        -- PyTorch's rule, op by op
            ops:assign_sub(nesterov and g + m * 0.9 or m, 0.01)
          end
          assert.equal(0, mg.sum(mg.cast(mg.not_equal(fused:value(), ops:value()), "int64")):item())
          assert.equal(0, mg.sum(mg.cast(mg.not_equal(opt.slots[fused], m), "int64")):item())
        end
      end
    end
    local w = mg.Variable({1, 2})
    assert.has_error(function() mg._momentum(w, mg.ones{3}, nil, 0.9, 0.1) end,
                     "momentum: the gradient has shape (3), the variable (2)")
    assert.has_error(function() mg._momentum(w, mg.ones{2}, mg.ones({2}, "float64"), 0.9, 0.1) end,
                     "momentum: slot momentum is float64, the variable is float32")
  end)

  it("RMSprop (plain, centered, with momentum) steps in one pass with the separate ops' numbers, bit for bit", function()
    -- Keras' rule op by op, as the optimizer ran it before its fused step
    local function by_ops (opt, var, g, lr, st)
      local rho = opt.rho
      st.v = (st.v or mg.zeros_like(g)) * rho + g * g * (1 - rho)
      local denom = st.v + opt.epsilon
      if opt.centered then
        st.a = (st.a or mg.zeros_like(g)) * rho + g * (1 - rho)
        denom = st.v - st.a * st.a + opt.epsilon
      end
      local step = g / mg.sqrt(denom)
      if opt.momentum > 0 then
        st.b = (st.b or mg.zeros_like(g)) * opt.momentum + step * lr
        var:assign_sub(st.b)
      else
        var:assign_sub(step, lr)
      end
    end
    local function same (a, b) assert.equal(0, mg.sum(mg.cast(mg.not_equal(a, b), "int64")):item()) end
    mg.random.seed(11)
    for _, dtype in ipairs{"float32", "float64"} do
      for _, shape in ipairs{{1}, {3, 5}, {600, 500}} do
        for _, centered in ipairs{false, true} do
          for _, momentum in ipairs{0, 0.8} do
            local w0 = mg.random.normal(shape, 0, 1, dtype)
            local fused, ops = mg.Variable(w0 + 0), mg.Variable(w0 + 0)
            local opt = mg.optim.RMSprop{learning_rate = 0.01, momentum = momentum, centered = centered}
            local st = {}
            for _ = 1, 3 do
              local g = mg.random.normal(shape, 0, 1, dtype)
              opt:apply_gradients({g}, {fused})
              by_ops(opt, ops, g, 0.01, st)
            end
            same(fused:value(), ops:value())
            local state = opt:get_state({fused}).slots
            same(state.velocity[1], st.v)
            if centered then same(state.average_gradient[1], st.a) end
            if momentum > 0 then same(state.momentum[1], st.b) end
          end
        end
      end
    end
    local w = mg.Variable({1, 2})
    assert.has_error(function() mg._rmsprop(w, mg.ones{2}, mg.ones{3}, nil, nil, 0.1, 0.9, 1e-7, 0, false) end,
                     "rmsprop: slot velocity has shape (3), the variable (2)")
  end)

  it("Adam's step leaves the slots it read as they were (get_state's tensors stay a snapshot)", function()
    local w = mg.Variable({1, 2, 3})
    local opt = mg.optim.Adam{learning_rate = 0.1}
    opt:apply_gradients({mg.constant({1, 1, 1})}, {w})
    local state = opt:get_state()
    local m1, v1 = state.slots.m[1]:totable(), state.slots.v[1]:totable()
    opt:apply_gradients({mg.constant({5, 5, 5})}, {w})
    assert.same(m1, state.slots.m[1]:totable())
    assert.same(v1, state.slots.v[1]:totable())
    assert.are_not.same(m1, opt.m[w]:totable())
    -- a value someone else holds is not written over: the variable gets a new one
    local held = w:value()
    local before = held:totable()
    opt:apply_gradients({mg.constant({1, 1, 1})}, {w})
    assert.same(before, held:totable())
    assert.are_not.same(before, w:value():totable())
  end)

  it("Adam's one-pass step names its mismatches", function()
    local w = mg.Variable({1, 2})
    assert.has_error(function() mg._adam(w, mg.ones{3}, nil, nil, 0.1, 0.9, 0.999, 1e-7, 0) end,
                     "adam: the gradient has shape (3), the variable (2)")
    assert.has_error(function() mg._adam(w, mg.ones({2}, "float64"), nil, nil, 0.1, 0.9, 0.999, 1e-7, 0) end,
                     "adam: the gradient is float64, the variable is float32")
    assert.has_error(function() mg._adam(w, mg.ones{2}, mg.ones{3}, nil, 0.1, 0.9, 0.999, 1e-7, 0) end,
                     "adam: slot m has shape (3), the variable (2)")
    assert.has_error(function() mg._adam(mg.Variable(mg.ones({2}, "int64")), mg.ones({2}, "int64"), nil, nil,
                                         0.1, 0.9, 0.999, 1e-7, 0) end,
                     "adam: the variable must be float32 or float64, got int64")
    -- one slot alone (a state set by hand): the other counts as zeros
    local m, v = mg._adam(w, mg.ones{2}, nil, mg.zeros{2}, 0.1, 0.9, 0.999, 1e-7, 0)
    local w2 = mg.Variable({1, 2})
    local m2, v2 = mg._adam(w2, mg.ones{2}, nil, nil, 0.1, 0.9, 0.999, 1e-7, 0)
    assert.same(m2:totable(), m:totable())
    assert.same(v2:totable(), v:totable())
    assert.same(w2:value():totable(), w:value():totable())
  end)

  it("RMSprop: plain, centered, with momentum (Keras' rules)", function()
    local lr, rho, eps = 0.01, 0.9, 1e-7
    local function rms (w, gs, centered, mom)
      local v, a, buf = 0, 0, 0
      for _, g in ipairs(gs) do
        v = rho * v + (1 - rho) * g * g
        local denom = v + eps
        if centered then a = rho * a + (1 - rho) * g; denom = v - a * a + eps end
        local step = lr * g / math.sqrt(denom)
        if mom then buf = mom * buf + step; w = w - buf else w = w - step end
      end
      return w
    end
    h.assert_close(steps(mg.optim.RMSprop{learning_rate = lr}, {1}, {{2}, {-1}}), {rms(1, {2, -1})}, 1e-12)
    h.assert_close(steps(mg.optim.RMSprop{learning_rate = lr, centered = true}, {1}, {{2}, {-1}}),
                   {rms(1, {2, -1}, true)}, 1e-12)
    h.assert_close(steps(mg.optim.RMSprop{learning_rate = lr, momentum = 0.5}, {1}, {{2}, {-1}}),
                   {rms(1, {2, -1}, false, 0.5)}, 1e-12)
    -- one step is lr g / sqrt(0.1 g^2 + eps): about lr sqrt(10) in the gradient's sign
    h.assert_close(steps(mg.optim.RMSprop{learning_rate = lr}, {0}, {{3}}), {-lr * 3 / math.sqrt(0.9 + eps)}, 1e-12)
  end)

  it("clipnorm, clipvalue and global_clipnorm scale the gradients first", function()
    local sgd = mg.optim.SGD
    h.assert_close(steps(sgd{learning_rate = 1, clipnorm = 1}, {0, 0}, {{3, 4}}), {-0.6, -0.8}, 1e-12)
    h.assert_close(steps(sgd{learning_rate = 1, clipnorm = 10}, {0, 0}, {{3, 4}}), {-3, -4}, 0)     -- under: untouched
    h.assert_close(steps(sgd{learning_rate = 1, clipvalue = 1}, {0, 0}, {{3, -0.5}}), {-1, 0.5}, 0)
    local a, b = mg.Variable(f64{0}), mg.Variable(f64{0, 0})
    sgd{learning_rate = 1, global_clipnorm = 2.5}:apply_gradients({f64{3}, f64{0, 4}}, {a, b})       -- norm 5
    h.assert_close(a, {-1.5}, 1e-12)
    h.assert_close(b, {0, -2}, 1e-12)
    -- an infinite global norm scales by 0, as PyTorch's clip_grad_norm_: inf * 0 is NaN, the rest stay
    a, b = mg.Variable(f64{1}), mg.Variable(f64{1, 1})
    sgd{learning_rate = 1, global_clipnorm = 1}:apply_gradients({f64{1 / 0}, f64{2, 3}}, {a, b})
    assert.is_true(a:value():item() ~= a:value():item())
    h.assert_close(b, {1, 1}, 0)
    -- per-variable clipnorm clips each alone
    a, b = mg.Variable(f64{0}), mg.Variable(f64{0, 0})
    sgd{learning_rate = 1, clipnorm = 2}:apply_gradients({f64{3}, f64{0, 1}}, {a, b})
    h.assert_close(a, {-2}, 1e-12)
    h.assert_close(b, {0, -1}, 1e-12)
    -- clipping comes before the L2 weight decay: g = clip(g) + wd w
    h.assert_close(steps(sgd{learning_rate = 1, clipnorm = 1, weight_decay = 0.5}, {2}, {{10}}), {2 - (1 + 1)}, 1e-12)
  end)

  it("a schedule sets the rate at opt.iterations", function()
    local opt = mg.optim.SGD{learning_rate = function(step) return step == 0 and 1 or 0.5 end}
    assert.equal(1, opt:get_learning_rate())
    local v = mg.Variable(f64{1})
    opt:apply_gradients({f64{1}}, {v})
    assert.equal(0.5, opt:get_learning_rate())
    opt:apply_gradients({f64{1}}, {v})
    assert.same({-0.5}, v:value():totable())
    local decay = mg.schedules.ExponentialDecay{initial_learning_rate = 0.1, decay_steps = 1, decay_rate = 0.5}
    h.assert_close(steps(mg.optim.SGD{learning_rate = decay}, {0}, {{1}, {1}, {1}}), {-(0.1 + 0.05 + 0.025)}, 1e-12)
    assert.equal(mg.optim.schedules, mg.schedules)
  end)
end)

describe("schedules", function()
  local s = mg.schedules
  it("ExponentialDecay", function()
    local e = s.ExponentialDecay{initial_learning_rate = 0.1, decay_steps = 10, decay_rate = 0.5}
    h.assert_close({e(0), e(5), e(10), e(20)}, {0.1, 0.1 * math.sqrt(0.5), 0.05, 0.025}, 1e-15)
    local st = s.ExponentialDecay{initial_learning_rate = 0.1, decay_steps = 10, decay_rate = 0.5, staircase = true}
    h.assert_close({st(9), st(10), st(15)}, {0.1, 0.05, 0.05}, 1e-15)
  end)

  it("CosineDecay, with and without Keras' warmup", function()
    local c = s.CosineDecay{initial_learning_rate = 1, decay_steps = 10, alpha = 0.1}
    h.assert_close({c(0), c(5), c(10), c(20)}, {1, 0.55, 0.1, 0.1}, 1e-15)
    local w = s.CosineDecay{initial_learning_rate = 0, decay_steps = 10, warmup_steps = 4, warmup_target = 1}
    h.assert_close({w(0), w(2), w(4), w(9), w(14), w(30)}, {0, 0.5, 1, 0.5, 0, 0}, 1e-15)
  end)

  it("LinearWarmup composes with any schedule or a constant", function()
    local lw = s.LinearWarmup{warmup_steps = 4, after = s.CosineDecay{initial_learning_rate = 1, decay_steps = 10}}
    h.assert_close({lw(0), lw(2), lw(4), lw(9), lw(14)}, {0, 0.5, 1, 0.5, 0}, 1e-15)
    local c = s.LinearWarmup{warmup_steps = 10, after = 0.2, initial_learning_rate = 0.1}
    h.assert_close({c(0), c(5), c(10), c(100)}, {0.1, 0.15, 0.2, 0.2}, 1e-15)
    local fn = s.LinearWarmup{warmup_steps = 2, after = function(step) return 1 / (step + 1) end}
    h.assert_close({fn(1), fn(2), fn(3)}, {0.5, 1, 0.5}, 1e-15)
  end)

  it("PiecewiseConstantDecay (a boundary step keeps the earlier value, as Keras)", function()
    local p = s.PiecewiseConstantDecay{boundaries = {10, 20}, values = {1, 0.5, 0.1}}
    assert.same({1, 1, 0.5, 0.5, 0.1}, {p(0), p(10), p(11), p(20), p(21)})
  end)

  it("check their options", function()
    local cases = {
      {function() s.ExponentialDecay{decay_steps = 10, decay_rate = 0.5} end,
       "ExponentialDecay: option 'initial_learning_rate' is required"},
      {function() s.ExponentialDecay{initial_learning_rate = 0.1, decay_steps = 0, decay_rate = 0.5} end,
       "ExponentialDecay: option 'decay_steps' must be a positive finite number, got 0"},
      {function() s.CosineDecay{initial_learning_rate = 1, decay_steps = 10, warmup_steps = 5} end,
       "CosineDecay: warmup_steps needs warmup_target (the rate the warmup reaches)"},
      {function() s.CosineDecay{initial_learning_rate = 1, decay_steps = 10, alpha = 2} end,
       "CosineDecay: option 'alpha' must be a number in [0, 1], got 2"},
      {function() s.LinearWarmup{warmup_steps = 0, after = 1} end,
       "LinearWarmup: option 'warmup_steps' must be a positive integer, got 0"},
      {function() s.LinearWarmup{warmup_steps = 3, after = "cosine"} end,
       "LinearWarmup: option 'after' must be a positive number or a schedule, got 'cosine'"},
      {function() s.PiecewiseConstantDecay{boundaries = {10, 5}, values = {1, 2, 3}} end,
       "PiecewiseConstantDecay: boundaries must increase, got 5 after 10"},
      {function() s.PiecewiseConstantDecay{boundaries = {10}, values = {1}} end,
       "PiecewiseConstantDecay: values needs one entry more than boundaries (1), got 1"},
      {function() s.CosineDecay{initial_learning_rate = 1, decay_steps = 10}(-1) end,
       "CosineDecay: step must be a number >= 0, got -1"},
    }
    for _, c in ipairs(cases) do assert.has_error(c[1], c[2]) end
  end)
end)

describe("optimizer options", function()
  it("are checked as PyTorch does (a beta of 1, a negative rate or decay, two clips)", function()
    local o = mg.optim
    local cases = {
      {function() o.AdamW{beta_1 = 1} end, "AdamW: option 'beta_1' must be a number in [0, 1), got 1"},
      {function() o.AdamW{beta2 = 1} end, "AdamW: option 'beta2' must be a number in [0, 1), got 1"},
      {function() o.RMSprop{rho = 1} end, "RMSprop: option 'rho' must be a number in [0, 1), got 1"},
      {function() o.RMSprop{learning_rate = -0.1} end,
       "RMSprop: option 'learning_rate' must be a positive finite number or a schedule, got -0.1"},
      {function() o.SGD{weight_decay = -1} end, "SGD: option 'weight_decay' must be a finite number >= 0, got -1"},
      {function() o.Adam{clipnorm = 0} end, "Adam: option 'clipnorm' must be a positive finite number, got 0"},
      {function() o.Adam{global_clipnorm = 0 / 0} end,
       "Adam: option 'global_clipnorm' must be a positive finite number, got nan"},
      {function() o.SGD{clipnorm = 1, global_clipnorm = 1} end,
       "SGD: clipnorm, clipvalue and global_clipnorm: give at most one"},
      {function() o.RMSprop{centered = 1} end, "RMSprop: option 'centered' must be true or false, got 1"},
      {function() o.RMSprop{momentum = 1} end, "RMSprop: option 'momentum' must be a number in [0, 1), got 1"},
      {function() o.RMSprop{epsilon = 0} end, "RMSprop: option 'epsilon' must be a positive finite number, got 0"},
      {function() o.AdamW{amsgrad = true} end, "AdamW: unknown option 'amsgrad' (known: learning_rate, beta1, "
        .. "beta2, epsilon, weight_decay, clipnorm, clipvalue, global_clipnorm, name)"},
      {function() o.RMSprop{alpha = 0.99} end, "RMSprop: unknown option 'alpha' (known: learning_rate, rho, momentum, "
        .. "epsilon, centered, weight_decay, clipnorm, clipvalue, global_clipnorm, name)"},
      {function() o.get("adagrad") end, "optim.get: unknown optimizer 'adagrad' (known: sgd, adam, adamw, rmsprop)"},
    }
    for _, c in ipairs(cases) do assert.has_error(c[1], c[2]) end
  end)

  it("a schedule that fails or gives a bad rate stops the step before anything moves", function()
    local v = mg.Variable(f64{1})
    local opt = mg.optim.SGD{learning_rate = function() return -1 end}
    assert.has_error(function() opt:apply_gradients({f64{1}}, {v}) end,
                     "SGD: the learning-rate schedule gave -1 at step 0; it must be a finite number >= 0")
    opt.learning_rate = function() error("boom", 0) end
    assert.has_error(function() opt:apply_gradients({f64{1}}, {v}) end,
                     "SGD: the learning-rate schedule failed at step 0: boom")
    assert.same({1}, v:value():totable())
    assert.equal(0, opt.iterations)
    assert.same({}, opt:get_state().slots)
  end)
end)

describe("optimizer state", function()
  local function run (opt, vars, n)
    for i = 1, n do
      local grads = {}
      for j, v in ipairs(vars) do grads[j] = mg.ones(v.shape, "float64") * (i + j) end
      opt:apply_gradients(grads, vars)
    end
  end

  for _, make in ipairs({
    {"SGD", function() return mg.optim.SGD{learning_rate = 0.1, momentum = 0.9} end, {"momentum"}},
    {"Adam", function() return mg.optim.Adam{learning_rate = 0.1} end, {"m", "v"}},
    {"AdamW", function() return mg.optim.AdamW{learning_rate = 0.1} end, {"m", "v"}},
    {"RMSprop", function() return mg.optim.RMSprop{momentum = 0.5, centered = true} end,
     {"velocity", "momentum", "average_gradient"}},
  }) do
    local name, new, slots = make[1], make[2], make[3]
    it(name .. ": get_state and set_state resume bit for bit", function()
      local a, b = mg.Variable(f64{1, 2}), mg.Variable(f64{{3}})
      local opt = new()
      run(opt, {a, b}, 2)
      local state = opt:get_state()
      assert.equal(name, state.optimizer)
      assert.equal(2, state.iterations)
      local names = {}
      for k, list in pairs(state.slots) do
        names[#names + 1] = k
        assert.equal(2, #list)
        assert.same({2}, list[1].shape)
        assert.same({1, 1}, list[2].shape)
      end
      table.sort(names)
      table.sort(slots)
      assert.same(slots, names)
      -- a fresh optimizer on copies of the variables, restored, takes the same next step
      local a2, b2 = mg.Variable(a:value()), mg.Variable(b:value())
      local opt2 = new()
      opt2:set_state(state, {a2, b2})
      assert.equal(2, opt2.iterations)
      run(opt, {a, b}, 1)
      run(opt2, {a2, b2}, 1)
      assert.same(a:value():totable(), a2:value():totable())
      assert.same(b:value():totable(), b2:value():totable())
    end)
  end

  it("zeros for a variable not yet updated; build fixes the order", function()
    local a, b = mg.Variable(f64{1}), mg.Variable(f64{1, 1})
    local opt = mg.optim.Adam():build({a, b})
    opt:apply_gradients({nil, f64{1, 1}}, {a, b})
    local st = opt:get_state()
    assert.same({0}, st.slots.m[1]:totable())
    assert.is_true(st.slots.m[2]:totable()[1] > 0)
    assert.same({}, mg.optim.SGD():get_state({a}).slots)                 -- no momentum, no slots
  end)

  it("set_state checks the whole state before it changes anything", function()
    local a = mg.Variable(f64{1, 2})
    local opt = mg.optim.Adam()
    opt:apply_gradients({f64{1, 1}}, {a})
    local good = opt:get_state()
    local cases = {
      {{optimizer = "SGD", iterations = 1, slots = {}}, "the state is 'SGD''s, not Adam's"},
      {{iterations = -1, slots = good.slots}, "state.iterations must be an integer >= 0, got -1"},
      {{iterations = 1.5, slots = good.slots}, "state.iterations must be an integer >= 0, got 1.5"},
      {{iterations = 1, slots = {m = good.slots.m}}, "state.slots.v is missing"},
      {{iterations = 1, slots = {m = good.slots.m, v = good.slots.v, velocity = good.slots.v}},
       "state.slots has 'velocity', which Adam does not keep (its slots: m, v)"},
      {{iterations = 1, slots = {m = {mg.zeros{2}}, v = good.slots.v}},
       "state.slots.m[1] must be a float64 tensor of shape (2) (variable 'Variable'), got a tensor (2) float32"},
      {{iterations = 1, slots = {m = {}, v = good.slots.v}}, "state.slots.m has 0 tensors for 1 variables"},
      {"state", "state must be a table {optimizer =, iterations =, slots = {...}}, got 'state'"},
    }
    for _, c in ipairs(cases) do
      assert.has_error(function() opt:set_state(c[1]) end, "Adam:set_state: " .. c[2])
    end
    assert.equal(1, opt.iterations)
    assert.equal(good.slots.m[1], opt.m[a])
    assert.has_error(function() mg.optim.Adam():set_state(good) end, "Adam:set_state: the optimizer has no "
                     .. "variables yet; give them: opt:set_state(state, model.trainable_variables)")
  end)
end)

-- {========================= the bar ===========================

-- a writer that keeps what is written
local function sink ()
  local out = {buf = {}}
  function out:write (...) for _, s in ipairs({...}) do self.buf[#self.buf + 1] = s end return self end
  function out:flush () end
  function out:text () return table.concat(self.buf) end
  return out
end

-- the text with the timings (which vary) as T
local function untimed (s)
  return (s:gsub(" %- %d+s %d+[mu]?s/step", " - Ts T/step"):gsub(" %- %d+s %- %d+[mu]?s/step", " - Ts - T/step")
           :gsub("ETA: [%d:]+s?", "ETA: T"))
end

describe("progress", function()
  it("into a pipe or a file: nothing until finish, then one line", function()
    local out = sink()
    local bar = mg.progress(4, {out = out, tty = false})
    for i = 1, 4 do bar:update(i, {loss = 1 / i}) end
    assert.equal("", out:text())
    bar:finish({accuracy = 0.75, loss = 0.25, val_loss = 0.5, val_accuracy = 1})
    bar:finish()                                                        -- once only
    assert.equal("4/4 [==============================] - Ts T/step - loss: 0.2500 - accuracy: 0.7500 "
                 .. "- val_loss: 0.5000 - val_accuracy: 1.0000\n", untimed(out:text()))
    assert.is_nil(out:text():find("\r", 1, true))
  end)

  it("on a terminal: redrawn in place with \\r, the final line once", function()
    local out = sink()
    local bar = mg.progress(12, {out = out, tty = true, interval = 0, label = "fit"})
    for i = 0, 12 do bar:update(i, {{"loss", 2 / (i + 1)}, {"mae", 1e-4}}) end
    bar:finish()
    local text = untimed(out:text())
    local draws = {}
    for d in text:gmatch("\r([^\r]*)") do draws[#draws + 1] = d end
    assert.equal(14, #draws)                                            -- 13 updates and the final line
    assert.equal("fit  0/12 [..............................] - loss: 2.0000 - mae: 1.0000e-04", draws[1])
    assert.equal("fit  5/12 [===========>..................] - ETA: T - loss: 0.3333 - mae: 1.0000e-04", draws[6])
    assert.equal("fit 12/12 [==============================] - loss: 0.1538 - mae: 1.0000e-04",
                 (draws[13]:gsub(" +$", "")))                          -- padded over the longer ETA line
    assert.equal("fit 12/12 [==============================] - Ts T/step - loss: 0.1538 - mae: 1.0000e-04\n",
                 draws[14])
    local _, finals = text:gsub("%- Ts T/step", "")
    assert.equal(1, finals)
    assert.equal("\n", text:sub(-1))
  end)

  it("pads a shorter redraw over a longer one, and a stopped bar ends at its last step", function()
    local out = sink()
    local bar = mg.progress(3, {out = out, tty = true, interval = 0})
    bar:update(1, {loss = 123456.5})
    bar:update(2, {loss = 1})
    bar:stop()
    bar:finish()
    local draws = {}
    for d in out:text():gmatch("\r([^\r]*)") do draws[#draws + 1] = d end
    assert.equal(#draws[1], #draws[2])
    assert.truthy(untimed(draws[3]):find("^2/3 %[===================>%.%.%.%.%.%.%.%.%.%.%] %- Ts T/step %- loss: 1%.0000"))
  end)

  it("verbose = 2 is one short line; nan and inf print as such", function()
    local out = sink()
    local bar = mg.progress(5, {out = out, verbose = 2, tty = true})
    bar:update(3)
    bar:finish({loss = 0 / 0, other = math.huge})
    assert.equal("5/5 - Ts - T/step - loss: nan - other: inf\n", untimed(out:text()))
  end)

  it("draws a bar with counts, time and values", function()
    local out = sink()
    local bar = mg.progress(4, {label = "fit", out = out, tty = true})
    bar:update(2, {loss = 0.5})
    bar:finish({loss = 0.25})
    local text = out:text()
    assert.truthy(text:find("fit 2/4 [==============>...............] - ETA: ", 1, true))
    assert.truthy(text:find("fit 4/4 [==============================] - ", 1, true))
    assert.truthy(text:find("loss: 0.2500", 1, true))
    assert.equal("\n", text:sub(-1))
    assert.has_error(function() mg.progress(-1) end,
                     "progress: the number of steps must be a non-negative integer, got -1")
    assert.has_error(function() mg.progress(2):update(1, {{"loss"}}) end,
                     "progress:update: value 'loss' must be a number or a one-element tensor, got nil")
  end)

  it("knows a pipe from a terminal by itself", function()
    local cmd = h.bin .. [[ -e 'local b = mg.progress(3, {interval = 0}); for i = 1, 3 do b:update(i, {loss = i}) end; b:finish()']]
    local out, code = h.run(cmd .. " | cat")
    assert.equal(0, code, out)
    assert.equal("3/3 [==============================] - Ts T/step - loss: 3.0000\n", untimed(out))
    local file = os.tmpname()
    out, code = h.run(cmd .. " > " .. file)
    assert.equal(0, code, out)
    local f = assert(io.open(file))
    assert.equal("3/3 [==============================] - Ts T/step - loss: 3.0000\n", untimed(f:read("a")))
    f:close()
    os.remove(file)
    -- util-linux's script gives a pseudo-terminal, where the system has them
    -- (a chroot without /dev/pts has none: the terminal half is left out, said so)
    local _, has_script = h.run("command -v script")
    if has_script ~= 0 then return end
    out = h.run("script -qec " .. quote(cmd) .. " /dev/null")
    if out:find("failed to create pseudo-terminal", 1, true) then
      io.stderr:write("\n(spec/09: no pseudo-terminal here; the progress bar on a terminal is not checked)\n")
      return
    end
    assert.truthy(out:find("\r1/3 [=========>....................]", 1, true), out)
    local _, finals = untimed(out):gsub("3/3 %[=+%] %- Ts T/step", "")
    assert.equal(1, finals, out)
  end)
end)

-- }=============================================================

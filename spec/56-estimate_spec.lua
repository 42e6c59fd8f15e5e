-- mg.memory.estimate(step, ...): a training step run dry (no arithmetic)
-- predicts the peak mg.memory.stats().peak_bytes shows for the real step,
-- and changes nothing the step would change.
local mg = require "moongrad"
local h = require "spec.helpers"
local nn = mg.nn

local function labels (n, k) return mg.cast(mg.random.uniform({n}, 1, k + 1) // 1, "int64") end

-- models as the bench has them, small: (model, x, y, loss)
local MODELS = {
  mlp = function()
    return nn.Sequential{nn.Dense(256, "relu"), nn.Dense(256, "relu"), nn.Dense(10)}, mg.random.normal{64, 196},
           labels(64, 10), mg.losses.SparseCategoricalCrossentropy{from_logits = true}
  end,
  cnn = function()
    return nn.Sequential{nn.Conv2D(8, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
                         nn.Conv2D(16, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
                         nn.Flatten(), nn.Dense(32, "relu"), nn.Dense(10)},
           mg.random.normal{16, 16, 16, 1}, labels(16, 10), mg.losses.SparseCategoricalCrossentropy{from_logits = true}
  end,
  gpt = function()
    local layers = {nn.Embedding(32, 64), nn.PositionalEmbedding(16)}
    for _ = 1, 2 do layers[#layers + 1] = nn.TransformerBlock(4, 64, {causal = true}) end
    layers[#layers + 1] = nn.LayerNorm()
    layers[#layers + 1] = nn.Dense(32)
    local ids = mg.cast(mg.random.uniform({8, 16}, 1, 33) // 1, "int64")
    return nn.Sequential(layers), ids, mg.cast(mg.random.uniform({8, 16}, 1, 33) // 1, "int64"),
           mg.losses.SparseCategoricalCrossentropy{from_logits = true}
  end,
  chain = function()
    local layers = {}
    for i = 1, 8 do layers[i] = nn.Dense(128, "tanh") end
    return nn.Sequential(layers), mg.random.normal{128, 128}, nil, function(_, p) return mg.mean(p * p) end
  end,
}

-- a training step of the model, its forward wrapped by `how`
local function stepper (name, how)
  mg.random.seed(1)
  local model, x, y, loss_fn = MODELS[name]()
  local opt = mg.optim.Adam{learning_rate = 1e-3}
  model(x)
  local vars = model.trainable_variables
  local forward = function(v) return model(v) end
  if how == "recompute" then forward = mg.recompute_grad(forward)
  elseif how == "dots" then forward = mg.recompute_grad(forward, {policy = "dots"})
  elseif how == "sequential" then
    forward = function(v) return nn.checkpoint_sequential(model.layers, 2, v) end
  end
  local function step ()
    local t = mg.tape()
    local loss
    if how == "hooks" then
      loss = mg.saved_tensors_hooks("bfloat16", function() return loss_fn(y, forward(x)) end)
    else
      loss = loss_fn(y, forward(x))
    end
    t:stop()
    opt:apply_gradients(t:gradient(loss, vars), vars)
    return loss
  end
  return step, vars, opt
end

local function real_peak (step)
  h.settled()
  mg.memory.reset_peak()
  step()
  return mg.memory.stats().peak_bytes
end

describe("memory.estimate", function()
  local old, oldmin
  before_each(function() if not os.getenv("PACING") then old, oldmin = mg.memory.setpause(100, 0) else old, oldmin = mg.memory.setpause(110) end end)   -- exact peaks
  after_each(function() mg.memory.setpause(old, oldmin) end)

  for _, name in ipairs{"mlp", "cnn", "gpt", "chain"} do
    for _, how in ipairs{"plain", "recompute", "dots", "hooks", "sequential"} do
      it(("predicts the %s step's peak (%s) within 5%%, first step and later ones"):format(name, how), function()
        local step, vars, opt = stepper(name, how)
        for round = 1, 2 do
          h.settled()
          local w = vars[1]:value():sum():item()
          local r = mg.memory.estimate(step)
          assert.are.equal(w, vars[1]:value():sum():item())             -- nothing written
          assert.are.equal(round - 1, opt.iterations)                  -- nor counted
          local real = real_peak(step)
          if os.getenv("SHOW") then print(name, how, round, r.peak_bytes, real, r.peak_bytes / real) end
          assert.is_true(math.abs(r.peak_bytes - real) <= 0.05 * real,
                         ("%s/%s round %d: estimate %d, real %d"):format(name, how, round, r.peak_bytes, real))
        end
      end)
    end
  end

  it("leaves everything as it was: weights, slots, step counts, statistics, the random stream, the peak", function()
    mg.random.seed(4)
    local model = nn.Sequential{nn.Dense(32), nn.BatchNorm(), nn.Lambda(function(v) return mg.relu(v) end), nn.Dropout(0.3), nn.Dense(4)}
    local x, y = mg.random.normal{16, 8}, labels(16, 4)
    local loss_fn = mg.losses.SparseCategoricalCrossentropy{from_logits = true}
    for _, opt in ipairs{mg.optim.SGD{learning_rate = 0.1, momentum = 0.9}, mg.optim.RMSprop{centered = true, momentum = 0.5},
                         mg.optim.Adam{}} do
      model(x)
      local vars = model.trainable_variables
      local function step ()
        local t = mg.tape()
        local loss = loss_fn(y, model(x, true))
        t:stop()
        opt:apply_gradients(t:gradient(loss, vars), vars)
      end
      step()                                         -- slots exist
      local before = {}
      for i, v in ipairs(model.variables) do before[i] = v:value():cast("float64"):sum():item() end
      local state = opt:get_state(vars)
      local rng = mg.random.get_state()
      local peak = mg.memory.stats().peak_bytes
      local r = mg.memory.estimate(step)
      assert.is_true(r.peak_bytes > 0)
      for i, v in ipairs(model.variables) do assert.are.equal(before[i], v:value():cast("float64"):sum():item(), v.name) end
      local now = opt:get_state(vars)
      assert.are.equal(state.iterations, now.iterations)
      for name, list in pairs(state.slots) do
        for i = 1, #list do assert.are.equal(list[i], now.slots[name][i], name .. " " .. i) end   -- the same tensors
      end
      assert.are.same(rng, mg.random.get_state())
      assert.are.equal(peak, mg.memory.stats().peak_bytes)
      assert.is_false(mg.memory.dry_running())
    end
  end)

  it("builds a model for real when its first call is in the dry run, and refuses variables made from dry values", function()
    local Scale = nn.Layer:subclass("Scale")
    function Scale:build (shape)                      -- arithmetic in a build
      self.w = mg.Variable(mg.random.normal{shape[#shape]} * 0.1 + 1)
    end
    function Scale:call (v) return v * self.w end
    local function make ()
      mg.random.seed(8)
      return nn.Sequential{nn.Dense(16, "tanh"), Scale(), nn.Dense(4)}
    end
    local x = mg.random.normal{8, 5}
    local built_outside = make()
    built_outside(x)
    local inside = make()
    local function step ()
      local t = mg.tape()
      local loss = mg.sum(inside(x))
      t:stop()
      return t:gradient(loss, inside.trainable_variables)
    end
    mg.memory.estimate(step)                          -- the first call, dry: builds the layers
    local a, b = built_outside.variables, inside.variables
    assert.are.equal(#a, #b)
    for i = 1, #a do assert.are.same(a[i]:value():totable(), b[i]:value():totable()) end
    local ok, err = pcall(mg.memory.estimate, function() return mg.Variable(mg.exp(x)) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("Variable: its initial value was computed in a dry run", 1, true), tostring(err))
    -- a contiguous copy of a real tensor is skipped in a dry run too, so it is refused the same way
    ok, err = pcall(mg.memory.estimate, function() return mg.Variable(mg.transpose(x):reshape{-1}) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("Variable: its initial value was computed in a dry run", 1, true), tostring(err))
  end)

  it("keeps no values in what a dry run computes: inside it they read as NaN, after it reading one is an error", function()
    local x = mg.random.normal({2, 3}, 0, 1, "float64")
    local kept, seen = {}, {}
    mg.memory.estimate(function()
      local t = mg.tape({persistent = true})
      t:watch(x)
      local y = mg.exp(x) * 2
      kept.y, kept.view, kept.t = y, y:transpose(), t
      kept.g = t:gradient(mg.sum(y), x)
      kept.ids = mg.constant({1, 0}, "int64") + 1      -- integers are computed for real
      kept.mask = mg.greater(y, -1)                     -- on zeros (defined, meaningless)
      kept.top = mg.topk(y, 2)                          -- two results: computed on zeros, floats without values
      kept.picked = mg.gather(y, kept.ids)              -- a float of floats without values and integers
      seen.item, seen.rows = mg.sum(y):item(), y:totable()
      seen.text = tostring(y)
    end)
    assert.is_true(seen.item ~= seen.item)              -- NaN
    assert.is_true(seen.rows[2][3] ~= seen.rows[2][3])
    assert.truthy(seen.text:find("no values: computed in a dry run", 1, true), seen.text)
    assert.are.same({2, 1}, kept.ids:totable())
    assert.are.same({{true, true, true}, {true, true, true}}, kept.mask:totable())
    assert.truthy(tostring(kept.view):find("no values", 1, true))   -- printing still works
    local dry = "this tensor was computed in a dry run (mg.memory.estimate), which computes no values"
    local v = mg.Variable(mg.zeros({2, 3}, "float64"))
    for what, f in pairs{
      item = function() return kept.y:reshape{-1}[1]:item() end,
      totable = function() return kept.g:totable() end,
      round = function() return mg.round(kept.view) end,
      add = function() return kept.y + 1 end,
      topk = function() return kept.top:totable() end,
      gather = function() return kept.picked * 1 end,
      reshape = function() return kept.y:reshape{-1} end,
      cast = function() return mg.cast(kept.y, "float32") end,
      assign = function() v:assign(kept.y) end,
      gradient = function() return kept.t:gradient(mg.sum(kept.y), x) end,
      save = function() mg.save(os.tmpname(), {w = kept.y}) end,
    } do
      local ok, err = pcall(f)
      assert.is_false(ok, what)
      assert.truthy(tostring(err):find(dry, 1, true), what .. ": " .. tostring(err))
    end
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, v:value():totable())   -- nothing half-done
    -- estimate's next dry run takes them as its own (meaningless values, no error)
    mg.memory.estimate(function() return mg.round(kept.view) + kept.y:transpose() end)
  end)

  it("does not keep an autocast region's weight casts from a dry run inside it", function()
    local w = mg.Variable(mg.random.normal{8, 8})
    local x = mg.random.normal{4, 8}
    local want = mg.autocast("bfloat16", function() return mg.matmul(x, w) end)
    local got = mg.autocast("bfloat16", function()
      mg.memory.estimate(function() return mg.matmul(x, w) end)   -- casts w, dry
      return mg.matmul(x, w)                                      -- casts it again, for real
    end)
    assert.are.same(want:totable(), got:totable())
  end)

  it("predicts custom gradients, second order on persistent tapes, RevBlock and checkpoint_loop exactly", function()
    local x = mg.random.normal{64, 32}
    local w = mg.Variable(mg.random.normal{32, 32})
    local sq = mg.custom_gradient(function(ctx, a)
      ctx:save(a)
      return a * a, function(dy) return dy * 2 * ctx:saved() end
    end, {context = true})
    local rev = nn.RevBlock(nn.Dense(16, "tanh"), nn.Dense(16, "tanh"), {num_layers = 4})
    rev(x)
    local steps = {
      custom_gradient = function()
        local t = mg.tape(); local l = mg.sum(sq(mg.matmul(x, w))); t:stop(); return t:gradient(l, {w})
      end,
      second_order = function()
        local t = mg.tape({persistent = true}); t:watch(x)
        local t2 = mg.tape(); t2:watch(x)
        local y = mg.sum(mg.tanh(mg.matmul(x, w)))
        local g = t2:gradient(y, {x})[1]
        local z = mg.sum(g * g)
        t:stop()
        return t:gradient(z, {w}), t:gradient(y, {w})
      end,
      revblock = function()
        local t = mg.tape(); local l = mg.sum(rev(x)); t:stop(); return t:gradient(l, rev.trainable_variables)
      end,
      checkpoint_loop = function()
        local t = mg.tape()
        local h = mg.checkpoint_loop(function(st) return mg.tanh(mg.matmul(st, w)) end, x, 16)
        local l = mg.sum(h); t:stop(); return t:gradient(l, {w})
      end,
    }
    for name, step in pairs(steps) do
      step()
      local r = mg.memory.estimate(step)
      assert.are.equal(real_peak(step), r.peak_bytes, name)
    end
  end)

  it("prints what makes the peak", function()
    local step = stepper("mlp", "plain")
    local r = mg.memory.estimate(step)
    local text = tostring(r)
    assert.truthy(text:find("moongrad.memory.estimate: peak ", 1, true), text)
    assert.truthy(text:find("| weights (variables) | ", 1, true), text)
    assert.truthy(text:find("| saved for the backward (activations) | ", 1, true), text)
    local parts = r.at_peak.variable + r.at_peak.saved + r.at_peak.gradient + r.at_peak.tensor
    assert.are.equal(r.peak_bytes, parts)
    assert.is_true(r.seconds < 1)
  end)

  it("leaves the peak as reset_peak left it, though its tensors outlive it until collected, failing or not", function()
    local W = mg.Variable(mg.random.normal{256, 256})
    local x = mg.random.normal{128, 256}
    local function step (fail)
      local t = mg.tape()
      local loss = mg.sum(mg.tanh(mg.matmul(x, W)))
      t:stop()
      local g = t:gradient(loss, {W})
      if fail then error("late") end
      return g
    end
    for _, fail in ipairs{false, true} do
      h.settled()
      mg.memory.reset_peak()
      local peak = mg.memory.stats().peak_bytes
      pcall(mg.memory.estimate, step, fail)
      assert.are.equal(peak, mg.memory.stats().peak_bytes)
    end
  end)

  it("names a failing step, closes the dry run, and refuses what is not a step", function()
    local ok, err = pcall(mg.memory.estimate, function() error("boom") end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("memory.estimate: the step failed in the dry run: ", 1, true), tostring(err))
    assert.truthy(tostring(err):find("boom", 1, true))
    assert.is_false(mg.memory.dry_running())
    assert.has_error(function() mg.memory.estimate(42) end, "memory.estimate: step must be a function, got number")
    ok, err = pcall(mg.memory.estimate, function() return mg.memory.estimate(function() end) end)
    assert.truthy(tostring(err):find("estimates do not nest", 1, true), tostring(err))
    assert.is_false(mg.memory.dry_running())
    local x = mg.ones{3}
    assert.are.same({1, 1, 1}, (x * 1):totable())    -- ops compute again
  end)

  it("passes the step its arguments and gives the step's bytes under autocast and a budget too", function()
    local step, vars = stepper("gpt", "plain")
    local auto = function() return mg.autocast("bfloat16", step) end
    local r = mg.memory.estimate(auto)
    assert.is_true(math.abs(r.peak_bytes - real_peak(auto)) <= 0.05 * r.peak_bytes)
    local seen
    mg.memory.estimate(function(a, b) seen = {a, b} end, 1, "two")
    assert.are.same({1, "two"}, seen)
    local was = mg.memory.budget("1 GiB")
    local rb = mg.memory.estimate(step)                -- the step as it runs without a budget
    assert.are.equal(1024 ^ 3, mg.memory.budget())     -- the budget back after it
    mg.memory.budget(was)
    assert.are.equal(rb.peak_bytes, mg.memory.estimate(step).peak_bytes)
    assert.is_true(#vars > 0)
  end)

  it("says which Lua line made what the tapes hold (layers count at the line that calls them)", function()
    local l1, l2 = nn.Dense(64, "tanh"), nn.Dense(8)
    local x = mg.random.normal{32, 16}
    local function step ()
      local t = mg.tape()
      local a = l1(x)                                  -- LINE_A: l1 keeps its output (tanh's gradient)
      local b = mg.exp(a) * 3                          -- LINE_B: exp keeps its output, mul nothing
      local loss = mg.sum(l2(b))
      t:stop()
      return t:gradient(loss, {x})
    end
    local r = mg.memory.estimate(step)
    local src = debug.getinfo(1, "S").short_src
    local by = {}
    for _, s in ipairs(r.saved_by_line) do by[s.site] = s.bytes end
    local line_a, line_b
    local n = 0
    for l in io.lines(src) do
      n = n + 1
      if l:find("-- LINE_A:", 1, true) and not l:find("find", 1, true) then line_a = n end
      if l:find("-- LINE_B:", 1, true) and not l:find("find", 1, true) then line_b = n end
    end
    assert.are.equal(32 * 64 * 4, by[src .. ":" .. line_a], tostring(r))
    -- exp's output and the product (l2 keeps its input); and the 3 that mul keeps for a's
    -- gradient, unless a constant made earlier stands for it (then it is "before the step")
    local b = by[src .. ":" .. line_b]
    assert.is_true(b >= 32 * 64 * 4 * 2 and b <= 32 * 64 * 4 * 2 + 8, tostring(r))
    local total = 0
    for _, s in ipairs(r.saved_by_line) do total = total + s.bytes end
    local before = r.peak_saved_bytes - total           -- x, made before the step, and such constants
    assert.is_true(before >= 32 * 16 * 4 and before <= 32 * 16 * 4 + 64, tostring(r))
    assert.truthy(tostring(r):find("| before the step %(its inputs, %.%.%.%) | 2%.0%d KiB |"), tostring(r))
  end)
end)

describe("examples/memory_estimate.lua", function()
  it("compares three ways before running, and the real step matches the prediction", function()
    local out, code = h.run(h.bin .. " examples/memory_estimate.lua")
    assert.are.equal(0, code, out)
    for _, how in ipairs{"plain", "recompute", "bfloat16 hooks"} do
      assert.truthy(out:find("| " .. how .. " | [%d.]+ MiB | [%d.]+ MiB | [%d.]+ ms |"), how .. ":\n" .. out)
    end
    local measured, predicted = out:match("measured: ([%d.]+) MiB, predicted: ([%d.]+) MiB")
    assert.are.equal(predicted, measured, out)
  end)
end)

-- Non-tensor values through the memory-saving transforms, as PyTorch's
-- torch.utils.checkpoint passes them: recompute_grad's arguments and
-- results of any Lua type, checkpoint_sequential's one input, and
-- checkpoint_loop's table states with numbers, strings and booleans in
-- them. Each compares values and gradients with the plain tape running the
-- same program (float64, the same arithmetic: bit for bit).
local mg = require "moongrad"
local h = require "helpers"

local function f64 (v) return mg.constant(v, "float64") end
local function identity (f) return f end

-- the tensors of a list of gradients, as plain tables
local function grads (gs)
  local out = {}
  for i, g in ipairs(gs) do out[i] = g:totable() end
  return out
end

-- runs prog(wrap) with wrap = recompute_grad, then with wrap = identity,
-- from the same random state; returns both results
local function both (prog)
  local state = mg.random.get_state()
  local with = table.pack(prog(mg.recompute_grad))
  mg.random.set_state(state)
  local without = table.pack(prog(identity))
  return with, without
end

describe("recompute_grad passes non-tensor values through", function()
  before_each(function() mg.random.seed(41) end)

  it("number, string, boolean and nil arguments reach f as they are, in the first run and the re-run", function()
    local with, without = both(function(wrap)
      local seen = {}
      local w = mg.Variable(mg.random.normal({3, 3}, 0, 1, "float64"))
      local f = wrap(function(x, n, s, flag, z, last)
        seen[#seen + 1] = table.concat({math.type(n), tostring(n), s, tostring(flag), tostring(z),
                                        tostring(last), select("#", x, n, s, flag, z, last)}, " ")
        local y = mg.tanh(mg.matmul(x, w)) * n
        if flag then y = y + 1 end
        return s == "square" and y * y or y
      end)
      local x = mg.random.normal({2, 3}, 0, 1, "float64")
      local t = mg.tape()
      t:watch(x)
      local loss = mg.sum(f(x, 2.5, "square", true, nil, nil))
      t:stop()
      return grads(t:gradient(loss, {x, w})), loss:item(), seen
    end)
    assert.same(without[1], with[1])
    assert.equal(without[2], with[2])
    -- the first run and the re-run saw the same arguments, trailing nils counted
    assert.same({"float 2.5 square true nil nil 6", "float 2.5 square true nil nil 6"}, with[3])
    assert.same({"float 2.5 square true nil nil 6"}, without[3])
  end)

  it("gives back f's results as f gave them: the count with trailing nils, nil holes, every type", function()
    local x = f64{1, 2}
    local fn = function() end
    local obj = setmetatable({}, {__index = {kind = "object"}})
    local g = mg.recompute_grad(function(v)
      return v * 2, nil, 3, "s", true, false, fn, obj, 2^53, math.huge, nil, nil
    end)
    local t = mg.tape()
    t:watch(x)
    local r = table.pack(g(x))
    local loss = mg.sum(r[1] * r[1])
    t:stop()
    assert.equal(12, r.n)
    assert.same({2, 4}, r[1]:totable())
    assert.is_nil(r[2])
    assert.equal(3, r[3])
    assert.equal("integer", math.type(r[3]))
    assert.equal("s", r[4])
    assert.is_true(r[5])
    assert.is_false(r[6])
    assert.equal(fn, r[7])
    assert.equal(obj, r[8])                    -- a table with a metatable is a value: the same object
    assert.equal(2^53, r[9])
    assert.equal(math.huge, r[10])
    assert.is_nil(r[11])
    assert.is_nil(r[12])
    assert.same({8, 16}, t:gradient(loss, x):totable())
    -- and with no tape recording, the same
    assert.equal(12, select("#", g(x)))
  end)

  it("rebuilds tables in the results with their structure and non-tensor fields; their tensors differentiate", function()
    local with, without = both(function(wrap)
      local w = mg.Variable(mg.random.normal({3, 2}, 0, 1, "float64"))
      local f = wrap(function(x)
        local y = mg.matmul(x, w)
        return {out = mg.tanh(y), meta = {name = "block", layer = 2, flag = false},
                list = {1, mg.exp(y) * 0.5, "z", {deep = y * y, note = "deep"}}}, "tag", 7
      end)
      local x = mg.random.normal({4, 3}, 0, 1, "float64")
      local t = mg.tape()
      t:watch(x)
      local r, tag, seven = f(x)
      local loss = mg.sum(r.out) + mg.sum(r.list[2]) + mg.mean(r.list[4].deep)
      t:stop()
      local shape = {r.meta.name, r.meta.layer, r.meta.flag, r.list[1], r.list[3], r.list[4].note, tag, seven,
                     mg.is_tensor(r.out), mg.is_tensor(r.list[2]), mg.is_tensor(r.list[4].deep)}
      return grads(t:gradient(loss, {x, w})), shape, r.out:totable(), r.list[4].deep:totable()
    end)
    for i = 1, 4 do assert.same(without[i], with[i]) end
    assert.same({"block", 2, false, 1, "z", "deep", "tag", 7, true, true, true}, with[2])
  end)

  it("gradients reach the tensor leaves of argument tables, a Variable in them, among non-tensors", function()
    local with, without = both(function(wrap)
      local v = mg.Variable(mg.random.normal({3}, 0, 1, "float64"))
      local f = wrap(function(a, opts, last)
        assert.equal("relu", opts.act)
        assert.equal(3, opts.n)
        assert.is_nil(last)
        local s = a * opts.p.w + opts.p.list[2] * opts.n
        if opts.act == "relu" then s = mg.relu(s) end
        return s * opts.v, opts.n, nil
      end)
      local a, b = mg.random.normal({3}, 0, 1, "float64"), mg.random.normal({3}, 0, 1, "float64")
      local t = mg.tape()
      t:watch({a, b})
      local c = b * 2                                         -- taped before the call
      local y, n, z = f(a, {act = "relu", n = 3, p = {w = c, list = {"x", b, false}}, v = v}, nil)
      local loss = mg.sum(y * y)
      t:stop()
      assert.equal(3, n)
      assert.is_nil(z)
      return grads(t:gradient(loss, {a, b, v}))
    end)
    assert.same(without[1], with[1])
  end)

  it("nested recompute_grad: non-tensor arguments and results through both levels", function()
    local with, without = both(function(wrap)
      local w = mg.Variable(mg.random.normal({4, 4}, 0, 0.5, "float64"))
      local inner = wrap(function(x, scale, tag)
        return mg.tanh(mg.matmul(x, w)) * scale, tag .. "!", {count = 1, out = x * scale}
      end)
      local outer = wrap(function(x, cfg)
        local y, tag, extra = inner(x, cfg.scale, cfg.tag)
        local y2, tag2, extra2 = inner(y, cfg.scale, tag)
        return {y = y2 + extra.out, tag = tag2, count = extra.count + extra2.count}, nil, cfg.tag
      end)
      local x = mg.random.normal({3, 4}, 0, 1, "float64")
      local t = mg.tape()
      t:watch(x)
      local r, hole, tag = outer(x, {scale = 1.5, tag = "t"})
      local loss = mg.sum(r.y)
      t:stop()
      return grads(t:gradient(loss, {x, w})), {r.tag, r.count, hole, tag}
    end)
    assert.same(without[1], with[1])
    assert.same({"t!!", 2, nil, "t"}, with[2])
  end)

  it("a persistent tape re-runs f with the same non-tensor arguments on each gradient", function()
    local seen = {}
    local f = mg.recompute_grad(function(x, k, s) seen[#seen + 1] = s .. k; return x * k, s end)
    local x = f64{1, 2}
    local t = mg.tape{persistent = true}
    t:watch(x)
    local y, s = f(x, 3, "k=")
    local loss = mg.sum(y * y)
    t:stop()
    assert.equal("k=", s)
    assert.same({18, 36}, t:gradient(loss, x):totable())
    assert.same({18, 36}, t:gradient(loss, x):totable())
    assert.same({"k=3", "k=3", "k=3"}, seen)
  end)

  it("a function giving no tensor runs once, records nothing and returns its values", function()
    local runs = 0
    local f = mg.recompute_grad(function(x, n)
      runs = runs + 1
      return n, nil, "no tensor", {n = n}, nil
    end)
    local x = f64{1, 2}
    local t = mg.tape()
    t:watch(x)
    local before = t:saved_bytes()
    local r = table.pack(f(x, 4))
    local y = mg.sum(x * x)
    t:stop()
    assert.equal(5, r.n)
    assert.equal(4, r[1])
    assert.equal("no tensor", r[3])
    assert.equal(4, r[4].n)
    assert.equal(1, runs)
    local t0 = mg.tape()                                     -- the same tape without the call
    t0:watch(x)
    local _ = mg.sum(x * x)
    t0:stop()
    assert.equal(0, before)
    assert.equal(t0:saved_bytes(), t:saved_bytes())
    assert.same({2, 4}, t:gradient(y, x):totable())
    assert.equal(1, runs)
    assert.equal(0, select("#", mg.recompute_grad(function() end)(x)))
  end)

  it("the re-run's own non-tensor results are dropped: the caller keeps the first run's", function()
    local runs = 0
    local f = mg.recompute_grad(function(x)
      runs = runs + 1
      return x * 3, runs, {runs = runs}
    end)
    local x = f64{2}
    local t = mg.tape()
    t:watch(x)
    local y, n, tbl = f(x)
    t:stop()
    assert.same({3}, t:gradient(y, x):totable())
    assert.equal(2, runs)
    assert.equal(1, n)
    assert.equal(1, tbl.runs)
  end)

  it("the documented example: the seed prints the same, and docs/memory.md's example works", function()
    local out, code = h.run(h.bin .. " examples/seed_recompute.lua")
    assert.equal(0, code)
    assert.equal(("running\n"):rep(12), out)
    local block = mg.recompute_grad(function(x, opts)
      local y = mg.tanh(x * opts.scale)
      return {y = y, norm = mg.sum(y * y)}, opts.name, nil
    end)
    local x = f64{0.5, -1}
    local t = mg.tape()
    t:watch(x)
    local r, name, none = block(x, {scale = 2, name = "block1"})
    t:stop()
    assert.equal("block1", name)
    assert.is_nil(none)
    assert.is_true(mg.is_tensor(r.y))
    h.assert_close(t:gradient(r.norm, x), {4 * math.tanh(1) * (1 - math.tanh(1) ^ 2),
                                           4 * math.tanh(-2) * (1 - math.tanh(-2) ^ 2)}, 1e-12)
  end)
end)

describe("recompute_grad with non-tensor values: errors", function()
  local function record (f, x)
    local t = mg.tape()
    t:watch(x)
    local y = f(x)
    t:stop()
    return t, y
  end

  it("a re-run whose tensors are not where the first run's were names both places", function()
    local runs = 0
    local moved = mg.recompute_grad(function(v)
      runs = runs + 1
      if runs == 1 then return v * 2, 1 end
      return 1, v * 2
    end)
    local x = f64{1}
    local t = mg.tape()
    t:watch(x)
    local y = moved(x)
    t:stop()
    assert.has_error(function() t:gradient(y, x) end,
      "tape:gradient: in the backward of 'recompute_grad': the recomputed function gave tensors at " ..
      "result 2, the first run gave tensors at result 1 (it must be deterministic)")
    runs = 0
    local nested = mg.recompute_grad(function(v)
      runs = runs + 1
      if runs == 1 then return {h = {v * 2, "a"}, n = 1} end
      return {h = {"a", v * 2}, n = 1}
    end)
    local t2, y2 = record(nested, x)
    assert.has_error(function() t2:gradient(y2.h[1], x) end,
      "tape:gradient: in the backward of 'recompute_grad': the recomputed function gave tensors at " ..
      "result 1.h[2], the first run gave tensors at result 1.h[1] (it must be deterministic)")
    runs = 0
    local gone = mg.recompute_grad(function(v)
      runs = runs + 1
      if runs == 1 then return v * 2 end
      return "nothing"
    end)
    local t3, y3 = record(gone, x)
    assert.has_error(function() t3:gradient(y3, x) end,
      "tape:gradient: in the backward of 'recompute_grad': the recomputed function gave no tensors, " ..
      "the first run gave tensors at result 1 (it must be deterministic)")
  end)

  it("a long list of places is cut to the first entry that differs", function()
    local runs = 0
    local f = mg.recompute_grad(function(v)
      runs = runs + 1
      local t = {}
      for i = 1, 40 do t[i] = {a_rather_long_key_name = v * i} end
      if runs > 1 then t[40] = {other = v * 40} end
      if runs > 2 then t[41] = v end
      return t, "tail"
    end)
    local x = f64{1}
    local t = mg.tape{persistent = true}
    t:watch(x)
    local r = f(x)
    local y = mg.sum(r[1].a_rather_long_key_name)
    t:stop()
    assert.has_error(function() t:gradient(y, x) end,
      "tape:gradient: in the backward of 'recompute_grad': the recomputed function gave tensors at ..., " ..
      "result 1[40].other, the first run gave tensors at ..., result 1[40].a_rather_long_key_name (it must " ..
      "be deterministic)")
    assert.has_error(function() t:gradient(y, x) end,
      "tape:gradient: in the backward of 'recompute_grad': the recomputed function gave tensors at ..., " ..
      "result 1[40].other, ..., the first run gave tensors at ..., result 1[40].a_rather_long_key_name (it " ..
      "must be deterministic)")
  end)

  it("a re-run with the tensors in place but other non-tensor values is fine", function()
    local runs = 0
    local f = mg.recompute_grad(function(v)
      runs = runs + 1
      return v * 2, runs == 1 and "first" or nil, {k = runs}
    end)
    local x = f64{1}
    local t, y = record(f, x)
    assert.same({2}, t:gradient(y, x):totable())
  end)

  it("a bad f is still an error; so is a shape that moves", function()
    assert.has_error(function() mg.recompute_grad("f") end,
      "bad argument #1 to 'recompute_grad' (f must be callable (a function, or a table with __call), got string)")
    local x = f64{1}
    local t = mg.tape()
    t:watch(x)
    assert.has_error(function() mg.recompute_grad(function() error("boom", 0) end)(x, "a", nil) end, "boom")
    assert.is_true(t:is_recording())
    t:stop()
  end)
end)

describe("checkpoint_sequential takes one input, as PyTorch's", function()
  it("an extra input is an error naming the function", function()
    local x = mg.ones{2, 2}
    assert.has_error(function() mg.nn.checkpoint_sequential({mg.tanh, mg.tanh}, 1, x, x) end,
      "checkpoint_sequential: takes one input (x, argument 3), got 1 more argument; pass several inputs " ..
      "as one table, for the first layer to take apart")
    assert.has_error(function() mg.nn.checkpoint_sequential({mg.tanh, mg.tanh}, 1, x, nil, 3) end,
      "checkpoint_sequential: takes one input (x, argument 3), got 2 more arguments; pass several inputs " ..
      "as one table, for the first layer to take apart")
  end)

  it("a table input with non-tensor fields passes through the segments, with the plain gradients", function()
    local function run (segments)
      mg.random.seed(7)
      local ws = {}
      local layers = {}
      for i = 1, 6 do
        ws[i] = mg.Variable(mg.random.normal({3, 3}, 0, 0.5, "float64"))
        layers[i] = function(s)
          assert.equal("float64", s.dtype)
          return {h = mg.tanh(mg.matmul(s.h, ws[i])) * s.scale, scale = s.scale, dtype = s.dtype,
                  seen = s.seen + 1, skip = s.skip}
        end
      end
      local x = mg.random.normal({2, 3}, 0, 1, "float64")
      local t = mg.tape()
      t:watch(x)
      local input = {h = x, scale = 1.25, dtype = "float64", seen = 0, skip = {x * 2, "kept"}}
      local out = segments and mg.nn.checkpoint_sequential(layers, segments, input)
                  or (function(s) for i = 1, 6 do s = layers[i](s) end return s end)(input)
      local loss = mg.sum(out.h) + mg.sum(out.skip[1])
      t:stop()
      return grads(t:gradient(loss, {x, table.unpack(ws)})), {out.seen, out.scale, out.dtype, out.skip[2]}
    end
    local plain, plain_meta = run(nil)
    for _, segments in ipairs({1, 2, 3, 6}) do
      local g, meta = run(segments)
      assert.same(plain, g)
      assert.same({6, 1.25, "float64", "kept"}, meta)
      assert.same(plain_meta, meta)
    end
  end)
end)

describe("checkpoint_loop with non-tensor values in its state", function()
  -- a recurrent step whose state holds a counter, a name, a flag, a
  -- setting table and a field that comes and goes
  local function make ()
    mg.random.seed(3)
    local W = mg.Variable(mg.random.normal({4, 4}, 0, 0.5, "float64"))
    local seen = {}
    local function step (s, i)
      seen[#seen + 1] = ("%d %d %s %s %s %s"):format(i, s.count, s.name, tostring(s.on), tostring(s.cfg.gain),
                                                   tostring(s.note))
      local h = mg.tanh(mg.matmul(s.h, W)) * s.cfg.gain
      if s.on then h = h + s.x * 0.5 end
      return {h = h, x = s.x, count = s.count + 1, name = s.name, on = not s.on, cfg = s.cfg,
              note = i % 3 == 0 and ("step " .. i) or nil}
    end
    local x = mg.random.normal({2, 4}, 0, 1, "float64")
    local s0 = {h = mg.zeros({2, 4}, "float64"), x = x, count = 10, name = "rnn", on = true, cfg = {gain = 1.5},
                note = false}
    return step, s0, W, x, seen
  end

  it("passes them through each step and gives the plain loop's values and gradients bit for bit", function()
    local n = 9
    local step, s0, W, x = make()
    local t = mg.tape()
    t:watch(x)
    local p = s0
    for i = 1, n do p = step(p, i) end
    local loss = mg.sum(p.h * p.h)
    t:stop()
    local plain = grads(t:gradient(loss, {x, W}))
    for _, k in ipairs({1, 2, 3, n}) do
      local step2, s02, W2, x2, seen = make()
      local stats = {}
      local t2 = mg.tape()
      t2:watch(x2)
      local s = mg.checkpoint_loop(step2, s02, n, {snapshots = k, stats = stats})
      local loss2 = mg.sum(s.h * s.h)
      t2:stop()
      assert.same({p.count, p.name, p.on, p.note}, {s.count, s.name, s.on, s.note})
      assert.equal(s02.cfg, s.cfg)                            -- a table with no tensor: the same table
      assert.same(p.h:totable(), s.h:totable())
      local forward = #seen
      assert.same(plain, grads(t2:gradient(loss2, {x2, W2})))
      assert.is_true(stats.taped == n)
      if k < n - 1 then assert.is_true(stats.recomputed > 0) end
      -- every run of step i, forward, re-run or taped, saw the values step i saw first
      local first = {}
      for j = 1, forward do first[tonumber(seen[j]:match("^%d+"))] = seen[j] end
      for j = forward + 1, #seen do assert.equal(first[tonumber(seen[j]:match("^%d+"))], seen[j]) end
      assert.equal("3 12 rnn true 1.5 nil", first[3])
      assert.equal("4 13 rnn false 1.5 step 3", first[4])
    end
  end)

  it("a tensor state and a table of tensors work as before", function()
    local x = f64{0.5, -0.25}
    local t = mg.tape()
    t:watch(x)
    local s = mg.checkpoint_loop(function(v) return mg.tanh(v) * 2 end, x, 5, {snapshots = 2})
    local loss = mg.sum(s)
    t:stop()
    local t2 = mg.tape()
    t2:watch(x)
    local p = x
    for _ = 1, 5 do p = mg.tanh(p) * 2 end
    local loss2 = mg.sum(p)
    t2:stop()
    assert.same(t2:gradient(loss2, x):totable(), t:gradient(loss, x):totable())
  end)

  it("says when a step puts a tensor where the state had another value, or adds a key", function()
    local x = mg.ones{2}
    assert.has_error(function()
      mg.checkpoint_loop(function(s, i) return {h = s.h, n = i == 2 and s.h or s.n} end, {h = x, n = 1}, 3)
    end, "checkpoint_loop: step 2 returned state.n as a tensor (2) float32; the state had no tensor there " ..
         "(a loop keeps where its tensors are)")
    assert.has_error(function()
      mg.checkpoint_loop(function(s) return {h = s.h, n = {s.h}} end, {h = x, n = 1}, 3)
    end, "checkpoint_loop: step 1 returned state.n as a table holding tensors; the state had no tensor " ..
         "there (a loop keeps where its tensors are)")
    assert.has_error(function()
      mg.checkpoint_loop(function(s) return {h = s.h, n = s.n, extra = "x"} end, {h = x, n = 1}, 3)
    end, "checkpoint_loop: step 1 returned state.extra, which the state did not have")
    assert.has_error(function() mg.checkpoint_loop(function(s) return s end, {n = 1, name = "x"}, 3) end,
      "checkpoint_loop: the state holds no tensors")
    assert.has_error(function() mg.checkpoint_loop(function(s) return s end, 3, 3) end,
      "checkpoint_loop: state is 3; the state must be a tensor or a table holding tensors")
  end)
end)

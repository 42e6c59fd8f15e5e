-- mg.checkpoint_loop: a loop differentiated with Griewank's binomial
-- checkpointing (Revolve): the count of re-run steps against the closed
-- formula, gradients equal to the plain tape's bit for bit, the memory it
-- holds, randomness replayed, is_in_loop, bad input.
local mg = require "moongrad"
local h = require "helpers"

-- the closed formula, written out here apart from the module's: with r the
-- least integer for which C(k + r, k) >= n, reversing n steps from x_0 takes
-- r n - C(k + r, k + 1) forward steps (Griewank and Walther 2000); the
-- loop's forward pass made n - 1 of them
local function C (a, b)
  if b < 0 or b > a then return 0 end
  local r = 1
  for i = 1, b do r = r * (a - b + i) // i end
  return r
end
local function revolve_recomputed (n, k)
  if n <= 1 then return 0 end
  local r = 0
  while C(k + r, k) < n do r = r + 1 end
  return r * n - C(k + r, k + 1) - (n - 1)
end

-- the minimum over every split, by dynamic programming: T(l, s) forward
-- steps to reverse l steps from a held state with s snapshots
local function dp_minimum (nmax, kmax)
  local T = {}
  for s = 1, kmax do
    T[s] = {[1] = 0}
    for l = 2, nmax do
      if s == 1 then
        T[s][l] = l * (l - 1) // 2
      else
        local best = math.huge
        for m = 1, l - 1 do best = math.min(best, m + T[s - 1][l - m] + T[s][m]) end
        T[s][l] = best
      end
    end
  end
  return T
end

local function same (a, b)
  assert.same(a:totable(), b:totable())
  assert.equal(a.dtype, b.dtype)
end

describe("checkpoint_loop", function()
  it("runs state = step(state, i) for i = 1..n, with is_in_loop() true in the steps", function()
    local seen = {}
    local y = mg.checkpoint_loop(function(s, i)
      assert.is_true(mg.is_in_loop())
      assert.is_false(mg.is_recomputing())
      seen[#seen + 1] = i
      return {a = s.a * 2, b = {s.b[1] + i}}
    end, {a = mg.ones{2}, b = {mg.zeros{3}}}, 5)
    assert.same({1, 2, 3, 4, 5}, seen)
    assert.same({32, 32}, y.a:totable())
    assert.same({15, 15, 15}, y.b[1]:totable())
    assert.is_false(mg.is_in_loop())
    local x = mg.ones{2}
    assert.equal(x, mg.checkpoint_loop(function(s) return s * 2 end, x, 0))   -- no steps
  end)

  it("keeps no snapshots when no tape records it", function()
    local old, oldmin = mg.memory.setpause(100, 0)          -- exact peaks
    local x = mg.random.normal{64, 64}                       -- 16 KiB
    local base = h.settled()
    mg.memory.reset_peak()
    local y = mg.checkpoint_loop(function(s) return s * 0.5 end, x, 50, {snapshots = 10})
    local peak = mg.memory.stats().peak_bytes - base.current_bytes
    mg.memory.setpause(old, oldmin)
    -- the state, the next one, the last one's box until collected (10 snapshots: 10 more)
    assert.is_true(peak < 4 * 16384, "peak " .. peak)
    assert.equal(0.5 ^ 50 * x:totable()[1][1], y:totable()[1][1])
  end)

  it("re-runs Revolve's minimal number of steps in the gradient, for every n and k", function()
    local T = dp_minimum(60, 6)
    for _, k in ipairs{1, 2, 3, 4, 6} do
      for _, n in ipairs{1, 2, 3, 4, 5, 7, 10, 16, 21, 35, 36, 37, 60} do
        local expected = revolve_recomputed(n, k)
        assert.equal(expected, mg.checkpoint_loop.recomputed_steps(n, k))
        if n >= 2 then assert.equal(T[k][n] - (n - 1), expected) end    -- the optimum
        local x = mg.constant({1.5}, "float64")
        local calls, recomputing = 0, 0
        local t = mg.tape()
        t:watch(x)
        local stats = {}
        local y = mg.checkpoint_loop(function(s, i)
          calls = calls + 1
          if mg.is_recomputing() then recomputing = recomputing + 1 end
          assert.is_true(mg.is_in_loop())
          return mg.sin(s) * 0.5 + s
        end, x, n, {snapshots = k, stats = stats})
        t:stop()
        assert.equal(n, calls)
        calls = 0
        t:gradient(y, x)
        assert.equal(n + expected, calls, ("n = %d, k = %d"):format(n, k))   -- n taped + re-run
        assert.equal(calls, recomputing)
        assert.same({steps = n, snapshots = k, recomputed = expected, taped = n}, stats)
      end
    end
    -- 1000 steps with 10 snapshots: r = 4, 4000 - C(14, 11) - 999
    assert.equal(4000 - 364 - 999, mg.checkpoint_loop.recomputed_steps(1000, 10))
  end)

  -- an LSTM-like cell: two state tensors, two variables, Wh read twice a
  -- step (a variable's gradient is a sum over every read, in the plain walk's
  -- order: bit for bit needs that order kept)
  local function cell (Wx, Wh)
    return function(s, i)
      local z = mg.matmul(s.h, Wh) + mg.matmul(s.c, Wx) * (1 / i)
      local c = s.c * mg.sigmoid(z) + mg.tanh(z) * 0.5
      return {h = mg.tanh(mg.matmul(c, Wh)) * mg.sigmoid(z), c = c}
    end
  end

  local function gradients (run, dtype)
    mg.random.seed(11)
    local Wx = mg.Variable(mg.random.normal({6, 6}, 0, 0.4, dtype))
    local Wh = mg.Variable(mg.random.normal({6, 6}, 0, 0.4, dtype))
    local h0 = mg.random.normal({3, 6}, 0, 1, dtype)
    local t = mg.tape()
    t:watch(h0)
    local s = run(cell(Wx, Wh), {h = h0, c = mg.tanh(h0)})
    local loss = mg.sum(s.h * s.h) + mg.mean(s.c)
    t:stop()
    return loss, t:gradient(loss, {h0, Wx, Wh})
  end

  local function plain (step, s, n) for i = 1, n do s = mg.in_loop(step, s, i) end return s end

  for _, dtype in ipairs{"float32", "float64"} do
    it("gives the plain tape's gradients bit for bit (" .. dtype .. ")", function()
      local l0, g0 = gradients(function(step, s) return plain(step, s, 37) end, dtype)
      for _, k in ipairs{1, 2, 5, 40} do
        local l1, g1 = gradients(function(step, s)
          return mg.checkpoint_loop(step, s, 37, {snapshots = k})
        end, dtype)
        same(l0, l1)
        for i = 1, 3 do same(g0[i], g1[i]) end
      end
    end)
  end

  it("replays dropout's randomness: the same gradients, and the stream as without it", function()
    local W = mg.Variable(mg.random.normal({8, 8}, 0, 0.3, "float64"))
    local x = mg.random.normal({4, 8}, 0, 1, "float64")
    local function step (s) return {h = mg.nn.dropout(mg.tanh(mg.matmul(s.h, W)), 0.3) + s.h,
                                     n = s.n + 1} end
    local function run (checkpointed)
      mg.random.seed(7)
      local t = mg.tape()
      t:watch(x)
      local s = {h = x, n = mg.constant({0}, "int64")}
      if checkpointed then s = mg.checkpoint_loop(step, s, 23, {snapshots = 3})
      else s = plain(step, s, 23) end
      local loss = mg.sum(s.h * s.h)
      t:stop()
      local after = mg.random.get_state()
      local g = t:gradient(loss, {x, W})
      assert.same(after, mg.random.get_state())            -- the backward leaves the stream
      return g, after, s.n
    end
    local g0, r0, n0 = run(false)
    local g1, r1, n1 = run(true)
    assert.same(r0, r1)
    assert.same({23}, n1:totable())
    same(n0, n1)
    same(g0[1], g1[1])
    same(g0[2], g1[2])
  end)

  it("holds k snapshots and the state before the last step; its gradient a few states more", function()
    local old, oldmin = mg.memory.setpause(100, 0)          -- exact peaks
    local B, D, n = 128, 128, 40
    local S = B * D * 4                                      -- one state: 64 KiB
    local W = mg.Variable(mg.random.normal({D, D}, 0, 0.1))
    local x = mg.random.normal({B, D})
    local function step (s) return mg.tanh(mg.matmul(s, W)) + s end
    local function measure (k)
      local base = h.settled()
      mg.memory.reset_peak()
      local t = mg.tape()
      t:watch(x)
      local y = k and mg.checkpoint_loop(step, x, n, {snapshots = k}) or plain(step, x, n)
      local loss = mg.sum(y)
      t:stop()
      local saved, held = t:saved_bytes(), h.settled().current_bytes - base.current_bytes
      local g = t:gradient(loss, {x, W})
      local peak = mg.memory.stats().peak_bytes - base.current_bytes
      assert(g[1] and g[2])
      return saved / S, held / S, peak / S
    end
    local ok, err = pcall(function()
      local _, held0, peak0 = measure(nil)
      assert.is_true(held0 >= 2 * n)                        -- the plain tape: 2 states a step
      for _, k in ipairs{2, 4, 8} do
        local saved, held, peak = measure(k)
        -- saved: x_0 and k - 1 more snapshots, x_(n-1), a few bytes of the loss
        assert.is_true(saved >= k + 1 and saved < k + 1.01, ("k = %d: saved %.2f states"):format(k, saved))
        -- held beyond x: k - 1 snapshots, x_(n-1) and the output
        assert.is_true(held < k + 1.01, ("k = %d: held %.2f states"):format(k, held))
        -- the walk: the snapshots Revolve keeps, the output and its gradient, and
        -- one step's own tape and gradients (about 8 states of this step)
        assert.is_true(peak <= k + 11, ("k = %d: peak %.2f states"):format(k, peak))
        assert.is_true(peak < peak0 / 3)
      end
    end)
    mg.memory.setpause(old, oldmin)
    if not ok then error(err, 0) end
  end)

  it("gives the same gradients again on a persistent tape (re-running from x_0)", function()
    local x = mg.constant({{0.5, -1}}, "float64")
    local W = mg.Variable(mg.constant({{0.9, 0.1}, {-0.2, 0.8}}, "float64"))
    local t = mg.tape{persistent = true}
    t:watch(x)
    local stats = {}
    local y = mg.checkpoint_loop(function(s) return mg.tanh(mg.matmul(s, W)) end, x, 30,
                                 {snapshots = 4, stats = stats})
    local loss = mg.sum(y)
    t:stop()
    local g1 = t:gradient(loss, {x, W})
    assert.equal(mg.checkpoint_loop.recomputed_steps(30, 4), stats.recomputed)
    local g2 = t:gradient(loss, {x, W})
    same(g1[1], g2[1])
    same(g1[2], g2[2])
    assert.is_true(stats.recomputed > mg.checkpoint_loop.recomputed_steps(30, 4))
    mg.test.gradcheck(function(x0)
      return mg.checkpoint_loop(function(s) return mg.tanh(mg.matmul(s, W)) end, x0, 6, {snapshots = 2})
    end, {x})
  end)

  it("leaves integer state alone and takes gradients through variables in the state", function()
    local v = mg.Variable(mg.constant({1, 2}, "float64"))
    local t = mg.tape()
    local s = mg.checkpoint_loop(function(s) return {x = s.x * s.x, k = s.k * 2} end,
                                 {x = v, k = mg.constant({1}, "int64")}, 3, {snapshots = 2})
    local loss = mg.sum(s.x)
    t:stop()
    assert.same({8}, s.k:totable())
    h.assert_close(t:gradient(loss, v), {8, 8 * 128}, 1e-12)   -- d x^8 = 8 x^7
  end)

  it("says what is wrong with its arguments, and with what a step returns", function()
    local x = mg.ones{2, 2}
    local id = function(s) return s end
    assert.has_error(function() mg.checkpoint_loop(1, x, 3) end,
      "checkpoint_loop: step must be a function (or a callable table), got 1")
    assert.has_error(function() mg.checkpoint_loop(id, x, -1) end,
      "checkpoint_loop: n (the number of steps) must be an integer >= 0, got -1")
    assert.has_error(function() mg.checkpoint_loop(id, x, 2.5) end,
      "checkpoint_loop: n (the number of steps) must be an integer >= 0, got 2.5")
    assert.has_error(function() mg.checkpoint_loop(id, x, 3, {snapshots = 0}) end,
      "checkpoint_loop: option 'snapshots' must be a positive integer, got 0")
    assert.has_error(function() mg.checkpoint_loop(id, x, 3, {snapshot = 2}) end,
      "checkpoint_loop: unknown option 'snapshot' (did you mean 'snapshots'? known: snapshots, stats)")
    assert.has_error(function() mg.checkpoint_loop(id, nil, 3) end,
      "checkpoint_loop: state is nil; give the loop's initial state (a tensor or a table of tensors)")
    -- other values pass through a table state (spec/41-nontensor_spec.lua), but the state holds tensors
    assert.has_error(function() mg.checkpoint_loop(id, "a", 3) end,
      "checkpoint_loop: state is 'a'; the state must be a tensor or a table holding tensors")
    assert.has_error(function() mg.checkpoint_loop(id, {}, 3) end,
      "checkpoint_loop: the state holds no tensors")
    assert.has_error(function() mg.checkpoint_loop(function(s, i) return i == 2 and {s} or s end, x, 3) end,
      "checkpoint_loop: step 2 returned state as a table; it must have the structure of the state (a tensor here)")
    assert.has_error(function() mg.checkpoint_loop(function(s) return {h = s.h:reshape{4}} end, {h = x}, 3) end,
      "checkpoint_loop: step 1 returned state.h as (4) float32; the state had it as (2,2) float32 " ..
      "(a loop keeps its state's shapes)")
    assert.has_error(function() mg.checkpoint_loop(function(s) return {h = s.h, c = s.h} end, {h = x}, 3) end,
      "checkpoint_loop: step 1 returned state.c, which the state did not have")
    assert.has_error(function() mg.checkpoint_loop(function() return {} end, {h = {x}}, 3) end,
      "checkpoint_loop: step 1 returned state.h as nil; it must have the structure of the state (a table here)")
    assert.has_error(function() mg.checkpoint_loop.recomputed_steps(10, 0) end,
      "checkpoint_loop.recomputed_steps: snapshots must be a positive integer, got 0")
  end)

  it("turns running out of memory anywhere in a step into an error, and leaks nothing", function()
    local W = mg.Variable(mg.constant({{0.9, 0.1}, {-0.2, 0.8}}, "float64"))
    local x = mg.constant({{0.5, -1}, {2, 0.25}}, "float64")
    local function step ()
      local t <close> = mg.tape()        -- stopped when a failure leaves the scope: else it would
      t:watch(x)                          -- record the next step's gradient (a second order, refused)
      local s = mg.checkpoint_loop(function(s, i)
        return {h = mg.tanh(mg.matmul(s.h, W)) + s.c, c = s.c * (1 / i)}
      end, {h = x, c = x}, 9, {snapshots = 2})
      local loss = mg.sum(s.h)
      t:stop()
      local g = t:gradient(loss, {x, W})
      return g[1]:totable()[1][1] + g[2]:totable()[2][1]
    end
    -- earlier specs' tapes, collected, leave their calls' Lua data to be let go
    -- at the next call (a finalizer cannot touch the Lua state): settle first,
    -- so that the first step lets it go before the baseline is taken
    h.settled()
    local failures, base, after, expected = h.oom_sweep(step, 5000)   -- (earlier specs' garbage may go too)
    assert.is_true(failures > 100, "only " .. failures .. " allocations were tried")
    assert.is_true(after.current_bytes <= base.current_bytes, after.current_bytes .. " > " .. base.current_bytes)
    assert.is_true(after.live_tensors <= base.live_tensors)
    assert.equal(base.saved_bytes, after.saved_bytes)
    assert.is_false(mg.is_recomputing())
    assert.is_false(mg.is_in_loop())
    assert.equal(expected, step())
  end)

  it("shows re-runs and let-go snapshots as their own events in mg.memory.trace", function()
    local path = os.tmpname()
    local x = mg.random.normal{4, 4}
    mg.memory.trace(path, function()
      local t = mg.tape()
      t:watch(x)
      local y = mg.checkpoint_loop(function(s) return mg.tanh(s) end, x, 10, {snapshots = 2})
      local loss = mg.sum(y)
      t:stop()
      t:gradient(loss, x)
    end)
    local f = assert(io.open(path))
    local text = f:read("a")
    f:close()
    os.remove(path)
    local function count (name)
      local n, at, key = 0, 1, '"name":"' .. name .. '","ph":"B"'
      while true do
        at = text:find(key, at, true)
        if not at then return n end
        n, at = n + 1, at + 1
      end
    end
    -- n = 10, k = 2: snapshots at 0, 6 and 9; x_6 and x_9 let go once passed;
    -- the re-runs: 6 -> 7, 6 -> 8, 0 -> 1, ..., 0 -> 5
    assert.equal(2, count("checkpoint_loop: let go of a snapshot"))
    assert.equal(7, count("checkpoint_loop: re-run"))
  end)

  it("examples/neural_ode.lua trains 1,000 RK4 steps with 10 snapshots", function()
    local out, code = h.run(h.bin .. " examples/neural_ode.lua 2")
    assert.equal(0, code, out)
    local ratio = tonumber(out:match("checkpoint_loop [%d.]+ MiB %((%d+)x less%)"))
    assert.is_true(ratio and ratio > 1000, out)
    assert.truthy(out:find("checkpoint_loop 1000 forward + 2637 re-run + 1000 taped", 1, true), out)
    assert.truthy(out:find("gradients equal bit for bit: true", 1, true), out)
    local a, b = out:match("loss: ([%d.]+) %-> ([%d.]+)")
    assert.is_true(tonumber(b) < tonumber(a), out)
  end)

  it("leaves the tapes and counters as they were when a step fails", function()
    local x = mg.random.normal{4, 4}
    local base = h.settled()
    local t = mg.tape()
    t:watch(x)
    assert.has_error(function()
      mg.checkpoint_loop(function(s, i) if i == 5 then error("bad step", 0) end return s * 2 end, x, 9)
    end, "bad step")
    t:stop()
    t = nil                                                        -- luacheck: ignore
    local now = h.settled()
    assert.is_true(now.current_bytes <= base.current_bytes)     -- (earlier garbage may go too)
    assert.equal(base.saved_bytes, now.saved_bytes)
    -- and in the backward: the gradient is an error naming the step's
    local t2 = mg.tape()
    t2:watch(x)
    local y = mg.checkpoint_loop(function(s, i)
      if mg.is_recomputing() and i == 2 then error("bad re-run", 0) end
      return s * 2
    end, x, 4, {snapshots = 1})
    local loss = mg.sum(y)
    t2:stop()
    assert.has_error(function() t2:gradient(loss, x) end,
      "tape:gradient: in the backward of 'custom_gradient': bad re-run")
  end)

  it("refuses a second-order gradient through the loop (it would be wrong), and allows an unrelated tape", function()
    local W = mg.Variable(mg.constant({{0.5, -0.2}, {0.3, 0.9}}, "float64"))
    local x0 = mg.constant({{0.3, -0.7}, {0.1, 0.2}}, "float64")
    local step = function(s) return {h = mg.tanh(mg.matmul(s.h, W))} end
    for _, watched in ipairs{x0, W} do
      local outer = mg.tape()
      outer:watch(watched)
      local inner = mg.tape()
      inner:watch(x0)
      local s = mg.checkpoint_loop(step, {h = x0}, 3, {snapshots = 1})
      local loss = mg.sum(s.h ^ 2)
      inner:stop()
      local ok, e = pcall(inner.gradient, inner, loss, x0)
      outer:stop()
      assert.is_false(ok)
      assert.truthy(tostring(e):find("checkpoint_loop: a tape records this gradient (a second-order gradient", 1, true), e)
    end
    -- a recording tape that follows nothing the gradient reads is no second order
    -- (without watch_accessed_variables = false, it would follow W, read in the steps)
    local other = mg.tape{watch_accessed_variables = false}
    other:watch(mg.ones(2))
    local t = mg.tape()
    t:watch(x0)
    local s = mg.checkpoint_loop(step, {h = x0}, 3, {snapshots = 1})
    local loss = mg.sum(s.h ^ 2)
    t:stop()
    local g = t:gradient(loss, x0)
    other:stop()
    local t2 = mg.tape()
    t2:watch(x0)
    local p = {h = x0}
    for _ = 1, 3 do p = step(p) end
    local plain = mg.sum(p.h ^ 2)
    t2:stop()
    h.assert_close(g, t2:gradient(plain, x0), 0)
  end)

  it("refuses a gradient after a variable the steps read was written (it would be another function's)", function()
    local W = mg.Variable(mg.constant({{0.5, -0.2}, {0.3, 0.9}}, "float64"), {name = "w"})
    local x0 = mg.constant({{0.3, -0.7}, {0.1, 0.2}}, "float64")
    local step = function(s) return {h = mg.tanh(mg.matmul(s.h, W))} end
    local opt = mg.optim.SGD{learning_rate = 0.1}
    for _, write in ipairs{function() W:assign(W:value() * 2) end, function() W:assign_add(W:value()) end,
                           function() opt:apply_gradients({mg.ones_like(W:value())}, {W}) end} do
      local t = mg.tape({persistent = true})
      t:watch(x0)
      local loss = mg.sum(mg.checkpoint_loop(step, {h = x0}, 4, {snapshots = 2}).h)
      t:stop()
      local g = t:gradient(loss, {x0, W})              -- before the write: fine
      assert.is_true(mg.is_tensor(g[1]) and mg.is_tensor(g[2]))
      write()
      local ok, e = pcall(t.gradient, t, loss, {x0, W})
      assert.is_false(ok)
      assert.truthy(tostring(e):find("checkpoint_loop: variable 'w' was assigned after the forward", 1, true), e)
    end
  end)
end)

-- mg.memory.budget and tape{budget=}: Dynamic Tensor Rematerialization.
-- Gradients under feasible budgets equal the plain ones bit for bit, the
-- live bytes stay within the budget, what the user holds and variables are
-- never evicted, an infeasible budget is a clear error that changes
-- nothing, and the counters and trace show evictions and rebuilds.
local mg = require "moongrad"
local h = require "helpers"

local release                                  -- same bits: one thread count throughout
setup(function() release = h.hold_threads() end)
teardown(function() release() end)

local W, B, N = 64, 512, 16         -- one activation: 128 KiB; a kernel: 16 KiB

local function chain (activation, dropout)
  mg.random.seed(7)
  local layers = {}
  for i = 1, N do layers[i] = mg.nn.Dense(W, {activation = activation}) end
  local x = mg.random.normal{B, W}
  local vars = {}
  local function forward ()
    local y = x
    for _, l in ipairs(layers) do
      y = l(y)
      if dropout then y = mg.nn.dropout(y, dropout) end
    end
    return mg.mean(y ^ 2)
  end
  forward()                                           -- builds the layers
  for _, l in ipairs(layers) do
    for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end
  end
  return forward, vars
end

-- the gradients of one step (mask stream reset first), the peak above the
-- settled start, and the counters after it
local function step (forward, vars, budget)
  mg.random.seed(11)
  local base = h.settled()
  mg.memory.reset_peak()
  local was = mg.memory.budget(budget and base.current_bytes + budget)
  local ok, grads = pcall(function()
    local t = mg.tape()
    local loss = forward()
    t:stop()
    return t:gradient(loss, vars)
  end)
  local st = mg.memory.stats()
  mg.memory.budget(was)
  if not ok then error(grads, 0) end
  return grads, st.peak_bytes - base.current_bytes, st
end

local function same_values (a, b)
  for i = 1, #a do
    assert.equal(0, mg.sum(mg.not_equal(a[i], b[i])):item(), "gradient " .. i .. " differs")
  end
end

describe("memory.budget", function()
  local old, oldmin
  before_each(function() old, oldmin = mg.memory.setpause(100, 0) end)   -- exact peaks
  after_each(function()
    mg.memory.setpause(old, oldmin)
    mg.memory.budget(nil)
  end)

  it("gives the plain gradients bit for bit under budgets down to a third of the peak, within them", function()
    local forward, vars = chain("tanh")
    local plain, peak = step(forward, vars)
    local evicted = 0
    for _, frac in ipairs{0.9, 0.7, 0.5, 0.4, 0.34} do
      local budget = math.floor(peak * frac)
      local g, p, st = step(forward, vars, budget)
      same_values(plain, g)
      assert.is_true(p <= budget, ("peak %d over the budget %d (%.2f)"):format(p, budget, frac))
      assert.is_true(st.evictions > evicted, "no eviction at " .. frac)
      evicted = st.evictions
    end
  end)

  it("replays nothing random: a chain with dropout gets the same gradients", function()
    local forward, vars = chain("relu", 0.25)     -- the masks are leaves: they stay
    local plain, peak = step(forward, vars)
    for _, frac in ipairs{0.8, 0.7, 0.6} do
      local g, p = step(forward, vars, math.floor(peak * frac))
      same_values(plain, g)
      assert.is_true(p <= math.floor(peak * frac))
    end
  end)

  it("rebuilds for every gradient of a persistent tape, and gradcheck holds under a budget", function()
    local forward, vars = chain("sigmoid")
    local plain, peak = step(forward, vars)
    mg.random.seed(11)
    local base = h.settled()
    mg.memory.budget(base.current_bytes + math.floor(peak * 0.4))
    local t = mg.tape{persistent = true}
    local loss = forward()
    t:stop()
    same_values(plain, t:gradient(loss, vars))
    same_values(plain, t:gradient(loss, vars))
    local f = function(a) return mg.sum(mg.tanh(mg.tanh(a) * 2) ^ 2) end
    assert.is_true(mg.test.gradcheck(f, {mg.random.normal({3, 4}, 0, 1, "float64")}))
  end)

  it("leaves what saved-tensor hooks packed alone, and gives their gradients", function()
    mg.random.seed(7)
    local layers, vars = {}, {}
    for i = 1, N do layers[i] = mg.nn.Dense(W, {activation = "tanh"}) end
    local x = mg.random.normal{B, W}
    local function forward ()                 -- the first half's saved tensors in bfloat16
      local y = mg.saved_tensors_hooks("bfloat16", function()
        local y = x
        for i = 1, N // 2 do y = layers[i](y) end
        return y
      end)
      for i = N // 2 + 1, N do y = layers[i](y) end
      return mg.mean(y ^ 2)
    end
    forward()
    for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end end
    local plain, peak = step(forward, vars)
    local g, p, st = step(forward, vars, math.floor(peak * 0.7))
    same_values(plain, g)
    assert.is_true(p <= math.floor(peak * 0.7))
    assert.is_true(st.evictions > 0)
  end)

  it("never evicts a tensor the user holds, nor a variable", function()
    local forward, vars = chain("tanh")
    local plain, peak = step(forward, vars)
    local values = {}
    for i, v in ipairs(vars) do values[i] = v:value() + 0 end
    local held = {}
    local fwd = function()
      local y = mg.random.normal{B, W}
      for i = 1, N do
        y = mg.tanh(mg.matmul(y, vars[2 * i - 1]) + vars[2 * i])
        if i == 3 then held.y, held.copy = y, y + 0 end
      end
      return mg.mean(y ^ 2)
    end
    local g, _, st = step(fwd, vars, math.floor(peak * 0.6))
    assert.is_true(st.evictions > 0)
    assert.equal(0, mg.sum(mg.not_equal(held.y, held.copy)):item())
    for i, v in ipairs(vars) do assert.equal(0, mg.sum(mg.not_equal(v:value(), values[i])):item()) end
    assert.equal(#vars, #g)
  end)

  it("refuses an infeasible budget with a clear error naming what it needs, changing nothing", function()
    local forward, vars = chain("tanh")
    local plain, peak = step(forward, vars)
    local values = {}
    for i, v in ipairs(vars) do values[i] = v:value() + 0 end
    -- short in the forward: three activations do not fit. The step runs on
    -- at the least memory it can and its gradient fails, naming what had to
    -- stay live at once and what to try
    local SUGGEST = "%. Try mg%.memory%.budget%(\"([%d.]+ %a+)\"%) or more, or hold less at once: recompute a block "
                    .. "%(mg%.recompute_grad%), a save policy %(mg%.recompute_grad%(f, {policy = %.%.%.}%)%), or float16 "
                    .. "packing of what the tape saves %(mg%.saved_tensors_hooks%(\"float16\"%)%)$"
    local ok, err = pcall(step, forward, vars, 2 * B * W * 4)
    assert.is_false(ok)
    local need = err:match(":%d+: tape:gradient: memory budget [%d.]+ %a+ [(%d B)]*is too small for this step: it needs at least "
                           .. "([%d.]+ %a+) %(what had to stay live at once [^)]+%)?%)?, with all else dropped%)" .. SUGGEST)
    assert.is_truthy(need, err)
    local function bytes (s)
      local v, u = s:match("([%d.]+) (%a+)")
      return tonumber(v) * ({B = 1, KiB = 2^10, MiB = 2^20, GiB = 2^30})[u]
    end
    assert.is_true(bytes(need) > 2 * B * W * 4, err)
    -- short in the backward: the weights' gradients do not fit beside what it holds
    ok, err = pcall(step, forward, vars, math.floor(peak * 0.15))
    assert.is_false(ok)
    assert.matches(":%d+: tape:gradient: memory budget [%d.]+ %a+ [(%d B)]*is too small for this step: it needs at least "
                   .. "[%d.]+ %a+ %(what had to stay live at once in the backward of '%a+', with all else dropped%)" .. SUGGEST, err)
    -- nothing changed: the variables, and the same step without a budget
    for i, v in ipairs(vars) do assert.equal(0, mg.sum(mg.not_equal(v:value(), values[i])):item()) end
    same_values(plain, (step(forward, vars)))
    assert.is_nil(mg.memory.budget())
    -- a budget can be met by trying what the error names, again as needed:
    -- each try needs more (a lower bound: the tries drop all they can) and
    -- the gradients are the plain ones
    local budget, tries = 2 * B * W * 4, 0
    repeat
      tries = tries + 1
      local done, g = pcall(step, forward, vars, budget)
      if done then same_values(plain, g) break end
      local named = bytes(g:match('budget%("([%d.]+ %a+)"%)')) - h.settled().current_bytes
      assert.is_true(named > budget, g)
      budget = math.ceil(named)
    until tries == 20
    assert.is_true(tries < 20)
  end)

  it("with no step to finish, a budget below what is live fails at once", function()
    local x = mg.ones{256, 256}
    mg.memory.budget(h.settled().current_bytes + 1024)
    local ok, err = pcall(function() return x + 1 end)
    mg.memory.budget(nil)
    assert.is_false(ok)
    assert.matches("memory budget [%d.]+ %a+ is below the [%d.]+ %a+ that must stay live %(allocating 256.00 KiB%)", err)
  end)

  it("fails cleanly wherever memory runs out under a budget, evicted tensors and all", function()
    local forward, vars = chain("tanh")
    local _, peak = step(forward, vars)
    local budget = h.settled().current_bytes + math.floor(peak * 0.5)
    local function run ()
      mg.random.seed(11)
      mg.memory.budget(budget)
      local ok, g = pcall(function()
        local t = mg.tape()
        local loss = forward()
        t:stop()
        return t:gradient(loss, vars)
      end)
      mg.memory.budget(nil)
      if not ok then error(g, 0) end
      return mg.sum(g[1]):item()
    end
    local failures, base, after, expected = h.oom_sweep(run, 3000)
    assert.is_true(failures > 200, "only " .. failures .. " allocations were tried")
    assert.is_true(after.current_bytes <= base.current_bytes, after.current_bytes .. " > " .. base.current_bytes)
    assert.is_true(after.live_tensors <= base.live_tensors)
    assert.equal(base.saved_bytes, after.saved_bytes)
    assert.equal(expected, run())
  end)

  it("counts evictions and rebuilds, and shows them in mg.memory.trace", function()
    local forward, vars = chain("tanh")
    local _, peak = step(forward, vars)
    local before = mg.memory.stats()
    local path = os.tmpname()
    mg.memory.trace(path, function() step(forward, vars, math.floor(peak * 0.4)) end)
    local st = mg.memory.stats()
    local f = assert(io.open(path))
    local text = f:read("a")
    f:close()
    os.remove(path)
    local function count (name)
      local n = 0
      for _ in text:gmatch('"name":"' .. name .. '","ph":"B"') do n = n + 1 end
      return n
    end
    local evictions = st.evictions - before.evictions
    local remats = st.rematerialisations - before.rematerialisations
    assert.is_true(evictions > 0 and remats >= evictions, evictions .. " " .. remats)
    assert.is_true(st.evicted_bytes - before.evicted_bytes >= evictions * B * W * 4)
    assert.is_true(st.rematerialised_bytes > before.rematerialised_bytes)
    assert.equal(evictions, count("evict"))
    assert.equal(remats, count("remat"))
  end)

  it("reads, sets and clears the budget; tape{budget=} holds while that tape records or is walked", function()
    assert.is_nil(mg.memory.budget())
    assert.is_nil(mg.memory.budget(10 * 2^20))
    assert.equal(10 * 2^20, mg.memory.budget())
    assert.equal(10 * 2^20, mg.memory.budget("300 MB"))
    assert.equal(300000000, mg.memory.budget())
    assert.equal(300000000, mg.memory.budget("1.5 GiB"))
    assert.equal(1.5 * 2^30, mg.memory.stats().budget)
    assert.equal(1.5 * 2^30, mg.memory.budget(false))
    assert.is_nil(mg.memory.budget())
    assert.equal(0, mg.memory.stats().budget)
    assert.has_error(function() mg.memory.budget(0) end, "memory.budget: the budget must be a positive number of bytes (got 0)")
    assert.has_error(function() mg.memory.budget("lots") end,
      "memory.budget: 'lots' is not a size (a number of bytes, or one with a unit: B, KB, MB, GB, KiB, MiB, GiB; '+40 MiB' for that much above what is live now)")
    assert.has_error(function() mg.tape{budget = -1} end, "tape: option 'budget': the budget must be a positive number of bytes (got -1)")
    do
      local t <close> = mg.tape{budget = "20 MB"}
      assert.equal(20000000, mg.memory.budget())
      mg.memory.budget(30 * 2^20)
      assert.equal(20000000, mg.memory.budget())       -- the least of the two
      t:stop()
      assert.equal(30 * 2^20, mg.memory.budget())
      mg.memory.budget(nil)
    end
    collectgarbage()
    assert.is_nil(mg.memory.budget())
    -- a tape's budget alone gives the same gradients
    local forward, vars = chain("tanh")
    local plain, peak = step(forward, vars)
    mg.random.seed(11)
    local base = h.settled()
    local t = mg.tape{budget = base.current_bytes + math.floor(peak * 0.4)}
    local loss = forward()
    t:stop()
    local before = mg.memory.stats().evictions
    same_values(plain, t:gradient(loss, vars))
    assert.is_true(mg.memory.stats().evictions >= before)
  end)

  it("bench/budget.lua runs (tiny sizes), writing its tables and its plot", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(os.execute("mkdir -p " .. dir))
    local out, code = h.run(h.bin .. " bench/budget.lua 32 32 4 1 " .. dir)
    assert.equal(0, code, out)
    assert.truthy(out:find("| plain |", 1, true), out)
    local f = assert(io.open(dir .. "/budget.txt"))
    local text = f:read("a")
    f:close()
    for _, want in ipairs{"dense+tanh", "GPT (", "| planned 0.80 x plain peak |", "planned, spilling 0.80 x plain peak"} do
      assert.truthy(text:find(want, 1, true), want .. "\n" .. text)
    end
    assert.truthy(io.open(dir .. "/budget.svg")):close()
    os.execute("rm -rf " .. dir)
  end)

  -- issue 30, item 10: budgets in the user's terms
  it("takes fractional byte counts, and '+40 MiB' above what is live after a collection", function()
    collectgarbage()
    local keep = mg.ones({1000})
    mg.memory.budget(mg.memory.stats().current_bytes * 4.5 + 0.25)
    assert.equal(math.floor(mg.memory.stats().current_bytes * 4.5 + 0.25), mg.memory.budget())
    mg.memory.budget(nil)
    local junk = {}
    for i = 1, 4 do junk[i] = mg.ones({500, 500}) end
    junk = nil                                            -- garbage: not live once collected
    mg.memory.budget("+40 MiB")
    assert.equal(40 * 1048576, mg.memory.budget() - mg.memory.stats().current_bytes)
    assert.is_true(mg.memory.stats().current_bytes < 1000000)  -- the junk was collected first
    assert.equal(4000, keep:numel() * 4)
    mg.memory.budget(nil)
    assert.has_error(function() mg.memory.budget(0.5) end,
      "memory.budget: the budget must be a positive number of bytes (got 0.5)")
    assert.has_error(function() mg.memory.budget(0 / 0) end,
      "memory.budget: the budget must be a positive number of bytes (got NaN)")
  end)
end)

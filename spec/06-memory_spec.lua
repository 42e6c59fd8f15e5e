-- Memory: every tensor byte is counted, and counters come back when freed.
local mg = require "moongrad"
local h = require "helpers"

describe("memory counters", function()
  it("count allocations and return to the baseline after collection", function()
    local base = h.settled()
    do
      local a = mg.zeros{1000, 250}                     -- 1,000,000 bytes
      local s = mg.memory.stats()
      assert.equal(base.current_bytes + 1000000, s.current_bytes)
      assert.equal(base.live_tensors + 1, s.live_tensors)
      assert.is_true(s.peak_bytes >= s.current_bytes)
      local v = a:reshape{250, 1000}                   -- a view: no new bytes
      assert.equal(s.current_bytes, mg.memory.stats().current_bytes)
      assert.equal(s.live_tensors + 1, mg.memory.stats().live_tensors)
      a, v = nil, nil
    end
    local after = h.settled()
    assert.equal(base.current_bytes, after.current_bytes)
    assert.equal(base.live_tensors, after.live_tensors)
    assert.equal(base.live_storages, after.live_storages)
  end)

  it("keeps the peak until reset_peak", function()
    collectgarbage()
    mg.memory.reset_peak()
    local base = mg.memory.stats().current_bytes
    do local big = mg.ones{1 << 20} end                  -- 4 MiB, then garbage
    local s = h.settled()
    assert.equal(base, s.current_bytes)
    assert.is_true(s.peak_bytes >= base + 4 * 2^20)
    mg.memory.reset_peak()
    assert.equal(s.current_bytes, mg.memory.stats().peak_bytes)
  end)

  it("splits live bytes by role, and the roles add up", function()
    local s = mg.memory.stats()
    assert.equal(s.current_bytes, s.tensor_bytes + s.saved_bytes + s.variable_bytes + s.gradient_bytes)
    assert.equal(0, s.gradient_bytes)                    -- no gradient is running
  end)

  it("counts what a running gradient holds as gradient bytes, and nothing once it returns", function()
    -- probe's backward runs after matmul's: the walk then holds W's gradient
    -- (1 MiB), x's (8 KiB) and the gradient in flight
    local seen
    local probe = mg.custom_gradient(function(a)
      return a * 1, function(dy) seen = mg.memory.stats(); return dy end
    end)
    local W = mg.Variable(mg.ones{512, 512})
    local x = mg.ones{4, 512}
    local t = mg.tape()
    t:watch(x)
    local y = mg.sum(mg.matmul(probe(x), W))
    t:stop()
    local g = t:gradient(y, {x, W})
    assert.is_true(seen.gradient_bytes >= 512 * 512 * 4 + 4 * 512 * 4, tostring(seen.gradient_bytes))
    assert.equal(seen.current_bytes, seen.tensor_bytes + seen.saved_bytes + seen.variable_bytes + seen.gradient_bytes)
    local s = mg.memory.stats()
    assert.equal(0, s.gradient_bytes)
    assert.same({4, 512}, g[1].shape)
    assert.same({512, 512}, g[2].shape)
  end)

  it("garbage tensors are collected during long loops without help", function()
    collectgarbage()
    local base = mg.memory.stats().current_bytes
    mg.memory.reset_peak()
    local x = mg.ones{1 << 18}                           -- 1 MiB
    for _ = 1, 400 do x = x * 1.0 end                   -- 400 MiB made over time
    local s = mg.memory.stats()
    assert.is_true(s.peak_bytes - base < 100 * 2^20, "peak grew to " .. (s.peak_bytes - base))
  end)

  it("tapes that are dropped are collected: their records count as graph_bytes", function()
    -- each tape records 1000 ops and is dropped; it lives across several
    -- young collections, so only a full one finds it (once 700 MB piled up)
    collectgarbage()
    mg.memory.setpause(mg.memory.setpause(110))   -- fresh pacing: earlier specs' big full collections
    local a, b = mg.ones{1000}, mg.ones{1000}      -- would hold the next one back for their share
    local base = mg.memory.stats().graph_bytes
    local one, most = 0, 0
    for i = 1, 600 do
      local t = mg.tape()
      t:watch(a)
      for _ = 1, 1000 do local _ = a + b end
      t:stop()
      local g = mg.memory.stats().graph_bytes - base
      if i == 1 then one = g end
      most = math.max(most, g)
    end
    assert.is_true(one > 1000 * 64, "one tape's records: " .. one)
    -- bounded, not growing with the loop (full collections keep to their
    -- share of the time, so a big Lua heap lets a few dozen tapes wait)
    assert.is_true(most < 300 * one, ("graph bytes grew to %d tapes' worth"):format(most // one))
    collectgarbage()
    collectgarbage()
    assert.is_true(mg.memory.stats().graph_bytes - base < one // 10)
  end)

  it("a loop of ops leaks no tensors", function()
    local before = h.live()
    for _ = 1, 100 do
      local a = mg.random.normal{8, 8}
      local b = mg.matmul(a, a:transpose()) + 1
      local _ = mg.softmax(b)[1]:slice({2, 4}):sum()
    end
    assert.equal(before, h.live())
  end)
end)

describe("recompute memory, measured by the counters", function()
  local B, W, N = 64, 256, 16
  local unit = B * W * 4                               -- one activation, in bytes
  local old_pause, old_min

  setup(function() old_pause, old_min = mg.memory.setpause(100, 0) end)   -- exact peaks
  teardown(function() mg.memory.setpause(old_pause, old_min) end)

  -- one training-style pass: forward through `run`, gradient for the input
  -- and the first layer's variables; returns the tape's saved bytes after
  -- the forward, and the peak bytes above the start
  local function measure (run, x, vars)
    collectgarbage()
    collectgarbage()
    mg.memory.reset_peak()
    local base = mg.memory.stats().current_bytes
    local t = mg.tape()
    t:watch(x)
    local loss = mg.sum(run(x))
    t:stop()
    local saved = t:saved_bytes()
    t:gradient(loss, {x, vars})
    return saved, mg.memory.stats().peak_bytes - base
  end

  local function chain (make)
    mg.random.seed(17)
    local layers = {}
    for i = 1, N do layers[i] = make() end
    local x = mg.random.normal{B, W}
    for _, l in ipairs(layers) do l(x) end             -- build outside the measurements
    local function plain (h) for _, l in ipairs(layers) do h = l(h) end return h end
    local function every (h) for _, l in ipairs(layers) do h = mg.recompute_grad(l)(h) end return h end
    return layers, x, plain, every
  end

  it("dense+tanh x16: the recompute tape holds exactly the layer inputs", function()
    local layers, x, plain, every = chain(function() return mg.nn.Dense(W, {activation = "tanh"}) end)
    local vars = layers[1].variables
    local plain_saved, plain_peak = measure(plain, x, vars)
    local every_saved, every_peak = measure(every, x, vars)
    assert.equal(N * unit, every_saved)                -- the 16 layer inputs, nothing else
    -- the plain tape keeps only what backward needs too: each layer's input
    -- (for matmul) and output (for tanh), which is the next layer's input
    assert.equal((N + 1) * unit, plain_saved)
    -- so the peaks match: recompute has nothing to drop here (compare the MLP blocks below)
    assert.is_true(math.abs(every_peak - plain_peak) <= 2 * unit,
                   ("peaks %d vs %d"):format(every_peak, plain_peak))
  end)

  it("MLP blocks (W -> 4W -> W) x16: recompute cuts the saved bytes over 4x and the peak over 2x", function()
    local layers, x, plain, every = chain(function()
      return mg.nn.Sequential{mg.nn.Dense(4 * W, {activation = "tanh"}), mg.nn.Dense(W, {activation = "tanh"})}
    end)
    local vars = layers[1].variables
    local plain_saved, plain_peak = measure(plain, x, vars)
    local every_saved, every_peak = measure(every, x, vars)
    assert.equal(N * unit, every_saved)
    assert.equal((N * 5 + 1) * unit, plain_saved)      -- per block: input, hidden (4 units)
    assert.is_true(plain_saved / every_saved > 4)
    assert.is_true(plain_peak / every_peak > 2, ("peaks %d vs %d"):format(plain_peak, every_peak))
  end)

  it("checkpoint_sequential with sqrt(N) segments holds O(sqrt(N)) activations", function()
    local layers, x, plain = chain(function() return mg.nn.Dense(W, {activation = "tanh"}) end)
    local vars = layers[1].variables
    local ck = function(h) return mg.nn.checkpoint_sequential(layers, 4, h) end
    local ck_saved, ck_peak = measure(ck, x, vars)
    local _, plain_peak = measure(plain, x, vars)
    -- inputs of segments 1..3, then the last segment's 4 layers run plainly
    assert.equal((3 + 5) * unit, ck_saved)
    assert.is_true(ck_peak < plain_peak)
    local layers64 = {}
    for i = 1, 64 do layers64[i] = layers[(i - 1) % N + 1] end
    local ck64_saved = select(1, measure(function(h) return mg.nn.checkpoint_sequential(layers64, 8, h) end, x, vars))
    assert.equal((7 + 9) * unit, ck64_saved)           -- 4x the layers, 2x the activations
  end)

  it("RevBlock: what the tape holds does not grow with num_layers", function()
    mg.random.seed(23)
    local f = mg.nn.Dense(W // 2, {activation = "tanh"})
    local g = mg.nn.Dense(W // 2, {activation = "tanh"})
    local x = mg.random.normal{B, W}
    local results = {}
    for _, n in ipairs({2, 8}) do
      local block = mg.nn.RevBlock(f, g, {num_layers = n})
      block(x)
      local saved, peak = measure(function(h) return block(h) end, x, f.variables)
      results[n] = {saved = saved, peak = peak}
    end
    assert.equal(results[2].saved, results[8].saved)
    assert.is_true(results[8].peak <= results[2].peak * 1.25,
                   ("peak grew from %d to %d"):format(results[2].peak, results[8].peak))
  end)
end)

describe("memory timeline", function()
  it("writes a Chrome trace with counters and forward/backward/recompute spans", function()
    local path = os.tmpname()
    local w = mg.Variable(mg.random.normal{32, 32})
    local f = mg.recompute_grad(function(v) return mg.tanh(mg.matmul(v, w)) end)
    local result = mg.memory.trace(path, function()
      local t = mg.tape()
      local y = mg.memory.span("model", function() return mg.sum(f(mg.ones{4, 32})) end)
      t:stop()
      t:gradient(y, w)
      return "done"
    end)
    assert.equal("done", result)
    local text = assert(io.open(path)):read("a")
    os.remove(path)
    assert.equal('{"displayTimeUnit":"ms","traceEvents":[', text:sub(1, 39))
    assert.equal("]}\n", text:sub(-3))
    assert.truthy(text:find('"name":"memory","ph":"C"', 1, true))
    for _, span in ipairs({"forward", "backward", "recompute", "model"}) do
      assert.truthy(text:find('"name":"' .. span .. '","ph":"B"', 1, true), span)
      assert.truthy(text:find('"name":"' .. span .. '","ph":"E"', 1, true), span)
    end
    local nil_, msg = mg.memory.trace("/nonexistent/dir/t.json", function() end)
    assert.is_nil(nil_)
    assert.equal("memory.trace: '/nonexistent/dir/t.json': No such file or directory", msg)
    assert.has_error(function() mg.memory.trace(path, function() mg.memory.trace(path, print) end) end,
                     "memory.trace: a trace is already running")
    os.remove(path)
  end)
end)

describe("the reuse cache", function()
  -- under AddressSanitizer the cache is off (so a use after free is caught)
  local it = mg.memory.stats().cache_limit > 0 and it or pending

  it("keeps freed storages apart from live bytes, reuses them, and lets go on request", function()
    collectgarbage()
    collectgarbage()
    mg.memory.release_cache()
    local base = mg.memory.stats()
    assert.equal(0, base.cached_bytes)
    do local a = mg.zeros{1000} end                    -- 4000 bytes, then garbage
    local s = h.settled()
    assert.equal(base.current_bytes, s.current_bytes)  -- not live any more ...
    assert.equal(4000, s.cached_bytes)                 -- ... but held for reuse
    local b = mg.ones{1000}                            -- the same size: taken from the cache
    assert.equal(0, mg.memory.stats().cached_bytes)
    assert.equal(base.current_bytes + 4000, mg.memory.stats().current_bytes)
    assert.same({1, 1}, b:slice({1, 2}):totable())     -- filled afresh
    b = nil
    collectgarbage()
    collectgarbage()
    mg.memory.release_cache()
    assert.equal(0, mg.memory.stats().cached_bytes)
  end)

  it("evicts the blocks freed longest ago to take a newly freed one", function()
    -- sizes used once must not keep a step's sizes out (the cap is 16 MiB + half the most ever live)
    mg.memory.release_cache()
    for n = 1, 20 do local _ <close> = mg.zeros{(1 << 18) + n} end    -- 20 one-off sizes, ~20 MiB
    local step = {}
    for i = 1, 8 do step[i] = mg.zeros{1 << 19} end                    -- a step's 8 x 2 MiB
    for i = 1, 8 do mg.dispose(step[i]) end
    local before = mg.memory.stats()
    for i = 1, 8 do step[i] = mg.zeros{1 << 19} end                    -- the next step: all from the cache
    local after = mg.memory.stats()
    assert.equal(before.cached_bytes - 8 * 2^21, after.cached_bytes)
    mg.dispose(step)
  end)

  it("respects its limit, and setting it returns the one before", function()
    local old = mg.memory.set_cache_limit(1000)
    assert.equal(256 * 2^20, old)                                        -- the default
    do local a = mg.zeros{1000} end
    collectgarbage()
    collectgarbage()
    assert.equal(0, mg.memory.stats().cached_bytes)
    assert.equal(1000, mg.memory.set_cache_limit(old))
  end)
end)

describe("peaks follow liveness with the default pacing", function()
  -- a 12-layer dense+tanh chain of width W, batch B: (x, vars, plain, every),
  -- `every` with each layer under recompute_grad; Lua source, for this
  -- process and for a script's
  local CHAIN = [[
    local W, B = ...
    local mg = mg or require "moongrad"
    mg.random.seed(3)
    local layers, vars = {}, {}
    for i = 1, 12 do layers[i] = mg.nn.Dense(W, {activation = "tanh"}) end
    local x = mg.random.normal{B, W}
    local function plain (h) for _, l in ipairs(layers) do h = l(h) end return h end
    local function every (h) for _, l in ipairs(layers) do h = mg.recompute_grad(l)(h) end return h end
    plain(x)
    for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end end
    return x, vars, plain, every
  ]]

  -- One training step of a chain, its peak above the start, in a fresh
  -- process as a training script runs: in busted's, the heap of every spec
  -- loaded makes each full collection cost more, and the pacing holds full
  -- collections to a quarter of the time (the next test), so the peak there
  -- is looser than a script's.
  local script = "local CHAIN = [=[" .. CHAIN .. "]=]\n" .. [[
    local function peak_of (x, vars, run)
      local t = mg.tape()
      local loss = mg.mean(run(x) ^ 2)
      t:stop()
      local grads = t:gradient(loss, vars)
      for i, v in ipairs(vars) do v:assign_sub(grads[i], 1e-3) end
      collectgarbage()
      collectgarbage()
      local base = mg.memory.stats().current_bytes
      mg.memory.reset_peak()
      t = mg.tape()
      loss = mg.mean(run(x) ^ 2)
      t:stop()
      grads = t:gradient(loss, vars)
      for i, v in ipairs(vars) do v:assign_sub(grads[i], 1e-3) end
      return mg.memory.stats().peak_bytes - base
    end
    local x, vars, plain, every = load(CHAIN)(256, 128)
    for _, run in ipairs{plain, every} do
      local default = peak_of(x, vars, run)
      local old, oldmin = mg.memory.setpause(100, 0)
      local ideal = peak_of(x, vars, run)
      mg.memory.setpause(old, oldmin)
      print(("peak %d ideal %d"):format(default, ideal))
    end
  ]]

  it("within 1.15x of a collection before every allocation, plain and recomputed", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(script)
    f:close()
    local out, code = h.run(h.bin .. " " .. path)
    os.remove(path)
    assert.equal(0, code, out)
    local n = 0
    for default, ideal in out:gmatch("peak (%d+) ideal (%d+)") do
      n = n + 1
      assert.is_true(tonumber(default) <= 1.15 * tonumber(ideal), ("peak %s vs ideal %s"):format(default, ideal))
    end
    assert.equal(2, n, out)
  end)

  it("a training step's full collections: the one before the gradient; plain and recomputed", function()
    -- old garbage (which only a full collection finds) was a step's weight
    -- gradients while the walk summed them, each layer's input (held by the
    -- layer's call wrapper across its ops), and recompute_grad's arguments
    -- (held by its node's template): 8 and 12 full collections a step; then
    -- the step's gradients, boxed before the walk (2 a step)
    local x, vars, plain, every = load(CHAIN)(512, 256)
    local function step (run)
      local t = mg.tape()
      local loss = mg.mean(run(x) ^ 2)
      t:stop()
      local grads = t:gradient(loss, vars)
      for i, v in ipairs(vars) do v:assign_sub(grads[i], 1e-3) end
    end
    mg.memory.setpause(mg.memory.setpause(110))          -- fresh pacing
    for _, run in ipairs{plain, every} do
      for _ = 1, 3 do step(run) end                      -- the pacing learns the step
      local before = mg.memory.stats()
      for _ = 1, 5 do step(run) end
      local fulls = mg.memory.stats().full_collections - before.full_collections
      assert.is_true(fulls <= 7, fulls .. " full collections in 5 steps")
    end
  end)

  it("a step's gradients are young garbage once its update is done", function()
    -- the walk runs young collections: boxes made before it turned old, and
    -- each step's weight gradients waited for a full collection in the next
    -- step's forward pass
    local x, vars, plain = load(CHAIN)(256, 128)
    local weak = setmetatable({}, {__mode = "v"})
    local function step ()
      local t = mg.tape()
      local loss = mg.mean(plain(x) ^ 2)
      t:stop()
      local young = mg.memory.stats().young_collections
      local grads = t:gradient(loss, vars)
      assert.is_true(mg.memory.stats().young_collections > young, "no young collection during the walk")
      for i, v in ipairs(vars) do v:assign_sub(grads[i], 1e-3) end
      for i, g in ipairs(grads) do weak[i] = g end
    end
    step()
    collectgarbage("step", 0)                            -- a young collection
    for i = 1, #vars do assert.is_nil(weak[i], "gradient " .. i) end
  end)

  it("recompute_grad's node does not keep its arguments' boxes alive", function()
    -- the node keeps the tensors; a box there would pin its tensor after the
    -- walk let go, until a full collection
    mg.random.seed(3)
    local layers = {}
    for i = 1, 4 do layers[i] = mg.nn.Dense(64, {activation = "tanh"}) end
    local weak = setmetatable({}, {__mode = "v"})
    local t = mg.tape()
    local h = mg.random.normal{8, 64}
    for i, l in ipairs(layers) do h = mg.recompute_grad(l)(h); weak[i] = h end
    local loss = mg.mean(h ^ 2)
    t:stop()
    h = nil
    collectgarbage()
    collectgarbage()
    for i = 1, 4 do assert.is_nil(weak[i], "box " .. i) end
    local g = t:gradient(loss, layers[1].trainable_variables)   -- the re-runs still find their inputs
    assert.equal(2, #g)
  end)

  it("does not make each op pay for a full collection of a big Lua heap", function()
    -- a data set kept in Lua tables: a full collection walks all of it
    local words = {}
    for i = 1, 100000 do words[i] = {i, tostring(i)} end
    local heap = collectgarbage("count") * 1024
    local x = mg.ones{64, 22, 128}                        -- 704 KiB
    mg.memory.reset_peak()                                -- an earlier spec's peak is not this one's
    local before = mg.memory.stats()
    for _ = 1, 200 do local _ = x * 2 end                 -- 138 MiB allocated, each result garbage at once
    local after = mg.memory.stats()
    local allocated = after.allocated_bytes - before.allocated_bytes
    local fulls = after.full_collections - before.full_collections
    -- full collections take at most a quarter of the time: a few, where each op paid one
    assert.is_true(fulls < 50, ("%d full collections for 200 ops (%d bytes), heap %d"):format(fulls, allocated, heap))
    assert.is_true(after.peak_bytes - before.current_bytes < 16 * 2^20)   -- the young ones keep up
    assert.equal(100000, #words)
  end)
end)

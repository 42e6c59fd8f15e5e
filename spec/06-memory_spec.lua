-- Memory: every tensor byte is counted, and counters come back when freed.
local mg = require "moongrad"
local h = require "helpers"

describe("memory counters", function()
  it("count allocations and return to the baseline after collection", function()
    collectgarbage()
    collectgarbage()
    local base = mg.memory.stats()
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
    collectgarbage()
    collectgarbage()
    local after = mg.memory.stats()
    assert.equal(base.current_bytes, after.current_bytes)
    assert.equal(base.live_tensors, after.live_tensors)
    assert.equal(base.live_storages, after.live_storages)
  end)

  it("keeps the peak until reset_peak", function()
    collectgarbage()
    mg.memory.reset_peak()
    local base = mg.memory.stats().current_bytes
    do local big = mg.ones{1 << 20} end                  -- 4 MiB, then garbage
    collectgarbage()
    collectgarbage()
    local s = mg.memory.stats()
    assert.equal(base, s.current_bytes)
    assert.is_true(s.peak_bytes >= base + 4 * 2^20)
    mg.memory.reset_peak()
    assert.equal(s.current_bytes, mg.memory.stats().peak_bytes)
  end)

  it("splits live bytes by role, and the roles add up", function()
    local s = mg.memory.stats()
    assert.equal(s.current_bytes, s.tensor_bytes + s.saved_bytes + s.variable_bytes)
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

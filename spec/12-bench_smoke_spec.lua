-- The benchmark scripts run (tiny sizes, no timing asserted: benchmarks are
-- not tests, but they should not rot).
local h = require "helpers"

describe("bench scripts", function()
  it("cases.lua runs every case and prints numbers", function()
    for _, args in ipairs({"op 1 0", "op 4 1", "seed", "mlp 2", "ckpt plain 32 8 3", "ckpt every 32 8 3", "matmul 32"}) do
      local out, code = h.run(h.bin .. " bench/cases.lua " .. args)
      assert.equal(0, code, args .. ": " .. out)
      assert.truthy(out:match("^[%d.]+"), args .. ": " .. out)
    end
  end)

  it("recompute.lua reports every method as ratios to plain", function()
    local out, code = h.run(h.bin .. " bench/recompute.lua 16 8 4 1")
    assert.equal(0, code, out)
    for _, method in ipairs({"plain", "recompute every layer", "checkpoint_sequential%(2%)", "RevBlock"}) do
      assert.truthy(out:find(method), method)
    end
  end)
end)

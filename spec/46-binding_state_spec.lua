-- The binding's state (src/lua/lstate.c) belongs to the Lua state: its
-- coroutines share it (a tidy scope takes what they make, the pacing is
-- one), and loading the module afresh (busted's insulation) keeps it. Two
-- Lua states on one thread keep theirs apart: spec/binding_states_test.c.
local mg = require "moongrad"

describe("the binding's state", function()
  it("is shared by the state's coroutines: a tidy scope takes their boxes", function()
    local made
    local kept = mg.tidy(function()
      local co = coroutine.wrap(function()
        made = mg.tensor{1, 2}
        coroutine.yield(mg.tensor{3})
      end)
      return co()
    end)
    assert.equal(3, kept:item())
    assert.is_false((pcall(function() return made:sum() end)))
  end)

  it("sees a scope opened inside a coroutine, and mg.keep there", function()
    local out, loose
    coroutine.wrap(function()
      mg.tidy(function()
        loose = mg.tensor{1}
        out = mg.keep(mg.tensor{2})
      end)
    end)()
    assert.equal(2, out:item())
    assert.is_false((pcall(function() return loose:item() end)))
  end)

  it("has one pacing for the main thread and its coroutines", function()
    local old, oldmin = mg.memory.setpause(300, 12345)
    local seen = {coroutine.wrap(function() return mg.memory.setpause(300, 12345) end)()}
    mg.memory.setpause(old, oldmin)
    assert.same({300, 12345}, seen)
  end)

  it("outlives a fresh require of the module", function()
    local old, oldmin = mg.memory.setpause(250, 4096)
    package.loaded.moongrad = nil
    local mg2 = require "moongrad"
    package.loaded.moongrad = mg
    local was = {mg2.memory.setpause(old, oldmin)}
    assert.same({250, 4096}, was)
    local inside
    mg2.tidy(function() inside = mg.tensor{1} end)
    assert.is_false((pcall(function() return inside:item() end)))
  end)

  it("runs a gradient asked for from a coroutine on that coroutine", function()
    local v = mg.Variable(mg.tensor{2})
    local g = coroutine.wrap(function()
      local t = mg.tape()
      local y = mg.recompute_grad(function(x) return x * x * x end)(v)
      t:stop()
      return t:gradient(y, v)
    end)()
    assert.equal(12, g:item())
  end)
end)

-- mg.debug.check_numerics(true): the first op whose output holds a NaN or an infinity
-- raises, naming the op and its inputs' shapes (tf.debugging.enable_check_numerics);
-- off by default, when NaN and Inf flow as IEEE says.
local mg = require "moongrad"

describe("mg.debug.check_numerics", function()
  after_each(function() mg.debug.check_numerics(false) end)

  it("is off by default: NaN and Inf flow", function()
    assert.is_false(mg.debug.check_numerics(false))
    local y = mg.log(mg.tensor({0, 1}))
    assert.equal(-math.huge, y:totable()[1])
  end)

  it("raises at the first op producing NaN or Inf, naming it and its inputs", function()
    assert.is_false(mg.debug.check_numerics(true))
    local ok, msg = pcall(mg.log, mg.tensor({0, 1, 2}))
    assert.is_false(ok)
    assert.truthy(msg:find("check_numerics: log produced -Inf (inputs: (3) float32; output (3) float32)", 1, true), msg)
    ok, msg = pcall(function() return mg.zeros{2, 3} / mg.zeros{3} end)
    assert.truthy(msg:find("check_numerics: div produced NaN (inputs: (2,3) float32, (3) float32; output (2,3) float32)",
                           1, true), msg)
    -- finite results pass, integers are not checked
    assert.same({2, 3}, (mg.ones{2, 3} * 2).shape)
    assert.same({2}, mg.tensor({1, 2}, "int64"):mul(3).shape)
    assert.is_true(mg.debug.check_numerics(false))
  end)

  it("catches the op in a backward walk", function()
    mg.debug.check_numerics(true)
    local v = mg.tensor({0, 1}, "float64")
    local t = mg.tape()
    t:watch(v)
    local y = mg.sum(mg.sqrt(v))
    t:stop()
    local ok, msg = pcall(t.gradient, t, y, v)
    assert.is_false(ok)
    assert.truthy(msg:find("in the backward of 'sqrt'", 1, true), msg)
    assert.truthy(msg:find("check_numerics: div produced Inf", 1, true), msg)
  end)

  it("stops a diverging training step where the NaN starts", function()
    mg.debug.check_numerics(true)
    local w = mg.Variable(mg.tensor({1e38, 1e38}))
    local ok, msg = pcall(function() return mg.sum(w * w) end)
    assert.is_false(ok)
    assert.truthy(msg:find("check_numerics: mul produced Inf", 1, true), msg)
  end)

  it("checks its argument", function()
    assert.has_error(function() mg.debug.check_numerics("yes") end)
    assert.has_error(function() mg.debug.check_numerics(true, {}) end)
  end)
end)

-- Errors raised through moongrad's own Lua modules name the line of the
-- caller's code, as Lua's functions' do (moongrad.check: check.fail and
-- check.guard), never a line of moongrad/*.lua: raised by check.fail, by a
-- plain error(), by a C function the module called (mg.load in
-- checkpoint.restore) or passed on by one that ran a callback (checkpoint_loop).
local mg = require "moongrad"
local h = require "helpers"
local nn = mg.nn

local SELF = debug.getinfo(1, "S").short_src

-- the line of the code that calls here()
local function here () return debug.getinfo(2, "l").currentline end

-- fn's error must start with this file's name and `line`, and name no
-- library file; returns the message after the position
local function raised_at (line, fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  assert.is_string(e)
  local at = ("%s:%d: "):format(SELF, line)
  assert.equal(at, e:sub(1, #at), e)
  assert.is_nil(e:find("moongrad/[%w_]+%.lua:%d+"), e)
  return e:sub(#at + 1)
end

local function tmpfile (text)
  local p = os.tmpname()
  local f = assert(io.open(p, "wb"))
  f:write(text)
  f:close()
  return p
end

describe("an error raised through a library module names the caller's line", function()
  it("checkpoint: a C function's error (mg.load) and the module's own", function()
    local junk = tmpfile("junk")
    assert.equal(("load: '%s': the file is 4 bytes, too short for the 8-byte header length (not a safetensors file?)")
                 :format(junk), raised_at(here(), function() local r = mg.checkpoint.restore(junk, {}) return r end))
    local plain = tmpfile("")
    mg.save(plain, {a = mg.zeros(2)})
    assert.equal(("checkpoint.restore: '%s' is not a training checkpoint (no format = moongrad.checkpoint in its "
                 .. "metadata)"):format(plain), raised_at(here(), function() local r = mg.checkpoint.restore(plain) return r end))
    local d = nn.Dense(2)
    assert.equal("load_weights: the model has no variables yet; build it first: model:build{nil, 20} (the input's "
                 .. "shape, the batch first, nil allowed), Sequential{..., {input_shape = {20}}}, or call it on an input",
                 raised_at(here(), function() local r = d:load_weights(plain) return r end))
    os.remove(junk)
    os.remove(plain)
  end)

  it("checkpoint_loop: its checks, and the step's own error at the step's line", function()
    assert.equal("checkpoint_loop: step 1 returned state as 1; it must have the structure of the state (a tensor here)",
                 raised_at(here(), function() local r = mg.checkpoint_loop(function() return 1 end, mg.zeros(2), 3) return r end))
    assert.equal("boom", raised_at(here(), function() local r = mg.checkpoint_loop(function() error("boom") end, mg.zeros(2), 3) return r end))
    assert.equal("add: shapes do not broadcast: (2) + (3) (dimension 1: 2 vs 3)",
                 raised_at(here(), function() local r = mg.checkpoint_loop(function(s) return s + mg.zeros(3) end, mg.zeros(2), 2) return r end))
  end)

  it("distributed: without init, and a C function's error after init (another process)", function()
    assert.truthy(raised_at(here(), function() local r = mg.distributed.allreduce(mg.zeros(2)) return r end)
                  :find("^allreduce: "))
    if not mg.distributed.available() then pending("built without MPI") return end
    local out, code = h.run_script([[
mg.distributed.init()
local ok, e = pcall(function() local r = mg.distributed.allreduce(nil) return r end)
print(e)
]], nil, 'ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"')   -- Open MPI's own allocations outlive it (spec/30)
    assert.equal(0, code, out)
    assert.truthy(out:find("^[^\n]-%.lua:2: bad argument #1 to 'allreduce' %(moongrad.Tensor expected, got nil%)\n"), out)
  end)

  it("nn, optim, mixed_precision, fit: the modules' checks and plain errors", function()
    assert.equal("Dense: units must be a positive integer, got 0", raised_at(here(), function() local r = nn.Dense(0) return r end))
    local d = nn.Dense(3)
    d(mg.ones{2, 4})
    assert.equal("Dense: input has 5 features (its last axis), the layer was built for 4",
                 raised_at(here(), function() local r = d(mg.ones{2, 5}) return r end))
    local C = nn.Layer:subclass("NoCall")
    assert.equal("moongrad.nn.NoCall 'no_call': call is not defined",
                 raised_at(here(), function() local r = C()(mg.ones{2}) return r end))
    assert.equal("SGD: option 'learning_rate' must be a positive finite number or a schedule, got -1",
                 raised_at(here(), function() local r = mg.optim.SGD{learning_rate = -1} return r end))
    local opt = mg.optim.SGD{}
    assert.equal("SGD: gradients[1] has shape (3) but variables[1] has shape (2)",
                 raised_at(here(), function() opt:apply_gradients({mg.ones(3)}, {mg.Variable(mg.ones(2))}) end))
    assert.equal("set_global_policy: unknown policy 'bad' (mixed_bfloat16, mixed_float16 or float32)",
                 raised_at(here(), function() mg.mixed_precision.set_global_policy("bad") end))
    local m = nn.Sequential{nn.Dense(1)}
    m:compile{optimizer = "sgd", loss = "mse"}
    assert.equal("fit: x has 4 samples but y has 3 (their first axes must match)",
                 raised_at(here(), function() local r = m:fit(mg.zeros(4, 2), mg.zeros(3, 1), {verbose = 0}) return r end))
    assert.equal("fit: mean_squared_error: y_true has shape (4,3) but y_pred has shape (4,1); they must match exactly",
                 raised_at(here(), function() local r = m:fit(mg.zeros(4, 2), mg.zeros(4, 3), {verbose = 0}) return r end))
  end)

  it("an op's error inside a built-in layer's call: the line that called the layer", function()
    local conv = nn.Conv2D(4, 3)
    local e = raised_at(here(), function() local r = conv(mg.ones(1, 2, 2, 3)) return r end)
    assert.truthy(e:find("^conv2d: "), e)
    local m = nn.Sequential{nn.Dense(2), nn.Conv2D(4, 3)}
    e = raised_at(here(), function() local r = m(mg.ones(1, 2, 2, 3)) return r end)
    assert.truthy(e:find("^conv2d: "), e)
    m:compile{optimizer = "sgd", loss = "mse"}
    e = raised_at(here(), function() local r = m:fit(mg.ones(4, 2, 2, 3), mg.ones(4, 1), {verbose = 0}) return r end)
    assert.truthy(e:find("^fit: conv2d: "), e)
    -- a yielding layer's error after its resume, too
    local Y = nn.Layer:subclass("Yielding")
    function Y:call (x) coroutine.yield() return mg.matmul(x, mg.ones(5, 1)) end
    local y = Y()
    local co = coroutine.wrap(function() local r = y(mg.ones(2, 3)) return r end)
    co()
    local ok, msg = pcall(co)
    assert.is_false(ok)
    assert.truthy(msg:find("matmul: inner dimensions differ", 1, true), msg)
  end)

  it("from inside the caller's own function the library called, that function's line", function()
    -- a custom layer whose call misuses a built-in one: the custom call's line
    local Outer = nn.Layer:subclass("Outer")
    local line
    function Outer:init () self.inner = nn.Dense(0 + 2) end
    function Outer:call (x) line = here() return self.inner(x:reshape(-1)) end
    local o = Outer()
    o(mg.ones{1, 3})
    local ok, e = pcall(function() local r = o(mg.ones{1, 4}) return r end)
    assert.is_false(ok)
    assert.equal(("%s:%d: Dense: input has 4 features (its last axis), the layer was built for 3"):format(SELF, line), e)
  end)

  it("called by pcall itself, no position at all, as Lua's pcall(string.rep)", function()
    local ok, e = pcall(nn.Dense, 0)
    assert.is_false(ok)
    assert.equal("Dense: units must be a positive integer, got 0", e)
    ok, e = pcall(mg.checkpoint.restore, "/nonexistent/x.safetensors")
    assert.is_false(ok)
    assert.equal("load: '/nonexistent/x.safetensors': cannot open: No such file or directory", e)
  end)
end)

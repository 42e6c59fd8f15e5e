-- What stopped or misled a newcomer's first afternoon (issue 30), each
-- fixed: silent nil gradients warn once per tape; moongrad --help and
-- --version work and list every option; activations by any name; indices
-- out of range name the valid, 1-based range.
local h = require "helpers"

local run_script = h.run_script

describe("a gradient of a target the tape never recorded", function()
  it("is nil, with a warning once per tape naming the line", function()
    local out, status = run_script([[
local mg = require "moongrad"
local x = mg.Variable(mg.ones({3}))
local t = mg.tape({persistent = true})
local y = x * 2
t:stop()
print("first", t:gradient(mg.sum(y), x))
print("again", t:gradient(mg.sum(y), x))
print("recorded", t:gradient(y, x):totable()[1])
]])
    assert.equal(0, status, out)
    assert.truthy(out:find("first\tnil", 1, true), out)
    assert.truthy(out:find("again\tnil", 1, true), out)
    assert.truthy(out:find("recorded\t2.0", 1, true), out)
    local _, n = out:gsub("moongrad: warning:", "")
    assert.equal(1, n, out)
    assert.truthy(out:find("%.lua:6: tape:gradient: the target was not recorded by this tape %(computed after "
                           .. "t:stop%(%), from nothing the tape watches, or by ops without a gradient such as sign, floor or //%), so it has no gradient %(nil%); "
                           .. "mg%.tape{warn = false} silences this"), out)
  end)

  it("is said for a list only when no target was recorded, and never by a call that raises", function()
    local out, status = run_script([[
local mg = require "moongrad"
local a = mg.Variable(mg.ones({2}))
local t = mg.tape({persistent = true})
local y = mg.sum(a * 2)
t:stop()
local z = mg.sum(a * 3)
print("one of two", t:gradient({y, z}, a):totable()[1])
local u = mg.tape({persistent = true})
u:stop()
print("none of two", u:gradient({mg.sum(a), mg.sum(a * a)}, a))
local v = mg.tape()
local w = mg.sum(a * 4)
v:stop()
v:gradient(w, a)
print("second", pcall(v.gradient, v, w, a))
]])
    assert.equal(0, status, out)
    assert.truthy(out:find("one of two\t2.0", 1, true), out)
    assert.truthy(out:find("none of two\tnil", 1, true), out)
    assert.truthy(out:find("second\tfalse", 1, true), out)
    local _, n = out:gsub("moongrad: warning:", "")
    assert.equal(1, n, out)
    assert.truthy(out:find(":10: tape:gradient: the targets were not recorded by this tape", 1, true), out)
  end)

  it("says that an integer target has no gradient, rather than that it was not recorded", function()
    local out, status = run_script([[
local mg = require "moongrad"
local v = mg.Variable(mg.tensor({1, 2}, "int64"))
local t = mg.tape()
local y = mg.sum(v * 2)
t:stop()
print("int", t:gradient(y, v))
]])
    assert.equal(0, status, out)
    assert.truthy(out:find("int\tnil", 1, true), out)
    assert.truthy(out:find(":6: tape:gradient: the target is integer or bool, and such tensors have no gradient " ..
                           "(nil); cast to float32 or float64 before the ops to differentiate", 1, true), out)
  end)

  it("keeps quiet with mg.tape{warn = false}, with unconnected = \"zero\", and for recorded targets", function()
    local out, status = run_script([[
local mg = require "moongrad"
local x = mg.Variable(mg.ones({3}))
local q = mg.tape({warn = false})
local y = x * 2
q:stop()
print(q:gradient(mg.sum(y), x))
local t = mg.tape()
local y2 = x * 3
t:stop()
print(t:gradient(mg.sum(y2), x, {unconnected = "zero"}):totable()[1])
local u = mg.tape()
local z = mg.sum(x * x)
print(u:gradient(z, x):totable()[1])
]])
    assert.equal(0, status, out)
    assert.falsy(out:find("warning", 1, true), out)
    assert.truthy(out:find("nil\n0.0\n2.0", 1, true), out)
  end)

  it("checks the option", function()
    local mg = require "moongrad"
    assert.has_error(function() mg.tape({warn = 1}) end,
      "bad argument #1 to 'tape' (option 'warn' must be a boolean, got number)")
  end)
end)

describe("moongrad --help and --version", function()
  it("--help (and -h) lists every option, the kernel's included, on stdout", function()
    for _, flag in ipairs{"--help", "-h"} do
      local out, status = h.run(h.bin .. " " .. flag .. " 2>/dev/null")
      assert.equal(0, status, out)
      for _, opt in ipairs{"-e stat", "-i ", "-l mod", "-v ", "-E ", "-W ", "-h ", "--kernel CONNECTION_FILE",
                           "--install-kernel [--user] [--prefix PREFIX]", "--version", "--help"} do
        assert.truthy(out:find(opt, 1, true), flag .. " does not list " .. opt .. ":\n" .. out)
      end
    end
  end)

  it("--version prints the version and exits", function()
    local out, status = h.run(h.bin .. " --version")
    assert.equal(0, status, out)
    assert.truthy(out:match("^moongrad %d+%.%d+%.%d+, with Lua 5%.4"), out)
  end)

  it("an unknown option is still an error, with the usage on stderr", function()
    local out, status = h.run(h.bin .. " --nope 2>&1")
    assert.are_not.equal(0, status)
    assert.truthy(out:find("unrecognized option '--nope'", 1, true), out)
    assert.truthy(out:find("--install-kernel", 1, true), out)
  end)
end)

describe("activations by any name", function()
  local mg = require "moongrad"
  local nn = mg.nn

  it("every layer that takes one accepts every activation the library has, as Keras names them", function()
    local x = mg.random.normal({3, 4})
    local want = {
      gelu = mg.gelu, gelu_tanh = function(v) return mg.gelu(v, "tanh") end, silu = mg.silu, swish = mg.silu,
      elu = mg.elu, softplus = mg.softplus, leaky_relu = function(v) return mg.leaky_relu(v, 0.2) end,
      tanh = mg.tanh, relu = mg.relu, sigmoid = mg.sigmoid, softmax = mg.softmax, exponential = mg.exp,
      log_softmax = mg.log_softmax, linear = function(v) return v end,
    }
    for name, f in pairs(want) do
      local d = nn.Dense(5, name)
      local y = d(x)
      h.assert_close(y, f(mg.dense(x, d.kernel, d.bias)), 1e-6)
      local c = nn.Conv2D(2, 1, {activation = name})
      assert.same({1, 2, 2, 2}, c(mg.ones({1, 2, 2, 3})).shape, name)
    end
    local block = nn.TransformerBlock(2, 4, {activation = "silu"})
    assert.same({1, 3, 4}, block(mg.random.normal({1, 3, 4})).shape)
  end)

  it("silu, elu and leaky_relu are ops with gradients (spec/03 checks them), alpha as PyTorch's", function()
    local x = mg.constant({-2, -0.5, 0, 1.5}, "float64")
    h.assert_close(mg.elu(x), mg.constant({math.exp(-2) - 1, math.exp(-0.5) - 1, 0, 1.5}, "float64"), 1e-12)
    h.assert_close(mg.leaky_relu(x), mg.constant({-0.02, -0.005, 0, 1.5}, "float64"), 1e-12)
    h.assert_close(x:leaky_relu(0.5), mg.constant({-1, -0.25, 0, 1.5}, "float64"), 1e-12)
    h.assert_close(mg.silu(x), x * mg.sigmoid(x), 1e-12)
    assert.has_error(function() mg.elu(mg.constant({1}, "int64")) end, "elu: needs a float tensor, got int64")
    assert.has_error(function() mg.leaky_relu(x, 1 / 0) end, "leaky_relu: alpha must be a finite number, got inf")
  end)
end)

describe("indices out of range", function()
  local mg = require "moongrad"

  it("name the valid range, 1-based, wherever an index is checked", function()
    local x = mg.constant({{1, 2, 3}, {4, 5, 6}})
    local cases = {
      {function() return x[0] end, "index 0 is out of bounds for dimension 1 of size 2 (use 1..2 or -2..-1: indices are 1-based)"},
      {function() return x[3] end, "index 3 is out of bounds for dimension 1 of size 2 (use 1..2 or -2..-1: indices are 1-based)"},
      {function() return x:slice({0, 2}) end, "(start 0 is out of range for dimension 1 of size 2 (use 1..2 or -2..-1: indices are 1-based))"},
      {function() return x:slice(nil, {2, 5}) end, "(stop 5 is out of range for dimension 2 of size 3 (use 1..3 or -3..-1: indices are 1-based))"},
      {function() return mg.gather(x, mg.constant({5}, "int64"), 1) end, "gather: index 5 is out of bounds for dimension 1 of size 2 (use 1..2 or -2..-1)"},
      {function() return mg.take_along_axis(x, mg.constant({{4}}, "int64"), 2) end, "take_along_axis: index 4 is out of bounds for dimension 2 of size 3 (use 1..3 or -3..-1)"},
      {function() return mg.sum(x, 3) end, "(axis 3 is out of range for 2 dimensions (use 1..2 or -2..-1))"},
      {function() return mg.zeros({0, 2})[1] end, "index 1 is out of bounds for dimension 1 of size 0 (the dimension is empty)"},
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  it("a table or a boolean as an index is an error that shows the ways to index, not nil", function()
    local x = mg.constant({{1, 2}, {3, 4}})
    assert.has_error(function() return x[{1, 2}] end)
    local ok, err = pcall(function() return x[true] end)
    assert.is_false(ok)
    assert.truthy(err:find("a tensor's index must be an integer (1-based, negative from the end) or a name, got boolean: "
                           .. "x[i][j] picks one entry, x:slice({a, b}, ...) a range, mg.gather many", 1, true), err)
  end)
end)

describe("resume without bookkeeping: callbacks.BackupAndRestore", function()
  local script = [==[
local mg = require "moongrad"
local dir, crash_at = arg[1], tonumber(arg[2])
mg.random.seed(5)
local x = mg.random.normal({64, 4})
local y = mg.sum(x, 2, true)
local model = mg.nn.Sequential{mg.nn.Dense(8, "relu"), mg.nn.Dropout(0.3), mg.nn.Dense(1)}
model:compile{optimizer = mg.optim.Adam{learning_rate = 0.01}, loss = "mse"}
local cbs = {}
if dir ~= "-" then cbs[1] = mg.callbacks.BackupAndRestore{backup_dir = dir} end
if crash_at then
  cbs[#cbs + 1] = mg.callbacks.LambdaCallback{on_epoch_end = function(e) if e == crash_at then error("crash at " .. e, 0) end end}
end
local h = model:fit(x, y, {epochs = 5, batch_size = 16, verbose = 0, callbacks = cbs})
local s = 0
for _, v in ipairs(model.variables) do s = s + mg.sum(mg.abs(v:value())):item() end
print(("epochs run %d, weights %.17g"):format(#h.history.loss, s))
]==]

  it("a run killed at epoch 3 and run again ends bit for bit where one run would, and leaves no backup", function()
    local dir = os.tmpname() .. "-backups"                -- made by the callback
    local whole = run_script(script, "-")
    local crashed, code = run_script(script, dir .. " 3")
    assert.are_not.equal(0, code)
    assert.truthy(crashed:find("crash at 3", 1, true), crashed)
    assert.truthy(io.open(dir .. "/backup.safetensors"), "no backup after the crash")
    local resumed = run_script(script, dir)
    local w1 = whole:match("epochs run 5, weights (%S+)")
    local runs, w2 = resumed:match("epochs run (%d+), weights (%S+)")
    assert.truthy(w1, whole)
    assert.equal("2", runs, resumed)                        -- epochs 4 and 5 only
    assert.equal(w1, w2)
    assert.is_nil(io.open(dir .. "/backup.safetensors"), "the backup outlived the training")
    os.remove(dir)
  end)

  it("checks its directory", function()
    local mg = require "moongrad"
    assert.has_error(function() mg.callbacks.BackupAndRestore{} end,
      'BackupAndRestore: backup_dir is required: BackupAndRestore{backup_dir = "backups"}')
    assert.has_error(function() mg.callbacks.BackupAndRestore{backup_dir = "a\nb"} end,
      "BackupAndRestore: backup_dir must be a directory's path, not empty and without NUL bytes or newlines")
  end)
end)

describe("help() by the names the docs print", function()
  it("resolves model:fit, layer:add_variable, opt:build as well as Layer:fit", function()
    local help = require "moongrad.help"
    for name, want in pairs{["model:fit"] = "Layer:fit", ["layer:add_variable"] = "Layer:add_variable",
                            ["opt:build"] = "Optimizer:build", ["Layer:fit"] = "Layer:fit"} do
      local e = help.entry(name)
      assert.truthy(e, name)
      assert.equal(want, e.name, name)
    end
    assert.is_nil(help.entry("model:nope"))
  end)
end)

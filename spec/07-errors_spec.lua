-- Bad input is a Lua error naming the function and the mismatch; never a crash.
local mg = require "moongrad"
local h = require "helpers"
local c = mg.constant

local function fails (f, msg) assert.has_error(f, msg) end

describe("errors name the function and the mismatch", function()
  it("shapes", function()
    fails(function() return mg.matmul(mg.ones{2, 3}, mg.ones{4, 5}) end,
          "matmul: inner dimensions differ: (2,3) @ (4,5)")
    fails(function() return mg.ones{2, 3} + mg.ones{4} end,
          "add: shapes do not broadcast: (2,3) + (4) (dimension 2: 3 vs 4)")
    fails(function() return mg.ones{2, 3} * mg.ones{3, 2} end,
          "mul: shapes do not broadcast: (2,3) * (3,2) (dimension 1: 2 vs 3)")
    fails(function() return mg.ones{2, 3}:reshape{4, 2} end,
          "reshape: cannot reshape (2,3) [6 elements] into (4,2)")
    fails(function() return mg.reshape(mg.ones{6}, {-1, -1}) end, "reshape: only one dimension can be -1")
    fails(function() return mg.reshape(mg.zeros{0, 3}, {-1, 0}) end,       -- NumPy's and PyTorch's refusal
          "reshape: the -1 in (-1,0) is ambiguous: another dimension is 0, so any size fits")
    assert.same({0}, mg.reshape(mg.zeros{0, 3}, {-1}).shape)
    fails(function() return mg.concat({mg.ones{2, 3}, mg.ones{2, 4}}) end,
          "concat: shapes differ outside axis 1: tensor 1 is (2,3), tensor 2 is (2,4)")
    fails(function() return mg.squeeze(mg.ones{2, 3}, 1) end, "squeeze: dimension 1 has size 2, not 1")
    fails(function() return mg.broadcast_to(mg.ones{2, 3}, {3, 3}) end,
          "broadcast_to: cannot broadcast (2,3) to (3,3)")
    fails(function() return mg.matmul(c(1), c(2)) end,
          "matmul: needs tensors with at least 1 dimension, got a 0-d tensor (use * for scalars)")
    fails(function() return mg.ones{2}:item() end, "item: tensor has 2 elements, expected 1")
  end)

  it("dtypes", function()
    fails(function() return mg.ones{2} + c({1}, "int64") end, "add: dtypes differ: float32 + int64")
    fails(function() return mg.exp(c({1}, "int64")) end, "exp: not defined for int64 tensors; cast to float first")
    fails(function() return mg.where(mg.ones{2}, 1, 2) end, "where: condition must be a bool tensor, got float32")
    fails(function() return mg.cast(mg.ones{2}, "float8") end,
          "bad argument #2 to 'cast' (unknown dtype 'float8' (use float32, float64, int64, bool, float16 or bfloat16))")
    fails(function() return mg.matmul(mg.ones({2, 2}, "float16"), mg.ones({2, 2})) end,
          "matmul: dtypes differ: float16 @ float32")
    fails(function() return mg.ones({2}, "bfloat16") * mg.ones({2}, "float64") end, "mul: dtypes differ: bfloat16 * float64")
    fails(function() return mg.softmax(c({1}, "int64")) end, "softmax: needs a float tensor, got int64")
    fails(function() return mg.stack({mg.ones{2}, mg.ones({2}, "float64")}) end,
          "stack: dtypes differ: tensor 1 is float32, tensor 2 is float64")
    fails(function() return mg.concat({mg.ones({2}, "bfloat16"), c({1}, "int64")}) end,
          "concat: dtypes differ: tensor 1 is bfloat16, tensor 2 is int64")
    fails(function() return mg.concat({mg.ones({2}, "bfloat16"), mg.ones{1}, mg.ones({1}, "float64")}) end,
          "concat: dtypes differ: tensor 1 is bfloat16, tensor 3 is float64")   -- (bfloat16 with float32 joins)
    fails(function() return mg.where(c({true}), mg.ones({1}, "bfloat16"), mg.ones({1}, "float64")) end,
          "where: dtypes differ: bfloat16 vs float64")
    fails(function() return c({true}) + c({true}) end, "add: not defined for bool tensors; cast them first")
    fails(function() return c({1}, "int64") + 1.5 end, "add: cannot convert 1.5 to int64")
    fails(function() return c({1, 2}, "int64") // c({0, 1}, "int64") end, "floordiv: integer division by zero")
    fails(function() return c({2}, "int64") ^ c({-1}, "int64") end,
          "pow: integers to negative integer powers are not allowed; cast to float first")
  end)

  it("argument types", function()
    fails(function() return mg.ones{2} + {} end, "attempt to add a 'moongrad.Tensor' with a 'table'")
    fails(function() return "x" * mg.ones{2} end, "attempt to multiply a 'string' with a 'moongrad.Tensor'")
    fails(function() return mg.add(mg.ones{2}, "x") end,
          "bad argument #2 to 'add' (moongrad.Tensor or number expected, got string)")
    fails(function() return mg.exp(nil) end, "bad argument #1 to 'exp' (moongrad.Tensor expected, got nil)")
    fails(function() return mg.exp() end, "bad argument #1 to 'exp' (moongrad.Tensor expected, got no value)")
    fails(function() return mg.zeros(nil) end,
          "bad argument #1 to 'zeros' (shape expected (a table of sizes), got nil)")
    fails(function() return mg.zeros{2, "a"} end,
          "bad argument #1 to 'zeros' (dimension 2 is a string, not an integer)")
    fails(function() return mg.constant({1, "a"}) end, "constant: expected a number at [2], got string")
    fails(function() return mg.constant({{1, 2}, {3}}) end, "constant: ragged nested table: [2] has 1 entries, expected 2")
    fails(function() return mg.constant({1.5}, "int64") end, "constant: cannot convert 1.5 at [1] to int64")
    fails(function() return mg.constant(print) end,
          "bad argument #1 to 'constant' (number, boolean, table or tensor expected, got function)")
  end)

  it("another userdata is no tensor or variable, whatever its metatable", function()
    -- a box is told by the mark it starts with, not by its metatable: a file
    -- handle dressed in the tensor's or the variable's metatable stays a file
    local f = assert(io.tmpfile())
    local file_mt = getmetatable(f)
    for _, like in ipairs{mg.ones{2}, mg.Variable(1)} do
      debug.setmetatable(f, getmetatable(like))
      local ok, err = pcall(mg.exp, f)
      local ok2, err2 = pcall(function() return mg.ones{2} + f end)
      local ok3, err3 = pcall(mg.add, f, mg.ones{2})
      getmetatable(like).__gc(f)                        -- its finalizer leaves it alone
      debug.setmetatable(f, file_mt)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("(moongrad.Tensor expected, got userdata)", 1, true), err)
      assert.is_false(ok2)
      assert.truthy(tostring(err2):find("add", 1, true), err2)
      assert.is_false(ok3)
      assert.truthy(tostring(err3):find("(moongrad.Tensor or number expected, got userdata)", 1, true), err3)
    end
    -- a variable's methods and metamethods on it: errors, never a made-up answer
    local vmt = getmetatable(mg.Variable(1))
    debug.setmetatable(f, vmt)
    local results = {}
    for _, use in ipairs{function() return f:ndim() end, function() return f.shape end,
                         function() return f:assign(1) end, function() return tostring(f) end,
                         function() return f + 1 end} do
      results[#results + 1] = table.pack(pcall(use))
    end
    debug.setmetatable(f, file_mt)
    for _, r in ipairs(results) do assert.is_false(r[1], tostring(r[2])) end
    assert.truthy(tostring(results[1][2]):find("moongrad.Variable expected", 1, true), results[1][2])
    assert.equal("x", (function() f:write("x"); f:seek("set"); return f:read(1) end)())   -- still a file
    f:close()
  end)

  it("two copies of the library in one Lua state take each other's tensors and release them", function()
    -- stock lua5.4 with moongrad.so, and a second copy of it opened by hand
    local so = (os.getenv("MOONGRAD_SO_DIR") or "build") .. "/moongrad.so"
    local dir = h.run("mktemp -d"):match("^(%S+)")
    assert.is_true(os.execute(("cp %s %s/moongrad.so && cp %s %s/copy.so"):format(so, dir, so, dir)))
    local f = assert(io.open(dir .. "/two.lua", "w"))
    f:write(([[package.cpath = "%s/?.so"
      local mg = require "moongrad"
      local mg2 = assert(package.loadlib("%s/copy.so", "luaopen_moongrad"))()
      local x, v = mg.ones{2}, mg.Variable(2)
      assert(mg2.sum(mg2.exp(x)):item() > 5.43 and mg2.exp(v):item() > 7.38 and (x + 1):sum():item() == 4)
      do local big = mg.zeros{1024, 1024} end
      collectgarbage() collectgarbage()
      print(mg.memory.stats().live_tensors)]]):format(dir, dir))
    f:close()
    local out, code = h.run(("lua5.4 %s/two.lua 2>&1"):format(dir))
    os.execute("rm -rf " .. dir)
    assert.equal(0, code, out)
    assert.equal("2", out:match("^%s*(.-)%s*$"))           -- x and v; the dropped one released
  end)

  it("NaN, negative and oversized shapes", function()
    fails(function() return mg.zeros{0 / 0} end, "bad argument #1 to 'zeros' (dimension 1 is NaN, not an integer)")
    fails(function() return mg.zeros{-1} end, "bad argument #1 to 'zeros' (dimension 1 is negative (-1))")
    fails(function() return mg.zeros{2.5} end, "bad argument #1 to 'zeros' (dimension 1 is 2.5, not an integer)")
    fails(function() return mg.zeros{1, 1, 1, 1, 1, 1, 1, 1, 1} end,
          "bad argument #1 to 'zeros' (9 dimensions given, at most 8 allowed)")
    fails(function() return mg.zeros{1e6, 1e6, 1e6} end,
          "tensor: shape (1000000,1000000,1000000) has too many elements to allocate")
    fails(function() return mg.zeros{100000, 100000, 1000} end,
          "out of memory allocating 36.38 TiB for tensor (100000,100000,1000) float32")
    fails(function() return mg.arange(0, 10, 0) end, "arange: step must be a nonzero number, and bounds numbers")
    fails(function() return mg.random.normal({2}, 0, -1) end, "normal: stddev must not be negative")
  end)

  it("axes and indices", function()
    fails(function() return mg.sum(mg.ones{2, 3}, 3) end,
          "bad argument #2 to 'sum' (axis 3 is out of range for 2 dimensions (use 1..2 or -2..-1))")
    fails(function() return mg.sum(mg.ones{2, 3}, 0) end,
          "bad argument #2 to 'sum' (axis 0 is out of range for 2 dimensions (use 1..2 or -2..-1))")
    fails(function() return mg.sum(mg.ones{2, 3}, 1.5) end, "bad argument #2 to 'sum' (axis is 1.5, not an integer)")
    fails(function() return mg.sum(mg.ones{2, 3}, 0 / 0) end, "bad argument #2 to 'sum' (axis is NaN, not an integer)")
    fails(function() return mg.ones{3}:slice({2, 5}) end,
          "bad argument #1 to 'slice' (stop 5 is out of range for dimension 1 of size 3 (use 1..3 or -3..-1: indices are 1-based))")
    fails(function() return mg.slice(mg.ones{3}, 1, 1) end, "slice: 2 indices for a tensor with 1 dimensions")
    fails(function() return mg.ones{3}[4] end, "index 4 is out of bounds for dimension 1 of size 3 (use 1..3 or -3..-1: indices are 1-based)")
    fails(function() return mg.gather(mg.ones{3}, {4}) end, "gather: index 4 is out of bounds for dimension 1 of size 3 (use 1..3 or -3..-1)")
    fails(function() return mg.transpose(mg.ones{2, 3}, {1, 1}) end, "permute: 2 dimensions need a permutation of 1..2")
  end)

  it("leaves nothing half-done: a failed op allocates nothing that stays", function()
    collectgarbage()
    local before = mg.memory.stats()
    for _ = 1, 50 do
      pcall(mg.matmul, mg.ones{2, 3}, mg.ones{4, 5})
      pcall(function() return mg.ones{2, 3} + mg.ones{4} end)
      pcall(mg.constant, {1, 2, "x"})
    end
    local after = h.settled()
    assert.equal(before.live_tensors, after.live_tensors)
    assert.equal(before.current_bytes, after.current_bytes)
  end)
end)

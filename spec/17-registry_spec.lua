-- The op registry: one row per op, which the binding walks.
local mg = require "moongrad"

-- the registry as Lua sees it
local function ops () return mg.ops() end

describe("the op registry", function()
  it("lists every op once, with a kind and a description", function()
    local seen = {}
    for _, op in ipairs(ops()) do
      assert.is_nil(seen[op.name], "twice: " .. op.name)
      seen[op.name] = true
      assert.truthy(({unary = 1, binary = 1, reduce = 1, other = 1})[op.kind], op.name)
      assert.is_string(op.doc, op.name)
    end
    assert.is_true(seen.add and seen.softplus and seen.matmul and seen.sum and true)
  end)

  it("every op is reachable from Lua, as mg.f and (unary, binary, reduce) as x:f()", function()
    local c_only = {unslice = true, scatter_add = true, permute = true}   -- Lua: slice's and gather's gradients, transpose
    local x = mg.ones{2}
    for _, op in ipairs(ops()) do
      if not c_only[op.name] then
        assert.is_function(mg[op.name], op.name)
        if op.kind ~= "other" then assert.is_function(x[op.name], op.name) end
      end
    end
  end)

  it("the rows say which ops are products (what policy \"dots\" keeps, what a budget weighs by multiply-adds)", function()
    local products = {}
    for _, op in ipairs(ops()) do if op.product then products[#products + 1] = op.name end end
    table.sort(products)
    assert.same({"conv2d", "dense", "einsum", "matmul", "scaled_dot_product_attention"}, products)
  end)

  it("every op the C header declares has a row, and every row a function in the header", function()
    local f = assert(io.open("include/moongrad.h"))
    local header = f:read("a")
    f:close()
    local rows = {}
    for _, op in ipairs(ops()) do rows[op.name] = true end
    -- functions that make tensors without being ops of their own: creation and
    -- reading (nothing to differentiate), views and composites built of rows
    -- (their gradients are their parts'), references
    local not_ops = {
      arange = "creation", arange_int64 = "creation", empty = "creation", eye = "creation",
      from_blob = "creation", from_dlpack = "creation", from_doubles = "creation", full = "creation",
      full_int64 = "creation", scalar = "creation", random_normal = "creation", random_uniform = "creation",
      read_csv = "reading", read_idx = "reading", indices_from_1based = "indices",
      contiguous = "a copy through rows", expand_dims = "reshape", squeeze = "reshape",
      transpose = "permute", stack = "concat", select = "slice", sum_to_shape = "sum and reshape",
      custom_saved = "a reference", tensor_retain = "a reference", variable_peek = "a reference",
      variable_read = "a reference", conv2d_act = "conv2d's row, with its activation",
    }
    for name in header:gmatch("MG_API%s+mg_tensor%s+%*mg_([%w_]+)%s*%(") do
      assert.is_true(rows[name] or not_ops[name] ~= nil, "mg_" .. name .. " has no row (or a reason in not_ops)")
    end
    for name in pairs(rows) do
      assert.truthy(header:find("%*?mg_" .. name .. "%s*%("), "row " .. name .. " has no mg_" .. name .. " in the header")
    end
  end)

  it("metamethods come from the rows, for tensors and variables alike", function()
    local v = mg.Variable({1, 2})
    for _, op in ipairs(ops()) do
      if op.metamethod then
        assert.is_function(getmetatable(mg.ones{1})[op.metamethod], op.name)
        assert.is_function(getmetatable(v)[op.metamethod], op.name)
      end
    end
    assert.same({2, 4}, (v + v + v - v):totable())
  end)
end)

describe("the C sources", function()
  it("only the binding and the floors above it include lua.h (src/lua/, src/cli/, the kernel's and mg.distributed's Lua halves)", function()
    local p = io.popen("grep -rlE '#include [<\"](lua|lauxlib|lualib)\\.h' src")
    local files = p:read("a")
    p:close()
    for f in files:gmatch("[^\n]+") do
      assert.truthy(f:match("^src/lua/") or f:match("^src/cli/") or f:match("^src/kernel/lkernel%.[ch]$")
                    or f == "src/dist/ldistributed.c", f .. " includes Lua")
    end
  end)
end)

describe("the public header", function()
  -- what it says of threads agrees with its contexts section and the docs
  -- (issue 30: the top said one per process, the docs one per thread)
  it("says state is one per thread, as docs/embedding.md does", function()
    local header = assert(io.open("include/moongrad.h")):read("a")
    local docs = assert(io.open("docs/embedding.md")):read("a")
    assert.falsy(header:find("one per process", 1, true))
    assert.truthy(header:find("are one per thread", 1, true))
    assert.truthy(docs:find("one per thread", 1, true))
  end)
end)

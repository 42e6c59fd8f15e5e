-- A table where a function takes none, or takes another kind, is an error, never read as
-- something else (issue 18: `x:sum{keepdims=true}` used to be an empty list of axes and
-- return x). The sweep covers every function of the mg table and every tensor method:
-- given a tensor and then an options table it cannot use, each raises, naming the table.
local mg = require "moongrad"

local function opts () return {keepdims = true} end

-- functions for which a table after x is legitimate data, not options (print), or
-- that call their first argument (in_loop(fn, ...) takes any callable: Lua says it cannot)
-- or that take tables as data (dispose and keep take tables of tensors)
local TAKES_ANY = {print = true, in_loop = true, dispose = true, keep = true}

local function err (f, ...)
  local ok, msg = pcall(f, ...)
  return not ok and tostring(msg) or nil
end

-- an error about the table: it names the key, or says it is a table or options
local function about_table (msg)
  return msg and (msg:find("keepdims", 1, true) or msg:find("table", 1, true) or msg:find("option", 1, true))
end

describe("options tables", function()
  it("reductions reject an options table where their axes go", function()
    local x = mg.ones{2, 3}
    for _, name in ipairs({"sum", "mean", "max", "min", "prod", "logsumexp"}) do
      local msg = err(x[name], x, opts())
      assert.truthy(msg and msg:find("the axes must be a list, but has the key 'keepdims'", 1, true), name .. ": " .. tostring(msg))
      -- the right way still works
      assert.same({2, 1}, x[name](x, 2, true).shape)
    end
    for _, name in ipairs({"argmax", "argmin"}) do
      assert.truthy(about_table(err(x[name], x, opts())), name)
    end
    -- options that exist elsewhere are unknown here, by name
    assert.truthy(err(x.std, x, opts()):find("unknown option 'keepdims'", 1, true))
    assert.truthy(err(x.cumsum, x, opts()):find("unknown option 'keepdims'", 1, true))
  end)

  it("functions that take no options reject a trailing table, and nil is still fine", function()
    local x = mg.ones{2, 3}
    assert.equal("bad argument #1 to 'exp' (unexpected table: it takes at most 1 argument, and no options table there)",
                 err(load("local x, t = ...; return x:exp(t)", "=(x:exp)"), x, opts()):match("bad argument.*"))
    assert.truthy(err(mg.add, x, x, opts()):find("it takes at most 2 arguments", 1, true))
    assert.truthy(err(mg.sum, x, 1, true, opts()):find("it takes at most 3 arguments", 1, true))
    assert.truthy(err(mg.softmax, x, 2, opts()):find("it takes at most 2 arguments", 1, true))
    assert.same({2, 3}, mg.exp(x, nil).shape)
    assert.same({2, 3}, (-x).shape)           -- metamethods get extra operands from Lua
    assert.same({2, 3}, (x + x).shape)
  end)

  it("every registry op rejects an options table after its arguments", function()
    local x = mg.ones{2, 3}
    for _, op in ipairs(mg.ops()) do
      local args = op.kind == "unary" and {x} or op.kind == "binary" and {x, x}
                or op.kind == "reduce" and {x, 1, true} or nil
      if args then
        args[#args + 1] = opts()
        local msg = err(mg[op.name], table.unpack(args))
        assert.truthy(about_table(msg), op.name .. ": " .. tostring(msg))
      end
    end
  end)

  it("every function of mg and every tensor method, given (x, options), raises about the table", function()
    local x = mg.ones{2, 3}
    local seen, silent = 0, {}
    for name, f in pairs(mg) do
      if type(f) == "function" and not TAKES_ANY[name] then
        seen = seen + 1
        local msg = err(f, x, opts())
        if not about_table(msg) and (msg == nil or not msg:find("expected", 1, true)) then
          silent[#silent + 1] = ("mg.%s: %s"):format(name, tostring(msg))
        end
        -- as a method too, where x has it
        local ok, m = pcall(function() return x[name] end)
        if ok and type(m) == "function" then
          local mmsg = err(m, x, opts())
          if not about_table(mmsg) and (mmsg == nil or not mmsg:find("expected", 1, true)) then
            silent[#silent + 1] = ("x:%s: %s"):format(name, tostring(mmsg))
          end
        end
      end
    end
    assert.is_true(seen > 80, "only " .. seen .. " functions")
    table.sort(silent)
    assert.same({}, silent)
  end)
end)

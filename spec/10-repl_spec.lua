-- The moongrad interpreter: scripts, options, and the REPL.
local h = require "helpers"
local mg = require "moongrad"

describe("the moongrad interpreter", function()
  it("runs stdin with '-' and has mg preloaded", function()
    local out, code = h.run_moongrad("-", "print(mg.ones{2,2} + 1)")
    assert.equal(0, code)
    assert.equal("{{2.0, 2.0},\n {2.0, 2.0}}\nmoongrad.Tensor(2,2) float32\n", out)
  end)

  it("predefines tape, Variable, constant, recompute_grad, custom_gradient", function()
    local out = h.run_moongrad("-", [[
      print(type(tape), type(Variable), type(constant), type(recompute_grad), type(custom_gradient))]])
    assert.equal("function\tfunction\tfunction\tfunction\tfunction\n", out)
  end)

  it("sets arg like lua5.4 and runs -e", function()
    local tmp = os.tmpname()
    local f = assert(io.open(tmp, "w"))
    f:write("print(#arg, arg[1], arg[2], arg[0] ~= nil)")
    f:close()
    local out, code = h.run(h.bin .. " " .. tmp .. " a b")
    os.remove(tmp)
    assert.equal(0, code)
    assert.equal("2\ta\tb\ttrue\n", out)
    assert.equal("6.0\n", h.run(h.bin .. " -e 'print(mg.sum(mg.ones{2,3}):item())'"))
  end)

  it("-v prints the version", function()
    assert.truthy(h.run(h.bin .. " -v"):find("moongrad 0.1.0, with Lua 5.4", 1, true))
  end)

  it("reports a script error and exits non-zero", function()
    local out, code = h.run_moongrad("-", "local x = mg.matmul(mg.ones{2,3}, mg.ones{4,5})")
    assert.equal(1, code)
    assert.truthy(out:find("matmul: inner dimensions differ: (2,3) @ (4,5)", 1, true))
  end)

  describe("the REPL", function()
    it("prints expression results, with = too", function()
      local out = h.run_moongrad("-i", "mg.ones{2}\n=1+1\nx = 3\nx\n")
      assert.truthy(out:find("{1.0, 1.0}\nmoongrad.Tensor(2) float32\n", 1, true))
      assert.truthy(out:find("\n2\n", 1, true))
      assert.truthy(out:find("\n3\n", 1, true))
    end)

    it("shows tables as constructors, byte counts with units, models with their size", function()
      local out = h.run_moongrad("-i", table.concat({
        "mg.ones{2, 3}.shape",
        "mg.memory.stats()",
        "{1, 'a', {b = 2}, t = mg.ones{2}, v = mg.Variable(mg.zeros{3}, {name = 'w'})}",
        "local t = {1}; t.self = t; return t",
        "local m = mg.nn.Sequential{mg.nn.Dense(4), mg.nn.Dense(2)}; m(mg.ones{1, 3}); return m",
        "'text', 2",
      }, "\n") .. "\n")
      assert.truthy(out:find("\n{2, 3}\n", 1, true), out)
      assert.truthy(out:find("current_bytes = %d+ B,") or out:find("current_bytes = [%d.]+ KiB,"), out)
      assert.truthy(out:find("cache_limit = [%d.]+ [KMG]?i?B,"), out)    -- 256.0 MiB; 0 B under ASan
      assert.truthy(out:find("live_tensors = %d+,"), out)
      assert.truthy(out:find([[{1, "a", {b = 2}, t = <tensor (2) float32>, v = <variable 'w' (3) float32>}]], 1, true), out)
      assert.truthy(out:find("{1, self = <cycle>}", 1, true), out)
      assert.truthy(out:find("moongrad.nn.Sequential 'sequential' (2 layers, 26 parameters) {", 1, true), out)
      assert.truthy(out:find("\ntext\t2\n", 1, true), out)
    end)

    it("continues multi-line input", function()
      local out = h.run_moongrad("-i", "function f(x)\n  return x * 2\nend\nf(21)\nfor i = 1, 2 do\nprint('i', i)\nend\n")
      assert.truthy(out:find("42", 1, true))
      assert.truthy(out:find("i\t1\n", 1, true))
      assert.truthy(out:find("i\t2\n", 1, true))
    end)

    it("reports errors and keeps going", function()
      local out, code = h.run_moongrad("-i", "mg.ones{2} + mg.ones{3}\nprint('still here')\n")
      assert.equal(0, code)
      assert.truthy(out:find("add: shapes do not broadcast: (2) + (3)", 1, true))
      assert.truthy(out:find("still here", 1, true))
    end)

    it("reports a statement left unfinished at the end of input", function()
      local out, code = h.run_moongrad("-i", "for i = 1, 2 do\n")
      assert.equal(0, code)
      assert.truthy(out:find("'end' expected near <eof>", 1, true))
    end)

    it("keeps no history file when stdin is not a terminal", function()
      local home = os.tmpname()
      os.remove(home)
      assert(os.execute("mkdir " .. home))
      local out = h.run("printf 'x = 41\\n=x + 1\\n' | env -u MOONGRAD_HISTORY HOME=" .. home .. " "
                        .. h.bin .. " -i")
      local f = io.open(home .. "/.moongrad_history")
      if f then f:close() end
      os.execute("rm -rf " .. home)
      assert.truthy(out:find("42", 1, true))
      assert.is_nil(f)
    end)

    -- on a terminal that script(1) makes (util-linux), typing a file of lines
    describe("on a terminal, the history file", function()
      local function q (s) return "'" .. s:gsub("'", "'\\''") .. "'" end
      local function mode (path)
        local p = io.popen("stat -c %a " .. q(path))
        local m = p:read("l")
        p:close()
        return m
      end
      local dir
      local it = it
      if os.execute("command -v script >/dev/null 2>&1") ~= true then
        it = function(name) pending(name .. ": no script(1) to run the REPL on a terminal") end
      elseif os.execute("script -qec true /dev/null </dev/null >/dev/null 2>&1") ~= true then
        -- a chroot or container without /dev/pts: no terminal to be had
        it = function(name) pending(name .. ": script(1) cannot make a pseudo-terminal here (no /dev/pts)") end
      end

      before_each(function()
        dir = os.tmpname()
        os.remove(dir)
        assert(os.execute("mkdir " .. q(dir)))
      end)

      after_each(function() os.execute("rm -rf " .. q(dir)) end)

      -- a session that types `lines` and then os.exit(0), history in `history`, under umask 000
      local function session (history, lines)
        local input = dir .. "/input"
        local f = assert(io.open(input, "w"))
        f:write(lines, "os.exit(0)\n")
        f:close()
        local cmd = ("env HOME=%s MOONGRAD_HISTORY=%s %s"):format(q(dir), q(history), h.bin)
        return h.run(("umask 000; script -qec %s /dev/null < %s"):format(q(cmd), q(input)))
      end

      it("is created readable by its owner only (0600), whatever the umask", function()
        local out, code = session(dir .. "/history", "x = 6 * 7\n=x\n")
        assert.equal(0, code, out)
        assert.truthy(out:find("42", 1, true), out)
        assert.equal("600", mode(dir .. "/history"))
        assert.truthy(h.read(dir .. "/history"):find("x = 6 * 7\n", 1, true))
      end)

      it("keeps the mode of a file that exists", function()
        local f = assert(io.open(dir .. "/history", "w"))
        f:write("old = 1\n")
        f:close()
        assert(os.execute("chmod 640 " .. q(dir .. "/history")))
        session(dir .. "/history", "new = 2\n")
        assert.equal("640", mode(dir .. "/history"))
        assert.truthy(h.read(dir .. "/history"):find("old = 1\nnew = 2\n", 1, true))
      end)

      it("is refused, with a warning, when it is a FIFO or a device; /dev/null means none", function()
        -- something holds the FIFO open read-write, so opening it never blocks
        -- (a wrong REPL would write its history into it rather than hang)
        assert(os.execute("mkfifo " .. q(dir .. "/fifo")))
        local p = io.popen(("sleep 100000 3<>%s >/dev/null 2>&1 & echo $!"):format(q(dir .. "/fifo")))
        local holder = p:read("l")
        p:close()
        local out, code = session(dir .. "/fifo", "=6 * 7\n")
        os.execute("kill " .. holder)
        assert.equal(0, code, out)
        assert.truthy(out:find("history not saved: '" .. dir .. "/fifo': is a FIFO, not a regular file", 1, true), out)
        assert.truthy(out:find("42", 1, true), out)
        out = session("/dev/full", "=6 * 7\n")
        assert.truthy(out:find("history not saved: '/dev/full': is a character device, not a regular file", 1, true), out)
        out = session("/dev/null", "=6 * 7\n")
        assert.falsy(out:find("history not saved", 1, true), out)
        assert.truthy(out:find("42", 1, true), out)
      end)
    end)
  end)
end)

describe("mg.repr", function()
  it("cuts long tables, nests to a depth, breaks wide ones into lines", function()
    local long = {}
    for i = 1, 30 do long[i] = i end
    assert.equal("{1, 2, 3, ... (27 more)}", mg.repr(long, {items = 3}))
    assert.equal("{{{...}}}", mg.repr({{{{1}}}}, {depth = 2}))
    assert.equal("{{}}", mg.repr({{}}))
    local wide = mg.repr({alpha = string.rep("a", 40), beta = string.rep("b", 40)})
    assert.equal('{\n  alpha = "' .. string.rep("a", 40) .. '",\n  beta = "' .. string.rep("b", 40) .. '"\n}', wide)
    assert.equal('{["a key"] = 1, [true] = 2}', mg.repr({["a key"] = 1, [true] = 2}))
    assert.equal("{peak_bytes = 1.5 MiB, total = 1572864}", mg.repr({peak_bytes = 1572864, total = 1572864}))
    assert.equal("plain", mg.repr("plain"))
    assert.equal('{"quoted"}', mg.repr({"quoted"}))
  end)

  it("checks its options", function()
    assert.has_error(function() mg.repr({}, {colour = 1}) end, "repr: unknown option 'colour' (known: depth, items, width)")
    assert.has_error(function() mg.repr({}, {depth = 0}) end, "repr: option 'depth' must be a positive integer, got 0")
    assert.has_error(function() mg.repr({}, 3) end, "repr: options must be a table, got number")
  end)
end)

-- Shared by the specs: closeness checks and running the moongrad binary.
local mg = require "moongrad"
local assert = require "luassert"

local helpers = {}

-- the interpreter under test (make asan points this at the instrumented one)
helpers.bin = os.getenv("MOONGRAD_BIN") or "build/moongrad"

local function flat (v, out)
  out = out or {}
  if type(v) == "table" then
    for _, x in ipairs(v) do flat(x, out) end
  else
    out[#out + 1] = v
  end
  return out
end

local function values (x)
  if mg.is_tensor(x) or mg.is_variable(x) then
    return flat(x:totable()), x.shape
  end
  return flat(x)
end

-- holds the thread count where it is until the returned function puts the
-- mode back: same bits need the same thread count, and "auto" drops to one
-- thread while other processes hold the cores (a busy CI machine), where a
-- product's sums change order. For specs that compare bits across steps.
function helpers.hold_threads ()
  local n, mode = mg.get_num_threads()
  mg.set_num_threads(n)
  return function() mg.set_num_threads(mode == "auto" and "auto" or n) end
end

-- asserts every element of a is within tol (absolute + relative) of b;
-- either may be a tensor, a nested table or a number
function helpers.assert_close (a, b, tol)
  tol = tol or 1e-5
  if a == nil or b == nil then                        -- nil beside nil would compare no elements
    error(("assert_close: got %s, expected %s"):format(tostring(a), tostring(b)), 2)
  end
  local va, sa = values(a)
  local vb, sb = values(b)
  if sa and sb then assert.same(sa, sb, "shapes differ") end
  assert.equal(#vb, #va, "element counts differ")
  for i = 1, #va do
    local x, y = va[i], vb[i]
    local ok = (x ~= x and y ~= y) or x == y or math.abs(x - y) <= tol * (1 + math.abs(y))
    if not ok then
      error(("element %d: got %.9g, expected %.9g (tol %g)"):format(i, x, y, tol), 2)
    end
  end
end

-- runs f(...) under a new tape that watches the arguments; returns the
-- stopped tape and f's first result
function helpers.record (f, ...)
  local t = mg.tape()
  t:watch({...})
  local y = f(...)
  t:stop()
  return t, y
end

-- runs a shell command; returns its stdout and exit status
-- the whole file at path, as bytes
function helpers.read (path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

function helpers.run (cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"exit:$?\"")
  local out = p:read("a")
  p:close()
  local body, code = out:match("^(.*)exit:(%d+)\n$")
  return body, tonumber(code)
end

-- runs Lua code in the moongrad binary with stdin from `input`
function helpers.run_moongrad (args, input)
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "w"))
  f:write(input or "")
  f:close()
  local out, code = helpers.run(helpers.bin .. " " .. args .. " < " .. tmp)
  os.remove(tmp)
  return out, code
end

-- a new empty directory, and its removal with all it holds
function helpers.tempdir ()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p '" .. dir .. "'"))
  return dir
end
function helpers.remove_tree (dir) os.execute("rm -rf '" .. dir .. "'") end

-- runs a script (Lua code) in the moongrad binary with the given arguments
-- and environment (a prefix such as "env OMP_NUM_THREADS=1"); its stdout
-- and stderr together, and its exit status
function helpers.run_script (code, args, env)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(code)
  f:close()
  local out, code_ = helpers.run(("%s %s %s %s"):format(env or "", helpers.bin, path, args or ""))
  os.remove(path)
  return out, code_
end

-- the memory counters once garbage tensors are collected (two cycles: the
-- first runs the finalizers that release the storages)
function helpers.settled ()
  collectgarbage()
  collectgarbage()
  return mg.memory.stats()
end

-- Runs step() once, then again with the allocator failing at its 1st, 2nd,
-- ... allocation until a run gets through; each failure must be an "out of
-- memory" Lua error. Returns the failures, the settled counters before and
-- after the sweep, and the first run's result.
function helpers.oom_sweep (step, limit)
  local expected = step()
  local before = helpers.settled()
  local failures = 0
  for n = 1, limit do
    mg.memory.fail_after(n)
    local ok, err = pcall(step)
    mg.memory.fail_after(0)
    if ok then break end
    failures = failures + 1
    assert(tostring(err):find("out of memory", 1, true), tostring(err))
  end
  return failures, before, helpers.settled(), expected
end

-- the gradient of sum(f(x)) at x, from a fresh tape that watches x
function helpers.grad (f, x)
  local t = mg.tape()
  t:watch(x)
  local y = mg.sum(f(x))
  t:stop()
  return t:gradient(y, x)
end

-- the gradient of sum(f(xs...) * seed) with respect to each of xs, on a tape
-- that watches them
function helpers.grads (f, xs, seed)
  local t = mg.tape()
  t:watch(xs)
  local y = mg.sum(f(table.unpack(xs)) * seed)
  t:stop()
  return t:gradient(y, xs)
end

-- the gradient of f() (a scalar) with respect to x, on a tape that
-- watches x: the peak bytes above the gradient's start (collected eagerly),
-- the bytes the tape saved, and the gradient
function helpers.gradient_peak (x, f)
  local t = mg.tape()
  t:watch(x)
  local y = f()
  t:stop()
  local saved = t:saved_bytes()
  collectgarbage()
  collectgarbage()
  local pause, min_bytes = mg.memory.setpause(100, 0)
  mg.memory.reset_peak()
  local before = mg.memory.stats().current_bytes
  local ok, g = pcall(t.gradient, t, y, x)
  local peak = mg.memory.stats().peak_bytes - before
  mg.memory.setpause(pause, min_bytes)
  if not ok then error(g, 0) end
  return peak, saved, g
end

-- live tensor count after a full collection
function helpers.live ()
  return helpers.settled().live_tensors
end

return helpers

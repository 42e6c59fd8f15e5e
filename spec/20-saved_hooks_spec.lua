-- Saved-tensor hooks (PyTorch's saved_tensors_hooks), float16/bfloat16 as
-- storage formats, and offloading saved tensors to a mapped file.
local mg = require "moongrad"
local h = require "helpers"

local function model ()
  mg.random.seed(2)
  local layers, vars = {}, {}
  for i = 1, 4 do layers[i] = mg.nn.Dense(32, {activation = "tanh"}) end
  local x = mg.random.normal{16, 32}
  local function run (v) for _, l in ipairs(layers) do v = l(v) end return v end
  run(x)
  for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end end
  -- the gradients of a loss recorded inside wrap(f), and what the tape held
  return function (wrap)
    local t = mg.tape()
    local y = wrap(function() return mg.sum(run(x) ^ 2) end)
    t:stop()
    local held = t:saved_bytes()
    return t:gradient(y, vars), held
  end
end

describe("float16 and bfloat16", function()
  it("are storage formats: made, cast, printed, read; products round to float16", function()
    local x = mg.constant({1.5, -2.25, 65504, 1e-8}, "float16")
    assert.equal("float16", x.dtype)
    assert.same({1.5, -2.25, 65504, 0}, x:totable())
    assert.equal(1.5, x[1]:item())
    local b = mg.cast(mg.constant{3.14159, -1e30}, "bfloat16"):totable()
    assert.equal(3.140625, b[1])                                 -- 8 bits of mantissa
    assert.is_true(math.abs(b[2] / -1e30 - 1) < 1e-2)            -- float32's range
    assert.truthy(tostring(x):find("moongrad.Tensor(4) float16", 1, true))
    assert.same({2.5, 2.5}, mg.full({2}, 2.5, "bfloat16"):totable())
    local before = mg.memory.stats().current_bytes
    local z = mg.zeros({4}, "float16")
    assert.equal(before + 8, mg.memory.stats().current_bytes)    -- 2 bytes an element
    z = nil
    assert.equal("float32", mg.sum(x).dtype)                    -- computed in float32
    assert.equal("float32", mg.prod(x).dtype)                   -- computed in float32 too
    local p = mg.matmul(x:reshape{2, 2}, x:reshape{2, 2})     -- widened to float32, rounded to float16
    assert.equal("float16", p.dtype)
    assert.same(mg.cast(mg.matmul(mg.cast(x:reshape{2, 2}, "float32"), mg.cast(x:reshape{2, 2}, "float32")),
                        "float16"):totable(), p:totable())
    assert.same({1.5, -2.25}, x:slice({1, 2}):cast("float64"):totable())   -- views work
  end)

  it("take a Lua number in arithmetic as float32 (as they compute), in comparisons rounded", function()
    local h = mg.constant({10, 1}, "float16")
    local y = h * 65536                             -- 65536 alone is infinite in float16
    assert.equal("float32", y.dtype)
    assert.same({655360, 65536}, y:totable())
    local tiny = (h * 1e-8):totable()              -- 1e-8 alone is 0 in float16
    assert.is_true(math.abs(tiny[1] - 1e-7) < 1e-12 and math.abs(tiny[2] - 1e-8) < 1e-13)
    assert.same({true}, mg.equal(mg.constant({0.1}, "float16"), 0.1):totable())    -- NumPy's and PyTorch's
    assert.same({true}, mg.equal(mg.constant({0.1}, "bfloat16"), 0.1):totable())
    local w = mg.Variable(mg.constant({2}, "bfloat16"))
    local t = mg.tape()
    local l = mg.sum(w * 3e-3)
    t:stop()
    local g = t:gradient(l, w)
    assert.equal("bfloat16", g.dtype)               -- back in the variable's dtype
    assert.equal(mg.cast(mg.constant{3e-3}, "bfloat16"):item(), g:item())
  end)

  it("elementwise ops, reductions, softmax and the rest compute them in float32; ops that move data keep them",
     function()
    for _, dt in ipairs{"float16", "bfloat16"} do
      local x32 = mg.constant{{1.5, -2, 3}, {4, 5, -6}}
      local x = x32:cast(dt)
      local in_float32 = {                            -- as autocast's float32 list (docs/autocast.md)
        sin = mg.sin, floor = mg.floor, exp = mg.exp, abs = mg.abs, relu = mg.relu, neg = mg.neg,
        sum = mg.sum, mean = mg.mean, max = mg.max, argmax = mg.argmax, softmax = mg.softmax,
        add = function(a) return a + 1 end, mul = function(a) return a * a end,
        prod = mg.prod, cumsum = mg.cumsum, logsumexp = mg.logsumexp, var = mg.var, std = mg.std,
        norm = mg.norm, clamp = function(a) return mg.clamp(a, -1, 1) end,
        sort = function(a) return (mg.sort(a, 2)) end, topk = function(a) return (mg.topk(a, 2, 2)) end,
        put_along_axis = function(a) return mg.put_along_axis(a, mg.constant({{1}, {3}}, "int64"), mg.ones{2, 1}, 2) end,
      }
      for name, f in pairs(in_float32) do
        local got, want = f(x), f(x32)
        assert.equal(want.dtype, got.dtype, name)
        assert.same(want:totable(), got:totable(), name)   -- these values are exact in both dtypes
      end
      local moves = {
        function(a) return mg.flip(a, 1) end, function(a) return mg.tile(a, {2, 1}) end,
        function(a) return mg.pad(a, {{1, 1}, {0, 0}}) end, function(a) return a:reshape{3, 2} end,
        function(a) return mg.concat({a, a}) end, function(a) return mg.tril(a) end,
        function(a) return mg.repeat_interleave(a, 2, 1) end, function(a) return mg.transpose(a) end,
      }
      for i, f in ipairs(moves) do
        local got, want = f(x), f(x32)
        assert.equal(dt, got.dtype, i)
        assert.same(want:totable(), got:cast("float32"):totable(), i)
      end
    end
  end)
end)

describe("saved_tensors_hooks", function()
  local grads = model()
  local ref, plain_held = grads(function(f) return f() end)

  it("with identity hooks, give the plain gradients bit for bit", function()
    local packed, unpacked = 0, 0
    local g, held = grads(function(f)
      return mg.saved_tensors_hooks(function(t) packed = packed + 1; return t end,
                                    function(t) unpacked = unpacked + 1; return t end, f)
    end)
    for i = 1, #ref do h.assert_close(g[i], ref[i], 0) end
    assert.equal(plain_held, held)
    assert.is_true(packed > 0 and unpacked > 0)
  end)

  it("as float16 or bfloat16, halve the bytes held, within their rounding", function()
    for name, tol in pairs{float16 = 2e-3, bfloat16 = 2e-2} do
      local g, held = grads(function(f) return mg.saved_tensors_hooks(name, f) end)
      assert.is_true(math.abs(held - plain_held / 2) <= 4, name .. " held " .. held)
      for i = 1, #ref do h.assert_close(g[i], ref[i], tol) end
    end
  end)

  it("as float16 or bfloat16, leave integer tensors (a gather's indices, an Embedding's) as they are", function()
    local x = mg.cast(mg.arange(5000), "float32")
    local ids = mg.constant({4001, 4999, 2049, 1}, "int64")
    local emb = mg.nn.Embedding(1000, 4)
    local tok = mg.constant({{300, 301, 999}}, "int64")
    emb(tok)
    local function grads (wrap)
      local t = mg.tape()
      t:watch(x)
      local y = wrap(function() return mg.sum(mg.gather(x, ids) * 1) + mg.sum(emb(tok) ^ 2) end)
      t:stop()
      return t:gradient(y, {x, emb.embeddings})
    end
    local ref = grads(function(f) return f() end)
    for _, half in ipairs{"float16", "bfloat16"} do
      local g = grads(function(f) return mg.saved_tensors_hooks(half, f) end)
      h.assert_close(g[1], ref[1], 0)                   -- ones at 1, 2049, 4001, 4999 (not 4993)
      h.assert_close(g[2], ref[2], 2e-2)                -- rows 300, 301, 999, within the rounding
      local rows = {}
      for i, row in ipairs(g[2]:totable()) do
        for _, v in ipairs(row) do if v ~= 0 then rows[#rows + 1] = i break end end
      end
      assert.same({300, 301, 999}, rows)                -- no other row (a rounded id would move it)
    end
  end)

  it("offloaded to a mapped file, leave nothing on the tape and give the same gradients", function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
    local during
    local g, held = grads(function(f)
      return mg.saved_tensors_hooks({offload = dir}, function()
        local y = f()
        during = mg.memory.stats().external_bytes
        return y
      end)
    end)
    for i = 1, #ref do h.assert_close(g[i], ref[i], 0) end
    assert.is_true(held <= 8, "held " .. held)   -- only numbers (PyTorch's wrapped numbers) stay
    assert.is_true(during > 0)
    local left = io.popen("ls " .. dir):read("a")
    os.execute("rm -rf " .. dir)
    assert.equal("", left)                                 -- the files were unlinked at once
  end)

  it("offloaded, give the plain tape's gradients for aliases, views, captured values, numbers and recompute", function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
    mg.random.seed(7)
    local w = mg.Variable(mg.random.normal{5, 5}:cast("float64"))
    local x = mg.random.normal{3, 5}:cast("float64")
    local scale, on = 0.5, true
    -- a recomputed stretch taking a number and a boolean, and capturing w
    local block = mg.recompute_grad(function(u, k, flag)
      local v = flag and mg.tanh(mg.matmul(u, w)) * k or u
      return v * v                                     -- one tensor as both arguments
    end)
    local function step (wrap)
      local t = mg.tape()
      t:watch(x)
      local y = wrap(function()
        local a = mg.matmul(x, w)
        local at = mg.transpose(a)                     -- a view of a, saved beside a
        local b = mg.matmul(at, a) + a[1]              -- a row of a, a view again
        local c = block(b, scale, on) + block(b, scale, on)   -- the same input twice
        return mg.sum(c * mg.sum(a)) + mg.sum(mg.exp(w) * scale)
      end)
      t:stop()
      return t:gradient(y, {w, x})
    end
    local ref = step(function(f) return f() end)
    for round = 1, 2 do                                -- the second writes over the first's pages
      local spilled
      local g = step(function(f)
        return mg.saved_tensors_hooks({offload = dir}, function()
          local y = f()
          spilled = mg.memory.stats().external_bytes
          return y
        end)
      end)
      assert.is_true(spilled >= 2 * 3 * 5 * 8, "spilled " .. spilled)   -- a and x at least
      for i = 1, #ref do h.assert_close(g[i], ref[i], 0) end
    end
    os.execute("rm -rf " .. dir)
  end)

  -- the spill files this process has open in dir (unlinked: "(deleted)")
  local function spill_files (dir)
    local pid = io.open("/proc/self/stat"):read("l"):match("^(%d+)")
    local n = 0
    for line in io.popen("ls -l /proc/" .. pid .. "/fd 2>/dev/null"):lines() do
      if line:find(dir .. "/moongrad-saved-", 1, true) then n = n + 1 end
    end
    return n
  end

  it("offloaded, share one file per directory, its space reused step after step and released when idle", function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
    mg.memory.release_cache()
    assert.equal(0, spill_files(dir))
    local ext0 = mg.memory.stats().external_bytes
    for _ = 1, 3 do                                     -- tensors of several sizes, freed out of order
      local g = grads(function(f) return mg.saved_tensors_hooks({offload = dir}, f) end)
      for i = 1, #ref do h.assert_close(g[i], ref[i], 0) end
      local t = mg.tape()
      local xs = {}
      mg.saved_tensors_hooks({offload = dir}, function()
        for i = 1, 6 do
          xs[i] = mg.Variable(mg.random.normal{i * 300})
          t:watch(xs[i])
          xs[i] = mg.sum(mg.tanh(xs[i]) * xs[i])
        end
      end)
      t:stop()
      collectgarbage()
      assert.equal(1, spill_files(dir))                 -- one file however many tensors went
      assert.is_true(mg.memory.stats().external_bytes > ext0)
      t = nil
      collectgarbage()
      assert.equal(ext0, mg.memory.stats().external_bytes)
    end
    assert.equal(1, spill_files(dir))                   -- idle, kept for the next step's spills
    mg.memory.release_cache()
    assert.equal(0, spill_files(dir))
    -- a tape that still holds spilled tensors keeps its file through release_cache
    local x = mg.Variable(mg.random.normal({1000}, 0, 1, "float64"))
    local t = mg.tape{persistent = true}
    local y = mg.saved_tensors_hooks({offload = dir}, function() return mg.sum(mg.sin(x) * x) end)
    t:stop()
    local g1 = t:gradient(y, x)
    mg.memory.release_cache()
    assert.equal(1, spill_files(dir))
    h.assert_close(t:gradient(y, x), g1, 0)
    t, y = nil, nil
    collectgarbage()
    mg.memory.release_cache()
    assert.equal(0, spill_files(dir))
    -- empty tensors take no space; a directory that is not there is an error naming it
    local e = mg.Variable(mg.zeros{0, 3})
    t = mg.tape()
    y = mg.saved_tensors_hooks({offload = dir}, function() return mg.sum(mg.exp(e)) end)
    t:stop()
    assert.same({0, 3}, t:gradient(y, e).shape)
    local v = mg.Variable(mg.ones{3})
    t = mg.tape()
    assert.has_error(function()
      mg.saved_tensors_hooks({offload = dir .. "/missing"}, function() return mg.exp(v) end)
    end, "saved-tensor hooks: pack failed: offload: cannot make a file in " .. dir .. "/missing")
    t:stop()
    t, y = nil, nil
    collectgarbage()
    os.execute("rm -rf " .. dir)
    mg.memory.release_cache()
    -- a new directory each step: beside the last one, the idle files of the four used
    -- before it stay open, no more
    local dirs = {}
    for i = 1, 6 do
      dirs[i] = os.tmpname()
      os.remove(dirs[i])
      os.execute("mkdir -p " .. dirs[i])
      grads(function(f) return mg.saved_tensors_hooks({offload = dirs[i]}, f) end)
      collectgarbage()
    end
    local open = {}
    for i = 1, 6 do open[i] = spill_files(dirs[i]) end
    assert.same({0, 1, 1, 1, 1, 1}, open)
    -- one directory however it is written; a child process does not inherit its file
    for _, d in ipairs{dirs[6] .. "/", dirs[6]:gsub("/([^/]*)$", "//%1"), dirs[6] .. "/../" .. dirs[6]:match("[^/]*$")} do
      grads(function(f) return mg.saved_tensors_hooks({offload = d}, f) end)
    end
    collectgarbage()
    assert.equal(1, spill_files(dirs[6]))
    assert.equal(nil, io.popen("ls -l /proc/self/fd"):read("a"):find("moongrad-saved-", 1, true))
    mg.memory.release_cache()
    for i = 1, 6 do
      assert.equal(0, spill_files(dirs[i]))
      os.execute("rm -rf " .. dirs[i])
    end
  end)

  it("check what unpack gives, and name the hook that failed", function()
    assert.has_error(function()
      grads(function(f) return mg.saved_tensors_hooks(function(t) return t end, function(t) return t:reshape{-1} end, f) end)
    end)
    assert.has_error(function()
      grads(function(f) return mg.saved_tensors_hooks(function() return 1 end, function(t) return t end, f) end)
    end, "saved_tensors_hooks: pack must return a tensor, got number")
    assert.has_error(function() mg.saved_tensors_hooks("float8", print) end,
      "bad argument #1 to 'saved_tensors_hooks' (\"float16\", \"bfloat16\", {offload = dir} or a pack function expected, got \"float8\")")
    local g = grads(function(f) return f() end)         -- the stack is clean again
    for i = 1, #ref do h.assert_close(g[i], ref[i], 0) end
  end)

  it("a nested call with bad arguments leaves no hooks installed", function()
    for _, bad in ipairs{
      function() mg.saved_tensors_hooks(print, function() end) end,   -- no fn
      function() mg.saved_tensors_hooks("float16") end,
      function() mg.saved_tensors_hooks({offload = "/tmp"}, 3) end,
    } do
      assert.is_false(pcall(mg.saved_tensors_hooks, "float16", bad))
      local g = grads(function(f) return f() end)
      for i = 1, #ref do h.assert_close(g[i], ref[i], 0) end
    end
  end)

  it("second-order gradients flow through what the hooks kept", function()
    local x = mg.constant({1, 2}, "float64")
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
    for _, hooks in ipairs{{"float16"}, {{offload = dir}}, {function(t) return t * 1 end, function(t) return t end}} do
      local args = {table.unpack(hooks)}
      args[#args + 1] = function()
        local outer = mg.tape()
        outer:watch(x)
        local t = mg.tape()
        t:watch(x)
        local y = mg.sum(x * x * x)
        t:stop()
        local s = mg.sum(t:gradient(y, x))              -- 3x^2
        outer:stop()
        return outer:gradient(s, x)                     -- 6x
      end
      assert.same({6, 12}, mg.saved_tensors_hooks(table.unpack(args)):totable())
    end
    os.execute("rm -rf " .. dir)
  end)

  it("numbers skip the hooks (PyTorch's wrapped numbers); a 0-d tensor does not", function()
    local seen = {}
    local function pack (t) seen[#seen + 1] = t.shape[1] or 0; return t end
    local a = mg.constant({1.0, 2.0}, "float64")
    local t = mg.tape()
    t:watch(a)
    local y = mg.saved_tensors_hooks(pack, function(p) return p end, function()
      return mg.sum(a * 3) + mg.sum(a ^ 2) + mg.sum(a * mg.constant(5, "float64"))
    end)
    t:stop()
    assert.same({2, 0}, seen)               -- a (a*3 keeps 3 only; a^2 keeps a, not a^2: no exponent's gradient), the 0-d 5
    h.assert_close(t:gradient(y, a), mg.constant({3 + 2 + 5, 3 + 4 + 5}, "float64"), 1e-15)
  end)

  it("a hook that fails inside a recorded backward is the error reported", function()
    local a = mg.constant({1.0, 2.0}, "float64")
    local outer = mg.tape()
    outer:watch(a)
    local inner = mg.tape()
    inner:watch(a)
    local s = mg.sum(mg.exp(a))
    inner:stop()
    local ok, err = pcall(mg.saved_tensors_hooks, function() error("no room") end, function(p) return p end,
                          function() return inner:gradient(s, a) end)
    outer:stop()
    assert.is_false(ok)
    assert.matches("in the backward of 'exp': saved-tensor hooks: pack failed: ", err, 1, true)
    assert.matches("no room", err, 1, true)
    -- a hook's message that says "pack" is wrapped all the same (it was raised bare, its position twice)
    local t = mg.tape()
    t:watch(a)
    ok, err = pcall(mg.saved_tensors_hooks, function() error("pack boom", 0) end, function(p) return p end,
                    function() return mg.exp(a) end)
    t:stop()
    assert.is_false(ok)
    local tail = "saved-tensor hooks: pack failed: pack boom"
    assert.equal(tail, err:sub(-#tail), err)
  end)
end)

-- Files: safetensors (mg.save, mg.load), atomic writes, corrupt files; the
-- IDX and CSV readers; mg.data.Dataset; save_weights/load_weights; training
-- checkpoints that resume bit for bit; interoperability with PyTorch; Debian
-- dataset packages.
local mg = require "moongrad"
local h = require "helpers"

local nn = mg.nn

-- a fresh directory for the files of one test, removed by teardown
local dirs = {}
local function tmpdir ()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p '" .. d .. "'"))
  dirs[#dirs + 1] = d
  return d
end

local function write (path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end

local read = h.read

local function listdir (d)
  local out = {}
  for name in io.popen("ls -A '" .. d .. "'"):lines() do out[#out + 1] = name end
  table.sort(out)
  return out
end

-- the error a call raises (its message), failing if it returns
local function err (f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end

local function assert_has (text, want)
  assert(text:find(want, 1, true), ("\"%s\"\ndoes not contain\n\"%s\""):format(text, want))
end

-- a safetensors file from a header (text) and data bytes; n overrides the length field
local function st_bytes (header, data, n)
  return string.pack("<I8", n or #header) .. header .. (data or "")
end

local function floats (...) return string.pack("<" .. ("f"):rep(select("#", ...)), ...) end

local function bits (x) return ("%a"):format(x) end

teardown(function()
  for _, d in ipairs(dirs) do os.execute("rm -rf '" .. d .. "'") end
end)

describe("safetensors", function()
  it("round-trips every dtype, 0-d and 0-size tensors, non-contiguous views and variables", function()
    local d = tmpdir()
    local big = mg.constant({4611686018427387904, -9223372036854775807, 7}, "int64")
    local tensors = {
      f32 = mg.constant{{1.5, -2}, {3, 1e-30}},
      f64 = mg.constant(math.pi, "float64"),                  -- 0-d
      i64 = big,
      bool = mg.constant{true, false, true},
      f16 = mg.constant({0.5, -65504, 1e-7}, "float16"),
      bf16 = mg.constant({3.140625, -1e30}, "bfloat16"),
      empty = mg.zeros({0, 4}),
      empty64 = mg.zeros({3, 0}, "int64"),
      view = mg.transpose(mg.arange(6):reshape{2, 3}),        -- not contiguous
      var = mg.Variable(mg.constant{9, 8}),
    }
    mg.save(d .. "/a.safetensors", tensors)
    local back, meta = mg.load(d .. "/a.safetensors")
    assert.same({}, meta)
    local n = 0
    for name, t in pairs(tensors) do
      n = n + 1
      local b = back[name]
      assert.truthy(b, name)
      assert.equal(t.dtype, b.dtype, name)
      assert.same(t.shape, b.shape, name)
      assert.same(t:totable(), b:totable(), name)
    end
    for _ in pairs(back) do n = n - 1 end
    assert.equal(0, n)
    assert.equal(math.pi, back.f64:item())
    assert.equal(math.type(back.i64:totable()[1]), "integer")
    assert.same({4611686018427387904, -9223372036854775807, 7}, back.i64:totable())
  end)

  it("keeps metadata, flattens nested tables with '/', writes the header sorted and padded to 8", function()
    local d = tmpdir()
    local p = d .. "/m.safetensors"
    mg.save(p, {b = mg.ones{1}, a = {x = mg.zeros{2}, [2] = mg.ones{3}}, c = mg.zeros({1}, "bool")},
            {metadata = {note = "hello, \"world\"", step = 12}})
    local t, meta = mg.load(p)
    assert.same({note = "hello, \"world\"", step = "12"}, meta)
    assert.same({3}, t["a/2"].shape)
    assert.same({2}, t["a/x"].shape)
    local raw = read(p)
    local n = string.unpack("<I8", raw)
    assert.equal(0, (8 + n) % 8)
    local header = raw:sub(9, 8 + n)
    local pa, px, pb, pc = header:find('"a/2"', 1, true), header:find('"a/x"', 1, true),
                           header:find('"b"', 1, true), header:find('"c"', 1, true)
    assert.truthy(pa < px and px < pb and pb < pc)
  end)

  it("an empty table is a valid file", function()
    local d = tmpdir()
    mg.save(d .. "/e.safetensors", {})
    local t, meta = mg.load(d .. "/e.safetensors")
    assert.same({}, t)
    assert.same({}, meta)
  end)

  it("refuses what it cannot save, naming the entry", function()
    local d = tmpdir()
    local p = d .. "/x.safetensors"
    local one = mg.ones{1}
    assert_has(err(mg.save, p, {a = {b = "text"}}), "save: tensors['a/b'] is string, not a tensor")
    assert_has(err(mg.save, p, {["a/b"] = one, a = {b = one}}), "save: the name 'a/b' is given twice")
    local loop = {x = one}
    loop.self = loop
    assert_has(err(mg.save, p, loop), "save: the tensors table contains itself at 'self'")
    local deep, t = {}, nil
    t = deep
    for _ = 1, 60 do t.x = {}; t = t.x end
    t.w = one
    mg.save(p, deep)
    assert.same({1}, mg.load(p)[("x/"):rep(60) .. "w"].shape)
    os.remove(p)
    t.x = {}
    for _ = 1, 10 do t = t.x; t.x = {} end
    assert_has(err(mg.save, p, deep), "save: the tensors table nests more than 64 deep")
    assert_has(err(mg.save, p, {__metadata__ = one}), "'__metadata__' is reserved")
    assert_has(err(mg.save, p, {[true] = one}), "has a key of type boolean")
    assert_has(err(mg.save, p, {a = one}, {metadata = {k = {}}}), "metadata['k'] must be a string, got table")
    assert_has(err(mg.save, p, {a = one}, {metdata = {}}), "unknown option 'metdata'")
    assert_has(err(mg.save, p, {["\255"] = one}), "is not valid UTF-8")
    assert.same({}, listdir(d))
  end)

  describe("writes atomically", function()
    it("a save that fails leaves no file behind", function()
      local d = tmpdir()
      assert_has(err(mg.save, d .. "/no/such/dir/w.safetensors", {a = mg.ones{2}}),
                 "save: '" .. d .. "/no/such/dir/w.safetensors': cannot create a temporary file in '" .. d ..
                 "/no/such/dir': No such file or directory")
      write(d .. "/file", "x")
      assert_has(err(mg.save, d .. "/file/w.safetensors", {a = mg.ones{2}}), "Not a directory")
      os.execute("mkdir '" .. d .. "/sub'")
      assert_has(err(mg.save, d .. "/sub", {a = mg.ones{2}}), "save: '" .. d .. "/sub': is a directory, not a regular file")
      assert.same({"file", "sub"}, listdir(d))
    end)

    it("a failure in the middle of writing keeps the old file and removes the temporary one", function()
      local d = tmpdir()
      local p = d .. "/w.safetensors"
      mg.save(p, {a = mg.ones{3}})
      local old = read(p)
      -- the float64 tensor is written first; then copying the transposed one
      -- (not contiguous) fails, as if the process died mid-save
      local first, second = mg.ones({1000}, "float64"), mg.transpose(mg.ones{300, 200})
      mg.memory.fail_after(1)
      local e = err(mg.save, p, {first = first, second = second})
      mg.memory.fail_after(0)
      assert_has(e, "save: '" .. p .. "': tensor 'second': ")
      assert.equal(old, read(p))
      assert.same({"w.safetensors"}, listdir(d))
      assert.same({3}, mg.load(p).a.shape)
    end)

    it("a process killed while saving leaves the previous checkpoint whole", function()
      local d = tmpdir()
      local p = d .. "/big.safetensors"
      write(d .. "/saver.lua", ([[
        local x = mg.full({2048, 2048}, 7)
        mg.save(%q, {x = x})
        local i = 0
        while true do i = i + 1; mg.save(%q, {x = x + i}) end
      ]]):format(p, p))
      local out, code = h.run(("(%s %s/saver.lua & pid=$!; while [ ! -s %s ]; do sleep 0.02; done; "
                               .. "sleep 0.4; kill -9 $pid; wait $pid; true) 2>&1"):format(h.bin, d, p))
      assert.equal(0, code, out)
      local t = mg.load(p)                            -- whole, whichever save it is
      assert.same({2048, 2048}, t.x.shape)
      local v = t.x[1][1]:item()
      assert.equal(v, mg.min(t.x):item())
      assert.equal(v, mg.max(t.x):item())
    end)
  end)

  describe("refuses corrupt files with a clear error and loads nothing", function()
    local d, good
    setup(function()
      d = tmpdir()
      good = d .. "/good.safetensors"
      mg.save(good, {a = mg.constant{1, 2, 3}, b = mg.constant({{1, 2}, {3, 4}}, "float64")})
    end)

    local function loads (bytes)
      local p = write(d .. "/bad.safetensors", bytes)
      return err(mg.load, p)
    end

    local cases = {
      {"a file shorter than 8 bytes", "\1\0\0", "the file is 3 bytes, too short for the 8-byte header length"},
      {"a header length beyond the file", st_bytes("{}", "", 4096),
       "the header length 4096 runs past the end of the file (10 bytes; truncated, or not a safetensors file?)"},
      {"a header length of 2^63", st_bytes("{}", "", 1 << 62), "runs past the end of the file"},
      {"invalid JSON", st_bytes('{"a": {"dtype": "F32",, }}'), "the header is not valid JSON (at byte"},
      {"a JSON array", st_bytes("[1, 2]  "), "the header is an array, not a JSON object"},
      {"text after the JSON", st_bytes('{} x'), "the header has bytes after its JSON object (at byte 3)"},
      {"an unknown dtype", st_bytes('{"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}', floats(1)),
       "tensor 'a': dtype 'I32' is not supported (moongrad reads F32, F64, I64, BOOL, F16 and BF16)"},
      {"a shape that does not fit its offsets",
       st_bytes('{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}', ("\0"):rep(20)),
       "tensor 'a': shape (2,3) F32 needs 24 bytes, but data_offsets [0, 20] hold 20"},
      {"a huge shape", st_bytes('{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}',
                                ("\0"):rep(8)), "shape (4294967296,4294967296) F64 needs more than 4611686018427387904 bytes, but data_offsets [0, 8] hold 8"},
      {"offsets past the data", st_bytes('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', floats(1)),
       "tensor 'a': data_offsets [0, 8] run past the end of the data (4 bytes)"},
      {"reversed offsets", st_bytes('{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}', floats(1)),
       "data_offsets [4, 0] end before they begin"},
      {"overlapping tensors",
       st_bytes('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
                floats(1, 2, 3)), "tensors 'a' and 'b' overlap (data_offsets [0, 8] and [4, 12])"},
      {"a gap", st_bytes('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', floats(1, 2)),
       "a gap of 4 bytes before tensor 'a'"},
      {"bytes after the last tensor", st_bytes('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', floats(1, 2)),
       "the data is 8 bytes but the tensors hold 4; the rest belongs to no tensor"},
      {"two tensors of one name",
       st_bytes('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
                floats(1, 2)), "two tensors are named 'a'"},
      {"a missing field", st_bytes('{"a":{"dtype":"F32","shape":[1]}}'), "tensor 'a': the field 'data_offsets' is missing"},
      {"an unknown field", st_bytes('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}', floats(1)),
       "tensor 'a': unknown field 'x'"},
      {"a negative size", st_bytes('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}'),
       "tensor 'a': shape entry 1 is not a whole number >= 0"},
      {"a fractional size", st_bytes('{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}}'),
       "shape entry 1 is not a whole number"},
      {"nine dimensions", st_bytes('{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}', floats(1)),
       "tensor 'a': 9 dimensions, moongrad takes at most 8"},
      {"a metadata number", st_bytes('{"__metadata__":{"k":1}}'), "__metadata__ 'k' is a number, not a string"},
      {"an entry that is not an object", st_bytes('{"a":[1]}'), "tensor 'a': its header entry is an array, not an object"},
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        local e = loads(c[2])
        assert_has(e, "load: '" .. d .. "/bad.safetensors': ")
        assert_has(e, c[3])
      end)
    end

    it("a file cut short anywhere", function()
      local bytes = read(good)
      local n = string.unpack("<I8", bytes)
      for _, cut in ipairs({#bytes - 1, #bytes - 20, 8 + n, 8 + n - 1, 20, 8, 7, 0}) do
        local e = loads(bytes:sub(1, cut))
        assert.truthy(e:find("run past the end of the data", 1, true) or e:find("runs past the end of the file", 1, true)
                      or e:find("too short for the 8%-byte header") or e:find("belongs to no tensor", 1, true), e)
      end
    end)

    it("a directory and a missing file", function()
      assert_has(err(mg.load, d), "load: '" .. d .. "': is a directory, not a regular file")
      assert_has(err(mg.load, d .. "/none"), "load: '" .. d .. "/none': cannot open: No such file or directory")
    end)

    it("leaves no tensor behind, and random damage is an error or a file, never a crash", function()
      local bytes = read(good)
      local before = h.settled()
      local seed = 12345
      local function rand (n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n + 1 end
      local loaded, refused = 0, 0
      for _ = 1, 400 do
        local b = {bytes:byte(1, -1)}
        for _ = 1, rand(4) do b[rand(#b)] = rand(256) - 1 end
        local s = string.char(table.unpack(b))
        if rand(4) == 1 then s = s:sub(1, rand(#s)) end
        local ok, e = pcall(mg.load, write(d .. "/fuzz.safetensors", s))
        if ok then loaded = loaded + 1 else
          refused = refused + 1
          assert.truthy(tostring(e):find("^load: '"), e)
        end
      end
      assert.truthy(refused > 100)
      local after = h.settled()
      assert.equal(before.live_tensors, after.live_tensors)
      assert.equal(before.current_bytes, after.current_bytes)
    end)
  end)
end)

describe("files that are not regular files, and NUL bytes", function()
  local function q (s) return "'" .. s:gsub("'", "'\\''") .. "'" end
  local function shell_out (cmd)
    local p = io.popen(cmd)
    local out = p:read("a")
    p:close()
    return (out:gsub("%s+$", ""))
  end
  local function mode (path) return shell_out("stat -c %a " .. q(path)) end
  local function is_fifo (path) return os.execute("test -p " .. q(path)) == true end
  local function exists (path) return os.execute("test -e " .. q(path)) == true end

  -- A FIFO at p with a helper in the background on its other side, so that
  -- code that wrongly opens the FIFO and waits finds a peer, and the spec
  -- ends (with the wrong answer) instead of hanging: side "writer" opens it
  -- for writing and closes it at once (a reader sees an empty stream),
  -- "reader" copies it to /dev/null. The returned function frees the helper
  -- when nothing opened the FIFO (opening it read-write is never blocked)
  -- and waits for it to end.
  local function fifo (p, side)
    assert(os.execute("mkfifo " .. q(p)))
    local body = side == "writer" and "exec 3>" .. q(p) or "cat " .. q(p) .. " >/dev/null"
    assert(os.execute(("(%s; touch %s) >/dev/null 2>&1 &"):format(body, q(p .. ".done"))))
    return function()
      os.execute(("while [ ! -e %s ]; do exec 3<>%s; exec 3>&-; done"):format(q(p .. ".done"), q(p)))
      os.remove(p .. ".done")
    end
  end

  it("save refuses a FIFO, a device and a directory, and leaves them as they were", function()
    local d = tmpdir()
    local one = {a = mg.ones{2}}
    local done = fifo(d .. "/fifo", "reader")
    assert.equal("save: '" .. d .. "/fifo': is a FIFO, not a regular file", err(mg.save, d .. "/fifo", one))
    done()
    assert.truthy(is_fifo(d .. "/fifo"))
    -- /dev/full through a link: a save that went wrong replaces the link, never the device
    assert(os.execute("ln -s /dev/full " .. q(d .. "/full")))
    assert.equal("save: '" .. d .. "/full': is a character device, not a regular file",
                 err(mg.save, d .. "/full", one))
    assert.equal("/dev/full", shell_out("readlink " .. q(d .. "/full")))
    os.execute("mkdir " .. q(d .. "/sub"))
    assert.equal("save: '" .. d .. "/sub': is a directory, not a regular file", err(mg.save, d .. "/sub", one))
    assert.same({"fifo", "full", "sub"}, listdir(d))           -- no temporary file left
  end)

  it("load, read_csv and read_idx refuse a FIFO at once instead of waiting for a writer", function()
    local d = tmpdir()
    for _, c in ipairs{{"load", mg.load}, {"read_csv", mg.data.read_csv}, {"read_idx", mg.data.read_idx}} do
      local p = d .. "/" .. c[1] .. ".fifo"
      local done = fifo(p, "writer")
      local ok, e = pcall(c[2], p)
      done()
      assert.is_false(ok)
      assert.equal(c[1] .. ": '" .. p .. "': is a FIFO, not a regular file", tostring(e))
    end
  end)

  it("load, read_csv and read_idx refuse devices: /dev/zero is not a file of 0 bytes", function()
    for _, c in ipairs{{"load", mg.load}, {"read_csv", mg.data.read_csv}, {"read_idx", mg.data.read_idx}} do
      for _, dev in ipairs{"/dev/zero", "/dev/null", "/dev/full"} do
        assert.equal(c[1] .. ": '" .. dev .. "': is a character device, not a regular file", err(c[2], dev))
      end
    end
    assert.equal("load: '/tmp': is a directory, not a regular file", err(mg.load, "/tmp"))
  end)

  it("a path with a NUL byte is refused, not cut short at the NUL", function()
    local d = tmpdir()
    local p = d .. "/w.safetensors"
    assert.equal("save: the path '" .. p .. "\\0x' contains a NUL byte", err(mg.save, p .. "\0x", {a = mg.ones{2}}))
    assert.is_false(exists(p))
    mg.save(p, {a = mg.ones{2}})
    write(d .. "/x.csv", "1,2\n")
    assert.equal("load: the path '" .. p .. "\\0' contains a NUL byte", err(mg.load, p .. "\0"))
    assert.equal("read_csv: the path '" .. d .. "/x.csv\\0.gz' contains a NUL byte",
                 err(mg.data.read_csv, d .. "/x.csv\0.gz"))
    assert.equal("read_idx: the path '" .. p .. "\\0' contains a NUL byte", err(mg.data.read_idx, p .. "\0"))
    assert.equal("memory.trace: the path '" .. d .. "/t.json\\0' contains a NUL byte",
                 err(mg.memory.trace, d .. "/t.json\0", function() end))
    assert.equal("saved_tensors_hooks: the path '" .. d .. "\\0x' contains a NUL byte",
                 err(mg.saved_tensors_hooks, {offload = d .. "\0x"}, function() end))
    assert_has(err(mg.data.read_csv, d .. "/x.csv", {delimiter = "\0"}),
               "option 'delimiter' must be one character other than NUL")       -- it meant ','
    assert.equal("debian_file: the path 'usr/bin/lua5.4\\0x' contains a NUL byte",
                 err(mg.data.debian_file, "lua5.4", "usr/bin/lua5.4\0x"))
    assert.same({"w.safetensors", "x.csv"}, listdir(d))
  end)

  it("a NUL byte in a tensor name or in metadata is refused when saving and when loading", function()
    local d = tmpdir()
    local p = d .. "/w.safetensors"
    local one = mg.ones{1}
    assert.equal("save: the tensor name 'a\\0b' contains a NUL byte", err(mg.save, p, {["a\0b"] = one}))
    assert.equal("save: the tensor name 'x/a\\0' contains a NUL byte", err(mg.save, p, {x = {["a\0"] = one}}))
    assert_has(err(mg.save, p, {a = one}, {metadata = {["k\0"] = "v"}}), "metadata key 'k\\0' contains a NUL byte")
    assert_has(err(mg.save, p, {a = one}, {metadata = {k = "v\0w"}}), "metadata['k'] contains a NUL byte")
    assert.same({}, listdir(d))
    local entry = '{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    for _, c in ipairs{
      {'{"a\\u0000b":' .. entry .. '}', 3},                    -- an escaped NUL in a name
      {'{"a\0b":' .. entry .. '}', 3},                         -- a raw NUL byte in a name
      {'{"__metadata__":{"k":"v\\u0000"},"a":' .. entry .. '}', 23},
      {'{"a\\\\u0000":' .. entry .. '}', nil},                 -- a backslash, then "u0000": no NUL
    } do
      write(p, st_bytes(c[1], floats(1)))
      if c[2] then
        assert.equal(("load: '%s': the header has a NUL character at byte %d; tensor names and metadata "
                      .. "cannot hold NUL"):format(p, c[2]), err(mg.load, p))
      else
        assert.same({1}, mg.load(p)["a\\u0000"].shape)
      end
    end
  end)

  it("save keeps the permissions of the file it replaces", function()
    local d = tmpdir()
    local p = d .. "/w.safetensors"
    mg.save(p, {a = mg.ones{2}})
    assert(os.execute("chmod 600 " .. q(p)))
    mg.save(p, {a = mg.ones{3}})
    assert.equal("600", mode(p))
    assert(os.execute("chmod 640 " .. q(p)))
    mg.save(p, {a = mg.ones{4}})
    assert.equal("640", mode(p))
    assert.same({4}, mg.load(p).a.shape)
  end)

  it("the GEMM choices file ($MOONGRAD_GEMM_CACHE) is passed over when it is a FIFO, never opened", function()
    local d = tmpdir()
    local p = d .. "/choices.fifo"
    local done = fifo(p, "writer")
    -- the writer touches p.done while it holds the FIFO open, before a reader
    -- could see the end: once the run is over, p.done says whether it opened the FIFO
    local out, code = h.run(("MOONGRAD_GEMM=openblas MOONGRAD_GEMM_CACHE=%s %s -e %s"):format(q(p), h.bin,
                            q("print(mg.sum(mg.matmul(mg.ones{64, 64}, mg.ones{64, 64})):item())")))
    local opened = exists(p .. ".done")
    done()
    assert.equal(0, code, out)
    assert.equal("262144.0\n", out)
    assert.is_false(opened)
  end)

  it("memory.trace refuses a FIFO and a device, and reports a write that fails", function()
    local d = tmpdir()
    local ran = false
    local function fn () ran = true end
    assert.equal("memory.trace: '/dev/full': is a character device, not a regular file",
                 err(mg.memory.trace, "/dev/full", fn))
    local done = fifo(d .. "/fifo", "reader")
    local ok, e = pcall(mg.memory.trace, d .. "/fifo", fn)
    done()
    assert.is_false(ok)
    assert.equal("memory.trace: '" .. d .. "/fifo': is a FIFO, not a regular file", tostring(e))
    assert.is_false(ran)
    -- a file that cannot grow past 512 bytes (ulimit -f; SIGXFSZ ignored, so
    -- write fails with EFBIG): the trace, a few KiB, fails when it is closed
    write(d .. "/small.lua", ([[
      local r, msg = mg.memory.trace(%q, function()
        local x = mg.ones{4}
        for _ = 1, 8 do x = x + 1 end
        return "ran"
      end)
      print(r, msg)
      print(pcall(mg.save, %q, {x = mg.ones{1000}}))
    ]]):format(d .. "/t.json", d .. "/w.safetensors"))
    local out = h.run(("trap '' XFSZ; ulimit -f 1 && %s %s"):format(h.bin, q(d .. "/small.lua")))
    assert_has(out, "nil\tmemory.trace: '" .. d .. "/t.json': writing the trace failed: File too large\n")
    assert_has(out, "false\tsave: '" .. d .. "/w.safetensors': writing the temporary file '")
    assert_has(out, "' failed: File too large\n")
    assert.same({"fifo", "small.lua", "t.json"}, listdir(d))
  end)
end)

describe("IDX files", function()
  local d
  setup(function() d = tmpdir() end)

  -- an IDX file: type code, shape, and the packed elements
  local function idx (name, code, shape, fmt, values)
    local parts = {string.pack(">BBBB", 0, 0, code, #shape)}
    for _, s in ipairs(shape) do parts[#parts + 1] = string.pack(">I4", s) end
    for _, v in ipairs(values) do parts[#parts + 1] = string.pack(">" .. fmt, v) end
    return write(d .. "/" .. name, table.concat(parts))
  end

  local function gzip (path)
    assert(os.execute("gzip -c '" .. path .. "' > '" .. path .. ".gz'"))
    return path .. ".gz"
  end

  it("reads images as float32 and labels as int64, values kept, gzipped or not", function()
    local images = idx("images", 0x08, {2, 2, 3}, "B", {0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255})
    local labels = idx("labels", 0x08, {4}, "B", {9, 0, 3, 7})
    for _, p in ipairs({images, gzip(images)}) do
      local x = mg.data.read_idx(p)
      assert.equal("float32", x.dtype)
      assert.same({{{0, 1, 2}, {3, 4, 5}}, {{250, 251, 252}, {253, 254, 255}}}, x:totable())
    end
    for _, p in ipairs({labels, gzip(labels)}) do
      local y = mg.data.read_idx(p)
      assert.equal("int64", y.dtype)
      assert.same({9, 0, 3, 7}, y:totable())
    end
    assert.equal("float64", mg.data.read_idx(labels, {dtype = "float64"}).dtype)
    assert.equal("int64", mg.data.read_idx(images, {dtype = "int64"}).dtype)
  end)

  it("reads every element type", function()
    assert.same({-128, -1, 127}, mg.data.read_idx(idx("i8", 0x09, {3}, "b", {-128, -1, 127})):totable())
    assert.same({{-32768, 32767}}, mg.data.read_idx(idx("i16", 0x0B, {1, 2}, "i2", {-32768, 32767}), {dtype = "int64"}):totable())
    local i32 = mg.data.read_idx(idx("i32", 0x0C, {2}, "i4", {-2147483648, 2147483647}))
    assert.equal("int64", i32.dtype)
    assert.same({-2147483648, 2147483647}, i32:totable())
    local f32 = mg.data.read_idx(gzip(idx("f32", 0x0D, {2}, "f", {1.5, -0.25})))
    assert.equal("float32", f32.dtype)
    assert.same({1.5, -0.25}, f32:totable())
    local f64 = mg.data.read_idx(idx("f64", 0x0E, {1, 1, 1}, "d", {math.pi}))
    assert.equal("float64", f64.dtype)
    assert.equal(math.pi, f64:totable()[1][1][1])
    assert.same({0, 5}, mg.data.read_idx(idx("empty", 0x08, {0, 5}, "B", {})).shape)
  end)

  it("refuses wrong magic numbers, truncated and oversized files, naming the file", function()
    local p = d .. "/bad"
    local function says (bytes, want)
      write(p, bytes)
      assert_has(err(mg.data.read_idx, p), "read_idx: '" .. p .. "': " .. want)
    end
    says("\1\2\8\1", "wrong magic number 0x01020801: an IDX file starts with two zero bytes")
    says("\0\0\7\1", "wrong magic number 0x00000701")
    says("\0\0\8\0", "0 dimensions in the magic number 0x00000800; moongrad takes 1 to 8")
    says("\0\0\8\9", "9 dimensions in the magic number 0x00000809")
    says("\0\0", "truncated: the magic number needs 4 bytes, only 2 remain")
    says("\0\0\8\2\0\0\0\2", "truncated: the dimensions needs 8 bytes, only 4 remain")
    says("\0\0\8\1\0\0\0\5abc", "truncated: shape (5) of u8 needs 5 bytes of data, the file has 3")
    says("\0\0\8\1\0\0\0\2abc", "shape (2) of u8 needs 2 bytes of data, the file has 3 (1 too many)")
    says("\0\0\14\3\255\255\255\255\255\255\255\255\255\255\255\255", "truncated: shape (4294967295,4294967295,4294967295) of f64")
    local full = idx("full", 0x0B, {1000}, "i2", (function() local t = {} for i = 1, 1000 do t[i] = i end return t end)())
    local gz = read(gzip(full))
    write(p, gz:sub(1, #gz - 30))
    assert_has(err(mg.data.read_idx, p), "read_idx: '" .. p .. "': truncated")
    write(p, gz:sub(1, #gz // 2))
    assert_has(err(mg.data.read_idx, p), "truncated: shape (1000) of i16 needs 2000 bytes of data")
    assert_has(err(mg.data.read_idx, d .. "/none"), "read_idx: '" .. d .. "/none': cannot open: No such file or directory")
    assert_has(err(mg.data.read_idx, d), "is a directory, not a regular file")
    assert_has(err(mg.data.read_idx, full, {dtype = "bool"}), "option 'dtype': an IDX file cannot be read as bool")
    assert_has(err(mg.data.read_idx, full, {dtyp = "int64"}), "unknown option 'dtyp'")
  end)
  it("random damage to IDX files, gzipped or not, is an error or a tensor, never a crash", function()
    local plain = read(idx("fz", 0x0B, {3, 4}, "i2", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}))
    local gz = read(gzip(d .. "/fz"))
    local seed = 99
    local function rand (n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n + 1 end
    for _, bytes in ipairs({plain, gz}) do
      for _ = 1, 300 do
        local b = {bytes:byte(1, -1)}
        for _ = 1, rand(3) do b[rand(#b)] = rand(256) - 1 end
        local s = string.char(table.unpack(b))
        if rand(3) == 1 then s = s:sub(1, rand(#s)) end
        local ok, e = pcall(mg.data.read_idx, write(d .. "/fz.bin", s))
        assert.truthy(ok or tostring(e):find("^read_idx: '"), e)
      end
    end
  end)
end)

describe("CSV files", function()
  local d
  setup(function() d = tmpdir() end)

  it("reads numbers into a (rows, columns) tensor, gzipped or not, with a header, delimiters, blank lines", function()
    local p = write(d .. "/a.csv", "1,2,3\n4.5, -6 ,1e3\r\n\n  \n7,nan,inf\n")
    local x = mg.data.read_csv(p)
    assert.equal("float32", x.dtype)
    assert.same({3, 3}, x.shape)
    local t = x:totable()
    assert.same({1, 2, 3}, t[1])
    assert.same({4.5, -6, 1000}, t[2])
    assert.truthy(t[3][2] ~= t[3][2] and t[3][3] == math.huge)
    assert(os.execute("gzip -k '" .. p .. "'"))
    assert.same(x.shape, mg.data.read_csv(p .. ".gz").shape)
    local q = write(d .. "/b.csv", "a;b\n0.1;\"2\"\n3;4")
    local y = mg.data.read_csv(q, {header = true, delimiter = ";", dtype = "float64"})
    assert.equal("float64", y.dtype)
    assert.same({{0.1, 2}, {3, 4}}, y:totable())
    assert.same({0, 0}, mg.data.read_csv(write(d .. "/empty.csv", "")).shape)
    assert.same({0, 2}, mg.data.read_csv(write(d .. "/head.csv", "x,y\n"), {header = true}).shape)   -- the header's columns
  end)

  it("names the file, line and column of a ragged row or a field that is not a number", function()
    local p = d .. "/bad.csv"
    local function says (text, want, opts)
      write(p, text)
      assert_has(err(mg.data.read_csv, p, opts), "read_csv: '" .. p .. "': " .. want)
    end
    says("1,2,3\n4,5,6\n7,8\n", "line 3 has 2 fields, line 1 has 3 (every row must have as many)")
    says("\n1,2\n3,4,5\n", "line 3 has 3 fields, line 2 has 2")
    says("1,2\n3,abc\n", "line 2, column 2: 'abc' is not a number")
    says("1,2\n3,4x\n", "line 2, column 2: '4x' is not a number")
    says("1,,2\n", "line 1, column 2: the field is empty")
    says("1,2\n", "line 1, column 1: '1,2' is not a number", {delimiter = ";"})
    says("1\0002\n", "line 1 has a NUL byte (not a text file?)")
    assert(os.execute("printf '1,2\\n3,4\\n' | gzip -c | head -c 20 > '" .. p .. "'"))
    assert_has(err(mg.data.read_csv, p), "read_csv: '" .. p .. "': after line")
    assert_has(err(mg.data.read_csv, p, {delimiter = ",,"}), "option 'delimiter' must be one character")
    assert_has(err(mg.data.read_csv, p, {dtype = "int64"}), "option 'dtype' must be float32 or float64, got int64")
    assert_has(err(mg.data.read_csv, p, {header = 1}), "option 'header' must be a boolean")
    assert_has(err(mg.data.read_csv, d .. "/none.csv"), "cannot open: No such file or directory")
  end)
  it("random damage to a CSV file is an error or a tensor, never a crash", function()
    local text = "1,2,3\n4.5,-6,7e3\n8,9,10\n"
    local seed = 7
    local function rand (n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n + 1 end
    for _ = 1, 300 do
      local b = {text:byte(1, -1)}
      for _ = 1, rand(3) do b[rand(#b)] = rand(256) - 1 end
      local ok, e = pcall(mg.data.read_csv, write(d .. "/fz.csv", string.char(table.unpack(b))))
      assert.truthy(ok or tostring(e):find("^read_csv: '"), e)
    end
  end)
end)

describe("mg.data.Dataset", function()
  local x = mg.arange(1, 11):reshape{10, 1}
  local y = mg.arange(1, 11, 1, "int64")

  local function order (ds, epoch)
    local out = {}
    for _, b in ds:iter(epoch) do
      for _, v in ipairs(b.ndim == 0 and {b:item()} or b:totable()) do out[#out + 1] = v end
    end
    return table.concat(out, ",")
  end

  it("zips tensors along their first axis, in order", function()
    local ds = mg.data.Dataset(x, y)
    assert.equal(10, #ds)
    local i = 0
    for xi, yi in ds:iter() do
      i = i + 1
      assert.same({1}, xi.shape)
      assert.equal(i, xi:totable()[1])
      assert.equal(i, yi:item())
    end
    assert.equal(10, i)
    assert.equal("1,2,3,4,5,6,7,8,9,10", order(mg.data.Dataset{x, y}))
  end)

  it("shuffles by (seed, epoch), reproducibly, without touching mg.random", function()
    mg.random.seed(1)
    local state = mg.random.get_state()
    local ds = mg.data.Dataset(x, y):shuffle(42)
    local e1, e2 = order(ds), order(ds)                  -- epochs 1 and 2 of this shuffle
    assert.same(state, mg.random.get_state())
    assert.are_not.equal(e1, e2)
    assert.equal(e1, order(ds, 1))
    assert.equal(e2, order(mg.data.Dataset(x, y):shuffle(42), 2))
    mg.random.seed(99)
    assert.equal(e1, order(mg.data.Dataset(x, y):shuffle(42)))
    assert.are_not.equal(e1, order(mg.data.Dataset(x, y):shuffle(43)))
    local fixed = mg.data.Dataset(x, y):shuffle(42, {reshuffle_each_iteration = false})
    assert.equal(order(fixed), order(fixed))
    local sorted = {}
    for v in e1:gmatch("%d+") do sorted[#sorted + 1] = tonumber(v) end
    table.sort(sorted)
    assert.equal("1,2,3,4,5,6,7,8,9,10", table.concat(sorted, ","))
  end)

  it("batches (with drop_remainder), maps, takes and skips", function()
    local ds = mg.data.Dataset(x, y)
    local sizes = {}
    for xb, yb in ds:batch(4):iter() do
      sizes[#sizes + 1] = xb.shape[1]
      assert.same({xb.shape[1], 1}, xb.shape)
      assert.equal(xb.shape[1], yb.shape[1])
    end
    assert.same({4, 4, 2}, sizes)
    assert.equal(3, #ds:batch(4))
    assert.equal(2, #ds:batch(4, {drop_remainder = true}))
    assert.equal("1,2,3,4,5,6,7,8", order(ds:batch(4, {drop_remainder = true})))
    assert.equal("3,4,5", order(ds:skip(2):take(3)))
    assert.equal("3,4,5", order(ds:skip(2):batch(2):take(2):map(function(a, b) return a, b end):skip(0):batch(1):map(
      function(a, b) return a, mg.reshape(b, {-1}) end)):sub(1, 5))
    assert.equal("20,40,60", order(ds:take(3):map(function(a, b) return a, b * 20 end)))
    assert.equal("2,4", order(ds:map(function(a, b) return a, b * 2 end):batch(2):take(1)))
    local m = ds:map(function(a, b) return b:item() * 10, b end):batch(3)
    local first = m:iter()()
    assert.same({10, 20, 30}, first:totable())
    -- shuffle, take and skip compose on indices: the same elements as one by one
    local s = ds:skip(1):shuffle(7):take(6):skip(1)
    assert.equal(5, #s)
    assert.equal(order(s, 3), order(s:batch(2), 3))
    local X, Y = ds:shuffle(5):tensors(1)
    assert.same({10, 1}, X.shape)
    assert.equal(order(ds:shuffle(5), 1), table.concat(Y:totable(), ","))
    assert.equal(order(ds:batch(3):shuffle(9), 2), order(ds:batch(3):shuffle(9), 2))
  end)

  it("checks its arguments", function()
    assert_has(err(mg.data.Dataset, y, mg.zeros{3}), "Dataset: tensor 2 has 3 samples (its first axis), tensor 1 has 10")
    assert_has(err(mg.data.Dataset, mg.constant(1)), "Dataset: tensor 1 must have a first axis of samples")
    assert_has(err(mg.data.Dataset), "give at least one tensor")
    local ds = mg.data.Dataset(y)
    assert_has(err(ds.batch, ds, 0), "Dataset:batch: size must be a positive integer, got 0")
    assert_has(err(ds.shuffle, ds, 1.5), "Dataset:shuffle: seed must be an integer, got 1.5")
    assert_has(err(ds.take, ds, -1), "Dataset:take: n must be an integer >= 0, got -1")
    assert_has(err(ds.map, ds, 3), "Dataset:map: fn must be a function")
    assert_has(err(ds.batch, ds, 2, {drop = true}), "unknown option 'drop'")
    assert_has(err(ds.iter, ds, 0), "Dataset:iter: epoch must be a positive integer, got 0")
  end)
end)

describe("save_weights and load_weights", function()
  local function model (n_in)
    local m = nn.Sequential{nn.Dense(6, "tanh"), nn.Dense(4), nn.Sequential{nn.Dense(3), nn.BatchNorm()}}
    m(mg.ones{2, n_in or 5})
    return m
  end

  it("name variables by the layer structure, the same for every instance", function()
    local names = {}
    for i, e in ipairs(mg.checkpoint.names(model())) do names[i] = e.name end
    assert.same({"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias", "sequential/dense/kernel",
                 "sequential/dense/bias", "sequential/batch_norm/gamma", "sequential/batch_norm/beta",
                 "sequential/batch_norm/moving_mean", "sequential/batch_norm/moving_variance"}, names)
  end)

  it("round-trip into a model built again", function()
    local d = tmpdir()
    mg.random.seed(3)
    local a, b = model(), model()
    local x = mg.random.normal{3, 5}
    a:save_weights(d .. "/w.safetensors")
    assert.is_true(mg.max(mg.abs(a(x) - b(x))):item() > 0)
    b:load_weights(d .. "/w.safetensors")
    assert.same(a(x):totable(), b(x):totable())
    local _, meta = mg.load(d .. "/w.safetensors")
    assert.equal("moongrad.weights", meta.format)
  end)

  it("refuse a file that does not match, changing nothing", function()
    local d = tmpdir()
    local p = d .. "/w.safetensors"
    model():save_weights(p)
    local function unchanged (m, want)
      local before = {}
      for i, v in ipairs(m.variables) do before[i] = v:value():totable() end
      assert_has(err(m.load_weights, m, p), want)
      for i, v in ipairs(m.variables) do assert.same(before[i], v:value():totable()) end
    end
    unchanged(model(7), "load_weights: '" .. p .. "': 'dense/kernel' has shape (5,6) in the file, the model's variable has shape (7,6)")
    local small = nn.Sequential{nn.Dense(6, "tanh"), nn.Dense(4)}
    small(mg.ones{1, 5})
    unchanged(small, "load_weights: '" .. p .. "' has 6 weights the model does not: 'sequential/batch_norm/beta'")
    local more = nn.Sequential{nn.Dense(6, "tanh"), nn.Dense(4), nn.Sequential{nn.Dense(3), nn.BatchNorm()}, nn.Dense(2)}
    more(mg.ones{1, 5})
    unchanged(more, "load_weights: '" .. p .. "' has no weights for 2 variables of the model: 'dense_2/bias', 'dense_2/kernel'")
    local ints = model()
    mg.save(p, (function()
      local t = {}
      for _, e in ipairs(mg.checkpoint.names(ints)) do t[e.name] = mg.cast(e.var, "int64") end
      return t
    end)())
    unchanged(ints, "'dense/kernel' is int64 in the file, the model's variable is float32")
    local unbuilt = nn.Dense(3)
    assert_has(err(unbuilt.save_weights, unbuilt, p), "save_weights: the model has no variables yet")
    assert_has(err(model().load_weights, model(), d .. "/none"), "load: '" .. d .. "/none': cannot open")
  end)

  it("list every mismatch in one error, load_weights and checkpoint.restore alike, changing nothing", function()
    local d = tmpdir()
    local p, c = d .. "/w.safetensors", d .. "/c.safetensors"
    local src = model()
    src:save_weights(p)
    local opt = mg.optim.Adam{}
    opt:apply_gradients({mg.zeros_like(src.trainable_variables[1])}, {src.trainable_variables[1]})
    mg.checkpoint.save(c, {model = src, optimizer = opt})
    -- three shapes differ: the first Dense's kernel and bias (7 units, not 6), the second's kernel
    local wide = nn.Sequential{nn.Dense(7, "tanh"), nn.Dense(4), nn.Sequential{nn.Dense(3), nn.BatchNorm()}}
    wide(mg.ones{2, 5})
    local function values (m)
      local out = {}
      for i, v in ipairs(m.variables) do out[i] = v:value():totable() end
      return out
    end
    local before, rng = values(wide), mg.random.get_state()
    local three = "'dense/kernel' has shape (5,6) in the file, the model's variable has shape (5,7); "
               .. "'dense/bias' has shape (6) in the file, the model's variable has shape (7); "
               .. "'dense_1/kernel' has shape (6,4) in the file, the model's variable has shape (7,4)"
    assert.equal("load_weights: '" .. p .. "' does not match the model in 3 places: " .. three,
                 (err(wide.load_weights, wide, p):gsub("^.-:%d+: ", "")))
    assert.same(before, values(wide))
    local opt2 = mg.optim.Adam{}
    assert.equal("checkpoint.restore: '" .. c .. "' does not match the model in 3 places: " .. three,
                 (err(mg.checkpoint.restore, c, {model = wide, optimizer = opt2}):gsub("^.-:%d+: ", "")))
    assert.same(before, values(wide))
    assert.same(rng, mg.random.get_state())
    -- a shape and a missing pair: one error with both
    local more = nn.Sequential{nn.Dense(7, "tanh"), nn.Dense(4), nn.Sequential{nn.Dense(3), nn.BatchNorm()}, nn.Dense(2)}
    more(mg.ones{2, 5})
    before = values(more)
    assert.equal("load_weights: '" .. p .. "' does not match the model in 4 places: " .. three
                 .. "; it has no weights for 2 variables of the model: 'dense_2/bias', 'dense_2/kernel'",
                 (err(more.load_weights, more, p):gsub("^.-:%d+: ", "")))
    assert.same(before, values(more))
  end)

  it("cast float weights to the model's dtype", function()
    local d = tmpdir()
    local a = nn.Dense(2)
    a(mg.ones{1, 3})
    a:save_weights(d .. "/w.safetensors")
    local b = nn.Dense(2)
    b(mg.ones({1, 3}, "float64"))
    b:load_weights(d .. "/w.safetensors")
    assert.equal("float64", b.kernel.dtype)
    h.assert_close(b.kernel:value(), mg.cast(a.kernel:value(), "float64"), 0)
  end)
end)

describe("training checkpoints", function()
  -- a model with dropout (so the random state matters) trained with Adam on
  -- a dataset shuffled per epoch; returns the losses of epochs first..last
  -- as exact bit strings
  local function setup_run ()
    mg.random.seed(11)
    local x = mg.random.normal{64, 6}
    local y = mg.tanh(mg.matmul(x, mg.random.normal{6, 2}))
    local model = nn.Sequential{nn.Dense(16, "tanh"), nn.Dropout(0.2), nn.Dense(2)}
    model(x)
    return model, mg.optim.Adam(0.01), mg.data.Dataset(x, y):shuffle(5):batch(16)
  end

  local function train (model, opt, ds, first, last, losses)
    for epoch = first, last do
      local total = 0
      for xb, yb in ds:iter(epoch) do
        local vars = model.trainable_variables
        local t = mg.tape()
        local loss = nn.mean_squared_error(model(xb), yb)
        t:stop()
        opt:apply_gradients(t:gradient(loss, vars), vars)
        total = total + loss:item()
      end
      losses[#losses + 1] = bits(total)
    end
    return losses
  end

  it("resume bit for bit: a run stopped after epoch 2 and restored gives the same curve", function()
    local d = tmpdir()
    local model, opt, ds = setup_run()
    local straight = train(model, opt, ds, 1, 4, {})

    model, opt, ds = setup_run()
    local resumed = train(model, opt, ds, 1, 2, {})
    mg.checkpoint.save(d .. "/c.safetensors", {model = model, optimizer = opt, epoch = 2})
    -- a fresh start: new model (its layers have other names), new optimizer, other random state
    local model2, opt2, ds2 = setup_run()
    mg.random.seed(777)
    local info = mg.checkpoint.restore(d .. "/c.safetensors", {model = model2, optimizer = opt2})
    assert.equal(2, info.epoch)
    assert.equal(opt.iterations, opt2.iterations)
    train(model2, opt2, ds2, info.epoch + 1, 4, resumed)
    assert.same(straight, resumed)
  end)

  it("resume bit for bit in another process", function()
    local d = tmpdir()
    local script = d .. "/run.lua"
    write(script, [[
      local nn, mode, path = mg.nn, arg[1], arg[2]
      mg.random.seed(11)
      local x = mg.random.normal{64, 6}
      local y = mg.tanh(mg.matmul(x, mg.random.normal{6, 2}))
      local model = nn.Sequential{nn.Dense(16, "tanh"), nn.Dropout(0.2), nn.Dense(2)}
      model(x)
      local opt, ds = mg.optim.Adam(0.01), mg.data.Dataset(x, y):shuffle(5):batch(16)
      local first, last = 1, 4
      if mode == "stop" then last = 2 end
      if mode == "resume" then first = mg.checkpoint.restore(path, {model = model, optimizer = opt}).epoch + 1 end
      for epoch = first, last do
        local total = 0
        for xb, yb in ds:iter(epoch) do
          local vars = model.trainable_variables
          local t = mg.tape()
          local loss = nn.mean_squared_error(model(xb), yb)
          t:stop()
          opt:apply_gradients(t:gradient(loss, vars), vars)
          total = total + loss:item()
        end
        print(("%d %a"):format(epoch, total))
      end
      if mode == "stop" then mg.checkpoint.save(path, {model = model, optimizer = opt, epoch = last}) end
    ]])
    local function run (mode)
      local out, code = h.run(("%s %s %s %s/c.safetensors"):format(h.bin, script, mode, d))
      assert.equal(0, code, out)
      return out
    end
    local straight = run("all")
    assert.equal(straight, run("stop") .. run("resume"))
  end)

  it("through fit and mg.checkpoint.callback", function()
    if not nn.Layer.fit then return pending("fit is not there yet") end
    local d = tmpdir()
    local function compiled ()
      mg.random.seed(21)
      local x = mg.random.normal{48, 5}
      local y = mg.tanh(mg.matmul(x, mg.random.normal{5, 1}))
      local m = nn.Sequential{nn.Dense(8, "tanh"), nn.Dropout(0.3), nn.Dense(1)}
      m(x)
      m:compile{optimizer = mg.optim.Adam(0.02), loss = "mean_squared_error"}
      return m, x, y
    end
    local function curve (history)
      local out = {}
      for i, v in ipairs(history.history.loss) do out[i] = bits(v) end
      return out
    end
    local m, x, y = compiled()
    local straight = curve(m:fit(x, y, {epochs = 4, batch_size = 16, verbose = 0, seed = 3}))

    m, x, y = compiled()
    local first = m:fit(x, y, {epochs = 2, batch_size = 16, verbose = 0, seed = 3,
                              callbacks = {mg.checkpoint.callback(d .. "/ckpt-{epoch:02d}.safetensors")}})
    assert.same({"ckpt-01.safetensors", "ckpt-02.safetensors"}, listdir(d))
    local m2, x2, y2 = compiled()
    mg.random.seed(5)
    local info = mg.checkpoint.restore(d .. "/ckpt-02.safetensors", {model = m2, optimizer = m2.optimizer})
    local rest = m2:fit(x2, y2, {epochs = 4, initial_epoch = info.epoch, batch_size = 16, verbose = 0, seed = 3})
    local resumed = curve(first)
    for _, v in ipairs(curve(rest)) do resumed[#resumed + 1] = v end
    assert.same(straight, resumed)
  end)

  it("checks what it is given and what it reads", function()
    local d = tmpdir()
    local model, opt = setup_run()
    mg.checkpoint.save(d .. "/c.safetensors", {model = model, optimizer = opt, epoch = 1, metadata = {run = "a"}})
    local info = mg.checkpoint.restore(d .. "/c.safetensors", {model = model, rng = false})
    assert.same({run = "a"}, info.metadata)
    assert_has(err(mg.checkpoint.save, d .. "/c.safetensors", {optimizer = opt}),
               "checkpoint.save: an optimizer's state is saved with its model")
    assert_has(err(mg.checkpoint.save, d .. "/c.safetensors", {model = model, epoch = 1.5}),
               "option 'epoch' must be an integer")
    assert_has(err(mg.checkpoint.save, d .. "/c.safetensors", {model = model, metadata = {epoch = "x"}}),
               "metadata key 'epoch' is reserved")
    local sgd = mg.optim.SGD(0.1, {momentum = 0.9})
    assert_has(err(mg.checkpoint.restore, d .. "/c.safetensors", {model = model, optimizer = sgd}), "SGD")
    model:save_weights(d .. "/w.safetensors")
    assert_has(err(mg.checkpoint.restore, d .. "/w.safetensors", {model = model}),
               "is not a training checkpoint (no format = moongrad.checkpoint in its metadata); it holds weights")
    local m2 = setup_run()
    m2:load_weights(d .. "/c.safetensors")           -- the weights of a checkpoint
    assert.same(model.variables[1]:value():totable(), m2.variables[1]:value():totable())
  end)
end)

describe("interoperability with PyTorch (json, struct and torch only)", function()
  local python = "/usr/bin/python3"
  local has_torch = h.run(python .. " -c 'import torch' ")
  local ok = select(2, h.run(python .. " -c 'import torch'")) == 0
  local _ = has_torch
  local script = "spec/io_interop.py"

  local function model ()
    local m = nn.Sequential{nn.Dense(8, "tanh"), nn.Dense(8, "tanh"), nn.Dense(3)}
    m(mg.ones{1, 5})
    return m
  end

  it("PyTorch reads moongrad's weights and predicts the same", function()
    if not ok then return pending("no torch for " .. python) end
    local d = tmpdir()
    mg.random.seed(8)
    local m = model()
    local x = mg.random.normal{4, 5}
    m:save_weights(d .. "/w.safetensors")
    mg.save(d .. "/x.safetensors", {x = x})
    local out, code = h.run(("%s %s predict %s/w.safetensors %s/x.safetensors"):format(python, script, d, d))
    assert.equal(0, code, out)
    local got = {}
    for v in out:gmatch("[^\n]+") do got[#got + 1] = tonumber(v) end
    local want = mg.reshape(m(x), {-1}):totable()
    assert.equal(12, #got)
    h.assert_close(got, want, 1e-5)
  end)

  it("moongrad loads weights PyTorch wrote and predicts the same; every dtype reads back", function()
    if not ok then return pending("no torch for " .. python) end
    local d = tmpdir()
    local out, code = h.run(("%s %s write %s/w.safetensors %s/d.safetensors"):format(python, script, d, d))
    assert.equal(0, code, out)
    local m = model()
    m:load_weights(d .. "/w.safetensors")
    local data = mg.load(d .. "/d.safetensors")
    h.assert_close(m(data.x), data.y, 1e-5)
    assert.same({{1.5, -2.25}}, data["every/f64"]:totable())
    assert.same({-(1 << 62), 7, 0}, data["every/i64"]:totable())
    assert.same({true, false, true}, data["every/bool"]:totable())
    assert.same({0.5, -65504}, data["every/f16"]:totable())
    assert.equal("bfloat16", data["every/bf16"].dtype)
    assert.same({3.140625, -1}, data["every/bf16"]:totable())
    assert.equal(2.5, data["every/scalar"]:item())
    assert.same({0, 3}, data["every/empty"].shape)
    local _, meta = mg.load(d .. "/w.safetensors")
    assert.truthy(meta.written_by:find("^torch "))
  end)
end)

describe("Debian dataset packages", function()
  it("finds installed files, and checks its arguments", function()
    assert.equal("/usr/bin/lua5.4", mg.data.debian_file("lua5.4", "usr/bin/lua5.4"))
    assert.equal("/usr/bin/lua5.4", mg.data.debian_file("lua5.4", "/usr/bin/lua5.4"))
    assert_has(err(mg.data.debian_file, "Bad Name", "x"), "debian_file: 'Bad Name' is not a Debian package name")
    assert_has(err(mg.data.debian_file, "lua5.4", "../etc/passwd"), "path must be a file inside the package")
    assert_has(err(mg.data.debian_file, "lua5.4"), "debian_file: path must be a string, got nil")
  end)

  it("fetches a package with apt-get download and unpacks it into the cache, without root", function()
    if not select(2, h.run("command -v dpkg-deb")) == 0 then return pending("no dpkg-deb") end
    local d = tmpdir()
    -- a tiny package, and an apt-get that "downloads" it (no network in specs)
    assert(os.execute(("mkdir -p %s/pkg/DEBIAN %s/pkg/usr/share/datasets/tiny %s/bin"):format(d, d, d)))
    write(d .. "/pkg/DEBIAN/control", "Package: moongrad-tiny-dataset\nVersion: 1.0\nArchitecture: all\n"
          .. "Maintainer: spec <spec@example.org>\nDescription: a spec's dataset\n")
    write(d .. "/pkg/usr/share/datasets/tiny/data.csv", "1,2\n3,4\n")
    local out, code = h.run(("dpkg-deb --root-owner-group -b %s/pkg %s/moongrad-tiny-dataset_1.0_all.deb"):format(d, d))
    assert.equal(0, code, out)
    write(d .. "/bin/apt-get", ("#!/bin/sh\n[ \"$1\" = download ] && [ \"$2\" = moongrad-tiny-dataset ] || exit 100\n"
                                 .. "echo fetched >> %s/fetches\ncp %s/moongrad-tiny-dataset_1.0_all.deb .\n"):format(d, d))
    assert(os.execute("chmod +x " .. d .. "/bin/apt-get"))
    write(d .. "/get.lua", [[
      local p = mg.data.debian_file("moongrad-tiny-dataset", "usr/share/datasets/tiny/data.csv")
      print(p, table.concat(mg.data.read_csv(p):reshape{4}:totable(), " "))
      print(pcall(mg.data.debian_file, "moongrad-tiny-dataset", "usr/share/datasets/tiny/none"))
      print(pcall(mg.data.debian_file, "moongrad-absent", "x"))
    ]])
    local cmd = ("PATH=%s/bin:$PATH XDG_CACHE_HOME=%s/cache %s %s/get.lua"):format(d, d, h.bin, d)
    out, code = h.run(cmd)
    assert.equal(0, code, out)
    local where = d .. "/cache/moongrad/debs/moongrad-tiny-dataset/usr/share/datasets/tiny/data.csv"
    assert_has(out, where .. "\t1.0 2.0 3.0 4.0")
    assert_has(out, "debian_file: package moongrad-tiny-dataset (unpacked in " .. d
               .. "/cache/moongrad/debs/moongrad-tiny-dataset) has no file /usr/share/datasets/tiny/none")
    assert_has(out, "debian_file: package moongrad-absent is not installed, and fetching it failed")
    out = h.run(cmd)                                 -- the second time it is in the cache
    assert_has(out, where)
    assert.equal("fetched\n", read(d .. "/fetches"))          -- once
    assert.same({"moongrad-tiny-dataset"}, listdir(d .. "/cache/moongrad/debs"))
  end)

  it("keeps its cache in the user's own directory: without HOME and XDG_CACHE_HOME it refuses", function()
    local d = tmpdir()
    write(d .. "/cache.lua", [[
      print(pcall(mg.data.cache_dir))
      print(pcall(mg.data.debian_file, "moongrad-absent", "x"))
    ]])
    local msg = "no directory for the package cache: XDG_CACHE_HOME and HOME are unset, empty or relative; "
                .. "set XDG_CACHE_HOME to a directory of your own"
    assert(os.execute(("mkdir %s/bin && printf '#!/bin/sh\\nexit 100\\n' > %s/bin/apt-get && chmod +x %s/bin/apt-get")
                      :format(d, d, d)))                  -- should anything try to fetch
    for _, env in ipairs{"-u HOME -u XDG_CACHE_HOME", "HOME= XDG_CACHE_HOME=", "-u HOME XDG_CACHE_HOME=rel/dir"} do
      local out = h.run(("PATH=%s/bin:$PATH env %s %s %s/cache.lua"):format(d, env, h.bin, d))
      assert_has(out, "false\tcache_dir: " .. msg .. "\n")
      assert_has(out, "false\tdebian_file: " .. msg .. "\n")
    end
    local out = h.run(("env HOME=%s XDG_CACHE_HOME=rel/dir %s -e 'print(mg.data.cache_dir())'"):format(d, h.bin))
    assert.equal(d .. "/.cache/moongrad/debs\n", out)
    out = h.run(("env HOME=%s XDG_CACHE_HOME=%s/xdg %s -e 'print(mg.data.cache_dir())'"):format(d, d, h.bin))
    assert.equal(d .. "/xdg/moongrad/debs\n", out)
  end)

  it("reads Fashion-MNIST and the digits when they are here", function()
    local function present (pkg, path)
      local ok, p = pcall(mg.data.debian_file, pkg, path)
      return ok and p
    end
    local cache = mg.data.cache_dir()
    local have_fm = io.open("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")
      or io.open(cache .. "/dataset-fashion-mnist/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")
    local have_digits = io.open("/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz")
      or io.open(cache .. "/python3-sklearn/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz")
    if not (have_fm and have_digits) then
      return pending("dataset-fashion-mnist or python3-sklearn is neither installed nor in " .. cache)
    end
    have_fm:close()
    have_digits:close()
    local _ = present
    local train, test = mg.data.fashion_mnist()
    assert.same({60000, 28, 28}, train.x.shape)
    assert.same({10000}, test.y.shape)
    assert.equal("float32", test.x.dtype)
    assert.equal(255, mg.max(test.x):item())
    assert.same({1, 10}, {mg.min(test.y):item(), mg.max(test.y):item()})
    local x, y = mg.data.digits()
    assert.same({1797, 64}, x.shape)
    assert.same({1797}, y.shape)
    assert.equal(16, mg.max(x):item())
    assert.same({1, 10}, {mg.min(y):item(), mg.max(y):item()})
  end)
end)

-- The parsers' libFuzzer inputs (spec/fuzz/harness/: each reproducer once a
-- finding, and the seeds), replayed through the Lua API: each input made into
-- the file its harness makes (the first byte chooses gzip, dtype, delimiter,
-- header, padding, and for CSV columns and a label: see
-- spec/fuzz/harness/fuzz_*.c), then read. A reader gives
-- a tensor or raises an error that names it and the file, and never crashes
-- (under make asan: no sanitizer report either). The kernel's wire inputs are
-- replayed by build/fuzz_replay_wire in make check; make fuzz fuzzes them all.
local mg = require "moongrad"
local h = require "helpers"

local HERE = "spec/fuzz/harness"

local function files (dir)
  local out = {}
  for name in io.popen("ls -A '" .. dir .. "' 2>/dev/null"):lines() do
    if name:sub(1, 1) ~= "." then out[#out + 1] = dir .. "/" .. name end
  end
  table.sort(out)
  return out
end

local dir
setup(function() dir = h.tempdir() end)
teardown(function() h.remove_tree(dir) end)

-- bytes written to a file (gzipped by gzip(1) when asked); its path
local function as_file (bytes, gz)
  local path = dir .. "/input"
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  if gz then
    assert(os.execute(("gzip -c -n '%s' > '%s.gz'"):format(path, path)))
    path = path .. ".gz"
  end
  return path
end

-- what a reader did: "ok", or its error, which must be "<fn>: '<path>': ..."
local function outcome (fn, path, f, ...)
  local ok, e = pcall(f, ...)
  if ok then return "ok" end
  e = tostring(e)
  assert.truthy(e:find(fn .. ": '" .. path .. "': ", 1, true) == 1, e)
  return e
end

local readers = {
  safetensors = function (bytes)
    local path = as_file(bytes)
    return outcome("load_safetensors", path, mg.load, path)
  end,
  idx = function (bytes)
    local mode = bytes:byte(1) or 0
    local dtype = ({false, "float32", "float64", "int64", "float16", "bfloat16"})[(mode >> 1 & 7) + 1]
    if dtype == nil then return "skipped: a dtype the Lua API refuses itself" end
    local path = as_file(bytes:sub(2), mode & 1 == 1)
    return outcome("read_idx", path, mg.data.read_idx, path, {dtype = dtype or nil})
  end,
  csv = function (bytes)
    local mode, at = bytes:byte(1) or 0, 2
    local o = {header = mode & 2 ~= 0 or nil, delimiter = ({",", ";", "\t", " ", "|", ":", "0", "\n"})[(mode >> 3 & 7) + 1],
               dtype = mode & 4 ~= 0 and "float64" or "float32"}
    if mode & 128 ~= 0 and #bytes >= 2 then             -- the header, columns and a label
      local c, names = bytes:byte(2), {"a", "b", "", "a,b"}
      local k, label = c >> 5 & 3, c >> 3 & 3
      at = 3
      o.header = ({nil, true, false, nil})[(c & 3) + 1]
      o.label = label == 1 and k + 1 or label == 2 and names[k + 1] or label == 3 and 1000000 or nil
      if o.label and c & 4 ~= 0 then o.label_dtype = "int64" end
      if c & 128 ~= 0 then o.columns = {names[(k + 1 & 3) + 1], 1} end
    end
    local text = bytes:sub(at)
    if mode & 64 ~= 0 and #text >= 1 then text = (" "):rep(65535 - text:byte(1)) .. "\n" .. text:sub(2) end
    local path = as_file(text, mode & 1 == 1)
    return outcome("read_csv", path, mg.data.read_csv, path, o)
  end,
}

for _, name in ipairs{"safetensors", "idx", "csv"} do
  describe(name .. " fuzz inputs", function()
    for _, kind in ipairs{"repro", "corpus"} do
      it("of " .. HERE .. "/" .. kind .. "/" .. name .. " are read or refused cleanly", function()
        for _, f in ipairs(files(HERE .. "/" .. kind .. "/" .. name)) do
          local ok, e = pcall(readers[name], h.read(f))
          assert(ok, f .. ": " .. tostring(e))
        end
      end)
    end
  end)
end

describe("the fuzz seeds", function()
  it("are the formats' own files: the plain ones read", function()
    local st = mg.load(as_file(h.read(HERE .. "/corpus/safetensors/mixed")))
    assert.same({2, 2}, st.h.shape)
    assert.equal("ok", readers.idx(h.read(HERE .. "/corpus/idx/gzip-70000")))
    assert.equal("ok", readers.csv(h.read(HERE .. "/corpus/csv/gzip-90k")))
    assert.equal("ok", readers.csv(h.read(HERE .. "/corpus/csv/pad-boundary")))
    assert.same({9000, 3}, mg.data.read_csv(as_file(h.read(HERE .. "/corpus/csv/gzip-90k"):sub(2))).shape)
  end)
end)

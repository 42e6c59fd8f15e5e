-- mg.data.read_csv as a pandas or Keras user meets it (issue 30, item 9):
-- the header's names kept, the header detected or forced, columns picked by
-- name or number, a label column apart (int64 exact), RFC 4180 quotes, and
-- hostile files (BOM, CRLF, NUL, huge fields, a million columns, a header
-- alone) as errors naming the line and the column, or read, never a crash.
local mg = require "moongrad"
local h = require "helpers"

local read_csv = mg.data.read_csv

local dir
setup(function() dir = h.tempdir() end)
teardown(function() h.remove_tree(dir) end)

local n = 0
local function file (text)
  n = n + 1
  local path = dir .. "/f" .. n .. ".csv"
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

-- the message of the error f(...) raises, its "read_csv: '<path>': " cut
local function err (f, path, ...)
  local ok, e = pcall(f, path, ...)
  assert(not ok, "expected an error")
  e = tostring(e)
  local head = "read_csv: '" .. path .. "': "
  return e:sub(1, #head) == head and e:sub(#head + 1) or e
end

local IRIS = "sepal_length,sepal_width,species\n5.5,3.5,0\n4.75,3.0,0\n6.25,3.25,2\n"   -- exact in float32

describe("read_csv's header", function()
  it("is detected: a first line with no number among its fields, and a line after it", function()
    local x, names = read_csv(file(IRIS))
    assert.same({"sepal_length", "sepal_width", "species"}, names)
    assert.same({3, 3}, x.shape)
    assert.same({6.25, 3.25, 2}, x:totable()[3])
    local y, none = read_csv(file("1,2\n3,4\n"))
    assert.same({{1, 2}, {3, 4}}, y:totable())
    assert.is_nil(none)
  end)

  it("is not taken from a first row that has a number (a row with a text column)", function()
    local p = file("5.1,setosa\n4.9,versicolor\n")
    local x, names = read_csv(p, {columns = {1}, dtype = "float64"})
    assert.same({{5.1}, {4.9}}, x:totable())
    assert.is_nil(names)
    assert.equal("line 1, column 2: 'setosa' is not a number (a header line? pass {header = true})", err(read_csv, p))
  end)

  it("is not taken from a file of one line: that is an error that asks whether it is a header", function()
    local p = file("a,b\n")
    assert.equal("line 1, column 1: 'a' is not a number (a header line? pass {header = true})", err(read_csv, p))
    local x, names = read_csv(p, {header = true})
    assert.same({0, 2}, x.shape)
    assert.same({"a", "b"}, names)
  end)

  it("is forced by header = true, even when it holds numbers", function()
    local x, names = read_csv(file("2019,2020\n1,2\n3,4\n"), {header = true})
    assert.same({"2019", "2020"}, names)
    assert.same({{1, 2}, {3, 4}}, x:totable())
  end)

  it("is refused by header = false: a text first line is then an error that suggests {header = true}", function()
    local p = file(IRIS)
    assert.equal("line 1, column 1: 'sepal_length' is not a number (a header line? pass {header = true})",
                 err(read_csv, p, {header = false}))
    local x, names = read_csv(file("1,2\n"), {header = false})
    assert.same({{1, 2}}, x:totable())
    assert.is_nil(names)
  end)

  it("must have as many fields as every row", function()
    local p = file("a,b,c\n1,2,3\n4,5\n")
    assert.equal("line 3 has 2 fields, the header (line 1) has 3 (every row must have as many)", err(read_csv, p))
    assert.equal("line 2 has 2 fields, the header (line 1) has 1 (every row must have as many)",
                 err(read_csv, file("a\n1,2\n")))
  end)

  it("keeps names as written: quoted as RFC 4180, repeated or empty ones too", function()
    local _, names = read_csv(file('"petal, length", "say ""hi""" ,c\n1,2,3\n'))
    assert.same({"petal, length", 'say "hi"', "c"}, names)
    local p = file("a,b,a\n1,2,3\n")
    local x, dup = read_csv(p)
    assert.same({"a", "b", "a"}, dup)
    assert.same({{1, 2, 3}}, x:totable())
    assert.equal("option 'columns', item 1: columns 1 and 3 are both named 'a' (pick one by number)",
                 err(read_csv, p, {columns = {"a"}}))
    assert.same({{3}}, read_csv(p, {columns = {3}}):totable())
    local q = file(",a\n0,1\n1,2\n")                       -- pandas' to_csv writes its index so
    local z, y, rest = read_csv(q, {label = ""})
    assert.same({{1}, {2}}, z:totable())
    assert.same({0, 1}, y:totable())
    assert.same({"a"}, rest)
  end)
end)

describe("read_csv's columns and label", function()
  it("picks columns by name and by number, in the order given, repeats allowed", function()
    local p = file(IRIS)
    local x, names = read_csv(p, {columns = {"species", 1, "species"}})
    assert.same({"species", "sepal_length", "species"}, names)
    assert.same({{0, 5.5, 0}, {0, 4.75, 0}, {2, 6.25, 2}}, x:totable())
  end)

  it("returns features, labels and the features' names with a label, as make_csv_dataset(label_name=)", function()
    local x, y, names = read_csv(file(IRIS), {label = "species", label_dtype = "int64"})
    assert.same({"sepal_length", "sepal_width"}, names)
    assert.same({3, 2}, x.shape)
    assert.equal("int64", y.dtype)
    assert.same({0, 0, 2}, y:totable())
    local ds = mg.data.Dataset(x, y)                  -- ready for a loop or fit
    assert.equal(3, #ds)
    local _, fy = read_csv(file(IRIS), {label = 3, dtype = "float64"})
    assert.equal("float64", fy.dtype)                 -- the label's dtype is dtype unless told
  end)

  it("reads an int64 label exactly: digits beyond 2^53, whole numbers written as floats", function()
    local p = file("x,id\n1,9007199254740993\n2,-9223372036854775808\n3,3.0\n4,1e3\n")
    local _, y = read_csv(p, {label = "id", label_dtype = "int64"})
    assert.same({9007199254740993, math.mininteger, 3, 1000}, y:totable())
    local function bad (value, want)
      assert.equal("line 2, column 2: '" .. value .. "' " .. want,
                   err(read_csv, file("x,id\n1," .. value .. "\n"), {label = "id", label_dtype = "int64"}))
    end
    bad("2.5", "is not an integer (the label is read as int64)")
    bad("nan", "is not an integer (the label is read as int64)")
    bad("9223372036854775808", "is beyond int64's range")
    bad("1e17", "is not exact as a float beyond 2^53 (write the integer's digits)")
    bad("cat", "is not a number")
  end)

  it("leaves the columns not picked unread: they may hold text", function()
    local p = file('id,note,y\n1,"free, text",0\n2,,1\n')
    local x, y, names = read_csv(p, {columns = {"id"}, label = "y", label_dtype = "int64"})
    assert.same({{1}, {2}}, x:totable())
    assert.same({0, 1}, y:totable())
    assert.same({"id"}, names)
    assert.equal("line 2, column 2: 'free, text' is not a number", err(read_csv, p))
  end)

  it("names the known names when a name is unknown, and says when the file has none", function()
    local p = file(IRIS)
    assert.equal("option 'columns', item 2: no column is named 'petal_length'; the header names "
                 .. "'sepal_length', 'sepal_width', 'species'", err(read_csv, p, {columns = {1, "petal_length"}}))
    assert.equal("option 'label': no column is named 'label'; the header names 'sepal_length', 'sepal_width', "
                 .. "'species'", err(read_csv, p, {label = "label"}))
    assert.equal("option 'label': the column 'y' is asked for by name, but the file has no header (pick columns "
                 .. "by number, or pass {header = true})", err(read_csv, file("1,2\n"), {label = "y"}))
    assert.equal("option 'columns', item 1: column 4 is asked for; the file has 3 columns",
                 err(read_csv, p, {columns = {4}}))
  end)

  it("checks the options' types", function()
    local p = file(IRIS)
    local function says (opts, want) assert.truthy(err(read_csv, p, opts):find(want, 1, true), want) end
    says({columns = {}}, "option 'columns' must list at least one column (a name or a number)")
    says({columns = {0}}, "option 'columns', item 1 must be a column's name or its number (from 1), got 0")
    says({columns = {1.5}}, "option 'columns', item 1 must be a column's name or its number (from 1), got 1.5")
    says({columns = "species"}, "option 'columns' must be a table, got string")
    says({label = true}, "option 'label' must be a column's name or its number (from 1), got boolean")
    says({label = "a\0b"}, "option 'label': the name 'a\\0b' contains a NUL byte")
    says({label = 3, label_dtype = "bool"}, "option 'label_dtype' must be float32, float64 or int64, got bool")
    says({label_dtype = "int64"}, "option 'label_dtype' is given without a label")
    says({colums = {1}}, "unknown option 'colums' (did you mean 'columns'?)")
    says({header = "yes"}, "option 'header' must be a boolean")
  end)
end)

describe("read_csv on hostile files", function()
  it("drops a byte order mark and reads CRLF lines, gzipped or not", function()
    local p = file("\xEF\xBB\xBFa;b\r\n1;2\r\n\r\n3;4\r\n")
    local x, names = read_csv(p, {delimiter = ";"})
    assert.same({"a", "b"}, names)
    assert.same({{1, 2}, {3, 4}}, x:totable())
    assert(os.execute("gzip -k '" .. p .. "'"))
    local _, gz = read_csv(p .. ".gz", {delimiter = ";"})
    assert.same(names, gz)
  end)

  it("names line and column for an open quote, text after a quote, an empty field, a NUL byte", function()
    assert.equal("line 2, column 2: the quote is not closed (a quoted field cannot span lines)",
                 err(read_csv, file('a,b\n1,"2\n3"\n')))
    assert.equal("line 2, column 1: text after the closing quote", err(read_csv, file('a,b\n"1"x,2\n')))
    assert.equal("line 2, column 2: the field is empty", err(read_csv, file("a,b\n1,\n")))
    assert.equal("line 1, column 2: the field is empty (a header line? pass {header = true})",
                 err(read_csv, file("1,\n2,3\n")))
    assert.equal("line 2 has a NUL byte (not a text file?)", err(read_csv, file("a,b\n1,\0002\n")))
  end)

  it("shows a huge or binary field cut to 40 bytes, control bytes as '?'", function()
    local big = ("x"):rep(1 << 20)
    assert.equal("line 2, column 1: '" .. ("x"):rep(40) .. "...' is not a number",
                 err(read_csv, file("a\n" .. big .. "\n")))
    assert.equal("line 2, column 1: '1?2' is not a number", err(read_csv, file("a\n1\0272\n")))
  end)

  it("reads a header of a million columns; an unknown name lists a few of them", function()
    local cols = {}
    for i = 1, 1000000 do cols[i] = "c" .. i end
    local p = file(table.concat(cols, ",") .. "\n" .. ("1,"):rep(999999) .. "7\n")
    local x, names = read_csv(p)
    assert.same({1, 1000000}, x.shape)
    assert.equal(1000000, #names)
    assert.equal("c1000000", names[1000000])
    local _, y = read_csv(p, {columns = {1}, label = "c1000000", label_dtype = "int64"})
    assert.same({7}, y:totable())
    local e = err(read_csv, p, {columns = {"c0"}})
    assert.truthy(e:find("^option 'columns', item 1: no column is named 'c0'; the header names 'c1', 'c2', "), e)
    assert.truthy(e:find(", %.%.%. %(1000000 in all%)$"), e)
  end)

  it("gives (0, columns) for a header alone, (0, 0) for an empty file", function()
    local x, names = read_csv(file("a,b,c\n\n"), {header = true})
    assert.same({0, 3}, x.shape)
    assert.same({"a", "b", "c"}, names)
    local _, y = read_csv(file("a,b,c\n"), {header = true, label = "b", label_dtype = "int64"})
    assert.same({0}, y.shape)
    local e, none = read_csv(file(""))
    assert.same({0, 0}, e.shape)
    assert.is_nil(none)
    local _, empty = read_csv(file(""), {header = true})
    assert.same({}, empty)
    assert.equal("option 'label': column 1 is asked for; the file has 0 columns",
                 err(read_csv, file(""), {label = 1}))
  end)

  it("leaves no tensor behind when it fails, even for want of memory with a label", function()
    local p = file(IRIS)
    local failures, before, after = h.oom_sweep(function()
      local x, y = read_csv(p, {label = "species", label_dtype = "int64"})
      return x.shape[1] + y.shape[1]
    end, 10)
    assert.truthy(failures >= 2)
    assert.equal(before.live_tensors, after.live_tensors)
    local live = h.live()
    for _ = 1, 20 do pcall(read_csv, file("a,b\n1,x\n"), {label = "a"}) end
    assert.equal(live, h.live())
  end)
end)

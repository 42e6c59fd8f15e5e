-- The README and the pages of docs/ as a reader meets them: every ```lua block
-- runs as written, each alone, in a fresh moongrad process, in an empty directory
-- (some write files); every relative link leads to a file, and to a heading of it
-- when it names one; the README stays short enough to read in ten minutes.
local h = require "helpers"

local function read (path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("a")
  f:close()
  return text
end

-- README.md, then docs/README.md (the index), then the other pages by name
local function files ()
  local out = {"README.md", "docs/README.md"}
  local p = assert(io.popen("ls docs/*.md"))
  for path in p:lines() do
    if path ~= "docs/README.md" then out[#out + 1] = path end
  end
  p:close()
  return out
end

-- the ```lua blocks of a text, also indented ones (inside a list item), with the
-- line of their first line of code
local function blocks (text)
  local out, pos = {}, 1
  while true do
    local s, e, indent, body = text:find("\n( *)```lua\n(.-)\n%1```", pos)
    if not s then break end
    local _, line = text:sub(1, s):gsub("\n", "")
    if #indent > 0 then
      body = ("\n" .. body):gsub("\n" .. indent, "\n"):sub(2)
    end
    out[#out + 1] = {line = line + 2, body = body}
    pos = e
  end
  return out
end

local function run_block (path, b)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local f = assert(io.open(dir .. "/block.lua", "w"))
  f:write(b.body, "\n")
  f:close()
  local bin = h.bin:sub(1, 1) == "/" and h.bin or os.getenv("PWD") .. "/" .. h.bin
  -- Open MPI's singleton init leaves allocations in plugins it unloads (spec/30)
  local env = b.body:find("mg.distributed", 1, true) and 'ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" ' or ""
  local out, code = h.run(("cd %s && %s%s block.lua"):format(dir, env, bin))
  os.execute("rm -rf " .. dir)
  assert.equal(0, code, ("%s line %d:\n%s"):format(path, b.line, out))
end

-- the text without its fenced code blocks
local function unfenced (text)
  return (("\n" .. text):gsub("\n( *)```.-\n%1```", "\n"))
end

-- the text without code, where brackets are not links
local function prose (text)
  return (unfenced(text):gsub("``.-``", ""):gsub("`[^`\n]*`", ""))
end

-- GitHub's anchors: lower case, punctuation dropped but - and _, spaces as -,
-- a repeated heading numbered (-1, -2, ...)
local function anchors (text)
  local out, seen = {}, {}
  for heading in unfenced(text):gmatch("\n#+ ([^\n]+)") do
    local slug = heading:lower():gsub("[^%w%s%-_]", ""):gsub("%s", "-")
    if seen[slug] then
      seen[slug] = seen[slug] + 1
      out[slug .. "-" .. seen[slug]] = true
    else
      seen[slug] = 0
      out[slug] = true
    end
  end
  return out
end

local function dirname (path)
  return path:match("^(.*)/[^/]*$") or "."
end

-- a/b/../c -> a/c
local function normalize (path)
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." and #parts > 0 and parts[#parts] ~= ".." then
      parts[#parts] = nil
    elseif part ~= "." then
      parts[#parts + 1] = part
    end
  end
  return table.concat(parts, "/")
end

local function exists (path)
  local f = io.open(path, "rb")   -- a directory opens too
  if f then f:close() end
  return f ~= nil
end

-- the broken relative links of the file at path, as messages
local function broken_links (path)
  local bad = {}
  for target in prose(read(path)):gmatch("%]%(([^)%s]+)%)") do
    if not target:find("^%a[%w+.-]*:") then   -- http:, https:, mailto: are not checked
      local file, anchor = target:match("^([^#]*)#?(.*)$")
      local resolved = file == "" and path or normalize(dirname(path) .. "/" .. file)
      if not exists(resolved) then
        bad[#bad + 1] = ("%s: %s: no file %s"):format(path, target, resolved)
      elseif anchor ~= "" and resolved:find("%.md$") and not anchors(read(resolved))[anchor] then
        bad[#bad + 1] = ("%s: %s: %s has no heading #%s"):format(path, target, resolved, anchor)
      end
    end
  end
  return bad
end

describe("README.md", function()
  it("is under 400 lines: what a newcomer needs, the rest in docs/", function()
    local _, lines = read("README.md"):gsub("\n", "")
    assert.is_true(lines < 400, ("README.md has %d lines"):format(lines))
  end)

  it("links to the index of docs/, which links to every page", function()
    assert.truthy(read("README.md"):find("(docs/README.md)", 1, true))
    local index = read("docs/README.md")
    for _, path in ipairs(files()) do
      local name = path:match("^docs/(.+)$")
      if name and name ~= "README.md" then
        assert.truthy(index:find("(" .. name .. ")", 1, true), "docs/README.md does not list " .. name)
      end
    end
  end)

  it("has Lua blocks in its pages", function()
    local n = 0
    for _, path in ipairs(files()) do n = n + #blocks(read(path)) end
    assert.is_true(n >= 15, n .. " blocks")
  end)
end)

for _, path in ipairs(files()) do
  describe(path, function()
    it("has no dead relative links", function()
      assert.same({}, broken_links(path))
    end)

    for _, b in ipairs(blocks(read(path))) do
      it(("runs the Lua block at %s:%d"):format(path, b.line), function()
        run_block(path, b)
      end)
    end
  end)
end

-- The README's Lua blocks run as written: each ```lua block, alone, in a fresh
-- moongrad process, in an empty directory (some write files).
local h = require "helpers"

local function blocks ()
  local f = assert(io.open("README.md"))
  local text = f:read("a")
  f:close()
  local out, pos = {}, 1
  while true do
    local s, e, body = text:find("\n```lua\n(.-)\n```", pos)
    if not s then break end
    local _, line = text:sub(1, s):gsub("\n", "")
    out[#out + 1] = {line = line + 2, body = body}
    pos = e
  end
  return out
end

describe("README.md", function()
  local list = blocks()

  it("has Lua blocks", function()
    assert.is_true(#list >= 9, #list .. " blocks")
  end)

  for _, b in ipairs(list) do
    it(("runs the Lua block at line %d"):format(b.line), function()
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
      assert.equal(0, code, ("README.md line %d:\n%s"):format(b.line, out))
    end)
  end
end)

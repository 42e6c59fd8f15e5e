-- The floors of the C code (docs/design.md, "The layers of the code"): core <- ops <-
-- autodiff. A floor calls only into the floors below it; what goes the other
-- way (a variable read, an allocation under a memory budget) goes through a
-- hook the upper floor installs in the context.

-- the non-static functions defined in the C files of a folder
local function defined (folder)
  local names = {}
  local p = io.popen("ls " .. folder .. "/*.c")
  for path in p:lines() do
    local f = assert(io.open(path))
    for line in f:lines() do
      if line:match("^[%a_]") and not line:match("^static") and not line:match("^typedef") then
        local name = line:match("[%s%*](mg_[%w_]+) %(")
        if name then names[name] = path end
      end
    end
    f:close()
  end
  p:close()
  return names
end

-- the C source of path without its comments
local function code_of (path)
  local f = assert(io.open(path))
  local s = f:read("a")
  f:close()
  return (s:gsub("/%*.-%*/", " "):gsub("//[^\n]*", " "))
end

-- the names of `names` that the files of `paths` call or mention
local function used (paths, names)
  local hits = {}
  for _, path in ipairs(paths) do
    local code = code_of(path)
    for word in code:gmatch("mg_[%w_]+") do
      if names[word] then hits[#hits + 1] = path .. " -> " .. word .. " (" .. names[word] .. ")" end
    end
  end
  table.sort(hits)
  return hits
end

local function core_files ()
  local list = {}
  local p = io.popen("ls src/core/*.c")
  for path in p:lines() do list[#list + 1] = path end
  p:close()
  return list
end

describe("the floors of the C code", function()
  it("no core file (src/core/) names a function of the ops or of autodiff", function()
    local above = defined("src/ops")
    for name, path in pairs(defined("src/autodiff")) do above[name] = path end
    assert.same({}, used(core_files(), above))
  end)

  it("no op file (src/ops/) names a function of autodiff: ops reach the tapes through the dispatcher's hooks", function()
    local list = {}
    local p = io.popen("ls src/ops/*.c")
    for path in p:lines() do list[#list + 1] = path end
    p:close()
    assert.same({}, used(list, defined("src/autodiff")))
  end)

  it("no core file reads or writes the state the tapes keep in the context", function()
    local touched = {}
    for _, path in ipairs(core_files()) do
      local code = code_of(path)
      for field in code:gmatch("[%.>](tapes)[%.%s]") do touched[#touched + 1] = path .. ": " .. field end
      for field in code:gmatch("[%.>](replay)[%.%s]") do touched[#touched + 1] = path .. ": " .. field end
      for field in code:gmatch("[%.>](dtr)[^_%w]") do touched[#touched + 1] = path .. ": " .. field end
    end
    assert.same({}, touched)
  end)

  it("each floor includes only the headers of the floors below it", function()
    local above = {           -- folder -> the folders above it
      core = {"ops", "autodiff", "io", "dist", "lua", "cli", "kernel"},
      ops = {"autodiff", "io", "dist", "lua", "cli", "kernel"},
      autodiff = {"io", "dist", "lua", "cli", "kernel"},
      io = {"lua", "cli", "kernel"},
    }
    local wrong = {}
    for floor, higher in pairs(above) do
      local p = io.popen("ls src/" .. floor .. "/*.c src/" .. floor .. "/*.h 2>/dev/null")
      for path in p:lines() do
        local code = code_of(path)
        for inc in code:gmatch('#include "([^"]+)"') do
          for _, h in ipairs(higher) do
            if inc:match("^" .. h .. "/") then wrong[#wrong + 1] = path .. " includes " .. inc end
          end
          if inc == "moongrad_impl.h" then wrong[#wrong + 1] = path .. " includes " .. inc end
        end
      end
      p:close()
    end
    table.sort(wrong)
    assert.same({}, wrong)
  end)

  -- the binding's files call one another one way too (the circle lauxmg.c ->
  -- lmemory.c -> ltidy.c -> lauxmg.c is gone): file A needs file B when A
  -- names a function B defines; the graph has no cycle
  it("the binding's files (src/lua/) need one another without a circle", function()
    local defs = {}
    local p = io.popen("ls src/lua/*.c")
    local files = {}
    for path in p:lines() do files[#files + 1] = path end
    p:close()
    for _, path in ipairs(files) do
      for line in io.lines(path) do
        local name = not line:match("^static") and line:match("^[%a_][%w_%s%*]-[%s%*](mgL_[%w_]+) %(")
        if name then defs[name] = path end
      end
    end
    local needs = {}
    for _, path in ipairs(files) do
      needs[path] = {}
      for word in code_of(path):gmatch("mgL_[%w_]+") do
        local owner = defs[word]
        if owner and owner ~= path then needs[path][owner] = true end
      end
    end
    local state, circle = {}, nil
    local function visit (f, trail)
      if state[f] == "done" or circle then return end
      if state[f] == "open" then circle = table.concat(trail, " -> ") .. " -> " .. f return end
      state[f] = "open"
      trail[#trail + 1] = f
      local next = {}
      for g in pairs(needs[f]) do next[#next + 1] = g end
      table.sort(next)
      for _, g in ipairs(next) do visit(g, trail) end
      trail[#trail] = nil
      state[f] = "done"
    end
    for _, f in ipairs(files) do visit(f, {}) end
    assert.is_nil(circle)
  end)
end)

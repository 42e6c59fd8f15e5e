-- bench/assemble.lua: bench/RESULTS.md from every machine kind's section
-- (bench/results/*.md, written by make bench on that machine) and the
-- reading notes (bench/NOTES.md).   lua5.4 bench/assemble.lua
local function read (path)
  local f = assert(io.open(path))
  local s = f:read("a")
  f:close()
  return s
end

local names = {}
local p = io.popen("ls bench/results/*.md 2>/dev/null")
for line in p:lines() do names[#names + 1] = line end
p:close()
table.sort(names)

local out = {"# moongrad benchmark results\n\n",
  "One section per kind of machine the project runs on (the CPU model and ISA in its heading), each\n",
  "written by `make bench` on that machine (`bench/run.sh`); the notes after them read the figures.\n\n"}
for _, name in ipairs(names) do out[#out + 1] = read(name):gsub("%s*$", "\n\n") end
out[#out + 1] = read("bench/NOTES.md")
local f = assert(io.open("bench/RESULTS.md", "w"))
f:write(table.concat(out))
f:close()
print("wrote bench/RESULTS.md from " .. #names .. " machine section(s)")

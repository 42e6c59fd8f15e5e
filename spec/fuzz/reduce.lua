-- spec/fuzz/reduce.lua: minimises a fuzz finding.
--
--   lua5.4 spec/fuzz/reduce.lua PROG.lua [BIN] > min.lua
--
-- Runs spec/fuzz/check.sh on PROG for its signature, then deletes lines
-- (halves, quarters, ... single lines), then the '; '-separated pieces inside
-- each line, then shortens pieces, keeping every change after which
-- check.sh still prints the same signature. Candidates that do not parse are
-- skipped without running. Run from the repository root. FUZZ_TIMEOUT
-- (check.sh's) bounds each run; for a hang, 10 is plenty.
local prog, bin = arg[1], arg[2] or os.getenv("FUZZ_BIN") or "build-asan/moongrad"
if not prog then io.stderr:write("usage: lua5.4 spec/fuzz/reduce.lua PROG.lua [BIN]\n") os.exit(2) end

local function read (path)
  local f = assert(io.open(path))
  local s = f:read("a")
  f:close()
  return s
end

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)
local file = dir .. "/prog.lua"
local runs = 0

local function signature (src)
  local f = assert(io.open(file, "w"))
  f:write(src)
  f:close()
  runs = runs + 1
  local p = io.popen(("FUZZ_TMP=%s bash spec/fuzz/check.sh %s %s"):format(dir, file, bin))
  local out = p:read("a"):gsub("%s+$", "")
  p:close()
  return out
end

local lines = {}
for l in read(prog):gmatch("[^\n]+") do lines[#lines + 1] = l end
local target = signature(table.concat(lines, "\n") .. "\n")
io.stderr:write("reduce: target signature: ", target, "\n")
if target:match("^ok") then
  io.stderr:write("reduce: the program does not reproduce a finding\n")
  os.exit(1)
end

local function join (ls) return table.concat(ls, "\n") .. "\n" end

local function still (ls)
  local src = join(ls)
  if not load(src) then return false end
  return signature(src) == target
end

-- phase 1: whole lines, in chunks of shrinking size
local n = math.max(1, #lines // 2)
while n >= 1 do
  local i, changed = 1, false
  while i <= #lines do
    local cand = {}
    for k = 1, #lines do if k < i or k >= i + n then cand[#cand + 1] = lines[k] end end
    if #cand < #lines and still(cand) then
      lines = cand
      changed = true
    else
      i = i + n
    end
  end
  if not changed or n == 1 then n = n // 2 end
end
io.stderr:write(("reduce: %d lines after phase 1 (%d runs)\n"):format(#lines, runs))

-- phase 2: pieces of a line: split at '; ' and drop pieces one at a time
local function pieces (l)
  local out = {}
  for p in (l .. "; "):gmatch("(.-); ") do out[#out + 1] = p end
  return out
end

for li = 1, #lines do
  local ps = pieces(lines[li])
  local k = 1
  while #ps > 1 and k <= #ps do
    local cand = {}
    for j = 1, #ps do if j ~= k then cand[#cand + 1] = ps[j] end end
    local try = {table.unpack(lines)}
    try[li] = table.concat(cand, "; ")
    if still(try) then
      lines = try
      ps = cand
    else
      k = k + 1
    end
  end
end

-- phase 3: simpler argument lists: replace a V[i] by V[1], drop `, opts` tails
for li = 1, #lines do
  local l = lines[li]
  for _, pat in ipairs{", {[^{}]*}%)", ", [^,()]+%)"} do
    local s, e = l:find(pat)
    while s do
      local cand = l:sub(1, s - 1) .. ")" .. l:sub(e + 1)
      local try = {table.unpack(lines)}
      try[li] = cand
      if still(try) then lines, l = try, cand; s, e = l:find(pat, s)
      else s, e = l:find(pat, e + 1) end
    end
  end
end

io.stderr:write(("reduce: %d lines, %d runs\n"):format(#lines, runs))
io.write(join(lines))
os.execute("rm -rf " .. dir)

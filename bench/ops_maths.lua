-- bench/ops_maths.lua: the ops of src/ops/maths.c at one large size, next
-- to PyTorch's time on the same size and thread count (bench/ops_maths_peer.py,
-- run with /usr/bin/python3 when it has torch; otherwise moongrad's figures
-- alone). Each round times every case on both sides, moongrad then PyTorch,
-- as the median of `reps` runs after a warm-up; the table shows the median
-- over the rounds.
--   build/moongrad bench/ops_maths.lua [reps] [threads] [rounds]   (from the project root)
-- Elementwise ops run on 4M float32 values, reductions along each axis of a
-- 2048x2048 float32 matrix. GB/s counts the bytes read and written once.
-- Both sides run with the same number of threads (moongrad's default unless
-- given); on a machine busy with other work, 1 thread gives steadier figures
-- (a parallel loop otherwise waits for a core now and then).
local mg = mg or require "moongrad"

local median = require("bench.util").median

local REPS = tonumber(arg and arg[1]) or 11
if arg and arg[2] then mg.set_num_threads(tonumber(arg[2])) end
local ROUNDS = tonumber(arg and arg[3]) or 3
local PY = "/usr/bin/python3"
local N, SIDE = 4 * 1024 * 1024, 2048

-- the cases, in the order the peer prints them: name, input, function, bytes moved
local function cases ()
  mg.random.seed(0)
  local x = mg.random.uniform({N}, -0.9, 0.9)                -- inside log1p's domain
  local m = mg.random.uniform({SIDE, SIDE}, -1, 1)
  local mp = mg.random.uniform({SIDE, SIDE}, 0.999, 1.001)   -- products stay normal numbers
  local ew = 2 * 4 * N                                       -- read x, write out
  local list = {}
  local function add (name, input, fn, bytes) list[#list + 1] = {name = name, x = input, fn = fn, bytes = bytes} end
  for _, op in ipairs({"sin", "cos", "log1p", "expm1", "erf", "floor", "ceil", "round"}) do
    add(op, x, mg[op], ew)
  end
  add("clamp", x, function(v) return mg.clamp(v, -0.5, 0.5) end, ew)
  local red = 4 * SIDE * SIDE + 4 * SIDE                     -- read the matrix, write a row
  for _, axis in ipairs({2, 1}) do
    local tag = axis == 2 and "(rows)" or "(columns)"
    add(("prod axis %d %s"):format(axis, tag), mp, function(v) return mg.prod(v, axis) end, red)
    add(("logsumexp axis %d %s"):format(axis, tag), m, function(v) return mg.logsumexp(v, axis) end, red)
    add(("var axis %d %s"):format(axis, tag), m, function(v) return mg.var(v, axis) end, red)
    add(("std axis %d %s"):format(axis, tag), m, function(v) return mg.std(v, axis) end, red)
    add(("norm axis %d %s"):format(axis, tag), m, function(v) return mg.norm(v, axis) end, red)
    add(("cumsum axis %d %s"):format(axis, tag), m, function(v) return mg.cumsum(v, axis) end, 2 * 4 * SIDE * SIDE)
  end
  return list
end

-- median seconds of REPS calls of fn(x), after one warm-up call
local function timed (fn, x)
  fn(x)
  local ts = {}
  for r = 1, REPS do
    local t0 = mg.clock()
    local _ = fn(x)
    ts[r] = mg.clock() - t0
  end
  return median(ts)
end

local function sh (cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  return out, p:close()
end

local threads = mg.get_num_threads()
local list = cases()
local has_torch = select(2, sh(PY .. " -c 'import torch'"))
local mine, theirs, torch_version = {}, {}, nil
for _ = 1, ROUNDS do
  for i, c in ipairs(list) do
    mine[i] = mine[i] or {}
    table.insert(mine[i], timed(c.fn, c.x))
  end
  if has_torch then
    local out, ok = sh(("%s bench/ops_maths_peer.py %d %d"):format(PY, threads, REPS))
    if not ok then error("bench/ops_maths.lua: the PyTorch peer failed:\n" .. out) end
    for line in out:gmatch("[^\n]+") do
      local name, ms = line:match("^(.-)\t([%d.]+)$")
      if name then
        theirs[name] = theirs[name] or {}
        table.insert(theirs[name], tonumber(ms) / 1e3)
      end
      torch_version = torch_version or line:match("^torch (%S+)")
    end
  end
end
for i in ipairs(list) do mine[i] = median(mine[i]) end
for name, ts in pairs(theirs) do theirs[name] = median(ts) end

print(("%s vs PyTorch %s, %d thread%s, medians of %d runs, median of %d rounds"):format(mg.version,
      torch_version or "(not available: moongrad alone)", threads, threads > 1 and "s" or "", REPS, ROUNDS))
print("elementwise: 4M float32 (4194304); reductions: a 2048x2048 float32 matrix\n")
print("| op | moongrad ms | GB/s | PyTorch ms | GB/s | moongrad / PyTorch |")
print("|---|---|---|---|---|---|")
for i, c in ipairs(list) do
  local t, p = mine[i], theirs[c.name]
  print(("| %s | %.3f | %.1f | %s | %s | %s |"):format(c.name, t * 1e3, c.bytes / t / 1e9,
        p and ("%.3f"):format(p * 1e3) or "-", p and ("%.1f"):format(c.bytes / p / 1e9) or "-",
        p and ("%.2fx"):format(t / p) or "-"))
end

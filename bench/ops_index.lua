-- bench/ops_index.lua: the indexing, sorting and rearranging ops at one
-- large size each, medians of several runs, GB/s for the memory-bound ones
-- (bytes read + written once), next to PyTorch on the same sizes and the
-- same thread count when /usr/bin/python3 has torch (bench/ops_index_peer.py).
--   build/moongrad bench/ops_index.lua [reps]     (default 9 runs per op)
--   build/moongrad bench/ops_index.lua quick      (tiny sizes, no peer: a smoke test)
local mg = mg or require "moongrad"

local quick = arg and arg[1] == "quick"
local REPS = quick and 1 or tonumber(arg and arg[1]) or 9
local PY = "/usr/bin/python3"
local median = require("bench.util").median

-- the sizes (the peer uses the same ones: keep in step with ops_index_peer.py)
local N1 = quick and 1000 or 1 << 20          -- sort: one row of 1M float32
local R, C = 1024, 1024                      -- sort/topk: rows
local S = quick and 64 or 2048               -- (S, S) = 4M float32 for the memory-bound ops
local B, H, Q, D = 8, 8, 256, 64             -- einsum "bhqd,bhkd->bhqk"
if quick then R, C, B, H, Q, D = 8, 64, 1, 2, 8, 4 end

-- median seconds of REPS timings of fn, after one warm-up call
local function timed (fn)
  fn()
  local ts = {}
  for r = 1, REPS do
    collectgarbage()
    local t0 = mg.clock()
    fn()
    ts[r] = mg.clock() - t0
  end
  return median(ts)
end

mg.random.seed(0)
local x1 = mg.random.uniform({N1}, 0, 1)
local xr = mg.random.uniform({R, C}, 0, 1)
local xs = mg.random.uniform({S, S}, 0, 1)
local idx = mg.cast(mg.random.uniform({S, S}, 1, S + 1) // 1, "int64")     -- 1-based
local mask = mg.greater(mg.random.uniform({S, S}, 0, 1), 0.5)
local q, k = mg.random.normal{B, H, Q, D}, mg.random.normal{B, H, Q, D}
local vals = mg.random.uniform({S, S}, 0, 1)

local f32, i64 = 4, 8
local cases = {   -- name, function, bytes moved (nil: not memory-bound), flops
  {"sort 1M float32", function() return mg.sort(x1) end},
  {"argsort 1M float32", function() return mg.argsort(x1) end},
  {"sort (1024,1024) rows", function() return mg.sort(xr) end},
  {"topk k=100 of 1M", function() return mg.topk(x1, 100) end},
  {"topk k=16 of (1024,1024) rows", function() return mg.topk(xr, 16) end},
  {"einsum bhqd,bhkd->bhqk 8,8,256,64", function() return mg.einsum("bhqd,bhkd->bhqk", q, k) end,
   nil, 2 * B * H * Q * Q * D},
  {"tile (2048,2048) by {1,2}", function() return mg.tile(xs, {1, 2}) end, 3 * S * S * f32},
  {"pad (2048,2048) by 1, constant", function() return mg.pad(xs, 1) end, 2 * S * S * f32},
  {"pad (2048,2048) by 1, reflect", function() return mg.pad(xs, 1, {mode = "reflect"}) end, 2 * S * S * f32},
  {"flip (2048,2048) axis 2 (a view)", function() return mg.flip(xs, 2) end},
  {"flip axis 2, then a copy", function() return mg.flip(xs, 2):reshape{-1} end, 2 * S * S * f32},
  {"repeat_interleave (2048,2048) x2 axis 2", function() return mg.repeat_interleave(xs, 2, 2) end, 3 * S * S * f32},
  {"take_along_axis (2048,2048) axis 2", function() return mg.take_along_axis(xs, idx, 2) end,
   S * S * (2 * f32 + i64)},
  {"put_along_axis add (2048,2048) axis 2", function() return mg.put_along_axis(xs, idx, vals, 2, {mode = "add"}) end,
   S * S * (3 * f32 + i64)},
  {"tril (2048,2048)", function() return mg.tril(xs) end, 2 * S * S * f32},
  {"masked_fill (2048,2048)", function() return mg.masked_fill(xs, mask, 0) end, S * S * (2 * f32 + 1)},
}

-- the peer's times, by case name (ms); none when torch is missing
local peer = {}
local has_torch = false
if not quick then
  local p = io.popen(PY .. " -c 'import torch' 2>/dev/null && echo yes")
  has_torch = p:read("a"):match("yes") ~= nil
  p:close()
  if has_torch then
    p = io.popen(("OMP_NUM_THREADS=%d %s bench/ops_index_peer.py %d 2>&1"):format(mg.get_num_threads(), PY, REPS))
    for line in p:lines() do
      local name, ms = line:match("^(.-)\t([%d.]+)$")
      if name then peer[name] = tonumber(ms) end
    end
    p:close()
  end
end

print(("moongrad %s, %d thread%s, medians of %d runs%s"):format(mg.version, mg.get_num_threads(),
      mg.get_num_threads() > 1 and "s" or "", REPS,
      (quick or has_torch) and "" or " (PyTorch not available: moongrad alone)"))
print(("| %-40s | %10s | %8s | %10s | %6s |"):format("op", "moongrad", "GB/s", "PyTorch", "ratio"))
print(("|%s|%s|%s|%s|%s|"):format(("-"):rep(42), ("-"):rep(12), ("-"):rep(10), ("-"):rep(12), ("-"):rep(8)))
for _, cs in ipairs(cases) do
  local name, fn, bytes, flops = cs[1], cs[2], cs[3], cs[4]
  local s = timed(fn)
  local rate = bytes and ("%.1f"):format(bytes / s / 1e9) or flops and ("%.0f GF"):format(flops / s / 1e9) or "-"
  local theirs = peer[name]
  print(("| %-40s | %7.3f ms | %8s | %s | %6s |"):format(name, s * 1e3, rate,
        theirs and ("%7.3f ms"):format(theirs) or ("%10s"):format("-"),
        theirs and theirs > 0 and ("%.2fx"):format(s * 1e3 / theirs) or "-"))
end

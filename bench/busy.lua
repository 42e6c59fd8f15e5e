-- bench/busy.lua: training steps on a machine other processes keep busy.
-- A thread team waits for its slowest thread at every parallel region, so
-- when busy processes hold the cores a team can make a step many times
-- slower than one thread would. moongrad's default ("auto") threads use the
-- machine's cores and drop to one while others hold them (src/core/threads.c).
-- Each step runs at the default, at one thread and at a fixed team of every
-- core (OMP_NUM_THREADS), on an idle machine and beside as many busy loops as
-- the machine has cores; each round runs every case as a fresh process, in
-- turn; a figure is the median over rounds. The targets: beside the busy
-- loops, the default within 1.2x of one thread; idle, no slower than one
-- thread, and a large step as fast as the fixed team.
--   build/moongrad bench/busy.lua [rounds] [quick]
local mg = mg or require "moongrad"
local util = require "bench.util"
local median, sh = util.median, util.sh

local ROUNDS = tonumber(arg and arg[1]) or 3
local QUICK = arg and arg[2] == "quick"
local BIN = arg and arg[-1] or "build/moongrad"
local CORES = tonumber(sh("nproc")) or 2

-- name, size, command (THREADS: a count or "auto"), how to read its ms
local CASES = {
  {"fit 20-256-10, batch 32, Adam", "small", "bench/cases.lua fit_small", "^([%d.]+)"},
  {"MLP 784-1024-1024-10, batch 32", "small", "bench/cases.lua mlp 32", "^([%d.]+)"},
  {"MLP 784-1024-1024-10, batch 128", "medium", "bench/cases.lua mlp 128", "^([%d.]+)"},
  {"tanh chain, 8 layers of 512, batch 64", "medium", "bench/cases.lua ckpt plain 512 64 8 21", "^([%d.]+)"},
  {"CNN step, Fashion-MNIST, batch 128", "medium", "bench/conv.lua worker THREADS 5", "CNN step[^\t]*\t([%d.]+)"},
  {"GPT step (4 blocks, width 256, batch 32)", "large", "bench/gpt.lua worker plain THREADS 3", "step\t([%d.]+)"},
}
if QUICK then CASES = {CASES[1], CASES[2]} end

local SETTINGS = {   -- name, environment, THREADS
  {"default", "", "auto"},
  {"one thread", "OMP_NUM_THREADS=1 ", "1"},
  {("fixed %d"):format(CORES), ("OMP_NUM_THREADS=%d "):format(CORES), tostring(CORES)},
}

local function step_ms (case, setting)
  local cmd = ("%s%s %s 2>&1"):format(setting[2], BIN, case[3]:gsub("THREADS", setting[3]))
  local out = sh(cmd)
  local ms = tonumber(out:match(case[4]) or out:match("\n" .. case[4]:gsub("^%^", "")))
  if not ms then error(("bench/busy.lua: no time from `%s`:\n%s"):format(cmd, out)) end
  return ms
end

-- busy loops: shells spinning until killed
local function start_busy (n)
  local pids = {}
  for i = 1, n do
    pids[i] = sh("sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!"):match("%d+")
  end
  return pids
end
local function stop_busy (pids)
  if #pids > 0 then os.execute("kill " .. table.concat(pids, " ") .. " 2>/dev/null") end
end

local model, isa = util.machine()
print(("### Steps on a busy machine: %s (%s, %d cores)"):format(model, isa, CORES))
print()
print(("Median ms per step over %d rounds of fresh processes; the settings alternate within a round. "
       .. "`default` is moongrad's automatic team, `one thread` OMP_NUM_THREADS=1, `fixed %d` "
       .. "OMP_NUM_THREADS=%d. Command: `build/moongrad bench/busy.lua %d`."):format(ROUNDS, CORES, CORES, ROUNDS))
print()
print(("| busy loops | step | size | default | one thread | fixed %d | default / one | target |"):format(CORES))
print("|---|---|---|---|---|---|---|---|")
for _, load in ipairs{0, CORES} do
  for _, case in ipairs(CASES) do
    local ts = {}
    for i = 1, #SETTINGS do ts[i] = {} end
    local pids = start_busy(load)
    local ok, err = pcall(function()
      for r = 1, ROUNDS do
        for i, setting in ipairs(SETTINGS) do ts[i][r] = step_ms(case, setting) end
      end
    end)
    stop_busy(pids)
    if not ok then error(err, 0) end
    local m = {}
    for i = 1, #SETTINGS do m[i] = median(ts[i]) end
    local ratio = m[1] / m[2]
    local target = load > 0 and (case[2] ~= "large" and "<= 1.20x" or "-")
                   or (case[2] == "large" and ("<= %.2fx (fixed %d)"):format(m[3] / m[2], CORES) or "<= 1.00x")
    print(("| %d | %s | %s | %.3f | %.3f | %.3f | %.2fx | %s |"):format(load, case[1], case[2], m[1], m[2], m[3],
                                                                     ratio, target))
    io.stdout:flush()
  end
end

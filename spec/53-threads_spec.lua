-- Threads on a busy machine (issue 30, item 2): by default the team is the
-- machine's cores and drops to one thread while other processes hold them
-- (src/core/threads.c); it changes only between steps, never while a tape
-- keeps nodes; a count that was set stays. The speed itself is a benchmark
-- (bench/busy.lua), not a timed test: these check the mechanism, in child
-- processes beside busy loops.
local h = require "helpers"
local mg = require "moongrad"

local CORES = tonumber((h.run("nproc"))) or 1

local function run_script (code, env)
  return h.run_script(code, nil, env or "env -u OMP_NUM_THREADS")
end

-- runs fn with as many busy loops beside as the machine has cores
local function beside_busy_loops (fn)
  local pids = {}
  for i = 1, CORES do pids[i] = h.run("sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!"):match("%d+") end
  local ok, err = pcall(fn)
  os.execute("kill " .. table.concat(pids, " ") .. " 2>/dev/null")
  if not ok then error(err, 0) end
end

describe("the thread count", function()
  it("is the machine's, automatic, unless one was set", function()
    local out = run_script([[
local mg = require "moongrad"
print(mg.get_num_threads())
mg.set_num_threads(1)
print(mg.get_num_threads())
mg.set_num_threads("auto")
print(mg.get_num_threads())
]])
    local n = CORES
    assert.equal(("%d\tauto\t%d\n1\tfixed\t1\n%d\tauto\t%d\n"):format(n, n, n, n), out)
    out = run_script('local mg = require "moongrad"; print(mg.get_num_threads())', "env OMP_NUM_THREADS=3")
    assert.equal("3\tfixed\t3\n", out)
  end)

  it("is checked", function()
    local was, mode = mg.get_num_threads()
    assert.has_error(function() mg.set_num_threads("fast") end,
                     "bad argument #1 to 'set_num_threads' (a thread count or \"auto\", got \"fast\")")
    assert.has_error(function() mg.set_num_threads() end)
    assert.has_error(function() mg.set_num_threads(2, 3) end)
    assert.equal(was, (mg.get_num_threads()))
    assert.equal(mode, select(2, mg.get_num_threads()))
  end)
end)

describe("beside busy processes", function()
  local it_multi = CORES > 1 and it or pending

  it_multi("the automatic team drops to one thread, between steps only", function()
    beside_busy_loops(function()
      local out, status = run_script([[
local mg = require "moongrad"
local function team () return select(3, mg.get_num_threads()) end
local a = mg.random.normal{192, 192}
local w = mg.Variable(mg.random.normal{192, 192})
-- a step kept open for half a second: its tape keeps nodes, the team stays
local t = mg.tape()
local y = mg.matmul(a, w)
local teams, t0 = {}, mg.clock()
while mg.clock() - t0 < 0.5 do
  y = mg.tanh(mg.matmul(y, w)) * 0.5
  teams[team()] = true
end
local seen = {}
for k in pairs(teams) do seen[#seen + 1] = k end
print("during", table.concat(seen, ","))
local g = t:gradient(mg.sum(y), w)
-- the step is over: ops that no tape records may find the cores taken
t0 = mg.clock()
while team() > 1 and mg.clock() - t0 < 10 do local _ = mg.matmul(a, a) end
print("after", team(), (select(2, mg.get_num_threads())))
]])
      assert.equal(0, status, out)
      assert.equal(("during\t%d\nafter\t1\tauto\n"):format(CORES), out)
    end)
  end)

  it_multi("a count that was set stays", function()
    beside_busy_loops(function()
      local out = run_script([[
local mg = require "moongrad"
mg.set_num_threads(2)
local a = mg.random.normal{192, 192}
local t0, teams = mg.clock(), {}
while mg.clock() - t0 < 0.5 do local _ = mg.matmul(a, a); teams[select(3, mg.get_num_threads())] = true end
print(teams[1], teams[2])
]])
      assert.equal("nil\ttrue\n", out)
    end)
  end)
end)

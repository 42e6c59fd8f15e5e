-- planner.lua — know a step's memory before running it: mg.memory.estimate.
--
--   local report = mg.memory.estimate(step, x, y)   -- step(x, y) as a dry run
--   print(report)                                    -- the peak, and what makes it
--   report.peak_bytes                                -- what mg.memory.stats().peak_bytes would show
--
-- A dry run (mg_dry_run_begin, include/moongrad.h) runs the step with every
-- allocation it makes and no arithmetic: each op whose result is a float
-- tensor gets it fresh and unwritten (memory the allocator counts and the
-- system never maps in), views and integer results run as usual. So the
-- counters see the step's bytes as its real run would, in the time of the
-- dispatch alone. Garbage is collected before every allocation of the run:
-- the peak is what the step holds at its most, which the collector's
-- default pacing may exceed by the garbage it lets wait (bench/estimate.lua
-- measures both). Nothing the step would change changes: variables keep
-- their values (assignments and optimizer steps write nothing), the
-- optimizers their slots and step counts, the random stream its place, the
-- collector its pacing and the peak counters their state.

local mg = require "moongrad"

local planner = {}

local function human (n)
  local units, u = {"B", "KiB", "MiB", "GiB", "TiB"}, 1
  while n >= 1024 and u < #units do n, u = n / 1024, u + 1 end
  return u == 1 and ("%d B"):format(n) or ("%.2f %s"):format(n, units[u])
end

local PARTS = {
  {"variable_bytes", "weights (variables)"},
  {"saved_bytes", "saved for the backward (activations)"},
  {"gradient_bytes", "gradients in flight"},
  {"tensor_bytes", "other tensors (inputs, results, optimizer slots, temporaries)"},
}

local Report = {}
Report.__index = Report
Report.__name = "moongrad.memory.estimate"

Report.__tostring = function(r)
  local lines = {("moongrad.memory.estimate: peak %s (%d bytes), predicted in %.1f ms"):format(
    human(r.peak_bytes), r.peak_bytes, r.seconds * 1e3), "", "| at the peak | bytes | share |", "|---|---|---|"}
  for _, p in ipairs(PARTS) do
    local b = r.at_peak[p[1]:gsub("_bytes$", "")]
    lines[#lines + 1] = ("| %s | %s | %.0f%% |"):format(p[2], human(b), r.peak_bytes > 0 and 100 * b / r.peak_bytes or 0)
  end
  lines[#lines + 1] = ("\nThe tapes held at most %s at once."):format(human(r.peak_saved_bytes))
  if r.peak_saved_bytes > 0 then
    lines[#lines + 1] = "\n| the tapes at their most: made at | bytes |\n|---|---|"
    local shown, more, rest = 0, 0, 0
    for i, s in ipairs(r.saved_by_line) do
      if i <= 10 then lines[#lines + 1] = ("| %s | %s |"):format(s.site, human(s.bytes))
      else more, rest = more + 1, rest + s.bytes end
      shown = shown + s.bytes
    end
    if more > 0 then lines[#lines + 1] = ("| %d more lines | %s |"):format(more, human(rest)) end
    if r.peak_saved_bytes > shown then
      lines[#lines + 1] = ("| before the step (its inputs, ...) | %s |"):format(human(r.peak_saved_bytes - shown))
    end
  end
  return table.concat(lines, "\n")
end

local function callable (f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and mt.__call ~= nil
end

--- estimate(step, ...): step(...) as a dry run; a report whose peak_bytes is
-- the peak mg.memory.stats().peak_bytes would show for the step after
-- mg.memory.reset_peak() at its start, with what made it (at_peak: variable,
-- saved, gradient and tensor bytes), the tapes' most (peak_saved_bytes) and
-- what made it (saved_by_line: {site = "file:line", bytes =}, by the Lua
-- line outside moongrad's modules that made each tensor, most first), the
-- bytes live after it (after_bytes) and the seconds it took.
function planner.estimate (step, ...)
  if not callable(step) then
    error(("memory.estimate: step must be a function, got %s"):format(type(step)), 2)
  end
  local rng = mg.random.get_state()
  local budget = mg.memory.budget(nil)           -- the step as it runs without one
  collectgarbage()                               -- the start as a settled real step sees it
  -- garbage collected before every allocation: the peak of what the step
  -- holds, whatever the collector's pacing (which may add its allowance)
  local pause, min_bytes = mg.memory.setpause(100, 0)
  local t0 = mg.clock()
  local ok, stats = pcall(mg.memory._dry_run, step, ...)
  local seconds = mg.clock() - t0
  mg.memory.setpause(pause, min_bytes)
  mg.random.set_state(rng)
  mg.memory.budget(budget)
  collectgarbage()                               -- the dry run's tensors go now
  if not ok then
    error(("memory.estimate: the step failed in the dry run: %s"):format(tostring(stats)), 2)
  end
  table.sort(stats.saved_by_line, function(a, b) return a.bytes > b.bytes or (a.bytes == b.bytes and a.site < b.site) end)
  return setmetatable({
    peak_bytes = stats.peak_bytes,
    peak_saved_bytes = stats.peak_saved_bytes,
    after_bytes = stats.current_bytes,
    at_peak = {variable = stats.variable_bytes, saved = stats.saved_bytes, gradient = stats.gradient_bytes,
               tensor = stats.tensor_bytes},
    seconds = seconds,
    saved_by_line = stats.saved_by_line,
  }, Report)
end

return planner

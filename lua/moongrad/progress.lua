--- moongrad.progress: Keras' progress bar (the one fit draws).
--   local bar = mg.progress(steps)
--   for i = 1, steps do ...; bar:update(i, {loss = l}) end
--   bar:finish({loss = l})
-- On a terminal the bar is redrawn in place (a carriage return, at most every
-- `interval` seconds) and finish draws its final state once, then a newline:
--    40/469 [====>.........................] - ETA: 12s - loss: 0.4123 - accuracy: 0.8512
--   469/469 [==============================] - 3s 6ms/step - loss: 0.2940 - accuracy: 0.9155
-- Into a pipe or a file nothing is drawn until finish, which writes that
-- final line alone: a log gets one clean line per bar, no carriage returns.
-- verbose = 2 writes only a short final line: "469/469 - 3s - 6ms/step - loss: 0.2940".
--
-- Values are a table name = value (numbers or one-element tensors), shown
-- loss first, then the others by name, then val_loss and the other val_
-- names; or a list of {name, value} pairs, shown in that order.
--
-- Is `out` a terminal? Lua has no isatty. The answer for io.stdout and
-- io.stderr is worked out once per process, at the first bar: a stream that
-- can seek is a file (no terminal, no cost); otherwise `test -t 1` (or 2) runs
-- through os.execute, one fork and exec of /bin/sh, about a millisecond.
-- Other files and writer objects count as no terminal; so does every stream
-- of a rank that mpirun started: Open MPI gives each rank a pseudo-terminal
-- whatever mpirun's own stdout is (a file, under `mpirun ... > log`), so
-- `test -t` cannot tell, and a log must not fill with carriage returns
-- (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK set). tty = true or false
-- says it outright (a writer that is a terminal, a notebook that draws \r).
-- In a Jupyter kernel (moongrad --kernel) a bar on io.stdout with no tty
-- option is one display that each redraw updates in place (moongrad.notebook).
-- @module moongrad.progress
local mg = require "moongrad"
local check = require "moongrad.check"
local class = require "moongrad.class"

local fail = check.fail

local Progress = class("moongrad.progress")      -- made by the module's function, not called

-- {========================= terminals =========================

local tty_of_fd = {}

-- whether an MPI launcher (mpirun, mpiexec, srun through PMI) started us
local function launched_by_mpi ()
  local getenv = os and os.getenv
  if not getenv then return false end
  return (getenv("OMPI_COMM_WORLD_SIZE") or getenv("PMIX_RANK") or getenv("PMI_RANK")) ~= nil
end

local function isatty (out)
  local fd = (out == io.stdout and 1) or (out == io.stderr and 2) or nil
  if not fd or launched_by_mpi() then return false end
  if tty_of_fd[fd] == nil then
    local ok, pos = pcall(out.seek, out, "cur")
    if ok and pos then
      tty_of_fd[fd] = false                         -- a regular file
    else
      local execute = os and os.execute
      tty_of_fd[fd] = execute ~= nil and execute(("test -t %d"):format(fd)) == true
    end
  end
  return tty_of_fd[fd]
end

-- }=============================================================


-- {========================= formatting ========================

local function fmt_number (v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  if v == 0 then return "0.0000" end                 -- Keras writes 0.0000e+00
  return (math.abs(v) > 1e-3 and "%.4f" or "%.4e"):format(v)
end

-- ETA as Keras writes it: 12s, 3:05, 1:02:03
local function fmt_eta (s)
  s = math.floor(s + 0.5)
  if s > 3600 then return ("%d:%02d:%02d"):format(s // 3600, s % 3600 // 60, s % 60) end
  if s > 60 then return ("%d:%02d"):format(s // 60, s % 60) end
  return ("%ds"):format(s)
end

-- time per unit as Keras writes it: 2s/step, 6ms/step, 850us/step
local function fmt_per_unit (t, unit)
  if t >= 1 or t == 0 then return ("%.0fs/%s"):format(t, unit) end
  if t >= 1e-3 then return ("%.0fms/%s"):format(t * 1e3, unit) end
  return ("%.0fus/%s"):format(t * 1e6, unit)
end

local function rank (name)
  if name == "loss" then return 1 end
  if name == "val_loss" then return 3 end
  return name:find("^val_") and 4 or 2
end

-- the values as an ordered list of {name, number}
local function ordered (values)
  if values == nil then return {} end
  local list = {}
  if type(values[1]) == "table" then
    for i, p in ipairs(values) do list[i] = {p[1], p[2]} end
  else
    for k, v in pairs(values) do list[#list + 1] = {k, v} end
    table.sort(list, function(a, b)
      local ra, rb = rank(a[1]), rank(b[1])
      if ra ~= rb then return ra < rb end
      return a[1] < b[1]
    end)
  end
  for _, p in ipairs(list) do
    if check.is_array(p[2]) then p[2] = (mg.is_variable(p[2]) and p[2]:value() or p[2]):item() end
  end
  return list
end

--- The text of the bar at step i (final: the finished form, with the times).
function Progress:line (i, values, final)
  local total, elapsed = self.total, mg.clock() - self.start
  local parts = {self.label, ("%" .. #tostring(total) .. "d/%d"):format(i, total)}
  if self.verbose == 1 then
    local w = self.width
    local done = math.floor(w * (total > 0 and math.min(i / total, 1) or 1))
    local bar = done > 0 and ("="):rep(done - 1) .. (i < total and ">" or "=") or ""
    parts[#parts + 1] = " [" .. bar .. ("."):rep(w - done) .. "]"
  end
  local per_unit = i > 0 and elapsed / i or 0
  if not final then
    if i > 0 and i < total then parts[#parts + 1] = " - ETA: " .. fmt_eta(per_unit * (total - i)) end
  elseif self.verbose == 1 then
    parts[#parts + 1] = (" - %.0fs %s"):format(elapsed, fmt_per_unit(per_unit, self.unit))
  else
    parts[#parts + 1] = (" - %.0fs - %s"):format(elapsed, fmt_per_unit(per_unit, self.unit))
  end
  for _, p in ipairs(ordered(values)) do
    parts[#parts + 1] = (" - %s: %s"):format(p[1], fmt_number(p[2]))
  end
  return table.concat(parts)
end

-- }=============================================================


-- {============================ bar ============================

-- the values shown after the bar: nil, name = value, or a list of {name, value};
-- each value a number or a one-element tensor
local function check_value (who, k, v)
  if check.is_array(v) then
    if v:numel() ~= 1 then
      fail(who, "value '%s' is a tensor of shape %s; give a number or a one-element tensor", k, check.shape(v.shape))
    end
  elseif type(v) ~= "number" then
    fail(who, "value '%s' must be a number or a one-element tensor, got %s", k, check.show(v))
  end
end

local function check_values (who, values)
  if values == nil then return end
  if type(values) ~= "table" or check.kind(values) ~= "a table" then
    fail(who, "values must be a table {name = value, ...}, got %s", check.show(values))
  end
  if type(values[1]) == "table" and check.kind(values[1]) == "a table" then
    for i = 1, check.list(who, values, "the list of values", "value %d") do
      local p = values[i]
      if type(p) ~= "table" or type(p[1]) ~= "string" then
        fail(who, "value %d must be a pair {name, value}, got %s", i, check.show(p))
      end
      check_value(who, p[1], p[2])
    end
    return
  end
  for k, v in pairs(values) do
    if type(k) ~= "string" then fail(who, "values are named (name = value), got a value at [%s]", check.show(k)) end
    check_value(who, k, v)
  end
end

local step_rule = check.rule("a non-negative integer", function(v)
  return type(v) == "number" and math.tointeger(v) ~= nil and v >= 0
end)

local function write (self, ...)
  self.out:write(...)
  self.out:flush()
end

--- bar:update(i [, values]): step i is done (i may pass the total, as tqdm
-- allows). Redraws on a terminal; elsewhere only remembers the values.
function Progress:update (i, values)
  check.self("progress:update", self, Progress, "bar:update(i)")
  i = math.tointeger(check.value("progress:update", "step", i, step_rule))
  check_values("progress:update", values)
  self.i, self.values = i, values or self.values
  if self.finished or not (self.tty or self.notebook) or self.verbose ~= 1 then return end
  local now = mg.clock()
  if now - self.drawn < self.interval then return end
  self.drawn = now
  local line = self:line(i, self.values, false)
  if self.notebook then return self.notebook._bar_line(self, line) end
  write(self, "\r", line, (" "):rep(math.max(0, self.shown - #line)))
  self.shown = #line
end

--- bar:finish([values]): the final line, once (a second finish does nothing):
-- the bar at its total (or the last step given, if training stopped early),
-- with the elapsed time, the time per step and the values.
function Progress:finish (values)
  check.self("progress:finish", self, Progress, "bar:finish()")
  check_values("progress:finish", values)
  if self.finished then return end
  self.finished = true
  local line = self:line(math.max(self.i, self.stopped and 0 or self.total), values or self.values, true)
  if self.notebook and self.verbose == 1 then
    self.notebook._bar_line(self, line)
  elseif self.tty and self.verbose == 1 then
    write(self, "\r", line, (" "):rep(math.max(0, self.shown - #line)), "\n")
  else
    write(self, line, "\n")
  end
end

--- bar:stop(): the run ends before the total (early stopping, an error): finish
-- then shows the last step reached instead of the total.
function Progress:stop ()
  check.self("progress:stop", self, Progress, "bar:stop()")
  self.stopped = true
end

local writer = check.rule("a file or an object with write and flush methods", function(v)
  if type(v) ~= "table" and type(v) ~= "userdata" then return false end
  local ok, write_fn, flush = pcall(function() return v.write, v.flush end)
  return ok and check.is_callable(write_fn) and check.is_callable(flush)
end)

local OPTIONS = {{"label", check.string}, {"out", writer}, {"tty", check.boolean},
                 {"width", check.positive_integer, 30}, {"interval", check.nonnegative, 0.05},
                 {"unit", check.string, "step"},
                 {"verbose", check.rule("1 (a bar) or 2 (one line at the end)", function(v) return v == 1 or v == 2 end), 1}}

--- mg.progress(total, {label=, out=io.stdout, tty=<detected>, width=30,
-- interval=0.05, unit="step", verbose=1}): a bar for total steps.
return function (total, opts)
  if math.type(total) ~= "integer" or total < 0 then
    fail("progress", "the number of steps must be a non-negative integer, got %s", check.show(total))
  end
  opts = check.options("progress", opts, OPTIONS)
  local out = opts.out or io.stdout
  local tty = opts.tty
  local notebook = out == io.stdout and tty == nil and require("moongrad.notebook") or nil
  if notebook and not notebook.active() then notebook = nil end
  if tty == nil then tty = isatty(out) end
  return setmetatable({total = total, label = opts.label and (opts.label .. " ") or "", out = out, tty = tty,
                       notebook = notebook,
                       width = opts.width, interval = opts.interval, unit = opts.unit, verbose = opts.verbose,
                       start = mg.clock(), drawn = -math.huge, shown = 0, i = 0, finished = false}, Progress)
end

-- }=============================================================

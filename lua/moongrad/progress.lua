--- moongrad.progress: a progress bar for training loops.
--   local bar = mg.progress(steps, {label = "epoch 1"})
--   for i = 1, steps do ...; bar:update(i, {loss = l}) end
--   bar:finish()
-- Draws on one line of stderr (carriage returns), at most 10 times a second,
-- with the rate, the time left and the values given to update.
-- @module moongrad.progress
local mg = require "moongrad"
local check = require "moongrad.check"

local fail = check.fail

local Progress = {}
Progress.__index = Progress

local WIDTH = 30

local function fmt_time (s)
  if s ~= s or s == math.huge then return "?" end
  if s >= 3600 then return ("%dh%02dm"):format(s // 3600, s % 3600 // 60) end
  if s >= 60 then return ("%dm%02ds"):format(s // 60, s % 60) end
  return ("%.1fs"):format(s)
end

local function fmt_value (v)
  if mg.is_tensor(v) then v = v:item() end
  if type(v) == "number" then return ("%.4g"):format(v) end
  return tostring(v)
end

--- the line for step i of n
function Progress:line (i, values)
  local frac = self.total > 0 and math.min(i / self.total, 1) or 1
  local done = math.floor(frac * WIDTH + 0.5)
  local elapsed = mg.clock() - self.start
  local rate = i > 0 and i / elapsed or 0
  local parts = {("%s[%s%s] %d/%d"):format(self.label, ("="):rep(done), (" "):rep(WIDTH - done), i, self.total),
                 ("%s elapsed"):format(fmt_time(elapsed))}
  if i < self.total then parts[#parts + 1] = ("%s left"):format(fmt_time(rate > 0 and (self.total - i) / rate or math.huge)) end
  parts[#parts + 1] = ("%.1f it/s"):format(rate)
  local keys = {}
  for k in pairs(values or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do parts[#parts + 1] = ("%s %s"):format(k, fmt_value(values[k])) end
  return table.concat(parts, "  ")
end

-- the values shown after the bar: nil, or name = number or one-element tensor
local function check_values (who, values)
  if values == nil then return end
  if type(values) ~= "table" or check.kind(values) ~= "a table" then
    fail(who, "values must be a table {name = value, ...}, got %s", check.show(values))
  end
  for k, v in pairs(values) do
    if type(k) ~= "string" then fail(who, "values are named (name = value), got a value at [%s]", check.show(k)) end
    if check.is_array(v) and v:numel() ~= 1 then
      fail(who, "value '%s' is a tensor of shape %s; give a number or a one-element tensor", k,
           check.shape(v.shape))
    end
  end
end

local step_rule = check.rule("a non-negative integer", function(v)
  return type(v) == "number" and math.tointeger(v) ~= nil and v >= 0
end)

--- bar:update(i [, values]): step i is done (i may pass the total, as tqdm allows).
function Progress:update (i, values)
  check.self("progress:update", self, Progress, "bar:update(i)")
  i = math.tointeger(check.value("progress:update", "step", i, step_rule))
  check_values("progress:update", values)
  self.i, self.values = i, values or self.values
  local now = mg.clock()
  if i < self.total and now - self.drawn < 0.1 then return end
  self.drawn = now
  local line = self:line(i, self.values)
  self.out:write("\r", line, (" "):rep(math.max(0, self.width - #line)))
  self.out:flush()
  self.width = #line
end

function Progress:finish (values)
  check.self("progress:finish", self, Progress, "bar:finish()")
  check_values("progress:finish", values)
  self:update(self.total, values)
  self.out:write("\n")
  self.out:flush()
end

local writer = check.rule("a file or an object with write and flush methods", function(v)
  if type(v) ~= "table" and type(v) ~= "userdata" then return false end
  local ok, write, flush = pcall(function() return v.write, v.flush end)
  return ok and check.is_callable(write) and check.is_callable(flush)
end)

local OPTIONS = {{"label", check.string}, {"out", writer}}

--- mg.progress(total, {label=, out=io.stderr}): a bar for total steps.
return function (total, opts)
  if math.type(total) ~= "integer" or total < 0 then
    fail("progress", "the number of steps must be a non-negative integer, got %s", check.show(total))
  end
  opts = check.options("progress", opts, OPTIONS)
  return setmetatable({total = total, label = opts.label and (opts.label .. " ") or "",
                       out = opts.out or io.stderr, start = mg.clock(), drawn = -math.huge,
                       width = 0, i = 0}, Progress)
end

--- moongrad.plot: line plots through gnuplot (Debian's gnuplot-nox), as
-- torch7's gnuplot package did.
--   mg.plot(losses, {path = "loss.png", title = "training"})      -- a PNG (or .svg)
--   print(mg.plot(losses))                                        -- text, for the REPL
--   mg.plot({epochs, train, label = "train"}, {epochs, val, label = "val"}, {path = "curves.svg"})
--   history:plot("history.png")                                   -- fit's History
-- A series is a list of numbers or a 1-D tensor (y against 1, 2, ...), or a
-- pair {x, y} of them; label = names it in the key, style = "lines"
-- (default), "points" or "linespoints". The options table comes last:
--   path       where to draw: *.png (pngcairo, else gnuplot's png terminal) or
--              *.svg; without a path the plot is text (gnuplot's dumb
--              terminal), returned as a string
--   title, xlabel, ylabel, logscale ("x", "y" or "xy"),
--   width, height (pixels for files, 800x500; characters for text, 79x24)
-- NaN and infinite values are left out (the line breaks there).
-- The data go to gnuplot through a temporary file and the script through
-- another, never through a shell string; both are removed afterwards. $GNUPLOT
-- names another gnuplot binary. In a Jupyter kernel (moongrad --kernel) a plot
-- without a path is a PNG shown in the notebook (moongrad.notebook), and
-- nothing is returned.
-- @module moongrad.plot
local mg = require "moongrad"
local check = require "moongrad.check"

local fail, show = check.fail, check.show

local plot = {}

-- {========================= gnuplot ===========================

local function shell_quote (s) return "'" .. s:gsub("'", "'\\''") .. "'" end
-- a gnuplot string: single quotes expand nothing (no backquotes, no
-- escapes), a quote is doubled, and a line break or NUL (which would end the
-- command) becomes a space
local function gp_quote (s) return "'" .. tostring(s):gsub("[%z\r\n]", " "):gsub("'", "''") .. "'" end

local function binary () return os.getenv("GNUPLOT") or "gnuplot" end

local found = {}          -- binary -> true/false, and binary .. ":pngcairo"

local function read_file (path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- A private directory (mktemp -d: 0700, a name no one could guess) holds
-- the script, the data and the drawing: gnuplot never sees a name the user
-- gave (it would run one starting with '|' as a command), and no other local
-- user can plant a link where a file of ours is written.
local function private_dir (who)
  local p = io.popen('mktemp -d "${TMPDIR:-/tmp}/moongrad-plot.XXXXXXXX" 2>/dev/null')
  local dir = p and p:read("l")
  if p then p:close() end
  if not dir or not dir:match("^/[^\n]*$") then
    fail(who, "cannot make a private temporary directory (mktemp -d failed; check $TMPDIR)")
  end
  return dir
end

-- removes the files named in dir, then dir (os.remove takes an empty one)
local function remove_dir (dir, names)
  for _, name in ipairs(names) do os.remove(dir .. "/" .. name) end
  os.remove(dir)
end

local function write_file (who, path, s)
  local f, err = io.open(path, "wb")
  if not f then fail(who, "cannot write '%s': %s", path, err) end
  local ok, werr = f:write(s)
  local closed, cerr = f:close()
  if not ok or not closed then fail(who, "writing '%s' failed: %s", path, tostring(werr or cerr)) end
end

-- runs gnuplot on script (text) in dir; returns true, or false and its stderr
local function run (who, script, dir)
  local bin = binary()
  local own = dir == nil
  dir = dir or private_dir(who)
  local script_path, err_path = dir .. "/script.gp", dir .. "/stderr.txt"
  write_file(who, script_path, script)
  local ok = os.execute(shell_quote(bin) .. " " .. shell_quote(script_path) .. " </dev/null >/dev/null 2>"
                        .. shell_quote(err_path))
  local err = read_file(err_path) or ""
  os.remove(script_path)
  os.remove(err_path)
  if own then os.remove(dir) end
  return ok == true, err
end

local function check_gnuplot (who)
  local bin = binary()
  if found[bin] == nil then
    found[bin] = os.execute(shell_quote(bin) .. " --version >/dev/null 2>&1") == true
  end
  if not found[bin] then
    fail(who, "gnuplot not found (ran '%s'); install Debian's gnuplot-nox (make deps does it)%s", bin,
         os.getenv("GNUPLOT") and ", or fix $GNUPLOT" or "")
  end
end

local function has_pngcairo (who)
  local key = binary() .. ":pngcairo"
  if found[key] == nil then found[key] = (run(who, "set terminal pngcairo\n")) end
  return found[key]
end

-- }=============================================================


-- {========================== series ===========================

local function numbers (who, what, v)
  if check.is_array(v) then
    if v.ndim ~= 1 then fail(who, "%s must be 1-D, got a tensor of shape %s", what, check.shape(v.shape)) end
    if v.dtype == "bool" or v.dtype == "float16" or v.dtype == "bfloat16" or v.dtype == "float32" then
      v = mg.cast(v, "float64")
    end
    return v:totable()
  end
  if type(v) ~= "table" or getmetatable(v) ~= nil then
    fail(who, "%s must be a list of numbers or a 1-D tensor, got %s", what, show(v))
  end
  local n = check.list(who, v, what, what .. "[%d]", nil)
  for i = 1, n do
    if type(v[i]) ~= "number" then fail(who, "%s[%d] must be a number, got %s", what, i, show(v[i])) end
  end
  return v
end

local STYLES = {lines = true, points = true, linespoints = true}

-- {x = {...}, y = {...}, label =, style =} from series argument i
local function parse_series (who, i, s)
  local what = ("series %d"):format(i)
  local x, y, label, style
  if check.is_array(s) then
    y = numbers(who, what, s)
  elseif type(s) == "table" and getmetatable(s) == nil then
    label, style = s.label, s.style
    if label ~= nil and type(label) ~= "string" then fail(who, "%s: label must be a string, got %s", what, show(label)) end
    if style ~= nil and not STYLES[style] then
      fail(who, "%s: style must be 'lines', 'points' or 'linespoints', got %s", what, show(style))
    end
    for k in pairs(s) do
      if k ~= "label" and k ~= "style" and math.type(k) ~= "integer" then
        fail(who, "%s has a key %s (known: label, style)", what, show(k))
      end
    end
    if type(s[1]) == "table" or check.is_array(s[1]) then
      if #s ~= 2 then fail(who, "%s must be a pair {x, y}, got %d lists", what, #s) end
      x, y = numbers(who, what .. " x", s[1]), numbers(who, what .. " y", s[2])
      if #x ~= #y then fail(who, "%s has %d x values and %d y values", what, #x, #y) end
    else
      local list = {}
      for j = 1, #s do list[j] = s[j] end
      y = numbers(who, what, list)
    end
  else
    fail(who, "%s must be a list of numbers, a 1-D tensor or a pair {x, y}, got %s", what, show(s))
  end
  if #y == 0 then fail(who, "%s has no points", what) end
  if not x then
    x = {}
    for j = 1, #y do x[j] = j end
  end
  return {x = x, y = y, label = label, style = style or "lines"}
end

local function fmt (v)
  if v ~= v or v == math.huge or v == -math.huge then return "?" end
  return ("%.17g"):format(v)
end

-- }=============================================================


-- {=========================== draw ============================

local size_rule = check.positive_integer
local OPTIONS = {{"path", check.string}, {"title", check.string}, {"xlabel", check.string}, {"ylabel", check.string},
                 {"logscale", check.rule("'x', 'y' or 'xy'", function(v) return v == "x" or v == "y" or v == "xy" end)},
                 {"width", size_rule}, {"height", size_rule}}

-- moongrad.notebook when a plot without a path goes to a notebook
local function inline (opts)
  local notebook = not opts.path and require("moongrad.notebook")
  return notebook and notebook.active() and notebook or nil
end

-- the script and data that draw panels into out (a file in dir)
local function draw_into (who, panels, opts, dir, out, kind)
  local lines = {}
  local function add (fmt_, ...) lines[#lines + 1] = fmt_:format(...) end
  local file = kind ~= "text"
  if kind == "png" then
    add("set terminal %s size %d,%d", has_pngcairo(who) and "pngcairo" or "png", opts.width or 800, opts.height or 500)
  elseif kind == "svg" then
    add("set terminal svg size %d,%d", opts.width or 800, opts.height or 500)
  else
    add("set terminal dumb nofeed size %d,%d", opts.width or 79, opts.height or 24)
  end
  add("set termoption noenhanced")
  add("set output %s", gp_quote(out))
  add("set datafile missing '?'")
  add(file and "set grid\nset key outside right top" or "set key below")
  -- a margin inside the frame: a curve that reaches the range's ends (a loss
  -- falling to its last, lowest value) is drawn, not hidden in the frame's line
  add("set offsets graph 0.02, graph 0.02, graph 0.08, graph 0.08")
  if opts.integer_x then add("set xtics 1") end
  if opts.logscale then add("set logscale %s", opts.logscale) end
  if file and #panels > 1 then add("set lmargin at screen 0.1\nset rmargin at screen 0.76") end
  if #panels > 1 then add("set multiplot layout %d,1%s", #panels, opts.title and " title " .. gp_quote(opts.title) or "") end
  local data = dir .. "/data.txt"
  local chunks = {}
  local index = 0
  for _, panel in ipairs(panels) do
    local title = #panels > 1 and panel.title or opts.title
    if title then add("set title %s", gp_quote(title)) else add("unset title") end
    if opts.xlabel then add("set xlabel %s", gp_quote(opts.xlabel)) end
    local ylabel = panel.ylabel or opts.ylabel
    if ylabel then add("set ylabel %s", gp_quote(ylabel)) else add("unset ylabel") end
    local parts = {}
    for i, s in ipairs(panel.series) do
      for j = 1, #s.x do chunks[#chunks + 1] = fmt(s.x[j]) .. " " .. fmt(s.y[j]) .. "\n" end
      chunks[#chunks + 1] = "\n\n"
      local name = s.label or (#panel.series > 1 and ("series %d"):format(i) or nil)
      parts[i] = ("%s index %d using 1:2 with %s %s"):format(i == 1 and gp_quote(data) or "''", index, s.style,
                                                            name and "title " .. gp_quote(name) or "notitle")
      index = index + 1
    end
    add("plot %s", table.concat(parts, ", "))
  end
  if #panels > 1 then add("unset multiplot") end
  add("set output")
  write_file(who, data, table.concat(chunks))
  return run(who, table.concat(lines, "\n") .. "\n", dir)
end

--- Draws panels (each {series = {...}, title =, ylabel =}) one above the other.
-- Returns the path, or the text without one (nothing when shown inline).
function plot.draw (who, panels, opts)
  check_gnuplot(who)
  local notebook, path = inline(opts), opts.path
  local kind = "text"
  if path then
    if path:find("[%z\r\n]") then fail(who, "path must not contain a NUL byte or a line break, got %s", show(path)) end
    if path:find("^%s*|") then
      fail(who, "path must be a file name, got '%s' (a name starting with '|' would be a command to gnuplot)", path)
    end
    local ext = path:match("%.(%w+)$")
    kind = ext and ext:lower()
    if kind ~= "png" and kind ~= "svg" then
      fail(who, "path must end in .png or .svg, got '%s' (without a path the plot is text)", path)
    end
  elseif notebook then
    kind = "png"
  end
  local dir = private_dir(who)
  local out = dir .. "/plot." .. kind
  local done, ok, err = pcall(draw_into, who, panels, opts, dir, out, kind)
  local drawing = done and ok and read_file(out) or nil
  remove_dir(dir, {"plot." .. kind, "data.txt"})
  if not done then error(ok, 0) end
  if not ok then fail(who, "gnuplot failed: %s", (err:gsub("%s+$", ""))) end
  if drawing == nil then fail(who, "gnuplot wrote no %s", kind) end
  if path then
    write_file(who, path, drawing)
    return path
  end
  if notebook then
    notebook._plot_data(drawing)
    return
  end
  -- the dumb terminal pads every line to the width: trim the blank ends
  return (drawing:gsub("\f", ""):gsub("[ \t]+\n", "\n"):gsub("[ \t]+$", ""):gsub("^\n+", ""):gsub("\n*$", "\n"))
end

local function is_options (v)
  return type(v) == "table" and getmetatable(v) == nil and v[1] == nil
end

--- mg.plot(series... [, opts]): see the module's comment.
local function plot_call (_, ...)
  local who = "plot"
  local args = table.pack(...)
  local n = args.n
  local opts = nil
  if n > 0 and is_options(args[n]) then opts, n = args[n], n - 1 end
  opts = check.options(who, opts, OPTIONS)
  if n == 0 then fail(who, "nothing to plot: give one or more series (lists of numbers, 1-D tensors or {x, y} pairs)") end
  local series = {}
  for i = 1, n do series[i] = parse_series(who, i, args[i]) end
  return plot.draw(who, {{series = series}}, opts)
end

--- The curves of a fit History: the losses in one panel, the other metrics
-- (if any) in a second, against history.epoch.
function plot.history (history, path, opts)
  local who = "History:plot"
  if path ~= nil then check.value(who, "path", path, check.string) end
  opts = check.options(who, opts, OPTIONS)
  if path then opts.path = path end
  local keys = {}
  for k in pairs(history.history) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local va, vb = a:find("^val_") ~= nil, b:find("^val_") ~= nil
    local ba, bb = a:gsub("^val_", ""), b:gsub("^val_", "")
    if ba ~= bb then return ba < bb end
    return not va and vb
  end)
  if #keys == 0 or #history.epoch == 0 then fail(who, "the history is empty (no epoch ran)") end
  local losses, others = {}, {}
  for _, k in ipairs(keys) do
    local s = parse_series(who, 1, {history.epoch, history.history[k], label = k, style = "linespoints"})
    local list = k:find("loss$") and losses or others
    list[#list + 1] = s
  end
  local panels = {}
  if #losses > 0 then panels[#panels + 1] = {series = losses, title = "loss", ylabel = "loss"} end
  if #others > 0 then panels[#panels + 1] = {series = others, title = "metrics", ylabel = "value"} end
  if #panels == 1 and not opts.title then opts.title = panels[1].title end
  opts.xlabel = opts.xlabel or "epoch"
  opts.integer_x = #history.epoch <= 20
  if #panels > 1 and not opts.height then opts.height = (path or inline(opts)) and 700 or 40 end
  return plot.draw(who, panels, opts)
end

-- }=============================================================

return check.export(setmetatable(plot, {__call = plot_call}))     -- errors name the user's line (moongrad.check)

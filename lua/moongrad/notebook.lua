--- moongrad.notebook: rich output in Jupyter, when moongrad runs as a kernel
-- (`moongrad --kernel`, see docs/notebooks.md).
--   mg.notebook.display(x)                       -- x as the notebook shows results
--   mg.notebook.image("loss.png")                -- a PNG or SVG file, inline
--   mg.notebook.display(x, {id = "status"})      -- a display that can change:
--   mg.notebook.display(y, {id = "status", update = true})
-- A cell's value shows through bundle: as text (the REPL's mg.repr), and a
-- small tensor (at most 2-D, 400 entries) or a table of counters such as
-- mg.memory.stats() also as an HTML table. Inside the kernel mg.plot without
-- a path draws a PNG inline, and the progress bar (fit's included) redraws
-- one display in place. Outside a kernel display prints the text and image
-- prints the path, so code runs the same in a script.
-- The kernel's C half is package.loaded["moongrad.kernel"] (send, base64),
-- set by src/kernel/lkernel.c only.
-- @module moongrad.notebook
local mg = require "moongrad"
local check = require "moongrad.check"

local notebook = {}

local MAX_CELLS = 400      -- a tensor with more entries shows as text only

local function kernel () return package.loaded["moongrad.kernel"] end

--- notebook.active(): is this code running in a Jupyter kernel?
function notebook.active () return kernel() ~= nil end

-- {========================= HTML ==============================

local ESC = {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;"}
local function esc (s) return (tostring(s):gsub('[&<>"]', ESC)) end

local function entry (v)
  if math.type(v) == "float" then return ("%.6g"):format(v) end
  return tostring(v)
end

local function tensor_html (x)
  local caption = check.show(x)
  if mg.is_variable(x) then x = x:value() end
  local n = x:numel()
  if x.ndim > 2 or n == 0 or n > MAX_CELLS then return nil end
  local ok, t = pcall(x.totable, x)
  if not ok then return nil end
  local rows = x.ndim == 0 and {{t}} or x.ndim == 1 and {t} or t
  local out = {'<table class="moongrad-tensor"><caption style="caption-side:top; text-align:left; white-space:nowrap">',
               esc(caption), "</caption>"}
  for _, row in ipairs(rows) do
    out[#out + 1] = "<tr>"
    for _, v in ipairs(row) do out[#out + 1] = '<td style="text-align:right">' .. esc(entry(v)) .. "</td>" end
    out[#out + 1] = "</tr>"
  end
  out[#out + 1] = "</table>"
  return table.concat(out)
end

-- a plain table of named numbers with byte counts among them (mg.memory.stats())
local function counters_html (t)
  if type(t) ~= "table" or getmetatable(t) ~= nil or next(t) == nil then return nil end
  local keys, has_bytes = {}, false
  for k, v in pairs(t) do
    if type(k) ~= "string" or type(v) ~= "number" then return nil end
    keys[#keys + 1] = k
    has_bytes = has_bytes or k:find("_bytes$") ~= nil
  end
  if not has_bytes then return nil end
  table.sort(keys)
  local out = {'<table class="moongrad-counters">'}
  for _, k in ipairs(keys) do
    local shown = mg.repr({[k] = t[k]}):match("^{[^=]*= (.*)}$") or tostring(t[k])    -- repr's units
    out[#out + 1] = ('<tr><th style="text-align:left">%s</th><td style="text-align:right">%s</td></tr>'):format(esc(k), esc(shown))
  end
  out[#out + 1] = "</table>"
  return table.concat(out)
end

-- }=============================================================


-- {======================= displays ============================

--- notebook.bundle(v): v as a notebook shows it, {["text/plain"] = ..., ["text/html"] = ...}
function notebook.bundle (v)
  local b = {["text/plain"] = mg.repr(v)}
  local html = check.is_array(v) and tensor_html(v) or counters_html(v)
  if html then b["text/html"] = html end
  return b
end

local DISPLAY = {{"id", check.string}, {"update", check.boolean}}

-- sends a bundle as display_data, or as update_display_data of display opts.id
local function send (who, data, opts)
  opts = check.options(who, opts, DISPLAY)
  if opts.update and not opts.id then check.fail(who, "update = true needs the id of the display to update") end
  kernel().send(opts.update and "update_display_data" or "display_data",
                {data = data, metadata = {}, transient = opts.id and {display_id = opts.id} or {}})
end

--- notebook.display(v [, {id=, update=}]): shows v now (its bundle); with an
-- id the display can be replaced later by one with update = true
function notebook.display (v, opts)
  if not notebook.active() then
    check.options("notebook.display", opts, DISPLAY)
    print(mg.repr(v))
    return
  end
  send("notebook.display", notebook.bundle(v), opts)
end

local IMAGE_TYPES = {png = "image/png", svg = "image/svg+xml"}

-- shows the file at path (PNG or SVG) with text as its text/plain
local function show_file (who, path, text, opts)
  if path:find("%z") then check.fail(who, "the path %s contains a NUL byte", check.show(path)) end
  local mime = IMAGE_TYPES[(path:match("%.(%w+)$") or ""):lower()]
  if not mime then check.fail(who, "path must end in .png or .svg, got '%s'", path) end
  local f, err = io.open(path, "rb")
  if not f then check.fail(who, "cannot read '%s' (%s)", path, err) end
  local bytes = f:read("a")
  f:close()
  if not notebook.active() then
    check.options(who, opts, DISPLAY)
    print(text)
    return
  end
  local data = {["text/plain"] = text}
  data[mime] = mime == "image/png" and kernel().base64(bytes) or bytes
  send(who, data, opts)
end

--- notebook.image(path [, {id=, update=}]): shows a PNG or SVG file
function notebook.image (path, opts)
  check.value("notebook.image", "path", path, check.string)
  show_file("notebook.image", path, ("[image: %s]"):format(path), opts)
end

--- mg.plot's inline PNG, its bytes (internal: drawn in a private directory)
function notebook._plot_data (bytes)
  send("plot", {["text/plain"] = "[plot]", ["image/png"] = kernel().base64(bytes)})
end

-- }=============================================================


-- {=================== the kernel's callers ====================
-- (internal: the kernel, mg.progress and mg.plot call these)

--- the execute_result of a cell's values: one shows as bundle; several as the REPL prints them
function notebook._result (...)
  local n = select("#", ...)
  if n == 1 then return notebook.bundle((...)) end
  local parts = {}
  for i = 1, n do parts[i] = mg.repr((select(i, ...))) end
  return {["text/plain"] = table.concat(parts, "\t")}
end

-- the value a name ("mg.nn.Dense", "x:sum", "losses") has now, read without calling anything but __index
local function resolve (name)
  local v = _G
  for sep, part in ("." .. name):gmatch("([.:])([%w_]+)") do
    if type(v) ~= "table" and type(v) ~= "userdata" then return nil end
    local ok, x = pcall(function() return v[part] end)
    if not ok or x == nil then return nil end
    v = x
  end
  return v
end

--- what inspect (Shift-Tab in a notebook) shows for name: mg.help's entry,
-- else the value itself; nil when the name is unknown
function notebook._inspect (name)
  local help = mg.help
  local v = resolve(name)
  local text = v ~= nil and help.help(v) or help.help((name:gsub(":", ".")))
  if not text:find("^no help for") then return text end
  if v ~= nil then return ("%s: %s\n%s"):format(name, type(v), mg.repr(v)) end
  return nil
end

local bars = 0

--- the progress bar's line, drawn in place: its first line is a display, the next ones update it
function notebook._bar_line (bar, line)
  local first = bar.display_id == nil
  if first then
    bars = bars + 1
    bar.display_id = ("moongrad-progress-%d-%d"):format(os.time(), bars)   -- not one of an earlier kernel's
  end
  send("progress", {["text/plain"] = line}, {id = bar.display_id, update = not first})
end

-- }=============================================================

return check.export(notebook)          -- errors name the user's line (moongrad.check)

-- mg.plot and history:plot: PNG, SVG and text through gnuplot.
local mg = require "moongrad"
local h = require "helpers"

local function err (fn, msg) assert.has_error(fn, msg) end

local read = h.read

local function quote (s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- the private directories plots draw in, now
local function plot_dirs ()
  local p = io.popen('ls -d "${TMPDIR:-/tmp}"/moongrad-plot.* 2>/dev/null')
  local names = {}
  for line in p:lines() do names[line] = true end
  p:close()
  return names
end

-- fn(), then the directories it left behind
local function left_behind (fn)
  local before = plot_dirs()
  fn()
  local left = {}
  for name in pairs(plot_dirs()) do if not before[name] then left[#left + 1] = name end end
  return left
end

local has_gnuplot = select(2, h.run("command -v gnuplot")) == 0

describe("plot", function()
  if not has_gnuplot then
    it("needs gnuplot", function() pending("gnuplot is not installed (Debian's gnuplot-nox; make deps installs it)") end)
    return
  end

  local dir
  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. quote(dir .. "/with space's")))
  end)
  teardown(function() os.execute("rm -rf " .. quote(dir)) end)

  it("draws a PNG (pngcairo or png), a file in a directory with a space and a quote", function()
    local path = dir .. "/with space's/loss.png"
    local left = left_behind(function()
      assert.equal(path, mg.plot({3, 2, 1.5, 1.2}, mg.constant({4, 3, 2, 1}), {path = path, title = "loss's fall"}))
    end)
    assert.equal("\137PNG\r\n\26\n", read(path):sub(1, 8))
    assert.same({}, left)                                         -- the private directory went
  end)

  it("never hands gnuplot a name it could run: a path starting with '|' is refused", function()
    local marker = dir .. "/ran"
    local cwd_file = "|touch " .. marker .. "; cat >/dev/null; echo .png"
    for _, path in ipairs({cwd_file, "  |touch " .. marker .. " .svg"}) do
      err(function() mg.plot({1, 2}, {path = path}) end,
          "plot: path must be a file name, got '" .. path .. "' (a name starting with '|' would be a command to gnuplot)")
    end
    local history = mg.callbacks.History()
    history.epoch, history.history = {1, 2}, {loss = {2, 1}}
    err(function() history:plot(cwd_file) end,
        "History:plot: path must be a file name, got '" .. cwd_file .. "' (a name starting with '|' would be a command to gnuplot)")
    err(function() mg.plot({1, 2}, {path = dir .. "/a.png\0.svg"}) end,
        "plot: path must not contain a NUL byte or a line break, got '" .. dir .. "/a.png\0.svg'")
    err(function() mg.plot({1, 2}, {path = dir .. "/a\nb.png"}) end)
    assert.is_nil(io.open(marker), "a shell command ran")
    assert.is_nil(io.open(cwd_file))
  end)

  it("an inline plot (in a notebook) is drawn in a private directory, not at a name others can guess", function()
    local real, tmpname = package.loaded["moongrad.notebook"], os.tmpname
    local shown
    package.loaded["moongrad.notebook"] = {active = function() return true end,
                                           _plot_data = function(bytes) shown = bytes end}
    os.tmpname = function() error("os.tmpname used: a name another user can plant a link at") end
    local ok, e = pcall(function()
      return left_behind(function() assert.is_nil(mg.plot({1, 3, 2})) end)
    end)
    package.loaded["moongrad.notebook"], os.tmpname = real, tmpname
    assert(ok, e)
    assert.same({}, e)
    assert.equal("\137PNG\r\n\26\n", shown:sub(1, 8))
  end)

  it("titles, labels and series names are text to gnuplot, never commands", function()
    local marker = dir .. "/ran2"
    local evil = {"x' ; system('touch " .. marker .. "') ; '", "`touch " .. marker .. "`",
                  "a\nset output '|touch " .. marker .. "'\nplot 1", "a\0\nsystem('touch " .. marker .. "')",
                  "@evil \\' \" $x"}
    for _, s in ipairs(evil) do
      local path = dir .. "/evil.svg"
      os.remove(path)
      mg.plot({{1, 2}, {3, 4}, label = s}, {path = path, title = s, xlabel = s, ylabel = s})
      assert.truthy(read(path):find("<svg", 1, true))
      local text = mg.plot({1, 2, label = s}, {title = s})
      assert.is_string(text)
    end
    local history = mg.callbacks.History()
    history.epoch, history.history = {1, 2}, {[evil[1]] = {2, 1}}
    history:plot(dir .. "/evil2.png")
    assert.is_nil(io.open(marker), "a shell command ran")
  end)

  it("draws an SVG, from {x, y} pairs with labels and styles", function()
    local path = dir .. "/curves.SVG"
    mg.plot({{0, 0.5, 1}, {1, 4, 9}, label = "x_squared", style = "linespoints"},
            {mg.constant({0, 1}), {2, 2}, label = "flat", style = "points"}, {path = path, xlabel = "x", ylabel = "y"})
    local svg = read(path)
    assert.truthy(svg:find("<svg", 1, true))
    assert.truthy(svg:find("x_squared", 1, true))                -- noenhanced: the underscore stays
    assert.truthy(svg:find("flat", 1, true))
  end)

  it("returns text without a path (gnuplot's dumb terminal), NaN left out", function()
    local text = mg.plot({1, 4, 9, 0 / 0, 25, 36}, {title = "squares", width = 60, height = 15})
    assert.is_string(text)
    assert.truthy(text:find("squares", 1, true))
    local lines, widest = 0, 0
    for line in text:gmatch("[^\n]*\n") do lines = lines + 1; widest = math.max(widest, #line - 1) end
    assert.is_true(lines > 5 and lines <= 15, text)
    assert.is_true(widest <= 60, text)
    assert.is_nil(text:find(" \n", 1, true))                      -- trailing blanks trimmed
  end)

  it("history:plot draws the losses and the metrics per epoch", function()
    mg.random.seed(4)
    local x = mg.random.normal({30, 2})
    local y = mg.cast(mg.greater(mg.sum(x, 2), 0), "int64") + 1
    local model = mg.nn.Sequential{mg.nn.Dense(2)}
    model:compile{optimizer = "adam", loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true},
                  metrics = {"accuracy"}}
    local history = model:fit(x, y, {epochs = 3, validation_split = 0.2, verbose = 0})
    local path = dir .. "/history.png"
    assert.equal(path, history:plot(path))
    assert.equal("\137PNG\r\n\26\n", read(path):sub(1, 8))
    local text = history:plot({height = 30})
    for _, word in ipairs({"val_loss", "val_accuracy", "epoch"}) do assert.truthy(text:find(word, 1, true), text) end
  end)

  it("checks its arguments", function()
    local cases = {
      {function() mg.plot() end, "plot: nothing to plot: give one or more series (lists of numbers, 1-D tensors or "
        .. "{x, y} pairs)"},
      {function() mg.plot({1, 2}, {path = dir .. "/x.jpg"}) end, "plot: path must end in .png or .svg, got '"
        .. dir .. "/x.jpg' (without a path the plot is text)"},
      {function() mg.plot({1, "2"}) end, "plot: series 1[2] must be a number, got '2'"},
      {function() mg.plot({}, {1, 2}) end, "plot: series 1 has no points"},
      {function() mg.plot(mg.ones{2, 2}) end, "plot: series 1 must be 1-D, got a tensor of shape (2,2)"},
      {function() mg.plot({{1, 2}, {1, 2, 3}}) end, "plot: series 1 has 2 x values and 3 y values"},
      {function() mg.plot({1, 2, lable = "x"}) end, "plot: series 1 has a key 'lable' (known: label, style)"},
      {function() mg.plot({1, 2, style = "bars"}) end,
       "plot: series 1: style must be 'lines', 'points' or 'linespoints', got 'bars'"},
      {function() mg.plot({1, 2}, {titel = "x"}) end, "plot: unknown option 'titel' (did you mean 'title'? known: "
        .. "path, title, xlabel, ylabel, logscale, width, height)"},
      {function() mg.plot(42) end, "plot: series 1 must be a list of numbers, a 1-D tensor or a pair {x, y}, got 42"},
      {function() mg.callbacks.History():plot() end, "History:plot: the history is empty (no epoch ran)"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
  end)

  it("says what to install when gnuplot is missing", function()
    local out, code = h.run("GNUPLOT=/nonexistent/gnuplot " .. h.bin .. " -e 'mg.plot({1, 2})'")
    assert.is_false(code == 0)
    assert.truthy(out:find("plot: gnuplot not found (ran '/nonexistent/gnuplot'); install Debian's gnuplot-nox "
                           .. "(make deps does it), or fix $GNUPLOT", 1, true), out)
  end)

  -- issue 30, item 9: a loss that falls to its lowest value at the last epoch
  -- was drawn on the frame's bottom line, so the curve looked as if it stopped
  it("draws a curve inside the frame, its ends too", function()
    local losses = {}
    for i = 1, 20 do losses[i] = 2 - 0.1 * i end           -- from 1.9 down to 0.0, the last one lowest
    local text = mg.plot(losses)
    local rows = {}
    for line in text:gmatch("[^\n]+") do rows[#rows + 1] = line end
    local frame = {}                                        -- the frame's top and bottom lines
    for i, line in ipairs(rows) do if line:find("+%-%-%-%-%-") then frame[#frame + 1] = i end end
    assert.equal(2, #frame, text)
    local top, bottom = frame[1], frame[2]
    local first, last
    for i = top + 1, bottom - 1 do
      if rows[i]:find("*", 1, true) then first = first or i; last = i end
    end
    assert.is_true(first ~= nil and first > top + 1, text)     -- a row of space above the highest point
    assert.is_true(last < bottom - 1, text)                   -- and below the lowest, at the last epoch
  end)
end)

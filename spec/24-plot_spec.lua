-- mg.plot and history:plot: PNG, SVG and text through gnuplot.
local mg = require "moongrad"
local h = require "helpers"

local function err (fn, msg) assert.has_error(fn, msg) end

local read = h.read

local function quote (s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- runs fn with os.tmpname recording the names it hands out; returns them
local function temporaries (fn)
  local names, tmpname = {}, os.tmpname
  os.tmpname = function() local n = tmpname(); names[#names + 1] = n; return n end
  local ok, e = pcall(fn)
  os.tmpname = tmpname
  if not ok then error(e, 0) end
  return names
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
    local names = temporaries(function()
      assert.equal(path, mg.plot({3, 2, 1.5, 1.2}, mg.constant({4, 3, 2, 1}), {path = path, title = "loss's fall"}))
    end)
    assert.equal("\137PNG\r\n\26\n", read(path):sub(1, 8))
    for _, n in ipairs(names) do assert.is_nil(io.open(n), n .. " was left behind") end
    assert.is_true(#names >= 2)                                   -- the data and the script went through files
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
end)

-- help(name) teaches: every entry of lua/moongrad/help.lua has its arguments,
-- what it returns and an example (lua/moongrad/help_entries.lua); every example
-- runs, and each `expr --> text` line shows what the REPL prints for expr;
-- help(value) names the entry of the value's kind.
local h = require "helpers"
local mg = require "moongrad"
local help = require "moongrad.help"

-- what the REPL prints for values, on one line: each value's repr without a
-- tensor's footer (moongrad.Tensor(2) float32), lines joined, values by ", "
local function shown (...)
  local parts = {}
  for i = 1, select("#", ...) do
    local text = mg.repr((select(i, ...))):gsub("\nmoongrad%.[^\n]*$", "")
    parts[i] = text:gsub("%s*\n%s*", " ")
  end
  return table.concat(parts, ", ")
end

-- runs an example with mg bound and its globals its own; each `expr --> text`
-- line becomes a check of expr. Returns ok, the error, the checks {code=, want=, got=}
local function run_example (name, code)
  local checks, lines = {}, {}
  for line in (code .. "\n"):gmatch("(.-)\n") do
    local expr, want = line:match("^(.-)%s*%-%->%s*(.*)$")
    if expr and not expr:find("^%s*%-%-") then    -- not in a comment
      if not load("return " .. expr) then return false, "not an expression: " .. expr, checks end
      checks[#checks + 1] = {code = expr, want = want}
      line = ("__check(%d, %s)"):format(#checks, expr)
    end
    lines[#lines + 1] = line
  end
  local env = setmetatable({mg = mg, __check = function(k, ...) checks[k].got = shown(...) end}, {__index = _G})
  local f, err = load(table.concat(lines, "\n"), "=" .. name, "t", env)
  if not f then return false, err, checks end
  -- what the examples print goes nowhere (bars and summaries write to io.stdout)
  local null = assert(io.open("/dev/null", "w"))
  local G = _G
  local saved = {print = G.print, stdout = io.stdout, write = io.write}
  G.print, io.stdout, io.write = function() end, null, function(...) return null:write(...) end
  env.print = G.print
  local ok, e = pcall(f)
  G.print, io.stdout, io.write = saved.print, saved.stdout, saved.write
  null:close()
  env, f = nil, nil
  collectgarbage()        -- a tape an example left recording stops now, as its scope's end would stop it
  return ok, e, checks
end

-- entries whose details are still to come
local pending = {}

describe("help entries", function()
  it("give every entry its arguments (or none), what it returns and an example", function()
    local wrong = {}
    for _, e in ipairs(help.entries()) do
      if pending[e.name] then e = {name = e.name, args = {}, returns = "-", example = "-"} end
      if type(e.args) ~= "table" then wrong[#wrong + 1] = e.name .. ": no args (give {} for none)"
      else
        for i, a in ipairs(e.args) do
          if type(a[1]) ~= "string" or type(a[2]) ~= "string" or (a[3] ~= nil and type(a[3]) ~= "string") then
            wrong[#wrong + 1] = e.name .. ": argument " .. i .. " is not {name, what [, default]}"
          end
        end
      end
      if type(e.returns) ~= "string" or e.returns == "" then wrong[#wrong + 1] = e.name .. ": no returns" end
      if type(e.example) ~= "string" or e.example == "" then wrong[#wrong + 1] = e.name .. ": no example" end
    end
    -- and no details for a name without an entry
    for name in pairs(help.details) do
      if not help.entry(name) or help.entry(name).name ~= name then wrong[#wrong + 1] = name .. ": details, no entry" end
    end
    table.sort(wrong)
    assert.same({}, wrong)
  end)

  it("run every example, and each --> shows the value", function()
    local wrong, ran, checked = {}, 0, 0
    local state = mg.random.get_state()
    local threads, mode = mg.get_num_threads()
    for _, e in ipairs(help.entries()) do
      if not pending[e.name] then
        local ok, err, checks = run_example(e.name, e.example)
        ran = ran + 1
        if not ok then wrong[#wrong + 1] = e.name .. ": " .. tostring(err) end
        for _, c in ipairs(checks) do
          checked = checked + 1
          if ok and c.got ~= c.want then
            wrong[#wrong + 1] = ("%s: %s shows %s, the example says %s"):format(e.name, c.code, tostring(c.got), c.want)
          end
        end
      end
    end
    mg.random.set_state(state)
    mg.set_num_threads(mode == "auto" and "auto" or threads)
    assert.same({}, wrong)
    assert.is_true(ran >= 300, "examples run: " .. ran)
    assert.is_true(checked >= 250, "values checked: " .. checked)
  end)

  it("print signature, line, arguments, result and example for a name", function()
    local text = help("sum")
    assert.truthy(text:find("^mg%.sum%(x %[, axis or {axes}%] %[, keepdims%]%)\n    the sum over all axes"))
    assert.truthy(text:find("\nArguments:\n    x         a tensor", 1, true))
    assert.truthy(text:find("\n    keepdims  true keeps reduced axes with size 1 (default false)", 1, true))
    assert.truthy(text:find("\nReturns: a tensor", 1, true))
    assert.truthy(text:find("\nExample:\n    x = mg.tensor{{1, 2}, {3, 4}}\n    x:sum() --> 10.0\n", 1, true))
    assert.truthy(help("Tape:stop"):find("\nArguments: none\n", 1, true))
    -- by the names the docs print, and on tensors' methods
    assert.equal(help("Layer:fit"), help("model:fit"))
    assert.truthy(help("model:fit"):find("^model:fit%(x, y"))
    assert.truthy(help("layer:add_variable"):find("\nExample:\n", 1, true))
    assert.truthy(help("Tensor:sum"):find("^x:sum%(.-\nArguments:\n"))
    -- the index and a group stay one line per name
    assert.falsy(help():find("Arguments:", 1, true))
    assert.falsy(help("autodiff"):find("Arguments:", 1, true))
  end)

  it("gives help(value) the entry of the value's kind", function()
    local quiet = {write = function() end, flush = function() end}
    local model = mg.nn.Sequential{mg.nn.Dense(1)}
    model:compile{optimizer = "sgd", loss = "mse"}
    local Mine = mg.nn.Layer:subclass("HelpSpecLayer")
    function Mine:call (x) return x end
    local cases = {
      {mg.ones(2, 3), "^a tensor float32 shaped {2, 3}\nfields: shape dtype ndim itemsize nbytes\nmethods"},
      {mg.Variable(mg.ones(2), {name = "w"}), '^a Variable named "w"'},
      {mg.tape(), "^a gradient tape"},
      {mg.nn.Dense(3), "^mg%.nn%.Dense%(units"},
      {mg.nn.MultiHeadAttention(1, 2), "^mg%.nn%.MultiHeadAttention%("},
      {model, "^mg%.nn%.Sequential%("},
      {Mine(), "^mg%.nn%.Layer\n"},
      {mg.optim.Adam{}, "^mg%.optim%.Adam{"},
      {mg.schedules.CosineDecay{initial_learning_rate = 1, decay_steps = 10}, "^mg%.schedules%.CosineDecay{"},
      {mg.losses.MeanSquaredError(), "^mg%.losses%.MeanSquaredError%("},
      {mg.callbacks.EarlyStopping{}, "^mg%.callbacks%.EarlyStopping{"},
      {mg.callbacks.History(), "^mg%.callbacks%.History%(%)"},
      {mg.data.Dataset(mg.ones(4, 2)), "^mg%.data%.Dataset%("},
      {mg.data.Dataset(mg.ones(4, 2)):batch(2), "^mg%.data%.Dataset%("},
      {mg.progress(3, {out = quiet, tty = false}), "^mg%.progress%("},
      {mg.matmul, "^mg%.matmul%(a, b%)"},
      {mg.nn.Dense, "^mg%.nn%.Dense%("},
      {mg.ones(2).sum, "^[mgx]+[.:]sum%("},     -- mg.sum's entry, or Tensor:sum's (the same function)
      {mg.tape().gradient, "^t:gradient%("},
      {mg.memory.stats, "^mg%.memory%.stats%(%)"},
    }
    for i, c in ipairs(cases) do
      local text = help(c[1])
      assert.truthy(text:find(c[2]), ("case %d: %s"):format(i, text:sub(1, 80)))
    end
    -- an object's entry comes with its methods
    assert.truthy(help(model):find("\nExample:\n", 1, true))
    assert.truthy(help(model):find("model:fit(x, y", 1, true))
    assert.truthy(help(mg.optim.Adam{}):find("opt:apply_gradients(grads, vars)", 1, true))
    assert.truthy(help(mg.data.Dataset(mg.ones(2))):find("ds:batch(size", 1, true))
    assert.truthy(help(mg.progress(3, {out = quiet, tty = false})):find("bar:update(i", 1, true))
  end)

  it("says what an unknown value is and how to list names", function()
    assert.equal("no help for this number (42): help() lists the groups and their names", help(42))
    assert.truthy(help(function() end):find("^no help for this function %(defined at "))
    assert.truthy(help({a = 1}):find("^no help for this table"))
    assert.truthy(help({a = 1}):find("help%(%) lists the groups"))
  end)

  it("is what the REPL's help prints", function()
    local out, code = h.run_moongrad("-", "help('sum') help(mg.nn.Dense(2))")
    assert.equal(0, code)
    assert.truthy(out:find("^mg%.sum%(x"))
    assert.truthy(out:find("\nArguments:\n", 1, true))
    assert.truthy(out:find("\nmg%.nn%.Dense%(units"))
  end)
end)

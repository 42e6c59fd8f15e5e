-- mg.help and the REPL's help: every public name has an entry, every entry
-- names something that exists, and the API table of docs/reference.md is the one
-- lua/moongrad/help.lua generates.
local h = require "helpers"
local mg = require "moongrad"

local help = mg.help

-- the lazy modules of mg (package.preload holds every embedded one)
local function module_names ()
  local out = {}
  for k in pairs(package.preload) do
    local name = k:match("^moongrad%.([%w_]+)$")
    if name then out[#out + 1] = name end
  end
  table.sort(out)
  return out
end

local function missing_for (prefix, t, missing)
  for k, v in pairs(t) do
    local name = prefix .. k
    if type(k) == "string" and not k:find("^_") and not help.internal[name]
       and (type(v) == "function" or type(v) == "table") and not help.entry(name) then
      missing[#missing + 1] = name
    end
  end
end

describe("mg.help", function()
  it("has an entry for every function and table in mg and its modules", function()
    local missing = {}
    local top = {}
    for k, v in pairs(mg) do top[k] = v end
    for _, name in ipairs(module_names()) do top[name] = mg[name] end
    for k, v in pairs(top) do
      if not k:find("^_") and not help.internal[k] then
        local callable = type(v) == "function" or (getmetatable(v) or {}).__call
        if callable or type(v) ~= "table" then
          if not help.entry(k) then missing[#missing + 1] = k end
        end
        -- a module's fields (help's own are its machinery)
        if type(v) == "table" and k ~= "help" then missing_for(k .. ".", v, missing) end
      end
    end
    table.sort(missing)
    assert.same({}, missing)
  end)

  it("has an entry for every method of tensors, variables, tapes, layers, optimizers, datasets, bars", function()
    local missing = {}
    for _, kind in ipairs{"Tensor", "Variable", "Tape", "Layer", "Sequential", "Optimizer", "Dataset", "Progress"} do
      for m in pairs(help.methods(kind)) do
        local name = kind .. ":" .. m
        local covered = help.entry(name) or help.internal[name] or (kind == "Sequential" and help.entry("Layer:" .. m))
        if not covered then missing[#missing + 1] = name end
      end
    end
    table.sort(missing)
    assert.same({}, missing)
  end)

  it("names in every entry something that exists, with a signature and a line", function()
    local wrong = {}
    for _, e in ipairs(help.entries()) do
      local method = e.name:match(":([%w_]+)$")
      local sig_ok = method and e.signature:find(":" .. method, 1, true)
                     or e.name:find("^Tensor%.") or e.signature:sub(1, #e.name) == e.name
      if help.resolve(e.name) == nil then wrong[#wrong + 1] = e.name .. ": nothing by that name"
      elseif not sig_ok then wrong[#wrong + 1] = e.name .. ": signature " .. e.signature
      elseif type(e.doc) ~= "string" or e.doc == "" or e.doc:find("\n") then
        wrong[#wrong + 1] = e.name .. ": no one-line description"
      end
    end
    assert.same({}, wrong)
  end)

  -- each probe calls an entry's function with O (an options table) in the
  -- place its signature gives; an unknown key makes the code list the keys it knows
  local function probes ()
    local x, img, q = mg.ones(3), mg.ones(1, 4, 4, 1), mg.ones(1, 2, 2)
    local ids, logits = mg.tensor({1, 2}, "int64"), mg.ones(2, 3)
    local csv = os.tmpname()
    local f = assert(io.open(csv, "w")); f:write("1,2\n"); f:close()
    local model = mg.nn.Sequential{mg.nn.Dense(1)}
    model:compile{optimizer = "sgd", loss = "mean_squared_error"}
    local xs, ys = mg.ones(2, 2), mg.ones(2, 1)
    local t = mg.tape({persistent = true})
    local v = mg.Variable(mg.ones(2))
    local y = v * 2
    t:stop()
    return {
      ["Tape:gradient"] = function(O) return t:gradient(y, v, nil, O) end,
      ["Tape:jacobian"] = function(O) return t:jacobian(y, v:value(), O) end,
      ["Tape:batch_jacobian"] = function(O) return t:batch_jacobian(y, v:value(), O) end,
      sort = function(O) return mg.sort(x, 1, O) end,
      argsort = function(O) return mg.argsort(x, 1, O) end,
      topk = function(O) return mg.topk(x, 1, 1, O) end,
      put_along_axis = function(O) return mg.put_along_axis(x, mg.tensor({1}, "int64"), mg.ones(1), 1, O) end,
      pad = function(O) return mg.pad(x, {{1, 1}}, O) end,
      var = function(O) return mg.var(x, 1, false, O) end,
      std = function(O) return mg.std(x, 1, false, O) end,
      norm = function(O) return mg.norm(x, 1, false, O) end,
      cumsum = function(O) return mg.cumsum(x, 1, O) end,
      conv2d = function(O) return mg.conv2d(img, mg.ones(1, 1, 1, 1), O) end,
      conv2d_backward_input = function(O) return mg.conv2d_backward_input(img, mg.ones(1, 1, 1, 1), {1, 4, 4, 1}, O) end,
      conv2d_backward_filter = function(O) return mg.conv2d_backward_filter(img, img, {1, 1, 1, 1}, O) end,
      max_pool2d = function(O) return mg.max_pool2d(img, O) end,
      avg_pool2d = function(O) return mg.avg_pool2d(img, O) end,
      max_pool2d_backward = function(O) return mg.max_pool2d_backward(img, mg.ones(1, 2, 2, 1), O) end,
      avg_pool2d_backward = function(O) return mg.avg_pool2d_backward(mg.ones(1, 2, 2, 1), {1, 4, 4, 1}, O) end,
      scaled_dot_product_attention = function(O) return mg.scaled_dot_product_attention(q, q, q, O) end,
      layer_norm = function(O) return mg.layer_norm(logits, O) end,
      Variable = function(O) return mg.Variable(1, O) end,
      tape = function(O) return mg.tape(O) end,
      custom_gradient = function(O) return mg.custom_gradient(function() end, O) end,
      recompute_grad = function(O) return mg.recompute_grad(function() end, O) end,
      checkpoint_loop = function(O) return mg.checkpoint_loop(function(_, s) return s end, x, 1, O) end,
      ["test.gradcheck"] = function(O) return mg.test.gradcheck(function(a) return a end, {mg.ones(1, "float64")}, O) end,
      save = function(O) return mg.save(csv .. ".st", {a = x}, O) end,
      ["nn.Dense"] = function(O) return mg.nn.Dense(3, O) end,
      ["nn.Lambda"] = function(O) return mg.nn.Lambda(print, O) end,
      ["nn.Sequential"] = function(O) return mg.nn.Sequential({mg.nn.Flatten()}, O) end,
      ["nn.Dropout"] = function(O) return mg.nn.Dropout(0.5, O) end,
      ["nn.BatchNorm"] = function(O) return mg.nn.BatchNorm(O) end,
      ["nn.Conv2D"] = function(O) return mg.nn.Conv2D(1, 1, O) end,
      ["nn.MaxPool2D"] = function(O) return mg.nn.MaxPool2D(2, O) end,
      ["nn.AvgPool2D"] = function(O) return mg.nn.AvgPool2D(2, O) end,
      ["nn.GlobalAveragePooling2D"] = function(O) return mg.nn.GlobalAveragePooling2D(O) end,
      ["nn.Flatten"] = function(O) return mg.nn.Flatten(O) end,
      ["nn.Reshape"] = function(O) return mg.nn.Reshape({1}, O) end,
      ["nn.RevBlock"] = function(O) return mg.nn.RevBlock(mg.nn.Dense(2), mg.nn.Dense(2), O) end,
      ["nn.AffineCoupling"] = function(O) return mg.nn.AffineCoupling(mg.nn.Dense(2), O) end,
      ["nn.InvertibleLinear"] = function(O) return mg.nn.InvertibleLinear(O) end,
      ["nn.Embedding"] = function(O) return mg.nn.Embedding(2, 2, O) end,
      ["nn.PositionalEmbedding"] = function(O) return mg.nn.PositionalEmbedding(2, O) end,
      ["nn.LayerNorm"] = function(O) return mg.nn.LayerNorm(O) end,
      ["nn.MultiHeadAttention"] = function(O) return mg.nn.MultiHeadAttention(1, 2, O) end,
      ["nn.TransformerBlock"] = function(O) return mg.nn.TransformerBlock(1, 2, O) end,
      ["Layer:summary"] = function(O) return model:summary(O) end,
      ["Layer:compile"] = function(O) return mg.nn.Dense(1):compile(O) end,
      ["Layer:fit"] = function(O) return model:fit(xs, ys, O) end,
      ["Layer:evaluate"] = function(O) return model:evaluate(xs, ys, O) end,
      ["Layer:predict"] = function(O) return model:predict(xs, O) end,
      ["optim.SGD"] = function(O) return mg.optim.SGD(O) end,
      ["optim.Adam"] = function(O) return mg.optim.Adam(O) end,
      ["optim.AdamW"] = function(O) return mg.optim.AdamW(O) end,
      ["optim.RMSprop"] = function(O) return mg.optim.RMSprop(O) end,
      ["schedules.ExponentialDecay"] = function(O) return mg.schedules.ExponentialDecay(O) end,
      ["schedules.CosineDecay"] = function(O) return mg.schedules.CosineDecay(O) end,
      ["schedules.LinearWarmup"] = function(O) return mg.schedules.LinearWarmup(O) end,
      ["schedules.PiecewiseConstantDecay"] = function(O) return mg.schedules.PiecewiseConstantDecay(O) end,
      ["losses.mean_squared_error"] = function(O) return mg.losses.mean_squared_error(logits, logits, O) end,
      ["losses.mean_absolute_error"] = function(O) return mg.losses.mean_absolute_error(logits, logits, O) end,
      ["losses.binary_crossentropy"] = function(O) return mg.losses.binary_crossentropy(logits, logits, O) end,
      ["losses.categorical_crossentropy"] = function(O) return mg.losses.categorical_crossentropy(logits, logits, O) end,
      ["losses.sparse_categorical_crossentropy"] = function(O) return mg.losses.sparse_categorical_crossentropy(ids, logits, O) end,
      ["losses.MeanSquaredError"] = function(O) return mg.losses.MeanSquaredError(O) end,
      ["losses.MeanAbsoluteError"] = function(O) return mg.losses.MeanAbsoluteError(O) end,
      ["losses.BinaryCrossentropy"] = function(O) return mg.losses.BinaryCrossentropy(O) end,
      ["losses.CategoricalCrossentropy"] = function(O) return mg.losses.CategoricalCrossentropy(O) end,
      ["losses.SparseCategoricalCrossentropy"] = function(O) return mg.losses.SparseCategoricalCrossentropy(O) end,
      ["metrics.perplexity"] = function(O) return mg.metrics.perplexity(ids, logits, O) end,
      ["callbacks.EarlyStopping"] = function(O) return mg.callbacks.EarlyStopping(O) end,
      ["callbacks.TerminateOnNaN"] = function(O) return mg.callbacks.TerminateOnNaN(O) end,
      ["callbacks.ProgbarLogger"] = function(O) return mg.callbacks.ProgbarLogger(O) end,
      ["callbacks.LambdaCallback"] = function(O) return mg.callbacks.LambdaCallback(O) end,
      ["checkpoint.save"] = function(O) return mg.checkpoint.save(csv .. ".st", O) end,
      ["checkpoint.restore"] = function(O) return mg.checkpoint.restore(csv, O) end,
      ["checkpoint.callback"] = function(O) return mg.checkpoint.callback("c.safetensors", O) end,
      ["Dataset:shuffle"] = function(O) return mg.data.Dataset(x):shuffle(1, O) end,
      ["Dataset:batch"] = function(O) return mg.data.Dataset(x):batch(1, O) end,
      ["data.read_csv"] = function(O) return mg.data.read_csv(csv, O) end,
      ["data.read_idx"] = function(O) return mg.data.read_idx(csv, O) end,
      progress = function(O) return mg.progress(1, O) end,
      plot = function(O) return mg.plot({1, 2}, O) end,
      repr = function(O) return mg.repr(1, O) end,
      ["gemm.choice"] = function(O) return mg.gemm.choice(2, 2, 2, O) end,
    }, function() os.remove(csv) end
  end

  it("lists in each signature only options the code knows", function()
    local wrong = {}
    local list, cleanup = probes()
    for name, probe in pairs(list) do
      local e = help.entry(name)
      local ok, err = pcall(probe, {zz_unknown = 1})
      local known = not ok and tostring(err):match("known: ([%w_, ]+)")
      if not e then wrong[#wrong + 1] = name .. ": no entry"
      elseif not known then wrong[#wrong + 1] = name .. ": no list of known options in " .. tostring(err)
      else
        local set = {}
        for k in known:gmatch("[%w_]+") do set[k] = true end
        for group in e.signature:gmatch("%b{}") do       -- the keys of options tables, not their values'
          for k in group:sub(2, -2):gsub("%b{}", ""):gmatch("([%w_]+)=") do
            if not set[k] then wrong[#wrong + 1] = name .. ": " .. k .. "= is not one of " .. known end
          end
        end
        if os.getenv("HELP_SHOW_KNOWN") then io.stderr:write(name, ": ", known, "\n") end
      end
    end
    cleanup()
    table.sort(wrong)
    assert.same({}, wrong)
  end)

  it("gives the line of a function, a class, a method value and a name", function()
    assert.equal("mg.matmul(a, b)\n    the matrix product a @ b (batched, broadcast, vectors)\nArguments:\n",
                 help(mg.matmul):match("^.-\nArguments:\n"))
    assert.equal(help(mg.matmul), help("matmul"))
    assert.equal(help(mg.matmul), help("mg.matmul"))
    assert.equal(help(mg.sum), help(mg.ones(2).sum))
    assert.equal("x:sum([axis or {axes}] [, keepdims])\n    the sum over all axes, an axis, or a list of axes\nArguments:\n",
                 help("Tensor:sum"):match("^.-\nArguments:\n"))
    assert.truthy(help(mg.nn.Dense):find("^mg%.nn%.Dense%(units %[, activation%]"))
    assert.truthy(help(mg.memory.stats):find("^mg%.memory%.stats%(%)\n"))
    assert.equal(help(mg.losses.mean_squared_error), help("losses.mean_squared_error"))
  end)

  it("describes objects by their metatable: tapes, tensors, variables, layers, optimizers", function()
    local t = mg.tape()
    local text = help(t)
    assert.truthy(text:find("^a gradient tape"))
    assert.truthy(text:find("t:gradient(target, sources", 1, true))
    assert.truthy(help(mg.ones(2, 3)):find("^a tensor float32 shaped {2, 3}\nfields: shape dtype ndim itemsize nbytes\nmethods"))
    assert.truthy(help(mg.Variable(mg.ones(2), {name = "w"})):find('^a Variable named "w"'))
    local layer = mg.nn.Dense(3)
    assert.truthy(help(layer):find("^mg%.nn%.Dense%("))
    assert.truthy(help(layer):find("model:fit(x, y", 1, true))
    assert.truthy(help(mg.nn.Sequential{layer}):find("^mg%.nn%.Sequential%("))
    assert.truthy(help(mg.optim.Adam{}):find("opt:apply_gradients(grads, vars)", 1, true))
  end)

  it("lists the groups with help() and a group by its name; says when it has nothing", function()
    local all = help()
    for _, g in ipairs(help.groups) do assert.truthy(all:find("\n" .. g[1] .. " ", 1, true), g[1]) end
    assert.truthy(help("autodiff"):find("^autodiff:\n  mg%.tape%("))
    assert.equal('no help for "nosuch": help() lists the groups and their names', help("nosuch"))
    assert.equal("no help for this number (42): help() lists the groups and their names", help(42))
  end)

  it("writes the API table of docs/reference.md", function()
    local f = assert(io.open("docs/reference.md", "rb"))
    local reference = f:read("a")
    f:close()
    local table_text = reference:match("<!%-%- api%-table: [^\n]*%-%->\n(.-)<!%-%- api%-table end %-%->")
    assert.is_not_nil(table_text, "docs/reference.md has no api-table markers")
    assert.equal(help.markdown(), table_text, "docs/reference.md's API table is stale: run make api-table")
  end)

  it("is the global help of the interpreter, which prints; the module sets no global", function()
    local out, code = h.run_moongrad("-", "help(mg.matmul) help('nn.Dense')")
    assert.equal(0, code)
    assert.truthy(out:find("^mg%.matmul%(a, b%)\n    the matrix product"))
    assert.truthy(out:find("\nmg%.nn%.Dense%(units"))
    -- busted may run inside the interpreter (make asan), where help is predefined
    local before = rawget(_G, "help")
    assert.truthy(help("matmul"))
    assert.equal(before, rawget(_G, "help"))
  end)
end)

-- The Lua side's structure: one layer base (moongrad.layer) that nn, the
-- transformer's and the reversible layers all derive from; one class idiom
-- (moongrad.class) for every class; no module sets a global; one softmax
-- cross entropy and one epoch order.
local mg = require "moongrad"
local h = require "helpers"

local nn = mg.nn
local layer = require "moongrad.layer"
local class = require "moongrad.class"

-- runs a Lua script with the moongrad interpreter; returns its output
local function run (script)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(script)
  f:close()
  local out, code = h.run(h.bin .. " " .. path .. " 2>&1")
  os.remove(path)
  assert.equal(0, code, out)
  return out
end

-- the classes a class derives from, itself first
local function ancestry (cls)
  local out = {}
  while cls do
    out[#out + 1] = cls
    cls = rawget(cls, "__parent")
  end
  return out
end

local LAYER_CLASSES = {"Dense", "Lambda", "Sequential", "Conv2D", "MaxPool2D", "AvgPool2D", "GlobalAveragePooling2D",
                       "Flatten", "Reshape", "Dropout", "BatchNorm", "Embedding", "PositionalEmbedding", "LayerNorm",
                       "MultiHeadAttention", "TransformerBlock", "RecomputeLayer", "ReversibleLayer", "RevBlock",
                       "AffineCoupling", "InvertibleLinear"}

describe("moongrad.layer", function()
  it("is the one base of nn's, the transformer's and the reversible layers", function()
    assert.equal(layer.Layer, nn.Layer)
    for _, name in ipairs(LAYER_CLASSES) do
      local cls = nn[name]
      local chain = ancestry(cls)
      assert.equal(nn.Layer, chain[#chain], name)
      assert.equal("moongrad.nn." .. name, cls.__name)
      assert.equal(name, layer.classes[cls])
    end
    assert.equal(require("moongrad.transformer").TransformerBlock, nn.TransformerBlock)
    assert.equal(require("moongrad.reversible").RevBlock, nn.RevBlock)
    for _, l in ipairs{nn.Dense(2), nn.LayerNorm(), nn.TransformerBlock(2, 4), nn.RevBlock(nn.Dense(2), nn.Dense(2)),
                       nn.InvertibleLinear()} do
      assert.is_true(layer.is_layer(l), tostring(l))
    end
    assert.is_false(layer.is_layer(nn.Dense))       -- a class, not a layer
    assert.is_false(layer.is_layer(mg.optim.SGD()))
  end)

  it("is the same Layer the nn re-exports, with nn's public functions its own", function()
    assert.equal(layer.glorot_uniform, nn.glorot_uniform)
    assert.equal(layer.dropout, nn.dropout)
  end)

  it("loads without mg.nn: the transformer's and the reversible modules do not require it at load", function()
    local out = run [[
      for k in pairs(package.loaded) do if k:find("^moongrad%.") then package.loaded[k] = nil end end
      local t = require "moongrad.transformer"
      local r = require "moongrad.reversible"
      print("nn loaded:", package.loaded["moongrad.nn"] ~= nil)
      local block = t.TransformerBlock(2, 4)      -- its MLP's Dense comes from mg.nn, loaded now
      print(block(mg.ones{1, 3, 4}).shape[3], package.loaded["moongrad.nn"] ~= nil)
      print(r.RevBlock(function(x) return x end, function(x) return x end)(mg.ones{1, 4}).shape[2])
    ]]
    assert.equal("nn loaded:\tfalse\n4\ttrue\n4\n", out)
  end)

  it("says a base class is not called", function()
    assert.has_error(function() nn.Layer() end,
                     "Layer: Layer is a base class: make one with mg.nn.Layer:subclass(name) and define call")
  end)
end)

describe("Layer:subclass", function()
  it("makes a user's layer that tracks its variables and sublayers", function()
    local MyLayer = nn.Layer:subclass("MyLayer")
    function MyLayer:init (units) self.inner = nn.Dense(units); self.scale = mg.Variable(mg.ones{}) end
    function MyLayer:call (x) return self.inner(x) * self.scale end
    local l = MyLayer(3)
    assert.equal("my_layer", l.name)
    assert.equal("moongrad.nn.MyLayer 'my_layer'", tostring(l))
    assert.is_true(layer.is_layer(l))
    local y = l(mg.ones{2, 5})
    assert.same({2, 3}, y.shape)
    assert.equal(3, #l.variables)                       -- scale, the Dense's kernel and bias
    assert.same({2, 3}, rawget(l, "_output_shape"))     -- noted by the layers' __call
    -- a subclass of it inherits call and init, and tracks assignments too
    local Deeper = MyLayer:subclass("Deeper")
    local d = Deeper(2)
    d.extra = mg.Variable(mg.zeros{2})
    assert.same({4, 2}, d(mg.ones{4, 5}).shape)
    assert.equal(4, #d.variables)
    assert.same({MyLayer, nn.Layer}, {ancestry(Deeper)[2], ancestry(Deeper)[3]})
    local NoInit = nn.Layer:subclass("NoInit")
    assert.has_error(function() NoInit(1) end,
                     "NoInit: the constructor takes no arguments (define NoInit:init(...) to take some)")
  end)

  it("tracks what a list holds when it is asked, not only when assigned (Keras' lists)", function()
    local Stack = nn.Layer:subclass("ListStack")
    function Stack:init (n)
      self.blocks = {}                                  -- assigned empty, filled after
      for i = 1, n do self.blocks[i] = nn.Dense(4) end
      self.nested = {{}}
      self.nested[1][1] = nn.Dropout(0.5)
      self.scales = {}
      self.scales[1] = mg.Variable(mg.ones{})
    end
    function Stack:call (x)
      for _, b in ipairs(self.blocks) do x = b(x) end
      return self.nested[1][1](x) * self.scales[1]
    end
    local s = Stack(3)
    s(mg.ones{2, 4})
    assert.equal(7, #s.variables)                       -- 3 kernels, 3 biases and the scale
    assert.equal(7, #s.trainable_variables)
    s.blocks[4] = nn.Dense(4)                           -- added later still: tracked when asked
    s(mg.ones{2, 4})
    assert.equal(9, #s.variables)
    local names = {}
    for _, e in ipairs(require("moongrad.checkpoint").names(s)) do names[#names + 1] = e.name end
    assert.equal(9, #names)
    -- the Dropout in the nested list is in inference mode under evaluate/predict and training_off
    local drop = s.nested[1][1]
    layer.training_off(s, function() assert.is_false(drop.training) end)
    assert.is_true(drop.training)
    -- a list that holds itself (or holds a list that holds it) is walked once
    local Cyc = nn.Layer:subclass("ListCycle")
    function Cyc:init () local l = {nn.Dense(2)}; l[2] = l; self.l = l; self.l[3] = {nn.Dense(3), l} end
    function Cyc:call (x) return self.l[3][1](self.l[1](x)) end
    local c = Cyc()
    c(mg.ones{1, 2})
    assert.equal(4, #c.variables)
    -- a field that holds a list for a while (activations kept in call) piles nothing up
    local Keep = nn.Layer:subclass("ListKeep")
    function Keep:init () self.d = nn.Dense(4) end
    function Keep:call (x) local y = self.d(x); self.saved = {x, y}; self.saved = nil; return y end
    local k = Keep()
    for _ = 1, 50 do k(mg.ones{2, 4}) end
    assert.equal(2, #k.variables)
    assert.same({"saved"}, rawget(k, "_list_fields"))
    -- a layer in its own list, and tied layers, count as before (checkpoint names unchanged)
    local Self = nn.Layer:subclass("ListSelf")
    function Self:init () self.all = {}; self.all[1] = self; self.all[2] = nn.Dense(2) end
    function Self:call (x) return self.all[2](x) end
    local me = Self()
    me(mg.ones{1, 2})
    assert.equal(2, #me.variables)
    local d, e = nn.Dense(2), nn.Dense(2)
    local tied = nn.Sequential{d, d, e}
    tied(mg.ones{1, 2})
    local names = {}
    for _, n in ipairs(require("moongrad.checkpoint").names(tied)) do names[#names + 1] = n.name:match("^[^/]*") end
    assert.same({"dense", "dense", "dense_2", "dense_2"}, names)
  end)

  it("tracks what a dict holds too (Keras' dicts), in one order, and layers that hold each other once", function()
    local Heads = nn.Layer:subclass("DictHeads")
    function Heads:init ()
      self.heads = {v = nn.Dense(2), q = nn.Dense(2)}     -- assigned full
      self.params = {}                                    -- assigned empty, filled after
      self.params.scale = mg.Variable(mg.ones{}, {name = "scale"})
      self.mixed = {nn.Dense(2), extra = {gate = nn.Dense(2)}, [3] = nn.Dense(2)}   -- a list with a hole, a dict in it
      self.vocab = {the = 1, cat = 2}                     -- plain values: nothing to own
    end
    function Heads:call (x)
      local y = (self.heads.q(x) + self.heads.v(x)) * self.params.scale
      return self.mixed[3](self.mixed.extra.gate(self.mixed[1](y)))
    end
    local m = Heads()
    local x = mg.ones{3, 2}
    m(x)
    assert.equal(11, #m.variables)                      -- 5 Dense layers' kernels and biases, the scale
    assert.equal(11, #m.trainable_variables)
    -- numbers, then strings, sorted: the same order, and names, in every process
    local names = {}
    for i, e in ipairs(mg.checkpoint.names(m)) do names[i] = e.name end
    assert.same({"scale", "dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias", "dense_2/kernel",
                 "dense_2/bias", "dense_3/kernel", "dense_3/bias", "dense_4/kernel", "dense_4/bias"}, names)
    assert.equal(m.heads.q, rawget(m, "_layers")[1])     -- heads' q before v, whatever the hashing
    assert.equal(m.mixed[3], rawget(m, "_layers")[4])   -- the list part, then [3], then "extra"
    -- a training step moves them all (they were silently left out before)
    local vars = m.trainable_variables
    local before = {}
    for i, v in ipairs(vars) do before[i] = v:value():totable() end
    local t = mg.tape()
    local loss = mg.sum(m(x) ^ 2)
    t:stop()
    mg.optim.SGD{learning_rate = 0.1}:apply_gradients(t:gradient(loss, vars), vars)
    for i, v in ipairs(vars) do assert.are_not.same(before[i], v:value():totable()) end
    -- a dict filled after it was assigned counts what it holds when asked
    m.params.bias = mg.Variable(mg.zeros{})
    assert.equal(12, #m.variables)
    -- save and load by those names
    local d = h.tempdir()
    m:save_weights(d .. "/w.safetensors")
    local n = Heads()
    n(x)
    n.params.bias = mg.Variable(mg.zeros{})
    n:load_weights(d .. "/w.safetensors")
    assert.same(m(x):totable(), n(x):totable())
    h.remove_tree(d)
    -- a parent held by its child in a list and a dict: each layer walked once
    local Child = nn.Layer:subclass("DictChild")
    function Child:init () self.d = nn.Dense(2) end
    function Child:call (y) return self.d(y) end
    local Parent = nn.Layer:subclass("DictParent")
    function Parent:init () self.c = Child(); self.c.up = {self}; self.c.owner = {model = self} end
    function Parent:call (y) return self.c(y) end
    local p = Parent()
    p(x)
    assert.equal(2, #p.variables)
    assert.equal(2, #p.c.variables)
    assert.equal(2, #mg.checkpoint.names(p))
    local drop = nn.Dropout(0.5)
    p.c.owner.drop = drop
    layer.training_off(p, function() assert.is_false(drop.training) end)
    -- a child holding its parent owns the parent's variables too (Keras' tracking);
    -- rawset keeps a back-reference out of it
    local VarParent = nn.Layer:subclass("DictVarParent")
    function VarParent:init () self.w = mg.Variable(mg.ones{2}); self.c = Child(); self.c.owner = {model = self} end
    function VarParent:call (y) return self.c(y) * self.w end
    local vp = VarParent()
    vp(x)
    assert.equal(3, #vp.variables)
    assert.equal(3, #vp.c.variables)
    local Quiet = nn.Layer:subclass("DictQuietParent")
    function Quiet:init () self.w = mg.Variable(mg.ones{2}); self.c = Child(); rawset(self.c, "owner", {model = self}) end
    function Quiet:call (y) return self.c(y) * self.w end
    local qp = Quiet()
    qp(x)
    assert.equal(2, #qp.c.variables)
  end)

  it("a dict that names layers it already holds changes no checkpoint name; odd keys warn; data is scanned once", function()
    local function names_of (m)
      local out = {}
      for i, e in ipairs(mg.checkpoint.names(m)) do out[i] = e.name end
      return out
    end
    local Plain = nn.Layer:subclass("AliasPlain")
    function Plain:init () self.encoder = nn.Dense(4); self.head = nn.Dense(1) end
    function Plain:call (y) return self.head(self.encoder(y)) end
    local Alias = nn.Layer:subclass("AliasDict")
    function Alias:init ()
      self.encoder = nn.Dense(4)
      self.by_name = {encoder = self.encoder}           -- an alias, Keras-style
      self.head = nn.Dense(1)
      self.flags = {[false] = nn.Dense(2), [true] = nn.Dense(3)}   -- boolean keys: false first
    end
    function Alias:call (y) return self.head(self.encoder(y)) + mg.sum(self.flags[true](self.flags[false](y))) end
    local a, pl = Alias(), Plain()
    a(mg.ones{1, 3}); pl(mg.ones{1, 3})
    local want = names_of(pl)                           -- dense/..., dense_1/...
    local got = names_of(a)
    assert.same(want, {got[1], got[2], got[3], got[4]})
    assert.same({"dense_2/kernel", "dense_2/bias", "dense_3/kernel", "dense_3/bias"}, {got[5], got[6], got[7], got[8]})
    assert.same({2, 3}, a.flags[true].kernel.shape)
    -- a layer under a key with no order (a table) is not tracked, and says so once
    local out, code = h.run_script([[
      local nn = mg.nn
      local Odd = nn.Layer:subclass("OddKeys")
      function Odd:init () self.m = {[{}] = nn.Dense(2)} end
      function Odd:call (x) return x end
      local o = Odd()
      print(#rawget(o, "_layers"), #o.variables, #o.variables)
    ]])
    assert.equal(0, code)
    local _, warnings = out:gsub("a variable or layer under a key of type table is not tracked", "")
    assert.equal(1, warnings)
    assert.truthy(out:find("0\t0\t0"))
    -- a big table of plain values (a vocabulary) beside the layers: the variables as before
    local Tok = nn.Layer:subclass("VocabLayer")
    function Tok:init ()
      self.d = nn.Dense(2)
      local vocab = {}
      for i = 1, 5000 do vocab["w" .. i] = i end
      self.vocab = vocab
    end
    function Tok:call (y) return self.d(y) end
    local tok = Tok()
    tok(mg.ones{1, 2})
    for _ = 1, 3 do assert.equal(2, #tok.variables) end
  end)

  it("the layers' __call asks a hook before each call and tells it after, also when the call fails or yields", function()
    local log = {}
    local function hook (self) log[#log + 1] = self and "before" or "after" end
    local Y = nn.Layer:subclass("HookYield")
    function Y:call (a) return a + coroutine.yield("in") end
    local E = nn.Layer:subclass("HookError")
    function E:call () error("boom", 0) end
    local R = nn.Layer:subclass("HookReplace")
    function R:call () mg._layer_around(function(s) log[#log + 1] = s and "other" or "other after" end); return 1 end
    local was = mg._layer_around(hook)
    local co = coroutine.wrap(function() return Y()(1) end)
    assert.equal("in", co())
    assert.equal(4, co(3))
    assert.same({false, "boom"}, {pcall(E())})
    assert.equal(1, R()())                             -- the hook it asked is the one it tells
    mg._layer_around(was)
    assert.same({"before", "after", "before", "after", "before", "after"}, log)
    local M = nn.Layer:subclass("HookNone")
    function M:call (...) return ... end
    assert.equal(4, select("#", M()(1, nil, 3, nil)))  -- without a hook: every result, nils too
  end)

  it("makes RecomputeLayer subclasses that run under recompute_grad", function()
    local Block = nn.RecomputeLayer:subclass("Block")
    function Block:init () self.dense = nn.Dense(2) end
    function Block:call (x) return mg.tanh(self.dense(x)) end
    local b = Block()
    local x = mg.ones{3, 2}
    local t = mg.tape()
    local y = b(x)
    local loss = mg.sum(y)
    t:stop()
    assert.same({3, 2}, y.shape)
    local g = t:gradient(loss, b.variables)
    assert.equal(2, #g)
    assert.same({2, 2}, g[1].shape)
    assert.equal(getmetatable(b).__call, nn.RecomputeLayer.__call)   -- inherited by the subclass
  end)
end)

describe("moongrad.class", function()
  it("makes callable classes whose instances inherit methods and metamethods", function()
    local Animal = class("moongrad.spec.Animal")
    function Animal.__new (name) return setmetatable({name = name}, Animal) end
    function Animal:speak () return self.name .. " speaks" end
    Animal.__tostring = function(self) return "animal " .. self.name end
    local Dog = class("moongrad.spec.Dog", Animal)
    function Dog.__new (name) return setmetatable({name = name}, Dog) end
    function Dog:fetch () return self.name .. " fetches" end
    local d = Dog("rex")
    assert.equal("rex speaks", d:speak())
    assert.equal("rex fetches", d:fetch())
    assert.equal("animal rex", tostring(d))
    assert.equal(Animal, Dog.__parent)
    assert.is_nil(Animal("cat").fetch)
    local Base = class("moongrad.spec.Base")
    assert.has_error(function() Base() end, "moongrad.spec.Base is a base class: it makes no instances")
  end)

  it("is how every class is made: layers, optimizers, schedules, callbacks, losses, datasets", function()
    local construct = getmetatable(class("moongrad.spec.Any")).__call
    local classes = {mg.optim.SGD, mg.optim.Adam, mg.optim.AdamW, mg.optim.RMSprop, mg.schedules.CosineDecay,
                     mg.schedules.ExponentialDecay, mg.callbacks.EarlyStopping, mg.callbacks.History,
                     mg.losses.SparseCategoricalCrossentropy, mg.data.Dataset, nn.Layer:subclass("Mine")}
    for _, name in ipairs(LAYER_CLASSES) do classes[#classes + 1] = nn[name] end
    for _, cls in ipairs(classes) do
      assert.equal(construct, getmetatable(cls).__call, cls.__name)
      assert.is_string(cls.__name)
    end
    local instances = {mg.optim.Adam(), mg.schedules.CosineDecay{initial_learning_rate = 1, decay_steps = 2},
                       mg.callbacks.EarlyStopping(), mg.losses.SparseCategoricalCrossentropy(), mg.data.Dataset(mg.ones{2}),
                       mg.progress(1, {out = {write = function() end, flush = function() end}, tty = false}),
                       mg.checkpoint.callback("x")}
    for _, obj in ipairs(instances) do
      local cls = getmetatable(obj)
      assert.equal(construct, getmetatable(cls).__call, cls.__name)
      assert.equal(cls, cls.__index, cls.__name)
    end
  end)
end)

describe("the Lua modules", function()
  it("set no globals", function()
    local out = run [[
      local loaded = package.loaded
      for k in pairs(loaded) do if k:find("^moongrad%.") then loaded[k] = nil end end
      local before = {}
      for k in pairs(_G) do before[k] = true end
      local set = {}
      setmetatable(_G, {__newindex = function(t, k, v) set[#set + 1] = tostring(k); rawset(t, k, v) end})
      local names = {}
      for name in pairs(package.preload) do
        if name:find("^moongrad%.") and name ~= "moongrad.mpi" then names[#names + 1] = name end
      end
      table.sort(names)
      for _, name in ipairs(names) do
        local ok, err = pcall(require, name)
        if not ok then print("failed: " .. name .. ": " .. tostring(err)) end
      end
      getmetatable(mg.nn).__load_extensions()
      setmetatable(_G, nil)
      for k in pairs(_G) do if not before[k] then set[#set + 1] = tostring(k) end end
      print(#names > 15, table.concat(set, " "))
    ]]
    assert.equal("true\t\n", out)
  end)

  it("have one softmax cross entropy: nn's is losses'", function()
    local logits = mg.constant({{1, 2, 3}, {0, 0, 1}})
    local labels = mg.constant({3, 1}, "int64")
    assert.equal(mg.losses.softmax_cross_entropy(logits, labels):item(), nn.softmax_cross_entropy(logits, labels):item())
    assert.has_error(function() nn.softmax_cross_entropy(logits, mg.constant({4, 1}, "int64")) end)
  end)

  it("have one epoch order: mg.data.permutation (fit has none of its own)", function()
    assert.is_nil(require("moongrad.fit").epoch_order)
    assert.same(mg.data.permutation(6, 3, 2):totable(), mg.data.permutation(6, 3, 2):totable())
  end)
end)

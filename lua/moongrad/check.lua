--- moongrad.check: argument checks shared by the pure-Lua modules (nn, optim,
-- progress, test), so that every message has one form:
--   SGD: option 'momentum' must be a number in [0, 1), got 1
--   Adam: unknown option 'betta1' (did you mean 'beta1'? known: learning_rate, beta1, ...)
--   Sequential: layer 2 is nil (a hole in the list)
-- Errors point at the first caller outside moongrad's own Lua modules (the
-- user's line), however deep inside nn.lua the check ran.
-- @module moongrad.check
local mg = require "moongrad"

local check = {}

-- {======================= raising errors ======================

local getinfo = debug and debug.getinfo
local layer_call = mg._layer_call                  -- the layers' __call (nn.lua)

local function internal (source)
  return source:find("moongrad/[%w_]+%.lua$") ~= nil
end

-- the level (counted from the caller of first_user) of the first frame at or
-- above its level `level` outside these modules. mg._layer_call, the layers'
-- __call, is one of them; so is a pcall that they made (check.guard's), not
-- one the user made (pcall(mg.nn.Dense, 0) has no position, as
-- pcall(string.rep) in Lua). nil: none (a C host called in)
local function first_user (level)
  local info = getinfo(level + 1, "Sf")
  while info do
    local ours = internal(info.source) or info.func == layer_call
    if not ours and (info.func == pcall or info.func == xpcall) then
      local caller = getinfo(level + 2, "S")
      ours = caller ~= nil and internal(caller.source)
    end
    if not ours then return level end
    level = level + 1
    info = getinfo(level + 1, "Sf")
  end
end

-- error's level for the user's line, from the function that calls error (0:
-- no user frame, no position)
local function user_level ()
  if not getinfo then return 2 end
  local level = first_user(3)                       -- 1 is user_level, 2 is its caller
  return level and level - 1 or 0                   -- counted from that caller, as error counts
end

-- the work under way (check.within: "fit", "fit: validation_data"), or nil
local context

-- msg as said under ctx: "fit: " .. msg, unless msg already starts with
-- ctx's function ("fit: x has 4 samples ...")
local function prefixed (ctx, msg)
  if not ctx then return msg end
  local head = ctx:match("^[^:]+")
  if msg:sub(1, #head + 1) == head .. ":" then return msg end
  return ctx .. ": " .. msg
end

--- Raises "who: <fmt formatted>" at the user's line (under check.within's
-- context: "fit: who: ...").
function check.fail (who, fmt, ...)
  error(prefixed(context, who .. ": " .. fmt:format(...)), user_level())
end

-- A message that starts with the position of one of these modules (raised by
-- a plain error, by a C function that they called, or passed on by one that
-- ran a callback: "moongrad/checkpoint_loop.lua:172: x.lua:9: boom") loses
-- it: what is left is re-raised at the user's line, or as it is when it
-- already names a place (the user's own callback raised it).
local LIBRARY_AT = "^[^\n]-moongrad/[%w_]+%.lua:%d+: (.*)$"

-- whether msg starts with a position ("x.lua:9: ", '[string "..."]:1: ')
local function placed (msg)
  return msg:find("^[^%s:]+:%d+: ") ~= nil or msg:find('^%[string ".-"%]:%d+: ') ~= nil
end

-- e without the library positions it starts with; nil: it starts with none
local function unplaced (e)
  local rest = type(e) == "string" and e:match(LIBRARY_AT)
  while rest and rest:match(LIBRARY_AT) do rest = rest:match(LIBRARY_AT) end
  return rest
end

-- e raised again: without its library positions at the user's line (said
-- under who, when given: "fit: ..."), or as it is when it names the user's place
local function relocate (e, who)
  local rest = unplaced(e)
  if not rest or placed(rest) then error(rest or e, 0) end
  error(prefixed(who, rest), user_level())
end

--- fn(...) as the work of who ("fit"): an error that these modules raise
-- meanwhile says who first ("fit: mean_squared_error: y_true has shape
-- ..."); the user's own errors (a callback's) pass unchanged.
function check.within (who, fn, ...)
  local outer = context
  context = who
  local r = table.pack(pcall(fn, ...))
  context = outer
  if r[1] then return table.unpack(r, 2, r.n) end
  relocate(r[2], who)
end

local guarded = setmetatable({}, {__mode = "k"})    -- wrapper -> the function it wraps

-- whether the caller of the caller of called_by_user is the user's code
-- (past mg._layer_call, which runs a layer's call; a pcall is its caller's:
-- fit's pcall(mg.mixed_precision.run, ...) is the library's)
local function called_by_user ()
  local level = 3
  local info = getinfo(level, "Sf")
  while info and info.func == layer_call do
    level = level + 1
    info = getinfo(level, "Sf")
  end
  if info and (info.func == pcall or info.func == xpcall) then info = getinfo(level + 1, "S") end
  return info ~= nil and not internal(info.source)
end

-- A layer call's error, which mg._layer_call (C) hands here: when the user's
-- code called the layer, a position in these modules that the error starts
-- with (an op's check in a built-in layer's call, nn.lua's line) gives way
-- to the user's line; called by a layer or by fit, it goes on as it is, for
-- them to place. (Layer calls are not guarded: see public below.)
if mg._layer_errors then
  mg._layer_errors(function(e)
    if called_by_user() then relocate(e) end
    error(e, 0)
  end)
end

-- the end of a guarded call, tail-called by the wrapper g (so that g's
-- caller is called_by_user's level 3, as from g): the results, or the error,
-- placed at the user's line when the user called g, else as it is
local function rethrow (ok, ...)
  if ok then return ... end
  if called_by_user() then relocate((...)) end
  error((...), 0)
end

--- f, wrapped so that an error it raises when the user called it (not
-- another of these modules) names the user's line: check.fail does that by
-- itself, but errors raised by C functions (mg.load in checkpoint.restore)
-- or by plain error() would name a line of moongrad/*.lua. Who called is
-- looked at only when f failed: a call costs a pcall (a look at the stack
-- each time made a layer call 2.5 us slower).
function check.guard (f)
  if not getinfo or type(f) ~= "function" or guarded[f] then return f end
  local function g (...)
    return rethrow(pcall(f, ...))
  end
  guarded[g] = f
  return g
end

--- The function g wraps (help's "defined at"), or g itself.
function check.unguarded (g) return guarded[g] or g end

-- whether key = v is a public function of these modules (not __index,
-- _build...). Not a layer's call, which mg._layer_call runs: a wrapper's
-- frame would hold the layer's input until the layer returned (spec/08);
-- its own checks go through check.fail.
local function public (k, v)
  return type(k) == "string" and not k:find("^_") and k ~= "call" and type(v) == "function" and getinfo
         and internal(getinfo(v, "S").source)
end

--- Guards every public function of module t (and its metatable's __call, for
-- a callable module); returns t. Classes guard their methods by themselves
-- (moongrad.class).
function check.export (t)
  for k, v in pairs(t) do
    if public(k, v) then t[k] = check.guard(v) end
  end
  local mt = getmetatable(t)
  if type(mt) == "table" and type(rawget(mt, "__call")) == "function" then mt.__call = check.guard(mt.__call) end
  return t
end
check.public = public

-- }=============================================================


-- {===================== describing values =====================

function check.shape (shape) return "(" .. table.concat(shape, ",") .. ")" end

function check.same_shape (a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

function check.is_array (v) return mg.is_tensor(v) or mg.is_variable(v) end

function check.is_tape (v)
  local mt = type(v) == "userdata" and getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__name") == "moongrad.Tape"
end

--- minimize's arguments (loss, vars, tape), checked: the list's length
function check.minimize_args (who, loss, vars, tape)
  if not check.is_array(loss) then check.fail(who, "the loss must be a tensor, got %s", check.show(loss)) end
  if not check.is_tape(tape) then
    check.fail(who, "minimize(loss, vars, tape) needs the tape that recorded the loss (mg.tape()), got %s",
               check.show(tape))
  end
  if type(vars) ~= "table" then
    check.fail(who, "vars must be a list of Variables ({w, b}), got %s", check.show(vars))
  end
  local n = check.list(who, vars, "the list of variables", "variable %d")
  for i = 1, n do
    if not mg.is_variable(vars[i]) then
      check.fail(who, "variable %d must be a Variable, got %s", i, check.show(vars[i]))
    end
  end
  return n
end

local nouns = {nn = "layer", optim = "optimizer"}

-- the class of a moongrad Lua object and what it is: "Dense", "layer"; or nil
local function class_name (v)
  local mt = getmetatable(v)
  local name = type(mt) == "table" and rawget(mt, "__name")
  local module, class = (type(name) == "string" and name or ""):match("^moongrad%.(%a+)%.(%w+)$")
  if class then return class, nouns[module] or "object" end
end

--- What v is, for "layer 1 is a number": "nil", "a string", "a tensor", "a Dense layer".
function check.kind (v)
  if v == nil then return "nil" end
  if mg.is_tensor(v) then return "a tensor" end
  if mg.is_variable(v) then return "a Variable" end
  local name, noun = class_name(v)
  if name then
    local an = name:find("^[AEIOU]") or name:find("^[FHLMNRSX]%u")       -- "an SGD optimizer"
    return ("%s %s %s"):format(an and "an" or "a", name, noun)
  end
  return "a " .. type(v)
end

--- v for "got ...": numbers and strings by value, anything else by kind.
function check.show (v)
  if type(v) == "number" then return v ~= v and "nan" or tostring(v) end
  if type(v) == "string" then return ("'%s'"):format(#v > 40 and v:sub(1, 37) .. "..." or v) end
  if type(v) == "boolean" then return tostring(v) end
  if check.is_array(v) then return ("%s %s %s"):format(check.kind(v), check.shape(v.shape), v.dtype) end
  return check.kind(v)
end

function check.is_callable (v)
  if type(v) == "function" then return true end
  local mt = (type(v) == "table" or type(v) == "userdata") and getmetatable(v)
  return type(mt) == "table" and mt.__call ~= nil
end

-- }=============================================================


-- {=========================== rules ===========================
-- A rule is what a value must be: {desc = "a positive integer", test = fn}.
-- Range tests are written so that NaN fails them.

local function rule (desc, test) return {desc = desc, test = test} end
check.rule = rule

local function finite (v) return type(v) == "number" and v > -math.huge and v < math.huge end

check.positive = rule("a positive finite number", function(v) return finite(v) and v > 0 end)
check.nonnegative = rule("a finite number >= 0", function(v) return finite(v) and v >= 0 end)
check.fraction = rule("a number in [0, 1)", function(v) return type(v) == "number" and v >= 0 and v < 1 end)
check.unit = rule("a number in [0, 1]", function(v) return type(v) == "number" and v >= 0 and v <= 1 end)
check.positive_integer = rule("a positive integer", function(v) return math.type(v) == "integer" and v >= 1 end)
check.integer = rule("an integer", function(v) return math.type(v) == "integer" end)
check.boolean = rule("true or false", function(v) return type(v) == "boolean" end)
check.string = rule("a string", function(v) return type(v) == "string" end)
check.callable = rule("a function (or a callable table)", check.is_callable)

--- Returns v if it passes r, else raises "who: what must be <r.desc>, got <v>".
function check.value (who, what, v, r)
  if not r.test(v) then check.fail(who, "%s must be %s, got %s", what, r.desc, check.show(v)) end
  return v
end

local FLOATS = {float32 = true, float64 = true, bfloat16 = true, float16 = true}

--- x if it is a float tensor or Variable (bfloat16 and float16 too: autocast's
-- products give them), else raises "who: what must be a float tensor, got int64".
function check.float_tensor (who, what, x)
  if not check.is_array(x) then check.fail(who, "%s must be a float tensor, got %s", what, check.show(x)) end
  local dtype = x.dtype
  if not FLOATS[dtype] then
    check.fail(who, "%s must be a float tensor, got %s", what, dtype)
  end
  return x
end

-- }=============================================================


-- {=========================== lists ===========================

--- The length of t, a list whose every key is a position 1..n with no gaps.
-- what names the list ("the list of layers"), item one entry ("layer %d").
-- skip is a key allowed besides the positions (table.pack's "n").
function check.list (who, t, what, item, skip)
  local n, count = 0, 0
  for k in pairs(t) do
    if k ~= skip then
      if math.type(k) ~= "integer" or k < 1 then
        check.fail(who, "%s has a key %s; entries go at positions 1, 2, ...", what, check.show(k))
      end
      count, n = count + 1, math.max(n, k)
    end
  end
  if count < n then
    for i = 1, n do
      if t[i] == nil then check.fail(who, item .. " is nil (a hole in the list)", i) end
    end
  end
  return n
end

--- Raises when a variable comes twice in vars[1..n] (one optimizer step, as
-- PyTorch refuses a parameter in two groups): two updates through one slot
-- would follow neither gradient's rule.
function check.distinct_variables (who, vars, n)
  local first = {}
  for i = 1, n do
    local v = vars[i]
    if v ~= nil then
      local j = first[v]
      if j then
        check.fail(who, "variables[%d] is variables[%d] again (%s); give each variable once, with the sum "
                   .. "of its gradients", i, j, check.show(v.name))
      end
      first[v] = i
    end
  end
end

-- }=============================================================


-- {========================== options ==========================

-- spellings from other libraries, suggested when the key is not close to a known one
local other_names = {lr = "learning_rate", eps = "epsilon", epsilon = "eps"}

-- optimal string alignment distance (an adjacent swap costs 1), case-blind
local function distance (a, b)
  a, b = a:lower(), b:lower()
  local d = {}
  for i = 0, #a do d[i] = {[0] = i} end
  for j = 0, #b do d[0][j] = j end
  for i = 1, #a do
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      d[i][j] = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        d[i][j] = math.min(d[i][j], d[i - 2][j - 2] + 1)
      end
    end
  end
  return d[#a][#b]
end

--- The name in names closest to key, if close enough to be a likely typo.
function check.closest (key, names)
  local best, best_d = nil, math.max(1, #key // 3) + 1
  for _, name in ipairs(names) do
    local d = distance(key, name)
    if #key >= 2 and name:sub(1, #key) == key then d = 1 end     -- a prefix: "learning"
    if d < best_d then best, best_d = name, d end
  end
  if best then return best end
  local other = other_names[key]
  for _, name in ipairs(names) do if name == other then return other end end
end

--- Raises "who: unknown <what> 'key' (did you mean 'x'? known: a, b, c)".
function check.unknown (who, what, key, names, candidates)
  local guess = check.closest(key, candidates or names)
  check.fail(who, "unknown %s '%s' (%sknown: %s)", what, key,
             guess and ("did you mean '%s'? "):format(guess) or "", table.concat(names, ", "))
end

local function sorted_keys (t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    if type(a) ~= type(b) then return type(a) < type(b) end
    return type(a) == "number" and a < b or tostring(a) < tostring(b)
  end)
  return keys
end

--- Checks opts (nil or a table of name = value) against spec, a list of
-- {name, rule, default [, alias = "other_spelling"]}, and returns a new table
-- with every option under its name: the given value, or the default.
function check.options (who, opts, spec)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" or check.is_callable(opts) or class_name(opts) then
    check.fail(who, "options must be a table {name = value, ...}, got %s", check.show(opts))
  end
  local by_key, names, candidates = {}, {}, {}
  for i, o in ipairs(spec) do
    by_key[o[1]], names[i], candidates[#candidates + 1] = o, o[1], o[1]
    if o.alias then by_key[o.alias], candidates[#candidates + 1] = o, o.alias end
  end
  local out, given = {}, {}
  for _, k in ipairs(sorted_keys(opts)) do
    local o = by_key[k]
    if type(k) ~= "string" then
      check.fail(who, "options are named (name = value), got a value at [%s]", check.show(k))
    end
    if not o then check.unknown(who, "option", k, names, candidates) end
    if given[o] then check.fail(who, "options '%s' and '%s' are the same option; give one", given[o], k) end
    given[o] = k
    out[o[1]] = check.value(who, ("option '%s'"):format(k), opts[k], o[2])
  end
  for _, o in ipairs(spec) do
    if out[o[1]] == nil then out[o[1]] = o[3] end
  end
  return out
end

--- Re-checks the fields of obj that options set (users may change them
-- between calls: opt.learning_rate = ...): "who: learning_rate must be ...".
function check.fields (who, obj, spec)
  for _, o in ipairs(spec) do
    if o[3] ~= nil or obj[o[1]] ~= nil then check.value(who, o[1], obj[o[1]], o[2]) end
  end
end

--- Checks that self is an object of cls, as when a method is called with a dot.
function check.self (who, self, cls, example)
  if getmetatable(self) ~= cls then
    check.fail(who, "call it as a method, with a colon (%s), got self = %s", example, check.show(self))
  end
end

-- }=============================================================

return check

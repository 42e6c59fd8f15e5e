-- spec/fuzz/gen.lua: generates one random moongrad program (Lua 5.4) for a seed.
--
--   lua5.4 spec/fuzz/gen.lua SEED > prog.lua
--   build-asan/moongrad prog.lua
--
-- Pure Lua, deterministic for a seed. Every statement of the program is one
-- line `S(function() ... end)`: a Lua error inside it is expected and fine
-- (pcall); only a crash, a sanitizer report or a hang is a finding (run.sh).
-- The program works on a few pools of values the statements read and write:
--   V[1..NV] tensors, variables and anything else; T[k] tapes; F[k] functions
--   (custom_gradient, recompute_grad, layers); A[k] argument tables for
--   recompute_grad; O[k] optimizers; C[k] coroutines; saved (resurrected
--   objects). Since each statement names its slots, deleting lines keeps the
--   program valid, which is what reduce.lua does to minimise a finding.
-- FUZZ_VERBOSE=1 in the environment makes the program print each error, =2 also
-- each statement's line number (to stderr) before it runs.

local seed = math.tointeger(tonumber(arg and arg[1] or "1")) or 1
math.randomseed(seed)

local function R (a, b) return math.random(a, b) end
local function chance (p) return math.random() < p end
local function pick (t) return t[math.random(#t)] end
local fmt = string.format

-- picks from {weight, value, weight, value, ...}; a function value is called
local function wpick (list)
  local total = 0
  for i = 1, #list, 2 do total = total + list[i] end
  local r = math.random() * total
  for i = 1, #list, 2 do
    r = r - list[i]
    if r <= 0 then
      local v = list[i + 1]
      if type(v) == "function" then return v() end
      return v
    end
  end
  local v = list[#list]
  if type(v) == "function" then return v() end
  return v
end

-- {========================== program shape ==========================

local NV = R(6, 12)
local ORACLE_WEIGHT = tonumber(os.getenv("FUZZ_ORACLE_WEIGHT") or "") or 8           -- value slots
local NT, NF, NA, NO, NC = 3, 5, 3, 2, 2
local FDT = pick{"float32", "float32", "float64"}     -- the program's usual float dtype
-- most programs allow float16 autocast on this CPU (emulate_float16(true) in the
-- prelude); the others see it refused ("needs AVX512-FP16"), which is tested too
local F16 = chance(0.8)
local BASE = {}                                       -- the shape family
do
  local nd = wpick{3, 1, 5, 2, 4, 3, 1, 4}
  local sizes = {0, 1, 1, 2, 2, 3, 3, 4, 5}
  local numel = 1
  for i = 1, nd do
    local s = pick(sizes)
    if numel * math.max(s, 1) > 256 then s = 1 end
    BASE[i] = s
    numel = numel * math.max(s, 1)
  end
  if chance(0.6) then for i = 1, #BASE do if BASE[i] == 0 then BASE[i] = 2 end end end
end

-- }===================================================================


-- {============================ literals =============================

local WEIRD_NUMS = {
  "0", "1", "-1", "2", "3", "0.5", "-2.5", "1e308", "-1e308", "(1/0)", "(-1/0)", "(0/0)",
  "math.maxinteger", "math.mininteger", "(2^32+1)", "2^63", "((1<<32)+1)", "(1<<62)", "2^53",
  "-0.0", "1e-310", "7", "100", "2^31", "(-(2^31))", "(1<<31)", "1e-7", "65504.0", "3.5",
}

local function num ()
  return wpick{6, function() return tostring(R(-3, 5)) end,
               2, function() return pick{"0.5", "1.5", "-0.25", "2.0", "0.1"} end,
               3, function() return pick(WEIRD_NUMS) end}
end

local function small_int () return tostring(wpick{8, function() return R(1, 4) end, 1, 0, 1, -1, 1, 5}) end

local function dtype_lit ()
  return wpick{10, '"float32"', 6, '"float64"', 4, '"int64"', 3, '"bool"',
               1.5, '"float16"', 1.5, '"bfloat16"', 1, "nil", 0.5, "1", 0.5, "{}", 0.3, '"Float32"', 0.3, '"float8"'}
end

local function fdtype () return chance(0.85) and fmt("%q", FDT) or dtype_lit() end

-- a shape as a list of integers, from the family or not
local function shape_list ()
  local r = math.random()
  local s = {}
  if r < 0.65 then                                   -- a suffix of BASE, some dims made 1
    local k = R(0, #BASE)
    for i = #BASE - k + 1, #BASE do s[#s + 1] = chance(0.25) and 1 or BASE[i] end
    if chance(0.15) then table.insert(s, 1, 1) end
  elseif r < 0.9 then                                -- small and unrelated
    local nd = R(0, 4)
    for i = 1, nd do s[i] = pick{0, 1, 1, 2, 2, 3, 4, 6} end
  else                                               -- many dims, up to 8
    local nd = R(5, 8)
    for i = 1, nd do s[i] = pick{1, 1, 1, 2, 2, 3} end
  end
  return s
end

local function shape_code (s)
  local parts = {}
  for i, d in ipairs(s) do parts[i] = tostring(d) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local ABSURD_SHAPES = {
  "{1<<40}", "{1<<62}", "{1<<31, 1<<31}", "{2^40}", "{math.maxinteger}", "{(1<<32)+1, 1<<32}",
  "{-1}", "{0/0}", "{1.5}", "{'a'}", "{1, 1, 1, 1, 1, 1, 1, 1, 1}", "{3, 1<<61}", "{0, 1<<62}",
  "{1<<20, 1<<20, 1<<20}", "{2^63}", "{-(1<<62)}", "{1<<62, 0}", "{math.maxinteger, 0, 2}",
  "{(1<<31)+1}", "{0, math.maxinteger, math.maxinteger}", "{1<<21, 1<<21, 1<<21}", "{nil, 2}",
  "{true}", "{{2}}", "{2, 3, n = 5}", "{1e300}", "{(1<<32)-1, (1<<32)+1}",
}

local function shape ()
  return wpick{20, function() return shape_code(shape_list()) end,
               1.2, function() return pick(ABSURD_SHAPES) end,
               0.4, function() return pick{"nil", '"x"', "3", "V[1]"} end}
end

-- a nested Lua table literal of the given shape
local function data_lit (s, dt)
  local function elem ()
    if dt == '"bool"' then return pick{"true", "false"} end
    if dt == '"int64"' then
      return wpick{10, function() return tostring(R(-5, 9)) end, 1, "math.maxinteger", 1, "math.mininteger",
                   0.5, "1.5", 0.5, "2^63"}
    end
    return wpick{10, function() return tostring(R(-4, 4) + pick{0, 0, 0.5, 0.25}) end,
                 1, function() return pick(WEIRD_NUMS) end, 0.2, '"x"', 0.2, "true"}
  end
  local numel = 1
  for _, d in ipairs(s) do numel = numel * d end
  if numel > 64 then s = {numel > 0 and 2 or 0} end
  local function level (d)
    if d > #s then return elem() end
    local parts = {}
    for i = 1, s[d] do parts[i] = level(d + 1) end
    if chance(0.01) and #parts > 0 then parts[#parts] = "{}" end           -- ragged
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return level(1)
end

-- }===================================================================


-- {=========================== expressions ===========================

local function slot () return R(1, NV) end
local function V () return fmt("V[%d]", slot()) end
local function Tk () return fmt("T[%d]", R(1, NT)) end
local function Fk () return fmt("F[%d]", R(1, NF)) end
local function Ak () return fmt("A[%d]", R(1, NA)) end

local function axis ()
  return wpick{10, function() return tostring(pick{1, 2, -1, -2, 3}) end,
               1, "0", 1, "9", 0.5, "(1<<40)", 0.5, "(0/0)", 0.5, "1.5", 0.5, '"x"',
               1, "{1, 2}", 0.5, "{1, 1}", 0.5, "{}", 0.5, "{-1, 1}", 0.5, "math.mininteger", 0.3, "{1, (1<<40)}"}
end

local function weird_value ()
  return pick{"nil", '"str"', "{}", "{1, 2}", "print", "true", "false", "coroutine.create(print)",
              "T[1]", "F[1]", "A[1]", "O[1]", "saved[1]", "io.stdout", "setmetatable({}, {__index = error})",
              "(function() end)", "{V[1], {V[2]}}", "mg", "0/0", "C[1]"}
end

local slice_spec

local function view (x)
  return wpick{
    3, function() return x .. ":transpose()" end,
    2, function() return fmt("mg.swapaxes(%s, 1, -1)", x) end,
    3, function() return fmt("%s:slice(%s)", x, slice_spec()) end,
    2, function() return fmt("mg.broadcast_to(%s, %s)", x, shape()) end,
    2, function() return fmt("%s[%s]", x, pick{"1", "-1", "2"}) end,
    2, function() return fmt("mg.expand_dims(%s, %s)", x, pick{"1", "-1", "2"}) end,
    1, function() return fmt("%s:reshape(%s)", x, pick{"{-1}", "{1, -1}", "{-1, 1}", shape()}) end,
    1, function() return fmt("%s:squeeze()", x) end,
  }
end

-- a tensor-ish operand: mostly a slot, sometimes a view, a number or junk
local function operand ()
  return wpick{30, V, 5, function() return view(V()) end, 6, function() return "(" .. num() .. ")" end,
               2, function() return "(" .. weird_value() .. ")" end, 1, function() return fmt("saved[%d]", R(1, 3)) end,
               1, function() return fmt("%s:value()", V()) end}
end

slice_spec = function ()
  local n = R(0, 4)
  local parts = {}
  for i = 1, n do
    parts[i] = wpick{
      4, "nil",
      3, function() return tostring(pick{1, 2, -1, 0, 99, -99}) end,
      6, function()
        local a = pick{"nil", "1", "2", "-1", "-2", "0", "99"}
        local b = pick{"nil", "1", "2", "-1", "3", "-3", "99"}
        local st = pick{"nil", "1", "2", "-1", "-2", "3", "-3", "0", "(1<<40)", "-(1<<62)", "math.mininteger", "1.5"}
        return fmt("{%s, %s, %s}", a, b, st)
      end,
      1, "{}", 0.5, '"x"', 0.3, "1.5", 0.3, "{nil, nil, -1}",
    }
  end
  return table.concat(parts, ", ")
end

local BINMETA = {"+", "-", "*", "/", "^", "//", "%"}
local BINFN = {"add", "sub", "mul", "div", "pow", "floordiv", "mod", "maximum", "minimum", "equal",
               "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
               "logical_or", "matmul", "relu_grad"}
local UNFN = {"neg", "exp", "log", "sqrt", "abs", "sign", "tanh", "sigmoid", "relu", "logical_not", "softplus",
              "sin", "cos", "log1p", "expm1", "erf", "floor", "ceil", "round"}
local REDFN = {"sum", "mean", "max", "min", "argmax", "argmin", "prod", "logsumexp", "var", "std", "norm", "cumsum"}

local function creation ()
  return wpick{
    4, function() local s = shape_list(); local dt = dtype_lit()
         return fmt("mg.constant(%s%s)", data_lit(s, dt), chance(0.7) and ", " .. dt or "") end,
    1, function() return fmt("mg.tensor(%s, %s)", num(), dtype_lit()) end,
    1, function() return fmt("mg.constant(%s)", num()) end,
    4, function() return fmt("mg.%s(%s, %s)", pick{"zeros", "ones"}, shape(), fdtype()) end,
    1, function() return fmt("mg.zeros(%s)", table.concat({small_int(), small_int()}, ", ")) end,
    3, function() return fmt("mg.full(%s, %s, %s)", shape(), chance(0.2) and pick{"true", "false"} or num(), fdtype()) end,
    2, function() return fmt("mg.%s(%s, %s)", pick{"zeros_like", "ones_like"}, operand(), chance(0.5) and dtype_lit() or "nil") end,
    2, function() return wpick{
         3, function() return fmt("mg.arange(%d)", R(0, 12)) end,
         3, function() return fmt("mg.arange(%s, %s, %s, %s)", num(), num(), pick{"1", "2", "-1", "0.5", "0", "1e-300", "(0/0)"}, dtype_lit()) end,
         1, function() return pick{"mg.arange(1e15)", "mg.arange(0, 1, 1e-15)", "mg.arange(2^62)", "mg.arange(-1e300, 1e300)", "mg.arange(0/0)", "mg.arange(1/0)", "mg.arange(math.mininteger, math.maxinteger)"} end} end,
    2, function() return fmt("mg.eye(%s%s, %s)", pick{"0", "1", "2", "3", "4", "-1", "(1<<31)", "(1<<40)", "1.5"},
                             chance(0.4) and ", " .. pick{"2", "3", "0", "(1<<33)"} or "", fdtype()) end,
    4, function() return fmt("mg.random.%s(%s, %s, %s, %s)", pick{"normal", "uniform"}, shape(), num(), num(), fdtype()) end,
    2, function() return fmt("mg.random.%s(%s)", pick{"normal", "uniform"}, shape()) end,
    1, function() return fmt("mg.random.permutation(%s)", pick{"0", "1", "5", "-1", "(1<<40)", "2^62", "1.5", "(1<<39)"}) end,
    1, function() return fmt("mg.cast(%s, %s)", V(), dtype_lit()) end,
  }
end

local function binop ()
  local a, b = operand(), operand()
  if chance(0.5) then return fmt("%s %s %s", a, pick(BINMETA), b) end
  return fmt("mg.%s(%s, %s)", pick(BINFN), a, b)
end

local function reduce_expr ()
  local f = pick(REDFN)
  local x = operand()
  return wpick{3, fmt("mg.%s(%s)", f, x), 4, fmt("mg.%s(%s, %s)", f, x, axis()),
               3, fmt("mg.%s(%s, %s, %s)", f, x, axis(), pick{"true", "false", "1", "nil"}),
               2, fmt("%s:%s(%s)", V(), f, axis())}
end

local function shape_op ()
  local x = operand()
  return wpick{
    3, function() return fmt("mg.reshape(%s, %s)", x, wpick{5, shape, 2, "{-1}", 1, "{-1, -1}", 1, "{2, -1}", 1, "{-1, 0}", 1, "{0, -1}", 1, "3, 2", 1, "{-1, 1<<62}", 0.5, "{}"}) end,
    3, function() return fmt("mg.transpose(%s%s)", x, chance(0.5) and ", " .. pick{"{2, 1}", "{1, 2, 3}", "{1, 1}", "{-1, 1}", "{3, 1, 2}", "{}", "{1}", "{0, 1}", "{9, 1}"} or "") end,
    2, function() return fmt("mg.swapaxes(%s, %s, %s)", x, axis(), axis()) end,
    2, function() return fmt("mg.expand_dims(%s, %s)", x, axis()) end,
    2, function() return fmt("mg.squeeze(%s%s)", x, chance(0.5) and ", " .. axis() or "") end,
    3, function() return fmt("mg.broadcast_to(%s, %s)", x, shape()) end,
    4, function() local sp = slice_spec(); return fmt("mg.slice(%s%s)", x, sp ~= "" and ", " .. sp or "") end,
    3, function() local parts = {}; for i = 1, R(0, 4) do parts[i] = operand() end
         return fmt("mg.%s({%s}%s)", pick{"concat", "stack"}, table.concat(parts, ", "), chance(0.6) and ", " .. axis() or "") end,
    2, function() return fmt("mg.gather(%s, %s%s)", x,
         pick{'mg.constant({1, 2}, "int64")', "{1}", "{0}", "{-1}", "{99}", "(1<<40)", "1", "{{1, 2}, {2, 1}}", "V[2]",
              'mg.constant({}, "int64")', 'mg.constant({1.5})', 'mg.constant(math.maxinteger, "int64")', "{math.mininteger}"},
         chance(0.5) and ", " .. axis() or "") end,
    2, function() return fmt("mg.cast(%s, %s)", x, dtype_lit()) end,
    2, function() return fmt("mg.where(%s, %s, %s)", pick{fmt("mg.greater(%s, 0)", V()), V(), "mg.constant({true, false})", "true"}, operand(), operand()) end,
    2, function() return fmt("mg.%s(%s%s)", pick{"softmax", "log_softmax"}, x, chance(0.5) and ", " .. axis() or "") end,
    -- indexing, sorting and friends
    2, function() return fmt("first(mg.%s(%s%s))", pick{"sort", "argsort"}, x, pick{"", ", " .. axis(), ", " .. axis() .. ", {descending = true}", ", nil, {descending = 1}", ", 1, {bogus = 1}"}) end,
    2, function() return fmt("first(mg.topk(%s, %s%s))", x, pick{"1", "2", "0", "-1", "99", "(1<<40)", "1.5", "nil"}, pick{"", ", " .. axis(), ", -1, {largest = false, sorted = false}", ", 1, {largest = 'x'}"}) end,
    2, function() return fmt("mg.take_along_axis(%s, %s, %s)", x, pick{fmt("mg.argsort(%s, -1)", V()), 'mg.constant({{1}}, "int64")', "mg.constant({{-1, 1}}, 'int64')", "{1, 2}", "V[2]", "mg.constant({{math.maxinteger}}, 'int64')", "mg.constant({{0}}, 'int64')"}, axis()) end,
    2, function() return fmt("mg.put_along_axis(%s, %s, %s, %s%s)", x, pick{'mg.constant({{1}}, "int64")', "mg.constant({{-1, 1}}, 'int64')", fmt("mg.argsort(%s, -1)", V()), "mg.constant({{99}}, 'int64')", "mg.constant({{math.mininteger}}, 'int64')"},
                             operand(), axis(), pick{"", ", {mode = 'add'}", ", {mode = 'set'}", ", {mode = 'x'}"}) end,
    2, function() return fmt("mg.flip(%s%s)", x, chance(0.6) and ", " .. axis() or "") end,
    2, function() return fmt("mg.tile(%s, %s)", x, pick{"{2, 1}", "{1, 3}", "{2}", "{0, 2}", "{1, 1, 1, 1, 1, 1, 1, 1, 1}", "{1 << 40, 1}", "{-1}", "{}", "2", "{1, 1 << 31, 1 << 31}"}) end,
    2, function() return fmt("mg.pad(%s, %s%s)", x, pick{"{{1, 1}}", "{{0, 2}, {1, 0}}", "{{1, 1}, {1, 1}, {1, 1}}", "{{-1, 0}}", "{{1 << 40, 0}}", "{}", "{{3, 3}}", "1"},
                             pick{"", ", {mode = 'reflect'}", ", {mode = 'symmetric'}", ", {mode = 'edge'}", ", {mode = 'wrap'}", ", {mode = 'constant', value = 0/0}", ", {mode = 'bogus'}", ", {value = 'x'}"}) end,
    2, function() return fmt("mg.%s(%s%s)", pick{"tril", "triu"}, x, pick{"", ", 1", ", -1", ", (1<<62)", ", math.mininteger", ", 0.5"}) end,
    2, function() return fmt("mg.masked_fill(%s, %s, %s)", x, pick{fmt("mg.greater(%s, 0)", V()), "mg.constant({true, false})", "V[2]", "true"}, pick{"0", "(0/0)", "1e308", "V[1]", "'x'"}) end,
    2, function() return fmt("mg.repeat_interleave(%s, %s%s)", x, pick{"2", "0", "-1", "(1<<40)", "{1, 2}", "mg.constant({1, 0, 2}, 'int64')", "1.5"}, chance(0.6) and ", " .. axis() or "") end,
    2, function() return fmt("mg.einsum(%s, %s%s)", pick{"'ij,jk->ik'", "'ij->ji'", "'ii->i'", "'ij->'", "'i,i->'", "'ijk,ikl->ijl'", "'ab,bc'", "'...'", "''", "'ij,jk->ikz'", "'aaaaaaaaa->a'"}, x, chance(0.7) and ", " .. operand() or "") end,
    2, function() return fmt("mg.%s(%s, %s, %s)", pick{"clamp", "clip_by_value"}, x, pick{"nil", "-0.5", "0", "(0/0)", "V[2]", "1"}, pick{"nil", "0.5", "-1", "(1/0)", "V[3]"}) end,
    2, function() return fmt("mg.%s(%s, %s, %s, %s)", pick{"var", "std", "norm"}, x, pick{"nil", axis()}, pick{"false", "true", "nil"},
                             pick{"{ddof = 1}", "{ddof = -1}", "{ddof = 99}", "{unbiased = true}", "{ord = 1}", "{ord = math.huge}", "{ord = 3}", "{ord = 0/0}", "nil", "{bogus = 1}"}) end,
    2, function() return fmt("mg.cumsum(%s%s%s)", x, chance(0.6) and ", " .. axis() or ", nil", pick{"", ", {exclusive = true}", ", {reverse = true}", ", {exclusive = true, reverse = true}", ", {exclusive = 1}"}) end,
  }
end

-- an expression giving (usually) a tensor
local function tensor_expr (depth)
  depth = depth or 0
  if depth > 1 then return wpick{5, V, 1, creation} end
  return wpick{
    6, creation, 10, binop,
    5, function() return fmt("mg.%s(%s)", pick(UNFN), operand()) end,
    2, function() return "-" .. operand() end,
    5, reduce_expr, 8, shape_op, 2, function() return view(V()) end,
    2, function() return fmt("mg.matmul(%s, %s)", operand(), operand()) end,
    1, function() return fmt("mg.dense(%s, %s, %s, %s)", operand(), operand(), pick{"nil", operand()},
                             pick{"nil", "'relu'", "'tanh'", "'sigmoid'", "'linear'", "'gelu'", "1"}) end,
    2, function() return fmt("(%s) %s (%s)", tensor_expr(depth + 1), pick(BINMETA), tensor_expr(depth + 1)) end,
    1, function() return fmt("mg.%s(%s)", pick(UNFN), tensor_expr(depth + 1)) end,
  }
end

-- }===================================================================


-- {=========================== statements ============================
-- Each returns a statement body (one line of Lua, no S wrapper). depth
-- limits nesting: callbacks (record, grad_fn, finalizers ...) hold bodies.

local body

local function assign (e) return fmt("V[%d] = %s", slot(), e) end

local function inspect ()
  local x = operand()
  return wpick{
    2, fmt("local _ = %s:item()", x), 2, fmt("local _ = %s:totable()", x), 1, fmt("local _ = %s:numel()", x),
    2, fmt("local _ = #%s", x), 3, fmt("local _ = %s[%s]", x, pick{"1", "-1", "0", "99", "1.5", '"shape"', '"dtype"', '"ndim"', '"foo"', "true", "2^63", "math.mininteger", "(0/0)", "{}"}),
    3, fmt("local _ = tostring(%s)", x), 1, fmt("local _ = %s .. %s", x, pick{'"x"', x, "1"}),
    1, fmt("local _ = %s == %s", x, operand()), 1, fmt("local _ = %s < %s", x, operand()),
    1, fmt("local _ = %s <= %s", x, operand()), 1, fmt("%s.x = 1", x), 1, fmt("%s[1] = 2", x),
    1, fmt("local _ = %s(1)", x), 1, fmt("for _ in pairs(%s) do end", x),
    1, fmt("local _ = %s.shape, %s.dtype, %s.ndim", x, x, x),
    1, fmt("local _ = mg.is_tensor(%s), mg.is_variable(%s)", x, x),
    0.3, fmt("mg.print(%s, %s)", x, pick{'"s"', "nil", "{}", "1", x}),
  }
end

local function variable_stmt ()
  local v = V()
  return wpick{
    4, function() return assign(fmt("mg.Variable(%s%s)", wpick{5, operand, 2, function() return data_lit(shape_list(), fdtype()) end, 1, num},
         chance(0.5) and ", " .. pick{"{name = 'w'}", "{trainable = false}", fmt("{dtype = %s}", dtype_lit()), "{name = 5}", "{dtype = 'x'}", "{}", "'opts'", fmt("{name = 'v', trainable = %s, dtype = %s}", pick{"true", "false"}, fdtype())} or "")) end,
    3, function() return fmt("%s:assign(%s)", v, operand()) end,
    3, function() return fmt("%s:%s(%s%s)", v, pick{"assign_add", "assign_sub"}, operand(), chance(0.4) and ", " .. num() or "") end,
    2, function() return assign(fmt("%s:%s()", v, pick{"value", "read_value"})) end,
    1, function() return fmt("local _ = %s.name, %s.trainable, tostring(%s)", v, v, v) end,
    0.5, function() return fmt("%s.name = 'z'", v) end,
  }
end

-- sources for gradient: one, a list, a nested table, junk
local function sources ()
  return wpick{
    5, V, 4, function() return fmt("{%s, %s}", V(), V()) end,
    2, function() return fmt("{a = %s, b = {%s, c = %s}}", V(), V(), V()) end,
    1, function() local v = V(); return fmt("{%s, %s}", v, v) end,
    1, "{}", 1, weird_value, 0.5, "{V[1], 5}",
    0.5, function() local p = {}; for i = 1, 66 do p[i] = fmt("V[%d]", (i % NV) + 1) end; return "{" .. table.concat(p, ", ") .. "}" end,
    0.5, "(function() local c = {V[1]}; c[2] = c; return c end)()",
  }
end

local function gradient_call (t)
  local target = wpick{8, V, 2, function() return fmt("{%s, %s}", V(), V()) end, 1, function() return fmt("{%s, {%s}}", V(), V()) end, 1, weird_value}
  local src = sources()
  local seeds = wpick{6, "", 2, function() return ", " .. V() end, 1, function() return fmt(", mg.ones_like(%s)", V()) end,
                      1, function() return fmt(", {%s}", V()) end, 1, ", nil", 1, ", mg.zeros{7, 7}", 0.5, ", 'x'"}
  local opts = wpick{6, "", 2, ", {unconnected = 'zero'}", 1, ", {unconnected = 'bad'}", 1, ", {unconnected = 1}", 0.5, ", 5"}
  if seeds == "" and opts ~= "" and chance(0.5) then seeds = ", nil" end
  return fmt("V[%d] = first(%s:gradient(%s, %s%s%s))", slot(), t, target, src, seeds, opts)
end

local function tape_stmt (depth)
  local t = Tk()
  return wpick{
    5, function() return fmt("%s = mg.tape(%s)", t, pick{"", "{persistent = true}", "{watch_accessed_variables = false}",
                             "{persistent = true, watch_accessed_variables = false}", "'x'", "5", "{persistent = 1}"}) end,
    4, function() return fmt("%s:watch(%s)", t, wpick{5, V, 2, function() return fmt("{%s, {%s}}", V(), V()) end, 1, function() return fmt("{a = %s}", V()) end, 1, weird_value,
                                                      0.5, "(function() local c = {V[1]}; c[2] = c; return c end)()"}) end,
    3, function() return t .. ":stop()" end,
    1, function() return t .. ":reset()" end,
    1, function() return fmt("local _ = %s:is_recording(), %s:saved_bytes(), #%s:watched_variables(), tostring(%s)", t, t, t, t) end,
    8, function() return gradient_call(t) end,
    1, function() return fmt("V[%d] = first(%s:gradient(%s, %s))", slot(), t, V(), V()) .. "; " .. fmt("V[%d] = first(%s:gradient(%s, %s))", slot(), t, V(), V()) end,
    2, function() return fmt("local y, x = %s, %s; if small(y) and small(x) then V[%d] = %s:%s(y, x%s) end", operand(), operand(), slot(), t,
                             pick{"jacobian", "batch_jacobian"}, pick{"", ", {unconnected = 'zero'}"}) end,
    3, function() return fmt("V[%d] = first(%s:record(function() %s end))", slot(), t, body(depth + 1)) end,
    2, function() return fmt("%s:stop_recording(function() %s end)", t, body(depth + 1)) end,
    2, function() return fmt("local t <close> = mg.tape(%s); t:watch(%s); local y = %s; V[%d] = y; %s",
                             pick{"", "{persistent = true}"}, V(), tensor_expr(1), slot(), chance(0.5) and fmt("V[%d] = t:gradient(y, %s)", slot(), V()) or body(depth + 1)) end,
    1, function() return fmt("%s:record(%s)", t, pick{"nil", "5", "'f'"}) end,
    1, function() return fmt("local _ = mg.is_recomputing()") end,
  }
end

-- a grad_fn body for custom_gradient: dy1, dy2, vars are its parameters
local function grad_fn_body (depth)
  return wpick{
    12, function() return pick{"return dy1", "return dy1 * 2", "return dy1, dy1", "return dy1 * 1, nil", "return nil", "return mg.ones_like(dy1)"} end,
    3, function() return pick{"return mg.ones{7, 7}", "return mg.ones({1}, 'int64')", "return mg.ones({}, 'float64')", "return mg.zeros{0}"} end,
    3, function() return pick{"return 'x'", "return {}", "return 1", "return V[1]", "return print", "return true"} end,
    2, function() return pick{"return", "return dy1, dy1, dy1, dy1, dy1", "return dy1, 'x', {}", "return table.unpack(V)"} end,
    2, function() return pick{"error('boom')", "error(setmetatable({}, {__tostring = function() error('x') end}))", "error(nil)", "error(V[1])", "error()", "error(string.rep('e', 10000))"} end,
    2, function() return pick{"return dy1, {}", "return dy1, 'x'", "return dy1, {mg.ones{9}}", "return dy1, {nil, dy1}", "return dy1, vars", "return dy1, {dy1, dy1, dy1}"} end,
    5, function() return fmt("%s; return dy1", body(depth + 1)) end,
    2, function() return fmt("%s:gradient(%s, %s); return dy1", Tk(), V(), V()) end,
    1, function() return fmt("%s:reset(); return dy1", Tk()) end,
    1, function() return fmt("%s:stop(); return dy1", Tk()) end,
    1, function() return "collectgarbage(); collectgarbage(); return dy1" end,
    1, function() return "coroutine.yield(1); return dy1" end,
    1, function() return fmt("getmetatable(%s).__gc(%s); return dy1", Tk(), Tk()) end,
    1, function() return fmt("return %s(dy1)", Fk()) end,
    1, function() return "return dy1:slice({-1, 1, -1})" end,
    1, function() return "return mg.broadcast_to(mg.constant(1), dy1.shape)" end,
    1, function() return fmt("getmetatable(dy1).__gc(dy1); return dy1") end,
    -- `t` is the tape of the custom_stmt scenario walking this very node
    2, function() return pick{"t:reset(); return dy1", "getmetatable(t).__gc(t); return dy1", "t:gradient(y, a); return dy1",
                              "t:stop(); t:reset(); collectgarbage(); return dy1 * 2", "t:watch(dy1); return dy1", "local _ = t:jacobian(dy1, a); return dy1"} end,
    1, function() return fmt("if vars then getmetatable(vars[1]).__gc(vars[1]) end; return dy1") end,
  }
end

-- f's body for custom_gradient: a, b are its parameters
local function custom_forward (depth)
  local reads = chance(0.4) and fmt(" + %s", V()) or ""
  local out = wpick{
    6, function() return fmt("local y = %s%s", pick{"a * 2", "mg.tanh(a)", "a * b", "mg.exp(a)", "a + b", "mg.sum(a)", "a:transpose()", "a[1]"}, reads) end,
    2, "local y = a", 1, "local y = a:slice({-1, 1, -1})", 1, "local y = b", 1, "local y = 'x'",
    1, function() return fmt("local y = %s", tensor_expr(1)) end,
  }
  local ret = wpick{
    10, function() return fmt("return y, function(dy1, dy2, vars) %s end", grad_fn_body(depth)) end,
    2, function() return fmt("return y, y * 2, function(dy1, dy2, vars) %s end", grad_fn_body(depth)) end,
    1, "return y", 1, "return y, 5", 1, "return", 1, "return function() end", 1, "return y, {}, function(dy1) return dy1 end",
    1, "return {y}, function(dy1) return dy1 end",
  }
  local extra = chance(0.2) and (body(depth + 1) .. "; ") or ""
  return fmt("%s; %s%s", out, extra, ret)
end

local function custom_stmt (depth)
  local f = Fk()
  return wpick{
    4, function() return fmt("%s = mg.custom_gradient(function(a, b) %s end)", f, custom_forward(depth)) end,
    6, function() return assign(fmt("%s(%s%s)", f, operand(), chance(0.5) and ", " .. operand() or "")) end,
    1, function() return fmt("%s = mg.custom_gradient(%s)", f, weird_value()) end,
    3, function()      -- the whole thing under a tape, then its gradient
      return fmt("local t = mg.tape(%s); local g = mg.custom_gradient(function(a, b) %s end); t:watch(%s); local y = g(%s, %s); t:stop(); V[%d] = y; V[%d] = first(t:gradient(y, %s))",
                 pick{"", "{persistent = true}"}, custom_forward(depth), V(), V(), operand(), slot(), slot(), sources())
    end,
  }
end

-- recompute_grad's f: takes tables (tbl), a tensor (b), maybe the flag table
local function recompute_body (depth)
  return wpick{
    6, "local s; for _, x in ipairs(entries(tbl)) do if mg.is_tensor(x) or mg.is_variable(x) then s = s and s + mg.sum(x) or mg.sum(x) end end; return s or mg.constant(0)",
    4, "local x = tbl[1]; if type(tbl[2]) == 'table' and tbl[2][1] then x = x * tbl[2][1] end; return mg.tanh(x)",
    2, "return tbl[1] * 2, {a = tbl[1] + 1, b = {tbl[1]}}",
    2, "return mg.nn.dropout(tbl[1], 0.5)",
    2, function() return fmt("return tbl[1] * %s", V()) end,
    1, "return tbl[1]", 1, "return tbl", 1, "return", 1, "return 5", 1, "return {}",
    1, "cnt = (cnt or 0) + 1; if cnt % 2 == 0 then return mg.ones{3} end; return tbl[1] + 0",
    1, "if mg.is_recomputing() then error('no') end; return tbl[1] * 3",
    1, "if mg.is_recomputing() then tbl[1] = nil; collectgarbage() end; return mg.exp(tbl[1])",
    1, function() return fmt("%s:gradient(tbl[1], tbl[1]); return tbl[1] * 2", Tk()) end,
    1, function() return fmt("local r = mg.recompute_grad(function(z) return mg.sin and z or z * z end); return r(tbl[1])") end,
    1, function() return fmt("local t = mg.tape(); t:watch(tbl[1]); local y = tbl[1] * tbl[1]; return t:gradient(y, tbl[1])") end,
    2, function() return fmt("%s; return tbl[1] * 1", body(depth + 1)) end,
    1, function() return fmt("return %s(tbl[1])", Fk()) end,
    1, "return tbl[1], b, flag",
  }
end

local function table_arg ()
  return wpick{
    4, function() return fmt("{%s, {%s}, x = %s}", V(), V(), V()) end,
    3, function() return fmt("{%s, %s}", V(), V()) end,
    1, function() return fmt("{%s, {%s, {%s, {%s}}}}", V(), V(), V(), V()) end,
    1, function() local v = V(); return fmt("{%s, %s, {%s}}", v, v, v) end,
    1, "{}", 1, "{1, 'x', print}",
    0.5, "(function() local c = {V[1]}; c[2] = c; return c end)()",
  }
end

local function mutate_table (a)
  return wpick{
    3, fmt("table.insert(%s, 1, %s)", a, V()), 3, fmt("%s[1] = nil", a), 2, fmt("%s.x = nil", a),
    2, fmt("if type(%s[2]) == 'table' then %s[2][1] = mg.ones{9} end", a, a), 1, fmt("%s[2] = %s", a, a),
    1, fmt("setmetatable(%s, {__index = function() error('meta') end, __len = function() return 1e9 end})", a),
    1, fmt("table.remove(%s)", a), 1, fmt("for k in pairs(%s) do %s[k] = nil end", a, a),
    1, fmt("%s[1] = %s", a, weird_value()),
    1, fmt("if mg.is_tensor(%s[1]) then getmetatable(%s[1]).__gc(%s[1]) end", a, a, a),
    1, fmt("if mg.is_tensor(%s[1]) then local z <close> = %s[1] end", a, a),
  }
end

-- save policies (JAX's checkpoint policies); a Lua one is called from inside ops
local function policy ()
  return wpick{
    3, function() return pick{"'nothing'", "'dots'", "'everything'", "'output'"} end,
    1, function() return pick{"'bogus'", "5", "true", "{}"} end,
    4, function() return "function(op, shape, dtype, product) " .. pick{
         "return true", "return op == 'matmul'", "return #shape > 1", "return product", "return not product", "return nil", "return 'x'", "error('policy')",
         "collectgarbage(); return true", "local _ = mg.ones{2} + 1; return true", "T[1]:reset(); return true",
         "getmetatable(T[1]).__gc(T[1]); return false", "coroutine.yield(); return true", "V[1]:assign(V[1]); return true",
         "mg.memory.fail_after(1); return true", "mg.random.seed(1); return true", "return first(F[2](A[1]))",
         "local t = mg.tape(); t:watch(V[1]); local y = V[1] * 2; t:gradient(y, V[1]); return true",
         "setmetatable({}, {__gc = function() T[2]:reset() end}); collectgarbage(); return dtype == 'float64'"} .. " end" end,
  }
end

local function recompute_stmt (depth)
  local f, a = Fk(), Ak()
  return wpick{
    4, function() return fmt("%s = mg.recompute_grad(function(tbl, b, flag) %s end%s)", f, recompute_body(depth),
                             wpick{5, "", 2, ", {pass_is_recomputing = true}", 3, function() return fmt(", {policy = %s}", policy()) end,
                                   1, function() return fmt(", {policy = %s, pass_is_recomputing = true}", policy()) end,
                                   2, ", {verify = true}", 1, ", {verify = 'yes'}"}) end,
    1, function() return fmt("mg.debug.verify_recompute(%s)", pick{"true", "false", "1", "nil"}) end,
    1, function() return fmt("%s = mg.recompute_grad(%s)", f, pick{Fk(), "mg.nn.Dense(2)", "mg.tanh", "5", "nil", "{}", "setmetatable({}, {__call = function(_, x) return x * 2 end})", "setmetatable({}, {__call = function() error('c') end})"}) end,
    3, function() return fmt("%s = %s", a, table_arg()) end,
    5, function() return assign(fmt("first(%s(%s, %s))", f, chance(0.8) and a or table_arg(), operand())) end,
    4, function() return mutate_table(a) end,
    1, function() return fmt("local _ = %s.__wrapped__, %s.variables, %s.foo, tostring(%s)", f, f, f, f) end,
    3, function()      -- a whole scenario: record, mutate, gradient
      return fmt("local t = mg.tape(%s); local g = mg.recompute_grad(function(tbl, b, flag) %s end" .. (chance(0.4) and (", {policy = " .. policy() .. "}") or "") .. "); local args = %s; t:watch(args); local y = first(g(args, %s)); %s; V[%d] = y; V[%d] = first(t:gradient(y, %s))",
                 pick{"", "{persistent = true}"}, recompute_body(depth), table_arg(), V(), mutate_table("args"), slot(), slot(),
                 pick{"args", "V[1]", "{args, V[2]}", "args[1]"})
    end,
  }
end

local lso_stmt

local function act ()
  return pick{'"tanh"', '"relu"', '"sigmoid"', '"softmax"', '"linear"', "nil", '"bogus"', "function(x) return x * 2 end", "5"}
end

local function layer_expr ()
  return wpick{
    5, function() return fmt("mg.nn.Dense(%s, {activation = %s, use_bias = %s})", wpick{10, small_int, 1, "1.5", 1, "(1<<40)", 1, "nil", 1, '"3"', 0.5, "(1<<50)"}, act(), pick{"true", "false", "nil"}) end,
    2, function() return fmt("mg.nn.Dense(%s, %s%s)", small_int(), act(), pick{"", ", {use_bias = false}", ", {activation = 'relu'}", ", {bogus = 1}", ", 5"}) end,
    2, function() return fmt("mg.nn.Sequential{%s, nil, %s}", Fk(), Fk()) end,
    2, function() return fmt("mg.nn.Sequential{%s, %s}", Fk(), Fk()) end,
    1, function() return fmt("mg.nn.Sequential(%s)", pick{"{1}", "'x'", "{}", "{mg.nn.Dense(2), 'x'}", "{print}"}) end,
    2, function() return fmt("mg.nn.Lambda(function(x, ...) %s end)", pick{"return x * 2", "return mg.relu(x)", "return x", "error('lam')", "return nil", "return x, x", "collectgarbage(); return x + 1"}) end,
    1, function() return fmt("mg.nn.Lambda(%s)", weird_value()) end,
    2, function() return fmt("mg.nn.Dropout(%s%s)", pick{"0", "0.5", "0.99", "1", "-0.1", "(0/0)", "'x'", "nil"}, pick{"", ", {training = false}", ", {training = 1}"}) end,
    2, function() return fmt("mg.nn.BatchNorm(%s)", pick{"nil", "{momentum = 0.9}", "{epsilon = 0}", "{momentum = 0/0}", "{epsilon = -1}", "'x'", "{training = false}", "{momentum = 0.5, training = true}"}) end,
    2, function() return fmt("mg.nn.RevBlock(%s, %s, %s)", pick{Fk(), "function(x) return x * 2 end", "mg.nn.Dense(2)", "{" .. Fk() .. "}", "mg.tanh"},
                             pick{Fk(), "function(x) return mg.tanh(x) end", "mg.nn.Dense(2)", "mg.relu"},
                             pick{"nil", "{num_layers = 2}", "{num_layers = 3}", "{num_layers = 0}", "{num_layers = 1.5}", "{num_layers = 50}"}) end,
    1, function() return fmt("mg.recompute_grad(%s)", Fk()) end,
  }
end

local function nn_stmt (depth)
  local f = Fk()
  return wpick{
    6, function() return fmt("%s = %s", f, layer_expr()) end,
    8, function() return assign(fmt("first(%s(%s%s))", f, operand(), chance(0.3) and ", " .. pick{"false", "true", operand()} or "")) end,
    1, function() return fmt("local _ = #%s.variables, #%s.trainable_variables, #%s.non_trainable_variables, tostring(%s)", f, f, f, f) end,
    3, function() return assign(fmt("mg.nn.checkpoint_sequential(%s, %s, %s)", pick{f, fmt("{%s, %s}", Fk(), Fk()), fmt("{%s, nil, %s}", Fk(), Fk()), "{}", "'x'"},
                                    pick{"1", "2", "3", "0", "-1", "1.5", "100"}, operand())) end,
    2, function() return assign(fmt("mg.nn.dropout(%s, %s)", operand(), pick{"0", "0.5", "0.9", "1", "-1", "(0/0)", "'x'"})) end,
    3, function() return assign(fmt("mg.nn.softmax_cross_entropy(%s, %s)", operand(),
         pick{'mg.constant({1, 2}, "int64")', 'mg.constant({1}, "int64")', 'mg.constant({{1}, {2}}, "int64")', 'mg.constant({0, 99}, "int64")',
              'mg.constant({1, 2, 3, 1, 2, 3, 1, 2}, "int64")', "mg.constant({1, 2})", 'mg.constant({}, "int64")', 'mg.constant(1, "int64")', "V[2]", "{1, 2}",
              'mg.constant({math.maxinteger, math.mininteger}, "int64")', "mg.softmax(V[2])", "mg.ones_like(V[1])", "mg.zeros{2, 3}"})) end,
    1, function() return assign(fmt("mg.nn.mean_squared_error(%s, %s)", operand(), operand())) end,
    1, function() return assign(fmt("mg.nn.glorot_uniform(%s, %s)", pick{"{2, 3}", "{}", "{0, 0}", "{3}", "{1, 1, 1}", "{1<<40, 2}", "{2, -1}"}, dtype_lit())) end,
    2, function()      -- a training step
      return fmt("local m = %s; local x = %s; local t = mg.tape(); local y = first(m(x)); local l = mg.mean(y * y); t:stop(); local vs = m.trainable_variables; local gs = t:gradient(l, vs); %s:apply_gradients(gs, vs)",
                 pick{f, layer_expr()}, operand(), fmt("O[%d]", R(1, NO)))
    end,
  }
end


-- a LossScaleOptimizer's options, good and bad
local function lso_opts ()
  return wpick{
    3, "nil", 1, "{}",
    4, function() return fmt("{initial_scale = %s%s%s}", pick{"2^15", "1", "2", "0.5", "2^-3", "2^24", "3", "65536", "1e38", "0", "-1", "(1/0)", "(0/0)", "'x'", "2^1000"},
                             chance(0.5) and ", dynamic = " .. pick{"true", "false", "1", "nil"} or "",
                             chance(0.5) and ", dynamic_growth_steps = " .. pick{"1", "2", "3", "2000", "0", "-1", "1.5", "(1<<62)", "'2'"} or "") end,
    1, function() return pick{"{name = 'ls'}", "{name = 5}", "{bogus = 1}", "{learning_rate = 0.1}", "{clipnorm = 1}", "{weight_decay = 0.1}", "5", "'x'"} end,
  }
end

-- the optimizers a LossScaleOptimizer may wrap (and things that are not)
local function inner_opt ()
  return pick{"mg.optim.SGD{learning_rate = 0.1}", "mg.optim.SGD{learning_rate = 0.1, momentum = 0.9}", "mg.optim.Adam()",
              "mg.optim.AdamW{learning_rate = 0.01}", "mg.optim.RMSprop()", "mg.optim.SGD{clipnorm = 1}", "mg.optim.Adam{global_clipnorm = 0.5}",
              fmt("O[%d]", R(1, NO)), fmt("O[%d]", R(1, NO)), "nil", "5", "{}", "{apply_gradients = function() end}",
              "mg.optim.LossScaleOptimizer(mg.optim.SGD())"}
end

-- a gradient list for apply_gradients: finite, holding an infinity or a NaN,
-- with nil holes, of wrong shapes or dtypes
local function lso_grads ()
  local g = function() return pick{V(), V(), fmt("%s * (1/0)", V()), fmt("%s * (0/0)", V()), fmt("mg.cast(%s, 'float16')", V()),
                                   fmt("mg.cast(%s * 1e5, 'float16')", V()), fmt("mg.cast(%s, 'bfloat16')", V()), fmt("%s:transpose()", V()),
                                   "mg.ones{1}", "mg.constant({1/0, 1})", "mg.constant({0/0})", "nil", "5"} end
  return pick{fmt("{%s}", g()), fmt("{%s, %s}", g(), g()), fmt("{%s, nil, %s}", g(), g()), fmt("{n = 3, %s, nil, %s}", g(), g()),
              "{}", "nil", fmt("{{%s, %s}, {%s, %s}}", g(), V(), g(), V())}
end

-- LossScaleOptimizer: built with random options, fed random gradients, its
-- state round-tripped, losses of every dtype scaled
lso_stmt = function (o)
  return wpick{
    4, function() return fmt("%s = mg.optim.LossScaleOptimizer(%s, %s)", o, inner_opt(), lso_opts()) end,
    5, function() return fmt("local r = %s:apply_gradients(%s, %s); local _ = %s.loss_scale, %s.good_steps, %s.skipped_steps, %s.iterations",
                             o, lso_grads(), pick{fmt("{%s}", V()), fmt("{%s, %s}", V(), V()), fmt("{%s, %s, %s}", V(), V(), V()), "nil", "{}"}, o, o, o, o) end,
    3, function() return fmt("local s = %s:get_state(%s); %s:set_state(s%s)", o, pick{"", fmt("{%s}", V())}, pick{o, fmt("O[%d]", R(1, NO))}, pick{"", fmt(", {%s}", V())}) end,
    2, function() return fmt("%s:set_state(%s%s)", o, pick{"{loss_scale = -1}", "{loss_scale = 0/0}", "{loss_scale = 4, good_steps = -1}", "{loss_scale = 'x'}",
                                                            "{optimizer = 'SGD', iterations = 0, slots = {}, loss_scale = 2^1000}", "{good_steps = 1.5}", "5", "nil",
                                                            "{optimizer = 'Adam', iterations = 3, slots = {}, loss_scale = 8, good_steps = 2}"}, pick{"", ", {}", fmt(", {%s}", V())}) end,
    3, function() return assign(fmt("%s:%s(%s)", o, pick{"scale_loss", "scale_loss", "get_scaled_loss"},
                                    pick{fmt("mg.cast(%s, %s)", operand(), pick{"'float16'", "'bfloat16'", "'float32'", "'float64'", "'int64'"}), operand(), "3", "nil", "'x'", "mg.constant(60000, 'float16')"})) end,
    2, function() return assign(fmt("first(%s:get_unscaled_gradients(%s))", o, lso_grads())) end,
    2, function() return fmt("local t = mg.tape(); local v = %s; t:watch(v); local l = %s:scale_loss(mg.sum(%s(v * v))); t:stop(); %s:minimize(l, {v}, t)",
                             V(), o, pick{"", "mg.tanh", "mg.sigmoid"}, o) end,
    2, function() return fmt("%s.loss_scale = %s", o, pick{"1", "0", "-1", "(0/0)", "'x'", "2^20", "nil", "(1/0)"}) end,
    1, function() return fmt("local _ = tostring(%s), %s.dynamic, %s.name, %s.learning_rate", o, o, o, o) end,
  }
end

local function optim_stmt ()
  local o = fmt("O[%d]", R(1, NO))
  return wpick{
    3, function() return fmt("%s = mg.optim.SGD(%s)", o, pick{"nil", "{learning_rate = 0.1}", "{momentum = 0.9}", "{momentum = 0.9, nesterov = true}", "{learning_rate = 0/0}", "{learning_rate = 'x'}"}) end,
    3, function() return fmt("%s = mg.optim.Adam(%s)", o, pick{"nil", "{learning_rate = 0.01}", "{beta1 = 1}", "{epsilon = 0}", "{beta2 = 2}", "{beta_1 = 0.5, beta_2 = 0.9}", "0.1", "{beta1 = 0.5, beta_1 = 0.6}"}) end,
    2, function() return fmt("%s:apply_gradients({{%s, %s}, {%s, %s}})", o, V(), V(), V(), V()) end,
    5, function() return fmt("%s:apply_gradients(%s, %s)", o,
         pick{fmt("{%s, nil, %s}", V(), V()), fmt("{%s}", V()), "{}", "{nil}", fmt("{%s, %s}", V(), V()), "'g'", fmt("{%s:transpose()}", V())},
         pick{fmt("{%s, %s, %s}", V(), V(), V()), fmt("{%s}", V()), "{}", fmt("{%s, %s}", V(), V()), "nil", "{1}"}) end,
    6, function() return lso_stmt(o) end,
  }
end

local function memory_stmt (depth)
  return wpick{
    3, "local s = mg.memory.stats(); assert(s.current_bytes >= 0)",
    1, "mg.memory.reset_peak()", 1, "mg.memory.release_cache()",
    2, function() return fmt("mg.memory.setpause(%s%s)", pick{"100", "200", "99", "100000", "100001", "1.5", "(1<<40)", "'x'"}, chance(0.6) and ", " .. pick{"0", "-1", "(1<<62)", "1024", "nil"} or "") end,
    2, function() return fmt("mg.memory.set_cache_limit(%s)", pick{"0", "1", "(1<<62)", "-1", "1.5", "4096", "math.maxinteger"}) end,
    3, function() return fmt("mg.memory.trace(%s, function() %s end)", pick{"TMP .. '/trace.json'", "TMP .. '/trace.json'", "'/nonexistent/dir/x.json'", "5", "nil"}, body(depth + 1)) end,
    1, function() return fmt("mg.memory.trace(TMP .. '/trace.json', function() mg.memory.trace(TMP .. '/t2.json', function() end) end)") end,
    3, function() return fmt("mg.memory.span(%s, function() %s end)", pick{"'s'", "'s'", "5", "nil", "string.rep('a', 300)", "'\"quote'"}, body(depth + 1)) end,
    3, function() return fmt("local r = mg.memory.estimate(function() %s end); local _ = tostring(r), r.peak_bytes", body(depth + 1)) end,
    1, function() return fmt("mg.memory.estimate(%s)", pick{"5", "nil", "{}", "function() mg.memory.estimate(function() end) end"}) end,
    1, function() return fmt("mg.memory._computing(function() %s end)", body(depth + 1)) end,
    1, function() return fmt("mg.memory.with_plan(%s, function() %s end)", pick{"{}", "nil", "5"}, body(depth + 1)) end,
  }
end

local function random_stmt (depth)
  return wpick{
    3, function() return fmt("mg.random.seed(%s)", pick{"0", "1", "-1", "2^63", "math.maxinteger", "'x'", "42", "math.mininteger"}) end,
    2, "local s = mg.random.get_state(); mg.random.normal{2}; mg.random.set_state(s)",
    2, function() return fmt("mg.random.set_state(%s)", pick{"{seed = 1, offset = -1}", "{seed = 'x'}", "{}", "{seed = 1, offset = 1 << 62}", "5", "{seed = math.mininteger, offset = math.maxinteger}"}) end,
    2, function() return assign(fmt("mg.random.with_init_stream(%s)", pick{
         fmt("mg.random.normal, %s", shape()), fmt("function() %s; return V[1] end", body(depth + 1)), "error, 'x'", "5",
         "mg.random.with_init_stream, mg.random.uniform, {2}", "function() mg.random.seed(3); return mg.random.uniform{2} end"})) end,
  }
end

local function gc_stmt ()
  return wpick{
    5, "collectgarbage()", 2, function() return fmt("collectgarbage('step', %d)", R(0, 100)) end,
    1, "collectgarbage('generational')", 1, "collectgarbage('incremental')",
    0.5, "collectgarbage('stop'); local _ = mg.ones{3} + 1; collectgarbage('restart')",
    3, function() local x = pick{V(), Tk(), Fk(), "saved[1]", "O[1]"}; return fmt("getmetatable(%s).__gc(%s)", x, x) end,
    1, function() local x = V(); return fmt("getmetatable(%s).__close(%s)", x, x) end,
    1, function() return fmt("local z <close> = %s", pick{V(), Tk()}) end,
    3, function() return fmt("local x = %s; setmetatable({}, {__gc = function() saved[#saved + 1] = x end})", pick{V(), V(), Tk(), Fk(), Ak()}) end,
    2, function() return fmt("local x = %s; %s = nil; setmetatable({}, {__gc = function() saved[#saved + 1] = x end}); collectgarbage(); collectgarbage()", V(), V()) end,
    2, function() return assign(fmt("saved[%d]", R(1, 3))) end,
    2, function() return fmt("setmetatable({}, {__gc = function() %s end})", pick{
         fmt("%s:reset()", Tk()), fmt("V[1] = V[1] + 1"), "mg.tape()", "collectgarbage('step')",
         fmt("%s:gradient(V[1], V[2])", Tk()), fmt("V[2]:assign(V[1])"), "error('in gc')", fmt("getmetatable(%s).__gc(%s)", Tk(), Tk()),
         fmt("getmetatable(%s).__gc(%s)", V(), V()), fmt("mg.dispose(%s)", V()), fmt("local z <close> = %s", V()),
         "mg.memory.release_cache()", "mg.random.get_state()"}) end,
  }
end

local function coroutine_stmt (depth)
  local c = fmt("C[%d]", R(1, NC))
  return wpick{
    3, function() return fmt("%s = coroutine.create(function(a) local t = mg.tape(%s); t:watch(a); local y = a * a; coroutine.yield(y); %s; local g = t:gradient(y, a); coroutine.yield(g); return t end); local _, r = coroutine.resume(%s, %s); V[%d] = r",
                             c, pick{"", "{persistent = true}"}, body(depth + 1), c, V(), slot()) end,
    3, function() return fmt("local _, r = coroutine.resume(%s); V[%d] = r", c, slot()) end,
    1, function() return fmt("coroutine.close(%s)", c) end,
    2, function() return fmt("%s = coroutine.wrap(function() local t <close> = mg.tape(); %s; coroutine.yield(); %s end); %s()", c, body(depth + 1), body(depth + 1), c) end,
    1, function() return fmt("%s = coroutine.create(function() mg.memory.span('c', function() coroutine.yield() end) end); coroutine.resume(%s)", c, c) end,
    1, function() return fmt("%s = coroutine.create(function() %s:record(function() coroutine.yield() end) end); coroutine.resume(%s)", c, Tk(), c) end,
    1, function() return fmt("%s = coroutine.create(function() local g = mg.custom_gradient(function(a) return a * 2, function(dy) coroutine.yield(); return dy end end); local t = mg.tape(); t:watch(V[1]); local y = g(V[1]); t:gradient(y, V[1]) end); coroutine.resume(%s)", c, c) end,
  }
end

-- bigger tensors (over 256K elements), so the OpenMP paths run, strided too
local function big_stmt ()
  if chance(0.25) then
    return fmt("mg.set_num_threads(%s); local a = mg.random.normal(%s, 0, 1, %s); V[%d] = mg.matmul(%s, %s)", pick{"1", "2", "4"},
               pick{"{256, 300}", "{2, 128, 300}", "{300}"}, fdtype(), slot(), pick{"a", "a:transpose()", "a[1]"}, pick{"a:transpose()", "a", "mg.ones{300, 7}", "mg.ones{300}"})
  end
  local sh = pick{"{512, 600}", "{300000}", "{2, 400, 400}", "{600, 1, 512}"}
  local view = pick{"b", "b:transpose()", "b:slice({-1, 1, -1})", "mg.broadcast_to(mg.slice(b, 1), {3, table.unpack(mg.slice(b, 1).shape)})", "b[1]"}
  return fmt("mg.set_num_threads(%s); local b = mg.random.normal(%s, 0, 1, %s); local w = %s; V[%d] = mg.%s(%s(w) %s w%s)",
             pick{"1", "2", "3", "4"}, sh, fdtype(), view, slot(), pick{"sum", "mean", "max", "argmax", "min"},
             pick{"mg.tanh", "mg.exp", "mg.sigmoid", "mg.relu", "mg.sqrt", "mg.abs", "mg.log", ""}, pick{"*", "+", "-", "/", "//", "%"},
             pick{"", ", 1", ", -1", ", 1, true"})
end

-- saved_tensors_hooks: Lua pack/unpack called when a tape saves a tensor and when
-- the backward needs it back; also the ready-made float16/bfloat16/offload kinds
local function hook_fn ()
  return pick{"function(t) return t end", "function(t) return mg.cast(t, 'float16') end", "function(t) return t * 1 end",
              "function(t) return mg.ones{7, 7} end", "function(t) return 'x' end", "function(t) return {t} end", "function(t) return nil end",
              "function(t) error('hook') end", "function(t) T[1]:reset(); return t end", "function(t) collectgarbage(); return t end",
              "function(t) getmetatable(t).__gc(t); return t end", "function(t) coroutine.yield(); return t end",
              "function(t) return V[1] end", "function(t) local z = mg.tanh(t); return z end", "function(t) mg.memory.fail_after(1); return t end",
              "function(t) getmetatable(T[1]).__gc(T[1]); return t end", "function(t) return t:transpose() end", "function(t) return mg.cast(t, 'int64') end"}
end

local function hooks_stmt (depth)
  local kind = wpick{
    4, function() return fmt("%s, %s", hook_fn(), hook_fn()) end,
    2, function() return "function(t) return t end, function(t) return t end" end,
    2, function() return pick{"'float16'", "'bfloat16'"} end,
    2, function() return pick{"{offload = TMP}", "{offload = TMP}", "{offload = '/nonexistent/dir'}", "{offload = 5}", "{offload = TMP, bogus = 1}"} end,
    1, function() return pick{"'float8'", "5", "nil", "print"} end,
  }
  return wpick{
    5, function() return fmt("local t = mg.tape(%s); local x = %s; t:watch(x); local y = mg.saved_tensors_hooks(%s, function() return %s end); t:stop(); %s; V[%d] = y; V[%d] = first(t:gradient(y, x))",
                             pick{"", "{persistent = true}"}, operand(), kind, (tensor_expr(1):gsub("V%[%d+%]", "x", 1)), pick{"", "collectgarbage()", "t:reset()", "getmetatable(t).__gc(t)"}, slot(), slot()) end,
    3, function() return fmt("mg.saved_tensors_hooks(%s, function() %s end)", kind, body(depth + 1)) end,
    1, function() return fmt("mg.saved_tensors_hooks(%s, function() mg.saved_tensors_hooks(%s, function() %s end) end)", kind, kind, body(depth + 1)) end,
  }
end

local function misc_stmt ()
  return wpick{
    3, function() return fmt("mg.memory.fail_after(%d); %s; mg.memory.fail_after(0)", R(1, 80), body(1)) end,
    1, function() return fmt("mg.memory.fail_after(%d); %s", R(1, 400), pick{"collectgarbage()", gradient_call(Tk()), "V[1] = first(F[2](A[1], V[2]))", "V[1] = first(F[3](V[1]))"}) end,
    0.5, "local ops = mg.ops(); for i = 1, #ops do local o = ops[i]; local _ = o.name, o.kind, o.doc end",
    1, function() return fmt("local t = mg.tape(%s); local x = %s; t:watch(x); local y = x; for i = 1, %d do y = %s end; t:stop(); V[%d] = first(t:gradient(y, x))",
                             pick{"", "{persistent = true}"}, operand(), pick{100, 300, 600}, pick{"y * 1.001", "mg.tanh(y) + y", "y + x", "(y - x) * 0.5"}, slot()) end,
    1, function() return fmt("local ts = {}; for i = 1, %d do ts[i] = mg.tape(%s) end; V[%d] = %s; for i = 1, #ts, 7 do %s end",
                             pick{20, 100, 300}, pick{"", "{persistent = true}"}, slot(), tensor_expr(1),
                             pick{"ts[i]:stop()", "getmetatable(ts[i]).__gc(ts[i])", "ts[i]:reset()",
                                   -- chained: each gradient, recorded by the persistent tapes, is the next one's
                                   -- target: four orders at most (each costs ~3x the last: FINDINGS.md AD)
                                   "if i <= 22 then V[1] = first(ts[i]:gradient(V[1], V[2])) end"}) end,
    0.5, function() return fmt("debug.sethook(function() collectgarbage('step') end, '', %d); %s; debug.sethook()", pick{10, 100, 1000}, body(2)) end,
    3, function() return fmt("mg.set_num_threads(%s)", pick{"1", "2", "3", "4", "16", "0", "-1", "2^31", "((1<<32)+1)", "1.5", "'2'", "nil", "math.maxinteger", "(1<<31)+2"}) end,
    1, "local _ = mg.get_num_threads(), mg.clock(), mg.version, mg.is_recomputing()",
    2, function()
      local s = {}; local n = R(1, 3); for i = 1, n do s[i] = R(1, 3) end
      return fmt("mg.test.gradcheck(function(x, y) return %s end, {mg.random.normal(%s, 0, 1, %s), %s}%s)",
                 pick{"mg.tanh(x) * 2", "x * x", "mg.softmax(x)", "mg.sum(x, 1)", "x", "y", "'x'", "mg.cast(x, 'float32')", "mg.relu(x) + (y or 0)"},
                 shape_code(s), pick{'"float64"', '"float64"', '"float32"'}, pick{"nil", "V[1]", "3"}, pick{"", ", {eps = 0}", ", {atol = 1}"}) end,
    2, function() return fmt("local p = mg.progress(%s, {out = dummy, label = %s}); p:update(%s, %s); p:finish(%s)",
                             pick{"3", "0", "-1", "1.5", "(1<<40)"}, pick{"'e'", "nil", "5"}, pick{"1", "2", "0", "-5", "99"},
                             pick{"{loss = V[1]}", "nil", "{a = 1, b = 'x'}", "{l = mg.ones{2}}"}, pick{"nil", "{loss = 1}"}) end,
    1, "local _ = mg.nn.foo, mg.optim.bar, mg.nothing, mg[1]",
  }
end


-- {==================== float16 (and bfloat16) regions ====================
-- float16 autocast (emulated: products widened to float32 and rounded), half
-- tensors beside Lua numbers, half products outside a region, fit under float16

local function half_dt () return wpick{4, "'float16'", 2, "'bfloat16'"} end

-- an autocast region's dtype: float16 mostly, sometimes bad
local function region_dt () return wpick{8, "'float16'", 3, "'bfloat16'", 0.5, "'float32'", 0.3, "'float64'", 0.3, "'float8'", 0.3, "nil", 0.2, "5"} end

-- a product, with operands that fit (and sometimes large enough to overflow
-- float16's 65504) or taken from the slots
local function half_product ()
  local sd = pick{"1", "1", "1", "300", "1e-4", "1e5"}
  -- (normal draws float32/float64 only: half operands are cast)
  local function r (s) local dt = pick{"'float32'", "'float32'", "'float16'", "'bfloat16'", "'float64'"}
    local e = fmt("mg.random.normal(%s, 0, %s, %s)", s, sd, dt == "'float64'" and dt or "'float32'")
    return (dt == "'float16'" or dt == "'bfloat16'") and fmt("mg.cast(%s, %s)", e, dt) or e end
  return wpick{
    3, function() return fmt("mg.matmul(%s, %s)", r("{3, 4}"), pick{r("{4, 5}"), r("{4}"), "mg.ones{4, 2}", V()}) end,
    2, function() return fmt("mg.matmul(%s, %s)", operand(), operand()) end,
    2, function() return fmt("mg.dense(%s, %s, %s, %s)", r("{2, 3}"), r("{3, 4}"), pick{"nil", r("{4}"), "mg.zeros{4}"}, pick{"nil", "'relu'", "'tanh'", "'sigmoid'", "'gelu'", "'bogus'"}) end,
    2, function() return fmt("mg.conv2d(%s, %s, %s)", r("{1, 5, 5, 2}"), r("{3, 3, 2, 3}"), pick{"nil", "{padding = 'same'}", "{strides = 2}", "{dilation_rate = 2}", "{padding = 'same', activation = 'relu'}"}) end,
    1, function() return fmt("mg.conv2d_backward_input(%s, %s, {1, 5, 5, 2})", r("{1, 3, 3, 3}"), r("{3, 3, 2, 3}")) end,
    1, function() return fmt("mg.conv2d_backward_filter(%s, %s, {3, 3, 2, 3})", r("{1, 5, 5, 2}"), r("{1, 3, 3, 3}")) end,
    2, function() return fmt("mg.einsum(%s, %s, %s)", pick{"'ij,jk->ik'", "'bij,bkj->bik'", "'ij,kj->ik'"}, r("{2, 3}"), pick{r("{3, 2}"), r("{2, 3}"), r("{2, 2, 3}")}) end,
    2, function() return fmt("mg.scaled_dot_product_attention(%s, %s, %s%s)", r("{2, 3, 4}"), r("{2, 5, 4}"), r("{2, 5, 2}"), pick{"", ", {causal = true}", ", {scale = 100}"}) end,
    1, function() return fmt("mg.nn.Dense(3)(%s)", r("{2, 4}")) end,
  }
end

local function half_arith ()
  local op = pick{"+", "-", "*", "/", "^", "//", "%"}
  local h = fmt("mg.cast(%s, %s)", operand(), half_dt())
  return pick{fmt("%s %s %s", h, op, num()), fmt("%s %s %s", num(), op, h), fmt("%s %s %s", h, op, pick{"65536", "1e-8", "2^-25", "1e39", "65520"}),
              fmt("mg.%s(%s, %s)", pick{"greater", "less", "equal", "not_equal", "greater_equal", "maximum", "minimum", "clamp"}, h, num()),
              fmt("mg.where(mg.greater(%s, 0), %s, %s)", h, h, num())}
end

local function half_stmt (depth)
  return wpick{
    5, function() return fmt("mg.autocast(%s, function() %s end)", region_dt(), body(depth + 1)) end,
    6, function() return assign(fmt("mg.autocast(%s, function() return %s end)", region_dt(), half_product())) end,
    3, function() return assign(half_product()) end,
    5, function() return assign(half_arith()) end,
    4, function() return fmt("local t = mg.tape(); local x = %s; t:watch(x); local y = mg.autocast(%s, function() return %s end); t:stop(); V[%d] = y; V[%d] = first(t:gradient(mg.sum(y), x))",
                             operand(), region_dt(), (tensor_expr(1):gsub("V%[%d+%]", "x", 1)), slot(), slot()) end,
    2, function() return fmt("local t = mg.tape(); local w = mg.Variable(mg.random.normal({4, 3}, 0, %s)); local x = %s; local y = mg.autocast('float16', function() return mg.matmul(x, w) end); local l = mg.sum(y); t:stop(); V[%d] = first(t:gradient(%s, w))",
                             pick{"1", "1e-4", "300"}, pick{"mg.random.normal{2, 4}", "mg.random.normal({2, 4}, 0, 1e3)", operand()}, slot(), pick{"l", "l * 65536", "l * 1e-8", "mg.cast(l, 'float16') * 2^16"}) end,
    -- (the setting restored after, so that the rest of the program keeps its float16 regions)
    1, function() return fmt("local was = mg.mixed_precision.emulate_float16(%s); %s; mg.mixed_precision.emulate_float16(was)", pick{"true", "false", "nil", "1"}, body(depth + 1)) end,
    1, function() return fmt("mg.autocast('float16', function() mg.autocast('bfloat16', function() %s end) end)", body(depth + 1)) end,
    1, function() return fmt("mg.autocast('float16', function() V[%d] = mg.recompute_grad(function(a) return mg.matmul(a, mg.transpose(a)) end)(%s) end)", slot(), operand()) end,
    1, function()      -- fit under float16: the loss scaled on the tape, the optimizer wrapped
      return fmt("local m = mg.nn.Sequential{mg.nn.Dense(%s, 'relu'), mg.nn.Dense(1)}; m:compile{optimizer = %s, loss = 'mse'}; local x = mg.random.normal({8, 3}, 0, %s); local h = m:fit(x, mg.random.normal{8, 1}, {epochs = %d, batch_size = 4, verbose = 0, mixed_precision = %s}); V[%d] = m(x)",
                 pick{"4", "3"}, pick{"mg.optim.SGD(0.01)", "mg.optim.Adam()", "mg.optim.LossScaleOptimizer(mg.optim.SGD(0.01), {initial_scale = 2^20})", fmt("O[%d]", R(1, NO))},
                 pick{"1", "1e4", "1e-6"}, R(1, 2), pick{"'float16'", "'float16'", "'bfloat16'", "true", "'x'"}, slot())
    end,
  }
end

-- }===================================================================


-- {====================== oracles (silently wrong) ======================
-- Statements whose answer is known: gradcheck of a random smooth composition,
-- an op on a strided view against the same op on a contiguous copy,
-- recompute_grad against the plain function, jacobian against gradient, a
-- persistent tape asked twice. A disagreement prints "FUZZ-WRONG: <check>" on
-- stderr (check.sh: kind "wrong"). Library errors inside them are skipped.
-- Expressions are typed: gexpr knows the shape it produces.

local function copy (s) local c = {}; for i, d in ipairs(s) do c[i] = d end; return c end
local function numel_of (s) local n = 1; for _, d in ipairs(s) do n = n * d end; return n end

-- a smooth (or almost everywhere smooth) expression of `e` of shape s
local function gexpr (e, s, depth)
  if depth <= 0 then return e, s end
  local inner, sh = gexpr(e, s, depth - 1)
  local nd = #sh
  local options = {
    5, function() return fmt("mg.%s(%s)", pick{"tanh", "sigmoid", "tanh", "neg"}, inner), sh end,
    2, function() return pick{fmt("mg.sqrt(%s * %s + 1)", inner, inner), fmt("mg.log(%s * %s + 1)", inner, inner),
                              fmt("mg.exp(mg.tanh(%s))", inner), fmt("(%s) ^ 2", inner), fmt("(%s) ^ 3", inner),
                              fmt("1 / (1 + (%s) * (%s))", inner, inner), fmt("(%s) * 2 - 0.5", inner),
                              fmt("mg.abs(%s)", inner), fmt("mg.relu(%s)", inner)}, sh end,
    3, function() return fmt("(%s) * (%s)", inner, gexpr(e, s, depth - 1)), sh end,
    2, function() return fmt("(%s) + (%s)", inner, (gexpr(e, s, depth - 1))), sh end,
    1, function() return fmt("mg.where(mg.greater(%s, 0), %s, (%s) * 0.5)", inner, inner, inner), sh end,
    1, function() return fmt("mg.maximum(%s, mg.tanh(%s) * 0.3)", inner, inner), sh end,
    2, function() return pick{fmt("mg.sin(%s)", inner), fmt("mg.cos(%s)", inner), fmt("mg.log1p(%s * %s)", inner, inner),
                              fmt("mg.expm1(mg.tanh(%s))", inner), fmt("mg.erf(%s)", inner), fmt("mg.clamp(%s, -0.7, 0.9)", inner),
                              fmt("mg.cumsum(%s)", inner)}, (function() return sh end)() end,
  }
  local function add (w, f) options[#options + 1] = w; options[#options + 1] = f end
  -- broadcasting against a constant of a suffix shape
  add(2, function()
    local k = R(0, nd); local c = {}
    for i = nd - k + 1, nd do c[#c + 1] = chance(0.3) and 1 or sh[i] end
    if numel_of(c) > 16 then return inner, sh end
    local function lit (d)
      if d > #c then return fmt("%.2f", math.random() * 4 - 2) end
      local parts = {}
      for i = 1, c[d] do parts[i] = lit(d + 1) end
      return "{" .. table.concat(parts, ", ") .. "}"
    end
    local k = #c == 0 and lit(1) or lit(1)
    return fmt("(%s) %s mg.constant(%s, 'float64')", inner, pick{"*", "+", "-"}, k), sh end)
  if nd >= 1 then
    add(3, function()
      local a = R(1, nd); local keep = chance(0.3); local out = {}
      for i = 1, nd do if i ~= a then out[#out + 1] = sh[i] elseif keep then out[#out + 1] = 1 end end
      return fmt("mg.%s(%s, %d%s)", pick{"sum", "mean", "sum", "max", "min"}, inner, pick{a, a - nd - 1}, keep and ", true" or ""), out end)
    -- (no std: entries equal as functions but not to the bit, sort(x) * x of two, put std
    -- at its kink (zero spread) everywhere, where the tape differentiates the rounding: FINDINGS V)
    add(1, function() return fmt("mg.%s(%s)", pick{"sum", "mean", "logsumexp", "prod", "norm", "var"}, inner), {} end)
    add(1, function() local a = R(1, nd); local out = copy(sh); table.remove(out, a)
      return fmt("mg.%s(%s, %d)", pick{"logsumexp", "prod", "var", "norm"}, inner, a), out end)
    add(1, function() return fmt("mg.flip(%s, %d)", inner, R(1, nd)), sh end)
    add(1, function() return fmt("first(mg.sort(%s, %d))", inner, R(1, nd)), sh end)
    add(1, function() local out = copy(sh); out[1] = 2 * sh[1]; return fmt("mg.tile(%s, {2%s})", inner, string.rep(", 1", nd - 1)), out end)
    add(1, function() local out = copy(sh); out[nd] = sh[nd] + 2; return fmt("mg.pad(%s, {%s{1, 1}}, {mode = '%s'})", inner, string.rep("{0, 0}, ", nd - 1), sh[nd] >= 2 and pick{"constant", "edge", "reflect", "wrap"} or "constant"), out end)
    if nd == 2 then add(1, function() return fmt("mg.%s(%s)", pick{"tril", "triu"}, inner), sh end)
                    add(1, function() return fmt("mg.einsum('ij,kj->ik', %s, %s)", inner, inner), {sh[1], sh[1]} end) end
    add(2, function() local out = {}; for i = 1, nd do out[i] = sh[nd + 1 - i] end; return fmt("mg.transpose(%s)", inner), out end)
    add(1, function() return fmt("mg.reshape(%s, {-1})", inner), {numel_of(sh)} end)
    add(2, function() if sh[nd] == 0 then return inner, sh end
      return fmt("mg.%s(%s, -1)", pick{"softmax", "log_softmax"}, inner), sh end)
    add(3, function()                                    -- a slice, steps of either sign
      local specs, out = {}, {}
      for i = 1, nd do
        local n = sh[i]
        if n == 0 or chance(0.3) then specs[i] = "nil"; out[#out + 1] = n
        elseif chance(0.2) then specs[i] = tostring(R(1, n)) -- drops the dimension
        else
          local a, b = R(1, n), R(1, n)
          local step = pick{1, 1, 2, -1, -1, -2, 3}
          if (step > 0 and a > b) or (step < 0 and a < b) then a, b = b, a end
          specs[i] = fmt("{%d, %d, %d}", a, b, step)
          out[#out + 1] = (math.abs(b - a)) // math.abs(step) + 1
        end
      end
      return fmt("mg.slice(%s, %s)", inner, table.concat(specs, ", ")), out end)
    add(2, function() local a = R(1, nd); local out = copy(sh); out[a] = 2 * sh[a]
      return fmt("mg.concat({%s, %s}, %d)", inner, inner, a), out end)
    if sh[1] > 0 then
      add(1, function() local out = copy(sh); table.remove(out, 1); return fmt("(%s)[%d]", inner, R(1, sh[1])), out end)
      add(1, function() local idx = {}; for i = 1, R(1, 3) do idx[i] = R(1, sh[1]) end
        local out = copy(sh); out[1] = #idx
        return fmt("mg.gather(%s, {%s})", inner, table.concat(idx, ", ")), out end)
    end
    if nd == 2 then add(2, function() return fmt("mg.matmul(%s, mg.transpose(%s))", inner, inner), {sh[1], sh[1]} end) end
    if nd == 2 then
      add(2, function() return fmt("mg.dense(%s, mg.transpose(%s), %s, %s)", inner, inner,
                                   pick{"nil", fmt("mg.sum(%s, 2)", inner)}, pick{"'relu'", "'tanh'", "'sigmoid'", "nil"}),
                               {sh[1], sh[1]} end)
    end
    if nd == 1 then add(1, function() return fmt("mg.matmul(%s, %s)", inner, inner), {} end) end
  end
  if nd < 7 then
    add(1, function() local out = copy(sh); table.insert(out, 1, 1); return fmt("mg.expand_dims(%s, 1)", inner), out end)
    add(1, function() local out = copy(sh); table.insert(out, 1, 2); return fmt("mg.broadcast_to(%s, %s)", inner, shape_code(out)), out end)
    add(1, function() local out = copy(sh); table.insert(out, 1, 2); return fmt("mg.stack({%s, %s})", inner, inner), out end)
  end
  add(1, function() return fmt("CG(%s)", inner), sh end)
  add(1, function() return fmt("RG(%s)", inner), sh end)
  local code, out = wpick(options)
  return code, out
end

local function oracle_shape ()
  local s = {}
  for i = 1, wpick{1, 0, 4, 1, 4, 2, 2, 3} do s[i] = pick{1, 2, 2, 3, 3, 4} end
  if numel_of(s) > 16 then s = {2, 3} end
  return s
end

-- x of shape s, maybe as a strided view
local function oracle_input (s)
  if chance(0.5) or #s == 0 then return fmt("mg.random.normal(%s, 0, 1, 'float64')", shape_code(s)) end
  if chance(0.5) then
    local r = {}; for i = 1, #s do r[i] = s[#s + 1 - i] end
    return fmt("mg.transpose(mg.random.normal(%s, 0, 1, 'float64'))", shape_code(r))
  end
  local b, specs = {}, {}
  for i = 1, #s do b[i] = 2 * s[i]; specs[i] = fmt("{%d, 1, -2}", 2 * s[i]) end
  return fmt("mg.slice(mg.random.normal(%s, 0, 1, 'float64'), %s)", shape_code(b), table.concat(specs, ", "))
end

local oracle_kinds

local function oracle_stmt ()
  -- an injected allocation failure (fail_after) would make the two sides differ
  return "mg.memory.fail_after(0); " .. oracle_kinds()
end

oracle_kinds = function ()
  local s = oracle_shape()
  local x = oracle_input(s)
  local e = gexpr("x", s, R(1, 3))
  return wpick{
    4, function()
      return fmt("local x = %s; local ok, err = pcall(mg.test.gradcheck, function(x) return %s end, {x}, {atol = 1e-5, rtol = 1e-3}); if not ok and tostring(err):find('gradcheck: input', 1, true) then WRONG('gradcheck', err) end", x, e)
    end,
    1, function()      -- second order: the gradient function, gradchecked
      return fmt("local x = %s; local ok, err = pcall(mg.test.gradcheck, function(x) local t = mg.tape(); t:watch(x); local y = mg.sum(%s); t:stop(); return t:gradient(y, x) end, {x}, {atol = 1e-5, rtol = 1e-3}); if not ok and tostring(err):find('gradcheck: input', 1, true) then WRONG('gradcheck-2nd-order', err) end", x, e)
    end,
    3, function()      -- a strided view against a contiguous copy: values and gradients
      return fmt("local v = %s; if v:numel() == 0 then return end; local c = mg.constant(v:totable(), 'float64'); local function f(x) return %s end; local t = mg.tape({persistent = true}); t:watch({v, c}); local ok1, a = pcall(f, v); local ok2, b = pcall(f, c); t:stop(); if ok1 ~= ok2 then WRONG('view-vs-copy-error', tostring(a) .. ' / ' .. tostring(b)) end; if not ok1 then return end; CHECK('view-vs-copy', a, b); CHECK('view-vs-copy-gradient', t:gradient(a, v), t:gradient(b, c))", x, e)
    end,
    2, function()      -- recompute_grad against the plain function, with dropout replayed
      local drop = chance(0.4) and "x = mg.nn.dropout(x, 0.5); " or ""
      return fmt("local x = %s; local function f(x) %sreturn %s end; local s = mg.random.get_state(); local t1 = mg.tape(); t1:watch(x); local ok1, a = pcall(f, x); t1:stop(); if not ok1 then return end; mg.random.set_state(s); local t2 = mg.tape(); t2:watch(x); local b = mg.recompute_grad(f, {policy = %s})(x); t2:stop(); CHECK('recompute-forward', a, b, 0); CHECK('recompute-gradient', t1:gradient(a, x), t2:gradient(b, x), 1e-12)", x, drop, e,
                 wpick{3, function() return pick{"'nothing'", "'dots'", "'everything'", "'output'"} end,
                       1, "function(op, shape) return #shape == 0 end", 1, "function(op, shape, dtype) return #shape > 0 end",
                       4, function()
                         local ops = {"mul", "add", "sub", "tanh", "sigmoid", "sum", "mean", "max", "exp", "pow", "matmul", "transpose",
                                      "slice", "concat", "div", "neg", "softmax", "log_softmax", "where", "maximum", "reshape", "sqrt", "log"}
                         local a, b = pick(ops), pick(ops)
                         return fmt("function(op, shape) return (op == '%s' or op == '%s')%s end", a, b, pick{"", " and #shape == 0", " and #shape > 0"})
                       end})
    end,
    1, function()      -- jacobian summed over y's axes = gradient of sum(y)
      return fmt("local x = %s; local t = mg.tape({persistent = true}); t:watch(x); local ok, y = pcall(function(x) return %s end, x); t:stop(); if not ok or y:numel() > 16 then return end; local j = t:jacobian(y, x, {unconnected = 'zero'}); local axes = {}; for i = 1, y.ndim do axes[i] = i end; local js = #axes > 0 and mg.sum(j, axes) or j; CHECK('jacobian-vs-gradient', js, t:gradient(y, x, {unconnected = 'zero'}), 1e-9)", x, e)
    end,
    2, function()      -- a variable changed in place after a tape read it: the tape keeps the old value
      local how = pick{"v:assign_sub(v:value(), 1)", "v:assign_add(v:value(), 2)", "v:assign(mg.zeros_like(v:value()))",
                       "v:assign_sub(mg.ones_like(v:value()), 0.5)", "mg.optim.SGD{learning_rate = 1}:apply_gradients({v:value()}, {v})",
                       "mg.optim.Adam{learning_rate = 1}:apply_gradients({v:value()}, {v})"}
      return fmt("local x = %s; local v = mg.Variable(mg.random.normal(x.shape, 0, 1, 'float64')); local old = mg.constant(v:value():totable(), 'float64'); local t = mg.tape({persistent = true}); t:watch(x); local y = mg.sum(v * x); local y2 = mg.sum(mg.tanh(v:value()) * x); t:stop(); %s; CHECK('mutation-after-record', t:gradient(y, x), old, 0); CHECK('mutation-after-record-tanh', t:gradient(y2, x), mg.tanh(old), 0)", x, how)
    end,
    2, function()      -- identity saved_tensors_hooks give the plain gradient bit for bit; float16 ones are close
      local k = pick{"function(t) return t end, function(t) return t end", "{offload = TMP}", "function(t) return {t} end, function(p) return p[1] end"}
      return fmt("local x = %s; local function f(x) return %s end; local t1 = mg.tape(); t1:watch(x); local ok, a = pcall(f, x); t1:stop(); if not ok then return end; local t2 = mg.tape(); t2:watch(x); local b = mg.saved_tensors_hooks(%s, f, x); t2:stop(); CHECK('hooks-forward', a, b, 0); CHECK('hooks-gradient', t1:gradient(a, x), t2:gradient(b, x), 0)", x, e, k)
    end,
    1, function()      -- a persistent tape asked twice; a non-persistent tape refuses
      return fmt("local x = %s; local t = mg.tape({persistent = true}); t:watch(x); local ok, y = pcall(function(x) return %s end, x); t:stop(); if not ok then return end; local g1 = t:gradient(y, x); local g2 = t:gradient(y, x); CHECK('persistent-twice', g1, g2, 0)", x, e)
    end,
  }
end

-- }===================================================================

-- {=========== oracles for float16 arithmetic and loss scaling ===========

-- a Lua number beside a half tensor enters arithmetic in float32, giving
-- float32: h op n must equal float32(h) op n to the bit (the same float32 op on
-- the same float32 operands), and so for n op h. Comparisons round n to the
-- tensor's dtype: greater(h, n) equals greater(h, constant(n, dtype)); n is
-- drawn exactly representable in float32, so rounding it to a half directly or
-- through float32 gives the same half (no double rounding).
local function half_number_oracle ()
  local s = oracle_shape()
  local dt = pick{"'float16'", "'float16'", "'bfloat16'"}
  local sd = pick{"1", "1", "300", "1e4", "1e-5", "1e-7"}
  local n = pick{"65536", "2^-26", "3", "-2.5", "0.5", "65504", "65520", "2^20", "2^-14", "2^-24", "2^-25", "3 * 2^-26", "0.1", "1/3", "1e-8", "1e39",
                 "(1/0)", "(-1/0)", "(0/0)", "0", "-0.0", "7", "1e5", "2^127", "2^-130"}
  local op = pick{"+", "-", "*", "/", "^", "//", "%"}
  local cmp_n = pick{"65536", "3", "-2.5", "0.5", "65504", "65520", "2^20", "2^-14", "2^-24", "2^-25", "3 * 2^-26", "0", "7", "1e5", "2^-20", "1.5", "(1/0)", "(0/0)"}
  local x = fmt("mg.cast(mg.random.normal(%s, 0, %s), %s)", shape_code(s), sd, dt)
  return wpick{
    3, function() return fmt("local h = %s; local n = %s; local a, b = h %s n, mg.cast(h, 'float32') %s n; if a.dtype ~= 'float32' then WRONG('half-number-dtype', a.dtype) end; CHECK('half-number-arith', a, b, 0, 0)", x, n, op, op) end,
    2, function() return fmt("local h = %s; local n = %s; local a, b = n %s h, n %s mg.cast(h, 'float32'); if a.dtype ~= 'float32' then WRONG('half-number-dtype', a.dtype) end; CHECK('half-number-arith-reversed', a, b, 0, 0)", x, n, op, op) end,
    2, function() local f = pick{"greater", "less", "equal", "not_equal", "greater_equal", "less_equal"}
      return fmt("local h = %s; local n = %s; CHECK('half-number-compare', mg.%s(h, n), mg.%s(h, mg.constant(n, %s)), 0, 0)", x, cmp_n, f, f, dt) end,
  }
end

-- a LossScaleOptimizer whose scale is a power of two (dynamic growth only
-- doubles it, a skip only halves it, so it stays one while it stays >= 1),
-- fed the float32/float64 finite gradients g times its scale, divides them back
-- exactly (g * 2^k / 2^k = g when nothing overflows or goes subnormal: g is
-- normal(0, 1)-sized and the scale at most 2^24 * 2^steps), so the inner
-- optimizer sees g to the bit: the variables must equal those of the same
-- inner optimizer alone fed g, bit for bit. A step of non-finite gradients, when
-- dynamic, is skipped: the inner optimizer must not see it at all. Also:
-- get_state/set_state into a fresh wrapper, then the same steps on both, gives
-- the same variables, scale and count; minimize on scale_loss(loss) against the
-- inner optimizer's minimize on loss (the tape's backward is linear in its seed
-- and a power-of-two seed scales every rounding exactly).
local function lso_oracle ()
  local dt = pick{"'float32'", "'float32'", "'float64'"}
  local shapes = {}
  for i = 1, R(1, 3) do shapes[i] = shape_code(oracle_shape()) end
  local inner = pick{"mg.optim.SGD{learning_rate = 0.1}", "mg.optim.SGD{learning_rate = 0.1, momentum = 0.9}", "mg.optim.SGD{learning_rate = 0.05, momentum = 0.5, nesterov = true}",
                     "mg.optim.Adam{learning_rate = 0.01}", "mg.optim.AdamW{learning_rate = 0.01}", "mg.optim.RMSprop()", "mg.optim.SGD{learning_rate = 0.1, clipnorm = 1}",
                     "mg.optim.Adam{global_clipnorm = 0.5}", "mg.optim.SGD{learning_rate = 0.1, weight_decay = 0.01}"}
  local dynamic = chance(0.7)
  local opts = fmt("{initial_scale = 2^%d, dynamic = %s%s}", R(0, 24), tostring(dynamic), chance(0.6) and fmt(", dynamic_growth_steps = %d", pick{1, 2, 3, 1000}) or "")
  local steps = R(1, 5)
  local bad = {}
  for i = 1, steps do bad[i] = dynamic and chance(0.25) end
  local pairs_form = chance(0.3)
  local hole = #shapes > 1 and chance(0.3) and R(1, #shapes) or 0
  local setup = fmt("local dt = %s; local shapes = {%s}; local function mk() return %s end; local a, b = mk(), mg.optim.LossScaleOptimizer(mk(), %s); local va, vb = {}, {}; for i, s in ipairs(shapes) do local x = mg.random.normal(s, 0, 1, dt); va[i] = mg.Variable(x * 1); vb[i] = mg.Variable(x * 1) end; " ..
                    "local function grads(sd) local g = {n = #shapes}; for i, s in ipairs(shapes) do if i ~= %d then g[i] = mg.random.normal(s, 0, sd, dt) end end; return g end; " ..
                    "local function scaled(g, S) local o = {n = g.n}; for i = 1, g.n do if g[i] then o[i] = g[i] * S end end; return o end; " ..
                    "local function apply(o, g, vs) if %s then local p = {}; for i = 1, #vs do if g[i] then p[#p + 1] = {g[i], vs[i]} end end; return o:apply_gradients(p) end; return o:apply_gradients(g, vs) end",
                    dt, table.concat(shapes, ", "), inner, opts, hole, tostring(pairs_form))
  local stepcode = {}
  for i = 1, steps do
    if bad[i] then
      stepcode[#stepcode + 1] = fmt("do local g = scaled(grads(1), b.loss_scale); local k = %d; if not g[k] then k = g.n == 1 and 1 or (k %% g.n) + 1 end; g[k] = (g[k] or mg.random.normal(shapes[k], 0, 1, dt)) * %s; local s0 = b.loss_scale; local r = apply(b, g, vb); if r ~= false then WRONG('loss-scale-skip', 'applied a non-finite step') end; if b.loss_scale ~= math.max(s0 / 2, 1) then WRONG('loss-scale-halve', s0 .. ' -> ' .. b.loss_scale) end end",
                                        R(1, #shapes), pick{"(1/0)", "(0/0)", "(-1/0)"})
    else
      stepcode[#stepcode + 1] = fmt("do local g = grads(%s); local gb = scaled(g, b.loss_scale); apply(a, g, va); local r = apply(b, gb, vb); if r ~= true then WRONG('loss-scale-applied', tostring(r)) end end", pick{"1", "1", "0.01", "100"})
    end
  end
  local check = "for i = 1, #va do CHECK('loss-scale-vs-inner', va[i]:value(), vb[i]:value(), 0, 0) end; if a.iterations ~= b.iterations then WRONG('loss-scale-iterations', a.iterations .. ' vs ' .. b.iterations) end"
  return wpick{
    4, function() return fmt("%s; %s; %s", setup, table.concat(stepcode, "; "), check) end,
    2, function()      -- state round trip into a fresh wrapper, then the same steps on both
      return fmt("%s; %s; local vc = {}; for i = 1, #vb do vc[i] = mg.Variable(vb[i]:value() * 1) end; local c = mg.optim.LossScaleOptimizer(mk(), %s); c:set_state(b:get_state(vb), vc); " ..
                 "for _ = 1, %d do local g = grads(1); local S = b.loss_scale; if c.loss_scale ~= S then WRONG('loss-scale-state-scale', S .. ' vs ' .. c.loss_scale) end; apply(b, scaled(g, S), vb); apply(c, scaled(g, S), vc) end; " ..
                 "for i = 1, #vb do CHECK('loss-scale-state-round-trip', vb[i]:value(), vc[i]:value(), 0, 0) end; if b.loss_scale ~= c.loss_scale or b.good_steps ~= c.good_steps or b.iterations ~= c.iterations then WRONG('loss-scale-state-counts', b.loss_scale .. '/' .. b.good_steps .. '/' .. b.iterations .. ' vs ' .. c.loss_scale .. '/' .. c.good_steps .. '/' .. c.iterations) end",
                 setup, table.concat(stepcode, "; "), opts, R(1, 3))
    end,
    2, function()      -- minimize: scale_loss on the tape against the inner optimizer's plain loss
      local loss = pick{"mg.sum(mg.tanh(v) * c)", "mg.mean(v * v) + mg.sum(mg.sigmoid(v))", "mg.sum(mg.exp(mg.tanh(v)) * c)", "mg.sum((v - c) ^ 2)"}
      return fmt("%s; local cs = {}; for i, s in ipairs(shapes) do cs[i] = mg.random.normal(s, 0, 1, dt) end; local function L(vs) local l = 0; for i, v in ipairs(vs) do local c = cs[i]; l = l + %s end; return l end; " ..
                 "for _ = 1, %d do local ta = mg.tape(); local la = L(va); ta:stop(); a:minimize(la, va, ta); local tb = mg.tape(); local lb = b:scale_loss(L(vb)); tb:stop(); if b:minimize(lb, vb, tb) ~= true then WRONG('loss-scale-minimize-applied', 'skipped') end end; %s",
                 setup, loss, R(1, 3), check)
    end,
  }
end

-- }===================================================================


-- {=============== structured ops, typed (images, indices, attention) ===============
-- sexpr is gexpr's counterpart for the ops whose shapes must fit: conv2d's and
-- the pools' windows, put_along_axis's and take_along_axis's indices, topk's k,
-- attention's keys. It returns the code and the shape it gives; the filters,
-- gammas and keys it needs are declared before f (ctx.pre) as constants or
-- variables. These programs run nested tapes (a gradient of a gradient)
-- through recompute_grad, which is how issue 27's heap overflow in
-- max_pool2d's backward was reached.

local function ceil_div (a, b) return (a + b - 1) // b end

-- a parameter of shape s declared before f; a variable sometimes (recompute_grad
-- then sees a variable read inside f)
local function sparam (ctx, s)
  ctx.n = ctx.n + 1
  local name = "p" .. ctx.n
  local e = fmt("mg.random.normal(%s, 0, 1, %q)", shape_code(s), ctx.dt)
  if chance(0.3) then e = fmt("mg.Variable(%s)", e); ctx.vars[#ctx.vars + 1] = name end
  ctx.pre[#ctx.pre + 1] = fmt("local %s = %s", name, e)
  return name
end

-- 1-based indices along an axis of size n, m of them (distinct when asked)
local function sindices (n, m, distinct)
  local out, pool = {}, {}
  for i = 1, n do pool[i] = i end
  for i = 1, m do
    if distinct then out[i] = table.remove(pool, R(1, #pool)) else out[i] = R(1, n) end
  end
  return out
end

-- an int64 constant of shape s, 1..n; with `distinct`, no index twice
-- along any line of `axis` (put_along_axis "set" then writes each entry once)
local function sindex_lit (s, axis, n, distinct)
  local lines, at = {}, {}
  local function value ()
    local key = {}
    for d = 1, #s do if d ~= axis then key[#key + 1] = at[d] end end
    key = table.concat(key, ",")
    lines[key] = lines[key] or sindices(n, s[axis], distinct)
    return lines[key][at[axis]]
  end
  local function level (d)
    if d > #s then return tostring(value()) end
    local parts = {}
    for i = 1, s[d] do at[d] = i; parts[i] = level(d + 1) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return fmt("mg.constant(%s, 'int64')", level(1))
end

local function with (s, a, v) local c = copy(s); c[a] = v; return c end

-- one window dimension: in pixels, window k dilated by d, stride st, padding
-- -> the output size, or nil when the window does not fit
local function sout (n, k, st, d, padding)
  local ext = (k - 1) * d + 1
  if padding == "same" then return ceil_div(n, st) end
  local p = padding == "valid" and 0 or padding
  if n + 2 * p < ext then return nil end
  return (n + 2 * p - ext) // st + 1
end

local function sexpr (ctx, e, s, depth)
  if depth <= 0 then return e, s end
  local x, sh = sexpr(ctx, e, s, depth - 1)
  local nd = #sh
  local options = {}
  local function add (w, f) options[#options + 1] = w; options[#options + 1] = f end
  -- any shape -> an (N,H,W,C) image, its entries gathered (repeats: ties for the pools)
  add(nd == 4 and 1 or 6, function()
    local n = numel_of(sh)
    if n == 0 then return x, sh end
    local img = {R(1, 2), R(1, 4), R(1, 4), R(1, 3)}
    local idx = {}
    for i = 1, numel_of(img) do idx[i] = chance(0.2) and 1 or R(1, n) end
    return fmt("mg.reshape(mg.gather(mg.reshape(%s, {-1}), {%s}), %s)", x, table.concat(idx, ", "), shape_code(img)), img end)
  add(2, function() return fmt("mg.tanh(%s)", x), sh end)
  add(1, function() return fmt("(%s) * (%s)", x, x), sh end)
  if nd == 4 then
    add(6, function()                                  -- conv2d
      local kh, kw, o = R(1, 3), R(1, 3), R(1, 3)
      local st = {R(1, 2), R(1, 2)}
      local dl = chance(0.3) and {R(1, 2), R(1, 2)} or {1, 1}
      local padding = pick{"valid", "same", "same", R(0, 2)}
      local oh, ow = sout(sh[2], kh, st[1], dl[1], padding), sout(sh[3], kw, st[2], dl[2], padding)
      if not oh or not ow then padding, oh, ow = "same", ceil_div(sh[2], st[1]), ceil_div(sh[3], st[2]) end
      local w = sparam(ctx, {kh, kw, sh[4], o})
      local b = chance(0.5) and ", " .. sparam(ctx, {o}) or ""
      local act = pick{"", "", ", activation = \"tanh\"", ", activation = \"sigmoid\"", ", activation = \"relu\""}
      if act:find("relu") then ctx.kinks = true end
      -- a convolution's tanh or sigmoid: its output is at most 1 whatever the sums
      -- before it, whose rounding (large terms that cancel) the float32 comparisons'
      -- bound, scaled by the output, does not allow for; saturated, its gradient
      -- 1 - y^2 turns on the pre-activation's last bits (FINDINGS.md AC)
      if act:find("tanh") or act:find("sigmoid") then ctx.saturates = true end
      return fmt("mg.conv2d(%s, %s%s, {strides = {%d, %d}, padding = %s, dilation_rate = {%d, %d}%s})", x, w, b,
                 st[1], st[2], type(padding) == "string" and fmt("%q", padding) or padding, dl[1], dl[2], act),
             {sh[1], oh, ow, o} end)
    add(6, function()                                  -- the pools: strides default to the window
      local kh, kw = R(1, 3), R(1, 3)
      local st = chance(0.5) and {kh, kw} or {R(1, 3), R(1, 3)}
      local padding = pick{"valid", "same", "same"}
      local oh, ow = sout(sh[2], kh, st[1], 1, padding), sout(sh[3], kw, st[2], 1, padding)
      if not oh or not ow then padding, oh, ow = "same", ceil_div(sh[2], st[1]), ceil_div(sh[3], st[2]) end
      local strides = (st[1] == kh and st[2] == kw and chance(0.5)) and "" or fmt(", strides = {%d, %d}", st[1], st[2])
      local f = pick{"max_pool2d", "avg_pool2d"}
      if f == "max_pool2d" then ctx.kinks = true end
      return fmt("mg.%s(%s, {pool_size = {%d, %d}%s, padding = %q})", f, x, kh, kw, strides, padding), {sh[1], oh, ow, sh[4]} end)
  end
  if nd >= 1 and numel_of(sh) > 0 then
    add(2, function()                                  -- layer_norm over the last axis
      local gb = chance(0.6) and fmt(", %s, %s", sparam(ctx, {sh[nd]}), sparam(ctx, {sh[nd]})) or ""
      -- a row of equal entries (the gathers repeat them) has variance 0: its
      -- derivatives scale as 1/sqrt(epsilon) per order, so rounding in the
      -- last bits of x - mean shows at the second order (stiff)
      ctx.stiff = true
      return fmt("mg.layer_norm(%s%s)", x, gb), sh end)
    add(2, function()
      return fmt("mg.cumsum(%s, %d%s)", x, R(1, nd), pick{"", ", {exclusive = true}", ", {reverse = true}", ", {exclusive = true, reverse = true}"}), sh end)
    add(2, function()                                  -- pad: reflect needs pads below the size
      local parts, out = {}, copy(sh)
      local mode = pick{"constant", "edge", "reflect", "symmetric", "wrap"}
      for i = 1, nd do
        local lim = mode == "reflect" and sh[i] - 1 or mode == "symmetric" and sh[i] or mode == "wrap" and sh[i] or 2
        local a, b = R(0, math.min(lim, 2)), R(0, math.min(lim, 2))
        parts[i] = fmt("{%d, %d}", a, b); out[i] = sh[i] + a + b
      end
      return fmt("mg.pad(%s, {%s}, {mode = %q})", x, table.concat(parts, ", "), mode), out end)
    add(2, function()
      local a = R(1, nd)
      ctx.kinks = true
      if chance(0.5) then return fmt("first(mg.sort(%s, %d%s))", x, a, pick{"", ", {descending = true}"}), sh end
      local k = R(1, sh[a])
      local opt = pick{"", ", {largest = false}", ", {sorted = false}"}
      -- unsorted, the k largest come in index order: a near-tie that half precision
      -- rounds the other way swaps which entry comes first (FINDINGS.md AC)
      if opt:find("sorted") then ctx.reorders = true end
      return fmt("first(mg.topk(%s, %d, %d%s))", x, k, a, opt), with(sh, a, k) end)
    add(3, function()                                  -- put_along_axis: set needs distinct indices along a line
      local a, mode = R(1, nd), pick{"add", "set"}
      local m = R(1, mode == "set" and sh[a] or 3)
      local is = with(sh, a, m)
      local vals = sparam(ctx, is)
      return fmt("mg.put_along_axis(%s, %s, %s, %d, {mode = %q})", x, sindex_lit(is, a, sh[a], mode == "set"), vals, a, mode), sh end)
    add(2, function()
      local a = R(1, nd)
      if chance(0.4) then ctx.kinks = true; return fmt("mg.take_along_axis(%s, mg.argsort(%s, %d), %d)", x, x, a, a), sh end
      local m = R(1, 3)
      return fmt("mg.take_along_axis(%s, %s, %d)", x, sindex_lit(with(sh, a, m), a, sh[a]), a), with(sh, a, m) end)
    add(2, function()
      local a = R(1, nd)
      local idx = sindices(sh[a], R(1, 3))
      return fmt("mg.gather(%s, {%s}, %d)", x, table.concat(idx, ", "), a), with(sh, a, #idx) end)
    add(1, function() return fmt("mg.reshape(%s, {-1})", x), {numel_of(sh)} end)
  end
  if nd >= 2 and nd <= 4 and numel_of(sh) > 0 then
    add(3, function()                                  -- attention over the last two axes
      local how = R(1, 3)
      if how == 1 then return fmt("mg.scaled_dot_product_attention(%s, %s, %s%s)", x, x, x, pick{"", ", {causal = true}", ", {scale = 0.5}"}), sh end
      local lk, dv = R(1, 4), R(1, 3)
      local k = sparam(ctx, with(sh, nd - 1, lk))
      local v = sparam(ctx, with(with(sh, nd - 1, lk), nd, dv))
      local opt = ""
      if how == 3 then                                 -- a row may be all masked out
        ctx.n = ctx.n + 1; ctx.kinks = true
        ctx.pre[#ctx.pre + 1] = fmt("local p%d = mg.greater(mg.random.normal(%s, 0, 1, 'float64'), -0.5)", ctx.n, shape_code({sh[nd - 1], lk}))
        opt = fmt(", {mask = p%d}", ctx.n)
      end
      return fmt("mg.scaled_dot_product_attention(%s, %s, %s%s)", x, k, v, opt), with(sh, nd, dv) end)
  end
  if nd == 2 then
    add(2, function()
      return pick{{fmt("mg.einsum('ij,kj->ik', %s, %s)", x, x), {sh[1], sh[1]}}, {fmt("mg.einsum('ij->ji', %s)", x), {sh[2], sh[1]}},
                  {fmt("mg.einsum('ij,ij->i', %s, %s)", x, x), {sh[1]}}, {fmt("mg.einsum('ij->', %s)", x), {}}} end)
  elseif nd == 3 then
    add(2, function() return fmt("mg.einsum('bij,bkj->bik', %s, %s)", x, x), {sh[1], sh[2], sh[2]} end)
  elseif nd == 4 then
    add(1, function() return fmt("mg.einsum('nhwc,nhwc->nc', %s, %s)", x, x), {sh[1], sh[4]} end)
  end
  local r, rs = wpick(options)
  if type(r) == "table" then return r[1], r[2] end
  return r, rs
end

-- x, the parameters and f, declared; returns that code, ctx and f's output shape
local function struct_setup (dt)
  local ctx = {n = 0, pre = {}, vars = {}, dt = dt, kinks = false}
  local s = {}
  for i = 1, R(1, 4) do s[i] = R(1, 4) end
  if numel_of(s) > 48 then s = {2, 3, 2} end
  local code, out = sexpr(ctx, "x1", s, R(2, 5))
  local x = fmt("mg.random.normal(%s, 0, 1, %q)", shape_code(s), dt)
  if chance(0.4) then x = fmt("mg.Variable(%s)", x) end
  local pre = table.concat(ctx.pre, "; ")
  return fmt("%s%slocal x = %s; local function f(x1) return %s end", pre, pre ~= "" and "; " or "", x, code), ctx, out
end

-- the sources of the inner gradient: x and the variables among the parameters
local function struct_sources (ctx)
  local s = {"x"}
  for _, v in ipairs(ctx.vars) do s[#s + 1] = v end
  return "{" .. table.concat(s, ", ") .. "}"
end

-- a gradient of a gradient: t2's gradient of sum(y * y), then t1's of the sum
-- of its squares; `gcode` is the function called (f, recompute_grad(f) ...)
local function nested_grad (ctx, gcode, outer)
  return fmt("local g = %s; local t1 = mg.tape(); local t2 = mg.tape(); t1:watch(x); t2:watch(x); local y = first(g(x)); local l = mg.sum(y * y); t2:stop(); local d = t2:gradient(l, %s, nil, {unconnected = 'zero'}); local s = mg.sum(d[1] * d[1]); for i = 2, #d do s = s + mg.sum(d[i] * d[i]) end; t1:stop(); local dd = %s",
             gcode, struct_sources(ctx), outer and "t1:gradient(s, x, nil, {unconnected = 'zero'})" or "nil")
end

local function struct_wrap ()
  return wpick{3, "f", 6, "mg.recompute_grad(f)",
               2, function() return fmt("mg.recompute_grad(f, {policy = %s})", policy()) end,
               1, "mg.recompute_grad(mg.recompute_grad(f))", 1, "mg.recompute_grad(function(a) return RG(f(a)) end)"}
end

-- crashes only: the nested gradients a few times over, collecting in between;
-- float32 ones under bfloat16 autocast a third of the time (its products,
-- attention, gelu and sums run on bfloat16 as it is)
local function struct_stmt ()
  local dt = chance(0.6) and "float64" or "float32"
  local setup, ctx = struct_setup(dt)
  local body = fmt("%s; V[%d] = first(dd or d)", nested_grad(ctx, struct_wrap(), chance(0.8)), slot())
  if dt == "float32" and chance(0.35) then body = fmt("mg.autocast(%s, function() %s end)", pick{"'bfloat16'", "'float16'"}, body) end
  return fmt("%s; for _ = 1, %d do %s; collectgarbage() end", setup, R(1, 3), body)
end

-- oracles: recompute_grad against f, first and second order; gradcheck
-- where f is smooth (no max pool, sort, topk, argsort or mask)
local FOCUS_AC = os.getenv("FUZZ_FOCUS") == "struct_autocast"
local function struct_oracle_stmt ()
  local dt = (chance(0.8) and not FOCUS_AC) and "float64" or "float32"
  local tol = dt == "float64" and 1e-9 or 1e-4
  local setup, ctx = struct_setup(dt)
  -- a stiff function's second order compares only in float64, at a tolerance
  -- that grows with the square of the first order's largest entry (sc): its
  -- rounding noise is the first order's magnitude times a derivative that the
  -- variance-0 rows amplify (FINDINGS.md O)
  -- A float32 second order compares within 1e-4 of its largest entry, not entry by
  -- entry: an entry is a sum of terms of about that size that can cancel, leaving
  -- float32's rounding of them (FINDINGS.md S)
  local second = not ctx.stiff and dt == "float64" and fmt("CHECK('struct-recompute-2nd-order', e1, e2, %g)", tol)
                 or not ctx.stiff and "CHECK('struct-recompute-2nd-order', e1, e2, nil, 1e-4 * (1 + math.max(amax(e1), amax(e2))))"
                 or dt == "float64" and "CHECK('struct-recompute-2nd-order', e1, e2, 1e-9 * (1 + sc) ^ 2)" or ""
  local both = fmt("local function run(gcode) %s; local sc = 0; for i = 1, #d do if d[i]:numel() > 0 then sc = math.max(sc, mg.max(mg.abs(d[i])):item()) end end; return y, d[1], dd, sc end; local ok1, y1, d1, e1, sc = pcall(run, f); if not ok1 then return end; local y2, d2, e2 = run(mg.recompute_grad(f%s)); CHECK('struct-recompute-forward', y1, y2, %g); CHECK('struct-recompute-gradient', d1, d2, %g); %s",
                   nested_grad(ctx, "gcode", true), chance(0.3) and fmt(", {policy = %s}", pick{"'nothing'", "'dots'", "'everything'", "'output'"}) or "", tol, tol, second)
  if dt == "float64" and not ctx.kinks and chance(0.5) then
    return fmt("mg.memory.fail_after(0); %s; local x0 = mg.is_variable(x) and x:value() or x; local ok, err = pcall(mg.test.gradcheck, function(a) return f(a) end, {x0}, {atol = 1e-5, rtol = 1e-3}); if not ok and tostring(err):find('gradcheck: input', 1, true) then WRONG('struct-gradcheck', err) end", setup)
  end
  if dt == "float32" and (chance(0.4) or FOCUS_AC) then
    -- under bfloat16 autocast: recompute_grad against f to the bit, forward and first
    -- order (the docs' promise; FINDINGS.md AB), and f against float32 within
    -- bfloat16's reach (a wrong kernel is far off; FINDINGS.md T), not where an
    -- unsorted topk's order turns on a near-tie or a convolution's tanh or sigmoid
    -- squeezes the output's scale (FINDINGS.md AC);
    -- not against float32 when f is stiff (a layer_norm of a row bfloat16 rounds to
    -- nearly equal entries normalises the rounding itself: 0 against 0.30, seed 1186
    -- with FUZZ_FOCUS=struct_autocast)
    local half = chance(0.5) and "float16" or "bfloat16"
    local one = fmt("local function run(gcode, ac) local function body() local g = gcode; local t2 = mg.tape(); t2:watch(x); local y = first(g(x)); local l = mg.sum(mg.cast(y, 'float32') ^ 2); t2:stop(); return mg.cast(y, 'float32'), first(t2:gradient(l, %s, nil, {unconnected = 'zero'})) end; if ac then return mg.autocast('%s', body) end; return body() end", struct_sources(ctx), half)
    if half == "float16" then
      -- float16: 11 bits of mantissa (rounding 2^-11 = 4.9e-4 a step, 8x finer than
      -- bfloat16, whose forward passes within 5e-2 of the largest entry), so 5e-2 of the
      -- largest entry keeps a wide margin for a chain of ~20 roundings and the
      -- cancellation of intermediates larger than the output; the gradient is compared
      -- to float32's too. Its range is what differs: a product above 65504 is infinite
      -- (then NaN through softmax, layer_norm ...) and below 6e-8 flushes. A flush is
      -- within that bound (absolute, at most 6e-8 an entry, amplified at most by the
      -- products after it); an overflow is not compared: float32 against float16 only
      -- where the float16 run is all finite and float32's forward and gradient stay under
      -- 1e4 (headroom below 65504 for the products inside f and their gradients);
      -- recompute against plain to the bit.
      -- Not against float32 when f is stiff (a layer_norm: a row of nearly equal
      -- entries has its spread, and so its normalised output, made of the rounding
      -- itself), reorders (an unsorted topk) or saturates (a convolution's tanh or
      -- sigmoid), and the gradient not when f has kinks (a max, sort, relu or mask: a
      -- rounding that swaps a near-tie sends the gradient elsewhere)
      local vs32 = (ctx.stiff or ctx.reorders or ctx.saturates) and "" or ctx.kinks and "CHECK('struct-f16-vs-float32', y1, y3, nil, 5e-2 * (1 + amax(y3)))"
                   or "CHECK('struct-f16-vs-float32', y1, y3, nil, 5e-2 * (1 + amax(y3))); CHECK('struct-f16-gradient-vs-float32', d1, d3, nil, 5e-2 * (1 + s3))"
      return fmt("mg.memory.fail_after(0); %s; %s; local ok1, y1, d1 = pcall(run, f, true); if not ok1 then return end; local y2, d2 = run(mg.recompute_grad(f), true); local y3, d3 = run(f, false); local s1, s3 = amax(d1), amax(d3); " ..
                 "CHECK('struct-f16-recompute-forward', y1, y2, nil, 0); CHECK('struct-f16-recompute-gradient', d1, d2, nil, 0); " ..
                 "if finite(y1) and finite(d1) and finite(y3) and finite(d3) and amax(y3) < 1e4 and s3 < 1e4 then %s end",
                 setup, one, vs32)
    end
    return fmt("mg.memory.fail_after(0); %s; %s; local ok1, y1, d1 = pcall(run, f, true); if not ok1 then return end; local y2, d2 = run(mg.recompute_grad(f), true); local y3, d3 = run(f, false); local s1, s3 = amax(d1), amax(d3); CHECK('struct-autocast-recompute-forward', y1, y2, nil, 0); CHECK('struct-autocast-recompute-gradient', d1, d2, nil, 0); %s",
               setup, one, (ctx.stiff or ctx.reorders or ctx.saturates) and "" or "CHECK('struct-autocast-vs-float32', y1, y3, nil, 5e-2 * (1 + amax(y3)))")
  end
  return fmt("mg.memory.fail_after(0); %s; %s", setup, both)
end

-- }===================================================================


-- a statement body; depth > 2 gives only simple ones
local FOCUS = os.getenv("FUZZ_FOCUS")      -- testing an oracle: only it, at the top level
body = function (depth)
  depth = depth or 0
  if FOCUS and depth == 0 then
    local f = ({half_number = half_number_oracle, lso = lso_oracle, struct_oracle = struct_oracle_stmt, struct_autocast = struct_oracle_stmt, half = function() return half_stmt(0) end,
                optim = optim_stmt})[FOCUS]
    if f then return "mg.memory.fail_after(0); " .. f() end
  end
  if depth > 2 then
    return wpick{5, function() return assign(tensor_expr(1)) end, 1, inspect, 1, gc_stmt}
  end
  return wpick{
    30, function() return assign(tensor_expr(0)) end,
    8, inspect,
    8, variable_stmt,
    14, function() return tape_stmt(depth) end,
    6, function() return custom_stmt(depth) end,
    6, function() return recompute_stmt(depth) end,
    7, function() return nn_stmt(depth) end,
    2, optim_stmt,
    3, function() return memory_stmt(depth) end,
    2, function() return random_stmt(depth) end,
    5, gc_stmt,
    2, function() return coroutine_stmt(depth) end,
    1.5, misc_stmt,
    0.7, big_stmt,
    2.5, function() return hooks_stmt(depth) end,
    5, function() return half_stmt(depth) end,
    depth == 0 and ORACLE_WEIGHT or 0, oracle_stmt,     -- not inside hooks, traces, records ...
    depth <= 1 and 4 or 0, struct_stmt,
    depth == 0 and 3 or 0, struct_oracle_stmt,
    depth == 0 and 1.5 or 0, function() return "mg.memory.fail_after(0); " .. half_number_oracle() end,
    depth == 0 and 1.5 or 0, function() return "mg.memory.fail_after(0); " .. lso_oracle() end,
  }
end

-- }===================================================================


-- {============================= output ==============================

local out = {}
local function line (s) out[#out + 1] = s end

line(fmt("-- moongrad fuzz program, seed %d (lua5.4 spec/fuzz/gen.lua %d); base shape %s, %s",
         seed, seed, shape_code(BASE), FDT))
line("local mg = mg or require 'moongrad'")
-- freed storages go back to malloc, so ASan sees a use after free of tensor data
if not chance(0.05) then line("mg.memory.set_cache_limit(0)") end
if F16 then line("mg.mixed_precision.emulate_float16(true)") end
line("local V, T, F, A, O, C, saved = {}, {}, {}, {}, {}, {}, {}")
line("local TMP, VERBOSE = os.getenv('FUZZ_TMP') or '/tmp', os.getenv('FUZZ_VERBOSE')")
line("local dummy = {write = function() end, flush = function() end}")
-- the entries of a table in a fixed order (1..#t, then string keys sorted): pairs'
-- order changes from run to run (Lua seeds its string hashes randomly)
line("local function entries (t) if type(t) ~= 'table' then return {t} end local out, ks = {}, {}; for _, x in ipairs(t) do out[#out + 1] = x end; for k in pairs(t) do if type(k) == 'string' then ks[#ks + 1] = k end end; table.sort(ks); for _, k in ipairs(ks) do out[#out + 1] = t[k] end; return out end")
-- the first leaf of a nest of plain tables; bounded, since a program may make a table hold
-- itself (A[1][1] = A[1]) and an op may hand it back (FINDINGS W)
line("local function first (g, depth) depth = depth or 0; if type(g) == 'table' and not getmetatable(g) and depth < 16 then return first(entries(g)[1], depth + 1) end return g end")
line("local function small (x) return not (mg.is_tensor(x) or mg.is_variable(x)) or x:numel() <= 64 end")
line("local function WRONG (what, detail) io.stderr:write('FUZZ-WRONG: ', what, ' (', tostring(detail):sub(1, 300), ')\\n'); error('wrong: ' .. what) end")
-- close: each pair within tol relative to the pair, or within `bound` when given
line("local function close (a, b, tol, bound) if not (mg.is_tensor(a) and mg.is_tensor(b)) then return rawequal(a, b) end; if table.concat(a.shape, ',') ~= table.concat(b.shape, ',') then return false end; local fa, fb = mg.reshape(mg.cast(a, 'float64'), {-1}):totable(), mg.reshape(mg.cast(b, 'float64'), {-1}):totable(); for i = 1, #fa do local p, q = fa[i], fb[i]; if not (p == q or (p ~= p and q ~= q) or math.abs(p - q) <= (bound or tol * (1 + math.abs(p) + math.abs(q)))) then return false, i, p, q end end; return true end")
line("local function CHECK (what, a, b, tol, bound) local ok, i, p, q = close(a, b, tol or 1e-9, bound); if not ok then WRONG(what, i and ('element ' .. i .. ': ' .. p .. ' vs ' .. q) or (tostring(a) .. ' vs ' .. tostring(b))) end end")
-- the largest finite magnitude in a tensor (0 for anything else)
line("local function amax (t) local m = 0; if mg.is_tensor(t) then for _, v in ipairs(mg.reshape(mg.cast(t, 'float64'), {-1}):totable()) do if math.abs(v) < math.huge then m = math.max(m, math.abs(v)) end end end; return m end")
-- no infinity or NaN in a tensor (true for anything else)
line("local function finite (t) if not mg.is_tensor(t) or t:numel() == 0 then return true end; return mg.sum(mg.cast(t, 'float64') * 0):item() == 0 end")
line("local CG = mg.custom_gradient(function(a) local y = mg.tanh(a); return y, function(dy) return dy * (1 - y * y) end end)")
line("local RG = mg.recompute_grad(function(a) return mg.sigmoid(a) * a end)")
line("local function S (f) if VERBOSE == '2' then io.stderr:write('line ', debug.getinfo(2, 'l').currentline, '\\n') end local ok, e = pcall(f); if VERBOSE and not ok then print('error: ' .. tostring(e):sub(1, 300)) end end")

-- first the slots get plausible values, so most later statements have operands
for i = 1, NV do
  local e
  if chance(0.2) then
    e = fmt("mg.Variable(mg.random.normal(%s, 0, 1, %s))", shape_code(shape_list()), fmt("%q", FDT))
  elseif chance(0.8) then
    e = fmt("mg.random.normal(%s, 0, 1, %s)", shape_code(shape_list()), chance(0.85) and fmt("%q", FDT) or '"float64"')
  else
    local s = shape_list()
    local dt = pick{'"int64"', '"bool"', fmt("%q", FDT)}
    e = fmt("mg.constant(%s, %s)", data_lit(s, dt), dt)
  end
  line(fmt("S(function() V[%d] = %s end)", i, e))
end
for k = 1, NT do
  if chance(0.7) then line(fmt("S(function() T[%d] = mg.tape(%s) end)", k, pick{"", "{persistent = true}", "{persistent = true}", "{watch_accessed_variables = false}"})) end
end
line(fmt("S(function() F[1] = mg.custom_gradient(function(a, b) local y = a * 2; return y, function(dy1) return dy1 * 2 end end) end)"))
line(fmt("S(function() F[2] = mg.recompute_grad(function(tbl, b, flag) %s end) end)", recompute_body(2)))
for k = 3, NF do line(fmt("S(function() F[%d] = %s end)", k, layer_expr())) end
for k = 1, NA do line(fmt("S(function() A[%d] = %s end)", k, table_arg())) end
line("S(function() O[1] = mg.optim.SGD{learning_rate = 0.1, momentum = 0.5}; O[2] = mg.optim.Adam() end)")

local nstmts = R(10, 60)
for _ = 1, nstmts do line(fmt("S(function() %s end)", body(0))) end
if chance(0.5) then line("S(function() collectgarbage() end)") end

io.write(table.concat(out, "\n"), "\n")

-- }===================================================================

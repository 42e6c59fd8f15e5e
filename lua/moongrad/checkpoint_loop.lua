--- moongrad.checkpoint_loop: a loop whose gradient replays it with
-- Griewank's binomial checkpointing (Revolve), as mg.checkpoint_loop:
--
--   state = mg.checkpoint_loop(step, state, n, {snapshots = k})
--
-- runs state = step(state, i) for i = 1..n. The schedule, the snapshots
-- and the reversal are the C core's (src/autodiff/loop.c,
-- mg_checkpoint_loop); this module gives the state its structure (a tensor
-- or nested tables of tensors, flattened to a list of leaves and rebuilt for
-- each step), checks what each step returns, and counts the steps by phase
-- for {stats = tbl}. Other values in a table state (numbers, strings,
-- booleans, tables holding no tensor, any object) pass through the steps:
-- the forward pass notes the ones each step got, and a re-run of step i in
-- the backward gets those again.
-- @module moongrad.checkpoint_loop
local mg = require "moongrad"
local check = require "moongrad.check"

local fail, show = check.fail, check.show
local WHO = "checkpoint_loop"

-- {===================== states as leaf lists ===================

local function is_leaf (v) return mg.is_tensor(v) or mg.is_variable(v) end

local function key_name (path, k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return path .. "." .. k end
  return ("%s[%s]"):format(path, type(k) == "string" and ("%q"):format(k) or tostring(k))
end

local function sorted_keys (who, t, path)
  local keys = {}
  for k in pairs(t) do
    if type(k) ~= "number" and type(k) ~= "string" then
      fail(who, "%s has a key of type %s; a state's keys are numbers and strings", path, type(k))
    end
    keys[#keys + 1] = k
  end
  table.sort(keys, function(a, b)
    if type(a) ~= type(b) then return type(a) == "number" end
    return a < b
  end)
  return keys
end

local function is_plain (v) return type(v) == "table" and getmetatable(v) == nil end

-- does v (a plain table, nested at most 32 deep) hold a tensor or a variable?
local function holds_leaf (v, depth)
  if is_leaf(v) then return true end
  if not is_plain(v) or depth > 32 then return false end
  for _, x in pairs(v) do
    if holds_leaf(x, depth + 1) then return true end
  end
  return false
end

-- The template of a state: {leaf = j} for a tensor or variable, {value = j}
-- for another value (a table holding no tensor is one value), {keys = ...,
-- child = {[k] = template}} for a table holding tensors; the leaves go to
-- `leaves` in order, with their shapes and dtypes, the values to `values`.
local function describe (who, v, path, leaves, values, depth)
  if is_leaf(v) then
    leaves[#leaves + 1] = v
    return {leaf = #leaves, path = path, shape = v.shape, dtype = v.dtype}
  end
  if depth > 0 and not holds_leaf(v, 0) then
    values.n = values.n + 1
    values[values.n] = v
    return {value = values.n, path = path}
  end
  if not is_plain(v) then
    fail(who, "%s is %s; the state must be a tensor or a table holding tensors", path, show(v))
  end
  if depth > 32 then fail(who, "%s is nested more than 32 deep (a cycle?)", path) end
  local node = {keys = sorted_keys(who, v, path), path = path, child = {}}
  for _, k in ipairs(node.keys) do
    node.child[k] = describe(who, v[k], key_name(path, k), leaves, values, depth + 1)
  end
  return node
end

-- a state of the template's structure over the leaves xs and the values vs (a new table)
local function build (tmpl, xs, vs)
  if tmpl.leaf then return xs[tmpl.leaf] end
  if tmpl.value then return vs[tmpl.value] end
  local t = {}
  for _, k in ipairs(tmpl.keys) do t[k] = build(tmpl.child[k], xs, vs) end
  return t
end

-- the leaves of what step i returned, checked against the template; its
-- other values go to vs (when given)
local function leaves_of (tmpl, v, i, out, vs)
  local where = ("step %d returned"):format(i)
  if tmpl.value then
    if holds_leaf(v, 0) then
      fail(WHO, "%s %s as %s; the state had no tensor there (a loop keeps where its tensors are)",
           where, tmpl.path, is_leaf(v) and show(v) or "a table holding tensors")
    end
    if vs then vs[tmpl.value] = v end
    return out
  end
  if tmpl.leaf then
    if not is_leaf(v) then
      fail(WHO, "%s %s as %s; it must have the structure of the state (a tensor here)", where,
           tmpl.path, show(v))
    end
    if v.dtype ~= tmpl.dtype or not check.same_shape(v.shape, tmpl.shape) then
      fail(WHO, "%s %s as %s %s; the state had it as %s %s (a loop keeps its state's shapes)",
           where, tmpl.path, check.shape(v.shape), v.dtype, check.shape(tmpl.shape), tmpl.dtype)
    end
    out[tmpl.leaf] = v
    return out
  end
  if type(v) ~= "table" or getmetatable(v) ~= nil then
    fail(WHO, "%s %s as %s; it must have the structure of the state (a table here)", where,
         tmpl.path, show(v))
  end
  for k in pairs(v) do
    if tmpl.child[k] == nil then fail(WHO, "%s %s, which the state did not have", where, key_name(tmpl.path, k)) end
  end
  for _, k in ipairs(tmpl.keys) do leaves_of(tmpl.child[k], v[k], i, out, vs) end
  return out
end

-- }=============================================================


-- {========================= the loop ==========================

local core = mg._loop

local loop = {}

--- The steps the gradient of a loop of n steps with k snapshots re-runs
-- besides its n taped ones: Revolve's minimum, less the n - 1 the forward
-- pass already made (mg_revolve_recomputed).
function loop.recomputed_steps (n, k)
  check.value(WHO .. ".recomputed_steps", "n", n, check.rule("an integer >= 0",
    function(v) return math.type(v) == "integer" and v >= 0 end))
  check.value(WHO .. ".recomputed_steps", "snapshots", k, check.positive_integer)
  return core.recomputed(n, k)
end

local count_rule = check.rule("an integer >= 0", function(v) return math.type(v) == "integer" and v >= 0 end)

--- checkpoint_loop(step, state, n [, {snapshots = k}]): state after
-- state = step(state, i) for i = 1..n, differentiated with Revolve
local function checkpoint_loop (step, state, n, opts)
  check.value(WHO, "step", step, check.callable)
  if type(n) == "number" and math.type(n) == "float" and n == math.floor(n) and n >= 0 and n < 2^53 then
    n = math.tointeger(n)
  end
  check.value(WHO, "n (the number of steps)", n, count_rule)
  local o = check.options(WHO, opts, {{"snapshots", check.positive_integer, nil}, {"stats", check.rule(
    "a table", function(v) return type(v) == "table" end), nil}})
  if state == nil then fail(WHO, "state is nil; give the loop's initial state (a tensor or a table of tensors)") end
  local x0, v0 = {}, {n = 0}
  local tmpl = describe(WHO, state, "state", x0, v0, 0)
  if #x0 == 0 then fail(WHO, "the state holds no tensors") end
  local k = o.snapshots or math.max(1, math.ceil(math.sqrt(n)))
  local stats = o.stats or {}
  stats.steps, stats.snapshots, stats.recomputed, stats.taped = n, k, 0, 0
  if n == 0 then return state end
  local counted = {forward = "steps", rerun = "recomputed", taped = "taped"}
  stats.steps = 0
  local L = #x0
  -- values[i]: the non-tensor values step i got (noted by the forward pass,
  -- which runs the steps in order; a re-run of step i takes them again)
  local values, nv = {v0}, v0.n
  local out = table.pack(core.run(function(i, phase, ...)
    local forward = phase == "forward" and nv > 0
    local vs = forward and {n = nv} or nil
    local y = step(build(tmpl, {...}, values[i] or v0), i)
    local key = counted[phase]
    stats[key] = stats[key] + 1
    local xs = leaves_of(tmpl, y, i, {}, vs)
    if forward then                                -- the same values as before: one table
      local was, same = values[i], true
      for j = 1, nv do same = same and rawequal(vs[j], was[j]) end
      values[i + 1] = same and was or vs
    end
    return table.unpack(xs, 1, L)
  end, n, math.min(k, n), table.unpack(x0)))
  return build(tmpl, out, values[n + 1] or v0)
end

return check.export(setmetatable(loop, {      -- errors name the user's line (moongrad.check)
  __call = function(_, ...) return checkpoint_loop(...) end,
  __name = "moongrad.checkpoint_loop",
}))

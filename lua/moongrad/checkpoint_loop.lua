--- moongrad.checkpoint_loop: a loop whose gradient replays it with
-- Griewank's binomial checkpointing (Revolve), as mg.checkpoint_loop:
--
--   state = mg.checkpoint_loop(step, state, n, {snapshots = k})
--
-- runs state = step(state, i) for i = 1..n. The tapes record the whole loop
-- as one custom gradient whose context saves k states (x_0 among them) and
-- the state before the last step; nothing inside a step is recorded. The
-- backward pass reverses the steps from the last to the first: it re-runs
-- step i under a local tape from x_(i-1), seeded with the gradient of x_i,
-- and gets x_(i-1) by advancing from the nearest snapshot, taking new
-- snapshots on the way as Revolve schedules them. For n steps and k
-- snapshots that re-runs the fewest steps possible (Griewank and Walther,
-- ACM TOMS 26(1), 2000): with r the least integer for which
-- beta(k, r) = C(k + r, k) >= n, reversing n steps from x_0 takes
-- r n - beta(k + 1, r - 1) forward steps; the loop's own forward already
-- went through n - 1 of them, so the gradient re-runs
-- r n - beta(k + 1, r - 1) - (n - 1) steps besides its n taped ones.
--
-- The schedule is the recursion Revolve's closed form describes: to reverse
-- l steps from a held state with s snapshots (that state's included),
-- advance m steps, keep that state, reverse the last l - m steps with s - 1
-- snapshots, let it go, then reverse the first m with s. Any m with
-- beta(s, r - 2) <= m <= beta(s, r - 1) and
-- beta(s - 1, r - 1) <= l - m <= beta(s - 1, r) reaches the minimum (the
-- two sub-costs add up to the closed form by Pascal's rule).
-- @module moongrad.checkpoint_loop
local mg = require "moongrad"
local check = require "moongrad.check"

local fail, show = check.fail, check.show
local WHO = "checkpoint_loop"

-- {======================== the schedule ========================

-- C(a, b) exactly, in integers (each partial product is a binomial)
local function binom (a, b)
  if b < 0 or b > a then return 0 end
  if b > a - b then b = a - b end
  local r = 1
  for i = 1, b do r = r * (a - b + i) // i end
  return r
end

-- beta(s, r) = C(s + r, s): the most steps s snapshots reverse with r
-- repetitions of each step at most
local function beta (s, r) return r < 0 and 0 or binom(s + r, s) end

-- the least r with beta(s, r) >= l
local function repetitions (l, s)
  local r = 0
  while beta(s, r) < l do r = r + 1 end
  return r
end

--- The forward steps that reversing l steps from a held state takes with s
-- snapshots (that state's included): Griewank's r l - beta(s + 1, r - 1).
local function reversal_cost (l, s)
  if l <= 1 then return 0 end
  local r = repetitions(l, s)
  return r * l - beta(s + 1, r - 1)
end

-- where to keep the next snapshot when reversing l >= 2 steps with s >= 2
local function split (l, s)
  local r = repetitions(l, s)
  return math.max(1, beta(s, r - 2), l - beta(s - 1, r))
end

-- the positions the forward pass keeps: x_0, the first descent of the
-- recursion, and x_(n-1) (Revolve's working state at its first turn)
local function forward_positions (n, k)
  local keep, a, l, s = {[0] = true}, 0, n, k
  while l >= 2 and s >= 2 do
    local m = split(l, s)
    a, l, s = a + m, l - m, s - 1
    keep[a] = true
  end
  if n >= 1 then keep[n - 1] = true end
  return keep
end

-- }=============================================================


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

-- the template of a state (true for a leaf, {keys = ..., [k] = template}
-- for a table) and its leaves in order, with their shapes and dtypes
local function describe (who, v, path, leaves, depth)
  if is_leaf(v) then
    leaves[#leaves + 1] = v
    return {leaf = #leaves, path = path, shape = v.shape, dtype = v.dtype}
  end
  if type(v) ~= "table" or getmetatable(v) ~= nil then
    fail(who, "%s is %s; the state must be a tensor or a table of tensors", path, show(v))
  end
  if depth > 32 then fail(who, "%s is nested more than 32 deep (a cycle?)", path) end
  local node = {keys = sorted_keys(who, v, path), path = path, child = {}}
  for _, k in ipairs(node.keys) do
    node.child[k] = describe(who, v[k], key_name(path, k), leaves, depth + 1)
  end
  return node
end

-- a state of the template's structure over the leaves xs (a new table)
local function build (tmpl, xs)
  if tmpl.leaf then return xs[tmpl.leaf] end
  local t = {}
  for _, k in ipairs(tmpl.keys) do t[k] = build(tmpl.child[k], xs) end
  return t
end

-- the leaves of what step i returned, checked against the template
local function leaves_of (tmpl, v, i, out)
  local where = ("step %d returned"):format(i)
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
  for _, k in ipairs(tmpl.keys) do leaves_of(tmpl.child[k], v[k], i, out) end
  return out
end

-- }=============================================================


-- {========================= the loop ==========================

local function is_float (x) return x.dtype == "float32" or x.dtype == "float64" end

-- One call: the forward runs the steps, keeping the forward positions in
-- ctx (counted as saved bytes); grad_fn runs the reversal.
local function make_call (step, tmpl, n, k, stats)
  local function run_step (xs, i)
    local y = step(build(tmpl, xs), i)
    return leaves_of(tmpl, y, i, {})
  end

  return mg.custom_gradient(function(ctx, ...)
    local x0 = table.pack(...)
    local L, nsaved = x0.n, 0
    local store = {}                 -- position -> {pos, x = leaves, rng, first = ctx index}
    local function keep (pos, xs)
      ctx:save(table.unpack(xs, 1, L))
      store[pos] = {pos = pos, x = xs, rng = mg.random.get_state(), first = nsaved + 1}
      nsaved = nsaved + L
    end
    local function let_go (e)        -- a forward snapshot the walk has passed (x_0 stays)
      if e.pos == 0 or store[e.pos] ~= e then return end
      for j = e.first, e.first + L - 1 do ctx:forget(j) end
      store[e.pos] = nil
    end

    local positions = forward_positions(n, k)
    local xs = {table.unpack(x0, 1, L)}
    mg.in_loop(function()
      for i = 1, n do
        if positions[i - 1] then keep(i - 1, xs) end
        xs = run_step(xs, i)
      end
    end)

    -- the state at position c, from the store or advanced from e
    local function fetch (e, c)
      if store[c] then return store[c] end
      mg.random.set_state(e.rng)
      local x = e.x
      for i = e.pos + 1, c do
        x = run_step(x, i)
        stats.recomputed = stats.recomputed + 1
      end
      return {pos = c, x = x, rng = mg.random.get_state()}
    end

    local vars, vgrads
    -- step e.pos + 1 under a local tape from e, seeded with adj (the
    -- gradient of its output leaves; nil: none); returns e's leaves' gradients
    local function turn (e, adj)
      mg.random.set_state(e.rng)
      local t = mg.tape()
      for j = 1, L do if is_float(e.x[j]) then t:watch(e.x[j]) end end
      local y = run_step(e.x, e.pos + 1)
      stats.taped = stats.taped + 1
      local targets, seeds = {}, {}
      for j = 1, L do
        if adj[j] ~= nil and is_float(y[j]) then targets[#targets + 1], seeds[#seeds + 1] = y[j], adj[j] end
      end
      if #targets == 0 then
        t:stop()
        return {}
      end
      -- The plain tape sums a variable's gradient over the steps in its walk's
      -- order, one op's share at a time. So that the sums round alike, the
      -- gradient so far enters this tape's walk first: sum(v * g) recorded
      -- last has the gradient g exactly.
      for q = 1, #vars do
        if vgrads[q] ~= nil then
          targets[#targets + 1], seeds[#seeds + 1] = mg.sum(vars[q] * vgrads[q]), mg.ones({}, vgrads[q].dtype)
        end
      end
      t:stop()
      local sources, at = {}, {}
      for j = 1, L do if is_float(e.x[j]) then sources[#sources + 1], at[j] = e.x[j], #sources + 1 end end
      local base = #sources
      for q = 1, #vars do sources[base + q] = vars[q] end
      local g = t:gradient(targets, sources, seeds)
      for q = 1, #vars do
        if g[base + q] ~= nil then vgrads[q] = g[base + q] end
      end
      local out = {}
      for j = 1, L do if at[j] then out[j] = g[at[j]] end end
      return out
    end

    -- reverses steps a+1..b from e (the state at a) with s snapshots
    local function reverse (e, b, s, adj)
      local a = e.pos
      if b - a == 1 then return turn(e, adj) end
      if s == 1 then
        for i = b, a + 1, -1 do
          local x = i - 1 == a and e or fetch(e, i - 1)
          adj = turn(x, adj)
          let_go(x)
        end
        return adj
      end
      local m = a + split(b - a, s)
      local xm = fetch(e, m)
      adj = reverse(xm, b, s - 1, adj)
      let_go(xm)
      xm = nil                                       -- luacheck: ignore (let it be collected)
      return reverse(e, m, s, adj)
    end

    local function backward (...)
      local args = table.pack(...)
      vars, vgrads = args.n > L and args[L + 1] or {}, {}
      local adj = {table.unpack(args, 1, L)}
      adj = ctx:recompute(function()
        return mg.in_loop(reverse, store[0], n, k, adj)
      end)
      local out = {}
      for j = 1, L do out[j] = adj[j] end
      if args.n > L then
        vgrads.n = #vars
        out[L + 1] = vgrads
        return table.unpack(out, 1, L + 1)
      end
      return table.unpack(out, 1, L)
    end
    xs[L + 1] = backward
    return table.unpack(xs, 1, L + 1)
  end, {context = true})
end

local loop = {}

--- The steps the gradient of a loop of n steps with k snapshots re-runs
-- besides its n taped ones: Revolve's minimum, less the n - 1 the forward
-- pass already made.
function loop.recomputed_steps (n, k)
  check.value(WHO .. ".recomputed_steps", "n", n, check.rule("an integer >= 0",
    function(v) return math.type(v) == "integer" and v >= 0 end))
  check.value(WHO .. ".recomputed_steps", "snapshots", k, check.positive_integer)
  if n <= 1 then return 0 end
  return reversal_cost(n, k) - (n - 1)
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
  local x0 = {}
  local tmpl = describe(WHO, state, "state", x0, 0)
  if #x0 == 0 then fail(WHO, "the state holds no tensors") end
  local k = o.snapshots or math.max(1, math.ceil(math.sqrt(n)))
  local stats = o.stats or {}
  stats.steps, stats.snapshots, stats.recomputed, stats.taped = n, k, 0, 0
  if n == 0 then return state end
  local call = make_call(step, tmpl, n, k, stats)
  local out = table.pack(call(table.unpack(x0)))
  return build(tmpl, out)
end

return setmetatable(loop, {
  __call = function(_, ...) return checkpoint_loop(...) end,
  __name = "moongrad.checkpoint_loop",
})

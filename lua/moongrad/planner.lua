-- planner.lua — know a step's memory before running it: mg.memory.estimate.
--
--   local report = mg.memory.estimate(step, x, y)   -- step(x, y) as a dry run
--   print(report)                                    -- the peak, and what makes it
--   report.peak_bytes                                -- what mg.memory.stats().peak_bytes would show
--
-- A dry run (mg_dry_run_begin, include/moongrad.h) runs the step with every
-- allocation it makes and no arithmetic: each op whose result is a float
-- tensor gets it fresh and unwritten (memory the allocator counts and the
-- system never maps in), views and integer results run as usual. So the
-- counters see the step's bytes as its real run would, in the time of the
-- dispatch alone. Garbage is collected before every allocation of the run:
-- the peak is what the step holds at its most, which the collector's
-- default pacing may exceed by the garbage it lets wait (bench/estimate.lua
-- measures both). Nothing the step would change changes: variables keep
-- their values (assignments and optimizer steps write nothing), the
-- optimizers their slots and step counts, the random stream its place, the
-- collector its pacing and the peak counters their state.

local mg = require "moongrad"

local planner = {}

local function human (n)
  local units, u = {"B", "KiB", "MiB", "GiB", "TiB"}, 1
  while n >= 1024 and u < #units do n, u = n / 1024, u + 1 end
  return u == 1 and ("%d B"):format(n) or ("%.2f %s"):format(n, units[u])
end

local PARTS = {
  {"variable_bytes", "weights (variables)"},
  {"saved_bytes", "saved for the backward (activations)"},
  {"gradient_bytes", "gradients in flight"},
  {"tensor_bytes", "other tensors (inputs, results, optimizer slots, temporaries)"},
}

local Report = {}
Report.__index = Report
Report.__name = "moongrad.memory.estimate"

Report.__tostring = function(r)
  local lines = {("moongrad.memory.estimate: peak %s (%d bytes), predicted in %.1f ms"):format(
    human(r.peak_bytes), r.peak_bytes, r.seconds * 1e3), "", "| at the peak | bytes | share |", "|---|---|---|"}
  for _, p in ipairs(PARTS) do
    local b = r.at_peak[p[1]:gsub("_bytes$", "")]
    lines[#lines + 1] = ("| %s | %s | %.0f%% |"):format(p[2], human(b), r.peak_bytes > 0 and 100 * b / r.peak_bytes or 0)
  end
  lines[#lines + 1] = ("\nThe tapes held at most %s at once."):format(human(r.peak_saved_bytes))
  if r.peak_saved_bytes > 0 then
    lines[#lines + 1] = "\n| the tapes at their most: made at | bytes |\n|---|---|"
    local shown, more, rest = 0, 0, 0
    for i, s in ipairs(r.saved_by_line) do
      if i <= 10 then lines[#lines + 1] = ("| %s | %s |"):format(s.site, human(s.bytes))
      else more, rest = more + 1, rest + s.bytes end
      shown = shown + s.bytes
    end
    if more > 0 then lines[#lines + 1] = ("| %d more lines | %s |"):format(more, human(rest)) end
    if r.peak_saved_bytes > shown then
      lines[#lines + 1] = ("| before the step (its inputs, ...) | %s |"):format(human(r.peak_saved_bytes - shown))
    end
  end
  return table.concat(lines, "\n")
end

local function callable (f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and mt.__call ~= nil
end

--- estimate(step, ...): step(...) as a dry run; a report whose peak_bytes is
-- the peak mg.memory.stats().peak_bytes would show for the step after
-- mg.memory.reset_peak() at its start, with what made it (at_peak: variable,
-- saved, gradient and tensor bytes), the tapes' most (peak_saved_bytes) and
-- what made it (saved_by_line: {site = "file:line", bytes =}, by the Lua
-- line outside moongrad's modules that made each tensor, most first), the
-- bytes live after it, its results and garbage let go (after_bytes), and the
-- seconds it took.
function planner.estimate (step, ...)
  if not callable(step) then
    error(("memory.estimate: step must be a function, got %s"):format(type(step)), 2)
  end
  local rng = mg.random.get_state()
  local budget = mg.memory.budget(nil)           -- the step as it runs without one
  collectgarbage()                               -- the start as a settled real step sees it
  -- garbage collected before every allocation: the peak of what the step
  -- holds, whatever the collector's pacing (which may add its allowance)
  local pause, min_bytes = mg.memory.setpause(100, 0)
  local t0 = mg.clock()
  local ok, stats = pcall(mg.memory._dry_run, step, ...)
  local seconds = mg.clock() - t0
  mg.memory.setpause(pause, min_bytes)
  mg.random.set_state(rng)
  mg.memory.budget(budget)                       -- (the dry run let its tensors go before its end)
  if not ok then
    error(("memory.estimate: the step failed in the dry run: %s"):format(tostring(stats)), 2)
  end
  table.sort(stats.saved_by_line, function(a, b) return a.bytes > b.bytes or (a.bytes == b.bytes and a.site < b.site) end)
  return setmetatable({
    peak_bytes = stats.peak_bytes,
    peak_saved_bytes = stats.peak_saved_bytes,
    after_bytes = stats.current_bytes,
    at_peak = {variable = stats.variable_bytes, saved = stats.saved_bytes, gradient = stats.gradient_bytes,
               tensor = stats.tensor_bytes},
    seconds = seconds,
    saved_by_line = stats.saved_by_line,
  }, Report)
end

-- {========================== plans ===========================
-- A plan says, for each stretch of the layers of the Sequential models a
-- step runs, whether the tape keeps what they save ("keep"), keeps their
-- input only and runs them again in the backward ("recompute", one
-- recompute_grad over the stretch), for one layer keeps its input and its
-- products' outputs and runs the rest again ("dots", recompute_grad's policy
-- of that name), or keeps it packed into bfloat16
-- ("pack", lossy plans only). Sequential:call runs its layers by the plan
-- while mg.memory.with_plan applies it. A step without a Sequential model
-- is planned per layer call of its model instead (below: "models that are
-- not chains"), the layers' __call running each call by the plan.

local Sequential = mg.nn.Sequential
local layer = require "moongrad.layer"

local function bytes_of (x) return mg.is_tensor(x) and x.nbytes or 0 end

-- {------------------------- measuring ---------------------------
-- What each layer of the outermost Sequential models a step runs saves on
-- the tape (a dry run of the step), and what its forward costs: each layer
-- timed on the model's first input, the best of two runs (a first pays for
-- oneDNN primitives made and pages touched; a busy machine's noise flipped
-- plans), for real, in inference mode (every
-- training flag off: no dropout drawn, no statistics moved), its last op
-- too. With spill, also what spilling costs a byte: each layer's forward
-- and a backward to its variables (of the sum of its output) under a tape
-- with the offload hooks against the same without them (the mean of two
-- runs each), over the bytes those runs spilled, once the whole model has run
-- spilled (which grows the directory's spill file to a step's bytes: every
-- later step writes over pages the file has, spill.c). The first spill of
-- a step's worth of new pages costs many times a later one (1.0 s against
-- 0.45 s for a 32-layer chain's step, bench/budget.lua's narrow one); the
-- rate is the later ones', which a run of layers alone, never holding more
-- than a layer saves, measures alike (0.15 against 0.11 ms a MiB), where a
-- whole run against the layers alone took their cache misses for the
-- files' cost (0.9 ms a MiB). No optimizer steps.

-- seconds of layer run's forward and backward under a tape, spilling to dir
-- or not, and the bytes spilled (what the files hold after the forward)
local function taped_seconds (run, dir)
  local t0, files = mg.clock(), mg.memory.stats().external_bytes
  local t = mg.tape()
  local y = dir and mg.saved_tensors_hooks({offload = dir}, run) or run()
  local differentiable = mg.is_tensor(y) and y.dtype:match("^b?float") ~= nil
  local loss = differentiable and mg.sum(y)
  t:stop()
  files = mg.memory.stats().external_bytes - files
  local vars = t:watched_variables()
  if differentiable and #vars > 0 then t:gradient(loss, vars) end
  return mg.clock() - t0, files
end

-- taped_seconds of n runs, spilling to dir or not: their means
local function runs (n, run, dir)
  local total, spilled = 0, 0
  for _ = 1, n do
    local ok, took, files = pcall(taped_seconds, run, dir)
    if not ok then error(("memory.plan: spill: %s"):format((tostring(took):gsub("^.-offload: ", ""))), 0) end
    total, spilled = total + took, spilled + files
  end
  return total / n, spilled / n
end

-- a layer's forward, its seconds and those of its last op when that op
-- made its output (a recomputed stretch ending at the layer keeps that
-- output and does not run the op again: policy "output"), the bytes of the
-- variables it reads (their gradients, which the backward holds), and what
-- policy "dots" would keep (the products' outputs) and leave to run again
-- (the seconds of every other op). The op times are stamps a save policy
-- takes as each op ends; a tape records, so that it is asked, and is dropped.
local SIZE = {float64 = 8, int64 = 8, float32 = 4, float16 = 2, bfloat16 = 2, bool = 1}

local function forward_seconds (run, x)
  local stamps, shape, products, others, prev = {}, nil, 0, 0, nil
  local function stamp (_, out_shape, dtype, product)
    local now = mg.clock()
    stamps[#stamps + 1], shape = now, out_shape
    if product then
      local n = SIZE[dtype] or 8
      for _, d in ipairs(out_shape) do n = n * d end
      products = products + n
    else
      others = others + (now - prev)
    end
    prev = now
    return false
  end
  local t = mg.is_tensor(x) and mg.tape()
  local t0 = mg.clock()
  prev = t0
  local y                                        -- (not `t and ... or run()`: a nil result ran it twice)
  if t then y = mg.recompute_grad(function(_) return run() end, {policy = stamp})(x) else y = run() end
  local seconds = mg.clock() - t0
  local grads = 0
  if t then
    t:stop()
    for _, v in ipairs(t:watched_variables()) do if v.trainable then grads = grads + v.nbytes end end
    t:reset()                                    -- (its node holds the model: let it go now)
  end
  local last = 0
  if #stamps > 0 and mg.is_tensor(y) and #shape == #y.shape then
    last = stamps[#stamps] - (stamps[#stamps - 1] or t0)
    for k = 1, #shape do if shape[k] ~= y.shape[k] then last = 0 end end
  end
  return y, seconds, math.min(last, seconds), grads, {bytes = products, seconds = others}
end

-- f(...) with the random stream and the values of every variable
-- reachable from root (its fields, lists and sublayers, however they were
-- assigned) put back after, even when f fails: timing a layer for real must
-- not move a BatchNorm's statistics, whatever its training flag (an
-- explicit `training` argument, a layer in a list the model does not track)
local function keeping_variables (root, f, ...)
  local rng = mg.random.get_state()
  local vars, fields, seen, todo = {}, {}, {}, {root}
  while #todo > 0 do
    local t = table.remove(todo)
    if mg.is_variable(t) then
      vars[#vars + 1] = {t, t:read_value()}      -- (copy on write: an assign leaves it as it is)
    elseif type(t) == "table" and not seen[t] then
      seen[t] = true
      local is_layer = rawget(t, "_vars") ~= nil  -- its counters too (BatchNorm's updates)
      for k, v in next, t do
        if type(v) == "table" or mg.is_variable(v) then todo[#todo + 1] = v end
        if type(k) == "table" then todo[#todo + 1] = k end
        if is_layer and type(v) == "number" then fields[#fields + 1] = {t, k, v} end
      end
    end
  end
  local out = table.pack(pcall(f, ...))
  for _, kv in ipairs(vars) do kv[1]:assign(kv[2]) end
  for _, tkv in ipairs(fields) do rawset(tkv[1], tkv[2], tkv[3]) end
  mg.random.set_state(rng)
  if not out[1] then error(out[2], 0) end
  return table.unpack(out, 2, out.n)
end

-- times each of layers: run_of(i, y) gives layer i's run and its input
-- (y: what layer i - 1 gave); with spill, also what spilling costs a byte,
-- once whole (the model's run) has run under the offload hooks
local function time_layers (layers, run_of, whole, spill)
  if spill then runs(1, whole, spill) end        -- the spill file grown to a step's bytes
  local plain, hooked, bytes, y = 0, 0, 0, nil
  for i, l in ipairs(layers) do
    local run, x = run_of(i, y)
    y, l.seconds, l.last_seconds, l.grad_bytes, l.dots = forward_seconds(run, x)
    local _, seconds, last, _, dots = forward_seconds(run, x)      -- the best of two
    if seconds < l.seconds then l.seconds, l.last_seconds = seconds, last end
    l.dots.seconds = math.min(l.dots.seconds, dots.seconds)
    if spill then
      local seconds, spilled = runs(2, run, spill)
      plain, hooked, bytes = plain + runs(2, run), hooked + seconds, bytes + spilled
    end
  end
  if spill then
    local rate = math.max(hooked - plain, 0) / math.max(bytes, 1)
    for _, l in ipairs(layers) do l.spill_seconds = l.saved * rate end
  end
end

-- fn run as the dry run ran it: under the autocast its call was made in
-- (a layer called in a bfloat16 region gets a bfloat16 input, which its
-- float32 weights meet only there)
local function under (dtype, fn) return function() return mg.autocast(dtype, fn) end end

-- a dry run's input with fresh floats (a dry run's are never written)
local function fresh (args)
  local out = {n = args.n}
  for i = 1, args.n do
    local x = args[i]
    if mg.is_tensor(x) and x.dtype:match("^b?float") then   -- (half: drawn in float32, then cast)
      local half = x.dtype == "float16" or x.dtype == "bfloat16"
      local ok, y = pcall(mg.random.normal, x.shape, 0, 1, half and "float32" or x.dtype)
      x = ok and (half and mg.cast(y, x.dtype) or y) or x
    end
    out[i] = x
  end
  return out
end

local function profile (timed, step, spill, ...)
  local models, order = {}, {}
  local depth = 0
  local function around (self, x, ...)
    if depth > 0 then return Sequential._run(self, 1, #self.layers, x, ...) end   -- an inner one is a layer
    depth = depth + 1
    local m = models[self]
    if not m then
      m = {model = self, layers = {}, first_input = timed and x or nil, first_args = timed and table.pack(...) or nil,
           autocast = mg.autocast_dtype() or false}
      models[self] = m
      order[#order + 1] = m
    end
    local ok, out = pcall(function(...)
      m.input = bytes_of(x)
      for i = 1, #self.layers do
        local before = mg.memory.stats().saved_bytes
        x = Sequential._run(self, i, i, x, ...)
        local l = m.layers[i] or {name = tostring(self.layers[i]):match("^[^\n]*")}
        l.saved = math.max(l.saved or 0, mg.memory.stats().saved_bytes - before)
        l.output = bytes_of(x)
        m.layers[i] = l
      end
      return x
    end, ...)
    depth = depth - 1
    if not ok then error(out, 0) end
    return out
  end
  local was = Sequential._around
  Sequential._around = around
  local ok, err = pcall(planner.estimate, step, ...)
  Sequential._around = was
  if not ok then error(err, 0) end
  for _, m in ipairs(timed and order or {}) do   -- the costs
    local x, args
    local function run_of (i, y)                 -- each layer on the one before's output
      local h = i == 1 and x or y
      return under(m.autocast, function() return Sequential._run(m.model, i, i, h, table.unpack(args, 1, args.n)) end), h
    end
    local function whole ()
      return mg.autocast(m.autocast, Sequential._run, m.model, 1, #m.layers, x, table.unpack(args, 1, args.n))
    end
    local function timing ()                     -- (an inner model's input is the dry run's: drawn afresh)
      x, args = fresh{n = 1, m.first_input}[1], fresh(m.first_args)
      time_layers(m.layers, run_of, whole, spill)
    end
    keeping_variables(m.model, layer.training_off, m.model, timing)
    m.first_input, m.first_args = nil, nil
  end
  return order
end
-- }------------------------------------------------------------------

-- {--------------------- models that are not chains ---------------------
-- A step that runs no Sequential model gets a heuristic over its layer
-- calls. The units are the layers called directly by the outermost layer
-- call that calls two or more (through wrappers that call one): for a model
-- class whose call runs an embedding, a list of blocks and a head, those.
-- Each unit call is timed on its own input (captured in the dry run, its
-- floats drawn afresh) and, like a chain's layer, kept, recomputed (its
-- input kept), recomputed but its products ("dots"), packed or spilled;
-- the choice is greedy, by extra seconds per byte freed (the greedy
-- knapsack of PyTorch's activation memory budget, per layer call), taking
-- the fewest options whose dry run fits the budget. Units are matched by
-- their order among the parent's calls (a layer called twice is two units).

-- the tree of a dry run's layer calls: {layer, children, saved, input, output, args}
local function call_tree (step, ...)
  local root, stack = {children = {}}, {}
  stack[1] = root
  local function record (self, ...)
    local node = {layer = self, children = {}, input = bytes_of((...)), args = table.pack(...),
                  autocast = mg.autocast_dtype() or false}
    local parent = stack[#stack]
    parent.children[#parent.children + 1] = node
    stack[#stack + 1] = node
    local before = mg.memory.stats().saved_bytes
    local out = table.pack(pcall(self.call, self, ...))
    stack[#stack] = nil
    if not out[1] then error(out[2], 0) end
    node.saved, node.output = math.max(mg.memory.stats().saved_bytes - before, 0), bytes_of(out[2])
    return table.unpack(out, 2, out.n)
  end
  -- (a recompute's re-run in the backward calls its layers again: not recorded)
  local function around (self) if self ~= nil and not mg.is_recomputing() then return record end end
  local was = mg._layer_around(around)
  local ok, err = pcall(planner.estimate, step, ...)
  mg._layer_around(was)
  if not ok then error(err, 0) end
  return root
end

local function first_tensor (args)
  for i = 1, args.n do if mg.is_tensor(args[i]) then return args[i] end end
end

-- the units of a step that runs no Sequential model, as a chain (its
-- layers the unit calls, in order), timed when `timed`; nil when the step
-- calls no layer that calls two or more (and then how many layers the
-- step called itself)
local function call_chain (timed, step, spill, ...)
  local node = call_tree(step, ...)
  while #node.children == 1 do node = node.children[1] end
  if not node.layer or #node.children < 2 then return nil, #node.children end
  local ch = {model = node.layer, general = true, input = node.input, layers = {}}
  for k, c in ipairs(node.children) do
    ch.layers[k] = {name = tostring(c.layer):match("^[^\n]*"), saved = c.saved, output = c.output, input = c.input}
  end
  if not timed then return ch end
  local function run_of (k)                      -- each call on its own input
    local c, args = node.children[k], fresh(node.children[k].args)
    return under(c.autocast, function() return c.layer:call(table.unpack(args, 1, args.n)) end), first_tensor(args)
  end
  local function timing ()                       -- (its draws inside: the stream is put back)
    local all = fresh(node.args)
    time_layers(ch.layers, run_of, under(node.autocast, function() return node.layer:call(table.unpack(all, 1, all.n)) end),
                spill)
  end
  keeping_variables(node.layer, layer.training_off, node.layer, timing)
  return ch
end

-- the options of a call chain, cheapest per byte freed first: {k, how, freed, cost, kept}
local function call_options (ch, lossy, spills)
  local options = {}
  for k, l in ipairs(ch.layers) do
    local function add (how, freed, cost, kept)
      if freed > 0 then options[#options + 1] = {k = k, how = how, freed = freed, cost = cost, kept = kept} end
    end
    -- a recompute keeps its input (which its first op would have saved); a spill keeps nothing
    add("recompute", l.saved - l.input, l.seconds, l.input)
    if l.dots then add("dots", l.saved - l.dots.bytes - l.input, l.dots.seconds, l.dots.bytes + l.input) end
    if lossy then add("pack", l.saved / 2, l.seconds * 0.05, l.saved / 2) end
    if spills then add("spill", l.saved, l.spill_seconds or 0, l.saved) end
  end
  table.sort(options, function(a, b)
    local ra, rb = a.cost / a.freed, b.cost / b.freed
    if ra ~= rb then return ra < rb end
    return a.k < b.k or (a.k == b.k and a.how < b.how)
  end)
  return options
end

-- the segments (one per unit) that the first `count` options make: an
-- option replaces a unit's earlier one only when it frees more
local function call_segments (ch, options, count)
  local segs = {}
  for k, l in ipairs(ch.layers) do segs[k] = {first = k, last = k, how = "keep", bytes = l.saved, cost = 0, freed = 0} end
  for i = 1, count do
    local o = options[i]
    local g = segs[o.k]
    if o.freed > g.freed then
      g.how, g.bytes, g.cost, g.freed = o.how, math.floor(o.kept), o.cost, o.freed
    end
  end
  return segs
end

-- what runs a unit call by its segment g, called as (self, ...) in place
-- of self.call; nil: self.call itself (kept)
local function unit_runner (self, g, spill)
  if not g or g.how == "keep" then return nil end
  g.fns = g.fns or setmetatable({}, {__mode = "k"})
  local f = g.fns[self]
  if f then return f end
  if g.how == "recompute" or g.how == "dots" then
    local rf = mg.recompute_grad(function(...) return self:call(...) end, {policy = g.how == "dots" and "dots" or "nothing"})
    f = function(_, ...) return rf(...) end
  else
    local hooks = g.how == "spill" and {offload = spill} or "bfloat16"
    f = function(s, ...) return mg.saved_tensors_hooks(hooks, s.call, s, ...) end
  end
  g.fns[self] = f
  return f
end

-- the layer-call hook that applies a plan's call chains: a planned parent's
-- k-th direct layer call runs by its k-th segment. Each call at depth d
-- sets frames[d] (the planned parent's count of its calls, or nothing), so
-- a call at d + 1 finds its parent's; a recompute's re-run passes through.
local function planned_calls (plan)
  local depth, frames = 0, {}
  return function(self)
    if self == nil then depth = depth - 1; return end          -- a call returned
    depth = depth + 1
    if mg.is_recomputing() then frames[depth] = nil; return nil end
    local frame, g = frames[depth - 1], nil
    if frame then frame.n = frame.n + 1; g = frame.segs[frame.n] end
    frames[depth] = plan.general[self] and {segs = plan.segments[self], n = 0} or nil
    return unit_runner(self, g, plan.spill)
  end
end

-- }------------------------------------------------------------------

-- {------------------------- choosing ----------------------------
-- For one chain of n layers (saved bytes s, output bytes a, a[0] the
-- input, forward seconds c, of which last in the op that makes the
-- output, gradient bytes g of the variables each reads): the segments and
-- their ways that cost the least extra time within room bytes, at every
-- moment of the backward. While the backward is at layer q, what layers
-- 1..q store is still held, and so are the gradients of layers q..n: early
-- layers share the step with almost every gradient, late ones with few
-- (DTR finds this online; a bound on the total stored misses it). A
-- dynamic programme over (layers covered, bytes stored), the
-- heterogeneous-chain checkpointing problem in its segment form (Beaumont
-- et al.'s Rotor solves a finer one). A recomputed segment keeps its input
-- and its result (policy "output": the re-run stops short of its last op),
-- and the next segment's input is that result: state k = 2 marks a
-- boundary already counted. A single layer may also be recomputed keeping
-- its products' outputs (policy "dots": its input and those outputs held,
-- the cheap ops between them run again), where that holds less than
-- keeping it: a transformer block's layer norms, GELU and residual sums
-- cost a tenth of its time and free a third of its bytes.

local UNITS = 120

local function choose (chain, room, lossy, spills, at_end)
  local n, s, a, c, w, last, ga = #chain.layers, {}, {[0] = chain.input}, {}, {}, {}, {}
  for i, l in ipairs(chain.layers) do
    s[i], a[i], c[i], w[i] = l.saved, l.output, math.max(l.seconds, 1e-7), l.spill_seconds or 0
    last[i] = math.min(l.last_seconds or 0, c[i])
  end
  ga[n] = 0                                      -- ga[q]: the gradients of layers q+1..n
  for q = n - 1, 0, -1 do ga[q] = ga[q + 1] + (chain.layers[q + 1].grad_bytes or 0) end
  local total, worst = 0, 0
  for q = 1, n do total = total + s[q]; worst = math.max(worst, total + ga[q]) end
  at_end = math.min(at_end or room, room)       -- what may be stored when the forward ends
  if worst <= room and total <= at_end then      -- everything fits: keep it all
    return {{first = 1, last = n, how = "keep", bytes = total, cost = 0}}, total
  end
  local unit = math.max(room, 1) / UNITS
  local function units (b) return math.ceil(b / unit - 1e-9) end
  -- f[j][k][m]: the least cost covering layers 1..j storing m units; how[j][k][m] its last segment
  local f, how = {[0] = {{[0] = 0}, {}}}, {}
  for j = 1, n do
    f[j], how[j] = {{}, {}}, {{}, {}}
    local seg_s, seg_c, seg_w, held = 0, 0, 0, -math.huge
    for i = j, 1, -1 do                          -- the segment i..j
      seg_s, seg_c, seg_w = seg_s + s[i], seg_c + c[i], seg_w + w[i]
      held = s[i] + math.max(ga[i - 1], held)    -- the most a kept i..j holds with the gradients
      for k0 = 1, 2 do
        -- {way, units stored, units at its backward's worst moment, cost, k, bytes}
        local ways = {{"keep", units(seg_s), units(held), 0, 1, seg_s}}
        local kept = a[j] + (k0 == 2 and 0 or a[i - 1])
        ways[2] = {"recompute", units(kept), units(kept + seg_s + ga[i - 1]), math.max(seg_c - last[j], 0), 2, kept}
        if lossy then ways[#ways + 1] = {"pack", units(seg_s / 2), units(held - seg_s / 2), seg_c * 0.05, 1, seg_s / 2} end
        if spills then ways[#ways + 1] = {"spill", 0, units(ga[i - 1]), seg_w, 1, seg_s} end
        local dots = i == j and chain.layers[i].dots
        if dots and dots.bytes < s[i] then
          local held_dots = dots.bytes + (k0 == 2 and 0 or a[i - 1])
          ways[#ways + 1] = {"dots", units(held_dots), units(held_dots + s[i] + ga[i - 1]), dots.seconds, 1, held_dots}
        end
        for m0, cost0 in pairs(f[i - 1][k0]) do
          for _, way in ipairs(ways) do
            local m, cost, fk = m0 + way[2], cost0 + way[4], f[j][way[5]]
            if m0 + way[3] <= UNITS and m <= UNITS and (fk[m] == nil or cost < fk[m]) then
              fk[m], how[j][way[5]][m] = cost, {i, way[1], k0, m0, way[6], cost - cost0}
            end
          end
        end
      end
    end
  end
  local best
  for k = 1, 2 do
    for m, cost in pairs(f[n][k]) do
      if m * unit <= at_end and (not best or cost < best.cost or (cost == best.cost and m < best.m)) then
        best = {cost = cost, m = m, k = k}
      end
    end
  end
  if not best then return nil end
  local segs, j, k, m = {}, n, best.k, best.m
  while j > 0 do
    local h = how[j][k][m]
    local i, way = h[1], h[2]
    table.insert(segs, 1, {first = i, last = j, how = way, bytes = h[5], cost = h[6]})
    j, k, m = i - 1, h[3], h[4]
  end
  -- neighbours kept, packed or spilled alike run as one stretch: a tensor
  -- both save (a layer's output, the next one's input) is packed once
  local merged = {}
  for _, g in ipairs(segs) do
    local prev = merged[#merged]
    if prev and prev.how == g.how and g.how ~= "recompute" and g.how ~= "dots" then
      prev.last, prev.bytes, prev.cost = g.last, prev.bytes + g.bytes, prev.cost + g.cost
    else
      merged[#merged + 1] = g
    end
  end
  return merged, best.m * unit
end
-- }------------------------------------------------------------------

local Plan = {}
Plan.__index = Plan
Plan.__name = "moongrad.memory.plan"

-- runs a Sequential by its segments (spill: the directory spilled stretches write to)
local function run_planned (self, segs, spill, x, ...)
  for _, g in ipairs(segs) do
    if g.how == "keep" then
      x = Sequential._run(self, g.first, g.last, x, ...)
    else
      local a, b = g.first, g.last
      local function run (h, ...) return Sequential._run(self, a, b, h, ...) end
      if g.how == "recompute" or g.how == "dots" then
        g.fn = g.fn or mg.recompute_grad(run, {policy = g.how == "dots" and "dots" or "output"})
        x = g.fn(x, ...)
      elseif g.how == "spill" then
        x = mg.saved_tensors_hooks({offload = spill}, run, x, ...)
      else
        x = mg.saved_tensors_hooks("bfloat16", run, x, ...)
      end
    end
  end
  return x
end

--- with_plan(plan, step, ...): step(...) with the plan applied; its results
function planner.with_plan (plan, step, ...)
  if getmetatable(plan) ~= Plan then
    error(("memory.with_plan: plan must be what mg.memory.plan gave, got %s"):format(type(plan)), 2)
  end
  local was = Sequential._around
  Sequential._around = function(self, x, ...)
    local segs = plan.segments[self]
    if not segs then return Sequential._run(self, 1, #self.layers, x, ...) end
    return run_planned(self, segs, plan.spill, x, ...)
  end
  local calls = next(plan.general) ~= nil        -- a plan of layer calls (not a Sequential's)
  local was_calls = calls and mg._layer_around(planned_calls(plan)) or nil
  local out = table.pack(pcall(step, ...))
  Sequential._around = was
  if calls then mg._layer_around(was_calls) end
  if not out[1] then error(out[2], 0) end
  return table.unpack(out, 2, out.n)
end

-- a Plan of segments (by model) for the chains: its rows (layers, decision,
-- bytes, cost, the layers' names) and models in the order the step runs them
local function plan_of (chains, segments, fields)
  local rows, order, sizes, general = {}, {}, {}, {}
  for i, ch in ipairs(chains) do
    order[i], sizes[i], general[ch.model] = ch.model, #ch.layers, ch.general
    for _, g in ipairs(segments[ch.model]) do
      local names = {}
      for k = g.first, g.last do names[#names + 1] = ch.layers[k].name end
      rows[#rows + 1] = {layers = ("%d-%d"):format(g.first, g.last), what = table.concat(names, ", "), how = g.how,
                         bytes = g.bytes, cost = g.cost}
    end
  end
  fields.segments, fields.rows, fields.models, fields.sizes, fields.general = segments, rows, order, sizes, general
  return setmetatable(fields, Plan)
end

local function parse_budget (who, b)
  if math.type(b) == "integer" and b > 0 then return b end
  if type(b) == "number" and b > 0 then return math.floor(b) end
  if type(b) == "string" then
    local n, u = b:match("^%s*([%d.]+)%s*(%a*)%s*$")
    local scale = {[""] = 1, B = 1, KB = 1e3, MB = 1e6, GB = 1e9, KiB = 2^10, MiB = 2^20, GiB = 2^30}
    if n and tonumber(n) and scale[u] then return math.floor(tonumber(n) * scale[u]) end
  end
  error(("%s: budget must be a number of bytes or a size like \"2 GiB\", got %s"):format(who, tostring(b)), 3)
end

--- plan(step, {budget =, lossy = false, spill = dir}, ...): what to keep,
-- recompute, pack or spill for each stretch of the layers of the Sequential
-- models step(...) runs, so that its peak stays within budget at the least
-- extra time; checked by a dry run (peak_bytes is the planned step's
-- estimate). An error says when nothing fits, and what does not move.
function planner.plan (step, opts, ...)
  if not callable(step) then
    error(("memory.plan: step must be a function, got %s"):format(type(step)), 2)
  end
  if type(opts) ~= "table" then error("memory.plan: options {budget = bytes [, lossy = false, spill = dir]} expected", 2) end
  for k in pairs(opts) do
    if k ~= "budget" and k ~= "lossy" and k ~= "spill" then
      error(("memory.plan: unknown option '%s' (budget, lossy, spill)"):format(tostring(k)), 2)
    end
  end
  local budget, lossy, spill = parse_budget("memory.plan", opts.budget), opts.lossy == true, opts.spill
  if spill ~= nil and (type(spill) ~= "string" or spill == "" or spill:find("[%z\n]")) then
    error(("memory.plan: spill must be a directory's path, got %s"):format(type(spill) == "string" and "'" .. spill:sub(1, 40) .. "'" or type(spill)), 2)
  end
  local chains = profile(true, step, spill, ...)
  local plain = planner.estimate(step, ...)
  local args = table.pack(...)
  -- the cheapest plan of these chains within the budget (their segments by
  -- model), its estimate, and the least peak a candidate reached; `lossy`:
  -- packing among the options
  local function search_with (chains, lossy)
    local general = {}                           -- the models planned by their layer calls
    for _, ch in ipairs(chains) do general[ch.model], ch.ends = ch.general, nil end
    local stored = 0                             -- all the layers save, and their gradients
    for _, ch in ipairs(chains) do for _, l in ipairs(ch.layers) do stored = stored + l.saved + (l.grad_bytes or 0) end end
    -- a candidate (segments by model), its peak checked by a dry run
    local function checked (segments)
      local p = setmetatable({segments = segments, spill = spill, general = general}, Plan)
      return planner.estimate(function() return planner.with_plan(p, step, table.unpack(args, 1, args.n)) end)
    end
    local function cost_of (segments)
      local cost = 0
      for _, list in pairs(segments) do for _, g in ipairs(list) do cost = cost + g.cost end end
      return cost
    end
    -- the same rule on every chain: segments of `size` layers recomputed but
    -- the last (checkpoint_sequential's), or each chain's optimum within room
    local function uniform (size)
      local segments = {}
      for _, ch in ipairs(chains) do
        local list, n = {}, #ch.layers
        for first = 1, n, size do
          local last = math.min(first + size - 1, n)
          local cost, kept = 0, 0
          for k = first, last do cost, kept = cost + ch.layers[k].seconds, kept + ch.layers[k].saved end
          local how = last < n and "recompute" or "keep"
          cost = how == "recompute" and math.max(cost - (ch.layers[last].last_seconds or 0), 0) or 0
          list[#list + 1] = {first = first, last = last, how = how, cost = cost,
                             bytes = how == "recompute" and (first == 1 and ch.input or ch.layers[first - 1].output) or kept}
        end
        segments[ch.model] = list
      end
      return segments
    end
    local function optimal (room, less_at_end)
      local segments = {}
      for _, ch in ipairs(chains) do
        ch.ends = ch.ends or {}                    -- what room's plan stored at the forward's end
        local segs, used = choose(ch, room, lossy, spill ~= nil, less_at_end and ch.ends[room] - less_at_end)
        if not segs then return nil end
        if not less_at_end then ch.ends[room] = used end
        segments[ch.model] = segs
      end
      return segments
    end
    -- candidates: the optimum for rooms spread geometrically from the least any
    -- plan fits to all the layers save with their gradients (the peak of a room's plan is not
    -- monotone in it: sharing and packing move it, so each is checked), and
    -- checkpoint_sequential's segmentations (one recompute per layer among
    -- them); the cheapest within the budget wins
    local best, best_est, least
    local calls = chains[1] and chains[1].general and chains[1]
    local options = calls and call_options(calls, lossy, spill ~= nil)
    local function calls_plan (count) return {[calls.model] = call_segments(calls, options, count)} end
    if plain.peak_bytes <= budget then
      best = calls and calls_plan(0) or optimal(math.huge)
      best_est = checked(best)
    elseif calls then
      -- the fewest options (cheapest per byte first) whose dry run fits:
      -- a bisection, the peak falling as options are taken
      local lo, hi = 0, #options
      local est = checked(calls_plan(hi))
      least = est.peak_bytes
      if est.peak_bytes <= budget then
        best, best_est = calls_plan(hi), est
        while hi - lo > 1 do
          local mid = (lo + hi) // 2
          est = checked(calls_plan(mid))
          least = math.min(least, est.peak_bytes)
          if est.peak_bytes <= budget then hi, best, best_est = mid, calls_plan(mid), est else lo = mid end
        end
      else
        -- all of them over the budget (a re-run's working set can outweigh
        -- what a unit frees): the fewest that fit, one count after another
        for count = 1, #options - 1 do
          est = checked(calls_plan(count))
          least = math.min(least, est.peak_bytes)
          if est.peak_bytes <= budget then best, best_est = calls_plan(count), est; break end
        end
      end
    else
      local candidates, longest = {}, 1
      for _, ch in ipairs(chains) do longest = math.max(longest, #ch.layers) end
      for size = 1, longest - 1 do candidates[#candidates + 1] = uniform(size) end
      local lo, hi = 0, stored
      for _ = 1, 30 do
        local mid = (lo + hi) / 2
        if optimal(mid) then hi = mid else lo = mid end
        if hi - lo < 1 + stored / 4096 then break end
      end
      local best_cost = math.huge
      local function consider (segs)
        local est = checked(segs)
        if not least or est.peak_bytes < least then least = est.peak_bytes end
        local cost = cost_of(segs)
        if est.peak_bytes <= budget and cost < best_cost then best, best_est, best_cost = segs, est, cost end
        return est
      end
      for _, segs in ipairs(candidates) do consider(segs) end
      -- a room bounds what the backward holds, but the forward's end has a
      -- working set of its own (the loss and what it reads): a plan over the
      -- budget is tried again storing less when the forward ends, at the same
      -- room, by what it was over and at least twice as much as the last try
      -- (what the end stores does not come off the peak byte for byte: by
      -- the overshoot alone, a budget a little over a plan's peak could fail
      -- where a smaller one, overshot by more, found that plan)
      local min_room = math.max(hi, 1)
      for k = 0, 15 do
        local room = min_room * (math.max(stored, min_room) / min_room) ^ (k / 15)
        local segs, est, less = optimal(room), nil, 0
        for _ = 1, 6 do
          if not segs then break end
          est = consider(segs)
          if est.peak_bytes <= budget then break end
          less = math.max(less + est.peak_bytes - budget, 2 * less, room / UNITS)   -- (a unit at least)
          segs = optimal(room, less)
        end
      end
    end
    return best, best_est, least
  end
  -- Packing only adds options, but the search is a heuristic whose lossy
  -- candidates (a pack's bytes predicted as half, checked after) can all
  -- miss where lossless ones meet the budget: a lossy plan that fails falls
  -- back on the lossless search, so lossy never fails where lossless would
  local function search (chains)
    local best, best_est, least = search_with(chains, lossy)
    if best or not lossy then return best, best_est, least end
    local b, e, l = search_with(chains, false)
    if l and (not least or l < least) then least = l end
    return b, e, least
  end
  local best, best_est, least
  if #chains > 0 then best, best_est, least = search(chains) end
  -- no Sequential model, or none whose plans meet the budget (a small one
  -- inside a block, say): the layer calls of the step's model
  if not best then
    local calls, called = call_chain(true, step, spill, ...)
    if calls then
      local b, e, l = search({calls})
      if b then chains, best, best_est = {calls}, b, e end
      if l and (not least or l < least) then least = l end
    elseif #chains == 0 and plain.peak_bytes <= budget then
      best, best_est = {}, plain                 -- nothing to plan, nothing needed
    elseif #chains == 0 then
      local what = called >= 2 and ("calls %d layers itself (put them in one model: a Layer subclass or an "
                                    .. "nn.Sequential)"):format(called)
                   or "runs no nn.Sequential model and no layer that calls two or more layers"
      error(("memory.plan: the step (%s without a plan, over the budget of %s) %s: there is nothing to plan "
             .. "(wrap its parts in layers, or use recompute_grad yourself)"):format(human(plain.peak_bytes),
             human(budget), what), 2)
    end
  end
  if not best then
    local try = (not lossy and "lossy = true, " or "") .. (not spill and "spill = a directory, " or "")
    error(("memory.plan: no plan keeps this step within %s: the least a plan found peaks at %s (the step "
           .. "without one at %s); weights, gradients and optimizer slots do not move: try %sor a larger budget")
          :format(human(budget), least and human(least) or "nothing found", human(plain.peak_bytes), try), 2)
  end
  return plan_of(chains, best, {budget = budget, lossy = lossy, spill = spill, peak_bytes = best_est.peak_bytes,
                                 plain_peak_bytes = plain.peak_bytes})
end

-- {------------------------- save and load -----------------------
-- A plan as text, one record per line (no code: a file is hostile input):
--   moongrad plan 1
--   budget <bytes> lossy <0|1> peak <bytes> plain <bytes>
--   spill <dir>                           -- only in a plan that spills: where to
--   model <layers> [calls]                -- the step's Sequential models, in order, or (calls)
--                                            one model's layer calls: one segment each
--   segment <first> <last> <keep|recompute|dots|pack|spill> <bytes> <seconds>
-- Loading matches the models a dry run of the step runs, by order and
-- number of layers, and checks the segments tile each model's layers.

local HOWS = {keep = true, recompute = true, dots = true, pack = true, spill = true}

--- plan:save(path): the plan as text, for mg.memory.load_plan(path, step, ...)
function Plan.save (p, path)
  if getmetatable(p) ~= Plan then error("plan:save: call it on a plan (plan:save(path))", 2) end
  if type(path) ~= "string" then error(("plan:save: path must be a string, got %s"):format(type(path)), 2) end
  local lines = {"moongrad plan 1", ("budget %d lossy %d peak %d plain %d"):format(p.budget, p.lossy and 1 or 0,
                 p.peak_bytes, p.plain_peak_bytes)}
  if p.spill then lines[#lines + 1] = "spill " .. p.spill end
  for i, model in ipairs(p.models) do
    lines[#lines + 1] = ("model %d%s"):format(p.sizes[i], p.general[model] and " calls" or "")
    for _, g in ipairs(p.segments[model]) do
      lines[#lines + 1] = ("segment %d %d %s %d %.17g"):format(g.first, g.last, g.how, g.bytes, g.cost)
    end
  end
  local f, err = io.open(path, "w")
  if not f then error(("plan:save: cannot write %s: %s"):format(path, err), 2) end
  local ok, werr = f:write(table.concat(lines, "\n"), "\n")
  f:close()
  if not ok then error(("plan:save: cannot write %s: %s"):format(path, werr), 2) end
  return p
end

-- the saved plan's lines, checked: {budget =, lossy =, models = {{n =, segments = {...}}}}
local function parse_plan (path, text)
  local function bad (n, why) error(("memory.load_plan: %s:%d: %s"):format(path, n, why), 0) end
  local saved, n, current = {models = {}}, 0, nil
  local function count (s, k, what)
    local v = math.tointeger(tonumber(s))
    if not v or v < 0 or v > 2^53 then bad(k, ("%s must be an integer >= 0, got '%s'"):format(what, s:sub(1, 40))) end
    return v
  end
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    line = line:gsub("\r$", "")
    if n == 1 then
      if line ~= "moongrad plan 1" then bad(1, "not a saved plan (its first line is not 'moongrad plan 1')") end
    elseif n == 2 then
      local b, l, pk, pl = line:match("^budget (%S+) lossy ([01]) peak (%S+) plain (%S+)$")
      if not b then bad(2, "expected 'budget <bytes> lossy <0|1> peak <bytes> plain <bytes>'") end
      saved.budget, saved.lossy = count(b, 2, "budget"), l == "1"
      saved.peak_bytes, saved.plain_peak_bytes = count(pk, 2, "peak"), count(pl, 2, "plain")
    elseif n == 3 and line:match("^spill ") then
      saved.spill = line:sub(7)
      if saved.spill == "" or saved.spill:find("%z") then bad(3, "the spill directory is empty or not text") end
    elseif line:match("^model ") then
      local k, calls = line:match("^model (%S+)$"), false
      if not k then k, calls = line:match("^model (%S+) calls$"), true end
      current = {n = count(k or "", n, "the number of layers"), segments = {}, calls = calls}
      if #saved.models > 0 and (calls or saved.models[1].calls) then bad(n, "a plan of layer calls has one model") end
      if current.n < 1 then bad(n, "a model has at least one layer") end
      saved.models[#saved.models + 1] = current
    elseif line:match("^segment ") then
      local a, b, how, bytes, cost = line:match("^segment (%S+) (%S+) (%S+) (%S+) (%S+)$")
      if not a then bad(n, "expected 'segment <first> <last> <keep|recompute|dots|pack|spill> <bytes> <seconds>'") end
      if not current then bad(n, "a segment before any model") end
      if not HOWS[how] then bad(n, ("unknown decision '%s' (keep, recompute, dots, pack, spill)"):format(how:sub(1, 40))) end
      if how == "pack" and not saved.lossy then bad(n, "a packed segment in a plan that is not lossy") end
      if how == "spill" and not saved.spill then bad(n, "a spilled segment in a plan without a 'spill <dir>' line") end
      local g = {first = count(a, n, "first"), last = count(b, n, "last"), how = how, bytes = count(bytes, n, "bytes"),
                 cost = tonumber(cost)}
      if not g.cost or g.cost ~= g.cost or g.cost < 0 or g.cost == math.huge then
        bad(n, ("the time must be a number of seconds >= 0, got '%s'"):format(cost:sub(1, 40)))
      end
      if current.calls and g.last ~= g.first then
        bad(n, ("segment %d-%d spans layer calls: a model planned per call has one segment each"):format(g.first, g.last))
      end
      local prev = current.segments[#current.segments]
      if g.first ~= (prev and prev.last + 1 or 1) or g.last < g.first or g.last > current.n then
        bad(n, ("segment %d-%d does not follow on within the model's %d layers"):format(g.first, g.last, current.n))
      end
      current.segments[#current.segments + 1] = g
    elseif line ~= "" then
      bad(n, ("unexpected line '%s'"):format(line:sub(1, 40)))
    end
  end
  if n < 2 or not saved.budget then bad(n, "the file ends before its budget line") end
  for _, m in ipairs(saved.models) do
    local last = m.segments[#m.segments]
    if not last or last.last ~= m.n then bad(n, ("a model's segments do not cover its %d layers"):format(m.n)) end
  end
  return saved
end

--- load_plan(path, step, ...): a plan saved by plan:save, for step(...): its
-- models matched, in order, with the Sequential models a dry run of the step
-- runs (the number of layers must agree), and its peak checked by a dry run
function planner.load_plan (path, step, ...)
  if type(path) ~= "string" then error(("memory.load_plan: path must be a string, got %s"):format(type(path)), 2) end
  if not callable(step) then
    error(("memory.load_plan: step must be a function, got %s"):format(type(step)), 2)
  end
  local f, err = io.open(path, "rb")
  if not f then error(("memory.load_plan: cannot read %s: %s"):format(path, err), 2) end
  local text = f:read((1 << 20) + 1)
  f:close()
  if text and #text > 1 << 20 then error(("memory.load_plan: %s is over 1 MiB: not a saved plan"):format(path), 2) end
  local saved = parse_plan(path, text or "")
  local chains
  if saved.models[1] and saved.models[1].calls then
    chains = {(call_chain(false, step, nil, ...))}
  else
    chains = profile(false, step, nil, ...)
  end
  if #chains ~= #saved.models then
    error(("memory.load_plan: %s plans %d models, a dry run of the step finds %d"):format(path, #saved.models,
          #chains), 2)
  end
  local segments = {}
  for i, ch in ipairs(chains) do
    local m = saved.models[i]
    if #ch.layers ~= m.n then
      error(("memory.load_plan: %s's model %d has %d layers, the step's has %d"):format(path, i, m.n, #ch.layers), 2)
    end
    segments[ch.model] = m.segments
  end
  local p = plan_of(chains, segments, {budget = saved.budget, lossy = saved.lossy, spill = saved.spill,
                                       plain_peak_bytes = saved.plain_peak_bytes})
  local args = table.pack(...)
  p.peak_bytes = planner.estimate(function() return planner.with_plan(p, step, table.unpack(args, 1, args.n)) end).peak_bytes
  return p
end
-- }------------------------------------------------------------------

Plan.__tostring = function(p)
  local lines = {("moongrad.memory.plan: peak %s within %s (%s without a plan)%s"):format(human(p.peak_bytes),
    human(p.budget), human(p.plain_peak_bytes), (p.lossy and ", lossy" or "") .. (p.spill and ", spilling to " .. p.spill or "")),
    "", "| layers | decision | kept | extra time | what |", "|---|---|---|---|---|"}
  for _, r in ipairs(p.rows) do
    local kept = r.how == "spill" and human(r.bytes) .. " in files" or human(r.bytes)
    lines[#lines + 1] = ("| %s | %s | %s | %.2f ms | %s |"):format(r.layers, r.how, kept, r.cost * 1e3, r.what:sub(1, 60))
  end
  return table.concat(lines, "\n")
end

-- }=============================================================

return planner

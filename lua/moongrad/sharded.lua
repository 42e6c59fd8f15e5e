--- moongrad.sharded: ZeRO stages 1 and 2 (Rajbhandari et al., SC 2020) over
-- mg.distributed, as mg.distributed.ShardedOptimizer(opt, {stage = 1 | 2}).
--
-- The trainable variables of each dtype are laid end to end in one flat
-- vector of P elements (in the order of the list given), and rank r of N owns
-- elements floor(P r / N) + 1 .. floor(P (r + 1) / N) of it (uneven shares are
-- fine). A rank's shard is a list of pieces: the part of each variable that
-- falls in its range, each a Variable of its own, which the wrapped optimizer
-- updates as if they were the model's weights. So its slots (Adam's m and v)
-- exist for 1/N of the elements, and a variable without a gradient leaves its
-- pieces alone, as the replicated optimizer leaves it.
--
-- A step: stage 1 averages the whole gradients (allreduce, as
-- DistributedOptimizer) and takes each piece's slice; stage 2 reduce-scatters
-- them (MPI_Reduce_scatter of the flat vector, half the bytes of an
-- allreduce), so a rank receives only its shard. The pieces are refreshed
-- from the weights (a restored checkpoint, a broadcast), the wrapped optimizer
-- steps them, and an allgather of every rank's pieces writes the new weights
-- into every variable on every rank.
-- @module moongrad.sharded
local mg = require "moongrad"
local check = require "moongrad.check"
local class = require "moongrad.class"
local mpi = require "moongrad.mpi"
local dist = require "moongrad.distributed"

local fail, show = check.fail, check.show

local sharded = {}

local Sharded = class("moongrad.distributed.ShardedOptimizer")
sharded.class = Sharded

-- learning_rate, iterations, get_learning_rate, ... are the wrapped
-- optimizer's, as DistributedOptimizer's (its methods get it as self)
Sharded.__index = dist._forwarding_index(Sharded)

-- get_state gathers from every rank: checkpoint callbacks call it on all of them
Sharded.collective_state = true

function Sharded.__newindex (self, k, v) rawget(self, "optimizer")[k] = v end

function Sharded.__tostring (self)
  return ("moongrad.distributed.ShardedOptimizer (%s, stage=%d)"):format(tostring(self.optimizer), self.stage)
end

local OPTIONS = {{"stage", check.rule("1 or 2", function(v) return v == 1 or v == 2 end), 1},
                 table.unpack(dist.WRAPPER_OPTIONS)}

--- ShardedOptimizer(opt [, {stage = 1, fusion_bytes = 4 MiB, op = "mean", overlap = "auto"}])
function sharded.new (opt, opts)
  local who = "ShardedOptimizer"
  if getmetatable(opt) == Sharded then return opt end
  if getmetatable(opt) == dist.DistributedOptimizer_class then opt = rawget(opt, "optimizer") end
  local ok, method = pcall(function() return opt.apply_gradients end)
  if not (ok and check.is_callable(method)) then
    fail(who, "the optimizer must be an optimizer (mg.optim.Adam{...}), got %s", show(opt))
  end
  local o = check.options(who, opts, OPTIONS)
  return setmetatable({optimizer = opt, stage = o.stage, fusion_bytes = math.tointeger(o.fusion_bytes), op = o.op, overlap = o.overlap,
                       grad_scale = 1}, Sharded)
end

-- the wrapped optimizer's update must be elementwise for a piece's update
-- to be the variable's: clipping by a norm looks at whole variables
local function check_elementwise (self, who)
  local inner = self.optimizer
  if inner.clipnorm or inner.global_clipnorm then
    fail(who, "%s clips by a norm (clipnorm or global_clipnorm), which needs whole gradients; a sharded "
              .. "step sees a shard of them (use clipvalue, or the replicated DistributedOptimizer)", tostring(inner))
  end
  if require("moongrad.optim")._loss_scaler(inner) then
    fail(who, "%s scales the loss: each rank would check only its shard of the gradients for infinities and "
              .. "skip steps the others take (use the replicated DistributedOptimizer)", tostring(inner))
  end
end

-- {---- the layout ----

-- the flat layout of vars: per dtype, its members {index =, var =, offset =,
-- numel =} and this rank's pieces {member =, from =, count =, piece =}
local function layout_of (vars, n)
  local size, rank = mpi.size(), mpi.rank()
  local groups, by_dtype = {}, {}
  for i = 1, n do
    local v = vars[i]
    local g = by_dtype[v.dtype]
    if not g then
      g = {dtype = v.dtype, members = {}, total = 0}
      by_dtype[v.dtype] = g
      groups[#groups + 1] = g
    end
    local numel = 1
    for _, d in ipairs(v.shape) do numel = numel * d end
    g.members[#g.members + 1] = {index = i, var = v, offset = g.total, numel = numel}
    g.total = g.total + numel
  end
  local pieces = {}
  for _, g in ipairs(groups) do
    local first, last = mpi.shard_range(g.total, size, rank)       -- 1-based, inclusive
    g.pieces = {}
    for _, m in ipairs(g.members) do
      local a, b = math.max(first, m.offset + 1), math.min(last, m.offset + m.numel)
      if a <= b then
        local p = {member = m, from = a - m.offset, count = b - a + 1}
        p.piece = mg.Variable(mg.reshape(m.var:value(), {-1}):slice({p.from, p.from + p.count - 1}),
                              {name = m.var.name .. "/shard", trainable = true})
        g.pieces[#g.pieces + 1] = p
        pieces[#pieces + 1] = p
      end
    end
  end
  return {vars = {table.unpack(vars, 1, n)}, n = n, groups = groups, pieces = pieces}
end

-- the layout for this list of variables: made on first use, then the same list each step
local function layout (self, vars, n, who)
  local l = rawget(self, "_layout")
  if l == nil then
    l = layout_of(vars, n)
    if n > 0 then rawset(self, "_layout", l) end          -- an empty list (a model not built yet) fixes nothing
    return l
  end
  local same = l.n == n
  for i = 1, n do same = same and l.vars[i] == vars[i] end
  if not same then
    fail(who, "the variables differ from the first step's (%d then, %d now): a sharded optimizer keeps one "
              .. "list; give the same list, in the same order, every step", l.n, n)
  end
  return l
end

-- the layout for vars (the first one given fixes it, after rank 0's weights
-- are broadcast), or the one fixed when vars is nil
local function layout_for (self, vars, who, example)
  if vars == nil then
    local l = rawget(self, "_layout")
    if l == nil then fail(who, "no step yet: give the variables (%s)", example) end
    return l
  end
  local n = check.list(who, vars, "the list of variables", "variable %d")
  for i = 1, n do
    if not mg.is_variable(vars[i]) then fail(who, "variable %d must be a Variable, got %s", i, show(vars[i])) end
  end
  if rawget(self, "_layout") == nil and n > 0 and not rawget(self, "_synced") then
    dist.broadcast_variables(vars, 0, who)
  end
  return layout(self, vars, n, who)
end

local function pieces_of (l)
  local pv = {}
  for k, p in ipairs(l.pieces) do pv[k] = p.piece end
  return pv
end

-- parts (1-D, of dtype) end to end
local function joined (parts, dtype)
  return #parts == 0 and mg.zeros({0}, dtype) or #parts == 1 and parts[1] or mg.concat(parts)
end

-- member m's values, shaped, out of a gathered stretch of the flat vector starting after lo
local function cut (all, m, lo)
  if m.numel == 0 then return mg.zeros(m.var.shape, m.var.dtype) end
  return mg.reshape(all:slice({m.offset - lo + 1, m.offset - lo + m.numel}), m.var.shape)
end

-- the slice of a (shape of the piece's variable) that piece p holds
local function slice_of (t, p)
  return mg.reshape(t, {-1}):slice({p.from, p.from + p.count - 1})
end

-- }----

-- {---- the step ----

local function postscale (self) return self.op == "mean" and 1 / mpi.size() or 1 end

-- the pieces' gradients out of the whole averaged gradients (stage 1)
local function pieces_of_whole (l, full)
  local out = {}
  for k, p in ipairs(l.pieces) do                          -- copies: the whole gradients go before the gather
    local g = full[p.member.index]
    if g ~= nil then out[k] = mg.concat({slice_of(g, p)}) end
  end
  return out
end

-- the pieces' gradients out of this rank's shard of each dtype's flat
-- vector (stage 2); present(i): variable i has a gradient
local function pieces_of_shards (l, shards, present)
  local out, k = {}, 0
  for gi, g in ipairs(l.groups) do
    local at = 0
    for _, p in ipairs(g.pieces) do
      k = k + 1
      if present(p.member.index) then out[k] = shards[gi]:slice({at + 1, at + p.count}) end
      at = at + p.count
    end
  end
  return out
end

-- this rank's pieces' gradients: stage 1 from the averaged whole gradients,
-- stage 2 from the reduce-scattered flat vector of each dtype
local function shard_gradients (self, l, grads, who)
  local post = postscale(self)
  if self.stage == 1 then
    local list = {}
    for i = 1, l.n do list[i] = grads[i] end
    return pieces_of_whole(l, mpi.allreduce_many(list, "sum", self.grad_scale, post, math.max(self.fusion_bytes, 1),
                                                 l.n, who))
  end
  local shards = {}
  for gi, g in ipairs(l.groups) do
    local parts = {}
    for j, m in ipairs(g.members) do
      local gr = grads[m.index]
      parts[j] = gr ~= nil and mg.reshape(gr, {-1}) or mg.zeros({m.numel}, g.dtype)   -- every rank sends P values
    end
    local flat = joined(parts, g.dtype)
    if self.grad_scale ~= 1 then flat = flat * self.grad_scale end
    local mine = mpi.reduce_scatter(flat, {op = "sum"}, who)
    flat, parts = nil, nil                                 -- the whole vector goes at once
    shards[gi] = post ~= 1 and mine * post or mine
  end
  return pieces_of_shards(l, shards, function(i) return grads[i] ~= nil end)
end

-- The variables of each dtype in buckets of whole variables of about
-- fusion_bytes: each bucket is a stretch of the flat vector, so every rank's
-- pieces in it, gathered in rank order, are its values in order. Calls
-- fn(members, values) with each bucket's variables and their flat values.
local function gather_buckets (l, fusion_bytes, value_of, fn)
  for _, g in ipairs(l.groups) do
    local size = g.members[1].var.itemsize
    local i = 1
    while i <= #g.members do
      local j, bytes = i, g.members[i].numel * size
      while j < #g.members and bytes + g.members[j + 1].numel * size <= fusion_bytes do
        j = j + 1
        bytes = bytes + g.members[j].numel * size
      end
      local lo, hi, parts = g.members[i].offset, g.members[j].offset + g.members[j].numel, {}
      for _, p in ipairs(g.pieces) do
        if p.member.offset >= lo and p.member.offset < hi then parts[#parts + 1] = value_of(p) end
      end
      local members = table.move(g.members, i, j, 1, {})
      fn(members, mpi.allgather(mg.reshape(joined(parts, g.dtype), {-1})), lo)
      i = j + 1
    end
  end
end

-- every rank's pieces, gathered, into every variable
local function gather_weights (self, l)
  gather_buckets(l, self.fusion_bytes, function(p) return p.piece:value() end, function(members, all, lo)
    for _, m in ipairs(members) do
      if m.numel > 0 then m.var:assign(cut(all, m, lo)) end
    end
  end)
end

-- one step of the wrapped optimizer on the pieces, then every rank's pieces into the weights
local function step (self, l, pg)
  local pv = pieces_of(l)
  for _, p in ipairs(l.pieces) do
    p.piece:assign(slice_of(p.member.var:value(), p))     -- the weights as they are now (a restore, a broadcast)
  end
  pg.n = #l.pieces
  self.optimizer:apply_gradients(pg, pv)
  pg = nil                                                 -- gone before the gather's buffer
  gather_weights(self, l)
end

--- opt:apply_gradients(grads, vars): one sharded step (every rank must call it
-- with the same variables; nil gradients stay nil, the same on every rank)
function Sharded.apply_gradients (self, grads, vars)
  local who = "ShardedOptimizer"
  grads, vars = dist._split_pairs(grads, vars)
  local n = type(vars) == "table" and #vars or 0
  check.distinct_variables(who, vars, n)
  check_elementwise(self, who)
  dist._started(who)
  local gs = {}
  for i = 1, n do
    local g = grads[i]
    if g ~= nil then
      if not check.is_array(g) then fail(who, "gradient %d must be a tensor, got %s", i, show(g)) end
      if not check.same_shape(g.shape, vars[i].shape) or g.dtype ~= vars[i].dtype then
        fail(who, "gradient %d is %s %s, its variable '%s' is %s %s", i, g.dtype, check.shape(g.shape), vars[i].name,
             vars[i].dtype, check.shape(vars[i].shape))
      end
      gs[i] = mg.is_variable(g) and g:value() or g
    end
  end
  local l = layout_for(self, vars, who)                     -- the first step: rank 0's weights everywhere
  return step(self, l, shard_gradients(self, l, gs, who))
end

--- opt:minimize(loss, vars, tape): one sharded step on tape's gradient of
-- loss for vars, reduced while the backward runs (mpi.gradient: stage 1
-- allreduces each bucket, stage 2 reduce-scatters it, so a rank keeps only
-- its shard of the gradients, and the walk lets each whole gradient go as
-- soon as its bucket holds it). A gradient no rank made stays nil.
function Sharded.minimize (self, loss, vars, tape)
  local who = "ShardedOptimizer"
  local n = check.minimize_args(who .. ":minimize", loss, vars, tape)
  check.distinct_variables(who, vars, n)
  check_elementwise(self, who)
  dist._started(who)
  if not dist._overlaps(self, self.stage == 2) then return self:apply_gradients(tape:gradient(loss, vars), vars) end
  local list, fusion = {table.unpack(vars, 1, n)}, math.max(self.fusion_bytes, 1)
  if self.stage == 1 then
    local full = mpi.gradient(tape, loss, list, "allreduce", self.grad_scale, postscale(self), fusion, who)
    local l = layout_for(self, vars, who)                   -- after the walk: it reads the weights as they were
    return step(self, l, pieces_of_whole(l, full))
  end
  local shards, present = mpi.gradient(tape, loss, list, "reduce_scatter", self.grad_scale, postscale(self), fusion, who)
  local l = layout_for(self, vars, who)
  return step(self, l, pieces_of_shards(l, shards, function(i) return present[i] end))
end

--- opt:mark_synced(vars): the variables hold the same values on every rank already (fit does it)
function Sharded.mark_synced (self) rawset(self, "_synced", true) end

--- opt:build(vars): fixes the layout (and broadcasts rank 0's weights)
function Sharded.build (self, vars)
  local l = layout_for(self, vars, "ShardedOptimizer:build", "opt:build(model.trainable_variables)")
  self.optimizer:build(pieces_of(l))
  return self
end

-- }----

-- {---- state: the whole optimizer's, as a replicated one keeps it ----

local function inner_state_of (self)
  local inner = self.optimizer
  if not (check.is_callable(inner.get_state) and check.is_callable(inner.set_state)) then
    fail("ShardedOptimizer:get_state", "%s keeps no state to save", tostring(inner))
  end
end

--- opt:get_state([vars]): the state a replicated optimizer would hold for vars
-- ({optimizer =, iterations =, slots = {name = {tensor per variable}}}),
-- gathered from every rank: a collective, every rank calls it. A checkpoint of
-- it restores under any number of ranks, sharded or not.
function Sharded.get_state (self, vars)
  local who = "ShardedOptimizer:get_state"
  inner_state_of(self)
  local l = layout_for(self, vars, who, "opt:get_state(model.trainable_variables)")
  local st = self.optimizer:get_state(pieces_of(l))
  local slot_of = {}                                       -- piece -> its place in pv
  for k, p in ipairs(l.pieces) do slot_of[p] = k end
  local slots, names = {}, {}
  for name in pairs(st.slots) do names[#names + 1] = name end
  table.sort(names)                                        -- the same collectives, in the same order, everywhere
  for _, name in ipairs(names) do
    local list = {}
    gather_buckets(l, self.fusion_bytes, function(p) return st.slots[name][slot_of[p]] end, function(members, all, lo)
      for _, m in ipairs(members) do list[m.index] = cut(all, m, lo) end
    end)
    slots[name] = list
  end
  return {optimizer = st.optimizer, iterations = st.iterations, slots = slots}
end

--- opt:set_state(state [, vars]): restores what get_state (or a replicated
-- optimizer's get_state, from any number of ranks) returned: each rank takes
-- its pieces' slices. No collective: every rank restores the same state.
function Sharded.set_state (self, state, vars)
  local who = "ShardedOptimizer:set_state"
  inner_state_of(self)
  local l = layout_for(self, vars, who, "opt:set_state(state, model.trainable_variables)")
  if type(state) ~= "table" or type(state.slots) ~= "table" then
    fail(who, "state must be a table {optimizer =, iterations =, slots = {...}}, got %s", show(state))
  end
  local slots, pv = {}, pieces_of(l)
  for name, list in pairs(state.slots) do
    if type(list) ~= "table" or #list ~= l.n then
      fail(who, "state.slots.%s must hold %d tensors (one per variable), got %s", tostring(name), l.n, show(list))
    end
    local mine = {}
    for k, p in ipairs(l.pieces) do
      local m = p.member
      local t = list[m.index]
      if not check.is_array(t) or t.dtype ~= m.var.dtype or not check.same_shape(t.shape, m.var.shape) then
        fail(who, "state.slots.%s[%d] must be a %s tensor of shape %s (variable '%s'), got %s", tostring(name), m.index,
             m.var.dtype, check.shape(m.var.shape), m.var.name, show(t))
      end
      mine[k] = slice_of(t, p)
    end
    slots[name] = mine
  end
  self.optimizer:set_state({optimizer = state.optimizer, iterations = state.iterations, slots = slots}, pv)
  return self
end

-- }----

return check.export(sharded)          -- errors name the user's line (moongrad.check)

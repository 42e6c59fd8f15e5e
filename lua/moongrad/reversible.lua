--- moongrad.reversible: layers that spend computation to hold less (the
-- seeds' AbstractRecomputeWrapper), which mg.nn gives (loading this module
-- on first use); a script's own derive from the first two with :subclass
-- (moongrad.layer's Layer:subclass):
--
--   RecomputeLayer         subclasses override call(...); calling the layer runs
--                          call under recompute_grad
--   ReversibleLayer        subclasses give forward(...) and inverse(...) (and,
--                          optionally, a fused backward); a chain of them holds
--                          a constant number of activations whatever its length
--   RevBlock, AffineCoupling, InvertibleLinear   built on ReversibleLayer
--
-- How a chain of reversible layers holds nothing per layer. Each call is one
-- custom gradient whose context saves the layer's outputs (counted by the
-- tapes: t:saved_bytes(), the saved role). When a later reversible layer is
-- called on those outputs, it claims them: the earlier layer forgets its
-- saved copy, and in the backward pass the later layer, having rebuilt its
-- inputs with inverse(), hands them to the earlier one as its outputs (the
-- seed's _set_recomputed_tensor / _check_get_recomputed_tensor). So after the
-- forward pass only the last layer's outputs are held. A layer that is not
-- reversible in between (a Dense) saves its input as usual: the reversible
-- layer before it keeps its outputs, since nobody will rebuild them.
--
-- When the walk reaches a layer whose successor did not run first (a
-- gradient of an intermediate output alone), the layer rebuilds its outputs
-- through its successors' inverses, from the last saved outputs.
-- @module moongrad.reversible
local mg = require "moongrad"
local check = require "moongrad.check"
local layer = require "moongrad.layer"

local fail, show = check.fail, check.show
local class, new_layer, note_shape, check_input = layer.class, layer.new, layer.note_shape, layer.check_input

local reversible = {}

local pack = table.pack
local function unpack (t) return table.unpack(t, 1, t.n or #t) end

-- a class's short name ("moongrad.nn.AffineCoupling" -> "AffineCoupling")
local function who_of (self)
  local mt = getmetatable(self)
  local name = type(mt) == "table" and rawget(mt, "__name") or "ReversibleLayer"
  return name:match("([%w_]+)$")
end

-- {===================== RecomputeLayer ======================

--- RecomputeLayer: subclasses override call(...); calling the layer runs
-- call under recompute_grad: the tape keeps only the arguments, and the
-- backward pass runs call again and takes its gradients in one step (the
-- seed's _block_recompute_and_gradients). self:is_recomputing() is true in
-- that re-run, self:is_in_loop() inside a loop helper (mg.in_loop) and in
-- the re-run of a call made there. A `policy` field ("nothing", "dots",
-- "everything" or a function, as recompute_grad's) chooses what the first
-- run keeps.
local RecomputeLayer = class("RecomputeLayer", layer.Layer)
reversible.RecomputeLayer = RecomputeLayer
layer.abstract(RecomputeLayer, "call")

RecomputeLayer.__call = function(self, ...)
  if rawget(self, "_build_pending") then self:_build_first(...) end   -- outside the recompute
  local policy, verify = self.policy, self.verify == true
  local f = rawget(self, "_recompute")
  if f == nil or rawget(self, "_recompute_policy") ~= policy or rawget(self, "_recompute_verify") ~= verify then
    f = mg.recompute_grad(function(...) return self:call(...) end, {policy = policy, verify = verify})
    rawset(self, "_recompute", f)                      -- rawset: not a sublayer of itself
    rawset(self, "_recompute_policy", policy)
    rawset(self, "_recompute_verify", verify)
  end
  return note_shape(self, f(...))
end

function RecomputeLayer.is_recomputing () return mg.is_recomputing() end
function RecomputeLayer.is_in_loop () return mg.is_in_loop() end

-- }============================================================


-- {===================== ReversibleLayer =====================

--- ReversibleLayer: subclasses give forward(...) -> outputs and
-- inverse(outputs...) -> inputs, tensors in and out; optionally
-- backward(ys, dys, variables) -> xs, dxs, dvars (lists), a fused rebuild
-- and gradient cheaper than the default (inverse, then forward again under
-- a local tape: recompute_gradients). forward, inverse and backward run
-- with mg.is_recomputing() true in the backward pass, the random state as
-- at the call.
local ReversibleLayer = class("ReversibleLayer", layer.Layer)
reversible.ReversibleLayer = ReversibleLayer
layer.abstract(ReversibleLayer, "forward and inverse")

ReversibleLayer.is_recomputing = RecomputeLayer.is_recomputing
ReversibleLayer.is_in_loop = RecomputeLayer.is_in_loop

function ReversibleLayer:forward ()
  fail(who_of(self), "forward is not defined")
end

function ReversibleLayer:inverse ()
  fail(who_of(self), "inverse is not defined")
end

-- every input a float tensor (RevBlock keeps its own messages)
function ReversibleLayer:check_inputs (...)
  local who = who_of(self)
  local n = select("#", ...)
  if n == 0 then fail(who, "no input given") end
  for j = 1, n do check.float_tensor(who, n == 1 and "input" or ("input %d"):format(j), (select(j, ...))) end
end

--- recompute_gradients(xs, dys, variables) -> dxs, dvars: forward run
-- again on xs under a local tape, its gradient seeded with dys (the
-- seed's _block_recompute_and_gradients)
function ReversibleLayer:recompute_gradients (xs, dys, variables)
  xs, dys = {unpack(xs)}, {unpack(dys)}                -- plain lists, for the tape
  local t = mg.tape()
  t:watch(xs)
  t:watch(variables)
  local outs = pack(self:forward(unpack(xs)))
  t:stop()
  local g = t:gradient({unpack(outs)}, {xs, variables}, dys, {unconnected = "zero"})
  return g[1], g[2]
end

--- the default backward: inverse, then the gradients of forward run again
-- from the rebuilt inputs (with the random state of the call)
function ReversibleLayer:backward (ys, dys, variables)
  local state = mg.random.get_state()
  local xs = pack(self:inverse(unpack(ys)))
  mg.random.set_state(state)
  local dxs, dvars = self:recompute_gradients(xs, dys, variables)
  return xs, dxs, dvars
end

-- the output (box) -> {rec =, i =} of the call that made it, while it lives
local producers = setmetatable({}, {__mode = "k"})

local inputs_of

-- the outputs of call rec in the backward pass: handed over by the next
-- layer, saved, still alive, or rebuilt through the layers after it
local function outputs_of (rec)
  local saved = rec.ctx:is_recorded() and pack(rec.ctx:saved()) or {}
  local ys = {n = rec.nout}
  for i = 1, rec.nout do
    local y = rec.handed[i] or saved[i] or rec.outs[i]
    if y == nil and rec.next[i] then
      local nxt = rec.next[i]
      y = inputs_of(nxt.rec)[nxt.j]
    end
    if y == nil then
      fail(rec.who, "cannot rebuild output %d of layer '%s' for its gradient: the layers after it that "
           .. "rebuild it were let go before the gradient reached them (ask for the gradient of the "
           .. "chain's last outputs, or use a persistent tape)", i, rec.layer.name)
    end
    ys[i] = y
  end
  return ys
end

-- layer:method(...) of call rec, as a re-run of it: mg.is_recomputing()
-- true, the random state of the call, and the call's memo
local function rerun (rec, method, ...)
  local layer = rec.layer
  return rec.ctx:recompute(function(...)
    local was = rawget(layer, "_memo")
    rawset(layer, "_memo", rec.memo)
    local r = pack(pcall(layer[method], layer, ...))
    rawset(layer, "_memo", was)
    if not r[1] then error(r[2], 0) end
    return table.unpack(r, 2, r.n)
  end, ...)
end

-- the inputs of call rec, rebuilt by its inverse
function inputs_of (rec)
  return pack(rerun(rec, "inverse", unpack(outputs_of(rec))))
end

-- rebuilt input tensors and their gradients, as many as the call's inputs
local function check_backward (rec, xs, dxs)
  for j = 1, rec.nin do
    if not mg.is_tensor(xs[j]) then
      fail(rec.who, "backward must return the rebuilt inputs as a list of %d tensors, got %s for input %d",
           rec.nin, show(xs[j]), j)
    end
  end
  if type(dxs) ~= "table" then fail(rec.who, "backward must return a list of input gradients, got %s", show(dxs)) end
end

-- grad_fn of call rec: (dy1, ..., dyk [, variables])
local function backward_of (rec, ...)
  local dys = pack(...)
  local variables = dys.n > rec.nout and dys[rec.nout + 1] or nil
  dys.n = rec.nout
  local ys = outputs_of(rec)
  rec.handed = {}
  local xs, dxs, dvars = rerun(rec, "backward", ys, dys, variables or {})
  check_backward(rec, xs, dxs)
  for j, p in pairs(rec.prev) do                -- the earlier layers' outputs, rebuilt
    if rec.ctx:needs_input_grad(j) and p.rec.ctx:is_recorded() then p.rec.handed[p.i] = xs[j] end
  end
  local out = {n = rec.nin + (variables and 1 or 0)}
  for j = 1, rec.nin do out[j] = dxs[j] end
  if variables then
    dvars = dvars or {}
    out[rec.nin + 1] = {n = #variables, table.unpack(dvars, 1, #variables)}
  end
  return unpack(out)
end

-- the outputs of this call claim the outputs of earlier calls they take
local function link (rec, xs, outs)
  rec.outs = setmetatable({}, {__mode = "v"})
  for i = 1, outs.n do
    rec.outs[i] = outs[i]
    producers[outs[i]] = {rec = rec, i = i}
  end
  for j = 1, xs.n do
    local p = producers[xs[j]]
    if p and p.rec.next[p.i] == nil and p.rec.ctx:is_recorded() then
      p.rec.next[p.i] = {rec = rec, j = j}
      rec.prev[j] = p
      p.rec.ctx:forget(p.i)                     -- this call will hand it back
    end
  end
end

--- calling a reversible layer: one custom gradient that saves the
-- outputs, which the next reversible layer claims (see the top)
function ReversibleLayer:call (...)
  self:check_inputs(...)
  local xs = pack(...)
  local rec = {layer = self, who = who_of(self), nin = xs.n, prev = {}, next = {}, handed = {}, memo = {}}
  local fn = mg.custom_gradient(function(ctx, ...)
    rec.ctx = ctx
    local was = rawget(self, "_memo")
    rawset(self, "_memo", rec.memo)
    local ys = pack(self:forward(...))
    rawset(self, "_memo", was)
    if ys.n == 0 then fail(rec.who, "forward returned nothing; it must return tensors") end
    for i = 1, ys.n do
      if not mg.is_tensor(ys[i]) then fail(rec.who, "forward must return tensors, got %s for output %d", show(ys[i]), i) end
    end
    rec.nout = ys.n
    ctx:save(unpack(ys))
    ys.n = ys.n + 1
    ys[ys.n] = function(...) return backward_of(rec, ...) end
    return unpack(ys)
  end, {context = true, captures = true,    -- what forward closes over gets its gradient too,
        rereads = true})                    -- and the backward's inverse reads the variables again
  local outs = pack(fn(...))
  if rec.ctx:is_recorded() then link(rec, xs, outs) end
  return unpack(outs)
end

--- the per-call table of a reversible layer's forward, inverse (in the
-- backward pass) and backward: what forward notes there (random states)
-- is there when backward runs
function ReversibleLayer:memo ()
  return rawget(self, "_memo") or {}
end

-- }============================================================


-- {========================== RevBlock ===========================

local function is_list (v)
  return type(v) == "table" and not check.is_callable(v) and check.kind(v) == "a table"
end

local fn_rule = check.rule("a function (or a callable table) or a list of them", check.is_callable)

-- f or g of a RevBlock: one callable shared by the n layers, or a list of n
local function callables (v, n, what)
  if is_list(v) then
    local len = check.list("RevBlock", v, "the list " .. what, what .. "[%d]")
    if len ~= n then fail("RevBlock", "%s has %d functions for %d layers", what, len, n) end
    for i = 1, n do check.value("RevBlock", ("%s[%d]"):format(what, i), v[i], check.callable) end
    return v
  end
  check.value("RevBlock", what, v, fn_rule)
  -- one callable for every layer: a view of it as a list, not n copies (a
  -- num_layers of 2^40 made the constructor fill memory)
  return setmetatable({}, {__index = function(_, i)
    if math.type(i) == "integer" and i >= 1 and i <= n then return v end
  end, __len = function() return n end})
end

-- h's result, which must have the shape of the half it is added to (else the
-- sum broadcasts and the block is not reversible)
local function residual (out, like, what, i)
  if not (check.is_array(out) and check.same_shape(out.shape, like.shape)) then
    fail("RevBlock", "%s of layer %d gave %s for a half of shape %s; it must keep the shape", what, i,
         show(out), check.shape(like.shape))
  end
  return out
end

-- x split in halves along its last axis
local function halves (x)
  local n, d = x.ndim, x.shape[x.ndim]
  local spec = {}                                   -- nil for every axis but the last
  spec[n] = {1, d // 2}
  local h1 = mg.slice(x, table.unpack(spec, 1, n))
  spec[n] = {d // 2 + 1, d}
  return h1, mg.slice(x, table.unpack(spec, 1, n))
end

-- f or g of layer i as a function of x alone: with side inputs (TF1's
-- f_side_input), h(x, side_inputs). The block's node takes the side inputs
-- as tensors its forward closes over, and they get their gradients.
local function side (block, which, i)
  local h, inputs = block[which][i], block[which .. "_side_input"]
  if inputs == nil then return h end
  return function(x) return h(x, inputs) end
end

-- gradient of h(x) seeded with dy, with respect to x and the variables (and
-- the tensors the block closes over; nil for those h does not read)
local function vjp (h, x, dy, variables)
  local t = mg.tape()
  t:watch(x)
  t:watch(variables)
  local out = h(x)
  t:stop()
  local g = t:gradient(out, {x, variables}, dy)
  return out, g[1], g[2]
end


--- RevBlock(f, g, {num_layers=1, name=, f_side_input=, g_side_input=}): reversible
-- residual layers (RevNet; TF1's rev_block). Each layer maps (x1, x2) to
-- y1 = x1 + f(x2), y2 = x2 + g(y1); with side inputs (lists of tensors),
-- f(x2, f_side_input) and g(y1, g_side_input), and the side inputs get
-- their gradients (so does any tensor f or g closes over).
-- The backward pass rebuilds each layer's inputs from its outputs
-- (x2 = y2 - g(y1), x1 = y1 - f(x2)) instead of keeping them, so the tape
-- holds the block's outputs only, and a chain of RevBlocks the last
-- block's. f and g are callables (shared by every layer) or lists of
-- num_layers callables (num_layers defaults to their length); randomness in
-- them (dropout) is replayed exactly when rebuilding. Call it as block(x1, x2)
-- -> y1, y2, or block(x) with x split in halves along its last axis ->
-- concatenated y.
local RevBlock = class("RevBlock", ReversibleLayer)
reversible.RevBlock = RevBlock

local side_rule = check.rule("a list of tensors", function(v)
  if type(v) ~= "table" then return false end
  for i = 1, #v do if not mg.is_tensor(v[i]) then return false end end
  return true
end)
local REVBLOCK_OPTIONS = {{"num_layers", check.positive_integer}, {"name", check.string},
                          {"f_side_input", side_rule}, {"g_side_input", side_rule}}

function RevBlock.__new (f, g, opts)
  opts = check.options("RevBlock", opts, REVBLOCK_OPTIONS)
  local n = opts.num_layers or (is_list(f) and #f) or (is_list(g) and #g) or 1
  local self = new_layer(RevBlock, {num_layers = n, name = opts.name}, "rev_block")
  self.f, self.g = callables(f, n, "f"), callables(g, n, "g")
  self.f_side_input, self.g_side_input = opts.f_side_input, opts.g_side_input
  local seen = {}
  local shared = rawlen(self.f) == 0 and rawlen(self.g) == 0    -- then layer 1 stands for all
  for i = 1, shared and 1 or n do
    for _, h in ipairs({self.f[i], self.g[i]}) do
      if not seen[h] then seen[h] = true; self:track(h) end
    end
  end
  return self
end

function RevBlock:check_inputs (x1, x2, ...)
  check_input("RevBlock", x1, 1)
  if x2 ~= nil then check.float_tensor("RevBlock", "x2", x2) end
  if select("#", ...) > 0 then fail("RevBlock", "takes x1 and x2, or x alone; got %d arguments", 2 + select("#", ...)) end
  if x2 == nil and x1.shape[x1.ndim] % 2 ~= 0 then
    fail("RevBlock", "the last dimension (%d) must be even to split in halves", x1.shape[x1.ndim])
  end
end

function RevBlock:forward (x1, x2)
  if x2 == nil then return mg.concat({self:forward(halves(x1))}, -1) end
  local memo, rng = self:memo(), mg.random.get_state()
  local states = {}
  for i = 1, self.num_layers do
    states[2 * i - 1] = mg.random.get_state()
    local y1 = x1 + residual(side(self, "f", i)(x2), x1, "f", i)
    states[2 * i] = mg.random.get_state()
    x2 = x2 + residual(side(self, "g", i)(y1), x2, "g", i)
    x1 = y1
  end
  local now = mg.random.get_state()
  if now.seed ~= rng.seed or now.offset ~= rng.offset then memo.states = states end  -- f or g drew
  return x1, x2
end

-- before f or g of layer i runs again: the random state it saw
local function replay (states, k)
  if states then mg.random.set_state(states[k]) end
end

function RevBlock:inverse (y1, y2)
  if y2 == nil then return mg.concat({self:inverse(halves(y1))}, -1) end
  local states = self:memo().states
  for i = self.num_layers, 1, -1 do
    replay(states, 2 * i)
    local x2 = y2 - side(self, "g", i)(y1)
    replay(states, 2 * i - 1)
    y1, y2 = y1 - side(self, "f", i)(x2), x2
  end
  return y1, y2
end

-- the fused backward (RevNet's): each layer's inputs rebuilt while its
-- gradients are taken, f and g running once each. Each half runs in
-- mg.tidy, and what it hands on is disposed once used (as memcnn and
-- RevTorch free their rebuilt inputs): a tensor that lives across many ops
-- would wait for a full collection, and the peak would carry it.
local function backward_halves (self, y1, y2, dy1, dy2, variables)
  local states = self:memo().states
  local given = {[y1] = true, [y2] = true, [dy1] = true, [dy2] = true}
  local dvars = {}
  local function sums_with (dv)               -- the variables' gradient sums that change
    local sums = {}
    for k = 1, #variables do
      if dv[k] then sums[k] = dvars[k] and dvars[k] + dv[k] or dv[k] end
    end
    return sums
  end
  local function update (sums)
    for k, sum in pairs(sums) do
      mg.dispose(dvars[k])
      dvars[k] = sum
    end
  end
  local function g_half (i)                   -- x2 = y2 - g(y1), and through y2 = x2 + g(y1)
    replay(states, 2 * i)
    local gy1, dz, dv = vjp(side(self, "g", i), y1, dy2, variables)
    return y2 - gy1, dz and dy1 + dz or dy1, sums_with(dv)
  end
  local function f_half (i, x2, dy1_total)    -- x1 = y1 - f(x2), and through y1 = x1 + f(x2)
    replay(states, 2 * i - 1)
    local fx2, dx2f, dv = vjp(side(self, "f", i), x2, dy1_total, variables)
    return y1 - fx2, dx2f and dy2 + dx2f or dy2, sums_with(dv)
  end
  for i = self.num_layers, 1, -1 do
    local x2, dx1, gsums = mg.tidy(g_half, i)
    update(gsums)
    local x1, dx2, fsums = mg.tidy(f_half, i, x2, dx1)
    update(fsums)
    local kept = {[x1] = true, [x2] = true, [dx1] = true, [dx2] = true}
    for _, old in ipairs({y1, y2, dy1, dy2}) do
      if not (given[old] or kept[old]) then mg.dispose(old) end
    end
    y1, y2, dy1, dy2 = x1, x2, dx1, dx2
  end
  return y1, y2, dy1, dy2, dvars
end

function RevBlock:backward (ys, dys, variables)
  if ys.n == 2 then
    local x1, x2, dx1, dx2, dvars = backward_halves(self, ys[1], ys[2], dys[1], dys[2], variables)
    return {x1, x2, n = 2}, {dx1, dx2}, dvars
  end
  local y1, y2 = halves(ys[1])
  local dy1, dy2 = halves(dys[1])
  local x1, x2, dx1, dx2, dvars = backward_halves(self, y1, y2, dy1, dy2, variables)
  return {mg.concat({x1, x2}, -1), n = 1}, {mg.concat({dx1, dx2}, -1)}, dvars
end

-- }===============================================================


-- {================== normalising-flow layers ====================

-- the running log-determinant of a flow: (B), one per sample
local function check_logdet (who, x, logdet)
  if logdet == nil then return end
  check.float_tensor(who, "logdet", logdet)
  if logdet.ndim ~= 1 or logdet.shape[1] ~= x.shape[1] then
    fail(who, "logdet must have shape (%d) (one per sample of the batch), got %s", x.shape[1],
         check.shape(logdet.shape))
  end
end

-- the sum over every axis but the first: (B, ...) -> (B)
local function per_sample (x)
  if x.ndim == 1 then return x end
  local axes = {}
  for i = 2, x.ndim do axes[#axes + 1] = i end
  return mg.sum(x, axes)
end

-- the gradient of a per-sample sum, (B), spread over like (B, ...)
local function per_sample_grad (g, like)
  local shape = {g.shape[1]}
  for i = 2, like.ndim do shape[i] = 1 end
  return mg.reshape(g, shape)
end

-- x split along its last axis at d: x[..., 1..d], x[..., d+1..]
local function split_last (x, d)
  local n, D = x.ndim, x.shape[x.ndim]
  local spec = {}
  spec[n] = {1, d}
  local a = mg.slice(x, table.unpack(spec, 1, n))
  spec[n] = {d + 1, D}
  return a, mg.slice(x, table.unpack(spec, 1, n))
end

-- (I + n)^-1 for n strictly triangular (so nilpotent): the product of
-- (I + (-n)^(2^k)), exact once the power is zero (after log2(C) steps)
local function unit_triangular_inverse (n)
  local c = n.shape[1]
  local eye = mg.eye(c, c, n.dtype)
  local p = -n
  local r = eye + p
  local span = 2
  while span < c do
    p = mg.matmul(p, p)
    r = mg.matmul(r, eye + p)
    span = span * 2
  end
  return r
end

-- {================= a random rotation, as LU =================
-- InvertibleLinear starts from a random rotation (Glow), written as P L U:
-- Gram-Schmidt on a normal matrix, then LU with partial pivoting, in Lua
-- numbers (float64) once when the layer is built.

local function orthogonal (c)
  local a = mg.random.with_init_stream(mg.random.normal, {c, c}, 0, 1, "float64"):totable()
  if c == 1 then return {{1}} end
  for i = 1, c do                                 -- rows orthonormalised twice (stable enough)
    for _ = 1, 2 do
      for j = 1, i - 1 do
        local dot = 0
        for k = 1, c do dot = dot + a[i][k] * a[j][k] end
        for k = 1, c do a[i][k] = a[i][k] - dot * a[j][k] end
      end
    end
    local norm = 0
    for k = 1, c do norm = norm + a[i][k] ^ 2 end
    norm = math.sqrt(norm)
    for k = 1, c do a[i][k] = a[i][k] / norm end
  end
  return a
end

-- a = P L U: P a permutation (as a matrix), L unit lower, U upper
local function lu (a)
  local c = #a
  local perm, l, u = {}, {}, {}
  for i = 1, c do
    perm[i] = i
    u[i] = {table.unpack(a[i])}
    l[i] = {}
    for j = 1, c do l[i][j] = i == j and 1 or 0 end
  end
  for k = 1, c do
    local p = k
    for i = k + 1, c do if math.abs(u[i][k]) > math.abs(u[p][k]) then p = i end end
    u[k], u[p] = u[p], u[k]
    perm[k], perm[p] = perm[p], perm[k]
    for j = 1, k - 1 do l[k][j], l[p][j] = l[p][j], l[k][j] end
    for i = k + 1, c do
      local f = u[i][k] / u[k][k]
      l[i][k] = f
      for j = k, c do u[i][j] = u[i][j] - f * u[k][j] end
    end
  end
  local pm = {}                                   -- rows of a = P (L U): a[perm[i]] = (LU)[i]
  for i = 1, c do
    pm[i] = {}
    for j = 1, c do pm[i][j] = 0 end
  end
  for i = 1, c do pm[perm[i]][i] = 1 end
  return pm, l, u
end

-- }=============================================================


--- AffineCoupling(net, {swap=false, clamp=2, name=}): RealNVP's affine
-- coupling on the last axis. x splits into a conditioning part xa (the
-- first floor(D/2) features; the last ones with swap=true) and the rest xb;
-- net(xa) gives 2 * #xb features, read as (s, t), and
--   y = (xa, xb * exp(s') + t),  s' = clamp * tanh(s / clamp)
-- (a soft clamp of the log-scale; clamp = false for none). Called with a
-- running log-determinant, layer(x, logdet) -> y, logdet + sum(s') per
-- sample. inverse(y [, logdet]) undoes it. Its backward runs net once
-- (rebuild and gradient together). Start net's last layer at zero (Dense
-- with kernel_initializer = "zeros") for a flow that begins as the identity.
local AffineCoupling = ReversibleLayer:subclass("AffineCoupling")
reversible.AffineCoupling = AffineCoupling

local clamp_rule = check.rule("a positive number or false", function(v)
  return v == false or (type(v) == "number" and v > 0 and v < math.huge)
end)
local COUPLING_OPTIONS = {{"swap", check.boolean, false}, {"clamp", clamp_rule, 2}, {"name", check.string}}

function AffineCoupling:init (net, opts)
  check.value("AffineCoupling", "net", net, check.callable)
  opts = check.options("AffineCoupling", opts, COUPLING_OPTIONS)
  self.net = net
  self.swap, self.clamp = opts.swap, opts.clamp
  if opts.name then self.name = opts.name end
end

function AffineCoupling:check_inputs (x, logdet, ...)
  check.float_tensor("AffineCoupling", "input", x)
  if x.ndim < 2 or x.shape[x.ndim] < 2 then
    fail("AffineCoupling", "input must be (batch, ..., features) with at least 2 features, got shape %s",
         check.shape(x.shape))
  end
  check_logdet("AffineCoupling", x, logdet)
  if select("#", ...) > 0 then fail("AffineCoupling", "takes x and an optional logdet") end
end

-- (conditioning, transformed) parts of x, and how to put them back
local function parts (self, x)
  local D = x.shape[x.ndim]
  local d = self.swap and D - D // 2 or D // 2
  local a, b = split_last(x, d)
  if self.swap then return b, a, function(c, t) return mg.concat({t, c}, -1) end end
  return a, b, function(c, t) return mg.concat({c, t}, -1) end
end

-- s' and t from the conditioning part
local function scale_shift (self, cond, width)
  local h = self.net(cond)
  if not (mg.is_tensor(h) and h.ndim == cond.ndim and h.shape[h.ndim] == 2 * width) then
    fail("AffineCoupling", "net must give 2 x %d = %d features (s and t) for the %d transformed ones, got %s",
         width, 2 * width, width, show(h))
  end
  local s, t = split_last(h, width)
  if self.clamp then s = mg.tanh(s / self.clamp) * self.clamp end
  return s, t
end

function AffineCoupling:forward (x, logdet)
  local cond, b, join = parts(self, x)
  local s, t = scale_shift(self, cond, b.shape[b.ndim])
  local y = join(cond, b * mg.exp(s) + t)
  if logdet == nil then return y end
  return y, logdet + per_sample(s)
end

function AffineCoupling:inverse (y, logdet)
  local cond, b, join = parts(self, y)
  local s, t = scale_shift(self, cond, b.shape[b.ndim])
  local x = join(cond, (b - t) * mg.exp(-s))
  if logdet == nil then return x end
  return x, logdet - per_sample(s)
end

-- the fused backward: net runs once, for the rebuild and the gradient
function AffineCoupling:backward (ys, dys, variables)
  local cond, yb, join = parts(self, ys[1])
  local dcond, dyb = parts(self, dys[1])
  local tape = mg.tape()
  tape:watch(cond)
  tape:watch(variables)
  local s, t = scale_shift(self, cond, yb.shape[yb.ndim])
  tape:stop()
  local e = mg.exp(s)
  local xb = (yb - t) / e
  local ds = dyb * (yb - t)                          -- d/ds of xb * exp(s) + t
  if ys.n == 2 then ds = ds + per_sample_grad(dys[2], s) end
  local g = tape:gradient({s, t}, {cond, variables}, {ds, dyb}, {unconnected = "zero"})
  local xs = {join(cond, xb), n = ys.n}
  local dxs = {join(dcond + g[1], dyb * e)}
  if ys.n == 2 then
    xs[2] = ys[2] - per_sample(s)
    dxs[2] = dys[2]
  end
  return xs, dxs, g[2]
end

--- InvertibleLinear({name=}): Glow's invertible 1x1 convolution, a
-- learned invertible matrix W (C,C) over the last axis (the channels):
-- y = x @ W. W = P L (U + diag(sign * exp(log_s))) (Glow's LU form: P a
-- fixed permutation, L unit lower and U strictly upper triangular,
-- trainable with log_s), so log|det W| = sum(log_s) costs nothing and the
-- inverse needs no general solver. It starts as a random rotation. Called
-- with a running log-determinant, layer(x, logdet) -> y, logdet +
-- (positions per sample) * sum(log_s). layer:log_det() is log|det W|.
local InvertibleLinear = ReversibleLayer:subclass("InvertibleLinear")
reversible.InvertibleLinear = InvertibleLinear

function InvertibleLinear:init (opts)
  opts = check.options("InvertibleLinear", opts, {{"name", check.string}})
  if opts.name then self.name = opts.name end
end

function InvertibleLinear:check_inputs (x, logdet, ...)
  check.float_tensor("InvertibleLinear", "input", x)
  if x.ndim < 2 then fail("InvertibleLinear", "input must be (batch, ..., channels), got shape %s", check.shape(x.shape)) end
  local w = rawget(self, "log_s")
  if w and (not layer.fits(x.dtype, w.dtype) or x.shape[x.ndim] ~= w.shape[1]) then
    fail("InvertibleLinear", "input is %s with %d channels (its last axis), the layer was built for %s with %d",
         x.dtype, x.shape[x.ndim], w.dtype, w.shape[1])
  end
  check_logdet("InvertibleLinear", x, logdet)
  if select("#", ...) > 0 then fail("InvertibleLinear", "takes x and an optional logdet") end
end

--- il:build(input_shape [, dtype]): the LU factors of a random rotation of
-- input_shape's last axis (the channels; float32 by default)
function InvertibleLinear:build (input_shape, dtype)
  local c = layer.last_size("InvertibleLinear:build", input_shape)
  dtype = layer.weights_dtype(dtype)
  local p, l, u = lu(orthogonal(c))
  local diag, sign = {}, {}
  for i = 1, c do
    diag[i] = math.log(math.abs(u[i][i]))
    sign[i] = u[i][i] < 0 and -1 or 1
    for j = 1, i do u[i][j] = 0 end
    for j = i, c do l[i][j] = 0 end
  end
  -- (C, C) and (C) even for C = 0, where the nested tables are empty
  local function matrix (m) return mg.reshape(mg.constant(c > 0 and m or {}, dtype), {c, c}) end
  local function vector (v) return mg.reshape(mg.constant(v, dtype), {c}) end
  self.lower = self:add_variable("lower", matrix(l))
  self.upper = self:add_variable("upper", matrix(u))
  self.log_s = self:add_variable("log_s", vector(diag))
  self.sign_s = self:add_variable("sign_s", vector(sign), {trainable = false})
  self.permutation = self:add_variable("permutation", matrix(p), {trainable = false})
  self.lower_mask = mg.tril(mg.ones({c, c}, dtype), -1)
  self.upper_mask = mg.triu(mg.ones({c, c}, dtype), 1)
end

-- the factors: L (unit lower), U' = U + diag(sign * exp(log_s))
local function factors (self)
  local c = self.log_s.shape[1]
  local l = self.lower * self.lower_mask + mg.eye(c, c, self.log_s.dtype)
  local d = self.sign_s * mg.exp(self.log_s)
  return l, self.upper * self.upper_mask, d
end

--- W (C,C), differentiable in the trainable factors
function InvertibleLinear:weight ()
  local l, u, d = factors(self)
  return mg.matmul(mg.matmul(self.permutation, l), u + mg.eye(d.shape[1], d.shape[1], d.dtype) * d)
end

--- log|det W|, a 0-d tensor
function InvertibleLinear:log_det () return mg.sum(self.log_s) end

-- positions per sample: what the channel mix repeats over
local function positions (x)
  local n = 1
  for i = 2, x.ndim - 1 do n = n * x.shape[i] end
  return n
end

function InvertibleLinear:forward (x, logdet)
  if not rawget(self, "log_s") then self:build(x.shape, x.dtype) end
  local y = mg.matmul(x, self:weight())
  if logdet == nil then return y end
  return y, logdet + self:log_det() * positions(x)
end

function InvertibleLinear:inverse (y, logdet)
  local l, u, d = factors(self)
  -- W^-1 = U'^-1 L^-1 P^T, U' = D (I + D^-1 U): U'^-1 = (I + D^-1 U)^-1 D^-1
  local c = d.shape[1]
  local uinv = unit_triangular_inverse(u / mg.reshape(d, {c, 1})) / mg.reshape(d, {1, c})
  local winv = mg.matmul(mg.matmul(uinv, unit_triangular_inverse(l - mg.eye(c, c, d.dtype))),
                         mg.transpose(self.permutation))
  local x = mg.matmul(y, winv)
  if logdet == nil then return x end
  return x, logdet - self:log_det() * positions(y)
end

-- }===============================================================

return check.export(reversible)          -- errors name the user's line (moongrad.check)

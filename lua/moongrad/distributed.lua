--- moongrad.distributed: data-parallel training over MPI (Open MPI), as Horovod.
--   local dist = mg.distributed
--   dist.init()                              -- once, in every process mpirun started
--   dist.init{timeout = 600}                 -- seconds a collective waits for every rank (0: for ever)
--   dist.rank(), dist.size()                 -- 0-based rank, number of processes
--   dist.allreduce(t, {op = "sum"})          -- "sum" (the default), "mean", "max", "min"
--   dist.broadcast(t, root)                  -- root's tensor on every rank (root 0 by default)
--   dist.allgather(t)                        -- every rank's t along the first axis
--   dist.barrier()
--   dist.broadcast_variables(vars, root)     -- in place: root's values everywhere
--   opt = dist.DistributedOptimizer(mg.optim.Adam{}, {fusion_bytes = 4 * 2^20})
--   opt:minimize(loss, vars, tape)           -- gradients sent while the backward runs
--   opt = dist.ShardedOptimizer(mg.optim.Adam{}, {stage = 2})   -- ZeRO: slots (and gradients) 1/N per rank
--   dist.reduce_scatter(t, {op = "sum"}), dist.shard_range(n)
--   model:fit(x, y, {distributed = true, batch_size = 32})   -- 32 per rank
--   model:fit(x, y, {distributed = true, shard = 2})         -- with ZeRO stage 2
-- Started the usual way: mpirun -np 4 moongrad train.lua (as root, Open MPI
-- also wants --allow-run-as-root). Tensors of every dtype; a tensor's result
-- is a new tensor reduced in one buffer (MPI_IN_PLACE), a variable is reduced
-- or broadcast in its own storage when nobody else holds its value. Every
-- collective first checks that the ranks agree on what the call is (which
-- collective, op, root, dtype, shape, DistributedOptimizer's list), each
-- rank raising the same error when they do not (src/dist/mpi.c), and waits
-- at most the timeout for a rank that never arrives.
-- bool reduces by "or" (sum, max) and "and" (min); "mean" is for floats.
-- A rank whose script fails stops every rank at once (src/cli/main.c: MPI_Abort,
-- mpirun names the rank); a rank that dies is seen by mpirun, which ends the job.
-- @module moongrad.distributed
local mg = require "moongrad"
local check = require "moongrad.check"
local class = require "moongrad.class"
local optim = require "moongrad.optim"

local fail, show = check.fail, check.show

local loaded, mpi = pcall(require, "moongrad.mpi")

local dist = {}

-- the C half (src/dist/ldistributed.c), or a plain error saying why it is missing
local function c (who)
  if not loaded then
    fail(who, "this moongrad was built without MPI; install Open MPI (make deps installs libopenmpi-dev and "
              .. "openmpi-bin) and rebuild")
  end
  return mpi
end

local function started (who)
  if not c(who).is_initialized() then
    fail(who, "mg.distributed is not initialized; call mg.distributed.init() first (and start the program with mpirun)")
  end
  return mpi
end
dist._started = started                -- the wrappers' modules (moongrad.sharded) check the same way

local INIT = {{"timeout", check.rule("a number of seconds >= 0 (0: no timeout)", function(v)
  return type(v) == "number" and v >= 0 and v <= 1e9 end)}}

--- init([{timeout = 600}]): starts MPI (once; again only sets the options);
-- returns rank, size. timeout: the seconds a collective waits for every rank
-- to arrive before it fails (0: for ever); MOONGRAD_DIST_TIMEOUT gives it too.
function dist.init (opts)
  local o = check.options("init", opts, INIT)
  local rank, size = c("init").init()
  if o.timeout then mpi.set_timeout(o.timeout) end
  return rank, size
end
function dist.is_initialized () return loaded and mpi.is_initialized() end
function dist.available () return loaded end
function dist.rank () return started("rank").rank() end
function dist.size () return started("size").size() end
--- local_size(): the ranks on this rank's machine (sharing its memory), as Horovod's
function dist.local_size () return started("local_size").local_size() end
function dist.barrier () return started("barrier").barrier() end
--- finalize(): ends MPI early (it also ends by itself when the program does)
function dist.finalize () if loaded then mpi.finalize() end end
--- stats(): {calls =, bytes =, waited =}: MPI calls made and bytes moved since init,
-- and seconds overlapped steps (minimize) waited at their end for communication
function dist.stats () return started("stats").stats() end

function dist.allreduce (t, opts) return started("allreduce").allreduce(t, opts) end
function dist.allgather (t) return started("allgather").allgather(t) end

function dist.broadcast (t, root)
  if root ~= nil and math.type(root) ~= "integer" then fail("broadcast", "root must be an integer rank, got %s", show(root)) end
  return started("broadcast").broadcast(t, root)
end

--- broadcast_variables(vars [, root = 0]): every variable of the list gets
-- root's value, in place (Horovod's broadcast_variables); returns vars.
function dist.broadcast_variables (vars, root, who)
  who = who or "broadcast_variables"
  if root ~= nil and math.type(root) ~= "integer" then fail(who, "root must be an integer rank, got %s", show(root)) end
  started(who)
  local list = {}
  for i = 1, check.list(who, vars, "the list of variables", "variable %d") do
    if not mg.is_variable(vars[i]) then fail(who, "variable %d must be a variable, got %s", i, show(vars[i])) end
    list[i] = vars[i]
  end
  mpi.broadcast_variables(list, root, who)               -- one agreement on the whole list
  return vars
end

--- broadcast_optimizer_state(opt, vars [, root = 0]): root's optimizer state
-- (iterations, slots: opt:get_state(vars)) on every rank, as Horovod's; so a
-- checkpoint restored on rank 0 alone resumes everywhere. Optimizers without
-- get_state/set_state are left alone. Returns opt.
function dist.broadcast_optimizer_state (opt, vars, root)
  local who = "broadcast_optimizer_state"
  started(who)
  local inner = getmetatable(opt) == dist.DistributedOptimizer_class and rawget(opt, "optimizer") or opt
  local ok, get, set = pcall(function() return inner.get_state, inner.set_state end)
  if not (ok and check.is_callable(get) and check.is_callable(set)) then return opt end
  local state = inner:get_state(vars)
  state.iterations = math.tointeger(mpi.broadcast(mg.tensor({state.iterations}, "int64"), root):totable()[1])
  local names = {}
  for name in pairs(state.slots) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local list = state.slots[name]
    for i = 1, #list do list[i] = mpi.broadcast(list[i], root) end
  end
  inner:set_state(state, vars)
  return opt
end

-- {=================== DistributedOptimizer ====================

local DistributedOptimizer = class("moongrad.distributed.DistributedOptimizer")
dist.DistributedOptimizer_class = DistributedOptimizer

-- the wrappers' shared parts (optim's: LossScaleOptimizer is one too)
dist._forwarding_index, dist._split_pairs = optim._forwarding_index, optim._split_pairs

DistributedOptimizer.__index = dist._forwarding_index(DistributedOptimizer)

function DistributedOptimizer.__newindex (self, k, v) rawget(self, "optimizer")[k] = v end

function DistributedOptimizer.__tostring (self)
  return ("moongrad.distributed.DistributedOptimizer (%s, fusion_bytes=%d)"):format(tostring(self.optimizer),
                                                                                    self.fusion_bytes)
end

--- the options both optimizer wrappers take (ShardedOptimizer adds stage)
dist.WRAPPER_OPTIONS = {
  {"fusion_bytes", check.rule("a whole number >= 0", function(v) return type(v) == "number" and math.tointeger(v) ~= nil and v >= 0 end),
   4 * 1024 * 1024},
  {"op", check.rule("'mean' or 'sum'", function(v) return v == "mean" or v == "sum" end), "mean"},
  {"overlap", check.rule("true, false or 'auto'", function(v) return type(v) == "boolean" or v == "auto" end), "auto"}}

--- Does a wrapper's minimize send buckets during the backward? overlap =
-- "auto": when the ranks span machines (their interconnect moves the bytes
-- while the backward computes), or when keep (stage 2) asks it, to hold 1/N
-- of the gradients. On one machine the bytes go through shared memory, copied
-- by the ranks' own cores, which the backward keeps busy: nothing to hide
-- behind, and the nonblocking collectives' progress costs (bench/overlap.lua).
function dist._overlaps (opt, keep)
  if opt.overlap ~= "auto" then return opt.overlap end
  return keep or mpi.local_size() < mpi.size()
end

--- DistributedOptimizer(opt [, {fusion_bytes = 4 MiB, op = "mean", overlap = "auto"}]):
-- opt, with gradients averaged over the ranks before each update. The first
-- call to apply_gradients, minimize or build broadcasts rank 0's variables,
-- so every rank starts from the same weights; gradients are packed by dtype
-- into buckets of at most fusion_bytes, one allreduce each (0: one call per
-- gradient). opt:minimize(loss, vars, tape) (what fit calls) sends each
-- bucket as soon as the backward has made its gradients, so communication
-- overlaps the rest of the backward (overlap = false: after it, as
-- apply_gradients does; "auto": overlap when the ranks span machines, see
-- dist._overlaps). Everything else (learning_rate, iterations,
-- get_state, ...) is opt's.
function dist.DistributedOptimizer (opt, opts)
  local who = "DistributedOptimizer"
  if getmetatable(opt) == DistributedOptimizer then return opt end
  local ok, method = pcall(function() return opt.apply_gradients end)
  if not (ok and check.is_callable(method)) then
    fail(who, "the optimizer must be an optimizer (mg.optim.Adam{...}), got %s", show(opt))
  end
  local o = check.options(who, opts, dist.WRAPPER_OPTIONS)
  return setmetatable({optimizer = opt, fusion_bytes = math.tointeger(o.fusion_bytes), op = o.op, overlap = o.overlap,
                       _synced = setmetatable({}, {__mode = "k"}), grad_scale = 1}, DistributedOptimizer)
end

-- rank 0's values for the variables not broadcast yet (one agreement on
-- the list: ranks with other variables fail here, all with the same error)
local function sync (self, vars, n)
  local fresh = {}
  for i = 1, n do
    local v = vars[i]
    if mg.is_variable(v) and not self._synced[v] then fresh[#fresh + 1] = v end
  end
  if #fresh == 0 then return end
  dist.broadcast_variables(fresh, 0, "DistributedOptimizer")
  for _, v in ipairs(fresh) do self._synced[v] = true end
end

--- opt:mark_synced(vars): these variables were broadcast already (fit does it)
function DistributedOptimizer.mark_synced (self, vars)
  for _, v in ipairs(vars) do self._synced[v] = true end
end

function DistributedOptimizer.build (self, vars)
  started("DistributedOptimizer")
  sync(self, vars, #vars)
  return self.optimizer:build(vars)
end

--- opt:apply_gradients(grads, vars): averages grads over the ranks, then opt's
-- update. A nil gradient stays nil (every rank must leave out the same ones:
-- the ranks check that they agree on the list, nils, dtypes and shapes).
-- opt.grad_scale (1) multiplies this rank's gradients first: fit sets it to
-- a rank's share of an uneven batch, so the result is the whole batch's.
function DistributedOptimizer.apply_gradients (self, grads, vars)
  local who = "DistributedOptimizer"
  grads, vars = dist._split_pairs(grads, vars)
  local n = type(vars) == "table" and #vars or 0
  check.distinct_variables(who, vars, n)                  -- before any collective
  started(who)
  local list = {}
  for i = 1, n do
    local g = grads[i]
    if g ~= nil then
      if not check.is_array(g) then fail(who, "gradient %d must be a tensor, got %s", i, show(g)) end
      list[i] = mg.is_variable(g) and g:value() or g
    end
  end
  sync(self, vars, n)
  local post = self.op == "mean" and 1 / mpi.size() or 1
  local out = mpi.allreduce_many(list, "sum", self.grad_scale, post, math.max(self.fusion_bytes, 1), n, who)
  return self.optimizer:apply_gradients(out, vars)
end

--- opt:minimize(loss, vars, tape): tape's gradient of loss for vars, averaged
-- over the ranks while the backward runs (mpi.gradient: each bucket goes out
-- with MPI_Iallreduce once the walk has made all of its gradients), then
-- opt's update. A gradient no rank made stays nil; one that only some ranks
-- made is the sum with zeros from the others.
function DistributedOptimizer.minimize (self, loss, vars, tape)
  local who = "DistributedOptimizer"
  local n = check.minimize_args(who .. ":minimize", loss, vars, tape)
  check.distinct_variables(who, vars, n)
  started(who)
  if not dist._overlaps(self) then return self:apply_gradients(tape:gradient(loss, vars), vars) end
  local post = self.op == "mean" and 1 / mpi.size() or 1
  local grads = mpi.gradient(tape, loss, {table.unpack(vars, 1, n)}, "allreduce", self.grad_scale, post,
                             math.max(self.fusion_bytes, 1), who)
  sync(self, vars, n)                                     -- after the walk: it reads the weights as they were
  return self.optimizer:apply_gradients(grads, vars)
end

--- ShardedOptimizer(opt [, {stage = 1, fusion_bytes = 4 MiB, op = "mean", overlap = "auto"}]):
-- opt with its state sharded over the ranks, as DeepSpeed's ZeRO: stage 1
-- keeps each rank's 1/N of the optimizer's slots and updates its shard of the
-- weights, then all-gathers them; stage 2 also reduce-scatters the gradients,
-- so a rank receives only its shard of them (moongrad.sharded).
function dist.ShardedOptimizer (opt, opts)
  started("ShardedOptimizer")
  return require("moongrad.sharded").new(opt, opts)
end

--- reduce_scatter(t [, {op = "sum"}]): t (the same shape on every rank)
-- reduced across the ranks; this rank's shard of the flattened result, a 1-D
-- tensor (elements shard_range(t numel) of it)
function dist.reduce_scatter (t, opts) return started("reduce_scatter").reduce_scatter(t, opts) end

--- shard_range(n [, size, rank]): the 1-based first and last of n elements a
-- rank holds in a sharded collective (this rank of this run by default):
-- floor(n r / N) + 1 .. floor(n (r + 1) / N), empty (last < first) when n < N
function dist.shard_range (n, size, rank)
  if size == nil then return started("shard_range").shard_range(n) end
  return c("shard_range").shard_range(n, size, rank)
end

-- }=============================================================


-- {====================== fit's helpers =========================

--- The rows rank `rank` of `size` trains on in global step i of an epoch of n
-- samples, global batch bs * size: a..b (b < a: none). The global batch is cut
-- in size nearly equal shares, in rank order, so batch i is the same samples
-- on one process with batch bs * size and on size processes with batch bs.
function dist.shard (i, bs, size, rank, n)
  local first = (i - 1) * bs * size
  local len = math.min(bs * size, n - first)
  local a = first + (len * rank) // size + 1
  local b = first + (len * (rank + 1)) // size
  return a, b, len
end

--- Global steps per epoch: a last global batch with fewer samples than
-- ranks is left out (some rank would have none).
function dist.steps (n, bs, size)
  local steps = (n + bs * size - 1) // (bs * size)
  if steps > 1 and n - (steps - 1) * bs * size < size then steps = steps - 1 end
  return steps
end

--- average_logs(logs, rows, total): every rank's logs (numbers) averaged,
-- weighted by rows (this rank's samples of the step) out of total.
function dist.average_logs (logs, rows, total)
  local keys = {}
  for k in pairs(logs) do keys[#keys + 1] = k end
  table.sort(keys)
  local values = {}
  for i, k in ipairs(keys) do values[i] = logs[k] * rows / total end
  local sums = mpi.allreduce(mg.tensor(values, "float64"), {op = "sum"}):totable()
  local out = {}
  for i, k in ipairs(keys) do out[k] = sums[i] end
  return out
end

--- seed_of(seed): rank 0's integer seed on every rank
function dist.seed_of (seed)
  return math.tointeger(mpi.broadcast(mg.tensor({seed}, "int64"), 0):totable()[1])
end

-- }=============================================================

return check.export(dist)          -- errors name the user's line (moongrad.check)

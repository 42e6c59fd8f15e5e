-- Run by spec/30-distributed_spec.lua: mpirun -np <p> moongrad spec/dist/overlap.lua
-- opt:minimize(loss, vars, tape), whose gradients go out in buckets while the
-- backward runs (mpi.gradient), against the same optimizer's step after the
-- backward (overlap = false: tape:gradient, then apply_gradients), on a
-- program with what a bucket must survive: a recomputed stretch, a weight
-- used twice, a float64 variable among float32 ones, a variable without a
-- gradient every other step, one that only rank 0 uses (the others add
-- zeros), uneven shares scaled by grad_scale, and bucket sizes from one
-- variable each to all in one. DistributedOptimizer and ShardedOptimizer
-- stages 1 and 2; bit for bit on 2 ranks, within 1e-6 on more (Open MPI's
-- nonblocking and blocking reductions may add in other orders).
-- Then the memory: a stage 2 step that overlaps holds less at its peak
-- (mg.memory.stats) than one that reduces after the backward.
-- Prints "ok <n> checks on <p> ranks" on rank 0.
local dist = mg.distributed
local rank, size = dist.init()
local checks = 0

local function same (what, a, b, exact)
  checks = checks + 1
  assert(a.dtype == b.dtype and table.concat(a.shape, ",") == table.concat(b.shape, ","), what .. ": dtype or shape")
  if a:numel() == 0 then return end
  local err = mg.max(mg.abs(mg.cast(a, "float64") - mg.cast(b, "float64"))):item()
  if exact then
    assert(err == 0, ("%s: not bit for bit on rank %d (off by %g)"):format(what, rank, err))
  else
    local scale = math.max(mg.max(mg.abs(mg.cast(b, "float64"))):item(), 1e-30)
    assert(err / scale <= 1e-6, ("%s: off by %g on rank %d"):format(what, err / scale, rank))
  end
end

local N = 30
local function setup ()
  mg.random.seed(7)
  local model = mg.nn.Sequential{mg.nn.Dense(6, "tanh"), mg.nn.Dense(6, "relu"), mg.nn.Dense(2)}
  local x, y = mg.random.normal{N, 5}, mg.random.normal{N, 2}
  model(x)
  local tied = mg.Variable(mg.random.normal{6, 6}, {name = "tied"})
  local scale64 = mg.Variable(mg.random.normal({2}, 0, 1, "float64"), {name = "scale64"})
  local idle = mg.Variable(mg.random.normal{3}, {name = "idle"})
  local lonely = mg.Variable(mg.random.normal{4}, {name = "lonely"})
  local vars = {table.unpack(model.trainable_variables)}
  table.insert(vars, 3, scale64)
  table.insert(vars, 1, tied)
  vars[#vars + 1] = idle
  vars[#vars + 1] = lonely
  local a, b = math.floor(N * rank / size) + 1, math.floor(N * (rank + 1) / size)
  if rank == size - 1 then b = b - 1 end                       -- uneven shares: grad_scale evens them out
  local xs, ys = x:slice({a, b}), y:slice({a, b})
  local share = (b - a + 1) * size / N
  local layers = model.layers
  local middle = mg.recompute_grad(function(h) return layers[2](mg.matmul(h, tied)) + mg.matmul(h, tied) end)
  local function step (opt, i, overlap)
    opt.overlap, opt.grad_scale = overlap, 1 / share
    local t = mg.tape()
    local h = middle(layers[1](xs))
    local p = layers[3](h) * mg.cast(mg.exp(scale64), "float32")
    local loss = mg.sum((p - ys) ^ 2) / N * share
    if i % 2 == 0 then loss = loss + mg.sum(idle ^ 2) end
    if rank == 0 then loss = loss + mg.sum(mg.sin(lonely))
    elseif overlap ~= true then loss = loss + 0 * mg.sum(lonely) end   -- the replicated list must match: zeros
    t:stop()
    opt:minimize(loss, vars, t)
    return loss
  end
  return vars, step
end

local makers = {
  replicated = function(f) return dist.DistributedOptimizer(mg.optim.Adam{learning_rate = 0.05}, {fusion_bytes = f}) end,
  stage1 = function(f) return dist.ShardedOptimizer(mg.optim.Adam{learning_rate = 0.05}, {stage = 1, fusion_bytes = f}) end,
  stage2 = function(f) return dist.ShardedOptimizer(mg.optim.Adam{learning_rate = 0.05}, {stage = 2, fusion_bytes = f}) end,
}

local function train (name, fusion, overlap)
  local vars, step = setup()
  local opt = makers[name](fusion)
  local losses = {}
  for i = 1, 4 do losses[i] = step(opt, i, overlap) end
  return vars, losses
end

for _, name in ipairs{"replicated", "stage1", "stage2"} do
  for _, fusion in ipairs{0, 100, 4 << 20} do
    local exact = size <= 2
    local ref_vars, ref_losses = train(name, fusion, false)
    local calls = dist.stats().calls
    local vars, losses = train(name, fusion, true)
    assert(dist.stats().calls > calls)
    for i = 1, #vars do
      same(("%s fusion %d variable %d"):format(name, fusion, i), vars[i]:value(), ref_vars[i]:value(), exact)
    end
    for i = 1, #losses do same(("%s fusion %d loss %d"):format(name, fusion, i), losses[i], ref_losses[i], exact) end
  end
end

-- overlap = "auto" (the default): on one machine the replicated and stage 1
-- steps send after the backward (nothing to hide behind), stage 2 during it
do
  checks = checks + 4
  assert(dist.local_size() == size, ("local_size %d on one machine of %d ranks"):format(dist.local_size(), size))
  for _, c in ipairs{{"replicated", false}, {"stage1", false}, {"stage2", true}} do
    local vars, step = setup()
    local opt = makers[c[1]](4 << 20)
    assert(opt.overlap == "auto")
    local waited = dist.stats().waited
    step(opt, 1, "auto")
    assert((dist.stats().waited > waited) == c[2], c[1] .. ": auto chose the other way")
  end
end

-- a gradient no rank makes stays nil (no update): the idle variable on an odd step
do
  local vars, step = setup()
  local opt = dist.DistributedOptimizer(mg.optim.SGD(1), {fusion_bytes = 0})
  local idle_before = vars[#vars - 1]:value()
  step(opt, 1, true)
  same("idle variable left alone", vars[#vars - 1]:value(), idle_before, true)
end

-- minimize's arguments, on every rank alike
do
  local opt = dist.DistributedOptimizer(mg.optim.SGD(1))
  local v = mg.Variable(mg.ones({2}))
  local ok, err = pcall(opt.minimize, opt, mg.sum(v), {v})
  assert(not ok and err:find("DistributedOptimizer:minimize: minimize(loss, vars, tape) needs the tape that recorded "
                             .. "the loss (mg.tape()), got nil", 1, true), err)
  ok, err = pcall(opt.minimize, opt, 3, {v}, mg.tape())
  assert(not ok and err:find("DistributedOptimizer:minimize: the loss must be a tensor, got 3", 1, true), err)
  ok, err = pcall(opt.minimize, opt, mg.sum(v), {v, 5}, mg.tape())
  assert(not ok and err:find("DistributedOptimizer:minimize: variable 2 must be a Variable, got 5", 1, true), err)
  local t = mg.tape()
  local loss = mg.sum(v * v)
  t:stop()
  opt:minimize(loss, {v}, t)
  ok, err = pcall(opt.minimize, opt, loss, {v}, t)                 -- a spent tape: an error before any bucket goes
  assert(not ok and err:find("a non-persistent tape can only compute one gradient", 1, true), err)
  checks = checks + 4
end

-- a backward that fails on every rank, caught: the buckets already sent are
-- finished, the error is the rule's, and the ranks stay in step
do
  local a, b = mg.Variable(mg.ones{3}), mg.Variable(mg.ones{300})
  local f = mg.custom_gradient(function(x) return x * 2, function() error("boom") end end)
  local opt = dist.DistributedOptimizer(mg.optim.SGD(0.1), {overlap = true, fusion_bytes = 64})
  local t = mg.tape()
  local loss = mg.sum(f(a)) + mg.sum(b * b)                   -- b's bucket goes out before f's backward fails
  t:stop()
  local ok, err = pcall(opt.minimize, opt, loss, {a, b}, t)
  assert(not ok and err:find("in the backward of 'custom_gradient': .*boom"), err)
  dist.barrier()
  t = mg.tape()
  loss = mg.sum(b * b)
  t:stop()
  opt:minimize(loss, {a, b}, t)                                -- a has no gradient: nil, left alone
  same("after a failed backward", b:value(), mg.full({300}, 0.8), true)
  same("a left alone", a:value(), mg.ones{3}, true)
end

-- memory: stage 2 keeps 1/N of the gradients when they go out during the backward
if size == 2 then
  local function peak (overlap)
    mg.random.seed(3)
    local model = mg.nn.Sequential{mg.nn.Dense(256, "relu"), mg.nn.Dense(256, "relu"), mg.nn.Dense(256, "relu"),
                                   mg.nn.Dense(256)}
    local x = mg.random.normal{4, 256}
    model(x)
    local vars = model.trainable_variables
    local opt = dist.ShardedOptimizer(mg.optim.SGD(0.01), {stage = 2, fusion_bytes = 64 * 1024, overlap = overlap})
    local function step ()
      local t = mg.tape()
      local loss = mg.sum(model(x) ^ 2)
      t:stop()
      opt:minimize(loss, vars, t)
    end
    step()                                                   -- the layout and the broadcast
    collectgarbage()
    mg.memory.reset_peak()
    local base = mg.memory.stats().current_bytes
    step()
    return mg.memory.stats().peak_bytes - base
  end
  local plain, overlapped = peak(false), peak(true)
  local grads = 4 * (256 * 256 + 256) * 4
  checks = checks + 1
  assert(overlapped < plain - grads / 4, ("stage 2 peak above the step's start: %d bytes overlapped, %d after the "
                                          .. "backward (gradients %d bytes)"):format(overlapped, plain, grads))
  if rank == 0 then print(("stage 2 peak: %d bytes overlapped, %d after the backward"):format(overlapped, plain)) end
end

if rank == 0 then print(("ok %d checks on %d ranks"):format(checks, size)) end

-- Run by spec/30-distributed_spec.lua: mpirun -np <p> moongrad spec/dist/sharded.lua <dir> [mode]
-- ShardedOptimizer (ZeRO stages 1 and 2) against DistributedOptimizer (the
-- replicated step) on the same program: a small MLP whose variables split
-- unevenly over the ranks, a float64 variable beside the float32 ones, and a
-- variable without a gradient every other step. Checks, on every rank:
--   the weights, the losses and the gathered optimizer state equal the
--   replicated run's (bit for bit where the sums meet in the same order:
--   stage 1 always, stage 2 on 2 ranks; within 1e-6 otherwise);
--   the wrapped optimizer keeps slots for this rank's shard only;
--   reduce_scatter against a serial reference.
-- mode "save": stage 2 trains 3 steps and writes <dir>/ck.safetensors;
-- mode "resume": stage 1 restores it (saved under another rank count) and
-- trains 3 more, rank 0 writing <dir>/resumed.safetensors; mode "reference":
-- the replicated optimizer's 6 steps, into <dir>/reference.safetensors.
-- Prints "ok <n> checks on <p> ranks" on rank 0.
local dist = mg.distributed
local rank, size = dist.init()
local dir, mode = arg[1], arg[2] or "check"
local checks = 0

local function bits_equal (a, b)
  return mg.sum(mg.cast(mg.not_equal(a, b), "int64")):item() == 0
end

local function same (what, a, b, exact)
  checks = checks + 1
  assert(a.dtype == b.dtype and table.concat(a.shape, ",") == table.concat(b.shape, ","), what .. ": dtype or shape")
  if a:numel() == 0 then return end
  if exact then
    assert(bits_equal(a, b), ("%s: not bit for bit on rank %d"):format(what, rank))
  else
    local scale = math.max(mg.max(mg.abs(mg.cast(b, "float64"))):item(), 1e-30)
    local err = mg.max(mg.abs(mg.cast(a, "float64") - mg.cast(b, "float64"))):item() / scale
    assert(err <= 1e-6, ("%s: off by %g on rank %d"):format(what, err, rank))
  end
end

-- the model, its data and the step; the same weights on every rank from the seed
local N = 64
local function setup ()
  mg.random.seed(5)
  local model = mg.nn.Sequential{mg.nn.Dense(7, "tanh"), mg.nn.Dense(5, "relu"), mg.nn.Dense(3)}
  local x, y = mg.random.normal{N, 9}, mg.random.normal{N, 3}
  model(x)
  local extra = mg.Variable(mg.random.normal({3}, 0, 1, "float64"), {name = "extra64"})
  local idle = mg.Variable(mg.random.normal{4}, {name = "idle"})
  local vars = {table.unpack(model.trainable_variables)}
  table.insert(vars, 2, extra)                               -- dtypes interleaved in the list
  vars[#vars + 1] = idle
  local a, b = dist.shard_range(N)
  local xs, ys = x:slice({a, b}), y:slice({a, b})
  local function step (opt, i)
    local t = mg.tape()
    local p = model(xs) * mg.cast(mg.exp(extra), "float32")
    local loss = mg.sum((p - ys) ^ 2) / N                     -- this rank's part of the whole batch's mean
    if i % 2 == 0 then loss = loss + mg.sum(idle ^ 2) / (N * size) end
    t:stop()
    local g = t:gradient(loss, vars, {unconnected = "none"})
    opt:apply_gradients(g, vars)
    return loss
  end
  return model, vars, step
end

local function train (make_opt, steps)
  local model, vars, step = setup()
  local opt = make_opt()
  local losses = {}
  for i = 1, steps do losses[i] = step(opt, i) end
  return vars, opt, losses
end

local function replicated () return dist.DistributedOptimizer(mg.optim.AdamW{learning_rate = 0.02}, {op = "sum"}) end
local function zero (stage, fusion)
  return function()
    return dist.ShardedOptimizer(mg.optim.AdamW{learning_rate = 0.02}, {stage = stage, op = "sum", fusion_bytes = fusion})
  end
end

if mode == "check" then
  local ref_vars, ref_opt, ref_losses = train(replicated, 6)
  local ref_state = ref_opt:get_state(ref_vars)
  for _, run in ipairs{{1}, {2}, {1, 64}, {2, 0}} do                -- fusion_bytes 64 and 0: a gather per variable
    local stage = run[1]
    local exact = stage == 1 or size <= 2
    local vars, opt, losses = train(zero(stage, run[2]), 6)
    for i = 1, #vars do same(("stage %d variable %d"):format(stage, i), vars[i]:value(), ref_vars[i]:value(), exact) end
    for i = 1, #losses do same(("stage %d loss %d"):format(stage, i), losses[i], ref_losses[i], exact) end
    local state = opt:get_state(vars)                          -- gathered: the replicated optimizer's form
    assert(state.iterations == ref_state.iterations and state.optimizer == ref_state.optimizer, "state header")
    for name, list in pairs(ref_state.slots) do
      for i = 1, #vars do same(("stage %d slot %s %d"):format(stage, name, i), state.slots[name][i], list[i], exact) end
    end
    -- slots for this rank's shard only: m and v of shard_range(P) elements of each dtype
    local inner, want, have = opt.optimizer, 0, 0
    for _, dt in ipairs{"float32", "float64"} do
      local total = 0
      for _, v in ipairs(vars) do if v.dtype == dt then total = total + v:value():numel() end end
      local a, b = dist.shard_range(total)
      want = want + 2 * (b - a + 1) * (dt == "float64" and 8 or 4)
    end
    for _, slot in ipairs{"m", "v"} do
      for _, t in pairs(inner[slot]) do have = have + t:numel() * (t.dtype == "float64" and 8 or 4) end
    end
    checks = checks + 1
    assert(have == want, ("stage %d: slots of %d bytes on rank %d, expected %d"):format(stage, have, rank, want))
    local all = 0
    for _, v in ipairs(vars) do all = all + 2 * v:value():numel() * (v.dtype == "float64" and 8 or 4) end
    if rank == 0 then
      print(("stage %d: slots of %d bytes on rank 0, %d replicated; bit for bit: %s"):format(stage, have, all,
                                                                                          tostring(exact)))
    end
  end
  -- reduce_scatter against a serial reference, every float dtype, uneven sizes, views
  for _, dtype in ipairs{"float32", "float64", "bfloat16"} do
    for _, n in ipairs{0, 1, size - 1, 7, 1000} do
      local function values (r) return ((mg.arange(0, n, 1, "float64") * (r + 2) + r) % 7 - 3):cast(dtype) end
      local ref = mg.zeros({n}, "float64")
      for r = 0, size - 1 do ref = ref + values(r):cast("float64") end
      local a, b = dist.shard_range(n)
      local function mine (t) return b < a and mg.zeros({0}, dtype) or t:slice({a, b}):cast(dtype) end
      local got = dist.reduce_scatter(values(rank))
      same(("reduce_scatter %s %d"):format(dtype, n), got, mine(ref), true)
      got = dist.reduce_scatter(mg.reshape(values(rank), {1, n}), {op = "mean"})
      same(("reduce_scatter mean %s %d"):format(dtype, n), got, mine(ref / size), dtype ~= "bfloat16")
    end
  end
  local ok, err = pcall(dist.reduce_scatter, mg.zeros({2}, "int64"), {op = "mean"})
  assert(not ok and err:find("reduce_scatter: op 'mean' is for float tensors, got int64 %(use 'sum'%)"), err)
  -- arguments, and what a shard cannot do
  ok, err = pcall(dist.ShardedOptimizer, 3)
  assert(not ok and err:find("ShardedOptimizer: the optimizer must be an optimizer (mg.optim.Adam{...}), got 3", 1, true), err)
  ok, err = pcall(dist.ShardedOptimizer, mg.optim.SGD(), {stage = 3})
  assert(not ok and err:find("ShardedOptimizer: option 'stage' must be 1 or 2, got 3", 1, true), err)
  local clipped = dist.ShardedOptimizer(mg.optim.Adam{clipnorm = 1})
  ok, err = pcall(clipped.apply_gradients, clipped, {mg.ones({2})}, {mg.Variable(mg.ones({2}))})
  assert(not ok and err:find("clips by a norm (clipnorm or global_clipnorm), which needs whole gradients", 1, true), err)
  local wrapped = dist.ShardedOptimizer(mg.optim.Adam{learning_rate = 0.5})
  assert(wrapped.learning_rate == 0.5 and wrapped.iterations == 0 and dist.ShardedOptimizer(wrapped) == wrapped)
  checks = checks + 4
  -- a different list of variables after the first step is refused, on every rank alike
  local vars, opt = train(zero(1), 1)
  ok, err = pcall(opt.apply_gradients, opt, {mg.ones({4})}, {vars[#vars]})
  assert(not ok and err:find("ShardedOptimizer: the variables differ from the first step's", 1, true), err)
elseif mode == "save" then
  local model, vars, step = setup()
  local opt = zero(2)()
  for i = 1, 3 do step(opt, i) end
  local state = opt:get_state(vars)                          -- every rank: a collective
  if rank == 0 then
    local t = {}
    for i, v in ipairs(vars) do t["w" .. i] = v:value() end
    for name, list in pairs(state.slots) do for i, s in ipairs(list) do t[name .. i] = s end end
    t.iterations = mg.tensor({state.iterations}, "int64")
    mg.save(dir .. "/ck.safetensors", t)
  end
  dist.barrier()
elseif mode == "reference" then
  local vars = train(replicated, 6)
  if rank == 0 then
    local out = {}
    for i, v in ipairs(vars) do out["w" .. i] = v:value() end
    mg.save(dir .. "/reference.safetensors", out)
  end
  dist.barrier()
elseif mode == "resume" then
  local model, vars, step = setup()
  local t = mg.load(dir .. "/ck.safetensors")
  for i, v in ipairs(vars) do v:assign(t["w" .. i]) end
  local slots = {m = {}, v = {}}
  for i = 1, #vars do slots.m[i], slots.v[i] = t["m" .. i], t["v" .. i] end
  local opt = zero(1)()
  opt:set_state({optimizer = "AdamW", iterations = math.tointeger(t.iterations:totable()[1]), slots = slots}, vars)
  for i = 4, 6 do step(opt, i) end
  if rank == 0 then
    local out = {}
    for i, v in ipairs(vars) do out["w" .. i] = v:value() end
    mg.save(dir .. "/resumed.safetensors", out)
  end
  dist.barrier()
end
if rank == 0 then print(("ok %d checks on %d ranks"):format(checks, size)) end

-- Run by spec/30-distributed_spec.lua as: mpirun -np 2 moongrad spec/dist/collectives.lua
-- Every collective against a serial reference: each rank can make every
-- rank's tensor (values(r, ...)), so each checks its result against the
-- combination computed here, for every dtype and several shapes (0 elements
-- included). Prints "ok <n>" on rank 0 at the end; any mismatch is an error
-- (which stops every rank).
local dist = mg.distributed
local rank, size = dist.init()

local shapes = {{}, {0}, {3, 0, 2}, {1}, {5}, {4, 3}, {2, 3, 4}, {70000}}
local dtypes = {"float32", "float64", "int64", "bool", "float16", "bfloat16"}
local checks = 0

-- rank r's tensor: small integers (exact in every dtype), distinct per rank
local function values (r, shape, dtype)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  local t = mg.arange(0, n, 1, "float64")
  t = ((t * (r + 3) + r * 7) % 11) - 4
  if dtype == "bool" then return mg.reshape(mg.greater(t, 0), shape) end
  return mg.reshape(t, shape):cast(dtype)
end

local function as64 (t) return (t.dtype == "bool" and mg.where(t, 1.0, 0.0) or t):cast("float64") end

local function same (what, got, want, tol)
  checks = checks + 1
  assert(got.dtype == want.dtype, ("%s: dtype %s, expected %s"):format(what, got.dtype, want.dtype))
  assert(table.concat(got.shape, ",") == table.concat(want.shape, ","),
         ("%s: shape (%s), expected (%s)"):format(what, table.concat(got.shape, ","), table.concat(want.shape, ",")))
  if got:numel() == 0 then return end
  local err = mg.max(mg.abs(as64(got) - as64(want))):item()
  assert(err <= (tol or 0), ("%s: off by %g on rank %d"):format(what, err, rank))
end

local function reference (op, shape, dtype)
  local acc
  for r = 0, size - 1 do
    local t = as64(values(r, shape, dtype))
    if acc == nil then acc = t
    elseif op == "max" or (dtype == "bool" and op == "sum") then acc = mg.maximum(acc, t)
    elseif op == "min" then acc = mg.minimum(acc, t)
    else acc = acc + t end
  end
  if op == "mean" then acc = acc / size end
  if dtype == "bool" then return mg.greater(acc, 0) end
  return acc:cast(dtype)
end

for _, dtype in ipairs(dtypes) do
  local ops = {"sum", "max", "min"}
  if dtype ~= "int64" and dtype ~= "bool" then ops[#ops + 1] = "mean" end
  for _, shape in ipairs(shapes) do
    local mine = values(rank, shape, dtype)
    local name = ("%s (%s)"):format(dtype, table.concat(shape, ","))
    local tol = (dtype == "bfloat16" and 0.07 or dtype == "float16" and 0.01 or 0) * size
    for _, op in ipairs(ops) do
      local t = op == "mean" and math.max(tol, 1e-5) or tol      -- 1 / size rounds
      same("allreduce " .. op .. " " .. name, dist.allreduce(mine, {op = op}), reference(op, shape, dtype), t)
    end
    local v = Variable(mine)                          -- in place on a variable
    assert(dist.allreduce(v, {op = "max"}) == v)
    same("allreduce of a variable " .. name, v:value(), reference("max", shape, dtype))
    for root = 0, size - 1 do
      same("broadcast from " .. root .. " " .. name, dist.broadcast(mine, root), values(root, shape, dtype))
    end
    local w = Variable(mine)
    dist.broadcast(w, size - 1)
    same("broadcast of a variable " .. name, w:value(), values(size - 1, shape, dtype))
    local parts = {}
    for r = 0, size - 1 do
      local t = values(r, shape, dtype)
      parts[#parts + 1] = #shape == 0 and mg.reshape(t, {1}) or t
    end
    same("allgather " .. name, dist.allgather(mine), mg.concat(parts, 1))
  end
  -- allgather with first axes that differ by rank
  local mine = values(rank, {rank + 1, 2}, dtype)
  local parts = {}
  for r = 0, size - 1 do parts[#parts + 1] = values(r, {r + 1, 2}, dtype) end
  same("allgather of uneven rows " .. dtype, dist.allgather(mine), mg.concat(parts, 1))
end

-- a non-contiguous tensor (a transposed view) reduces as its values
local t = mg.transpose(values(rank, {3, 4}, "float32"))
local want = reference("sum", {3, 4}, "float32")
same("allreduce of a transposed view", dist.allreduce(t), mg.transpose(want))

-- the fused path DistributedOptimizer uses: buckets of mixed dtypes and sizes
local list, ref = {}, {}
for i, dtype in ipairs({"float32", "float64", "float32", "float32", "float64"}) do
  list[i] = values(rank, {i, 3}, dtype)
  ref[i] = reference("mean", {i, 3}, dtype)
end
for _, fusion in ipairs({1, 64, 1 << 20}) do
  local before = dist.stats().calls
  local out = require("moongrad.mpi").allreduce_many(list, "sum", 1, 1 / size, fusion)
  for i = 1, #list do same("fused bucket " .. i .. " at " .. fusion, out[i], ref[i], 1e-6) end
  local calls = dist.stats().calls - before
  local want = 1 + (fusion == 1 and 5 or fusion == 64 and 4 or 2)   -- the agreement, then one per tensor, ..., one per dtype
  assert(calls == want, ("fusion_bytes %d: %d MPI calls, expected %d"):format(fusion, calls, want))
end

-- what ranks disagree on is an error naming the rank and the mismatch
local ok, err
if size > 1 then
ok, err = pcall(dist.allreduce, mg.zeros(rank + 2))
assert(not ok and err:find("allreduce: ranks disagree on the shape: rank 0 gives float32 %(2%), rank 1 gives float32 %(3%)"), err)
ok, err = pcall(dist.broadcast, mg.zeros({2}, rank == 0 and "float32" or "float64"))
assert(not ok and err:find("broadcast: ranks disagree on the dtype: rank 0 gives float32 %(2%), rank 1 gives float64 %(2%)"), err)
ok, err = pcall(dist.allgather, mg.zeros({2, rank + 1}))
assert(not ok and err:find("allgather: ranks disagree on the shape after the first axis: rank 0 gives float32 %(2,1%), rank 1 gives float32 %(2,2%)"), err)
end
ok, err = pcall(dist.allreduce, mg.zeros({2}, "int64"), {op = "mean"})
assert(not ok and err:find("allreduce: op 'mean' is for float tensors, got int64 %(use 'sum'%)"), err)
ok, err = pcall(dist.allreduce, mg.zeros(2), {op = "avg"})
assert(not ok and err:find("allreduce: op must be 'sum', 'mean', 'max' or 'min', got 'avg'"), err)
ok, err = pcall(dist.broadcast, mg.zeros(2), size)
assert(not ok and err:find(("broadcast: root must be a rank from 0 to %d, got %d"):format(size - 1, size)), err)
dist.barrier()
if rank == 0 then print(("ok %d checks on %d ranks"):format(checks, size)) end

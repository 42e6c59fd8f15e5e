-- Run by spec/30-distributed_spec.lua as: mpirun -np 2 moongrad spec/dist/disagree.lua
-- Each case makes the two ranks disagree on what a collective means (its
-- shape, op, root, the call itself, DistributedOptimizer's list) and prints
-- "rank <r> <case>: <error>" for the error each rank raises; the spec checks
-- that both ranks print the same text. After every error no data has moved
-- and the ranks are still in step: the last line is a collective that works.
local dist = mg.distributed
local rank, size = dist.init()
assert(size == 2, "run with -np 2")

local function case (name, f)
  local ok, err = pcall(f)
  print(("rank %d %s: %s"):format(rank, name, ok and "no error" or tostring(err)))
end

local function mine (a, b) if rank == 0 then return a end return b end

case("allgather dims", function() return dist.allgather(mg.zeros({2, rank + 1})) end)
case("allgather ndim", function() return dist.allgather(mg.zeros(mine({2}, {2, 1}))) end)
case("allreduce op", function() return dist.allreduce(mg.ones(3), {op = mine("sum", "max")}) end)
case("allreduce dtype", function() return dist.allreduce(mg.ones({3}, mine("float32", "float64"))) end)

local v = mg.Variable(mg.full({3}, rank + 1))        -- in place: left alone by the error
case("allreduce op on a variable", function() return dist.allreduce(v, {op = mine("sum", "min")}) end)
assert(v:value():totable()[1] == rank + 1, "the variable changed")

case("broadcast root", function() return dist.broadcast(mg.ones(2), rank) end)
case("broadcast root out of range on one rank", function() return dist.broadcast(mg.ones(2), mine(0, 5)) end)
case("broadcast root out of range on all", function() return dist.broadcast(mg.ones(2), 5) end)
case("call", function()
  if rank == 0 then return dist.barrier() end
  return dist.allreduce(mg.ones(2))
end)

-- DistributedOptimizer: a nil gradient on one rank, another list of variables
local w = mg.Variable(mg.full({2, 3}, rank + 1), {name = "w"})
local b = mg.Variable(mg.full({3}, rank + 1), {name = "b"})
local gw, gb = mg.ones({2, 3}), mg.ones({3})
local opt = dist.DistributedOptimizer(mg.optim.SGD{learning_rate = 0.5})
case("optimizer nil gradient", function() return opt:apply_gradients({gw, mine(gb, nil)}, {w, b}) end)
-- the first update broadcast rank 0's weights (the ranks agreed on the list); no step was taken
assert(w:value():totable()[1][1] == 1 and b:value():totable()[1] == 1, "the weights are not rank 0's")
assert(opt.iterations == 0, "a step was taken")

case("optimizer other variables (first step)", function()
  local fresh = dist.DistributedOptimizer(mg.optim.SGD())
  return fresh:apply_gradients(mine({gw, gb}, {gw}), mine({w, b}, {w}))
end)
case("optimizer other variables", function() return opt:apply_gradients(mine({gw, gb}, {gw}), mine({w, b}, {w})) end)
case("optimizer variables in another order", function()
  return opt:apply_gradients(mine({gw, gb}, {gb, gw}), mine({w, b}, {b, w}))
end)
case("optimizer op", function()
  local other = dist.DistributedOptimizer(mg.optim.SGD(), {op = mine("mean", "sum")})
  other:mark_synced({w, b})
  return other:apply_gradients({gw, gb}, {w, b})
end)
case("optimizer fusion_bytes", function()
  local other = dist.DistributedOptimizer(mg.optim.SGD(), {fusion_bytes = mine(64, 1 << 20)})
  other:mark_synced({w, b})
  return other:apply_gradients({gw, gb}, {w, b})
end)
case("broadcast_variables order", function() return dist.broadcast_variables(mine({w, b}, {b, w})) end)

-- still in step: a step that agrees, then a collective
opt:apply_gradients({gw, gb}, {w, b})
assert(opt.iterations == 1 and w:value():totable()[1][1] == 0.5, "the step after the errors is wrong")
print(("rank %d in step: %g"):format(rank, dist.allreduce(mg.ones(3)):totable()[1]))

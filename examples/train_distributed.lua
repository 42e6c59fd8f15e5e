-- The digits MLP of train_digits.lua, trained data-parallel over MPI:
--   mpirun -np 2 build/moongrad examples/train_distributed.lua [epochs] [shard]
--   (as root: mpirun --allow-run-as-root ...; more ranks than cores: --oversubscribe)
-- Every rank runs this same script. fit{distributed = true} starts every rank
-- from rank 0's weights, gives each rank batch_size samples of every global
-- batch, averages the gradients and the logs over the ranks, and draws the
-- progress bar on rank 0; the result is the training of batch 32 x ranks on
-- one process. shard 1 or 2 shards Adam's slots (and with 2 the gradients'
-- reduction) over the ranks, as ZeRO: each rank keeps 1/ranks of the slots,
-- and the weights come out the same as without.
local mg = mg or require "moongrad"
local nn = mg.nn
local dist = mg.distributed

local rank, size = dist.init()
local epochs = tonumber(arg and arg[1]) or 10
local shard = math.tointeger(tonumber(arg and arg[2]) or 0)

local x, labels = mg.data.digits()
x = x / 16
local n = x.shape[1]
mg.random.seed(42)                                     -- the same split on every rank
local order = mg.random.permutation(n)
local n_train = math.floor(n * 0.8)
local train, test = order:slice({1, n_train}), order:slice({n_train + 1, n})
local x_train, y_train = mg.gather(x, train), mg.gather(labels, train)
local x_test, y_test = mg.gather(x, test), mg.gather(labels, test)
if rank == 0 then print(("%d ranks, %d training images, batch 32 per rank"):format(size, n_train)) end

local model = nn.Sequential{nn.Dense(256, "relu"), nn.Dense(10)}
model:compile{optimizer = mg.optim.Adam{learning_rate = 2e-3},
              loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}, metrics = {"accuracy"}}
model:fit(x_train, y_train, {epochs = epochs, batch_size = 32, distributed = true, shard = shard, verbose = 2})
local result = model:evaluate(x_test, y_test, {verbose = 0})
local slots = 0                                        -- Adam's m and v on this rank
for _, t in pairs(model.optimizer.m) do slots = slots + t:numel() end
if rank == 0 then
  print(("test accuracy %.4f, MPI calls on rank 0: %d, Adam's slots on rank 0: 2 x %d values (shard %d)"):format(
    result.accuracy, dist.stats().calls, slots, shard))
end

-- A loop of your own: opt:minimize(loss, vars, tape) averages the gradients
-- over the ranks as the backward makes them, in buckets of fusion_bytes (on
-- one machine "auto" would reduce after the backward: overlap = true forces
-- it here). dist.stats().waited: seconds the steps waited at their end for
-- communication the backward did not hide.
local opt = dist.DistributedOptimizer(mg.optim.SGD(0.01), {overlap = true, fusion_bytes = 64 * 1024})
local a, b = dist.shard_range(n_train)                 -- this rank's rows
local xs, ys = x_train:slice({a, b}), y_train:slice({a, b})
local loss_fn = mg.losses.SparseCategoricalCrossentropy{from_logits = true}
local waited = dist.stats().waited
local loss
for _ = 1, 5 do
  local t = mg.tape()
  loss = loss_fn(ys, model(xs))
  t:stop()
  opt:minimize(loss, model.trainable_variables, t)
end
if rank == 0 then
  print(("5 steps of a loop of our own: loss %.4f on rank 0, %.2f ms waited for the gradients after the backward"):format(
    loss:item(), (dist.stats().waited - waited) * 1e3))
end

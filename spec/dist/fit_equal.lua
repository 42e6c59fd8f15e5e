-- Run by spec/30-distributed_spec.lua: mpirun -np <p> moongrad spec/dist/fit_equal.lua <batch> <out> [fusion] [shard] [unbuilt]
-- The digits MLP trained by fit{distributed = true} for 3 epochs of 320
-- samples at `batch` per rank. Rank 0 writes the running loss after every
-- step (one line each) to <out>.txt and the final weights to <out>.safetensors:
-- 1 process at batch 64 and 2 at batch 32 must give the same.
local dist = mg.distributed
local rank, size = dist.init()
local bs, out, fusion, shard = tonumber(arg[1]), arg[2], tonumber(arg[3] or "65536"), math.tointeger(tonumber(arg[4] or "0"))
local x, y = mg.data.digits()
x, y = x:slice({1, 320}) / 16, y:slice({1, 320})
mg.random.seed(7 + rank)                     -- other weights on rank 1: fit broadcasts rank 0's
local model = mg.nn.Sequential{mg.nn.Dense(32, "relu"), mg.nn.Dense(10)}
model:compile{optimizer = mg.distributed.DistributedOptimizer(mg.optim.Adam{learning_rate = 0.01},
                                                              {fusion_bytes = math.tointeger(fusion)}),
              loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}, metrics = {"accuracy"}}
if arg[5] ~= "unbuilt" then model(x:slice({1, 2})) end   -- builds the weights (else fit's first batch does)
local curve = {}
local calls0 = dist.stats().calls
local callbacks = {mg.callbacks.LambdaCallback{
  on_batch_end = function(_, logs) curve[#curve + 1] = ("%.9g %.9g"):format(logs.loss, logs.accuracy) end}}
if arg[4] then callbacks[2] = mg.checkpoint.callback(out .. ".ck.safetensors") end   -- given a shard: a checkpoint too
model:fit(x, y, {epochs = 3, batch_size = bs, seed = 11, verbose = 0, distributed = true, shard = shard,
                 callbacks = callbacks})
local calls = dist.stats().calls - calls0
if rank == 0 then
  local f = assert(io.open(out .. ".txt", "w"))
  f:write(table.concat(curve, "\n"), "\n")
  f:close()
  model:save_weights(out .. ".safetensors")
  print(("steps %d calls %d"):format(#curve, calls))
end

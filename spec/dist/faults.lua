-- Run by spec/30-distributed_spec.lua: mpirun -np 2 moongrad spec/dist/faults.lua <error|kill>
-- Rank 1 fails at the third step of a distributed fit, by a Lua error or by
-- SIGKILL, while rank 0 waits for it in the gradients' allreduce: the job
-- must end at once with the failed rank named, not hang.
local dist = mg.distributed
local rank = dist.init()
local mode = arg[1]
local x, y = mg.data.digits()
x, y = x:slice({1, 320}) / 16, y:slice({1, 320})
local model = mg.nn.Sequential{mg.nn.Dense(32, "relu"), mg.nn.Dense(10)}
model:compile{optimizer = "adam", loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}}
model:fit(x, y, {epochs = 50, batch_size = 32, verbose = 0, distributed = true, callbacks = {mg.callbacks.LambdaCallback{
  on_batch_begin = function(batch)
    if rank ~= 1 or batch ~= 3 then return end
    if mode == "error" then error("a failure on purpose") end
    local pid = assert(io.open("/proc/self/stat")):read("n")
    os.execute("kill -9 " .. math.tointeger(pid))
  end}}})
print("rank " .. rank .. " finished: the fault did not happen")

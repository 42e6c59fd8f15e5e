-- Run by spec/30-distributed_spec.lua: mpirun -np 2 moongrad spec/dist/resume.lua <mode> <dir>
--   full:    3 epochs; rank 0 writes the running losses to <dir>/full.txt
--   first:   epoch 1 with a checkpoint callback (rank 0 writes <dir>/ckpt.safetensors)
--   resume:  every rank restores <dir>/ckpt.safetensors, then epochs 2 and 3
--            (<dir>/resumed.txt): the curve must be full.txt's from epoch 2 on
--   resume0: rank 0 alone restores it (<dir>/resumed0.txt): the same curve
local dist = mg.distributed
local rank = dist.init()
local mode, dir = arg[1], arg[2]
local x, y = mg.data.digits()
x, y = x:slice({1, 320}) / 16, y:slice({1, 320})
mg.random.seed(3)
local model = mg.nn.Sequential{mg.nn.Dense(32, "relu"), mg.nn.Dense(10)}
model:compile{optimizer = mg.optim.Adam{learning_rate = 0.01},
              loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}}
model(x:slice({1, 2}))
local curve = {}
local opts = {epochs = 3, batch_size = 32, seed = 5, verbose = 0, distributed = true, callbacks = {
  mg.callbacks.LambdaCallback{on_batch_end = function(_, logs) curve[#curve + 1] = ("%.9g"):format(logs.loss) end}}}
if mode == "first" then
  opts.epochs = 1
  table.insert(opts.callbacks, mg.checkpoint.callback(dir .. "/ckpt.safetensors"))
elseif mode == "resume" then
  model.optimizer:build(model.trainable_variables)
  local info = mg.checkpoint.restore(dir .. "/ckpt.safetensors", {model = model, optimizer = model.optimizer})
  opts.initial_epoch = info.epoch
elseif mode == "resume0" then                  -- rank 0 alone reads the file: fit broadcasts the rest
  local epoch = 0
  if rank == 0 then
    model.optimizer:build(model.trainable_variables)
    epoch = mg.checkpoint.restore(dir .. "/ckpt.safetensors", {model = model, optimizer = model.optimizer}).epoch
  end
  opts.initial_epoch = math.tointeger(dist.broadcast(mg.tensor({epoch}, "int64"), 0):totable()[1])
end
model:fit(x, y, opts)
if rank == 0 and mode ~= "first" then
  local f = assert(io.open(dir .. "/" .. (mode == "full" and "full" or mode == "resume" and "resumed" or "resumed0")
                           .. ".txt", "w"))
  f:write(table.concat(curve, "\n"), "\n")
  f:close()
end
if rank == 0 then print("done " .. mode) end

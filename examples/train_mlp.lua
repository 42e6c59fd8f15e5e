-- Training a small classifier end to end: data, model, loss, optimizer,
-- progress bar, and recompute_grad on the hidden blocks to save memory.
--   build/moongrad examples/train_mlp.lua [epochs]
local mg = mg or require "moongrad"
local nn = mg.nn

local epochs = tonumber(arg and arg[1]) or 5
mg.random.seed(7)

-- three Gaussian blobs in 2-D, 600 points
local N, C = 600, 3
local centers = mg.constant({{-2, 0}, {2, 0}, {0, 2.5}})
local labels = mg.cast(mg.arange(N) % C, "int64") + 1
local x = mg.gather(centers, labels) + mg.random.normal({N, 2}, 0, 0.8)

local function block (width)
  return nn.Sequential{nn.Dense(width, {activation = "tanh"}), nn.Dense(width, {activation = "tanh"})}
end
local blocks = {block(64), block(64)}
local head = nn.Dense(C)
local model = nn.Sequential{nn.Dense(64, {activation = "tanh"}), blocks[1], blocks[2], head}
local checkpointed = {mg.recompute_grad(blocks[1]), mg.recompute_grad(blocks[2])}

local function forward (xb)
  local h = model.layers[1](xb)
  for _, b in ipairs(checkpointed) do h = b(h) end
  return head(h)
end

local opt = mg.optim.Adam{learning_rate = 0.01}
local batch = 60
for epoch = 1, epochs do
  local order = mg.random.permutation(N)
  local bar = mg.progress(N // batch, {label = ("epoch %d"):format(epoch), out = io.stdout})
  local total = 0
  for step = 1, N // batch do
    local idx = order:slice({(step - 1) * batch + 1, step * batch})
    local xb, yb = mg.gather(x, idx), mg.gather(labels, idx)
    local t = mg.tape()
    local loss = nn.softmax_cross_entropy(forward(xb), yb)
    t:stop()
    local vars = model.trainable_variables
    opt:apply_gradients(t:gradient(loss, vars), vars)
    total = total + loss:item()
    bar:update(step, {loss = total / step})
  end
  bar:finish()
end

local predicted = mg.argmax(forward(x), 2)
local accuracy = mg.mean(mg.cast(mg.equal(predicted, labels), "float32")):item()
print(("accuracy %.3f"):format(accuracy))

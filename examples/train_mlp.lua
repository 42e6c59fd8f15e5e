-- Training a small classifier end to end with fit: data, model, loss,
-- optimizer, the progress bar, and recompute_grad to save memory.
--   build/moongrad examples/train_mlp.lua [epochs]
-- On a terminal the bar is redrawn in place; piped (`| cat`) or written to a
-- file, each epoch is one line.
local mg = mg or require "moongrad"
local nn = mg.nn

local epochs = tonumber(arg and arg[1]) or 5
mg.random.seed(7)

-- three Gaussian blobs in 2-D, 600 points, labels 1..3
local N, C = 600, 3
local centers = mg.constant({{-2, 0}, {2, 0}, {0, 2.5}})
local labels = mg.cast(mg.arange(N) % C, "int64") + 1
local x = mg.gather(centers, labels) + mg.random.normal({N, 2}, 0, 0.8)

local model = nn.Sequential{
  nn.Dense(64, "tanh"),
  nn.Dense(64, "tanh"), nn.Dense(64, "tanh"),
  nn.Dense(64, "tanh"), nn.Dense(64, "tanh"),
  nn.Dense(C),
}
model:compile{
  optimizer = mg.optim.Adam{learning_rate = 0.01},
  loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true},
  metrics = {"accuracy"},
}
-- recompute: each step's forward runs under recompute_grad, so the tape holds
-- the batch alone and the gradient runs the forward again
model:fit(x, labels, {epochs = epochs, batch_size = 60, recompute = true})

print(("accuracy %.3f"):format(model:evaluate(x, labels, {verbose = 0}).accuracy))

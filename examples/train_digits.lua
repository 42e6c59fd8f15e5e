-- The 8x8 handwritten digits (1,797 images, UCI's set as scikit-learn ships
-- it) classified by an MLP trained with fit, on a fixed, seeded 80/20 split.
--   build/moongrad examples/train_digits.lua [epochs] [curves.png]
-- A second argument (a .png or .svg path) draws the loss and accuracy curves there.
-- The data come from Debian's python3-sklearn (sklearn/datasets/data/digits.csv.gz).
-- Without the package installed, mg.data fetches it with no root:
-- `apt-get download python3-sklearn`, unpacked with `dpkg-deb -x` into
-- ~/.cache/moongrad/debs/python3-sklearn (or under $XDG_CACHE_HOME);
-- nothing else touches the network.
local mg = mg or require "moongrad"
local nn = mg.nn

local epochs = tonumber(arg and arg[1]) or 30
local plot_path = arg and arg[2]

local x, labels = mg.data.digits()     -- (N, 64) pixels 0..16, classes 1..10 (digit + 1)
x = x / 16
local n = x.shape[1]

mg.random.seed(42)                                         -- the split, the weights and the shuffles
local order = mg.random.permutation(n)
local n_train = math.floor(n * 0.8)
local train, test = order:slice({1, n_train}), order:slice({n_train + 1, n})
local x_train, y_train = mg.gather(x, train), mg.gather(labels, train)
local x_test, y_test = mg.gather(x, test), mg.gather(labels, test)
print(("%d training and %d test images of 8x8 pixels"):format(n_train, n - n_train))

local model = nn.Sequential{
  nn.Dense(256, "relu"),
  nn.Dropout(0.2),
  nn.Dense(10),
}
model:compile{
  optimizer = mg.optim.Adam{learning_rate = 2e-3},
  loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true},
  metrics = {"accuracy"},
}
-- the test set as validation data only shows its figures after each epoch;
-- nothing is chosen by them
local history = model:fit(x_train, y_train, {epochs = epochs, batch_size = 64, validation_data = {x_test, y_test}})
if plot_path then print("curves: " .. history:plot(plot_path)) end

local result = model:evaluate(x_test, y_test, {verbose = 0})
print(("test loss: %.4f"):format(result.loss))
print(("test accuracy: %.4f"):format(result.accuracy))

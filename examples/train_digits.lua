-- The 8x8 handwritten digits (1,797 images, UCI's set as scikit-learn ships
-- it) classified by an MLP trained with fit, on a fixed, seeded 80/20 split.
--   build/moongrad examples/train_digits.lua [epochs] [curves.png]
-- A second argument (a .png or .svg path) draws the loss and accuracy curves there.
-- The data come from Debian's python3-sklearn (sklearn/datasets/data/digits.csv.gz).
-- Without the package installed, the example fetches it with no root:
-- `apt-get download python3-sklearn`, unpacked with `dpkg-deb -x` into
-- ~/.cache/moongrad/debs/python3-sklearn (or under $XDG_CACHE_HOME), as
-- mg.data.debian_file does; nothing else touches the network.
local mg = mg or require "moongrad"
local nn = mg.nn

local epochs = tonumber(arg and arg[1]) or 30
local plot_path = arg and arg[2]

-- {=========================== data ============================

local FILE = "usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

local function q (s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function exists (path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- the path of digits.csv.gz: the installed package's, or the one in the
-- package unpacked into the cache (fetched the first time)
local function digits_path ()
  if exists("/" .. FILE) then return "/" .. FILE end
  local cache = os.getenv("XDG_CACHE_HOME")
  if cache == nil or cache == "" then cache = (os.getenv("HOME") or "/tmp") .. "/.cache" end
  local root = cache .. "/moongrad/debs/python3-sklearn"
  if exists(root .. "/" .. FILE) then return root .. "/" .. FILE end
  io.stderr:write("python3-sklearn is not installed; fetching it into ", root, "\n")
  local tmp = root .. ".part"
  local ok = os.execute(("rm -rf %s && mkdir -p %s && cd %s && apt-get download -q python3-sklearn >&2 && "
                         .. "dpkg-deb -x python3-sklearn_*.deb root && rm -f python3-sklearn_*.deb && mv root %s")
                        :format(q(tmp), q(tmp), q(tmp), q(root)))
  os.execute("rm -rf " .. q(tmp))
  if not (ok and exists(root .. "/" .. FILE)) then
    error("python3-sklearn is not installed and apt-get download / dpkg-deb -x failed (see above)", 0)
  end
  return root .. "/" .. FILE
end

-- x (N, 64) float32 pixels 0..16 and y (N) int64 class numbers 1..10 (digit + 1)
local function load_digits ()
  if mg.data and mg.data.digits then return mg.data.digits() end       -- the data module, when built in
  local path, all = digits_path(), nil
  if mg.data and mg.data.read_csv then
    all = mg.data.read_csv(path)                                        -- zlib, in C
  else
    local p = assert(io.popen("gzip -dc " .. q(path)))                 -- else gzip and Lua's patterns
    local rows = {}
    for line in p:lines() do
      local row = {}
      for v in line:gmatch("[^,]+") do row[#row + 1] = tonumber(v) end
      if #row == 65 then rows[#rows + 1] = row end
    end
    p:close()
    all = mg.constant(rows, "float32")
  end
  return all:slice(nil, {1, 64}), mg.cast(all:slice(nil, 65), "int64") + 1
end

-- }=============================================================

local x, labels = load_digits()
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

-- bench/util.lua: what the benchmark scripts share (require "bench.util").
local util = {}

function util.median (xs)
  local s = {table.unpack(xs)}
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

--- the output of a shell command
function util.sh (cmd)
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  return out
end
local sh = util.sh

--- the CPU's model name and "AVX-512" or "AVX2"
function util.machine ()
  local model = sh("lscpu | sed -n 's/^Model name: *//p' | head -1"):gsub("%s+$", "")
  local isa = sh("grep -m1 -o -w avx512f /proc/cpuinfo"):match("avx512f") and "AVX-512" or "AVX2"
  return model, isa
end

--- The OpenBLAS core type whose kernels fit this CPU: SkylakeX where it
--- has AVX-512, Haswell where it has AVX2 only. Debian's OpenBLAS guesses
--- on its own (Prescott on one AVX-512 Xeon, Cooperlake on an AVX-512
--- EPYC), and a machine's environment may set OPENBLAS_CORETYPE for all
--- programs (Haswell on these machines, AVX-512 ones included: PyTorch's
--- products then run at half speed). bench/run.sh exports this for every
--- process it starts (moongrad, PyTorch, the raw libraries).
function util.openblas_core ()
  local _, isa = util.machine()
  return isa == "AVX-512" and "SkylakeX" or "Haswell"
end

--- bench/results/<model>-<isa>.md: this machine kind's section of RESULTS.md
function util.results_path ()
  local model, isa = util.machine()
  local slug = (model .. "-" .. isa):lower():gsub("[^%w]+", "-"):gsub("^%-+", ""):gsub("%-+$", "")
  return "bench/results/" .. slug .. ".md"
end

local GPT = {B = 32, T = 64, D = 256, H = 4, L = 4, V = 64}     -- bench/gpt.lua's SIZES

--- The bench's GPT (4 pre-norm blocks of width 256, batch 32 x 64; tiny when quick)
--- as an nn.Sequential, with random token ids and targets, and its sizes S.
function util.gpt (quick)
  local mg = require "moongrad"
  local nn = mg.nn
  local S = quick and {B = 2, T = 8, D = 16, H = 2, L = 2, V = 11} or GPT
  local layers = {nn.Embedding(S.V, S.D), nn.PositionalEmbedding(S.T)}
  for _ = 1, S.L do layers[#layers + 1] = nn.TransformerBlock(S.H, S.D, {causal = true}) end
  layers[#layers + 1] = nn.LayerNorm()
  layers[#layers + 1] = nn.Dense(S.V)
  local function tokens () return mg.cast(mg.random.uniform({S.B, S.T}, 1, S.V + 1) // 1, "int64") end
  return nn.Sequential(layers), tokens(), tokens(), S
end

--- bench/distributed.lua's and bench/overlap.lua's models: "cnn" (the
-- Fashion-MNIST CNN) or "gpt" (bench/gpt.lua's), built from seed 0
function util.dist_model (name)
  local mg = require "moongrad"
  local nn = mg.nn
  mg.random.seed(0)
  if name == "cnn" then
    return nn.Sequential{
      nn.Conv2D(32, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
      nn.Conv2D(64, 3, {padding = "same", activation = "relu"}), nn.MaxPool2D(2),
      nn.Flatten(), nn.Dense(128, "relu"), nn.Dense(10)}
  end
  return (util.gpt())
end

--- n random samples of the model's inputs and labels
function util.dist_data (name, n)
  local mg = require "moongrad"
  if name == "cnn" then
    return mg.random.uniform({n, 28, 28, 1}), mg.cast(mg.random.uniform({n}, 1, 11) // 1, "int64")
  end
  local ids = mg.cast(mg.random.uniform({n, GPT.T}, 1, GPT.V + 1) // 1, "int64")
  return ids, mg.cast(mg.random.uniform({n, GPT.T}, 1, GPT.V + 1) // 1, "int64")
end

return util

-- Let the library choose what to keep: mg.memory.plan fits a training step
-- into a memory budget at the least extra time, deciding for each stretch of
-- an nn.Sequential's layers to keep what they save, recompute it (all of it,
-- or a block's cheap ops with its products kept: "dots"), or spill it to
-- files; the plan prints as a table, runs with mg.memory.with_plan (the plain
-- step's gradients, to the bit) and saves to a file for later runs.
--   build/moongrad examples/memory_plan.lua [spill directory]   (default $TMPDIR or /tmp)
-- A small GPT (bench/gpt.lua's blocks): its step's peak, then plans at 60%
-- and 30% of it, recomputing only and with spilling allowed, each one run
-- for real and measured against its prediction; last, the same GPT as a
-- Layer subclass of its own, planned per layer call.
local mg = mg or require "moongrad"
local nn = mg.nn

local spill_dir = arg and arg[1] or os.getenv("TMPDIR") or "/tmp"
-- same bits need the same thread count: "auto" (the default) drops to one
-- thread while other processes hold the cores, and a product's sums change order
mg.set_num_threads((mg.get_num_threads()))
mg.random.seed(0)
local V, T, D = 64, 64, 128
local layers = {nn.Embedding(V, D), nn.PositionalEmbedding(T)}
for _ = 1, 6 do layers[#layers + 1] = nn.TransformerBlock(4, D, {causal = true}) end
layers[#layers + 1] = nn.LayerNorm()
layers[#layers + 1] = nn.Dense(V)
local model = nn.Sequential(layers)
local ids = mg.cast(mg.random.uniform({16, T}, 1, V + 1) // 1, "int64")
local targets = mg.cast(mg.random.uniform({16, T}, 1, V + 1) // 1, "int64")
model(ids)                                        -- builds the layers
local vars = model.trainable_variables

-- one step's gradients (an optimizer would apply them)
local function step ()
  local t = mg.tape()
  local loss = mg.losses.sparse_categorical_crossentropy(targets, model(ids), {from_logits = true})
  t:stop()
  return t:gradient(loss, vars)
end

-- the peak of one real run (a collection at every allocation: what the step holds)
local function measured (f, ...)
  local pause, min_bytes = mg.memory.setpause(100, 0)
  collectgarbage()
  mg.memory.reset_peak()
  local out = f(...)
  local peak = mg.memory.stats().peak_bytes
  mg.memory.setpause(pause, min_bytes)
  return peak, out
end

local function mib (b) return ("%.1f MiB"):format(b / 2^20) end
local function same_bits (a, b)
  for i = 1, #a do
    if mg.sum(mg.cast(mg.not_equal(a[i], b[i]), "int64")):item() ~= 0 then return false end
  end
  return true
end

local predicted = mg.memory.estimate(step).peak_bytes
local plain_peak, plain = measured(step)
print(("the plain step peaks at %s (%s predicted by mg.memory.estimate)"):format(mib(plain_peak), mib(predicted)))
-- (peaks count what is live: the plain gradients, kept to compare, from here on)

for _, frac in ipairs{0.6, 0.3} do
  for _, spill in ipairs{false, spill_dir} do
    local budget = math.floor(plain_peak * frac)
    local ok, plan = pcall(mg.memory.plan, step, {budget = budget, spill = spill or nil})
    print(("\n-- within %.0f%% of it (%s)%s"):format(frac * 100, mib(budget), spill and ", spilling allowed" or ""))
    if not ok then
      print(plan)                                 -- says what a plan could reach, and what to try
    else
      print(plan)
      local t0 = mg.clock()
      local peak, grads = measured(mg.memory.with_plan, plan, step)
      print(("ran it: peak %s (predicted %s), %.0f ms, gradients %s the plain step's"):format(mib(peak),
            mib(plan.peak_bytes), (mg.clock() - t0) * 1e3, same_bits(plain, grads) and "bit for bit" or "NOT"))
      grads = nil
      if spill then                               -- plan once, apply it in later runs
        local path = os.tmpname()
        plan:save(path)
        print(("saved to %s and loaded back: peak %s"):format(path, mib(mg.memory.load_plan(path, step).peak_bytes)))
        os.remove(path)
      end
    end
  end
end

-- The same GPT as a model of your own (a Layer subclass whose call runs a Lua
-- list of blocks): no Sequential to plan stretches of, so the planner decides
-- per layer call of the model (keep, recompute, dots, pack or spill each),
-- cheapest extra time per byte freed first, as few as fit.
local GPT = nn.Layer:subclass("GPT")
function GPT:init (blocks)
  self.embed, self.position = nn.Embedding(V, D), nn.PositionalEmbedding(T)
  self.blocks = {}
  for i = 1, blocks do self.blocks[i] = nn.TransformerBlock(4, D, {causal = true}) end
  self.norm, self.head = nn.LayerNorm(), nn.Dense(V)
end
function GPT:call (x)
  local h = self.position(self.embed(x))
  for _, block in ipairs(self.blocks) do h = block(h) end
  return self.head(self.norm(h))
end
model = GPT(6)
model(ids)
vars = model.trainable_variables
plain, plain_peak = nil, nil
plain_peak, plain = measured(step)
local budget = math.floor(plain_peak * 0.6)
local plan = mg.memory.plan(step, {budget = budget})
print(("\n-- a GPT class of its own (no Sequential), within 60%% of its peak (%s)"):format(mib(budget)))
print(plan)
local t0 = mg.clock()
local peak, grads = measured(mg.memory.with_plan, plan, step)
print(("ran it: peak %s (predicted %s), %.0f ms, gradients %s the plain step's"):format(mib(peak),
      mib(plan.peak_bytes), (mg.clock() - t0) * 1e3, same_bits(plain, grads) and "bit for bit" or "NOT"))

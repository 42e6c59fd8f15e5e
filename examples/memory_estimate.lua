-- Does checkpointing save memory here? Ask before running: mg.memory.estimate
-- runs a training step dry (no arithmetic, nothing changed) and gives its
-- peak and what makes it.
--   build/moongrad examples/memory_estimate.lua
-- A small GPT's step three ways: plain, each block under recompute_grad,
-- and the tape packing what it saves into bfloat16. Then one real step of
-- the cheapest, measured, to compare.
local mg = mg or require "moongrad"
local nn = mg.nn

mg.random.seed(0)
local V, T, D = 64, 64, 256
local blocks = {}
for i = 1, 4 do blocks[i] = nn.TransformerBlock(4, D, {causal = true}) end
local embed, pos, head = nn.Embedding(V, D), nn.PositionalEmbedding(T), nn.Sequential{nn.LayerNorm(), nn.Dense(V)}
local ids = mg.cast(mg.random.uniform({32, T}, 1, V + 1) // 1, "int64")
local xent = mg.losses.SparseCategoricalCrossentropy{from_logits = true}
local opt = mg.optim.AdamW{learning_rate = 3e-4}

local recomputed = {}
for i, b in ipairs(blocks) do recomputed[i] = mg.recompute_grad(function(h) return b(h) end) end

local function forward (how)
  local h = pos(embed(ids))
  for i, b in ipairs(blocks) do h = how == "recompute" and recomputed[i](h) or b(h) end
  return head(h)
end

local vars
local function step (how)
  local t = mg.tape()
  local logits = how == "bfloat16 hooks" and mg.saved_tensors_hooks("bfloat16", forward, how) or forward(how)
  local loss = xent(mg.reshape(ids, {-1}), mg.reshape(logits, {-1, V}))
  t:stop()
  opt:apply_gradients(t:gradient(loss, vars), vars)
end

forward("plain")                                  -- builds the layers
vars = {}
for _, l in ipairs{embed, pos, head, table.unpack(blocks)} do
  for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end
end
step("plain")                                     -- AdamW's slots exist, as in training

local MiB = 2 ^ 20
local best, best_how
print("| forward | predicted peak | the tapes at their most | predicted in |")
print("|---|---|---|---|")
for _, how in ipairs{"plain", "recompute", "bfloat16 hooks"} do
  local r = mg.memory.estimate(step, how)
  print(("| %s | %.1f MiB | %.1f MiB | %.1f ms |"):format(how, r.peak_bytes / MiB, r.peak_saved_bytes / MiB, r.seconds * 1e3))
  if not best or r.peak_bytes < best.peak_bytes then best, best_how = r, how end
end

print(("\nWhat makes the %s step's peak:\n"):format(best_how))
print(best)

local pause, min_bytes = mg.memory.setpause(100, 0)   -- the real step's own peak, garbage collected at once
collectgarbage()
mg.memory.reset_peak()
step(best_how)
mg.memory.setpause(pause, min_bytes)
print(("\nmeasured: %.1f MiB, predicted: %.1f MiB"):format(mg.memory.stats().peak_bytes / MiB, best.peak_bytes / MiB))

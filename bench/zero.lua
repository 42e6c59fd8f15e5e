-- bench/zero.lua: what a rank holds under ZeRO (mg.distributed.ShardedOptimizer)
-- against the replicated DistributedOptimizer, from the library's own byte
-- counters (mg.memory.stats()), for the GPT of bench/gpt.lua (AdamW).
--   mpirun -np 2 build/moongrad bench/zero.lua [quick]
-- (as root add --allow-run-as-root; --oversubscribe where ranks outnumber cores)
-- Rows per stage (0: replicated, 1, 2) and step (apply: tape:gradient, then
-- apply_gradients; minimize: the gradients sent during the backward, stage 2
-- keeping 1/N of them), on every rank: the optimizer's slots (bytes of m and
-- v), the bytes live between steps (weights, slots, a stage's shard copy of
-- its weights), what the step holds above them when the wrapped optimizer's
-- update starts (the gradients: whole, or stage 2's shard), and the peak of
-- a step from its start.
local mg = mg or require "moongrad"
local util = require "bench.util"

local dist = mg.distributed
local rank, size = dist.init()
local quick = arg and arg[1] == "quick"
mg.set_num_threads(1)

local function slot_bytes (inner)
  local n = 0
  for _, name in ipairs({"m", "v"}) do
    for _, t in pairs(inner[name]) do n = n + t:numel() * 4 end
  end
  return n
end

local rows = {}
for _, case in ipairs({{0, "apply"}, {1, "apply"}, {2, "apply"}, {0, "minimize"}, {1, "minimize"}, {2, "minimize"}}) do
  local stage, via = case[1], case[2]
  collectgarbage()
  collectgarbage()
  mg.random.seed(0)
  local model, ids, targets, S = util.gpt(quick)
  model(ids)
  local vars = model.trainable_variables
  local inner = mg.optim.AdamW{learning_rate = 1e-4}
  local held = 0                                             -- live bytes when the inner update starts
  local inner_apply = inner.apply_gradients
  inner.apply_gradients = function(self, ...)
    collectgarbage()
    held = mg.memory.stats().current_bytes
    return inner_apply(self, ...)
  end
  local opt = stage == 0 and dist.DistributedOptimizer(inner) or dist.ShardedOptimizer(inner, {stage = stage})
  local loss_fn = mg.losses.SparseCategoricalCrossentropy{from_logits = true}
  local update = 0                                           -- the update's own peak, above its start
  local function step ()
    local t = mg.tape()
    local loss = loss_fn(mg.reshape(targets, {-1}), mg.reshape(model(ids), {-1, S.V}))
    t:stop()
    if via == "minimize" then                              -- gradients sent (stage 2: kept 1/N) during the backward
      opt:minimize(loss, vars, t)
      update = nil
      return mg.memory.stats().peak_bytes
    end
    local grads = t:gradient(loss, vars)
    t, loss = nil, nil
    collectgarbage()
    local peak0, at = mg.memory.stats().peak_bytes, mg.memory.stats().current_bytes
    mg.memory.reset_peak()
    opt:apply_gradients(grads, vars)
    update = mg.memory.stats().peak_bytes - at
    mg.memory.reset_peak()
    return peak0
  end
  step()
  step()
  local pause, min_bytes = mg.memory.setpause(100, 0)      -- garbage collected at once: peaks as the liveness goes
  collectgarbage()
  collectgarbage()
  local before = mg.memory.stats().current_bytes
  mg.memory.reset_peak()
  local peak = math.max(step(), mg.memory.stats().peak_bytes)
  collectgarbage()
  collectgarbage()
  local live = mg.memory.stats().current_bytes
  mg.memory.setpause(pause, min_bytes)
  local params = 0
  for _, v in ipairs(vars) do params = params + v:value():numel() end
  rows[#rows + 1] = {stage = stage, via = via, held = held - before, params = params, slots = slot_bytes(inner), between = before, after = live, peak = peak,
                     update = update}
  model, opt, inner = nil, nil, nil
end

local function mib (b) return ("%.2f"):format(b / 2^20) end
local mine = {}
for _, r in ipairs(rows) do
  mine[#mine + 1] = ("| %d | %d | %s | %s | %s | %s | %s | %s | %s |"):format(rank, r.stage, r.via, mib(r.params * 4),
                     mib(r.slots), mib(r.after), mib(r.held), r.update and mib(r.update) or "-", mib(r.peak))
end
local text = table.concat(mine, "\n")
for r = 0, size - 1 do                                    -- rank by rank

  if r == rank then
    if r == 0 then
      local model, isa = util.machine()
      print(("### ZeRO on %d ranks of %s (%s), GPT %s, AdamW"):format(size, model, isa, quick and "(quick sizes)" or "4 x 256"))
      print()
      print("| rank | stage | step | weights MiB | slots MiB | live between steps MiB | held at the update MiB | "
            .. "update's own peak MiB | step peak MiB |")
      print("|---|---|---|---|---|---|---|---|---|")
    end
    print(text)
    io.stdout:flush()
  end
  dist.barrier()
end

-- A character-level GPT (makemore-style) trained on the English words of
-- Debian's wamerican package (/usr/share/dict/american-english, about
-- 104,000 words, one per line), compared with a counted bigram model.
--   build/moongrad examples/char_gpt.lua [--recompute] [--bf16] [--steps N] [--tiny]
-- Each word is a sequence "." w1 w2 ... wn, and the model predicts w1 ... wn
-- "." from it: the mean loss per predicted character (the end included) on
-- a seeded 90/10 split by word is the validation loss, for the bigram
-- (counts with add-one smoothing, not trained) and for the transformer: 4
-- pre-norm blocks of width 128 with 4 causal heads, learned positions, a
-- context of the longest word plus one. Batches hold words of one length
-- (sorted, then chunked; the order of the batches is shuffled each epoch),
-- so little is padding, and a mask keeps what is out of the loss.
-- --recompute runs each block under recompute_grad: the tape keeps the
-- blocks' inputs, and each block runs again for its gradient. Either way the
-- example first measures one training step both ways: what the tape holds,
-- the step's peak and its time. Then it trains, prints 20 sampled words, and
-- as its last line `val loss: X.XXXX (bigram Y.YYYY)`. --tiny is a smoke
-- test (2,000 words, a small model, a few steps). --bf16 runs each forward
-- and loss under mg.autocast("bfloat16"): the products in bfloat16 (oneDNN's
-- bfloat16 kernels where the CPU has them), the weights and their updates
-- in float32.
-- Without wamerican installed, mg.data fetches it with no root (apt-get
-- download + dpkg-deb -x into ~/.cache/moongrad/debs).
local mg = mg or require "moongrad"
local nn = mg.nn

local recompute, tiny, steps, bf16 = false, false, nil, false
local argv = arg or {}
local i = 1
while i <= #argv do
  local a = argv[i]
  if a == "--recompute" then recompute = true
  elseif a == "--tiny" then tiny = true
  elseif a == "--bf16" then bf16 = true
  elseif a == "--steps" then i = i + 1; steps = math.tointeger(tonumber(argv[i])) or error("--steps needs a number", 0)
  else error("unknown argument " .. a .. " (use --recompute, --bf16, --steps N, --tiny)", 0) end
  i = i + 1
end

-- {=========================== data ============================

local path = mg.data.debian_file("wamerican", "usr/share/dict/american-english")
local words = {}
for line in io.lines(path) do
  if line ~= "" then words[#words + 1] = line end
end

-- characters (UTF-8: "Ångström" has 8), token 1 the boundary "."
local chars, token_of, seqs = {"."}, {["."] = 1}, {}
local seen = {}
for _, w in ipairs(words) do
  for _, c in utf8.codes(w) do seen[utf8.char(c)] = true end
end
local sorted = {}
for c in pairs(seen) do if c ~= "." then sorted[#sorted + 1] = c end end
table.sort(sorted)
for _, c in ipairs(sorted) do chars[#chars + 1] = c; token_of[c] = #chars end
local V = #chars

mg.random.seed(2024)                                   -- the split, the weights, the samples
local order = mg.random.permutation(#words):totable()
if tiny then order = table.move(order, 1, 2000, 1, {}) end
local n_val = #order // 10
local train, val, longest = {}, {}, 0
for k, j in ipairs(order) do
  local s = {}
  for _, c in utf8.codes(words[j]) do s[#s + 1] = token_of[utf8.char(c)] end
  if #s > longest then longest = #s end
  if k <= n_val then val[#val + 1] = s else train[#train + 1] = s end
end
local T = longest + 1                                  -- "." and the word; the targets: the word and "."
print(("%d words (%d train, %d validation), %d characters, the longest word %d"):format(
  #order, #train, #val, V - 1, longest))

-- }=============================================================


-- {========================== bigram ===========================

-- counts of (previous, next) over the training words, add-one smoothed;
-- the validation loss: the mean of -log p(next | previous) over every
-- predicted character, the end included
local counts = {}
for a = 1, V do counts[a] = {}; for b = 1, V do counts[a][b] = 1 end end
for _, s in ipairs(train) do
  local prev = 1
  for k = 1, #s + 1 do
    local nxt = s[k] or 1
    counts[prev][nxt] = counts[prev][nxt] + 1
    prev = nxt
  end
end
local logp = {}
for a = 1, V do
  local total = 0
  for b = 1, V do total = total + counts[a][b] end
  logp[a] = {}
  for b = 1, V do logp[a][b] = math.log(counts[a][b] / total) end
end
local nll, n_pred = 0, 0
for _, s in ipairs(val) do
  local prev = 1
  for k = 1, #s + 1 do
    local nxt = s[k] or 1
    nll, n_pred, prev = nll - logp[prev][nxt], n_pred + 1, nxt
  end
end
local bigram = nll / n_pred
print(("bigram (counted): validation loss %.4f"):format(bigram))

-- }=============================================================


-- {========================= batches ===========================

-- words sorted by length (ties in the split's order), cut into batches of
-- `size` from the longest (the first may be smaller); each batch: x (B, L+1) inputs, y (B, L+1) targets, mask
-- (B, L+1) 1 where a target is real, for L its longest word
local function batches (set, size)
  local idx = {}
  for k = 1, #set do idx[k] = k end
  table.sort(idx, function(a, b)
    if #set[a] ~= #set[b] then return #set[a] < #set[b] end
    return a < b
  end)
  local out = {}
  for last = #idx, 1, -size do                       -- from the longest: a short batch at the start
    local first = math.max(1, last - size + 1)
    local L = #set[idx[last]]
    local x, y, m = {}, {}, {}
    for r = first, last do
      local s = set[idx[r]]
      local xr, yr, mr = {1}, {}, {}
      for k = 1, L + 1 do
        xr[k + 1] = k <= L and (s[k] or 1) or nil
        yr[k] = k <= #s and s[k] or 1
        mr[k] = k <= #s + 1 and 1 or 0
      end
      x[#x + 1], y[#y + 1], m[#m + 1] = xr, yr, mr
    end
    out[#out + 1] = {x = mg.constant(x, "int64"), y = mg.constant(y, "int64"), mask = mg.constant(m)}
  end
  return out
end

-- }=============================================================


-- {========================== model ============================

local width, blocks_n, heads, batch_size = 128, 4, 4, 64
if tiny then width, blocks_n, batch_size = 32, 2, 32 end
local blocks = {}
for k = 1, blocks_n do blocks[k] = nn.TransformerBlock(heads, width, {causal = true}) end
-- the same layers (the same variables) plain, and with every block under recompute_grad
local function model_of (wrap)
  local layers = {nn.Embedding(V, width), nn.PositionalEmbedding(T)}
  for k = 1, blocks_n do layers[#layers + 1] = wrap(blocks[k]) end
  layers[#layers + 1] = nn.LayerNorm()
  layers[#layers + 1] = nn.Dense(V)
  return layers
end
local layers = model_of(function(b) return b end)
local plain = nn.Sequential(layers)
local rlayers = model_of(mg.recompute_grad)
for k, l in ipairs(layers) do                        -- share all but the wrapped blocks
  if k <= 2 or k > 2 + blocks_n then rlayers[k] = l end
end
local recomputed = nn.Sequential(rlayers)

local train_batches, val_batches = batches(train, batch_size), batches(val, 256)
local function loss_of (model, b)
  return mg.mixed_precision.run(bf16 and "bfloat16", function()   -- products in bfloat16 with --bf16
    return mg.losses.sparse_categorical_crossentropy(b.y, model(b.x), {from_logits = true, mask = b.mask})
  end)
end
plain(train_batches[1].x)                            -- build the layers
local vars = plain.trainable_variables
local n_params = 0
for _, v in ipairs(vars) do n_params = n_params + v:numel() end
print(("GPT: %d blocks, width %d, %d heads, context %d, %d parameters"):format(blocks_n, width, heads, T, n_params))

-- }=============================================================


-- {===================== one step, both ways ===================

-- one step's forward and gradient on a batch of the longest words: what the
-- tape holds after the forward, the peak above what was live before, and
-- the time (the median of 3, after one to warm up)
local function step_measure (model, b)
  local old = mg.memory.setpause(100, 0)              -- exact peaks for the measure
  collectgarbage()
  mg.memory.reset_peak()
  local base = mg.memory.stats().current_bytes
  local t = mg.tape()
  local loss = loss_of(model, b)
  t:stop()
  local held = t:saved_bytes()
  local grads = t:gradient(loss, vars)
  local peak = mg.memory.stats().peak_bytes - base
  t, loss, grads = nil, nil, nil
  collectgarbage()
  mg.memory.setpause(old)
  local times = {}
  for k = 1, 4 do
    local t0 = mg.clock()
    local tk = mg.tape()
    local l = loss_of(model, b)
    tk:stop()
    tk:gradient(l, vars)
    times[k] = mg.clock() - t0
  end
  table.remove(times, 1)
  table.sort(times)
  return held, peak, times[2]
end

local longest_batch = train_batches[1]
local p_held, p_peak, p_time = step_measure(plain, longest_batch)
local r_held, r_peak, r_time = step_measure(recomputed, longest_batch)
local MiB = 2 ^ 20
print(("one step, %d words of %d characters: the tape holds %.1f MiB plain, %.1f MiB recomputed (%.1fx less)")
      :format(longest_batch.x.shape[1], longest_batch.x.shape[2] - 1, p_held / MiB, r_held / MiB, p_held / r_held))
print(("    the step peaks %.1f MiB plain, %.1f MiB recomputed (%.1fx less); it takes %.0f ms plain, %.0f ms recomputed (%.2fx)")
      :format(p_peak / MiB, r_peak / MiB, p_peak / r_peak, p_time * 1e3, r_time * 1e3, r_time / p_time))

-- }=============================================================


-- {========================= training ==========================

local model = recompute and recomputed or plain
local total = steps or (tiny and 20 or #train_batches)         -- one epoch
local schedule = mg.schedules.LinearWarmup{warmup_steps = math.min(100, total // 10 + 1),
  after = mg.schedules.CosineDecay{initial_learning_rate = 3e-3, decay_steps = total, alpha = 0.05}}
local opt = mg.optim.AdamW{learning_rate = schedule, weight_decay = 0.01}

-- the mean loss per predicted character over a set's batches
local function evaluate (set)
  for _, b in ipairs(blocks) do b.training = false end
  local sum, count = 0, 0
  for _, b in ipairs(set) do
    local n = mg.sum(b.mask):item()
    sum = sum + loss_of(plain, b):item() * n
    count = count + n
  end
  for _, b in ipairs(blocks) do b.training = true end
  return sum / count
end

print(("training %d steps of %d words%s%s"):format(total, batch_size,
      recompute and ", each block under recompute_grad" or "",
      bf16 and (", products in bfloat16 (%s)"):format(mg.autocast_isa() or "emulated: no bfloat16 instructions here") or ""))
local t0, step, running = mg.clock(), 0, nil
while step < total do
  local perm = mg.random.permutation(#train_batches):totable()
  for _, j in ipairs(perm) do
    if step >= total then break end
    local b = train_batches[j]
    local t = mg.tape()
    local loss = loss_of(model, b)
    t:stop()
    opt:apply_gradients(t:gradient(loss, vars), vars)
    step = step + 1
    local l = loss:item()
    running = running and 0.98 * running + 0.02 * l or l
    if step % 250 == 0 or step == total then
      print(("step %5d/%d  loss %.4f  %.0f s"):format(step, total, running, mg.clock() - t0))
    end
  end
end
print(("trained in %.0f s"):format(mg.clock() - t0))

-- }=============================================================


-- {========================= sampling ==========================

-- 20 words drawn one character at a time from the model's distribution
-- (conditioned on not ending at once: no empty words)
local not_end = {0}
for k = 2, V do not_end[k] = 1 end
not_end = mg.constant(not_end)
local function sample (n)
  for _, b in ipairs(blocks) do b.training = false end
  local seqs, done = {}, {}
  for r = 1, n do seqs[r] = {1} end
  for pos = 1, T - 1 do
    local logits = plain(mg.constant(seqs, "int64"))           -- (n, pos, V)
    local p = mg.softmax(logits:slice(nil, pos), -1)
    if pos == 1 then p = p * not_end; p = p / mg.sum(p, -1, true) end   -- a word has a first letter
    local c = mg.cumsum(p, 2)
    local u = mg.random.uniform({n, 1}, 0, 1)
    local next_ids = (mg.sum(mg.cast(mg.less(c, u), "int64"), 2) + 1):totable()
    for r = 1, n do
      seqs[r][pos + 1] = done[r] and 1 or math.min(next_ids[r], V)
      if seqs[r][pos + 1] == 1 then done[r] = true end
    end
  end
  local out = {}
  for r = 1, n do
    local w = {}
    for k = 2, #seqs[r] do
      if seqs[r][k] == 1 then break end
      w[#w + 1] = chars[seqs[r][k]]
    end
    out[r] = table.concat(w)
  end
  return out
end

print("20 sampled words: " .. table.concat(sample(20), " "))
local val_loss = evaluate(val_batches)
print(("val loss: %.4f (bigram %.4f)"):format(val_loss, bigram))

-- }=============================================================

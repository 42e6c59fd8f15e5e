-- bench/budget.lua: a training step under a memory budget (DTR) and under
-- mg.memory.plan's plan for the same budget, against the plain step, and a
-- sweep of time against budget with recompute_grad on every layer and
-- checkpoint_sequential as reference points, on bench/recompute.lua's two
-- chains (dense+tanh layers, MLP blocks), a narrow one and a GPT (bench/gpt.lua's
-- blocks, eight of them). The planner plans twice: recomputing only, and
-- allowed to spill to files in $TMPDIR (or /tmp) as well; and once more
-- with the same layers called from a model class of its own (no
-- Sequential: its heuristic per layer call, "planned per call").
--   build/moongrad bench/budget.lua [width] [batch] [layers] [repeats] [dir]
-- Budgets are given as fractions of the plain step's peak above the model
-- (activations, gradients, temporaries); a budget is that many bytes above
-- what is live before the step. Times are medians of `repeats` rounds, each
-- round running every configuration once (alternating), and the best round
-- (the least disturbed by other work on a shared machine); peaks are measured
-- in one more run with a collection at every allocation. Writes
-- dir/budget.txt (the tables, in Markdown; not .md, which bench/assemble.lua
-- takes for a machine's section) and dir/budget.svg (the plot); dir is
-- bench/results unless given. For a quick look at one case:
-- BUDGET_CHAINS=MLP (chains whose name starts so) and BUDGET_FRACTIONS=0.5,0.4.
local mg = mg or require "moongrad"
local util = require "bench.util"

local W = tonumber(arg and arg[1]) or 1024
local B = tonumber(arg and arg[2]) or 1024
local N = tonumber(arg and arg[3]) or 16
local REPEATS = tonumber(arg and arg[4]) or 3
local DIR = arg and arg[5] or "bench/results"
local FRACTIONS = {0.8, 0.6, 0.5, 0.4, 1 / 3, 0.3}
if os.getenv("BUDGET_FRACTIONS") then
  FRACTIONS = {}
  for f in os.getenv("BUDGET_FRACTIONS"):gmatch("[^,]+") do FRACTIONS[#FRACTIONS + 1] = assert(tonumber(f), f) end
end
local ONLY = os.getenv("BUDGET_CHAINS")
local SPILL = os.getenv("TMPDIR") or "/tmp"
local GPT = {B = 32, T = 64, D = 256, H = 4, L = 8, V = 64}

local now, median = mg.clock, util.median

-- the chain's layers called by a model of its own (no Sequential): what
-- mg.memory.plan plans per layer call
local OwnChain = mg.nn.Layer:subclass("OwnChain")
function OwnChain:init (layers) self.chain = layers end
function OwnChain:call (h)
  for _, l in ipairs(self.chain) do h = l(h) end
  return h
end

-- bench/recompute.lua's chains (layers, the input's width and the batch),
-- and a third where activations outweigh the weights: the dense chain at a
-- quarter of the width, four times the batch and twice the depth
local function chains ()
  mg.random.seed(1)
  local dense, blocks, narrow = {}, {}, {}
  for i = 1, N do
    dense[i] = mg.nn.Dense(W, {activation = "tanh"})
    blocks[i] = mg.nn.Sequential{mg.nn.Dense(W, {activation = "tanh"}), mg.nn.Dense(W // 4, {activation = "tanh"})}
  end
  for i = 1, 2 * N do narrow[i] = mg.nn.Dense(W // 4, {activation = "tanh"}) end
  local square = function(y) return mg.mean(y ^ 2) end
  -- the GPT, sized by W's ratio to the default (tiny in spec/38's run)
  local S, nn = GPT, mg.nn
  local D = math.max(8, S.D * W // 1024 // 8 * 8)
  local gpt = {nn.Embedding(S.V, D), nn.PositionalEmbedding(S.T)}
  for _ = 1, S.L do gpt[#gpt + 1] = nn.TransformerBlock(S.H, D, {causal = true}) end
  gpt[#gpt + 1] = nn.LayerNorm()
  gpt[#gpt + 1] = nn.Dense(S.V)
  local function ids () return mg.cast(mg.random.uniform({S.B, S.T}, 1, S.V + 1) // 1, "int64") end
  local targets = ids()
  local cross_entropy = function(y) return mg.losses.sparse_categorical_crossentropy(targets, y, {from_logits = true}) end
  return {{name = "dense+tanh", layers = dense, x = {B, W}, act = B * W, loss = square},
          {name = "MLP block (W/4 -> W -> W/4)", layers = blocks, x = {B, W // 4}, act = B * W, loss = square},
          {name = "narrow dense+tanh (W/4, 4B)", layers = narrow, x = {4 * B, W // 4}, act = B * W, loss = square},
          {name = ("GPT (%d blocks, width %d, batch %d x %d tokens)"):format(S.L, D, S.B, S.T), layers = gpt,
           x = ids(), act = S.B * S.T * D, loss = cross_entropy}}
end

-- one step: forward, backward, SGD; budget (bytes above the start) or nil
local function step (chain, run, budget)
  local was
  if budget then
    collectgarbage()
    was = mg.memory.budget(mg.memory.stats().current_bytes + budget)
  end
  local ok, err = pcall(function()
    local t = mg.tape()
    local loss = chain.loss(run(chain.x))
    t:stop()
    local grads = t:gradient(loss, chain.vars)
    for i, v in ipairs(chain.vars) do v:assign_sub(grads[i] * 1e-3) end
  end)
  if budget then mg.memory.budget(was) end
  if not ok then return nil, err end
  return true
end

-- the peak above the start, evictions and rebuilt ops of one step
local function measure (chain, run, budget)
  local old, oldmin = mg.memory.setpause(100, 0)
  collectgarbage()
  collectgarbage()
  mg.memory.reset_peak()
  local before = mg.memory.stats()
  local ok, err = step(chain, run, budget)
  local s = mg.memory.stats()
  mg.memory.setpause(old, oldmin)
  return {ok = ok, err = err, peak = s.peak_bytes - before.current_bytes,
          evictions = s.evictions - before.evictions,
          remats = s.rematerialisations - before.rematerialisations}
end

local model, isa = util.machine()
local lines, series = {}, {}
local function out (fmt, ...)
  local s = fmt:format(...)
  print(s)
  lines[#lines + 1] = s
end
out("%s, %s, %d threads; width %d, batch %d, %d layers; medians and best of %d alternating rounds",
    model, isa, mg.get_num_threads(), W, B, N, REPEATS)

for _, chain in ipairs(chains()) do
 if not ONLY or chain.name:sub(1, #ONLY) == ONLY then
  local layers = chain.layers
  if not mg.is_tensor(chain.x) then chain.x = mg.random.normal(chain.x) end
  do local y = chain.x for _, l in ipairs(layers) do y = l(y) end end     -- builds them
  chain.vars = {}
  for _, l in ipairs(layers) do for _, v in ipairs(l.trainable_variables) do chain.vars[#chain.vars + 1] = v end end
  local plain = function(h) for _, l in ipairs(layers) do h = l(h) end return h end
  local segments = math.max(1, math.floor(math.sqrt(#layers) + 0.5))
  local configs = {
    {name = "plain", run = plain},
    {name = "recompute_grad every layer", run = function(h) for _, l in ipairs(layers) do h = mg.recompute_grad(l)(h) end return h end},
    {name = ("checkpoint_sequential(%d)"):format(segments), run = function(h) return mg.nn.checkpoint_sequential(layers, segments, h) end},
  }
  local peak = measure(chain, plain).peak
  local infeasible = {}
  local model = mg.nn.Sequential(layers)             -- what mg.memory.plan plans
  local function sequential (h) return model(h) end
  local own = OwnChain(layers)
  local function per_call (h) return own(h) end
  for _, f in ipairs(FRACTIONS) do
    local budget = math.floor(peak * f)
    local m = measure(chain, plain, budget)
    if m.ok then
      configs[#configs + 1] = {name = ("budget %.2f x plain peak"):format(f), run = plain, budget = budget, frac = f, m = m}
    else
      infeasible[#infeasible + 1] = ("budget %.2f x plain peak (%.1f MiB): %s"):format(f, budget / 2^20,
        tostring(m.err):gsub("^[^:]*:%d+: ", ""))
    end
    -- the planner at the same budget (bytes above the start, as the
    -- budget's are), recomputing only, then allowed to spill
    for _, way in ipairs{{"planned", sequential}, {"planned, spilling", sequential, SPILL}, {"planned per call", per_call}} do
      collectgarbage()
      collectgarbage()
      local what, run, spill = way[1], way[2], way[3]
      local ok, plan = pcall(mg.memory.plan, function() return step(chain, run) end,
                             {budget = mg.memory.stats().current_bytes + budget, spill = spill})
      if ok then
        configs[#configs + 1] = {name = ("%s %.2f x plain peak"):format(what, f),
                                 planned = spill and "spill" or run == per_call and "calls" or "plan",
                                 run = function(h) return mg.memory.with_plan(plan, run, h) end}
      else
        infeasible[#infeasible + 1] = ("%s %.2f x plain peak (%.1f MiB): %s"):format(what, f, budget / 2^20,
          tostring(plan):gsub("^[^:]*:%d+: ", ""))
      end
    end
  end
  for _, c in ipairs(configs) do
    c.m = c.m or measure(chain, c.run, c.budget)
    step(chain, c.run, c.budget)                     -- warm up
    c.times = {}
  end
  for _ = 1, REPEATS do                              -- alternating rounds
    for _, c in ipairs(configs) do
      collectgarbage()
      local t0 = now()
      assert(step(chain, c.run, c.budget))
      c.times[#c.times + 1] = (now() - t0) * 1000
    end
  end
  out("")
  out("%s x%d, input %s (one activation %.1f MiB):", chain.name, #layers, table.concat(chain.x.shape, "x"),
      chain.act * 4 / 2^20)
  out("")
  out("| configuration | step ms | x plain | best ms | x plain | peak MiB | x plain | evictions | rebuilt ops |")
  out("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  local base = configs[1]
  base.ms, base.best = median(base.times), math.min(table.unpack(base.times))
  local bx, by, px, py, sx, sy, cx, cy = {}, {}, {}, {}, {}, {}, {}, {}
  for _, c in ipairs(configs) do
    c.ms, c.best = median(c.times), math.min(table.unpack(c.times))
    out("| %s | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f | %d | %d |", c.name, c.ms, c.ms / base.ms, c.best,
        c.best / base.best, c.m.peak / 2^20, c.m.peak / base.m.peak, c.m.evictions, c.m.remats)
    if c.budget then bx[#bx + 1], by[#by + 1] = c.m.peak / base.m.peak, c.ms / base.ms end
    if c.planned == "plan" then px[#px + 1], py[#py + 1] = c.m.peak / base.m.peak, c.ms / base.ms end
    if c.planned == "spill" then sx[#sx + 1], sy[#sy + 1] = c.m.peak / base.m.peak, c.ms / base.ms end
    if c.planned == "calls" then cx[#cx + 1], cy[#cy + 1] = c.m.peak / base.m.peak, c.ms / base.ms end
  end
  for _, why in ipairs(infeasible) do out("") out("infeasible: %s", why) end
  local short = chain.name:match("^[^(]+"):gsub("%s+$", "")
  if #bx > 0 then series[#series + 1] = {bx, by, label = short .. ": under a budget", style = "linespoints"} end
  if #px > 0 then series[#series + 1] = {px, py, label = short .. ": planned (mg.memory.plan)", style = "linespoints"} end
  if #sx > 0 then series[#series + 1] = {sx, sy, label = short .. ": planned, spilling", style = "linespoints"} end
  if #cx > 0 then series[#series + 1] = {cx, cy, label = short .. ": planned per call", style = "linespoints"} end
  for k = 2, 3 do
    local c = configs[k]
    series[#series + 1] = {{c.m.peak / base.m.peak}, {c.ms / base.ms}, label = short .. ": " .. c.name, style = "points"}
  end
 end
end

local f = assert(io.open(DIR .. "/budget.txt", "w"))
f:write("# bench/budget.lua\n\n", table.concat(lines, "\n"), "\n")
f:close()
series[#series + 1] = {path = DIR .. "/budget.svg",
  title = ("one training step against its peak (%s, %s, %d threads)"):format(model, isa, mg.get_num_threads()),
  xlabel = "peak / plain peak", ylabel = "step time / plain"}
local ok, err = pcall(mg.plot, table.unpack(series))
print(ok and ("wrote %s/budget.txt and %s/budget.svg"):format(DIR, DIR) or ("no plot: " .. tostring(err)))

-- bench/reversible.lua: what a deep chain of additive coupling layers
-- (y1 = x1 + f(x2), y2 = x2 + g(y1); f, g Dense + tanh on halves) holds,
-- by depth, four ways: separate reversible layers (one RevBlock per layer),
-- one RevBlock{num_layers = n}, recompute_grad around each layer, and the
-- plain tape. Also a training step's time and peak.
--   build/moongrad bench/reversible.lua [width] [batch] [depths] [repeats]
-- "held" is what the chain's forward pass leaves alive above the model and
-- the input (its output included), "tape" what t:saved_bytes() counts then,
-- "peak" the
-- step's highest point above the same start; every figure measured with a
-- collection before each allocation (mg.memory.setpause(100, 0)).
local mg = mg or require "moongrad"

local W = tonumber(arg and arg[1]) or 512
local B = tonumber(arg and arg[2]) or 1024
local DEPTHS = {}
for d in ((arg and arg[3]) or "2,4,8,16,32"):gmatch("%d+") do DEPTHS[#DEPTHS + 1] = tonumber(d) end
local REPEATS = tonumber(arg and arg[4]) or 3

local median = require("bench.util").median
local MiB = 2 ^ 20

local function model (n, x)
  mg.random.seed(1)
  local f, g = {}, {}
  for i = 1, n do
    f[i] = mg.nn.Dense(W // 2, {activation = "tanh"})
    g[i] = mg.nn.Dense(W // 2, {activation = "tanh"})
  end
  local separate, one = {}, mg.nn.RevBlock(f, g)
  for i = 1, n do separate[i] = mg.nn.RevBlock(f[i], g[i]) end
  local function plain_layer (i, h)
    local x1, x2 = h:slice(nil, {1, W // 2}), h:slice(nil, {W // 2 + 1, W})
    local y1 = x1 + f[i](x2)
    return mg.concat({y1, x2 + g[i](y1)}, -1)
  end
  one(x)                                              -- build f and g
  local vars = one.trainable_variables
  return vars, {
    {"separate reversible layers", function(h) for i = 1, n do h = separate[i](h) end return h end},
    {"one RevBlock", function(h) return one(h) end},
    {"recompute_grad each layer", function(h)
      for i = 1, n do h = mg.recompute_grad(function(v) return plain_layer(i, v) end)(h) end
      return h
    end},
    {"plain tape", function(h) for i = 1, n do h = plain_layer(i, h) end return h end},
  }
end

local function settled ()
  collectgarbage()
  collectgarbage()
  return mg.memory.stats()
end

-- held after the forward pass, the tape's bytes, the step's peak
local function measure (run, x, vars)
  local old, oldmin = mg.memory.setpause(100, 0)
  local base = settled()
  mg.memory.reset_peak()
  local t = mg.tape()
  local y = run(x)
  local after = settled()                           -- the chain's forward pass, its output alive
  local held, tape = after.current_bytes - base.current_bytes, t:saved_bytes()
  local loss = mg.mean(y ^ 2)
  t:stop()
  local grads = t:gradient(loss, vars)
  local peak = mg.memory.stats().peak_bytes - base.current_bytes
  grads, y, loss, t = nil, nil, nil, nil
  mg.memory.setpause(old, oldmin)
  return held, tape, peak
end

local function step (run, x, vars)
  local t = mg.tape()
  local loss = mg.mean(run(x) ^ 2)
  t:stop()
  local grads = t:gradient(loss, vars)
  for i, v in ipairs(vars) do v:assign_sub(grads[i] * 1e-4) end
end

print(("%s, %d threads; width %d, batch %d: one activation %.1f MiB; medians of %d steps"):format(
  mg.version, mg.get_num_threads(), W, B, B * W * 4 / MiB, REPEATS))
print(("%-28s %6s %10s %10s %10s %10s"):format("", "depth", "held MiB", "tape MiB", "peak MiB", "step ms"))
mg.random.seed(2)
local x = mg.random.normal{B, W}
for _, n in ipairs(DEPTHS) do
  local vars, runs = model(n, x)
  for _, r in ipairs(runs) do
    local name, run = r[1], r[2]
    step(run, x, vars)                                -- build, warm up
    local held, tape, peak = measure(run, x, vars)
    local times = {}
    for k = 1, REPEATS do
      collectgarbage()
      local t0 = mg.clock()
      step(run, x, vars)
      times[k] = (mg.clock() - t0) * 1000
    end
    print(("%-28s %6d %10.1f %10.1f %10.1f %10.1f"):format(name, n, held / MiB, tape / MiB, peak / MiB, median(times)))
  end
end

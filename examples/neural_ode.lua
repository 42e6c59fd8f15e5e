-- A neural ODE integrated over 1,000 RK4 steps and trained through
-- mg.checkpoint_loop with 10 snapshots (Griewank's Revolve): the gradient
-- holds 10 states of the integrator instead of every step's activations.
--
--   build/moongrad examples/neural_ode.lua [iterations=40]
--
-- The data are trajectories of a damped spiral, dx/dt = x A (x in R^2),
-- observed every 100 steps; the model is dx/dt = tanh(x W1 + b1) W2 + b2.
-- The state carried through the loop is {x = the points, loss = the squared
-- error summed at the observations so far}. Before training, one step is
-- measured both ways: the memory the tape holds, the peak of the step, the
-- steps run, and the gradients (equal bit for bit).
local mg = require "moongrad"

local iterations = tonumber(arg and arg[1]) or 40
local N, K, DT, EVERY = 1000, 10, 0.01, 100
local B, H = 64, 64
mg.random.seed(2021)

-- {========================== the data ==========================

local A = mg.constant({{-0.1, -1.0}, {1.0, -0.1}})            -- a damped spiral
local function rk4 (f, x, h)
  local k1 = f(x)
  local k2 = f(x + k1 * (h / 2))
  local k3 = f(x + k2 * (h / 2))
  local k4 = f(x + k3 * h)
  return x + (k1 + k2 * 2 + k3 * 2 + k4) * (h / 6)
end

local x0 = mg.random.uniform({B, 2}, -2, 2)
local observed = {}
do
  local x = x0
  for i = 1, N do
    x = rk4(function(z) return mg.matmul(z, A) end, x, DT)
    if i % EVERY == 0 then observed[i] = x end
  end
end

-- }=============================================================


-- {========================== the model =========================

local W1 = mg.Variable(mg.random.normal({2, H}, 0, 0.5), {name = "W1"})
local b1 = mg.Variable(mg.zeros{H}, {name = "b1"})
local W2 = mg.Variable(mg.random.normal({H, 2}, 0, 0.1), {name = "W2"})
local b2 = mg.Variable(mg.zeros{2}, {name = "b2"})
local vars = {W1, b1, W2, b2}

local function field (x) return mg.matmul(mg.tanh(mg.matmul(x, W1) + b1), W2) + b2 end

-- one step of the loop: x one RK4 step on, the error added at observations
local function step (s, i)
  local x = rk4(field, s.x, DT)
  local loss = s.loss
  if observed[i] then loss = loss + mg.mean((x - observed[i]) ^ 2) end
  return {x = x, loss = loss}
end

local function start () return {x = x0, loss = mg.zeros{}} end

-- the loss and its gradients, through the loop or the plain tape
local function loss_and_gradients (checkpointed, stats)
  local t = mg.tape()
  local s
  if checkpointed then
    s = mg.checkpoint_loop(step, start(), N, {snapshots = K, stats = stats})
  else
    s = start()
    for i = 1, N do s = step(s, i) end
  end
  local loss = s.loss / (N // EVERY)
  t:stop()
  local held = t:saved_bytes()
  return loss, t:gradient(loss, vars), held
end

-- }=============================================================


-- {====================== one step, both ways ===================

local MiB = 1024 * 1024
-- one step; with exact, a collection at every allocation, so that the peak
-- is what the step needs, not what garbage waiting for the collector adds
-- (a step makes tens of thousands of temporaries: plainly the collector's
-- pacing lets some MiB of them wait)
local function measure (checkpointed, exact)
  collectgarbage()
  collectgarbage()
  local pause, min_bytes
  if exact then pause, min_bytes = mg.memory.setpause(100, 0) end
  local base = mg.memory.stats().current_bytes
  mg.memory.reset_peak()
  local stats = {}
  local t0 = mg.clock()
  local loss, grads, held = loss_and_gradients(checkpointed, stats)
  local seconds = mg.clock() - t0
  local peak = mg.memory.stats().peak_bytes - base
  if exact then mg.memory.setpause(pause, min_bytes) end
  return {loss = loss, grads = grads, held = held, peak = peak, seconds = seconds, stats = stats}
end

-- three runs each, alternating; times are medians
local runs = {[false] = {}, [true] = {}}
for _ = 1, 3 do
  for _, checkpointed in ipairs{false, true} do table.insert(runs[checkpointed], measure(checkpointed)) end
end
local function median_time (list)
  local ts = {}
  for i, r in ipairs(list) do ts[i] = r.seconds end
  table.sort(ts)
  return ts[(#ts + 1) // 2]
end
local plain, ck = runs[false][1], runs[true][1]
plain.seconds, ck.seconds = median_time(runs[false]), median_time(runs[true])
plain.peak, ck.peak = measure(false, true).peak, measure(true, true).peak
local same = plain.loss:item() == ck.loss:item()
for q = 1, #vars do same = same and mg.max(mg.abs(plain.grads[q] - ck.grads[q])):item() == 0 end

print(("%d RK4 steps, batch %d, hidden %d, %d snapshots"):format(N, B, H, K))
print(("held by the tape after the forward: plain %.2f MiB, checkpoint_loop %.3f MiB (%.0fx less)")
      :format(plain.held / MiB, ck.held / MiB, plain.held / ck.held))
print(("peak of a training step above the start (a collection at every allocation): " ..
       "plain %.2f MiB, checkpoint_loop %.2f MiB")
      :format(plain.peak / MiB, ck.peak / MiB))
print(("steps run: plain %d forward; checkpoint_loop %d forward + %d re-run + %d taped " ..
       "(Revolve's minimum for n = %d, k = %d: %d re-run)")
      :format(N, N, ck.stats.recomputed, ck.stats.taped, N, K, mg.checkpoint_loop.recomputed_steps(N, K)))
print(("time of a step (median of 3): plain %.3f s, checkpoint_loop %.3f s (%.2fx)")
      :format(plain.seconds, ck.seconds, ck.seconds / plain.seconds))
print("gradients equal bit for bit: " .. tostring(same))

-- }=============================================================


-- {=========================== training =========================

local opt = mg.optim.Adam{learning_rate = 0.02}
local first = plain.loss:item()
for it = 1, iterations do
  local loss, grads = loss_and_gradients(true)
  opt:apply_gradients(grads, vars)
  if it == 1 or it % 10 == 0 or it == iterations then
    print(("iteration %3d  loss %.5f"):format(it, loss:item()))
  end
end
print(("loss: %.5f -> %.5f"):format(first, loss_and_gradients(true):item()))

-- }=============================================================

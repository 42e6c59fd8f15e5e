-- Freeing tensors at a known point: mg.tidy and mg.dispose (TF.js's).
-- A training step makes many temporaries; the collector finds most of
-- them (the pacing of mg.memory), but a tensor that lived across several
-- ops has grown old and waits for a full collection. mg.tidy(fn) releases
-- everything fn made but its results when fn returns, so each step ends
-- with only the model and what it returned.
--   build/moongrad examples/tidy_training.lua [steps]
local mg = mg or require "moongrad"

local steps = tonumber(arg and arg[1]) or 20
local x, y = mg.random.normal{256, 128}, mg.random.normal{256, 10}

-- the same model, from the same weights, for each way of training
local function fresh ()
  mg.random.seed(1)
  local model = mg.nn.Sequential{mg.nn.Dense(512, {activation = "tanh"}), mg.nn.Dense(512, {activation = "tanh"}),
                                 mg.nn.Dense(10)}
  model(x)
  return model, model.trainable_variables
end

local model, vars
local function step ()
  local t = mg.tape()
  local loss = mg.mean((model(x) - y) ^ 2)
  t:stop()
  local grads = t:gradient(loss, vars)
  for i, v in ipairs(vars) do v:assign_sub(grads[i], 0.05) end
  return loss:item()                          -- a number: nothing of the step is kept
end

-- runs the steps, each through `run`; the loss, the peak above the model
-- and what stays after them (bytes besides the variables), and the collections
local function train (run)
  model, vars = fresh()
  collectgarbage()
  collectgarbage()
  local s0 = mg.memory.stats()
  mg.memory.reset_peak()
  local loss
  for _ = 1, steps do loss = run(step) end
  local s1 = mg.memory.stats()
  return loss, s1.peak_bytes - s0.current_bytes, s1.tensor_bytes + s1.saved_bytes,
         s1.full_collections - s0.full_collections
end

local function show (name, loss, peak, left, fulls)
  print(("%-22s loss %.4f  peak %6.2f MiB  left after %6.2f MiB  full collections %d"):format(
    name, loss, peak / 2^20, left / 2^20, fulls))
end

show("collector only", train(function(f) return f() end))
show("each step in mg.tidy", train(mg.tidy))

-- mg.dispose: a tensor you are done with goes now (the tape that saved it,
-- or a view of it, keeps it: gradients never change)
local big = mg.ones{1024, 1024}
local before = mg.memory.stats().tensor_bytes
mg.dispose(big)
print(("dispose freed %.2f MiB at once; using the box now: %s"):format(
  (before - mg.memory.stats().tensor_bytes) / 2^20, select(2, pcall(function() return big + 1 end))))

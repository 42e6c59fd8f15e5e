-- examples/reversible_flow.lua: a small normalising flow (RealNVP/Glow:
-- affine couplings between invertible 1x1 channel mixes) fitted to two
-- moons by maximum likelihood, then what its tape holds at 4 and 32 layers.
--   build/moongrad examples/reversible_flow.lua [steps]
-- The flow maps data x to z = flow(x) with log p(x) = log N(z; 0, I) +
-- log|det dz/dx|; each layer adds its log-determinant to a running one.
-- Every layer is reversible, so the chain keeps only its last outputs, at
-- any depth: the backward pass rebuilds each layer's inputs with inverse().
local mg = mg or require "moongrad"
local nn = mg.nn

local STEPS = tonumber(arg and arg[1]) or 1500
mg.set_num_threads(1)          -- (256, 64) products: a second thread costs more than it gives

-- {======================== the data =========================

-- n points of scikit-learn's make_moons (noise 0.08), standardised
local function two_moons (n)
  local pts = {}
  local u = mg.random.uniform({n}, 0, math.pi, "float64"):totable()
  local e = mg.random.normal({n, 2}, 0, 0.08, "float64"):totable()
  for i = 1, n do
    local t = u[i]
    if i % 2 == 1 then pts[i] = {math.cos(t) + e[i][1], math.sin(t) + e[i][2]}
    else pts[i] = {1 - math.cos(t) + e[i][1], 0.5 - math.sin(t) + e[i][2]} end
  end
  local x = mg.constant(pts)
  return (x - mg.mean(x, 1)) / mg.std(x, 1)
end

-- }============================================================

-- {======================== the flow =========================

-- n layers: invertible linear, affine coupling, alternately; each coupling's
-- net starts at zero, so the flow starts as a rotation
local function flow (n)
  local layers = {}
  for i = 1, n do
    if i % 2 == 1 then
      layers[i] = nn.InvertibleLinear()
    else
      local out = nn.Dense(2)
      layers[i] = nn.AffineCoupling(nn.Sequential{nn.Dense(64, "tanh"), nn.Dense(64, "tanh"), out},
                                    {swap = i % 4 == 0})
      layers[i].zero = out
    end
  end
  return layers
end

local LOG_2PI = math.log(2 * math.pi)

-- the mean negative log-likelihood of x (N, 2) under the flow
local function nll (layers, x, plainly)
  local h, logdet = x, mg.zeros{x.shape[1]}
  for _, l in ipairs(layers) do
    if plainly then h, logdet = l:forward(h, logdet)      -- the same ops, without the trick
    else h, logdet = l(h, logdet) end
  end
  local log_pz = -0.5 * mg.sum(h * h, 2) - LOG_2PI
  return -mg.mean(log_pz + logdet)
end

-- }============================================================

mg.random.seed(0)
local layers = flow(16)
local data = two_moons(2048)
nll(layers, data)                                          -- build
for _, l in ipairs(layers) do
  if l.zero then l.zero.kernel:assign(mg.zeros_like(l.zero.kernel)) end
end
local vars = {}
for _, l in ipairs(layers) do
  for _, v in ipairs(l.trainable_variables) do vars[#vars + 1] = v end
end

local opt = mg.optim.Adam{learning_rate = 3e-3}
print(("fitting a flow of %d layers to two moons (%d points), %d steps"):format(#layers, data.shape[1], STEPS))
local batch = 256
for step = 1, STEPS do
  local idx = mg.random.permutation(data.shape[1]):slice({1, batch})
  local x = mg.gather(data, idx, 1)
  local t = mg.tape()
  local loss = nll(layers, x)
  t:stop()
  opt:apply_gradients(t:gradient(loss, vars), vars)
  if step == 1 or step % (STEPS // 6) == 0 or step == STEPS then
    print(("step %5d  negative log-likelihood %.4f"):format(step, nll(layers, data):item()))
  end
end

-- rebuilding x from z: the inverse of the whole flow
local z, logdet = data, mg.zeros{data.shape[1]}
for _, l in ipairs(layers) do z, logdet = l(z, logdet) end
local back = z
for i = #layers, 1, -1 do back = layers[i]:inverse(back) end
print(("x rebuilt from z by the inverses: max error %.2g"):format(mg.max(mg.abs(back - data)):item()))

-- what a step holds: the tape's bytes after the forward pass, a batch of 65536
print("held by the tape after the forward pass (batch 8192; one activation = 64 KiB):")
local big = two_moons(8192)
for _, depth in ipairs({4, 32}) do
  mg.random.seed(1)
  local deep = flow(depth)
  nll(deep, big)                                           -- build
  local line = ("  %2d layers:"):format(depth)
  for _, plainly in ipairs({false, true}) do
    local t = mg.tape()
    local loss = nll(deep, big, plainly)
    t:stop()
    collectgarbage()
    collectgarbage()
    line = line .. ("  %s %8.1f KiB"):format(plainly and "plain tape" or "reversible", t:saved_bytes() / 1024)
    loss = nil
  end
  print(line)
end

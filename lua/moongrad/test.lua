--- moongrad.test: checking gradients against finite differences.
-- @module moongrad.test
local mg = require "moongrad"

local M = {}

local function is_float64 (x)
  return (mg.is_tensor(x) or mg.is_variable(x)) and x.dtype == "float64"
end

-- the tensors among f's inputs that gradients are checked for
local function checked_inputs (inputs)
  local list = {}
  for i, x in ipairs(inputs) do
    if mg.is_tensor(x) or mg.is_variable(x) then
      if x.dtype == "float32" then
        error(("gradcheck: input %d is float32; finite differences need float64 "
               .. "(use mg.cast(x, 'float64'))"):format(i), 3)
      end
      if is_float64(x) then list[#list + 1] = i end
    end
  end
  return list
end

-- a fixed random projection w, drawn without disturbing the global stream
local function projection (y, seed)
  local saved = mg.random.get_state()
  mg.random.seed(seed)
  local w = mg.random.normal(y.shape, 0, 1, "float64")
  mg.random.set_state(saved)
  return w
end

-- inputs with element k of input i moved by delta
local function nudged (inputs, i, k, delta)
  local x = inputs[i]
  local flat = mg.reshape(x, {-1}):totable()
  flat[k] = flat[k] + delta
  local copy = {}
  for j, v in ipairs(inputs) do copy[j] = v end
  copy[i] = mg.reshape(mg.constant(flat, "float64"), x.shape)
  return copy
end

local function scalar (f, inputs, w)
  local y = f(table.unpack(inputs, 1, inputs.n or #inputs))
  return mg.sum(y * w):item()
end

--- Checks the tape's gradients of f at inputs against central differences.
-- f maps the inputs (float64 tensors; others are passed through) to one
-- tensor y. Both sides differentiate sum(y * w) for a fixed random w, which
-- checks every entry of the jacobian in one backward pass.
-- @param f function
-- @param inputs list of inputs
-- @param opts {eps=1e-6, atol=1e-6, rtol=1e-4, seed=1}
-- @return true, or raises naming the input, element and both values
function M.gradcheck (f, inputs, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-6, opts.rtol or 1e-4
  assert(type(inputs) == "table", "gradcheck: inputs must be a list of tensors")
  local which = checked_inputs(inputs)
  local t = mg.tape()
  for _, i in ipairs(which) do t:watch(inputs[i]) end
  local y = f(table.unpack(inputs, 1, inputs.n or #inputs))
  t:stop()
  if not mg.is_tensor(y) then error("gradcheck: f must return a tensor, got " .. type(y), 2) end
  if y.dtype ~= "float64" then error("gradcheck: f must return float64, got " .. y.dtype, 2) end
  local w = projection(y, opts.seed or 1)
  local sources = {}
  for n, i in ipairs(which) do sources[n] = inputs[i] end
  local grads = t:gradient(y, sources, w, {unconnected = "zero"})
  for n, i in ipairs(which) do
    local analytic = mg.reshape(grads[n], {-1}):totable()
    for k = 1, #analytic do
      local up = scalar(f, nudged(inputs, i, k, eps), w)
      local down = scalar(f, nudged(inputs, i, k, -eps), w)
      local numeric = (up - down) / (2 * eps)
      if math.abs(analytic[k] - numeric) > atol + rtol * math.abs(numeric) then
        error(("gradcheck: input %d, element %d: tape gives %.10g, finite differences %.10g")
              :format(i, k, analytic[k], numeric), 2)
      end
    end
  end
  return true
end

return M

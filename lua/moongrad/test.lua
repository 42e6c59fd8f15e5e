--- moongrad.test: checking gradients against finite differences.
-- @module moongrad.test
local mg = require "moongrad"
local check = require "moongrad.check"

local fail = check.fail

local M = {}

local function is_float64 (x)
  return (mg.is_tensor(x) or mg.is_variable(x)) and x.dtype == "float64"
end

-- the number of inputs: a list, or table.pack's n (then nil inputs may be among them)
local function count_inputs (inputs)
  if type(inputs) ~= "table" or check.kind(inputs) ~= "a table" then
    fail("gradcheck", "inputs must be a list of tensors, got %s", check.show(inputs))
  end
  local n = inputs.n
  if n == nil then return check.list("gradcheck", inputs, "the list of inputs", "input %d") end
  check.value("gradcheck", "inputs.n", n, check.rule("an integer >= 0",
              function(v) return math.type(v) == "integer" and v >= 0 end))
  for k in pairs(inputs) do
    if k ~= "n" and not (math.type(k) == "integer" and k >= 1 and k <= n) then
      fail("gradcheck", "the list of inputs has a key %s outside 1..n (n = %d)", check.show(k), n)
    end
  end
  return n
end

-- the tensors among f's inputs that gradients are checked for
local function checked_inputs (inputs, n)
  local list = {}
  for i = 1, n do
    local x = inputs[i]
    if check.is_array(x) then
      if x.dtype == "float32" then
        fail("gradcheck", "input %d is float32; finite differences need float64 (use mg.cast(x, 'float64'))", i)
      end
      if is_float64(x) then list[#list + 1] = i end
    end
  end
  if #list == 0 then
    fail("gradcheck", "no float64 tensor among the inputs; there is nothing to check (use mg.cast(x, 'float64'))")
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
  for j = 1, inputs.n do copy[j] = inputs[j] end
  copy.n = inputs.n
  copy[i] = mg.reshape(mg.constant(flat, "float64"), x.shape)
  return copy
end

local function scalar (f, inputs, w)
  local y = f(table.unpack(inputs, 1, inputs.n))
  return mg.sum(y * w):item()
end

local OPTIONS = {{"eps", check.positive, 1e-6}, {"atol", check.nonnegative, 1e-6},
                 {"rtol", check.nonnegative, 1e-4}, {"seed", check.integer, 1}}

--- Checks the tape's gradients of f at inputs against central differences.
-- f maps the inputs (float64 tensors; others are passed through) to one
-- tensor y. Both sides differentiate sum(y * w) for a fixed random w, which
-- checks every entry of the jacobian in one backward pass. Differences
-- within the rounding of the finite differences themselves (16 ulps of
-- sum(|y * w|), over 2 eps) pass, so large outputs do not fail a right tape.
-- @param f function
-- @param inputs list of inputs
-- @param opts {eps=1e-6, atol=1e-6, rtol=1e-4, seed=1}: eps > 0; atol, rtol >= 0
-- (a zero tolerance is a legitimate choice, as in numpy's allclose)
-- @return true, or raises naming the input, element and both values
function M.gradcheck (f, inputs, opts)
  check.value("gradcheck", "f", f, check.callable)
  local n = count_inputs(inputs)
  opts = check.options("gradcheck", opts, OPTIONS)
  local eps, atol, rtol = opts.eps, opts.atol, opts.rtol
  inputs = table.move(inputs, 1, n, 1, {n = n})
  local which = checked_inputs(inputs, n)
  local t = mg.tape()
  for _, i in ipairs(which) do t:watch(inputs[i]) end
  local y = f(table.unpack(inputs, 1, n))
  t:stop()
  if not mg.is_tensor(y) then fail("gradcheck", "f must return a tensor, got %s", check.kind(y)) end
  if y.dtype ~= "float64" then fail("gradcheck", "f must return float64, got %s", y.dtype) end
  local w = projection(y, opts.seed)
  local sources = {}
  for n, i in ipairs(which) do sources[n] = inputs[i] end
  local grads = t:gradient(y, sources, w, {unconnected = "zero"})
  -- what central differences cannot resolve: f's value is rounded to a few
  -- ulps of its size, and the difference divides that by 2 eps (an output
  -- of 1e5 leaves about 1e-4 of noise at eps = 1e-6)
  local floor = 16 * 2^-52 * mg.sum(mg.abs(y * w)):item() / (2 * eps)
  for n, i in ipairs(which) do
    local analytic = mg.reshape(grads[n], {-1}):totable()
    for k = 1, #analytic do
      local up = scalar(f, nudged(inputs, i, k, eps), w)
      local down = scalar(f, nudged(inputs, i, k, -eps), w)
      local numeric = (up - down) / (2 * eps)
      if math.abs(analytic[k] - numeric) > atol + rtol * math.abs(numeric) + floor then
        fail("gradcheck", "input %d, element %d: tape gives %.10g, finite differences %.10g",
             i, k, analytic[k], numeric)
      end
    end
  end
  return true
end

return check.export(M)          -- errors name the user's line (moongrad.check)

-- Q (silently wrong, both builds): oneDNN's float32 weight gradient of a 1x1
-- convolution with strides above 1 and fewer input channels than its block
-- (jit_1x1's reduce-to-unit-stride copy, uxlfoundation/oneDNN#6035) wrote
-- past its workspace: dw wrong, different from run to run (the fuzzer saw a
-- gradient of a gradient change between two identical runs).
local x = mg.random.normal({4, 3, 4, 1}, 0, 1, 'float64')
local w = mg.random.normal({1, 1, 1, 1}, 0, 1, 'float64')
local function dw (x0, w0)
  local xv, wv = mg.Variable(x0), mg.Variable(w0)
  local t = mg.tape()
  local y = mg.conv2d(xv, wv, {strides = {1, 2}, padding = "same"})
  local l = mg.sum(y * y)
  t:stop()
  return t:gradient(l, wv)
end
local want = dw(x, w):item()
for _ = 1, 5 do
  local got = dw(mg.cast(x, 'float32'), mg.cast(w, 'float32')):item()
  print("dw", got, want)
  if math.abs(got - want) > 1e-4 * (1 + math.abs(want)) then
    io.stderr:write("FUZZ-WRONG: conv2d-weight-gradient (", got, " vs ", want, ")\n")
  end
end

--- moongrad.help_entries: what help(name) prints below an entry's line: its
-- arguments, what it returns and an example, by entry name (the names of
-- lua/moongrad/help.lua). args: {{name, what [, default]}, ...}, {} for none;
-- example: Lua run with mg bound to require "moongrad", where `expr --> text`
-- shows what the REPL prints for expr (spec/52-help_entries_spec.lua runs
-- every example and checks each `-->`).
local D = {}

local function E (name, args, returns, example)
  assert(not D[name], name)
  D[name] = {args = args, returns = returns, example = example}
end

-- the arguments many entries share
local X = {"x", "a tensor (or a number, or a nested table of numbers)"}
local A = {"a", "a tensor or a number"}
local B = {"b", "a tensor or a number, broadcasting against a"}
local DTYPE = {"dtype", "float32 float64 float16 bfloat16 int64 or bool", "\"float32\""}
local FDTYPE = {"dtype", "a float dtype: float32 float64 float16 bfloat16", "\"float32\""}
local SHAPE = {"shape", "the sizes: a table {2, 3} or integers 2, 3"}
-- mg.random's shapes: as mg.zeros', but numbers after a table are the draw's
-- parameters (normal({2, 3}, 0, 0.1)), numbers first all sizes (normal(2, 3))
local RSHAPE = {"shape", "a table {2, 3} (then mean/low and stddev/high may follow) or integers 2, 3 (every number a size)"}
local AXES = {"axis", "a 1-based axis (negative from the end), or a table of axes; nil for all", "nil"}
local KEEP = {"keepdims", "true keeps reduced axes with size 1", "false"}
local FN = {"fn", "a function"}
local ARGS = {"...", "fn's arguments"}
local OPTS = {"opts", "a table of options, as in the signature", "{}"}
local PATH = {"path", "a file's path"}
local YT = {"y_true", "the targets, a tensor"}
local YP = {"y_pred", "the predictions, a tensor shaped like y_true"}
local MODEL = {"model", "a layer or model"}

-- elementwise ops: one tensor in, one of its shape out
local function unary (name, example, returns)
  E(name, {X}, returns or "a tensor shaped like x", example)
end

-- elementwise ops of two operands that broadcast
local function binary (name, example, returns)
  E(name, {A, B}, returns or "a tensor of the broadcast shape (a number takes the tensor's dtype)", example)
end

local function compare (name, example)
  binary(name, example, "a bool tensor of the broadcast shape")
end

-- reductions: x, an axis or axes, keepdims
local function reduce (name, example, extra)
  local args = {X, AXES, KEEP}
  if extra then args[4] = extra end
  E(name, args, "a tensor: a scalar for axis nil, else x without the reduced axes (size 1 with keepdims)", example)
end

-- {====================== build, inspect =======================

E("constant", {{"data", "a number, a boolean, a nested table of them, or a tensor"}, DTYPE},
  "a new tensor (a boolean gives bool)", "mg.constant({{1, 2}, {3, 4}}) --> {{1.0, 2.0}, {3.0, 4.0}}")
E("tensor", {{"data", "a number, a boolean, a nested table of them, or a tensor"}, DTYPE},
  "a new tensor", "mg.tensor({1, 2, 3}, \"int64\") --> {1, 2, 3}")
E("zeros", {SHAPE, DTYPE}, "a tensor of zeros", "mg.zeros(2, 3) --> {{0.0, 0.0, 0.0}, {0.0, 0.0, 0.0}}")
E("ones", {SHAPE, DTYPE}, "a tensor of ones", "mg.ones({2}, \"int64\") --> {1, 1}")
E("full", {SHAPE, {"value", "a number or a boolean"}, DTYPE}, "a tensor of value",
  "mg.full({2, 2}, 7) --> {{7.0, 7.0}, {7.0, 7.0}}")
E("zeros_like", {X, {"dtype", "the new tensor's dtype", "x.dtype"}}, "a tensor of zeros shaped like x",
  "mg.zeros_like(mg.ones(2, 2)) --> {{0.0, 0.0}, {0.0, 0.0}}")
E("ones_like", {X, {"dtype", "the new tensor's dtype", "x.dtype"}}, "a tensor of ones shaped like x",
  "mg.ones_like(mg.zeros(3)) --> {1.0, 1.0, 1.0}")
E("arange", {{"start", "the first value", "0"}, {"stop", "the end, not included"}, {"step", "the stride", "1"}, DTYPE},
  "a 1-D tensor", "mg.arange(5) --> {0.0, 1.0, 2.0, 3.0, 4.0}\nmg.arange(1, 2, 0.25) --> {1.0000, 1.2500, 1.5000, 1.7500}")
E("eye", {{"n", "the rows"}, {"m", "the columns", "n"}, DTYPE}, "an n by m tensor, ones on the diagonal",
  "mg.eye(2) --> {{1.0, 0.0}, {0.0, 1.0}}")
E("Variable", {{"init", "the initial value: a tensor, a number or a nested table"},
               {"opts", "name=, trainable= (true), dtype=", "{}"}},
  "a Variable: mutable state that tapes watch, usable wherever a tensor is",
  "v = mg.Variable({1, 2}, {name = \"w\"})\nv:assign_add(mg.ones(2))\nv:value() --> {2.0, 3.0}")
E("is_tensor", {{"v", "any value"}}, "a boolean (false for a Variable)", "mg.is_tensor(mg.ones(2)) --> true")
E("is_variable", {{"v", "any value"}}, "a boolean", "mg.is_variable(mg.Variable(1)) --> true")

E("Tensor.shape", {}, "a table of the sizes", "mg.zeros(2, 3).shape --> {2, 3}")
E("Tensor.dtype", {}, "a string", "mg.tensor{1, 2}.dtype --> float32")
E("Tensor.ndim", {}, "an integer", "mg.zeros(2, 3).ndim --> 2")
E("Tensor.itemsize", {}, "an integer", "mg.zeros(2, 3).itemsize --> 4")
E("Tensor.nbytes", {}, "an integer", "mg.zeros({2, 3}, \"bfloat16\").nbytes --> 12")
E("item", {{"x", "a tensor of one element"}}, "a Lua number (an integer for int64) or a boolean",
  "mg.tensor{1, 2, 3}:sum():item() --> 6.0")
E("totable", {X}, "nested Lua tables of numbers or booleans (a number for a scalar)",
  "mg.eye(2):totable()[2][2] --> 1.0")
E("numel", {X}, "an integer", "mg.zeros(2, 3):numel() --> 6")
E("print", {{"...", "tensors, strings or any values"}}, "nothing; writes a line to standard output",
  "mg.print(\"x =\", mg.tensor{1, 2})")
E("repr", {{"v", "any value"}, {"opts", "width=, depth=, items=", "{width=80, depth=4, items=20}"}},
  "a string", "mg.repr({a = 1}) --> {a = 1}")
E("help", {{"x", "a function, a value, an entry's name or a group's name; nil for the index", "nil"}},
  "a string (the REPL's help(x) prints it)", "print(mg.help(\"matmul\"))")
E("version", {}, "a string", "type(mg.version) --> string")
E("ops", {}, "a list of tables, one per op", "mg.ops()[1].name --> neg")
E("debug.check_numerics", {{"on", "true to check every op, false to stop"}}, "the previous setting",
  [[before = mg.debug.check_numerics(true)
print(pcall(mg.log, mg.tensor{-1}))   -- false  check_numerics: log produced NaN ...
mg.debug.check_numerics(before)]])
E("debug.verify_recompute", {{"on", "true to verify every recompute_grad, false to stop"}}, "the previous setting",
  [[before = mg.debug.verify_recompute(true)
k = 0
f = mg.recompute_grad(function(x) k = k + 1; return x * k end)
x = mg.Variable(mg.ones(2))
t = mg.tape()
y = f(x):sum()
t:stop()
print(pcall(t.gradient, t, y, x))   -- false  ... verify: the re-run's op 1 (mul, (2) float32) computed other values ...
mg.debug.verify_recompute(before)]])

-- }=============================================================

-- {================= arithmetic, maths, compare =================

binary("add", "mg.add(mg.tensor{1, 2}, 10) --> {11.0, 12.0}\nmg.tensor{{1}, {2}} + mg.tensor{10, 20} --> {{11.0, 21.0}, {12.0, 22.0}}")
binary("sub", "mg.sub(mg.tensor{5, 7}, mg.tensor{1, 2}) --> {4.0, 5.0}")
binary("mul", "mg.tensor{1, 2} * 3 --> {3.0, 6.0}")
binary("div", "mg.tensor{1, 3} / 2 --> {0.5000, 1.5000}\nmg.div(mg.tensor({7}, \"int64\"), 2) --> {3.5000}")
binary("pow", "mg.tensor{2, 3} ^ 2 --> {4.0, 9.0}")
binary("floordiv", "mg.floordiv(mg.tensor{7, -7}, 2) --> { 3.0, -4.0}")
binary("mod", "mg.mod(mg.tensor{7, -7}, 3) --> {1.0, 2.0}")
E("neg", {X}, "a tensor shaped like x", "-mg.tensor{1, -2} --> {-1.0,  2.0}")
binary("maximum", "mg.maximum(mg.tensor{1, 5}, 3) --> {3.0, 5.0}")
binary("minimum", "mg.minimum(mg.tensor{1, 5}, 3) --> {1.0, 3.0}")

unary("exp", "mg.exp(mg.tensor{0, 1}) --> {1.0000, 2.7183}")
unary("log", "mg.log(mg.tensor{1, math.exp(2)}) --> {0.0, 2.0}")
unary("sqrt", "mg.sqrt(mg.tensor{4, 9}) --> {2.0, 3.0}")
unary("abs", "mg.abs(mg.tensor{-1.5, 2}) --> {1.5000, 2.0000}")
unary("sign", "mg.sign(mg.tensor{-3, 0, 2}) --> {-1.0,  0.0,  1.0}")
unary("tanh", "mg.tanh(mg.tensor{0, 1}) --> {0.0000, 0.7616}")
unary("sigmoid", "mg.sigmoid(mg.tensor{0, 2}) --> {0.5000, 0.8808}")
unary("relu", "mg.relu(mg.tensor{-1, 2}) --> {0.0, 2.0}")
unary("softplus", "mg.softplus(mg.tensor{0, 10}) --> { 0.6931, 10.0000}")
unary("silu", "mg.silu(mg.tensor{-1, 1}) --> {-0.2689,  0.7311}")
E("elu", {X, {"alpha", "the scale of the negative side", "1"}}, "a tensor shaped like x",
  "mg.elu(mg.tensor{-1, 2}) --> {-0.6321,  2.0000}")
E("leaky_relu", {X, {"alpha", "the slope of the negative side", "0.01"}}, "a tensor shaped like x",
  "mg.leaky_relu(mg.tensor{-10, 2}, 0.1) --> {-1.0,  2.0}")
local GRAD_ARGS = {{"d", "the gradient of the output"}, {"y", "the forward's output"}}
E("relu_grad", GRAD_ARGS, "the gradient of relu's input, shaped like d",
  "mg.relu_grad(mg.tensor{5, 5}, mg.tensor{0, 2}) --> {0.0, 5.0}")
E("tanh_grad", GRAD_ARGS, "the gradient of tanh's input, shaped like d",
  "mg.tanh_grad(mg.tensor{1, 1}, mg.tensor{0, 0.5}) --> {1.0000, 0.7500}")
E("sigmoid_grad", GRAD_ARGS, "the gradient of sigmoid's input, shaped like d",
  "mg.sigmoid_grad(mg.tensor{1}, mg.tensor{0.5}) --> {0.2500}")
local SOFT_AXIS = {"axis", "the axis normalized", "-1"}
E("softmax", {X, SOFT_AXIS}, "a tensor shaped like x whose entries along axis sum to 1",
  "mg.softmax(mg.tensor{1, 2, 3}) --> {0.0900, 0.2447, 0.6652}")
E("log_softmax", {X, SOFT_AXIS}, "a tensor shaped like x", "mg.log_softmax(mg.tensor{0, 0}) --> {-0.6931, -0.6931}")
unary("sin", "mg.sin(mg.tensor{0, math.pi / 2}) --> {0.0, 1.0}")
unary("cos", "mg.cos(mg.tensor{0, math.pi}) --> { 1.0, -1.0}")
unary("log1p", "mg.log1p(mg.tensor({1e-10}, \"float64\")) --> {1.0000e-10}")
unary("expm1", "mg.expm1(mg.tensor({1e-10}, \"float64\")) --> {1.0000e-10}")
unary("erf", "mg.erf(mg.tensor{0, 1}) --> {0.0000, 0.8427}")
unary("floor", "mg.floor(mg.tensor{1.5, -1.5}) --> { 1.0, -2.0}")
unary("ceil", "mg.ceil(mg.tensor{1.5, -1.5}) --> { 2.0, -1.0}")
unary("round", "mg.round(mg.tensor{0.5, 1.5, 2.6}) --> {0.0, 2.0, 3.0}")
local CLAMP_ARGS = {X, {"lo", "the lower bound: a number, a tensor or nil"}, {"hi", "the upper bound: a number, a tensor or nil"}}
E("clamp", CLAMP_ARGS, "a tensor shaped like x", "mg.clamp(mg.tensor{-2, 0.5, 3}, 0, 1) --> {0.0000, 0.5000, 1.0000}\nmg.clamp(mg.tensor{-2, 3}, nil, 1) --> {-2.0,  1.0}")
E("clip_by_value", CLAMP_ARGS, "a tensor shaped like x", "mg.clip_by_value(mg.tensor{-2, 3}, -1, 1) --> {-1.0,  1.0}")
E("gelu", {X, {"approximate", "true or \"tanh\" for the tanh form, or {approximate=}", "false"}},
  "a tensor shaped like x", "mg.gelu(mg.tensor{-1, 0, 1}) --> {-0.1587,  0.0000,  0.8413}")
E("layer_norm", {X, {"gamma", "the scale, shaped like x's last axis", "nil"}, {"beta", "the shift", "nil"},
                 {"opts", "epsilon=", "{epsilon=1e-5}"}},
  "a tensor shaped like x", "mg.layer_norm(mg.tensor{{1, 2, 3}}) --> {{-1.2247,  0.0000,  1.2247}}")

compare("equal", "mg.equal(mg.tensor{1, 2}, mg.tensor{1, 3}) --> { true, false}")
compare("not_equal", "mg.not_equal(mg.tensor{1, 2}, 2) --> { true, false}")
compare("less", "mg.less(mg.tensor{1, 2, 3}, 2) --> { true, false, false}")
compare("less_equal", "mg.less_equal(mg.tensor{1, 2, 3}, 2) --> { true,  true, false}")
compare("greater", "mg.greater(mg.tensor{1, 2, 3}, 2) --> {false, false,  true}")
compare("greater_equal", "mg.greater_equal(mg.tensor{1, 2, 3}, 2) --> {false,  true,  true}")
compare("logical_and", "mg.logical_and(mg.tensor{true, true}, mg.tensor{true, false}) --> { true, false}")
compare("logical_or", "mg.logical_or(mg.tensor{true, false}, false) --> { true, false}")
E("logical_not", {{"x", "a bool tensor"}}, "a bool tensor shaped like x", "mg.logical_not(mg.tensor{true, false}) --> {false,  true}")
E("isfinite", {{"x", "a tensor of any dtype"}}, "a bool tensor shaped like x",
  "mg.isfinite(mg.tensor{1, 1 / 0, 0 / 0}) --> { true, false, false}")
E("isnan", {{"x", "a tensor of any dtype"}}, "a bool tensor shaped like x",
  "mg.isnan(mg.tensor{1, 1 / 0, 0 / 0}) --> {false, false,  true}")
E("isinf", {{"x", "a tensor of any dtype"}}, "a bool tensor shaped like x",
  "mg.isinf(mg.tensor{1, -1 / 0, 0 / 0}) --> {false,  true, false}")
E("where", {{"cond", "a bool tensor"}, {"a", "values where cond is true"}, {"b", "values where it is false"}},
  "a tensor of the three's broadcast shape", "mg.where(mg.tensor{true, false}, mg.tensor{1, 2}, 0) --> {1.0, 0.0}")

-- }=============================================================

-- {============ reduce, linear algebra, shape, sorting ============

local M22 = "x = mg.tensor{{1, 2}, {3, 4}}\n"
reduce("sum", M22 .. "x:sum() --> 10.0\nmg.sum(x, 1) --> {4.0, 6.0}\nx:sum(2, true) --> {{3.0}, {7.0}}")
reduce("mean", M22 .. "x:mean() --> 2.5000\nx:mean(2) --> {1.5000, 3.5000}")
reduce("max", M22 .. "x:max() --> 4.0\nx:max(1) --> {3.0, 4.0}")
reduce("min", M22 .. "x:min(2) --> {1.0, 3.0}")
reduce("prod", M22 .. "x:prod() --> 24.0\nx:prod({1, 2}) --> 24.0")
reduce("logsumexp", "mg.logsumexp(mg.tensor{0, 0}) --> 0.6931")
local DDOF = {"opts", "ddof= (the divisor is n - ddof), unbiased= (true: ddof 1)", "{ddof=0}"}
reduce("var", "mg.var(mg.tensor{1, 2, 3, 4}) --> 1.2500\nmg.var(mg.tensor{1, 2, 3, 4}, nil, false, {ddof = 1}) --> 1.6667", DDOF)
reduce("std", "mg.std(mg.tensor{1, 3}) --> 1.0", DDOF)
reduce("norm", "mg.norm(mg.tensor{3, 4}) --> 5.0\nmg.norm(mg.tensor{3, -4}, nil, false, {ord = 1}) --> 7.0",
       {"opts", "ord= 2, 1 or math.huge", "{ord=2}"})
E("cumsum", {X, {"axis", "the axis; nil for the flattened x", "nil"}, {"opts", "exclusive=, reverse=", "{}"}},
  "a tensor shaped like x (1-D for axis nil)", "mg.cumsum(mg.tensor{1, 2, 3}) --> {1.0, 3.0, 6.0}\nmg.cumsum(mg.tensor{1, 2, 3}, 1, {reverse = true}) --> {6.0, 5.0, 3.0}")
local ARG_AXIS = {"axis", "the axis searched; nil for the flattened x", "nil"}
E("argmax", {X, ARG_AXIS}, "an int64 tensor of 1-based positions (a scalar for axis nil)",
  M22 .. "x:argmax() --> 4\nx:argmax(2) --> {2, 2}")
E("argmin", {X, ARG_AXIS}, "an int64 tensor of 1-based positions", M22 .. "x:argmin(1) --> {1, 1}")

E("matmul", {{"a", "a tensor (..., n, k), or a vector"}, {"b", "a tensor (..., k, m), or a vector"}},
  "a tensor (..., n, m); the batch axes broadcast", M22 .. "mg.matmul(x, x) --> {{ 7.0, 10.0}, {15.0, 22.0}}\nmg.matmul(x, mg.tensor{1, 1}) --> {3.0, 7.0}")
E("dense", {{"x", "a tensor (..., in)"}, {"w", "the weights (in, out)"}, {"b", "the bias (out) or nil", "nil"},
            {"activation", "\"linear\" \"relu\" \"tanh\" or \"sigmoid\"", "\"linear\""}},
  "a tensor (..., out)", "mg.dense(mg.tensor{{1, -1}}, mg.eye(2), mg.tensor{0, 0.5}, \"relu\") --> {{1.0, 0.0}}")
E("einsum", {{"spec", "subscripts, as \"ij,jk->ik\""}, {"a", "a tensor"}, {"b", "a second tensor", "nil"}},
  "a tensor", M22 .. "mg.einsum(\"ij->ji\", x) --> {{1.0, 3.0}, {2.0, 4.0}}\nmg.einsum(\"ij,ij->\", x, x) --> 30.0")

E("reshape", {X, {"shape", "the new sizes (a table or integers); one may be -1"}}, "a tensor with x's values",
  "mg.arange(6):reshape(2, 3) --> {{0.0, 1.0, 2.0}, {3.0, 4.0, 5.0}}\nmg.arange(6):reshape{-1, 2}.shape --> {3, 2}")
E("transpose", {X, {"perm", "the new order of the axes, 1-based", "reversed"}}, "a tensor",
  "mg.tensor{{1, 2, 3}}:transpose() --> {{1.0}, {2.0}, {3.0}}\nmg.zeros(2, 3, 4):transpose{1, 3, 2}.shape --> {2, 4, 3}")
E("swapaxes", {X, {"a", "an axis"}, {"b", "another axis"}}, "a tensor", "mg.zeros(2, 3, 4):swapaxes(1, 3).shape --> {4, 3, 2}")
E("expand_dims", {X, {"axis", "where the new axis goes (1-based, negative from the end)"}}, "a tensor with one more axis",
  "mg.tensor{1, 2}:expand_dims(1) --> {{1.0, 2.0}}")
E("squeeze", {X, {"axis", "the axis removed; nil for every axis of size 1", "nil"}}, "a tensor",
  "mg.zeros(1, 3, 1):squeeze().shape --> {3}")
E("broadcast_to", {X, {"shape", "the larger shape"}}, "a tensor (a view)", "mg.tensor{1, 2}:broadcast_to{2, 2} --> {{1.0, 2.0}, {1.0, 2.0}}")
E("slice", {X, {"s1, s2, ...", "per axis: nil (all), an index (the axis dropped) or {start, stop [, step]}, inclusive, negative from the end"}},
  "a tensor", M22 .. "x:slice(nil, 2) --> {2.0, 4.0}\nx:slice({2, 2}, nil) --> {{3.0, 4.0}}\nmg.arange(6):slice{1, -1, 2} --> {0.0, 2.0, 4.0}")
local LIST = {"tensors", "a table {x1, x2, ...} of tensors"}
E("concat", {LIST, {"axis", "the axis joined along", "1"}}, "a tensor",
  "mg.concat({mg.tensor{1, 2}, mg.tensor{3}}) --> {1.0, 2.0, 3.0}\nmg.concat({mg.ones(2, 1), mg.zeros(2, 1)}, 2) --> {{1.0, 0.0}, {1.0, 0.0}}")
E("stack", {LIST, {"axis", "where the new axis goes", "1"}}, "a tensor with one more axis",
  "mg.stack({mg.tensor{1, 2}, mg.tensor{3, 4}}) --> {{1.0, 2.0}, {3.0, 4.0}}\nmg.stack({mg.tensor{1, 2}, mg.tensor{3, 4}}, 2) --> {{1.0, 3.0}, {2.0, 4.0}}")
E("gather", {X, {"indices", "an int64 tensor (or table) of 1-based positions"}, {"axis", "the axis indexed", "1"}},
  "a tensor: x's slices at indices", "mg.gather(mg.tensor{10, 20, 30}, {3, 1}) --> {30.0, 10.0}\nmg.gather(mg.eye(3), {2}, 2) --> {{0.0}, {1.0}, {0.0}}")
E("cast", {X, {"dtype", "the new dtype"}}, "a tensor of dtype", "mg.tensor{1.7, -1.7}:cast(\"int64\") --> { 1, -1}")

local SORT_AXIS = {"axis", "the axis sorted", "-1"}
E("sort", {X, SORT_AXIS, {"opts", "descending=", "{descending=false}"}}, "two tensors: the sorted values and their int64 positions in x",
  "mg.sort(mg.tensor{3, 1, 2}) --> {1.0, 2.0, 3.0}, {2, 3, 1}\nmg.sort(mg.tensor{3, 1, 2}, -1, {descending = true}) --> {3.0, 2.0, 1.0}, {1, 3, 2}")
E("argsort", {X, SORT_AXIS, {"opts", "descending=", "{descending=false}"}}, "an int64 tensor of 1-based positions",
  "mg.argsort(mg.tensor{3, 1, 2}) --> {2, 3, 1}")
E("topk", {X, {"k", "how many"}, SORT_AXIS, {"opts", "largest=, sorted=", "{largest=true, sorted=true}"}},
  "two tensors: values and int64 positions, k along axis", "mg.topk(mg.tensor{5, 1, 7, 3}, 2) --> {7.0, 5.0}, {3, 1}")
local INDICES = {"indices", "an int64 tensor of 1-based positions, x's rank"}
E("take_along_axis", {X, INDICES, {"axis", "the axis indexed"}}, "a tensor shaped like indices",
  "x = mg.tensor{{10, 20}, {30, 40}}\nmg.take_along_axis(x, mg.tensor({{2}, {1}}, \"int64\"), 2) --> {{20.0}, {30.0}}")
E("put_along_axis", {X, INDICES, {"values", "what goes there (broadcast to indices)"}, {"axis", "the axis indexed"},
                     {"opts", "mode= \"set\" or \"add\"", "{mode=\"set\"}"}},
  "a new tensor shaped like x", "mg.put_along_axis(mg.zeros(3), mg.tensor({2}, \"int64\"), mg.tensor{9}, 1) --> {0.0, 9.0, 0.0}")
E("flip", {X, {"axes", "an axis or a table of axes; nil for all", "nil"}}, "a tensor (a view)",
  "mg.flip(mg.tensor{1, 2, 3}) --> {3.0, 2.0, 1.0}")
E("tile", {X, {"reps", "a table of repeats per axis"}}, "a tensor", "mg.tile(mg.tensor{1, 2}, {2}) --> {1.0, 2.0, 1.0, 2.0}")
E("repeat_interleave", {X, {"repeats", "an integer, or an int64 tensor of one count per entry"},
                        {"axis", "the axis; nil for the flattened x", "nil"}},
  "a tensor", "mg.repeat_interleave(mg.tensor{1, 2}, 2) --> {1.0, 1.0, 2.0, 2.0}")
E("pad", {X, {"paddings", "a table of {before, after} per axis"},
          {"opts", "mode= constant reflect symmetric edge wrap, value=", "{mode=\"constant\", value=0}"}},
  "a larger tensor", "mg.pad(mg.tensor{1, 2}, {{1, 2}}) --> {0.0, 1.0, 2.0, 0.0, 0.0}\nmg.pad(mg.tensor{1, 2}, {{2, 0}}, {mode = \"edge\"}) --> {1.0, 1.0, 1.0, 2.0}")
local DIAG = {"k", "the diagonal kept: 0 the main one, 1 above, -1 below", "0"}
E("tril", {X, DIAG}, "a tensor shaped like x", "mg.tril(mg.ones(3, 3)) --> {{1.0, 0.0, 0.0}, {1.0, 1.0, 0.0}, {1.0, 1.0, 1.0}}")
E("triu", {X, DIAG}, "a tensor shaped like x", "mg.triu(mg.ones(3, 3), 1) --> {{0.0, 1.0, 1.0}, {0.0, 0.0, 1.0}, {0.0, 0.0, 0.0}}")
E("masked_fill", {X, {"mask", "a bool tensor broadcasting to x"}, {"value", "a number"}}, "a tensor shaped like x",
  "x = mg.tensor{1, 2, 3}\nmg.masked_fill(x, x:greater(1), 0) --> {1.0, 0.0, 0.0}")

-- }=============================================================

-- {================== convolution, random, memory ===================

local CONV = {"opts", "strides= (1), padding= \"valid\" or \"same\", dilation_rate= (1)", "{}"}
local POOL = {"opts", "pool_size= (2), strides= (pool_size), padding= \"valid\" or \"same\"", "{}"}
local IMG = {"x", "images (batch, height, width, channels)"}
E("conv2d", {IMG, {"w", "filters (height, width, in, out)"}, {"b", "a bias (out)", "nil"},
              {"opts", "strides= (1), padding= \"valid\" or \"same\", dilation_rate= (1), activation= \"linear\", \"relu\", \"tanh\" or \"sigmoid\" (in the same op)", "{}"}},
  "images (batch, height', width', out)",
  "x = mg.ones(1, 4, 4, 1)\nmg.conv2d(x, mg.ones(3, 3, 1, 2)).shape --> {1, 2, 2, 2}\nmg.conv2d(x, mg.ones(3, 3, 1, 1), {padding = \"same\"}):slice(1, nil, 1, 1) --> {4.0, 6.0, 6.0, 4.0}")
E("conv2d_backward_input", {{"dy", "conv2d's output gradient"}, {"w", "the filters"}, {"input_shape", "conv2d's input shape"}, CONV},
  "the gradient of conv2d's input, input_shape", "mg.conv2d_backward_input(mg.ones(1, 2, 2, 1), mg.ones(3, 3, 1, 1), {1, 4, 4, 1}).shape --> {1, 4, 4, 1}")
E("conv2d_backward_filter", {IMG, {"dy", "conv2d's output gradient"}, {"filter_shape", "the filters' shape"}, CONV},
  "the gradient of the filters, filter_shape", "mg.conv2d_backward_filter(mg.ones(1, 4, 4, 1), mg.ones(1, 2, 2, 1), {3, 3, 1, 1}):sum() --> 36.0")
E("max_pool2d", {IMG, POOL}, "the pooled images",
  "mg.max_pool2d(mg.arange(16):reshape(1, 4, 4, 1)):reshape(2, 2) --> {{ 5.0,  7.0}, {13.0, 15.0}}")
E("max_pool2d_backward", {IMG, {"dy", "max_pool2d's output gradient"}, POOL}, "the gradient of x, shaped like x",
  "x = mg.arange(16):reshape(1, 4, 4, 1)\nmg.max_pool2d_backward(x, mg.ones(1, 2, 2, 1)):reshape(4, 4) --> {{0.0, 0.0, 0.0, 0.0}, {0.0, 1.0, 0.0, 1.0}, {0.0, 0.0, 0.0, 0.0}, {0.0, 1.0, 0.0, 1.0}}")
E("avg_pool2d", {IMG, POOL}, "the pooled images", "mg.avg_pool2d(mg.arange(16):reshape(1, 4, 4, 1)):reshape(2, 2) --> {{ 2.5000,  4.5000}, {10.5000, 12.5000}}")
E("avg_pool2d_backward", {{"dy", "avg_pool2d's output gradient"}, {"input_shape", "avg_pool2d's input shape"}, POOL},
  "the gradient of the input", "mg.avg_pool2d_backward(mg.ones(1, 1, 1, 1), {1, 2, 2, 1}):reshape(2, 2) --> {{0.2500, 0.2500}, {0.2500, 0.2500}}")
E("scaled_dot_product_attention", {{"q", "queries (..., n, d)"}, {"k", "keys (..., m, d)"}, {"v", "values (..., m, dv)"},
                                   {"opts", "mask= (bool, true keeps), causal=, scale= (1 / sqrt(d))", "{}"}},
  "a tensor (..., n, dv)", "q = mg.ones(1, 2, 4)\nmg.scaled_dot_product_attention(q, q, mg.tensor{{{1, 2, 3, 4}, {5, 6, 7, 8}}}, {causal = true}) --> {{{1.0, 2.0, 3.0, 4.0}, {3.0, 4.0, 5.0, 6.0}}}")

E("random.seed", {{"n", "an integer"}}, "nothing", "mg.random.seed(42)\na = mg.random.normal{3}\nmg.random.seed(42)\n(a - mg.random.normal{3}):abs():max():item() --> 0.0")
E("random.normal", {RSHAPE, {"mean", "the mean", "0"}, {"stddev", "the standard deviation", "1"}, FDTYPE},
  "a tensor of draws", "mg.random.seed(1)\nmg.random.normal({2, 3}, 0, 0.1).shape --> {2, 3}\nmg.random.normal(2, 3, \"float64\").dtype --> float64")
E("random.uniform", {RSHAPE, {"low", "the lower end", "0"}, {"high", "the upper end (not reached)", "1"}, FDTYPE},
  "a tensor of draws", "mg.random.seed(1)\nu = mg.random.uniform({1000}, -1, 1)\nu:min():item() >= -1 and u:max():item() < 1 --> true")
E("random.randint", {{"low", "the smallest value (an integer)"}, {"high", "one past the largest (not drawn)"}, SHAPE},
  "an int64 tensor of draws, each of low..high-1 as likely (torch.randint)",
  "mg.random.seed(1)\nr = mg.random.randint(1, 7, 2, 500)\nr.dtype --> int64\nr:min():item() == 1 and r:max():item() == 6 --> true")
E("random.permutation", {{"n", "how many"}}, "an int64 tensor holding 1..n in some order",
  "mg.random.seed(1)\nmg.random.permutation(5) --> {1, 4, 3, 5, 2}")
E("random.get_state", {}, "a table {seed=, offset=}", "s = mg.random.get_state()\na = mg.random.uniform{2}\nmg.random.set_state(s)\n(a - mg.random.uniform{2}):abs():max():item() --> 0.0")
E("random.set_state", {{"state", "what get_state returned"}}, "nothing",
  "s = mg.random.get_state()\nmg.random.normal{4}\nmg.random.set_state(s)")
E("random.with_init_stream", {FN, ARGS}, "fn's results",
  "w = mg.random.with_init_stream(mg.random.normal, {2, 2})\nw.shape --> {2, 2}")

E("memory.stats", {}, "a table of counters: current_bytes=, peak_bytes=, tensor_bytes=, saved_bytes=, gradient_bytes=, cached_bytes=, live_tensors=, ...",
  "x = mg.ones(1000)\nmg.memory.stats().live_tensors > 0 --> true")
E("memory.estimate", {{"step", "a function: a training step"}, ARGS},
  "a report (prints as tables): peak_bytes=, at_peak={variable=, saved=, gradient=, tensor=}, peak_saved_bytes=, saved_by_line={{site=, bytes=}, ...}, seconds=",
  [[layer = mg.nn.Dense(64, "relu")
x = mg.random.normal{32, 16}
function step ()
  local t = mg.tape()
  local loss = mg.sum(layer(x))
  t:stop()
  return t:gradient(loss, layer.trainable_variables)
end
r = mg.memory.estimate(step)   -- print(r): the peak, its parts, the lines that made what the tapes hold
pause, min_bytes = mg.memory.setpause(100, 0)   -- garbage collected at once, as the estimate counts
collectgarbage()
mg.memory.reset_peak()
step()
mg.memory.setpause(pause, min_bytes)
r.peak_bytes == mg.memory.stats().peak_bytes --> true]])
E("memory.dry_running", {}, "a boolean", "mg.memory.dry_running() --> false")
E("memory.plan", {{"step", "a function: a training step (nn.Sequential models planned per stretch of layers, another model per layer call)"},
                  {"opts", "budget= (bytes or \"2 GiB\"), lossy= (true: bfloat16 packing allowed), spill= (a directory: spilling to files allowed)"}, ARGS},
  "a plan: rows={{layers=, how=, bytes=, cost=, what=}, ...}, peak_bytes= (its dry run's), budget=, plain_peak_bytes=, spill=",
  [[layers = {}
for i = 1, 6 do layers[i] = mg.nn.Dense(64, "tanh") end
model = mg.nn.Sequential(layers)
x = mg.random.normal{1024, 64}
model(x)
function step ()
  local t = mg.tape()
  local loss = mg.mean(model(x) ^ 2)
  t:stop()
  return t:gradient(loss, model.trainable_variables)
end
plain = mg.memory.estimate(step).peak_bytes
plan = mg.memory.plan(step, {budget = plain * 0.9})   -- print(plan): the decisions
plan.peak_bytes <= plain * 0.9 --> true]])
E("memory.with_plan", {{"plan", "what memory.plan gave"}, {"step", "the step it was made for"}, ARGS}, "step's results",
  [[layers = {mg.nn.Dense(32, "tanh"), mg.nn.Dense(32, "tanh"), mg.nn.Dense(32)}
model = mg.nn.Sequential(layers)
x = mg.random.normal{512, 32}
model(x)
function step () local t = mg.tape(); local l = mg.sum(model(x)); t:stop(); return t:gradient(l, model.trainable_variables) end
plan = mg.memory.plan(step, {budget = "1 GiB"})
#mg.memory.with_plan(plan, step) --> 6]])
E("memory.load_plan", {{"path", "a file plan:save(path) wrote"}, {"step", "the step it was made for"}, ARGS},
  "the plan, its models matched with the Sequential models a dry run of step(...) runs, its peak checked again",
  [[layers = {mg.nn.Dense(32, "tanh"), mg.nn.Dense(32)}
model = mg.nn.Sequential(layers)
x = mg.random.normal{64, 32}
model(x)
function step () local t = mg.tape(); local l = mg.sum(model(x)); t:stop(); return t:gradient(l, model.trainable_variables) end
path = os.tmpname()
plan = mg.memory.plan(step, {budget = "1 GiB"}):save(path)
mg.memory.load_plan(path, step).peak_bytes == plan.peak_bytes --> true]])
E("memory.reset_peak", {}, "nothing", "mg.memory.reset_peak()\nmg.memory.stats().peak_bytes >= mg.memory.stats().current_bytes --> true")
E("memory.trace", {PATH, FN, ARGS}, "fn's results; writes a Chrome trace (chrome://tracing, Perfetto)",
  "path = os.tmpname()\nmg.memory.trace(path, function() return mg.ones(100):sum() end)\nos.remove(path)")
E("memory.span", {{"name", "the span's name"}, FN, ARGS}, "fn's results",
  "mg.memory.span(\"forward\", function() return mg.ones(10) * 2 end):sum() --> 20.0")
E("memory.setpause", {{"percent", "collect when tensor bytes grow by this percent"}, {"min_bytes", "never below these bytes", "256 KiB"}},
  "the previous settings", "pause, min = mg.memory.setpause(110)\nmg.memory.setpause(pause, min)")
E("tidy", {FN, ARGS}, "fn's results (kept); every other tensor made inside is released",
  "y = mg.tidy(function() local t = mg.ones(1000) * 2 return t:sum() end)\ny --> 2000.0")
E("dispose", {{"x, ...", "tensors or tables of them"}}, "nothing", "x = mg.ones(1000)\nmg.dispose(x)")
E("keep", {{"x, ...", "tensors"}}, "x, ...", "saved = nil\nmg.tidy(function() saved = mg.keep(mg.ones(2)) end)\nsaved --> {1.0, 1.0}")
E("memory.set_cache_limit", {{"bytes", "an integer number of bytes"}}, "the limit set before",
  "old = mg.memory.set_cache_limit(64 * 2^20)   -- (a sanitizer build keeps no cache)\nmg.memory.stats().cache_limit <= 67108864 --> true\nmg.memory.set_cache_limit(old) --> 67108864")
E("memory.release_cache", {}, "nothing", "mg.memory.release_cache()\nmg.memory.stats().cached_bytes --> 0")
E("memory.fail_after", {{"n", "the allocation that fails; 0 turns it off"}}, "nothing",
  "mg.memory.fail_after(1)\nprint(pcall(mg.ones, 1000))   -- false  out of memory allocating 3.91 KiB (injected failure) ...\nmg.memory.fail_after(0)")
E("memory.budget", {{"bytes", "a number, \"300 MB\", \"+40 MiB\" (above what is live), or nil to clear", "nil"}},
  "the previous budget", "before = mg.memory.budget(\"+40 MiB\")\nmg.memory.budget(before)")

-- }=============================================================

-- {=========================== autodiff ===========================

local TAPE = "x = mg.Variable(mg.tensor{1, 2, 3})\nt = mg.tape()\ny = (x * x):sum()\nt:stop()\n"
E("tape", {{"opts", "persistent= (more than one gradient), watch_accessed_variables=, budget=, warn=", "{persistent=false}"}},
  "a Tape, recording from now until t:stop() (or t:record(fn))", TAPE .. "t:gradient(y, x) --> {2.0, 4.0, 6.0}")
E("Tape:gradient", {{"target", "a tensor (summed if not a scalar) or a table of them"},
                    {"sources", "a tensor, a Variable, or a nested table of them"},
                    {"output_gradients", "the gradient of target (ones by default)", "nil"},
                    {"opts", "unconnected= \"none\" (nil) or \"zero\"", "{unconnected=\"none\"}"}},
  "the gradients, in sources' structure (nil where unconnected)", TAPE .. "t:gradient(y, {w = x}).w --> {2.0, 4.0, 6.0}")
E("Tape:jacobian", {{"target", "a tensor"}, {"sources", "a tensor, a Variable or a nested table"},
                    {"opts", "unconnected=", "{}"}},
  "tensors shaped target.shape .. source.shape, in sources' structure",
  "x = mg.Variable(mg.tensor{1, 2})\nt = mg.tape()\ny = x * x\nt:stop()\nt:jacobian(y, x) --> {{2.0, 0.0}, {0.0, 4.0}}")
E("Tape:batch_jacobian", {{"target", "a tensor (batch, ...)"}, {"source", "a tensor (batch, ...)"}, {"opts", "unconnected=", "{}"}},
  "a tensor (batch, target's sizes, source's sizes)",
  "x = mg.Variable(mg.tensor{{1, 2}, {3, 4}})\nt = mg.tape()\ny = x * 2\nt:stop()\nt:batch_jacobian(y, x).shape --> {2, 2, 2}")
E("Tape:watch", {{"x", "a tensor, a Variable or nested tables of them"}}, "nothing",
  "x = mg.tensor{3}\nt = mg.tape()\nt:watch(x)\ny = x * x\nt:stop()\nt:gradient(y, x) --> {6.0}")
E("Tape:watched_variables", {}, "a list of Variables",
  "v = mg.Variable(1)\nt = mg.tape()\ny = v * 2\nt:stop()\n#t:watched_variables() --> 1")
E("Tape:stop", {}, "nothing", "t = mg.tape()\nt:stop()\nt:is_recording() --> false")
E("Tape:record", {FN, ARGS}, "fn's results",
  "x = mg.Variable(2)\nt = mg.tape()\nt:stop()\ny = t:record(function() return x * x end)\nt:gradient(y, x) --> 4.0")
E("Tape:stop_recording", {FN, ARGS}, "fn's results",
  "x = mg.Variable(2)\nt = mg.tape()\nc = t:stop_recording(function() return x * 10 end)\ny = x * c\nt:stop()\nt:gradient(y, x) --> 20.0")
E("stop_gradient", {X}, "x, seen by tapes as a constant",
  "x = mg.Variable(3)\nt = mg.tape()\ny = x * mg.stop_gradient(x)\nt:stop()\nt:gradient(y, x) --> 3.0")
E("identity", {X}, "a new tensor with x's values", "mg.identity(mg.tensor{1, 2}) --> {1.0, 2.0}")
E("Tape:reset", {}, "nothing", "t = mg.tape({persistent = true})\nt:reset()\nt:saved_bytes() --> 0")
E("Tape:is_recording", {}, "a boolean", "t = mg.tape()\nt:is_recording() --> true")
E("Tape:saved_bytes", {}, "an integer",
  "x = mg.Variable(mg.ones(1000))\nt = mg.tape()\ny = mg.exp(x):sum()\nt:stop()\nt:saved_bytes() --> 4000")
E("Variable:value", {}, "a tensor", "mg.Variable({1, 2}):value() --> {1.0, 2.0}")
E("Variable:read_value", {}, "a tensor", "mg.Variable({1, 2}):read_value() --> {1.0, 2.0}")
E("Variable:assign", {{"value", "a tensor or number of the variable's shape"}}, "the variable",
  "v = mg.Variable({1, 2})\nv:assign(mg.tensor{5, 6})\nv:value() --> {5.0, 6.0}")
local SCALE = {"scale", "a number multiplying d", "1"}
E("Variable:assign_add", {{"d", "a tensor of the variable's shape"}, SCALE}, "the variable",
  "v = mg.Variable({1, 2})\nv:assign_add(mg.ones(2), 10)\nv:value() --> {11.0, 12.0}")
E("Variable:assign_sub", {{"d", "a tensor of the variable's shape"}, SCALE}, "the variable",
  "v = mg.Variable({1, 2})\nv:assign_sub(mg.ones(2))\nv:value() --> {0.0, 1.0}")
E("custom_gradient", {{"f", "a function returning its outputs and a backward function(dy) giving the inputs' gradients"},
                      {"opts", "context= (true: backward gets a ctx first)", "{context=false}"}},
  "a function: f with that gradient",
  [[clip = mg.custom_gradient(function(x)
  return x * 1, function(dy) return mg.clamp(dy, -1, 1) end
end)
x = mg.Variable(mg.tensor{1, 2})
t = mg.tape()
y = (clip(x) * 5):sum()
t:stop()
t:gradient(y, x) --> {1.0, 1.0}]])
E("recompute_grad", {{"f", "a function of tensors"}, {"opts", "pass_is_recomputing=, policy=, verify= (the re-run must compute the same bytes, op by op)", "{policy=\"nothing\"}"}},
  "a function: f, its inside activations recomputed in the backward",
  "f = mg.recompute_grad(function(x) return mg.tanh(mg.exp(x)) end)\nx = mg.Variable(mg.zeros(2))\nt = mg.tape()\ny = f(x):sum()\nt:stop()\nt:gradient(y, x) --> {0.4200, 0.4200}")
E("is_recomputing", {}, "a boolean", "mg.is_recomputing() --> false")
E("in_loop", {FN, ARGS}, "fn's results", "mg.in_loop(mg.is_in_loop) --> true")
E("is_in_loop", {}, "a boolean", "mg.is_in_loop() --> false")
E("checkpoint_loop", {{"step", "function(state, i) returning the next state"}, {"state", "a tensor or table of tensors"},
                      {"n", "the number of steps"}, {"opts", "snapshots= (how many states kept), stats=", "{}"}},
  "the state after n steps",
  "x = mg.Variable(mg.tensor{1})\nt = mg.tape()\ny = mg.checkpoint_loop(function(s) return s * 2 end, x, 10, {snapshots = 2})\nt:stop()\ny --> {1024.0}\nt:gradient(y, x) --> {1024.0}")
E("checkpoint_loop.recomputed_steps", {{"n", "the steps"}, {"k", "the snapshots"}}, "an integer",
  "mg.checkpoint_loop.recomputed_steps(100, 5) --> 217")
E("saved_tensors_hooks", {{"pack", "function(x) returning what is kept; or \"float16\", \"bfloat16\", {offload=dir} with no unpack"},
                          {"unpack", "function(packed) returning the tensor"}, FN, ARGS},
  "fn's results",
  "x = mg.Variable(mg.tensor{1, 2})\nt = mg.tape()\ny = mg.saved_tensors_hooks(\"bfloat16\", function() return (x * x):sum() end)\nt:stop()\nt:gradient(y, x) --> {2.0, 4.0}")
E("autocast", {{"dtype", "\"bfloat16\"; \"float16\" on AVX512-FP16 CPUs or after mixed_precision.emulate_float16(true); \"float32\" or false: off inside"},
               {"fn", "the function to run (omitted: a region open until its <close> variable goes)", "nil"}, ARGS},
  "fn's results, or a region with :close()",
  "a = mg.ones{2, 2}\nmg.autocast(\"bfloat16\", function() return mg.matmul(a, a) end).dtype --> bfloat16")
E("autocast_dtype", {}, "a dtype name or nil",
  "mg.autocast(\"bfloat16\", mg.autocast_dtype) --> bfloat16")
E("autocast_isa", {{"dtype", "the half dtype", "\"bfloat16\""}}, "an ISA name or nil",
  "mg.autocast_isa(\"float16\") --> nil")
E("mixed_precision.set_global_policy", {{"name", "\"mixed_bfloat16\", \"mixed_float16\" or \"float32\""}},
  "the previous policy's name",
  "was = mg.mixed_precision.set_global_policy(\"mixed_bfloat16\")\nmg.mixed_precision.set_global_policy(was) --> mixed_bfloat16")
E("mixed_precision.global_policy", {}, "a policy name", "mg.mixed_precision.global_policy() --> float32")
E("mixed_precision.emulate_float16", {{"on", "true or false"}}, "the previous setting",
  "was = mg.mixed_precision.emulate_float16(true)\nmg.autocast(\"float16\", mg.matmul, mg.ones{2, 2}, mg.ones{2, 2}).dtype --> float16\nmg.mixed_precision.emulate_float16(was) --> true")
E("mixed_precision.LossScaleOptimizer", {{"opt", "the optimizer to wrap"},
                                         {"opts", "initial_scale=, dynamic=, dynamic_growth_steps=, name=", "{initial_scale=32768, dynamic=true, dynamic_growth_steps=2000}"}},
  "the same class as optim.LossScaleOptimizer",
  "mg.mixed_precision.LossScaleOptimizer == mg.optim.LossScaleOptimizer --> true")
E("mixed_precision.autocast_dtype", {{"model", "a layer or model (its dtype_policy)"},
                                     {"asked", "a dtype name or false: wins when given", "nil"}},
  "a dtype name or false",
  "m = mg.nn.Dense(2)\nm.dtype_policy = \"mixed_bfloat16\"\nmg.mixed_precision.autocast_dtype(m) --> bfloat16")
E("mixed_precision.run", {{"dtype", "a dtype name, or false"}, FN, ARGS}, "fn's results",
  "mg.mixed_precision.run(false, function() return 1 end) --> 1")
E("test.gradcheck", {{"f", "a function of the inputs, returning a tensor"}, {"inputs", "a list of float64 tensors"},
                     {"opts", "eps=, atol=, rtol=, seed=", "{eps=1e-6, atol=1e-6, rtol=1e-4, seed=1}"}},
  "true, or raises naming the input and element that differ",
  "mg.test.gradcheck(function(a) return (a * a):sum() end, {mg.ones(3, \"float64\")}) --> true")

-- }=============================================================

-- {============================ layers ============================

local NAME = {"opts", "name=", "{}"}
local LAYER = "a layer, called as layer(x)"
E("nn.Layer", {}, "the class; subclass it with nn.Layer:subclass(name)",
  "-- every layer (Dense, Sequential, a subclass) is an nn.Layer\nlayer = mg.nn.Dense(2)\nlayer(mg.ones(1, 3)).shape --> {1, 2}\n#layer.variables --> 2")
E("nn.Dense", {{"units", "the output size"}, {"activation", "\"relu\" \"tanh\" \"sigmoid\" \"softmax\" \"linear\" or a function", "nil"},
               {"opts", "activation=, use_bias=, name=", "{use_bias=true}"}},
  LAYER .. ": (..., in) -> (..., units); kernel and bias made on the first call",
  "mg.random.seed(0)\nlayer = mg.nn.Dense(4, \"relu\")\nlayer(mg.ones(2, 3)).shape --> {2, 4}\nlayer.kernel.shape --> {3, 4}")
E("nn.Sequential", {{"layers", "a table of layers, applied in order"},
                    {"opts", "name=, input_shape= (one sample's shape, no batch: builds the layers at once)", "{}"}},
  "a model (a layer): compile, fit, evaluate, predict, summary",
  "model = mg.nn.Sequential{mg.nn.Dense(8, \"relu\"), mg.nn.Dense(1)}\nmodel(mg.ones(4, 3)).shape --> {4, 1}")
E("nn.Lambda", {FN, NAME}, "a layer; layer(x, ...) is fn(x, ...)",
  "double = mg.nn.Lambda(function(x) return x * 2 end)\ndouble(mg.tensor{1, 2}) --> {2.0, 4.0}")
E("nn.Dropout", {{"rate", "the probability of zeroing an entry"}, {"opts", "training=, name=", "{training=true}"}},
  LAYER .. "; kept entries scaled by 1 / (1 - rate) while training",
  "drop = mg.nn.Dropout(0.5, {training = false})\ndrop(mg.ones(3)) --> {1.0, 1.0, 1.0}")
E("nn.BatchNorm", {{"opts", "momentum=, epsilon=, training=, name=", "{momentum=0.99, epsilon=1e-3, training=true}"}},
  LAYER .. ", normalizing each feature over the batch",
  "bn = mg.nn.BatchNorm()\nbn(mg.tensor{{1, 10}, {3, 30}}) --> {{-0.9995, -1.0000}, { 0.9995,  1.0000}}")
E("nn.Conv2D", {{"filters", "the output channels"}, {"kernel_size", "an integer or {height, width}"},
                {"opts", "strides=, padding= \"valid\" or \"same\", dilation_rate=, activation=, use_bias=, kernel_initializer=", "{padding=\"valid\"}"}},
  LAYER .. ", on images (batch, height, width, channels)",
  "conv = mg.nn.Conv2D(8, 3, {padding = \"same\", activation = \"relu\"})\nconv(mg.ones(2, 28, 28, 1)).shape --> {2, 28, 28, 8}")
local POOL_SIZE = {"pool_size", "an integer or {height, width}", "2"}
local POOL_OPTS = {"opts", "strides=, padding=", "{}"}
E("nn.MaxPool2D", {POOL_SIZE, POOL_OPTS}, LAYER, "mg.nn.MaxPool2D()(mg.ones(1, 28, 28, 8)).shape --> {1, 14, 14, 8}")
E("nn.AvgPool2D", {POOL_SIZE, POOL_OPTS}, LAYER, "mg.nn.AvgPool2D(4)(mg.ones(1, 28, 28, 8)).shape --> {1, 7, 7, 8}")
E("nn.GlobalAveragePooling2D", {{"opts", "keepdims=", "{keepdims=false}"}}, LAYER .. ": (batch, h, w, c) -> (batch, c)",
  "mg.nn.GlobalAveragePooling2D()(mg.ones(2, 7, 7, 16)).shape --> {2, 16}")
E("nn.Flatten", {NAME}, LAYER .. ": (batch, ...) -> (batch, n)", "mg.nn.Flatten()(mg.ones(2, 28, 28)).shape --> {2, 784}")
E("nn.Reshape", {{"target_shape", "each sample's new shape (without the batch)"}, NAME}, LAYER,
  "mg.nn.Reshape{28, 28, 1}(mg.ones(2, 784)).shape --> {2, 28, 28, 1}")
local SUBCLASS = {{"name", "the class's name"}}
E("nn.RecomputeLayer", SUBCLASS, "a layer class: give it init and call",
  [[Block = mg.nn.RecomputeLayer:subclass("Block")
function Block:init (units) self.up, self.down = mg.nn.Dense(4 * units, "relu"), mg.nn.Dense(units) end
function Block:call (x) return self.down(self.up(x)) end
Block(8)(mg.ones(2, 8)).shape --> {2, 8}]])
E("nn.ReversibleLayer", SUBCLASS, "a layer class: give it init, forward and inverse",
  [[Shift = mg.nn.ReversibleLayer:subclass("Shift")
function Shift:init () self.b = mg.Variable(mg.ones(2)) end
function Shift:forward (x) return x + self.b end
function Shift:inverse (y) return y - self.b end
Shift()(mg.zeros(1, 2)) --> {{1.0, 1.0}}]])
E("nn.RevBlock", {{"f", "a layer or function of half the features"}, {"g", "another"},
                  {"opts", "num_layers=, name=, f_side_input=, g_side_input=", "{num_layers=1}"}},
  "a layer called as block(x1, x2), returning y1 = x1 + f(x2), y2 = x2 + g(y1)",
  "block = mg.nn.RevBlock(mg.nn.Dense(4, \"tanh\"), mg.nn.Dense(4, \"tanh\"), {num_layers = 2})\ny1, y2 = block(mg.ones(2, 4), mg.ones(2, 4))\ny2.shape --> {2, 4}")
E("nn.AffineCoupling", {{"net", "a layer mapping the first half of the features to twice the rest"},
                        {"opts", "swap=, clamp=", "{swap=false, clamp=2}"}},
  "a layer called as layer(x [, logdet]), returning y and the log-determinant per sample",
  "mg.random.seed(0)\nflow = mg.nn.AffineCoupling(mg.nn.Dense(4))\ny, logdet = flow(mg.ones(3, 4), mg.zeros(3))\nlogdet.shape --> {3}")
E("nn.InvertibleLinear", {}, "a layer called as layer(x [, logdet]), returning y and the log-determinant per sample",
  "mg.random.seed(0)\nmix = mg.nn.InvertibleLinear()\ny, logdet = mix(mg.ones(3, 4), mg.zeros(3))\nx = mix:inverse(y, logdet)\n(x - 1):abs():max():item() < 1e-5 --> true")
E("nn.checkpoint_sequential", {{"layers", "a list of layers (or a Sequential)"}, {"segments", "how many segments"}, {"x", "the input"}},
  "the last layer's output",
  "layers = {mg.nn.Dense(4, \"tanh\"), mg.nn.Dense(4, \"tanh\"), mg.nn.Dense(4, \"tanh\"), mg.nn.Dense(1)}\nmg.nn.checkpoint_sequential(layers, 2, mg.ones(2, 4)).shape --> {2, 1}")
E("nn.dropout", {X, {"rate", "the probability of zeroing an entry"}}, "a tensor shaped like x",
  "mg.random.seed(0)\ny = mg.nn.dropout(mg.ones(1000), 0.5)\ny:max() --> 2.0")
E("nn.glorot_uniform", {SHAPE, FDTYPE}, "a tensor of draws in +-sqrt(6 / (fan_in + fan_out))",
  "mg.random.seed(0)\nmg.nn.glorot_uniform{3, 2}.shape --> {3, 2}")
E("nn.softmax_cross_entropy", {{"logits", "a tensor (batch, classes)"}, {"labels", "int64 class numbers 1..classes, or probabilities like logits"}},
  "a scalar tensor", "mg.nn.softmax_cross_entropy(mg.tensor{{0, 0}}, mg.tensor({1}, \"int64\")) --> 0.6931")
E("nn.mean_squared_error", {{"y", "the predictions, a tensor"}, {"target", "the targets, y's shape (a bfloat16 y under autocast with a float32 target is fine)"}},
  "a scalar tensor", "mg.nn.mean_squared_error(mg.tensor{1, 4}, mg.tensor{1, 2}) --> 2.0")
E("Layer:subclass", SUBCLASS, "a new layer class, a table to give methods to (init, build, call)",
  [[Scale = mg.nn.Layer:subclass("Scale")
function Scale:build (input_shape) self.w = self:add_variable("w", mg.ones(input_shape[#input_shape])) end
function Scale:call (x) return x * self.w end
Scale()(mg.tensor{{1, 2}}) --> {{1.0, 2.0}}]])
E("Layer:summary", {{"opts", "input_shape= (without the batch axis: builds an unbuilt model), print_fn= (receives each line)", "{}"}},
  "the table's text; prints it (or gives each line to print_fn)", "model = mg.nn.Sequential{mg.nn.Dense(8, \"relu\"), mg.nn.Dense(1)}\nmodel:summary{input_shape = {3}}")
E("Layer:add_variable", {{"name", "the variable's name within the layer"}, {"init", "a tensor, a number or a nested table"},
                         {"opts", "trainable=", "{trainable=true}"}},
  "a Variable, kept in layer.variables",
  [[Bias = mg.nn.Layer:subclass("Bias")
function Bias:build (input_shape) self.b = self:add_variable("b", mg.zeros(input_shape[2])) end
function Bias:call (x) return x + self.b end
layer = Bias()
layer(mg.ones(1, 3)) --> {{1.0, 1.0, 1.0}}
#layer.variables --> 1]])
E("Layer:build", {{"input_shape", "the input's shape, the batch first (nil allowed)"}, FDTYPE},
  "nothing; the layer's variables exist after it",
  "layer = mg.nn.Dense(3)\nlayer:build{nil, 5}\nlayer.kernel.shape --> {5, 3}")
E("Layer:track", {{"sublayer", "a layer"}}, "sublayer",
  [[Pair = mg.nn.Layer:subclass("Pair")
function Pair:init () self.inner = self:track(mg.nn.Dense(2)) end
function Pair:call (x) return self.inner(x) * 2 end
outer = Pair()
outer(mg.ones(1, 3)).shape --> {1, 2}
#outer.variables --> 2]])
E("Layer:call", {{"x", "the input"}, {"...", "more arguments"}}, "the layer's output",
  "mg.nn.Dense(2):call(mg.ones(1, 3)).shape --> {1, 2}")
E("Layer:describe", {}, "a string", "mg.nn.Dense(3, \"relu\", {name = \"hidden\"}):describe() --> moongrad.nn.Dense 'hidden' (units=3, activation=relu)")
E("Layer:save_weights", {PATH}, "the model; writes a safetensors file",
  "model = mg.nn.Sequential{mg.nn.Dense(2)}\nmodel:build{nil, 3}\npath = os.tmpname()\nmodel:save_weights(path)\nos.remove(path)")
E("Layer:load_weights", {PATH}, "the model, its variables holding the file's values",
  [[model = mg.nn.Sequential{mg.nn.Dense(2)}
model:build{nil, 3}
path = os.tmpname()
model:save_weights(path)
copy = mg.nn.Sequential{mg.nn.Dense(2)}
copy:build{nil, 3}
copy:load_weights(path)
os.remove(path)
(copy.variables[1]:value() - model.variables[1]:value()):abs():max():item() --> 0.0]])
E("Sequential:add", {{"layer", "a layer"}}, "the model", "model = mg.nn.Sequential{}\nmodel:add(mg.nn.Dense(4))\nmodel:add(mg.nn.Dense(1))\nmodel(mg.ones(2, 3)).shape --> {2, 1}")

E("nn.Embedding", {{"input_dim", "the number of ids"}, {"output_dim", "the vector size"},
                   {"opts", "embeddings_initializer=, dtype=, name=", "{embeddings_initializer=\"uniform\"}"}},
  LAYER .. ": int64 ids (...) -> (..., output_dim)",
  "emb = mg.nn.Embedding(100, 8)\nemb(mg.tensor({{1, 5, 9}}, \"int64\")).shape --> {1, 3, 8}")
E("nn.PositionalEmbedding", {{"sequence_length", "the longest sequence"}, {"opts", "initializer=, name=", "{initializer=\"uniform\"}"}},
  LAYER .. ": (batch, n, dim) -> the same, a position vector added",
  "pos = mg.nn.PositionalEmbedding(16)\npos(mg.zeros(2, 10, 8)).shape --> {2, 10, 8}")
E("nn.LayerNorm", {{"opts", "epsilon=, center=, scale=, name=", "{epsilon=1e-5, center=true, scale=true}"}},
  LAYER, "mg.nn.LayerNorm()(mg.tensor{{1, 2, 3}}) --> {{-1.2247,  0.0000,  1.2247}}")
E("nn.MultiHeadAttention", {{"heads", "the number of heads"}, {"dim", "the model's width, split among the heads (PyTorch's embed_dim)"},
                            {"opts", "causal=, dropout=, use_bias=, fused=, training=", "{causal=false, dropout=0}"}},
  "a layer called as mha(x) or mha(query, value [, {mask=, training=}]): (batch, n, dim)",
  "mha = mg.nn.MultiHeadAttention(2, 16, {causal = true})\nmha(mg.ones(1, 5, 16)).shape --> {1, 5, 16}")
E("nn.TransformerBlock", {{"heads", "the number of heads"}, {"dim", "the model's width: the input's features"},
                          {"opts", "mlp_dim=, causal=, dropout=, activation=, epsilon=, fused=, training=", "{mlp_dim=4*dim}"}},
  LAYER .. ": (batch, n, features) -> the same shape",
  "block = mg.nn.TransformerBlock(2, 16, {causal = true})\nblock(mg.ones(1, 5, 16)).shape --> {1, 5, 16}")

-- }=============================================================

-- {================= losses, metrics, optimizers =================

local LOSS_OPTS = {"opts", "reduction= \"mean\" \"sum\" or \"none\", mask= (a bool or 0/1 tensor of y_true's shape)", "{reduction=\"mean\"}"}
local XENT_OPTS = {"opts", "from_logits=, reduction=, mask=, label_smoothing=", "{from_logits=false, reduction=\"mean\"}"}
local LOSS_RET = "a scalar tensor (reduction \"none\": one value per sample)"
E("losses.mean_squared_error", {YT, YP, LOSS_OPTS}, LOSS_RET,
  "mg.losses.mean_squared_error(mg.tensor{{1, 2}}, mg.tensor{{1, 4}}) --> 2.0")
E("losses.mean_absolute_error", {YT, YP, LOSS_OPTS}, LOSS_RET,
  "mg.losses.mean_absolute_error(mg.tensor{{1, 2}}, mg.tensor{{1, 4}}) --> 1.0")
E("losses.binary_crossentropy", {{"y_true", "0/1 labels"}, {"y_pred", "probabilities (logits with from_logits)"}, XENT_OPTS}, LOSS_RET,
  "mg.losses.binary_crossentropy(mg.tensor{{1, 0}}, mg.tensor{{0.9, 0.2}}) --> 0.1643\nmg.losses.binary_crossentropy(mg.tensor{{1}}, mg.tensor{{0}}, {from_logits = true}) --> 0.6931")
E("losses.categorical_crossentropy", {{"y_true", "one-hot labels (batch, classes)"}, {"y_pred", "probabilities (logits with from_logits)"}, XENT_OPTS}, LOSS_RET,
  "mg.losses.categorical_crossentropy(mg.tensor{{0, 1}}, mg.tensor{{0.5, 0.5}}) --> 0.6931")
E("losses.sparse_categorical_crossentropy", {{"y_true", "int64 class numbers 1..C (batch)"}, {"y_pred", "probabilities (batch, C) (logits with from_logits)"}, XENT_OPTS}, LOSS_RET,
  "mg.losses.sparse_categorical_crossentropy(mg.tensor({2}, \"int64\"), mg.tensor{{0, 0}}, {from_logits = true}) --> 0.6931")
E("losses.softmax_cross_entropy", {{"logits", "a tensor (batch, classes)"}, {"labels", "int64 class numbers or probabilities"}},
  "a scalar tensor", "mg.losses.softmax_cross_entropy(mg.tensor{{0, 0}}, mg.tensor({2}, \"int64\")) --> 0.6931")
local CLASS_RET = "a loss object: loss(y_true, y_pred) gives the loss; compile takes it"
local REDUCTION = {"opts", "reduction=", "{reduction=\"mean\"}"}
local XENT_CLASS = {"opts", "from_logits=, reduction=, label_smoothing=", "{from_logits=false}"}
E("losses.MeanSquaredError", {REDUCTION}, CLASS_RET, "mse = mg.losses.MeanSquaredError()\nmse(mg.tensor{0, 0}, mg.tensor{1, 3}) --> 5.0")
E("losses.MeanAbsoluteError", {REDUCTION}, CLASS_RET, "mae = mg.losses.MeanAbsoluteError()\nmae(mg.tensor{0, 0}, mg.tensor{1, 3}) --> 2.0")
E("losses.BinaryCrossentropy", {XENT_CLASS}, CLASS_RET,
  "bce = mg.losses.BinaryCrossentropy{from_logits = true}\nbce(mg.tensor{{1}}, mg.tensor{{0}}) --> 0.6931")
E("losses.CategoricalCrossentropy", {XENT_CLASS}, CLASS_RET,
  "cce = mg.losses.CategoricalCrossentropy{label_smoothing = 0.1}\ncce(mg.tensor{{0, 1}}, mg.tensor{{0.5, 0.5}}) --> 0.6931")
E("losses.SparseCategoricalCrossentropy", {XENT_CLASS}, CLASS_RET,
  "loss = mg.losses.SparseCategoricalCrossentropy{from_logits = true}\nloss(mg.tensor({1, 2}, \"int64\"), mg.tensor{{2, 0}, {0, 2}}) --> 0.1269")
E("losses.get", {{"spec", "a name (\"mse\", \"mean_squared_error\", \"binary_crossentropy\", ...), a loss object or a function"}},
  "a function(y_true, y_pred)", "mse = mg.losses.get(\"mse\")\nmse(mg.tensor{1}, mg.tensor{3}) --> 4.0")

local METRIC_RET = "a float64 scalar tensor"
E("metrics.accuracy", {YT, YP}, METRIC_RET, "mg.metrics.accuracy(mg.tensor{1, 2, 3}, mg.tensor{1, 2, 4}) --> 1.0")
E("metrics.sparse_categorical_accuracy", {{"y_true", "int64 class numbers 1..C"}, {"y_pred", "scores (batch, C)"}}, METRIC_RET,
  "mg.metrics.sparse_categorical_accuracy(mg.tensor({2, 1}, \"int64\"), mg.tensor{{0.1, 0.9}, {0.2, 0.8}}) --> 0.5000")
E("metrics.categorical_accuracy", {{"y_true", "one-hot labels (batch, C)"}, {"y_pred", "scores (batch, C)"}}, METRIC_RET,
  "mg.metrics.categorical_accuracy(mg.tensor{{0, 1}}, mg.tensor{{0.3, 0.7}}) --> 1.0")
E("metrics.binary_accuracy", {{"y_true", "0/1 labels"}, {"y_pred", "probabilities"}}, METRIC_RET,
  "mg.metrics.binary_accuracy(mg.tensor{1, 0, 1}, mg.tensor{0.9, 0.6, 0.2}) --> 0.3333")
E("metrics.mean_squared_error", {YT, YP}, METRIC_RET, "mg.metrics.mean_squared_error(mg.tensor{1, 2}, mg.tensor{1, 4}) --> 2.0")
E("metrics.mean_absolute_error", {YT, YP}, METRIC_RET, "mg.metrics.mean_absolute_error(mg.tensor{1, 2}, mg.tensor{1, 4}) --> 1.0")
E("metrics.perplexity", {{"y_true", "int64 token numbers 1..V"}, {"y_pred", "probabilities (..., V), or logits with from_logits"}, {"opts", "from_logits=, mask=", "{from_logits=false}"}},
  METRIC_RET, "mg.metrics.perplexity(mg.tensor({1, 2}, \"int64\"), mg.zeros(2, 4), {from_logits = true}) --> 4.0000")
E("metrics.get", {{"spec", "a name (\"accuracy\", \"mae\", ...) or a function"}, {"loss_name", "the compiled loss's name, for \"accuracy\"", "nil"},
                  {"from_logits", "whether the loss takes logits", "nil"}},
  "a function(y_true, y_pred)",
  "acc = mg.metrics.get(\"accuracy\", \"sparse_categorical_crossentropy\")\nacc(mg.tensor({2}, \"int64\"), mg.tensor{{0.1, 0.9}}) --> 1.0")

local CLIP = "weight_decay=, clipnorm=, clipvalue=, global_clipnorm="
local OPT_RET = "an optimizer: opt:apply_gradients(grads, vars), or give it to compile"
E("optim.SGD", {{"opts", "learning_rate=, momentum=, nesterov=, " .. CLIP, "{learning_rate=0.01, momentum=0}"}}, OPT_RET,
  "opt = mg.optim.SGD{learning_rate = 0.1}\nw = mg.Variable(mg.tensor{1, 2})\nopt:apply_gradients({mg.tensor{1, 1}}, {w})\nw:value() --> {0.9000, 1.9000}")
E("optim.Adam", {{"opts", "learning_rate=, beta1=, beta2=, epsilon=, " .. CLIP .. " (or the learning rate alone)",
                  "{learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-7}"}}, OPT_RET,
  "opt = mg.optim.Adam{learning_rate = 0.1}\nw = mg.Variable(mg.tensor{1, 2})\nopt:apply_gradients({mg.tensor{1, 1}}, {w})\nw:value() --> {0.9000, 1.9000}")
E("optim.AdamW", {{"opts", "learning_rate=, beta1=, beta2=, epsilon=, " .. CLIP, "{learning_rate=0.001, weight_decay=0.01}"}}, OPT_RET,
  "opt = mg.optim.AdamW{learning_rate = 0.1, weight_decay = 0.1}\nw = mg.Variable(mg.tensor{1, 2})\nopt:apply_gradients({mg.tensor{1, 1}}, {w})\nw:value() --> {0.8900, 1.8800}")
E("optim.RMSprop", {{"opts", "learning_rate=, rho=, momentum=, epsilon=, centered=, " .. CLIP, "{learning_rate=0.001, rho=0.9}"}}, OPT_RET,
  "opt = mg.optim.RMSprop{learning_rate = 0.01}\nw = mg.Variable(mg.tensor{1, 2})\nopt:apply_gradients({mg.tensor{1, 1}}, {w})\nw:value() --> {0.9684, 1.9684}")
E("optim.LossScaleOptimizer", {{"opt", "the optimizer to wrap"},
                               {"opts", "initial_scale=, dynamic=, dynamic_growth_steps=, name=", "{initial_scale=32768, dynamic=true, dynamic_growth_steps=2000}"}},
  "an optimizer: opt:scale_loss(loss) while the tape records, then opt:apply_gradients(grads, vars) (false: a step skipped)",
  "opt = mg.optim.LossScaleOptimizer(mg.optim.SGD(0.1), {initial_scale = 8})\nw = mg.Variable(mg.tensor{1, 2})\nopt:apply_gradients({mg.tensor{8, 8}}, {w}) --> true\nw:value() --> {0.9000, 1.9000}\nopt:apply_gradients({mg.tensor{1 / 0, 8}}, {w}) --> false\nopt.loss_scale --> 4.0")
E("optim.get", {{"spec", "an optimizer, or \"sgd\" \"adam\" \"adamw\" \"rmsprop\""}}, "an optimizer",
  "opt = mg.optim.get(\"adam\")\nopt:get_learning_rate() --> 0.001")
E("optim.schedules", {}, "the table mg.schedules", "mg.optim.schedules == mg.schedules --> true")
E("Optimizer:apply_gradients", {{"grads", "a list of gradients (nil entries skipped), or {grad, var} pairs"}, {"vars", "the list of Variables"}},
  "nothing; the variables move",
  [[w = mg.Variable(mg.tensor{3})
opt = mg.optim.SGD{learning_rate = 0.1}
for step = 1, 20 do
  t = mg.tape()
  loss = (w * w):sum()
  t:stop()
  opt:apply_gradients(t:gradient(loss, {w}), {w})
end
w:value() --> {0.0346}]])
E("Optimizer:minimize", {{"loss", "the tensor the tape recorded"}, {"vars", "the list of Variables"}, {"tape", "the tape (mg.tape())"}},
  "nothing; the variables move (opt:apply_gradients(tape:gradient(loss, vars), vars); the distributed wrappers reduce each bucket of gradients while the backward runs)",
  [[w = mg.Variable(mg.tensor{3})
opt = mg.optim.SGD{learning_rate = 0.1}
t = mg.tape()
loss = (w * w):sum()
t:stop()
opt:minimize(loss, {w}, t)
w:value() --> {2.4000}]])
E("Optimizer:build", {{"vars", "the list of Variables"}}, "the optimizer",
  "w = mg.Variable(mg.zeros(2))\nopt = mg.optim.Adam{}\nopt:build({w})\nopt:get_state({w}).iterations --> 0")
E("Optimizer:get_state", {{"vars", "the Variables whose slots are given", "every built one"}}, "a table {iterations=, optimizer=, slots={name={tensor per variable}}}",
  "w = mg.Variable(mg.zeros(2))\nopt = mg.optim.SGD{momentum = 0.9}\nopt:apply_gradients({mg.ones(2)}, {w})\nopt:get_state({w}).iterations --> 1")
E("Optimizer:set_state", {{"state", "what get_state returned"}, {"vars", "the same Variables", "every built one"}}, "the optimizer",
  "w = mg.Variable(mg.zeros(2))\nopt = mg.optim.Adam{}\nopt:apply_gradients({mg.ones(2)}, {w})\nstate = opt:get_state({w})\nfresh = mg.optim.Adam{}\nfresh:set_state(state, {w})\nfresh:get_state({w}).iterations --> 1")
E("Optimizer:get_learning_rate", {}, "a number", "mg.optim.SGD{learning_rate = 0.05}:get_learning_rate() --> 0.05")
local SCHED_RET = "a schedule: schedule(step) is the rate at a step (from 0); optimizers take it as learning_rate"
E("schedules.ExponentialDecay", {{"opts", "initial_learning_rate=, decay_steps=, decay_rate=, staircase="}}, SCHED_RET,
  "s = mg.schedules.ExponentialDecay{initial_learning_rate = 0.1, decay_steps = 10, decay_rate = 0.5}\ns(10) --> 0.05\nopt = mg.optim.SGD{learning_rate = s}\nopt:get_learning_rate() --> 0.1")
E("schedules.CosineDecay", {{"opts", "initial_learning_rate=, decay_steps=, alpha=, warmup_steps=, warmup_target="}}, SCHED_RET,
  "s = mg.schedules.CosineDecay{initial_learning_rate = 1, decay_steps = 100}\ns(0), s(50), s(100) --> 1.0, 0.5, 0.0")
E("schedules.LinearWarmup", {{"opts", "warmup_steps=, after= (a rate or a schedule), initial_learning_rate="}}, SCHED_RET,
  "s = mg.schedules.LinearWarmup{warmup_steps = 10, after = 0.1}\ns(5), s(20) --> 0.05, 0.1")
E("schedules.PiecewiseConstantDecay", {{"opts", "boundaries= (steps), values= (one more than boundaries)"}}, SCHED_RET,
  "s = mg.schedules.PiecewiseConstantDecay{boundaries = {100}, values = {0.1, 0.01}}\ns(50), s(150) --> 0.1, 0.01")

-- }=============================================================

-- {========================== fit, data ==========================

-- a model learning y = 2x + 1 (fit's entries start from it)
local FIT = "mg.random.seed(0)\nx = mg.tensor{{0}, {1}, {2}, {3}}\ny = x * 2 + 1\nmodel = mg.nn.Sequential{mg.nn.Dense(1)}\n" ..
            "model:compile{optimizer = mg.optim.SGD{learning_rate = 0.1}, loss = \"mse\", metrics = {\"mae\"}}\n"
local XY = {{"x", "the inputs (a tensor, a table of tensors, or a Dataset)"}, {"y", "the targets (nil with a Dataset of pairs)"}}
E("Layer:compile", {{"opts", "optimizer= (a name or an optimizer), loss= (a name, object or function), metrics= (a list)", "{optimizer=\"rmsprop\"}"}},
  "the model; fit, evaluate and train_step use them", FIT .. "logs = model:test_step(x, y)\nlogs.loss ~= nil and logs.mae ~= nil --> true")
E("Layer:fit", {XY[1], XY[2], {"opts", "epochs=, batch_size=, validation_data= or validation_split=, shuffle=, callbacks=, verbose=, seed=, ...", "{epochs=1, batch_size=32, verbose=\"auto\"}"}},
  "a History: history.history.loss and each metric's per-epoch values",
  FIT .. "history = model:fit(x, y, {epochs = 200, batch_size = 4, verbose = 0})\n#history.history.loss --> 200\nmg.round(model:predict(mg.tensor{{10}})) --> {{21.0}}")
E("Layer:evaluate", {XY[1], XY[2], {"opts", "batch_size=, verbose=", "{batch_size=32, verbose=\"auto\"}"}},
  "a table {loss=, and each metric=} of numbers",
  FIT .. "model:fit(x, y, {epochs = 200, verbose = 0})\nlogs = model:evaluate(x, y, {verbose = 0})\nlogs.loss < 1e-6 --> true")
E("Layer:predict", {XY[1], {"opts", "batch_size=, verbose=", "{batch_size=32, verbose=0}"}}, "the outputs, batches concatenated",
  FIT .. "model:predict(x).shape --> {4, 1}")
E("Layer:train_step", {{"x", "one batch of inputs"}, {"y", "its targets"}}, "the logs {loss=, metric=...} of the batch",
  FIT .. "before = model:train_step(x, y).loss\nafter = model:train_step(x, y).loss\nafter < before --> true")
E("Layer:test_step", {{"x", "one batch of inputs"}, {"y", "its targets"}}, "the logs {loss=, metric=...}; the weights do not move",
  FIT .. "model:test_step(x, y).loss == model:test_step(x, y).loss --> true")
E("callbacks.EarlyStopping", {{"opts", "monitor=, min_delta=, patience=, mode=, baseline=, restore_best_weights=, start_from_epoch=, verbose=", "{monitor=\"val_loss\", patience=0}"}},
  "a callback for fit's callbacks=",
  FIT .. "stop = mg.callbacks.EarlyStopping{monitor = \"loss\", patience = 2, min_delta = 1e-3}\nhistory = model:fit(x, y, {epochs = 100, verbose = 0, callbacks = {stop}})\n#history.history.loss < 100 --> true")
E("callbacks.LambdaCallback", {{"opts", "on_train_begin=, on_train_end=, on_epoch_begin=, on_epoch_end= (function(epoch, logs)), on_batch_begin=, on_batch_end="}},
  "a callback for fit's callbacks=",
  FIT .. "epochs = 0\ncount = mg.callbacks.LambdaCallback{on_epoch_end = function(epoch, logs) epochs = epochs + 1 end}\nmodel:fit(x, y, {epochs = 3, verbose = 0, callbacks = {count}})\nepochs --> 3")
E("callbacks.TerminateOnNaN", {{"opts", "verbose=", "{}"}}, "a callback for fit's callbacks=",
  FIT .. "model:fit(x, y, {epochs = 2, verbose = 0, callbacks = {mg.callbacks.TerminateOnNaN()}})")
E("callbacks.ProgbarLogger", {{"opts", "out= (a file), tty=, verbose= 1 (a bar) or 2 (a line per epoch)", "{verbose=1}"}},
  "a callback for fit's callbacks= (fit adds one by itself for verbose 1 or 2)",
  FIT .. "model:fit(x, y, {epochs = 2, verbose = 0, callbacks = {mg.callbacks.ProgbarLogger{verbose = 2, out = io.stdout}}})")
E("callbacks.History", {}, "a History: history.history = {loss = {...}, ...}; history:plot([path])",
  FIT .. "history = model:fit(x, y, {epochs = 5, verbose = 0})\nhistory --> moongrad.callbacks.History (5 epochs: loss, mae)")
E("callbacks.ModelCheckpoint", {{"path", "the file; {epoch} in it is replaced by the epoch"}, {"opts", "every=, optimizer=", "{every=1}"}},
  "a callback for fit's callbacks= (checkpoint.callback)",
  FIT .. "dir = os.tmpname()\nos.remove(dir)\nos.execute(\"mkdir \" .. dir)\nmodel:fit(x, y, {epochs = 2, verbose = 0, callbacks = {mg.callbacks.ModelCheckpoint(dir .. \"/ckpt{epoch}.safetensors\")}})\nio.open(dir .. \"/ckpt2.safetensors\") ~= nil --> true\nos.execute(\"rm -r \" .. dir)")
E("callbacks.BackupAndRestore", {{"opts", "backup_dir= (a directory, made if missing)"}}, "a callback for fit's callbacks=",
  FIT .. "dir = os.tmpname()\nos.remove(dir)\nmodel:fit(x, y, {epochs = 3, verbose = 0, callbacks = {mg.callbacks.BackupAndRestore{backup_dir = dir}}})")
E("checkpoint.save", {PATH, {"what", "model=, optimizer=, epoch=, rng= (the random state), metadata= (strings)"}}, "nothing; writes a safetensors file",
  FIT .. "model:fit(x, y, {verbose = 0})\npath = os.tmpname()\nmg.checkpoint.save(path, {model = model, epoch = 1})\nmg.checkpoint.restore(path, {model = model}).epoch --> 1\nos.remove(path)")
E("checkpoint.restore", {PATH, {"into", "model=, optimizer=, rng="}}, "a table {epoch=, rng=, metadata=}",
  FIT .. "model:fit(x, y, {verbose = 0})\npath = os.tmpname()\nmg.checkpoint.save(path, {model = model, epoch = 7, metadata = {note = \"first\"}})\ninfo = mg.checkpoint.restore(path, {model = model})\ninfo.epoch, info.metadata.note --> 7, first\nos.remove(path)")
E("checkpoint.callback", {{"path", "the file; {epoch} in it is replaced by the epoch"}, {"opts", "every=, optimizer=", "{every=1}"}},
  "a callback for fit's callbacks=",
  FIT .. "dir = os.tmpname()\nos.remove(dir)\nos.execute(\"mkdir \" .. dir)\nmodel:fit(x, y, {epochs = 2, verbose = 0, callbacks = {mg.checkpoint.callback(dir .. \"/ckpt{epoch}.safetensors\")}})\nio.open(dir .. \"/ckpt2.safetensors\") ~= nil --> true\nos.execute(\"rm -r \" .. dir)")
E("checkpoint.names", {MODEL}, "a list of {name=, var=}",
  FIT .. "model:build{nil, 1}\nmg.checkpoint.names(model)[1].name --> dense/kernel")

local ST = "path = os.tmpname()\n"
E("save", {PATH, {"tensors", "a table of name = tensor (nested tables flattened with /)"}, {"opts", "metadata= (string keys and values)", "{}"}},
  "nothing; writes a safetensors file",
  ST .. "mg.save(path, {w = mg.ones(2), layer = {b = mg.zeros(1)}}, {metadata = {step = \"10\"}})\ntensors, meta = mg.load(path)\ntensors[\"layer/b\"], meta.step --> {0.0}, 10\nos.remove(path)")
E("load", {PATH}, "two tables: name -> tensor, and the metadata",
  ST .. "mg.save(path, {w = mg.tensor{1, 2}})\nmg.load(path).w --> {1.0, 2.0}\nos.remove(path)")
local DS = "ds = mg.data.Dataset(mg.arange(6):reshape(3, 2), mg.tensor({1, 2, 3}, \"int64\"))\n"
E("data.Dataset", {{"x, y, ...", "tensors (or a table {x, y, ...}) whose first axes have one size"}},
  "a Dataset: #ds elements, each (x[i], y[i], ...); fit, evaluate and predict take it",
  DS .. "#ds --> 3\nfor x, y in ds:iter() do print(x, y) end")
E("Dataset:shuffle", {{"seed", "an integer"}, {"opts", "reshuffle_each_iteration=", "{reshuffle_each_iteration=true}"}},
  "a Dataset", DS .. "for x, y in ds:shuffle(42):iter() do io.write(y:item(), \" \") end")
E("Dataset:batch", {{"size", "the batch size"}, {"opts", "drop_remainder=", "{drop_remainder=false}"}},
  "a Dataset of batches", DS .. "for x, y in ds:batch(2):iter() do print(x.shape[1], y) end")
E("Dataset:take", {{"n", "how many"}}, "a Dataset", DS .. "#ds:take(2) --> 2")
E("Dataset:skip", {{"n", "how many"}}, "a Dataset", DS .. "#ds:skip(2) --> 1")
E("Dataset:map", {{"fn", "function(x, y, ...) returning the new element"}}, "a Dataset",
  DS .. "doubled = ds:map(function(x, y) return x * 2, y end)\nfor x, y in doubled:take(1):iter() do print(x) end")
E("Dataset:iter", {{"epoch", "the epoch, for shuffled views", "1"}}, "an iterator: for x, y in ds:iter() do ... end",
  DS .. "for x, y in ds:iter() do print(x, y) end")
E("Dataset:batches", {{"size", "the batch size"}, {"opts", "drop_remainder=", "{}"}, {"epoch", "the epoch", "1"}},
  "an iterator over batches", DS .. "for x, y in ds:batches(2) do print(y) end")
E("Dataset:tensors", {{"epoch", "the epoch", "1"}}, "the elements stacked: x, y, ...",
  DS .. "x, y = ds:tensors()\ny --> {1, 2, 3}")
E("data.read_csv", {PATH, {"opts", "header= (true, false; unset: detected when the first line holds no number), delimiter=, dtype=, "
                          .. "columns= (names or 1-based numbers), label= (a name or number: y apart), label_dtype= (\"int64\": exact)",
                          "{delimiter=\",\", dtype=\"float32\"}"}},
  "x (rows, columns), then y (rows) with a label, then the header's names of x's columns (nil without a header)",
  [[path = os.tmpname()
f = io.open(path, "w")
f:write("width,height,kind\n1.5,2,1\n3,4.5,2\n")
f:close()
x, y, names = mg.data.read_csv(path, {label = "kind", label_dtype = "int64"})
x --> {{1.5000, 2.0000}, {3.0000, 4.5000}}
y --> {1, 2}
names[2] --> height
os.remove(path)]])
E("data.read_idx", {PATH, {"opts", "dtype=", "{}"}}, "a tensor (uint8 data as float32 unless dtype)",
  [[path = os.tmpname()
f = io.open(path, "wb")
f:write(string.char(0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 4))
f:close()
mg.data.read_idx(path) --> {{1.0, 2.0}, {3.0, 4.0}}
os.remove(path)]])
E("data.debian_file", {{"package", "a Debian package's name"}, {"path", "a file inside it"}},
  "the file's local path (downloaded once, then from the cache)",
  "path = mg.data.debian_file(\"wamerican\", \"usr/share/dict/american-english\")\nio.open(path):read(\"l\") ~= nil --> true")
E("data.cache_dir", {}, "a directory's path: $XDG_CACHE_HOME/moongrad/debs or ~/.cache/moongrad/debs", "type(mg.data.cache_dir()) --> string")
E("data.fashion_mnist", {}, "train, test: tables {x=, y=}, x (n, 28, 28) float32 in 0..255, y int64 1..10",
  "train, test = mg.data.fashion_mnist()\ntrain.x.shape, test.y.shape --> {60000, 28, 28}, {10000}")
E("data.fashion_mnist_classes", {}, "a list of 10 names", "mg.data.fashion_mnist_classes[1] --> T-shirt/top")
E("data.digits", {}, "x, y: x (1797, 64) float32 in 0..16, y int64 1..10",
  "x, y = mg.data.digits()\nx.shape, y:max() --> {1797, 64}, 10")
E("data.permutation", {{"n", "how many"}, {"seed", "an integer"}, {"epoch", "an integer"}}, "an int64 tensor of 1..n in an order",
  "mg.data.permutation(5, 1, 1) --> {1, 5, 3, 4, 2}")

-- }=============================================================

-- {===================== distributed, the rest =====================

-- distributed examples run under mpirun, in a script given to moongrad
local MPI = "-- run with: mpirun -n 2 moongrad script.lua\n"
local ROOT = {"root", "the rank whose values are sent", "0"}
E("distributed.init", {{"opts", "timeout= (seconds)", "{timeout=600}"}}, "rank, size",
  MPI .. "-- rank, size = mg.distributed.init()   --> 0, 2 on the first process")
E("distributed.rank", {}, "an integer from 0", MPI .. "-- mg.distributed.rank() --> 0 on the first process")
E("distributed.size", {}, "an integer", MPI .. "-- mg.distributed.size() --> 2")
E("distributed.barrier", {}, "nothing", MPI .. "-- mg.distributed.barrier()")
E("distributed.allreduce", {{"t", "a tensor or Variable"}, {"opts", "op= \"sum\" \"mean\" \"max\" \"min\"", "{op=\"sum\"}"}},
  "the combined tensor (a Variable: itself, updated)", MPI .. "-- mg.distributed.allreduce(mg.tensor{mg.distributed.rank()}) --> {1.0} on 2 ranks")
E("distributed.broadcast", {{"t", "a tensor or Variable"}, ROOT}, "root's values",
  MPI .. "-- w = mg.distributed.broadcast(mg.random.normal{3})   -- the same on every rank")
E("distributed.allgather", {{"t", "a tensor"}}, "the ranks' tensors concatenated along the first axis",
  MPI .. "-- mg.distributed.allgather(mg.tensor{mg.distributed.rank()}) --> {0.0, 1.0}")
E("distributed.broadcast_variables", {{"vars", "a list of Variables"}, ROOT}, "nothing",
  MPI .. "-- mg.distributed.broadcast_variables(model.variables)")
E("distributed.broadcast_optimizer_state", {{"opt", "an optimizer"}, {"vars", "its variables"}, ROOT}, "nothing",
  MPI .. "-- mg.distributed.broadcast_optimizer_state(opt, model.variables)")
E("distributed.local_size", {}, "an integer", MPI .. "-- mg.distributed.local_size() --> 2 (mpirun -np 2 on one machine)")
E("distributed.DistributedOptimizer", {{"opt", "an optimizer"}, {"opts", "fusion_bytes= (4 MiB), op= \"mean\" or \"sum\", overlap= \"auto\" (true across machines, and for stage 2), true or false", "{}"}}, "an optimizer",
  MPI .. "-- opt = mg.distributed.DistributedOptimizer(mg.optim.Adam{})\n-- opt:minimize(loss, vars, tape)   -- buckets sent while the backward runs\n-- model:compile{optimizer = opt, loss = \"mse\"}")
E("distributed.ShardedOptimizer", {{"opt", "an optimizer"}, {"opts", "stage= 1 or 2, fusion_bytes= (4 MiB), op= \"mean\" or \"sum\", overlap= \"auto\" (true across machines, and for stage 2), true or false", "{}"}},
  "an optimizer", MPI .. "-- opt = mg.distributed.ShardedOptimizer(mg.optim.AdamW{}, {stage = 2})\n-- opt:minimize(loss, vars, tape)   -- this rank keeps 1/N of the gradients")
E("distributed.reduce_scatter", {{"t", "a tensor, the same shape on every rank"}, {"opts", "op= \"sum\" or \"mean\"", "{}"}},
  "a 1-D tensor: this rank's shard of the flattened result",
  MPI .. "-- mg.distributed.reduce_scatter(mg.ones(4)) --> {2.0, 2.0} on each of 2 ranks")
E("distributed.shard_range", {{"n", "a number of elements"}, {"size", "ranks", "this run's"}, {"rank", "a rank", "this one"}},
  "first, last (1-based; last < first when empty)", "mg.distributed.shard_range(10, 3, 1) --> 4, 6")
E("distributed.stats", {}, "a table {calls=, bytes=, waited=} (waited: seconds minimize waited at its end for communication the backward did not hide)", MPI .. "-- mg.distributed.stats().bytes")
E("distributed.is_initialized", {}, "a boolean", "mg.distributed.is_initialized() --> false")
E("distributed.available", {}, "a boolean", "type(mg.distributed.available()) --> boolean")
E("distributed.finalize", {}, "nothing", MPI .. "-- mg.distributed.finalize()")

local QUIET = "quiet = {write = function() end, flush = function() end}\n"
E("progress", {{"steps", "the number of steps (nil if unknown)"}, {"opts", "out=, tty=, verbose=, width=, interval=, unit=, label=", "{}"}},
  "a progress bar", "bar = mg.progress(3, {tty = false})\nfor i = 1, 3 do bar:update(i, {loss = 1 / i}) end\nbar:finish()")
E("Progress:update", {{"i", "the step done"}, {"values", "a table name = number shown", "nil"}}, "nothing",
  "bar = mg.progress(10)\nbar:update(5, {loss = 0.25})\nbar:stop()")
E("Progress:finish", {{"values", "a table name = number", "nil"}}, "nothing",
  "bar = mg.progress(2)\nbar:update(2)\nbar:finish({loss = 0.1})")
E("Progress:line", {{"i", "the step"}, {"values", "a table name = number", "nil"}, {"final", "true for the last line", "false"}}, "a string",
  QUIET .. "bar = mg.progress(3, {out = quiet, tty = false})\nbar:line(2, {loss = 0.5}) --> 2/3 [===================>..........] - ETA: 0s - loss: 0.5000")
E("Progress:stop", {}, "nothing", "bar = mg.progress(3)\nbar:stop()")
E("plot", {{"series...", "tables or 1-D tensors of y values, or {x, y} pairs, a History"},
           {"opts", "path= (.png or .svg; none: text), title=, xlabel=, ylabel=, logscale=, width=, height=", "{}"}},
  "the path written, or the text when there is no path",
  "print(mg.plot({1, 4, 9, 16}, {width = 30, height = 8}))")

E("notebook.active", {}, "a boolean", "mg.notebook.active() --> false")
E("notebook.display", {{"v", "any value"}, {"opts", "id=, update=", "{}"}}, "nothing (outside a notebook: prints v)",
  "mg.notebook.display(mg.eye(2))")
E("notebook.image", {PATH, {"opts", "id=, update=", "{}"}}, "nothing",
  "if mg.notebook.active() then mg.notebook.image(\"loss.png\") end")
E("notebook.bundle", {{"v", "any value"}}, "a table mime-type -> text", "mg.notebook.bundle(mg.ones(2))[\"text/plain\"] ~= nil --> true")

E("set_num_threads", {{"n", "a count from 1 to 1024 (fixed: the same bits run after run), or \"auto\""}}, "nothing",
  "mg.set_num_threads(1)\n(mg.get_num_threads()) --> 1\nmg.set_num_threads(\"auto\")")
E("get_num_threads", {}, "the count (set, or the machine's cores), \"auto\" or \"fixed\", and the team in use now (1 while other processes hold the cores)",
  "n, mode, team = mg.get_num_threads()\nteam <= n --> true")
E("clock", {}, "a number of seconds", "t0 = mg.clock()\nmg.matmul(mg.ones(256, 256), mg.ones(256, 256))\nmg.clock() - t0 >= 0 --> true")
E("gemm.use", {{"name", "\"auto\" \"dnnl\" or \"openblas\""}}, "nothing", "mg.gemm.use(\"openblas\")\nmg.gemm.use(\"auto\")")
E("gemm.choice", {{"m, n, k", "the product's sizes"}, {"opts", "transpose_a=, transpose_b=", "{}"}}, "a string: library/threads",
  "type(mg.gemm.choice(64, 64, 64)) --> string")

-- }=============================================================

return D

--- moongrad.help: every public function and layer in one place, a signature
-- and a line each; help(name) adds its arguments, result and example
-- (lua/moongrad/help_entries.lua). The REPL's help(x) prints mg.help(x), and `make api-table`
-- writes the API table of docs/reference.md from the same groups (spec/33-help_spec.lua
-- checks that the two agree and that every name reachable in mg has an entry).
-- An entry without a description takes its op's `doc` from the op registry
-- (mg.ops()), so an op's line is written once, in C, beside its kernel.
local mg = require "moongrad"

-- {name, signature, description}; names: "matmul" for mg.matmul, "nn.Dense"
-- for mg.nn.Dense, "Tape:gradient" for a method. Tensor methods are mg's
-- functions (x:sum(1) is mg.sum(x, 1)), so they have no entries of their own.
local groups = {
  {"build", {
    {"constant", "constant(data [, dtype])", "a tensor from a number, a nested table or a tensor (alias tensor); dtype float32 by default"},
    {"tensor", "tensor(data [, dtype])", "the same as constant"},
    {"zeros", "zeros(shape [, dtype])", "a tensor of zeros; shape a table or integers"},
    {"ones", "ones(shape [, dtype])", "a tensor of ones"},
    {"full", "full(shape, value [, dtype])", "a tensor filled with value (a boolean gives bool)"},
    {"zeros_like", "zeros_like(x [, dtype])", "zeros shaped like x"},
    {"ones_like", "ones_like(x [, dtype])", "ones shaped like x"},
    {"arange", "arange([start,] stop [, step] [, dtype])", "start, start + step, ... below stop (0 and 1 by default)"},
    {"eye", "eye(n [, m] [, dtype])", "the n by m identity"},
    {"Variable", "Variable(init [, {name=, trainable=true, dtype=}])", "trainable state that tapes watch (v:value(), v:assign(x))"},
    {"is_tensor", "is_tensor(v)", "whether v is a tensor"},
    {"is_variable", "is_variable(v)", "whether v is a Variable"},
  }},
  {"inspect", {
    {"Tensor.shape", "x.shape", "the sizes, a table ({} for a scalar)"},
    {"Tensor.dtype", "x.dtype", "float32 float64 float16 bfloat16 int64 or bool"},
    {"Tensor.ndim", "x.ndim", "the number of axes"},
    {"Tensor.itemsize", "x.itemsize", "bytes per element (PyTorch's)"},
    {"Tensor.nbytes", "x.nbytes", "bytes of its elements: numel x itemsize (PyTorch's)"},
    {"item", "item(x)", "the value of a one-element tensor as a Lua number or boolean"},
    {"totable", "totable(x)", "the values as nested Lua tables"},
    {"numel", "numel(x)", "the number of entries (#x is the first size)"},
    {"print", "print(...)", "prints values (tensors without the footer) and strings, as tf.print"},
    {"repr", "repr(v [, {width=80, depth=4, items=20}])", "the REPL's text for any value"},
    {"help", "help([x])", "this text: of a function, layer, tensor, tape or name; help() lists the groups"},
    {"version", "version", "the version string"},
    {"ops", "ops()", "the op registry, one {name=, kind=, symbol=, metamethod=, doc=, product=} per op"},
    {"debug.check_numerics", "debug.check_numerics(on)", "on: the first op whose float output holds NaN or Inf raises, naming it; returns the previous setting"},
    {"debug.verify_recompute", "debug.verify_recompute(on)", "on: every recompute_grad as with {verify=true}; returns the previous setting"},
  }},
  {"arithmetic", {
    {"add", "add(a, b)"}, {"sub", "sub(a, b)"}, {"mul", "mul(a, b)"}, {"div", "div(a, b)"},
    {"pow", "pow(a, b)"}, {"floordiv", "floordiv(a, b)"}, {"mod", "mod(a, b)"}, {"neg", "neg(x)"},
    {"maximum", "maximum(a, b)"}, {"minimum", "minimum(a, b)"},
  }},
  {"maths", {
    {"exp", "exp(x)"}, {"log", "log(x)"}, {"sqrt", "sqrt(x)"}, {"abs", "abs(x)"}, {"sign", "sign(x)"},
    {"tanh", "tanh(x)"}, {"sigmoid", "sigmoid(x)"}, {"relu", "relu(x)"}, {"softplus", "softplus(x)"},
    {"silu", "silu(x)"}, {"elu", "elu(x [, alpha=1])"}, {"leaky_relu", "leaky_relu(x [, alpha=0.01])"},
    {"relu_grad", "relu_grad(d, y)"}, {"tanh_grad", "tanh_grad(d, y)"}, {"sigmoid_grad", "sigmoid_grad(d, y)"},
    {"softmax", "softmax(x [, axis=-1])"}, {"log_softmax", "log_softmax(x [, axis=-1])"},
    {"sin", "sin(x)"}, {"cos", "cos(x)"}, {"log1p", "log1p(x)"}, {"expm1", "expm1(x)"}, {"erf", "erf(x)"},
    {"floor", "floor(x)"}, {"ceil", "ceil(x)"}, {"round", "round(x)"},
    {"clamp", "clamp(x, lo, hi)", "min(max(x, lo), hi); lo or hi nil for one side, numbers or broadcasting tensors"},
    {"clip_by_value", "clip_by_value(x, lo, hi)", "the same as clamp (TensorFlow's name)"},
    {"gelu", "gelu(x [, approximate])", "x * Phi(x); approximate true or \"tanh\" for the tanh form (also {approximate=})"},
    {"layer_norm", "layer_norm(x [, gamma [, beta]] [, {epsilon=1e-5}])"},
  }},
  {"compare", {
    {"equal", "equal(a, b)"}, {"not_equal", "not_equal(a, b)"}, {"less", "less(a, b)"},
    {"less_equal", "less_equal(a, b)"}, {"greater", "greater(a, b)"}, {"greater_equal", "greater_equal(a, b)"},
    {"logical_and", "logical_and(a, b)"}, {"logical_or", "logical_or(a, b)"}, {"logical_not", "logical_not(x)"},
    {"where", "where(cond, a, b)"},
    {"isfinite", "isfinite(x)", "which entries are neither infinite nor NaN (bool; integers and bools: all true)"},
    {"isnan", "isnan(x)", "which entries are NaN (bool)"}, {"isinf", "isinf(x)", "which entries are +-infinity (bool)"},
  }},
  {"reduce", {
    {"sum", "sum(x [, axis or {axes}] [, keepdims])"}, {"mean", "mean(x [, axis or {axes}] [, keepdims])"},
    {"max", "max(x [, axis or {axes}] [, keepdims])"}, {"min", "min(x [, axis or {axes}] [, keepdims])"},
    {"prod", "prod(x [, axis or {axes}] [, keepdims])"}, {"logsumexp", "logsumexp(x [, axis or {axes}] [, keepdims])"},
    {"var", "var(x [, axis or {axes}] [, keepdims] [, {ddof=0, unbiased=}])"},
    {"std", "std(x [, axis or {axes}] [, keepdims] [, {ddof=0, unbiased=}])"},
    {"norm", "norm(x [, axis or {axes}] [, keepdims] [, {ord=2 | 1 | math.huge}])"},
    {"cumsum", "cumsum(x [, axis] [, {exclusive=, reverse=}])", "running sums along an axis (no axis: the flattened x, as NumPy)"},
    {"argmax", "argmax(x [, axis])"}, {"argmin", "argmin(x [, axis])"},
  }},
  {"linear algebra", {
    {"matmul", "matmul(a, b)"},
    {"dense", "dense(x, w [, b [, activation]])",
     "activation(x @ w + b) as one op: w (in, out), b (out) or nil, activation \"linear\" (the default), " ..
     "\"relu\", \"tanh\" or \"sigmoid\"; the bias and activation run in one pass (nn.Dense's op)"},
    {"einsum", "einsum(spec, a [, b])", "Einstein summation of one or two operands (no ...)"},
  }},
  {"shape", {
    {"reshape", "reshape(x, shape)"},
    {"transpose", "transpose(x [, perm])", "the axes reversed, or permuted by perm (1-based)"},
    {"swapaxes", "swapaxes(x, a, b)", "axes a and b exchanged"},
    {"expand_dims", "expand_dims(x, axis)", "a new axis of size 1 at axis"},
    {"squeeze", "squeeze(x [, axis])", "axes of size 1 removed (all of them, or the one given)"},
    {"broadcast_to", "broadcast_to(x, shape)"},
    {"slice", "slice(x, s1, s2, ...)", "one spec per axis: nil all of it, i one entry (axis dropped), {start, stop, step} inclusive"},
    {"concat", "concat({x1, x2, ...} [, axis=1])", "tensors joined along an existing axis"},
    {"stack", "stack({x1, x2, ...} [, axis=1])", "tensors joined along a new axis"},
    {"gather", "gather(x, indices [, axis=1])", "slices of x along axis at 1-based integer indices"},
    {"cast", "cast(x, dtype)"},
  }},
  {"indexing and sorting", {
    {"sort", "sort(x [, axis=-1] [, {descending=}])", "values and 1-based int64 indices (stable; NaN above every number)"},
    {"argsort", "argsort(x [, axis=-1] [, {descending=}])"},
    {"topk", "topk(x, k [, axis=-1] [, {largest=true, sorted=true}])", "the k largest (or smallest) values and their 1-based indices"},
    {"take_along_axis", "take_along_axis(x, indices, axis)"},
    {"put_along_axis", "put_along_axis(x, indices, values, axis [, {mode=\"set\" | \"add\"}])"},
    {"flip", "flip(x [, axes])"}, {"tile", "tile(x, reps)"},
    {"repeat_interleave", "repeat_interleave(x, repeats [, axis])"},
    {"pad", "pad(x, paddings [, {mode=\"constant\", value=0}])"},
    {"tril", "tril(x [, k=0])"}, {"triu", "triu(x [, k=0])"},
    {"masked_fill", "masked_fill(x, mask, value)"},
  }},
  {"convolution", {
    {"conv2d", "conv2d(x, w [, b] [, {strides=, padding=, dilation_rate=, activation=}])"},
    {"conv2d_backward_input", "conv2d_backward_input(dy, w, input_shape [, {strides=, padding=, dilation_rate=}])"},
    {"conv2d_backward_filter", "conv2d_backward_filter(x, dy, filter_shape [, {strides=, padding=, dilation_rate=}])"},
    {"max_pool2d", "max_pool2d(x [, {pool_size=2, strides=, padding=}])"},
    {"max_pool2d_backward", "max_pool2d_backward(x, dy [, {pool_size=2, strides=, padding=}])"},
    {"avg_pool2d", "avg_pool2d(x [, {pool_size=2, strides=, padding=}])"},
    {"avg_pool2d_backward", "avg_pool2d_backward(dy, input_shape [, {pool_size=2, strides=, padding=}])"},
    {"scaled_dot_product_attention", "scaled_dot_product_attention(q, k, v [, {mask=, causal=, scale=}])"},
  }},
  {"random", {
    {"random.seed", "random.seed(n)", "restarts the stream (dropout, initializers, normal, uniform)"},
    {"random.normal", "random.normal(shape [, mean=0, stddev=1] [, dtype])", "normal draws; normal(2, 3): every number a size"},
    {"random.uniform", "random.uniform(shape [, low=0, high=1] [, dtype])", "uniform draws in [low, high); uniform(2, 3): sizes"},
    {"random.randint", "random.randint(low, high, shape)", "int64 draws in low..high-1 (high not drawn)"},
    {"random.permutation", "random.permutation(n)", "1..n shuffled (int64)"},
    {"random.get_state", "random.get_state()", "the stream's state {seed=, offset=}"},
    {"random.set_state", "random.set_state(state)", "goes back to a state get_state gave"},
    {"random.with_init_stream", "random.with_init_stream(fn, ...)", "fn(...) drawing from the initializers' stream"},
  }},
  {"memory", {
    {"memory.stats", "memory.stats()", "the byte counters: current and peak, by role (tensor, saved, gradient, variable), cached, the tapes' records (graph_bytes), live tensors, collections"},
    {"memory.estimate", "memory.estimate(step, ...)", "step(...) run dry (no arithmetic, nothing changed): its peak as memory.stats() would show it, what makes it, and the Lua lines that made what the tapes hold"},
    {"memory.dry_running", "memory.dry_running()", "true while memory.estimate runs a step"},
    {"memory.plan", "memory.plan(step, {budget=, lossy=false, spill=nil}, ...)", "what each stretch of the step's Sequential models keeps, recomputes (all, or a layer's cheap ops: dots), packs or spills to files, for the least extra time within budget; prints as a table"},
    {"memory.with_plan", "memory.with_plan(plan, step, ...)", "step(...) with the plan applied; its results"},
    {"memory.load_plan", "memory.load_plan(path, step, ...)", "a plan plan:save(path) wrote, for step(...) (its models matched by a dry run)"},
    {"memory.reset_peak", "memory.reset_peak()", "the peak starts again from the current bytes"},
    {"memory.trace", "memory.trace(path, fn, ...)", "runs fn(...) writing its memory timeline as a Chrome trace"},
    {"memory.span", "memory.span(name, fn, ...)", "fn(...) as a named span of the running trace"},
    {"memory.setpause", "memory.setpause(percent [, min_bytes])", "when tensor bytes trigger a collection (110, 256 KiB); the pacing starts afresh"},
    {"tidy", "tidy(fn, ...)", "fn(...), and every tensor made meanwhile released at its end, but its results (TF.js's tidy)"},
    {"dispose", "dispose(x, ...)", "releases tensors (or tables of them) now, as a <close> variable would"},
    {"keep", "keep(x, ...)", "x, ...: tensors taken out of the open tidy scopes, to outlive them (state kept for later)"},
    {"memory.set_cache_limit", "memory.set_cache_limit(bytes)", "how many freed bytes may wait for reuse; returns the limit before"},
    {"memory.release_cache", "memory.release_cache()", "frees the cached blocks, and closes the spill files ({offload = dir}) nothing is spilled in"},
    {"memory.fail_after", "memory.fail_after(n)", "for tests: the n-th allocation from now fails as if out of memory (0 turns it off)"},
    {"memory.budget", "memory.budget([bytes])", "train within bytes (\"300 MB\", \"+40 MiB\" above what is live too): saved tensors are evicted and rebuilt on demand (DTR); nil clears; returns the previous"},
  }},
  {"autodiff", {
    {"tape", "tape([{persistent=false, watch_accessed_variables=true, budget=nil, warn=true}])", "a gradient tape recording the ops run while it is active; warn: say once when a gradient's target was never recorded"},
    {"Tape:gradient", "t:gradient(target, sources [, output_gradients] [, {unconnected=\"none\" | \"zero\"}])", "gradients of target with respect to sources (a tensor, variable or nested table)"},
    {"Tape:jacobian", "t:jacobian(target, sources [, {unconnected=}])", "the full Jacobian of a tensor target by each source (a tensor, variable or nested table, answered in its structure)"},
    {"Tape:batch_jacobian", "t:batch_jacobian(target, source [, {unconnected=}])", "per-example Jacobians (first axis the batch; one source, as TensorFlow's)"},
    {"Tape:watch", "t:watch(x)", "records ops on x (a tensor, a variable or nested tables of them)"},
    {"Tape:watched_variables", "t:watched_variables()", "the variables the tape watches"},
    {"Tape:stop", "t:stop()", "stops recording"},
    {"Tape:record", "t:record(fn, ...)", "records during fn(...)"},
    {"Tape:stop_recording", "t:stop_recording(fn, ...)", "fn(...) with this tape paused"},
    {"stop_gradient", "stop_gradient(x)", "x as a constant to every tape, no copy (tf.stop_gradient, torch's x:detach())"},
    {"identity", "identity(x)", "x as a new tensor, no copy, recorded (tf.identity): its gradient is dout"},
    {"Tape:reset", "t:reset()", "forgets what was recorded"},
    {"Tape:is_recording", "t:is_recording()", "whether the tape records now"},
    {"Tape:saved_bytes", "t:saved_bytes()", "bytes the tape holds for its backward"},
    {"Variable:value", "v:value()", "the current value as a tensor (a read: tapes notice it)"},
    {"Variable:read_value", "v:read_value()", "the same as value"},
    {"Variable:assign", "v:assign(value)", "a new value of the same shape and dtype"},
    {"Variable:assign_add", "v:assign_add(d [, scale=1])", "v = v + scale * d, in place"},
    {"Variable:assign_sub", "v:assign_sub(d [, scale=1])", "v = v - scale * d, in place"},
    {"custom_gradient", "custom_gradient(f [, {context=false, captures=false, rereads=false}])", "f returns outputs and a backward function; a context ctx has save saved forget needs_input_grad is_recorded recompute"},
    {"recompute_grad", "recompute_grad(f [, {pass_is_recomputing=false, policy=\"nothing\", verify=false}])", "f whose inside activations are recomputed in the backward instead of kept"},
    {"is_recomputing", "is_recomputing()", "whether the code runs as a recompute"},
    {"in_loop", "in_loop(fn, ...)", "fn(...) as a loop helper's body (is_in_loop() true)"},
    {"is_in_loop", "is_in_loop()", "whether the code runs inside in_loop"},
    {"checkpoint_loop", "checkpoint_loop(step, state, n [, {snapshots=, stats=}])", "n steps of state = step(state, i) whose backward keeps only snapshots (Revolve)"},
    {"checkpoint_loop.recomputed_steps", "checkpoint_loop.recomputed_steps(n, k)", "steps Revolve recomputes for n steps and k snapshots"},
    {"saved_tensors_hooks", "saved_tensors_hooks(pack, unpack, fn, ...)", "fn(...) with every tensor a tape saves packed (also \"float16\", \"bfloat16\", {offload=dir})"},
    {"autocast", "autocast(dtype, fn, ...) | autocast(dtype)", "fn(...) with products (matmul, dense, conv2d, einsum, attention) in bfloat16 (or float16), the rest in float32; alone: a region for a <close> variable"},
    {"autocast_dtype", "autocast_dtype()", "the open autocast region's dtype, or nil"},
    {"autocast_isa", "autocast_isa([dtype=\"bfloat16\"])", "the ISA oneDNN runs dtype's products on here (\"avx512_core_bf16\", \"avx512_core_amx\"), or nil: emulated"},
    {"mixed_precision.set_global_policy", "mixed_precision.set_global_policy(name)", "\"mixed_bfloat16\", \"mixed_float16\" or \"float32\": the policy fit, evaluate and predict follow; returns the previous"},
    {"mixed_precision.global_policy", "mixed_precision.global_policy()", "the global policy's name"},
    {"mixed_precision.emulate_float16", "mixed_precision.emulate_float16(on)", "allow float16 autocast on a CPU without AVX512-FP16 (products widened to float32: float16's numerics, not its speed); returns the previous"},
    {"mixed_precision.LossScaleOptimizer", "mixed_precision.LossScaleOptimizer(opt [, opts])", "optim.LossScaleOptimizer, where Keras keeps it too"},
    {"mixed_precision.autocast_dtype", "mixed_precision.autocast_dtype(model [, asked])", "the dtype a model's fit runs products in (asked, model.dtype_policy, the global policy), or false"},
    {"mixed_precision.run", "mixed_precision.run(dtype, fn, ...)", "fn(...) under autocast(dtype), or plainly when dtype is false"},
    {"test.gradcheck", "test.gradcheck(f, inputs [, {eps=1e-6, atol=1e-6, rtol=1e-4, seed=1}])", "checks the tape's gradient of f against finite differences (float64 inputs)"},
  }},
  {"layers", {
    {"nn.Layer", "nn.Layer", "the base class of every layer (its methods: help(\"layers\"), help(\"fit\"))"},
    {"nn.Dense", "nn.Dense(units [, activation] [, {activation=, use_bias=true, name=}])", "a fully connected layer (one `mg.dense` op; softmax or a function runs after it)"},
    {"nn.Sequential", "nn.Sequential({layer, ...} [, {name=, input_shape=}])", "layers applied in order (a model: compile, fit, summary); input_shape (one sample's, no batch) builds it at once"},
    {"nn.Lambda", "nn.Lambda(fn [, {name=}])", "a layer calling fn"},
    {"nn.Dropout", "nn.Dropout(rate [, {training=true, name=}])", "zeros entries with probability rate while training"},
    {"nn.BatchNorm", "nn.BatchNorm([{momentum=0.99, epsilon=1e-3, training=true, name=}])", "normalizes over every axis but the last"},
    {"nn.Conv2D", "nn.Conv2D(filters, kernel_size [, {strides=, padding=\"valid\", dilation_rate=, activation=, use_bias=, kernel_initializer=}])", "2-D convolution of NHWC images"},
    {"nn.MaxPool2D", "nn.MaxPool2D([pool_size=2] [, {strides=, padding=}])", "window maxima"},
    {"nn.AvgPool2D", "nn.AvgPool2D([pool_size=2] [, {strides=, padding=}])", "window means"},
    {"nn.GlobalAveragePooling2D", "nn.GlobalAveragePooling2D([{keepdims=false}])", "the mean over height and width"},
    {"nn.Flatten", "nn.Flatten([{name=}])", "every axis but the first in one"},
    {"nn.Reshape", "nn.Reshape(target_shape [, {name=}])", "each sample reshaped"},
    {"nn.RecomputeLayer", "nn.RecomputeLayer:subclass(name)", "a base whose call is recomputed in the backward"},
    {"nn.ReversibleLayer", "nn.ReversibleLayer:subclass(name)", "a base with forward and inverse: activations rebuilt from the outputs"},
    {"nn.RevBlock", "nn.RevBlock(f, g [, {num_layers=, name=, f_side_input=, g_side_input=}])", "a reversible residual block (RevNet)"},
    {"nn.AffineCoupling", "nn.AffineCoupling(net [, {swap=false, clamp=2}])", "an affine coupling layer of a normalising flow"},
    {"nn.InvertibleLinear", "nn.InvertibleLinear()", "an invertible 1x1 mixing (Glow)"},
    {"nn.checkpoint_sequential", "nn.checkpoint_sequential(layers, segments, x)", "runs layers keeping only segment boundaries for the backward"},
    {"nn.dropout", "nn.dropout(x, rate)", "dropout as a function"},
    {"nn.glorot_uniform", "nn.glorot_uniform(shape [, dtype])", "Glorot-uniform initial values"},
    {"nn.softmax_cross_entropy", "nn.softmax_cross_entropy(logits, labels)", "the mean cross entropy of int64 class numbers or probabilities"},
    {"nn.mean_squared_error", "nn.mean_squared_error(y, target)", "the mean squared error (shapes must match)"},
    {"Layer:subclass", "nn.Layer:subclass(name)", "a new layer class (give it build and call)"},
    {"Layer:summary", "model:summary([{input_shape=, print_fn=}])", "prints Keras' table of layers and parameters"},
    {"Layer:add_variable", "layer:add_variable(name, init [, {trainable=true}])", "a variable owned by the layer"},
    {"Layer:build", "layer:build(input_shape [, dtype])", "makes the variables before the first call; input_shape has the batch first, nil allowed ({nil, 20})"},
    {"Layer:track", "layer:track(sublayer)", "makes sublayer's variables the layer's"},
    {"Layer:call", "layer:call(x, ...)", "the forward (what layer(x) runs after build)"},
    {"Layer:describe", "layer:describe()", "a short text for summary and tostring"},
    {"Layer:save_weights", "model:save_weights(path)", "the weights to a safetensors file, named by the layer structure"},
    {"Layer:load_weights", "model:load_weights(path)", "weights from a file; all names, shapes and dtypes checked first"},
    {"Sequential:add", "model:add(layer)", "appends a layer"},
  }},
  {"transformers", {
    {"nn.Embedding", "nn.Embedding(input_dim, output_dim [, {embeddings_initializer=\"uniform\", dtype=\"float32\", name=}])", "rows of a table for int64 ids 1..input_dim"},
    {"nn.PositionalEmbedding", "nn.PositionalEmbedding(sequence_length [, {initializer=\"uniform\", name=}])", "a learned position embedding added to x"},
    {"nn.LayerNorm", "nn.LayerNorm([{epsilon=1e-5, center=true, scale=true, name=}])", "layer normalization over the last axis"},
    {"nn.MultiHeadAttention", "nn.MultiHeadAttention(heads, dim [, {causal=false, dropout=0, use_bias=true, fused=true, training=true}])", "attention called as mha(x) or mha(query, value), {mask=, training=} last"},
    {"nn.TransformerBlock", "nn.TransformerBlock(heads, dim [, {mlp_dim=4*dim, causal=false, dropout=0, activation=\"gelu\", epsilon=1e-5, fused=true, training=true}])", "a pre-norm transformer block"},
  }},
  {"losses", {
    {"losses.mean_squared_error", "losses.mean_squared_error(y_true, y_pred [, {reduction=, mask=}])", "the squared error"},
    {"losses.mean_absolute_error", "losses.mean_absolute_error(y_true, y_pred [, {reduction=, mask=}])", "the absolute error"},
    {"losses.binary_crossentropy", "losses.binary_crossentropy(y_true, y_pred [, {from_logits=false, reduction=, mask=, label_smoothing=}])", "cross entropy of 0/1 labels"},
    {"losses.categorical_crossentropy", "losses.categorical_crossentropy(y_true, y_pred [, {from_logits=false, reduction=, mask=, label_smoothing=}])", "cross entropy of one-hot labels"},
    {"losses.sparse_categorical_crossentropy", "losses.sparse_categorical_crossentropy(y_true, y_pred [, {from_logits=false, reduction=, mask=, label_smoothing=}])", "cross entropy of int64 class numbers 1..C"},
    {"losses.softmax_cross_entropy", "losses.softmax_cross_entropy(logits, labels)", "mg.nn's softmax_cross_entropy"},
    {"losses.MeanSquaredError", "losses.MeanSquaredError([{reduction=}])", "the loss as a Keras class"},
    {"losses.MeanAbsoluteError", "losses.MeanAbsoluteError([{reduction=}])", "the loss as a Keras class"},
    {"losses.BinaryCrossentropy", "losses.BinaryCrossentropy([{from_logits=, reduction=, label_smoothing=}])", "the loss as a Keras class"},
    {"losses.CategoricalCrossentropy", "losses.CategoricalCrossentropy([{from_logits=, reduction=, label_smoothing=}])", "the loss as a Keras class"},
    {"losses.SparseCategoricalCrossentropy", "losses.SparseCategoricalCrossentropy([{from_logits=, reduction=, label_smoothing=}])", "the loss as a Keras class"},
    {"losses.get", "losses.get(spec)", "the loss compile uses for a name (\"mse\", ...), a loss object or a function"},
  }},
  {"metrics", {
    {"metrics.accuracy", "metrics.accuracy(y_true, y_pred)", "the fraction right, as a float64 scalar"},
    {"metrics.sparse_categorical_accuracy", "metrics.sparse_categorical_accuracy(y_true, y_pred)", "argmax of y_pred against class numbers"},
    {"metrics.categorical_accuracy", "metrics.categorical_accuracy(y_true, y_pred)", "argmax of y_pred against argmax of y_true"},
    {"metrics.binary_accuracy", "metrics.binary_accuracy(y_true, y_pred)", "y_pred > 0.5 against 0/1 labels"},
    {"metrics.mean_squared_error", "metrics.mean_squared_error(y_true, y_pred)", "the mean squared error"},
    {"metrics.mean_absolute_error", "metrics.mean_absolute_error(y_true, y_pred)", "the mean absolute error"},
    {"metrics.perplexity", "metrics.perplexity(y_true, y_pred [, {from_logits=false, mask=}])", "exp of the mean cross entropy"},
    {"metrics.get", "metrics.get(spec [, loss_name, from_logits])", "the metric compile uses for a name or function (\"accuracy\" by the loss, as Keras)"},
  }},
  {"optimizers", {
    {"optim.SGD", "optim.SGD{learning_rate=0.01, momentum=0, nesterov=false, weight_decay=, clipnorm=, clipvalue=, global_clipnorm=}", "stochastic gradient descent"},
    {"optim.Adam", "optim.Adam{learning_rate=, beta1=, beta2=, epsilon=, weight_decay=, clipnorm=, clipvalue=, global_clipnorm=}", "Adam (Keras' beta_1 and beta_2 too; a number alone is the learning rate)"},
    {"optim.AdamW", "optim.AdamW{learning_rate=, beta1=, beta2=, epsilon=, weight_decay=0.01, clipnorm=, clipvalue=, global_clipnorm=}", "Adam with decoupled weight decay"},
    {"optim.RMSprop", "optim.RMSprop{learning_rate=0.001, rho=0.9, momentum=0, epsilon=1e-7, centered=false, weight_decay=, clipnorm=, clipvalue=, global_clipnorm=}", "RMSprop"},
    {"optim.LossScaleOptimizer", "optim.LossScaleOptimizer(opt [, {initial_scale=2^15, dynamic=true, dynamic_growth_steps=2000, name=}])", "loss scaling for float16 (Keras', PyTorch's GradScaler): scale_loss, then apply_gradients unscales, skips steps that overflow, adapts the scale"},
    {"optim.get", "optim.get(spec)", "an optimizer for compile: one given, or a name (\"sgd\", \"adam\", \"adamw\", \"rmsprop\") with the defaults"},
    {"optim.schedules", "optim.schedules", "the same table as mg.schedules"},
    {"Optimizer:apply_gradients", "opt:apply_gradients(grads, vars)", "one update (nil gradients skipped; Keras' {grad, var} pairs too; a variable twice is an error)"},
    {"Optimizer:minimize", "opt:minimize(loss, vars, tape)", "one update on tape's gradient of loss (Keras'); distributed: sent during the backward"},
    {"Optimizer:build", "opt:build(vars)", "makes the slots for vars before the first step"},
    {"Optimizer:get_state", "opt:get_state([vars])", "the slots and step count as a plain table of tensors"},
    {"Optimizer:set_state", "opt:set_state(state [, vars])", "restores what get_state gave"},
    {"Optimizer:get_learning_rate", "opt:get_learning_rate()", "the rate of the next step (a schedule's value)"},
    {"schedules.ExponentialDecay", "schedules.ExponentialDecay{initial_learning_rate=, decay_steps=, decay_rate=, staircase=false}", "rate * decay_rate^(step / decay_steps)"},
    {"schedules.CosineDecay", "schedules.CosineDecay{initial_learning_rate=, decay_steps=, alpha=0, warmup_steps=0, warmup_target=}", "cosine decay to alpha * rate"},
    {"schedules.LinearWarmup", "schedules.LinearWarmup{warmup_steps=, after=, initial_learning_rate=0}", "a linear rise, then the schedule or rate after"},
    {"schedules.PiecewiseConstantDecay", "schedules.PiecewiseConstantDecay{boundaries=, values=}", "values[i] between boundaries"},
  }},
  {"fit", {
    {"Layer:compile", "model:compile{optimizer=\"rmsprop\", loss=, metrics=}", "what fit trains with"},
    {"Layer:fit", "model:fit(x, y [, {epochs=, batch_size=, validation_data= | validation_split=, validation_batch_size=, shuffle=, callbacks=, recompute=, verbose=, initial_epoch=, seed=, distributed=, shard=, mixed_precision=, memory_budget=}])", "trains; returns a History"},
    {"Layer:evaluate", "model:evaluate(x, y [, {batch_size=32, verbose=\"auto\"}])", "{loss=, metric=...} over x, y in inference mode"},
    {"Layer:predict", "model:predict(x [, {batch_size=32, verbose=0}])", "the outputs for x, batch by batch"},
    {"Layer:train_step", "model:train_step(x, y)", "one training step; returns the logs"},
    {"Layer:test_step", "model:test_step(x, y)", "the logs of one batch in inference mode"},
    {"callbacks.EarlyStopping", "callbacks.EarlyStopping{monitor=\"val_loss\", min_delta=0, patience=0, mode=\"auto\", baseline=, restore_best_weights=, start_from_epoch=, verbose=}", "stops fit when monitor stops improving"},
    {"callbacks.LambdaCallback", "callbacks.LambdaCallback{on_train_begin=, on_train_end=, on_epoch_begin=, on_epoch_end=, on_batch_begin=, on_batch_end=}", "a callback from functions"},
    {"callbacks.TerminateOnNaN", "callbacks.TerminateOnNaN([{verbose=}])", "stops fit on a NaN or infinite loss"},
    {"callbacks.ProgbarLogger", "callbacks.ProgbarLogger([{out=, tty=, verbose=1}])", "Keras' progress bar"},
    {"callbacks.History", "callbacks.History()", "the per-epoch logs (fit returns one; history:plot([path]))"},
    {"callbacks.ModelCheckpoint", "callbacks.ModelCheckpoint(path [, {every=1, optimizer=}])", "the same as checkpoint.callback (Keras' name)"},
    {"callbacks.BackupAndRestore", "callbacks.BackupAndRestore{backup_dir=}", "a backup after each epoch: fit run again after a crash goes on from it, bit for bit; removed when fit ends"},
    {"checkpoint.save", "checkpoint.save(path, {model=, optimizer=, epoch=, rng=true, metadata=})", "a training checkpoint, atomically"},
    {"checkpoint.restore", "checkpoint.restore(path, {model=, optimizer=, rng=true})", "restores a checkpoint; returns {epoch=, rng=, metadata=}"},
    {"checkpoint.callback", "checkpoint.callback(path [, {every=1, optimizer=}])", "Keras' ModelCheckpoint ({epoch} in path)"},
    {"checkpoint.names", "checkpoint.names(model)", "the {name=, var=} list save_weights writes"},
  }},
  {"data", {
    {"save", "save(path, tensors [, {metadata={key=\"value\"}}])", "tensors (nested tables flattened with /) to a safetensors file"},
    {"load", "load(path)", "the tensors and the metadata of a safetensors file"},
    {"data.Dataset", "data.Dataset(x, y, ...)", "samples along the first axis, zipped"},
    {"Dataset:shuffle", "ds:shuffle(seed [, {reshuffle_each_iteration=true}])", "a shuffled view (the order depends on seed and epoch)"},
    {"Dataset:batch", "ds:batch(size [, {drop_remainder=false}])", "batches of size samples"},
    {"Dataset:take", "ds:take(n)", "the first n samples"},
    {"Dataset:skip", "ds:skip(n)", "all but the first n"},
    {"Dataset:map", "ds:map(fn)", "fn applied to each element"},
    {"Dataset:iter", "ds:iter([epoch])", "an iterator over the elements"},
    {"Dataset:batches", "ds:batches(size [, opts] [, epoch])", "an iterator over batches"},
    {"Dataset:tensors", "ds:tensors([epoch])", "every element stacked into tensors"},
    {"data.read_idx", "data.read_idx(path [, {dtype=}])", "an IDX file (the MNIST family)"},
    {"data.read_csv", "data.read_csv(path [, {header=, delimiter=\",\", dtype=\"float32\", columns=, label=, label_dtype=}])", "a CSV file of numbers: x and the header's names (x, y, names with a label); the header detected unless header= says"},
    {"data.debian_file", "data.debian_file(package, path)", "a file of a Debian package, fetched once into cache_dir()"},
    {"data.cache_dir", "data.cache_dir()", "where debian_file keeps packages"},
    {"data.fashion_mnist", "data.fashion_mnist()", "train, test tables {x=, y=} of Fashion-MNIST"},
    {"data.fashion_mnist_classes", "data.fashion_mnist_classes", "the class names, by class number"},
    {"data.digits", "data.digits()", "scikit-learn's digits: x (1797, 64), y 1..10"},
    {"data.permutation", "data.permutation(n, seed, epoch)", "the order of n elements for (seed, epoch), without moving mg.random"},
  }},
  {"distributed", {
    {"distributed.init", "distributed.init([{timeout=}])", "starts MPI; returns rank, size (timeout: seconds a collective waits for every rank, 600)"},
    {"distributed.rank", "distributed.rank()", "this process's rank, from 0"},
    {"distributed.size", "distributed.size()", "the number of processes"},
    {"distributed.barrier", "distributed.barrier()", "waits for every rank"},
    {"distributed.allreduce", "distributed.allreduce(t [, {op=\"sum\" | \"mean\" | \"max\" | \"min\"}])", "every rank's t combined (a variable: in place)"},
    {"distributed.broadcast", "distributed.broadcast(t [, root=0])", "root's values (a variable: in place)"},
    {"distributed.allgather", "distributed.allgather(t)", "every rank's t concatenated"},
    {"distributed.broadcast_variables", "distributed.broadcast_variables(vars [, root=0])", "root's values into every variable"},
    {"distributed.broadcast_optimizer_state", "distributed.broadcast_optimizer_state(opt, vars [, root=0])", "root's optimizer slots everywhere"},
    {"distributed.local_size", "distributed.local_size()", "ranks on this rank's machine (Horovod's)"},
    {"distributed.DistributedOptimizer", "distributed.DistributedOptimizer(opt [, {fusion_bytes=, op=, overlap=\"auto\"}])", "opt with gradients averaged across ranks (minimize: during the backward)"},
    {"distributed.ShardedOptimizer", "distributed.ShardedOptimizer(opt [, {stage=1 | 2, fusion_bytes=, op=, overlap=\"auto\"}])", "opt with its slots (stage 2: and gradients) sharded over the ranks (ZeRO)"},
    {"distributed.reduce_scatter", "distributed.reduce_scatter(t [, {op=\"sum\" | \"mean\"}])", "this rank's shard of every rank's t combined (flattened)"},
    {"distributed.shard_range", "distributed.shard_range(n [, size, rank])", "the first and last of n elements a rank holds when sharded"},
    {"distributed.stats", "distributed.stats()", "{calls=, bytes=, waited=}: MPI calls and bytes since init, seconds overlapped steps waited at their end"},
    {"distributed.is_initialized", "distributed.is_initialized()", "whether init ran"},
    {"distributed.available", "distributed.available()", "whether MPI support is built in"},
    {"distributed.finalize", "distributed.finalize()", "ends MPI early"},
  }},
  {"progress, plot", {
    {"progress", "progress(steps [, {out=, tty=, verbose=, width=, interval=, unit=, label=}])", "Keras' progress bar"},
    {"Progress:update", "bar:update(i [, values])", "shows step i and the values"},
    {"Progress:finish", "bar:finish([values])", "the last line"},
    {"Progress:line", "bar:line(i [, values] [, final])", "the bar's text for step i"},
    {"Progress:stop", "bar:stop()", "ends the bar without a final line"},
    {"plot", "plot(series... [, {path=, title=, xlabel=, ylabel=, logscale=, width=, height=}])", "curves as PNG, SVG or text"},
  }},
  {"notebooks (moongrad --kernel)", {
    {"notebook.active", "notebook.active()", "whether the code runs in moongrad's Jupyter kernel"},
    {"notebook.display", "notebook.display(v [, {id=, update=}])", "shows v in the notebook now (update = true replaces display id)"},
    {"notebook.image", "notebook.image(path [, {id=, update=}])", "shows a PNG or SVG file in the notebook"},
    {"notebook.bundle", "notebook.bundle(v)", "v's MIME bundle: text/plain, and text/html for a small tensor or stats()"},
  }},
  {"threads and time", {
    {"set_num_threads", "set_num_threads(n | \"auto\")", "a fixed thread count (1 to 1024), or \"auto\" (the default): the machine's cores, one while other processes hold them"},
    {"get_num_threads", "get_num_threads()", "the thread count, \"auto\" or \"fixed\", and the team ops run on now"},
    {"clock", "clock()", "seconds on a monotonic wall clock"},
    {"gemm.use", "gemm.use(name)", "\"auto\", \"dnnl\" or \"openblas\" for every float32 product"},
    {"gemm.choice", "gemm.choice(m, n, k [, {transpose_a=, transpose_b=}])", "the library and threads an m x n x k product uses"},
  }},
}

-- names in mg that are not API: helpers other modules load, and internals
local internal = {
  _io = true, _loop = true, _layer_call = true, _layer_around = true, ["Layer:_build_first"] = true, ["checkpoint.BackupAndRestore"] = true, check = true, fit = true, transformer = true, reversible = true,
  layer = true, class = true, ["checkpoint.layer_methods"] = true, ["plot.draw"] = true, ["plot.history"] = true,
  ["distributed.DistributedOptimizer_class"] = true, ["distributed.shard"] = true,
  ["Optimizer:init"] = true, ["Optimizer:update"] = true, ["Optimizer:slot_names"] = true,
  ["Optimizer:spec"] = true, ["Optimizer:who"] = true, ["Optimizer:check"] = true,
  ["distributed.steps"] = true, ["distributed.WRAPPER_OPTIONS"] = true, ["distributed.average_logs"] = true, ["distributed.seed_of"] = true,
  planner = true, sharded = true, ["Sequential:_run"] = true,        -- mg.memory.estimate's module, and how a plan runs a Sequential
}

-- each entry's arguments, result and example live in moongrad.help_entries,
-- by name: {args = {{name, what [, default]}, ...}, returns = text, example = code}
local details = require "moongrad.help_entries"
internal.help_entries = true

local M = {groups = groups, internal = internal, details = details}

local by_name, order = {}, {}
for _, g in ipairs(groups) do
  for _, e in ipairs(g[2]) do
    local d = details[e[1]] or {}
    local entry = {name = e[1], signature = e[2], doc = e[3], group = g[1],
                   args = d.args, returns = d.returns, example = d.example}
    assert(not by_name[e[1]], e[1])
    by_name[e[1]], order[#order + 1] = entry, entry
  end
end

-- the op registry's doc for entries that give none
local op_docs
local function doc_of (e)
  if e.doc then return e.doc end
  if not op_docs then
    op_docs = {}
    for _, r in ipairs(mg.ops()) do op_docs[r.name] = r.doc end
  end
  return op_docs[e.name]
end

-- an entry as handed out: a copy, its description filled in
local function copy (e, name, signature)
  return {name = name or e.name, signature = signature or e.signature, doc = doc_of(e), group = e.group,
          args = e.args, returns = e.returns, example = e.example}
end

--- M.entries(): every entry {name=, signature=, doc=, group=, args=, returns=, example=}, in the reference's order
function M.entries ()
  local out = {}
  for i, e in ipairs(order) do out[i] = copy(e) end
  return out
end

--- M.entry(name): one entry, or nil. "Tensor:sum" is mg.sum's entry.
-- every entry also by its name as the docs print it, the head of its
-- signature: "model:fit", "layer:add_variable", "opt:build" (first one wins)
local by_signature = {}
for _, e in ipairs(order) do
  local head = e.signature:match("^([%w_.:]+)%(")
  if head and by_signature[head] == nil then by_signature[head] = e end
end

function M.entry (name)
  local e = by_name[name] or by_signature[name]
  if e then return copy(e) end
  local method = name:match("^Tensor:([%w_]+)$") or name:match("^Variable:([%w_]+)$")
  if method and by_name[method] and M.methods("Tensor")[method] then
    e = by_name[method]
    local sig = e.signature:gsub("^[%w_]+%(([%w_]+),? ?", "%1:" .. method .. "("):gsub("%(%[, ", "([")
    return copy(e, name, sig)
  end
end

-- {====================== finding names =======================

-- the method tables of the objects entries name as "Kind:method", found
-- once (tensors, variables and tapes keep theirs in C, out of reach of pairs)
local kind_tables
local function kinds ()
  if kind_tables then return kind_tables end
  local quiet = {write = function() end, flush = function() end}
  local bar = mg.progress(1, {out = quiet, tty = false})
  kind_tables = {
    Tensor = debug.getregistry()["moongrad.methods"],
    Variable = select(2, debug.getupvalue(getmetatable(mg.Variable(0)).__index, 1)),
    Tape = getmetatable(mg.tape()).__index,
    Layer = mg.nn.Layer, Sequential = mg.nn.Sequential, Optimizer = mg.optim.SGD,
    Dataset = mg.data.Dataset, Progress = getmetatable(bar).__index,
  }
  return kind_tables
end

--- M.methods(kind): name -> function of one kind's methods (Tensor, Tape, Layer, ...)
function M.methods (kind)
  local t = kinds()[kind]
  local out = {}
  if kind == "Tensor" or kind == "Variable" or kind == "Tape" then
    for k, v in pairs(t) do out[k] = v end
  else   -- class tables: their own functions, not metamethods or fields
    for k, v in pairs(t) do
      if type(v) == "function" and not k:find("^__") then out[k] = v end
    end
  end
  return out
end

--- M.resolve(name): the value an entry's name denotes (nil when none)
function M.resolve (name)
  local kind, method = name:match("^(%u%w*):([%w_]+)$")
  if kind then
    local t = kinds()[kind]
    return t and t[method]
  end
  if name:match("^Tensor%.") then return name end    -- properties, not values
  local v = mg
  for part in name:gmatch("[^.]+") do
    if type(v) ~= "table" then return nil end
    v = v[part]
  end
  return v
end

local names_of    -- value -> entry name, built on first use
local function index_values ()
  if names_of then return names_of end
  getmetatable(mg.nn).__load_extensions()     -- their methods, not the stand-ins (nn.lua)
  names_of = setmetatable({}, {__mode = "k"})
  for i = #order, 1, -1 do      -- the first entry naming a value wins (constant over tensor)
    local v = M.resolve(order[i].name)
    if type(v) == "function" or type(v) == "table" then names_of[v] = order[i].name end
  end
  for k, v in pairs(kinds().Tensor) do
    if not names_of[v] then names_of[v] = "Tensor:" .. k end
  end
  return names_of
end

-- the entry name for an object by its metatable (a layer, an optimizer, ...)
local function object_name (x)
  if mg.is_variable(x) then return "Variable" end
  if mg.is_tensor(x) then return "Tensor" end
  local mt = getmetatable(x)
  if type(mt) ~= "table" then return nil end
  if mt.__index == kinds().Tape then return "Tape" end
  if mt.__index == kinds().Progress then return "progress" end
  local names = index_values()
  local cls = mt
  while type(cls) == "table" do
    if names[cls] then return names[cls], cls end
    cls = rawget(cls, "__parent")
  end
end

-- }=============================================================

-- a signature as written out: mg.matmul(a, b), x:sum(...), t:gradient(...)
local function shown (e)
  if e.name:find(":") or e.name:find("^Tensor%.") then return e.signature end
  return "mg." .. e.signature
end

local function line (e)
  return shown(e) .. "\n    " .. (e.doc or "")
end

-- an entry in full: its line, then its arguments, result and example
local function entry_text (e)
  local out = {line(e)}
  if e.args and #e.args == 0 then out[#out + 1] = "Arguments: none"
  elseif e.args then
    out[#out + 1] = "Arguments:"
    local width = 0
    for _, a in ipairs(e.args) do width = math.max(width, #a[1]) end
    for _, a in ipairs(e.args) do
      local default = a[3] and (" (default " .. a[3] .. ")") or ""
      out[#out + 1] = ("    %-" .. width .. "s  %s%s"):format(a[1], a[2], default)
    end
  end
  if e.returns then out[#out + 1] = "Returns: " .. e.returns end
  if e.example then
    out[#out + 1] = "Example:"
    for l in e.example:gmatch("[^\n]+") do out[#out + 1] = "    " .. l end
  end
  return table.concat(out, "\n")
end

local function method_list (kind)
  local names = {}
  for k in pairs(M.methods(kind)) do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, " ")
end

local function overview ()
  local out = {"moongrad " .. mg.version .. ": help(x) for a function, layer, tensor or tape; help(\"name\") by name",
               "(\"matmul\", \"nn.Dense\", \"Tape:gradient\"); help(\"group\") lists a group.", ""}
  for _, g in ipairs(groups) do
    local names = {}
    for _, e in ipairs(g[2]) do names[#names + 1] = e[1] end
    out[#out + 1] = ("%-22s %s"):format(g[1], table.concat(names, " "))
  end
  return table.concat(out, "\n")
end

local function group_text (g)
  local out = {g[1] .. ":"}
  for _, e in ipairs(g[2]) do out[#out + 1] = "  " .. line(M.entry(e[1])) end
  return table.concat(out, "\n")
end

-- an object's fields and methods: names for a tensor's many, else a line each
local function object_text (kind, title)
  local out = {title}
  local props = {Tensor = "shape dtype ndim itemsize nbytes", Variable = "name trainable shape dtype ndim itemsize nbytes"}
  if props[kind] then out[#out + 1] = "fields: " .. props[kind] end
  if kind == "Tensor" then
    out[#out + 1] = "methods (x:f(...) is mg.f(x, ...)): " .. method_list(kind)
    return table.concat(out, "\n")
  end
  local names = {}
  for k in pairs(M.methods(kind)) do
    if M.entry(kind .. ":" .. k) then names[#names + 1] = k end
  end
  table.sort(names)
  for _, k in ipairs(names) do out[#out + 1] = "  " .. line(M.entry(kind .. ":" .. k)) end
  if kind == "Variable" then out[#out + 1] = "and every tensor method, on its value" end
  return table.concat(out, "\n")
end

-- what a value without an entry is: its type, and a number's value, a
-- function's source, a table's first keys
local function what (x)
  if type(x) == "number" or type(x) == "boolean" then return ("%s (%s)"):format(type(x), tostring(x)) end
  if type(x) == "function" then
    local info = debug.getinfo(require("moongrad.check").unguarded(x), "S")
    if info.what == "C" then return "function (a C function, not mg's)" end
    return ("function (defined at %s:%d)"):format(info.short_src, info.linedefined)
  end
  if type(x) == "table" then
    local keys = {}
    for k in pairs(x) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    local n = #keys
    for i = n, 6, -1 do keys[i] = nil end
    if n > 5 then keys[6] = "..." end
    return ("table {%s}"):format(table.concat(keys, ", "))
  end
  return type(x)
end

--- help([x]): the text for x (a function, layer, object or name), or the overview
function M.help (x)
  if x == nil then return overview() end
  if type(x) == "string" then
    local e = M.entry(x) or M.entry(x:gsub("^mg%.", ""), nil)
    if e then return entry_text(e) end
    for _, g in ipairs(groups) do if g[1] == x then return group_text(g) end end
    return ("no help for %q: help() lists the groups and their names"):format(x)
  end
  local names = index_values()
  if names[x] then return M.help(names[x]) end
  local name = object_name(x)
  if name == "Tensor" then return object_text("Tensor", "a tensor " .. tostring(x.dtype) .. " shaped {" .. table.concat(x.shape, ", ") .. "}") end
  if name == "Variable" then return object_text("Variable", ("a Variable named %q, %s shaped {%s}"):format(x.name, x.dtype, table.concat(x.shape, ", "))) end
  if name == "Tape" then return object_text("Tape", "a gradient tape (mg.tape)") end
  if name then
    local text = M.help(name)
    if name:find("^nn%.") then text = text .. "\n" .. object_text("Layer", "a layer:") end
    if name:find("^optim%.") then text = text .. "\n" .. object_text("Optimizer", "an optimizer:") end
    if name == "data.Dataset" then text = text .. "\n" .. object_text("Dataset", "a dataset:") end
    if name == "progress" then text = text .. "\n" .. object_text("Progress", "a progress bar:") end
    return text
  end
  return ("no help for this %s: help() lists the groups and their names"):format(what(x))
end

--- the API table of docs/reference.md, from the entries (`make api-table` writes it)
function M.markdown ()
  local out = {"| group | signature | what it does |", "|---|---|---|"}
  local function cell (s) return (s:gsub("|", "\\|")) end
  for _, g in ipairs(groups) do
    for i, e in ipairs(g[2]) do
      local entry = M.entry(e[1])
      out[#out + 1] = ("| %s | `%s` | %s |"):format(i == 1 and g[1] or "", cell(shown(entry)), cell(entry.doc or ""))
    end
  end
  return table.concat(out, "\n") .. "\n"
end

--- show([x]): prints help(x); the moongrad interpreter's global `help`
function M.show (x) print(M.help(x)) end

return setmetatable(M, {__call = function(_, x) return M.help(x) end})

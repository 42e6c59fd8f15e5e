--- moongrad.transformer: the layers of a transformer, which mg.nn gives
-- (loading this module on first use): Embedding, PositionalEmbedding,
-- LayerNorm, MultiHeadAttention and TransformerBlock (pre-norm).
--
--   local block = mg.nn.TransformerBlock(4, 128, {causal = true})
--   local y = block(x)                        -- x (batch, time, 128)
--
-- They follow mg.nn's conventions: variables built on the first call from
-- the input's shape, `name`, a `training` flag (dropout) that fit's
-- evaluate/predict turn off, summary() and checkpoint names. Sequences are
-- (batch, time, features); token ids are int64, 1-based, as class numbers
-- are everywhere in moongrad.
--
-- Attention runs mg.scaled_dot_product_attention, a fused primitive whose
-- tape keeps q, k and v only (no (batch, heads, T, T) tensor), unless
-- attention dropout is on while training, or {fused = false} asks for the
-- plain ops (batched matmul, masked softmax, matmul): the reference the
-- specs hold the fused op to.
-- @module moongrad.transformer
local mg = require "moongrad"
local check = require "moongrad.check"
local layer = require "moongrad.layer"

local fail, show = check.fail, check.show
local class, new_layer, Layer = layer.class, layer.new, layer.Layer

local transformer = {}

local NEG = {float32 = -3.4028234663852886e38, float64 = -1.7976931348623157e308}   -- the lowest finite

-- {====================== helpers ==============================

local optional_boolean = check.rule("true, false or nil", function(v) return v == nil or type(v) == "boolean" end)
local dtype_rule = check.rule("'float32' or 'float64'", function(v) return v == "float32" or v == "float64" end)
local init_rule = check.rule("'uniform', 'normal', 'glorot_uniform', 'zeros' or a function(shape, dtype)",
                             function(v) return type(v) == "string" or check.is_callable(v) end)
local mask_rule = check.rule("a bool tensor (true: attend) or nil", function(v)
  return v == nil or (check.is_array(v) and v.dtype == "bool")
end)

-- initial values for `who` from the initializers' stream: Keras' Embedding
-- default (uniform in +-0.05), GPT-2's normal(0, 0.02), Glorot, zeros
local function initializer (who, init)
  if check.is_callable(init) then
    return function(shape, dtype) return mg.random.with_init_stream(init, shape, dtype) end
  end
  local known = {
    uniform = function(shape, dtype) return mg.random.with_init_stream(mg.random.uniform, shape, -0.05, 0.05, dtype) end,
    normal = function(shape, dtype) return mg.random.with_init_stream(mg.random.normal, shape, 0, 0.02, dtype) end,
    glorot_uniform = layer.glorot_uniform,
    zeros = function(shape, dtype) return mg.zeros(shape, dtype) end,
  }
  return known[init] or check.unknown(who, "initializer", init, {"uniform", "normal", "glorot_uniform", "zeros"})
end

-- x must be a float tensor (batch, time, features) with `features` (when known)
local function check_sequence (who, x, features, what)
  what = what or "input"
  check.float_tensor(who, what, x)
  if x.ndim ~= 3 then
    fail(who, "%s must have 3 dimensions (batch, time, features), got shape %s", what, check.shape(x.shape))
  end
  if features and x.shape[3] ~= features then
    fail(who, "%s has %d features (its last axis), the layer was built for %d", what, x.shape[3], features)
  end
end

-- the variable v's dtype must be x's
local function check_dtype (who, x, v)
  if v and not layer.fits(x.dtype, v.dtype) then fail(who, "input is %s, the layer was built for %s", x.dtype, v.dtype) end
end

-- call options: {mask=, training=}
local CALL_OPTIONS = {{"mask", mask_rule}, {"training", optional_boolean}}

-- x (..., n) @ kernel (n, m) + bias: mg.dense folds x into one (rows, n)
-- matrix, so the kernel's gradient is a single GEMM (a batched operand would
-- give one product per batch entry and a sum), and adds the bias in the
-- product's own pass
local function project (x, kernel, bias)
  return mg.dense(x, kernel, bias)
end

-- the attention mask as (batch, 1|heads, Tq, Tk) for q of (B, H, Tq, dh):
-- (B, Tk) marks the keys that are real (padding), (B, Tq, Tk) per query
local function attention_mask (who, mask, B, Tq, Tk)
  if mask == nil then return nil end
  local s = mask.shape
  if #s == 2 and s[1] == B and s[2] == Tk then return mg.reshape(mask, {B, 1, 1, Tk}) end
  if #s == 3 and s[1] == B and s[2] == Tq and s[3] == Tk then return mg.reshape(mask, {B, 1, Tq, Tk}) end
  if #s == 4 and (s[1] == B or s[1] == 1) and s[3] == Tq and s[4] == Tk then return mask end
  fail(who, "mask must be (batch, keys) = (%d,%d), (batch, queries, keys) = (%d,%d,%d) or (batch, heads, "
       .. "queries, keys), got %s", B, Tk, B, Tq, Tk, check.shape(s))
end

-- }=============================================================


-- {========================= Embedding =========================

--- Embedding(input_dim, output_dim, {embeddings_initializer="uniform", dtype="float32", name=}):
-- a table of input_dim vectors of output_dim; ids (any shape, int64 1..input_dim) ->
-- (ids' shape..., output_dim). A gather, whose gradient adds each row back (scatter-add).
local Embedding = class("Embedding", Layer)
transformer.Embedding = Embedding

local EMBEDDING_OPTIONS = {{"embeddings_initializer", init_rule, "uniform"}, {"dtype", dtype_rule, "float32"},
                           {"name", check.string}}

function Embedding.__new (input_dim, output_dim, opts)
  check.value("Embedding", "input_dim", input_dim, check.positive_integer)
  check.value("Embedding", "output_dim", output_dim, check.positive_integer)
  opts = check.options("Embedding", opts, EMBEDDING_OPTIONS)
  local self = new_layer(Embedding, {input_dim = input_dim, output_dim = output_dim, dtype = opts.dtype,
                                     name = opts.name}, "embedding")
  self._init = initializer("Embedding", opts.embeddings_initializer)
  return self
end

function Embedding:build ()
  self.embeddings = self:add_variable("embeddings", self._init({self.input_dim, self.output_dim}, self.dtype))
end

function Embedding:call (ids)
  local who = "Embedding"
  if not check.is_array(ids) or ids.dtype ~= "int64" then
    fail(who, "ids must be an int64 tensor of token numbers 1..%d, got %s", self.input_dim,
         check.is_array(ids) and ids.dtype or show(ids))
  end
  if ids:numel() > 0 then
    local lo, hi = mg.min(ids):item(), mg.max(ids):item()
    if lo < 1 or hi > self.input_dim then
      fail(who, "ids must be token numbers in 1..%d (1-based), got %d%s", self.input_dim, lo < 1 and lo or hi,
           (lo == 0 and hi < self.input_dim) and "; add 1 to 0-based ids" or "")
    end
  end
  if not rawget(self, "embeddings") then self:build() end
  return mg.gather(self.embeddings, ids, 1)
end

function Embedding:describe ()
  return ("moongrad.nn.Embedding '%s' (%d x %d)"):format(self.name, self.input_dim, self.output_dim)
end

-- }=============================================================


-- {==================== PositionalEmbedding ====================

--- PositionalEmbedding(sequence_length, {initializer="uniform", name=}): adds a
-- learned vector per position to x (batch, time, features), time <= sequence_length.
local PositionalEmbedding = class("PositionalEmbedding", Layer)
transformer.PositionalEmbedding = PositionalEmbedding

local POSITIONAL_OPTIONS = {{"initializer", init_rule, "uniform"}, {"name", check.string}}

function PositionalEmbedding.__new (sequence_length, opts)
  check.value("PositionalEmbedding", "sequence_length", sequence_length, check.positive_integer)
  opts = check.options("PositionalEmbedding", opts, POSITIONAL_OPTIONS)
  local self = new_layer(PositionalEmbedding, {sequence_length = sequence_length, name = opts.name},
                         "positional_embedding")
  self._init = initializer("PositionalEmbedding", opts.initializer)
  return self
end

function PositionalEmbedding:call (x)
  local who = "PositionalEmbedding"
  local p = rawget(self, "embeddings")
  check_sequence(who, x, p and p.shape[2])
  check_dtype(who, x, p)
  local T = x.shape[2]
  if T > self.sequence_length then
    fail(who, "the input has %d positions, the layer holds %d (its sequence_length)", T, self.sequence_length)
  end
  if not p then
    p = self:add_variable("embeddings", self._init({self.sequence_length, x.shape[3]}, layer.weights_dtype(x.dtype)))
    self.embeddings = p
  end
  if T < self.sequence_length then p = mg.slice(p, {1, T}) end
  return x + p
end

function PositionalEmbedding:describe ()
  return ("moongrad.nn.PositionalEmbedding '%s' (sequence_length=%d)"):format(self.name, self.sequence_length)
end

-- }=============================================================


-- {========================= LayerNorm =========================

--- LayerNorm{epsilon=1e-5, center=true, scale=true, name=}: normalizes each
-- vector along the last axis to mean 0 and variance 1, then scales by gamma
-- and shifts by beta (PyTorch's LayerNorm and its epsilon; Keras'
-- LayerNormalization(axis=-1)). One fused primitive, mg.layer_norm.
local LayerNorm = class("LayerNorm", Layer)
transformer.LayerNorm = LayerNorm

local LAYERNORM_OPTIONS = {{"epsilon", check.nonnegative, 1e-5}, {"center", check.boolean, true},
                           {"scale", check.boolean, true}, {"name", check.string}}

function LayerNorm.__new (opts)
  opts = check.options("LayerNorm", opts, LAYERNORM_OPTIONS)
  return new_layer(LayerNorm, {epsilon = opts.epsilon, center = opts.center, scale = opts.scale,
                               name = opts.name}, "layer_norm")
end

function LayerNorm:call (x)
  local who = "LayerNorm"
  check.float_tensor(who, "input", x)
  if x.ndim == 0 then fail(who, "input must have at least 1 dimension, got shape ()") end
  local built = rawget(self, "_built")
  local D = x.shape[x.ndim]
  if built then
    check_dtype(who, x, self.gamma or self.beta)
    if D ~= self._features then
      fail(who, "input has %d features (its last axis), the layer was built for %d", D, self._features)
    end
  else
    if self.scale then self.gamma = self:add_variable("gamma", mg.ones({D}, layer.weights_dtype(x.dtype))) end
    if self.center then self.beta = self:add_variable("beta", mg.zeros({D}, layer.weights_dtype(x.dtype))) end
    self._features, self._built = D, true
  end
  return mg.layer_norm(x, rawget(self, "gamma"), rawget(self, "beta"), {epsilon = self.epsilon})
end

-- }=============================================================


-- {===================== MultiHeadAttention ====================

--- MultiHeadAttention(heads, dim, {causal=false, dropout=0, use_bias=true, fused=true,
-- training=true, name=}): self-attention mha(x) or cross-attention mha(query, value),
-- with an optional {mask=, training=} last. dim is the model's width, split among
-- the heads (PyTorch's embed_dim; Keras' key_dim is dim / heads); the output has dim
-- features. Projections query, key, value (in -> dim) and output (dim -> dim).
-- causal: query i sees keys 1..i. mask (bool, true: attend): (batch, keys) for
-- padding, (batch, queries, keys), or 4-D broadcasting to (batch, heads, queries, keys).
-- dropout applies to the attention weights while training.
local MultiHeadAttention = class("MultiHeadAttention", Layer)
transformer.MultiHeadAttention = MultiHeadAttention

-- heads and dim as attention needs them: dim / heads features per head
local function check_heads (who, heads, dim)
  check.value(who, "heads", heads, check.positive_integer)
  check.value(who, "dim", dim, check.positive_integer)
  if dim % heads ~= 0 then
    fail(who, "dim (%d) must be a multiple of heads (%d): each head gets dim / heads features", dim, heads)
  end
end

local MHA_OPTIONS = {{"causal", check.boolean, false}, {"dropout", check.fraction, 0},
                     {"use_bias", check.boolean, true}, {"fused", check.boolean, true},
                     {"training", check.boolean, true}, {"name", check.string}}

function MultiHeadAttention.__new (heads, dim, opts)
  local who = "MultiHeadAttention"
  check_heads(who, heads, dim)
  opts = check.options(who, opts, MHA_OPTIONS)
  return new_layer(MultiHeadAttention, {heads = heads, dim = dim, head_dim = dim // heads, causal = opts.causal,
                                        dropout = opts.dropout, use_bias = opts.use_bias, fused = opts.fused,
                                        training = opts.training, name = opts.name}, "multi_head_attention")
end

function MultiHeadAttention:build (query, value)
  local dtype, dim = layer.weights_dtype(query.dtype), self.dim
  local function proj (name, fan_in)
    self[name .. "_kernel"] = self:add_variable(name .. "_kernel", layer.glorot_uniform({fan_in, dim}, dtype))
    if self.use_bias then self[name .. "_bias"] = self:add_variable(name .. "_bias", mg.zeros({dim}, dtype)) end
  end
  proj("query", query.shape[3])
  proj("key", value.shape[3])
  proj("value", value.shape[3])
  proj("output", dim)
end

-- (B, T, dim) -> (B, heads, T, head_dim), a view
local function split_heads (self, x)
  local s = x.shape
  return mg.swapaxes(mg.reshape(x, {s[1], s[2], self.heads, self.head_dim}), 2, 3)
end

-- the plain ops: softmax(q k^T * scale, masked) (dropout) v
function MultiHeadAttention:_plain (q, k, v, mask, training)
  local Tq, Tk = q.shape[3], k.shape[3]
  local s = mg.matmul(q, mg.swapaxes(k, 3, 4)) * (1 / math.sqrt(self.head_dim))
  if self.causal then
    local c = mg.less_equal(mg.reshape(mg.arange(1, Tk + 1, 1, "int64"), {1, Tk}),
                            mg.reshape(mg.arange(1, Tq + 1, 1, "int64"), {Tq, 1}))
    mask = mask and mg.logical_and(mask, c) or c
  end
  local p
  if mask then
    p = mg.where(mask, mg.softmax(mg.where(mask, s, NEG[s.dtype] or NEG.float32), -1), 0)   -- 0 where nothing is attended
  else
    p = mg.softmax(s, -1)
  end
  if training and self.dropout > 0 then p = layer.dropout(p, self.dropout) end
  return mg.matmul(p, v)
end

function MultiHeadAttention:call (query, value, opts)
  local who = "MultiHeadAttention"
  if type(value) == "table" and not check.is_array(value) then value, opts = nil, value end
  opts = check.options(who, opts, CALL_OPTIONS)
  local built = rawget(self, "query_kernel")
  check_sequence(who, query, built and built.shape[1], "query")
  if value ~= nil then
    check_sequence(who, value, rawget(self, "key_kernel") and self.key_kernel.shape[1], "value")
    if value.dtype ~= query.dtype then fail(who, "query is %s but value is %s", query.dtype, value.dtype) end
    if value.shape[1] ~= query.shape[1] then
      fail(who, "query and value must have the same batch size, got %d and %d", query.shape[1], value.shape[1])
    end
  end
  value = value or query
  check_dtype(who, query, built)
  if not built then self:build(query, value) end
  local training = opts.training
  if training == nil then training = self.training end
  local B, Tq, Tk = query.shape[1], query.shape[2], value.shape[2]
  local mask = attention_mask(who, opts.mask, B, Tq, Tk)
  local q = split_heads(self, project(query, self.query_kernel, self.query_bias))
  local k = split_heads(self, project(value, self.key_kernel, self.key_bias))
  local v = split_heads(self, project(value, self.value_kernel, self.value_bias))
  query, value = nil, nil     -- let go at once: a tensor held across two collections grows old (full ones find it)
  local o
  if self.fused and not (training and self.dropout > 0) then
    o = mg.scaled_dot_product_attention(q, k, v, {mask = mask, causal = self.causal})
  else
    o = self:_plain(q, k, v, mask, training)
  end
  q, k, v, mask = nil, nil, nil, nil
  o = mg.reshape(mg.swapaxes(o, 2, 3), {B, Tq, self.dim})            -- the heads side by side
  return project(o, self.output_kernel, self.output_bias)
end

function MultiHeadAttention:describe ()
  return ("moongrad.nn.MultiHeadAttention '%s' (heads=%d, dim=%d%s)"):format(self.name, self.heads, self.dim,
                                                                           self.causal and ", causal" or "")
end

-- }=============================================================


-- {====================== TransformerBlock =====================

--- TransformerBlock(heads, dim, {mlp_dim=4*dim, causal=false, dropout=0,
-- activation="gelu", epsilon=1e-5, fused=true, training=true, name=}): a pre-norm
-- block (GPT-2's): x = x + attention(layer_norm(x)); x = x + mlp(layer_norm(x)), the
-- MLP dim -> mlp_dim -> dim with `activation` between ("gelu", "gelu_tanh", "relu"
-- or a function); dropout (while training) on each branch before its residual add.
-- Called as block(x [, {mask=, training=}]), x (batch, time, dim).
local TransformerBlock = class("TransformerBlock", Layer)
transformer.TransformerBlock = TransformerBlock

local activation_rule = layer.activation_rule

local BLOCK_OPTIONS = {{"mlp_dim", check.positive_integer}, {"causal", check.boolean, false},
                       {"dropout", check.fraction, 0}, {"activation", activation_rule, "gelu"},
                       {"epsilon", check.nonnegative, 1e-5}, {"fused", check.boolean, true},
                       {"training", check.boolean, true}, {"name", check.string}}

function TransformerBlock.__new (heads, dim, opts)
  local who = "TransformerBlock"
  check_heads(who, heads, dim)
  opts = check.options(who, opts, BLOCK_OPTIONS)
  local act = layer.activation_of(who, opts.activation)
  local self = new_layer(TransformerBlock, {heads = heads, dim = dim, mlp_dim = opts.mlp_dim or 4 * dim,
                                            causal = opts.causal, dropout = opts.dropout, training = opts.training,
                                            name = opts.name}, "transformer_block")
  self.activation = act
  self.ln1 = self:track(LayerNorm{epsilon = opts.epsilon})
  self.attention = self:track(MultiHeadAttention(heads, dim, {causal = opts.causal, dropout = opts.dropout,
                                                                  fused = opts.fused, training = opts.training}))
  self.ln2 = self:track(LayerNorm{epsilon = opts.epsilon})
  local Dense = require("moongrad.nn").Dense     -- here, not at load: mg.nn loads this module
  self.mlp_in = self:track(Dense(self.mlp_dim))
  self.mlp_out = self:track(Dense(dim))
  return self
end

function TransformerBlock:call (x, opts)
  local who = "TransformerBlock"
  opts = check.options(who, opts, CALL_OPTIONS)
  check_sequence(who, x, self.dim)
  local training = opts.training
  if training == nil then training = self.training end
  local drop = training and self.dropout > 0
  local h = self.attention(self.ln1(x), {mask = opts.mask, training = training})
  if drop then h = layer.dropout(h, self.dropout) end
  x, h = x + h, nil
  local B, T = x.shape[1], x.shape[2]
  -- the MLP on (B*T, dim) rows: 2-D products keep each kernel's gradient one GEMM
  h = self.mlp_out(self.activation(self.mlp_in(mg.reshape(self.ln2(x), {B * T, self.dim}))))
  h = mg.reshape(h, {B, T, self.dim})
  if drop then h = layer.dropout(h, self.dropout) end
  return x + h
end

function TransformerBlock:describe ()
  return ("moongrad.nn.TransformerBlock '%s' (heads=%d, dim=%d, mlp_dim=%d%s)"):format(self.name, self.heads,
    self.dim, self.mlp_dim, self.causal and ", causal" or "")
end

-- }=============================================================

return check.export(transformer)          -- errors name the user's line (moongrad.check)

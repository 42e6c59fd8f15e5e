-- mg.losses and mg.metrics: values against their definitions, gradchecks in
-- float64, stability at extreme logits, masks for sequences, errors.
local mg = require "moongrad"
local h = require "helpers"
local L, M = mg.losses, mg.metrics

local function f64 (data) return mg.constant(data, "float64") end
local function i64 (data) return mg.constant(data, "int64") end
local function err (fn, msg) assert.has_error(fn, msg) end

-- log(sum(exp(row))) and the log-softmax of a row, by hand
local function logsumexp (row)
  local m = -math.huge
  for _, v in ipairs(row) do m = math.max(m, v) end
  local z = 0
  for _, v in ipairs(row) do z = z + math.exp(v - m) end
  return m + math.log(z)
end

local function sigmoid (x) return 1 / (1 + math.exp(-x)) end

describe("losses match their definitions", function()
  local y = f64{{1, 2}, {3, 5}}
  local p = f64{{1.5, 2}, {2, 3}}

  it("mean_squared_error and mean_absolute_error, with every reduction", function()
    assert.equal((0.25 + 0 + 1 + 4) / 4, L.mean_squared_error(y, p):item())
    assert.equal(0.25 + 1 + 4, L.mean_squared_error(y, p, {reduction = "sum"}):item())
    assert.same({{0.25, 0}, {1, 4}}, L.mean_squared_error(y, p, {reduction = "none"}):totable())
    assert.equal((0.5 + 0 + 1 + 2) / 4, L.mean_absolute_error(y, p):item())
    assert.equal(L.mse, nil)                                   -- names, not aliases, are the functions
    assert.equal(L.mean_squared_error, (L.get("mse")))
  end)

  it("binary_crossentropy from probabilities and from logits", function()
    local t = f64{1, 0, 1, 0.25}
    local x = {-1, 2, 0.5, 3}
    local logits = f64(x)
    local want = 0
    for i, v in ipairs(x) do
      local q, yt = sigmoid(v), t:totable()[i]
      want = want - (yt * math.log(q) + (1 - yt) * math.log(1 - q))
    end
    want = want / 4
    h.assert_close(L.binary_crossentropy(t, logits, {from_logits = true}), want, 1e-12)
    h.assert_close(L.binary_crossentropy(t, mg.sigmoid(logits)), want, 1e-12)
    -- int64 and bool targets are 0/1
    h.assert_close(L.binary_crossentropy(i64{1, 0}, f64{0.9, 0.2}), -(math.log(0.9) + math.log(0.8)) / 2, 1e-12)
    h.assert_close(L.binary_crossentropy(mg.greater(f64{1, 0}, 0.5), f64{0.9, 0.2}),
                   -(math.log(0.9) + math.log(0.8)) / 2, 1e-12)
  end)

  it("categorical_crossentropy: one-hot, soft targets, logits and probabilities", function()
    local rows = {{2, 1, 0}, {0, 0, 3}}
    local logits = f64(rows)
    local onehot = f64{{1, 0, 0}, {0, 0, 1}}
    local want = ((logsumexp(rows[1]) - 2) + (logsumexp(rows[2]) - 3)) / 2
    h.assert_close(L.categorical_crossentropy(onehot, logits, {from_logits = true}), want, 1e-12)
    h.assert_close(L.categorical_crossentropy(onehot, mg.softmax(logits, -1)), want, 1e-12)
    -- probabilities are normalised over the last axis first, as Keras does
    h.assert_close(L.categorical_crossentropy(onehot, mg.softmax(logits, -1) * 0.5), want, 1e-12)
    local soft = f64{{0.5, 0.5, 0}, {0, 0.25, 0.75}}
    local want_soft = (0.5 * (logsumexp(rows[1]) - 2) + 0.5 * (logsumexp(rows[1]) - 1)
                       + 0.25 * logsumexp(rows[2]) + 0.75 * (logsumexp(rows[2]) - 3)) / 2
    h.assert_close(L.categorical_crossentropy(soft, logits, {from_logits = true}), want_soft, 1e-12)
    h.assert_close(L.categorical_crossentropy(onehot, logits, {from_logits = true, reduction = "none"}),
                   {logsumexp(rows[1]) - 2, logsumexp(rows[2]) - 3}, 1e-12)
  end)

  it("sparse_categorical_crossentropy: 1-based labels, logits or probabilities, (B,1) labels", function()
    local rows = {{2, 1, 0}, {0, 0, 3}}
    local logits = f64(rows)
    local labels = i64{1, 3}
    local want = ((logsumexp(rows[1]) - 2) + (logsumexp(rows[2]) - 3)) / 2
    h.assert_close(L.sparse_categorical_crossentropy(labels, logits, {from_logits = true}), want, 1e-12)
    h.assert_close(L.sparse_categorical_crossentropy(labels, mg.softmax(logits, -1)), want, 1e-12)
    h.assert_close(L.sparse_categorical_crossentropy(i64{{1}, {3}}, logits, {from_logits = true}), want, 1e-12)
    -- the same as categorical with the one-hot, and as mg.nn's softmax_cross_entropy
    local onehot = f64{{1, 0, 0}, {0, 0, 1}}
    h.assert_close(L.sparse_categorical_crossentropy(labels, logits, {from_logits = true}),
                   L.categorical_crossentropy(onehot, logits, {from_logits = true}), 1e-14)
    h.assert_close(L.softmax_cross_entropy(logits, labels), mg.nn.softmax_cross_entropy(logits, labels), 1e-14)
    h.assert_close(L.softmax_cross_entropy(logits, onehot), mg.nn.softmax_cross_entropy(logits, onehot), 1e-14)
  end)

  it("label_smoothing mixes the target with the uniform one", function()
    local logits = f64{{2, 1, 0}}
    local e = 0.3
    local smooth = f64{{1 - e + e / 3, e / 3, e / 3}}
    h.assert_close(L.sparse_categorical_crossentropy(i64{1}, logits, {from_logits = true, label_smoothing = e}),
                   L.categorical_crossentropy(smooth, logits, {from_logits = true}), 1e-12)
    h.assert_close(L.categorical_crossentropy(f64{{1, 0, 0}}, logits, {from_logits = true, label_smoothing = e}),
                   L.categorical_crossentropy(smooth, logits, {from_logits = true}), 1e-12)
    h.assert_close(L.binary_crossentropy(f64{1}, f64{0}, {from_logits = true, label_smoothing = 0.2}), math.log(2), 1e-12)
  end)

  it("loss objects are Keras' classes", function()
    local loss = L.SparseCategoricalCrossentropy{from_logits = true, reduction = "sum"}
    local logits, labels = f64{{2, 1, 0}, {0, 0, 3}}, i64{1, 3}
    h.assert_close(loss(labels, logits), L.sparse_categorical_crossentropy(labels, logits,
                   {from_logits = true, reduction = "sum"}), 0)
    assert.equal("sparse_categorical_crossentropy", loss.name)
    assert.is_true(loss.from_logits)
    assert.equal(0.25, L.MeanSquaredError()(f64{1, 2}, f64{1, 3}):item() * 0.5)
    local fn, name, from_logits = L.get(loss)
    assert.equal(loss, fn)
    assert.equal("sparse_categorical_crossentropy", name)
    assert.is_true(from_logits)
  end)
end)

describe("masks and sequences", function()
  it("sparse_categorical_crossentropy over (B, T, C) logits with a mask", function()
    mg.random.seed(5)
    local logits = mg.random.normal({2, 3, 4}, 0, 1, "float64")
    local labels = i64{{1, 4, 0}, {2, 2, 3}}                     -- 0: padding, masked out
    local mask = mg.constant({{true, true, false}, {true, true, true}})
    local rows = logits:totable()
    local total = 0
    for b = 1, 2 do
      for t = 1, 3 do
        local k = labels:totable()[b][t]
        if k > 0 then total = total + logsumexp(rows[b][t]) - rows[b][t][k] end
      end
    end
    h.assert_close(L.sparse_categorical_crossentropy(labels, logits, {from_logits = true, mask = mask}), total / 5, 1e-12)
    h.assert_close(L.sparse_categorical_crossentropy(labels, logits, {from_logits = true, mask = mask, reduction = "sum"}),
                   total, 1e-12)
    local none = L.sparse_categorical_crossentropy(labels, logits, {from_logits = true, mask = mask, reduction = "none"})
    assert.same({2, 3}, none.shape)
    assert.equal(0, none:totable()[1][3])
    -- float weights, and everything masked gives 0, not NaN
    h.assert_close(L.sparse_categorical_crossentropy(labels, logits, {from_logits = true,
                   mask = mg.cast(mask, "float64")}), total / 5, 1e-12)
    assert.equal(0, L.sparse_categorical_crossentropy(labels, logits, {from_logits = true,
                 mask = mg.zeros({2, 3}, "bool")}):item())
    -- without the mask the padding label is an error
    err(function() L.sparse_categorical_crossentropy(labels, logits, {from_logits = true}) end,
        "sparse_categorical_crossentropy: y_true must be class numbers in 1..4 (1-based), got 0")
  end)

  it("other losses take a mask of their unreduced shape", function()
    local y, p = f64{1, 2, 3}, f64{2, 2, 5}
    assert.equal(0.5, L.mean_squared_error(y, p, {mask = i64{1, 1, 0}}):item())
    err(function() L.mean_squared_error(y, p, {mask = i64{1, 1}}) end,
        "mean_squared_error: mask has shape (2) but the unreduced loss has shape (3)")
  end)
end)

describe("gradients", function()
  mg.random.seed(11)
  local logits = mg.random.normal({3, 4}, 0, 2, "float64")
  local labels = i64{4, 1, 2}
  local onehot = f64{{0, 0, 0, 1}, {1, 0, 0, 0}, {0, 1, 0, 0}}
  local targets = mg.random.uniform({3, 4}, 0, 1, "float64")
  local cases = {
    {"mse", function(x) return L.mean_squared_error(targets, x) end},
    {"mae", function(x) return L.mean_absolute_error(targets, x + 3) end},
    {"bce logits", function(x) return L.binary_crossentropy(targets, x, {from_logits = true}) end},
    {"bce probabilities", function(x) return L.binary_crossentropy(targets, mg.sigmoid(x)) end},
    {"cce logits", function(x) return L.categorical_crossentropy(onehot, x, {from_logits = true, label_smoothing = 0.1}) end},
    {"cce probabilities", function(x) return L.categorical_crossentropy(onehot, mg.softmax(x, -1)) end},
    {"scce logits", function(x) return L.sparse_categorical_crossentropy(labels, x, {from_logits = true}) end},
    {"scce probabilities", function(x) return L.sparse_categorical_crossentropy(labels, mg.softmax(x, -1)) end},
    {"scce smoothing, masked", function(x)
      return L.sparse_categorical_crossentropy(labels, x, {from_logits = true, label_smoothing = 0.2,
                                                           mask = f64{1, 0, 0.5}})
    end},
    {"scce sequence", function(x)
      return L.sparse_categorical_crossentropy(i64{{4, 1, 2}}, mg.reshape(x, {1, 3, 4}), {from_logits = true,
                                                                                        reduction = "sum"})
    end},
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " gradchecks", function()
      assert.is_true(mg.test.gradcheck(c[2], {logits}))
    end)
  end
end)

describe("stability at extreme logits", function()
  it("crossentropies from logits of 1e4 are exact and their gradients finite", function()
    for _, dtype in ipairs({"float32", "float64"}) do
      local logits = mg.constant({{1e4, 0, -1e4}, {-1e4, 1e4, 0}}, dtype)
      h.assert_close(L.sparse_categorical_crossentropy(i64{1, 2}, logits, {from_logits = true}), 0, 0)
      h.assert_close(L.sparse_categorical_crossentropy(i64{2, 1}, logits, {from_logits = true}), 1.5e4, 1e-6)
      h.assert_close(L.categorical_crossentropy(mg.constant({{0, 0, 1}, {0, 1, 0}}, dtype), logits,
                                                {from_logits = true}), 1e4, 1e-6)
      local x = mg.constant({1e4, -1e4, 1e4, -1e4}, dtype)
      h.assert_close(L.binary_crossentropy(mg.constant({1, 0, 0, 1}, dtype), x, {from_logits = true},
                                           nil), 1e4 / 2, 1e-6)
      local t, loss = h.record(function(z)
        return L.sparse_categorical_crossentropy(i64{2, 1}, z, {from_logits = true}) +
               L.binary_crossentropy(mg.constant({1, 0, 0, 1}, dtype), mg.reshape(z, {6}):slice({1, 4}),
                                     {from_logits = true})
      end, logits)
      local g = t:gradient(loss, logits)
      for _, row in ipairs(g:totable()) do
        for _, v in ipairs(row) do assert.is_true(v == v and math.abs(v) < 1) end
      end
      assert.is_true(loss:item() < math.huge)
    end
  end)

  it("float32 logits of 1e4 and 1e5 lose nothing to the large max: log 2, gradient -1/2", function()
    for _, v in ipairs{1e4, 1e5, -1e5} do
      local z = mg.constant({{v, v}})
      local t, loss = h.record(function(a)
        return L.categorical_crossentropy(mg.constant({{1, 0}}), a, {from_logits = true})
      end, z)
      h.assert_close(loss, math.log(2), 1e-7)
      h.assert_close(t:gradient(loss, z), mg.constant({{-0.5, 0.5}}), 1e-7)
      h.assert_close(mg.log_softmax(z), mg.constant({{-math.log(2), -math.log(2)}}), 1e-7)
    end
  end)

  it("a NaN probability is a NaN loss, as a NaN logit is, not the error for values outside [0, 1]", function()
    local nan = 0 / 0
    local function is_nan (t) local v = t:item() return v ~= v end
    assert.is_true(is_nan(L.binary_crossentropy(f64{0, 1}, f64{nan, 0.5})))
    assert.is_true(is_nan(L.categorical_crossentropy(f64{{1, 0}}, f64{{nan, 0.5}})))
    assert.is_true(is_nan(L.sparse_categorical_crossentropy(i64{1}, f64{{0.5, nan}})))
    assert.is_true(is_nan(L.binary_crossentropy(f64{0, 1}, f64{nan, 0.5}, {from_logits = true})))
    err(function() L.binary_crossentropy(f64{0, 1}, f64{-0.5, 0.5}) end,
        "binary_crossentropy: y_pred has values outside [0, 1] (min -0.5, max 0.5), so it is not probabilities; "
        .. "for logits pass {from_logits = true}")
  end)

  it("probabilities of exactly 0 and 1 are clipped, not log(0)", function()
    local l = L.sparse_categorical_crossentropy(i64{2}, f64{{1, 0}})
    h.assert_close(l, -math.log(1e-7), 1e-9)
    h.assert_close(L.binary_crossentropy(f64{1}, f64{0}), -math.log(1e-7), 1e-9)
  end)
end)

describe("losses check their arguments", function()
  it("with messages that name the loss and the mismatch", function()
    local logits = f64{{1, 2, 3}, {3, 2, 1}}
    local scce, cce, bce, mse = L.sparse_categorical_crossentropy, L.categorical_crossentropy,
                                L.binary_crossentropy, L.mean_squared_error
    local cases = {
      {function() scce(i64{1, 2}, logits) end, "sparse_categorical_crossentropy: y_pred has values outside [0, 1] "
        .. "(min 1, max 3), so it is not probabilities; for logits pass {from_logits = true}"},
      {function() scce(i64{1}, logits, {from_logits = true}) end, "sparse_categorical_crossentropy: y_true must have "
        .. "shape (2) (y_pred's shape (2,3) without its last axis), got (1)"},
      {function() scce(i64{1, 4}, logits, {from_logits = true}) end,
       "sparse_categorical_crossentropy: y_true must be class numbers in 1..3 (1-based), got 4"},
      {function() scce(f64{1, 2}, logits, {from_logits = true}) end,
       "sparse_categorical_crossentropy: y_true must be int64 class numbers (1-based), got float64"},
      {function() scce(mg.softmax(logits, -1), logits, {from_logits = true}) end,
       "sparse_categorical_crossentropy: y_true must be int64 class numbers (1-based), got float64; "
       .. "one-hot targets go to categorical_crossentropy"},
      {function() scce(i64{1, 2}, i64{{1, 2, 3}, {3, 2, 1}}) end,
       "sparse_categorical_crossentropy: y_pred must be a float tensor, got int64"},
      {function() scce(i64{1, 2}, logits, {from_logit = true}) end, "sparse_categorical_crossentropy: unknown option "
        .. "'from_logit' (did you mean 'from_logits'? known: from_logits, reduction, mask, label_smoothing)"},
      {function() scce(i64{1, 2}, logits, {from_logits = true, reduction = "avg"}) end,
       "sparse_categorical_crossentropy: option 'reduction' must be 'mean', 'sum' or 'none', got 'avg'"},
      {function() scce(i64{1, 2}, logits, {from_logits = true, mask = {1, 1}}) end,
       "sparse_categorical_crossentropy: option 'mask' must be a tensor of weights (bool, int64 or float), got a table"},
      {function() cce(i64{1, 2}, logits, {from_logits = true}) end, "categorical_crossentropy: y_true is int64; class "
        .. "numbers go to sparse_categorical_crossentropy, one-hot targets here"},
      {function() cce(f64{1, 0, 0}, logits, {from_logits = true}) end,
       "categorical_crossentropy: y_true has shape (3) but y_pred has shape (2,3); they must match exactly"},
      {function() cce(mg.ones{2, 3}, logits, {from_logits = true}) end,
       "categorical_crossentropy: y_true is float32 but y_pred is float64; cast one"},
      {function() cce(f64{{1, 0, 0}, {0, 1, 0}}, logits, {label_smoothing = 2}) end,
       "categorical_crossentropy: option 'label_smoothing' must be a number in [0, 1], got 2"},
      {function() bce(f64{1, 0}, f64{1.5, 0}) end, "binary_crossentropy: y_pred has values outside [0, 1] "
        .. "(min 0, max 1.5), so it is not probabilities; for logits pass {from_logits = true}"},
      {function() bce(f64{{1}, {0}}, f64{0.5, 0.5}) end,
       "binary_crossentropy: y_true has shape (2,1) but y_pred has shape (2); they must match exactly"},
      {function() bce("y", f64{0.5}) end, "binary_crossentropy: y_true must be a tensor, got 'y'"},
      {function() mse(i64{1}, f64{1}) end, "mean_squared_error: y_true must be a float tensor, got int64"},
      {function() mse(f64{1}, nil) end, "mean_squared_error: y_pred must be a float tensor, got nil"},
      {function() L.get("crossentropy") end, "losses.get: unknown loss 'crossentropy' (known: mean_squared_error, "
        .. "mean_absolute_error, binary_crossentropy, categorical_crossentropy, sparse_categorical_crossentropy, mse, mae)"},
      {function() L.SparseCategoricalCrossentropy{from_logits = 1} end,
       "SparseCategoricalCrossentropy: option 'from_logits' must be true or false, got 1"},
      {function() L.softmax_cross_entropy(logits, i64{{3}, {1}}) end, "softmax_cross_entropy: labels must have shape (2) "
        .. "(the logits' shape (2,3) without its last axis), got (2,1); squeeze the last axis"},
    }
    for _, c in ipairs(cases) do err(c[1], c[2]) end
  end)

  it("softmax_cross_entropy gives mg.nn's messages, so nn may forward to it", function()
    local logits = f64{{1, 2, 3}, {3, 2, 1}}
    for _, labels in ipairs({i64{0, 2}, i64{1}, f64{1, 2}, mg.constant({1, 2}), "x"}) do
      local _, want = pcall(mg.nn.softmax_cross_entropy, logits, labels)
      local _, got = pcall(L.softmax_cross_entropy, logits, labels)
      assert.equal(want:gsub("^.-: softmax", "softmax"), got:gsub("^.-: softmax", "softmax"))
    end
  end)
end)

describe("metrics", function()
  local logits = f64{{2, 1, 0}, {0, 0, 3}, {1, 5, 0}, {0, 1, 0}}
  it("sparse_categorical_accuracy, categorical_accuracy, binary_accuracy, accuracy", function()
    assert.equal(0.75, M.sparse_categorical_accuracy(i64{1, 3, 1, 2}, logits):item())
    assert.equal(0.75, M.sparse_categorical_accuracy(i64{{1}, {3}, {1}, {2}}, logits):item())
    assert.equal(0.5, M.categorical_accuracy(f64{{1, 0, 0}, {0, 0, 1}, {1, 0, 0}, {1, 0, 0}}, logits):item())
    assert.equal(0.75, M.binary_accuracy(f64{1, 0, 1, 1}, f64{0.9, 0.2, 0.4, 0.6}):item())
    assert.equal(0.5, M.binary_accuracy(i64{1, 0, 1, 1}, f64{2, -1, -3, -0.5}, {threshold = 0}):item())
    -- accuracy picks the kind from the shapes and dtypes
    assert.equal(0.75, M.accuracy(i64{1, 3, 1, 2}, logits):item())
    assert.equal(0.5, M.accuracy(f64{{1, 0, 0}, {0, 0, 1}, {1, 0, 0}, {1, 0, 0}}, logits):item())
    assert.equal(0.75, M.accuracy(f64{{1}, {0}, {1}, {1}}, f64{{0.9}, {0.2}, {0.4}, {0.6}}):item())
    assert.equal("float64", M.accuracy(i64{1, 3, 1, 2}, logits).dtype)
  end)

  it("get resolves 'accuracy' by the loss, as Keras", function()
    assert.equal(M.sparse_categorical_accuracy, M.get("accuracy", "sparse_categorical_crossentropy"))
    assert.equal(M.categorical_accuracy, M.get("acc", "categorical_crossentropy"))
    assert.equal(M.binary_accuracy, M.get("accuracy", "binary_crossentropy"))
    local on_logits = M.get("accuracy", "binary_crossentropy", true)
    assert.equal(0.5, on_logits(f64{1, 0, 1, 1}, f64{2, -1, -3, -0.5}):item())       -- threshold 0
    assert.equal(M.accuracy, M.get("accuracy", "mean_squared_error"))
    err(function() M.get("acuracy") end, "metrics.get: unknown metric 'acuracy' (did you mean 'accuracy'? known: "
        .. "accuracy, binary_accuracy, categorical_accuracy, sparse_categorical_accuracy, mean_squared_error, "
        .. "mean_absolute_error, perplexity, acc, mse, mae)")
  end)

  it("check shapes and dtypes", function()
    err(function() M.sparse_categorical_accuracy(f64{1, 2}, logits) end,
        "sparse_categorical_accuracy: y_true must be int64 class numbers (1-based), got float64")
    err(function() M.sparse_categorical_accuracy(i64{1, 2}, logits) end,
        "sparse_categorical_accuracy: y_true must have shape (4) (y_pred's shape (4,3) without its last axis), got (2)")
    -- the labels the matching loss refuses, the metric refuses with the loss's words
    for _, bad in ipairs({{{0, 1, 2, 2}, 0, "; add 1 to 0-based labels"}, {{1, 2, 3, 4}, 4, ""}}) do
      for _, fn in ipairs({"sparse_categorical_accuracy", "sparse_categorical_crossentropy"}) do
        local f = fn == "sparse_categorical_accuracy" and M[fn] or mg.losses[fn]
        err(function() f(i64(bad[1]), logits) end,
            fn .. ": y_true must be class numbers in 1..3 (1-based), got " .. bad[2] .. bad[3])
      end
    end
    err(function() M.accuracy(f64{1, 2}, logits) end, "accuracy: y_true has shape (2); for y_pred of shape (4,3) it "
        .. "must be int64 class numbers shaped (4) or targets shaped like y_pred")
    err(function() M.binary_accuracy(f64{1}, f64{1}, {threshold = "half"}) end,
        "binary_accuracy: option 'threshold' must be a finite number, got 'half'")
  end)
end)

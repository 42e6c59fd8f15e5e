/*
** unary.c — elementwise maths of one tensor: neg, exp, log, sqrt, abs,
** sign, tanh, sigmoid, relu, softplus, logical_not, and the activations
** silu, elu and leaky_relu (the last two with a parameter).
**
** Each op is one block: its kernels, its backward rule, its registry row
** and its entry point. exp, log and tanh go through glibc's vector maths
** (vecmath.h), so their loops run 8 or 16 values at a time.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/op.h"
#include "vecmath.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define UNARY_OPS(X) \
  X(NEG, neg) X(EXP, exp) X(LOG, log) X(SQRT, sqrt) X(ABS, abs) X(SIGN, sign) X(TANH, tanh) \
  X(SIGMOID, sigmoid) X(RELU, relu) X(SOFTPLUS, softplus) X(LOGICAL_NOT, logical_not) X(SILU, silu) \
  X(ELU, elu) X(LEAKY_RELU, leaky_relu) X(ISFINITE, isfinite) X(ISNAN, isnan) X(ISINF, isinf)
enum { UNARY_OPS(MG_ROW_ENUM) UNARY__COUNT };

/* {=================== kernels and the common path =========== */

/* (VM_MAP1: every element through the same code, whatever its place) */
#define KERNEL(NAME, TI, TO, EXPR) \
  static void NAME (int64_t n, char **p, const int64_t *s) { VM_MAP1(TI, TO, EXPR); }
#define FLOAT_KERNELS(OP, EXPR) \
  KERNEL(OP##_f32, float, float, EXPR) KERNEL(OP##_f64, double, double, EXPR)

#define EXP(x)    _Generic((x), float: expf, default: exp)(x)
#define LOG(x)    _Generic((x), float: logf, default: log)(x)
#define LOG1P(x)  _Generic((x), float: log1pf, default: log1p)(x)
#define SQRT(x)   _Generic((x), float: sqrtf, default: sqrt)(x)
#define FABS(x)   _Generic((x), float: fabsf, default: fabs)(x)
#define TANH(x)   _Generic((x), float: tanhf, default: tanh)(x)

typedef struct { mg_kernel k; } kernel_ud;

static void run_kernel (int64_t n, char **p, const int64_t *s, void *ud) {
  ((const kernel_ud *)ud)->k(n, p, s);
}

/* the kernel of every one-input elementwise op (maths.c's rows too) */
mg_status mg_unary_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  mg_tensor *out = mg_empty(x->shape, x->ndim, x->dtype);
  if (out == NULL) return MG_ERR;
  mg_iter it;
  const mg_tensor *ops[2] = {out, x};
  mg_iter_init(&it, x->shape, x->ndim, 2, ops);
  char *base[2] = {mg_ptr(out), mg_ptr(x)};
  size_t sz[2] = {mg_dtype_size(x->dtype), mg_dtype_size(x->dtype)};
  kernel_ud ud = {c->def->kernel[x->dtype]};
  mg_iter_run(&it, base, sz, run_kernel, &ud);
  c->out[0] = out;
  return MG_OK;
}

/* the entry of a one-input elementwise op (maths.c's rows take it too) */
mg_tensor *mg_unary_op (const mg_opdef *op, mg_tensor *x) {
  const char *fn = op->info.name;
  if (x == NULL) {
    char cfn[32];
    snprintf(cfn, sizeof cfn, "mg_%s", fn);
    return mg_null_arg(cfn, "x"), NULL;
  }
  if (mg_is_half(x->dtype) && op->kernel[MG_FLOAT32] != NULL) {   /* computed in float32 (autocast.c) */
    mg_tensor *x32 = mg_half_to_float32(x), *r = mg_unary_op(op, x32);
    mg_tensor_release(x32);
    return r;
  }
  if (op->kernel[x->dtype] == NULL) return mg_refuse_dtype(fn, x->dtype, op->kernel[MG_BOOL] != NULL), NULL;
  mg_opcall c = MG_OPCALL(op, 1, &x, NULL, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

/* }========================================================== */


/* {==================== ops and gradients =================== */

/* neg: out = -x.  grad: dx = -dout */
FLOAT_KERNELS(neg, -x)
KERNEL(neg_i64, int64_t, int64_t, 0u - (uint64_t)x)          /* wraps, as Lua's */
static mg_status neg_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  MG_UNUSED(n);
  din[0] = mg_neg(dout[0]);
  return MG_OK;
}
MG_ROW(NEG, neg) = {
  .forward = mg_unary_forward,
  .info = {.name = "neg", .kind = MG_OP_UNARY, .symbol = "-", .metamethod = "__unm",
           .doc = "-x", .fn.unary = mg_neg},
  .kernel = {[MG_FLOAT32] = neg_f32, [MG_FLOAT64] = neg_f64, [MG_INT64] = neg_i64},
  .backward = neg_backward,
};
mg_tensor *mg_neg (mg_tensor *x) { return mg_unary_op(&neg_op, x); }

/* exp: out = e^x.  grad: dx = dout * out */
FLOAT_KERNELS(exp, EXP(x))
static mg_status exp_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_mul(dout[0], n->out[0]);
  return MG_OK;
}
MG_ROW(EXP, exp) = {
  .forward = mg_unary_forward,
  .info = {.name = "exp", .kind = MG_OP_UNARY, .doc = "e^x", .fn.unary = mg_exp},
  .kernel = {[MG_FLOAT32] = exp_f32, [MG_FLOAT64] = exp_f64},
  .saves = MG_SAVE_OUT(0), .backward = exp_backward,
};
mg_tensor *mg_exp (mg_tensor *x) { return mg_unary_op(&exp_op, x); }

/* log: out = ln x.  grad: dx = dout / x */
FLOAT_KERNELS(log, LOG(x))
static mg_status log_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_div(dout[0], n->in[0]);
  return MG_OK;
}
MG_ROW(LOG, log) = {
  .forward = mg_unary_forward,
  .info = {.name = "log", .kind = MG_OP_UNARY, .doc = "the natural logarithm", .fn.unary = mg_log},
  .kernel = {[MG_FLOAT32] = log_f32, [MG_FLOAT64] = log_f64},
  .saves = MG_SAVE_IN(0), .backward = log_backward,
};
mg_tensor *mg_log (mg_tensor *x) { return mg_unary_op(&log_op, x); }

/* sqrt: out = sqrt(x).  grad: dx = dout * 0.5 / out */
FLOAT_KERNELS(sqrt, SQRT(x))
static mg_status sqrt_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *half = mg_tmp(&sc, mg_scalar(0.5, dout[0]->dtype));
  din[0] = mg_div(mg_tmp(&sc, mg_mul(dout[0], half)), n->out[0]);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(SQRT, sqrt) = {
  .forward = mg_unary_forward,
  .info = {.name = "sqrt", .kind = MG_OP_UNARY, .doc = "the square root", .fn.unary = mg_sqrt},
  .kernel = {[MG_FLOAT32] = sqrt_f32, [MG_FLOAT64] = sqrt_f64},
  .saves = MG_SAVE_OUT(0), .backward = sqrt_backward,
};
mg_tensor *mg_sqrt (mg_tensor *x) { return mg_unary_op(&sqrt_op, x); }

/* abs: out = |x|.  grad: dx = dout * sign(x) (0 at 0) */
FLOAT_KERNELS(abs, FABS(x))
KERNEL(abs_i64, int64_t, int64_t, x < 0 ? 0u - (uint64_t)x : (uint64_t)x)
static mg_status abs_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  din[0] = mg_mul(dout[0], mg_tmp(&sc, mg_sign(n->in[0])));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(ABS, abs) = {
  .forward = mg_unary_forward,
  .info = {.name = "abs", .kind = MG_OP_UNARY, .doc = "|x|", .fn.unary = mg_abs},
  .kernel = {[MG_FLOAT32] = abs_f32, [MG_FLOAT64] = abs_f64, [MG_INT64] = abs_i64},
  .saves = MG_SAVE_IN(0), .backward = abs_backward,
};
mg_tensor *mg_abs (mg_tensor *x) { return mg_unary_op(&abs_op, x); }

/* sign: -1, 0 or 1 (NaN stays NaN).  Not differentiable */
FLOAT_KERNELS(sign, (x > 0) - (x < 0) + (x != x ? x : 0))
KERNEL(sign_i64, int64_t, int64_t, (x > 0) - (x < 0))
MG_ROW(SIGN, sign) = {
  .forward = mg_unary_forward,
  .info = {.name = "sign", .kind = MG_OP_UNARY, .doc = "-1, 0 or 1 (not differentiable)",
           .fn.unary = mg_sign},
  .kernel = {[MG_FLOAT32] = sign_f32, [MG_FLOAT64] = sign_f64, [MG_INT64] = sign_i64},
};
mg_tensor *mg_sign (mg_tensor *x) { return mg_unary_op(&sign_op, x); }

/* tanh: out = tanh(x).  grad: dx = tanh_grad(dout, out) = dout * (1 - out^2), one
** pass; keeps the output only */
FLOAT_KERNELS(tanh, TANH(x))
static mg_status tanh_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_activation_backward(n, MG_ACT_TANH, dout[0], n->out[0]);
  return MG_OK;
}
MG_ROW(TANH, tanh) = {
  .forward = mg_unary_forward,
  .info = {.name = "tanh", .kind = MG_OP_UNARY, .doc = "the hyperbolic tangent", .fn.unary = mg_tanh},
  .kernel = {[MG_FLOAT32] = tanh_f32, [MG_FLOAT64] = tanh_f64},
  .saves = MG_SAVE_OUT(0), .backward = tanh_backward, .reuses_gradient = true,
};
mg_tensor *mg_tanh (mg_tensor *x) { return mg_unary_op(&tanh_op, x); }

/* sigmoid: out = 1 / (1 + e^-x).  grad: dx = sigmoid_grad(dout, out), one pass */
FLOAT_KERNELS(sigmoid, 1 / (1 + EXP(-x)))
static mg_status sigmoid_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_activation_backward(n, MG_ACT_SIGMOID, dout[0], n->out[0]);
  return MG_OK;
}
MG_ROW(SIGMOID, sigmoid) = {
  .forward = mg_unary_forward,
  .info = {.name = "sigmoid", .kind = MG_OP_UNARY, .doc = "1 / (1 + e^-x)", .fn.unary = mg_sigmoid},
  .kernel = {[MG_FLOAT32] = sigmoid_f32, [MG_FLOAT64] = sigmoid_f64},
  .saves = MG_SAVE_OUT(0), .backward = sigmoid_backward, .reuses_gradient = true,
};
mg_tensor *mg_sigmoid (mg_tensor *x) { return mg_unary_op(&sigmoid_op, x); }

/* relu: out = max(x, 0), NaN kept.  grad: dx = relu_grad(dout, out), one pass */
FLOAT_KERNELS(relu, (x > 0 || x != x) ? x : 0)
KERNEL(relu_i64, int64_t, int64_t, x > 0 ? x : 0)
static mg_status relu_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_activation_backward(n, MG_ACT_RELU, dout[0], n->out[0]);
  return MG_OK;
}
MG_ROW(RELU, relu) = {
  .forward = mg_unary_forward,
  .info = {.name = "relu", .kind = MG_OP_UNARY, .doc = "max(x, 0)", .fn.unary = mg_relu},
  .kernel = {[MG_FLOAT32] = relu_f32, [MG_FLOAT64] = relu_f64, [MG_INT64] = relu_i64},
  .saves = MG_SAVE_OUT(0), .backward = relu_backward, .reuses_gradient = true,
};
mg_tensor *mg_relu (mg_tensor *x) { return mg_unary_op(&relu_op, x); }

static const char *const act_names[MG_ACT__COUNT] = {
  [MG_ACT_LINEAR] = "linear", [MG_ACT_RELU] = "relu", [MG_ACT_TANH] = "tanh", [MG_ACT_SIGMOID] = "sigmoid"};

mg_status mg_activation_parse (const char *fn, const char *name, mg_activation *act) {
  for (int i = 0; i < MG_ACT__COUNT; i++)
    if (strcmp(name ? name : "linear", act_names[i]) == 0) {
      *act = (mg_activation)i;
      return MG_OK;
    }
  *act = MG_ACT_LINEAR;
  return mg_seterror("%s: unknown activation '%s' (linear, relu, tanh or sigmoid)", fn, name);
}

const char *mg_activation_name (mg_activation act) { return act_names[act]; }

mg_kernel mg_activation_kernel (mg_activation act, mg_dtype dt) {
  static const mg_opdef *const defs[MG_ACT__COUNT] = {
    [MG_ACT_LINEAR] = NULL, [MG_ACT_RELU] = &relu_op, [MG_ACT_TANH] = &tanh_op, [MG_ACT_SIGMOID] = &sigmoid_op};
  return defs[act] ? defs[act]->kernel[dt] : NULL;
}

/* softplus: out = log(1 + e^x), as max(x, 0) + log1p(e^-|x|) so that it
** neither overflows nor loses the small values.  grad: dx = dout * sigmoid(x) */
FLOAT_KERNELS(softplus, (x > 0 ? x : 0) + LOG1P(EXP(-FABS(x))))
static mg_status softplus_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  din[0] = mg_mul(dout[0], mg_tmp(&sc, mg_sigmoid(n->in[0])));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(SOFTPLUS, softplus) = {
  .forward = mg_unary_forward,
  .info = {.name = "softplus", .kind = MG_OP_UNARY, .doc = "log(1 + e^x), computed stably",
           .fn.unary = mg_softplus},
  .kernel = {[MG_FLOAT32] = softplus_f32, [MG_FLOAT64] = softplus_f64},
  .saves = MG_SAVE_IN(0), .backward = softplus_backward,
};
mg_tensor *mg_softplus (mg_tensor *x) { return mg_unary_op(&softplus_op, x); }

/* silu (swish): out = x * sigmoid(x).  grad: dx = dout * s * (1 + x * (1 - s)),
** s = sigmoid(x) */
FLOAT_KERNELS(silu, x / (1 + EXP(-x)))
static mg_status silu_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0];
  mg_tensor *s = mg_tmp(&sc, mg_sigmoid(x)), *one = mg_tmp(&sc, mg_scalar(1.0, x->dtype));
  mg_tensor *slope = mg_tmp(&sc, mg_mul(s, mg_tmp(&sc, mg_add(one, mg_tmp(&sc, mg_mul(x,
                        mg_tmp(&sc, mg_sub(one, s))))))));
  din[0] = mg_mul(dout[0], slope);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(SILU, silu) = {
  .forward = mg_unary_forward,
  .info = {.name = "silu", .kind = MG_OP_UNARY, .doc = "x * sigmoid(x), the sigmoid linear unit (swish)",
           .fn.unary = mg_silu},
  .kernel = {[MG_FLOAT32] = silu_f32, [MG_FLOAT64] = silu_f64},
  .saves = MG_SAVE_IN(0), .backward = silu_backward,
};
mg_tensor *mg_silu (mg_tensor *x) { return mg_unary_op(&silu_op, x); }

/* elu: out = x > 0 ? x : alpha * (e^x - 1).  grad: dx = dout where x > 0,
** else dout * (out + alpha).
** leaky_relu: out = x > 0 ? x : alpha * x.  grad: dx = dout where x > 0,
** else dout * alpha. NaN stays NaN in both. alpha is the row's attribute. */
#define PARAM_ACT(T, ELU) do {                                                 \
    const T *X_ = (const T *)mg_ptr(xc); T *Y_ = (T *)mg_ptr(out);             \
    T a_ = (T)alpha;                                                           \
    MG_PARALLEL_FOR(n >= MG_PARALLEL_MIN, ,                                    \
    for (int64_t i = 0; i < n; i++) {                                          \
      T v = X_[i];                                                             \
      Y_[i] = (v > 0 || v != v) ? v : (ELU) ? a_ * EXPM1(v) : a_ * v;          \
    });                                                                        \
  } while (0)
#define EXPM1(x)  _Generic((x), float: expm1f, default: expm1)(x)

static mg_status param_act_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  double alpha = c->attr->f;
  bool elu = c->attr->a[0];
  int64_t n = x->numel;
  mg_tensor *xc = mg_contiguous(x), *out = xc ? mg_empty(x->shape, x->ndim, x->dtype) : NULL;
  if (out == NULL) {
    mg_tensor_release(xc);
    return MG_ERR;
  }
  if (x->dtype == MG_FLOAT32) PARAM_ACT(float, elu);
  else PARAM_ACT(double, elu);
  mg_tensor_release(xc);
  c->out[0] = out;
  return MG_OK;
}

static mg_status param_act_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0];
  mg_tensor *zero = mg_tmp(&sc, mg_scalar(0.0, x->dtype)), *one = mg_tmp(&sc, mg_scalar(1.0, x->dtype));
  mg_tensor *alpha = mg_tmp(&sc, mg_scalar(n->attr->f, x->dtype));
  mg_tensor *below = n->attr->a[0] ? mg_tmp(&sc, mg_add(n->out[0], alpha)) : alpha;
  mg_tensor *slope = mg_tmp(&sc, mg_where(mg_tmp(&sc, mg_greater(x, zero)), one, below));
  din[0] = mg_mul(dout[0], slope);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(ELU, elu) = {
  .forward = param_act_forward,
  .info = {.name = "elu", .kind = MG_OP_OTHER, .doc = "x where x > 0, else alpha * (e^x - 1) (alpha 1 by default)"},
  .saves = MG_SAVE_IN(0) | MG_SAVE_OUT(0), .backward = param_act_backward,
};
MG_ROW(LEAKY_RELU, leaky_relu) = {
  .forward = param_act_forward,
  .info = {.name = "leaky_relu", .kind = MG_OP_OTHER, .doc = "x where x > 0, else alpha * x (alpha 0.01 by default)"},
  .saves = MG_SAVE_IN(0), .backward = param_act_backward,
};

static mg_tensor *param_act (const mg_opdef *def, mg_tensor *x, double alpha) {
  const char *fn = def->info.name;
  if (x == NULL) return mg_null_arg(def == &elu_op ? "mg_elu" : "mg_leaky_relu", "x"), NULL;
  if (mg_is_half(x->dtype)) {
    mg_tensor *x32 = mg_half_to_float32(x), *r = x32 ? param_act(def, x32, alpha) : NULL;
    mg_tensor_release(x32);
    return r;
  }
  if (!mg_is_float(x->dtype) || mg_check_computable(fn, x->dtype) != MG_OK)
    return mg_seterror("%s: needs a float tensor, got %s", fn, mg_dtype_name(x->dtype)), NULL;
  if (!isfinite(alpha)) return mg_seterror("%s: alpha must be a finite number, got %g", fn, alpha), NULL;
  mg_attr attr = {0};
  attr.f = alpha;
  attr.a[0] = def == &elu_op;
  mg_opcall c = MG_OPCALL(def, 1, &x, &attr, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}
mg_tensor *mg_elu (mg_tensor *x, double alpha) { return param_act(&elu_op, x, alpha); }
mg_tensor *mg_leaky_relu (mg_tensor *x, double alpha) { return param_act(&leaky_relu_op, x, alpha); }

/* logical_not: not x, on bool tensors.  Not differentiable */
KERNEL(logical_not_b, uint8_t, uint8_t, !x)
MG_ROW(LOGICAL_NOT, logical_not) = {
  .forward = mg_unary_forward,
  .info = {.name = "logical_not", .kind = MG_OP_UNARY, .symbol = "not",
           .doc = "not x, elementwise on a bool tensor", .fn.unary = mg_logical_not},
  .kernel = {[MG_BOOL] = logical_not_b},
};
mg_tensor *mg_logical_not (mg_tensor *x) { return mg_unary_op(&logical_not_op, x); }

/* isfinite, isnan, isinf: a bool per entry, no gradient (nothing recorded
** is saved). Half entries are tested on their bits (exponent all ones: an
** infinity when the mantissa is 0, else NaN), so nothing is widened, and
** integer and bool tensors are all finite */
#define TEST_KERNELS(OP, EXPR, F16, BF16)                                          \
  KERNEL(OP##_f32, float, uint8_t, EXPR) KERNEL(OP##_f64, double, uint8_t, EXPR)    \
  KERNEL(OP##_f16, uint16_t, uint8_t, F16) KERNEL(OP##_bf16, uint16_t, uint8_t, BF16)
TEST_KERNELS(isfinite, isfinite(x) != 0, (x & 0x7C00) != 0x7C00, (x & 0x7F80) != 0x7F80)
TEST_KERNELS(isnan, isnan(x) != 0, (x & 0x7FFF) > 0x7C00, (x & 0x7FFF) > 0x7F80)
TEST_KERNELS(isinf, isinf(x) != 0, (x & 0x7FFF) == 0x7C00, (x & 0x7FFF) == 0x7F80)

static mg_status test_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  mg_tensor *out = mg_empty(x->shape, x->ndim, MG_BOOL);
  if (out == NULL) return MG_ERR;
  mg_iter it;
  const mg_tensor *ops[2] = {out, x};
  mg_iter_init(&it, x->shape, x->ndim, 2, ops);
  char *base[2] = {mg_ptr(out), mg_ptr(x)};
  size_t sz[2] = {1, mg_dtype_size(x->dtype)};
  kernel_ud ud = {c->def->kernel[x->dtype]};
  mg_iter_run(&it, base, sz, run_kernel, &ud);
  c->out[0] = out;
  return MG_OK;
}

/* integer and bool x: all `finite` (true for isfinite, false for the others) */
static mg_tensor *test_op (const mg_opdef *op, mg_tensor *x, const char *cfn, bool finite) {
  if (x == NULL) return mg_null_arg(cfn, "x"), NULL;
  if (op->kernel[x->dtype] == NULL) return mg_full(x->shape, x->ndim, MG_BOOL, finite);
  mg_opcall c = MG_OPCALL(op, 1, &x, NULL, x->shape, x->ndim, MG_BOOL);
  return mg_dispatch(&c);
}

#define TEST_ROW(E, OP, FINITE, DOC)                                               \
  MG_ROW(E, OP) = {                                                                \
    .forward = test_forward,                                                       \
    .info = {.name = #OP, .kind = MG_OP_UNARY, .doc = DOC, .fn.unary = mg_##OP},   \
    .kernel = {[MG_FLOAT32] = OP##_f32, [MG_FLOAT64] = OP##_f64, [MG_FLOAT16] = OP##_f16,  \
               [MG_BFLOAT16] = OP##_bf16},                                         \
  };                                                                               \
  mg_tensor *mg_##OP (mg_tensor *x) { return test_op(&OP##_op, x, "mg_" #OP, FINITE); }
TEST_ROW(ISFINITE, isfinite, true, "which entries are neither infinite nor NaN (bool)")
TEST_ROW(ISNAN, isnan, false, "which entries are NaN (bool)")
TEST_ROW(ISINF, isinf, false, "which entries are +-infinity (bool)")

/* }========================================================== */


MG_FAMILY(mg_unary_ops, UNARY_OPS, UNARY__COUNT);

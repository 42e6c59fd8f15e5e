/*
** binary.c — broadcasting binary ops (arithmetic, comparisons, logic) and
** where.
**
** Each op is one block: its kernels, its backward rule, its registry row
** and its entry point. A kernel handles one innermost run of one dtype
** (see iter.c), with the contiguous and broadcast cases split out so the
** compiler vectorises them; binary() does the checks and the broadcast for
** every op alike, binary_forward runs the kernel, and the dispatcher records.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/op.h"
#include "vecmath.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define BINARY_OPS(X) \
  X(ADD, add) X(SUB, sub) X(MUL, mul) X(DIV, div) X(POW, pow) X(FLOORDIV, floordiv) X(MOD, mod) \
  X(MAXIMUM, maximum) X(MINIMUM, minimum) X(RELU_GRAD, relu_grad) X(TANH_GRAD, tanh_grad) \
  X(SIGMOID_GRAD, sigmoid_grad) X(EQUAL, equal) X(NOT_EQUAL, not_equal) X(LESS, less) \
  X(LESS_EQUAL, less_equal) X(GREATER, greater) X(GREATER_EQUAL, greater_equal) \
  X(LOGICAL_AND, logical_and) X(LOGICAL_OR, logical_or) X(WHERE, where)
enum { BINARY_OPS(MG_ROW_ENUM) BINARY__COUNT };

/* {=================== kernels and checks =================== */

/* one innermost run of out[i] = EXPR(x = a[i], y = b[i]), strides 0 or 1
** split out so the common cases vectorise */
#define LOOP2(TI, TO, EXPR) do {                                             \
    const TI *A_ = (const TI *)p[1], *B_ = (const TI *)p[2];                \
    TO *O_ = (TO *)p[0];                                                     \
    int64_t sa_ = s[1], sb_ = s[2];                                          \
    if (sa_ == 1 && sb_ == 1)                                                \
      for (int64_t i = 0; i < n; i++) { TI x = A_[i], y = B_[i]; O_[i] = (TO)(EXPR); } \
    else if (sa_ == 0 && sb_ == 1) {                                         \
      TI x = A_[0];                                                          \
      for (int64_t i = 0; i < n; i++) { TI y = B_[i]; O_[i] = (TO)(EXPR); } \
    } else if (sa_ == 1 && sb_ == 0) {                                       \
      TI y = B_[0];                                                          \
      for (int64_t i = 0; i < n; i++) { TI x = A_[i]; O_[i] = (TO)(EXPR); } \
    } else                                                                   \
      for (int64_t i = 0; i < n; i++) {                                      \
        TI x = A_[i * sa_], y = B_[i * sb_]; O_[i] = (TO)(EXPR);             \
      }                                                                      \
  } while (0)

#define KERNEL(NAME, TI, TO, EXPR) \
  static void NAME (int64_t n, char **p, const int64_t *s) { LOOP2(TI, TO, EXPR); }

/* float32 and float64 kernels of one expression (libm through _Generic) */
#define FLOAT_KERNELS(OP, EXPR) \
  KERNEL(OP##_f32, float, float, EXPR) KERNEL(OP##_f64, double, double, EXPR)
/* comparisons: any dtype in, bool out */
#define COMPARE_KERNELS(OP, EXPR) \
  KERNEL(OP##_f32, float, uint8_t, EXPR) KERNEL(OP##_f64, double, uint8_t, EXPR) \
  KERNEL(OP##_i64, int64_t, uint8_t, EXPR) KERNEL(OP##_b, uint8_t, uint8_t, EXPR)

#define POW(x, y)   _Generic((x), float: powf, default: pow)(x, y)
#define FLOOR(x)    _Generic((x), float: floorf, default: floor)(x)
#define FMOD(x, y)  _Generic((x), float: fmodf, default: fmod)(x, y)

/* floor-mod as Lua's %: the result has the divisor's sign */
#define MOD_FLOOR(x, y) \
  ((FMOD(x, y) != 0 && ((FMOD(x, y) < 0) != (y < 0))) ? FMOD(x, y) + y : FMOD(x, y))

/* integer floor division and modulo as Lua does them (b != 0 checked before) */
static inline int64_t idiv_floor (int64_t a, int64_t b) {
  if (b == -1) return (int64_t)(0u - (uint64_t)a);
  int64_t q = a / b;
  return ((a % b != 0) && ((a ^ b) < 0)) ? q - 1 : q;
}
static inline int64_t imod_floor (int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t m = a % b;
  return (m != 0 && (m ^ b) < 0) ? m + b : m;
}
static inline int64_t ipow (int64_t a, int64_t e) {   /* e >= 0, checked before */
  uint64_t r = 1, base = (uint64_t)a;
  while (e > 0) {
    if (e & 1) r *= base;
    base *= base;
    e >>= 1;
  }
  return (int64_t)r;
}

static bool any_int (const mg_tensor *t, bool (*bad)(int64_t)) {
  mg_tensor *c = mg_contiguous((mg_tensor *)t);
  bool found = false;
  if (c == NULL) return false;
  const int64_t *v = (const int64_t *)mg_ptr(c);
  for (int64_t i = 0; i < c->numel && !found; i++) found = bad(v[i]);
  mg_tensor_release(c);
  return found;
}
static bool is_zero (int64_t v) { return v == 0; }
static bool is_negative (int64_t v) { return v < 0; }

/* integer // and %: a zero divisor would trap */
static mg_status check_int_divisor (const mg_opdef *op, const mg_tensor *a, const mg_tensor *b) {
  if (a->dtype == MG_INT64 && any_int(b, is_zero))
    return mg_seterror("%s: integer division by zero", op->info.name);
  return MG_OK;
}

static mg_status check_int_power (const mg_opdef *op, const mg_tensor *a, const mg_tensor *b) {
  MG_UNUSED(op);
  if (a->dtype == MG_INT64 && any_int(b, is_negative))
    return mg_seterror("pow: integers to negative integer powers are not allowed; cast to float first");
  return MG_OK;
}

/* }========================================================== */


/* {===================== the common path ==================== */

typedef struct { mg_kernel k; } kernel_ud;

static void run_kernel (int64_t n, char **p, const int64_t *s, void *ud) {
  ((const kernel_ud *)ud)->k(n, p, s);
}

static mg_tensor *null_operand (const mg_opdef *op, const char *arg) {
  char fn[32];
  snprintf(fn, sizeof fn, "mg_%s", op->info.name);
  mg_null_arg(fn, arg);
  return NULL;
}

static mg_dtype result_dtype (const mg_opdef *op, mg_dtype dt) {
  switch (op->result) {
    case MG_RESULT_BOOL: return MG_BOOL;
    case MG_RESULT_FLOAT: return dt == MG_INT64 ? MG_FLOAT64 : dt;
    default: return dt;
  }
}

/* float32 a + bfloat16 b (a residual stream and a product's output under
** autocast, mg_add): b widened as it is read, exactly, so the sums are
** those of casting b first, with no float32 copy of it */
static void add_f32_bf16 (int64_t n, char **p, const int64_t *s) {
  const float *A = (const float *)p[1];
  const uint16_t *B = (const uint16_t *)p[2];
  float *O = (float *)p[0];
  if (s[1] == 1 && s[2] == 1)
    for (int64_t i = 0; i < n; i++) O[i] = A[i] + mg_bf16_value(B[i]);
  else
    for (int64_t i = 0; i < n; i++) O[i] = A[i * s[1]] + mg_bf16_value(B[i * s[2]]);
}

/* the kernel of every two-input elementwise op */
static mg_status binary_forward (mg_opcall *c) {
  mg_tensor *a = c->in[0], *b = c->in[1];
  mg_kernel k = a->dtype == b->dtype ? c->def->kernel[a->dtype] : c->def->mixed;   /* (the entry checked the pair) */
  mg_assert(k != NULL);
  mg_tensor *out = mg_empty(c->shape, c->ndim, c->dtype);
  if (out == NULL) return MG_ERR;
  char *base[3] = {mg_ptr(out), mg_ptr(a), mg_ptr(b)};
  int64_t n = out->numel;
  bool ca = mg_tensor_is_contiguous(a), cb = mg_tensor_is_contiguous(b);
  if (n < MG_PARALLEL_MIN && ca && cb && (a->numel == n || a->numel == 1) && (b->numel == n || b->numel == 1)) {
    int64_t st[3] = {1, a->numel == n, b->numel == n};    /* one run: no iterator to set up */
    k(n, base, st);
  } else {
    mg_iter it;
    const mg_tensor *ops[3] = {out, a, b};
    mg_iter_init(&it, c->shape, c->ndim, 3, ops);
    size_t sz[3] = {mg_dtype_size(out->dtype), mg_dtype_size(a->dtype), mg_dtype_size(b->dtype)};
    kernel_ud ud = {k};
    mg_iter_run(&it, base, sz, run_kernel, &ud);
  }
  c->out[0] = out;
  return MG_OK;
}

/* the entry of every two-input elementwise op */
static mg_tensor *binary (const mg_opdef *op, mg_tensor *a, mg_tensor *b) {
  if (a == NULL) return null_operand(op, "a");
  if (b == NULL) return null_operand(op, "b");
  const char *fn = op->info.name;
  mg_tensor *ab[2] = {a, b};
  if (a->dtype != b->dtype && !mg_half_mixed(ab, 2))       /* (a half and float32 may meet) */
    return mg_seterror("%s: dtypes differ: %s %s %s", fn, mg_dtype_name(a->dtype),
                       op->info.symbol, mg_dtype_name(b->dtype)), NULL;
  /* computed in float32 (autocast.c) */
  HALF_PAIR_AS_FLOAT32(a, b, mg_is_half(a->dtype) || mg_is_half(b->dtype), binary(op, a, b));
  if (op->kernel[a->dtype] == NULL) return mg_refuse_dtype(op->info.name, a->dtype, !op->kernel[MG_FLOAT32]), NULL;
  if (op->check && op->check(op, a, b) != MG_OK) return NULL;
  int64_t shape[MG_MAX_DIMS];
  int nd = mg_broadcast_shapes(fn, op->info.symbol, a->shape, a->ndim, b->shape, b->ndim, shape);
  if (nd < 0) return NULL;
  mg_tensor *in[2] = {a, b};
  mg_opcall c = MG_OPCALL(op, 2, in, NULL, shape, nd, result_dtype(op, a->dtype));
  return mg_dispatch(&c);
}

/* }========================================================== */


/* {================ arithmetic and its gradients ============= */
/* Every rule sums its result back to the input's shape (broadcasting's
** adjoint) with mg_sum_to_shape; SHAPE_OF(n, j) names input j's shape. */

static mg_tensor *zero_like_dtype (const mg_tensor *t) {
  return t ? mg_scalar(0.0, t->dtype) : NULL;
}

/* add: out = a + b.  grad: da = dout, db = dout */
FLOAT_KERNELS(add, x + y)
KERNEL(add_i64, int64_t, int64_t, (uint64_t)x + (uint64_t)y)    /* wraps, as Lua's */
static mg_status add_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  for (int j = 0; j < 2; j++)
    if (n->needs[j]) din[j] = mg_sum_to_shape(dout[0], SHAPE_OF(n, j));
  return MG_OK;
}
MG_ROW(ADD, add) = {
  .forward = binary_forward,
  .info = {.name = "add", .kind = MG_OP_BINARY, .symbol = "+", .metamethod = "__add",
           .verb = "add", .doc = "a + b, elementwise with broadcasting", .fn.binary = mg_add},
  .kernel = {[MG_FLOAT32] = add_f32, [MG_FLOAT64] = add_f64, [MG_INT64] = add_i64}, .mixed = add_f32_bf16,
  .backward = add_backward,
};
mg_tensor *mg_add (mg_tensor *a, mg_tensor *b) {
  if (a && b && a->dtype != b->dtype && (a->dtype == MG_BFLOAT16 || b->dtype == MG_BFLOAT16) &&
      (a->dtype == MG_FLOAT32 || b->dtype == MG_FLOAT32)) {      /* float32 + bfloat16: add_f32_bf16 */
    mg_tensor *in[2] = {a->dtype == MG_FLOAT32 ? a : b, a->dtype == MG_FLOAT32 ? b : a};  /* + commutes, to the bit */
    int64_t shape[MG_MAX_DIMS];
    int nd = mg_broadcast_shapes("add", "+", a->shape, a->ndim, b->shape, b->ndim, shape);
    if (nd < 0) return NULL;
    mg_opcall c = MG_OPCALL(&add_op, 2, in, NULL, shape, nd, MG_FLOAT32);
    return mg_dispatch(&c);
  }
  return binary(&add_op, a, b);
}

/* a kernel over contiguous arrays: out[i] = k(a[i], b[i * bs]), elements of
** esz bytes (out may be a; bs 0 repeats one b) */
typedef struct run_args {
  mg_kernel k;
  char *out;
  const char *a, *b;
  int64_t bs, esz;
} run_args;

static void run_block (const void *ctx, int64_t lo, int64_t hi) {
  const run_args *r = (const run_args *)ctx;
  char *base[3] = {r->out + lo * r->esz, (char *)r->a + lo * r->esz, (char *)r->b + lo * r->bs * r->esz};
  int64_t st[3] = {1, 1, r->bs};
  r->k(hi - lo, base, st);
}

/* d = op(d, b) over d's own buffer, when d is contiguous and b is too, of
** d's float dtype and shape, or one element broadcast to it (else false,
** changing nothing) */
static bool binary_into (const mg_opdef *op, mg_tensor *d, const mg_tensor *b) {
  if (d->dtype != b->dtype || !mg_is_float(d->dtype) || !mg_tensor_is_contiguous(d) || !mg_tensor_is_contiguous(b))
    return false;
  bool scalar = b->numel == 1 && b->ndim <= d->ndim;
  if (!scalar && !mg_same_shape(d->shape, d->ndim, b->shape, b->ndim)) return false;
  run_args r = {op->kernel[d->dtype], mg_ptr(d), mg_ptr(d), mg_ptr(b), !scalar, (int64_t)mg_dtype_size(d->dtype)};
  if (!mg_dry_running()) mg_for_blocks(d->numel, run_block, &r);   /* a dry run computes nothing */
  return true;
}

bool mg_add_into (mg_tensor *acc, const mg_tensor *g) { return binary_into(&add_op, acc, g); }

/* sub: out = a - b.  grad: da = dout, db = -dout */
FLOAT_KERNELS(sub, x - y)
KERNEL(sub_i64, int64_t, int64_t, (uint64_t)x - (uint64_t)y)
static mg_status sub_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  if (n->needs[0]) din[0] = mg_sum_to_shape(dout[0], SHAPE_OF(n, 0));
  if (n->needs[1]) din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_neg(dout[0])), SHAPE_OF(n, 1));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(SUB, sub) = {
  .forward = binary_forward,
  .info = {.name = "sub", .kind = MG_OP_BINARY, .symbol = "-", .metamethod = "__sub",
           .verb = "subtract", .doc = "a - b", .fn.binary = mg_sub},
  .kernel = {[MG_FLOAT32] = sub_f32, [MG_FLOAT64] = sub_f64, [MG_INT64] = sub_i64},
  .backward = sub_backward,
};
mg_tensor *mg_sub (mg_tensor *a, mg_tensor *b) { return binary(&sub_op, a, b); }

/* mul: out = a * b.  grad: da = dout * b, db = dout * a */
FLOAT_KERNELS(mul, x * y)
KERNEL(mul_i64, int64_t, int64_t, (uint64_t)x * (uint64_t)y)
static const mg_opdef mul_op;
static mg_status mul_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  if (n->needs[1]) din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(dout[0], n->in[0])), SHAPE_OF(n, 1));
  if (n->needs[0]) {          /* last: over dout itself when the walk spares it */
    if ((n->spare & 1) && mg_same_shape(SHAPE_OF(n, 0), dout[0]->shape, dout[0]->ndim) &&
        binary_into(&mul_op, dout[0], n->in[1]))
      din[0] = mg_tensor_retain(dout[0]);
    else din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(dout[0], n->in[1])), SHAPE_OF(n, 0));
  }
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(MUL, mul) = {
  .forward = binary_forward,
  .info = {.name = "mul", .kind = MG_OP_BINARY, .symbol = "*", .metamethod = "__mul",
           .verb = "multiply", .doc = "a * b, elementwise (the matrix product is matmul)",
           .fn.binary = mg_mul},
  .kernel = {[MG_FLOAT32] = mul_f32, [MG_FLOAT64] = mul_f64, [MG_INT64] = mul_i64},
  .grad_saves = {MG_SAVE_IN(1), MG_SAVE_IN(0)}, .backward = mul_backward, .reuses_gradient = true,
};
mg_tensor *mg_mul (mg_tensor *a, mg_tensor *b) { return binary(&mul_op, a, b); }

/* div: out = a / b (int64 / int64 gives float64).  grad: da = dout / b,
** db = -dout * out / b */
FLOAT_KERNELS(div, x / y)
KERNEL(div_i64, int64_t, double, (double)x / (double)y)
static mg_status div_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *g = mg_tmp(&sc, mg_div(dout[0], n->in[1]));    /* dout / b: b is saved for either */
  if (n->needs[0]) din[0] = mg_sum_to_shape(g, SHAPE_OF(n, 0));
  if (n->needs[1])
    din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_neg(mg_tmp(&sc, mg_mul(g, n->out[0])))), SHAPE_OF(n, 1));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(DIV, div) = {
  .forward = binary_forward,
  .info = {.name = "div", .kind = MG_OP_BINARY, .symbol = "/", .metamethod = "__div",
           .verb = "divide", .doc = "a / b (int64 / int64 gives float64)", .fn.binary = mg_div},
  .kernel = {[MG_FLOAT32] = div_f32, [MG_FLOAT64] = div_f64, [MG_INT64] = div_i64},
  .result = MG_RESULT_FLOAT,
  .grad_saves = {MG_SAVE_IN(1), MG_SAVE_IN(1) | MG_SAVE_OUT(0)}, .backward = div_backward,
};
mg_tensor *mg_div (mg_tensor *a, mg_tensor *b) { return binary(&div_op, a, b); }

/* pow: out = a ^ b.  grad: da = dout * b * a^(b-1), 0 where b = 0 (as
** PyTorch: no 0 * 0^-1 = NaN at a = 0); db = dout * out * log(a) where
** a > 0, else 0 (as TensorFlow) */
/* (libm's pow: VM_MAP2, every element through the same code whatever its
** place. A number exponent of 2, the square in losses and norms, is x * x
** as PyTorch's (exact, where libm may be an ulp off, and ten times faster);
** of 1, x itself) */
#define POW_KERNEL(NAME, T)                                                       \
  static void NAME (int64_t n, char **p, const int64_t *s) {                      \
    T e = n > 0 && s[2] == 0 ? *(const T *)p[2] : 0;                              \
    if (e == 2 || e == 1) {                                                       \
      const T *a = (const T *)p[1];                                               \
      T *o = (T *)p[0];                                                           \
      int64_t sa = s[1];                                                          \
      if (e == 2) for (int64_t i = 0; i < n; i++) o[i] = a[i * sa] * a[i * sa];   \
      else for (int64_t i = 0; i < n; i++) o[i] = a[i * sa];                      \
    } else                                                                        \
      VM_MAP2(T, T, POW(x, y));                                                   \
  }
POW_KERNEL(pow_f32, float)
POW_KERNEL(pow_f64, double)
KERNEL(pow_i64, int64_t, int64_t, ipow(x, y))

/* d = d * (2 * a) over contiguous d and a of one float dtype and shape: the
** gradient of a ^ 2 to a in one pass over dout's own buffer, the roundings
** of pow_backward's ops (a ^ 1 is a, 2 * a exact) */
typedef struct square_grad_args { char *d; const char *a; mg_dtype dt; } square_grad_args;
static void square_grad_block (const void *ctx, int64_t lo, int64_t hi) {
  const square_grad_args *r = (const square_grad_args *)ctx;
  if (r->dt == MG_FLOAT32) {
    float *d = (float *)r->d;
    const float *a = (const float *)r->a;
    for (int64_t i = lo; i < hi; i++) d[i] = d[i] * (2 * a[i]);
  } else {
    double *d = (double *)r->d;
    const double *a = (const double *)r->a;
    for (int64_t i = lo; i < hi; i++) d[i] = d[i] * (2 * a[i]);
  }
}
static bool square_grad_into (mg_tensor *d, const mg_tensor *a) {
  if ((d->dtype != MG_FLOAT32 && d->dtype != MG_FLOAT64) || a->dtype != d->dtype ||
      !mg_same_shape(d->shape, d->ndim, a->shape, a->ndim) || !mg_tensor_is_contiguous(d) ||
      !mg_tensor_is_contiguous(a))
    return false;
  square_grad_args r = {mg_ptr(d), mg_ptr(a), d->dtype};
  if (!mg_dry_running()) mg_for_blocks(d->numel, square_grad_block, &r);   /* a dry run computes nothing */
  return true;
}

/* is b the one number 2 (a dry run's computed b has no value: no) */
static bool is_two (const mg_tensor *b) {
  return b->numel == 1 && mg_is_float(b->dtype) && !b->storage->unwritten && mg_load_double(mg_ptr(b), b->dtype) == 2;
}

static mg_status pow_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *a = n->in[0], *b = n->in[1];
  /* a ^ 2 (a square in a loss or a norm): dout * (2 * a) over dout's own
  ** buffer when the walk spares it, else two ops, not pow's five. Only
  ** where the walk allows shortcuts: while a tape records the backward,
  ** pow's ops keep a third derivative connected to a (0, not none, as
  ** TensorFlow's), and a recompute's first run takes the path its re-run
  ** (recorded) takes */
  if (n->needs[0] && !n->needs[1] && n->shortcuts && is_two(b)) {
    if ((n->spare & 1) && square_grad_into(dout[0], a)) {
      din[0] = mg_tensor_retain(dout[0]);
      return MG_OK;
    }
    mg_tensor *twice = mg_tmp(&sc, mg_mul(a, mg_tmp(&sc, mg_scalar(2.0, a->dtype))));
    din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(dout[0], twice)), SHAPE_OF(n, 0));
    mg_scope_end(&sc);
    return MG_OK;
  }
  mg_tensor *one = mg_tmp(&sc, mg_scalar(1.0, a->dtype)), *zero = mg_tmp(&sc, zero_like_dtype(a));
  if (n->needs[0]) {
    mg_tensor *p = mg_tmp(&sc, mg_pow(a, mg_tmp(&sc, mg_sub(b, one))));
    mg_tensor *d = mg_tmp(&sc, mg_where(mg_tmp(&sc, mg_equal(b, zero)), zero, mg_tmp(&sc, mg_mul(b, p))));
    din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(dout[0], d)), SHAPE_OF(n, 0));
  }
  if (n->needs[1]) {
    mg_tensor *pos = mg_tmp(&sc, mg_greater(a, zero));
    mg_tensor *safe = mg_tmp(&sc, mg_where(pos, a, one));          /* log(1) = 0 elsewhere */
    mg_tensor *lg = mg_tmp(&sc, mg_where(pos, mg_tmp(&sc, mg_log(safe)), zero));
    mg_tensor *g = mg_tmp(&sc, mg_mul(dout[0], mg_tmp(&sc, mg_mul(n->out[0], lg))));
    din[1] = mg_sum_to_shape(g, SHAPE_OF(n, 1));
  }
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(POW, pow) = {
  .forward = binary_forward,
  .info = {.name = "pow", .kind = MG_OP_BINARY, .symbol = "^", .metamethod = "__pow",
           .verb = "exponentiate", .doc = "a ^ b", .fn.binary = mg_pow},
  .kernel = {[MG_FLOAT32] = pow_f32, [MG_FLOAT64] = pow_f64, [MG_INT64] = pow_i64},
  .check = check_int_power,
  .grad_saves = {MG_SAVE_IN(0) | MG_SAVE_IN(1), MG_SAVE_IN(0) | MG_SAVE_OUT(0)}, .backward = pow_backward,
  .reuses_gradient = true,
};
mg_tensor *mg_pow (mg_tensor *a, mg_tensor *b) { return binary(&pow_op, a, b); }

/* floordiv: out = floor(a / b), as Lua's //.  Not differentiable */
FLOAT_KERNELS(floordiv, FLOOR(x / y))
KERNEL(floordiv_i64, int64_t, int64_t, idiv_floor(x, y))
MG_ROW(FLOORDIV, floordiv) = {
  .forward = binary_forward,
  .info = {.name = "floordiv", .kind = MG_OP_BINARY, .symbol = "//", .metamethod = "__idiv",
           .verb = "floor-divide", .doc = "floor(a / b), as Lua's // (not differentiable)",
           .fn.binary = mg_floordiv},
  .kernel = {[MG_FLOAT32] = floordiv_f32, [MG_FLOAT64] = floordiv_f64, [MG_INT64] = floordiv_i64},
  .check = check_int_divisor,
};
mg_tensor *mg_floordiv (mg_tensor *a, mg_tensor *b) { return binary(&floordiv_op, a, b); }

/* mod: out = a - floor(a / b) * b (floor-mod, as Lua's %).
** grad: da = dout, db = -dout * floor(a / b) (TensorFlow's FloorMod rule) */
FLOAT_KERNELS(mod, MOD_FLOOR(x, y))
KERNEL(mod_i64, int64_t, int64_t, imod_floor(x, y))
static mg_status mod_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  if (n->needs[0]) din[0] = mg_sum_to_shape(dout[0], SHAPE_OF(n, 0));
  if (n->needs[1]) {
    mg_tensor *q = mg_tmp(&sc, mg_floordiv(n->in[0], n->in[1]));
    din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_neg(mg_tmp(&sc, mg_mul(dout[0], q)))), SHAPE_OF(n, 1));
  }
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(MOD, mod) = {
  .forward = binary_forward,
  .info = {.name = "mod", .kind = MG_OP_BINARY, .symbol = "%", .metamethod = "__mod",
           .verb = "take the modulo of", .doc = "a % b, the floor-modulo (as Lua's %)",
           .fn.binary = mg_mod},
  .kernel = {[MG_FLOAT32] = mod_f32, [MG_FLOAT64] = mod_f64, [MG_INT64] = mod_i64},
  .check = check_int_divisor,
  .saves = MG_SAVE_IN(0) | MG_SAVE_IN(1), .backward = mod_backward,
};
mg_tensor *mg_mod (mg_tensor *a, mg_tensor *b) { return binary(&mod_op, a, b); }

/* maximum/minimum: the gradient goes to a where a wins (ties go to a),
** else to b, as TensorFlow's _MaximumMinimumGrad; NaN wins */
static mg_status pick_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din,
                                mg_tensor *(*a_wins)(mg_tensor *, mg_tensor *)) {
  mg_scope sc = {0};
  mg_tensor *mask = mg_tmp(&sc, a_wins(n->in[0], n->in[1]));
  mg_tensor *zero = mg_tmp(&sc, zero_like_dtype(dout[0]));
  if (n->needs[0])
    din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_where(mask, dout[0], zero)), SHAPE_OF(n, 0));
  if (n->needs[1])
    din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_where(mask, zero, dout[0])), SHAPE_OF(n, 1));
  mg_scope_end(&sc);
  return MG_OK;
}

FLOAT_KERNELS(maximum, (x >= y || x != x) ? x : y)
KERNEL(maximum_i64, int64_t, int64_t, x >= y ? x : y)
static mg_status maximum_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  return pick_backward(n, dout, din, mg_greater_equal);
}
MG_ROW(MAXIMUM, maximum) = {
  .forward = binary_forward,
  .info = {.name = "maximum", .kind = MG_OP_BINARY, .symbol = ",",
           .doc = "the larger of a and b, elementwise (ties: the gradient goes to a)",
           .fn.binary = mg_maximum},
  .kernel = {[MG_FLOAT32] = maximum_f32, [MG_FLOAT64] = maximum_f64, [MG_INT64] = maximum_i64},
  .saves = MG_SAVE_IN(0) | MG_SAVE_IN(1), .backward = maximum_backward,
};
mg_tensor *mg_maximum (mg_tensor *a, mg_tensor *b) { return binary(&maximum_op, a, b); }

FLOAT_KERNELS(minimum, (x <= y || x != x) ? x : y)
KERNEL(minimum_i64, int64_t, int64_t, x <= y ? x : y)
static mg_status minimum_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  return pick_backward(n, dout, din, mg_less_equal);
}
MG_ROW(MINIMUM, minimum) = {
  .forward = binary_forward,
  .info = {.name = "minimum", .kind = MG_OP_BINARY, .symbol = ",",
           .doc = "the smaller of a and b, elementwise (ties: the gradient goes to a)",
           .fn.binary = mg_minimum},
  .kernel = {[MG_FLOAT32] = minimum_f32, [MG_FLOAT64] = minimum_f64, [MG_INT64] = minimum_i64},
  .saves = MG_SAVE_IN(0) | MG_SAVE_IN(1), .backward = minimum_backward,
};
mg_tensor *mg_minimum (mg_tensor *a, mg_tensor *b) { return binary(&minimum_op, a, b); }

/* relu_grad: out = y > 0 ? d : 0 (relu's backward as a primitive, so that
** it can be differentiated again).  grad: dd = relu_grad(dout, y); dy = 0 */
FLOAT_KERNELS(relu_grad, y > 0 ? x : 0)
static mg_status relu_grad_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  if (n->needs[0]) din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_relu_grad(dout[0], n->in[1])), SHAPE_OF(n, 0));
  if (n->needs[1]) din[1] = mg_zeros_meta(&n->in_meta[1]);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(RELU_GRAD, relu_grad) = {
  .forward = binary_forward,
  .info = {.name = "relu_grad", .kind = MG_OP_BINARY, .symbol = ",",
           .doc = "relu_grad(d, y) = y > 0 ? d : 0, relu's backward", .fn.binary = mg_relu_grad},
  .kernel = {[MG_FLOAT32] = relu_grad_f32, [MG_FLOAT64] = relu_grad_f64},
  .saves = MG_SAVE_IN(1), .backward = relu_grad_backward,
};
mg_tensor *mg_relu_grad (mg_tensor *d, mg_tensor *y) { return binary(&relu_grad_op, d, y); }

/* tanh_grad: out = d * (1 - y^2), tanh's backward from its output in one
** pass (three ops and two temporaries otherwise).
** grad: dd = tanh_grad(dout, y); dy = -2 y d dout */
FLOAT_KERNELS(tanh_grad, x * (1 - y * y))
static mg_status tanh_grad_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *d = n->in[0], *y = n->in[1];
  if (n->needs[0]) din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_tanh_grad(dout[0], y)), SHAPE_OF(n, 0));
  if (n->needs[1]) {
    mg_tensor *minus_two = mg_tmp(&sc, mg_scalar(-2.0, y->dtype));
    mg_tensor *yd = mg_tmp(&sc, mg_mul(y, d));
    din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(mg_tmp(&sc, mg_mul(yd, minus_two)), dout[0])), SHAPE_OF(n, 1));
  }
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(TANH_GRAD, tanh_grad) = {
  .forward = binary_forward,
  .info = {.name = "tanh_grad", .kind = MG_OP_BINARY, .symbol = ",",
           .doc = "tanh_grad(d, y) = d * (1 - y^2), tanh's backward from its output y", .fn.binary = mg_tanh_grad},
  .kernel = {[MG_FLOAT32] = tanh_grad_f32, [MG_FLOAT64] = tanh_grad_f64},
  .saves = MG_SAVE_IN(0) | MG_SAVE_IN(1), .backward = tanh_grad_backward,
};
mg_tensor *mg_tanh_grad (mg_tensor *d, mg_tensor *y) { return binary(&tanh_grad_op, d, y); }

/* sigmoid_grad: out = d * y * (1 - y), sigmoid's backward from its output
** in one pass.  grad: dd = sigmoid_grad(dout, y); dy = d (1 - 2 y) dout */
FLOAT_KERNELS(sigmoid_grad, x * y * (1 - y))
static mg_status sigmoid_grad_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *d = n->in[0], *y = n->in[1];
  if (n->needs[0]) din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_sigmoid_grad(dout[0], y)), SHAPE_OF(n, 0));
  if (n->needs[1]) {
    mg_tensor *one = mg_tmp(&sc, mg_scalar(1.0, y->dtype)), *two = mg_tmp(&sc, mg_scalar(2.0, y->dtype));
    mg_tensor *slope = mg_tmp(&sc, mg_sub(one, mg_tmp(&sc, mg_mul(y, two))));
    din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(mg_tmp(&sc, mg_mul(d, slope)), dout[0])), SHAPE_OF(n, 1));
  }
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(SIGMOID_GRAD, sigmoid_grad) = {
  .forward = binary_forward,
  .info = {.name = "sigmoid_grad", .kind = MG_OP_BINARY, .symbol = ",",
           .doc = "sigmoid_grad(d, y) = d * y * (1 - y), sigmoid's backward from its output y",
           .fn.binary = mg_sigmoid_grad},
  .kernel = {[MG_FLOAT32] = sigmoid_grad_f32, [MG_FLOAT64] = sigmoid_grad_f64},
  .saves = MG_SAVE_IN(0) | MG_SAVE_IN(1), .backward = sigmoid_grad_backward,
};
mg_tensor *mg_sigmoid_grad (mg_tensor *d, mg_tensor *y) { return binary(&sigmoid_grad_op, d, y); }

/* relu's gradient on bfloat16 bits: d where y > 0 (not NaN), else +0; the
** bits relu_grad gives in float32, rounded back (exact) */
typedef struct { const uint16_t *d, *y; uint16_t *out; } relu_mask_ud;
#define RELU_MASK(yv, dv) ((int16_t)(yv) > 0 && (yv) <= 0x7f80 ? (dv) : 0)
static void relu_mask_block (const void *ctx, int64_t lo, int64_t hi) {
  const relu_mask_ud *m = (const relu_mask_ud *)ctx;
  const uint16_t *restrict y = m->y;
  if (m->out == m->d) {                          /* in place: one pointer, so restrict holds */
    uint16_t *restrict d = m->out;
    for (int64_t i = lo; i < hi; i++) d[i] = RELU_MASK(y[i], d[i]);
    return;
  }
  const uint16_t *restrict d = m->d;
  uint16_t *restrict out = m->out;
  for (int64_t i = lo; i < hi; i++) out[i] = RELU_MASK(y[i], d[i]);
}

/* over d itself when the walk spares it (no fresh pages to fault in, one
** tensor fewer in the cache) */
static mg_tensor *relu_mask_bf16 (mg_tensor *d, mg_tensor *y, bool spare) {
  bool in_place = spare && mg_tensor_is_contiguous(d);
  mg_tensor *dc = mg_contiguous(d), *yc = mg_contiguous(y);
  mg_tensor *out = !dc || !yc ? NULL : in_place ? mg_tensor_retain(dc) : mg_empty(d->shape, d->ndim, d->dtype);
  if (out && !mg_dry_running()) {                /* a dry run computes nothing */
    relu_mask_ud m = {(const uint16_t *)mg_ptr(dc), (const uint16_t *)mg_ptr(yc), (uint16_t *)mg_ptr(out)};
    mg_for_blocks(out->numel, relu_mask_block, &m);
  }
  mg_tensor_release(dc);
  mg_tensor_release(yc);
  return out;
}

mg_tensor *mg_activation_backward (const mg_node *n, mg_activation act, mg_tensor *dout, mg_tensor *y) {
  static const mg_opdef *const defs[MG_ACT__COUNT] = {
    [MG_ACT_LINEAR] = NULL, [MG_ACT_RELU] = &relu_grad_op, [MG_ACT_TANH] = &tanh_grad_op,
    [MG_ACT_SIGMOID] = &sigmoid_grad_op};
  if (defs[act] == NULL) return mg_tensor_retain(dout);
  /* autocast's relu (conv2d, dense): a mask on the bfloat16 bits, where no
  ** tape records the backward (relu_grad's op, in float32, where one does) */
  if (act == MG_ACT_RELU && dout->dtype == MG_BFLOAT16 && y->dtype == MG_BFLOAT16 && !mg_op_recorded())
    return relu_mask_bf16(dout, y, n->spare & 1);
  if ((n->spare & 1) && binary_into(defs[act], dout, y)) return mg_tensor_retain(dout);
  return binary(defs[act], dout, y);
}

/* }========================================================== */


/* {=============== comparisons and logic (no gradient) ======== */

#define COMPARE_OP(E, OP, SYM, EXPR, DOC)                                           \
  COMPARE_KERNELS(OP, EXPR)                                                         \
  MG_ROW(E, OP) = {                                                                 \
    .forward = binary_forward,                                                      \
    .info = {.name = #OP, .kind = MG_OP_BINARY, .symbol = SYM, .doc = DOC,          \
             .fn.binary = mg_##OP},                                                 \
    .kernel = {[MG_FLOAT32] = OP##_f32, [MG_FLOAT64] = OP##_f64,                    \
               [MG_INT64] = OP##_i64, [MG_BOOL] = OP##_b},                          \
    .result = MG_RESULT_BOOL,                                                       \
  };                                                                                \
  mg_tensor *mg_##OP (mg_tensor *a, mg_tensor *b) { return binary(&OP##_op, a, b); }

COMPARE_OP(EQUAL, equal, "==", x == y, "a == b, elementwise (bool)")
COMPARE_OP(NOT_EQUAL, not_equal, "~=", x != y, "a ~= b, elementwise (bool)")
COMPARE_OP(LESS, less, "<", x < y, "a < b, elementwise (bool)")
COMPARE_OP(LESS_EQUAL, less_equal, "<=", x <= y, "a <= b, elementwise (bool)")
COMPARE_OP(GREATER, greater, ">", x > y, "a > b, elementwise (bool)")
COMPARE_OP(GREATER_EQUAL, greater_equal, ">=", x >= y, "a >= b, elementwise (bool)")

KERNEL(logical_and_b, uint8_t, uint8_t, x && y)
MG_ROW(LOGICAL_AND, logical_and) = {
  .forward = binary_forward,
  .info = {.name = "logical_and", .kind = MG_OP_BINARY, .symbol = "and",
           .doc = "a and b, elementwise on bool tensors", .fn.binary = mg_logical_and},
  .kernel = {[MG_BOOL] = logical_and_b}, .result = MG_RESULT_BOOL,
};
mg_tensor *mg_logical_and (mg_tensor *a, mg_tensor *b) { return binary(&logical_and_op, a, b); }

KERNEL(logical_or_b, uint8_t, uint8_t, x || y)
MG_ROW(LOGICAL_OR, logical_or) = {
  .forward = binary_forward,
  .info = {.name = "logical_or", .kind = MG_OP_BINARY, .symbol = "or",
           .doc = "a or b, elementwise on bool tensors", .fn.binary = mg_logical_or},
  .kernel = {[MG_BOOL] = logical_or_b}, .result = MG_RESULT_BOOL,
};
mg_tensor *mg_logical_or (mg_tensor *a, mg_tensor *b) { return binary(&logical_or_op, a, b); }

/* }========================================================== */


/* {========================== where ========================= */

static void where_run (int64_t n, char **p, const int64_t *s, void *ud) {
  size_t sz = *(size_t *)ud;
  const uint8_t *c = (const uint8_t *)p[1];
  if (sz == 4 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
    const float *a = (const float *)p[2], *b = (const float *)p[3];
    float *o = (float *)p[0];
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : b[i];
  } else if (sz == 8 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
    const double *a = (const double *)p[2], *b = (const double *)p[3];
    double *o = (double *)p[0];
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : b[i];
  } else {
    for (int64_t i = 0; i < n; i++)
      memcpy(p[0] + (size_t)i * sz, c[i * s[1]] ? p[2] + i * s[2] * (int64_t)sz
                                               : p[3] + i * s[3] * (int64_t)sz, sz);
  }
}

/* where: out = cond ? a : b.  grad: da = where(cond, dout, 0),
** db = where(cond, 0, dout); cond gets none */
static mg_status where_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *zero = mg_tmp(&sc, zero_like_dtype(dout[0]));
  if (n->needs[1])
    din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_where(n->in[0], dout[0], zero)), SHAPE_OF(n, 1));
  if (n->needs[2])
    din[2] = mg_sum_to_shape(mg_tmp(&sc, mg_where(n->in[0], zero, dout[0])), SHAPE_OF(n, 2));
  mg_scope_end(&sc);
  return MG_OK;
}
static mg_status where_forward (mg_opcall *c);
MG_ROW(WHERE, where) = {
  .forward = where_forward,
  .info = {.name = "where", .kind = MG_OP_OTHER,
           .doc = "where(cond, a, b): a where cond is true, else b (all three broadcast)"},
  .saves = MG_SAVE_IN(0), .backward = where_backward,
};

static mg_status where_forward (mg_opcall *c) {
  mg_tensor *cond = c->in[0], *a = c->in[1], *b = c->in[2];
  mg_tensor *out = mg_empty(c->shape, c->ndim, c->dtype);
  if (out == NULL) return MG_ERR;
  mg_iter it;
  const mg_tensor *ops[4] = {out, cond, a, b};
  mg_iter_init(&it, c->shape, c->ndim, 4, ops);
  char *base[4] = {mg_ptr(out), mg_ptr(cond), mg_ptr(a), mg_ptr(b)};
  size_t esz = mg_dtype_size(a->dtype), sz[4] = {esz, 1, esz, esz};
  mg_iter_run(&it, base, sz, where_run, &esz);
  c->out[0] = out;
  return MG_OK;
}

mg_tensor *mg_where (mg_tensor *cond, mg_tensor *a, mg_tensor *b) {
  MG_CHECK_ARG("mg_where", cond, NULL);
  MG_CHECK_ARG("mg_where", a, NULL);
  MG_CHECK_ARG("mg_where", b, NULL);
  if (cond->dtype != MG_BOOL)
    return mg_seterror("where: condition must be a bool tensor, got %s", mg_dtype_name(cond->dtype)), NULL;
  mg_tensor *ab[2] = {a, b};                        /* a half and float32: in float32 */
  HALF_PAIR_AS_FLOAT32(a, b, mg_half_mixed(ab, 2), mg_where(cond, a, b));
  if (a->dtype != b->dtype)
    return mg_seterror("where: dtypes differ: %s vs %s", mg_dtype_name(a->dtype),
                       mg_dtype_name(b->dtype)), NULL;
  int64_t s1[MG_MAX_DIMS], shape[MG_MAX_DIMS];
  int n1 = mg_broadcast_shapes("where", ",", a->shape, a->ndim, b->shape, b->ndim, s1);
  if (n1 < 0) return NULL;
  int nd = mg_broadcast_shapes("where", "and", cond->shape, cond->ndim, s1, n1, shape);
  if (nd < 0) return NULL;
  mg_tensor *in[3] = {cond, a, b};
  mg_opcall c = MG_OPCALL(&where_op, 3, in, NULL, shape, nd, a->dtype);
  return mg_dispatch(&c);
}

/* }========================================================== */


MG_FAMILY(mg_binary_ops, BINARY_OPS, BINARY__COUNT);

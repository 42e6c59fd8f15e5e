/*
** elementwise.c — broadcasting binary ops, unary maths and where.
**
** Each differentiable op's backward rule sits right after its forward
** entry, written with the public ops so an outer tape records it too.
** Kernels are loops over one innermost run (see iter.c); the op and dtype
** are switched on once per run, and the contiguous cases are plain loops
** the compiler vectorises.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moongrad_impl.h"
#include "vecmath.h"

/* {===================== binary kernels ===================== */

typedef enum binop {
  B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MAX, B_MIN, B_FLOORDIV, B_MOD,
  B_EQ, B_NE, B_LT, B_LE, B_GT, B_GE, B_AND, B_OR, B_RELU_GRAD
} binop;

enum { ARITH, COMPARE, LOGICAL };

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

static inline float fmodf_floor (float x, float y) {
  float m = fmodf(x, y);
  return (m != 0 && ((m < 0) != (y < 0))) ? m + y : m;
}
static inline double fmod_floor (double x, double y) {
  double m = fmod(x, y);
  return (m != 0 && ((m < 0) != (y < 0))) ? m + y : m;
}

#define FLOAT_BINARY(T, POW, FLOOR, MODF)                          \
  switch (op) {                                                    \
    case B_ADD: LOOP2(T, T, x + y); break;                         \
    case B_SUB: LOOP2(T, T, x - y); break;                         \
    case B_MUL: LOOP2(T, T, x * y); break;                         \
    case B_DIV: LOOP2(T, T, x / y); break;                         \
    case B_POW: LOOP2(T, T, POW(x, y)); break;                     \
    case B_MAX: LOOP2(T, T, (x >= y || x != x) ? x : y); break;    \
    case B_MIN: LOOP2(T, T, (x <= y || x != x) ? x : y); break;    \
    case B_FLOORDIV: LOOP2(T, T, FLOOR(x / y)); break;             \
    case B_MOD: LOOP2(T, T, MODF(x, y)); break;                    \
    case B_EQ: LOOP2(T, uint8_t, x == y); break;                   \
    case B_NE: LOOP2(T, uint8_t, x != y); break;                   \
    case B_LT: LOOP2(T, uint8_t, x < y); break;                    \
    case B_LE: LOOP2(T, uint8_t, x <= y); break;                   \
    case B_GT: LOOP2(T, uint8_t, x > y); break;                    \
    case B_GE: LOOP2(T, uint8_t, x >= y); break;                   \
    case B_RELU_GRAD: LOOP2(T, T, y > 0 ? x : 0); break;           \
    default: break;                                                \
  }

static void binary_f32 (binop op, int64_t n, char **p, const int64_t *s) {
  FLOAT_BINARY(float, powf, floorf, fmodf_floor)
}

static void binary_f64 (binop op, int64_t n, char **p, const int64_t *s) {
  FLOAT_BINARY(double, pow, floor, fmod_floor)
}

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

static void binary_i64 (binop op, int64_t n, char **p, const int64_t *s) {
  switch (op) {   /* unsigned arithmetic: wrap around instead of overflowing */
    case B_ADD: LOOP2(int64_t, int64_t, (uint64_t)x + (uint64_t)y); break;
    case B_SUB: LOOP2(int64_t, int64_t, (uint64_t)x - (uint64_t)y); break;
    case B_MUL: LOOP2(int64_t, int64_t, (uint64_t)x * (uint64_t)y); break;
    case B_DIV: LOOP2(int64_t, double, (double)x / (double)y); break;
    case B_POW: LOOP2(int64_t, int64_t, ipow(x, y)); break;
    case B_MAX: LOOP2(int64_t, int64_t, x >= y ? x : y); break;
    case B_MIN: LOOP2(int64_t, int64_t, x <= y ? x : y); break;
    case B_FLOORDIV: LOOP2(int64_t, int64_t, idiv_floor(x, y)); break;
    case B_MOD: LOOP2(int64_t, int64_t, imod_floor(x, y)); break;
    case B_EQ: LOOP2(int64_t, uint8_t, x == y); break;
    case B_NE: LOOP2(int64_t, uint8_t, x != y); break;
    case B_LT: LOOP2(int64_t, uint8_t, x < y); break;
    case B_LE: LOOP2(int64_t, uint8_t, x <= y); break;
    case B_GT: LOOP2(int64_t, uint8_t, x > y); break;
    case B_GE: LOOP2(int64_t, uint8_t, x >= y); break;
    default: break;
  }
}

static void binary_bool (binop op, int64_t n, char **p, const int64_t *s) {
  switch (op) {
    case B_AND: LOOP2(uint8_t, uint8_t, x && y); break;
    case B_OR: LOOP2(uint8_t, uint8_t, x || y); break;
    case B_EQ: LOOP2(uint8_t, uint8_t, x == y); break;
    case B_NE: LOOP2(uint8_t, uint8_t, x != y); break;
    default: break;
  }
}

typedef struct { binop op; mg_dtype dt; } binary_ud;

static void binary_run (int64_t n, char **p, const int64_t *s, void *ud) {
  binary_ud *b = (binary_ud *)ud;
  switch (b->dt) {
    case MG_FLOAT32: binary_f32(b->op, n, p, s); break;
    case MG_FLOAT64: binary_f64(b->op, n, p, s); break;
    case MG_INT64: binary_i64(b->op, n, p, s); break;
    default: binary_bool(b->op, n, p, s); break;
  }
}

/* }========================================================== */


/* {=================== binary forward ===================== */

static const mg_opdef add_op, sub_op, mul_op, div_op, pow_op, maximum_op, minimum_op, mod_op,
                      relu_grad_op;

static const struct {
  const char *name, *sym;
  int kind;
  const mg_opdef *def;           /* NULL: no gradient */
} BIN[] = {
  {"add", "+", ARITH, &add_op},          {"sub", "-", ARITH, &sub_op},
  {"mul", "*", ARITH, &mul_op},          {"div", "/", ARITH, &div_op},
  {"pow", "^", ARITH, &pow_op},          {"maximum", ",", ARITH, &maximum_op},
  {"minimum", ",", ARITH, &minimum_op},  {"floordiv", "//", ARITH, NULL},
  {"mod", "%", ARITH, &mod_op},
  {"equal", "==", COMPARE, NULL},        {"not_equal", "~=", COMPARE, NULL},
  {"less", "<", COMPARE, NULL},          {"less_equal", "<=", COMPARE, NULL},
  {"greater", ">", COMPARE, NULL},       {"greater_equal", ">=", COMPARE, NULL},
  {"logical_and", "and", LOGICAL, NULL}, {"logical_or", "or", LOGICAL, NULL},
  {"relu_grad", ",", ARITH, &relu_grad_op},
};

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

/* the checks integer kernels cannot make without crashing */
static mg_status check_int_operands (binop op, const mg_tensor *b) {
  const char *fn = BIN[op].name;
  if ((op == B_FLOORDIV || op == B_MOD) && any_int(b, is_zero))
    return mg_seterror("%s: integer division by zero", fn);
  if (op == B_POW && any_int(b, is_negative))
    return mg_seterror("pow: integers to negative integer powers are not allowed; cast to float first");
  return MG_OK;
}

static mg_status check_binary_dtypes (binop op, const mg_tensor *a, const mg_tensor *b) {
  const char *fn = BIN[op].name;
  if (a->dtype != b->dtype)
    return mg_seterror("%s: dtypes differ: %s %s %s", fn, mg_dtype_name(a->dtype), BIN[op].sym,
                       mg_dtype_name(b->dtype));
  if (BIN[op].kind == LOGICAL && a->dtype != MG_BOOL)
    return mg_seterror("%s: needs bool tensors, got %s", fn, mg_dtype_name(a->dtype));
  if (BIN[op].kind == ARITH && a->dtype == MG_BOOL)
    return mg_seterror("%s: not defined for bool tensors; cast them first", fn);
  if (a->dtype == MG_INT64) return check_int_operands(op, b);
  return MG_OK;
}

static mg_dtype binary_out_dtype (binop op, mg_dtype dt) {
  if (BIN[op].kind != ARITH) return MG_BOOL;
  if (op == B_DIV && dt == MG_INT64) return MG_FLOAT64;
  return dt;
}

/* "mg_add: argument 'a' is NULL" */
static mg_tensor *null_operand (const char *op, const char *arg) {
  char fn[32];
  snprintf(fn, sizeof fn, "mg_%s", op);
  mg_null_arg(fn, arg);
  return NULL;
}

static mg_tensor *binary (binop op, mg_tensor *a, mg_tensor *b) {
  if (a == NULL) return null_operand(BIN[op].name, "a");
  if (b == NULL) return null_operand(BIN[op].name, "b");
  if (check_binary_dtypes(op, a, b) != MG_OK) return NULL;
  int64_t shape[MG_MAX_DIMS];
  int nd = mg_broadcast_shapes(BIN[op].name, BIN[op].sym, a->shape, a->ndim, b->shape,
                               b->ndim, shape);
  if (nd < 0) return NULL;
  mg_tensor *out = mg_empty(shape, nd, binary_out_dtype(op, a->dtype));
  if (out == NULL) return NULL;
  char *base[3] = {mg_ptr(out), mg_ptr(a), mg_ptr(b)};
  binary_ud ud = {op, a->dtype};
  int64_t n = out->numel;
  bool ca = mg_tensor_is_contiguous(a), cb = mg_tensor_is_contiguous(b);
  if (n < MG_PARALLEL_MIN && ca && cb && (a->numel == n || a->numel == 1) && (b->numel == n || b->numel == 1)) {
    int64_t st[3] = {1, a->numel == n, b->numel == n};    /* one run: no iterator to set up */
    binary_run(n, base, st, &ud);
  } else {
    mg_iter it;
    const mg_tensor *ops[3] = {out, a, b};
    mg_iter_init(&it, shape, nd, 3, ops);
    size_t sz[3] = {mg_dtype_size(out->dtype), mg_dtype_size(a->dtype), mg_dtype_size(b->dtype)};
    mg_iter_run(&it, base, sz, binary_run, &ud);
  }
  mg_tensor *in[2] = {a, b};
  return BIN[op].def && mg_is_float(out->dtype) && mg_is_float(a->dtype)
             ? mg_finish(BIN[op].def, 2, in, out, NULL) : out;
}

mg_tensor *mg_floordiv (mg_tensor *a, mg_tensor *b) { return binary(B_FLOORDIV, a, b); }
mg_tensor *mg_equal (mg_tensor *a, mg_tensor *b) { return binary(B_EQ, a, b); }
mg_tensor *mg_not_equal (mg_tensor *a, mg_tensor *b) { return binary(B_NE, a, b); }
mg_tensor *mg_less (mg_tensor *a, mg_tensor *b) { return binary(B_LT, a, b); }
mg_tensor *mg_less_equal (mg_tensor *a, mg_tensor *b) { return binary(B_LE, a, b); }
mg_tensor *mg_greater (mg_tensor *a, mg_tensor *b) { return binary(B_GT, a, b); }
mg_tensor *mg_greater_equal (mg_tensor *a, mg_tensor *b) { return binary(B_GE, a, b); }
mg_tensor *mg_logical_and (mg_tensor *a, mg_tensor *b) { return binary(B_AND, a, b); }
mg_tensor *mg_logical_or (mg_tensor *a, mg_tensor *b) { return binary(B_OR, a, b); }

/* }========================================================== */


/* {============ binary ops and their gradients ============== */
/* Every rule sums its result back to the input's shape (broadcasting's
** adjoint) with mg_sum_to_shape; `shape_of(n, j)` names input j's shape. */

#define SHAPE_OF(n, j)  (n)->in_meta[j].shape, (n)->in_meta[j].ndim

static mg_tensor *zero_like_dtype (const mg_tensor *t) {
  return t ? mg_scalar(0.0, t->dtype) : NULL;
}

/* add: out = a + b.  grad: da = dout, db = dout */
mg_tensor *mg_add (mg_tensor *a, mg_tensor *b) { return binary(B_ADD, a, b); }

static mg_status add_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  for (int j = 0; j < 2; j++)
    if (n->needs[j]) din[j] = mg_sum_to_shape(dout[0], SHAPE_OF(n, j));
  return MG_OK;
}
static const mg_opdef add_op = {"add", 0, add_backward, NULL};

/* sub: out = a - b.  grad: da = dout, db = -dout */
mg_tensor *mg_sub (mg_tensor *a, mg_tensor *b) { return binary(B_SUB, a, b); }

static mg_status sub_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  if (n->needs[0]) din[0] = mg_sum_to_shape(dout[0], SHAPE_OF(n, 0));
  if (n->needs[1]) din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_neg(dout[0])), SHAPE_OF(n, 1));
  mg_scope_end(&sc);
  return MG_OK;
}
static const mg_opdef sub_op = {"sub", 0, sub_backward, NULL};

/* mul: out = a * b.  grad: da = dout * b, db = dout * a */
mg_tensor *mg_mul (mg_tensor *a, mg_tensor *b) { return binary(B_MUL, a, b); }

static mg_status mul_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  if (n->needs[0]) din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(dout[0], n->in[1])), SHAPE_OF(n, 0));
  if (n->needs[1]) din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(dout[0], n->in[0])), SHAPE_OF(n, 1));
  mg_scope_end(&sc);
  return MG_OK;
}
static const mg_opdef mul_op = {"mul", MG_SAVE_IN(0) | MG_SAVE_IN(1), mul_backward, NULL};

/* div: out = a / b.  grad: da = dout / b, db = -dout * out / b */
mg_tensor *mg_div (mg_tensor *a, mg_tensor *b) { return binary(B_DIV, a, b); }

static mg_status div_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *g = mg_tmp(&sc, mg_div(dout[0], n->in[1]));    /* dout / b */
  if (n->needs[0]) din[0] = mg_sum_to_shape(g, SHAPE_OF(n, 0));
  if (n->needs[1])
    din[1] = mg_sum_to_shape(mg_tmp(&sc, mg_neg(mg_tmp(&sc, mg_mul(g, n->out[0])))), SHAPE_OF(n, 1));
  mg_scope_end(&sc);
  return MG_OK;
}
static const mg_opdef div_op = {"div", MG_SAVE_IN(1) | MG_SAVE_OUT(0), div_backward, NULL};

/* pow: out = a ^ b.  grad: da = dout * b * a^(b-1),
** db = dout * out * log(a) where a > 0, else 0 (as TensorFlow) */
mg_tensor *mg_pow (mg_tensor *a, mg_tensor *b) { return binary(B_POW, a, b); }

static mg_status pow_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *a = n->in[0], *b = n->in[1];
  mg_tensor *one = mg_tmp(&sc, mg_scalar(1.0, a->dtype)), *zero = mg_tmp(&sc, zero_like_dtype(a));
  if (n->needs[0]) {            /* 0 where b = 0, as PyTorch: not 0 * 0^-1 = NaN at a = 0 */
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
static const mg_opdef pow_op = {"pow", MG_SAVE_IN(0) | MG_SAVE_IN(1) | MG_SAVE_OUT(0),
                                pow_backward, NULL};

/* mod: out = a - floor(a / b) * b (floor-mod, as Lua's %).
** grad: da = dout, db = -dout * floor(a / b) (TensorFlow's FloorMod rule) */
mg_tensor *mg_mod (mg_tensor *a, mg_tensor *b) { return binary(B_MOD, a, b); }

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
static const mg_opdef mod_op = {"mod", MG_SAVE_IN(0) | MG_SAVE_IN(1), mod_backward, NULL};

/* maximum/minimum: the gradient goes to a where a wins (ties go to a),
** else to b, as TensorFlow's _MaximumMinimumGrad */
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

mg_tensor *mg_maximum (mg_tensor *a, mg_tensor *b) { return binary(B_MAX, a, b); }
static mg_status maximum_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  return pick_backward(n, dout, din, mg_greater_equal);
}
static const mg_opdef maximum_op = {"maximum", MG_SAVE_IN(0) | MG_SAVE_IN(1), maximum_backward, NULL};

mg_tensor *mg_minimum (mg_tensor *a, mg_tensor *b) { return binary(B_MIN, a, b); }
static mg_status minimum_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  return pick_backward(n, dout, din, mg_less_equal);
}
static const mg_opdef minimum_op = {"minimum", MG_SAVE_IN(0) | MG_SAVE_IN(1), minimum_backward, NULL};

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

static const mg_opdef where_op;

/* where: out = cond ? a : b.  grad: da = where(cond, dout, 0),
** db = where(cond, 0, dout); cond gets none */
mg_tensor *mg_where (mg_tensor *cond, mg_tensor *a, mg_tensor *b) {
  MG_CHECK_ARG("mg_where", cond, NULL);
  MG_CHECK_ARG("mg_where", a, NULL);
  MG_CHECK_ARG("mg_where", b, NULL);
  if (cond->dtype != MG_BOOL)
    return mg_seterror("where: condition must be a bool tensor, got %s", mg_dtype_name(cond->dtype)), NULL;
  if (a->dtype != b->dtype)
    return mg_seterror("where: dtypes differ: %s vs %s", mg_dtype_name(a->dtype),
                       mg_dtype_name(b->dtype)), NULL;
  int64_t s1[MG_MAX_DIMS], shape[MG_MAX_DIMS];
  int n1 = mg_broadcast_shapes("where", ",", a->shape, a->ndim, b->shape, b->ndim, s1);
  if (n1 < 0) return NULL;
  int nd = mg_broadcast_shapes("where", "and", cond->shape, cond->ndim, s1, n1, shape);
  if (nd < 0) return NULL;
  mg_tensor *out = mg_empty(shape, nd, a->dtype);
  if (out == NULL) return NULL;
  mg_iter it;
  const mg_tensor *ops[4] = {out, cond, a, b};
  mg_iter_init(&it, shape, nd, 4, ops);
  char *base[4] = {mg_ptr(out), mg_ptr(cond), mg_ptr(a), mg_ptr(b)};
  size_t esz = mg_dtype_size(a->dtype), sz[4] = {esz, 1, esz, esz};
  mg_iter_run(&it, base, sz, where_run, &esz);
  mg_tensor *in[3] = {cond, a, b};
  return mg_is_float(a->dtype) ? mg_finish(&where_op, 3, in, out, NULL) : out;
}

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
static const mg_opdef where_op = {"where", MG_SAVE_IN(0), where_backward, NULL};

/* }========================================================== */


/* {====================== unary kernels ===================== */

typedef enum unop { U_NEG, U_EXP, U_LOG, U_SQRT, U_ABS, U_SIGN, U_TANH, U_SIGMOID, U_RELU,
                    U_NOT } unop;

#define LOOP1(TI, TO, EXPR) do {                                              \
    const TI *X_ = (const TI *)p[1];                                          \
    TO *O_ = (TO *)p[0];                                                      \
    int64_t sx_ = s[1];                                                       \
    if (sx_ == 1) for (int64_t i = 0; i < n; i++) { TI x = X_[i]; O_[i] = (TO)(EXPR); } \
    else for (int64_t i = 0; i < n; i++) { TI x = X_[i * sx_]; O_[i] = (TO)(EXPR); } \
  } while (0)

#define FLOAT_UNARY(T, EXP, LOG, SQRT, FABS, TANH)                            \
  switch (op) {                                                               \
    case U_NEG: LOOP1(T, T, -x); break;                                       \
    case U_EXP: LOOP1(T, T, EXP(x)); break;                                   \
    case U_LOG: LOOP1(T, T, LOG(x)); break;                                   \
    case U_SQRT: LOOP1(T, T, SQRT(x)); break;                                 \
    case U_ABS: LOOP1(T, T, FABS(x)); break;                                  \
    case U_SIGN: LOOP1(T, T, (x > 0) - (x < 0) + (x != x ? x : 0)); break;    \
    case U_TANH: LOOP1(T, T, TANH(x)); break;                                 \
    case U_SIGMOID: LOOP1(T, T, 1 / (1 + EXP(-x))); break;                    \
    case U_RELU: LOOP1(T, T, (x > 0 || x != x) ? x : 0); break;  /* NaN stays */ \
    default: break;                                                           \
  }

static void unary_f32 (unop op, int64_t n, char **p, const int64_t *s) {
  FLOAT_UNARY(float, expf, logf, sqrtf, fabsf, tanhf)
}

static void unary_f64 (unop op, int64_t n, char **p, const int64_t *s) {
  FLOAT_UNARY(double, exp, log, sqrt, fabs, tanh)
}

static void unary_i64 (unop op, int64_t n, char **p, const int64_t *s) {
  switch (op) {
    case U_NEG: LOOP1(int64_t, int64_t, 0u - (uint64_t)x); break;
    case U_ABS: LOOP1(int64_t, int64_t, x < 0 ? 0u - (uint64_t)x : (uint64_t)x); break;
    case U_SIGN: LOOP1(int64_t, int64_t, (x > 0) - (x < 0)); break;
    case U_RELU: LOOP1(int64_t, int64_t, x > 0 ? x : 0); break;
    default: break;
  }
}

typedef struct { unop op; mg_dtype dt; } unary_ud;

static void unary_run (int64_t n, char **p, const int64_t *s, void *ud) {
  unary_ud *u = (unary_ud *)ud;
  switch (u->dt) {
    case MG_FLOAT32: unary_f32(u->op, n, p, s); break;
    case MG_FLOAT64: unary_f64(u->op, n, p, s); break;
    case MG_INT64: unary_i64(u->op, n, p, s); break;
    default: LOOP1(uint8_t, uint8_t, !x); break;       /* U_NOT */
  }
}

static const mg_opdef neg_op, exp_op, log_op, sqrt_op, abs_op, tanh_op, sigmoid_op, relu_op;

static const struct { const char *name; bool int_ok; const mg_opdef *def; } UN[] = {
  {"neg", true, &neg_op},   {"exp", false, &exp_op},   {"log", false, &log_op},
  {"sqrt", false, &sqrt_op}, {"abs", true, &abs_op},   {"sign", true, NULL},
  {"tanh", false, &tanh_op}, {"sigmoid", false, &sigmoid_op}, {"relu", true, &relu_op},
  {"logical_not", false, NULL},
};

static mg_tensor *unary (unop op, mg_tensor *x) {
  if (x == NULL) return null_operand(UN[op].name, "x");
  const char *fn = UN[op].name;
  if (op == U_NOT) {
    if (x->dtype != MG_BOOL)
      return mg_seterror("logical_not: needs a bool tensor, got %s", mg_dtype_name(x->dtype)), NULL;
  } else if (x->dtype == MG_BOOL) {
    return mg_seterror("%s: not defined for bool tensors; cast first", fn), NULL;
  } else if (x->dtype == MG_INT64 && !UN[op].int_ok) {
    return mg_seterror("%s: not defined for int64 tensors; cast to float first", fn), NULL;
  }
  mg_tensor *out = mg_empty(x->shape, x->ndim, x->dtype);
  if (out == NULL) return NULL;
  mg_iter it;
  const mg_tensor *ops[2] = {out, x};
  mg_iter_init(&it, x->shape, x->ndim, 2, ops);
  char *base[2] = {mg_ptr(out), mg_ptr(x)};
  size_t sz[2] = {mg_dtype_size(x->dtype), mg_dtype_size(x->dtype)};
  unary_ud ud = {op, x->dtype};
  mg_iter_run(&it, base, sz, unary_run, &ud);
  return UN[op].def && mg_is_float(x->dtype) ? mg_finish(UN[op].def, 1, &x, out, NULL) : out;
}

mg_tensor *mg_sign (mg_tensor *x) { return unary(U_SIGN, x); }
mg_tensor *mg_logical_not (mg_tensor *x) { return unary(U_NOT, x); }

/* }========================================================== */


/* {============= unary ops and their gradients ============== */

/* neg: out = -x.  grad: dx = -dout */
mg_tensor *mg_neg (mg_tensor *x) { return unary(U_NEG, x); }
static mg_status neg_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  MG_UNUSED(n);
  din[0] = mg_neg(dout[0]);
  return MG_OK;
}
static const mg_opdef neg_op = {"neg", 0, neg_backward, NULL};

/* exp: out = e^x.  grad: dx = dout * out */
mg_tensor *mg_exp (mg_tensor *x) { return unary(U_EXP, x); }
static mg_status exp_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_mul(dout[0], n->out[0]);
  return MG_OK;
}
static const mg_opdef exp_op = {"exp", MG_SAVE_OUT(0), exp_backward, NULL};

/* log: out = ln x.  grad: dx = dout / x */
mg_tensor *mg_log (mg_tensor *x) { return unary(U_LOG, x); }
static mg_status log_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_div(dout[0], n->in[0]);
  return MG_OK;
}
static const mg_opdef log_op = {"log", MG_SAVE_IN(0), log_backward, NULL};

/* sqrt: out = sqrt(x).  grad: dx = dout * 0.5 / out */
mg_tensor *mg_sqrt (mg_tensor *x) { return unary(U_SQRT, x); }
static mg_status sqrt_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *half = mg_tmp(&sc, mg_scalar(0.5, dout[0]->dtype));
  din[0] = mg_div(mg_tmp(&sc, mg_mul(dout[0], half)), n->out[0]);
  mg_scope_end(&sc);
  return MG_OK;
}
static const mg_opdef sqrt_op = {"sqrt", MG_SAVE_OUT(0), sqrt_backward, NULL};

/* abs: out = |x|.  grad: dx = dout * sign(x) */
mg_tensor *mg_abs (mg_tensor *x) { return unary(U_ABS, x); }
static mg_status abs_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  din[0] = mg_mul(dout[0], mg_tmp(&sc, mg_sign(n->in[0])));
  mg_scope_end(&sc);
  return MG_OK;
}
static const mg_opdef abs_op = {"abs", MG_SAVE_IN(0), abs_backward, NULL};

/* tanh: out = tanh(x).  grad: dx = dout * (1 - out^2); keeps the output only */
mg_tensor *mg_tanh (mg_tensor *x) { return unary(U_TANH, x); }
static mg_status tanh_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *y = n->out[0], *one = mg_tmp(&sc, mg_scalar(1.0, y->dtype));
  mg_tensor *d = mg_tmp(&sc, mg_sub(one, mg_tmp(&sc, mg_mul(y, y))));
  din[0] = mg_mul(dout[0], d);
  mg_scope_end(&sc);
  return MG_OK;
}
static const mg_opdef tanh_op = {"tanh", MG_SAVE_OUT(0), tanh_backward, NULL};

/* sigmoid: out = 1 / (1 + e^-x).  grad: dx = dout * out * (1 - out) */
mg_tensor *mg_sigmoid (mg_tensor *x) { return unary(U_SIGMOID, x); }
static mg_status sigmoid_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *y = n->out[0], *one = mg_tmp(&sc, mg_scalar(1.0, y->dtype));
  mg_tensor *d = mg_tmp(&sc, mg_mul(y, mg_tmp(&sc, mg_sub(one, y))));
  din[0] = mg_mul(dout[0], d);
  mg_scope_end(&sc);
  return MG_OK;
}
static const mg_opdef sigmoid_op = {"sigmoid", MG_SAVE_OUT(0), sigmoid_backward, NULL};

/* relu: out = max(x, 0).  grad: dx = relu_grad(dout, out), one fused pass */
mg_tensor *mg_relu (mg_tensor *x) { return unary(U_RELU, x); }
static mg_status relu_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_relu_grad(dout[0], n->out[0]);
  return MG_OK;
}
static const mg_opdef relu_op = {"relu", MG_SAVE_OUT(0), relu_backward, NULL};

/* relu_grad: out = y > 0 ? d : 0 (relu's backward as a primitive, so that it
** can be differentiated again).  grad: dd = relu_grad(dout, y); dy = 0 */
mg_tensor *mg_relu_grad (mg_tensor *d, mg_tensor *y) { return binary(B_RELU_GRAD, d, y); }
static mg_status relu_grad_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  if (n->needs[0]) din[0] = mg_sum_to_shape(mg_tmp(&sc, mg_relu_grad(dout[0], n->in[1])), SHAPE_OF(n, 0));
  if (n->needs[1]) din[1] = mg_zeros_meta(&n->in_meta[1]);
  mg_scope_end(&sc);
  return MG_OK;
}
static const mg_opdef relu_grad_op = {"relu_grad", MG_SAVE_IN(1), relu_grad_backward, NULL};

/* }========================================================== */

/*
** maths.c — more elementwise maths and reductions: sin, cos, log1p, expm1,
** erf, floor, ceil, round, clamp, prod, cumsum, logsumexp, var, std, norm.
**
** Each op is one block: its kernels, its backward rule (written with the
** public ops, so nested tapes differentiate it again), its registry row and
** its entry point. The elementwise kernels go through glibc's vector maths
** (vecmath.h). The reductions see their input as (outer, n, inner) around
** the reduced axis, as reduce.c does: a row (inner == 1) runs in 16
** independent lanes so the compiler vectorises it, columns (inner > 1) are
** streamed row after row with their accumulators beside. float32
** accumulates in double.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/op.h"
#include "lanes.h"
#include "vecmath.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define MATHS_OPS(X) \
  X(SIN, sin) X(COS, cos) X(LOG1P, log1p) X(EXPM1, expm1) X(ERF, erf) X(FLOOR, floor) \
  X(CEIL, ceil) X(ROUND, round) X(CLAMP, clamp) X(PROD, prod) X(LOGSUMEXP, logsumexp) \
  X(VAR, var) X(STD, std) X(NORM, norm) X(CUMSUM, cumsum)
enum { MATHS_OPS(MG_ROW_ENUM) MATHS__COUNT };

/* {============= elementwise: kernels and the common path ========= */

/* (VM_MAP1: every element through the same code, whatever its place) */
#define KERNEL(NAME, TI, TO, EXPR) \
  static void NAME (int64_t n, char **p, const int64_t *s) { VM_MAP1(TI, TO, EXPR); }
#define FLOAT_KERNELS(OP, EXPR) \
  KERNEL(OP##_f32, float, float, EXPR) KERNEL(OP##_f64, double, double, EXPR)

#define SIN(x)    _Generic((x), float: sinf, default: sin)(x)
#define COS(x)    _Generic((x), float: cosf, default: cos)(x)
#define EXP(x)    _Generic((x), float: expf, default: exp)(x)
#define LOG1P(x)  _Generic((x), float: log1pf, default: log1p)(x)
#define EXPM1(x)  _Generic((x), float: expm1f, default: expm1)(x)
#define ERF(x)    _Generic((x), float: erff, default: erf)(x)
#define FABS(x)   _Generic((x), float: fabsf, default: fabs)(x)

/*
** Rounding that vectorises: GCC turns floorf/ceilf/rintf into vector
** instructions only under -fno-trapping-math. Below 2^23 (2^52 for double),
** adding and taking away 2^23 leaves no fraction bits, and the addition
** rounds to the nearest, ties to even (the default rounding mode); larger
** values, infinities and NaN are integral already and get 0 added. ceil
** steps up from there and floor(x) is -ceil(-x) (written as r - 1 where
** r > x, GCC would branch). Every result has x's sign: -0.3 rounds to -0.
*/
static inline float round_f32v (float x) {
  float a = fabsf(x), t = a < 0x1p23f ? 0x1p23f : 0.0f;
  return copysignf((a + t) - t, x);
}
static inline double round_f64v (double x) {
  double a = fabs(x), t = a < 0x1p52 ? 0x1p52 : 0.0;
  return copysign((a + t) - t, x);
}
static inline float ceil_f32v (float x) { float r = round_f32v(x); return copysignf(r + (r < x ? 1.0f : 0.0f), x); }
static inline double ceil_f64v (double x) { double r = round_f64v(x); return copysign(r + (r < x ? 1.0 : 0.0), x); }
static inline float floor_f32v (float x) { return -ceil_f32v(-x); }
static inline double floor_f64v (double x) { return -ceil_f64v(-x); }
#define ROUND_EVEN(x)  _Generic((x), float: round_f32v, default: round_f64v)(x)
#define FLOOR(x)       _Generic((x), float: floor_f32v, default: floor_f64v)(x)
#define CEIL(x)        _Generic((x), float: ceil_f32v, default: ceil_f64v)(x)

/* }========================================================== */


/* {================= elementwise ops and gradients ============ */

/* sin: out = sin x.  grad: dx = dout * cos x */
FLOAT_KERNELS(sin, SIN(x))
static mg_status sin_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  din[0] = mg_mul(dout[0], mg_tmp(&sc, mg_cos(n->in[0])));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(SIN, sin) = {
  .forward = mg_unary_forward,
  .info = {.name = "sin", .kind = MG_OP_UNARY, .doc = "the sine (radians)", .fn.unary = mg_sin},
  .kernel = {[MG_FLOAT32] = sin_f32, [MG_FLOAT64] = sin_f64},
  .saves = MG_SAVE_IN(0), .backward = sin_backward,
};
mg_tensor *mg_sin (mg_tensor *x) { return mg_unary_op(&sin_op, x); }

/* cos: out = cos x.  grad: dx = -dout * sin x */
FLOAT_KERNELS(cos, COS(x))
static mg_status cos_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *s = mg_tmp(&sc, mg_sin(n->in[0]));
  din[0] = mg_neg(mg_tmp(&sc, mg_mul(dout[0], s)));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(COS, cos) = {
  .forward = mg_unary_forward,
  .info = {.name = "cos", .kind = MG_OP_UNARY, .doc = "the cosine (radians)", .fn.unary = mg_cos},
  .kernel = {[MG_FLOAT32] = cos_f32, [MG_FLOAT64] = cos_f64},
  .saves = MG_SAVE_IN(0), .backward = cos_backward,
};
mg_tensor *mg_cos (mg_tensor *x) { return mg_unary_op(&cos_op, x); }

/* log1p: out = log(1 + x), exact near 0.  grad: dx = dout / (1 + x) */
FLOAT_KERNELS(log1p, LOG1P(x))
static mg_status log1p_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *one = mg_tmp(&sc, mg_scalar(1.0, n->in[0]->dtype));
  din[0] = mg_div(dout[0], mg_tmp(&sc, mg_add(one, n->in[0])));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(LOG1P, log1p) = {
  .forward = mg_unary_forward,
  .info = {.name = "log1p", .kind = MG_OP_UNARY, .doc = "log(1 + x), accurate near 0",
           .fn.unary = mg_log1p},
  .kernel = {[MG_FLOAT32] = log1p_f32, [MG_FLOAT64] = log1p_f64},
  .saves = MG_SAVE_IN(0), .backward = log1p_backward,
};
mg_tensor *mg_log1p (mg_tensor *x) { return mg_unary_op(&log1p_op, x); }

/* expm1: out = e^x - 1, exact near 0.  grad: dx = dout * (out + 1) */
FLOAT_KERNELS(expm1, EXPM1(x))
static mg_status expm1_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *one = mg_tmp(&sc, mg_scalar(1.0, n->out[0]->dtype));
  din[0] = mg_mul(dout[0], mg_tmp(&sc, mg_add(n->out[0], one)));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(EXPM1, expm1) = {
  .forward = mg_unary_forward,
  .info = {.name = "expm1", .kind = MG_OP_UNARY, .doc = "e^x - 1, accurate near 0",
           .fn.unary = mg_expm1},
  .kernel = {[MG_FLOAT32] = expm1_f32, [MG_FLOAT64] = expm1_f64},
  .saves = MG_SAVE_OUT(0), .backward = expm1_backward,
};
mg_tensor *mg_expm1 (mg_tensor *x) { return mg_unary_op(&expm1_op, x); }

/* erf: the error function.  grad: dx = dout * 2/sqrt(pi) * e^(-x^2) */
FLOAT_KERNELS(erf, ERF(x))
static mg_status erf_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0];
  mg_tensor *c = mg_tmp(&sc, mg_scalar(1.1283791670955126, x->dtype));     /* 2/sqrt(pi) */
  mg_tensor *e = mg_tmp(&sc, mg_exp(mg_tmp(&sc, mg_neg(mg_tmp(&sc, mg_mul(x, x))))));
  din[0] = mg_mul(dout[0], mg_tmp(&sc, mg_mul(c, e)));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(ERF, erf) = {
  .forward = mg_unary_forward,
  .info = {.name = "erf", .kind = MG_OP_UNARY, .doc = "the error function", .fn.unary = mg_erf},
  .kernel = {[MG_FLOAT32] = erf_f32, [MG_FLOAT64] = erf_f64},
  .saves = MG_SAVE_IN(0), .backward = erf_backward,
};
mg_tensor *mg_erf (mg_tensor *x) { return mg_unary_op(&erf_op, x); }

/* floor, ceil, round: integers stay as they are. Not differentiable (their
** results are constants to the tape, as sign and //: TensorFlow's None;
** the derivative is 0 wherever it exists) */
FLOAT_KERNELS(floor, FLOOR(x))
FLOAT_KERNELS(ceil, CEIL(x))
FLOAT_KERNELS(round, ROUND_EVEN(x))
KERNEL(same_i64, int64_t, int64_t, x)

MG_ROW(FLOOR, floor) = {
  .forward = mg_unary_forward,
  .info = {.name = "floor", .kind = MG_OP_UNARY,
           .doc = "the largest integer <= x (not differentiable)", .fn.unary = mg_floor},
  .kernel = {[MG_FLOAT32] = floor_f32, [MG_FLOAT64] = floor_f64, [MG_INT64] = same_i64},
};
mg_tensor *mg_floor (mg_tensor *x) { return mg_unary_op(&floor_op, x); }

MG_ROW(CEIL, ceil) = {
  .forward = mg_unary_forward,
  .info = {.name = "ceil", .kind = MG_OP_UNARY,
           .doc = "the smallest integer >= x (not differentiable)", .fn.unary = mg_ceil},
  .kernel = {[MG_FLOAT32] = ceil_f32, [MG_FLOAT64] = ceil_f64, [MG_INT64] = same_i64},
};
mg_tensor *mg_ceil (mg_tensor *x) { return mg_unary_op(&ceil_op, x); }

MG_ROW(ROUND, round) = {
  .forward = mg_unary_forward,
  .info = {.name = "round", .kind = MG_OP_UNARY,
           .doc = "the nearest integer, halves to even (not differentiable)", .fn.unary = mg_round},
  .kernel = {[MG_FLOAT32] = round_f32, [MG_FLOAT64] = round_f64, [MG_INT64] = same_i64},
};
mg_tensor *mg_round (mg_tensor *x) { return mg_unary_op(&round_op, x); }

/* }========================================================== */


/* {=========================== clamp ========================= */

/* min(max(x, lo), hi), NaN in any of the three winning; lo > hi gives hi */
static inline float clamp_f32 (float x, float lo, float hi) {
  x = (x >= lo || x != x) ? x : lo;
  return (x <= hi || x != x) ? x : hi;
}
static inline double clamp_f64 (double x, double lo, double hi) {
  x = (x >= lo || x != x) ? x : lo;
  return (x <= hi || x != x) ? x : hi;
}
static inline int64_t clamp_i64 (int64_t x, int64_t lo, int64_t hi) {
  x = x >= lo ? x : lo;
  return x <= hi ? x : hi;
}

/* one run: p = {out, x, lo, hi}; the common cases (bounds shared by the
** run, or all contiguous) are split out so they vectorise */
#define CLAMP_RUN(T, CL) do {                                                 \
    T *o = (T *)p[0];                                                         \
    const T *x = (const T *)p[1], *l = (const T *)p[2], *h = (const T *)p[3]; \
    if (s[1] == 1 && s[2] == 0 && s[3] == 0) {                                \
      T lo = l[0], hi = h[0];                                                 \
      for (int64_t i = 0; i < n; i++) o[i] = CL(x[i], lo, hi);                \
    } else if (s[1] == 1 && s[2] == 1 && s[3] == 1) {                         \
      for (int64_t i = 0; i < n; i++) o[i] = CL(x[i], l[i], h[i]);            \
    } else {                                                                  \
      for (int64_t i = 0; i < n; i++)                                         \
        o[i] = CL(x[i * s[1]], l[i * s[2]], h[i * s[3]]);                     \
    }                                                                         \
  } while (0)

static void clamp_run (int64_t n, char **p, const int64_t *s, void *ud) {
  switch (*(const mg_dtype *)ud) {
    case MG_FLOAT32: CLAMP_RUN(float, clamp_f32); break;
    case MG_FLOAT64: CLAMP_RUN(double, clamp_f64); break;
    default: CLAMP_RUN(int64_t, clamp_i64); break;
  }
}

/* clamp: out = min(max(x, lo), hi), all three broadcast.
** grad, as PyTorch: dx = dout where lo <= x <= hi (ties go to x);
** dlo = dout where x < lo and lo < hi; dhi = dout where x > hi or hi < lo
** (when lo > hi the result is hi, and so is the gradient's) */
static mg_status clamp_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0], *lo = n->in[1], *hi = n->in[2];
  mg_tensor *zero = mg_tmp(&sc, mg_scalar(0.0, dout[0]->dtype));
  mg_tensor *mask[3] = {NULL, NULL, NULL};
  if (n->needs[0])
    mask[0] = mg_tmp(&sc, mg_logical_and(mg_tmp(&sc, mg_greater_equal(x, lo)),
                                         mg_tmp(&sc, mg_less_equal(x, hi))));
  if (n->needs[1])
    mask[1] = mg_tmp(&sc, mg_logical_and(mg_tmp(&sc, mg_less(x, lo)), mg_tmp(&sc, mg_less(lo, hi))));
  if (n->needs[2])
    mask[2] = mg_tmp(&sc, mg_logical_or(mg_tmp(&sc, mg_greater(x, hi)), mg_tmp(&sc, mg_less(hi, lo))));
  for (int j = 0; j < 3; j++)
    if (n->needs[j])
      din[j] = mg_sum_to_shape(mg_tmp(&sc, mg_where(mask[j], dout[0], zero)), SHAPE_OF(n, j));
  mg_scope_end(&sc);
  return MG_OK;
}
static mg_status clamp_forward (mg_opcall *c);
MG_ROW(CLAMP, clamp) = {
  .forward = clamp_forward,
  .info = {.name = "clamp", .kind = MG_OP_OTHER,
           .doc = "clamp(x, lo, hi) = min(max(x, lo), hi), broadcasting; alias clip_by_value"},
  .saves = MG_SAVE_IN(0) | MG_SAVE_IN(1) | MG_SAVE_IN(2), .backward = clamp_backward,
};

mg_tensor *mg_clamp (mg_tensor *x, mg_tensor *lo, mg_tensor *hi) {
  MG_CHECK_ARG("mg_clamp", x, NULL);
  MG_CHECK_ARG("mg_clamp", lo, NULL);
  MG_CHECK_ARG("mg_clamp", hi, NULL);
  if (x->dtype == MG_BOOL) return mg_seterror("clamp: not defined for bool tensors"), NULL;
  if (mg_is_half(x->dtype) || mg_is_half(lo->dtype) || mg_is_half(hi->dtype)) {   /* in float32, as other ops */
    mg_tensor *x32 = mg_half_to_float32(x), *lo32 = mg_half_to_float32(lo), *hi32 = mg_half_to_float32(hi);
    mg_tensor *r = x32 && lo32 && hi32 ? mg_clamp(x32, lo32, hi32) : NULL;
    mg_tensor_release(x32);
    mg_tensor_release(lo32);
    mg_tensor_release(hi32);
    return r;
  }
  if (lo->dtype != x->dtype || hi->dtype != x->dtype)
    return mg_seterror("clamp: dtypes differ: x is %s, lo is %s, hi is %s", mg_dtype_name(x->dtype),
                       mg_dtype_name(lo->dtype), mg_dtype_name(hi->dtype)), NULL;
  int64_t s1[MG_MAX_DIMS], shape[MG_MAX_DIMS];
  int n1 = mg_broadcast_shapes("clamp", "and lo", x->shape, x->ndim, lo->shape, lo->ndim, s1);
  if (n1 < 0) return NULL;
  int nd = mg_broadcast_shapes("clamp", "and hi", s1, n1, hi->shape, hi->ndim, shape);
  if (nd < 0) return NULL;
  mg_tensor *in[3] = {x, lo, hi};
  mg_opcall c = MG_OPCALL(&clamp_op, 3, in, NULL, shape, nd, x->dtype);
  return mg_dispatch(&c);
}

static mg_status clamp_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0], *lo = c->in[1], *hi = c->in[2];
  mg_tensor *out = mg_empty(c->shape, c->ndim, x->dtype);
  if (out == NULL) return MG_ERR;
  mg_iter it;
  const mg_tensor *ops[4] = {out, x, lo, hi};
  mg_iter_init(&it, c->shape, c->ndim, 4, ops);
  char *base[4] = {mg_ptr(out), mg_ptr(x), mg_ptr(lo), mg_ptr(hi)};
  size_t esz = mg_dtype_size(x->dtype), sz[4] = {esz, esz, esz, esz};
  mg_dtype dt = x->dtype;
  mg_iter_run(&it, base, sz, clamp_run, &dt);
  c->out[0] = out;
  return MG_OK;
}

/* }========================================================== */


/* {================ reductions: the common path =============== */

#define EXPBUF 256               /* exponentials computed per batch */

/*
** A reduction kernel sees x (contiguous) as (outer, n, inner) around the
** reduced axis. A row (inner == 1) runs in LANES independent lanes, which
** the compiler vectorises without reassociating. Columns (inner > 1) are
** streamed row after row, as memory holds them, with each result's
** accumulators in scratch (up to 2 * outer * inner doubles); when there are fewer
** slices than threads, each slice's columns are cut into one chunk per
** thread. p is the op's parameter (var's divisor).
*/
typedef void (*red_kernel)(mg_dtype dt, const void *x, void *out, int64_t outer, int64_t n,
                           int64_t inner, double p, double *scratch);

/* column chunks per outer slice */
static int64_t column_chunks (int64_t outer, int64_t inner) {
  int64_t nt = mg_get_num_threads();
  if (outer >= nt || inner < 128) return 1;
  return inner / 64 < nt ? inner / 64 : nt;
}

/* runs the statements given for each chunk: columns b0 .. b0+w-1 of outer
** slice o */
#define FOR_CHUNKS(...) do {                                                  \
    int64_t nc_ = column_chunks(outer, inner), cw_ = (inner + nc_ - 1) / nc_; \
    MG_PARALLEL_FOR((outer * n * inner) >= MG_PARALLEL_MIN, ,                 \
    for (int64_t it_ = 0; it_ < outer * nc_; it_++) {                         \
      int64_t o = it_ / nc_, b0 = (it_ % nc_) * cw_;                          \
      int64_t w = inner - b0 < cw_ ? inner - b0 : cw_;                        \
      if (w > 0) { __VA_ARGS__ }                                              \
    });                                                                       \
  } while (0)

/* where a reduction runs: x as (outer, n, inner), the result's shape */
typedef struct rview {
  int axis;                      /* 0-based, or MG_ALL_AXES */
  int64_t outer, n, inner;
  int nd;
  int64_t shape[MG_MAX_DIMS];
} rview;

static int reduce_view (const char *fn, const mg_tensor *x, int axis, int keepdims, rview *v) {
  if (mg_check_computable(fn, x->dtype) != MG_OK) return -1;
  if (axis != MG_ALL_AXES && (axis = mg_check_axis(fn, axis, x->ndim)) < 0) return -1;
  v->axis = axis;
  v->outer = 1, v->n = x->numel, v->inner = 1;
  if (axis != MG_ALL_AXES) {
    v->n = x->shape[axis];
    for (int i = 0; i < axis; i++) v->outer *= x->shape[i];
    for (int i = axis + 1; i < x->ndim; i++) v->inner *= x->shape[i];
  }
  v->nd = 0;
  for (int i = 0; i < x->ndim; i++) {
    bool gone = axis == MG_ALL_AXES || i == axis;
    if (!gone) v->shape[v->nd++] = x->shape[i];
    else if (keepdims) v->shape[v->nd++] = 1;
  }
  return 0;
}

static void fill_value (mg_tensor *t, double v) {
  char *p = mg_ptr(t);
  for (int64_t i = 0; i < t->numel; i++) {
    if (t->dtype == MG_FLOAT32) ((float *)p)[i] = (float)v;
    else if (t->dtype == MG_FLOAT64) ((double *)p)[i] = v;
    else ((int64_t *)p)[i] = (int64_t)v;
  }
}

/* doubles for a kernel's column accumulators (NULL when rows need none) */
static mg_status scratch_for (const rview *v, int per_column, mg_tensor **sc) {
  *sc = NULL;
  if (v->inner == 1 || v->n == 0 || per_column == 0) return MG_OK;
  int64_t len = per_column * v->outer * v->inner;
  *sc = mg_empty(&len, 1, MG_FLOAT64);
  return *sc ? MG_OK : MG_ERR;
}

/* runs k over x as v says, with `acc` doubles of scratch per result for
** columns; an empty axis gives `empty` everywhere */
static mg_tensor *reduce_run (red_kernel k, int acc, mg_tensor *x, const rview *v, double p, double empty) {
  mg_tensor *out = mg_empty(v->shape, v->nd, x->dtype), *sc = NULL;
  mg_tensor *xc = out && scratch_for(v, acc, &sc) == MG_OK ? mg_contiguous(x) : NULL;
  if (xc == NULL) {
    mg_tensor_release(out);
    mg_tensor_release(sc);
    return NULL;
  }
  if (v->n == 0) fill_value(out, empty);
  else if (out->numel > 0)
    k(x->dtype, mg_ptr(xc), mg_ptr(out), v->outer, v->n, v->inner, p, sc ? (double *)mg_ptr(sc) : NULL);
  mg_tensor_release(xc);
  mg_tensor_release(sc);
  return out;
}

/* the reduced tensor t reshaped to keep the reduced axes as 1s, so that it
** broadcasts against the input */
static mg_tensor *kept (mg_node *n, mg_tensor *t, mg_scope *sc) {
  const mg_meta *m = &n->in_meta[0];
  int64_t shape[MG_MAX_DIMS];
  for (int i = 0; i < m->ndim; i++)
    shape[i] = (n->attr->axis == MG_ALL_AXES || i == n->attr->axis) ? 1 : m->shape[i];
  return mg_tmp(sc, mg_reshape(t, shape, m->ndim));
}

/* elements reduced into each result */
static int64_t reduced_count (const mg_node *n) {
  const mg_meta *m = &n->in_meta[0];
  int64_t c = 1;
  for (int i = 0; i < m->ndim; i++)
    if (n->attr->axis == MG_ALL_AXES || i == n->attr->axis) c *= m->shape[i];
  return c;
}

/* what a reduction's entry found, for its kernel (reduce_run's arguments) */
typedef struct reduction {
  red_kernel k;
  int acc;
  const rview *v;
  double p, empty;
} reduction;

static mg_status reduction_forward (mg_opcall *c) {
  const reduction *r = (const reduction *)c->local;
  c->out[0] = reduce_run(r->k, r->acc, c->in[0], r->v, r->p, r->empty);
  return c->out[0] ? MG_OK : MG_ERR;
}

/* runs reduction op over x as v says: the kernel k (with p, and acc
** doubles of scratch per column; `empty` for an empty axis); the node
** keeps `attr_f` (ddof, ord) */
static mg_tensor *reduction_op (const mg_opdef *op, mg_tensor *x, const rview *v, int keepdims, double attr_f,
                                red_kernel k, int acc, double p, double empty) {
  mg_attr attr = {0};
  attr.axis = v->axis;
  attr.keepdims = keepdims;
  attr.f = attr_f;
  reduction r = {k, acc, v, p, empty};
  mg_opcall c = MG_OPCALL(op, 1, &x, &attr, v->shape, v->nd, x->dtype);
  c.local = &r;
  return mg_dispatch(&c);
}

/* int64 and bool reduce as float64, as mean does */
#define AS_FLOAT64(x, CALL) RETRY_AS(x, (x)->dtype == MG_INT64 || (x)->dtype == MG_BOOL, MG_FLOAT64, CALL)

/* }========================================================== */


/* {=========================== prod ========================== */

#define PROD_BODY(T, ACC) do {                                                \
    const T *X = (const T *)xs; T *Y = (T *)ys;                               \
    if (inner == 1) {                                                         \
      MG_PARALLEL_FOR((outer * n) >= MG_PARALLEL_MIN, ,                       \
      for (int64_t o = 0; o < outer; o++) {                                   \
        const T *r = X + o * n;                                               \
        ACC lane[LANES];                                                      \
        for (int l = 0; l < LANES; l++) lane[l] = 1;                          \
        int64_t i = 0;                                                        \
        for (; i + LANES <= n; i += LANES)                                    \
          for (int l = 0; l < LANES; l++) lane[l] *= (ACC)r[i + l];           \
        for (; i < n; i++) lane[0] *= (ACC)r[i];                              \
        ACC t = 1;                                                            \
        for (int l = 0; l < LANES; l++) t *= lane[l];                         \
        Y[o] = (T)t;                                                          \
      });                                                                     \
    } else FOR_CHUNKS(                                                        \
      ACC *acc = (ACC *)scratch + o * inner + b0;                             \
      for (int64_t i = 0; i < w; i++) acc[i] = 1;                             \
      for (int64_t k = 0; k < n; k++) {                                       \
        const T *r = X + (o * n + k) * inner + b0;                            \
        for (int64_t i = 0; i < w; i++) acc[i] *= (ACC)r[i];                  \
      }                                                                       \
      for (int64_t i = 0; i < w; i++) Y[o * inner + b0 + i] = (T)acc[i];      \
    );                                                                        \
  } while (0)

static void prod_kernel (mg_dtype dt, const void *xs, void *ys, int64_t outer, int64_t n,
                         int64_t inner, double p, double *scratch) {
  MG_UNUSED(p);
  if (dt == MG_FLOAT32) PROD_BODY(float, double);
  else if (dt == MG_FLOAT64) PROD_BODY(double, double);
  else PROD_BODY(int64_t, uint64_t);          /* wraps, as NumPy's */
}

/*
** prod: out = the product over axis (1 over an empty one).
** grad: dx_i = dout * (the product of the others), without dividing by a
** zero: with x1 = x with its zeros made 1, p1 = prod(x1) and pz = prod of
** the zeros (0, or 1 when there are none),
**   at a nonzero x_i:  p1 / x1_i * pz
**   at a zero x_i:     p1 if it is its slice's only zero, else 0.
** Both are products of the others as functions of x, so the second
** derivative is right too where a slice holds at most one zero (as PyTorch).
*/
static mg_status prod_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0];
  int axis = n->attr->axis;
  mg_tensor *zero = mg_tmp(&sc, mg_scalar(0.0, x->dtype)), *one = mg_tmp(&sc, mg_scalar(1.0, x->dtype));
  mg_tensor *z = mg_tmp(&sc, mg_equal(x, zero));
  mg_tensor *x1 = mg_tmp(&sc, mg_where(z, one, x));
  mg_tensor *p1 = mg_tmp(&sc, mg_prod(x1, axis, 1));
  mg_tensor *pz = mg_tmp(&sc, mg_prod(mg_tmp(&sc, mg_where(z, x, one)), axis, 1));
  mg_tensor *count = mg_tmp(&sc, mg_sum(mg_tmp(&sc, mg_cast(z, x->dtype)), axis, 1));
  mg_tensor *alone = mg_tmp(&sc, mg_equal(count, one));
  mg_tensor *at_nonzero = mg_tmp(&sc, mg_mul(mg_tmp(&sc, mg_div(p1, x1)), pz));
  mg_tensor *at_zero = mg_tmp(&sc, mg_where(alone, p1, zero));
  mg_tensor *others = mg_tmp(&sc, mg_where(z, at_zero, at_nonzero));
  din[0] = mg_mul(kept(n, dout[0], &sc), others);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(PROD, prod) = {
  .forward = reduction_forward,
  .info = {.name = "prod", .kind = MG_OP_REDUCE,
           .doc = "the product over all axes, an axis, or a list of axes (zeros are fine for the gradient)",
           .fn.reduce = mg_prod},
  .saves = MG_SAVE_IN(0), .backward = prod_backward,
};

mg_tensor *mg_prod (mg_tensor *x, int axis, int keepdims) {
  MG_CHECK_ARG("mg_prod", x, NULL);
  HALF_AS_FLOAT32(x, mg_prod(x, axis, keepdims));
  RETRY_AS(x, x->dtype == MG_BOOL, MG_INT64, mg_prod(x, axis, keepdims));   /* counts as int64, as sum does */
  rview v;
  if (reduce_view("prod", x, axis, keepdims, &v) < 0) return NULL;
  return reduction_op(&prod_op, x, &v, keepdims, 0, prod_kernel, 1, 0, 1);
}

/* }========================================================== */


/* {======================== logsumexp ======================== */

/* s = m where m is finite, else 0: all -inf gives -inf, a +inf gives +inf */
#define FINITE_OR_0(m) ((m) - (m) == 0 ? (m) : 0)

#define LSE_BODY(T) do {                                                      \
    const T *X = (const T *)xs; T *Y = (T *)ys;                               \
    if (inner == 1) {                                                         \
      MG_PARALLEL_FOR((outer * n) >= MG_PARALLEL_MIN, ,                       \
      for (int64_t o = 0; o < outer; o++) {                                   \
        const T *r = X + o * n;                                               \
        T lm[LANES];                                                          \
        for (int l = 0; l < LANES; l++) lm[l] = -INFINITY;                    \
        int64_t i = 0;                                                        \
        for (; i + LANES <= n; i += LANES)                                    \
          for (int l = 0; l < LANES; l++) lm[l] = r[i + l] > lm[l] ? r[i + l] : lm[l]; \
        for (; i < n; i++) lm[0] = r[i] > lm[0] ? r[i] : lm[0];               \
        T m = -INFINITY;                                                      \
        for (int l = 0; l < LANES; l++) m = lm[l] > m ? lm[l] : m;            \
        m = FINITE_OR_0(m);                                                   \
        double ls[LANES] = {0};                                               \
        T e[EXPBUF];                                                          \
        for (int64_t i0 = 0; i0 < n; i0 += EXPBUF) {                          \
          int64_t len = n - i0 < EXPBUF ? n - i0 : EXPBUF, j = 0;             \
          for (int64_t q = 0; q < len; q++) e[q] = EXP((T)(r[i0 + q] - m));   \
          for (; j + LANES <= len; j += LANES)                                \
            for (int l = 0; l < LANES; l++) ls[l] += (double)e[j + l];        \
          for (; j < len; j++) ls[0] += (double)e[j];                         \
        }                                                                     \
        double t = 0;                                                         \
        for (int l = 0; l < LANES; l++) t += ls[l];                           \
        Y[o] = (T)((double)m + log(t));                                       \
      });                                                                     \
    } else FOR_CHUNKS(                                                        \
      T *mx = Y + o * inner + b0;              /* the maxima, then the result */ \
      double *acc = scratch + o * inner + b0;                                 \
      for (int64_t i = 0; i < w; i++) { mx[i] = -INFINITY; acc[i] = 0; }      \
      for (int64_t k = 0; k < n; k++) {                                       \
        const T *r = X + (o * n + k) * inner + b0;                            \
        for (int64_t i = 0; i < w; i++) mx[i] = r[i] > mx[i] ? r[i] : mx[i];   \
      }                                                                       \
      for (int64_t i = 0; i < w; i++) mx[i] = FINITE_OR_0(mx[i]);             \
      for (int64_t k = 0; k < n; k++) {                                       \
        const T *r = X + (o * n + k) * inner + b0;                            \
        for (int64_t i = 0; i < w; i++) acc[i] += (double)EXP((T)(r[i] - mx[i])); \
      }                                                                       \
      for (int64_t i = 0; i < w; i++) mx[i] = (T)((double)mx[i] + log(acc[i])); \
    );                                                                          \
  } while (0)

static void lse_kernel (mg_dtype dt, const void *xs, void *ys, int64_t outer, int64_t n,
                        int64_t inner, double p, double *scratch) {
  MG_UNUSED(p);
  if (dt == MG_FLOAT32) LSE_BODY(float);
  else LSE_BODY(double);
}

/* logsumexp: out = log(sum(e^x)) over axis, shifted by the maximum so that
** it neither overflows nor underflows (-inf over an empty axis).
** grad: dx = dout * e^(x - out), the softmax */
static mg_status lse_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *sm = mg_tmp(&sc, mg_exp(mg_tmp(&sc, mg_sub(n->in[0], kept(n, n->out[0], &sc)))));
  din[0] = mg_mul(kept(n, dout[0], &sc), sm);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(LOGSUMEXP, logsumexp) = {
  .forward = reduction_forward,
  .info = {.name = "logsumexp", .kind = MG_OP_REDUCE,
           .doc = "log(sum(e^x)), computed stably (int64 and bool give float64)",
           .fn.reduce = mg_logsumexp},
  .saves = MG_SAVE_IN(0) | MG_SAVE_OUT(0), .backward = lse_backward,
};

mg_tensor *mg_logsumexp (mg_tensor *x, int axis, int keepdims) {
  MG_CHECK_ARG("mg_logsumexp", x, NULL);
  HALF_AS_FLOAT32(x, mg_logsumexp(x, axis, keepdims));
  AS_FLOAT64(x, mg_logsumexp(x, axis, keepdims));
  rview v;
  if (reduce_view("logsumexp", x, axis, keepdims, &v) < 0) return NULL;
  return reduction_op(&logsumexp_op, x, &v, keepdims, 0, lse_kernel, 1, 0, -INFINITY);
}

/* }========================================================== */


/* {======================== var and std ====================== */

/* two passes in double: the mean, then the squared deviations; p is the
** divisor max(n - ddof, 0); std takes the square root */
#define MOMENT_BODY(T, ROOT) do {                                             \
    const T *X = (const T *)xs; T *Y = (T *)ys;                               \
    if (inner == 1) {                                                         \
      MG_PARALLEL_FOR((outer * n) >= MG_PARALLEL_MIN, ,                       \
      for (int64_t o = 0; o < outer; o++) {                                   \
        const T *r = X + o * n;                                               \
        double ls[LANES] = {0};                                               \
        int64_t i = 0;                                                        \
        for (; i + LANES <= n; i += LANES)                                    \
          for (int l = 0; l < LANES; l++) ls[l] += (double)r[i + l];          \
        for (; i < n; i++) ls[0] += (double)r[i];                             \
        double mean = 0;                                                      \
        for (int l = 0; l < LANES; l++) mean += ls[l];                        \
        mean /= (double)n;                                                    \
        for (int l = 0; l < LANES; l++) ls[l] = 0;                            \
        for (i = 0; i + LANES <= n; i += LANES)                               \
          for (int l = 0; l < LANES; l++) {                                   \
            double d = (double)r[i + l] - mean; ls[l] += d * d;               \
          }                                                                   \
        for (; i < n; i++) { double d = (double)r[i] - mean; ls[0] += d * d; } \
        double m2 = 0;                                                        \
        for (int l = 0; l < LANES; l++) m2 += ls[l];                          \
        Y[o] = (T)ROOT(m2 / p);                                               \
      });                                                                     \
    } else FOR_CHUNKS(                                                        \
      double *mean = scratch + o * inner + b0;                                \
      double *m2 = scratch + (outer + o) * inner + b0;                        \
      for (int64_t i = 0; i < w; i++) { mean[i] = 0; m2[i] = 0; }             \
      for (int64_t k = 0; k < n; k++) {                                       \
        const T *r = X + (o * n + k) * inner + b0;                            \
        for (int64_t i = 0; i < w; i++) mean[i] += (double)r[i];              \
      }                                                                       \
      for (int64_t i = 0; i < w; i++) mean[i] /= (double)n;                   \
      for (int64_t k = 0; k < n; k++) {                                       \
        const T *r = X + (o * n + k) * inner + b0;                            \
        for (int64_t i = 0; i < w; i++) {                                     \
          double d = (double)r[i] - mean[i]; m2[i] += d * d;                  \
        }                                                                     \
      }                                                                       \
      for (int64_t i = 0; i < w; i++) Y[o * inner + b0 + i] = (T)ROOT(m2[i] / p); \
    );                                                                            \
  } while (0)

#define NO_ROOT(v) (v)

static void var_kernel (mg_dtype dt, const void *xs, void *ys, int64_t outer, int64_t n,
                        int64_t inner, double p, double *scratch) {
  if (dt == MG_FLOAT32) MOMENT_BODY(float, NO_ROOT);
  else MOMENT_BODY(double, NO_ROOT);
}

static void std_kernel (mg_dtype dt, const void *xs, void *ys, int64_t outer, int64_t n,
                        int64_t inner, double p, double *scratch) {
  if (dt == MG_FLOAT32) MOMENT_BODY(float, sqrt);
  else MOMENT_BODY(double, sqrt);
}

/* the divisor n - ddof, or 0 (then the result is inf, or NaN for 0/0, as NumPy) */
static double moment_divisor (const mg_node *n) {
  double d = (double)reduced_count(n) - n->attr->f;
  return d > 0 ? d : 0;
}

/* var: out = sum((x - mean)^2) / (n - ddof).
** grad: dx = dout * 2 (x - mean) / (n - ddof) */
static mg_status var_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0];
  mg_tensor *dev = mg_tmp(&sc, mg_sub(x, mg_tmp(&sc, mg_mean(x, n->attr->axis, 1))));
  mg_tensor *c = mg_tmp(&sc, mg_scalar(2.0 / moment_divisor(n), x->dtype));
  din[0] = mg_mul(mg_tmp(&sc, mg_mul(kept(n, dout[0], &sc), c)), dev);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(VAR, var) = {
  .forward = reduction_forward,
  .info = {.name = "var", .kind = MG_OP_OTHER,
           .doc = "the variance, sum((x - mean)^2) / (n - ddof), ddof 0 by default (as NumPy)"},
  .saves = MG_SAVE_IN(0), .backward = var_backward,
};

/* std: out = sqrt(var).  grad: dx = dout * (x - mean) / ((n - ddof) * out),
** 0 where out = 0 (a constant slice), as PyTorch */
static mg_status std_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0], *y = kept(n, n->out[0], &sc);
  mg_tensor *zero = mg_tmp(&sc, mg_scalar(0.0, x->dtype)), *one = mg_tmp(&sc, mg_scalar(1.0, x->dtype));
  mg_tensor *flat = mg_tmp(&sc, mg_equal(y, zero));
  mg_tensor *safe = mg_tmp(&sc, mg_where(flat, one, y));
  mg_tensor *c = mg_tmp(&sc, mg_scalar(1.0 / moment_divisor(n), x->dtype));
  mg_tensor *dev = mg_tmp(&sc, mg_sub(x, mg_tmp(&sc, mg_mean(x, n->attr->axis, 1))));
  mg_tensor *g = mg_tmp(&sc, mg_mul(dev, mg_tmp(&sc, mg_div(mg_tmp(&sc, mg_mul(kept(n, dout[0], &sc), c)), safe))));
  din[0] = mg_where(flat, zero, g);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(STD, std) = {
  .forward = reduction_forward,
  .info = {.name = "std", .kind = MG_OP_OTHER,
           .doc = "the standard deviation, sqrt(var) (ddof 0 by default; gradient 0 where it is 0)"},
  .saves = MG_SAVE_IN(0) | MG_SAVE_OUT(0), .backward = std_backward,
};

static mg_tensor *moment (const mg_opdef *op, red_kernel k, mg_tensor *x, int axis, int keepdims,
                          double ddof) {
  const char *fn = op->info.name;
  if (!(ddof >= 0) || isinf(ddof))
    return mg_seterror("%s: ddof must be a finite number >= 0, got %g", fn, ddof), NULL;
  rview v;
  if (reduce_view(fn, x, axis, keepdims, &v) < 0) return NULL;
  double div = (double)v.n - ddof;
  return reduction_op(op, x, &v, keepdims, ddof, k, 2, div > 0 ? div : 0, NAN);
}

mg_tensor *mg_var (mg_tensor *x, int axis, int keepdims, double ddof) {
  MG_CHECK_ARG("mg_var", x, NULL);
  HALF_AS_FLOAT32(x, mg_var(x, axis, keepdims, ddof));
  AS_FLOAT64(x, mg_var(x, axis, keepdims, ddof));
  return moment(&var_op, var_kernel, x, axis, keepdims, ddof);
}

mg_tensor *mg_std (mg_tensor *x, int axis, int keepdims, double ddof) {
  MG_CHECK_ARG("mg_std", x, NULL);
  HALF_AS_FLOAT32(x, mg_std(x, axis, keepdims, ddof));
  AS_FLOAT64(x, mg_std(x, axis, keepdims, ddof));
  return moment(&std_op, std_kernel, x, axis, keepdims, ddof);
}

/* }========================================================== */


/* {=========================== norm ========================== */

#define NORM_SUM_BODY(T, TERM, ROOT) do {                                     \
    const T *X = (const T *)xs; T *Y = (T *)ys;                               \
    if (inner == 1) {                                                         \
      MG_PARALLEL_FOR((outer * n) >= MG_PARALLEL_MIN, ,                       \
      for (int64_t o = 0; o < outer; o++) {                                   \
        const T *r = X + o * n;                                               \
        double ls[LANES] = {0};                                               \
        int64_t i = 0;                                                        \
        for (; i + LANES <= n; i += LANES)                                    \
          for (int l = 0; l < LANES; l++) { double v = (double)r[i + l]; ls[l] += TERM(v); } \
        for (; i < n; i++) { double v = (double)r[i]; ls[0] += TERM(v); }    \
        double t = 0;                                                         \
        for (int l = 0; l < LANES; l++) t += ls[l];                           \
        Y[o] = (T)ROOT(t);                                                    \
      });                                                                     \
    } else FOR_CHUNKS(                                                        \
      double *acc = scratch + o * inner + b0;                                 \
      for (int64_t i = 0; i < w; i++) acc[i] = 0;                             \
      for (int64_t k = 0; k < n; k++) {                                       \
        const T *r = X + (o * n + k) * inner + b0;                            \
        for (int64_t i = 0; i < w; i++) { double v = (double)r[i]; acc[i] += TERM(v); } \
      }                                                                       \
      for (int64_t i = 0; i < w; i++) Y[o * inner + b0 + i] = (T)ROOT(acc[i]); \
    );                                                                         \
  } while (0)

/* the largest |x|; NaN wins */
#define NORM_MAX_BODY(T) do {                                                 \
    const T *X = (const T *)xs; T *Y = (T *)ys;                               \
    if (inner == 1) {                                                         \
      MG_PARALLEL_FOR((outer * n) >= MG_PARALLEL_MIN, ,                       \
      for (int64_t o = 0; o < outer; o++) {                                   \
        const T *r = X + o * n;                                               \
        T lm[LANES] = {0};                                                    \
        int64_t i = 0;                                                        \
        for (; i + LANES <= n; i += LANES)                                    \
          for (int l = 0; l < LANES; l++) {                                   \
            T a = FABS(r[i + l]); lm[l] = (a > lm[l] || a != a) ? a : lm[l];  \
          }                                                                   \
        for (; i < n; i++) { T a = FABS(r[i]); lm[0] = (a > lm[0] || a != a) ? a : lm[0]; } \
        T m = 0;                                                              \
        for (int l = 0; l < LANES; l++) m = (lm[l] > m || lm[l] != lm[l]) ? lm[l] : m; \
        Y[o] = m;                                                             \
      });                                                                     \
    } else FOR_CHUNKS(                                                        \
      T *acc = Y + o * inner + b0;                                            \
      for (int64_t i = 0; i < w; i++) acc[i] = 0;                             \
      for (int64_t k = 0; k < n; k++) {                                       \
        const T *r = X + (o * n + k) * inner + b0;                            \
        for (int64_t i = 0; i < w; i++) {                                     \
          T a = FABS(r[i]); acc[i] = (a > acc[i] || a != a) ? a : acc[i];     \
        }                                                                     \
      }                                                                       \
    );                                                                        \
  } while (0)

#define ABS_TERM(v) fabs(v)
#define SQ_TERM(v) ((v) * (v))

static void norm1_kernel (mg_dtype dt, const void *xs, void *ys, int64_t outer, int64_t n,
                          int64_t inner, double p, double *scratch) {
  MG_UNUSED(p);
  if (dt == MG_FLOAT32) NORM_SUM_BODY(float, ABS_TERM, NO_ROOT);
  else NORM_SUM_BODY(double, ABS_TERM, NO_ROOT);
}

static void norm2_kernel (mg_dtype dt, const void *xs, void *ys, int64_t outer, int64_t n,
                          int64_t inner, double p, double *scratch) {
  MG_UNUSED(p);
  if (dt == MG_FLOAT32) NORM_SUM_BODY(float, SQ_TERM, sqrt);
  else NORM_SUM_BODY(double, SQ_TERM, sqrt);
}

static void norm_inf_kernel (mg_dtype dt, const void *xs, void *ys, int64_t outer, int64_t n,
                             int64_t inner, double p, double *scratch) {
  MG_UNUSED(p);
  MG_UNUSED(scratch);
  if (dt == MG_FLOAT32) NORM_MAX_BODY(float);
  else NORM_MAX_BODY(double);
}

/*
** norm: the vector norm over axis, attr.f = ord:
**   1:   sum |x|            grad: dout * sign(x)
**   2:   sqrt(sum x^2)      grad: dout * x / out, 0 where out = 0 (PyTorch's subgradient)
**   inf: max |x|            grad: dout * sign(x), shared evenly among the ties
** The inverse of out is taken with zeros made 1 first, so no NaN appears
** even in the branch that where() discards (its gradient would be NaN).
*/
static mg_status norm_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0], *d = kept(n, dout[0], &sc);
  double ord = n->attr->f;
  if (ord == 1) {
    din[0] = mg_mul(d, mg_tmp(&sc, mg_sign(x)));
  } else if (ord == 2) {
    mg_tensor *y = kept(n, n->out[0], &sc);
    mg_tensor *zero = mg_tmp(&sc, mg_scalar(0.0, x->dtype)), *one = mg_tmp(&sc, mg_scalar(1.0, x->dtype));
    mg_tensor *flat = mg_tmp(&sc, mg_equal(y, zero));
    mg_tensor *safe = mg_tmp(&sc, mg_where(flat, one, y));
    mg_tensor *g = mg_tmp(&sc, mg_mul(x, mg_tmp(&sc, mg_div(d, safe))));
    din[0] = mg_where(flat, zero, g);
  } else {
    mg_tensor *y = kept(n, n->out[0], &sc);
    mg_tensor *hit = mg_tmp(&sc, mg_cast(mg_tmp(&sc, mg_equal(mg_tmp(&sc, mg_abs(x)), y)), x->dtype));
    mg_tensor *count = mg_tmp(&sc, mg_sum(hit, n->attr->axis, 1));
    mg_tensor *share = mg_tmp(&sc, mg_div(d, count));
    din[0] = mg_mul(mg_tmp(&sc, mg_mul(hit, mg_tmp(&sc, mg_sign(x)))), share);
  }
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(NORM, norm) = {
  .forward = reduction_forward,
  .info = {.name = "norm", .kind = MG_OP_OTHER,
           .doc = "the vector norm, ord 2 (default), 1 or inf (gradient 0 at 0)"},
  .saves = MG_SAVE_IN(0) | MG_SAVE_OUT(0), .backward = norm_backward,
};

mg_tensor *mg_norm (mg_tensor *x, int axis, int keepdims, double ord) {
  MG_CHECK_ARG("mg_norm", x, NULL);
  if (ord != 1 && ord != 2 && ord != INFINITY)
    return mg_seterror("norm: ord must be 1, 2 or inf, got %g", ord), NULL;
  HALF_AS_FLOAT32(x, mg_norm(x, axis, keepdims, ord));
  AS_FLOAT64(x, mg_norm(x, axis, keepdims, ord));
  rview v;
  if (reduce_view("norm", x, axis, keepdims, &v) < 0) return NULL;
  if (v.n == 0 && ord == INFINITY)
    return mg_seterror("norm: the inf-norm of an empty axis is not defined (a max of nothing)"), NULL;
  red_kernel k = ord == 1 ? norm1_kernel : ord == 2 ? norm2_kernel : norm_inf_kernel;
  return reduction_op(&norm_op, x, &v, keepdims, ord, k, ord == INFINITY ? 0 : 1, 0, 0);
}

/* }========================================================== */


/* {========================== cumsum ========================= */

/* y[k] = sum of x[j] for j <= k (exclusive: j < k; reverse: j >= k, j > k)
** along the middle axis; rows run 4 at a time so the additions overlap */
#define CUMSUM_BODY(T, ACC) do {                                              \
    const T *X = (const T *)xs; T *Y = (T *)ys;                               \
    if (inner == 1) {                                                         \
      int64_t groups = (outer + 3) / 4;                                       \
      MG_PARALLEL_FOR((outer * n) >= MG_PARALLEL_MIN, ,                       \
      for (int64_t g = 0; g < groups; g++) {                                  \
        int64_t o0 = g * 4, rows = outer - o0 < 4 ? outer - o0 : 4;           \
        ACC s[4] = {0, 0, 0, 0};                                              \
        const T *xr[4]; T *yr[4];                                             \
        for (int q = 0; q < 4; q++) {                                         \
          int64_t o = o0 + (q < rows ? q : 0);                                \
          xr[q] = X + o * n; yr[q] = Y + o * n;                               \
        }                                                                     \
        for (int64_t k = 0; k < n; k++) {                                     \
          int64_t j = reverse ? n - 1 - k : k;                                \
          for (int q = 0; q < 4; q++) {                                       \
            ACC v = (ACC)xr[q][j];                                            \
            if (exclusive) { yr[q][j] = (T)s[q]; s[q] += v; }                 \
            else { s[q] += v; yr[q][j] = (T)s[q]; }                           \
          }                                                                   \
        }                                                                     \
      });                                                                     \
    } else FOR_CHUNKS(                                                        \
      ACC *acc = (ACC *)scratch + o * inner + b0;                             \
      for (int64_t i = 0; i < w; i++) acc[i] = 0;                             \
      for (int64_t k = 0; k < n; k++) {                                       \
        int64_t j = reverse ? n - 1 - k : k;                                  \
        const T *r = X + (o * n + j) * inner + b0;                            \
        T *y = Y + (o * n + j) * inner + b0;                                  \
        if (exclusive)                                                        \
          for (int64_t i = 0; i < w; i++) { y[i] = (T)acc[i]; acc[i] += (ACC)r[i]; } \
        else                                                                  \
          for (int64_t i = 0; i < w; i++) { acc[i] += (ACC)r[i]; y[i] = (T)acc[i]; } \
      }                                                                       \
    );                                                                        \
  } while (0)

static void cumsum_kernel (mg_dtype dt, const void *xs, void *ys, int64_t outer, int64_t n,
                           int64_t inner, bool exclusive, bool reverse, double *scratch) {
  if (dt == MG_FLOAT32) CUMSUM_BODY(float, double);
  else if (dt == MG_FLOAT64) CUMSUM_BODY(double, double);
  else CUMSUM_BODY(int64_t, uint64_t);        /* wraps, as sum */
}

/* cumsum: running sums along axis (all axes: of the flattened tensor,
** 1-D, as NumPy); attr.a = {exclusive, reverse}.
** grad: dx = cumsum(dout) the other way round (reverse flipped), reshaped
** to x's shape */
static mg_status cumsum_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  int axis = n->attr->axis == MG_ALL_AXES ? 0 : n->attr->axis;
  mg_tensor *g = mg_tmp(&sc, mg_cumsum(dout[0], axis, (int)n->attr->a[0], !n->attr->a[1]));
  din[0] = mg_reshape(g, SHAPE_OF(n, 0));
  mg_scope_end(&sc);
  return MG_OK;
}
static mg_status cumsum_forward (mg_opcall *c);
MG_ROW(CUMSUM, cumsum) = {
  .forward = cumsum_forward,
  .info = {.name = "cumsum", .kind = MG_OP_OTHER,
           .doc = "running sums along an axis (exclusive and reverse as TensorFlow's)"},
  .backward = cumsum_backward,
};

mg_tensor *mg_cumsum (mg_tensor *x, int axis, int exclusive, int reverse) {
  MG_CHECK_ARG("mg_cumsum", x, NULL);
  HALF_AS_FLOAT32(x, mg_cumsum(x, axis, exclusive, reverse));
  RETRY_AS(x, x->dtype == MG_BOOL, MG_INT64, mg_cumsum(x, axis, exclusive, reverse));   /* counts as int64, as sum does */
  rview v;
  if (reduce_view("cumsum", x, axis, 0, &v) < 0) return NULL;
  int64_t flat[1] = {x->numel};
  mg_attr attr = {0};
  attr.axis = v.axis;
  attr.a[0] = exclusive != 0;
  attr.a[1] = reverse != 0;
  mg_opcall c = v.axis == MG_ALL_AXES ? MG_OPCALL(&cumsum_op, 1, &x, &attr, flat, 1, x->dtype)
                                      : MG_OPCALL(&cumsum_op, 1, &x, &attr, x->shape, x->ndim, x->dtype);
  c.local = &v;
  return mg_dispatch(&c);
}

static mg_status cumsum_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  const rview *vp = (const rview *)c->local, v = *vp;
  bool exclusive = c->attr->a[0], reverse = c->attr->a[1];
  mg_tensor *out = mg_empty(c->shape, c->ndim, x->dtype);
  mg_tensor *sc = NULL;
  mg_tensor *xc = out && scratch_for(&v, 1, &sc) == MG_OK ? mg_contiguous(x) : NULL;
  if (xc == NULL) {
    mg_tensor_release(out);
    mg_tensor_release(sc);
    return MG_ERR;
  }
  if (x->numel > 0)
    cumsum_kernel(x->dtype, mg_ptr(xc), mg_ptr(out), v.outer, v.n, v.inner, exclusive, reverse,
                  sc ? (double *)mg_ptr(sc) : NULL);
  mg_tensor_release(xc);
  mg_tensor_release(sc);
  c->out[0] = out;
  return MG_OK;
}

/* }========================================================== */


MG_FAMILY(mg_maths_ops, MATHS_OPS, MATHS__COUNT);

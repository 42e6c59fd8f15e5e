/*
** reduce.c — sum, max, min (and mean, argmax, argmin) over one axis or all.
**
** A reduction sees its input as (outer, n, inner) after making it
** contiguous: inner == 1 sums contiguous rows in 16 independent lanes (so
** the compiler vectorises without reassociating), inner > 1 adds whole rows
** into the output. float32 rows accumulate in double lanes, which keeps
** long sums accurate at no cost a memory-bound loop would notice.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <omp.h>

#include "ops/op.h"
#include "lanes.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define REDUCE_OPS(X) \
  X(SUM, sum) X(MEAN, mean) X(MAX, max) X(MIN, min) X(ARGMAX, argmax) X(ARGMIN, argmin)
enum { REDUCE_OPS(MG_ROW_ENUM) REDUCE__COUNT };

typedef enum redop { R_SUM, R_MAX, R_MIN, R_ARGMAX, R_ARGMIN } redop;

#define BLOCK 4096

#define AS_IS(v) (v)

/* sum of n contiguous values, each read as V(x[i]) */
#define ROW_SUM(T, ACC, V) do {                                            \
    ACC total = 0;                                                         \
    for (int64_t b0 = 0; b0 < n; b0 += BLOCK) {                            \
      int64_t e = b0 + BLOCK < n ? b0 + BLOCK : n, i = b0;                 \
      ACC lane[LANES] = {0};                                               \
      for (; i + LANES <= e; i += LANES)                                   \
        for (int l = 0; l < LANES; l++) lane[l] += V(x[i + l]);            \
      for (; i < e; i++) lane[0] += V(x[i]);                               \
      ACC s = 0;                                                           \
      for (int l = 0; l < LANES; l++) s += lane[l];                        \
      total += s;                                                          \
    }                                                                      \
    *out = (T)total;                                                       \
  } while (0)

/* out[i] (inner values, T) = the sum over k of V(x[k*inner + i]) (x of X), each
** column's rows added in order, so any team size gives the same bits. Each
** thread takes a range of columns (whole blocks of 16) and walks the rows
** over it: a bias' gradient sums 100,000 rows, once serial */
#define COL_BLOCK 16
#define COLS_SUM(T, X, V, ADD) do {                                        \
    int64_t nblocks = (inner + COL_BLOCK - 1) / COL_BLOCK;                 \
    bool par = n * inner >= MG_PARALLEL_MIN && nblocks > 1;                \
    int64_t parts = par ? omp_get_max_threads() : 1;                       \
    if (parts > nblocks) parts = nblocks;                                  \
    MG_PARALLEL_FOR(par, ,                                                 \
    for (int64_t t = 0; t < parts; t++) {                                  \
      int64_t i0 = nblocks * t / parts * COL_BLOCK;                        \
      int64_t i1 = nblocks * (t + 1) / parts * COL_BLOCK;                  \
      if (i1 > inner) i1 = inner;                                          \
      int64_t full = i1 - i0 <= 4 * COL_BLOCK ? i0 + (i1 - i0) / COL_BLOCK * COL_BLOCK : i0; \
      for (int64_t b = i0; b < full; b += COL_BLOCK) {   /* a narrow range: 16 sums in registers */ \
        T acc[COL_BLOCK] = {0};                                            \
        for (int64_t k = 0; k < n; k++) {                                  \
          const X *row = x + k * inner + b;                                \
          for (int c = 0; c < COL_BLOCK; c++) acc[c] = ADD(acc[c], (T)V(row[c])); \
        }                                                                  \
        for (int c = 0; c < COL_BLOCK; c++) out[b + c] = acc[c];           \
      }                                                                    \
      for (int64_t i = full; i < i1; i++) out[i] = 0;                      \
      for (int64_t k = 0; full < i1 && k < n; k++) {                       \
        const X *row = x + k * inner;                                      \
        for (int64_t i = full; i < i1; i++) out[i] = ADD(out[i], (T)V(row[i])); \
      }                                                                    \
    });                                                                    \
  } while (0)

/* out[i] (inner values) = reduce over k of x[k*inner + i] */
#define COLS(T, INIT, STEP) do {                                           \
    for (int64_t i = 0; i < inner; i++) out[i] = INIT;                     \
    for (int64_t k = 0; k < n; k++) {                                      \
      const T *row = x + k * inner;                                        \
      for (int64_t i = 0; i < inner; i++) { T v = row[i], m = out[i]; out[i] = (STEP); } \
    }                                                                      \
  } while (0)

#define ROW_EXTREME(T, BETTER) do {                                        \
    T m = x[0];                                                            \
    for (int64_t i = 1; i < n; i++) { T v = x[i]; if (BETTER) m = v; }     \
    *out = m;                                                              \
  } while (0)

/* first index of the extreme; NaN beats everything, as in NumPy */
#define ROW_ARG(T, BETTER) do {                                            \
    int64_t best = 0; T m = x[0];                                          \
    for (int64_t k = 1; k < n && m == m; k++) {                            \
      T v = x[k * inner]; if (BETTER || v != v) { m = v; best = k; }       \
    }                                                                      \
    *out = best;                                                           \
  } while (0)

/* ADD(a, b): T's addition; int64 sums wrap around, as NumPy's, instead of
** overflowing (undefined in C) */
#define REDUCE_BODY(T, ACC, ADD)                                           \
    for (int64_t o = 0; o < outer; o++) {                                  \
      const T *x0 = xs + o * n * inner;                                    \
      if (op == R_ARGMAX || op == R_ARGMIN) {                              \
        for (int64_t i = 0; i < inner; i++) {                              \
          const T *x = x0 + i; int64_t *out = (int64_t *)outs + o * inner + i; \
          if (op == R_ARGMAX) ROW_ARG(T, v > m); else ROW_ARG(T, v < m);   \
        }                                                                  \
        continue;                                                          \
      }                                                                    \
      T *out = (T *)outs + o * inner;                                      \
      const T *x = x0;                                                     \
      if (inner == 1) {                                                    \
        if (op == R_SUM) ROW_SUM(T, ACC, AS_IS);                           \
        else if (op == R_MAX) ROW_EXTREME(T, v > m || v != v);             \
        else ROW_EXTREME(T, v < m || v != v);                              \
      } else if (op == R_SUM) COLS_SUM(T, T, AS_IS, ADD);                   \
      else if (op == R_MAX) COLS(T, x[i], (v > m || v != v) ? v : m);      \
      else COLS(T, x[i], (v < m || v != v) ? v : m);                       \
    }

#define PLAIN_ADD(a, b) ((a) + (b))
#define WRAP_ADD(a, b)  ((int64_t)((uint64_t)(a) + (uint64_t)(b)))

static void reduce_f32 (redop op, const float *xs, void *outs, int64_t outer, int64_t n,
                        int64_t inner) {
  REDUCE_BODY(float, double, PLAIN_ADD)
}

static void reduce_f64 (redop op, const double *xs, void *outs, int64_t outer, int64_t n,
                        int64_t inner) {
  REDUCE_BODY(double, double, PLAIN_ADD)
}

static void reduce_i64 (redop op, const int64_t *xs, void *outs, int64_t outer, int64_t n,
                        int64_t inner) {
  REDUCE_BODY(int64_t, uint64_t, WRAP_ADD)
}

/* a bfloat16 sum (autocast's bias gradients) reads its input as it is, into
** float32: float32's sum of the widened values, without the widened copy */
static void sum_bf16 (const uint16_t *xs, float *outs, int64_t outer, int64_t n, int64_t inner) {
  for (int64_t o = 0; o < outer; o++) {
    const uint16_t *x = xs + o * n * inner;
    float *out = outs + o * inner;
    if (inner == 1) ROW_SUM(float, double, mg_bf16_value);
    else COLS_SUM(float, uint16_t, mg_bf16_value, PLAIN_ADD);
  }
}

/* the kernel of every reduction, one switch per call; the rows' kernels below */
static void reduce_any (redop op, mg_dtype dt, const void *x, void *out, int64_t outer, int64_t n,
                        int64_t inner) {
  if (dt == MG_BFLOAT16 && op == R_SUM) sum_bf16((const uint16_t *)x, (float *)out, outer, n, inner);
  else if (dt == MG_FLOAT32) reduce_f32(op, (const float *)x, out, outer, n, inner);
  else if (dt == MG_FLOAT64) reduce_f64(op, (const double *)x, out, outer, n, inner);
  else reduce_i64(op, (const int64_t *)x, out, outer, n, inner);
}

#define REDUCE_KERNEL(NAME, OP)                                                          \
  static void NAME (mg_dtype dt, const void *x, void *out, int64_t outer, int64_t n,     \
                    int64_t inner) { reduce_any(OP, dt, x, out, outer, n, inner); }
REDUCE_KERNEL(sum_kernel, R_SUM)
REDUCE_KERNEL(max_kernel, R_MAX)
REDUCE_KERNEL(min_kernel, R_MIN)
REDUCE_KERNEL(argmax_kernel, R_ARGMAX)
REDUCE_KERNEL(argmin_kernel, R_ARGMIN)

static const mg_opdef sum_op;
static mg_status reduce_forward (mg_opcall *c);

/* the shape left after reducing `axis` (all axes when MG_ALL_AXES) */
static int reduced_shape (const mg_tensor *x, int axis, int keepdims, int64_t *shape) {
  int nd = 0;
  for (int i = 0; i < x->ndim; i++) {
    bool gone = axis == MG_ALL_AXES || i == axis;
    if (!gone) shape[nd++] = x->shape[i];
    else if (keepdims) shape[nd++] = 1;
  }
  return nd;
}

/* the entry of every reduction: checks, the reduced shape */
static mg_tensor *reduce (const mg_opdef *op, mg_tensor *x, int axis, int keepdims) {
  const char *fn = op->info.name;
  bool index = op->result == MG_RESULT_INDEX;
  if (x == NULL) {
    char cfn[32];
    snprintf(cfn, sizeof cfn, "mg_%s", fn);
    return mg_null_arg(cfn, "x"), NULL;
  }
  if (axis != MG_ALL_AXES && (axis = mg_check_axis(fn, axis, x->ndim)) < 0) return NULL;
  mg_dtype dt = x->dtype;
  bool read_as_is = op == &sum_op && dt == MG_BFLOAT16;   /* sum_bf16: float32 out, no widened copy */
  if (mg_is_half(dt) && !read_as_is) {        /* computed in float32 (autocast.c) */
    mg_tensor *x32 = mg_half_to_float32(x), *r = x32 ? reduce(op, x32, axis, keepdims) : NULL;
    mg_tensor_release(x32);
    return r;
  }
  if (dt == MG_BOOL) {                        /* only sum counts trues */
    if (op != &sum_op) return mg_seterror("%s: not defined for bool tensors", fn), NULL;
    mg_tensor *xi = mg_cast(x, MG_INT64), *r = reduce(op, xi, axis, keepdims);
    mg_tensor_release(xi);
    return r;
  }
  int64_t n = axis == MG_ALL_AXES ? x->numel : x->shape[axis];
  if (n == 0 && op != &sum_op)
    return mg_seterror("%s: cannot reduce over an empty axis", fn), NULL;
  int64_t shape[MG_MAX_DIMS];
  int nd = reduced_shape(x, axis, keepdims, shape);
  mg_attr attr = {0};
  attr.axis = axis;
  attr.keepdims = keepdims;
  mg_opcall c = MG_OPCALL(op, 1, &x, &attr, shape, nd, index ? MG_INT64 : read_as_is ? MG_FLOAT32 : dt);
  return mg_dispatch(&c);
}

/* the kernel of every reduction: x seen as (outer, n, inner) */
static mg_status reduce_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  int axis = c->attr->axis;
  int64_t outer = 1, n = x->numel, inner = 1;
  if (axis != MG_ALL_AXES) {
    n = x->shape[axis];
    for (int i = 0; i < axis; i++) outer *= x->shape[i];
    for (int i = axis + 1; i < x->ndim; i++) inner *= x->shape[i];
  }
  mg_tensor *out = mg_empty(c->shape, c->ndim, c->dtype);
  mg_tensor *xc = mg_contiguous(x);
  if (out == NULL || xc == NULL) {
    mg_tensor_release(out);
    mg_tensor_release(xc);
    return MG_ERR;
  }
  if (n == 0)
    memset(mg_ptr(out), 0, (size_t)out->numel * mg_dtype_size(out->dtype));
  else
    c->def->reduce(x->dtype, mg_ptr(xc), mg_ptr(out), outer, n, inner);
  mg_tensor_release(xc);
  c->out[0] = out;
  return MG_OK;
}

/* the reduced shape with the reduced axes kept as 1s */
static int kept_shape (const mg_meta *x, int axis, int64_t *shape) {
  for (int i = 0; i < x->ndim; i++)
    shape[i] = (axis == MG_ALL_AXES || i == axis) ? 1 : x->shape[i];
  return x->ndim;
}

/* dout, reshaped to keep the reduced axes, broadcast back to x's shape */
static mg_tensor *spread (mg_node *n, mg_tensor *dout, mg_scope *sc) {
  int64_t shape[MG_MAX_DIMS];
  int nd = kept_shape(&n->in_meta[0], n->attr->axis, shape);
  mg_tensor *kept = mg_tmp(sc, mg_reshape(dout, shape, nd));
  return mg_tmp(sc, mg_broadcast_to(kept, n->in_meta[0].shape, n->in_meta[0].ndim));
}

/* sum: out = sum of x over axis.  grad: dx = dout broadcast back (a view) */

static mg_status sum_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  din[0] = mg_retain_or_null(spread(n, dout[0], &sc));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(SUM, sum) = {
  .forward = reduce_forward,
  .info = {.name = "sum", .kind = MG_OP_REDUCE, .doc = "the sum over all axes, an axis, or a list of axes",
           .fn.reduce = mg_sum},
  .reduce = sum_kernel, .backward = sum_backward,
};
mg_tensor *mg_sum (mg_tensor *x, int axis, int keepdims) { return reduce(&sum_op, x, axis, keepdims); }

/* max/min: out = extreme of x over axis.  grad: dout shared evenly among
** the positions that reach the extreme (TensorFlow's rule) */
static mg_status extreme_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  int64_t shape[MG_MAX_DIMS];
  int nd = kept_shape(&n->in_meta[0], n->attr->axis, shape);
  mg_tensor *y = mg_tmp(&sc, mg_reshape(n->out[0], shape, nd));
  mg_tensor *hit = mg_tmp(&sc, mg_equal(n->in[0], y));
  mg_tensor *hitf = mg_tmp(&sc, mg_cast(hit, dout[0]->dtype));
  mg_tensor *count = mg_tmp(&sc, mg_sum(hitf, n->attr->axis, 1));
  mg_tensor *share = mg_tmp(&sc, mg_div(mg_tmp(&sc, mg_reshape(dout[0], shape, nd)), count));
  din[0] = mg_mul(hitf, share);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(MAX, max) = {
  .forward = reduce_forward,
  .info = {.name = "max", .kind = MG_OP_REDUCE,
           .doc = "the largest value (ties share the gradient)", .fn.reduce = mg_max},
  .reduce = max_kernel, .saves = MG_SAVE_IN(0) | MG_SAVE_OUT(0), .backward = extreme_backward,
};
mg_tensor *mg_max (mg_tensor *x, int axis, int keepdims) { return reduce(&max_op, x, axis, keepdims); }

MG_ROW(MIN, min) = {
  .forward = reduce_forward,
  .info = {.name = "min", .kind = MG_OP_REDUCE,
           .doc = "the smallest value (ties share the gradient)", .fn.reduce = mg_min},
  .reduce = min_kernel, .saves = MG_SAVE_IN(0) | MG_SAVE_OUT(0), .backward = extreme_backward,
};
mg_tensor *mg_min (mg_tensor *x, int axis, int keepdims) { return reduce(&min_op, x, axis, keepdims); }

/* argmax/argmin: the first position of the extreme (NaN wins), int64. No gradient */
MG_ROW(ARGMAX, argmax) = {
  .forward = reduce_forward,
  .info = {.name = "argmax", .kind = MG_OP_OTHER, .doc = "the position of the largest value (int64)"},
  .reduce = argmax_kernel, .result = MG_RESULT_INDEX,
};
mg_tensor *mg_argmax (mg_tensor *x, int axis, int keepdims) { return reduce(&argmax_op, x, axis, keepdims); }

MG_ROW(ARGMIN, argmin) = {
  .forward = reduce_forward,
  .info = {.name = "argmin", .kind = MG_OP_OTHER, .doc = "the position of the smallest value (int64)"},
  .reduce = argmin_kernel, .result = MG_RESULT_INDEX,
};
mg_tensor *mg_argmin (mg_tensor *x, int axis, int keepdims) { return reduce(&argmin_op, x, axis, keepdims); }


/* mean = sum / n (a composite: its gradient comes from sum and div) */
MG_ROW(MEAN, mean) = {
  .forward = reduce_forward,
  .info = {.name = "mean", .kind = MG_OP_REDUCE, .doc = "the mean (int64 and bool give float64)",
           .fn.reduce = mg_mean},
};

mg_tensor *mg_mean (mg_tensor *x, int axis, int keepdims) {
  MG_CHECK_ARG("mg_mean", x, NULL);
  if (x->dtype == MG_INT64 || x->dtype == MG_BOOL || mg_is_half(x->dtype)) {
    mg_tensor *xf = mg_cast(x, mg_is_half(x->dtype) ? MG_FLOAT32 : MG_FLOAT64), *r = mg_mean(xf, axis, keepdims);
    mg_tensor_release(xf);
    return r;
  }
  if (mg_check_computable("mean", x->dtype) != MG_OK) return NULL;
  int a = axis == MG_ALL_AXES ? axis : mg_check_axis("mean", axis, x->ndim);
  if (a != MG_ALL_AXES && a < 0) return NULL;
  double count = a == MG_ALL_AXES ? (double)x->numel : (double)x->shape[a];
  mg_tensor *s = mg_sum(x, a, keepdims), *c = s ? mg_scalar(count, x->dtype) : NULL;
  mg_tensor *r = c ? mg_div(s, c) : NULL;
  mg_tensor_release(s);
  mg_tensor_release(c);
  return r;
}

/*
** Sums x over the dimensions broadcasting added, so that it has `shape`:
** the adjoint of broadcasting that every binary op's backward rule uses.
** Returns x itself (retained) when nothing needs summing.
*/
mg_tensor *mg_sum_to_shape (mg_tensor *x, const int64_t *shape, int ndim) {
  MG_CHECK_ARG("mg_sum_to_shape", x, NULL);
  if (mg_shape_numel("mg_sum_to_shape", shape, ndim) < 0) return NULL;
  if (mg_same_shape(x->shape, x->ndim, shape, ndim)) return mg_tensor_retain(x);
  int lead = x->ndim - ndim;
  if (lead < 0) {
    char a[160], b[160];
    mg_seterror("sum_to_shape: cannot reduce %s to %s", mg_shape_str(a, sizeof a, x->shape, x->ndim),
                mg_shape_str(b, sizeof b, shape, ndim));
    return NULL;
  }
  mg_tensor *cur = mg_tensor_retain(x);
  for (int i = x->ndim - 1; i >= 0 && cur; i--) {
    bool sum_it = i < lead || (shape[i - lead] == 1 && x->shape[i] != 1);
    if (!sum_it) continue;
    mg_tensor *next = mg_sum(cur, i, 1);
    mg_tensor_release(cur);
    cur = next;
  }
  mg_tensor *r = mg_reshape(cur, shape, ndim);
  mg_tensor_release(cur);
  return r;
}

MG_FAMILY(mg_reduce_ops, REDUCE_OPS, REDUCE__COUNT);

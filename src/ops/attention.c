/*
** attention.c — the transformer's primitives: layer_norm, gelu and
** scaled_dot_product_attention, each fused forward and backward.
**
**   layer_norm(x, gamma, beta)   over the last axis; keeps x and gamma, and
**                                its backward recomputes the row statistics
**   gelu(x)                      exact (erf) or tanh-approximated; keeps x
**   scaled_dot_product_attention(q, k, v [, mask])
**                                softmax(q k^T * scale, masked) v per batch
**                                entry; keeps q, k, v only: the backward
**                                builds the (Tq,Tk) weights again, a tile at
**                                a time, as FlashAttention does, so the tape
**                                holds no (batch, heads, T, T) tensor
**
** The fused backward kernels run when no tape records the backward pass
** (the usual case: the tape was stopped before its gradient). When one does
** (second-order gradients), the backward rules are written with the public
** ops instead, so that tape sees differentiable steps; both give the same
** numbers, and the specs check each against the other.
**
** float32 products go to oneDNN's sgemm, called from inside an OpenMP loop
** over the batch, where oneDNN runs each on the calling thread; float64 runs
** plain C loops (the reference the gradient checks use). Under autocast,
** bfloat16 q, k and v (where the CPU has bfloat16 products) keep their
** dtype: each batch entry's products are oneDNN's bfloat16 matmul into
** float32 tiles, the softmax and its gradient run in float32, and the
** results are rounded to bfloat16 once, as PyTorch's autocast attention.
*/
#include <float.h>
#include <math.h>
#include <string.h>

#include <dnnl.h>
#include <omp.h>

#include "dnn.h"
#include "ops/op.h"
#include "lanes.h"
#include "vecmath.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define ATTENTION_OPS(X) \
  X(LAYER_NORM, layer_norm) X(GELU, gelu) X(SDPA, sdpa)
enum { ATTENTION_OPS(MG_ROW_ENUM) ATTENTION__COUNT };

static const mg_opdef layer_norm_op, gelu_op, sdpa_op;

/* does a tape record what a backward rule computes now (second order)? */
static bool recorded_backward (void) { return mg_op_recorded(); }

/* checks that t is a float32/float64 tensor, naming fn and `what` */
static mg_status check_float (const char *fn, const char *what, const mg_tensor *t) {
  if (mg_is_float(t->dtype) && mg_check_computable(fn, t->dtype) == MG_OK) return MG_OK;
  return mg_seterror("%s: %s must be float32 or float64, got %s", fn, what, mg_dtype_name(t->dtype));
}

static mg_status check_same_dtype (const char *fn, const char *a, const mg_tensor *x, const char *b,
                                   const mg_tensor *y) {
  if (x->dtype == y->dtype) return MG_OK;
  return mg_seterror("%s: dtypes differ: %s is %s, %s is %s", fn, a, mg_dtype_name(x->dtype), b,
                     mg_dtype_name(y->dtype));
}

/* scratch memory for the kernels' threads, through the counting allocator */
static mg_storage *scratch (size_t bytes) { return mg_storage_new(bytes > 0 ? bytes : 1); }


/* {======================== layer_norm ========================== */

/* the mean and 1/sqrt(var + eps) of the D values at xr */
#define ROW_STATS(T, xr, mu, rstd) do {                                             \
    T s_, v_;                                                                       \
    LANE_SUM(T, s_, D, xr[j]);                                                      \
    mu = s_ / (T)D;                                                                 \
    LANE_SUM(T, v_, D, (xr[j] - mu) * (xr[j] - mu));                                \
    rstd = (T)(1 / sqrt((double)(v_ / (T)D) + eps));                                \
  } while (0)

/* y (rows, D) = (x - mean) / sqrt(var + eps) * gamma + beta, row by row;
** gamma/beta may be NULL */
#define LN_FWD(T) do {                                                              \
    const T *X = (const T *)x, *G = (const T *)g, *Bt = (const T *)b; T *Y = (T *)y; \
    MG_PARALLEL_FOR(rows * D > 65536, ,                                              \
    for (int64_t r = 0; r < rows; r++) {                                            \
      const T *xr = X + r * D; T *yr = Y + r * D;                                   \
      T mu, rstd;                                                                   \
      ROW_STATS(T, xr, mu, rstd);                                                   \
      if (G && Bt)                                                                  \
        for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mu) * rstd * G[j] + Bt[j]; \
      else                                                                          \
        for (int64_t j = 0; j < D; j++) {                                           \
          T h = (xr[j] - mu) * rstd;                                                \
          yr[j] = (G ? h * G[j] : h) + (Bt ? Bt[j] : 0);                            \
        }                                                                           \
    });                                                                             \
  } while (0)

static void ln_forward (mg_dtype dt, const void *x, const void *g, const void *b, void *y, int64_t rows,
                        int64_t D, double eps) {
  if (dt == MG_FLOAT32) LN_FWD(float);
  else LN_FWD(double);
}

/*
** dx, dgamma, dbeta of layer_norm in one pass over the rows: with
** h = (x - mean) * rstd and g = dy * gamma,
**   dx = rstd * (g - mean(g) - h * mean(g * h)),
**   dgamma = sum over rows of dy * h, dbeta = sum over rows of dy.
** Each thread adds its rows' dgamma/dbeta into its own part of acc
** (nthr * 2 * D doubles), summed at the end.
*/
#define LN_BWD(T) do {                                                              \
    const T *X = (const T *)x, *G = (const T *)g, *DY = (const T *)dy;              \
    T *DX = (T *)dx;                                                                \
    MG_PARALLEL(nthr > 1, num_threads(nthr),                                        \
    {                                                                               \
      double *ag = acc + (size_t)omp_get_thread_num() * 2 * D, *ab = ag + D;        \
      _Pragma("omp for schedule(static)")                                          \
      for (int64_t r = 0; r < rows; r++) {                                          \
        const T *xr = X + r * D, *dyr = DY + r * D;                                 \
        T mu, rstd, sg, sgh;                                                        \
        ROW_STATS(T, xr, mu, rstd);                                                 \
        if (want_g)                                                                 \
          for (int64_t j = 0; j < D; j++) ag[j] += (double)(dyr[j] * ((xr[j] - mu) * rstd)); \
        if (want_b)                                                                 \
          for (int64_t j = 0; j < D; j++) ab[j] += (double)dyr[j];                  \
        if (!DX) continue;                                                          \
        if (G) {                                                                    \
          LANE_SUM(T, sg, D, dyr[j] * G[j]);                                        \
          LANE_SUM(T, sgh, D, dyr[j] * G[j] * ((xr[j] - mu) * rstd));               \
        } else {                                                                    \
          LANE_SUM(T, sg, D, dyr[j]);                                               \
          LANE_SUM(T, sgh, D, dyr[j] * ((xr[j] - mu) * rstd));                      \
        }                                                                           \
        T mg_ = sg / (T)D, mgh = sgh / (T)D; T *dxr = DX + r * D;                   \
        for (int64_t j = 0; j < D; j++) {                                           \
          T h = (xr[j] - mu) * rstd, gj = G ? dyr[j] * G[j] : dyr[j];               \
          dxr[j] = rstd * (gj - mg_ - h * mgh);                                     \
        }                                                                           \
      }                                                                             \
    });                                                                             \
    for (int t = 1; t < nthr; t++)                                                  \
      for (int64_t j = 0; j < 2 * D; j++) acc[j] += acc[(size_t)t * 2 * D + j];     \
  } while (0)

static void ln_backward_kernel (mg_dtype dt, const void *x, const void *g, const void *dy, void *dx,
                                double *acc, int nthr, bool want_g, bool want_b, int64_t rows,
                                int64_t D, double eps) {
  if (dt == MG_FLOAT32) LN_BWD(float);
  else LN_BWD(double);
}

/* the fused backward: din[] for the inputs that need one */
static mg_status ln_backward_fused (mg_node *n, mg_tensor *dy, mg_tensor **din, bool has_g, bool has_b) {
  mg_tensor *x = n->in[0], *gamma = has_g ? n->in[1] : NULL;
  int64_t D = x->ndim ? x->shape[x->ndim - 1] : 1, rows = D ? x->numel / D : 0;
  int ig = has_g ? 1 : -1, ib = has_b ? (has_g ? 2 : 1) : -1;
  bool want_g = ig > 0 && n->needs[ig], want_b = ib > 0 && n->needs[ib];
  int nthr = rows * D > 65536 ? omp_get_max_threads() : 1;
  mg_tensor *xc = mg_contiguous(x), *dyc = mg_contiguous(dy);
  mg_tensor *gc = gamma ? mg_contiguous(gamma) : NULL;
  /* dx over dy when the walk spares it: a row's dy is read before its dx is written */
  mg_tensor *dx = !n->needs[0] || dyc == NULL ? NULL
                : (n->spare & 1) && dyc == dy ? mg_tensor_retain(dy)
                                              : mg_empty(x->shape, x->ndim, x->dtype);
  mg_storage *acc = scratch(sizeof(double) * 2 * (size_t)D * (size_t)nthr);
  mg_status st = xc && dyc && (gc || !gamma) && (dx || !n->needs[0]) && acc ? MG_OK : MG_ERR;
  if (st == MG_OK) {
    memset(acc->data, 0, sizeof(double) * 2 * (size_t)D * (size_t)nthr);
    if (!mg_dry_running())                         /* a dry run computes nothing */
      ln_backward_kernel(x->dtype, mg_ptr(xc), gc ? mg_ptr(gc) : NULL, mg_ptr(dyc), dx ? mg_ptr(dx) : NULL,
                       (double *)acc->data, nthr, want_g, want_b, rows, D, n->attr->f);
    double *a = (double *)acc->data;
    if (want_g) st = (din[ig] = mg_from_doubles(a, &D, 1, x->dtype)) ? MG_OK : MG_ERR;
    if (want_b && st == MG_OK) st = (din[ib] = mg_from_doubles(a + D, &D, 1, x->dtype)) ? MG_OK : MG_ERR;
  }
  if (st == MG_OK) din[0] = dx;
  else mg_tensor_release(dx);
  mg_tensor_release(xc);
  mg_tensor_release(dyc);
  mg_tensor_release(gc);
  mg_storage_release(acc);
  return st;
}

/* the same with public ops, for a tape that records the backward */
static mg_status ln_backward_ops (mg_node *n, mg_tensor *dy, mg_tensor **din, bool has_g, bool has_b) {
  mg_scope sc = {0};
  mg_tensor *x = n->in[0], *gamma = has_g ? n->in[1] : NULL;
  int64_t D = x->ndim ? x->shape[x->ndim - 1] : 1;
  int ig = has_g ? 1 : -1, ib = has_b ? (has_g ? 2 : 1) : -1;
  mg_tensor *mu = mg_tmp(&sc, mg_mean(x, -1, 1));
  mg_tensor *xc = mg_tmp(&sc, mg_sub(x, mu));
  mg_tensor *var = mg_tmp(&sc, mg_mean(mg_tmp(&sc, mg_mul(xc, xc)), -1, 1));
  mg_tensor *eps = mg_tmp(&sc, mg_scalar(n->attr->f, x->dtype));
  mg_tensor *rstd = mg_tmp(&sc, mg_pow(mg_tmp(&sc, mg_add(var, eps)), mg_tmp(&sc, mg_scalar(-0.5, x->dtype))));
  mg_tensor *h = mg_tmp(&sc, mg_mul(xc, rstd));
  if (n->needs[0]) {
    mg_tensor *g = gamma ? mg_tmp(&sc, mg_mul(dy, gamma)) : dy;
    mg_tensor *mg_ = mg_tmp(&sc, mg_mean(g, -1, 1));
    mg_tensor *mgh = mg_tmp(&sc, mg_mean(mg_tmp(&sc, mg_mul(g, h)), -1, 1));
    mg_tensor *inner = mg_tmp(&sc, mg_sub(mg_tmp(&sc, mg_sub(g, mg_)), mg_tmp(&sc, mg_mul(h, mgh))));
    din[0] = mg_mul(rstd, inner);
  }
  if (ig > 0 && n->needs[ig]) din[ig] = mg_sum_to_shape(mg_tmp(&sc, mg_mul(dy, h)), &D, 1);
  if (ib > 0 && n->needs[ib]) din[ib] = mg_sum_to_shape(dy, &D, 1);
  mg_scope_end(&sc);
  return MG_OK;
}

/* layer_norm: y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta over the
** last axis.  grad: with h the normalized x and g = dout * gamma,
** dx = rstd * (g - mean(g) - h * mean(g * h)), dgamma = sum(dout * h),
** dbeta = sum(dout), the sums over every axis but the last */
static mg_status layer_norm_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  bool has_g = n->attr->a[0], has_b = n->attr->a[1];
  if (recorded_backward()) return ln_backward_ops(n, dout[0], din, has_g, has_b);
  return ln_backward_fused(n, dout[0], din, has_g, has_b);
}
static mg_status layer_norm_forward (mg_opcall *c);
MG_ROW(LAYER_NORM, layer_norm) = {
  .forward = layer_norm_forward,
  .info = {.name = "layer_norm", .kind = MG_OP_OTHER,
           .doc = "(x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis"},
  .saves = MG_SAVE_IN(0), .grad_saves = {MG_SAVE_IN(1)}, .backward = layer_norm_backward,
  .reuses_gradient = true,                /* gamma only for x's gradient */
};

mg_tensor *mg_layer_norm (mg_tensor *x, mg_tensor *gamma, mg_tensor *beta, double epsilon) {
  const char *fn = "layer_norm";
  char s1[160];
  MG_CHECK_ARG("mg_layer_norm", x, NULL);
  /* half x, gamma or beta beside float32: computed in float32 (as under autocast);
  ** beside float64, an error naming the dtypes given */
  mg_tensor *params[2] = {gamma, beta};
  const char *names[2] = {"gamma", "beta"};
  for (int i = 0; i < 2 && mg_is_half(x->dtype); i++)
    if (params[i] && params[i]->dtype != MG_FLOAT32 && !mg_is_half(params[i]->dtype))
      return check_same_dtype(fn, "x", x, names[i], params[i]), NULL;
  HALF_AS_FLOAT32(x, mg_layer_norm(x, gamma, beta, epsilon));
  if (gamma) RETRY_AS(gamma, mg_is_half(gamma->dtype) && x->dtype == MG_FLOAT32, MG_FLOAT32, mg_layer_norm(x, gamma, beta, epsilon));
  if (beta) RETRY_AS(beta, mg_is_half(beta->dtype) && x->dtype == MG_FLOAT32, MG_FLOAT32, mg_layer_norm(x, gamma, beta, epsilon));
  if (check_float(fn, "x", x) != MG_OK) return NULL;
  if (x->ndim == 0) return mg_seterror("%s: x must have at least 1 dimension (the features), got a 0-d tensor", fn), NULL;
  if (!(epsilon >= 0 && epsilon < INFINITY))
    return mg_seterror("%s: epsilon must be a finite number >= 0, got %g", fn, epsilon), NULL;
  int64_t D = x->shape[x->ndim - 1];
  for (int i = 0; i < 2; i++) {
    if (params[i] == NULL) continue;
    if (check_same_dtype(fn, "x", x, names[i], params[i]) != MG_OK) return NULL;
    if (params[i]->ndim != 1 || params[i]->shape[0] != D)
      return mg_seterror("%s: %s has shape %s, expected (%lld) (x's last axis)", fn, names[i],
                         mg_shape_str(s1, sizeof s1, params[i]->shape, params[i]->ndim), (long long)D), NULL;
  }
  mg_attr attr = {0};
  attr.a[0] = gamma != NULL;
  attr.a[1] = beta != NULL;
  attr.f = epsilon;
  mg_tensor *in[3] = {x, NULL, NULL};
  int nin = 1;
  if (gamma) in[nin++] = gamma;
  if (beta) in[nin++] = beta;
  mg_opcall c = MG_OPCALL(&layer_norm_op, nin, in, &attr, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

static mg_status layer_norm_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  bool has_g = c->attr->a[0], has_b = c->attr->a[1];
  mg_tensor *gamma = has_g ? c->in[1] : NULL, *beta = has_b ? c->in[1 + has_g] : NULL;
  int64_t D = x->shape[x->ndim - 1];
  double epsilon = c->attr->f;
  mg_tensor *xc = mg_contiguous(x), *gc = gamma ? mg_contiguous(gamma) : NULL, *bc = beta ? mg_contiguous(beta) : NULL;
  mg_tensor *out = mg_empty(x->shape, x->ndim, x->dtype);
  bool ok = xc && out && (gc || !gamma) && (bc || !beta);
  if (ok && out->numel > 0)
    ln_forward(x->dtype, mg_ptr(xc), gc ? mg_ptr(gc) : NULL, bc ? mg_ptr(bc) : NULL, mg_ptr(out),
               x->numel / D, D, epsilon);
  mg_tensor_release(xc);
  mg_tensor_release(gc);
  mg_tensor_release(bc);
  if (!ok) {
    mg_tensor_release(out);
    return MG_ERR;
  }
  c->out[0] = out;
  return MG_OK;
}

/* }============================================================= */


/* {=========================== gelu ============================= */

#define SQRT_HALF     0.70710678118654752440
#define SQRT_2_PI     0.79788456080286535588    /* sqrt(2/pi) */
#define INV_SQRT_2PI  0.39894228040143267794    /* 1/sqrt(2 pi) */
#define GELU_C        0.044715

#define ERF_(x)   _Generic((x), float: erff, default: erf)(x)
#define TANH_(x)  _Generic((x), float: tanhf, default: tanh)(x)
#define EXP_(x)   _Generic((x), float: expf, default: exp)(x)

/* y = gelu(x), or (dy given) dx = dy * gelu'(x), over [lo, hi) */
#define GELU_LOOP(T) do {                                                           \
    const T *X = (const T *)x, *DY = (const T *)dy; T *Y = (T *)y;                  \
    if (!approx && !DY) {                                                           \
      for (int64_t i = lo; i < hi; i++) Y[i] = (T)0.5 * X[i] * (1 + ERF_(X[i] * (T)SQRT_HALF)); \
    } else if (!approx) {                                                           \
      for (int64_t i = lo; i < hi; i++) {                                           \
        T v = X[i];                                                                 \
        T cdf = (T)0.5 * (1 + ERF_(v * (T)SQRT_HALF));                              \
        Y[i] = DY[i] * (cdf + v * (T)INV_SQRT_2PI * EXP_((T)-0.5 * v * v));         \
      }                                                                             \
    } else if (!DY) {                                                               \
      for (int64_t i = lo; i < hi; i++) {                                           \
        T v = X[i];                                                                 \
        Y[i] = (T)0.5 * v * (1 + TANH_((T)SQRT_2_PI * (v + (T)GELU_C * v * v * v))); \
      }                                                                             \
    } else {                                                                        \
      for (int64_t i = lo; i < hi; i++) {                                           \
        T v = X[i];                                                                 \
        T t = TANH_((T)SQRT_2_PI * (v + (T)GELU_C * v * v * v));                    \
        T du = (T)SQRT_2_PI * (1 + 3 * (T)GELU_C * v * v);                          \
        Y[i] = DY[i] * ((T)0.5 * (1 + t) + (T)0.5 * v * (1 - t * t) * du);          \
      }                                                                             \
    }                                                                               \
  } while (0)

typedef struct gelu_args {
  mg_dtype dt;
  bool approx;
  const void *x, *dy;
  void *y;
} gelu_args;

static void gelu_block (const void *ctx, int64_t lo, int64_t hi) {
  const gelu_args *a = (const gelu_args *)ctx;
  const void *x = a->x, *dy = a->dy;
  void *y = a->y;
  bool approx = a->approx;
  if (a->dt == MG_FLOAT32) GELU_LOOP(float);
  else GELU_LOOP(double);
}

/* in mg_for_blocks' fixed blocks: each element takes the same path (the
** vector loop, or the scalar one at a block's end, whose libm results
** differ from libmvec's in the last bits) at any thread count */
static void gelu_kernel (mg_dtype dt, bool approx, const void *x, const void *dy, void *y, int64_t n) {
  gelu_args a = {dt, approx, x, dy, y};
  mg_for_blocks(n, gelu_block, &a);
}

/* gelu(x) or dy * gelu'(x) on contiguous copies; dy may be NULL. The
** gradient goes over dy itself when the walk spares it (`over`) and it is
** contiguous: each element is read before it is written */
static mg_tensor *gelu_run (mg_tensor *x, mg_tensor *dy, bool approx, bool over) {
  mg_tensor *xc = mg_contiguous(x), *dyc = dy ? mg_contiguous(dy) : NULL;
  mg_tensor *out = !xc || (dy && !dyc) ? NULL
                 : over && dyc == dy   ? mg_tensor_retain(dy)
                                       : mg_empty(x->shape, x->ndim, x->dtype);
  if (out && out->numel > 0 && !mg_dry_running())   /* a dry run computes nothing */
    gelu_kernel(x->dtype, approx, mg_ptr(xc), dyc ? mg_ptr(dyc) : NULL, mg_ptr(out), out->numel);
  mg_tensor_release(xc);
  mg_tensor_release(dyc);
  return out;
}

/* {------- bfloat16 gelu (autocast's: a product's output) -------
** float32 inside, 512 values at a time on the stack, each result rounded
** once. The forward computes gelu'(x) beside gelu(x) (they share their exp)
** and keeps it, rounded, in place of x while a tape records: the backward
** is then dy * gelu'(x), a product, instead of erf and exp again. The same
** code gives y whether or not it is kept, and the backward without it
** rounds gelu'(x) the same way, so both paths give the same bits. */
#define STRETCH 512
#define AS_P   0.3275911f           /* erf by Abramowitz and Stegun 7.1.26, as oneDNN's gelu_erf */
#define AS_A1  0.254829592f
#define AS_A2 -0.284496736f
#define AS_A3  1.421413741f
#define AS_A4 -1.453152027f
#define AS_A5  1.061405429f

/* y = gelu(x), d = gelu'(x) of STRETCH float32 values (a stretch's tail
** zero-filled: every value takes the vector path, whatever the length). Exact: Phi(x) = 1 - Q(x)
** for x >= 0, Q(-x) else, with Q(a) = t P(t) e^(-a^2/2) / 2, t = 1 / (1 + p a / sqrt 2):
** the tail directly, without cancelling 1 - erf; phi(x) shares the exp */
static void gelu_both (bool approx, const float *x, float *y, float *d) {
  if (!approx) {
    for (int i = 0; i < STRETCH; i++) {
      float v = x[i], e = expf(-0.5f * v * v);
      float t = 1.0f / (1.0f + AS_P * (float)SQRT_HALF * fabsf(v));
      float q = 0.5f * e * t * (AS_A1 + t * (AS_A2 + t * (AS_A3 + t * (AS_A4 + t * AS_A5))));
      float cdf = v >= 0 ? 1.0f - q : q;
      y[i] = v * cdf;
      d[i] = cdf + v * (float)INV_SQRT_2PI * e;
    }
  } else {
    for (int i = 0; i < STRETCH; i++) {
      float v = x[i], t = tanhf((float)SQRT_2_PI * (v + (float)GELU_C * v * v * v));
      y[i] = 0.5f * v * (1 + t);
      d[i] = 0.5f * (1 + t) + 0.5f * v * (1 - t * t) * ((float)SQRT_2_PI * (1 + 3 * (float)GELU_C * v * v));
    }
  }
}

typedef struct gelu_half_args {
  bool approx;
  const uint16_t *x, *dy, *d;       /* bfloat16: x, or dy with d = gelu'(x) kept, or dy with x */
  uint16_t *y, *dkeep;              /* y (or dx); gelu'(x) to keep, or NULL */
} gelu_half_args;

/* the forward, y and maybe gelu'(x), over [lo, hi) */
static void gelu_half_forward (const void *ctx, int64_t lo, int64_t hi) {
  const gelu_half_args *a = (const gelu_half_args *)ctx;
  float x[STRETCH], y[STRETCH], d[STRETCH];
  for (int64_t s = lo; s < hi; s += STRETCH) {
    int m = hi - s < STRETCH ? (int)(hi - s) : STRETCH;
    mg_convert(x, MG_FLOAT32, a->x + s, MG_BFLOAT16, m);
    if (m < STRETCH) memset(x + m, 0, sizeof(float) * (size_t)(STRETCH - m));
    gelu_both(a->approx, x, y, d);
    mg_convert(a->y + s, MG_BFLOAT16, y, MG_FLOAT32, m);
    if (a->dkeep) mg_convert(a->dkeep + s, MG_BFLOAT16, d, MG_FLOAT32, m);
  }
}

/* the backward, dx = dy * gelu'(x) rounded, over [lo, hi): from the kept
** gelu'(x), or computed from x and rounded as the forward keeps it */
static void gelu_half_backward (const void *ctx, int64_t lo, int64_t hi) {
  const gelu_half_args *a = (const gelu_half_args *)ctx;
  float g[STRETCH], d[STRETCH], y[STRETCH];
  uint16_t r[STRETCH];
  for (int64_t s = lo; s < hi; s += STRETCH) {
    int m = hi - s < STRETCH ? (int)(hi - s) : STRETCH;
    const uint16_t *db = a->d ? a->d + s : r;
    if (!a->d) {
      mg_convert(g, MG_FLOAT32, a->x + s, MG_BFLOAT16, m);
      if (m < STRETCH) memset(g + m, 0, sizeof(float) * (size_t)(STRETCH - m));
      gelu_both(a->approx, g, y, d);
      mg_convert(r, MG_BFLOAT16, d, MG_FLOAT32, m);
    }
    mg_convert(d, MG_FLOAT32, db, MG_BFLOAT16, m);
    mg_convert(g, MG_FLOAT32, a->dy + s, MG_BFLOAT16, m);
    for (int i = 0; i < m; i++) g[i] *= d[i];
    mg_convert(a->y + s, MG_BFLOAT16, g, MG_FLOAT32, m);
  }
}

/* gelu of bfloat16 x: a new bfloat16 tensor, and gelu'(x) into *keep when
** keep is not NULL */
static mg_tensor *gelu_bf16 (mg_tensor *x, bool approx, mg_tensor **keep) {
  mg_tensor *xc = mg_contiguous(x);
  mg_tensor *out = xc ? mg_empty(x->shape, x->ndim, MG_BFLOAT16) : NULL;
  if (out && keep && (*keep = mg_empty(x->shape, x->ndim, MG_BFLOAT16)) == NULL) {
    mg_tensor_release(out);
    out = NULL;
  }
  if (out && out->numel > 0 && !mg_dry_running()) {    /* a dry run computes nothing */
    gelu_half_args a = {approx, (const uint16_t *)mg_ptr(xc), NULL, NULL, (uint16_t *)mg_ptr(out),
                        keep ? (uint16_t *)mg_ptr(*keep) : NULL};
    mg_for_blocks(out->numel, gelu_half_forward, &a);
  }
  mg_tensor_release(xc);
  return out;
}

/* dy * gelu'(x), bfloat16, from the kept gelu'(x) d (x may be NULL) or from x; over dy
** when the walk spares it and it is bfloat16 and contiguous */
static mg_tensor *gelu_grad_bf16 (mg_tensor *x, mg_tensor *d, mg_tensor *dy, bool approx, bool over) {
  mg_tensor *src = mg_contiguous(d ? d : x);
  mg_tensor *dyc = dy->dtype == MG_BFLOAT16 ? mg_contiguous(dy) : mg_cast(dy, MG_BFLOAT16);
  mg_tensor *out = !src || !dyc ? NULL : over && dyc == dy ? mg_tensor_retain(dy) : mg_empty(src->shape, src->ndim, MG_BFLOAT16);
  if (out && out->numel > 0 && !mg_dry_running()) {
    const uint16_t *sp = (const uint16_t *)mg_ptr(src);
    gelu_half_args a = {approx, d ? NULL : sp, (const uint16_t *)mg_ptr(dyc), d ? sp : NULL, (uint16_t *)mg_ptr(out), NULL};
    mg_for_blocks(out->numel, gelu_half_backward, &a);
  }
  mg_tensor_release(src);
  mg_tensor_release(dyc);
  return out;
}

/* }------------------------------------------------------------- */

/* gelu'(x) with public ops: Phi(x) + x * phi(x), or the tanh form's derivative */
static mg_tensor *gelu_grad_ops (mg_tensor *x, bool approx) {
  mg_scope sc = {0};
  mg_dtype dt = x->dtype;
#define C_(v) mg_tmp(&sc, mg_scalar((v), dt))
  mg_tensor *half = C_(0.5), *one = C_(1.0), *r;
  if (!approx) {
    mg_tensor *cdf = mg_tmp(&sc, mg_mul(half, mg_tmp(&sc, mg_add(one, mg_tmp(&sc, mg_erf(mg_tmp(&sc, mg_mul(x, C_(SQRT_HALF)))))))));
    mg_tensor *pdf = mg_tmp(&sc, mg_mul(C_(INV_SQRT_2PI), mg_tmp(&sc, mg_exp(mg_tmp(&sc, mg_mul(C_(-0.5), mg_tmp(&sc, mg_mul(x, x))))))));
    r = mg_add(cdf, mg_tmp(&sc, mg_mul(x, pdf)));
  } else {
    mg_tensor *x2 = mg_tmp(&sc, mg_mul(x, x));
    mg_tensor *u = mg_tmp(&sc, mg_mul(C_(SQRT_2_PI), mg_tmp(&sc, mg_add(x, mg_tmp(&sc, mg_mul(C_(GELU_C), mg_tmp(&sc, mg_mul(x2, x))))))));
    mg_tensor *t = mg_tmp(&sc, mg_tanh(u));
    mg_tensor *du = mg_tmp(&sc, mg_mul(C_(SQRT_2_PI), mg_tmp(&sc, mg_add(one, mg_tmp(&sc, mg_mul(C_(3 * GELU_C), x2))))));
    mg_tensor *a = mg_tmp(&sc, mg_mul(half, mg_tmp(&sc, mg_add(one, t))));
    mg_tensor *sech2 = mg_tmp(&sc, mg_sub(one, mg_tmp(&sc, mg_mul(t, t))));
    r = mg_add(a, mg_tmp(&sc, mg_mul(mg_tmp(&sc, mg_mul(mg_tmp(&sc, mg_mul(half, x)), sech2)), du)));
  }
#undef C_
  mg_scope_end(&sc);
  return r;
}

/* gelu: y = x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))), or with tanh:
** y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
** grad: dx = dout * (Phi(x) + x * phi(x)), or the tanh form's derivative
** x/2 * sech^2(u) * u' + (1 + tanh(u)) / 2 */
static mg_status gelu_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  bool approx = n->attr->a[0];
  mg_tensor *x = n->in[0], *kept = n->nout > 1 ? n->out[1] : NULL;     /* gelu'(x), when the forward kept it */
  if (kept && recorded_backward()) {    /* a tape records: gelu'(x) is a constant to it (no x kept) */
    din[0] = mg_mul(dout[0], kept);
    return MG_OK;
  }
  if (!recorded_backward()) {
    din[0] = kept || x->dtype == MG_BFLOAT16 ? gelu_grad_bf16(x, kept, dout[0], approx, n->spare & 1)
                                             : gelu_run(x, dout[0], approx, n->spare & 1);
    return MG_OK;
  }
  mg_tensor *x32 = mg_half_to_float32(x);       /* a tape records: public ops, in float32 for autocast's */
  mg_tensor *d = x32 ? gelu_grad_ops(x32, approx) : NULL;
  mg_tensor_release(x32);
  din[0] = mg_mul(dout[0], d);
  mg_tensor_release(d);
  return MG_OK;
}
/* bfloat16 x keeps gelu'(x) in place of x while a tape records and none
** can record the backward (mg_op_second_order): second order needs x */
static mg_status gelu_forward (mg_opcall *c) {
  bool approx = c->attr->a[0];
  mg_tensor *x = c->in[0], *d = NULL;
  if (x->dtype != MG_BFLOAT16) {
    c->out[0] = gelu_run(x, NULL, approx, false);
    return c->out[0] ? MG_OK : MG_ERR;
  }
  bool keep = mg_op_recording() && !mg_op_second_order();
  if ((c->out[0] = gelu_bf16(x, approx, keep ? &d : NULL)) == NULL) return MG_ERR;
  if (d) c->res[c->nres++] = d;
  return MG_OK;
}
MG_ROW(GELU, gelu) = {
  .forward = gelu_forward,
  .info = {.name = "gelu", .kind = MG_OP_OTHER,
           .doc = "x * Phi(x), the Gaussian error linear unit (exact, or the tanh approximation)"},
  .saves = MG_SAVE_IN(0), .backward = gelu_backward, .reuses_gradient = true,
  .saves_with_residuals = MG_SAVE_OUT(1),
};

mg_tensor *mg_gelu (mg_tensor *x, int approximate) {
  MG_CHECK_ARG("mg_gelu", x, NULL);
  bool bf16 = x->dtype == MG_BFLOAT16 && mg_half_isa(MG_BFLOAT16) != NULL;   /* gelu_bf16, like the products */
  RETRY_AS(x, mg_is_half(x->dtype) && !bf16, MG_FLOAT32, mg_gelu(x, approximate));
  if (!bf16 && check_float("gelu", "x", x) != MG_OK) return NULL;
  mg_attr attr = {0};
  attr.a[0] = approximate != 0;
  mg_opcall c = MG_OPCALL(&gelu_op, 1, &x, &attr, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

/* }============================================================= */


/* {================ scaled_dot_product_attention ================= */

/* one operand's matrices: the batch entry b's (rows, cols) matrix starts
** at base + off(b) elements, rows ld apart, columns adjacent */
typedef struct mat_view {
  const char *base;
  int64_t bstride[MG_MAX_DIMS];     /* per batch dimension, in elements */
  int64_t ld;
} mat_view;

/* everything the kernels need of one call */
typedef struct sdpa_geom {
  int nbd;                          /* batch dimensions */
  int64_t bshape[MG_MAX_DIMS], nb;  /* their sizes and product */
  int64_t Tq, Tk, dk, dv;
  double scale;
  bool causal;
  mat_view q, k, v, dout;
  const uint8_t *mask;              /* bool, broadcast to (..., Tq, Tk), or NULL */
  int64_t mbstride[MG_MAX_DIMS], mrow, mcol;
  size_t esz;
} sdpa_geom;

static int64_t offset_of (const sdpa_geom *g, const int64_t *bstride, int64_t b) {
  int64_t off = 0;
  for (int i = g->nbd - 1; i >= 0; i--) {
    off += (b % g->bshape[i]) * bstride[i];
    b /= g->bshape[i];
  }
  return off;
}

static const void *mat_at (const sdpa_geom *g, const mat_view *m, int64_t b) {
  return m->base + offset_of(g, m->bstride, b) * (int64_t)g->esz;
}

/* t as a mat_view when its last axis is adjacent and its rows do not
** overlap; otherwise *copy gets a contiguous copy and the view is of it */
static mg_status view_of (const mg_tensor *t, const sdpa_geom *g, mat_view *m, mg_tensor **copy) {
  int nd = t->ndim;
  int64_t rows = t->shape[nd - 2], cols = t->shape[nd - 1];
  int64_t rs = t->strides[nd - 2], cs = t->strides[nd - 1];
  *copy = NULL;
  const mg_tensor *src = t;
  if (!((cs == 1 || cols <= 1) && (rows <= 1 || rs >= cols))) {
    if ((*copy = mg_contiguous((mg_tensor *)t)) == NULL) return MG_ERR;
    src = *copy;
    rs = src->strides[nd - 2];
  }
  m->base = mg_ptr(src);
  m->ld = rows <= 1 ? (cols > 1 ? cols : 1) : rs;
  if (m->ld < cols) m->ld = cols > 0 ? cols : 1;
  for (int i = 0; i < g->nbd; i++) m->bstride[i] = src->strides[i];
  return MG_OK;
}

/* C (M,N) = alpha * op(A) op(B), row-major with leading dimensions; the
** float64 reference of dnnl_sgemm */
static void dgemm_ref (char ta, char tb, int64_t M, int64_t N, int64_t K, double alpha, const double *A,
                       int64_t lda, const double *B, int64_t ldb, double *C, int64_t ldc) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t p = 0; p < K; p++)
        s += (ta == 'N' ? A[i * lda + p] : A[p * lda + i]) * (tb == 'N' ? B[p * ldb + j] : B[j * ldb + p]);
      C[i * ldc + j] = alpha * s;
    }
}

/* C = alpha * op(A) op(B) in the tensor's dtype; beta 0 */
static void gemm (mg_dtype dt, char ta, char tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                  int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    memset(C, 0, (size_t)(M * ldc) * (dt == MG_FLOAT32 ? 4 : 8));
    return;
  }
  if (dt == MG_FLOAT32)
    dnnl_sgemm(ta, tb, M, N, K, (float)alpha, (const float *)A, lda, (const float *)B, ldb, 0.0f, (float *)C, ldc);
  else
    dgemm_ref(ta, tb, M, N, K, alpha, (const double *)A, lda, (const double *)B, ldb, (double *)C, ldc);
}

/* P (Tq,Tk), holding the scaled scores, becomes the masked softmax of
** each row: masked entries 0, a row with nothing to attend to all 0. A
** causal row i attends to its first i + 1 entries only: the rest are 0
** without an exp. A NaN (or +inf) among the scores a row attends to makes
** those entries NaN, as softmax and where give: the max skips NaN, so such
** a row is found by its sum, or by a max of -inf. */
#define SOFTMAX_ROWS(T, EXP) do {                                                   \
    T *P_ = (T *)P;                                                                 \
    const uint8_t *mb = g->mask ? g->mask + offset_of(g, g->mbstride, b) : NULL;    \
    for (int64_t i = 0; i < g->Tq; i++) {                                           \
      T *row = P_ + i * g->Tk, m, s;                                                \
      const uint8_t *mr = mb ? mb + i * g->mrow : NULL;                             \
      int64_t n = g->causal && i + 1 < g->Tk ? i + 1 : g->Tk;                       \
      for (int64_t j = n; j < g->Tk; j++) row[j] = 0;                               \
      if (mr)                                                                       \
        for (int64_t j = 0; j < n; j++)                                             \
          if (!mr[j * g->mcol]) row[j] = -INFINITY;                                 \
      LANE_MAX(T, m, row, n);                                                       \
      bool nan = false;                       /* a NaN or +inf score it attends to */ \
      if (m != -INFINITY) {                                                         \
        for (int64_t j = 0; j < n; j++) row[j] = EXP(row[j] - m);                   \
        LANE_SUM(T, s, n, row[j]);                                                  \
        if (s == s) {                                                               \
          T r = 1 / s;                                                              \
          for (int64_t j = 0; j < n; j++) row[j] *= r;                              \
          continue;                                                                 \
        }                                                                           \
        nan = true;                                                                 \
      } else {                                /* nothing to attend to, all -inf, or NaN */ \
        for (int64_t j = 0; j < n; j++) nan |= row[j] != row[j];                    \
      }                                                                             \
      for (int64_t j = 0; j < n; j++) row[j] = nan && !(mr && !mr[j * g->mcol]) ? (T)NAN : 0; \
    }                                                                               \
  } while (0)

/* C (M,N) float32 = op(A) op(B) of bfloat16 matrices (oneDNN's matmul, on
** this thread); false when oneDNN failed */
static bool gemm_bf16 (char ta, char tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                       const void *B, int64_t ldb, float *C) {
  return mg_gemm_half(ta, tb, M, N, K, MG_BFLOAT16, A, lda, B, ldb, NULL, C, MG_FLOAT32) == MG_OK;
}

/* n float32 values rounded into bfloat16 rows of `cols` at dst, ld apart */
static void round_rows (void *dst, int64_t ld, const float *src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    mg_convert((uint16_t *)dst + r * ld, MG_BFLOAT16, src + r * cols, MG_FLOAT32, cols);
}

/* P (Tq,Tk), holding entry b's scaled scores, becomes its weights */
static void softmax_tile (const sdpa_geom *g, mg_dtype dt, int64_t b, void *P) {
  if (dt == MG_FLOAT64) SOFTMAX_ROWS(double, exp);
  else SOFTMAX_ROWS(float, expf);
}

/* P (Tq,Tk) = the attention weights of batch entry b (float32 for bfloat16
** q and k); false when a product failed */
static bool weights (const sdpa_geom *g, mg_dtype dt, int64_t b, void *P) {
  if (dt == MG_BFLOAT16) {
    float *S = (float *)P;
    if (!gemm_bf16('N', 'T', g->Tq, g->Tk, g->dk, mat_at(g, &g->q, b), g->q.ld, mat_at(g, &g->k, b), g->k.ld, S))
      return false;
    for (int64_t i = 0; i < g->Tq * g->Tk; i++) S[i] *= (float)g->scale;
  } else {
    gemm(dt, 'N', 'T', g->Tq, g->Tk, g->dk, g->scale, mat_at(g, &g->q, b), g->q.ld, mat_at(g, &g->k, b), g->k.ld,
         P, g->Tk);
  }
  softmax_tile(g, dt, b, P);
  return true;
}

/* a failure seen by one of the team's threads */
#define FAILED(ok) do { _Pragma("omp atomic write") ok = false; } while (0)

/* a thread's scratch: the weights P and their gradient dP (Tq,Tk) in the
** sums' dtype; for bfloat16 also P (or dS) rounded, and a float32 tile for
** one product's result before its rounding */
typedef struct sdpa_work { size_t p, pb, o, total; } sdpa_work;
#define ROUND64(n) (((n) + 63) & ~(size_t)63)

static sdpa_work work_sizes (const sdpa_geom *g, mg_dtype dt, int tiles) {
  bool half = dt == MG_BFLOAT16;
  int64_t rows = g->Tq > g->Tk ? g->Tq : g->Tk, cols = g->dk > g->dv ? g->dk : g->dv;
  sdpa_work w;                                 /* each part on its own cache lines: aligned for its dtype too */
  w.p = ROUND64((size_t)(g->Tq * g->Tk) * (half ? sizeof(float) : g->esz));
  w.pb = half ? ROUND64((size_t)(g->Tq * g->Tk) * 2) : 0;
  w.o = half ? ROUND64((size_t)(rows * cols) * sizeof(float)) : 0;
  w.total = (size_t)tiles * w.p + w.pb + w.o;
  return w;
}

/* out (nb, Tq, dv) = P v for every batch entry, one per thread at a time;
** false when a bfloat16 product failed */
static bool sdpa_forward_kernel (const sdpa_geom *g, mg_dtype dt, char *out, char *work, int nthr) {
  sdpa_work w = work_sizes(g, dt, 1);
  bool ok = true;
  MG_PARALLEL_FOR(nthr > 1, schedule(dynamic) num_threads(nthr),
  for (int64_t b = 0; b < g->nb; b++) {
    char *P = work + w.total * (size_t)omp_get_thread_num(), *Pb = P + w.p;
    float *O = (float *)(Pb + w.pb);
    char *ob = out + (size_t)(b * g->Tq * g->dv) * g->esz;
    if (dt != MG_BFLOAT16) {
      weights(g, dt, b, P);
      gemm(dt, 'N', 'N', g->Tq, g->dv, g->Tk, 1.0, P, g->Tk, mat_at(g, &g->v, b), g->v.ld, ob, g->dv);
    } else if (weights(g, dt, b, P)) {
      mg_convert(Pb, MG_BFLOAT16, P, MG_FLOAT32, g->Tq * g->Tk);
      if (gemm_bf16('N', 'N', g->Tq, g->dv, g->Tk, Pb, g->Tk, mat_at(g, &g->v, b), g->v.ld, O))
        round_rows(ob, g->dv, O, g->Tq, g->dv);
      else FAILED(ok);
    } else {
      FAILED(ok);
    }
  });
  return ok;
}

/* dS = P * (dP - rowsum(P * dP)) * scale, in place of dP; 0 where P is 0
** (a masked entry of a NaN row stays 0, as through where) */
/* (the scale and lengths in locals, both sides of the select computed: a
** store through d could otherwise reach g, and the loop ran scalar) */
#define SOFTMAX_GRAD(T) do {                                                        \
    const T *restrict P_ = (const T *)P; T *restrict S_ = (T *)dP;                  \
    const T scale_ = (T)g->scale;                                                   \
    const int64_t Tq_ = g->Tq, Tk_ = g->Tk;                                         \
    for (int64_t i = 0; i < Tq_; i++) {                                             \
      const T *restrict p = P_ + i * Tk_; T *restrict d = S_ + i * Tk_, s;          \
      LANE_SUM(T, s, Tk_, p[j] * d[j]);                                             \
      for (int64_t j = 0; j < Tk_; j++) {                                           \
        T v = p[j] * (d[j] - s) * scale_;                                           \
        d[j] = p[j] == 0 ? 0 : v;                                                   \
      }                                                                             \
    }                                                                               \
  } while (0)

/* dP (Tq,Tk) float32 becomes dS from the weights P */
static void softmax_grad_tile (const sdpa_geom *g, const float *P, float *dP) { SOFTMAX_GRAD(float); }

/* {------- bfloat16 attention, the whole batch per product -------
** Per-entry oneDNN calls cost as much as the products themselves at 64 x 64 x
** 64 (a GPT's heads): with at most two batch dimensions each product is one
** strided 4-D matmul over a chunk of the batch, and the softmax passes run
** between them on the chunk's float32 scores, scratch of (chunk, Tq, Tk)
** kept under CHUNK_BYTES (longer sequences take the per-entry loop). */
#define CHUNK_BYTES ((size_t)8 << 20)

typedef struct chunking {
  int64_t B0, B1;                   /* the batch as two dimensions (1s in front) */
  int64_t per;                      /* entries of dimension 0 per chunk */
  bool heads_last;                  /* 4-D: results laid out as heads_last4 says */
} chunking;

static bool chunk_plan (const sdpa_geom *g, size_t bytes_per_entry, chunking *c) {
  if (g->nbd > 2 || g->nb == 0 || g->Tq == 0 || g->Tk == 0 || g->dk == 0 || g->dv == 0) return false;
  const mat_view *m[4] = {&g->q, &g->k, &g->v, &g->dout};
  for (int i = 0; i < 4; i++)                     /* a broadcast operand (batch stride 0): entry by entry */
    for (int d = 0; m[i]->base && d < g->nbd; d++)
      if (m[i]->bstride[d] == 0 && g->bshape[d] > 1) return false;
  c->B1 = g->nbd >= 1 ? g->bshape[g->nbd - 1] : 1;
  c->B0 = g->nbd == 2 ? g->bshape[0] : 1;
  c->heads_last = g->nbd == 2;
  size_t slice = bytes_per_entry * (size_t)c->B1;
  if (slice > 4 * CHUNK_BYTES) return false;
  c->per = CHUNK_BYTES / slice > 0 ? (int64_t)(CHUNK_BYTES / slice) : 1;
  if (c->per > c->B0) c->per = c->B0;
  return true;
}

/* the chunks of each pass: a weight is float32 scores and bfloat16 weights
** in the forward; scores, their gradient (float32) and a bfloat16 tile in
** the backward. The forward asks the backward's too: weights kept for a
** backward that is not batched would go unread. */
static bool forward_chunks (const sdpa_geom *g, chunking *c) { return chunk_plan(g, (size_t)(g->Tq * g->Tk) * 6, c); }
static bool backward_chunks (const sdpa_geom *g, chunking *c) { return chunk_plan(g, (size_t)(g->Tq * g->Tk) * 10, c); }

/* the 4-D strides of a matrix operand: its batch strides (for the two
** dimensions; a missing one spans the rest), then rows and columns */
static void strides4 (const sdpa_geom *g, const int64_t *bstride, int64_t B1, int64_t span, int64_t rs, int64_t cs,
                      int64_t out[4]) {
  out[1] = g->nbd >= 1 ? bstride[g->nbd - 1] : span;
  out[0] = g->nbd == 2 ? bstride[0] : out[1] * B1;
  out[2] = rs;
  out[3] = cs;
}

/* strides of a contiguous (B0, B1, R, C) tile */
static void dense4 (int64_t B1, int64_t R, int64_t C, int64_t out[4]) {
  out[0] = B1 * R * C; out[1] = R * C; out[2] = C; out[3] = 1;
}

/* strides of a (B0, B1, R, C) tensor stored as (B0, R, B1, C): the heads of
** (batch, heads, time, features) side by side in memory, as the projections
** make q, k, v and read the output back (PyTorch's fused attention does the
** same): swapping axes 2 and 3 then gives a contiguous tensor, so the
** reshapes around attention are views, forward and backward */
static void heads_last4 (int64_t B1, int64_t R, int64_t C, int64_t out[4]) {
  out[0] = R * B1 * C; out[1] = C; out[2] = B1 * C; out[3] = 1;
}

/* a new (B0, B1, R, C) tensor of dtype dt with heads_last4's strides */
static mg_tensor *heads_last_tensor (const int64_t shape[4], mg_dtype dt) {
  int64_t stored[4] = {shape[0], shape[2], shape[1], shape[3]}, strides[4];
  heads_last4(shape[1], shape[2], shape[3], strides);
  mg_tensor *t = mg_empty(stored, 4, dt);
  mg_tensor *v = t ? mg_tensor_view(t->storage, dt, shape, 4, strides, t->offset) : NULL;
  mg_tensor_release(t);
  return v;
}

/* one batched product of a chunk: c = a @ b, dims {cn, B1, M, N, K} */
static bool bmm (const chunking *ch, int64_t cn, int64_t M, int64_t N, int64_t K, const void *a, const int64_t as[4],
                 const void *b, const int64_t bs[4], void *c, const int64_t cs[4], mg_dtype cdt) {
  int64_t dims[5] = {cn, ch->B1, M, N, K};
  return mg_gemm_half_batched(dims, a, as, b, bs, c, cs, cdt) == MG_OK;
}

/* q, k, v and dout of chunk c0 (its first dimension-0 entry) */
static const char *at0 (const sdpa_geom *g, const mat_view *m, int64_t c0) {
  return m->base + (g->nbd == 2 ? c0 * m->bstride[0] : 0) * (int64_t)g->esz;
}

/* S (cn*B1 entries of Tq x Tk, float32) = scale * q k^T of a chunk, then
** the weights P in place and rounded into Pb */
static bool chunk_weights (const sdpa_geom *g, const chunking *ch, int64_t c0, int64_t cn, float *S, uint16_t *Pb) {
  int64_t qs[4], ks[4], ss[4];
  int64_t span = g->Tq * g->q.ld + g->dk;
  strides4(g, g->q.bstride, ch->B1, span, g->q.ld, 1, qs);
  strides4(g, g->k.bstride, ch->B1, g->Tk * g->k.ld + g->dk, 1, g->k.ld, ks);     /* k^T */
  dense4(ch->B1, g->Tq, g->Tk, ss);
  if (!bmm(ch, cn, g->Tq, g->Tk, g->dk, at0(g, &g->q, c0), qs, at0(g, &g->k, c0), ks, S, ss, MG_FLOAT32))
    return false;
  int64_t n = cn * ch->B1, tile = g->Tq * g->Tk;
  MG_PARALLEL_FOR(n * tile >= 65536, ,
  for (int64_t j = 0; j < n; j++) {
    float *P = S + j * tile;
    for (int64_t i = 0; i < tile; i++) P[i] *= (float)g->scale;
    softmax_tile(g, MG_FLOAT32, c0 * ch->B1 + j, P);
    mg_convert(Pb + j * tile, MG_BFLOAT16, P, MG_FLOAT32, tile);
  });
  return true;
}

/* out (nb, Tq, dv) bfloat16, and the weights into kept (nb, Tq, Tk) when
** not NULL (the backward's residual); false when a product failed */
static bool forward_batched (const sdpa_geom *g, const chunking *ch, char *out, uint16_t *kept, char *work) {
  size_t tile = (size_t)(g->Tq * g->Tk);
  float *S = (float *)work;
  uint16_t *scratch_Pb = (uint16_t *)(work + ROUND64((size_t)(ch->per * ch->B1) * tile * 4));
  int64_t vs[4], os[4], ps[4];
  strides4(g, g->v.bstride, ch->B1, g->Tk * g->v.ld + g->dv, g->v.ld, 1, vs);
  (ch->heads_last ? heads_last4 : dense4)(ch->B1, g->Tq, g->dv, os);   /* as sdpa_forward made it */
  dense4(ch->B1, g->Tq, g->Tk, ps);
  for (int64_t c0 = 0; c0 < ch->B0; c0 += ch->per) {
    int64_t cn = ch->B0 - c0 < ch->per ? ch->B0 - c0 : ch->per;
    uint16_t *Pb = kept ? kept + (size_t)(c0 * ch->B1) * tile : scratch_Pb;
    if (!chunk_weights(g, ch, c0, cn, S, Pb)) return false;
    char *o = out + (size_t)(c0 * ch->B1 * g->Tq * g->dv) * 2;
    if (!bmm(ch, cn, g->Tq, g->dv, g->Tk, Pb, ps, at0(g, &g->v, c0), vs, o, os, MG_BFLOAT16)) return false;
  }
  return true;
}

/* dq, dk, dv (any NULL) bfloat16, from the forward's weights `kept` when
** not NULL (else computed again); false when a product failed */
static bool backward_batched (const sdpa_geom *g, const chunking *ch, const uint16_t *kept, char *dq, char *dk,
                              char *dv, char *work) {
  size_t tile = (size_t)(g->Tq * g->Tk), f32 = ROUND64((size_t)(ch->per * ch->B1) * tile * 4);
  float *S = (float *)work, *dP = (float *)(work + f32);
  uint16_t *Pb = (uint16_t *)(work + 2 * f32);
  int64_t qs[4], ks[4], vT[4], ds[4], ps[4], pT[4], gq[4], gk[4], gv[4];
  strides4(g, g->q.bstride, ch->B1, g->Tq * g->q.ld + g->dk, g->q.ld, 1, qs);
  strides4(g, g->k.bstride, ch->B1, g->Tk * g->k.ld + g->dk, g->k.ld, 1, ks);
  strides4(g, g->v.bstride, ch->B1, g->Tk * g->v.ld + g->dv, 1, g->v.ld, vT);      /* v^T */
  strides4(g, g->dout.bstride, ch->B1, g->Tq * g->dout.ld + g->dv, g->dout.ld, 1, ds);
  dense4(ch->B1, g->Tq, g->Tk, ps);
  pT[0] = ps[0]; pT[1] = ps[1]; pT[2] = 1; pT[3] = g->Tk;                           /* P^T, dS^T */
  void (*layout)(int64_t, int64_t, int64_t, int64_t *) = ch->heads_last ? heads_last4 : dense4;
  layout(ch->B1, g->Tq, g->dk, gq);           /* as sdpa_backward_fused made them */
  layout(ch->B1, g->Tk, g->dk, gk);
  layout(ch->B1, g->Tk, g->dv, gv);
  for (int64_t c0 = 0; c0 < ch->B0; c0 += ch->per) {
    int64_t cn = ch->B0 - c0 < ch->per ? ch->B0 - c0 : ch->per, e0 = c0 * ch->B1;
    /* the weights, bfloat16; the softmax's gradient reads them widened from
    ** these, kept or just computed, so both paths give the same bits */
    const uint16_t *W = kept ? kept + (size_t)e0 * tile : Pb;
    if (!kept && !chunk_weights(g, ch, c0, cn, S, Pb)) return false;
    const char *DO = at0(g, &g->dout, c0), *Q = at0(g, &g->q, c0), *K = at0(g, &g->k, c0);
    if (dv && !bmm(ch, cn, g->Tk, g->dv, g->Tq, W, pT, DO, ds, dv + (size_t)(e0 * g->Tk * g->dv) * 2, gv, MG_BFLOAT16))
      return false;
    if (!dq && !dk) continue;
    if (!bmm(ch, cn, g->Tq, g->Tk, g->dv, DO, ds, at0(g, &g->v, c0), vT, dP, ps, MG_FLOAT32)) return false;
    int64_t n = cn * ch->B1;
    MG_PARALLEL_FOR(n * (int64_t)tile >= 65536, ,
    for (int64_t j = 0; j < n; j++) {
      float *P = S + (size_t)j * tile;
      float *dPj = dP + (size_t)j * tile;
      mg_convert(P, MG_FLOAT32, W + (size_t)j * tile, MG_BFLOAT16, (int64_t)tile);
      softmax_grad_tile(g, P, dPj);
      mg_convert(Pb + (size_t)j * tile, MG_BFLOAT16, dPj, MG_FLOAT32, (int64_t)tile);     /* dS, rounded */
    });
    if (dq && !bmm(ch, cn, g->Tq, g->dk, g->Tk, Pb, ps, K, ks, dq + (size_t)(e0 * g->Tq * g->dk) * 2, gq, MG_BFLOAT16))
      return false;
    if (dk && !bmm(ch, cn, g->Tk, g->dk, g->Tq, Pb, pT, Q, qs, dk + (size_t)(e0 * g->Tk * g->dk) * 2, gk, MG_BFLOAT16))
      return false;
  }
  return true;
}

/* }------------------------------------------------------------- */

/* the backward of one batch entry with bfloat16 q, k, v and dout: the
** float32 code's steps, each product oneDNN's bfloat16 one into the
** float32 tile O and rounded into its gradient; false when one failed */
static bool backward_bf16 (const sdpa_geom *g, int64_t b, char *dq, char *dk, char *dv, char *P, const sdpa_work *w) {
  char *dP = P + w->p, *Pb = dP + w->p;
  float *O = (float *)(Pb + w->pb);
  const void *Q = mat_at(g, &g->q, b), *K = mat_at(g, &g->k, b), *V = mat_at(g, &g->v, b);
  const void *DO = mat_at(g, &g->dout, b);
  size_t esz = 2;
  if (!weights(g, MG_BFLOAT16, b, P)) return false;
  if (dv) {
    mg_convert(Pb, MG_BFLOAT16, P, MG_FLOAT32, g->Tq * g->Tk);
    if (!gemm_bf16('T', 'N', g->Tk, g->dv, g->Tq, Pb, g->Tk, DO, g->dout.ld, O)) return false;
    round_rows(dv + (size_t)(b * g->Tk * g->dv) * esz, g->dv, O, g->Tk, g->dv);
  }
  if (!dq && !dk) return true;
  if (!gemm_bf16('N', 'T', g->Tq, g->Tk, g->dv, DO, g->dout.ld, V, g->v.ld, (float *)dP)) return false;
  SOFTMAX_GRAD(float);
  mg_convert(Pb, MG_BFLOAT16, dP, MG_FLOAT32, g->Tq * g->Tk);      /* dS, rounded */
  if (dq) {
    if (!gemm_bf16('N', 'N', g->Tq, g->dk, g->Tk, Pb, g->Tk, K, g->k.ld, O)) return false;
    round_rows(dq + (size_t)(b * g->Tq * g->dk) * esz, g->dk, O, g->Tq, g->dk);
  }
  if (dk) {
    if (!gemm_bf16('T', 'N', g->Tk, g->dk, g->Tq, Pb, g->Tk, Q, g->q.ld, O)) return false;
    round_rows(dk + (size_t)(b * g->Tk * g->dk) * esz, g->dk, O, g->Tk, g->dk);
  }
  return true;
}

/* dq, dk, dv (any may be NULL) from dout, for every batch entry; false when
** a bfloat16 product failed */
static bool sdpa_backward_kernel (const sdpa_geom *g, mg_dtype dt, char *dq, char *dk, char *dv, char *work,
                                  int nthr) {
  sdpa_work w = work_sizes(g, dt, 2);
  bool ok = true;
  MG_PARALLEL_FOR(nthr > 1, schedule(dynamic) num_threads(nthr),
  for (int64_t b = 0; b < g->nb; b++) {
    char *P = work + w.total * (size_t)omp_get_thread_num(), *dP = P + w.p;
    if (dt == MG_BFLOAT16) {
      if (!backward_bf16(g, b, dq, dk, dv, P, &w)) FAILED(ok);
      continue;
    }
    const void *Q = mat_at(g, &g->q, b), *K = mat_at(g, &g->k, b), *V = mat_at(g, &g->v, b);
    const void *DO = mat_at(g, &g->dout, b);
    weights(g, dt, b, P);
    if (dv) gemm(dt, 'T', 'N', g->Tk, g->dv, g->Tq, 1.0, P, g->Tk, DO, g->dout.ld,
                 dv + (size_t)(b * g->Tk * g->dv) * g->esz, g->dv);
    if (!dq && !dk) continue;
    gemm(dt, 'N', 'T', g->Tq, g->Tk, g->dv, 1.0, DO, g->dout.ld, V, g->v.ld, dP, g->Tk);
    if (dt == MG_FLOAT32) SOFTMAX_GRAD(float);
    else SOFTMAX_GRAD(double);
    if (dq) gemm(dt, 'N', 'N', g->Tq, g->dk, g->Tk, 1.0, dP, g->Tk, K, g->k.ld,
                 dq + (size_t)(b * g->Tq * g->dk) * g->esz, g->dk);
    if (dk) gemm(dt, 'T', 'N', g->Tk, g->dk, g->Tq, 1.0, dP, g->Tk, Q, g->q.ld,
                 dk + (size_t)(b * g->Tk * g->dk) * g->esz, g->dk);
  });
  return ok;
}

/* fills g from q, k, v and the broadcast mask; copies (to release) get
** whatever had to be made contiguous */
static mg_status geom_of (sdpa_geom *g, mg_tensor *q, mg_tensor *k, mg_tensor *v, mg_tensor *mask, bool causal,
                          double scale, mg_tensor *copies[4]) {
  int nd = q->ndim;
  memset(g, 0, sizeof *g);
  g->nbd = nd - 2;
  g->nb = 1;
  for (int i = 0; i < g->nbd; i++) g->nb *= (g->bshape[i] = q->shape[i]);
  g->Tq = q->shape[nd - 2]; g->Tk = k->shape[nd - 2];
  g->dk = q->shape[nd - 1]; g->dv = v->shape[nd - 1];
  g->scale = scale;
  g->causal = causal;
  g->esz = mg_dtype_size(q->dtype);
  if (view_of(q, g, &g->q, &copies[0]) != MG_OK || view_of(k, g, &g->k, &copies[1]) != MG_OK ||
      view_of(v, g, &g->v, &copies[2]) != MG_OK) return MG_ERR;
  if (mask) {
    int64_t shape[MG_MAX_DIMS];
    memcpy(shape, q->shape, sizeof(int64_t) * (size_t)nd);
    shape[nd - 1] = g->Tk;
    if ((copies[3] = mg_broadcast_to(mask, shape, nd)) == NULL) return MG_ERR;
    g->mask = (const uint8_t *)mg_ptr(copies[3]);
    for (int i = 0; i < g->nbd; i++) g->mbstride[i] = copies[3]->strides[i];
    g->mrow = copies[3]->strides[nd - 2];
    g->mcol = copies[3]->strides[nd - 1];
  }
  return MG_OK;
}

static int threads_for (const sdpa_geom *g) {
  int n = omp_get_max_threads();
  return g->nb < n ? (int)(g->nb > 0 ? g->nb : 1) : n;
}

/* the fused backward; din[0..2] for q, k, v as needed */
static mg_status sdpa_backward_fused (mg_node *n, mg_tensor *dout, mg_tensor **din) {
  mg_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *mask = n->nin > 3 ? n->in[3] : NULL;
  mg_tensor *copies[6] = {NULL, NULL, NULL, NULL, NULL, NULL}, *grads[3] = {NULL, NULL, NULL};
  sdpa_geom g;
  mg_status st = geom_of(&g, q, k, v, mask, n->attr->a[0], n->attr->f, copies);
  if (st == MG_OK) st = view_of(dout, &g, &g.dout, &copies[4]);
  int nthr = st == MG_OK ? threads_for(&g) : 1;
  chunking ch;
  size_t tile = st == MG_OK ? (size_t)(g.Tq * g.Tk) : 0;
  bool batched = st == MG_OK && q->dtype == MG_BFLOAT16 && backward_chunks(&g, &ch);
  mg_tensor *src[3] = {q, k, v};
  for (int j = 0; j < 3 && st == MG_OK; j++)
    if (n->needs[j] && (grads[j] = batched && ch.heads_last ? heads_last_tensor(src[j]->shape, src[j]->dtype)
                                                            : mg_empty(src[j]->shape, src[j]->ndim, src[j]->dtype)) == NULL)
      st = MG_ERR;
  size_t f32 = batched ? ROUND64((size_t)(ch.per * ch.B1) * tile * 4) : 0;
  mg_storage *work = st != MG_OK ? NULL
                   : batched ? scratch(2 * f32 + (size_t)(ch.per * ch.B1) * tile * 2)
                             : scratch(work_sizes(&g, q->dtype, 2).total * (size_t)nthr);
  if (work == NULL) st = MG_ERR;
  if (st == MG_OK && mg_dry_running()) {          /* a dry run computes nothing */
  } else if (st == MG_OK && g.nb > 0 && g.Tq > 0 && g.Tk > 0) {
    char *p[3];
    for (int j = 0; j < 3; j++) p[j] = grads[j] ? mg_ptr(grads[j]) : NULL;
    /* the forward's weights (a saved-tensor hook may give them back in other strides) */
    copies[5] = batched && n->nout > 1 && n->out[1] ? mg_contiguous(n->out[1]) : NULL;
    const uint16_t *kept = copies[5] ? (const uint16_t *)mg_ptr(copies[5]) : NULL;
    bool ok = batched ? backward_batched(&g, &ch, kept, p[0], p[1], p[2], (char *)work->data)
                      : sdpa_backward_kernel(&g, q->dtype, p[0], p[1], p[2], (char *)work->data, nthr);
    if (!ok) st = mg_seterror("scaled_dot_product_attention: a bfloat16 product of the backward failed (out of memory?)");
  } else if (st == MG_OK) {          /* nothing attended to: zero gradients */
    for (int j = 0; j < 3; j++)
      if (grads[j] && grads[j]->numel) memset(mg_ptr(grads[j]), 0, (size_t)grads[j]->numel * g.esz);
  }
  mg_storage_release(work);
  for (int i = 0; i < 6; i++) mg_tensor_release(copies[i]);
  for (int j = 0; j < 3; j++) {
    if (st == MG_OK) din[j] = grads[j];
    else mg_tensor_release(grads[j]);
  }
  return st;
}

/* the boolean (Tq,Tk) matrix of j <= i */
static mg_tensor *causal_mask (int64_t Tq, int64_t Tk) {
  mg_scope sc = {0};
  int64_t rs[2] = {Tq, 1}, cs[2] = {1, Tk};
  mg_tensor *i = mg_tmp(&sc, mg_reshape(mg_tmp(&sc, mg_arange_int64(0, Tq, 1)), rs, 2));
  mg_tensor *j = mg_tmp(&sc, mg_reshape(mg_tmp(&sc, mg_arange_int64(0, Tk, 1)), cs, 2));
  mg_tensor *m = mg_less_equal(j, i);
  mg_scope_end(&sc);
  return m;
}

/* the attention weights with public ops (the reference, and what a tape
** recording the backward sees): softmax of the masked scores, 0 where
** masked and in rows with nothing to attend to */
static mg_tensor *weights_ops (mg_tensor *q, mg_tensor *k, mg_tensor *mask, bool causal, double scale) {
  mg_scope sc = {0};
  int nd = q->ndim;
  mg_tensor *s = mg_tmp(&sc, mg_matmul(q, mg_tmp(&sc, mg_transpose(k, nd - 2, nd - 1))));
  s = mg_tmp(&sc, mg_mul(s, mg_tmp(&sc, mg_scalar(scale, q->dtype))));
  mg_tensor *m = mask;
  if (causal) {
    mg_tensor *c = mg_tmp(&sc, causal_mask(q->shape[nd - 2], k->shape[nd - 2]));
    m = mask ? mg_tmp(&sc, mg_logical_and(mask, c)) : c;
  }
  mg_tensor *p;
  if (m) {
    mg_tensor *low = mg_tmp(&sc, mg_scalar(q->dtype == MG_FLOAT32 ? -FLT_MAX : -DBL_MAX, q->dtype));
    mg_tensor *zero = mg_tmp(&sc, mg_scalar(0, q->dtype));
    p = mg_tmp(&sc, mg_softmax(mg_tmp(&sc, mg_where(m, s, low)), nd - 1));
    p = mg_where(m, p, zero);
  } else {
    p = mg_softmax(s, nd - 1);
  }
  mg_scope_end(&sc);
  return p;
}

/* the backward with public ops, for a tape that records it */
static mg_status sdpa_backward_ops (mg_node *n, mg_tensor *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *mask = n->nin > 3 ? n->in[3] : NULL;
  if (q->dtype == MG_BFLOAT16) {      /* autocast's: in float32 (the tape casts the gradients back) */
    q = mg_tmp(&sc, mg_half_to_float32(q));
    k = mg_tmp(&sc, mg_half_to_float32(k));
    v = mg_tmp(&sc, mg_half_to_float32(v));
    dout = mg_tmp(&sc, mg_half_to_float32(dout));
    if (!q || !k || !v || !dout) {
      mg_scope_end(&sc);
      return MG_ERR;
    }
  }
  int nd = q->ndim;
  mg_tensor *scale = mg_tmp(&sc, mg_scalar(n->attr->f, q->dtype));
  mg_tensor *p = mg_tmp(&sc, weights_ops(q, k, mask, n->attr->a[0], n->attr->f));
  if (n->needs[2]) din[2] = mg_matmul(mg_tmp(&sc, mg_transpose(p, nd - 2, nd - 1)), dout);
  if (n->needs[0] || n->needs[1]) {
    mg_tensor *dp = mg_tmp(&sc, mg_matmul(dout, mg_tmp(&sc, mg_transpose(v, nd - 2, nd - 1))));
    mg_tensor *rs = mg_tmp(&sc, mg_sum(mg_tmp(&sc, mg_mul(p, dp)), nd - 1, 1));
    mg_tensor *ds = mg_tmp(&sc, mg_mul(mg_tmp(&sc, mg_mul(p, mg_tmp(&sc, mg_sub(dp, rs)))), scale));
    if (mask || n->attr->a[0]) {          /* 0 where P is 0, as the fused kernel (a NaN row's masked entries) */
      mg_tensor *zero = mg_tmp(&sc, mg_scalar(0, q->dtype));
      ds = mg_tmp(&sc, mg_where(mg_tmp(&sc, mg_not_equal(p, zero)), ds, zero));
    }
    if (n->needs[0]) din[0] = mg_matmul(ds, k);
    if (n->needs[1]) din[1] = mg_matmul(mg_tmp(&sc, mg_transpose(ds, nd - 2, nd - 1)), q);
  }
  mg_scope_end(&sc);
  return MG_OK;
}

/* scaled_dot_product_attention: out = P v with P = softmax(q k^T * scale)
** over the keys, masked (0 where masked).  grad: dv = P^T dout,
** dS = P * (dout v^T - rowsum(P * dout v^T)) * scale, dq = dS k, dk = dS^T q */
static mg_status sdpa_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  if (recorded_backward()) return sdpa_backward_ops(n, dout[0], din);
  return sdpa_backward_fused(n, dout[0], din);
}
/* two products: q @ k^T and p @ v, each (..., Lq, D) by Lk */
static double sdpa_macs (const mg_node *n) {
  const mg_meta *q = &n->in_meta[0], *k = &n->in_meta[1];
  double c = 2;
  for (int d = 0; d < q->ndim; d++) c *= (double)q->shape[d];
  return k->ndim >= 2 ? c * (double)k->shape[k->ndim - 2] : c;
}
static mg_status sdpa_forward (mg_opcall *c);
MG_ROW(SDPA, sdpa) = {
  .forward = sdpa_forward,
  .info = {.name = "scaled_dot_product_attention", .kind = MG_OP_OTHER,
           .doc = "softmax(q @ k^T * scale, masked) @ v, fused; keeps q, k, v for its gradient (and its bfloat16 weights when no larger than q)",
           .product = 1},
  .macs = sdpa_macs, .saves = MG_SAVE_INPUTS, .backward = sdpa_backward,
  .saves_with_residuals = MG_SAVE_INPUTS | MG_SAVE_OUT(1),
};

/* the checks of q, k, v and mask; MG_ERR + error */
static mg_status sdpa_check (const char *fn, const mg_tensor *q, const mg_tensor *k, const mg_tensor *v,
                             const mg_tensor *mask, const mg_attention_params *p) {
  char s1[160], s2[160];
  const mg_tensor *t[3] = {q, k, v};
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    if (t[i]->dtype != MG_BFLOAT16 && check_float(fn, names[i], t[i]) != MG_OK) return MG_ERR;
    if (t[i]->ndim < 2)
      return mg_seterror("%s: %s must have at least 2 dimensions (..., positions, features), got shape %s", fn,
                         names[i], mg_shape_str(s1, sizeof s1, t[i]->shape, t[i]->ndim));
  }
  if (check_same_dtype(fn, "q", q, "k", k) != MG_OK || check_same_dtype(fn, "q", q, "v", v) != MG_OK) return MG_ERR;
  int nd = q->ndim;
  for (int i = 1; i < 3; i++)
    if (t[i]->ndim != nd || !mg_same_shape(q->shape, nd - 2, t[i]->shape, nd - 2))
      return mg_seterror("%s: q and %s must have the same batch dimensions, got %s and %s", fn, names[i],
                         mg_shape_str(s1, sizeof s1, q->shape, nd), mg_shape_str(s2, sizeof s2, t[i]->shape, t[i]->ndim));
  if (q->shape[nd - 1] != k->shape[nd - 1])
    return mg_seterror("%s: q and k must have the same last axis (features), got %s and %s", fn,
                       mg_shape_str(s1, sizeof s1, q->shape, nd), mg_shape_str(s2, sizeof s2, k->shape, nd));
  if (k->shape[nd - 2] != v->shape[nd - 2])
    return mg_seterror("%s: k and v must have as many positions (their axis " MG_POS "), got %s and %s", fn, (long long)nd - 2,
                       mg_shape_str(s1, sizeof s1, k->shape, nd), mg_shape_str(s2, sizeof s2, v->shape, nd));
  if (p && !(p->scale >= 0 && p->scale < INFINITY))
    return mg_seterror("%s: scale must be a finite number > 0 (0: 1/sqrt(features)), got %g", fn, p->scale);
  if (mask == NULL) return MG_OK;
  if (mask->dtype != MG_BOOL)
    return mg_seterror("%s: mask must be bool (true: attend), got %s", fn, mg_dtype_name(mask->dtype));
  int64_t shape[MG_MAX_DIMS];
  memcpy(shape, q->shape, sizeof(int64_t) * (size_t)nd);
  shape[nd - 1] = k->shape[nd - 2];
  bool fits = mask->ndim <= nd;
  for (int i = 0; fits && i < mask->ndim; i++) {
    int64_t m = mask->shape[mask->ndim - 1 - i];
    fits = m == 1 || m == shape[nd - 1 - i];
  }
  if (!fits)
    return mg_seterror("%s: mask of shape %s does not broadcast to the attention weights' shape %s", fn,
                       mg_shape_str(s1, sizeof s1, mask->shape, mask->ndim), mg_shape_str(s2, sizeof s2, shape, nd));
  return MG_OK;
}

static mg_tensor *attention_of (mg_tensor *q, mg_tensor *k, mg_tensor *v, mg_tensor *mask,
                                const mg_attention_params *p);

mg_tensor *mg_scaled_dot_product_attention (mg_tensor *q, mg_tensor *k, mg_tensor *v, mg_tensor *mask,
                                            const mg_attention_params *p) {
  MG_CHECK_ARG("mg_scaled_dot_product_attention", q, NULL);
  MG_CHECK_ARG("mg_scaled_dot_product_attention", k, NULL);
  MG_CHECK_ARG("mg_scaled_dot_product_attention", v, NULL);
  /* under autocast: bfloat16 q, k, v, as the other products' operands; not
  ** where the CPU has no bfloat16 products (they would be widened again:
  ** float32's speed, with rounded inputs and float32 copies on the tape).
  ** float16 always: its products are widened anyway, for float16's numerics */
  bool cast = mg_autocast_dtype() == MG_FLOAT16 || mg_half_isa(MG_BFLOAT16) != NULL;
  mg_tensor *qh = cast ? mg_autocast_operand(q) : mg_tensor_retain(q);
  mg_tensor *kh = cast ? mg_autocast_operand(k) : mg_tensor_retain(k);
  mg_tensor *vh = cast ? mg_autocast_operand(v) : mg_tensor_retain(v);
  mg_tensor *r = qh && kh && vh ? attention_of(qh, kh, vh, mask, p) : NULL;
  mg_tensor_release(qh);
  mg_tensor_release(kh);
  mg_tensor_release(vh);
  return r;
}

/* attention of q, k, v as they are */
static mg_tensor *attention_of (mg_tensor *q, mg_tensor *k, mg_tensor *v, mg_tensor *mask,
                                const mg_attention_params *p) {
  const char *fn = "scaled_dot_product_attention";
  bool bf16 = q->dtype == MG_BFLOAT16 && k->dtype == MG_BFLOAT16 && v->dtype == MG_BFLOAT16;
  if (bf16 && mg_half_isa(MG_BFLOAT16) == NULL) bf16 = false;
  if (!bf16 && (mg_is_half(q->dtype) || mg_is_half(k->dtype) || mg_is_half(v->dtype))) {
    /* float32 kernels for half q, k, v with no bfloat16 products here (or mixed dtypes): widened once */
    mg_tensor *q32 = mg_half_to_float32(q), *k32 = mg_half_to_float32(k), *v32 = mg_half_to_float32(v);
    mg_tensor *r = q32 && k32 && v32 ? attention_of(q32, k32, v32, mask, p) : NULL;
    mg_tensor_release(q32);
    mg_tensor_release(k32);
    mg_tensor_release(v32);
    bool f16 = q->dtype == MG_FLOAT16 && k->dtype == MG_FLOAT16 && v->dtype == MG_FLOAT16;
    return f16 ? mg_rounded_float16(r) : r;         /* a float16 product's result, as matmul's */
  }
  if (sdpa_check(fn, q, k, v, mask, p) != MG_OK) return NULL;
  int nd = q->ndim;
  double scale = p && p->scale > 0 ? p->scale : 1 / sqrt((double)(q->shape[nd - 1] > 0 ? q->shape[nd - 1] : 1));
  mg_attr attr = {0};
  attr.a[0] = p && p->causal;
  attr.a[1] = mask != NULL;
  attr.f = scale;
  mg_tensor *in[4] = {q, k, v, mask};
  int nin = mask ? 4 : 3;
  int64_t shape[MG_MAX_DIMS];
  memcpy(shape, q->shape, sizeof(int64_t) * (size_t)nd);
  shape[nd - 1] = v->shape[nd - 1];
  if (mg_shape_numel(fn, shape, nd) < 0) return NULL;
  mg_opcall c = MG_OPCALL(&sdpa_op, nin, in, &attr, shape, nd, q->dtype);
  return mg_dispatch(&c);
}

/* the kernel: softmax(q k^T * scale, masked) v, a block of rows per thread */
static mg_status sdpa_forward (mg_opcall *c) {
  mg_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2], *mask = c->attr->a[1] ? c->in[3] : NULL;
  double scale = c->attr->f;
  mg_tensor *copies[4] = {NULL, NULL, NULL, NULL}, *out = NULL;
  sdpa_geom g;
  mg_status st = geom_of(&g, q, k, v, mask, c->attr->a[0], scale, copies);
  int nthr = st == MG_OK ? threads_for(&g) : 1;
  chunking ch;
  size_t tile = st == MG_OK ? (size_t)(g.Tq * g.Tk) : 0;
  bool batched = st == MG_OK && q->dtype == MG_BFLOAT16 && forward_chunks(&g, &ch);
  if (st == MG_OK)
    out = batched && ch.heads_last ? heads_last_tensor(c->shape, c->dtype) : mg_empty(c->shape, c->ndim, c->dtype);
  if (out == NULL) st = MG_ERR;
  mg_tensor *kept = NULL;           /* the weights for the backward: no larger than q, bfloat16 */
  chunking back;                    /* (which the backward reads only where it is batched too) */
  if (st == MG_OK && batched && g.Tk <= g.dk && mg_op_recording() && backward_chunks(&g, &back)) {
    int64_t shape[MG_MAX_DIMS];
    memcpy(shape, q->shape, sizeof(int64_t) * (size_t)q->ndim);
    shape[q->ndim - 1] = g.Tk;
    if ((kept = mg_empty(shape, q->ndim, MG_BFLOAT16)) == NULL) st = MG_ERR;
  }
  mg_storage *work = st != MG_OK ? NULL
                   : batched ? scratch(ROUND64((size_t)(ch.per * ch.B1) * tile * 4) + (size_t)(ch.per * ch.B1) * tile * 2)
                             : scratch(work_sizes(&g, q->dtype, 1).total * (size_t)nthr);
  if (work == NULL) st = MG_ERR;
  if (st == MG_OK && out->numel > 0 && !mg_dry_running()) {      /* a dry run computes nothing */
    if (g.Tk == 0) memset(mg_ptr(out), 0, (size_t)out->numel * g.esz);   /* nothing to attend to */
    else if (!(batched ? forward_batched(&g, &ch, mg_ptr(out), kept ? (uint16_t *)mg_ptr(kept) : NULL,
                                         (char *)work->data)
                       : sdpa_forward_kernel(&g, q->dtype, mg_ptr(out), (char *)work->data, nthr)))
      st = mg_seterror("scaled_dot_product_attention: a bfloat16 product failed (out of memory?)");
  }
  mg_storage_release(work);
  for (int i = 0; i < 4; i++) mg_tensor_release(copies[i]);
  if (st != MG_OK) {
    mg_tensor_release(out);
    mg_tensor_release(kept);
    return MG_ERR;
  }
  c->out[0] = out;
  if (kept) c->res[c->nres++] = kept;
  return MG_OK;
}

/* }============================================================= */


MG_FAMILY(mg_attention_ops, ATTENTION_OPS, ATTENTION__COUNT);

/*
** nn.c — softmax and log_softmax, fused for numerical stability.
**
** Both subtract the running maximum before exponentiating, which a
** composite of exp/sum/div cannot do without overflowing for large logits.
*/
#include <math.h>

#include "ops/op.h"
#include "lanes.h"
#include "vecmath.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define NN_OPS(X) \
  X(SOFTMAX, softmax) X(LOG_SOFTMAX, log_softmax)
enum { NN_OPS(MG_ROW_ENUM) NN__COUNT };

/* y over (outer, n, inner) with the reduced axis in the middle. Rows of
** adjacent values (inner 1, the usual last axis) take their max and sum in
** lanes (lanes.h) and their exps in a loop of their own, so that all three
** vectorise; a running sum kept the exps scalar. */
#define SOFTMAX_BODY(T, EXP, LOG) do {                                         \
    const T *X = (const T *)mg_ptr(xc); T *Y = (T *)mg_ptr(out);               \
    if (inner == 1 && n >= LANES) {                                           \
      MG_PARALLEL_FOR(outer * n > 65536, ,                                    \
      for (int64_t o = 0; o < outer; o++) {                                    \
        const T *xr = X + o * n; T *y = Y + o * n, m, s;                       \
        LANE_MAX(T, m, xr, n);                                                 \
        for (int64_t k = 0; k < n; k++) y[k] = EXP(xr[k] - m);                 \
        LANE_SUM(T, s, n, y[j]);                                               \
        if (log_form) {                                                        \
          T ls = LOG(s);                                                       \
          for (int64_t k = 0; k < n; k++) y[k] = (xr[k] - m) - ls;             \
        } else {                                                               \
          T r = 1 / s;                                                         \
          for (int64_t k = 0; k < n; k++) y[k] *= r;                           \
        }                                                                      \
      });                                                                      \
      break;                                                                   \
    }                                                                          \
    MG_PARALLEL_FOR(outer * n * inner > 65536, ,                               \
    for (int64_t o = 0; o < outer; o++)                                        \
      for (int64_t i = 0; i < inner; i++) {                                    \
        const T *xr = X + o * n * inner + i; T *y = Y + o * n * inner + i;      \
        T m = xr[0];                                                            \
        for (int64_t k = 1; k < n; k++) if (xr[k * inner] > m) m = xr[k * inner]; \
        T s = 0;                                                               \
        for (int64_t k = 0; k < n; k++) { T e = EXP(xr[k * inner] - m); y[k * inner] = e; s += e; } \
        if (log_form) {                                                        \
          T ls = LOG(s);                                                       \
          for (int64_t k = 0; k < n; k++) y[k * inner] = (xr[k * inner] - m) - ls; \
        } else {                                                               \
          T r = 1 / s;                                                         \
          for (int64_t k = 0; k < n; k++) y[k * inner] *= r;                   \
        }                                                                      \
      });                                                                      \
  } while (0)

static const mg_opdef softmax_op, log_softmax_op;
static mg_status softmax_run (mg_opcall *c);

/* the kernel of softmax and log_softmax over c->attr->axis */
static mg_status softmax_run (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  int a = c->attr->axis;
  bool log_form = c->def == &log_softmax_op;
  int64_t outer = 1, n = x->shape[a], inner = 1;
  for (int i = 0; i < a; i++) outer *= x->shape[i];
  for (int i = a + 1; i < x->ndim; i++) inner *= x->shape[i];
  mg_tensor *xc = mg_contiguous(x), *out = mg_empty(x->shape, x->ndim, x->dtype);
  if (xc && out && n > 0) {
    if (x->dtype == MG_FLOAT32) SOFTMAX_BODY(float, expf, logf);
    else SOFTMAX_BODY(double, exp, log);
  }
  mg_tensor_release(xc);
  if (xc == NULL || out == NULL) {
    mg_tensor_release(out);
    return MG_ERR;
  }
  c->out[0] = out;
  return MG_OK;
}

static mg_tensor *softmax_entry (mg_tensor *x, int axis, bool log_form) {
  MG_CHECK_ARG(log_form ? "mg_log_softmax" : "mg_softmax", x, NULL);
  const char *fn = log_form ? "log_softmax" : "softmax";
  if (mg_is_half(x->dtype)) {                 /* computed in float32 (autocast.c) */
    mg_tensor *x32 = mg_half_to_float32(x), *r = x32 ? softmax_entry(x32, axis, log_form) : NULL;
    mg_tensor_release(x32);
    return r;
  }
  if (!mg_is_float(x->dtype))
    return mg_seterror("%s: needs a float tensor, got %s", fn, mg_dtype_name(x->dtype)), NULL;
  int a = mg_check_axis(fn, axis, x->ndim);
  if (a < 0) return NULL;
  mg_attr attr = {0};
  attr.axis = a;
  mg_opcall c = MG_OPCALL(log_form ? &log_softmax_op : &softmax_op, 1, &x, &attr, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

/* softmax: y = exp(x - max) / sum(exp(x - max)) over axis.
** grad: dx = y * (dout - sum(dout * y, axis)) */
mg_tensor *mg_softmax (mg_tensor *x, int axis) { return softmax_entry(x, axis, false); }

static mg_status softmax_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *y = n->out[0];
  mg_tensor *s = mg_tmp(&sc, mg_sum(mg_tmp(&sc, mg_mul(dout[0], y)), n->attr->axis, 1));
  din[0] = mg_mul(y, mg_tmp(&sc, mg_sub(dout[0], s)));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(SOFTMAX, softmax) = {.forward = softmax_run, .info = {.name = "softmax", .kind = MG_OP_OTHER, .doc = "exp(x) / sum(exp(x)) along an axis, computed stably"}, .saves = MG_SAVE_OUT(0), .backward = softmax_backward};

/* log_softmax: y = (x - max) - log(sum(exp(x - max))) over axis (in that
** order: x - (max + log(...)) rounds the large sum, off by 1e-4 in float32
** at logits of 1e4).
** grad: dx = dout - exp(y) * sum(dout, axis) */
mg_tensor *mg_log_softmax (mg_tensor *x, int axis) { return softmax_entry(x, axis, true); }

static mg_status log_softmax_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *p = mg_tmp(&sc, mg_exp(n->out[0]));
  mg_tensor *s = mg_tmp(&sc, mg_sum(dout[0], n->attr->axis, 1));
  din[0] = mg_sub(dout[0], mg_tmp(&sc, mg_mul(p, s)));
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(LOG_SOFTMAX, log_softmax) = {.forward = softmax_run, .info = {.name = "log_softmax", .kind = MG_OP_OTHER, .doc = "log(softmax(x)) along an axis, computed stably"}, .saves = MG_SAVE_OUT(0), .backward = log_softmax_backward};

MG_FAMILY(mg_nn_ops, NN_OPS, NN__COUNT);

/*
** optim.c — the optimizers' steps, each one pass over a variable's value:
** Adam (and AdamW), SGD with momentum (and Nesterov), RMSprop. Each gives
** the numbers of the separate ops it replaces; variable.c says where the
** new value is written (in place when no one else holds the old one).
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"

/* the updates run in a piece per thread from 2 * OPTIM_GRAIN values
** (mg_for_pieces): tens of microseconds of work a 256 x 256 kernel */
#define OPTIM_GRAIN 16384

/* {========================= checks ============================ */

/* the variable a step updates holds float32 or float64 */
static mg_status check_steppable (const char *fn, const mg_tensor *cur) {
  if (mg_is_float(cur->dtype) && mg_check_computable(fn, cur->dtype) == MG_OK) return MG_OK;
  return mg_seterror("%s: the variable must be float32 or float64, got %s", fn, mg_dtype_name(cur->dtype));
}

/* t (may be NULL) has v's shape and dtype, or an error naming fn and `what` */
static mg_status check_like (const char *fn, const mg_tensor *cur, const mg_tensor *t, const char *what) {
  char a[160], b[160];
  if (t == NULL) return MG_OK;
  if (t->dtype != cur->dtype)
    return mg_seterror("%s: %s is %s, the variable is %s", fn, what, mg_dtype_name(t->dtype), mg_dtype_name(cur->dtype));
  if (!mg_same_shape(t->shape, t->ndim, cur->shape, cur->ndim))
    return mg_seterror("%s: %s has shape %s, the variable %s", fn, what, mg_shape_str(a, sizeof a, t->shape, t->ndim),
                       mg_shape_str(b, sizeof b, cur->shape, cur->ndim));
  return MG_OK;
}

/* A dry run (mg.memory.estimate) counts a step's new slot and gives back
** the old one: the optimizer keeps its state, and nothing it held becomes
** garbage that the real step would not make. The first step's slot (no old
** one) is the fresh tensor. */
static mg_tensor *dry_slot (mg_tensor *fresh, mg_tensor *old) {
  if (!mg_dry_running() || old == NULL || fresh == NULL) return fresh;
  mg_tensor_release(fresh);
  return mg_tensor_retain(old);
}

/* }============================================================= */


/* {======================== Adam's step ========================= */

/* the step over values [lo, hi), each element's numbers those of the separate
** ops (mul, add, sqrt, div, axpy; the build contracts nothing into FMAs: -ffp-contract=off).
** One loop per case (slots or zeros, decay or none), each without a branch
** and on restrict pointers, so that it vectorises */
#define ADAM_CASE(M_I, S_I, DECAY)                                                    \
    for (int64_t i = lo; i < hi; i++) {                                               \
      T w = W[i], gi = G[i];                                                          \
      DECAY;                                                                          \
      T mi = (M_I) * b1 + gi * c1, si = (S_I) * b2 + gi * gi * c2;                    \
      MO[i] = mi;                                                                     \
      SO[i] = si;                                                                     \
      W[i] = w + step * (mi / (SQRT_OF(si) + eps));                                   \
    }
#define SQRT_OF(x) _Generic((x), float: sqrtf, default: sqrt)(x)

#define ADAM_RANGE(NAME, T_)                                                          \
  static void NAME (T_ *restrict W, const T_ *restrict G, const T_ *restrict M,        \
                    const T_ *restrict S, T_ *restrict MO, T_ *restrict SO, int64_t lo, \
                    int64_t hi, const mg_adam_params *p) {                            \
    typedef T_ T;                                                                     \
    const T b1 = (T)p->beta1, c1 = (T)(1 - p->beta1), b2 = (T)p->beta2, c2 = (T)(1 - p->beta2); \
    const T eps = (T)p->epsilon, step = (T)-p->step_size, dec = (T)-p->decay, zero = 0; \
    if (M && p->decay != 0) { ADAM_CASE(M[i], S[i], w = w + dec * w) }               \
    else if (M) { ADAM_CASE(M[i], S[i], (void)0) }                                    \
    else if (p->decay != 0) { ADAM_CASE(zero, zero, w = w + dec * w) }                \
    else { ADAM_CASE(zero, zero, (void)0) }                                           \
  }

ADAM_RANGE(adam_f32, float)
ADAM_RANGE(adam_f64, double)

/* w updated in place; m and s both given or both NULL (zeros); no buffer
** written is another's */
typedef struct { mg_dtype dt; void *w; const void *g, *m, *s; void *mo, *so; const mg_adam_params *p; } adam_bufs;

static void adam_block (const void *ctx, int64_t lo, int64_t hi) {
  const adam_bufs *k = (const adam_bufs *)ctx;
  if (k->dt == MG_FLOAT32) adam_f32(k->w, k->g, k->m, k->s, k->mo, k->so, lo, hi, k->p);
  else adam_f64(k->w, k->g, k->m, k->s, k->mo, k->so, lo, hi, k->p);
}

mg_status mg_variable_adam (mg_variable *v, mg_tensor *g, mg_tensor *m, mg_tensor *s, const mg_adam_params *p,
                            mg_tensor **m_out, mg_tensor **s_out) {
  MG_CHECK_ARG("mg_variable_adam", m_out, MG_ERR);
  MG_CHECK_ARG("mg_variable_adam", s_out, MG_ERR);
  *m_out = *s_out = NULL;
  MG_CHECK_ARG("mg_variable_adam", v, MG_ERR);
  MG_CHECK_ARG("mg_variable_adam", g, MG_ERR);
  MG_CHECK_ARG("mg_variable_adam", p, MG_ERR);
  mg_tensor *cur = v->value;
  if (check_steppable("adam", cur) != MG_OK || check_like("adam", cur, g, "the gradient") != MG_OK ||
      check_like("adam", cur, m, "slot m") != MG_OK || check_like("adam", cur, s, "slot v") != MG_OK)
    return MG_ERR;
  /* one slot alone (a state restored by hand): the other as zeros, so both or neither */
  bool slots = m || s;
  mg_tensor *in[3] = {mg_contiguous(g),
                      m ? mg_contiguous(m) : slots ? mg_full(cur->shape, cur->ndim, cur->dtype, 0.0) : NULL,
                      s ? mg_contiguous(s) : slots ? mg_full(cur->shape, cur->ndim, cur->dtype, 0.0) : NULL};
  mg_tensor *mo = mg_empty(cur->shape, cur->ndim, cur->dtype), *so = mg_empty(cur->shape, cur->ndim, cur->dtype);
  mg_tensor *dst = mg_variable_begin_write(v, in, 3);
  bool ok = in[0] && (!slots || (in[1] && in[2])) && mo && so && dst;
  if (ok) {
    adam_bufs k = {cur->dtype, mg_ptr(dst), mg_ptr(in[0]), in[1] ? mg_ptr(in[1]) : NULL,
                   in[2] ? mg_ptr(in[2]) : NULL, mg_ptr(mo), mg_ptr(so), p};
    if (!mg_dry_running()) mg_for_pieces(cur->numel, OPTIM_GRAIN, adam_block, &k);   /* a dry run writes nothing */
  }
  for (int i = 0; i < 3; i++) mg_tensor_release(in[i]);
  mg_variable_end_write(v, dst, ok);
  if (!ok) {
    mg_tensor_release(mo);
    mg_tensor_release(so);
    return MG_ERR;
  }
  *m_out = dry_slot(mo, m);
  *s_out = dry_slot(so, s);
  return MG_OK;
}

/* }============================================================= */

/* {================= SGD with momentum's step ================== */

/* the step over [lo, hi), the separate ops' numbers (mul, add, axpy);
** one branch-free loop per case, on restrict pointers */
#define MOMENTUM_CASE(B_I, STEP_X)                                                    \
    for (int64_t i = lo; i < hi; i++) {                                               \
      T gi = G[i], bi = B_I;                                                          \
      if (BO) BO[i] = bi;                                                             \
      W[i] = W[i] + step * (STEP_X);                                                  \
    }

#define MOMENTUM_RANGE(NAME, T_)                                                      \
  static void NAME (T_ *restrict W, const T_ *restrict G, const T_ *restrict B,        \
                    T_ *restrict BO, int64_t lo, int64_t hi, double momentum, double lr, \
                    bool nesterov) {                                                  \
    typedef T_ T;                                                                     \
    const T mu = (T)momentum, step = (T)-lr;                                          \
    if (B && nesterov) { MOMENTUM_CASE(B[i] * mu + gi, gi + bi * mu) }               \
    else if (B) { MOMENTUM_CASE(B[i] * mu + gi, bi) }                                 \
    else if (nesterov) { MOMENTUM_CASE(gi, gi + bi * mu) }                            \
    else { MOMENTUM_CASE(gi, bi) }                                                    \
  }

MOMENTUM_RANGE(momentum_f32, float)
MOMENTUM_RANGE(momentum_f64, double)

/* bo NULL when b is (the first step) */
typedef struct { mg_dtype dt; void *w; const void *g, *b; void *bo; double momentum, lr; bool nesterov; } momentum_bufs;

static void momentum_block (const void *ctx, int64_t lo, int64_t hi) {
  const momentum_bufs *k = (const momentum_bufs *)ctx;
  if (k->dt == MG_FLOAT32) momentum_f32(k->w, k->g, k->b, k->bo, lo, hi, k->momentum, k->lr, k->nesterov);
  else momentum_f64(k->w, k->g, k->b, k->bo, lo, hi, k->momentum, k->lr, k->nesterov);
}

mg_status mg_variable_momentum (mg_variable *v, mg_tensor *g, mg_tensor *b, double momentum, double lr,
                                int nesterov, mg_tensor **b_out) {
  MG_CHECK_ARG("mg_variable_momentum", b_out, MG_ERR);
  *b_out = NULL;
  MG_CHECK_ARG("mg_variable_momentum", v, MG_ERR);
  MG_CHECK_ARG("mg_variable_momentum", g, MG_ERR);
  mg_tensor *cur = v->value;
  if (check_steppable("momentum", cur) != MG_OK || check_like("momentum", cur, g, "the gradient") != MG_OK ||
      check_like("momentum", cur, b, "slot momentum") != MG_OK)
    return MG_ERR;
  mg_tensor *in[2] = {mg_contiguous(g), b ? mg_contiguous(b) : NULL};
  /* the first step's buffer is g itself, as PyTorch's */
  mg_tensor *bo = b ? mg_empty(cur->shape, cur->ndim, cur->dtype) : mg_retain_or_null(in[0]);
  mg_tensor *dst = mg_variable_begin_write(v, in, 2);
  bool ok = in[0] && (in[1] || !b) && bo && dst;
  if (ok) {
    momentum_bufs k = {cur->dtype, mg_ptr(dst), mg_ptr(in[0]), in[1] ? mg_ptr(in[1]) : NULL, b ? mg_ptr(bo) : NULL,
                       momentum, lr, nesterov != 0};
    if (!mg_dry_running()) mg_for_pieces(cur->numel, OPTIM_GRAIN, momentum_block, &k);   /* a dry run writes nothing */
  }
  for (int i = 0; i < 2; i++) mg_tensor_release(in[i]);
  mg_variable_end_write(v, dst, ok);
  if (!ok) {
    mg_tensor_release(bo);
    return MG_ERR;
  }
  *b_out = dry_slot(bo, b);
  return MG_OK;
}

/* }============================================================= */

/* {======================= RMSprop's step ======================= */

/* the step over [lo, hi), the separate ops' numbers (Keras' rule, as
** optim.lua wrote it op by op); one branch-free loop per case */
#define RMSPROP_CASE(DENOM, UPDATE)                                                   \
    for (int64_t i = lo; i < hi; i++) {                                               \
      T gi = G[i], vi = V[i] * rho + gi * gi * c;                                     \
      VO[i] = vi;                                                                     \
      T st = gi / (SQRT_OF(DENOM));                                                   \
      UPDATE;                                                                         \
    }

#define RMSPROP_RANGE(NAME, T_)                                                       \
  static void NAME (T_ *restrict W, const T_ *restrict G, const T_ *restrict V,        \
                    const T_ *restrict A, const T_ *restrict B, T_ *restrict VO,      \
                    T_ *restrict AO, T_ *restrict BO, int64_t lo, int64_t hi,         \
                    const mg_rmsprop_params *p) {                                     \
    typedef T_ T;                                                                     \
    const T rho = (T)p->rho, c = (T)(1 - p->rho), eps = (T)p->epsilon, mom = (T)p->momentum; \
    const T lr = (T)p->lr, minus_lr = (T)-p->lr, minus_one = (T)-1;                   \
    if (A && B) {                                                                     \
      RMSPROP_CASE((AO[i] = A[i] * rho + gi * c, vi - AO[i] * AO[i] + eps),          \
                   (BO[i] = B[i] * mom + st * lr, W[i] = W[i] + minus_one * BO[i]))   \
    } else if (A) {                                                                   \
      RMSPROP_CASE((AO[i] = A[i] * rho + gi * c, vi - AO[i] * AO[i] + eps), W[i] = W[i] + minus_lr * st) \
    } else if (B) {                                                                   \
      RMSPROP_CASE(vi + eps, (BO[i] = B[i] * mom + st * lr, W[i] = W[i] + minus_one * BO[i])) \
    } else {                                                                          \
      RMSPROP_CASE(vi + eps, W[i] = W[i] + minus_lr * st)                             \
    }                                                                                 \
  }

RMSPROP_RANGE(rmsprop_f32, float)
RMSPROP_RANGE(rmsprop_f64, double)

typedef struct {
  mg_dtype dt; void *w; const void *g, *v, *a, *b; void *vo, *ao, *bo; const mg_rmsprop_params *p;
} rmsprop_bufs;

static void rmsprop_block (const void *ctx, int64_t lo, int64_t hi) {
  const rmsprop_bufs *k = (const rmsprop_bufs *)ctx;
  if (k->dt == MG_FLOAT32) rmsprop_f32(k->w, k->g, k->v, k->a, k->b, k->vo, k->ao, k->bo, lo, hi, k->p);
  else rmsprop_f64(k->w, k->g, k->v, k->a, k->b, k->vo, k->ao, k->bo, lo, hi, k->p);
}

mg_status mg_variable_rmsprop (mg_variable *v, mg_tensor *g, mg_tensor *const slots[3], const mg_rmsprop_params *p,
                               mg_tensor *out[3]) {
  MG_CHECK_ARG("mg_variable_rmsprop", out, MG_ERR);
  out[0] = out[1] = out[2] = NULL;
  MG_CHECK_ARG("mg_variable_rmsprop", v, MG_ERR);
  MG_CHECK_ARG("mg_variable_rmsprop", g, MG_ERR);
  MG_CHECK_ARG("mg_variable_rmsprop", slots, MG_ERR);
  MG_CHECK_ARG("mg_variable_rmsprop", p, MG_ERR);
  mg_tensor *cur = v->value;
  static const char *const names[3] = {"slot velocity", "slot average_gradient", "slot momentum"};
  if (check_steppable("rmsprop", cur) != MG_OK || check_like("rmsprop", cur, g, "the gradient") != MG_OK)
    return MG_ERR;
  for (int i = 0; i < 3; i++)
    if (check_like("rmsprop", cur, slots[i], names[i]) != MG_OK) return MG_ERR;
  /* the slots in use (velocity always; the average if centered, the buffer
  ** with momentum), zeros where none is kept yet */
  bool used[3] = {true, p->centered != 0, p->momentum > 0};
  mg_tensor *in[4] = {mg_contiguous(g), NULL, NULL, NULL};
  bool ok = in[0] != NULL;
  for (int i = 0; i < 3; i++) {
    if (!used[i]) continue;
    in[i + 1] = slots[i] ? mg_contiguous(slots[i]) : mg_full(cur->shape, cur->ndim, cur->dtype, 0.0);
    out[i] = mg_empty(cur->shape, cur->ndim, cur->dtype);
    ok = ok && in[i + 1] && out[i];
  }
  mg_tensor *dst = mg_variable_begin_write(v, in, 4);
  ok = ok && dst;
  if (ok) {
    rmsprop_bufs k = {cur->dtype, mg_ptr(dst), mg_ptr(in[0]), mg_ptr(in[1]), in[2] ? mg_ptr(in[2]) : NULL,
                      in[3] ? mg_ptr(in[3]) : NULL, mg_ptr(out[0]), out[1] ? mg_ptr(out[1]) : NULL,
                      out[2] ? mg_ptr(out[2]) : NULL, p};
    if (!mg_dry_running()) mg_for_pieces(cur->numel, OPTIM_GRAIN, rmsprop_block, &k);   /* a dry run writes nothing */
  }
  for (int i = 0; i < 4; i++) mg_tensor_release(in[i]);
  mg_variable_end_write(v, dst, ok);
  if (!ok) {
    for (int i = 0; i < 3; i++) {
      mg_tensor_release(out[i]);
      out[i] = NULL;
    }
    return MG_ERR;
  }
  for (int i = 0; i < 3; i++) out[i] = dry_slot(out[i], slots[i]);
  return MG_OK;
}

/* }============================================================= */

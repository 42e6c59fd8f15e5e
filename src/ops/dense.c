/*
** dense.c — the fully connected layer as one op: y = act(x @ w + b).
**
** The product goes to the GEMM (matmul.c's mg_matrix_product); the bias add
** and the activation then run as one pass over each block of output rows
** while it is in cache: the same sum as `add` and the activation op's own
** kernel, so the numbers are those of the three ops bit for bit. The tape
** holds one node (x, w and y) where it held three. The backward is the
** activation's one-pass gradient (relu_grad, tanh_grad, sigmoid_grad), the
** bias' column sum and two products, all public ops: a tape that records
** the backward sees differentiable steps. Under autocast, where none does,
** the weight and bias gradients come from one oneDNN call (gemm.c).
*/
#include <stdio.h>
#include <string.h>

#include "ops/op.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define DENSE_OPS(X) \
  X(DENSE, dense)
enum { DENSE_OPS(MG_ROW_ENUM) DENSE__COUNT };

/* the output rows a pass covers: about 16 KiB of float32, in L1 */
#define BLOCK_ELEMS 4096

/* y[r, :] = act(y[r, :] + b) for `rows` rows of n, in blocks of rows; when
** `out` is given (autocast's bfloat16 output), each block is also rounded
** into it while in cache */
static void bias_act (mg_dtype dt, char *y, const char *b, int64_t rows, int64_t n, mg_activation act,
                      char *out, mg_dtype out_dt) {
  size_t esz = mg_dtype_size(dt);
  mg_kernel k = mg_activation_kernel(act, dt);
  int64_t per = n >= BLOCK_ELEMS ? 1 : BLOCK_ELEMS / n, nblocks = (rows + per - 1) / per;
  MG_PARALLEL_FOR(rows * n >= MG_PARALLEL_MIN, ,
  for (int64_t blk = 0; blk < nblocks; blk++) {
    int64_t r0 = blk * per, r1 = r0 + per < rows ? r0 + per : rows;
    char *base = y + (size_t)(r0 * n) * esz;
    if (b) {
      for (int64_t r = r0; r < r1; r++) {
        if (dt == MG_FLOAT32) {
          float *yr = (float *)(y + (size_t)(r * n) * esz);
          const float *bf = (const float *)b;
          for (int64_t j = 0; j < n; j++) yr[j] = yr[j] + bf[j];
        } else {
          double *yr = (double *)(y + (size_t)(r * n) * esz);
          const double *bd = (const double *)b;
          for (int64_t j = 0; j < n; j++) yr[j] = yr[j] + bd[j];
        }
      }
    }
    if (k) {
      char *p[2] = {base, base};
      int64_t s[2] = {1, 1};
      k((r1 - r0) * n, p, s);
    }
    if (out) mg_convert(out + (size_t)(r0 * n) * mg_dtype_size(out_dt), out_dt, base, dt, (r1 - r0) * n);
  });
}

/* autocast's weight and bias gradients in one oneDNN call (gemm.c): for
** bfloat16 x and w, a bfloat16 output gradient g (rows, N) and a float32
** bias, when no tape records the backward (it needs public ops); false: the
** products and the bias sum instead */
static bool weight_grads_fused (mg_node *n, mg_tensor *g, int64_t rows, int64_t K, int64_t N, mg_tensor **din) {
  mg_tensor *x = n->in[0];
  bool bias = n->nin == 3 && n->needs[2];
  if (!n->needs[1] || x == NULL || x->dtype != MG_BFLOAT16 || g->dtype != MG_BFLOAT16 ||
      n->in_meta[1].dtype != MG_BFLOAT16 || (bias && n->in_meta[2].dtype != MG_FLOAT32) ||
      rows == 0 || K == 0 || N == 0 || mg_op_recorded() || mg_half_isa(MG_BFLOAT16) == NULL)
    return false;
  int64_t ws[2] = {K, N};
  mg_tensor *xc = mg_contiguous(x), *gc = mg_contiguous(g);
  mg_tensor *dw = mg_empty(ws, 2, MG_BFLOAT16), *db = bias ? mg_empty(&N, 1, MG_FLOAT32) : NULL;
  bool ok = xc && gc && dw && (!bias || db);
  if (ok && !mg_dry_running())          /* a dry run computes nothing */
    ok = mg_dense_weight_grads(rows, K, N, mg_ptr(xc), mg_ptr(gc), mg_ptr(dw), db ? (float *)mg_ptr(db) : NULL) == MG_OK;
  mg_tensor_release(xc);
  mg_tensor_release(gc);
  if (!ok) {                            /* (no oneDNN kernel, or no memory): the public ops instead */
    mg_tensor_release(dw);
    mg_tensor_release(db);
    return false;
  }
  din[1] = dw;
  if (bias) din[2] = db;
  return true;
}

static mg_status dense_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  const mg_meta *xm = &n->in_meta[0];
  mg_tensor *w = n->in[1];
  int64_t K = n->in_meta[1].shape[0], N = n->in_meta[1].shape[1], rows = 1;
  for (int d = 0; d < xm->ndim - 1; d++) rows *= xm->shape[d];
  /* over dout itself when the walk spares it: no second (rows, N) tensor */
  mg_tensor *g = mg_tmp(&sc, mg_activation_backward(n, (mg_activation)n->attr->a[0], dout[0], n->out[0]));
  mg_node_unkeep_out(n, 0);     /* y is done with: not held through the products */
  bool fused = g && weight_grads_fused(n, g, rows, K, N, din);
  if (!fused && n->nin == 3 && n->needs[2]) din[2] = mg_sum_to_shape(g, &N, 1);
  /* autocast's dense: the activation's gradient came back in float32, the
  ** products take it in w's bfloat16 */
  if (g && g->dtype != n->in_meta[1].dtype) g = mg_tmp(&sc, mg_cast(g, n->in_meta[1].dtype));
  int64_t s2[2] = {rows, N};
  mg_tensor *g2 = mg_tmp(&sc, mg_reshape(g, s2, 2));
  if (n->needs[0])
    din[0] = mg_reshape(mg_tmp(&sc, mg_matmul(g2, mg_tmp(&sc, mg_transpose(w, 0, 1)))), xm->shape, xm->ndim);
  if (n->needs[1] && !fused) {
    int64_t x2[2] = {rows, K};
    mg_tensor *xt = mg_tmp(&sc, mg_transpose(mg_tmp(&sc, mg_reshape(n->in[0], x2, 2)), 0, 1));
    din[1] = mg_matmul(xt, g2);
  }
  mg_scope_end(&sc);
  return MG_OK;
}

/* DTR rebuilds y from the inputs it kept */
static mg_tensor *dense_replay (const mg_node *n, mg_tensor *const *in) {
  return mg_dense(in[0], in[1], n->nin == 3 ? in[2] : NULL, mg_activation_name((mg_activation)n->attr->a[0]));
}

/* y for the activation's gradient, whichever is wanted; x for w's, w for x's */
static unsigned dense_saves (const mg_attr *attr) {
  return attr->a[0] != MG_ACT_LINEAR ? MG_SAVE_OUT(0) : 0;
}

static mg_status dense_forward (mg_opcall *c);
MG_ROW(DENSE, dense) = {
  .forward = dense_forward,
  .info = {.name = "dense", .kind = MG_OP_OTHER,
           .doc = "act(x @ w + b) in one op: the product, then the bias and activation in one pass",
           .product = 1},
  .macs = mg_product_macs, .saves_for = dense_saves, .grad_saves = {MG_SAVE_IN(1), MG_SAVE_IN(0)}, .backward = dense_backward, .replay = dense_replay, .reuses_gradient = true,
};

/* the checks: x (..., K) and w (K, N) of one float dtype, b (N) or NULL */
static mg_status check_dense (mg_tensor *x, mg_tensor *w, mg_tensor *b, const char *activation, mg_activation *act) {
  const char *fn = "dense";
  char s1[160], s2[160];
  if (!(mg_is_float(x->dtype) || mg_is_half(x->dtype)))
    return mg_seterror("%s: x must be float32, float64, bfloat16 or float16, got %s", fn, mg_dtype_name(x->dtype));
  /* a half product (autocast's) adds a float32 bias as it is; float16's any half one */
  bool b_ok = b == NULL || b->dtype == x->dtype || (mg_is_half(x->dtype) && b->dtype == MG_FLOAT32) ||
              (x->dtype == MG_FLOAT16 && mg_is_half(b->dtype));
  if (w->dtype != x->dtype || !b_ok)
    return mg_seterror("%s: dtypes differ: x is %s, %s is %s", fn, mg_dtype_name(x->dtype),
                       w->dtype != x->dtype ? "w" : "b", mg_dtype_name(w->dtype != x->dtype ? w->dtype : b->dtype));
  if (x->ndim == 0) return mg_seterror("%s: x must have at least 1 dimension, got a 0-d tensor", fn);
  if (w->ndim != 2)
    return mg_seterror("%s: w must be a matrix (in, out), got shape %s", fn,
                       mg_shape_str(s1, sizeof s1, w->shape, w->ndim));
  if (x->shape[x->ndim - 1] != w->shape[0])
    return mg_seterror("%s: inner dimensions differ: x %s @ w %s", fn, mg_shape_str(s1, sizeof s1, x->shape, x->ndim),
                       mg_shape_str(s2, sizeof s2, w->shape, w->ndim));
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[1]))
    return mg_seterror("%s: b has shape %s, expected (%lld) (w's columns)", fn,
                       mg_shape_str(s1, sizeof s1, b->shape, b->ndim), (long long)w->shape[1]);
  return mg_activation_parse(fn, activation, act);
}

static mg_tensor *dense_of (mg_tensor *x, mg_tensor *w, mg_tensor *b, const char *activation);

mg_tensor *mg_dense (mg_tensor *x, mg_tensor *w, mg_tensor *b, const char *activation) {
  MG_CHECK_ARG("mg_dense", x, NULL);
  MG_CHECK_ARG("mg_dense", w, NULL);
  AUTOCAST_PAIR(x, w, dense_of(x, w, b, activation));   /* under autocast: bfloat16 */
}

static mg_tensor *dense_of (mg_tensor *x, mg_tensor *w, mg_tensor *b, const char *activation) {
  mg_activation act = MG_ACT_LINEAR;
  if (check_dense(x, w, b, activation, &act) != MG_OK) return NULL;
  if (x->dtype == MG_FLOAT16 && b && mg_is_half(b->dtype)) {   /* the bias adds in float32 */
    mg_tensor *b32 = mg_cast(b, MG_FLOAT32), *r = b32 ? dense_of(x, w, b32, activation) : NULL;
    mg_tensor_release(b32);
    return r;
  }
  FLOAT16_AS_FLOAT32(x, w, dense_of(x, w, b, activation));
  int64_t shape[MG_MAX_DIMS];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[x->ndim - 1] = w->shape[1];
  mg_attr attr = {0};
  attr.a[0] = act;
  mg_tensor *in[3] = {x, w, b};
  mg_opcall c = MG_OPCALL(&dense_op, b ? 3 : 2, in, &attr, shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

/* the kernel: one GEMM, then the bias and activation in one pass */
static mg_status dense_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
  mg_activation act = (mg_activation)c->attr->a[0];
  int64_t K = w->shape[0], N = w->shape[1], rows = 1;
  for (int d = 0; d < x->ndim - 1; d++) rows *= x->shape[d];
  /* x as the (rows, K) matrix: a 2-D view as it is (transposed views too), more dimensions folded */
  mg_tensor *xc = x->ndim == 2 ? mg_tensor_retain(x) : mg_contiguous(x);
  int64_t s2[2] = {rows, K}, st2[2] = {K, 1};
  mg_tensor *x2 = xc == NULL ? NULL
                : x->ndim == 2 ? mg_tensor_retain(xc) : mg_tensor_view(xc->storage, xc->dtype, s2, 2, st2, xc->offset);
  mg_tensor *bc = NULL;                 /* the bias, contiguous, in the dtype the sums run in */
  mg_dtype sums = x->dtype == MG_BFLOAT16 ? MG_FLOAT32 : x->dtype;
  if (b && b->dtype == sums) bc = mg_contiguous(b);
  else if (b && (bc = mg_empty(b->shape, b->ndim, sums)) != NULL && mg_copy_into(bc, b) != MG_OK) {
    mg_tensor_release(bc);
    bc = NULL;
  }
  mg_tensor *out = mg_empty(c->shape, c->ndim, c->dtype);
  if (out == NULL) {                    /* too large, or out of memory: say whose output */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mg_errmsg_raw());
    mg_seterror("dense: %s", msg);
  }
  /* a bfloat16 product accumulates into float32, where the bias and activation go, then rounds once:
  ** inside oneDNN's matmul for a bias and relu (its epilogue), else in bias_act */
  bool epilogue = sums != c->dtype && (act == MG_ACT_LINEAR || act == MG_ACT_RELU);
  mg_tensor *acc = out && sums != out->dtype && !epilogue ? mg_empty(c->shape, c->ndim, sums) : mg_retain_or_null(out);
  mg_status st = x2 && acc && (bc || !b) ? MG_OK : MG_ERR;
  if (st == MG_OK && out->numel > 0 && epilogue) {
    mg_epilogue ep = {bc ? (const float *)mg_ptr(bc) : NULL, act == MG_ACT_RELU};
    st = mg_matrix_product(x2, mg_ptr(x2), w, mg_ptr(w), &ep, mg_ptr(out), rows, N, K, out->dtype);
  } else if (st == MG_OK && out->numel > 0) {
    if (K == 0) memset(mg_ptr(acc), 0, (size_t)acc->numel * mg_dtype_size(acc->dtype));
    else st = mg_matrix_product(x2, mg_ptr(x2), w, mg_ptr(w), NULL, mg_ptr(acc), rows, N, K, acc->dtype);
    if (st == MG_OK)
      bias_act(acc->dtype, mg_ptr(acc), bc ? mg_ptr(bc) : NULL, rows, N, act, acc != out ? mg_ptr(out) : NULL,
               out->dtype);
  }
  mg_tensor_release(acc);
  mg_tensor_release(xc);
  mg_tensor_release(x2);
  mg_tensor_release(bc);
  if (st != MG_OK) {
    mg_tensor_release(out);
    return MG_ERR;
  }
  c->out[0] = out;
  return MG_OK;
}

MG_FAMILY(mg_dense_ops, DENSE_OPS, DENSE__COUNT);

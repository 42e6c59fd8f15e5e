/*
** matmul.c — matrix products, batched and broadcast.
**
** float32 goes to mg_sgemm (gemm.c: oneDNN or OpenBLAS, whichever is
** fastest for the shape on this machine), bfloat16 (autocast's) to
** oneDNN's bfloat16 matmul, accumulating in float32. Transposed views reach it as 'T'
** flags rather than copies, and a batch of matrices times one shared
** matrix is folded into a single tall GEMM. float64 and int64 use a
** cache-friendly C loop (gradient checks, indices), parallel over rows.
*/
#include <string.h>

#include "ops/op.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define MATMUL_OPS(X) \
  X(MATMUL, matmul)
enum { MATMUL_OPS(MG_ROW_ENUM) MATMUL__COUNT };

/* how a (rows, cols) matrix view can be handed to a row-major GEMM */
typedef struct { char trans; int64_t ld; } gemm_layout;

static bool layout_of (const mg_tensor *t, gemm_layout *l) {
  int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
  int64_t rs = t->strides[t->ndim - 2], cs = t->strides[t->ndim - 1];
  if ((cs == 1 || cols == 1) && (rs >= cols || rows == 1)) {
    l->trans = 'N';
    l->ld = rows == 1 ? (cols > 1 ? cols : 1) : rs;
    if (l->ld < cols) l->ld = cols;
    return true;
  }
  if ((rs == 1 || rows == 1) && (cs >= rows || cols == 1)) {
    l->trans = 'T';
    l->ld = cols == 1 ? (rows > 1 ? rows : 1) : cs;
    if (l->ld < rows) l->ld = rows;
    return true;
  }
  return false;
}

/* C (M,N) = A (M,K) @ B (K,N), all contiguous row-major; C zeroed first */
#define SIMPLE_GEMM(T) do {                                                        \
    const T *A = (const T *)a; const T *B = (const T *)b; T *C = (T *)c;           \
    MG_PARALLEL_FOR(M * N * K > 32768, ,                                           \
    for (int64_t i = 0; i < M; i++) {                                              \
      T *crow = C + i * N;                                                         \
      for (int64_t j = 0; j < N; j++) crow[j] = 0;                                 \
      for (int64_t k = 0; k < K; k++) {                                            \
        T aik = A[i * K + k]; const T *brow = B + k * N;                           \
        for (int64_t j = 0; j < N; j++) crow[j] += aik * brow[j];                  \
      }                                                                            \
    });                                                                            \
  } while (0)

static void gemm_f64 (const void *a, const void *b, void *c, int64_t M, int64_t N, int64_t K) {
  SIMPLE_GEMM(double);
}

/* in unsigned arithmetic: overflow wraps (as NumPy's and the elementwise ops') */
static void gemm_i64 (const void *a, const void *b, void *c, int64_t M, int64_t N, int64_t K) {
  SIMPLE_GEMM(uint64_t);
}

/* one (M,K) @ (K,N) product of matrix views a and b into contiguous c, of
** a's dtype or (bfloat16 a) float32 */
mg_status mg_matrix_product (const mg_tensor *a, const char *pa, const mg_tensor *b, const char *pb,
                             const mg_epilogue *ep, char *pc, int64_t M, int64_t N, int64_t K, mg_dtype cdt) {
  mg_assert(ep == NULL || a->dtype == MG_BFLOAT16);
  gemm_layout la, lb;
  if (a->dtype == MG_FLOAT32 && layout_of(a, &la) && layout_of(b, &lb))
    return mg_sgemm(la.trans, lb.trans, M, N, K, (const float *)pa, la.ld, (const float *)pb, lb.ld,
                    (float *)pc);
  if (a->dtype == MG_BFLOAT16 && layout_of(a, &la) && layout_of(b, &lb))
    return mg_gemm_half(la.trans, lb.trans, M, N, K, a->dtype, pa, la.ld, pb, lb.ld, ep, pc, cdt);
  /* other dtypes and odd strides: contiguous copies of these two matrices */
  int64_t sa[2] = {M, K}, sb[2] = {K, N};
  int64_t sta[2] = {a->strides[a->ndim - 2], a->strides[a->ndim - 1]};
  int64_t stb[2] = {b->strides[b->ndim - 2], b->strides[b->ndim - 1]};
  size_t esz = mg_dtype_size(a->dtype);
  mg_tensor *av = mg_tensor_view(a->storage, a->dtype, sa, 2, sta, (pa - (char *)a->storage->data) / (int64_t)esz);
  mg_tensor *bv = mg_tensor_view(b->storage, b->dtype, sb, 2, stb, (pb - (char *)b->storage->data) / (int64_t)esz);
  mg_tensor *ac = av ? mg_contiguous(av) : NULL, *bc = bv ? mg_contiguous(bv) : NULL;
  mg_status st = MG_ERR;
  if (ac && bc) {
    st = MG_OK;
    if (a->dtype == MG_FLOAT32)
      st = mg_sgemm('N', 'N', M, N, K, (const float *)mg_ptr(ac), K, (const float *)mg_ptr(bc), N, (float *)pc);
    else if (a->dtype == MG_BFLOAT16)
      st = mg_gemm_half('N', 'N', M, N, K, a->dtype, mg_ptr(ac), K, mg_ptr(bc), N, ep, pc, cdt);
    else if (a->dtype == MG_FLOAT64)
      gemm_f64(mg_ptr(ac), mg_ptr(bc), pc, M, N, K);
    else
      gemm_i64(mg_ptr(ac), mg_ptr(bc), pc, M, N, K);
  }
  mg_tensor_release(av); mg_tensor_release(bv);
  mg_tensor_release(ac); mg_tensor_release(bc);
  return st;
}

static const mg_opdef matmul_op;
static mg_status matmul_forward (mg_opcall *c);

/* a (..., M, K) @ b (..., K, N), both with at least 2 dims */
static mg_tensor *matmul_nd (mg_tensor *a, mg_tensor *b) {
  char sa[160], sb[160];
  int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
  int64_t K2 = b->shape[b->ndim - 2], N = b->shape[b->ndim - 1];
  if (K != K2)
    return mg_seterror("matmul: inner dimensions differ: %s @ %s",
                       mg_shape_str(sa, sizeof sa, a->shape, a->ndim),
                       mg_shape_str(sb, sizeof sb, b->shape, b->ndim)), NULL;
  int64_t bshape[MG_MAX_DIMS], shape[MG_MAX_DIMS];
  int nb = mg_broadcast_shapes("matmul", "@", a->shape, a->ndim - 2, b->shape, b->ndim - 2, bshape);
  if (nb < 0)
    return mg_seterror("matmul: batch dimensions do not broadcast: %s @ %s",
                       mg_shape_str(sa, sizeof sa, a->shape, a->ndim),
                       mg_shape_str(sb, sizeof sb, b->shape, b->ndim)), NULL;
  if (nb + 2 > MG_MAX_DIMS) return mg_seterror("matmul: too many dimensions"), NULL;
  memcpy(shape, bshape, sizeof(int64_t) * (size_t)nb);
  shape[nb] = M;
  shape[nb + 1] = N;
  mg_tensor *in[2] = {a, b};
  mg_opcall c = MG_OPCALL(&matmul_op, 2, in, NULL, shape, nb + 2, a->dtype);
  return mg_dispatch(&c);
}

/* the kernel: batches of (M,K) @ (K,N) products into c's shape */
static mg_status matmul_forward (mg_opcall *c) {
  mg_tensor *a = c->in[0], *b = c->in[1];
  int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
  int nb = c->ndim - 2;
  const int64_t *bshape = c->shape;
  mg_tensor *out = mg_empty(c->shape, c->ndim, c->dtype);
  if (out == NULL) return MG_ERR;
  int64_t batch = 1;
  for (int i = 0; i < nb; i++) batch *= bshape[i];
  size_t esz = mg_dtype_size(a->dtype);
  mg_status st = MG_OK;
  if (K == 0) {
    memset(mg_ptr(out), 0, (size_t)out->numel * esz);
  } else if (b->ndim == 2 && a->ndim > 2 && mg_tensor_is_contiguous(a)) {
    /* a stack of matrices times one matrix: a single (batch*M, K) GEMM */
    int64_t s2[2] = {batch * M, K}, st2[2] = {K, 1};
    mg_tensor *a2 = mg_tensor_view(a->storage, a->dtype, s2, 2, st2, a->offset);
    st = a2 ? mg_matrix_product(a2, mg_ptr(a2), b, mg_ptr(b), NULL, mg_ptr(out), batch * M, N, K, out->dtype) : MG_ERR;
    mg_tensor_release(a2);
  } else {
    /* walk the broadcast batch with per-operand strides (0 when broadcast) */
    mg_tensor *ops[2] = {a, b};
    int64_t bst[2][MG_MAX_DIMS];
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < nb; i++) {
        int j = i - (nb - (ops[k]->ndim - 2));
        bst[k][i] = (j < 0 || ops[k]->shape[j] == 1) ? 0 : ops[k]->strides[j];
      }
    for (int64_t t = 0; t < batch && st == MG_OK; t++) {
      int64_t rem = t, oa = 0, ob = 0;
      for (int i = nb - 1; i >= 0; i--) {
        int64_t k = rem % bshape[i];
        rem /= bshape[i];
        oa += k * bst[0][i];
        ob += k * bst[1][i];
      }
      st = mg_matrix_product(a, mg_ptr(a) + oa * (int64_t)esz, b, mg_ptr(b) + ob * (int64_t)esz, NULL,
                mg_ptr(out) + t * M * N * (int64_t)esz, M, N, K, out->dtype);
    }
  }
  if (st != MG_OK) {
    mg_tensor_release(out);
    return MG_ERR;
  }
  c->out[0] = out;
  return MG_OK;
}

/* matmul: out = a @ b.  grad: da = dout @ b^T, db = a^T @ dout, each summed
** over broadcast batch dimensions */
static mg_tensor *matmul_of (mg_tensor *a, mg_tensor *b);

mg_tensor *mg_matmul (mg_tensor *a, mg_tensor *b) {
  MG_CHECK_ARG("mg_matmul", a, NULL);
  MG_CHECK_ARG("mg_matmul", b, NULL);
  AUTOCAST_PAIR(a, b, matmul_of(a, b));            /* under autocast: bfloat16 */
}

/* a @ b of one dtype (float16 in float32: no float16 kernels) */
static mg_tensor *matmul_of (mg_tensor *a, mg_tensor *b) {
  FLOAT16_AS_FLOAT32(a, b, matmul_of(a, b));
  if (a->dtype != b->dtype)
    return mg_seterror("matmul: dtypes differ: %s @ %s", mg_dtype_name(a->dtype),
                       mg_dtype_name(b->dtype)), NULL;
  if (a->dtype == MG_BOOL) return mg_seterror("matmul: not defined for bool tensors"), NULL;
  if (a->dtype != MG_BFLOAT16 && mg_check_computable("matmul", a->dtype) != MG_OK) return NULL;
  if (a->ndim == 0 || b->ndim == 0)
    return mg_seterror("matmul: needs tensors with at least 1 dimension, got a 0-d tensor "
                       "(use * for scalars)"), NULL;
  if (a->ndim >= 2 && b->ndim >= 2) return matmul_nd(a, b);
  /* vectors as in NumPy: (K) is (1,K) on the left and (K,1) on the right */
  mg_tensor *a2 = a->ndim == 1 ? mg_expand_dims(a, 0) : mg_tensor_retain(a);
  mg_tensor *b2 = b->ndim == 1 ? mg_expand_dims(b, 1) : mg_tensor_retain(b);
  mg_tensor *r = a2 && b2 ? matmul_nd(a2, b2) : NULL, *t;
  if (r && b->ndim == 1) { t = mg_squeeze(r, -1); mg_tensor_release(r); r = t; }
  if (r && a->ndim == 1) { t = mg_squeeze(r, b->ndim == 1 ? -1 : -2); mg_tensor_release(r); r = t; }
  mg_tensor_release(a2);
  mg_tensor_release(b2);
  return r;
}

static mg_status matmul_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *a = n->in[0], *b = n->in[1];
  if (n->needs[0]) {
    mg_tensor *g = mg_tmp(&sc, mg_matmul(dout[0], mg_tmp(&sc, mg_transpose(b, -2, -1))));
    din[0] = mg_sum_to_shape(g, n->in_meta[0].shape, n->in_meta[0].ndim);
  }
  if (n->needs[1]) {
    mg_tensor *g = mg_tmp(&sc, mg_matmul(mg_tmp(&sc, mg_transpose(a, -2, -1)), dout[0]));
    din[1] = mg_sum_to_shape(g, n->in_meta[1].shape, n->in_meta[1].ndim);
  }
  mg_scope_end(&sc);
  return MG_OK;
}
/* the output's elements times the inner dimension (a's last axis) */
double mg_product_macs (const mg_node *n) {
  double c = 1;
  for (int d = 0; d < n->out_meta[0].ndim; d++) c *= (double)n->out_meta[0].shape[d];
  const mg_meta *a = &n->in_meta[0];
  return a->ndim > 0 ? c * (double)a->shape[a->ndim - 1] : c;
}
MG_ROW(MATMUL, matmul) = {
  .info = {.name = "matmul", .kind = MG_OP_BINARY, .symbol = "@", .product = 1,
           .doc = "the matrix product a @ b (batched, broadcast, vectors)", .fn.binary = mg_matmul},
  .forward = matmul_forward,
  .grad_saves = {MG_SAVE_IN(1), MG_SAVE_IN(0)}, .backward = matmul_backward, .macs = mg_product_macs,
};

MG_FAMILY(mg_matmul_ops, MATMUL_OPS, MATMUL__COUNT);

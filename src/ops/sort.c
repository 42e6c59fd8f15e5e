/*
** sort.c — sort, argsort and topk along an axis.
**
** Each value becomes an unsigned key in the same order: floats their bits
** with the sign flipped (negatives all flipped), NaN above +inf (NumPy's
** and PyTorch's order) and -0 as 0; int64 its sign bit flipped; bool
** itself; descending order complements the key. (key, position) pairs are
** then sorted by an LSD radix sort on the key bytes that differ, which is
** stable, so equal values keep their order in both directions and ties go
** to the earlier position; rows of up to 32 entries use insertion sort,
** stable too. topk keeps the k best pairs in a heap when k is small next to
** the row, else sorts the row. Values are then read back by position, so
** they come out bit for bit (NaN payloads, -0). Rows run in parallel.
*/
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "ops/op.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define SORT_OPS(X) \
  X(SORT, sort) X(ARGSORT, argsort) X(TOPK, topk)
enum { SORT_OPS(MG_ROW_ENUM) SORT__COUNT };
static const mg_opdef sort_op, argsort_op, topk_op;


static int thread_num (void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* {====================== keys and sorting ===================== */

static inline uint64_t key_f32 (float v) {
  if (v != v) return 0xFFFFFFFFu;
  if (v == 0) v = 0.0f;                       /* -0 sorts as 0 */
  uint32_t b;
  memcpy(&b, &v, 4);
  return (b >> 31) ? (uint32_t)~b : (b | 0x80000000u);
}

static inline uint64_t key_f64 (double v) {
  if (v != v) return UINT64_MAX;
  if (v == 0) v = 0.0;
  uint64_t b;
  memcpy(&b, &v, 8);
  return (b >> 63) ? ~b : (b | (UINT64_C(1) << 63));
}

/* keys of n entries read with `stride` (elements) from x, complemented by
** flip; positions 0..n-1 */
static void load_keys (const char *x, mg_dtype dt, int64_t n, int64_t stride, uint64_t flip,
                       uint64_t *key, int64_t *pos) {
  switch (dt) {
    case MG_FLOAT32:
      for (int64_t j = 0; j < n; j++) key[j] = key_f32(((const float *)x)[j * stride]) ^ flip;
      break;
    case MG_FLOAT64:
      for (int64_t j = 0; j < n; j++) key[j] = key_f64(((const double *)x)[j * stride]) ^ flip;
      break;
    case MG_INT64:
      for (int64_t j = 0; j < n; j++)
        key[j] = ((uint64_t)((const int64_t *)x)[j * stride] ^ (UINT64_C(1) << 63)) ^ flip;
      break;
    default:
      for (int64_t j = 0; j < n; j++) key[j] = (uint64_t)(((const uint8_t *)x)[j * stride] != 0) ^ flip;
      break;
  }
  for (int64_t j = 0; j < n; j++) pos[j] = j;
}

/* sorts n (key, position) pairs by key, keeping the order of equal keys;
** k2/p2 are scratch for n; only the low `bytes` bytes of the keys vary */
static void sort_pairs (uint64_t *k, int64_t *p, uint64_t *k2, int64_t *p2, int64_t n, int bytes) {
  if (n <= 32) {
    for (int64_t i = 1; i < n; i++) {
      uint64_t kk = k[i];
      int64_t pp = p[i], j = i;
      for (; j > 0 && k[j - 1] > kk; j--) {
        k[j] = k[j - 1];
        p[j] = p[j - 1];
      }
      k[j] = kk;
      p[j] = pp;
    }
    return;
  }
  int64_t count[8][256];
  memset(count, 0, sizeof(count[0]) * (size_t)bytes);
  for (int64_t j = 0; j < n; j++)
    for (int b = 0; b < bytes; b++) count[b][(k[j] >> (8 * b)) & 255]++;
  uint64_t *ks = k, *kd = k2;
  int64_t *ps = p, *pd = p2;
  for (int b = 0; b < bytes; b++) {
    int64_t *c = count[b], sum = 0;
    if (c[(ks[0] >> (8 * b)) & 255] == n) continue;     /* every key has this byte */
    for (int d = 0; d < 256; d++) {
      int64_t t = c[d];
      c[d] = sum;
      sum += t;
    }
    for (int64_t j = 0; j < n; j++) {
      int64_t at = c[(ks[j] >> (8 * b)) & 255]++;
      kd[at] = ks[j];
      pd[at] = ps[j];
    }
    uint64_t *tk = ks; ks = kd; kd = tk;
    int64_t *tp = ps; ps = pd; pd = tp;
  }
  if (ks != k) {
    memcpy(k, ks, sizeof(uint64_t) * (size_t)n);
    memcpy(p, ps, sizeof(int64_t) * (size_t)n);
  }
}

/* (key, position) pairs ordered by key, then position: a total order */
static inline bool before (uint64_t ka, int64_t pa, uint64_t kb, int64_t pb) {
  return ka < kb || (ka == kb && pa < pb);
}

static void sift_down (uint64_t *hk, int64_t *hp, int64_t size, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, top = i;
    if (l < size && before(hk[top], hp[top], hk[l], hp[l])) top = l;
    if (r < size && before(hk[top], hp[top], hk[r], hp[r])) top = r;
    if (top == i) return;
    uint64_t tk = hk[i]; hk[i] = hk[top]; hk[top] = tk;
    int64_t tp = hp[i]; hp[i] = hp[top]; hp[top] = tp;
    i = top;
  }
}

/* the k first pairs in (key, position) order of the n in key/pos, into
** hk/hp in that order: a max-heap of the best k seen, then popped */
static void heap_select (const uint64_t *key, int64_t n, int64_t k, uint64_t *hk, int64_t *hp) {
  for (int64_t j = 0; j < k; j++) {
    hk[j] = key[j];
    hp[j] = j;
  }
  for (int64_t i = k / 2; i-- > 0;) sift_down(hk, hp, k, i);
  for (int64_t j = k; j < n; j++)
    if (key[j] < hk[0]) {                       /* positions grow: equal keys never win */
      hk[0] = key[j];
      hp[0] = j;
      sift_down(hk, hp, k, 0);
    }
  for (int64_t size = k; size > 1; size--) {    /* heap sort: the largest to the back */
    uint64_t tk = hk[0]; hk[0] = hk[size - 1]; hk[size - 1] = tk;
    int64_t tp = hp[0]; hp[0] = hp[size - 1]; hp[size - 1] = tp;
    sift_down(hk, hp, size - 1, 0);
  }
}

/* }========================================================== */


/* {========================= the rows ======================= */

typedef struct sort_job {
  const char *x;              /* x seen as (outer, n, inner), contiguous */
  mg_dtype dt;
  int64_t outer, n, inner, k; /* k: entries kept per row (n for a sort) */
  uint64_t flip;              /* descending / largest: complement the keys */
  int bytes;                  /* key bytes that may vary */
  bool by_position;           /* topk unsorted: the k kept in their original order */
  char *values;               /* (outer, k, inner), or NULL */
  int64_t *indices;           /* (outer, k, inner), 0-based */
} sort_job;

/* one row: sorts or selects, then writes indices and values */
static void sort_row (const sort_job *J, int64_t row, uint64_t *k1, int64_t *p1, uint64_t *k2, int64_t *p2) {
  int64_t o = row / J->inner, i = row % J->inner, n = J->n, k = J->k, in = J->inner;
  size_t esz = mg_dtype_size(J->dt);
  if (k == 0) return;
  const char *src = J->x + (size_t)(o * n * in + i) * esz;
  load_keys(src, J->dt, n, in, J->flip, k1, p1);
  int64_t *best = p1;
  if (k < n && n > 64 && k <= n / 16) {
    heap_select(k1, n, k, k2, p2);              /* into k2/p2, ordered */
    best = p2;
    if (J->by_position) {
      for (int64_t j = 0; j < k; j++) k1[j] = (uint64_t)p2[j];
      sort_pairs(k1, p2, k1 + k, p1, k, 8);
    }
  } else {
    sort_pairs(k1, p1, k2, p2, n, J->bytes);
    if (J->by_position) {
      for (int64_t j = 0; j < k; j++) k2[j] = (uint64_t)p1[j];
      sort_pairs(k2, p1, k1, p2, k, 8);
    }
  }
  int64_t base = o * k * in + i;
  for (int64_t j = 0; j < k; j++) J->indices[base + j * in] = best[j];
  if (J->values == NULL) return;
  switch (esz) {
    case 4:
      for (int64_t j = 0; j < k; j++)
        ((uint32_t *)J->values)[base + j * in] = ((const uint32_t *)src)[best[j] * in];
      break;
    case 8:
      for (int64_t j = 0; j < k; j++)
        ((uint64_t *)J->values)[base + j * in] = ((const uint64_t *)src)[best[j] * in];
      break;
    default:
      for (int64_t j = 0; j < k; j++)
        ((uint8_t *)J->values)[base + j * in] = ((const uint8_t *)src)[best[j] * in];
      break;
  }
}

/*
** The common part: x's entries along axis sorted (k = -1) or the k first
** in the order kept. 0-d x is one entry. *values may be NULL (not wanted).
*/
/* x's dtype can be sorted, and axis normalized (0-d x: 0 or -1); -1 + error */
static int sort_axis (const char *fn, const mg_tensor *x, int axis) {
  if (x->dtype != MG_FLOAT32 && x->dtype != MG_FLOAT64 && x->dtype != MG_INT64 && x->dtype != MG_BOOL)
    return mg_seterror("%s: not defined for %s tensors; cast them first", fn, mg_dtype_name(x->dtype)), -1;
  return x->ndim == 0 ? (axis == 0 || axis == -1 ? 0 : mg_check_axis(fn, axis, 0))
                      : mg_check_axis(fn, axis, x->ndim);
}

static mg_status sort_along (mg_tensor *x, int a, int64_t k, bool flip, bool by_position,
                             mg_tensor **values, mg_tensor **indices) {
  int64_t outer = 1, inner = 1, n = x->ndim ? x->shape[a] : 1, shape[MG_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) {
    if (d < a) outer *= x->shape[d];
    if (d > a) inner *= x->shape[d];
    shape[d] = x->shape[d];
  }
  if (k < 0) k = n;
  else if (x->ndim) shape[a] = k;
  mg_tensor *xc = mg_contiguous(x);
  mg_tensor *ix = xc ? mg_empty(shape, x->ndim, MG_INT64) : NULL;
  mg_tensor *v = ix && values ? mg_empty(shape, x->ndim, x->dtype) : NULL;
  int64_t rows = outer * inner;
  int nt = 1;
#ifdef _OPENMP
  if (rows > 1 && rows * n >= MG_PARALLEL_MIN && !omp_in_parallel()) {
    nt = omp_get_max_threads();
    if (nt > rows) nt = (int)rows;
  }
#endif
  /* scratch: two key and two position arrays of n per thread */
  mg_storage *scratch = ix && (v || !values) && rows > 0 && n > 0
                        ? mg_storage_new((size_t)nt * 4 * (size_t)n * sizeof(uint64_t)) : NULL;
  if (ix == NULL || (values && v == NULL) || (rows > 0 && n > 0 && scratch == NULL)) {
    mg_tensor_release(xc);
    mg_tensor_release(ix);
    mg_tensor_release(v);
    return MG_ERR;
  }
  sort_job J = {mg_ptr(xc), x->dtype, outer, n, inner, k, 0, 8, by_position,
                v ? mg_ptr(v) : NULL, (int64_t *)mg_ptr(ix)};
  if (x->dtype == MG_FLOAT32 || x->dtype == MG_BOOL) J.bytes = 4;
  if (flip) J.flip = J.bytes == 4 ? 0xFFFFFFFFu : UINT64_MAX;
  if (scratch != NULL) {
    uint64_t *base = (uint64_t *)scratch->data;
    MG_PARALLEL_FOR(nt > 1, num_threads(nt) schedule(static),
    for (int64_t r = 0; r < rows; r++) {
      uint64_t *s = base + (size_t)thread_num() * 4 * (size_t)n;
      sort_row(&J, r, s, (int64_t *)(s + n), s + 2 * n, (int64_t *)(s + 3 * n));
    });
    mg_storage_release(scratch);
  }
  mg_tensor_release(xc);
  *indices = ix;
  if (values) *values = v;
  return MG_OK;
}

/* how to sort, from the entry to the kernel */
typedef struct sort_how { int64_t k; bool flip, by_position; } sort_how;

/* the kernel of sort, argsort and topk: values (when the op has two
** outputs) and positions along c->attr->axis */
static mg_status sort_forward (mg_opcall *c) {
  const sort_how *h = (const sort_how *)c->local;
  bool two = c->nout == 2;
  mg_tensor *v = NULL, *ix = NULL;
  if (sort_along(c->in[0], c->attr->axis, h->k, h->flip, h->by_position, two ? &v : NULL, &ix) != MG_OK)
    return MG_ERR;
  c->out[0] = two ? v : ix;
  if (two) c->out[1] = ix;
  return MG_OK;
}

/* runs def on x along axis a; with values NULL, its positions alone */
static mg_status run_sort (const mg_opdef *def, mg_tensor *x, int a, sort_how how, mg_tensor **values,
                          mg_tensor **indices) {
  mg_attr attr = {0};
  attr.axis = a;
  mg_opcall c = MG_OPCALL(def, 1, &x, &attr, x->shape, x->ndim, values ? x->dtype : MG_INT64);
  c.nout = values ? 2 : 1;
  c.local = &how;
  if (mg_dispatch(&c) == NULL) return MG_ERR;
  if (values) *values = c.out[0];
  *indices = c.out[values ? 1 : 0];
  return MG_OK;
}

/* sort and topk: grad: dvalues put back where the values came from,
** dx = put_along_axis(zeros, indices, dvalues), adding */
static mg_status sort_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  if (dout[0] == NULL) {
    din[0] = mg_zeros_meta(&n->in_meta[0]);
    return MG_OK;
  }
  if (n->in_meta[0].ndim == 0) {
    din[0] = mg_tensor_retain(dout[0]);
    return MG_OK;
  }
  mg_tensor *z = mg_zeros_meta(&n->in_meta[0]);
  din[0] = mg_put_along_axis(z, n->out[1], dout[0], n->attr->axis, 1);
  mg_tensor_release(z);
  return MG_OK;
}

/* sort: x's entries along axis in order, and where each came from */
mg_status mg_sort (mg_tensor *x, int axis, int descending, mg_tensor **values, mg_tensor **indices) {
  MG_CHECK_ARG("mg_sort", x, MG_ERR);
  if (values) *values = NULL;
  if (indices) *indices = NULL;
  /* half x (autocast's products) sorts in float32, as other ops compute */
  RETRY_AS_T(mg_status, MG_ERR, x, mg_is_half(x->dtype), MG_FLOAT32, mg_sort(x, axis, descending, values, indices));
  mg_tensor *v = NULL, *ix = NULL;
  int a = sort_axis("sort", x, axis);
  if (a < 0 || run_sort(&sort_op, x, a, (sort_how){-1, descending != 0, false}, &v, &ix) != MG_OK) return MG_ERR;
  if (values) *values = v; else mg_tensor_release(v);
  if (indices) *indices = ix; else mg_tensor_release(ix);
  return MG_OK;
}
MG_ROW(SORT, sort) = {
  .forward = sort_forward,
  .info = {.name = "sort", .kind = MG_OP_OTHER,
           .doc = "values sorted along an axis (stable; NaN above every number) and where they came from"},
  .saves = MG_SAVE_OUT(1), .backward = sort_backward,
};

/* argsort: where sort's values come from (not differentiable) */
mg_tensor *mg_argsort (mg_tensor *x, int axis, int descending) {
  MG_CHECK_ARG("mg_argsort", x, NULL);
  HALF_AS_FLOAT32(x, mg_argsort(x, axis, descending));
  mg_tensor *ix = NULL;
  int a = sort_axis("argsort", x, axis);
  if (a < 0 || run_sort(&argsort_op, x, a, (sort_how){-1, descending != 0, false}, NULL, &ix) != MG_OK) return NULL;
  return ix;
}
MG_ROW(ARGSORT, argsort) = {
  .forward = sort_forward,
  .info = {.name = "argsort", .kind = MG_OP_OTHER,
           .doc = "the positions that sort x along an axis (stable; not differentiable)"},
};

/* topk: the k largest (or smallest) entries along axis and their
** positions; sorted: best first, else in their order in x; ties: the
** earlier position first */
mg_status mg_topk (mg_tensor *x, int64_t k, int axis, int largest, int sorted, mg_tensor **values,
                   mg_tensor **indices) {
  MG_CHECK_ARG("mg_topk", x, MG_ERR);
  if (values) *values = NULL;
  if (indices) *indices = NULL;
  RETRY_AS_T(mg_status, MG_ERR, x, mg_is_half(x->dtype), MG_FLOAT32, mg_topk(x, k, axis, largest, sorted, values, indices));
  if (x->ndim == 0) return mg_seterror("topk: needs at least 1 dimension, got a 0-d tensor");
  int a = mg_check_axis("topk", axis, x->ndim);
  if (a < 0) return MG_ERR;
  if (k < 0) return mg_seterror("topk: k = %lld is negative", (long long)k);
  if (k > x->shape[a])
    return mg_seterror("topk: k = %lld is larger than dimension " MG_POS " of size %lld", (long long)k, (long long)a,
                       (long long)x->shape[a]);
  mg_tensor *v = NULL, *ix = NULL;
  if (sort_axis("topk", x, a) < 0 || run_sort(&topk_op, x, a, (sort_how){k, largest != 0, !sorted}, &v, &ix) != MG_OK)
    return MG_ERR;
  if (values) *values = v; else mg_tensor_release(v);
  if (indices) *indices = ix; else mg_tensor_release(ix);
  return MG_OK;
}
MG_ROW(TOPK, topk) = {
  .forward = sort_forward,
  .info = {.name = "topk", .kind = MG_OP_OTHER,
           .doc = "the k largest (or smallest) entries along an axis and their positions"},
  .saves = MG_SAVE_OUT(1), .backward = sort_backward,
};

/* }========================================================== */

MG_FAMILY(mg_sort_ops, SORT_OPS, SORT__COUNT);

/*
** iter.c — broadcasting and the strided loop every elementwise kernel uses.
**
** A kernel is written once as a function over one innermost run (n elements,
** one pointer and stride per operand). mg_iter_init merges dimensions until
** most tensors are a single contiguous run, and mg_iter_run calls the kernel
** per run, splitting the work across OpenMP threads when it is large. The
** kernel switches on op and dtype once per run, never per element.
*/
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/core.h"

int mg_broadcast_shapes (const char *fn, const char *opsym, const int64_t *a, int na,
                         const int64_t *b, int nb, int64_t *shape) {
  int nd = na > nb ? na : nb;
  for (int i = 0; i < nd; i++) {
    int ia = i - (nd - na), ib = i - (nd - nb);
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char sa[160], sb[160];
      mg_seterror("%s: shapes do not broadcast: %s %s %s (dimension " MG_POS ": %lld vs %lld)", fn,
                  mg_shape_str(sa, sizeof sa, a, na), opsym, mg_shape_str(sb, sizeof sb, b, nb),
                  (long long)i, (long long)da, (long long)db);
      return -1;
    }
    shape[i] = da == 1 ? db : da;
  }
  return nd;
}

void mg_iter_init (mg_iter *it, const int64_t *shape, int ndim, int nops,
                   const mg_tensor *const *ops) {
  int64_t st[4][MG_MAX_DIMS];
  for (int k = 0; k < nops; k++) {        /* align right; broadcast dims get stride 0 */
    const mg_tensor *t = ops[k];
    for (int i = 0; i < ndim; i++) {
      int j = i - (ndim - t->ndim);
      st[k][i] = (j < 0 || t->shape[j] == 1) ? 0 : t->strides[j];
    }
  }
  /* drop size-1 dims, then merge a dim into the next inner one when every
     operand steps through both as through one */
  int n = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 1) continue;
    if (n > 0) {
      bool merge = true;
      for (int k = 0; k < nops && merge; k++)
        merge = it->strides[k][n - 1] == st[k][i] * shape[i];
      if (merge) {
        it->shape[n - 1] *= shape[i];
        for (int k = 0; k < nops; k++) it->strides[k][n - 1] = st[k][i];
        continue;
      }
    }
    it->shape[n] = shape[i];
    for (int k = 0; k < nops; k++) it->strides[k][n] = st[k][i];
    n++;
  }
  if (n == 0) {   /* a scalar, or all ones: one run of one */
    it->shape[0] = 1;
    for (int k = 0; k < nops; k++) it->strides[k][0] = 0;
    n = 1;
  }
  for (int i = 0; i < ndim; i++) if (shape[i] == 0) { it->shape[0] = 0; break; }
  it->ndim = n;
  it->nops = nops;
}

/* runs outer indices [begin, end): decompose begin once, then count up */
static void run_range (const mg_iter *it, char **base, const size_t *sz, mg_run_fn run,
                       void *ud, int64_t begin, int64_t end) {
  int nd = it->ndim - 1, nops = it->nops;
  int64_t idx[MG_MAX_DIMS] = {0}, rem = begin, inner[4];
  char *p[4];
  for (int i = nd - 1; i >= 0; i--) {
    idx[i] = rem % it->shape[i];
    rem /= it->shape[i];
  }
  for (int k = 0; k < nops; k++) {
    int64_t off = 0;
    for (int i = 0; i < nd; i++) off += idx[i] * it->strides[k][i];
    p[k] = base[k] + off * (int64_t)sz[k];
    inner[k] = it->strides[k][nd];
  }
  for (int64_t o = begin; o < end; o++) {
    run(it->shape[nd], p, inner, ud);
    for (int i = nd - 1; i >= 0; i--) {    /* odometer step */
      for (int k = 0; k < nops; k++) p[k] += it->strides[k][i] * (int64_t)sz[k];
      if (++idx[i] < it->shape[i]) break;
      for (int k = 0; k < nops; k++) p[k] -= it->strides[k][i] * it->shape[i] * (int64_t)sz[k];
      idx[i] = 0;
    }
  }
}

void mg_iter_run (const mg_iter *it, char **base, const size_t *sz, mg_run_fn run, void *ud) {
  int64_t inner = it->shape[it->ndim - 1], outer = 1;
  for (int i = 0; i < it->ndim - 1; i++) outer *= it->shape[i];
  if (inner == 0 || outer == 0) return;
#ifdef _OPENMP
  int nt = omp_get_max_threads();
  if (nt > 1 && outer * inner >= MG_PARALLEL_MIN && !omp_in_parallel()) {
    if (outer == 1) {      /* one long run: cut it into chunks */
      /* of whole 64-element blocks: each element then takes the same path
      ** (the vector loop, or the scalar one at the run's end, whose libm
      ** results differ from libmvec's in the last bits) at any thread count */
      int64_t chunk = ((inner + nt - 1) / nt + 63) / 64 * 64, st[4] = {0, 0, 0, 0};
      for (int k = 0; k < it->nops; k++) st[k] = it->strides[k][0];
      #pragma omp parallel for num_threads(nt)
      for (int t = 0; t < nt; t++) {
        int64_t b = t * chunk, e = b + chunk < inner ? b + chunk : inner;
        if (b >= e) continue;
        char *p[4];
        for (int k = 0; k < it->nops; k++) p[k] = base[k] + b * st[k] * (int64_t)sz[k];
        run(e - b, p, st, ud);
      }
    } else {
      int64_t chunk = (outer + nt - 1) / nt;
      #pragma omp parallel for num_threads(nt)
      for (int t = 0; t < nt; t++) {
        int64_t b = t * chunk, e = b + chunk < outer ? b + chunk : outer;
        if (b < e) run_range(it, base, sz, run, ud, b, e);
      }
    }
    return;
  }
#endif
  run_range(it, base, sz, run, ud, 0, outer);
}

void mg_for_pieces (int64_t n, int64_t grain, mg_block_fn fn, const void *ctx) {
#ifdef _OPENMP
  int nt = omp_get_max_threads();
#else
  int nt = 1;
#endif
  int64_t pieces = grain > 0 ? n / grain : 1;
  if (pieces > nt) pieces = nt;
  if (pieces < 2) {
    if (n > 0) fn(ctx, 0, n);
    return;
  }
  int64_t piece = ((n + pieces - 1) / pieces + 63) & ~(int64_t)63;
  #pragma omp parallel for num_threads((int)pieces)
  for (int64_t k = 0; k < pieces; k++) {
    int64_t lo = k * piece, hi = lo + piece < n ? lo + piece : n;
    if (lo < hi) fn(ctx, lo, hi);
  }
}

void mg_for_blocks (int64_t n, mg_block_fn fn, const void *ctx) {
  int64_t block = 1 << 16, nblocks = (n + block - 1) / block;
  MG_PARALLEL_FOR(n >= MG_PARALLEL_MIN, ,
  for (int64_t k = 0; k < nblocks; k++) fn(ctx, k * block, k * block + block < n ? k * block + block : n););
}

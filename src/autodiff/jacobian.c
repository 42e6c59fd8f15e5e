/*
** jacobian.c — jacobians and batch jacobians (tf.GradientTape.jacobian).
**
** Row j of a jacobian is the gradient of the target seeded with a one-hot
** at element j: one reverse walk per row, stacked along a new first axis,
** then reshaped to target.shape ++ source.shape. The tape is consumed once,
** at the end.
*/
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

/* a fresh seed: one-hot at element j of every batch row (batch >= 1) */
static mg_tensor *one_hot (const mg_tensor *target, int64_t j, int64_t batch) {
  mg_tensor *seed = mg_full(target->shape, target->ndim, target->dtype, 0.0);
  if (seed == NULL) return NULL;
  int64_t per = seed->numel / batch;
  size_t esz = mg_dtype_size(seed->dtype);
  const double one = 1;
  for (int64_t b = 0; b < batch; b++)        /* in the target's dtype (float16 and bfloat16 too) */
    mg_convert((char *)mg_ptr(seed) + (size_t)(b * per + j) * esz, seed->dtype, &one, MG_FLOAT64, 1);
  return seed;
}

/*
** Rows of the jacobians of target by each of ns sources: for j in [0, rows),
** one reverse walk seeded with one-hot j (in each of `batch` rows) gives row
** j of every source's jacobian; out[s] stacks those rows along a new first
** axis, or stays NULL when sources[s] is unconnected and !zero. A jacobian
** with no elements (no rows, or an empty source) is zeros of its shape,
** connected or not, and needs no walk. The tape is consumed once, at the end.
*/
static mg_status jacobian_rows (mg_tape *t, mg_tensor *target, int ns, mg_tensor *const *sources,
                                int zero, int64_t rows, int64_t batch, const char *fn,
                                mg_tensor **out) {
  if (mg_tape_check_usable(t, fn) != MG_OK) return MG_ERR;
  bool any = false;                     /* a source with elements: else no walk is needed */
  for (int s = 0; s < ns; s++) any |= sources[s]->numel > 0;
  int64_t walks = any ? rows : 0;
  if (walks > (1 << 20))
    return mg_seterror("tape:%s: target is too large (%lld elements)", fn, (long long)rows);
  mg_held h = {0};
  if (mg_walk_begin(&h, t, fn, 1, &target, ns, sources, 0, NULL, 0) != MG_OK) return MG_ERR;
  bool differentiable = mg_is_floating(target->dtype);
  size_t np = (size_t)walks * (size_t)ns;            /* parts[s * walks + j]: row j of source s */
  mg_tensor **parts = (mg_tensor **)calloc(np ? np : 1, sizeof(mg_tensor *));
  bool *connected = (bool *)calloc((size_t)(ns ? ns : 1), sizeof(bool));
  mg_status st = parts && connected ? MG_OK : mg_seterror("out of memory in tape:%s", fn);
  for (int64_t j = 0; j < walks && st == MG_OK; j++) {
    idmap map = {0};
    mg_tensor *seed = differentiable ? one_hot(target, j, batch) : NULL;
    if (differentiable)
      st = seed ? mg_walk(t, 1, &target, &seed, 0, ns, sources, &map, false, NULL, NULL, fn) : MG_ERR;
    mg_tensor_release(seed);
    for (int s = 0; s < ns && st == MG_OK; s++) {
      mg_tensor *x = sources[s];
      mg_tensor *g = mg_is_floating(x->dtype) ? (mg_tensor *)idmap_get(&map, x->id) : NULL;
      connected[s] |= g != NULL;
      mg_tensor *row = g ? mg_tensor_retain(g) : mg_full(x->shape, x->ndim, x->dtype, 0.0);
      parts[(size_t)s * (size_t)walks + (size_t)j] = row;
      if (row == NULL) st = MG_ERR;
    }
    mg_release_grads(&map);
  }
  for (int s = 0; s < ns && st == MG_OK; s++) {
    mg_tensor *x = sources[s];
    if (walks == 0 || x->numel == 0) {              /* no elements: zeros of (rows, source...) */
      int64_t sh[MG_MAX_DIMS + 1];
      sh[0] = rows;
      memcpy(sh + 1, x->shape, sizeof(int64_t) * (size_t)x->ndim);
      out[s] = mg_full(sh, x->ndim + 1, x->dtype, 0.0);
    } else if (connected[s] || zero) {
      out[s] = mg_stack(parts + (size_t)s * (size_t)walks, (int)walks, 0);
    } else {
      continue;
    }
    if (out[s] == NULL) st = MG_ERR;
  }
  for (int s = 0; st != MG_OK && s < ns; s++) { mg_tensor_release(out[s]); out[s] = NULL; }
  for (size_t k = 0; parts && k < np; k++) mg_tensor_release(parts[k]);
  free(parts);
  free(connected);
  if (st == MG_OK) mg_tape_consume(t);
  mg_walk_end(&h);                      /* last: it may drop the final reference to t */
  return st;
}

/* the jacobian's shape: the target's dims from `from` on, then the
** source's; checked before any work */
static int jacobian_shape (const mg_tensor *y, const mg_tensor *x, int from, const char *fn,
                           int64_t *shape) {
  int nd = (y->ndim - from) + (x->ndim - from) + from;
  if (nd > MG_MAX_DIMS)
    return mg_seterror("tape:%s: the result would have %d dimensions (at most %d)", fn, nd,
                       MG_MAX_DIMS), -1;
  int k = 0;
  for (int i = 0; i < from; i++) shape[k++] = y->shape[i];
  for (int i = from; i < y->ndim; i++) shape[k++] = y->shape[i];
  for (int i = from; i < x->ndim; i++) shape[k++] = x->shape[i];
  return nd;
}

/* rows (n, ...) reshaped to shape; takes over rows */
static mg_status reshape_rows (mg_tensor **r, const int64_t *shape, int nd) {
  if (*r == NULL) return MG_OK;
  mg_tensor *x = mg_reshape(*r, shape, nd);
  mg_tensor_release(*r);
  *r = x;
  return x ? MG_OK : MG_ERR;
}

mg_status mg_tape_jacobians (mg_tape *t, mg_tensor *target, int nsources,
                             mg_tensor *const *sources, int zero, mg_tensor **outs) {
  const char *fn = "mg_tape_jacobians";
  if (nsources < 0) return mg_seterror("%s: the count of sources is negative (%d)", fn, nsources);
  if (nsources > 0) MG_CHECK_ARG(fn, outs, MG_ERR);
  for (int s = 0; s < nsources; s++) outs[s] = NULL;
  MG_CHECK_ARG(fn, t, MG_ERR);
  MG_CHECK_ARG(fn, target, MG_ERR);
  if (nsources > 0) MG_CHECK_ARG(fn, sources, MG_ERR);
  int64_t shape[MG_MAX_DIMS];
  for (int s = 0; s < nsources; s++) {              /* every shape checked before any work */
    if (sources[s] == NULL) return mg_seterror("%s: sources[%d] is NULL", fn, s);
    if (jacobian_shape(target, sources[s], 0, "jacobian", shape) < 0) return MG_ERR;
  }
  if (jacobian_rows(t, target, nsources, sources, zero, target->numel, 1, "jacobian", outs) != MG_OK)
    return MG_ERR;
  mg_status st = MG_OK;
  for (int s = 0; s < nsources && st == MG_OK; s++)
    st = reshape_rows(&outs[s], shape, jacobian_shape(target, sources[s], 0, "jacobian", shape));
  for (int s = 0; st != MG_OK && s < nsources; s++) { mg_tensor_release(outs[s]); outs[s] = NULL; }
  return st;
}

mg_status mg_tape_jacobian (mg_tape *t, mg_tensor *target, mg_tensor *source, int zero,
                            mg_tensor **out) {
  const char *fn = "mg_tape_jacobian";
  MG_CHECK_ARG(fn, out, MG_ERR);
  *out = NULL;
  MG_CHECK_ARG(fn, t, MG_ERR);
  MG_CHECK_ARG(fn, target, MG_ERR);
  MG_CHECK_ARG(fn, source, MG_ERR);
  return mg_tape_jacobians(t, target, 1, &source, zero, out);
}

mg_status mg_tape_batch_jacobian (mg_tape *t, mg_tensor *target, mg_tensor *source, int zero,
                                  mg_tensor **out) {
  char a[160], b[160];
  const char *fn = "mg_tape_batch_jacobian";
  MG_CHECK_ARG(fn, out, MG_ERR);
  *out = NULL;
  MG_CHECK_ARG(fn, t, MG_ERR);
  MG_CHECK_ARG(fn, target, MG_ERR);
  MG_CHECK_ARG(fn, source, MG_ERR);
  if (target->ndim < 1 || source->ndim < 1 || target->shape[0] != source->shape[0])
    return mg_seterror("tape:batch_jacobian: target %s and source %s need the same first (batch) "
                       "dimension", mg_shape_str(a, sizeof a, target->shape, target->ndim),
                       mg_shape_str(b, sizeof b, source->shape, source->ndim));
  int64_t shape[MG_MAX_DIMS];
  int nd = jacobian_shape(target, source, 1, "batch_jacobian", shape);
  int64_t batch = target->shape[0], per = batch ? target->numel / batch : 0;
  if (nd < 0 || jacobian_rows(t, target, 1, &source, zero, per, batch ? batch : 1,
                              "batch_jacobian", out) != MG_OK)
    return MG_ERR;
  if (*out == NULL) return MG_OK;
  /* rows: (T, B, S...) -> (B, T, S...) -> (B, target rest..., source rest...) */
  int perm[MG_MAX_DIMS];
  for (int i = 0; i < (*out)->ndim; i++) perm[i] = i;
  perm[0] = 1;
  perm[1] = 0;
  mg_tensor *p = mg_permute(*out, perm);
  mg_tensor_release(*out);
  *out = p;
  return p ? reshape_rows(out, shape, nd) : MG_ERR;
}

/* }========================================================== */

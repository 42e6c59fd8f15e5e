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
  for (int64_t b = 0; b < batch; b++) {
    int64_t i = b * per + j;
    if (seed->dtype == MG_FLOAT32) ((float *)mg_ptr(seed))[i] = 1;
    else ((double *)mg_ptr(seed))[i] = 1;
  }
  return seed;
}

/*
** Rows of a jacobian: for j in [0, rows), the gradient of target seeded with
** one-hot j (in each of `batch` rows), stacked along a new first axis.
** *out stays NULL when source is unconnected and !zero. The tape is
** consumed once, at the end.
*/
static mg_status jacobian_rows (mg_tape *t, mg_tensor *target, mg_tensor *source, int zero,
                                int64_t rows, int64_t batch, const char *fn, mg_tensor **out) {
  if (mg_tape_check_usable(t, fn) != MG_OK) return MG_ERR;
  if (rows > (1 << 20))
    return mg_seterror("tape:%s: target is too large (%lld elements)", fn, (long long)rows);
  mg_held h = {0};
  if (mg_walk_begin(&h, t, fn, 1, &target, 1, &source, 0, NULL) != MG_OK) return MG_ERR;
  bool differentiable = mg_is_float(target->dtype) && mg_is_float(source->dtype);
  mg_tensor **parts = (mg_tensor **)calloc((size_t)(rows > 0 ? rows : 1), sizeof(mg_tensor *));
  mg_status st = parts ? MG_OK : mg_seterror("out of memory in tape:%s", fn);
  bool connected = false;
  for (int64_t j = 0; j < rows && st == MG_OK; j++) {
    idmap map = {0};
    mg_tensor *seed = differentiable ? one_hot(target, j, batch) : NULL;
    if (differentiable)
      st = seed ? mg_walk(t, 1, &target, &seed, 1, &source, &map, false, fn) : MG_ERR;
    mg_tensor_release(seed);
    mg_tensor *g = st == MG_OK ? (mg_tensor *)idmap_get(&map, source->id) : NULL;
    connected |= g != NULL;
    if (st == MG_OK)
      parts[j] = g ? mg_tensor_retain(g) : mg_full(source->shape, source->ndim, source->dtype, 0.0);
    if (st == MG_OK && parts[j] == NULL) st = MG_ERR;
    mg_release_grads(&map);
  }
  if (st == MG_OK && (connected || zero)) {
    if (rows > 0) {
      *out = mg_stack(parts, (int)rows, 0);
    } else {
      int64_t sh[MG_MAX_DIMS + 1] = {0};
      memcpy(sh + 1, source->shape, sizeof(int64_t) * (size_t)source->ndim);
      *out = mg_full(sh, source->ndim + 1, source->dtype, 0.0);
    }
    if (*out == NULL) st = MG_ERR;
  }
  for (int64_t j = 0; parts && j < rows; j++) mg_tensor_release(parts[j]);
  free(parts);
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

static mg_status jacobian_args (const char *fn, mg_tape *t, mg_tensor *y, mg_tensor *x,
                                mg_tensor **out) {
  MG_CHECK_ARG(fn, out, MG_ERR);
  *out = NULL;
  MG_CHECK_ARG(fn, t, MG_ERR);
  MG_CHECK_ARG(fn, y, MG_ERR);
  MG_CHECK_ARG(fn, x, MG_ERR);
  return MG_OK;
}

/* rows (n, ...) reshaped to shape; takes over rows */
static mg_status reshape_rows (mg_tensor **r, const int64_t *shape, int nd) {
  if (*r == NULL) return MG_OK;
  mg_tensor *x = mg_reshape(*r, shape, nd);
  mg_tensor_release(*r);
  *r = x;
  return x ? MG_OK : MG_ERR;
}

mg_status mg_tape_jacobian (mg_tape *t, mg_tensor *target, mg_tensor *source, int zero,
                            mg_tensor **out) {
  int64_t shape[MG_MAX_DIMS];
  if (jacobian_args("mg_tape_jacobian", t, target, source, out) != MG_OK) return MG_ERR;
  int nd = jacobian_shape(target, source, 0, "jacobian", shape);
  if (nd < 0 || jacobian_rows(t, target, source, zero, target->numel, 1, "jacobian", out) != MG_OK)
    return MG_ERR;
  return reshape_rows(out, shape, nd);
}

mg_status mg_tape_batch_jacobian (mg_tape *t, mg_tensor *target, mg_tensor *source, int zero,
                                  mg_tensor **out) {
  char a[160], b[160];
  if (jacobian_args("mg_tape_batch_jacobian", t, target, source, out) != MG_OK) return MG_ERR;
  if (target->ndim < 1 || source->ndim < 1 || target->shape[0] != source->shape[0])
    return mg_seterror("tape:batch_jacobian: target %s and source %s need the same first (batch) "
                       "dimension", mg_shape_str(a, sizeof a, target->shape, target->ndim),
                       mg_shape_str(b, sizeof b, source->shape, source->ndim));
  int64_t shape[MG_MAX_DIMS];
  int nd = jacobian_shape(target, source, 1, "batch_jacobian", shape);
  int64_t batch = target->shape[0], per = batch ? target->numel / batch : 0;
  if (nd < 0 || jacobian_rows(t, target, source, zero, per, batch ? batch : 1, "batch_jacobian",
                              out) != MG_OK)
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

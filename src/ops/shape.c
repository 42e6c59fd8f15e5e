/*
** shape.c — movement ops: reshape, permute, broadcast, slice, concat, gather.
**
** reshape, permute, broadcast_to and slice return views that share the
** input's storage (reshape copies only when the strides do not allow a
** view). Each op's adjoint is another op of this file: slice <-> unslice,
** gather <-> scatter_add, broadcast_to -> sum_to_shape, so gradients of any
** order come from the same code.
*/
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define SHAPE_OPS(X) \
  X(RESHAPE, reshape) X(PERMUTE, permute) X(BROADCAST, broadcast) X(SLICE, slice) \
  X(UNSLICE, unslice) X(CONCAT, concat) X(GATHER, gather) X(SCATTER_ADD, scatter_add) \
  X(IDENTITY, identity) X(STOP_GRADIENT, stop_gradient)
enum { SHAPE_OPS(MG_ROW_ENUM) SHAPE__COUNT };


static char *shape_s (char *buf, size_t n, const mg_tensor *t) {
  return mg_shape_str(buf, n, t->shape, t->ndim);
}

/* a view's layout, from the entry to the kernel */
typedef struct view_layout { const int64_t *strides; int64_t offset; } view_layout;

/* the kernel of the views: x's storage seen with c's shape and the layout */
static mg_status view_forward (mg_opcall *c) {
  const view_layout *l = (const view_layout *)c->local;
  mg_tensor *x = c->in[0];
  c->out[0] = mg_tensor_view(x->storage, x->dtype, c->shape, c->ndim, l->strides, l->offset);
  return c->out[0] ? MG_OK : MG_ERR;
}

/* runs view op def on x: shape, strides and offset are the view's */
static mg_tensor *view_op (const mg_opdef *def, mg_tensor *x, const int64_t *shape, int ndim,
                           const int64_t *strides, int64_t offset, const mg_attr *attr) {
  view_layout l = {strides, offset};
  mg_opcall c = MG_OPCALL(def, 1, &x, attr, shape, ndim, x->dtype);
  c.local = &l;
  return mg_dispatch(&c);
}

/* {========================= reshape ======================== */

static const mg_opdef reshape_op;

/* reshape: a view when x is contiguous, else a copy.  grad: dout reshaped
** back to x's shape */
mg_tensor *mg_reshape (mg_tensor *x, const int64_t *shape_in, int ndim) {
  MG_CHECK_ARG("mg_reshape", x, NULL);
  int64_t shape[MG_MAX_DIMS], known = 1;
  int infer = -1;
  if (ndim > 0) MG_CHECK_ARG("mg_reshape", shape_in, NULL);
  if (ndim < 0 || ndim > MG_MAX_DIMS)
    return mg_seterror("reshape: %d dimensions given, at most %d allowed", ndim, MG_MAX_DIMS), NULL;
  for (int i = 0; i < ndim; i++) {
    shape[i] = shape_in[i];
    if (shape[i] == -1) {
      if (infer >= 0) return mg_seterror("reshape: only one dimension can be -1"), NULL;
      infer = i;
    } else if (shape[i] < 0) {
      return mg_seterror("reshape: dimension " MG_POS " has negative size %lld", (long long)i, (long long)shape[i]), NULL;
    } else if (shape[i] > 0 && known > INT64_MAX / shape[i]) {
      char b[160];
      return mg_seterror("reshape: shape %s has too many elements", mg_shape_str(b, sizeof b, shape_in, ndim)), NULL;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0 && known == 0) {               /* any size would do: NumPy and PyTorch refuse too */
    char b[160];
    return mg_seterror("reshape: the -1 in %s is ambiguous: another dimension is 0, so any size fits",
                       mg_shape_str(b, sizeof b, shape_in, ndim)), NULL;
  }
  if (infer >= 0) shape[infer] = x->numel / known;
  int64_t n = mg_shape_numel("reshape", shape, ndim);
  if (n < 0) return NULL;
  if (n != x->numel || (infer >= 0 && x->numel % known != 0)) {
    char a[160], b[160];
    mg_seterror("reshape: cannot reshape %s [%lld elements] into %s", shape_s(a, sizeof a, x),
                (long long)x->numel, mg_shape_str(b, sizeof b, shape_in, ndim));
    return NULL;
  }
  mg_opcall c = MG_OPCALL(&reshape_op, 1, &x, NULL, shape, ndim, x->dtype);
  return mg_dispatch(&c);
}

/* a view of x, or of a contiguous copy when x's strides allow none */
static mg_status reshape_forward (mg_opcall *c) {
  mg_tensor *xc = mg_contiguous(c->in[0]);
  if (xc == NULL) return MG_ERR;
  int64_t strides[MG_MAX_DIMS];
  mg_contiguous_strides(c->shape, c->ndim, strides);
  c->out[0] = mg_tensor_view(xc->storage, xc->dtype, c->shape, c->ndim, strides, xc->offset);
  mg_tensor_release(xc);
  return c->out[0] ? MG_OK : MG_ERR;
}

static mg_status reshape_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_reshape(dout[0], SHAPE_OF(n, 0));
  return MG_OK;
}
MG_ROW(RESHAPE, reshape) = {.makes_views = true, .forward = reshape_forward, .info = {.name = "reshape", .kind = MG_OP_OTHER, .doc = "the same values in another shape (one size may be -1)"}, .backward = reshape_backward};

mg_tensor *mg_expand_dims (mg_tensor *x, int axis) {
  MG_CHECK_ARG("mg_expand_dims", x, NULL);
  int a = mg_check_axis("expand_dims", axis, x->ndim + 1);
  if (a < 0) return NULL;
  int64_t shape[MG_MAX_DIMS + 1];
  for (int i = 0, j = 0; i <= x->ndim; i++) shape[i] = i == a ? 1 : x->shape[j++];
  return mg_reshape(x, shape, x->ndim + 1);
}

mg_tensor *mg_squeeze (mg_tensor *x, int axis) {
  MG_CHECK_ARG("mg_squeeze", x, NULL);
  int64_t shape[MG_MAX_DIMS];
  int nd = 0;
  if (axis != MG_ALL_AXES) {
    if ((axis = mg_check_axis("squeeze", axis, x->ndim)) < 0) return NULL;
    if (x->shape[axis] != 1)
      return mg_seterror("squeeze: dimension " MG_POS " has size %lld, not 1", (long long)axis,
                         (long long)x->shape[axis]), NULL;
  }
  for (int i = 0; i < x->ndim; i++)
    if (!(x->shape[i] == 1 && (axis == MG_ALL_AXES || axis == i))) shape[nd++] = x->shape[i];
  return mg_reshape(x, shape, nd);
}

/* }========================================================== */


/* {========================= permute ======================== */

static const mg_opdef permute_op;

/* permute: out dim i is x dim perm[i] (a view).  grad: the inverse permutation */
mg_tensor *mg_permute (mg_tensor *x, const int *perm) {
  MG_CHECK_ARG("mg_permute", x, NULL);
  if (x->ndim > 0) MG_CHECK_ARG("mg_permute", perm, NULL);
  int64_t shape[MG_MAX_DIMS], strides[MG_MAX_DIMS];
  bool seen[MG_MAX_DIMS] = {false};
  mg_attr attr = {0};
  for (int i = 0; i < x->ndim; i++) {
    int p = perm[i];
    if (p < 0 || p >= x->ndim || seen[p])
      return mg_seterror("permute: %d dimensions need a permutation of 1..%d", x->ndim, x->ndim), NULL;
    seen[p] = true;
    shape[i] = x->shape[p];
    strides[i] = x->strides[p];
    attr.a[p] = i;                                        /* the inverse */
  }
  return view_op(&permute_op, x, shape, x->ndim, strides, x->offset, &attr);
}

static mg_status permute_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  int inv[MG_MAX_DIMS];
  for (int i = 0; i < n->in_meta[0].ndim; i++) inv[i] = (int)n->attr->a[i];
  din[0] = mg_permute(dout[0], inv);
  return MG_OK;
}
MG_ROW(PERMUTE, permute) = {.makes_views = true, .forward = view_forward, .info = {.name = "permute", .kind = MG_OP_OTHER, .doc = "the axes reordered (transpose with a permutation)"}, .backward = permute_backward};

mg_tensor *mg_transpose (mg_tensor *x, int axis1, int axis2) {
  MG_CHECK_ARG("mg_transpose", x, NULL);
  if (x->ndim < 2 && axis1 == -2 && axis2 == -1) return mg_tensor_retain(x);  /* vectors */
  int a = mg_check_axis("transpose", axis1, x->ndim), b = a < 0 ? -1 : mg_check_axis("transpose", axis2, x->ndim);
  if (a < 0 || b < 0) return NULL;
  int perm[MG_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) perm[i] = i;
  perm[a] = b;
  perm[b] = a;
  return mg_permute(x, perm);
}

/* }========================================================== */


/* {====================== broadcast_to ====================== */

static const mg_opdef broadcast_op;

/* broadcast_to: a stride-0 view.  grad: dout summed back to x's shape */
mg_tensor *mg_broadcast_to (mg_tensor *x, const int64_t *shape, int ndim) {
  MG_CHECK_ARG("mg_broadcast_to", x, NULL);
  if (mg_shape_numel("broadcast_to", shape, ndim) < 0) return NULL;
  if (ndim < x->ndim) goto mismatch;
  int64_t strides[MG_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - x->ndim);
    if (j < 0) { strides[i] = 0; continue; }
    if (x->shape[j] == shape[i]) strides[i] = x->strides[j];
    else if (x->shape[j] == 1) strides[i] = 0;
    else goto mismatch;
  }
  return view_op(&broadcast_op, x, shape, ndim, strides, x->offset, NULL);
mismatch: {
    char a[160], b[160];
    mg_seterror("broadcast_to: cannot broadcast %s to %s", shape_s(a, sizeof a, x),
                mg_shape_str(b, sizeof b, shape, ndim));
    return NULL;
  }
}

static mg_status broadcast_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_sum_to_shape(dout[0], SHAPE_OF(n, 0));
  return MG_OK;
}
MG_ROW(BROADCAST, broadcast) = {.makes_views = true, .forward = view_forward, .info = {.name = "broadcast_to", .kind = MG_OP_OTHER, .doc = "a broadcast view with a larger shape"}, .backward = broadcast_backward};

/* }========================================================== */


/* {==================== slice and unslice =================== */

static const mg_opdef slice_op, unslice_op;

/* entries of start, start+step, ... before stop; unsigned, so no step or
** bound overflows */
static int64_t slice_count (int64_t start, int64_t stop, int64_t step) {
  bool up = step > 0;
  if (up ? stop <= start : stop >= start) return 0;
  uint64_t span = up ? (uint64_t)stop - (uint64_t)start : (uint64_t)start - (uint64_t)stop;
  uint64_t mag = up ? (uint64_t)step : 0 - (uint64_t)step;
  return (int64_t)((span - 1) / mag + 1);
}

/* do count entries from start by step stay inside [0, n)? */
static bool inside (int64_t start, int64_t count, int64_t step, int64_t n) {
  if (count == 0) return true;
  if (start < 0 || start >= n) return false;
  __int128 last = (__int128)start + (__int128)(count - 1) * step;
  return last >= 0 && last < n;
}

/* slice: x[start:stop:step] per axis, a view (steps may be negative).
** grad: unslice(dout) puts it back in place among zeros */
mg_tensor *mg_slice (mg_tensor *x, const int64_t *start, const int64_t *stop, const int64_t *step) {
  MG_CHECK_ARG("mg_slice", x, NULL);
  if (x->ndim > 0) {
    MG_CHECK_ARG("mg_slice", start, NULL);
    MG_CHECK_ARG("mg_slice", stop, NULL);
    MG_CHECK_ARG("mg_slice", step, NULL);
  }
  int64_t shape[MG_MAX_DIMS], strides[MG_MAX_DIMS], offset = x->offset;
  mg_attr attr = {0};
  for (int i = 0; i < x->ndim; i++) {
    if (step[i] == 0) return mg_seterror("slice: step of dimension " MG_POS " is 0", (long long)i), NULL;
    shape[i] = slice_count(start[i], stop[i], step[i]);
    if (!inside(start[i], shape[i], step[i], x->shape[i])) {
      char hint[96];
      return mg_seterror("slice: range " MG_POS1 "..%lld is out of bounds for dimension " MG_POS " of size %lld%s",
                         (long long)start[i], (long long)stop[i], (long long)i, (long long)x->shape[i],
                         mg_range_hint(hint, sizeof hint, x->shape[i])), NULL;
    }
    /* with two entries or more |step| < size, so the product fits; with one,
    ** the stride is never used (and step may be huge) */
    strides[i] = shape[i] > 1 ? x->strides[i] * step[i] : x->strides[i];
    if (shape[i] > 0) offset += start[i] * x->strides[i];
    attr.a[i] = start[i];
    attr.c[i] = step[i];
  }
  return view_op(&slice_op, x, shape, x->ndim, strides, offset, &attr);
}

static mg_status slice_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_unslice(dout[0], n->in_meta[0].shape, n->attr->a, n->attr->c);
  return MG_OK;
}
MG_ROW(SLICE, slice) = {.makes_views = true, .forward = view_forward, .info = {.name = "slice", .kind = MG_OP_OTHER, .doc = "a view of start..stop by step along each axis"}, .backward = slice_backward};

/* unslice: zeros of `shape` with x at start::step.  grad: slice(dout) */
mg_tensor *mg_unslice (mg_tensor *x, const int64_t *shape, const int64_t *start, const int64_t *step) {
  MG_CHECK_ARG("mg_unslice", x, NULL);
  if (x->ndim > 0) {
    MG_CHECK_ARG("mg_unslice", shape, NULL);
    MG_CHECK_ARG("mg_unslice", start, NULL);
    MG_CHECK_ARG("mg_unslice", step, NULL);
  }
  for (int i = 0; i < x->ndim; i++)
    if (step[i] == 0 || !inside(start[i], x->shape[i], step[i], shape[i]) ||
        (x->shape[i] > 0 && shape[i] < 0)) {
      char a[160], b[160];
      return mg_seterror("mg_unslice: %s at start " MG_POS1 " step %lld does not fit in dimension " MG_POS " of %s",
                         shape_s(a, sizeof a, x), (long long)start[i], (long long)step[i], (long long)i,
                         mg_shape_str(b, sizeof b, shape, x->ndim)), NULL;
    }
  int64_t stop[MG_MAX_DIMS];
  mg_attr attr = {0};
  for (int i = 0; i < x->ndim; i++) {   /* just past the last entry: no overflow for any step */
    int64_t n = x->shape[i];
    stop[i] = n == 0 ? start[i] : start[i] + (n - 1) * (n > 1 ? step[i] : 0) + (step[i] > 0 ? 1 : -1);
    attr.a[i] = start[i];
    attr.b[i] = stop[i];
    attr.c[i] = step[i];
  }
  mg_opcall c = MG_OPCALL(&unslice_op, 1, &x, &attr, shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

/* zeros with x written at start (c->attr->a) by step (c->attr->c) */
static mg_status unslice_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  const int64_t *start = c->attr->a, *step = c->attr->c;
  mg_tensor *out = mg_full(c->shape, c->ndim, x->dtype, 0.0);
  if (out == NULL) return MG_ERR;
  /* a view into the fresh output, written through */
  int64_t strides[MG_MAX_DIMS], offset = 0;
  for (int i = 0; i < x->ndim; i++) {
    strides[i] = x->shape[i] > 1 ? out->strides[i] * step[i] : out->strides[i];
    if (x->shape[i] > 0) offset += start[i] * out->strides[i];
  }
  mg_tensor *region = mg_tensor_view(out->storage, x->dtype, x->shape, x->ndim, strides, offset);
  if (region == NULL) {
    mg_tensor_release(out);
    return MG_ERR;
  }
  mg_copy_into(region, x);
  mg_tensor_release(region);
  c->out[0] = out;
  return MG_OK;
}

static mg_status unslice_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_slice(dout[0], n->attr->a, n->attr->b, n->attr->c);
  return MG_OK;
}
MG_ROW(UNSLICE, unslice) = {.forward = unslice_forward, .info = {.name = "unslice", .kind = MG_OP_OTHER, .doc = "zeros with x placed at start..stop by step (slice's adjoint)"}, .backward = unslice_backward};

/* select: x[..., index, ...] along axis, dropping it (slice + reshape) */
mg_tensor *mg_select (mg_tensor *x, int axis, int64_t index) {
  MG_CHECK_ARG("mg_select", x, NULL);
  int a = mg_check_axis("select", axis, x->ndim);
  if (a < 0) return NULL;
  char hint[96];
  if (index < 0 || index >= x->shape[a])
    return mg_seterror("select: index " MG_POS1 " is out of bounds for dimension " MG_POS " of size %lld%s",
                       (long long)index, (long long)a, (long long)x->shape[a],
                       mg_range_hint(hint, sizeof hint, x->shape[a])), NULL;
  int64_t start[MG_MAX_DIMS], stop[MG_MAX_DIMS], step[MG_MAX_DIMS], shape[MG_MAX_DIMS];
  int nd = 0;
  for (int i = 0; i < x->ndim; i++) {
    start[i] = i == a ? index : 0;
    stop[i] = i == a ? index + 1 : x->shape[i];
    step[i] = 1;
    if (i != a) shape[nd++] = x->shape[i];
  }
  mg_tensor *s = mg_slice(x, start, stop, step), *r = mg_reshape(s, shape, nd);
  mg_tensor_release(s);
  return r;
}

/* }========================================================== */


/* {======================== concat ========================== */

static const mg_opdef concat_op;

/* copies src into dst's rows [at, at + src rows) along axis; both seen as (outer, rows, inner) */
static void copy_block (mg_tensor *dst, const mg_tensor *src, int axis, int64_t at) {
  int64_t outer = 1, inner = 1, esz = (int64_t)mg_dtype_size(dst->dtype);
  for (int i = 0; i < axis; i++) outer *= dst->shape[i];
  for (int i = axis + 1; i < dst->ndim; i++) inner *= dst->shape[i];
  int64_t srows = src->shape[axis], drows = dst->shape[axis];
  for (int64_t o = 0; o < outer; o++)
    memcpy(mg_ptr(dst) + ((o * drows + at) * inner) * esz, mg_ptr(src) + (o * srows * inner) * esz,
           (size_t)(srows * inner * esz));
}

static bool joins_float32 (mg_dtype dt) { return dt == MG_FLOAT32 || mg_is_half(dt); }

/* MG_ERR + error naming the first tensor that cannot join the first one:
** another dtype, unless both are float32 or half (widened first) */
static mg_status dtypes_differ (const char *fn, mg_tensor *const *xs, int n) {
  mg_dtype d0 = xs[0]->dtype;
  for (int k = 1; k < n; k++) {
    mg_dtype dk = xs[k]->dtype;
    if (dk != d0 && !(joins_float32(d0) && joins_float32(dk)))
      return mg_seterror("%s: dtypes differ: tensor " MG_POS " is %s, tensor " MG_POS " is %s", fn, 0LL,
                         mg_dtype_name(d0), (long long)k, mg_dtype_name(dk));
  }
  return MG_OK;
}

/* join(xs, n, axis) with every half tensor among xs cast to float32 (the
** casts are recorded: each gradient comes back in its tensor's dtype) */
static mg_tensor *widened_join (const char *fn, mg_tensor *(*join)(mg_tensor *const *, int, int),
                                mg_tensor *const *xs, int n, int axis) {
  mg_tensor **w = (mg_tensor **)calloc((size_t)n, sizeof(mg_tensor *));
  if (w == NULL) return mg_seterror("%s: out of memory", fn), NULL;
  mg_tensor *out = NULL;
  int k = 0;
  for (; k < n && (w[k] = mg_half_to_float32(xs[k])) != NULL; k++) {}
  if (k == n) out = join(w, n, axis);
  for (int j = 0; j < n; j++) mg_tensor_release(w[j]);
  free(w);
  return out;
}

/* concat: xs joined along axis.  grad: dout sliced back into pieces */
mg_tensor *mg_concat (mg_tensor *const *xs, int n, int axis) {
  MG_CHECK_ARG("mg_concat", xs, NULL);
  if (n < 1) return mg_seterror("concat: needs at least one tensor"), NULL;
  for (int k = 0; k < n; k++) if (xs[k] == NULL) return mg_null_arg("mg_concat", "xs[k]"), NULL;
  if (mg_half_mixed(xs, n)) return widened_join("concat", mg_concat, xs, n, axis);
  const mg_tensor *x0 = xs[0];
  int a = mg_check_axis("concat", axis, x0->ndim);
  if (a < 0) return NULL;
  int64_t shape[MG_MAX_DIMS];
  memcpy(shape, x0->shape, sizeof shape);
  shape[a] = 0;
  if (dtypes_differ("concat", xs, n) != MG_OK) return NULL;
  for (int k = 0; k < n; k++) {
    const mg_tensor *x = xs[k];
    char s0[160], sk[160];
    bool ok = x->ndim == x0->ndim;
    for (int i = 0; ok && i < x->ndim; i++) ok = i == a || x->shape[i] == x0->shape[i];
    if (!ok)
      return mg_seterror("concat: shapes differ outside axis " MG_POS ": tensor " MG_POS " is %s, tensor " MG_POS " is %s",
                         (long long)a, 0LL, shape_s(s0, sizeof s0, x0), (long long)k, shape_s(sk, sizeof sk, x)), NULL;
    shape[a] += x->shape[a];
  }
  mg_attr attr = {0};
  attr.axis = a;
  mg_opcall c = MG_OPCALL(&concat_op, n, xs, &attr, shape, x0->ndim, x0->dtype);
  return mg_dispatch(&c);
}

static mg_status concat_forward (mg_opcall *c) {
  int a = c->attr->axis;
  mg_tensor *out = mg_empty(c->shape, c->ndim, c->dtype);
  if (out == NULL) return MG_ERR;
  int64_t at = 0;
  for (int k = 0; k < c->nin; k++) {
    mg_tensor *xc = mg_contiguous(c->in[k]);
    if (xc == NULL) {
      mg_tensor_release(out);
      return MG_ERR;
    }
    copy_block(out, xc, a, at);
    at += xc->shape[a];
    mg_tensor_release(xc);
  }
  c->out[0] = out;
  return MG_OK;
}

static mg_status concat_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  int a = n->attr->axis, nd = n->out_meta[0].ndim;
  int64_t start[MG_MAX_DIMS] = {0}, stop[MG_MAX_DIMS], step[MG_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    stop[i] = n->out_meta[0].shape[i];
    step[i] = 1;
  }
  int64_t at = 0;
  for (int k = 0; k < n->nin; k++) {
    start[a] = at;
    stop[a] = at + n->in_meta[k].shape[a];
    at = stop[a];
    if (n->needs[k]) din[k] = mg_slice(dout[0], start, stop, step);
  }
  return MG_OK;
}
MG_ROW(CONCAT, concat) = {.forward = concat_forward, .info = {.name = "concat", .kind = MG_OP_OTHER, .doc = "tensors joined along an axis"}, .backward = concat_backward};

/* stack: expand each at axis, then concat (a composite) */
mg_tensor *mg_stack (mg_tensor *const *xs, int n, int axis) {
  if (n < 1) return mg_seterror("stack: needs at least one tensor"), NULL;
  MG_CHECK_ARG("mg_stack", xs, NULL);
  for (int k = 0; k < n; k++) if (xs[k] == NULL) return mg_null_arg("mg_stack", "xs[k]"), NULL;
  int a = mg_check_axis("stack", axis, xs[0]->ndim + 1);
  if (a < 0) return NULL;
  if (mg_half_mixed(xs, n)) return widened_join("stack", mg_stack, xs, n, axis);
  if (dtypes_differ("stack", xs, n) != MG_OK) return NULL;
  for (int k = 1; k < n; k++)
    if (!mg_same_shape(xs[k]->shape, xs[k]->ndim, xs[0]->shape, xs[0]->ndim)) {
      char s0[160], sk[160];
      return mg_seterror("stack: shapes differ: tensor " MG_POS " is %s, tensor " MG_POS " is %s",
                         0LL, shape_s(s0, sizeof s0, xs[0]), (long long)k, shape_s(sk, sizeof sk, xs[k])), NULL;
    }
  mg_tensor **ex = (mg_tensor **)calloc((size_t)n, sizeof(mg_tensor *));
  if (ex == NULL) return mg_seterror("stack: out of memory"), NULL;
  mg_tensor *out = NULL;
  int k = 0;
  for (; k < n && (ex[k] = mg_expand_dims(xs[k], a)) != NULL; k++) {}
  if (k == n) out = mg_concat(ex, n, a);
  for (int j = 0; j < n; j++) mg_tensor_release(ex[j]);
  free(ex);
  return out;
}

/* }========================================================== */


/* {================== gather and scatter_add ================ */

static const mg_opdef gather_op, scatter_add_op;

static mg_status check_indices (const char *fn, const mg_tensor *idx, int64_t size, int axis) {
  if (idx->dtype != MG_INT64)
    return mg_seterror("%s: indices must be int64, got %s", fn, mg_dtype_name(idx->dtype));
  const int64_t *v = (const int64_t *)mg_ptr(idx);
  for (int64_t j = 0; j < idx->numel; j++)
    if (v[j] < 0 || v[j] >= size) {
      char hint[96];
      return mg_seterror("%s: index " MG_POS1 " is out of bounds for dimension " MG_POS " of size %lld%s", fn,
                         (long long)v[j], (long long)axis, (long long)size, mg_range_hint(hint, sizeof hint, size));
    }
  return MG_OK;
}

/* gather's indices, contiguous, with the negative ones (counting from the
** end) made non-negative; NULL + error when one is outside [-size, size) */
static mg_tensor *gather_indices (mg_tensor *indices, int64_t size, int axis) {
  if (indices->dtype != MG_INT64)
    return mg_seterror("gather: indices must be int64, got %s", mg_dtype_name(indices->dtype)), NULL;
  mg_tensor *idx = mg_contiguous(indices), *wrapped = NULL;
  if (idx == NULL) return NULL;
  const int64_t *v = (const int64_t *)mg_ptr(idx);
  bool negative = false;
  for (int64_t j = 0; j < idx->numel; j++) {
    if (v[j] < -size || v[j] >= size) {
      char hint[96];
      mg_seterror("gather: index " MG_POS " is out of bounds for dimension " MG_POS " of size %lld%s",
                  (long long)v[j], (long long)axis, (long long)size, mg_range_hint(hint, sizeof hint, size));
      mg_tensor_release(idx);
      return NULL;
    }
    negative = negative || v[j] < 0;
  }
  if (!negative) return idx;
  if ((wrapped = mg_empty(idx->shape, idx->ndim, MG_INT64)) != NULL)
    for (int64_t j = 0; j < idx->numel; j++) ((int64_t *)mg_ptr(wrapped))[j] = v[j] < 0 ? v[j] + size : v[j];
  mg_tensor_release(idx);
  return wrapped;
}

/* gather: out[..., j..., ...] = x[..., indices[j...], ...] along axis;
** a negative index counts from the end.
** grad: scatter_add(dout) adds each row back where it came from */
mg_tensor *mg_gather (mg_tensor *x, mg_tensor *indices, int axis) {
  MG_CHECK_ARG("mg_gather", x, NULL);
  MG_CHECK_ARG("mg_gather", indices, NULL);
  int a = mg_check_axis("gather", axis, x->ndim);
  if (a < 0) return NULL;
  if (x->ndim - 1 + indices->ndim > MG_MAX_DIMS)
    return mg_seterror("gather: result would have more than %d dimensions", MG_MAX_DIMS), NULL;
  mg_tensor *idx = gather_indices(indices, x->shape[a], a);
  if (idx == NULL) return NULL;
  int64_t shape[MG_MAX_DIMS];
  int nd = 0;
  for (int i = 0; i < a; i++) shape[nd++] = x->shape[i];
  for (int i = 0; i < idx->ndim; i++) shape[nd++] = idx->shape[i];
  for (int i = a + 1; i < x->ndim; i++) shape[nd++] = x->shape[i];
  mg_attr attr = {0};
  attr.axis = a;
  mg_tensor *in[2] = {x, idx};                /* scatter_add gets them non-negative */
  mg_opcall c = MG_OPCALL(&gather_op, 2, in, &attr, shape, nd, x->dtype);
  mg_tensor *out = mg_dispatch(&c);
  mg_tensor_release(idx);
  return out;
}

/* rows of x along c->attr->axis at the (non-negative) indices c->in[1] */
static mg_status gather_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0], *idx = c->in[1];
  int a = c->attr->axis;
  int64_t outer = 1, inner = 1, esz = (int64_t)mg_dtype_size(x->dtype);
  for (int i = 0; i < a; i++) outer *= x->shape[i];
  for (int i = a + 1; i < x->ndim; i++) inner *= x->shape[i];
  mg_tensor *xc = mg_contiguous(x), *out = xc ? mg_empty(c->shape, c->ndim, c->dtype) : NULL;
  if (out == NULL) goto done;
  const int64_t *v = (const int64_t *)mg_ptr(idx);
  int64_t k = idx->numel, rows = x->shape[a];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < k; j++)
      memcpy(mg_ptr(out) + ((o * k + j) * inner) * esz, mg_ptr(xc) + ((o * rows + v[j]) * inner) * esz,
             (size_t)(inner * esz));
done:
  mg_tensor_release(xc);
  c->out[0] = out;
  return out ? MG_OK : MG_ERR;
}

static mg_status gather_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_scatter_add(dout[0], n->in[1], n->attr->axis, SHAPE_OF(n, 0));
  return MG_OK;
}
MG_ROW(GATHER, gather) = {.forward = gather_forward, .info = {.name = "gather", .kind = MG_OP_OTHER, .doc = "slices of x along an axis at integer indices"}, .saves = MG_SAVE_IN(1), .backward = gather_backward};

#define SCATTER_ADD(T) do {                                                         \
    T *o_ = (T *)mg_ptr(out); const T *s_ = (const T *)mg_ptr(sc);                 \
    for (int64_t o = 0; o < outer; o++)                                             \
      for (int64_t j = 0; j < k; j++) {                                             \
        T *dst = o_ + (o * rows + v[j]) * inner; const T *from = s_ + (o * k + j) * inner; \
        for (int64_t i = 0; i < inner; i++) dst[i] += from[i];                       \
      }                                                                             \
  } while (0)

/* scatter_add: zeros of `shape`, with src's rows added at indices along
** axis.  grad: gather(dout) */
mg_tensor *mg_scatter_add (mg_tensor *src, mg_tensor *indices, int axis, const int64_t *shape,
                           int ndim) {
  MG_CHECK_ARG("mg_scatter_add", src, NULL);
  MG_CHECK_ARG("mg_scatter_add", indices, NULL);
  if (mg_shape_numel("mg_scatter_add", shape, ndim) < 0) return NULL;
  HALF_AS_FLOAT32(src, mg_scatter_add(src, indices, axis, shape, ndim));   /* gather's gradient under autocast */
  if (mg_check_computable("scatter_add", src->dtype) != MG_OK) return NULL;
  int a = mg_check_axis("scatter_add", axis, ndim);
  if (a < 0) return NULL;
  mg_tensor *idx = mg_contiguous(indices);
  if (idx == NULL) return NULL;
  mg_status st = check_indices("scatter_add", idx, shape[a], a);
  int64_t outer = 1, inner = 1, k = idx->numel;
  mg_tensor_release(idx);
  if (st != MG_OK) return NULL;
  for (int i = 0; i < a; i++) outer *= shape[i];
  for (int i = a + 1; i < ndim; i++) inner *= shape[i];
  if (src->numel != outer * k * inner) {
    char s1[160], s2[160];
    return mg_seterror("scatter_add: source %s does not fit %d indices into %s", shape_s(s1, sizeof s1, src),
                       (int)k, mg_shape_str(s2, sizeof s2, shape, ndim)), NULL;
  }
  mg_attr attr = {0};
  attr.axis = a;
  mg_tensor *in[2] = {src, indices};
  mg_opcall c = MG_OPCALL(&scatter_add_op, 2, in, &attr, shape, ndim, src->dtype);
  return mg_dispatch(&c);
}

/* zeros of c's shape with the rows of c->in[0] added at c->in[1] along c->attr->axis */
static mg_status scatter_add_forward (mg_opcall *c) {
  mg_tensor *src = c->in[0];
  int a = c->attr->axis;
  mg_tensor *idx = mg_contiguous(c->in[1]), *sc = mg_contiguous(src), *out = NULL;
  if (idx == NULL || sc == NULL) goto done;
  int64_t outer = 1, inner = 1, k = idx->numel, rows = c->shape[a];
  for (int i = 0; i < a; i++) outer *= c->shape[i];
  for (int i = a + 1; i < c->ndim; i++) inner *= c->shape[i];
  if ((out = mg_full(c->shape, c->ndim, src->dtype, 0.0)) == NULL) goto done;
  const int64_t *v = (const int64_t *)mg_ptr(idx);
  switch (src->dtype) {
    case MG_FLOAT32: SCATTER_ADD(float); break;
    case MG_FLOAT64: SCATTER_ADD(double); break;
    case MG_INT64: SCATTER_ADD(int64_t); break;
    default: SCATTER_ADD(uint8_t); break;
  }
done:
  mg_tensor_release(idx);
  mg_tensor_release(sc);
  c->out[0] = out;
  return out ? MG_OK : MG_ERR;
}

static mg_status scatter_add_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_tensor *g = mg_gather(dout[0], n->in[1], n->attr->axis);
  din[0] = mg_reshape(g, SHAPE_OF(n, 0));
  mg_tensor_release(g);
  return MG_OK;
}
MG_ROW(SCATTER_ADD, scatter_add) = {.forward = scatter_add_forward, .info = {.name = "scatter_add", .kind = MG_OP_OTHER, .doc = "zeros with slices added at indices (gather's adjoint)"}, .saves = MG_SAVE_IN(1), .backward = scatter_add_backward};

/* }========================================================== */


/* {=============== identity and stop_gradient ================ */

/* the kernel of both: a new tensor viewing x's data, a new id, so tapes see a new value */
static mg_status fresh_view (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  c->out[0] = mg_tensor_view(x->storage, x->dtype, x->shape, x->ndim, x->strides, x->offset);
  return c->out[0] ? MG_OK : MG_ERR;
}

static mg_tensor *fresh_view_op (const mg_opdef *def, mg_tensor *x) {
  mg_opcall c = MG_OPCALL(def, 1, &x, NULL, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

/* identity: the same values as a new tensor (TF's tf.identity).  grad: dout */
static const mg_opdef identity_op, stop_gradient_op;
mg_tensor *mg_identity (mg_tensor *x) {
  MG_CHECK_ARG("mg_identity", x, NULL);
  return fresh_view_op(&identity_op, x);
}
static mg_status identity_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  (void)n;
  din[0] = mg_tensor_retain(dout[0]);
  return MG_OK;
}
MG_ROW(IDENTITY, identity) = {
  .makes_views = true,
  .forward = fresh_view,
  .info = {.name = "identity", .kind = MG_OP_UNARY, .fn.unary = mg_identity,
           .doc = "x as a new tensor, no copy (tf.identity): a tape sees a new value"},
  .backward = identity_backward,
};

/* stop_gradient: the same values, recorded by no tape, so a constant to
** every gradient (tf.stop_gradient, torch's detach); no copy */
mg_tensor *mg_stop_gradient (mg_tensor *x) {
  MG_CHECK_ARG("mg_stop_gradient", x, NULL);
  return fresh_view_op(&stop_gradient_op, x);
}
MG_ROW(STOP_GRADIENT, stop_gradient) = {
  .makes_views = true,
  .forward = fresh_view,
  .info = {.name = "stop_gradient", .kind = MG_OP_UNARY, .fn.unary = mg_stop_gradient,
           .doc = "x as a constant to every tape, no copy (tf.stop_gradient, torch's detach)"},
};

/* }========================================================== */

MG_FAMILY(mg_shape_ops, SHAPE_OPS, SHAPE__COUNT);

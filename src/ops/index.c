/*
** index.c — indexing and rearranging: take_along_axis and its adjoint
** put_along_axis, flip, tile, repeat_interleave, pad, tril, triu,
** masked_fill. The rows of sort.c (sort, argsort, topk) and einsum.c are
** listed here too.
**
** Indices are int64 and 0-based; a negative one counts from the end (-1 is
** the last), as in NumPy. Every backward rule is written with public ops,
** mostly this file's own adjoint pairs (take_along_axis <-> put_along_axis,
** flip <-> flip, tril <-> tril, repeat_interleave -> scatter_add, pad ->
** slice or scatter_add), so gradients of any order come from the same code.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define INDEX_OPS(X) \
  X(TAKE, take) X(PUT, put) X(FLIP, flip) X(TILE, tile) X(REPEAT, repeat) X(PAD, pad) \
  X(TRIL, tril) X(TRIU, triu) X(MASKED_FILL, masked_fill)
enum { INDEX_OPS(MG_ROW_ENUM) INDEX__COUNT };

static char *shape_s (char *buf, size_t n, const mg_tensor *t) {
  return mg_shape_str(buf, n, t->shape, t->ndim);
}

/* a shape seen as (outer, n, inner) around axis a */
static void around (const int64_t *shape, int ndim, int a, int64_t *outer, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int i = 0; i < a; i++) *outer *= shape[i];
  for (int i = a + 1; i < ndim; i++) *inner *= shape[i];
}


/* do the (contiguous, int64) indices all lie in [-n, n)? */
static mg_status check_range (const char *fn, const mg_tensor *idx, int64_t n, int axis) {
  const int64_t *v = (const int64_t *)mg_ptr(idx);
  for (int64_t j = 0; j < idx->numel; j++)
    if (v[j] < -n || v[j] >= n) {
      char hint[96];
      return mg_seterror("%s: index " MG_POS " is out of bounds for dimension " MG_POS " of size %lld%s", fn,
                         (long long)v[j], (long long)axis, (long long)n, mg_range_hint(hint, sizeof hint, n));
    }
  return MG_OK;
}

static inline int64_t wrap_index (int64_t v, int64_t n) { return v < 0 ? v + n : v; }

/* 1-based indices, as Lua and the binding write them, to 0-based ones:
** i > 0 is i - 1, i < 0 stays (it counts from the end either way), 0 is an
** error */
mg_tensor *mg_indices_from_1based (mg_tensor *indices, const char *fn) {
  MG_CHECK_ARG("mg_indices_from_1based", indices, NULL);
  if (fn == NULL) fn = "indices";
  if (indices->dtype != MG_INT64)
    return mg_seterror("%s: indices must be int64, got %s", fn, mg_dtype_name(indices->dtype)), NULL;
  mg_tensor *c = mg_contiguous(indices), *out = c ? mg_empty(c->shape, c->ndim, MG_INT64) : NULL;
  if (out != NULL) {
    const int64_t *v = (const int64_t *)mg_ptr(c);
    int64_t *o = (int64_t *)mg_ptr(out);
    int zero = 0;
    for (int64_t j = 0; j < c->numel; j++) {        /* no branch: it vectorises */
      zero |= v[j] == 0;
      o[j] = v[j] - (v[j] > 0);
    }
    if (zero) {
      mg_tensor_release(out);
      out = NULL;
      mg_seterror("%s: index 0 is out of range (indices start at 1; negative ones count from the end)", fn);
    }
  }
  mg_tensor_release(c);
  return out;
}


/* {============= take_along_axis and put_along_axis ============ */

static const mg_opdef take_op, put_op;
static mg_status take_forward (mg_opcall *c), put_forward (mg_opcall *c);

/* out (outer,k,inner) = x (outer,n,inner) at idx (outer,k,inner) along the
** middle; an index outside [-n, n) sets bad (and is not followed) */
#define TAKE(T) do {                                                              \
    T *o_ = (T *)mg_ptr(out); const T *x_ = (const T *)mg_ptr(xc);                \
    MG_PARALLEL_FOR(outer > 1 && out->numel >= MG_PARALLEL_MIN, reduction(|:bad), \
    for (int64_t o = 0; o < outer; o++) {                                        \
      const T *src = x_ + o * n * inner;                                         \
      for (int64_t j = 0; j < k; j++) {                                          \
        const int64_t *vj = v + (o * k + j) * inner;                             \
        T *dst = o_ + (o * k + j) * inner;                                       \
        for (int64_t i = 0; i < inner; i++) {                                    \
          uint64_t r = (uint64_t)wrap_index(vj[i], n);                           \
          bad |= r >= (uint64_t)n;                                               \
          dst[i] = src[(r < (uint64_t)n ? (int64_t)r : 0) * inner + i];          \
        }                                                                        \
      }                                                                          \
    });                                                                          \
  } while (0)

/* x: (..., n, ...), indices: (..., k, ...), the same sizes elsewhere */
static mg_tensor *take_prim (mg_tensor *x, mg_tensor *indices, int a) {
  mg_attr attr = {0};
  attr.axis = a;
  mg_tensor *in[2] = {x, indices};
  mg_opcall c = MG_OPCALL(&take_op, 2, in, &attr, indices->shape, indices->ndim, x->dtype);
  return mg_dispatch(&c);
}

static mg_status take_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0], *indices = c->in[1];
  int a = c->attr->axis;
  mg_tensor *xc = mg_contiguous(x), *idx = mg_contiguous(indices), *out = NULL;
  if (xc == NULL || idx == NULL) goto done;
  int64_t outer, inner, n = x->shape[a], k = idx->shape[a];
  if (n == 0 && idx->numel > 0) {             /* nothing to take from */
    check_range("take_along_axis", idx, n, a);
    goto done;
  }
  if ((out = mg_empty(idx->shape, idx->ndim, x->dtype)) == NULL) goto done;
  around(x->shape, x->ndim, a, &outer, &inner);
  const int64_t *v = (const int64_t *)mg_ptr(idx);
  int bad = 0;
  switch (mg_dtype_size(x->dtype)) {            /* bits are copied: any dtype */
    case 8: TAKE(uint64_t); break;
    case 4: TAKE(uint32_t); break;
    case 2: TAKE(uint16_t); break;
    default: TAKE(uint8_t); break;
  }
  if (bad) {                                    /* the message names the first */
    check_range("take_along_axis", idx, n, a);
    mg_tensor_release(out);
    out = NULL;
    goto done;
  }
done:
  mg_tensor_release(xc);
  mg_tensor_release(idx);
  c->out[0] = out;
  return out ? MG_OK : MG_ERR;
}

/* put_add: out = x with values added at indices along axis a (bool: or) */
#define PUT(T, UPDATE) do {                                                       \
    T *o_ = (T *)mg_ptr(out); const T *s_ = (const T *)mg_ptr(vc);                \
    MG_PARALLEL_FOR(outer > 1 && vc->numel >= MG_PARALLEL_MIN, ,                  \
    for (int64_t o = 0; o < outer; o++) {                                        \
      T *dst = o_ + o * n * inner;                                               \
      for (int64_t j = 0; j < k; j++) {                                          \
        const int64_t *vj = v + (o * k + j) * inner;                             \
        const T *sj = s_ + (o * k + j) * inner;                                  \
        for (int64_t i = 0; i < inner; i++) {                                    \
          T *d = dst + wrap_index(vj[i], n) * inner + i;                         \
          *d = UPDATE(*d, sj[i]);                                                \
        }                                                                        \
      }                                                                          \
    });                                                                          \
  } while (0)
#define ADD(a, b)    ((a) + (b))
#define ADD_I(a, b)  ((int64_t)((uint64_t)(a) + (uint64_t)(b)))    /* wraps, as Lua's */
#define OR(a, b)     ((uint8_t)((a) | (b)))

/* x: (..., n, ...); indices and values: (..., k, ...), the same sizes elsewhere */
static mg_tensor *put_prim (mg_tensor *x, mg_tensor *indices, mg_tensor *values, int a) {
  mg_attr attr = {0};
  attr.axis = a;
  mg_tensor *in[3] = {x, indices, values};
  mg_opcall c = MG_OPCALL(&put_op, 3, in, &attr, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

static mg_status put_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0], *indices = c->in[1], *values = c->in[2];
  int a = c->attr->axis;
  mg_tensor *idx = mg_contiguous(indices), *vc = mg_contiguous(values), *out = NULL;
  if (idx == NULL || vc == NULL || check_range("put_along_axis", idx, x->shape[a], a) != MG_OK) goto done;
  if ((out = mg_empty(x->shape, x->ndim, x->dtype)) == NULL) goto done;
  if (mg_copy_into(out, x) != MG_OK) {
    mg_tensor_release(out);
    out = NULL;
    goto done;
  }
  int64_t outer, inner, n = x->shape[a], k = idx->shape[a];
  around(x->shape, x->ndim, a, &outer, &inner);
  const int64_t *v = (const int64_t *)mg_ptr(idx);
  switch (x->dtype) {                           /* mg_put_along_axis and take_backward checked the dtype */
    case MG_FLOAT32: PUT(float, ADD); break;
    case MG_FLOAT64: PUT(double, ADD); break;
    case MG_INT64: PUT(int64_t, ADD_I); break;
    default: mg_assert(x->dtype == MG_BOOL); PUT(uint8_t, OR); break;
  }
done:
  mg_tensor_release(idx);
  mg_tensor_release(vc);
  c->out[0] = out;
  return out ? MG_OK : MG_ERR;
}

/* take_along_axis: out = x[..., indices[..., j, ...], ...] along axis.
** grad: dx = put_along_axis(zeros, indices, dout), adding */
static mg_status take_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *d = mg_tmp(&sc, mg_half_to_float32(dout[0]));      /* half: the sums in float32 (cast back by the tape) */
  mg_meta m = n->in_meta[0];
  if (d) m.dtype = d->dtype;
  mg_tensor *z = d ? mg_tmp(&sc, mg_zeros_meta(&m)) : NULL;
  din[0] = z ? put_prim(z, n->in[1], d, n->attr->axis) : NULL;
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(TAKE, take) = {
  .forward = take_forward,
  .info = {.name = "take_along_axis", .kind = MG_OP_OTHER,
           .doc = "x's entries at indices along an axis, elementwise (NumPy's take_along_axis, torch.gather)"},
  .saves = MG_SAVE_IN(1), .backward = take_backward,
};

/* put_along_axis (adding): out = x, values added at indices along axis.
** grad: dx = dout, dvalues = take_along_axis(dout, indices) */
static mg_status put_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  if (n->needs[0]) din[0] = mg_tensor_retain(dout[0]);
  if (n->needs[2]) din[2] = take_prim(dout[0], n->in[1], n->attr->axis);
  return MG_OK;
}
MG_ROW(PUT, put) = {
  .forward = put_forward,
  .info = {.name = "put_along_axis", .kind = MG_OP_OTHER,
           .doc = "x with values written (or added) at indices along an axis (take_along_axis's adjoint)"},
  .saves = MG_SAVE_IN(1), .backward = put_backward,
};

/* the checks both share: int64 indices with x's number of dimensions */
static int along_axis_check (const char *fn, const mg_tensor *x, const mg_tensor *indices, int axis) {
  if (indices->dtype != MG_INT64)
    return mg_seterror("%s: indices must be int64, got %s", fn, mg_dtype_name(indices->dtype)), -1;
  if (x->ndim == 0) return mg_seterror("%s: needs at least 1 dimension, got a 0-d tensor", fn), -1;
  if (indices->ndim != x->ndim)
    return mg_seterror("%s: indices have %d dimensions and x has %d; they must have as many", fn,
                       indices->ndim, x->ndim), -1;
  return mg_check_axis(fn, axis, x->ndim);
}

/* a broadcast view of t with this shape, or t itself (retained) */
static mg_tensor *broadcast_or_same (mg_tensor *t, const int64_t *shape, int nd) {
  if (mg_same_shape(t->shape, t->ndim, shape, nd)) return mg_tensor_retain(t);
  return mg_broadcast_to(t, shape, nd);
}

mg_tensor *mg_take_along_axis (mg_tensor *x, mg_tensor *indices, int axis) {
  MG_CHECK_ARG("mg_take_along_axis", x, NULL);
  MG_CHECK_ARG("mg_take_along_axis", indices, NULL);
  int a = along_axis_check("take_along_axis", x, indices, axis);
  if (a < 0) return NULL;
  int64_t xs[MG_MAX_DIMS], is[MG_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) {        /* broadcast outside the axis, as NumPy */
    int64_t dx = x->shape[d], di = indices->shape[d];
    if (d != a && dx != di && dx != 1 && di != 1) {
      char s1[160], s2[160];
      return mg_seterror("take_along_axis: indices %s do not broadcast against x %s outside axis " MG_POS,
                         shape_s(s1, sizeof s1, indices), shape_s(s2, sizeof s2, x), (long long)a), NULL;
    }
    xs[d] = d == a ? dx : (dx == 1 ? di : dx);
    is[d] = d == a ? di : xs[d];
  }
  mg_tensor *xb = broadcast_or_same(x, xs, x->ndim);
  mg_tensor *ib = xb ? broadcast_or_same(indices, is, x->ndim) : NULL;
  mg_tensor *out = ib ? take_prim(xb, ib, a) : NULL;
  mg_tensor_release(xb);
  mg_tensor_release(ib);
  return out;
}

/*
** put_along_axis, set: the last value written to a place wins (as NumPy).
** As a composite: zero x where something is written, keep only the values
** that win, and add them; so the gradient reaches x where nothing was
** written and each value that won.
*/
static mg_tensor *put_set (mg_tensor *x, mg_tensor *ib, mg_tensor *vb, int a) {
  mg_scope sc = {0};
  mg_tensor *out = NULL;
  mg_tensor *idx = mg_tmp(&sc, mg_contiguous(ib));
  if (idx == NULL || check_range("put_along_axis", idx, x->shape[a], a) != MG_OK) goto done;
  mg_tensor *winner = mg_tmp(&sc, mg_full_int64(x->shape, x->ndim, -1));
  mg_tensor *written = mg_tmp(&sc, mg_empty(x->shape, x->ndim, MG_BOOL));
  mg_tensor *last = mg_tmp(&sc, mg_empty(idx->shape, idx->ndim, MG_BOOL));
  if (winner == NULL || written == NULL || last == NULL) goto done;
  int64_t outer, inner, n = x->shape[a], k = idx->shape[a];
  around(x->shape, x->ndim, a, &outer, &inner);
  const int64_t *v = (const int64_t *)mg_ptr(idx);
  int64_t *w = (int64_t *)mg_ptr(winner);
  for (int64_t s = 0; s < idx->numel; s++) {            /* s = (o*k + j)*inner + i */
    int64_t o = s / (k * inner), i = s % inner;
    w[(o * n + wrap_index(v[s], n)) * inner + i] = s;
  }
  uint8_t *wr = (uint8_t *)mg_ptr(written), *ls = (uint8_t *)mg_ptr(last);
  for (int64_t t = 0; t < x->numel; t++) wr[t] = w[t] >= 0;
  for (int64_t s = 0; s < idx->numel; s++) {
    int64_t o = s / (k * inner), i = s % inner;
    ls[s] = w[(o * n + wrap_index(v[s], n)) * inner + i] == s;
  }
  mg_tensor *zero = mg_tmp(&sc, mg_scalar(0.0, x->dtype));
  mg_tensor *xm = mg_tmp(&sc, mg_where(written, zero, x));
  mg_tensor *vm = mg_tmp(&sc, mg_where(last, vb, zero));
  out = xm && vm ? put_prim(xm, ib, vm, a) : NULL;
done:
  mg_scope_end(&sc);
  return out;
}

mg_tensor *mg_put_along_axis (mg_tensor *x, mg_tensor *indices, mg_tensor *values, int axis, int add) {
  MG_CHECK_ARG("mg_put_along_axis", x, NULL);
  MG_CHECK_ARG("mg_put_along_axis", indices, NULL);
  MG_CHECK_ARG("mg_put_along_axis", values, NULL);
  int a = along_axis_check("put_along_axis", x, indices, axis);
  if (a < 0) return NULL;
  if (mg_is_half(x->dtype) || mg_is_half(values->dtype)) {    /* in float32, as other ops */
    mg_tensor *x32 = mg_half_to_float32(x), *v32 = mg_half_to_float32(values);
    mg_tensor *r = x32 && v32 ? mg_put_along_axis(x32, indices, v32, axis, add) : NULL;
    mg_tensor_release(x32);
    mg_tensor_release(v32);
    return r;
  }
  if (values->dtype != x->dtype)
    return mg_seterror("put_along_axis: dtypes differ: x is %s, values are %s", mg_dtype_name(x->dtype),
                       mg_dtype_name(values->dtype)), NULL;
  if (x->dtype != MG_FLOAT32 && x->dtype != MG_FLOAT64 && x->dtype != MG_INT64 && x->dtype != MG_BOOL)
    return mg_seterror("put_along_axis: not defined for %s tensors; cast them first",
                       mg_dtype_name(x->dtype)), NULL;
  char s1[160], s2[160];
  int64_t fs[MG_MAX_DIMS], vs[MG_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) {
    if (d != a && indices->shape[d] != x->shape[d] && indices->shape[d] != 1)
      return mg_seterror("put_along_axis: indices %s do not fit x %s outside axis " MG_POS,
                         shape_s(s1, sizeof s1, indices), shape_s(s2, sizeof s2, x), (long long)a), NULL;
    fs[d] = d == a ? indices->shape[d] : x->shape[d];
  }
  int nv = mg_broadcast_shapes("put_along_axis", "and", values->shape, values->ndim, fs, x->ndim, vs);
  if (nv != x->ndim || !mg_same_shape(vs, nv, fs, x->ndim))
    return mg_seterror("put_along_axis: values %s do not broadcast to the indices' shape %s",
                       shape_s(s1, sizeof s1, values), mg_shape_str(s2, sizeof s2, fs, x->ndim)), NULL;
  mg_tensor *ib = broadcast_or_same(indices, fs, x->ndim);
  mg_tensor *vb = ib ? broadcast_or_same(values, fs, x->ndim) : NULL;
  mg_tensor *out = !vb ? NULL : add ? put_prim(x, ib, vb, a) : put_set(x, ib, vb, a);
  mg_tensor_release(ib);
  mg_tensor_release(vb);
  return out;
}

/* }========================================================== */


/* {========================== flip ========================== */

static const mg_opdef flip_op;

/* flip: x reversed along the axes, a view with those strides negated.
** grad: flip(dout) along the same axes */
mg_tensor *mg_flip (mg_tensor *x, const int *axes, int naxes) {
  MG_CHECK_ARG("mg_flip", x, NULL);
  if (naxes < 0) return mg_seterror("flip: %d axes given", naxes), NULL;
  bool rev[MG_MAX_DIMS] = {false};
  for (int k = 0; k < (axes ? naxes : x->ndim); k++) {
    int a = axes ? mg_check_axis("flip", axes[k], x->ndim) : k;
    if (a < 0) return NULL;
    if (rev[a]) return mg_seterror("flip: axis " MG_POS " is given twice", (long long)a), NULL;
    rev[a] = true;
  }
  mg_attr attr = {0};
  for (int d = 0; d < x->ndim; d++) attr.a[d] = rev[d];
  mg_opcall c = MG_OPCALL(&flip_op, 1, &x, &attr, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

/* the view with the flipped axes' (c->attr->a[d] set) strides negated */
static mg_status flip_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  int64_t strides[MG_MAX_DIMS], offset = x->offset;
  for (int d = 0; d < x->ndim; d++) {
    bool rev = c->attr->a[d];
    strides[d] = rev ? -x->strides[d] : x->strides[d];
    if (rev && x->shape[d] > 0) offset += (x->shape[d] - 1) * x->strides[d];
  }
  c->out[0] = mg_tensor_view(x->storage, x->dtype, x->shape, x->ndim, strides, offset);
  return c->out[0] ? MG_OK : MG_ERR;
}

static mg_status flip_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  int axes[MG_MAX_DIMS], k = 0;
  for (int d = 0; d < n->in_meta[0].ndim; d++) if (n->attr->a[d]) axes[k++] = d;
  din[0] = mg_flip(dout[0], axes, k);
  return MG_OK;
}
MG_ROW(FLIP, flip) = {
  .forward = flip_forward,
  .info = {.name = "flip", .kind = MG_OP_OTHER, .doc = "x reversed along some axes (a view)"},
  .backward = flip_backward,
};

/* }========================================================== */


/* {========================== tile ========================== */

static const mg_opdef tile_op;

/* writes x's block from dimension d on (src) tiled into dst; xstr and ostr
** are the byte steps of each dimension in x and in the output */
static void tile_fill (char *dst, const char *src, int d, int nd, const int64_t *xs, const int64_t *rs,
                       const int64_t *xstr, const int64_t *ostr) {
  if (d == nd - 1) {
    memcpy(dst, src, (size_t)(xs[d] * xstr[d]));
  } else {
    for (int64_t i = 0; i < xs[d]; i++)
      tile_fill(dst + i * ostr[d], src + i * xstr[d], d + 1, nd, xs, rs, xstr, ostr);
  }
  size_t block = (size_t)(xs[d] * ostr[d]);
  for (int64_t r = 1; r < rs[d]; r++) memcpy(dst + (size_t)r * block, dst, block);
}

/* tile: x repeated reps[d] times along each dimension, as NumPy's tile
** (the shorter of x's shape and reps is padded with leading 1s).
** grad: dout summed over the repetitions, one dimension at a time */
mg_tensor *mg_tile (mg_tensor *x, const int64_t *reps, int nreps) {
  MG_CHECK_ARG("mg_tile", x, NULL);
  if (nreps > 0) MG_CHECK_ARG("mg_tile", reps, NULL);
  if (nreps < 0 || nreps > MG_MAX_DIMS)
    return mg_seterror("tile: %d repetitions given, at most %d allowed", nreps, MG_MAX_DIMS), NULL;
  int nd = x->ndim > nreps ? x->ndim : nreps;
  int64_t xs[MG_MAX_DIMS], rs[MG_MAX_DIMS], shape[MG_MAX_DIMS] = {0};
  for (int d = 0; d < nd; d++) {
    int dx = d - (nd - x->ndim), dr = d - (nd - nreps);
    xs[d] = dx >= 0 ? x->shape[dx] : 1;
    rs[d] = dr >= 0 ? reps[dr] : 1;
    if (rs[d] < 0)
      return mg_seterror("tile: repetition %d is negative (%lld)", dr + 1, (long long)rs[d]), NULL;
    if (xs[d] > 0 && rs[d] > INT64_MAX / xs[d])
      return mg_seterror("tile: the result has too many elements"), NULL;
    shape[d] = xs[d] * rs[d];
  }
  if (mg_shape_numel("tile", shape, nd) < 0) return NULL;
  mg_attr attr = {0};
  attr.axis = nd;
  for (int d = 0; d < nd; d++) attr.a[d] = rs[d];
  mg_opcall c = MG_OPCALL(&tile_op, 1, &x, &attr, shape, nd, x->dtype);
  return mg_dispatch(&c);
}

/* the copies of x (c->attr->a: the repetitions, x's shape padded to c's) */
static mg_status tile_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  int nd = c->ndim;
  const int64_t *rs = c->attr->a, *shape = c->shape;
  int64_t xs[MG_MAX_DIMS];
  for (int d = 0; d < nd; d++) xs[d] = d - (nd - x->ndim) >= 0 ? x->shape[d - (nd - x->ndim)] : 1;
  mg_tensor *xc = mg_contiguous(x), *out = xc ? mg_empty(shape, nd, x->dtype) : NULL;
  if (out != NULL && out->numel > 0) {
    int64_t esz = (int64_t)mg_dtype_size(x->dtype), xstr[MG_MAX_DIMS], ostr[MG_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
      xstr[d] = d == nd - 1 ? esz : xstr[d + 1] * xs[d + 1];
      ostr[d] = d == nd - 1 ? esz : ostr[d + 1] * shape[d + 1];
    }
    if (nd == 0) memcpy(mg_ptr(out), mg_ptr(xc), (size_t)esz);
    else tile_fill(mg_ptr(out), mg_ptr(xc), 0, nd, xs, rs, xstr, ostr);
  }
  mg_tensor_release(xc);
  c->out[0] = out;
  return out ? MG_OK : MG_ERR;
}

static mg_status tile_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  int nd = n->attr->axis, xnd = n->in_meta[0].ndim;
  int64_t cur[MG_MAX_DIMS];                 /* g's shape; reduced from the left */
  mg_tensor *g = mg_tensor_retain(dout[0]);
  for (int d = 0; d < nd; d++) cur[d] = dout[0]->shape[d];
  for (int d = 0; d < nd && g; d++) {
    int64_t r = n->attr->a[d];
    if (r == 1) continue;
    int64_t xd = d - (nd - xnd) >= 0 ? n->in_meta[0].shape[d - (nd - xnd)] : 1;
    int64_t pre = 1, post = 1;
    for (int i = 0; i < d; i++) pre *= cur[i];
    for (int i = d + 1; i < nd; i++) post *= cur[i];
    int64_t four[4] = {pre, r, xd, post};     /* (before, repetition, x's dimension, after) */
    mg_tensor *g4 = mg_reshape(g, four, 4), *s = mg_sum(g4, 1, 0);
    cur[d] = xd;
    mg_tensor_release(g);
    g = mg_reshape(s, cur, nd);
    mg_tensor_release(g4);
    mg_tensor_release(s);
  }
  din[0] = mg_reshape(g, SHAPE_OF(n, 0));
  mg_tensor_release(g);
  return MG_OK;
}
MG_ROW(TILE, tile) = {
  .forward = tile_forward,
  .info = {.name = "tile", .kind = MG_OP_OTHER,
           .doc = "x repeated as a whole along each dimension (NumPy's tile)"},
  .backward = tile_backward,
};

/* }========================================================== */


/* {==================== repeat_interleave =================== */

static const mg_opdef repeat_op;

/* out (outer,k,inner) = x (outer,n,inner) at rows idx[0..k), 0 <= idx < n */
static void gather_rows (char *out, const char *x, const int64_t *idx, int64_t k, int64_t outer,
                         int64_t n, int64_t inner, size_t esz) {
  size_t row = (size_t)inner * esz;
  MG_PARALLEL_FOR(outer > 1 && outer * k * inner >= MG_PARALLEL_MIN, ,
  for (int64_t o = 0; o < outer; o++) {
    char *dst = out + (size_t)(o * k) * row;
    const char *src = x + (size_t)(o * n) * row;
    if (inner == 1 && esz == 4)
      for (int64_t j = 0; j < k; j++) ((uint32_t *)dst)[j] = ((const uint32_t *)src)[idx[j]];
    else if (inner == 1 && esz == 8)
      for (int64_t j = 0; j < k; j++) ((uint64_t *)dst)[j] = ((const uint64_t *)src)[idx[j]];
    else
      for (int64_t j = 0; j < k; j++) memcpy(dst + (size_t)j * row, src + (size_t)idx[j] * row, row);
  });
}

/* repeat_interleave: each entry of x along axis repeated (np.repeat,
** torch.repeat_interleave): repeats[0] times each when nrepeats is 1, else
** repeats[i] times entry i; MG_ALL_AXES repeats the flattened x.
** grad: scatter_add(dout) sums each entry's copies */
mg_tensor *mg_repeat_interleave (mg_tensor *x, const int64_t *repeats, int64_t nrepeats, int axis) {
  MG_CHECK_ARG("mg_repeat_interleave", x, NULL);
  MG_CHECK_ARG("mg_repeat_interleave", repeats, NULL);
  if (axis == MG_ALL_AXES) {
    int64_t flat = x->numel;
    mg_tensor *f = mg_reshape(x, &flat, 1), *r = f ? mg_repeat_interleave(f, repeats, nrepeats, 0) : NULL;
    mg_tensor_release(f);
    return r;
  }
  int a = mg_check_axis("repeat_interleave", axis, x->ndim);
  if (a < 0) return NULL;
  int64_t n = x->shape[a], total = 0;
  if (nrepeats != 1 && nrepeats != n)
    return mg_seterror("repeat_interleave: %lld repeat counts given for dimension " MG_POS " of size %lld "
                       "(give one, or one per entry)",
                       (long long)nrepeats, (long long)a, (long long)n), NULL;
  for (int64_t i = 0; i < nrepeats; i++) {
    if (repeats[i] < 0 && nrepeats == 1)
      return mg_seterror("repeat_interleave: repeats = %lld is negative", (long long)repeats[i]), NULL;
    if (repeats[i] < 0)
      return mg_seterror("repeat_interleave: repeats entry " MG_POS1 " is negative (%lld)", (long long)i,
                         (long long)repeats[i]), NULL;
    int64_t add = nrepeats == 1 ? (n > 0 && repeats[0] > INT64_MAX / n ? -1 : repeats[0] * n) : repeats[i];
    if (add < 0 || total > INT64_MAX - add)
      return mg_seterror("repeat_interleave: the result has too many elements"), NULL;
    total += add;
  }
  int64_t shape[MG_MAX_DIMS];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[a] = total;
  if (mg_shape_numel("repeat_interleave", shape, x->ndim) < 0) return NULL;
  mg_tensor *idx = mg_empty(&total, 1, MG_INT64);        /* which entry each row copies */
  if (idx == NULL) return NULL;
  int64_t *v = (int64_t *)mg_ptr(idx), at = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t r = 0, c = repeats[nrepeats == 1 ? 0 : i]; r < c; r++) v[at++] = i;
  mg_attr attr = {0};
  attr.axis = a;
  mg_tensor *in[2] = {x, idx};
  mg_opcall c = MG_OPCALL(&repeat_op, 2, in, &attr, shape, x->ndim, x->dtype);
  mg_tensor *out = mg_dispatch(&c);
  mg_tensor_release(idx);
  return out;
}

/* the rows of x that c->in[1] names, along c->attr->axis */
static mg_status repeat_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0], *idx = c->in[1];
  int a = c->attr->axis;
  int64_t outer, inner, total = idx->numel;
  mg_tensor *xc = mg_contiguous(x), *out = xc ? mg_empty(c->shape, c->ndim, c->dtype) : NULL;
  if (out != NULL) {
    around(x->shape, x->ndim, a, &outer, &inner);
    gather_rows(mg_ptr(out), mg_ptr(xc), (const int64_t *)mg_ptr(idx), total, outer, x->shape[a], inner,
                mg_dtype_size(x->dtype));
  }
  mg_tensor_release(xc);
  c->out[0] = out;
  return out ? MG_OK : MG_ERR;
}

static mg_status repeat_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_scatter_add(dout[0], n->in[1], n->attr->axis, SHAPE_OF(n, 0));
  return MG_OK;
}
static mg_status repeat_forward (mg_opcall *c);
MG_ROW(REPEAT, repeat) = {
  .forward = repeat_forward,
  .info = {.name = "repeat_interleave", .kind = MG_OP_OTHER,
           .doc = "each entry repeated along an axis (np.repeat, torch.repeat_interleave)"},
  .saves = MG_SAVE_IN(1), .backward = repeat_backward,
};

/* }========================================================== */


/* {=========================== pad ========================== */

static const mg_opdef pad_op;

static int64_t floor_mod (int64_t i, int64_t p) {
  int64_t r = i % p;
  return r < 0 ? r + p : r;
}

/* the entry of a dimension of size n (> 0) that position i (relative to
** its first entry, maybe outside) copies */
static int64_t pad_source (mg_pad_mode mode, int64_t i, int64_t n) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case MG_PAD_EDGE: return i < 0 ? 0 : n - 1;
    case MG_PAD_WRAP: return floor_mod(i, n);
    case MG_PAD_REFLECT: {
      if (n == 1) return 0;
      int64_t p = 2 * (n - 1), r = floor_mod(i, p);
      return r < n ? r : p - r;
    }
    default: {                                  /* symmetric */
      int64_t p = 2 * n, r = floor_mod(i, p);
      return r < n ? r : p - 1 - r;
    }
  }
}

/* the sources of dimension d's output positions, as an int64 tensor */
static mg_tensor *pad_map (mg_pad_mode mode, int64_t before, int64_t n, int64_t len) {
  mg_tensor *m = mg_empty(&len, 1, MG_INT64);
  if (m == NULL) return NULL;
  int64_t *v = (int64_t *)mg_ptr(m);
  for (int64_t j = 0; j < len; j++) v[j] = pad_source(mode, j - before, n);
  return m;
}

static const char *const pad_names[] = {"constant", "reflect", "symmetric", "edge", "wrap"};

/* pad: x with before[d] and after[d] entries added on each side of
** dimension d: `value` (constant), or copies of x's entries (reflect,
** symmetric, edge, wrap: NumPy's modes, any width).
** grad: constant: the middle of dout (a slice); else dout's copies summed
** back into place (scatter_add along each padded dimension) */
mg_tensor *mg_pad (mg_tensor *x, const int64_t *before, const int64_t *after, mg_pad_mode mode, double value) {
  MG_CHECK_ARG("mg_pad", x, NULL);
  if (x->ndim > 0) {
    MG_CHECK_ARG("mg_pad", before, NULL);
    MG_CHECK_ARG("mg_pad", after, NULL);
  }
  if ((int)mode < 0 || mode > MG_PAD_WRAP) return mg_seterror("pad: unknown mode %d", (int)mode), NULL;
  if (mode == MG_PAD_CONSTANT && x->dtype == MG_INT64 && (value != floor(value) || fabs(value) >= 0x1p63))
    return mg_seterror("pad: value %g is not an int64", value), NULL;
  int64_t shape[MG_MAX_DIMS] = {0};
  bool any = false;
  for (int d = 0; d < x->ndim; d++) {
    if (before[d] < 0 || after[d] < 0)
      return mg_seterror("pad: padding of dimension " MG_POS " is negative (%lld before, %lld after)", (long long)d,
                         (long long)before[d], (long long)after[d]), NULL;
    if (before[d] > INT64_MAX - x->shape[d] || after[d] > INT64_MAX - x->shape[d] - before[d])
      return mg_seterror("pad: the result has too many elements"), NULL;
    shape[d] = before[d] + x->shape[d] + after[d];
    if (shape[d] != x->shape[d] && x->shape[d] == 0 && mode != MG_PAD_CONSTANT)
      return mg_seterror("pad: mode '%s' cannot pad dimension " MG_POS ", which has no entries", pad_names[mode],
                         (long long)d), NULL;
    any = any || shape[d] != x->shape[d];
  }
  if (mg_shape_numel("pad", shape, x->ndim) < 0) return NULL;
  if (!any) mode = MG_PAD_CONSTANT;          /* nothing to copy from: a plain copy */
  mg_attr attr = {0};
  attr.axis = (int)mode;
  attr.f = value;
  for (int d = 0; d < x->ndim; d++) {
    attr.a[d] = before[d];
    attr.b[d] = after[d];
  }
  mg_opcall c = MG_OPCALL(&pad_op, 1, &x, &attr, shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

/* x padded as c->attr says: mode (axis), value (f), before (a) and after (b) */
static mg_status pad_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  mg_pad_mode mode = (mg_pad_mode)c->attr->axis;
  const int64_t *before = c->attr->a, *shape = c->shape;
  double value = c->attr->f;
  mg_tensor *out = NULL;
  if (mode == MG_PAD_CONSTANT) {
    if ((out = mg_full(shape, x->ndim, x->dtype, value)) == NULL) return MG_ERR;
    int64_t offset = 0;
    for (int d = 0; d < x->ndim; d++) offset += before[d] * out->strides[d];
    mg_tensor *mid = mg_tensor_view(out->storage, x->dtype, x->shape, x->ndim, out->strides, offset);
    if (mid == NULL || mg_copy_into(mid, x) != MG_OK) {
      mg_tensor_release(mid);
      mg_tensor_release(out);
      return MG_ERR;
    }
    mg_tensor_release(mid);
  } else {
    out = mg_contiguous(x);                  /* copies along one dimension at a time */
    for (int d = 0; d < x->ndim && out; d++) {
      if (shape[d] == x->shape[d]) continue;
      int64_t cur[MG_MAX_DIMS], outer, inner;
      memcpy(cur, out->shape, sizeof cur);
      cur[d] = shape[d];
      around(cur, x->ndim, d, &outer, &inner);
      mg_tensor *map = pad_map(mode, before[d], x->shape[d], shape[d]);
      mg_tensor *next = map ? mg_empty(cur, x->ndim, x->dtype) : NULL;
      if (next)
        gather_rows(mg_ptr(next), mg_ptr(out), (const int64_t *)mg_ptr(map), shape[d], outer,
                    x->shape[d], inner, mg_dtype_size(x->dtype));
      mg_tensor_release(map);
      mg_tensor_release(out);
      out = next;
    }
  }
  c->out[0] = out;
  return out ? MG_OK : MG_ERR;
}

static mg_status pad_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  const mg_meta *m = &n->in_meta[0];
  mg_pad_mode mode = (mg_pad_mode)n->attr->axis;
  if (mode == MG_PAD_CONSTANT) {
    int64_t stop[MG_MAX_DIMS], step[MG_MAX_DIMS];
    for (int d = 0; d < m->ndim; d++) {
      stop[d] = n->attr->a[d] + m->shape[d];
      step[d] = 1;
    }
    din[0] = mg_slice(dout[0], n->attr->a, stop, step);
    return MG_OK;
  }
  mg_tensor *g = mg_tensor_retain(dout[0]);
  for (int d = 0; d < m->ndim && g; d++) {
    int64_t len = g->shape[d], cur[MG_MAX_DIMS];
    if (len == m->shape[d]) continue;
    memcpy(cur, g->shape, sizeof cur);
    cur[d] = m->shape[d];
    mg_tensor *map = pad_map(mode, n->attr->a[d], m->shape[d], len);
    mg_tensor *next = map ? mg_scatter_add(g, map, d, cur, m->ndim) : NULL;
    mg_tensor_release(map);
    mg_tensor_release(g);
    g = next;
  }
  din[0] = g;
  return MG_OK;
}
MG_ROW(PAD, pad) = {
  .forward = pad_forward,
  .info = {.name = "pad", .kind = MG_OP_OTHER,
           .doc = "x padded on each side of each dimension (modes constant, reflect, symmetric, edge, wrap)"},
  .backward = pad_backward,
};

/* }========================================================== */


/* {====================== tril and triu ===================== */

static const mg_opdef tril_op, triu_op;

/* the entries on and below (lower) or on and above diagonal k of the last
** two dimensions kept, the others zero */
static mg_tensor *triangle (const mg_opdef *def, mg_tensor *x, int64_t k) {
  const char *fn = def->info.name;
  if (x->ndim < 2) return mg_seterror("%s: needs at least 2 dimensions, got %d", fn, x->ndim), NULL;
  mg_attr attr = {0};
  attr.a[0] = k;
  mg_opcall c = MG_OPCALL(def, 1, &x, &attr, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

static mg_status triangle_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0];
  int64_t k = c->attr->a[0];
  bool lower = c->def == &tril_op;
  mg_tensor *xc = mg_contiguous(x), *out = xc ? mg_empty(x->shape, x->ndim, x->dtype) : NULL;
  if (out != NULL) {
    int64_t rows = x->shape[x->ndim - 2], cols = x->shape[x->ndim - 1];
    int64_t mats = rows * cols == 0 ? 0 : x->numel / (rows * cols);
    size_t esz = mg_dtype_size(x->dtype);
    MG_PARALLEL_FOR(x->numel >= MG_PARALLEL_MIN, ,
    for (int64_t r = 0; r < mats * rows; r++) {
      int64_t i = r % rows;
      __int128 edge = lower ? (__int128)i + k + 1 : (__int128)i + k;   /* first column not kept / kept */
      int64_t e = edge < 0 ? 0 : edge > cols ? cols : (int64_t)edge;
      char *dst = mg_ptr(out) + (size_t)(r * cols) * esz;
      const char *src = mg_ptr(xc) + (size_t)(r * cols) * esz;
      if (lower) {
        memcpy(dst, src, (size_t)e * esz);
        memset(dst + (size_t)e * esz, 0, (size_t)(cols - e) * esz);
      } else {
        memset(dst, 0, (size_t)e * esz);
        memcpy(dst + (size_t)e * esz, src + (size_t)e * esz, (size_t)(cols - e) * esz);
      }
    });
  }
  mg_tensor_release(xc);
  c->out[0] = out;
  return out ? MG_OK : MG_ERR;
}

/* tril: x's lower triangle (j <= i + k) in the last two dimensions.
** grad: tril(dout, k) */
mg_tensor *mg_tril (mg_tensor *x, int64_t k) {
  MG_CHECK_ARG("mg_tril", x, NULL);
  return triangle(&tril_op, x, k);
}
static mg_status tril_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_tril(dout[0], n->attr->a[0]);
  return MG_OK;
}
MG_ROW(TRIL, tril) = {
  .forward = triangle_forward,
  .info = {.name = "tril", .kind = MG_OP_OTHER,
           .doc = "the lower triangle of the last two axes (j <= i + k), zeros above"},
  .backward = tril_backward,
};

/* triu: x's upper triangle (j >= i + k).  grad: triu(dout, k) */
mg_tensor *mg_triu (mg_tensor *x, int64_t k) {
  MG_CHECK_ARG("mg_triu", x, NULL);
  return triangle(&triu_op, x, k);
}
static mg_status triu_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_triu(dout[0], n->attr->a[0]);
  return MG_OK;
}
MG_ROW(TRIU, triu) = {
  .forward = triangle_forward,
  .info = {.name = "triu", .kind = MG_OP_OTHER,
           .doc = "the upper triangle of the last two axes (j >= i + k), zeros below"},
  .backward = triu_backward,
};

/* }========================================================== */


/* {====================== masked_fill ======================= */

static const mg_opdef masked_fill_op;

typedef struct { size_t esz; const char *value; } fill_ud;

/* one run of out = mask ? value : x; p: out, x, mask */
static void masked_fill_run (int64_t n, char **p, const int64_t *s, void *ud) {
  const fill_ud *f = (const fill_ud *)ud;
  const uint8_t *m = (const uint8_t *)p[2];
  int64_t sx = s[1], sm = s[2];
  switch (f->esz) {
    case 4: {
      uint32_t v, *o = (uint32_t *)p[0];
      const uint32_t *x = (const uint32_t *)p[1];
      memcpy(&v, f->value, 4);
      for (int64_t i = 0; i < n; i++) o[i] = m[i * sm] ? v : x[i * sx];
      break;
    }
    case 8: {
      uint64_t v, *o = (uint64_t *)p[0];
      const uint64_t *x = (const uint64_t *)p[1];
      memcpy(&v, f->value, 8);
      for (int64_t i = 0; i < n; i++) o[i] = m[i * sm] ? v : x[i * sx];
      break;
    }
    case 2: {
      uint16_t v, *o = (uint16_t *)p[0];
      const uint16_t *x = (const uint16_t *)p[1];
      memcpy(&v, f->value, 2);
      for (int64_t i = 0; i < n; i++) o[i] = m[i * sm] ? v : x[i * sx];
      break;
    }
    default: {
      uint8_t v = *(const uint8_t *)f->value, *o = (uint8_t *)p[0];
      const uint8_t *x = (const uint8_t *)p[1];
      for (int64_t i = 0; i < n; i++) o[i] = m[i * sm] ? v : x[i * sx];
      break;
    }
  }
}

/* masked_fill: out = mask ? value : x; mask (bool) broadcasts to x's
** shape, value is 0-d.  grad: dx = masked_fill(dout, mask, 0),
** dvalue = sum(where(mask, dout, 0)) */
mg_tensor *mg_masked_fill (mg_tensor *x, mg_tensor *mask, mg_tensor *value) {
  MG_CHECK_ARG("mg_masked_fill", x, NULL);
  MG_CHECK_ARG("mg_masked_fill", mask, NULL);
  MG_CHECK_ARG("mg_masked_fill", value, NULL);
  char s1[160], s2[160];
  if (mask->dtype != MG_BOOL)
    return mg_seterror("masked_fill: mask must be a bool tensor, got %s", mg_dtype_name(mask->dtype)), NULL;
  if (value->ndim != 0)
    return mg_seterror("masked_fill: value must be a 0-d tensor (one number), got shape %s",
                       shape_s(s1, sizeof s1, value)), NULL;
  mg_tensor *xv[2] = {x, value};                     /* a half and float32: in float32 */
  HALF_PAIR_AS_FLOAT32(x, value, mg_half_mixed(xv, 2), mg_masked_fill(x, mask, value));
  if (value->dtype != x->dtype)
    return mg_seterror("masked_fill: dtypes differ: x is %s, value is %s", mg_dtype_name(x->dtype),
                       mg_dtype_name(value->dtype)), NULL;
  int64_t shape[MG_MAX_DIMS];
  int nd = mg_broadcast_shapes("masked_fill", "and", x->shape, x->ndim, mask->shape, mask->ndim, shape);
  if (nd != x->ndim || !mg_same_shape(shape, nd, x->shape, x->ndim))
    return mg_seterror("masked_fill: mask %s does not broadcast to x's shape %s",
                       shape_s(s1, sizeof s1, mask), shape_s(s2, sizeof s2, x)), NULL;
  mg_tensor *in[3] = {x, mask, value};
  mg_opcall c = MG_OPCALL(&masked_fill_op, 3, in, NULL, x->shape, x->ndim, x->dtype);
  return mg_dispatch(&c);
}

static mg_status masked_fill_forward (mg_opcall *c) {
  mg_tensor *x = c->in[0], *mask = c->in[1], *value = c->in[2];
  mg_tensor *out = mg_empty(x->shape, x->ndim, x->dtype);
  if (out == NULL) return MG_ERR;
  mg_iter it;
  const mg_tensor *ops[3] = {out, x, mask};
  mg_iter_init(&it, x->shape, x->ndim, 3, ops);
  char *base[3] = {mg_ptr(out), mg_ptr(x), mg_ptr(mask)};
  size_t esz = mg_dtype_size(x->dtype), sz[3] = {esz, esz, 1};
  fill_ud ud = {esz, mg_ptr(value)};
  mg_iter_run(&it, base, sz, masked_fill_run, &ud);
  c->out[0] = out;
  return MG_OK;
}

static mg_status masked_fill_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  mg_scope sc = {0};
  mg_tensor *zero = mg_tmp(&sc, mg_scalar(0.0, dout[0]->dtype));
  if (n->needs[0]) din[0] = mg_masked_fill(dout[0], n->in[1], zero);
  if (n->needs[2]) din[2] = mg_sum(mg_tmp(&sc, mg_where(n->in[1], dout[0], zero)), MG_ALL_AXES, 0);
  mg_scope_end(&sc);
  return MG_OK;
}
MG_ROW(MASKED_FILL, masked_fill) = {
  .forward = masked_fill_forward,
  .info = {.name = "masked_fill", .kind = MG_OP_OTHER,
           .doc = "x with value where mask is true (mask broadcasts to x's shape)"},
  .saves = MG_SAVE_IN(1), .backward = masked_fill_backward,
};

/* }========================================================== */


MG_FAMILY(mg_index_ops, INDEX_OPS, INDEX__COUNT);

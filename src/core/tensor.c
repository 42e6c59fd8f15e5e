/*
** tensor.c — tensors: a counted view (shape, strides, offset, dtype) of a
** counted storage. Tensors are immutable once built, which is what lets
** views share storage and tapes keep them without copying.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"


static const struct { const char *name; size_t size; } dtypes[MG_DTYPE__COUNT] = {
  {"float32", 4}, {"float64", 8}, {"int64", 8}, {"bool", 1}, {"float16", 2}, {"bfloat16", 2}
};

mg_status mg_check_computable (const char *fn, mg_dtype dt) {
  if (dt == MG_FLOAT16 || dt == MG_BFLOAT16)
    return mg_seterror("%s: not defined for %s tensors (a storage format); cast to float32 first",
                       fn, mg_dtype_name(dt));
  return MG_OK;
}

/* why an elementwise op has no kernel for dt, in words */
mg_status mg_refuse_dtype (const char *fn, mg_dtype dt, int bool_only) {
  if (mg_check_computable(fn, dt) != MG_OK) return MG_ERR;
  if (bool_only) return mg_seterror("%s: needs bool tensors, got %s", fn, mg_dtype_name(dt));
  if (dt == MG_BOOL) return mg_seterror("%s: not defined for bool tensors; cast them first", fn);
  return mg_seterror("%s: not defined for %s tensors; cast to float first", fn, mg_dtype_name(dt));
}

const char *mg_dtype_name (mg_dtype dt) {
  return (unsigned)dt < MG_DTYPE__COUNT ? dtypes[dt].name : "?";
}

size_t mg_dtype_size (mg_dtype dt) {
  return mg_dtype_bytes(dt);
}

bool mg_dtype_is_float (mg_dtype dt) {
  return (unsigned)dt < MG_DTYPE__COUNT && mg_is_floating(dt);
}

int mg_dtype_from_name (const char *name) {
  if (name == NULL) return -1;
  for (int i = 0; i < MG_DTYPE__COUNT; i++)
    if (strcmp(name, dtypes[i].name) == 0) return i;
  return -1;
}

bool mg_is_float (mg_dtype dt) {
  return dt == MG_FLOAT32 || dt == MG_FLOAT64;
}

char *mg_shape_str (char *buf, size_t n, const int64_t *shape, int ndim) {
  if (buf == NULL || n == 0) return buf;
  if (shape == NULL || ndim < 0 || ndim > MG_MAX_DIMS) ndim = 0;
  size_t len = 0;
  len += (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < ndim && len < n; i++)
    len += (size_t)snprintf(buf + len, n - len, i ? ",%lld" : "%lld", (long long)shape[i]);
  if (len < n) snprintf(buf + len, n - len, ")");
  return buf;
}

void mg_contiguous_strides (const int64_t *shape, int ndim, int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i];
  }
}

int64_t mg_shape_numel (const char *fn, const int64_t *shape, int ndim) {
  if (ndim > 0 && shape == NULL) {
    mg_null_arg(fn, "shape");
    return -1;
  }
  if (ndim < 0 || ndim > MG_MAX_DIMS) {
    mg_seterror("%s: %d dimensions given, at most %d allowed", fn, ndim, MG_MAX_DIMS);
    return -1;
  }
  /* the product of the nonzero sizes must fit too: strides are made of it */
  int64_t n = 1, nonzero = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      mg_seterror("%s: dimension " MG_POS " has negative size %lld", fn, (long long)i, (long long)shape[i]);
      return -1;
    }
    if (shape[i] > 0 && nonzero > INT64_MAX / 16 / shape[i]) {
      char sh[160];
      mg_seterror("%s: shape %s has too many elements to allocate", fn, mg_shape_str(sh, sizeof sh, shape, ndim));
      return -1;
    }
    if (shape[i] > 0) nonzero *= shape[i];
    n *= shape[i];
  }
  return n;
}

bool mg_same_shape (const int64_t *a, int na, const int64_t *b, int nb) {
  return na == nb && memcmp(a, b, sizeof(int64_t) * (size_t)na) == 0;
}

int mg_check_axis (const char *fn, int axis, int ndim) {
  int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim) {
    if (ndim == 0)
      mg_seterror("%s: axis " MG_POS " is out of range for a 0-d tensor", fn, (long long)axis);
    else
      mg_seterror("%s: axis " MG_POS " is out of range for %d dimensions (use " MG_POS ".." MG_POS " or -%d..-1)",
                  fn, (long long)axis, ndim, 0LL, (long long)ndim - 1, ndim);
    return -1;
  }
  return a;
}

/* Freed tensor headers are kept for the next tensor (in the context's
** pool): ops make and drop them at a high rate, and a pointer pop beats
** malloc and free. */
mg_tensor *mg_tensor_view (mg_storage *s, mg_dtype dt, const int64_t *shape, int ndim,
                           const int64_t *strides, int64_t offset) {
  mg_context *c = mg_ctx();
  mg_tensor *t = mg_alloc_should_fail() ? NULL
               : c->tensors.npool > 0 ? c->tensors.pool[--c->tensors.npool]
               : (mg_tensor *)malloc(sizeof(mg_tensor));
  if (t == NULL) {
    mg_seterror("out of memory allocating a tensor");
    return NULL;
  }
  t->ctx = c;
  t->refcount = 1;
  t->dtype = dt;
  t->ndim = ndim;
  t->id = mg_new_id();
  t->offset = offset;
  t->storage = s;
  t->var = NULL;
  t->number = false;
  s->refcount++;
  t->numel = 1;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    t->strides[i] = strides[i];
    t->numel *= shape[i];
  }
  c->tensors.live++;
  return t;
}

mg_tensor *mg_empty (const int64_t *shape, int ndim, mg_dtype dt) {
  if ((unsigned)dt >= MG_DTYPE__COUNT)
    return mg_seterror("tensor: unknown dtype %d", (int)dt), NULL;
  int64_t n = mg_shape_numel("tensor", shape, ndim);
  if (n < 0) return NULL;
  mg_storage *s = mg_storage_new((size_t)n * mg_dtype_size(dt));
  if (s == NULL) {
    char sh[160], msg[512];
    snprintf(msg, sizeof msg, "%s for tensor %s %s", mg_errmsg_raw(),
             mg_shape_str(sh, sizeof sh, shape, ndim), mg_dtype_name(dt));
    mg_seterror("%s", msg);
    return NULL;
  }
  int64_t strides[MG_MAX_DIMS];
  mg_contiguous_strides(shape, ndim, strides);
  mg_tensor *t = mg_tensor_view(s, dt, shape, ndim, strides, 0);
  mg_storage_release(s);   /* the view holds it now (or nobody, on failure) */
  return t;
}

mg_tensor *mg_tensor_retain (mg_tensor *t) {
  if (t) t->refcount++;
  return t;
}

void mg_tensor_release (mg_tensor *t) {
  if (t == NULL || --t->refcount > 0) return;
  mg_storage_release(t->storage);
  mg_context *c = t->ctx;
  c->tensors.live--;
  if (MG_POOLS && c->tensors.npool < MG_HEADER_POOL) c->tensors.pool[c->tensors.npool++] = t;
  else free(t);
}

/* The getters answer an impossible value for NULL (with a message): -1, 0
** for ids, NULL for pointers, MG_DTYPE__COUNT for a dtype. */
mg_dtype mg_tensor_dtype (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_dtype", t, MG_DTYPE__COUNT);
  return t->dtype;
}
int mg_tensor_ndim (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_ndim", t, -1);
  return t->ndim;
}
const int64_t *mg_tensor_shape (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_shape", t, NULL);
  return t->shape;
}
const int64_t *mg_tensor_strides (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_strides", t, NULL);
  return t->strides;
}
int64_t mg_tensor_numel (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_numel", t, -1);
  return t->numel;
}
uint64_t mg_tensor_id (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_id", t, 0);
  return t->id;
}

int mg_tensor_is_contiguous (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_is_contiguous", t, 0);
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

void *mg_tensor_data (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_data", t, NULL);
  return mg_ptr(t);
}

int mg_tensor_has_values (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_has_values", t, 0);
  return !t->storage->unwritten;
}

/* A dry run's float results have no values. Inside the run they are read
** as meaningless (docs/memory.md); a tensor kept past its end would give
** uninitialised memory, so from then on reading it is an error. */
mg_status mg_tensor_need_values (const mg_tensor *t, const char *who) {
  MG_CHECK_ARG("mg_tensor_need_values", t, MG_ERR);
  if (!t->storage->unwritten || mg_ctx()->dry.on) return MG_OK;
  return mg_seterror("%s: this tensor was computed in a dry run (mg.memory.estimate), which computes no "
                     "values; compute it outside the estimate", who);
}

double mg_tensor_get (const mg_tensor *t, const int64_t *index) {
  MG_CHECK_ARG("mg_tensor_get", t, NAN);
  if (t->ndim > 0) MG_CHECK_ARG("mg_tensor_get", index, NAN);
  if (t->storage->unwritten)                    /* no values: NaN, and an error past the dry run */
    return mg_tensor_need_values(t, "mg_tensor_get"), NAN;
  int64_t off = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (index[i] < 0 || index[i] >= t->shape[i])
      return mg_seterror("mg_tensor_get: index[%d] = %lld is out of range for dimension %d of size %lld "
                         "(0-based)", i, (long long)index[i], i, (long long)t->shape[i]), NAN;
    off += index[i] * t->strides[i];
  }
  return mg_load_double(mg_ptr(t) + off * (int64_t)mg_dtype_size(t->dtype), t->dtype);
}

/* {================= conversion and copies ================== */

/* bfloat16 is float32's top half, rounded to nearest even (NaN stays NaN) */
static inline uint16_t to_bf16 (float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* a float to int64: toward zero, saturating, NaN gives 0 (C leaves the
** out-of-range cases undefined) */
static inline int64_t sat_i64 (double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

double mg_load_double (const void *p, mg_dtype dt) {
  switch (dt) {
    case MG_FLOAT32: return *(const float *)p;
    case MG_FLOAT64: return *(const double *)p;
    case MG_INT64: return (double)*(const int64_t *)p;
    case MG_BOOL: return *(const uint8_t *)p;
    case MG_FLOAT16: return (double)*(const _Float16 *)p;
    default: return mg_bf16_value(*(const uint16_t *)p);
  }
}

static inline void store_double (void *p, mg_dtype dt, double v) {
  switch (dt) {
    case MG_FLOAT32: *(float *)p = (float)v; break;
    case MG_FLOAT64: *(double *)p = v; break;
    case MG_INT64: *(int64_t *)p = sat_i64(v); break;
    case MG_BOOL: *(uint8_t *)p = v != 0; break;
    case MG_FLOAT16: *(_Float16 *)p = (_Float16)v; break;
    default: *(uint16_t *)p = to_bf16((float)v); break;
  }
}

#define CONVERT_LOOP(DT, ST, EXPR) \
  do { DT *d = (DT *)dst; const ST *s = (const ST *)src; \
       for (int64_t i = 0; i < n; i++) d[i] = (DT)(EXPR); } while (0)

/* the conversions training needs fast are typed loops the compiler
** vectorises (float16 with F16C where the CPU has it); the rest go through
** double one at a time */
void mg_convert (void *dst, mg_dtype ddt, const void *src, mg_dtype sdt, int64_t n) {
  if (n <= 0 || dst == NULL || src == NULL) return;
  if (ddt == sdt) {
    memcpy(dst, src, (size_t)n * mg_dtype_size(ddt));
    return;
  }
  if (sdt == MG_FLOAT32 && ddt == MG_FLOAT64) CONVERT_LOOP(double, float, s[i]);
  else if (sdt == MG_FLOAT64 && ddt == MG_FLOAT32) CONVERT_LOOP(float, double, s[i]);
  else if (sdt == MG_INT64 && ddt == MG_FLOAT32) CONVERT_LOOP(float, int64_t, s[i]);
  else if (sdt == MG_INT64 && ddt == MG_FLOAT64) CONVERT_LOOP(double, int64_t, s[i]);
  else if (sdt == MG_BOOL && ddt == MG_INT64) CONVERT_LOOP(int64_t, uint8_t, s[i]);
  else if (sdt == MG_BOOL && ddt == MG_FLOAT32) CONVERT_LOOP(float, uint8_t, s[i]);
  else if (sdt == MG_FLOAT32 && ddt == MG_FLOAT16) CONVERT_LOOP(_Float16, float, s[i]);
  else if (sdt == MG_FLOAT16 && ddt == MG_FLOAT32) CONVERT_LOOP(float, _Float16, s[i]);
  else if (sdt == MG_FLOAT32 && ddt == MG_BFLOAT16) CONVERT_LOOP(uint16_t, float, to_bf16(s[i]));
  else if (sdt == MG_BFLOAT16 && ddt == MG_FLOAT32) CONVERT_LOOP(float, uint16_t, mg_bf16_value(s[i]));
  else {
    size_t dsz = mg_dtype_size(ddt), ssz = mg_dtype_size(sdt);
    for (int64_t i = 0; i < n; i++)
      store_double((char *)dst + (size_t)i * dsz, ddt, mg_load_double((const char *)src + (size_t)i * ssz, sdt));
  }
}

typedef struct { mg_dtype ddt, sdt; } convert_ud;

/* n elements of `size` bytes, dst[i * sd] = src[i * ss] (strides in
** elements); memcpy of a constant size is one load and one store */
#define STRIDED(SIZE) for (int64_t i = 0; i < n; i++) memcpy(dst + i * sd * SIZE, src + i * ss * SIZE, SIZE)
static void strided_copy (size_t size, int64_t n, char *dst, int64_t sd, const char *src, int64_t ss) {
  switch (size) {
    case 8: STRIDED(8); break;
    case 4: STRIDED(4); break;
    case 2: STRIDED(2); break;
    default: STRIDED(1); break;
  }
}
#undef STRIDED

static void convert_run (int64_t n, char **p, const int64_t *s, void *ud) {
  convert_ud *c = (convert_ud *)ud;
  if (s[0] == 1 && s[1] == 1) {
    mg_convert(p[0], c->ddt, p[1], c->sdt, n);
    return;
  }
  size_t dsz = mg_dtype_size(c->ddt), ssz = mg_dtype_size(c->sdt);
  if (c->ddt == c->sdt) {
    strided_copy(dsz, n, p[0], s[0], p[1], s[1]);
    return;
  }
  enum { CHUNK = 512 };                 /* strided to contiguous, convert, back */
  double sbuf[CHUNK], dbuf[CHUNK];
  for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
    int64_t len = n - i0 < CHUNK ? n - i0 : CHUNK;
    strided_copy(ssz, len, (char *)sbuf, 1, p[1] + i0 * s[1] * (int64_t)ssz, s[1]);
    mg_convert(dbuf, c->ddt, sbuf, c->sdt, len);
    strided_copy(dsz, len, p[0] + i0 * s[0] * (int64_t)dsz, s[0], (const char *)dbuf, 1);
  }
}

/* one tile of tiled_copy: d[r * dk + c] = s[r + c * sl] for r < rn, c < cn,
** elements of SIZE bytes, in loops of a constant-size memcpy each (a load and
** a store, whatever the values' type: no aliasing assumed) that the compiler
** unrolls; strided_copy's call per tile row cost more than the copy. The
** threads split a large plane's tiles. A GPT's 2048 x 256 bfloat16
** transpose: 0.15 -> 0.07 ms */
#define TILE_COPY(SIZE, d, dk, s, sl, rn, cn) do {                                  \
    for (int64_t r = 0; r < (rn); r++)                                              \
      for (int64_t c = 0; c < (cn); c++)                                            \
        memcpy((d) + (r * (dk) + c) * (SIZE), (s) + (r + c * (sl)) * (SIZE), (SIZE)); \
  } while (0)

/* A transpose-like copy: dst is contiguous, src's unit stride lies on axis
** k, not the last. Walking dst in order would read src a cache line per
** element; tiles of TILE x TILE keep both sides in cache. Returns 0 when
** the case is not this one. */
static int tiled_copy (mg_tensor *dst, const mg_tensor *src) {
  enum { TILE = 16 };
  int nd = src->ndim, k = -1;
  if (nd < 2 || dst->dtype != src->dtype || !mg_tensor_is_contiguous(dst)) return 0;
  const int64_t *sh = src->shape, *ss = src->strides;
  for (int i = 0; i < nd; i++)
    if (sh[i] == 0) return 1;           /* nothing to copy: the planes' walk below would copy one */
  if (ss[nd - 1] == 1 || sh[nd - 1] < TILE) return 0;
  for (int i = nd - 2; i >= 0 && k < 0; i--) if (ss[i] == 1 && sh[i] >= TILE) k = i;
  if (k < 0) return 0;
  int64_t ds[MG_MAX_DIMS], idx[MG_MAX_DIMS] = {0};
  mg_contiguous_strides(sh, nd, ds);
  size_t size = mg_dtype_size(src->dtype);
  char *d0 = mg_ptr(dst);
  const char *s0 = mg_ptr(src);
  int64_t rows = sh[k], cols = sh[nd - 1], dk = ds[k], sl = ss[nd - 1];
  for (;;) {                            /* each plane (axis k, last axis) */
    int64_t doff = 0, soff = 0;
    for (int i = 0; i < nd; i++) doff += idx[i] * ds[i], soff += idx[i] * ss[i];
    MG_PARALLEL_FOR(rows * cols >= MG_PARALLEL_MIN, schedule(static),
    for (int64_t r0 = 0; r0 < rows; r0 += TILE)
      for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
        int64_t rn = rows - r0 < TILE ? rows - r0 : TILE, cn = cols - c0 < TILE ? cols - c0 : TILE;
        char *d = d0 + (doff + r0 * dk + c0) * (int64_t)size;
        const char *sp = s0 + (soff + r0 + c0 * sl) * (int64_t)size;
        switch (size) {
          case 2: TILE_COPY(2, d, dk, sp, sl, rn, cn); break;
          case 4: TILE_COPY(4, d, dk, sp, sl, rn, cn); break;
          case 8: TILE_COPY(8, d, dk, sp, sl, rn, cn); break;
          default:
            for (int64_t r = 0; r < rn; r++) strided_copy(size, cn, d + r * dk * (int64_t)size, 1, sp + r * (int64_t)size, sl);
        }
      });
    int i = nd - 2;                     /* next plane: odometer over the other axes */
    for (; i >= 0; i--) {
      if (i == k) continue;
      if (++idx[i] < sh[i]) break;
      idx[i] = 0;
    }
    if (i < 0) return 1;
  }
}

/* dst (any layout, not aliasing src) gets src's values, converting dtype if needed */
mg_status mg_copy_into (mg_tensor *dst, const mg_tensor *src) {
  if (mg_tensor_need_values(src, "copy") != MG_OK) return MG_ERR;
  if (tiled_copy(dst, src)) return MG_OK;
  mg_iter it;
  const mg_tensor *ops[2] = {dst, src};
  mg_iter_init(&it, dst->shape, dst->ndim, 2, ops);
  char *base[2] = {mg_ptr(dst), mg_ptr(src)};
  size_t sz[2] = {mg_dtype_size(dst->dtype), mg_dtype_size(src->dtype)};
  convert_ud c = {dst->dtype, src->dtype};
  mg_iter_run(&it, base, sz, convert_run, &c);
  return MG_OK;
}

mg_tensor *mg_contiguous (mg_tensor *t) {
  MG_CHECK_ARG("mg_contiguous", t, NULL);
  if (mg_tensor_need_values(t, "mg_contiguous") != MG_OK) return NULL;
  if (mg_tensor_is_contiguous(t)) return mg_tensor_retain(t);
  mg_tensor *out = mg_empty(t->shape, t->ndim, t->dtype);
  if (out == NULL) return NULL;
  if (mg_ctx()->dry.on && mg_is_floating(t->dtype))   /* a dry run's floats have no values */
    out->storage->unwritten = true;
  else mg_copy_into(out, t);
  return out;
}

/* }========================================================== */


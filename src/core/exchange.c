/*
** exchange.c — tensors over memory the library did not allocate: a host's
** buffer (mg_from_blob, as torch.from_blob), and DLPack, the exchange format
** of NumPy, PyTorch and JAX. Neither copies a byte: the tensor views the
** buffer, and the owner is told (release, or the DLPack deleter) when the
** last tensor viewing it goes.
*/
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

#include "core/core.h"

/* the lowest and highest element offsets a layout reaches (numel > 0) */
static void extent (const int64_t *shape, const int64_t *strides, int ndim, int64_t *lo,
                    int64_t *hi) {
  *lo = *hi = 0;
  for (int i = 0; i < ndim; i++) {
    int64_t reach = (shape[i] - 1) * strides[i];
    if (reach < 0) *lo += reach;
    else *hi += reach;
  }
}

/* the layout's problem, or MG_OK */
static mg_status check_layout (const char *fn, void *data, const int64_t *shape, int ndim,
                               const int64_t *strides, mg_dtype dt, int64_t *n) {
  if ((*n = mg_shape_numel(fn, shape, ndim)) < 0) return MG_ERR;
  if ((unsigned)dt >= MG_DTYPE__COUNT) return mg_seterror("%s: unknown dtype %d", fn, (int)dt);
  if (data == NULL && *n > 0) return mg_null_arg(fn, "data");
  for (int i = 0; strides && i < ndim; i++)
    if (shape[i] > 1 && (strides[i] > INT64_MAX / 16 / shape[i] || strides[i] < -(INT64_MAX / 16 / shape[i])))
      return mg_seterror("%s: stride %lld of dimension %d is too large", fn, (long long)strides[i], i);
  return MG_OK;
}

/* Checks the layout, then makes the view (data is the element at index 0).
** On any failure the buffer goes back at once: release(ud) has run. */
static mg_tensor *wrap (const char *fn, void *data, const int64_t *shape, int ndim,
                        const int64_t *strides, mg_dtype dt, void (*release)(void *ud), void *ud) {
  int64_t n, cs[MG_MAX_DIMS], lo = 0, hi = 0;
  if (check_layout(fn, data, shape, ndim, strides, dt, &n) != MG_OK) {
    if (release) release(ud);
    return NULL;
  }
  if (strides == NULL) {
    mg_contiguous_strides(shape, ndim, cs);
    strides = cs;
  }
  if (n > 0) extent(shape, strides, ndim, &lo, &hi);
  size_t esz = mg_dtype_size(dt);
  char *base = (char *)data + lo * (int64_t)esz;          /* the storage starts at the lowest */
  mg_storage *s = mg_storage_wrap(base, (size_t)(hi - lo + (n > 0)) * esz, release, ud);
  if (s == NULL) {
    if (release) release(ud);
    return NULL;
  }
  mg_tensor *t = mg_tensor_view(s, dt, shape, ndim, strides, -lo);
  mg_storage_release(s);                        /* the view holds it now (or nobody) */
  return t;
}

mg_tensor *mg_from_blob (void *data, const int64_t *shape, int ndim, const int64_t *strides,
                         mg_dtype dt, void (*release)(void *ud), void *ud) {
  return wrap("mg_from_blob", data, shape, ndim, strides, dt, release, ud);
}

/* {========================== DLPack ========================== */

typedef struct exported {
  DLManagedTensor m;
  mg_tensor *t;                                  /* keeps the data alive */
  int64_t shape[MG_MAX_DIMS], strides[MG_MAX_DIMS];
} exported;

static void exported_delete (DLManagedTensor *m) {
  exported *e = (exported *)m->manager_ctx;
  mg_tensor_release(e->t);
  free(e);
}

static DLDataType dl_type (mg_dtype dt) {
  switch (dt) {
    case MG_FLOAT32: return (DLDataType){kDLFloat, 32, 1};
    case MG_FLOAT64: return (DLDataType){kDLFloat, 64, 1};
    case MG_INT64: return (DLDataType){kDLInt, 64, 1};
    default: return (DLDataType){kDLUInt, 8, 1};   /* bool: DLPack 0.6 has no bool code */
  }
}

struct DLManagedTensor *mg_to_dlpack (mg_tensor *t) {
  MG_CHECK_ARG("mg_to_dlpack", t, NULL);
  if (mg_tensor_need_values(t, "to_dlpack") != MG_OK) return NULL;   /* a dry run's: nothing to hand over */
  exported *e = (exported *)calloc(1, sizeof(exported));
  if (e == NULL) return mg_seterror("mg_to_dlpack: out of memory"), NULL;
  e->t = mg_tensor_retain(t);
  memcpy(e->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  memcpy(e->strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
  DLTensor *d = &e->m.dl_tensor;
  d->data = t->storage->data;
  d->byte_offset = (uint64_t)t->offset * mg_dtype_size(t->dtype);
  d->device = (DLDevice){kDLCPU, 0};
  d->ndim = t->ndim;
  d->dtype = dl_type(t->dtype);
  d->shape = e->shape;
  d->strides = e->strides;
  e->m.manager_ctx = e;
  e->m.deleter = exported_delete;
  return &e->m;
}

static int from_dl_type (DLDataType t) {
  if (t.lanes != 1) return -1;
  if (t.code == kDLFloat && t.bits == 32) return MG_FLOAT32;
  if (t.code == kDLFloat && t.bits == 64) return MG_FLOAT64;
  if (t.code == kDLInt && t.bits == 64) return MG_INT64;
  if (t.code == kDLUInt && t.bits == 8) return MG_BOOL;
  return -1;
}

static void dl_release (void *ud) {
  DLManagedTensor *m = (DLManagedTensor *)ud;
  if (m->deleter) m->deleter(m);
}

mg_tensor *mg_from_dlpack (struct DLManagedTensor *m) {
  MG_CHECK_ARG("mg_from_dlpack", m, NULL);
  const DLTensor *d = &m->dl_tensor;
  /* the early refusals leave m to the caller; once wrap is called, m is ours */
  int dt = from_dl_type(d->dtype);
  if (d->device.device_type != kDLCPU)
    return mg_seterror("mg_from_dlpack: the tensor is on device type %d; moongrad takes CPU memory",
                       (int)d->device.device_type), NULL;
  if (dt < 0)
    return mg_seterror("mg_from_dlpack: dtype (code %d, %d bits, %d lanes) is not one of float32, "
                       "float64, int64, uint8 (bool)", d->dtype.code, d->dtype.bits, d->dtype.lanes), NULL;
  if (d->ndim < 0 || d->ndim > MG_MAX_DIMS)
    return mg_seterror("mg_from_dlpack: %d dimensions, at most %d", d->ndim, MG_MAX_DIMS), NULL;
  if (d->ndim > 0 && d->shape == NULL) return mg_null_arg("mg_from_dlpack", "dl_tensor.shape"), NULL;
  return wrap("mg_from_dlpack", (char *)d->data + d->byte_offset, d->shape, d->ndim, d->strides,
              (mg_dtype)dt, dl_release, m);
}

/* }========================================================== */

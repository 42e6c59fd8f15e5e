/*
** create.c — constructors (full, arange, eye, from values) and cast.
*/
#include <math.h>
#include <string.h>

#include "ops/op.h"

/* this file's rows (op.h, "A family's rows"): the enum, the table and its count follow this list */
#define CREATE_OPS(X) \
  X(CAST, cast)
enum { CREATE_OPS(MG_ROW_ENUM) CREATE__COUNT };

#define FILL(T, V) do { T *d = (T *)mg_ptr(t), v = (T)(V); \
    for (int64_t i = 0; i < t->numel; i++) d[i] = v; } while (0)

static void fill (mg_tensor *t, double value) {
  switch (t->dtype) {
    case MG_FLOAT32: FILL(float, value); break;
    case MG_FLOAT64: FILL(double, value); break;
    case MG_INT64: FILL(int64_t, value); break;
    case MG_BOOL: FILL(uint8_t, value != 0); break;
    default: {                                   /* float16, bfloat16: one conversion */
      uint16_t bits;
      mg_convert(&bits, t->dtype, &value, MG_FLOAT64, 1);
      FILL(uint16_t, bits);
      break;
    }
  }
}

/* checks that a double can become an element of dt without losing meaning */
static mg_status check_value (const char *fn, double v, mg_dtype dt) {
  if (dt == MG_INT64 && (v != floor(v) || !(fabs(v) < 9.3e18)))
    return mg_seterror("%s: cannot convert %.14g to int64", fn, v);
  return MG_OK;
}

mg_tensor *mg_full (const int64_t *shape, int ndim, mg_dtype dt, double value) {
  if (check_value("full", value, dt) != MG_OK) return NULL;
  mg_tensor *t = mg_empty(shape, ndim, dt);
  if (t) fill(t, value);
  return t;
}

mg_tensor *mg_full_int64 (const int64_t *shape, int ndim, int64_t value) {
  mg_tensor *t = mg_empty(shape, ndim, MG_INT64);
  if (t) FILL(int64_t, value);
  return t;
}

mg_tensor *mg_zeros_meta (const mg_meta *m) {
  return mg_full(m->shape, m->ndim, m->dtype, 0.0);
}

mg_tensor *mg_scalar (double value, mg_dtype dt) {
  mg_tensor *t = mg_full(NULL, 0, dt, value);
  if (t) t->number = true;
  return t;
}

mg_tensor *mg_from_doubles (const double *values, const int64_t *shape, int ndim, mg_dtype dt) {
  MG_CHECK_ARG("mg_from_doubles", values, NULL);
  mg_tensor *t = mg_empty(shape, ndim, dt);
  if (t == NULL) return NULL;
  for (int64_t i = 0; i < t->numel; i++)
    if (check_value("constant", values[i], dt) != MG_OK) {
      mg_tensor_release(t);
      return NULL;
    }
  mg_convert(mg_ptr(t), dt, values, MG_FLOAT64, t->numel);
  return t;
}

/* start, start+step, ... while < stop (> stop for a negative step) */
mg_tensor *mg_arange (double start, double stop, double step, mg_dtype dt) {
  if (mg_check_computable("arange", dt) != MG_OK) return NULL;
  if (step == 0 || step != step || start != start || stop != stop)
    return mg_seterror("arange: step must be a nonzero number, and bounds numbers"), NULL;
  double count = ceil((stop - start) / step);
  if (count < 0) count = 0;
  if (count > 1e15) return mg_seterror("arange: %.0f elements is too many", count), NULL;
  int64_t n = (int64_t)count;
  mg_tensor *t = mg_empty(&n, 1, dt);
  if (t == NULL) return NULL;
  for (int64_t i = 0; i < n; i++) {
    double v = start + (double)i * step;
    switch (dt) {
      case MG_FLOAT32: ((float *)mg_ptr(t))[i] = (float)v; break;
      case MG_FLOAT64: ((double *)mg_ptr(t))[i] = v; break;
      case MG_INT64: ((int64_t *)mg_ptr(t))[i] = (int64_t)v; break;
      default: ((uint8_t *)mg_ptr(t))[i] = v != 0; break;
    }
  }
  return t;
}

/* exact for every int64 (the double version loses integers above 2^53);
** the count is computed in unsigned arithmetic so no bound overflows */
mg_tensor *mg_arange_int64 (int64_t start, int64_t stop, int64_t step) {
  if (step == 0) return mg_seterror("arange: step must not be 0"), NULL;
  bool up = step > 0;
  uint64_t span = up ? (stop > start ? (uint64_t)stop - (uint64_t)start : 0)
                     : (start > stop ? (uint64_t)start - (uint64_t)stop : 0);
  uint64_t mag = up ? (uint64_t)step : 0 - (uint64_t)step;
  uint64_t count = span ? (span - 1) / mag + 1 : 0;
  if (count > ((uint64_t)1 << 50))
    return mg_seterror("arange: %llu elements is too many", (unsigned long long)count), NULL;
  int64_t n = (int64_t)count;
  mg_tensor *t = mg_empty(&n, 1, MG_INT64);
  if (t == NULL) return NULL;
  int64_t *d = (int64_t *)mg_ptr(t);
  for (int64_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)start + (uint64_t)i * (uint64_t)step);
  return t;
}

mg_tensor *mg_eye (int64_t n, int64_t m, mg_dtype dt) {
  if (mg_check_computable("eye", dt) != MG_OK) return NULL;
  int64_t shape[2] = {n, m};
  mg_tensor *t = mg_full(shape, 2, dt, 0.0);
  if (t == NULL) return NULL;
  size_t esz = mg_dtype_size(dt);
  for (int64_t i = 0; i < n && i < m; i++) {
    char *p = mg_ptr(t) + (size_t)(i * m + i) * esz;
    switch (dt) {
      case MG_FLOAT32: *(float *)p = 1; break;
      case MG_FLOAT64: *(double *)p = 1; break;
      case MG_INT64: *(int64_t *)p = 1; break;
      default: *(uint8_t *)p = 1; break;
    }
  }
  return t;
}

/* {========================== cast ========================== */

static const mg_opdef cast_op;
static mg_status cast_forward (mg_opcall *c);

/* cast: x converted to dt (floats truncate toward zero into int64).
** grad: float -> float casts pass dout back, cast to x's dtype */
mg_tensor *mg_cast (mg_tensor *x, mg_dtype dt) {
  MG_CHECK_ARG("mg_cast", x, NULL);
  if ((unsigned)dt >= MG_DTYPE__COUNT) return mg_seterror("cast: unknown dtype"), NULL;
  if (x->dtype == dt) return mg_tensor_retain(x);
  mg_opcall c = MG_OPCALL(&cast_op, 1, &x, NULL, x->shape, x->ndim, dt);
  return mg_dispatch(&c);
}

static mg_status cast_forward (mg_opcall *c) {
  mg_tensor *out = mg_empty(c->shape, c->ndim, c->dtype);
  if (out == NULL || mg_copy_into(out, c->in[0]) != MG_OK) {
    mg_tensor_release(out);
    return MG_ERR;
  }
  c->out[0] = out;
  return MG_OK;
}

static mg_status cast_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  din[0] = mg_cast(dout[0], n->in_meta[0].dtype);
  return MG_OK;
}
MG_ROW(CAST, cast) = {.forward = cast_forward, .info = {.name = "cast", .kind = MG_OP_OTHER, .doc = "x converted to another dtype (float to float is differentiable)"}, .backward = cast_backward,
  .any_gradient_dtype = true};

/* }========================================================== */

MG_FAMILY(mg_create_ops, CREATE_OPS, CREATE__COUNT);

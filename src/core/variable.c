/*
** variable.c — variables: mutable state that ops read like tensors.
**
** Every value a variable ever holds carries the variable's id, so a tape
** that watched it sums the gradients of all its reads. Tensors stay
** immutable: assign writes in place only when nobody else holds the value
** (no tape saved it, no Lua code kept it); otherwise the variable moves to a
** fresh copy and the old value stays as it was (copy on write).
*/
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* makes t (fresh, owned) the value of v */
static void adopt (mg_variable *v, mg_tensor *t) {
  t->id = v->id;
  t->var = v;
  t->number = false;                  /* a variable's value is state, never a number */
  mg_storage_hold(t->storage, MG_ROLE_VARIABLE, 1);
  v->value = t;
}

static void disown (mg_variable *v) {
  mg_tensor *t = v->value;
  if (t == NULL) return;
  t->var = NULL;
  mg_storage_hold(t->storage, MG_ROLE_VARIABLE, -1);
  mg_tensor_release(t);
  v->value = NULL;
}

/* the write clock (mg_variable_clock): one for all contexts and threads,
** so a stamp never repeats */
static _Atomic uint64_t write_clock;

static uint64_t next_stamp (void) { return atomic_fetch_add(&write_clock, 1) + 1; }

uint64_t mg_variable_clock (void) { return atomic_load(&write_clock); }

mg_variable *mg_variable_new (mg_tensor *init, const char *name, int trainable) {
  MG_CHECK_ARG("mg_variable_new", init, NULL);
  if (init->storage->unwritten)
    return mg_seterror("Variable: its initial value was computed in a dry run (mg.memory.estimate), "
                       "which computes nothing; make variables outside the step, or in a layer's build"), NULL;
  mg_variable *v = (mg_variable *)calloc(1, sizeof(mg_variable));
  mg_tensor *t = mg_empty(init->shape, init->ndim, init->dtype);
  char *nm = name ? strdup(name) : NULL;
  if (v == NULL || t == NULL || (name && nm == NULL)) {
    free(v);
    free(nm);
    mg_tensor_release(t);
    return mg_seterror("out of memory creating a variable"), NULL;
  }
  mg_copy_into(t, init);
  v->refcount = 1;
  v->id = mg_new_id();
  v->trainable = trainable != 0;
  v->name = nm;
  adopt(v, t);
  return v;
}

mg_variable *mg_variable_retain (mg_variable *v) {
  if (v) v->refcount++;
  return v;
}

void mg_variable_release (mg_variable *v) {
  if (v == NULL || --v->refcount > 0) return;
  disown(v);
  free(v->name);
  free(v);
}

mg_tensor *mg_variable_exchange (mg_variable *v, mg_tensor *t) {
  mg_tensor *old = v->value;
  old->var = NULL;
  mg_storage_hold(old->storage, MG_ROLE_VARIABLE, -1);
  adopt(v, mg_tensor_retain(t));
  return old;
}

mg_tensor *mg_variable_read (mg_variable *v) {
  MG_CHECK_ARG("mg_variable_read", v, NULL);
  void (*on_read)(mg_variable *) = mg_ctx()->hooks.on_read;   /* the tapes' hook */
  if (on_read) on_read(v);
  return v->value;
}

mg_tensor *mg_variable_peek (mg_variable *v) {
  MG_CHECK_ARG("mg_variable_peek", v, NULL);
  return v->value;
}

const char *mg_variable_name (const mg_variable *v) {
  MG_CHECK_ARG("mg_variable_name", v, NULL);
  return v->name ? v->name : "Variable";
}

int mg_variable_trainable (const mg_variable *v) {
  MG_CHECK_ARG("mg_variable_trainable", v, 0);
  return v->trainable;
}

/* the hook's say before v changes (a verified re-run refuses it) */
static mg_status assigning (mg_variable *v) {
  mg_status (*on_assign)(mg_variable *) = mg_ctx()->hooks.on_assign;
  return on_assign ? on_assign(v) : MG_OK;
}

/* a write in a dry run (memory.c): the fresh value a shared one would get
** is allocated and let go, counted; the variable keeps its value */
static mg_status dry_write (const mg_tensor *cur, bool exclusive) {
  if (exclusive) return MG_OK;
  mg_tensor *fresh = mg_empty(cur->shape, cur->ndim, cur->dtype);
  mg_tensor_release(fresh);
  return fresh ? MG_OK : MG_ERR;
}

mg_status mg_variable_assign (mg_variable *v, mg_tensor *value) {
  MG_CHECK_ARG("mg_variable_assign", v, MG_ERR);
  MG_CHECK_ARG("mg_variable_assign", value, MG_ERR);
  mg_tensor *cur = v->value;
  if (!mg_same_shape(value->shape, value->ndim, cur->shape, cur->ndim)) {
    char a[160], b[160];
    return mg_seterror("assign: shape %s does not match the variable's %s",
                       mg_shape_str(a, sizeof a, value->shape, value->ndim),
                       mg_shape_str(b, sizeof b, cur->shape, cur->ndim));
  }
  if (value->dtype != cur->dtype)
    return mg_seterror("assign: dtype %s does not match the variable's %s",
                       mg_dtype_name(value->dtype), mg_dtype_name(cur->dtype));
  if (mg_tensor_need_values(value, "assign") != MG_OK || assigning(v) != MG_OK) return MG_ERR;
  bool exclusive = cur->refcount == 1 && cur->storage->refcount == 1 && value->storage != cur->storage;
  if (mg_dry_running()) return dry_write(cur, exclusive);
  if (exclusive) {
    mg_copy_into(cur, value);         /* nobody else can see the old values */
    v->writes = next_stamp();
    return MG_OK;
  }
  mg_tensor *fresh = mg_empty(cur->shape, cur->ndim, cur->dtype);
  if (fresh == NULL) return MG_ERR;
  mg_copy_into(fresh, value);
  disown(v);
  adopt(v, fresh);
  v->writes = next_stamp();
  return MG_OK;
}

/* dst[i] = a[i] + alpha * x[i or 0], for n elements of one dtype */
#define AXPY(T) do {                                                          \
    T *d_ = (T *)dst; const T *a_ = (const T *)a, *x_ = (const T *)x;          \
    T al = (T)alpha;                                                          \
    if (xstep) {                                                              \
      MG_PARALLEL_FOR(n >= MG_PARALLEL_MIN, ,                                 \
      for (int64_t i = 0; i < n; i++) d_[i] = a_[i] + al * x_[i];);           \
    } else {                                                                  \
      T s_ = al * x_[0];                                                      \
      for (int64_t i = 0; i < n; i++) d_[i] = a_[i] + s_;                     \
    }                                                                         \
  } while (0)

/* int64 wraps, as its + and * do: in uint64_t (a signed overflow is undefined) */
static void axpy_i64 (int64_t *d, const int64_t *a, int64_t alpha, const int64_t *x, bool xstep, int64_t n) {
  uint64_t al = (uint64_t)alpha;
  if (xstep) {
    MG_PARALLEL_FOR(n >= MG_PARALLEL_MIN, ,
    for (int64_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)a[i] + al * (uint64_t)x[i]););
  } else {
    uint64_t s = al * (uint64_t)x[0];
    for (int64_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)a[i] + s);
  }
}

static void axpy (void *dst, const void *a, double alpha, const void *x, bool xstep, int64_t n,
                  mg_dtype dt) {
  if (dt == MG_FLOAT32) AXPY(float);
  else if (dt == MG_FLOAT64) AXPY(double);
  else axpy_i64((int64_t *)dst, (const int64_t *)a, (int64_t)alpha, (const int64_t *)x, xstep, n);
}

/* Does v's value belong to v alone: nobody else holds it, and none of the n
** tensors a step reads (any may be NULL) shares its storage? Then the step
** writes it in place. */
static bool owns_value (const mg_tensor *cur, mg_tensor *const *reads, int n) {
  bool own = cur->refcount == 1 && cur->storage->refcount == 1;
  for (int i = 0; i < n; i++) own = own && (reads[i] == NULL || reads[i]->storage != cur->storage);
  return own;
}

/*
** v = v + alpha * x, in one pass and in place when nobody else holds v's
** value (else into a fresh copy, as assign does). x has v's shape or one
** element. The optimizers' update: no temporaries, no copy.
*/
mg_status mg_variable_axpy (mg_variable *v, double alpha, mg_tensor *x) {
  MG_CHECK_ARG("mg_variable_axpy", v, MG_ERR);
  MG_CHECK_ARG("mg_variable_axpy", x, MG_ERR);
  mg_tensor *cur = v->value;
  if (x->dtype != cur->dtype)
    return mg_seterror("assign_add: dtype %s does not match the variable's %s", mg_dtype_name(x->dtype),
                       mg_dtype_name(cur->dtype));
  if (cur->dtype == MG_BOOL) return mg_seterror("assign_add: not defined for bool variables");
  if (mg_check_computable("assign_add", cur->dtype) != MG_OK) return MG_ERR;
  bool same = mg_same_shape(x->shape, x->ndim, cur->shape, cur->ndim);
  if (!same && x->ndim != 0) {        /* one number (0-d), or exactly v's shape: no broadcast */
    char a[160], b[160];
    return mg_seterror("assign_add: shape %s does not match the variable's %s",
                       mg_shape_str(a, sizeof a, x->shape, x->ndim), mg_shape_str(b, sizeof b, cur->shape, cur->ndim));
  }
  /* in range before the cast: converting a double beyond int64 is undefined */
  if (cur->dtype == MG_INT64 && !(alpha >= -0x1p63 && alpha < 0x1p63 && alpha == (double)(int64_t)alpha))
    return mg_seterror("assign_add: cannot scale an int64 variable by %g", alpha);
  if (assigning(v) != MG_OK) return MG_ERR;
  if (mg_dry_running()) return dry_write(cur, owns_value(cur, &x, 1));
  mg_tensor *xc = mg_contiguous(x);
  if (xc == NULL) return MG_ERR;
  bool exclusive = owns_value(cur, &xc, 1);
  mg_tensor *dst = exclusive ? cur : mg_empty(cur->shape, cur->ndim, cur->dtype);
  if (dst == NULL) {
    mg_tensor_release(xc);
    return MG_ERR;
  }
  axpy(mg_ptr(dst), mg_ptr(cur), alpha, mg_ptr(xc), same, cur->numel, cur->dtype);
  mg_tensor_release(xc);
  v->writes = next_stamp();
  if (!exclusive) {
    disown(v);
    adopt(v, dst);
  }
  return MG_OK;
}

/* {============ writing a value in one pass (the optimizers) ============ */

/* where a step writes v's new value: v's own when it owns it, else a copy
** of it (NULL: out of memory); mg_variable_end_write ends the step */
mg_tensor *mg_variable_begin_write (mg_variable *v, mg_tensor *const *reads, int n) {
  mg_tensor *cur = v->value;
  if (owns_value(cur, reads, n)) return cur;
  mg_tensor *copy = mg_empty(cur->shape, cur->ndim, cur->dtype);
  if (copy && !mg_dry_running() && mg_copy_into(copy, cur) != MG_OK) {
    mg_tensor_release(copy);
    return NULL;
  }
  return copy;
}

/* v takes the copy the step wrote (done), or the copy goes (failed) */
void mg_variable_end_write (mg_variable *v, mg_tensor *dst, bool done) {
  if (dst != NULL && done && !mg_dry_running()) v->writes = next_stamp();
  if (dst == NULL || dst == v->value) return;
  if (!done || mg_dry_running()) {                 /* a dry run's copy goes too */
    mg_tensor_release(dst);
    return;
  }
  disown(v);
  adopt(v, dst);
}

/* }============================================================= */

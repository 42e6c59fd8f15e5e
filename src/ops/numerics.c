/*
** numerics.c — mg_check_numerics: the first op whose output holds a NaN or
** an infinity fails, naming the op and its inputs (as TensorFlow's
** enable_check_numerics), so a training run that diverges stops where it
** starts instead of finishing on NaN. mg_dispatch, the way every op's
** forward and backward goes through, calls the test when it is on.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/op.h"

/* {=================== isfinite, isnan, isinf =================== */

/* made of comparisons (no kernels of their own): NaN is the one value unequal
** to itself, an infinity the one whose magnitude equals infinity, and x - x is
** 0 exactly when x is neither. Integer and bool tensors are all finite */
static mg_tensor *all_of (mg_tensor *x, bool value) { return mg_full(x->shape, x->ndim, MG_BOOL, value); }

static bool floating (mg_tensor *x) { return mg_is_float(x->dtype) || mg_is_half(x->dtype); }

mg_tensor *mg_isnan (mg_tensor *x) {
  MG_CHECK_ARG("mg_isnan", x, NULL);
  return floating(x) ? mg_not_equal(x, x) : all_of(x, false);
}

mg_tensor *mg_isinf (mg_tensor *x) {
  MG_CHECK_ARG("mg_isinf", x, NULL);
  if (!floating(x)) return all_of(x, false);
  mg_scope sc = {0};
  mg_tensor *a = mg_tmp(&sc, mg_abs(x));
  mg_tensor *r = a ? mg_equal(a, mg_tmp(&sc, mg_scalar(INFINITY, a->dtype))) : NULL;
  mg_scope_end(&sc);
  return r;
}

mg_tensor *mg_isfinite (mg_tensor *x) {
  MG_CHECK_ARG("mg_isfinite", x, NULL);
  if (!floating(x)) return all_of(x, true);
  mg_scope sc = {0};
  mg_tensor *d = mg_tmp(&sc, mg_sub(x, x));
  mg_tensor *r = d ? mg_equal(d, mg_tmp(&sc, mg_scalar(0, d->dtype))) : NULL;
  mg_scope_end(&sc);
  return r;
}

/* }========================================================== */


int mg_check_numerics (int on) {
  mg_context *c = mg_ctx();
  int was = c->check_numerics;
  c->check_numerics = on != 0;
  return was;
}

/* the first entry of t that is not finite (its value in *bad), walking its
** strides; false when all are finite */
static bool first_bad (const mg_tensor *t, double *bad) {
  if (t->numel == 0) return false;
  size_t es = mg_dtype_size(t->dtype);
  int64_t idx[MG_MAX_DIMS] = {0};
  const char *base = mg_ptr(t);
  for (int64_t n = 0; n < t->numel; n++) {
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
    double v = mg_load_double(base + off * (int64_t)es, t->dtype);
    if (!isfinite(v)) {
      *bad = v;
      return true;
    }
    for (int d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
  }
  return false;
}

mg_status mg_numerics_check (const mg_opdef *def, int nin, mg_tensor *const *in, const mg_tensor *out) {
  double bad;
  if (!mg_is_float(out->dtype) || !first_bad(out, &bad)) return MG_OK;
  char ins[320] = "", sh[160];
  size_t k = 0;
  for (int j = 0; j < nin && k < sizeof ins; j++) {
    if (in[j] == NULL) continue;
    int w = snprintf(ins + k, sizeof ins - k, "%s%s %s", k ? ", " : "",
                     mg_shape_str(sh, sizeof sh, in[j]->shape, in[j]->ndim), mg_dtype_name(in[j]->dtype));
    k += w < 0 ? 0 : (size_t)w;
  }
  return mg_seterror("check_numerics: %s produced %s (inputs: %s; output %s %s)", def->info.name,
                     isnan(bad) ? "NaN" : bad > 0 ? "Inf" : "-Inf", nin > 0 ? ins : "none",
                     mg_shape_str(sh, sizeof sh, out->shape, out->ndim), mg_dtype_name(out->dtype));
}

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

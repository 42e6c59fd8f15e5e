/*
** autocast.c — automatic mixed precision (PyTorch's torch.autocast).
**
** While a region is open, the products' entries (matmul, dense, conv2d) pass each
** operand through mg_autocast_operand: a float32 operand becomes its
** bfloat16 cast, a differentiable op the tapes record, so the gradient
** comes back to the float32 tensor in float32 and the tape keeps the
** 2-byte copies for the backward. The other ops compute half operands in
** float32 (mg_half_to_float32, at their entries). A variable's value is
** cast once per outermost region (PyTorch's weight cast cache) while the
** same tapes record: the tapes forget the casts when that changes
** (mg_autocast_forget), since a cast recorded on one set of tapes would not
** connect a gradient on another. float16 regions cast the same way; their
** products run widened to float32 (FLOAT16_AS_FLOAT32, op.h): oneDNN 2.6
** has no float16 kernels for CPUs.
*/
#include <stdlib.h>

#include "dnn.h"
#include "ops/op.h"

static void drop (mg_autocast_cast *e) {
  mg_tensor_release(e->value);
  mg_tensor_release(e->half);
  e->value = e->half = NULL;
}

static void forget_casts (mg_autocast_state *s) {
  for (int i = 0; i < s->ncache; i++) drop(&s->cache[i]);
  s->ncache = 0;
  drop(&s->last);
}

void mg_autocast_forget (mg_context *c) { forget_casts(&c->autocast); }

void mg_autocast_forget_id (mg_context *c, uint64_t id) {
  mg_autocast_state *s = &c->autocast;
  for (int i = 0; i < s->ncache; i++)
    if (s->cache[i].value->id == id) {
      drop(&s->cache[i]);
      s->cache[i--] = s->cache[--s->ncache];
    }
  if (s->last.value && s->last.value->id == id) drop(&s->last);
}

const char *mg_half_isa (mg_dtype dt) {
  if (dt != MG_BFLOAT16) return NULL;   /* oneDNN 2.6 runs no float16 products on CPUs */
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx) return "avx512_core_amx";
  if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16) return "avx512_core_bf16";
  return NULL;
}

bool mg_cpu_has_float16 (void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512fp16");
}

bool mg_autocast_emulate_float16 (bool on) {
  mg_autocast_state *s = &mg_ctx()->autocast;
  bool was = s->float16_emulated;
  s->float16_emulated = on;
  return was;
}

static mg_status push (mg_autocast_state *s, mg_dtype dt);

mg_status mg_autocast_push (mg_dtype dt) {
  mg_autocast_state *s = &mg_ctx()->autocast;
  if (dt == MG_FLOAT16 && !mg_cpu_has_float16() && !s->float16_emulated)
    return mg_seterror("autocast: float16 needs a CPU with AVX512-FP16, and this one has none: its float16 "
                       "products would run widened to float32, slower than float32 itself (oneDNN %d.%d has "
                       "no float16 kernels on CPUs either). Use bfloat16, or "
                       "mixed_precision.emulate_float16(true) to run float16's numerics anyway",
                       DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR);
  return push(s, dt);
}

/* a re-run's region: the dtype its first run was allowed, whatever the
** float16 setting is now */
mg_status mg_autocast_reenter (mg_dtype dt) { return push(&mg_ctx()->autocast, dt); }

static mg_status push (mg_autocast_state *s, mg_dtype dt) {
  if (dt != MG_BFLOAT16 && dt != MG_FLOAT16 && dt != MG_FLOAT32)
    return mg_seterror("autocast: dtype must be bfloat16, float16 or float32 (off), got %s", mg_dtype_name(dt));
  if (s->depth >= MG_AUTOCAST_DEPTH)
    return mg_seterror("autocast: regions nest %d deep at most", MG_AUTOCAST_DEPTH);
  s->outer[s->depth++] = s->dtype;
  s->dtype = dt;
  return MG_OK;
}

void mg_autocast_pop (void) {
  mg_autocast_state *s = &mg_ctx()->autocast;
  if (s->depth == 0) return;
  s->dtype = s->outer[--s->depth];
  if (s->depth == 0) forget_casts(s);   /* the step's casts go with its region */
}

mg_dtype mg_autocast_dtype (void) { return mg_ctx()->autocast.dtype; }
int mg_autocast_depth (void) { return mg_ctx()->autocast.depth; }

/* e's cast of x to dt, when e holds one with values (or a dry run,
** mg.memory.estimate, asks: a cast it made has none); a new reference */
static mg_tensor *hit (mg_autocast_cast *e, mg_tensor *x, mg_dtype dt) {
  if (e->value != x || e->half->dtype != dt) return NULL;
  return mg_tensor_has_values(e->half) || mg_dry_running() ? mg_tensor_retain(e->half) : NULL;
}

/* the cast of variable value x, made once per region */
static mg_tensor *cached_cast (mg_autocast_state *s, mg_tensor *x, mg_dtype dt) {
  for (int i = 0; i < s->ncache; i++) {
    mg_tensor *h = hit(&s->cache[i], x, dt);
    if (h) return h;
    if (s->cache[i].value == x) {       /* made by a dry run: made again */
      drop(&s->cache[i]);
      s->cache[i] = s->cache[--s->ncache];
      break;
    }
  }
  mg_tensor *h = mg_cast(x, dt);
  if (h == NULL) return NULL;
  if (s->ncache == s->capcache) {       /* no room: the cast is still right, only not kept */
    int cap = s->capcache ? 2 * s->capcache : 16;
    mg_autocast_cast *c = (mg_autocast_cast *)realloc(s->cache, sizeof *c * (size_t)cap);
    if (c == NULL) return h;
    s->cache = c;
    s->capcache = cap;
  }
  s->cache[s->ncache++] = (mg_autocast_cast){mg_tensor_retain(x), mg_tensor_retain(h)};
  return h;
}

/* the cast of any other x: the last one is kept, so that the products
** reading one activation (q, k and v of a layer norm's output) share one
** cast, one recorded op and one saved copy (the tape would keep a copy per
** product, PyTorch's autocast too). Tensors are immutable, and the entry
** holds x, so the same x means the same values. */
static mg_tensor *last_cast (mg_autocast_state *s, mg_tensor *x, mg_dtype dt) {
  mg_tensor *h = s->last.value ? hit(&s->last, x, dt) : NULL;
  if (h) return h;
  if ((h = mg_cast(x, dt)) == NULL) return NULL;
  drop(&s->last);
  s->last = (mg_autocast_cast){mg_tensor_retain(x), mg_tensor_retain(h)};
  return h;
}

mg_tensor *mg_autocast_operand (mg_tensor *x) {
  mg_autocast_state *s = &mg_ctx()->autocast;
  if (x == NULL) return NULL;
  if (s->dtype == MG_FLOAT32 || x->dtype != MG_FLOAT32) return mg_tensor_retain(x);
  if (s->depth == 0) return mg_cast(x, s->dtype);
  return x->var != NULL ? cached_cast(s, x, s->dtype) : last_cast(s, x, s->dtype);
}

mg_tensor *mg_rounded_float16 (mg_tensor *w) {
  mg_tensor *r = w ? mg_cast(w, MG_FLOAT16) : NULL;
  mg_tensor_release(w);
  return r;
}

mg_tensor *mg_half_to_float32 (mg_tensor *x) {
  if (x == NULL) return NULL;
  return mg_is_half(x->dtype) ? mg_cast(x, MG_FLOAT32) : mg_tensor_retain(x);
}

bool mg_half_mixed (mg_tensor *const *xs, int n) {
  bool half = false, differ = false;
  for (int k = 0; k < n; k++) {
    if (xs[k]->dtype != MG_FLOAT32 && !mg_is_half(xs[k]->dtype)) return false;
    half = half || mg_is_half(xs[k]->dtype);
    differ = differ || xs[k]->dtype != xs[0]->dtype;
  }
  return half && differ;
}

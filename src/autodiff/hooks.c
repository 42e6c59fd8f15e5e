/*
** hooks.c — saved-tensor hooks: what a tape keeps for the backward can be
** packed (to half precision, to a file) and unpacked when it is needed.
**
** The pushed hooks form a stack in the context; a node records the hooks
** its tensors went through (a counted reference), so they outlive the push
** while nodes need them. Ready-made hooks: float16 and bfloat16 here, and
** offload to a file (spill.c).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

struct mg_hooks_ref {
  const mg_saved_hooks *h;
  void *ud;
  int refs;
  struct mg_hooks_ref *prev;            /* the ones pushed before */
  idmap packed;                         /* source tensor id -> its stand-in, retained */
};

/* {====================== the hook stack ====================== */

mg_status mg_saved_hooks_push (const mg_saved_hooks *h, void *ud) {
  MG_CHECK_ARG("mg_saved_hooks_push", h, MG_ERR);
  if (h->pack == NULL || h->unpack == NULL)
    return mg_seterror("mg_saved_hooks_push: pack and unpack must both be given");
  mg_hooks_ref *r = (mg_hooks_ref *)malloc(sizeof(mg_hooks_ref));
  if (r == NULL) {
    if (h->release) h->release(ud);
    return mg_seterror("out of memory pushing saved-tensor hooks");
  }
  mg_tape_state *T = &mg_ctx()->tapes;
  memset(r, 0, sizeof *r);
  r->h = h;
  r->ud = ud;
  r->refs = 1;
  r->prev = T->hooks;
  T->hooks = r;
  return MG_OK;
}

void mg_saved_hooks_pop (void) {
  mg_tape_state *T = &mg_ctx()->tapes;
  mg_hooks_ref *r = T->hooks;
  if (r == NULL) return;
  T->hooks = r->prev;
  mg_hooks_release(r);
}

void mg_hooks_retain (mg_hooks_ref *r) { r->refs++; }

void mg_hooks_release (mg_hooks_ref *r) {
  if (r == NULL || --r->refs > 0) return;
  for (size_t i = 0; i < r->packed.cap; i++) mg_tensor_release((mg_tensor *)r->packed.vals[i]);
  idmap_free(&r->packed);
  if (r->h->release) r->h->release(r->ud);
  free(r);
}

void mg_hooks_forget (mg_hooks_ref *r, uint64_t src, mg_tensor *packed) {
  if (!idmap_has(&r->packed, src)) return;
  void **slot = idmap_slot(&r->packed, src);
  /* the map and this node are the last holders: the stand-in can go */
  if (slot && *slot == packed && packed->refcount <= 2) {
    mg_tensor_release(packed);
    *slot = NULL;
  }
}

/* a pack or unpack may run ops: none of them goes through the hooks again */
mg_tensor *mg_hooks_pack (mg_hooks_ref *r, mg_tensor *t) {
  mg_tensor *known = (mg_tensor *)idmap_get(&r->packed, t->id);
  if (known) return mg_tensor_retain(known);
  mg_tape_state *T = &mg_ctx()->tapes;
  T->in_hooks = true;
  mg_tensor *p = r->h->pack(r->ud, t);
  T->in_hooks = false;
  void **slot = p ? idmap_slot(&r->packed, t->id) : NULL;
  if (slot) *slot = mg_tensor_retain(p);
  /* said once: a hook's own "pack must return a tensor" names the hook already */
  if (p == NULL && strstr(mg_errmsg_raw(), "saved-tensor hooks") == NULL &&
      strstr(mg_errmsg_raw(), "saved_tensors_hooks") == NULL) {
    char msg[400];
    snprintf(msg, sizeof msg, "%s", mg_errmsg_raw());
    mg_seterror("saved-tensor hooks: pack failed: %s", msg);
  }
  return p;
}

mg_tensor *mg_hooks_unpack (mg_hooks_ref *r, mg_tensor *packed, const mg_meta *m) {
  mg_tape_state *T = &mg_ctx()->tapes;
  T->in_hooks = true;
  mg_tensor *t = r->h->unpack(r->ud, packed, m->dtype);
  T->in_hooks = false;
  if (t != NULL && (t->dtype != m->dtype || !mg_same_shape(t->shape, t->ndim, m->shape, m->ndim))) {
    char a[160], b[160];
    mg_seterror("saved-tensor hooks: unpack gave %s %s for a tensor saved as %s %s",
                mg_shape_str(a, sizeof a, t->shape, t->ndim), mg_dtype_name(t->dtype),
                mg_shape_str(b, sizeof b, m->shape, m->ndim), mg_dtype_name(m->dtype));
    mg_tensor_release(t);
    return NULL;
  }
  return t;
}

/* }========================================================== */


/* {==================== ready-made hooks ====================== */

/* float32 and float64 to half precision; integers (a gather's or an
** embedding's indices: a rounded index moves the gradient to another row),
** bools and halves stay as they are */
static mg_tensor *pack_half (mg_tensor *t, mg_dtype half) {
  return mg_is_float(t->dtype) ? mg_cast(t, half) : mg_tensor_retain(t);
}
static mg_tensor *pack_f16 (void *ud, mg_tensor *t) { MG_UNUSED(ud); return pack_half(t, MG_FLOAT16); }
static mg_tensor *pack_bf16 (void *ud, mg_tensor *t) { MG_UNUSED(ud); return pack_half(t, MG_BFLOAT16); }
static mg_tensor *unpack_cast (void *ud, mg_tensor *p, mg_dtype dt) { MG_UNUSED(ud); return mg_cast(p, dt); }

const mg_saved_hooks mg_hooks_float16 = {pack_f16, unpack_cast, NULL};
const mg_saved_hooks mg_hooks_bfloat16 = {pack_bf16, unpack_cast, NULL};

/* }========================================================== */

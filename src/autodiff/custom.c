/*
** custom.c — custom gradients (tf.custom_gradient), driven by C callbacks.
**
** The host's forward runs with the tapes paused (its insides are not
** recorded; with MG_FN_RECORD_FORWARD they are, as in TensorFlow, so a
** backward that uses the forward's tensors can be differentiated again)
** while its variable reads are noted; the tapes then record one node whose
** inputs are the forward's inputs plus those variables (and, with
** MG_FN_CAPTURES, the tensors it closed over), and whose backward is the
** host's. Ops the host's backward runs are recorded
** by tapes still recording, so custom gradients can be differentiated again.
**
** Each call has a context (PyTorch's ctx): what the forward saves through it
** is held by the node as saved tensors, so the counters see it (a closure's
** captures they cannot), and goes with the node. The context also keeps the
** random state and loop depth of the call, for re-runs in the backward.
*/
#include <stdlib.h>
#include <string.h>

#include "autodiff/autodiff.h"

/* {======================= the context ======================= */

typedef enum { CTX_FORWARD, CTX_RECORDED, CTX_CLOSED } ctx_state;

struct mg_custom_ctx {
  int refcount;                /* the call, its node, the host's handles */
  ctx_state state;
  int n, cap;
  mg_tensor **saved;           /* [n]: held as a node's saved tensors, or NULL */
  mg_rng_state rng;            /* the random state when the call began */
  int loop_depth;              /* mg_is_in_loop's depth then */
  mg_dtype autocast;           /* the autocast then (a re-run runs under it) */
  const mg_grad_args *args;    /* during the backward */
  mg_custom_ctx *prev;         /* the enclosing forward's, while this one runs */
};

static mg_custom_ctx *ctx_new (void) {
  mg_custom_ctx *c = (mg_custom_ctx *)calloc(1, sizeof(mg_custom_ctx));
  if (c == NULL) return mg_seterror("custom_gradient: out of memory"), NULL;
  c->refcount = 1;
  c->rng = mg_random_get_state();
  c->loop_depth = mg_ctx()->tapes.loop_depth;
  c->autocast = mg_autocast_dtype();
  return c;
}

/* a saved tensor counts as what tapes hold (the saved role) */
static void unkeep (mg_tensor **slot) {
  if (*slot == NULL) return;
  mg_storage_hold((*slot)->storage, MG_ROLE_SAVED, -1);
  mg_tensor_release(*slot);
  *slot = NULL;
}

/* the node let go (or none was recorded): so does the context */
static void ctx_close (mg_custom_ctx *c) {
  for (int i = 0; i < c->n; i++) unkeep(&c->saved[i]);
  c->state = CTX_CLOSED;
}

mg_custom_ctx *mg_custom_ctx_retain (mg_custom_ctx *c) {
  if (c) c->refcount++;
  return c;
}

void mg_custom_ctx_release (mg_custom_ctx *c) {
  if (c == NULL || --c->refcount > 0) return;
  ctx_close(c);
  free(c->saved);
  free(c);
}

mg_custom_ctx *mg_custom_context (void) {
  mg_custom_ctx *c = mg_ctx()->tapes.custom;
  if (c == NULL) mg_seterror("mg_custom_context: no custom gradient's forward is running");
  return c;
}

mg_status mg_custom_save (mg_custom_ctx *c, int n, mg_tensor *const *ts) {
  MG_CHECK_ARG("mg_custom_save", c, MG_ERR);
  if (n < 0) return mg_seterror("mg_custom_save: n is negative (%d)", n);
  if (n > 0 && ts == NULL) return mg_null_arg("mg_custom_save", "ts");
  if (c->state != CTX_FORWARD)
    return mg_seterror("mg_custom_save: only while the custom gradient's forward runs");
  if (c->n + n > c->cap) {
    int cap = c->cap ? c->cap : 4;
    while (cap < c->n + n) cap *= 2;
    mg_tensor **a = (mg_tensor **)realloc(c->saved, sizeof(mg_tensor *) * (size_t)cap);
    if (a == NULL) return mg_seterror("mg_custom_save: out of memory");
    c->saved = a;
    c->cap = cap;
  }
  for (int i = 0; i < n; i++) {
    mg_tensor *t = ts[i];
    c->saved[c->n++] = t ? mg_tensor_retain(t) : NULL;
    if (t) mg_storage_hold(t->storage, MG_ROLE_SAVED, 1);
  }
  return MG_OK;
}

int mg_custom_nsaved (const mg_custom_ctx *c) { return c ? c->n : 0; }

mg_tensor *mg_custom_saved (const mg_custom_ctx *c, int i) {
  MG_CHECK_ARG("mg_custom_saved", c, NULL);
  if (i < 0 || i >= c->n)
    return mg_seterror("mg_custom_saved: index %d is out of range (%d saved)", i, c->n), NULL;
  return c->saved[i];
}

mg_status mg_custom_forget (mg_custom_ctx *c, int i) {
  MG_CHECK_ARG("mg_custom_forget", c, MG_ERR);
  if (i < 0 || i >= c->n)
    return mg_seterror("mg_custom_forget: index %d is out of range (%d saved)", i, c->n);
  unkeep(&c->saved[i]);
  return MG_OK;
}

int mg_custom_recorded (const mg_custom_ctx *c) { return c && c->state == CTX_RECORDED; }

int mg_custom_needs_input_grad (const mg_custom_ctx *c, int j) {
  MG_CHECK_ARG("mg_custom_needs_input_grad", c, -1);
  if (c->args == NULL)
    return mg_seterror("needs_input_grad: only while the custom gradient's backward runs"), -1;
  if (j < 0 || j >= c->args->nin)
    return mg_seterror("needs_input_grad: input " MG_POS1 " is out of range (the call had %d)", (long long)j,
                       c->args->nin), -1;
  return c->args->needs[j] != 0;
}

mg_status mg_custom_rerun (mg_custom_ctx *c, mg_status (*fn)(void *ud), void *ud) {
  MG_CHECK_ARG("mg_custom_rerun", c, MG_ERR);
  MG_CHECK_ARG("mg_custom_rerun", fn, MG_ERR);
  mg_tape_state *T = &mg_ctx()->tapes;
  mg_rng_state now = mg_random_get_state();
  int loops = T->loop_depth;
  mg_random_set_state(c->rng);
  T->loop_depth += c->loop_depth;
  mg_recompute_enter();
  mg_status st = mg_autocast_reenter(c->autocast);
  if (st == MG_OK) {
    st = fn(ud);
    mg_autocast_pop();
  }
  mg_recompute_leave();
  T->loop_depth = loops;
  mg_random_set_state(now);
  return st;
}

/* }========================================================== */


/* {======================= the node ========================== */

typedef struct custom_ext {
  const mg_function *fn;
  void *ud;
  int nargs, nvars, ncaptured; /* inputs: nargs tensors, nvars variables, ncaptured tensors */
  mg_variable **vars;          /* retained */
  mg_tensor **captured;        /* retained */
  mg_custom_ctx *ctx;          /* retained */
  uint64_t *writes;            /* MG_FN_REREADS: each variable's last write at the forward, or STATE */
} custom_ext;

static void release_ud (const mg_function *fn, void *ud) {
  if (fn->release) fn->release(ud);
}

static void custom_free (mg_node *n) {
  custom_ext *e = (custom_ext *)n->ext;
  release_ud(e->fn, e->ud);
  for (int k = 0; k < e->nvars; k++) mg_variable_release(e->vars[k]);
  for (int k = 0; k < e->ncaptured; k++) mg_tensor_release(e->captured[k]);
  free(e->vars);
  free(e->captured);
  free(e->writes);
  if (e->ctx) ctx_close(e->ctx);               /* a host's handle may outlive the node */
  mg_custom_ctx_release(e->ctx);
  free(e);
}

/* the tensors the forward saved, for mg_tape_saved_bytes: the i-th present */
static mg_tensor *custom_saved (const mg_node *n, int i) {
  const mg_custom_ctx *c = ((const custom_ext *)n->ext)->ctx;
  for (int k = 0; c && k < c->n; k++)
    if (c->saved[k] && i-- == 0) return c->saved[k];
  return NULL;
}

/* zeros for the outputs no gradient reached: the host sees a tensor always */
static mg_status fill_douts (mg_node *n, mg_tensor *const *dout, mg_tensor **full) {
  for (int i = 0; i < n->nout; i++) {
    full[i] = dout[i] ? mg_tensor_retain(dout[i]) : mg_zeros_meta(&n->out_meta[i]);
    if (full[i] == NULL) return MG_ERR;
  }
  return MG_OK;
}

/* a variable the forward wrote itself (BatchNorm's moving averages): its
** state, which the gradient does not depend on, and others may move */
#define STATE UINT64_MAX

/* MG_FN_REREADS: the variables as the forward read them, or an error naming one written since */
static mg_status unwritten (const custom_ext *e) {
  for (int k = 0; e->writes && k < e->nvars; k++)
    if (e->writes[k] != STATE && e->vars[k]->writes != e->writes[k])
      return mg_seterror("%s: variable '%s' was assigned after the forward (an optimizer step?), and the "
                         "backward runs the steps again on its new value, which would give another function's "
                         "gradient; take the gradient before changing it", e->fn->name, mg_variable_name(e->vars[k]));
  return MG_OK;
}

static mg_status custom_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  custom_ext *e = (custom_ext *)n->ext;
  if (unwritten(e) != MG_OK) return MG_ERR;
  int nin = n->nin;
  mg_tensor **full = (mg_tensor **)calloc((size_t)n->nout + 1, sizeof(mg_tensor *));
  int *needs = (int *)calloc((size_t)nin + 1, sizeof(int));
  mg_status st = full && needs ? fill_douts(n, dout, full)
                               : mg_seterror("out of memory in the backward of '%s'", e->fn->name);
  for (int j = 0; j < nin && needs; j++) needs[j] = n->needs[j];
  if (st == MG_OK) {
    mg_grad_args a = {n->nout, full, e->nargs, e->nvars, e->vars, e->ncaptured, e->captured, needs, din, e->ctx};
    mg_tape_state *T = &mg_ctx()->tapes;
    int loops = T->loop_depth;
    T->loop_depth += e->ctx->loop_depth;         /* in a loop, as the call was */
    e->ctx->args = &a;
    st = e->fn->backward(e->ud, &a);
    e->ctx->args = NULL;
    T->loop_depth = loops;
  }
  for (int j = 0; j < nin && st == MG_OK; j++) {
    if (!n->needs[j]) {                          /* not asked for: dropped */
      mg_tensor_release(din[j]);
      din[j] = NULL;
    } else if (din[j] == NULL) {                 /* no gradient given: unconnected, as in TF */
      n->needs[j] = false;
    }
  }
  if (st != MG_OK)
    for (int j = 0; j < nin; j++) { mg_tensor_release(din[j]); din[j] = NULL; }
  for (int i = 0; full && i < n->nout; i++) mg_tensor_release(full[i]);
  free(full);
  free(needs);
  return st;
}

static const mg_opdef custom_op = {
  .info = {.name = "custom_gradient", .kind = MG_OP_OTHER},
  .backward = custom_backward, .free_ext = custom_free, .saved_extra = custom_saved,
};

/* }========================================================== */


/* {======================== the call ========================= */

/* records the node; takes over ud, the context and the watcher's variables
** and tensors */
static mg_status record (const mg_function *fn, void *ud, mg_custom_ctx *c, int nin,
                         mg_tensor *const *in, mg_var_watcher *w, uint64_t began, mg_list *out) {
  int ninputs = nin + w->n + w->nt;
  custom_ext *e = (custom_ext *)calloc(1, sizeof(custom_ext));
  mg_tensor **inputs = (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)(ninputs + 1));
  if (e == NULL || inputs == NULL) {
    free(e);
    free(inputs);
    release_ud(fn, ud);
    mg_watcher_free(w);
    ctx_close(c);
    mg_custom_ctx_release(c);
    return mg_seterror("%s: out of memory", fn->name);
  }
  memcpy(inputs, in, sizeof(mg_tensor *) * (size_t)nin);
  for (int k = 0; k < w->n; k++) inputs[nin + k] = w->vars[k]->value;
  for (int k = 0; k < w->nt; k++) inputs[nin + w->n + k] = w->ts[k];
  *e = (custom_ext){fn, ud, nin, w->n, w->nt, w->vars, w->ts, c, NULL};
  /* (out of memory here, the check is skipped: the call itself goes on) */
  if ((fn->flags & MG_FN_REREADS) && w->n > 0 && (e->writes = (uint64_t *)malloc(sizeof(uint64_t) * (size_t)w->n)))
    for (int k = 0; k < w->n; k++) e->writes[k] = w->vars[k]->writes > began ? STATE : w->vars[k]->writes;
  w->vars = NULL;                                /* the node owns them now */
  w->ts = NULL;
  w->n = w->cap = w->nt = w->capt = 0;
  mg_status st = mg_call_fresh_outputs(out, inputs, ninputs);
  c->state = CTX_RECORDED;                       /* closed again if no tape records it */
  if (st == MG_OK)
    st = mg_record_ex(&custom_op, ninputs, inputs, out->n, out->t, NULL, e, NULL);
  else
    custom_free(&(mg_node){.ext = e});
  free(inputs);
  return st;
}

mg_status mg_custom_call (const mg_function *fn, void *ud, int nin, mg_tensor *const *in,
                          mg_list *out) {
  mg_status st = mg_call_check("mg_custom_call", fn, nin, in, out);
  if (st == MG_OK && fn->backward == NULL) st = mg_seterror("mg_custom_call: fn->backward is NULL");
  if (st != MG_OK) {
    if (fn && fn->release) fn->release(ud);
    return st;
  }
  mg_custom_ctx *c = ctx_new();
  if (c == NULL) {
    release_ud(fn, ud);
    return MG_ERR;
  }
  mg_call_hold(nin, in);                 /* the forward may release what the caller lent */
  mg_tape_state *T = &mg_ctx()->tapes;
  c->prev = T->custom;                           /* the forward finds it (mg_custom_context) */
  T->custom = c;
  mg_var_watcher w;
  uint64_t began = mg_variable_clock();
  st = mg_call_forward(fn, ud, nin, in, out, &w, fn->flags);
  T->custom = c->prev;
  c->prev = NULL;
  if (st == MG_OK && mg_recording_tapes > 0) {
    mg_call_drop_passed(&w, nin, in);
    if ((st = record(fn, ud, c, nin, in, &w, began, out)) != MG_OK) mg_list_clear(out);
  } else {                                       /* failed, or nobody will ask for the gradient */
    if (st == MG_OK) mg_watcher_free(&w);
    release_ud(fn, ud);
    ctx_close(c);
    mg_custom_ctx_release(c);
  }
  mg_call_unhold(nin, in);
  return st;
}

/* }========================================================== */

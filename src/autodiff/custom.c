/*
** custom.c — custom gradients (tf.custom_gradient), driven by C callbacks.
**
** The host's forward runs with the tapes paused (its insides are not
** recorded) while its variable reads are noted; the tapes then record one
** node whose inputs are the forward's inputs plus those variables, and
** whose backward is the host's. Ops the host's backward runs are recorded
** by tapes still recording, so custom gradients can be differentiated again.
*/
#include <stdlib.h>
#include <string.h>

#include "moongrad_impl.h"

typedef struct custom_ext {
  const mg_function *fn;
  void *ud;
  int nargs, nvars;            /* inputs: nargs tensors, then nvars variables */
  mg_variable **vars;          /* retained */
} custom_ext;

static void release_ud (const mg_function *fn, void *ud) {
  if (fn->release) fn->release(ud);
}

static void custom_free (mg_node *n) {
  custom_ext *e = (custom_ext *)n->ext;
  release_ud(e->fn, e->ud);
  for (int k = 0; k < e->nvars; k++) mg_variable_release(e->vars[k]);
  free(e->vars);
  free(e);
}

/* zeros for the outputs no gradient reached: the host sees a tensor always */
static mg_status fill_douts (mg_node *n, mg_tensor *const *dout, mg_tensor **full) {
  for (int i = 0; i < n->nout; i++) {
    full[i] = dout[i] ? mg_tensor_retain(dout[i]) : mg_zeros_meta(&n->out_meta[i]);
    if (full[i] == NULL) return MG_ERR;
  }
  return MG_OK;
}

static mg_status custom_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  custom_ext *e = (custom_ext *)n->ext;
  int nin = n->nin;
  mg_tensor **full = (mg_tensor **)calloc((size_t)n->nout + 1, sizeof(mg_tensor *));
  int *needs = (int *)calloc((size_t)nin + 1, sizeof(int));
  mg_status st = full && needs ? fill_douts(n, dout, full)
                               : mg_seterror("out of memory in the backward of '%s'", e->fn->name);
  for (int j = 0; j < nin && needs; j++) needs[j] = n->needs[j];
  if (st == MG_OK) {
    mg_grad_args a = {n->nout, full, e->nargs, e->nvars, e->vars, needs, din};
    st = e->fn->backward(e->ud, &a);
  }
  for (int j = 0; j < nin && st == MG_OK; j++) {
    if (!n->needs[j]) {                          /* not asked for: dropped */
      mg_tensor_release(din[j]);
      din[j] = NULL;
    } else if (din[j] == NULL && (din[j] = mg_zeros_meta(&n->in_meta[j])) == NULL) {
      st = MG_ERR;
    }
  }
  if (st != MG_OK)
    for (int j = 0; j < nin; j++) { mg_tensor_release(din[j]); din[j] = NULL; }
  for (int i = 0; full && i < n->nout; i++) mg_tensor_release(full[i]);
  free(full);
  free(needs);
  return st;
}

static const mg_opdef custom_op = {.info = {.name = "custom_gradient", .kind = MG_OP_OTHER}, .backward = custom_backward, .free_ext = custom_free};

/* records the node; takes over ud and the watcher's variables */
static mg_status record (const mg_function *fn, void *ud, int nin, mg_tensor *const *in,
                         mg_var_watcher *w, mg_list *out) {
  int ninputs = nin + w->n;
  custom_ext *e = (custom_ext *)calloc(1, sizeof(custom_ext));
  mg_tensor **inputs = (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)(ninputs + 1));
  if (e == NULL || inputs == NULL) {
    free(e);
    free(inputs);
    release_ud(fn, ud);
    mg_watcher_free(w);
    return mg_seterror("%s: out of memory", fn->name);
  }
  memcpy(inputs, in, sizeof(mg_tensor *) * (size_t)nin);
  for (int k = 0; k < w->n; k++) inputs[nin + k] = w->vars[k]->value;
  *e = (custom_ext){fn, ud, nin, w->n, w->vars};
  w->vars = NULL;                                /* the node owns them now */
  w->n = w->cap = 0;
  mg_status st = mg_call_fresh_outputs(out, inputs, ninputs);
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
  mg_call_hold(nin, in);                 /* the forward may release what the caller lent */
  mg_var_watcher w;
  if (mg_call_forward(fn, ud, nin, in, out, &w) != MG_OK) {
    release_ud(fn, ud);
    st = MG_ERR;
  } else if (mg_recording_tapes == 0) {          /* nobody will ask for the gradient */
    mg_watcher_free(&w);
    release_ud(fn, ud);
  } else {
    mg_call_drop_passed(&w, nin, in);
    if ((st = record(fn, ud, nin, in, &w, out)) != MG_OK) mg_list_clear(out);
  }
  mg_call_unhold(nin, in);
  return st;
}

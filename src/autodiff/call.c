/*
** call.c — what custom gradients and recompute share: running a host's
** forward as one op. The forward runs with every tape paused (unless it is
** recorded, MG_FN_RECORD_FORWARD) while a watcher notes the variables it
** reads and, when asked, the tensors from outside it that a tape follows;
** its outputs get ids of their own; the node's inputs are the forward's
** inputs plus those variables and tensors.
*/
#include <stdlib.h>
#include <string.h>

#include "autodiff/autodiff.h"

/* {========================= lists ========================== */

mg_status mg_list_push (mg_list *l, mg_tensor *t) {
  if (l == NULL) {
    mg_tensor_release(t);
    return mg_null_arg("mg_list_push", "l");
  }
  if (t == NULL) return MG_ERR;                    /* the failed op said why */
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 8;
    mg_tensor **a = (mg_tensor **)realloc(l->t, sizeof(mg_tensor *) * (size_t)cap);
    if (a == NULL) {
      mg_tensor_release(t);
      return mg_seterror("out of memory collecting outputs");
    }
    l->t = a;
    l->cap = cap;
  }
  l->t[l->n++] = t;
  return MG_OK;
}

void mg_list_clear (mg_list *l) {
  if (l == NULL) return;
  for (int i = 0; i < l->n; i++) mg_tensor_release(l->t[i]);
  free(l->t);
  l->t = NULL;
  l->n = l->cap = 0;
}

/* }========================================================== */


/* {===================== running a call ===================== */

mg_status mg_call_check (const char *fn, const mg_function *f, int nin, mg_tensor *const *in,
                         mg_list *out) {
  if (f == NULL) return mg_null_arg(fn, "fn");
  if (f->forward == NULL) return mg_seterror("%s: fn->forward is NULL", fn);
  if (out == NULL) return mg_null_arg(fn, "out");
  if (nin < 0) return mg_seterror("%s: nin is negative (%d)", fn, nin);
  if (nin > 0 && in == NULL) return mg_null_arg(fn, "in");
  for (int j = 0; j < nin; j++)
    if (in[j] == NULL) return mg_seterror("%s: in[%d] is NULL", fn, j);
  return MG_OK;
}

void mg_call_hold (int nin, mg_tensor *const *in) {
  for (int i = 0; i < nin; i++) mg_tensor_retain(in[i]);
}

void mg_call_unhold (int nin, mg_tensor *const *in) {
  for (int i = 0; i < nin; i++) mg_tensor_release(in[i]);
}

mg_status mg_call_forward (const mg_function *f, void *ud, int nin, mg_tensor *const *in,
                           mg_list *out, mg_var_watcher *w, unsigned how) {
  mg_watcher_push(w, (how & MG_FN_CAPTURES) != 0 && !(how & MG_FN_RECORD_FORWARD));
  mg_status st;
  if (how & MG_FN_RECORD_FORWARD) {
    st = f->forward(ud, nin, in, out);
  } else if ((st = mg_pause_all()) == MG_OK) {
    w->level = mg_ctx()->tapes.npauses - 1;
    st = f->forward(ud, nin, in, out);
    if (st == MG_OK) mg_watcher_note_outputs(w, out->n, out->t);
    mg_resume_all();
  }
  mg_watcher_pop(w);
  if (st == MG_OK && w->failed) st = mg_seterror("out of memory noting what a forward reads");
  if (st == MG_OK && out->n == 0)
    st = mg_seterror("%s: the forward returned no tensors", f->name ? f->name : "function");
  if (st != MG_OK) {
    mg_list_clear(out);
    mg_watcher_free(w);
  }
  return st;
}

int mg_call_index_of (uint64_t id, mg_tensor *const *xs, int n) {
  for (int i = 0; i < n; i++) if (xs[i]->id == id) return i;
  return -1;
}

static bool among (uint64_t id, mg_tensor *const *xs, int n) { return mg_call_index_of(id, xs, n) >= 0; }

/* An op's output must be new to the tapes, or the record would loop: an
** output that is an input, a variable's value, an earlier output, or a
** tensor some tape follows becomes a fresh view of the same data. */
mg_status mg_call_fresh_outputs (mg_list *out, mg_tensor *const *inputs, int ninputs) {
  for (int i = 0; i < out->n; i++) {
    mg_tensor *t = out->t[i];
    if (!(t->var || among(t->id, inputs, ninputs) || among(t->id, out->t, i) ||
          mg_any_tape_tracks(t->id)))
      continue;
    mg_tensor *v = mg_tensor_view(t->storage, t->dtype, t->shape, t->ndim, t->strides, t->offset);
    if (v == NULL) return MG_ERR;
    mg_tensor_release(t);
    out->t[i] = v;
  }
  return MG_OK;
}

/* drops from w the variables whose value, and the captured tensors that,
** are among in[0..nin): they are inputs already */
void mg_call_drop_passed (mg_var_watcher *w, int nin, mg_tensor *const *in) {
  int k = 0;
  for (int i = 0; i < w->n; i++) {
    bool passed = false;
    for (int j = 0; j < nin && !passed; j++) passed = in[j]->var == w->vars[i];
    if (passed) mg_variable_release(w->vars[i]);
    else w->vars[k++] = w->vars[i];
  }
  w->n = k;
  k = 0;
  for (int i = 0; i < w->nt; i++) {
    if (among(w->ts[i]->id, in, nin)) mg_tensor_release(w->ts[i]);
    else w->ts[k++] = w->ts[i];
  }
  w->nt = k;
}

/* }========================================================== */

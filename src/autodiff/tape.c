/*
** tape.c — gradient tapes: recording, nesting, and the reverse walk.
**
** A tape follows tensor ids. Watching a tensor (or reading a trainable
** variable, whose values all carry the variable's id) puts its id in the
** tape's `tracked` set; an op that reads a tracked id is recorded as a node,
** and its outputs become tracked. Nodes keep only what their backward rule
** says it needs (mg_opdef.saves), so the bytes a tape holds are exactly the
** saved tensors, and recompute_grad can drop them.
**
** The walk visits nodes newest first, which is a valid reverse topological
** order because nodes are appended as ops run. Backward rules are written
** with the public ops, so a tape recording while another computes its
** gradient records that backward pass: nested tapes give higher orders.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

/* {========================= tapes ========================== */
/* The active tapes, the watchers and the pauses are the context's
** (mg_tape_state); a tape stays in the active list of the context that
** made it. */

static mg_tape_state *tapes (void) { return &mg_ctx()->tapes; }

/* after any change in which tapes record: autocast's cached casts were
** recorded by the tapes before it (autocast.c) */
static void count_recording (mg_context *c) {
  mg_tape_state *T = &c->tapes;
  int n = 0;
  for (int i = 0; i < T->nactive; i++) n += T->active[i]->paused == 0;
  T->recording = n;
  mg_autocast_forget(c);
}

static mg_status activate (mg_tape *t) {
  mg_tape_state *T = &t->ctx->tapes;
  if (t->active) return MG_OK;
  if (T->nactive == T->capactive) {
    int cap = T->capactive ? T->capactive * 2 : 8;
    mg_tape **a = (mg_tape **)realloc(T->active, sizeof(mg_tape *) * (size_t)cap);
    if (a == NULL) return mg_seterror("out of memory starting a tape");
    T->active = a;
    T->capactive = cap;
  }
  T->active[T->nactive++] = t;
  t->active = true;
  count_recording(t->ctx);
  return MG_OK;
}

static void deactivate (mg_tape *t) {
  mg_tape_state *T = &t->ctx->tapes;
  if (!t->active) return;
  for (int i = 0; i < T->nactive; i++)
    if (T->active[i] == t) {
      memmove(T->active + i, T->active + i + 1, sizeof(mg_tape *) * (size_t)(T->nactive - i - 1));
      T->nactive--;
      break;
    }
  t->active = false;
  count_recording(t->ctx);
}

static void note_variable_read (mg_variable *v);

mg_tape *mg_tape_new (int persistent, int watch_accessed_variables) {
  mg_tape *t = (mg_tape *)mg_small_alloc(sizeof(mg_tape));
  if (t == NULL) return mg_seterror("out of memory creating a tape"), NULL;
  memset(t, 0, sizeof *t);
  t->ctx = mg_ctx();
  mg_autodiff_install(t->ctx);
  t->refcount = 1;
  t->persistent = persistent != 0;
  t->watch_accessed = watch_accessed_variables != 0;
  if (activate(t) != MG_OK) {
    mg_small_free(t, sizeof *t);
    return NULL;
  }
  return t;
}

mg_tape *mg_tape_retain (mg_tape *t) {
  if (t) t->refcount++;
  return t;
}

static void node_release (mg_node *n);

/* lets go of the nodes and what they saved */
static void drop_record (mg_tape *t) {
  for (size_t i = 0; i < t->nnodes; i++) node_release(t->nodes[i]);   /* NULL-safe */
  t->nnodes = 0;
  idmap_free(&t->tracked);
}

static void drop_variables (mg_tape *t) {
  for (int i = 0; i < t->nvars; i++) mg_variable_release(t->vars[i]);
  t->nvars = 0;
}

mg_status mg_tape_reset (mg_tape *t) {
  MG_CHECK_ARG("mg_tape_reset", t, MG_ERR);
  if (t->walking)
    return mg_seterror("tape:reset: called while this tape's gradient is being computed");
  drop_record(t);
  drop_variables(t);
  t->used = false;
  return MG_OK;
}

void mg_tape_release (mg_tape *t) {
  if (t == NULL || --t->refcount > 0) return;
  if (t->budget) mg_dtr_forget_tape(t);
  deactivate(t);
  drop_record(t);
  drop_variables(t);
  free(t->nodes);
  free(t->vars);
  mg_small_free(t, sizeof *t);
}

void mg_tape_stop (mg_tape *t) { if (t) deactivate(t); }

mg_status mg_tape_start (mg_tape *t) {
  MG_CHECK_ARG("mg_tape_start", t, MG_ERR);
  if (!t->persistent && t->used)
    return mg_seterror("tape: a non-persistent tape cannot record after its gradient was taken");
  return activate(t);
}

void mg_tape_pause (mg_tape *t) {
  if (t == NULL) return;
  t->paused++;
  count_recording(t->ctx);
}

void mg_tape_resume (mg_tape *t) {
  if (t == NULL) return;
  if (t->paused > 0) t->paused--;
  count_recording(t->ctx);
}

int mg_tapes_recording (void) { return tapes()->recording; }

int mg_tape_is_recording (const mg_tape *t) { return t && t->active && t->paused == 0; }
int mg_tape_follows (const mg_tape *t, const mg_tensor *x) {
  return t && x && idmap_has(&t->tracked, x->id);
}
size_t mg_tape_nnodes (const mg_tape *t) { return t ? t->nnodes : 0; }
int mg_tape_nvariables (const mg_tape *t) { return t ? t->nvars : 0; }

mg_variable *mg_tape_variable (const mg_tape *t, int i) {
  MG_CHECK_ARG("mg_tape_variable", t, NULL);
  if (i < 0 || i >= t->nvars)
    return mg_seterror("mg_tape_variable: index %d is out of range (the tape watches %d variables)",
                       i, t->nvars), NULL;
  return t->vars[i];
}

static mg_status track (mg_tape *t, uint64_t id) {
  return idmap_slot(&t->tracked, id) ? MG_OK : MG_ERR;
}

mg_status mg_tape_watch (mg_tape *t, mg_tensor *x) {
  MG_CHECK_ARG("mg_tape_watch", t, MG_ERR);
  MG_CHECK_ARG("mg_tape_watch", x, MG_ERR);
  if (x->var) return mg_tape_watch_variable(t, x->var);
  if (!mg_is_floating(x->dtype)) return MG_OK;
  mg_autocast_forget_id(t->ctx, x->id);       /* a cast of x made before is not on t */
  return track(t, x->id);
}

/* adds v (retained) to a list unless it is there; *added says whether it
** was; MG_ERR when there is no memory for it */
static mg_status add_variable (mg_variable ***list, int *n, int *cap, mg_variable *v, bool *added) {
  *added = false;
  for (int i = 0; i < *n; i++) if ((*list)[i] == v) return MG_OK;
  if (*n == *cap) {
    int c = *cap ? *cap * 2 : 8;
    mg_variable **a = (mg_variable **)realloc(*list, sizeof(mg_variable *) * (size_t)c);
    if (a == NULL) return mg_seterror("out of memory watching a variable");
    *list = a;
    *cap = c;
  }
  (*list)[(*n)++] = mg_variable_retain(v);
  *added = true;
  return MG_OK;
}

mg_status mg_tape_watch_variable (mg_tape *t, mg_variable *v) {
  MG_CHECK_ARG("mg_tape_watch_variable", t, MG_ERR);
  MG_CHECK_ARG("mg_tape_watch_variable", v, MG_ERR);
  bool added;
  if (!mg_is_floating(v->value->dtype)) return MG_OK;
  if (add_variable(&t->vars, &t->nvars, &t->capvars, v, &added) != MG_OK) return MG_ERR;
  if (added) mg_autocast_forget_id(t->ctx, v->id);    /* a cast of v made before is not on t */
  return added ? track(t, v->id) : MG_OK;
}

bool mg_any_tape_tracks (uint64_t id) {
  mg_tape_state *T = tapes();
  for (int i = 0; i < T->nactive; i++)
    if (idmap_has(&T->active[i]->tracked, id)) return true;
  return false;
}

/* Tapes paused by mg_pause_all, resumed by the matching mg_resume_all. */
mg_status mg_pause_all (void) {
  mg_tape_state *T = tapes();
  if (T->npauses == MG_MAX_PAUSE_DEPTH)
    return mg_seterror("recompute_grad: nested more than %d deep", MG_MAX_PAUSE_DEPTH);
  mg_tape **ts = NULL;
  if (T->nactive > 0 && (ts = (mg_tape **)malloc(sizeof(mg_tape *) * (size_t)T->nactive)) == NULL)
    return mg_seterror("out of memory pausing tapes");
  for (int i = 0; i < T->nactive; i++) {
    ts[i] = mg_tape_retain(T->active[i]);
    T->active[i]->paused++;
  }
  T->pauses[T->npauses].t = ts;
  T->pauses[T->npauses].n = T->nactive;
  T->npauses++;
  count_recording(mg_ctx());
  return MG_OK;
}

void mg_resume_all (void) {
  mg_tape_state *T = tapes();
  if (T->npauses == 0) return;
  T->npauses--;
  for (int i = 0; i < T->pauses[T->npauses].n; i++) {
    mg_tape_resume(T->pauses[T->npauses].t[i]);
    mg_tape_release(T->pauses[T->npauses].t[i]);
  }
  free(T->pauses[T->npauses].t);
  count_recording(mg_ctx());
}

void mg_recompute_enter (void) { tapes()->recompute_depth++; }
void mg_recompute_leave (void) { tapes()->recompute_depth--; }
int mg_is_recomputing (void) { return tapes()->recompute_depth > 0; }

/* loop helpers (a checkpointed loop) say when their body runs, so that a
** layer can ask (the seed's is_in_while_loop) */
void mg_loop_enter (void) { tapes()->loop_depth++; }
void mg_loop_leave (void) { if (tapes()->loop_depth > 0) tapes()->loop_depth--; }
int mg_is_in_loop (void) { return tapes()->loop_depth > 0; }

/* }========================================================== */


/* {================ variable-read watchers =================== */

void mg_watcher_push (mg_var_watcher *w, bool captures) {
  mg_tape_state *T = tapes();
  w->vars = NULL;
  w->n = w->cap = 0;
  w->ts = NULL;
  w->nt = w->capt = 0;
  w->captures = captures;
  w->level = -1;                      /* set once its pause is in place */
  w->failed = false;
  w->prev = T->watchers;
  T->watchers = w;
  T->watching++;
  mg_autodiff_install(mg_ctx());
}

void mg_watcher_pop (mg_var_watcher *w) {
  mg_tape_state *T = tapes();
  mg_assert(T->watchers == w);
  T->watchers = w->prev;
  T->watching--;
}

void mg_watcher_free (mg_var_watcher *w) {
  for (int i = 0; i < w->n; i++) mg_variable_release(w->vars[i]);
  for (int i = 0; i < w->nt; i++) mg_tensor_release(w->ts[i]);
  free(w->vars);
  free(w->ts);
  w->vars = NULL;
  w->ts = NULL;
  w->n = w->cap = w->nt = w->capt = 0;
}

static void watcher_add (mg_var_watcher *w, mg_variable *v) {
  bool added;
  if (add_variable(&w->vars, &w->n, &w->cap, v, &added) != MG_OK) w->failed = true;
}

/* Was x there before w's forward began, for a tape it paused to follow? The
** paused tapes record nothing while it runs, so an id they follow came from
** outside: an argument, or a tensor the forward closes over. */
static bool from_outside (const mg_tape_state *T, const mg_var_watcher *w, const mg_tensor *x) {
  if (w->level < 0 || w->level >= T->npauses || x->var || !mg_is_floating(x->dtype)) return false;
  for (int i = 0; i < T->pauses[w->level].n; i++)
    if (idmap_has(&T->pauses[w->level].t[i]->tracked, x->id)) return true;
  return false;
}

static void capture (mg_var_watcher *w, mg_tensor *x) {
  for (int i = 0; i < w->nt; i++) if (w->ts[i]->id == x->id) return;
  if (w->nt == w->capt) {
    int cap = w->capt ? w->capt * 2 : 8;
    mg_tensor **a = (mg_tensor **)realloc(w->ts, sizeof(mg_tensor *) * (size_t)cap);
    if (a == NULL) {
      w->failed = true;
      return;
    }
    w->ts = a;
    w->capt = cap;
  }
  w->ts[w->nt++] = mg_tensor_retain(x);
}

/* an op read in[]: every watcher notes the variables, and those that
** capture the tensors from outside their forward, up to a paused forward
** that does not (a custom gradient with a context: what it closes over is
** a constant to it, and its node will not read it again in a re-run) */
static void note_inputs (mg_tape_state *T, int nin, mg_tensor *const *in) {
  bool capturing = true;
  for (mg_var_watcher *w = T->watchers; w; w = w->prev) {
    for (int j = 0; j < nin; j++) {
      if (in[j]->var) watcher_add(w, in[j]->var);
      else if (capturing && w->captures && from_outside(T, w, in[j])) capture(w, in[j]);
    }
    if (!w->captures && w->level >= 0) capturing = false;
  }
}

/* the forward of w returned out[0..n): those from outside it are captured
** too (a closed-over tensor returned as it is, read by no op) */
void mg_watcher_note_outputs (mg_var_watcher *w, int n, mg_tensor *const *out) {
  mg_tape_state *T = tapes();
  for (int i = 0; w->captures && i < n; i++)
    if (from_outside(T, w, out[i])) capture(w, out[i]);
}

/* a read of v (variables call it through the context's on_read, so the
** core below the tapes never calls up into them): every watcher sees it;
** tapes that watch accessed variables watch it */
static void note_variable_read (mg_variable *v) {
  mg_tape_state *T = tapes();
  for (mg_var_watcher *w = T->watchers; w; w = w->prev) watcher_add(w, v);
  if (!v->trainable) return;
  for (int i = 0; i < T->nactive; i++)
    if (T->active[i]->paused == 0 && T->active[i]->watch_accessed) mg_tape_watch_variable(T->active[i], v);
}

/* }========================================================== */


/* {======================== recording ======================= */

static bool saves_input (unsigned saves, int j) {
  return (saves & MG_SAVE_INPUTS) == MG_SAVE_INPUTS || (j < 16 && (saves & MG_SAVE_IN(j)));
}

static void keep (mg_tensor **slot, mg_tensor *t) {
  *slot = mg_tensor_retain(t);
  mg_storage_hold(t->storage, MG_ROLE_SAVED, 1);
}

static void unkeep (mg_tensor *t) {
  if (t == NULL) return;
  mg_storage_hold(t->storage, MG_ROLE_SAVED, -1);
  mg_tensor_release(t);
}

/* the record of t: its id, dtype and shape (copied to *shapes, advanced) */
static void meta_of (mg_meta *m, const mg_tensor *t, int64_t **shapes) {
  m->id = t->id;
  m->dtype = t->dtype;
  m->ndim = t->ndim;
  memcpy(*shapes, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  m->shape = *shapes;
  *shapes += t->ndim;
}

static const mg_attr no_attr;

/*
** One block: the node, its metas and saved-tensor slots, the shapes, the
** attributes (only when the op has some) and the needs flags, so a node
** costs what its op records and no more.
*/
/* slot k of n: an input, then an output */
static mg_tensor **slot_at (mg_node *n, int k) { return k < n->nin ? &n->in[k] : &n->out[k - n->nin]; }
static const mg_meta *meta_at (const mg_node *n, int k) {
  return k < n->nin ? &n->in_meta[k] : &n->out_meta[k - n->nin];
}

/* the hooks a node's saved tensors go through: the innermost pushed, for
** ops whose backward needs values only (not recompute's or custom inputs) */
static mg_hooks_ref *hooks_for (const mg_opdef *def) {
  mg_tape_state *T = &mg_ctx()->tapes;
  if (T->hooks == NULL || T->in_hooks || def->free_ext != NULL || def->backward == NULL) return NULL;
  return T->hooks;
}

/* slot k of n holds t: through the hooks when they apply (a variable's
** value stays as it is: the variable holds it anyway; a number is not a
** tensor to the user, as PyTorch's wrapped numbers) */
static mg_status keep_slot (mg_node *n, mg_tensor **slot, mg_tensor *t, int k) {
  mg_hooks_ref *h = n->hooks;
  if (h == NULL || k >= 32 || t->number || t->storage->holds[MG_ROLE_VARIABLE] > 0) {
    keep(slot, t);
    return MG_OK;
  }
  mg_tensor *p = mg_hooks_pack(h, t);
  if (p == NULL) return MG_ERR;
  keep(slot, p);
  mg_tensor_release(p);
  n->packed |= 1u << k;
  return MG_OK;
}

/* what def saves for a node whose inputs a tape followed as `followed` says */
static unsigned saves_of (const mg_opdef *def, const mg_attr *attr, unsigned followed) {
  unsigned saves = def->saves_for ? def->saves_for(attr) : def->saves;
  for (int j = 0; j < MG_GRAD_SAVES; j++)
    if (followed & (1u << j)) saves |= def->grad_saves[j];
  return saves;
}

static bool by_need (const mg_opdef *def) {
  for (int j = 0; j < MG_GRAD_SAVES; j++) if (def->grad_saves[j]) return true;
  return false;
}

static mg_node *node_new (const mg_opdef *def, int nin, mg_tensor *const *in, int nout,
                          mg_tensor *const *out, const mg_attr *attr, void *ext, unsigned followed) {
  size_t dims = 0;
  for (int j = 0; j < nin; j++) dims += (size_t)in[j]->ndim;
  for (int i = 0; i < nout; i++) dims += (size_t)out[i]->ndim;
  size_t size = sizeof(mg_node) + (size_t)(nin + nout) * (sizeof(mg_meta) + sizeof(mg_tensor *))
                + dims * sizeof(int64_t) + (attr ? sizeof(mg_attr) : 0) + (size_t)nin * sizeof(bool);
  mg_node *n = (mg_node *)mg_small_alloc(size);
  if (n == NULL) return mg_seterror("out of memory recording '%s'", def->info.name), NULL;
  mg_ctx()->pace.hold++;                 /* the thread team stays as it is while nodes live */
  n->size = size;
  n->refcount = 0;
  n->def = def;
  n->nin = nin;
  n->nout = nout;
  n->ext = ext;
  n->hooks = hooks_for(def);
  n->packed = 0;
  n->spare = 0;
  n->going = false;
  n->dtr = NULL;
  n->followed = by_need(def) ? followed : ~0u;
  if (n->hooks) mg_hooks_retain(n->hooks);
  n->in_meta = (mg_meta *)(n + 1);
  n->out_meta = n->in_meta + nin;
  n->in = (mg_tensor **)(n->out_meta + nout);
  n->out = n->in + nin;
  int64_t *shapes = (int64_t *)(n->out + nout);
  mg_status st = MG_OK;
  for (int j = 0; j < nin; j++) {
    meta_of(&n->in_meta[j], in[j], &shapes);
    n->in[j] = NULL;
  }
  for (int i = 0; i < nout; i++) {
    meta_of(&n->out_meta[i], out[i], &shapes);
    n->out[i] = NULL;
  }
  unsigned saves = def->saves_with_residuals && nout > 1 ? def->saves_with_residuals   /* the forward made residuals */
                                                        : saves_of(def, attr, n->followed);
  for (int j = 0; j < nin && st == MG_OK; j++)
    if (saves_input(saves, j)) st = keep_slot(n, &n->in[j], in[j], j);
  for (int i = 0; i < nout && st == MG_OK; i++)
    if (i < 16 && (saves & MG_SAVE_OUT(i))) st = keep_slot(n, &n->out[i], out[i], nin + i);
  n->attr = &no_attr;
  if (attr) {
    mg_attr *a = (mg_attr *)shapes;
    *a = *attr;
    n->attr = a;
    shapes = (int64_t *)(a + 1);
  }
  n->needs = (bool *)shapes;
  memset(n->needs, 0, (size_t)nin * sizeof(bool));
  if (st != MG_OK) {                     /* a pack failed: the node goes (ext is the caller's) */
    n->ext = NULL;
    n->refcount = 1;
    node_release(n);
    return NULL;
  }
  return n;
}

static void node_free (mg_node *n);

static void node_release (mg_node *n) {
  if (n == NULL || --n->refcount > 0) return;
  if (n->dtr) mg_dtr_release(n, node_free);   /* and the nodes its provenance held */
  else node_free(n);
}

static void node_free (mg_node *n) {
  for (int k = 0; n->packed && k < n->nin + n->nout && k < 32; k++)
    if (n->packed & (1u << k)) mg_hooks_forget(n->hooks, meta_at(n, k)->id, *slot_at(n, k));
  for (int j = 0; j < n->nin; j++) unkeep(n->in[j]);
  for (int i = 0; i < n->nout; i++) unkeep(n->out[i]);
  mg_hooks_release(n->hooks);
  if (n->def->free_ext) n->def->free_ext(n);
  mg_small_free(n, n->size);
  mg_context *c = mg_ctx();
  if (--c->pace.hold == 0) mg_pace_tick(c);   /* a step's end: the team may change now */
}

static mg_status append (mg_tape *t, mg_node *n) {
  if (t->nnodes == t->capnodes) {
    size_t cap = t->capnodes ? t->capnodes * 2 : 64;
    mg_node **a = (mg_node **)realloc(t->nodes, sizeof(mg_node *) * cap);
    if (a == NULL) return mg_seterror("out of memory recording '%s'", n->def->info.name);
    t->nodes = a;
    t->capnodes = cap;
  }
  t->nodes[t->nnodes++] = n;
  n->refcount++;
  return MG_OK;
}

/* does tape t follow one of these inputs? (reading a variable may make it) */
static bool tape_wants (mg_tape *t, int nin, mg_tensor *const *in) {
  bool hit = false;
  for (int j = 0; j < nin; j++) {
    const mg_tensor *x = in[j];
    if (!mg_is_floating(x->dtype)) continue;
    if (x->var && t->watch_accessed && x->var->trainable) {
      mg_tape_watch_variable(t, x->var);
      hit = true;
    } else if (!hit && idmap_has(&t->tracked, x->id)) {
      hit = true;
    }
  }
  return hit;
}

/* frees ext through the op's free_ext, for an op no tape recorded */
static void free_unrecorded_ext (const mg_opdef *def, void *ext) {
  if (ext == NULL || def->free_ext == NULL) return;
  mg_node tmp;
  memset(&tmp, 0, sizeof tmp);
  tmp.attr = &no_attr;
  tmp.def = def;
  tmp.ext = ext;
  def->free_ext(&tmp);
}

/* takes ownership of ext: the node owns it, or it is freed here when no
** tape recorded the op. Making the node may call user code (a pack hook)
** that stops or releases tapes and tensors: the tapes that want the op and
** its inputs are held until it is recorded. */
mg_status mg_record_ex (const mg_opdef *def, int nin, mg_tensor *const *in, int nout,
                        mg_tensor *const *out, const mg_attr *attr, void *ext, mg_node **node) {
  mg_tape_state *T = tapes();
  if (node) *node = NULL;
  if (T->watching > 0) note_inputs(T, nin, in);
  enum { FEW = 8 };
  mg_tape *few[FEW], **want = few;
  int nwant = 0;
  for (int i = 0; i < T->nactive; i++) {
    mg_tape *t = T->active[i];
    if (t->paused || !tape_wants(t, nin, in)) continue;
    if (nwant == FEW && want == few) {
      want = (mg_tape **)malloc(sizeof(mg_tape *) * (size_t)T->nactive);
      if (want == NULL) return free_unrecorded_ext(def, ext), mg_seterror("out of memory recording '%s'", def->info.name);
      memcpy(want, few, sizeof few);
    }
    want[nwant++] = t;
  }
  if (nwant == 0) return free_unrecorded_ext(def, ext), MG_OK;
  unsigned followed = 0;                /* the inputs a recording tape follows */
  for (int j = 0; j < nin && j < 32; j++)
    for (int i = 0; i < nwant && mg_is_floating(in[j]->dtype) && !(followed & (1u << j)); i++)
      if (idmap_has(&want[i]->tracked, in[j]->id)) followed |= 1u << j;
  bool callouts = T->hooks != NULL;     /* pack hooks: user code may run below */
  for (int i = 0; callouts && i < nwant; i++) mg_tape_retain(want[i]);
  for (int j = 0; callouts && j < nin; j++) mg_tensor_retain(in[j]);
  mg_status st = MG_OK;
  mg_node *n = node_new(def, nin, in, nout, out, attr, ext, followed);
  if (n == NULL) {
    free_unrecorded_ext(def, ext);
    st = MG_ERR;
  } else if (mg_dtr_recording()) {
    st = mg_dtr_attach(n, in);           /* under a memory budget: its provenance */
  }
  if (n != NULL) n->refcount++;        /* ours: letting a tape go below may free its nodes */
  for (int i = 0; i < nwant && st == MG_OK; i++) {
    if (!want[i]->active) continue;     /* stopped by a hook meanwhile */
    st = append(want[i], n);
    for (int k = 0; k < nout && st == MG_OK; k++)
      if (mg_is_floating(out[k]->dtype)) st = track(want[i], out[k]->id);
  }
  for (int j = 0; callouts && j < nin; j++) mg_tensor_release(in[j]);
  for (int i = 0; callouts && i < nwant; i++) mg_tape_release(want[i]);
  if (want != few) free(want);
  if (n != NULL && n->refcount == 1) {     /* recorded nowhere after all, or no more */
    node_release(n);
    n = NULL;
  } else if (n != NULL) {
    n->refcount--;
  }
  if (node && st == MG_OK) *node = n;
  return st;
}

mg_status mg_record (const mg_opdef *def, int nin, mg_tensor *const *in, int nout,
                     mg_tensor *const *out, const mg_attr *attr) {
  return mg_record_ex(def, nin, in, nout, out, attr, NULL, NULL);
}

/* {==================== the dispatcher's hooks ===================== */

/* An op's output joins the tapes that listen (and a save policy's record).
** A save policy may run user code that releases the op's inputs (assigning
** the variable they are the value of): they are held until it is recorded. */
static mg_status after_op (const mg_opcall *c) {
  mg_context *ctx = mg_ctx();
  bool policy = ctx->replay.recording != NULL && c->nout == 1;
  if (!policy && !mg_anyone_listening()) return MG_OK;
  for (int j = 0; policy && j < c->nin; j++) mg_tensor_retain(c->in[j]);
  mg_status st = policy ? mg_replay_note(c->def, c->out[0]) : MG_OK;
  if (st == MG_OK && mg_anyone_listening()) {
    mg_tensor *out[3] = {c->out[0], c->nout > 1 ? c->out[1] : NULL, NULL};
    for (int i = 0; i < c->nres; i++) out[c->nout + i] = c->res[i];     /* residuals: outputs from 1 on */
    st = mg_record(c->def, c->nin, c->in, c->nout + c->nres, out, c->attr);
  }
  for (int j = 0; policy && j < c->nin; j++) mg_tensor_release(c->in[j]);
  return st;
}

/* during a re-run under a save policy: the output the first run kept */
static mg_tensor *before_op (const mg_opcall *c) {
  return mg_replay_take(c->def, c->shape, c->ndim, c->dtype);
}

static bool listening (void) { return mg_anyone_listening(); }

static bool recording (void) { return mg_recording_tapes > 0; }

static bool second_order (void) {
  mg_tape_state *T = tapes();
  if (T->recording > 1) return true;
  for (int i = 0; i < T->nactive; i++)
    if (T->active[i]->paused == 0 && T->active[i]->persistent) return true;
  return false;
}

/* what the tapes keep in a context, when it goes */
static void release_state (mg_context *c) {
  free(c->tapes.active);
  c->tapes.active = NULL;
  c->tapes.nactive = c->tapes.capactive = 0;
}

void mg_autodiff_install (mg_context *c) {
  c->hooks.before = before_op;
  c->hooks.after = after_op;
  c->hooks.listening = listening;
  c->hooks.recording = recording;
  c->hooks.second_order = second_order;
  c->hooks.on_read = note_variable_read;     /* variables tell the tapes of reads */
  c->hooks.release = release_state;
}

/* }========================================================== */


/* the bytes only this tape's nodes keep alive: variables' values are
** theirs, not the tape's */
size_t mg_tape_saved_bytes (const mg_tape *t) {
  if (t == NULL) return 0;
  idmap seen = {0};       /* storages counted once, keyed by address */
  size_t total = 0;
  for (size_t i = 0; i < t->nnodes; i++) {
    mg_node *n = t->nodes[i];
    int ntotal = n ? n->nin + n->nout : 0;
    for (int k = 0; n && (k < ntotal || n->def->saved_extra); k++) {
      /* the saved inputs and outputs, then what the op keeps besides */
      mg_tensor *x = k < n->nin ? n->in[k] : k < ntotal ? n->out[k - n->nin]
                                           : n->def->saved_extra(n, k - ntotal);
      if (k >= ntotal && x == NULL) break;
      if (x == NULL || x->storage->holds[MG_ROLE_VARIABLE] > 0 || x->storage->external) continue;  /* not the tape's */
      void **slot = idmap_slot(&seen, (uint64_t)(uintptr_t)x->storage);
      if (slot == NULL || *slot != NULL) continue;
      *slot = x->storage;
      total += x->storage->nbytes;
    }
  }
  idmap_free(&seen);
  return total;
}

/* }========================================================== */


/* {===================== the reverse walk ==================== */

/* May the walk reuse a gradient's buffer (adding into a sum, or letting a
** rule write over its output gradient)? Not when a tape records the walk
** (a higher-order gradient needs the ops), nor inside a recompute's first
** run: its re-run runs under its own recording tape, and the two must make
** the same ops (a save policy's kept outputs, verify's log), a gradient
** taken inside the function included. */
static bool reuse_allowed (void) {
  const mg_replay_state *r = &mg_ctx()->replay;
  return mg_tapes_recording() == 0 && r->recording == NULL && r->playing == NULL && r->first_runs == 0;
}

/* Does nothing but the walk see gradient t: one reference, its storage's
** only view, held by no tape or variable, and a contiguous floating tensor
** (a buffer the walk may write; half ones too: autocast's gradients) */
static bool walk_alone_sees (const mg_tensor *t) {
  const mg_storage *s = t->storage;
  return t->refcount == 1 && s->refcount == 1 && s->holds[MG_ROLE_SAVED] == 0 && s->holds[MG_ROLE_VARIABLE] == 0 &&
         !s->external && mg_is_floating(t->dtype) && mg_tensor_is_contiguous(t);
}

/* May g be added into acc in place? When acc is a sum only the walk sees
** and the walk may reuse buffers (mg_add_into checks the layouts). */
static bool may_add_in_place (const mg_tensor *acc, const mg_tensor *g) {
  return walk_alone_sees(acc) && g->storage != acc->storage && reuse_allowed();
}

mg_status mg_accumulate (mg_tensor **acc, mg_tensor *g) {
  if (g == NULL) return MG_ERR;
  if (*acc == NULL) {
    *acc = g;
    return MG_OK;
  }
  /* half gradients add in float32 and stay there: a weight autocast cast
  ** once and read many times sums its gradients unrounded (step_back and
  ** collect narrow the sum where a half dtype is wanted) */
  mg_tensor *sum = mg_add(*acc, g);
  mg_tensor_release(g);
  if (sum == NULL) return MG_ERR;
  mg_tensor_release(*acc);
  *acc = sum;
  return MG_OK;
}

/* A walk's map holds the gradients in flight and the results: live bytes,
** which count in the gradient role (the collector's pacing must not take
** a step's weight gradients for garbage that a collection could find). */
static void grad_hold (mg_tensor *g, int delta) {
  if (g) mg_storage_hold(g->storage, MG_ROLE_GRADIENT, delta);
}

/* adds g to the gradient in the map's slot (takes g) */
static mg_status grads_add (void **slot, mg_tensor *g) {
  mg_tensor *acc = (mg_tensor *)*slot;
  if (acc && g && may_add_in_place(acc, g) && mg_add_into(acc, g)) {   /* no tensor per add; the role stays */
    mg_tensor_release(g);
    return MG_OK;
  }
  grad_hold(acc, -1);
  mg_status st = mg_accumulate(&acc, g);
  grad_hold(acc, 1);
  *slot = acc;
  return st;
}

static void grads_drop (void **slot) {
  grad_hold((mg_tensor *)*slot, -1);
  mg_tensor_release((mg_tensor *)*slot);
  *slot = NULL;
}

void mg_release_grads (idmap *g) {
  for (size_t i = 0; i < g->cap; i++)
    if (g->vals[i]) grads_drop(&g->vals[i]);
  idmap_free(g);
}

static mg_status check_seed (const mg_tensor *target, const mg_tensor *seed, int k) {
  char a[160], b[160];
  if (!mg_same_shape(seed->shape, seed->ndim, target->shape, target->ndim))
    return mg_seterror("tape:gradient: output_gradients[" MG_POS1 "] has shape %s, its target has %s", (long long)k,
                       mg_shape_str(a, sizeof a, seed->shape, seed->ndim),
                       mg_shape_str(b, sizeof b, target->shape, target->ndim));
  /* a float seed of another float dtype (float32 for autocast's bfloat16) is
  ** cast where the walk hands it to a rule (step_back) */
  if (seed->dtype != target->dtype && !(mg_is_floating(seed->dtype) && mg_is_floating(target->dtype)))
    return mg_seterror("tape:gradient: output_gradients[" MG_POS1 "] is %s, its target is %s", (long long)k,
                       mg_dtype_name(seed->dtype), mg_dtype_name(target->dtype));
  return MG_OK;
}

/* "tape:gradient: in the backward of 'mul': <why>": where a rule failed */
static mg_status locate (const char *fn, const mg_node *n) {
  char msg[512];
  const char *budget = mg_dtr_take_failure();   /* what a NULL argument came from */
  const mg_context *c = mg_ctx();               /* a rule passes on NULL only from an op that failed */
  const char *root = c->error.null_chain && c->error.cause[0] ? c->error.cause : mg_errmsg_raw();
  snprintf(msg, sizeof msg, "%s", budget ? budget : root);
  return mg_seterror("tape:%s: in the backward of '%s': %s", fn, n->def->info.name, msg);
}

/* what unpack gave, as the tensor that was saved: a view of it carrying the
** saved tensor's id, so that a tape recording the backward (a higher-order
** gradient) connects the rule's ops to the ops that made the saved tensor */
static mg_tensor *as_saved (mg_tensor *t, uint64_t id) {
  if (t == NULL || t->id == id) return t;
  mg_tensor *v = mg_tensor_view(t->storage, t->dtype, t->shape, t->ndim, t->strides, t->offset);
  mg_tensor_release(t);
  if (v) v->id = id;
  return v;
}

/* the backward rule sees the tensors themselves: each packed slot holds its
** unpacked tensor while the rule runs (packed[k] keeps the stand-in) */
static mg_status unpack_all (mg_node *n, mg_tensor **packed) {
  for (int k = 0; k < n->nin + n->nout && k < 32; k++) {
    if (!(n->packed & (1u << k))) continue;
    mg_tensor **slot = slot_at(n, k);
    const mg_meta *m = meta_at(n, k);
    mg_tensor *t = as_saved(mg_hooks_unpack(n->hooks, *slot, m), m->id);
    if (t == NULL) {
      while (k-- > 0)
        if (n->packed & (1u << k)) { mg_tensor_release(*slot_at(n, k)); *slot_at(n, k) = packed[k]; }
      return MG_ERR;
    }
    packed[k] = *slot;
    *slot = t;
  }
  return MG_OK;
}

static void repack_all (mg_node *n, mg_tensor **packed) {
  for (int k = 0; k < n->nin + n->nout && k < 32; k++) {
    if (!(n->packed & (1u << k))) continue;
    mg_tensor **slot = slot_at(n, k);
    mg_tensor_release(*slot);
    *slot = packed[k];
  }
}

/* May the rule write over its output gradient g? When only the walk sees
** it, the walk drops it after the rule (not a gradient the caller asked
** for) and may reuse buffers: as may_add_in_place's sums */
static bool spare_gradient (const mg_tensor *g, uint64_t id, const idmap *keep_ids) {
  return walk_alone_sees(g) && !idmap_has(keep_ids, id) && reuse_allowed();
}

/* Is g a float32 sum of gradients of a tensor of half dtype dt? The map
** keeps such sums unrounded; a rule that takes any gradient dtype (a
** recompute's, handing on its re-run's sums) may give one back, and it is
** rounded once, where it is read, as the plain walk's own sums are. */
static bool half_sum (const mg_tensor *g, mg_dtype dt) { return g->dtype == MG_FLOAT32 && mg_is_half(dt); }

/* a linked-outputs node's whole gradient at output i (see mg_opdef) */
static mg_status replace_gradient (idmap *grads, const mg_node *n, int i, mg_tensor **g) {
  const mg_meta *m = &n->out_meta[i];
  bool sum = n->def->any_gradient_dtype && half_sum(*g, m->dtype);
  if (!mg_same_shape((*g)->shape, (*g)->ndim, m->shape, m->ndim) || ((*g)->dtype != m->dtype && !sum))
    return mg_seterror("the backward of '%s' gave output " MG_POS1 " a gradient of another shape or dtype",
                       n->def->info.name, (long long)i);
  void **slot = idmap_slot(grads, m->id);
  if (slot == NULL) return MG_ERR;
  if (*slot) grads_drop(slot);
  mg_status st = grads_add(slot, *g);
  *g = NULL;
  return st;
}

/* runs node n's backward rule and adds what it gives to the map */
static mg_status step_back (mg_node *n, idmap *grads, const idmap *dep, const idmap *keep_ids, bool going,
                            const char *fn) {
  mg_tensor *dout_small[4], *din_small[8];
  int ndin = n->nin + (n->def->linked_outputs ? n->nout : 0);
  mg_tensor **dout = n->nout <= 4 ? dout_small : (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)n->nout);
  mg_tensor **din = ndin <= 8 ? din_small : (mg_tensor **)calloc((size_t)ndin, sizeof(mg_tensor *));
  mg_status st = MG_OK;
  unsigned narrowed = 0;                   /* dout[i] the walk cast for the rule: its own */
  if (dout == NULL || din == NULL) {
    st = mg_seterror("out of memory in the backward of '%s'", n->def->info.name);
    goto done;
  }
  n->spare = 0;
  n->going = going;
  n->shortcuts = reuse_allowed();
  for (int i = 0; i < n->nout; i++) {
    dout[i] = (mg_tensor *)idmap_get(grads, n->out_meta[i].id);
    if (dout[i] && dout[i]->dtype != n->out_meta[i].dtype && !n->def->any_gradient_dtype && i < 32) {
      /* a float32 sum of half gradients (grads_add): the rule gets its output's dtype */
      if ((dout[i] = mg_cast(dout[i], n->out_meta[i].dtype)) == NULL) {
        st = locate(fn, n);
        goto done;
      }
      narrowed |= 1u << i;
    }
    if (n->def->reuses_gradient && i < 32 && dout[i] && spare_gradient(dout[i], n->out_meta[i].id, keep_ids))
      n->spare |= 1u << i;
  }
  unsigned handed = 0;                     /* gradients out of the map, the rule's (takes_gradient) */
  for (int i = 0; n->def->takes_gradient && i < n->nout && i < 32; i++) {
    if (!(n->spare & (1u << i))) continue;
    if (narrowed & (1u << i)) {
      narrowed &= ~(1u << i);              /* the walk's own cast: the rule's now */
    } else {
      void **slot = idmap_slot(grads, n->out_meta[i].id);
      if (slot == NULL || *slot != dout[i]) { n->spare &= ~(1u << i); continue; }
      grad_hold(dout[i], -1);
      *slot = NULL;                        /* the map's reference, the rule's now */
    }
    handed |= 1u << i;
  }
  n->out_sources = 0;
  for (int i = 0; n->def->linked_outputs && i < n->nout && i < 32; i++)
    if (idmap_has(keep_ids, n->out_meta[i].id) && mg_is_floating(n->out_meta[i].dtype)) n->out_sources |= 1u << i;
  for (int j = 0; j < ndin; j++) din[j] = NULL;
  for (int j = 0; j < n->nin; j++) {
    n->needs[j] = mg_is_floating(n->in_meta[j].dtype) && idmap_has(dep, n->in_meta[j].id) &&
                  (j >= 32 || (n->followed & (1u << j)));
  }
  mg_tensor *packed[32];
  mg_dtr_take_failure();                   /* a refusal from before is not this rule's */
  st = n->dtr ? mg_dtr_pin(n) : MG_OK;     /* under a budget: evicted tensors rebuilt */
  bool pinned = n->dtr && st == MG_OK;
  if (st == MG_OK) st = n->packed ? unpack_all(n, packed) : MG_OK;
  if (st == MG_OK) {
    handed = 0;                            /* the rule releases or passes them on */
    st = n->def->backward(n, dout, din);
    if (n->packed) repack_all(n, packed);
  }
  mg_release_masked(n->nout, dout, handed);     /* handed over to a rule that did not run */
  n->spare = 0;
  n->going = false;
  if (pinned) mg_dtr_unpin(n);
  if (st != MG_OK) st = locate(fn, n);
  for (int j = 0; j < n->nin && st == MG_OK; j++) {
    if (!n->needs[j]) continue;
    if (din[j] == NULL) {
      st = locate(fn, n);
      break;
    }
    const mg_meta *m = &n->in_meta[j];
    bool sum = n->def->any_gradient_dtype && half_sum(din[j], m->dtype);   /* kept: see half_sum */
    if (din[j]->dtype != m->dtype && !sum && mg_is_floating(din[j]->dtype) && mg_is_floating(m->dtype)) {
      /* a rule whose float32 sums met a bfloat16 input (autocast): the
      ** gradient goes on in the input's dtype */
      mg_tensor *g = mg_cast(din[j], m->dtype);
      mg_tensor_release(din[j]);
      if ((din[j] = g) == NULL) { st = locate(fn, n); break; }
    }
    if (!mg_same_shape(din[j]->shape, din[j]->ndim, m->shape, m->ndim) || (din[j]->dtype != m->dtype && !sum)) {
      char a[160], b[160];
      st = mg_seterror("tape:%s: the backward of '%s' gave input " MG_POS1 " a gradient %s %s for %s %s",
                       fn, n->def->info.name, (long long)j, mg_shape_str(a, sizeof a, din[j]->shape, din[j]->ndim),
                       mg_dtype_name(din[j]->dtype), mg_shape_str(b, sizeof b, m->shape, m->ndim),
                       mg_dtype_name(m->dtype));
      break;
    }
    void **slot = idmap_slot(grads, m->id);
    if (slot == NULL) { st = MG_ERR; break; }
    st = grads_add(slot, din[j]);
    din[j] = NULL;
  }
  for (int i = 0; i < n->nout && i < 32 && st == MG_OK; i++)
    if ((n->out_sources & (1u << i)) && din[n->nin + i]) st = replace_gradient(grads, n, i, &din[n->nin + i]);
  for (int j = 0; j < ndin; j++) mg_tensor_release(din[j]);
done:
  for (int i = 0; i < n->nout && i < 32; i++)
    if (narrowed & (1u << i)) mg_tensor_release(dout[i]);
  if (dout != dout_small) free(dout);
  if (din != din_small) free(din);
  return st;
}

/* {---- ready hooks: when a source's gradient is whole ----

** A source's gradient is whole once the walk (which runs the nodes last to
** first) has run the earliest node that reads it, or, when no node reads
** it (a target that is its own source), once the seeds are in. Sources are
** listed by that node: first[i] heads the list for node i, first[nnodes]
** the seeds'. */
typedef struct ready_lists {
  const mg_gradient_hooks *hooks;
  char *taken;
  int *first, *next;          /* nnodes + 1 heads; one link per source; -1 ends */
  idmap still_needed;         /* ids a node made or a target is: their gradient flows on, never taken */
} ready_lists;

static mg_status ready_build (ready_lists *r, const mg_tape *t, int ntargets, mg_tensor *const *targets,
                              int nsources, mg_tensor *const *sources, const idmap *dep) {
  idmap earliest = {0};       /* source id -> 1 + the earliest node that adds to its gradient */
  idmap ids = {0};            /* the sources' ids */
  mg_status st = MG_OK;
  r->first = (int *)malloc(sizeof(int) * (t->nnodes + 1 + (size_t)nsources));
  if (r->first == NULL) return mg_seterror("out of memory in tape:gradient");
  r->next = r->first + t->nnodes + 1;
  for (size_t i = 0; i <= t->nnodes; i++) r->first[i] = -1;
  for (int s = 0; s < nsources && st == MG_OK; s++)
    if (idmap_slot(&ids, sources[s]->id) == NULL) st = MG_ERR;
  for (int k = 0; k < ntargets && st == MG_OK; k++)
    if (idmap_has(&ids, targets[k]->id) && idmap_slot(&r->still_needed, targets[k]->id) == NULL) st = MG_ERR;
  for (size_t i = 0; i < t->nnodes && st == MG_OK; i++) {
    const mg_node *n = t->nodes[i];
    for (int k = 0; k < n->nout && st == MG_OK; k++)   /* a source a node made: its maker needs its gradient */
      if (idmap_has(&ids, n->out_meta[k].id) && idmap_slot(&r->still_needed, n->out_meta[k].id) == NULL) st = MG_ERR;
    int nk = n->nin + (n->def->linked_outputs ? n->nout : 0);
    for (int k = 0; k < nk && st == MG_OK; k++) {
      const mg_meta *m = meta_at(n, k);
      bool reads = k >= n->nin || k >= 32 || (n->followed & (1u << k));
      if (!reads || !idmap_has(dep, m->id)) continue;
      void **slot = idmap_slot(&earliest, m->id);
      if (slot == NULL) st = MG_ERR;
      else if (*slot == NULL) *slot = (void *)(uintptr_t)(i + 1);     /* i rises: the first is the earliest */
    }
  }
  for (int s = nsources; s-- > 0 && st == MG_OK;) {
    if (!idmap_has(dep, sources[s]->id)) continue;   /* unconnected: no call */
    uintptr_t e = (uintptr_t)idmap_get(&earliest, sources[s]->id);
    size_t at = e ? e - 1 : t->nnodes;
    r->next[s] = r->first[at];
    r->first[at] = s;
  }
  idmap_free(&earliest);
  idmap_free(&ids);
  return st;
}

/* the sources listed at node i (or the seeds') are whole: hand them to ready */
static mg_status ready_call (ready_lists *r, size_t i, idmap *grads, mg_tensor *const *sources, const char *fn) {
  for (int s = r->first[i]; s >= 0; s = r->next[s]) {
    mg_tensor *g = (mg_tensor *)idmap_get(grads, sources[s]->id);
    int take = 0;
    if (g == NULL) continue;
    if (r->hooks->ready(r->hooks->ud, s, g, &take) != MG_OK) {
      char why[600];
      snprintf(why, sizeof why, "%s", mg_errmsg_raw());
      return mg_seterror("tape:%s: %s", fn, why);
    }
    if (take && !idmap_has(&r->still_needed, sources[s]->id)) r->taken[s] = 1;
  }
  for (int s = r->first[i]; s >= 0; s = r->next[s]) {   /* after every call: sources may repeat */
    void **slot = r->taken[s] ? idmap_slot(grads, sources[s]->id) : NULL;
    if (slot && *slot) grads_drop(slot);
  }
  return MG_OK;
}

/* }---- */

/*
** The walk: grads gets, for each source id, d(sum of targets · seeds)/d
** source. Only nodes downstream of a source are visited, and a node's
** output gradients are dropped once it has passed them on. With
** free_as_you_go (a non-persistent tape's one gradient) each node goes as
** soon as the walk is past it, so saved tensors are freed during the
** backward pass rather than after it, which lowers its peak.
*/
mg_status mg_walk (mg_tape *t, int ntargets, mg_tensor *const *targets,
                   mg_tensor *const *seeds, unsigned given, int nsources, mg_tensor *const *sources,
                   idmap *grads, bool free_as_you_go, const mg_gradient_hooks *hooks, char *taken,
                   const char *fn) {
  idmap dep = {0}, keep_ids = {0};
  unsigned owned = given;                      /* given seeds not yet in the map */
  bool *relevant = NULL, small_relevant[256];
  ready_lists ready = {hooks, taken, NULL, NULL, {0}};
  mg_status st = MG_OK;
  mg_dtr_walk(1);
  for (int s = 0; s < nsources && st == MG_OK; s++)    /* sources the tape never saw stay unconnected */
    if (mg_is_floating(sources[s]->dtype) && idmap_has(&t->tracked, sources[s]->id))
      st = idmap_slot(&dep, sources[s]->id) && idmap_slot(&keep_ids, sources[s]->id) ? MG_OK : MG_ERR;
  if (st != MG_OK) goto done;
  relevant = t->nnodes < 256 ? small_relevant : (bool *)malloc(t->nnodes + 1);
  if (relevant == NULL) { st = mg_seterror("out of memory in tape:gradient"); goto done; }
  memset(relevant, 0, t->nnodes + 1);
  for (size_t i = 0; i < t->nnodes; i++) {     /* which nodes a source reaches */
    mg_node *n = t->nodes[i];
    for (int j = 0; j < n->nin && !relevant[i]; j++)
      relevant[i] = mg_is_floating(n->in_meta[j].dtype) && idmap_has(&dep, n->in_meta[j].id) &&
                    (j >= 32 || (n->followed & (1u << j)));
    for (int k = 0; n->def->linked_outputs && k < n->nout && !relevant[i]; k++)
      relevant[i] = idmap_has(&keep_ids, n->out_meta[k].id);   /* an output is a source */
    for (int k = 0; relevant[i] && k < n->nout; k++)
      if (idmap_slot(&dep, n->out_meta[k].id) == NULL) { st = MG_ERR; goto done; }
  }
  for (int k = 0; k < ntargets; k++) {         /* seeds */
    const mg_tensor *y = targets[k];
    /* a target this tape never recorded (computed before it started, after
    ** it stopped, or from nothing it watches) reaches no source: as in
    ** TensorFlow, its sources are unconnected, not an error */
    if (!mg_is_floating(y->dtype) || !idmap_has(&t->tracked, y->id)) continue;
    bool mine = k < 32 && (owned & (1u << k));
    owned &= ~(mine ? 1u << k : 0u);
    mg_tensor *seed = mine ? seeds[k] : seeds && seeds[k] ? mg_tensor_retain(seeds[k])
                                                         : mg_full(y->shape, y->ndim, y->dtype, 1.0);
    if (seed == NULL) { st = MG_ERR; goto done; }
    void **slot = idmap_slot(grads, y->id);
    if (slot == NULL) mg_tensor_release(seed);
    if (slot == NULL || grads_add(slot, seed) != MG_OK) { st = MG_ERR; goto done; }
  }
  if (hooks && hooks->ready) {
    if ((st = ready_build(&ready, t, ntargets, targets, nsources, sources, &dep)) != MG_OK) goto done;
    if ((st = ready_call(&ready, t->nnodes, grads, sources, fn)) != MG_OK) goto done;
  }
  for (size_t i = t->nnodes; i-- > 0;) {
    mg_node *n = t->nodes[i];
    bool any = false;
    for (int k = 0; relevant[i] && k < n->nout && !any; k++)
      any = idmap_get(grads, n->out_meta[k].id) != NULL;
    if (any && (st = step_back(n, grads, &dep, &keep_ids, free_as_you_go && n->refcount == 1, fn)) != MG_OK) goto done;
    for (int k = 0; any && k < n->nout; k++) {   /* passed on: drop unless asked for */
      uint64_t id = n->out_meta[k].id;
      if (idmap_has(&keep_ids, id)) continue;
      void **slot = idmap_slot(grads, id);
      if (slot) grads_drop(slot);
    }
    if (free_as_you_go) {                        /* nothing before it needs what it saved */
      t->nodes[i] = NULL;
      node_release(n);
    }
    if (ready.first && (st = ready_call(&ready, i, grads, sources, fn)) != MG_OK) goto done;
    if (any && hooks && hooks->tick) hooks->tick(hooks->ud);
    if (any && mg_interrupted()) {
      st = mg_seterror("tape:%s: interrupted", fn);
      goto done;
    }
    if (any) mg_memory_safe_point();
  }
done:
  mg_release_masked(ntargets, seeds, owned);     /* given, never seeded (an error, a target not recorded) */
  if (mg_dtr_walk_end() != MG_OK && st == MG_OK) {   /* a step short of its budget */
    char why[600];
    snprintf(why, sizeof why, "%s", mg_errmsg_raw());
    st = mg_seterror("tape:%s: %s", fn, why);
  }
  if (relevant != small_relevant) free(relevant);
  free(ready.first);
  idmap_free(&ready.still_needed);
  idmap_free(&dep);
  idmap_free(&keep_ids);
  return st;
}

mg_status mg_tape_check_usable (const mg_tape *t, const char *fn) {
  if (!t->persistent && t->used)
    return mg_seterror("tape:%s: a non-persistent tape can only compute one gradient; "
                       "create it with mg.tape{persistent=true} to call it again", fn);
  return MG_OK;
}

/* after a gradient, a non-persistent tape lets go of everything it saved
** (it still lists the variables it watched) */
void mg_tape_consume (mg_tape *t) {
  if (t->persistent) return;
  t->used = true;
  deactivate(t);
  drop_record(t);
}

/* tape_gradient's flags: unconnected sources get zeros; half sources get
** the walk's float32 sums as they are (collect) */
enum { UNCONNECTED_ZERO = 1, KEEP_SUMS = 2 };

/* sets grads[s] from the map, as zeros or NULL when unconnected */
static mg_status collect (idmap *map, int nsources, mg_tensor *const *sources, int flags, mg_tensor **grads) {
  int zero = flags & UNCONNECTED_ZERO;
  for (int s = 0; s < nsources; s++) {
    mg_tensor *g = mg_is_floating(sources[s]->dtype) ? (mg_tensor *)idmap_get(map, sources[s]->id) : NULL;
    /* a float32 sum of half gradients goes back to their dtype, unless the
    ** caller (a recompute's rule) hands it on to a walk that goes on summing */
    if (g != NULL)
      grads[s] = g->dtype == sources[s]->dtype || ((flags & KEEP_SUMS) && half_sum(g, sources[s]->dtype))
                 ? mg_tensor_retain(g) : mg_cast(g, sources[s]->dtype);
    else
      grads[s] = zero ? mg_full(sources[s]->shape, sources[s]->ndim, sources[s]->dtype, 0.0) : NULL;
    if ((zero || g != NULL) && grads[s] == NULL) {
      for (int k = 0; k < s; k++) { mg_tensor_release(grads[k]); grads[k] = NULL; }
      return MG_ERR;
    }
  }
  return MG_OK;
}

/* n tensors of an argument array: present, and not NULL */
static mg_status check_array (const char *fn, const char *name, int n, mg_tensor *const *xs) {
  if (n < 0) return mg_seterror("%s: the count for '%s' is negative (%d)", fn, name, n);
  if (n > 0 && xs == NULL) return mg_null_arg(fn, name);
  for (int i = 0; i < n; i++)
    if (xs[i] == NULL) return mg_seterror("%s: %s[%d] is NULL", fn, name, i);
  return MG_OK;
}

mg_status mg_walk_begin (mg_held *h, mg_tape *t, const char *fn, int na, mg_tensor *const *a,
                         int nb, mg_tensor *const *b, int nc, mg_tensor *const *c, unsigned c_not_held) {
  if (t->walking)
    return mg_seterror("tape:%s: called while this tape's gradient is being computed", fn);
  int most = na + nb + nc;
  h->xs = most <= 8 ? h->small : (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)most);
  if (h->xs == NULL) return mg_seterror("out of memory in tape:%s", fn);
  h->n = 0;
  for (int i = 0; i < na; i++) h->xs[h->n++] = mg_tensor_retain(a[i]);
  for (int i = 0; i < nb; i++) h->xs[h->n++] = mg_tensor_retain(b[i]);
  for (int i = 0; c && i < nc; i++)
    if (c[i] && !(i < 32 && (c_not_held & (1u << i)))) h->xs[h->n++] = mg_tensor_retain(c[i]);
  h->t = mg_tape_retain(t);
  t->walking++;
  /* A persistent tape still recording records its own backward pass, as
  ** TensorFlow's does (a second order from one tape); a non-persistent one
  ** is done once it gives its gradient. */
  h->paused = !t->persistent;
  if (h->paused) mg_tape_pause(t);
  h->autocast_off = mg_autocast_dtype() != MG_FLOAT32 && mg_autocast_push(MG_FLOAT32) == MG_OK;
  return MG_OK;
}

void mg_walk_end (mg_held *h) {
  if (h->autocast_off) mg_autocast_pop();
  if (h->paused) mg_tape_resume(h->t);
  h->t->walking--;
  for (int i = 0; i < h->n; i++) mg_tensor_release(h->xs[i]);
  if (h->xs != h->small) free(h->xs);
  mg_tape_release(h->t);
}

mg_status mg_tape_gradient (mg_tape *t, int ntargets, mg_tensor *const *targets, int nsources,
                            mg_tensor *const *sources, mg_tensor *const *out_grads,
                            int unconnected_zero, mg_tensor **grads) {
  return mg_tape_gradient_hooked(t, ntargets, targets, nsources, sources, out_grads, unconnected_zero, NULL, grads);
}

void mg_release_masked (int n, mg_tensor *const *ts, unsigned mask) {
  for (int k = 0; k < n && k < 32; k++)
    if (mask & (1u << k)) mg_tensor_release(ts[k]);
}

/* releases the given seeds (as mg_walk's) and returns MG_ERR: a gradient
** that fails before its walk still owns them */
static mg_status drop_given (int ntargets, mg_tensor *const *seeds, unsigned given) {
  mg_release_masked(ntargets, seeds, given);
  return MG_ERR;
}

static mg_status tape_gradient (mg_tape *t, int ntargets, mg_tensor *const *targets, int nsources,
                                mg_tensor *const *sources, mg_tensor *const *out_grads, unsigned given,
                                int flags, const mg_gradient_hooks *hooks, mg_tensor **grads) {
  const char *fn = "mg_tape_gradient";
  if (grads == NULL && nsources > 0) return mg_null_arg(fn, "grads"), drop_given(ntargets, out_grads, given);
  for (int s = 0; s < nsources; s++) grads[s] = NULL;
  if (t == NULL) return mg_null_arg(fn, "t"), drop_given(ntargets, out_grads, given);
  if (check_array(fn, "targets", ntargets, targets) != MG_OK ||
      check_array(fn, "sources", nsources, sources) != MG_OK)
    return drop_given(ntargets, out_grads, given);
  if (mg_tape_check_usable(t, "gradient") != MG_OK) return drop_given(ntargets, out_grads, given);
  for (int k = 0; k < ntargets; k++) {
    if (out_grads && out_grads[k] && check_seed(targets[k], out_grads[k], k) != MG_OK)
      return drop_given(ntargets, out_grads, given);
  }
  /* the walk holds the seeds it was not given (a given one is the map's alone:
  ** a rule may write over it) */
  mg_held h = {0};
  if (mg_walk_begin(&h, t, "gradient", ntargets, targets, nsources, sources, ntargets, out_grads, given) != MG_OK)
    return drop_given(ntargets, out_grads, given);
  idmap map = {0};
  char *taken = hooks && hooks->ready ? (char *)calloc((size_t)nsources + 1, 1) : NULL;
  mg_status st = hooks && hooks->ready && taken == NULL ? mg_seterror("out of memory in tape:gradient") : MG_OK;
  if (st != MG_OK) drop_given(ntargets, out_grads, given);
  mg_memory_span("backward", 1);
  if (st == MG_OK)
    st = mg_walk(t, ntargets, targets, out_grads, given, nsources, sources, &map, !t->persistent, hooks, taken,
                 "gradient");
  mg_memory_span("backward", 0);
  if (st == MG_OK) st = collect(&map, nsources, sources, flags, grads);
  for (int s = 0; st == MG_OK && taken && s < nsources; s++)
    if (taken[s]) { mg_tensor_release(grads[s]); grads[s] = NULL; }
  free(taken);
  mg_release_grads(&map);
  mg_tape_consume(t);                        /* even after a failure: its nodes may be gone */
  mg_walk_end(&h);                      /* last: it may drop the final reference to t */
  return st;
}

mg_status mg_tape_gradient_hooked (mg_tape *t, int ntargets, mg_tensor *const *targets, int nsources,
                                   mg_tensor *const *sources, mg_tensor *const *out_grads,
                                   int unconnected_zero, const mg_gradient_hooks *hooks, mg_tensor **grads) {
  return tape_gradient(t, ntargets, targets, nsources, sources, out_grads, 0, unconnected_zero ? UNCONNECTED_ZERO : 0,
                       hooks, grads);
}

mg_status mg_tape_gradient_given (mg_tape *t, int ntargets, mg_tensor *const *targets, int nsources,
                                  mg_tensor *const *sources, mg_tensor *const *seeds, unsigned given,
                                  mg_tensor **grads) {
  return tape_gradient(t, ntargets, targets, nsources, sources, seeds, given, KEEP_SUMS, NULL, grads);
}

/* }========================================================== */

/*
** recompute.c — gradient checkpointing (tf.recompute_grad), driven by C
** callbacks.
**
** mg_recompute_call runs the host's forward with the tapes paused, noting
** the variables it reads and the tensors from outside it that a tape
** follows (those it closes over), and records one node whose inputs are
** the distinct input tensors, those tensors and those variables, holding
** only them. A closed-over tensor is read again through the closure by
** the re-run, and gets its gradient as an argument does (PyTorch's
** non-reentrant checkpoint and JAX get it; TF2 drops it). Its
** backward rule runs the forward again under a fresh local tape, exactly
** as it ran the first time: the same input tensors (the node kept them),
** the random state of the call restored (dropout masks match), the
** variables showing the values they had then (the node kept those too), and
** mg_is_recomputing() true. Then it takes that tape's gradient seeded with
** the incoming output gradients. Tapes still recording see the re-run and
** its backward pass, so second-order gradients through it are right.
*/
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

typedef struct recompute_ext {
  const mg_function *fn;
  void *ud;
  mg_rng_state rng;            /* the random state when the forward first ran */
  mg_dtype autocast;           /* the autocast it ran under: the re-run runs under it too */
  int nargs;                   /* the forward's inputs, repeats included ... */
  int *argmap;                 /* ... input k is node input argmap[k] */
  int ninputs;                 /* node inputs: the distinct tensors, then variables */
  int first_captured, ncaptured; /* node inputs [first, first + n): tensors f closed over */
  mg_variable **var_of;        /* [ninputs]: the variable whose value input j was, retained */
  mg_replay *kept;             /* outputs a save policy kept, or NULL */
  int loop_depth;              /* mg_is_in_loop's depth at the call, for the re-run */
  double *digest;              /* [2 nout]: each float output's sum and sum of magnitudes */
  mg_verify_log *verify;       /* verified: the first run's ops (verify.c), or NULL */
} recompute_ext;

static void recompute_free (mg_node *n) {
  recompute_ext *e = (recompute_ext *)n->ext;
  if (e->fn->release) e->fn->release(e->ud);
  for (int j = 0; e->var_of && j < e->ninputs; j++) mg_variable_release(e->var_of[j]);
  free(e->var_of);
  free(e->argmap);
  free(e->digest);
  mg_replay_free(e->kept);
  mg_verify_free(e->verify);
  free(e);
}

/* {====================== the backward ====================== */

/* Variables show the values they had at the call while the forward runs
** again (an optimizer may have assigned them since): swaps them in, or
** back when restore is set. */
static void swap_values (mg_node *n, recompute_ext *e, mg_tensor **kept, bool restore) {
  for (int j = 0; j < e->ninputs; j++) {
    mg_variable *v = e->var_of[j];
    if (v == NULL) continue;
    if (!restore) {
      kept[j] = v->value == n->in[j] ? NULL : mg_variable_exchange(v, n->in[j]);
    } else if (kept[j] != NULL) {
      mg_tensor_release(mg_variable_exchange(v, kept[j]));
      mg_tensor_release(kept[j]);
    }
  }
}

static void digest_f32 (const float *p, int64_t n, double *sum, double *mag) {
  double s = 0, m = 0;
  #pragma omp simd reduction(+:s, m)             /* any order: the check has a tolerance */
  for (int64_t i = 0; i < n; i++) { double v = p[i]; s += v; m += fabs(v); }
  *sum = s;
  *mag = m;
}

static void digest_f64 (const double *p, int64_t n, double *sum, double *mag) {
  double s = 0, m = 0;
  #pragma omp simd reduction(+:s, m)
  for (int64_t i = 0; i < n; i++) { s += p[i]; m += fabs(p[i]); }
  *sum = s;
  *mag = m;
}

/* A float tensor's sum and sum of magnitudes, in float64: enough to tell a
** re-run that computes something else (PyTorch checks what a re-run saves;
** here what it gives) without keeping the outputs. */
static mg_status digest (mg_tensor *t, double *sum, double *mag) {
  *sum = *mag = 0;
  if (!mg_is_floating(t->dtype) || mg_dry_running()) return MG_OK;   /* a dry run has no values */
  mg_tensor *c = mg_contiguous(t);
  if (c == NULL) return MG_ERR;
  const char *p = (const char *)mg_tensor_data(c);
  if (c->dtype == MG_FLOAT32 || c->dtype == MG_FLOAT64) {   /* (a digest every call: it must be quick) */
    if (c->dtype == MG_FLOAT32) digest_f32((const float *)p, c->numel, sum, mag);
    else digest_f64((const double *)p, c->numel, sum, mag);
    mg_tensor_release(c);
    return MG_OK;
  }
  double buf[256];
  for (int64_t i = 0; i < c->numel; i += 256) {
    int64_t m = c->numel - i < 256 ? c->numel - i : 256;
    mg_convert(buf, MG_FLOAT64, p + (size_t)i * mg_dtype_size(c->dtype), c->dtype, m);
    for (int64_t k = 0; k < m; k++) { *sum += buf[k]; *mag += fabs(buf[k]); }
  }
  mg_tensor_release(c);
  return MG_OK;
}

/* the same values within what a change of summation order (threads) moves */
static bool same_digest (double a, double b, double scale, mg_dtype dt) {
  double tol = dt == MG_FLOAT64 ? 1e-9 : dt == MG_FLOAT32 ? 1e-4 : 1e-2;
  if (a == b || (isnan(a) && isnan(b))) return true;
  return fabs(a - b) <= tol * scale;
}

static mg_status check_values (const recompute_ext *e, const mg_list *out) {
  for (int i = 0; i < out->n; i++) {
    double sum, mag;
    if (digest(out->t[i], &sum, &mag) != MG_OK) return MG_ERR;
    double was = e->digest[2 * i], wasmag = e->digest[2 * i + 1];
    double scale = fmax(fmax(mag, wasmag), DBL_MIN);
    if (same_digest(sum, was, scale, out->t[i]->dtype) && same_digest(mag, wasmag, scale, out->t[i]->dtype))
      continue;
    return mg_seterror("the recomputed function gave output " MG_POS1 " other values than its first "
                       "run (they sum to %.6g, the first run's to %.6g): it must compute the same "
                       "each run (randomness is replayed; is_recomputing may change side effects only)",
                       (long long)i, sum, was);
  }
  return MG_OK;
}

static mg_status check_outputs (const mg_node *n, const mg_list *out) {
  if (out->n != n->nout)
    return mg_seterror("the recomputed function gave %d outputs, the first run gave %d "
                       "(it must be deterministic)", out->n, n->nout);
  for (int i = 0; i < out->n; i++) {
    const mg_meta *m = &n->out_meta[i];
    const mg_tensor *t = out->t[i];
    if (mg_same_shape(m->shape, m->ndim, t->shape, t->ndim) && m->dtype == t->dtype) continue;
    char a[160], b[160];
    return mg_seterror("the recomputed function gave output " MG_POS1 " as %s %s, the first run gave "
                       "%s %s (it must be deterministic)", (long long)i,
                       mg_shape_str(a, sizeof a, t->shape, t->ndim), mg_dtype_name(t->dtype),
                       mg_shape_str(b, sizeof b, m->shape, m->ndim), mg_dtype_name(m->dtype));
  }
  return MG_OK;
}

/* the local tape's gradient of the outputs, seeded with dout, for the
** inputs the outer walk asked for; an input the outputs do not reach stays
** unconnected (needs cleared), as the plain tape leaves it. The douts in
** *handed (the walk's, handed over: takes_gradient) go to that walk as
** its own seeds, so its first rule may write over them; they are cleared
** from *handed once given */
static mg_status local_gradient (mg_node *n, mg_tape *tape, const mg_list *out,
                                 mg_tensor *const *dout, unsigned *handed, mg_tensor **din) {
  int nt = 0, ns = 0, most = n->nin + n->nout;
  mg_tensor **targets = (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)(2 * n->nout + 1));
  mg_tensor **sources = (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)(2 * most + 1));
  if (targets == NULL || sources == NULL) {
    free(targets);
    free(sources);
    return mg_seterror("out of memory in the backward of a recompute");
  }
  mg_tensor **seeds = targets + n->nout, **grads = sources + most;
  unsigned given = 0;
  for (int i = 0; i < n->nout; i++) {
    if (dout[i] == NULL || !mg_is_floating(out->t[i]->dtype)) continue;
    if (i < 32 && nt < 32 && (*handed & (1u << i))) {
      given |= 1u << nt;
      *handed &= ~(1u << i);
    }
    targets[nt] = out->t[i];
    seeds[nt++] = dout[i];
  }
  for (int j = 0; j < n->nin; j++)
    if (n->needs[j]) sources[ns++] = n->in[j];
  for (int i = 0; i < n->nout && i < 32; i++)     /* outputs asked for: through the others too */
    if (n->out_sources & (1u << i)) sources[ns++] = out->t[i];
  mg_status st = mg_tape_gradient_given(tape, nt, targets, ns, sources, seeds, given, grads);
  int k = 0;
  for (int j = 0; st == MG_OK && j < n->nin; j++)
    if (n->needs[j] && (din[j] = grads[k++]) == NULL) n->needs[j] = false;
  for (int i = 0; st == MG_OK && i < n->nout && i < 32; i++)
    if (n->out_sources & (1u << i)) din[n->nin + i] = grads[k++];
  free(targets);
  free(sources);
  return st;
}

/* Did the re-run read (or give back) the tensor closed over as input j?
** One it did not read the first run did: the closure now holds another
** tensor, and the gradient through the first would silently be lost. */
static bool reread (const mg_tape *tape, const mg_list *out, uint64_t id) {
  for (int i = 0; i < out->n; i++) if (out->t[i]->id == id) return true;
  for (size_t i = 0; i < tape->nnodes; i++)
    for (int j = 0; j < tape->nodes[i]->nin; j++)
      if (tape->nodes[i]->in_meta[j].id == id) return true;
  return false;
}

static mg_status check_captures (const mg_node *n, const recompute_ext *e, const mg_tape *tape,
                                 const mg_list *out) {
  for (int j = e->first_captured; j < e->first_captured + e->ncaptured; j++) {
    if (reread(tape, out, n->in_meta[j].id)) continue;
    char a[160];
    const mg_meta *m = &n->in_meta[j];
    return mg_seterror("the recomputed function did not read again the %s %s tensor it closed over "
                       "in its first run (a closure that now holds another tensor?); it must read "
                       "the same tensors each run", mg_shape_str(a, sizeof a, m->shape, m->ndim),
                       mg_dtype_name(m->dtype));
  }
  return MG_OK;
}

static mg_status rerun (mg_node *n, recompute_ext *e, mg_tape *tape, mg_list *out) {
  mg_tensor **in = (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)(e->nargs + 1));
  mg_tensor **kept = (mg_tensor **)calloc((size_t)e->ninputs + 1, sizeof(mg_tensor *));
  if (in == NULL || kept == NULL) {
    free(in);
    free(kept);
    return mg_seterror("out of memory in the backward of a recompute");
  }
  for (int k = 0; k < e->nargs; k++) in[k] = n->in[e->argmap[k]];
  for (int j = 0; j < n->nin; j++) mg_tape_watch(tape, n->in[j]);
  mg_replay_state *rs = &mg_ctx()->replay, was = *rs;
  mg_replay_rewind(e->kept);
  rs->playing = e->kept;                         /* the policy's outputs, taken again; */
  rs->recording = NULL;                          /* an enclosing run's are not these ops' */
  swap_values(n, e, kept, false);
  mg_status st = e->verify ? mg_verify_check(e->verify) : MG_OK;
  if (st == MG_OK) {
    st = e->fn->forward(e->ud, e->nargs, in, out);
    if (e->verify) st = mg_verify_checked(e->verify, st);
  }
  swap_values(n, e, kept, true);
  *rs = was;
  mg_tape_stop(tape);
  free(in);
  free(kept);
  return st;
}

/* releases the handed-over douts a backward did not pass on */
static mg_status drop_handed (const mg_node *n, mg_tensor *const *dout, unsigned handed, mg_status st) {
  mg_release_masked(n->nout, dout, handed);
  return st;
}

static mg_status recompute_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  recompute_ext *e = (recompute_ext *)n->ext;
  unsigned handed = n->spare;                    /* douts the walk handed over: ours to release */
  mg_tape *tape = mg_tape_new(0, 1);
  if (tape == NULL) return drop_handed(n, dout, handed, MG_ERR);
  mg_list out = {0};
  mg_rng_state now = mg_random_get_state();
  mg_random_set_state(e->rng);
  mg_recompute_enter();
  int *loops = &mg_ctx()->tapes.loop_depth, was = *loops;
  *loops += e->loop_depth;                       /* in a loop, as the call was */
  mg_memory_span("recompute", 1);
  mg_status st = mg_autocast_reenter(e->autocast);
  if (st == MG_OK) {
    st = rerun(n, e, tape, &out);
    mg_autocast_pop();
  }
  if (st == MG_OK) st = check_outputs(n, &out);
  if (st == MG_OK) st = check_captures(n, e, tape, &out);
  if (st == MG_OK && !mg_dry_running()) st = check_values(e, &out);   /* a dry run has no values */
  if (st == MG_OK) st = local_gradient(n, tape, &out, dout, &handed, din);
  drop_handed(n, dout, handed, st);
  mg_memory_span("recompute", 0);
  *loops = was;
  mg_recompute_leave();
  mg_random_set_state(now);                      /* as if no recompute had happened */
  mg_list_clear(&out);
  mg_tape_release(tape);
  return st;
}

static mg_tensor *recompute_kept (const mg_node *n, int i) {
  return mg_replay_kept(((const recompute_ext *)n->ext)->kept, i);
}

static const mg_opdef recompute_op = {
  .info = {.name = "recompute_grad", .kind = MG_OP_OTHER},
  .saves = MG_SAVE_INPUTS, .backward = recompute_backward, .free_ext = recompute_free,
  .saved_extra = recompute_kept, .linked_outputs = true,
  .reuses_gradient = true, .takes_gradient = true,    /* the re-run's walk may write over dout */
  .any_gradient_dtype = true,      /* a float32 sum of half gradients seeds the re-run as it is: rounded once, as the plain walk does */
};

/* }========================================================== */


/* {====================== the forward ======================= */

/* the node's inputs: distinct tensors of in[], then the tensors from
** outside that f read (those it closes over, not arguments), then the
** variables of w;
** fills e->argmap and e->var_of */
static mg_tensor **node_inputs (recompute_ext *e, int nin, mg_tensor *const *in,
                                const mg_var_watcher *w) {
  int most = nin + w->nt + w->n + 1;
  mg_tensor **inputs = (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)most);
  e->argmap = (int *)malloc(sizeof(int) * (size_t)(nin + 1));
  e->var_of = (mg_variable **)calloc((size_t)most, sizeof(mg_variable *));
  if (inputs == NULL || e->argmap == NULL || e->var_of == NULL) {
    free(inputs);
    return mg_seterror("%s: out of memory", e->fn->name), NULL;
  }
  int nd = 0;
  for (int k = 0; k < nin; k++) {
    int j = mg_call_index_of(in[k]->id, inputs, nd);
    if (j < 0) {
      j = nd++;
      inputs[j] = in[k];
      if (in[k]->var) e->var_of[j] = mg_variable_retain(in[k]->var);
    }
    e->argmap[k] = j;
  }
  e->first_captured = nd;
  e->ncaptured = w->nt;
  for (int k = 0; k < w->nt; k++) inputs[nd++] = w->ts[k];   /* none is an argument (drop_passed) */
  for (int k = 0; k < w->n; k++, nd++) {
    inputs[nd] = w->vars[k]->value;
    e->var_of[nd] = mg_variable_retain(w->vars[k]);
  }
  e->ninputs = nd;
  return inputs;
}

/* the first run, counted while it runs: a gradient taken inside f walks
** then as in the re-run, where a tape records (no buffer reused, no op
** skipped: its ops are the ones the re-run's verify and save policy count) */
static mg_status counted_forward (const mg_function *fn, void *ud, int nin, mg_tensor *const *in,
                                  mg_list *out, mg_var_watcher *w) {
  int *first_runs = &mg_ctx()->replay.first_runs;
  (*first_runs)++;
  mg_status st = mg_call_forward(fn, ud, nin, in, out, w, MG_FN_CAPTURES);
  (*first_runs)--;
  return st;
}

/* the first run under a save policy: what it keeps goes to *kept */
static mg_status first_run (const mg_function *fn, void *ud, int nin, mg_tensor *const *in,
                            mg_list *out, mg_var_watcher *w, mg_save_policy save, void *save_ud,
                            mg_replay **kept) {
  *kept = NULL;
  if (save == NULL) return counted_forward(fn, ud, nin, in, out, w);
  if ((*kept = mg_replay_new()) == NULL) return MG_ERR;
  mg_replay_state *rs = &mg_ctx()->replay, was = *rs;
  mg_autodiff_install(mg_ctx());                 /* the dispatcher tells the policy of each op */
  rs->recording = *kept;
  rs->playing = NULL;                            /* (an enclosing re-run's ops are not these) */
  rs->save = save;
  rs->save_ud = save_ud;
  mg_status st = counted_forward(fn, ud, nin, in, out, w);
  *rs = was;
  if (st == MG_OK) mg_replay_settle(*kept, out);
  if (st != MG_OK) {
    mg_replay_free(*kept);
    *kept = NULL;
  }
  return st;
}

mg_status mg_recompute_call (const mg_function *fn, void *ud, int nin, mg_tensor *const *in,
                             mg_list *out) {
  return mg_recompute_call_saving(fn, ud, nin, in, out, NULL, NULL);
}

static mg_status recompute_call (const mg_function *fn, void *ud, int nin, mg_tensor *const *in,
                                 mg_list *out, mg_save_policy save, void *save_ud);

mg_status mg_recompute_call_saving (const mg_function *fn, void *ud, int nin,
                                    mg_tensor *const *in, mg_list *out, mg_save_policy save,
                                    void *save_ud) {
  if (mg_call_check("mg_recompute_call", fn, nin, in, out) != MG_OK) {
    if (fn && fn->release) fn->release(ud);
    return MG_ERR;
  }
  mg_call_hold(nin, in);
  mg_status st = recompute_call(fn, ud, nin, in, out, save, save_ud);
  mg_call_unhold(nin, in);
  return st;
}

/* the inputs are held: the forward may release what the caller lent */
static mg_status recompute_call (const mg_function *fn, void *ud, int nin, mg_tensor *const *in,
                                 mg_list *out, mg_save_policy save, void *save_ud) {
  /* Nothing to save memory from; or inside an enclosing recompute whose save
  ** policy counts ops: its first run (tapes paused) ran this f as it is, so
  ** its re-run must too, or the two runs count different ops and a kept
  ** output goes to the wrong op. f's ops then join the enclosing re-run's
  ** tape, which lives only for that block's backward. */
  const mg_replay_state *rs = &mg_ctx()->replay;
  if (mg_recording_tapes == 0 || rs->recording != NULL || rs->playing != NULL) {
    mg_status st = fn->forward(ud, nin, in, out);
    if (st != MG_OK) mg_list_clear(out);
    if (fn->release) fn->release(ud);
    return st;
  }
  mg_rng_state rng = mg_random_get_state();
  mg_var_watcher w;
  mg_replay *kept;
  mg_verify_log *verify = NULL;
  if ((mg_verify_wanted(fn) && (verify = mg_verify_note(fn->name)) == NULL) ||
      (first_run(fn, ud, nin, in, out, &w, save, save_ud, &kept) != MG_OK)) {
    mg_verify_noted(verify);
    mg_verify_free(verify);
    if (fn->release) fn->release(ud);
    return MG_ERR;
  }
  mg_verify_noted(verify);
  mg_call_drop_passed(&w, nin, in);
  recompute_ext *e = (recompute_ext *)calloc(1, sizeof(recompute_ext));
  mg_tensor **inputs = NULL;
  mg_status st = MG_ERR;
  if (e == NULL) {
    mg_seterror("%s: out of memory", fn->name);
    if (fn->release) fn->release(ud);
    mg_replay_free(kept);
    mg_verify_free(verify);
  } else {
    *e = (recompute_ext){.fn = fn, .ud = ud, .rng = rng, .autocast = mg_autocast_dtype(), .nargs = nin, .kept = kept,
                         .loop_depth = mg_ctx()->tapes.loop_depth, .verify = verify};
    inputs = node_inputs(e, nin, in, &w);
    e->digest = (double *)malloc(sizeof(double) * (size_t)(2 * out->n + 1));
    st = inputs == NULL ? MG_ERR : e->digest == NULL ? mg_seterror("%s: out of memory", fn->name)
                                                     : mg_call_fresh_outputs(out, inputs, e->ninputs);
    for (int i = 0; i < out->n && st == MG_OK; i++)
      st = digest(out->t[i], &e->digest[2 * i], &e->digest[2 * i + 1]);
    if (st == MG_OK)
      st = mg_record_ex(&recompute_op, e->ninputs, inputs, out->n, out->t, NULL, e, NULL);
    else
      recompute_free(&(mg_node){.ext = e});
  }
  free(inputs);
  mg_watcher_free(&w);
  if (st != MG_OK) mg_list_clear(out);
  return st;
}

/* }========================================================== */

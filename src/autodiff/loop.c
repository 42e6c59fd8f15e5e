/*
** loop.c — checkpointed loops: state = step(state, i) for i = 1..n,
** differentiated with Griewank's binomial checkpointing (Revolve), driven
** by a C callback.
**
** The loop is one custom gradient (custom.c): its forward runs the steps
** with the tapes paused and saves, through the call's context, k states
** (x_0 among them) where Revolve's schedule first puts its snapshots, and
** x_(n-1), the state before the last step. Its backward reverses the steps
** from the last: step i runs again under a local tape from x_(i-1), seeded
** with the gradient of x_i, and x_(i-1) comes from the nearest snapshot,
** advancing and taking new snapshots as the schedule says; each forward
** snapshot is let go once the walk has passed it.
**
** The schedule is the recursion whose cost Revolve's closed form gives: to
** reverse l steps from a held state with s snapshots (that state's
** included), advance m steps, hold that state, reverse the last l - m with
** s - 1, let it go, reverse the first m with s. With r the least integer for
** which beta(s, r) = C(s + r, s) >= l, any m with
** beta(s, r - 2) <= m <= beta(s, r - 1) and
** beta(s - 1, r - 1) <= l - m <= beta(s - 1, r) gives the minimum,
** r l - beta(s + 1, r - 1) forward steps (Griewank and Walther, ACM TOMS
** 26(1), 2000; the sub-costs add up to it by Pascal's rule). The loop's
** forward made n - 1 of them, so its gradient re-runs the rest.
**
** Variable gradients (and those of the tensors the steps close over, which
** the loop's node takes as inputs after the variables, MG_FN_CAPTURES):
** the plain tape sums a variable's gradient over every
** read, one op's share at a time, from the last step back. Each local tape
** gets the gradient so far first (it records sum(v * g) last, whose
** gradient is g exactly), so the sums round as the plain tape's do and the
** gradients are equal bit for bit.
*/
#include <stdlib.h>
#include <string.h>

#include "autodiff/autodiff.h"

/* {======================== the schedule ======================== */

/* C(a, b) exactly (each partial product is a binomial); INT64_MAX past it */
static int64_t binom (int64_t a, int64_t b) {
  if (b < 0 || b > a) return 0;
  if (b > a - b) b = a - b;
  int64_t r = 1;
  for (int64_t i = 1; i <= b; i++) {
    if (r > INT64_MAX / (a - b + i)) return INT64_MAX;
    r = r * (a - b + i) / i;
  }
  return r;
}

static int64_t beta (int64_t s, int64_t r) { return r < 0 ? 0 : binom(s + r, s); }

static int64_t repetitions (int64_t l, int64_t s) {
  int64_t r = 0;
  while (beta(s, r) < l) r++;
  return r;
}

/* where the next snapshot goes when reversing l >= 2 steps with s >= 2 */
static int64_t split (int64_t l, int64_t s) {
  int64_t r = repetitions(l, s), m = beta(s, r - 2), alt = l - beta(s - 1, r);
  if (alt > m) m = alt;
  return m < 1 ? 1 : m;
}

int64_t mg_revolve_recomputed (int64_t n, int64_t k) {
  if (n < 0) return mg_seterror("mg_revolve_recomputed: n is negative (%lld)", (long long)n), -1;
  if (k < 1) return mg_seterror("mg_revolve_recomputed: snapshots must be at least 1, got %lld",
                                (long long)k), -1;
  if (n <= 1) return 0;
  int64_t r = repetitions(n, k);
  return r * n - beta(k + 1, r - 1) - (n - 1);
}

/* }============================================================== */


/* {========================= the call =========================== */

/* a state of the loop at a position: L tensors (held) and the random state
** before the step that follows it */
typedef struct loop_state {
  int64_t pos;
  mg_tensor **x;
  mg_rng_state rng;
} loop_state;

/* a snapshot the forward saved: position, random state, first saved index */
typedef struct kept { int64_t pos; mg_rng_state rng; int first; bool gone; } kept;

typedef struct loop_call {
  const mg_loop_fn *fn;
  void *ud;
  int L;                       /* tensors in a loop_state */
  int64_t n;                   /* steps */
  int k;                       /* snapshots */
  mg_tensor **x0;              /* [L] the first state, held: shapes and dtypes to check */
  kept *kept;                  /* the forward's snapshots, by position */
  int nkept;
  bool save;                   /* a tape records the call: keep the snapshots */
  mg_custom_ctx *ctx;          /* borrowed: the call's */
  const mg_grad_args *g;       /* during the backward */
  mg_tensor **vgrad;           /* [nvars + ncaptured] the outside tensors' gradients so far */
  mg_tensor **adj;             /* [L] the gradient of the state being reversed */
  mg_dtype autocast;           /* the autocast the call ran under: its re-runs run under it too */
} loop_call;

static void release_all (mg_tensor **x, int n) {
  for (int j = 0; x && j < n; j++) { mg_tensor_release(x[j]); x[j] = NULL; }
}

static void loop_release (void *ud) {
  loop_call *c = (loop_call *)ud;
  if (c->fn->release) c->fn->release(c->ud);
  release_all(c->x0, c->L);
  free(c->x0);
  free(c->kept);
  free(c);
}

static void state_free (loop_call *c, loop_state *e) {
  release_all(e->x, c->L);
  free(e->x);
  e->x = NULL;
}

/* runs step i from x into *y, checking that it kept the state's shapes */
static mg_status run_step (loop_call *c, int64_t i, mg_loop_phase phase, mg_tensor **x,
                           mg_tensor ***y) {
  mg_list out = {0};
  bool again = phase != MG_LOOP_FORWARD, pushed = again && mg_autocast_reenter(c->autocast) == MG_OK;
  mg_status st = again && !pushed ? MG_ERR : c->fn->step(c->ud, i, phase, c->L, x, &out);
  if (pushed) mg_autocast_pop();
  const char *who = c->fn->name ? c->fn->name : "checkpoint_loop";
  if (st == MG_OK && out.n != c->L)
    st = mg_seterror("%s: step %lld gave %d tensors; the state has %d", who, (long long)i, out.n,
                     c->L);
  for (int j = 0; st == MG_OK && j < c->L; j++) {
    const mg_tensor *a = out.t[j], *b = c->x0[j];
    if (a->dtype == b->dtype && mg_same_shape(a->shape, a->ndim, b->shape, b->ndim)) continue;
    char sa[160], sb[160];
    st = mg_seterror("%s: step %lld gave tensor " MG_POS1 " of the state as %s %s; it was %s %s (a loop "
                     "keeps its state's shapes)", who, (long long)i, (long long)j,
                     mg_shape_str(sa, sizeof sa, a->shape, a->ndim), mg_dtype_name(a->dtype),
                     mg_shape_str(sb, sizeof sb, b->shape, b->ndim), mg_dtype_name(b->dtype));
  }
  if (st != MG_OK) {
    mg_list_clear(&out);
    return st;
  }
  *y = out.t;                                    /* the list's array becomes the state's */
  return MG_OK;
}

/* the forward: runs the steps, saving the schedule's first snapshots */
static mg_status loop_forward (void *ud, int nin, mg_tensor *const *in, mg_list *out) {
  loop_call *c = (loop_call *)ud;
  (void)nin;
  c->ctx = mg_custom_context();
  if (c->ctx == NULL) return MG_ERR;
  /* x_0, the first descent of the recursion, and x_(n-1) */
  int64_t a = 0, l = c->n, s = c->k;
  c->kept[c->nkept++] = (kept){.pos = 0};
  while (l >= 2 && s >= 2) {
    int64_t m = split(l, s);
    a += m, l -= m, s--;
    c->kept[c->nkept++] = (kept){.pos = a};
  }
  if (c->kept[c->nkept - 1].pos != c->n - 1) c->kept[c->nkept++] = (kept){.pos = c->n - 1};
  mg_tensor **x = (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)c->L);
  if (x == NULL) return mg_seterror("checkpoint_loop: out of memory");
  for (int j = 0; j < c->L; j++) x[j] = mg_tensor_retain(in[j]);
  mg_status st = MG_OK;
  int next = 0;
  mg_loop_enter();
  for (int64_t i = 1; i <= c->n && st == MG_OK; i++) {
    if (c->save && next < c->nkept && c->kept[next].pos == i - 1) {
      c->kept[next].rng = mg_random_get_state();
      c->kept[next++].first = mg_custom_nsaved(c->ctx);
      st = mg_custom_save(c->ctx, c->L, x);
      if (st != MG_OK) break;
    }
    mg_tensor **y = NULL;
    st = run_step(c, i, MG_LOOP_FORWARD, x, &y);
    if (st == MG_OK) {
      release_all(x, c->L);
      free(x);
      x = y;
    }
  }
  mg_loop_leave();
  for (int j = 0; j < c->L; j++) {
    if (st == MG_OK) st = mg_list_push(out, x[j]);
    else mg_tensor_release(x[j]);
  }
  free(x);
  return st;
}

/* }============================================================== */


/* {======================= the reversal ========================= */

static kept *find_kept (loop_call *c, int64_t pos) {
  for (int i = 0; i < c->nkept; i++)
    if (c->kept[i].pos == pos && !c->kept[i].gone) return &c->kept[i];
  return NULL;
}

/* the state at pos from what the forward saved */
static mg_status from_kept (loop_call *c, kept *k, loop_state *e) {
  e->pos = k->pos;
  e->rng = k->rng;
  e->x = (mg_tensor **)calloc((size_t)c->L, sizeof(mg_tensor *));
  if (e->x == NULL) return mg_seterror("checkpoint_loop: out of memory");
  /* views with ids of their own: a step that also reads x_0 through its
  ** closure (a captured input) gets that use's gradient apart from the state's */
  for (int j = 0; j < c->L; j++) {
    mg_tensor *t = mg_custom_saved(c->ctx, k->first + j);
    e->x[j] = mg_tensor_view(t->storage, t->dtype, t->shape, t->ndim, t->strides, t->offset);
    if (e->x[j] == NULL) return state_free(c, e), MG_ERR;
  }
  return MG_OK;
}

/* a forward snapshot the walk has passed (x_0 stays, for another gradient) */
static void let_go (loop_call *c, int64_t pos) {
  kept *k = pos > 0 ? find_kept(c, pos) : NULL;
  if (k == NULL) return;
  for (int j = 0; j < c->L; j++) mg_custom_forget(c->ctx, k->first + j);
  k->gone = true;
  mg_memory_span("checkpoint_loop: let go of a snapshot", 1);     /* an instant on the trace */
  mg_memory_span("checkpoint_loop: let go of a snapshot", 0);
}

/* the state at pos >= e->pos: saved by the forward, or advanced from e */
static mg_status fetch (loop_call *c, const loop_state *e, int64_t pos, loop_state *out) {
  kept *k = find_kept(c, pos);
  if (k) return from_kept(c, k, out);
  mg_tensor **x = (mg_tensor **)malloc(sizeof(mg_tensor *) * (size_t)c->L);
  if (x == NULL) return mg_seterror("checkpoint_loop: out of memory");
  for (int j = 0; j < c->L; j++) x[j] = mg_tensor_retain(e->x[j]);
  mg_random_set_state(e->rng);
  mg_status st = MG_OK;
  if (pos > e->pos) mg_memory_span("checkpoint_loop: re-run", 1);
  for (int64_t i = e->pos + 1; i <= pos && st == MG_OK; i++) {
    mg_tensor **y = NULL;
    st = run_step(c, i, MG_LOOP_RERUN, x, &y);
    if (st == MG_OK) {
      release_all(x, c->L);
      free(x);
      x = y;
    }
  }
  if (pos > e->pos) mg_memory_span("checkpoint_loop: re-run", 0);
  *out = (loop_state){pos, x, mg_random_get_state()};
  if (st != MG_OK) state_free(c, out);
  return st;
}

/* What the steps read from outside the state: the variables, the tensors
** they close over (MG_FN_CAPTURES), then the initial state's own tensors,
** which a step may read through its closure too (the walk starts each
** state from a view with an id of its own, so the two uses stay apart). */
static int noutside (const loop_call *c) { return c->g->nvars + c->g->ncaptured + c->L; }

/* outside tensor q as the local tape's source */
static mg_tensor *outside (const loop_call *c, int q) {
  const mg_grad_args *g = c->g;
  if (q < g->nvars) return mg_variable_peek(g->vars[q]);
  q -= g->nvars;
  return q < g->ncaptured ? g->captured[q] : c->x0[q - g->ncaptured];
}

/* sum(x * g) for outside tensor q, whose gradient for it is g exactly (see
** the top); a variable is read, so the tape watches it */
static mg_tensor *carry (const loop_call *c, int q, mg_tensor *g) {
  mg_tensor *x = q < c->g->nvars ? mg_variable_read(c->g->vars[q]) : outside(c, q);
  mg_tensor *p = mg_mul(x, g);
  mg_tensor *s = p ? mg_sum(p, MG_ALL_AXES, 0) : NULL;
  mg_tensor_release(p);
  return s;
}

typedef struct turn_lists {
  mg_tensor **targets, **seeds, **sources, **grads;
  int *at;
  int nt, ns;
} turn_lists;

static mg_status turn_alloc (loop_call *c, turn_lists *t) {
  int n = c->L + noutside(c) + 1;
  t->targets = (mg_tensor **)calloc((size_t)n, sizeof(mg_tensor *));
  t->seeds = (mg_tensor **)calloc((size_t)n, sizeof(mg_tensor *));
  t->sources = (mg_tensor **)calloc((size_t)n, sizeof(mg_tensor *));
  t->grads = (mg_tensor **)calloc((size_t)n, sizeof(mg_tensor *));
  t->at = (int *)calloc((size_t)n, sizeof(int));
  t->nt = t->ns = 0;
  if (t->targets && t->seeds && t->sources && t->grads && t->at) return MG_OK;
  return mg_seterror("checkpoint_loop: out of memory");
}

/* frees the lists; the carried sums and their seeds are the lists' own */
static void turn_free (loop_call *c, turn_lists *t, int owned_from) {
  for (int i = owned_from; t->targets && i < t->nt; i++) {
    mg_tensor_release(t->targets[i]);
    mg_tensor_release(t->seeds[i]);
  }
  release_all(t->grads, c->L + noutside(c));
  free(t->targets);
  free(t->seeds);
  free(t->sources);
  free(t->grads);
  free(t->at);
}

/* the local tape's gradient: c->adj and c->vgrad become those of e's step input */
static mg_status take_gradient (loop_call *c, mg_tape *tape, const loop_state *e, turn_lists *t) {
  int nv = noutside(c);
  for (int j = 0; j < c->L; j++) {
    t->at[j] = -1;
    if (!mg_is_floating(e->x[j]->dtype)) continue;
    t->at[j] = t->ns;
    t->sources[t->ns++] = e->x[j];
  }
  int base = t->ns;
  for (int q = 0; q < nv; q++) t->sources[t->ns++] = outside(c, q);
  mg_status st = mg_tape_gradient(tape, t->nt, t->targets, t->ns, t->sources, t->seeds, 0, t->grads);
  if (st != MG_OK) return st;
  for (int j = 0; j < c->L; j++) {
    mg_tensor_release(c->adj[j]);
    c->adj[j] = t->at[j] >= 0 ? t->grads[t->at[j]] : NULL;
    if (t->at[j] >= 0) t->grads[t->at[j]] = NULL;
  }
  for (int q = 0; q < nv; q++) {
    if (t->grads[base + q] == NULL) continue;
    mg_tensor_release(c->vgrad[q]);
    c->vgrad[q] = t->grads[base + q];
    t->grads[base + q] = NULL;
  }
  return MG_OK;
}

/* step e->pos + 1 under a local tape from e, seeded with c->adj */
static mg_status turn (loop_call *c, const loop_state *e) {
  turn_lists t;
  mg_status st = turn_alloc(c, &t);
  mg_tape *tape = st == MG_OK ? mg_tape_new(0, 1) : NULL;
  mg_tensor **y = NULL;
  int owned = 0;
  if (tape == NULL) st = MG_ERR;
  mg_random_set_state(e->rng);
  for (int j = 0; st == MG_OK && j < c->L; j++)
    if (mg_is_floating(e->x[j]->dtype)) st = mg_tape_watch(tape, e->x[j]);
  for (int q = c->g->nvars; st == MG_OK && q < noutside(c); q++) st = mg_tape_watch(tape, outside(c, q));
  if (st == MG_OK) st = run_step(c, e->pos + 1, MG_LOOP_TAPED, e->x, &y);
  for (int j = 0; st == MG_OK && j < c->L; j++) {
    if (c->adj[j] == NULL || !mg_is_floating(y[j]->dtype)) continue;
    t.targets[t.nt] = y[j];
    t.seeds[t.nt++] = c->adj[j];
  }
  owned = t.nt;
  bool any = t.nt > 0;
  for (int q = 0; st == MG_OK && any && q < noutside(c); q++) {
    if (c->vgrad[q] == NULL) continue;
    mg_tensor *sum = carry(c, q, c->vgrad[q]);
    mg_tensor *one = sum ? mg_full(NULL, 0, sum->dtype, 1.0) : NULL;
    t.targets[t.nt] = sum;
    t.seeds[t.nt++] = one;
    if (one == NULL) st = MG_ERR;
  }
  if (tape) mg_tape_stop(tape);
  if (st == MG_OK && any) st = take_gradient(c, tape, e, &t);
  else if (st == MG_OK) release_all(c->adj, c->L);   /* nothing reached this step */
  turn_free(c, &t, owned);
  if (y) release_all(y, c->L);
  free(y);
  mg_tape_release(tape);
  return st;
}

/* reverses steps e->pos + 1 .. b with s snapshots */
static mg_status reverse (loop_call *c, const loop_state *e, int64_t b, int64_t s) {
  int64_t a = e->pos;
  if (b - a == 1) return turn(c, e);
  mg_status st = MG_OK;
  if (s == 1) {
    for (int64_t i = b; i > a && st == MG_OK; i--) {
      if (i - 1 == a) {
        st = turn(c, e);
        break;
      }
      loop_state x;
      st = fetch(c, e, i - 1, &x);
      if (st != MG_OK) break;
      st = turn(c, &x);
      let_go(c, x.pos);
      state_free(c, &x);
    }
    return st;
  }
  int64_t m = a + split(b - a, s);
  loop_state xm;
  st = fetch(c, e, m, &xm);
  if (st != MG_OK) return st;
  st = reverse(c, &xm, b, s - 1);
  let_go(c, m);
  state_free(c, &xm);
  return st == MG_OK ? reverse(c, e, m, s) : st;
}

static mg_status reverse_all (void *ud) {
  loop_call *c = (loop_call *)ud;
  if (!c->save)                                  /* a tape a step left recording took it */
    return mg_seterror("checkpoint_loop: no tape recorded when the loop began, so it kept no "
                       "snapshots");
  loop_state x0;
  mg_status st = from_kept(c, &c->kept[0], &x0);
  if (st != MG_OK) return st;
  mg_loop_enter();
  st = reverse(c, &x0, c->n, c->k);
  mg_loop_leave();
  state_free(c, &x0);
  return st;
}

/* Does a tape record this gradient, following what it reads (its seeds,
** the variables, the tensors the steps read, the initial state)? That is a
** second-order gradient through the loop, which re-runs from snapshots that
** tape never saw cannot give (it came out silently wrong: refused). */
static bool recorded_again (const loop_call *c, const mg_grad_args *g) {
  if (mg_tapes_recording() == 0) return false;
  for (int j = 0; j < g->nout; j++)
    if (mg_any_tape_tracks(g->dout[j]->id)) return true;
  for (int q = 0; q < g->nvars; q++)
    if (mg_any_tape_tracks(g->vars[q]->id)) return true;
  for (int q = 0; q < g->ncaptured; q++)
    if (mg_any_tape_tracks(g->captured[q]->id)) return true;
  for (int j = 0; j < c->L; j++)
    if (mg_any_tape_tracks(c->x0[j]->id)) return true;
  return false;
}

static mg_status loop_backward (void *ud, const mg_grad_args *g) {
  loop_call *c = (loop_call *)ud;
  if (recorded_again(c, g))
    return mg_seterror("checkpoint_loop: a tape records this gradient (a second-order gradient through the "
                       "loop), which the loop cannot give: its steps re-run from snapshots that tape never saw; "
                       "stop the outer tape before asking (tape:stop(); a tape left recording by an error counts "
                       "too: local t <close> = mg.tape() stops it), or for second order write the loop plainly "
                       "(recompute_grad on each step gives second-order gradients)");
  c->g = g;
  c->ctx = g->ctx;
  c->vgrad = (mg_tensor **)calloc((size_t)noutside(c) + 1, sizeof(mg_tensor *));
  c->adj = (mg_tensor **)calloc((size_t)c->L, sizeof(mg_tensor *));
  mg_status st = c->vgrad && c->adj ? MG_OK : mg_seterror("checkpoint_loop: out of memory");
  for (int j = 0; st == MG_OK && j < c->L; j++)
    if (mg_is_floating(g->dout[j]->dtype)) c->adj[j] = mg_tensor_retain(g->dout[j]);
  if (st == MG_OK) st = mg_custom_rerun(c->ctx, reverse_all, c);
  int x0 = g->nvars + g->ncaptured;             /* the initial state's closure uses */
  for (int j = 0; st == MG_OK && j < c->L; j++) {
    if (g->needs[j] && c->vgrad[x0 + j] && c->adj[j]) {
      g->din[j] = mg_add(c->adj[j], c->vgrad[x0 + j]);
      if (g->din[j] == NULL) st = MG_ERR;
    } else if (g->needs[j]) {
      g->din[j] = c->adj[j] ? mg_tensor_retain(c->adj[j]) : mg_tensor_retain(c->vgrad[x0 + j]);
    }
    mg_tensor_release(c->adj[j]);
    c->adj[j] = NULL;
  }
  for (int q = 0; st == MG_OK && q < x0; q++) {
    if (g->needs[g->nin + q]) g->din[g->nin + q] = c->vgrad[q];
    else mg_tensor_release(c->vgrad[q]);
    c->vgrad[q] = NULL;
  }
  if (c->adj) release_all(c->adj, c->L);
  if (c->vgrad) release_all(c->vgrad, noutside(c));
  free(c->adj);
  free(c->vgrad);
  c->adj = c->vgrad = NULL;
  c->g = NULL;
  return st;
}

/* }============================================================== */


/* {========================= the entry ========================== */

static mg_status loop_check (const mg_loop_fn *fn, int n, mg_tensor *const *state, int64_t steps,
                             int snapshots, mg_list *out) {
  const char *who = "mg_checkpoint_loop";
  if (fn == NULL) return mg_null_arg(who, "fn");
  if (fn->step == NULL) return mg_seterror("%s: fn->step is NULL", who);
  if (out == NULL) return mg_null_arg(who, "out");
  if (n < 1) return mg_seterror("%s: the state must hold at least one tensor, got %d", who, n);
  if (state == NULL) return mg_null_arg(who, "state");
  for (int j = 0; j < n; j++)
    if (state[j] == NULL) return mg_seterror("%s: state[%d] is NULL", who, j);
  if (steps < 0) return mg_seterror("%s: steps is negative (%lld)", who, (long long)steps);
  if (snapshots < 1) return mg_seterror("%s: snapshots must be at least 1, got %d", who, snapshots);
  return MG_OK;
}

mg_status mg_checkpoint_loop (const mg_loop_fn *fn, void *ud, int n, mg_tensor *const *state,
                              int64_t steps, int snapshots, mg_list *out) {
  mg_status st = loop_check(fn, n, state, steps, snapshots, out);
  if (st == MG_OK && steps == 0) {                /* no steps: the state itself */
    for (int j = 0; j < n && st == MG_OK; j++) st = mg_list_push(out, mg_tensor_retain(state[j]));
    if (st != MG_OK) mg_list_clear(out);
  }
  if (st != MG_OK || steps == 0) {
    if (fn && fn->release) fn->release(ud);
    return st;
  }
  if (snapshots > steps) snapshots = (int)steps;   /* more than n hold nothing more */
  loop_call *c = (loop_call *)calloc(1, sizeof(loop_call));
  mg_tensor **x0 = (mg_tensor **)calloc((size_t)n, sizeof(mg_tensor *));
  kept *k = (kept *)calloc((size_t)snapshots + 2, sizeof(kept));
  if (c == NULL || x0 == NULL || k == NULL) {
    free(c);
    free(x0);
    free(k);
    if (fn->release) fn->release(ud);
    return mg_seterror("mg_checkpoint_loop: out of memory");
  }
  for (int j = 0; j < n; j++) x0[j] = mg_tensor_retain(state[j]);
  *c = (loop_call){.fn = fn, .ud = ud, .L = n, .n = steps, .k = snapshots, .x0 = x0, .kept = k,
                   .autocast = mg_autocast_dtype(),
                   .save = mg_tapes_recording() > 0};   /* (the forward runs with them paused) */
  static const mg_function loop_fn = {"checkpoint_loop", loop_forward, loop_backward, loop_release,
                                      MG_FN_CAPTURES | MG_FN_REREADS};
  return mg_custom_call(&loop_fn, c, n, state, out);
}

/* }============================================================== */

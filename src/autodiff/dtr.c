/*
** dtr.c — a memory budget: Dynamic Tensor Rematerialization (Kirisame et
** al., ICLR 2021) over the tapes' saved tensors.
**
** While a budget is in force, each recorded node gets a provenance record
** (struct mg_dtr): the node that made each of its inputs (held, so it can
** run again), or the input itself when no node of ours made it (a leaf: the
** data, a variable's value, a dropout mask). When an allocation would take
** the live bytes over the budget, the allocator asks for room: the saved
** tensor with the smallest cost / (bytes x staleness) is evicted (its
** storage freed, its slots emptied and marked), counting in its cost the
** evicted or unsaved tensors it would need to be rebuilt from. Only tensors
** that nothing but the tapes' slots holds go: never a variable's value, a
** tensor the user still references (their references keep the count above
** the slots'), a view sharing its storage, or what no replayable op made
** (a random mask is a leaf). Before a node's backward rule runs, its
** evicted slots are rebuilt by running the producing op again on rebuilt
** inputs, recursively: the same kernel on the same inputs, so the gradient
** is bit for bit the one without a budget.
**
** The ops that can run again are the registry's unary and binary rows
** (elementwise ops, matmul): their forward is the row's entry point. The
** outputs of other ops stay resident while a node needs them.
*/
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

/* the most inputs of an op a rebuild runs again (dense has three) */
#define MAX_REPLAY_IN 4

struct mg_dtr {
  mg_node *node;                  /* weak: the record is the node's */
  struct mg_dtr *prev, *next;     /* the context's records */
  mg_node *pending;               /* the release queue (no recursion over long chains) */
  uint64_t stamp;                 /* last use: recorded, rebuilt, or its backward ran */
  double cost;                    /* its op alone, estimated */
  double up, down;                /* its evicted neighbourhood's costs (neighbourhoods) */
  bool lost;                      /* its output is evicted (neighbourhoods, for a moment) */
  bool replayable;                /* its outputs can be rebuilt */
  uint32_t evicted;               /* slots (inputs, then outputs) whose tensor went */
  int pins;                       /* its backward runs: its slots are held */
  mg_node **src;                  /* [nin]: the node that made input j (held), or NULL */
  int *src_out;                   /* [nin]: which output of it */
  mg_tensor **hold;               /* [nin]: a leaf input kept for a rebuild, or NULL */
};

typedef struct mg_dtr_state {
  size_t budget;                  /* the context's; 0: none */
  mg_tape **tapes;                /* tapes with a budget of their own (weak) */
  int ntapes, captapes;
  struct mg_dtr *head;            /* records of live nodes */
  int64_t nlive;
  idmap made;                     /* output id -> the live node that made it */
  uint64_t clock;
  int64_t recorded;               /* nodes recorded since the last time none was live */
  int walks;                      /* backward walks running */
  char failure[400];              /* the budget's last refusal, for the backward's message */
  const char *last_op;
  const char *walk_op;            /* the backward rule running (mg_dtr_pin) */
  /* a step found the budget too small: it runs on at the least memory it
  ** can, and its gradient then fails naming what it needed at once */
  struct { size_t needed, budget; char most[96]; } short_of;
  mg_node *pending;               /* nodes being released */
  bool releasing, collecting;
  void (*collect)(void *ud);      /* the host frees its garbage (mg_memory_set_collect_hook) */
  void *collect_ud;
  int64_t evictions, remats;
  size_t evicted_bytes, remat_bytes;
} mg_dtr_state;

static void state_free (mg_context *c);
static void dtr_stats (mg_memory_stats *st);
static mg_status make_room (size_t nbytes);

/* what the allocator calls, installed with the state */
static const mg_pressure pressure = {make_room, dtr_stats, state_free};

static mg_dtr_state *state (void) {
  mg_context *c = mg_ctx();
  if (c->dtr == NULL) {
    c->dtr = calloc(1, sizeof(mg_dtr_state));
    if (c->dtr == NULL) mg_seterror("out of memory setting a memory budget");
    else c->pressure = &pressure;
  }
  return c->dtr;
}

static void state_free (mg_context *c) {
  mg_dtr_state *S = c->dtr;
  if (S == NULL) return;
  idmap_free(&S->made);
  free(S->tapes);
  free(S);
  c->dtr = NULL;
  c->pressure = NULL;
}


/* {========================= the budget ======================= */

/* the budget in force: the least of the context's and those of its tapes
** that record or are being walked */
static size_t budget_now (const mg_dtr_state *S) {
  size_t b = S->budget;
  for (int i = 0; i < S->ntapes; i++) {
    const mg_tape *t = S->tapes[i];
    if ((t->active || t->walking) && t->budget && (b == 0 || t->budget < b)) b = t->budget;
  }
  return b;
}

size_t mg_memory_budget (void) {
  mg_dtr_state *S = mg_ctx()->dtr;
  return S ? budget_now(S) : 0;
}

size_t mg_memory_set_budget (size_t bytes) {
  mg_dtr_state *S = state();
  if (S == NULL) return 0;
  size_t was = S->budget;
  S->budget = bytes;
  return was;
}

void *mg_memory_set_collect_hook (void (*collect)(void *ud), void *ud) {
  mg_dtr_state *S = state();
  if (S == NULL) return NULL;
  void *was = S->collect_ud;
  S->collect = collect;
  S->collect_ud = ud;
  return was;
}

mg_status mg_tape_set_budget (mg_tape *t, size_t bytes) {
  MG_CHECK_ARG("mg_tape_set_budget", t, MG_ERR);
  mg_dtr_state *S = state();
  if (S == NULL) return MG_ERR;
  if (t->budget == 0 && bytes > 0) {
    if (S->ntapes == S->captapes) {
      int cap = S->captapes ? S->captapes * 2 : 4;
      mg_tape **a = (mg_tape **)realloc(S->tapes, sizeof(mg_tape *) * (size_t)cap);
      if (a == NULL) return mg_seterror("out of memory setting a tape's memory budget");
      S->tapes = a;
      S->captapes = cap;
    }
    S->tapes[S->ntapes++] = t;
  } else if (t->budget > 0 && bytes == 0) {
    mg_dtr_forget_tape(t);
  }
  t->budget = bytes;
  return MG_OK;
}

void mg_dtr_forget_tape (mg_tape *t) {
  mg_dtr_state *S = t->ctx->dtr;
  for (int i = 0; S && i < S->ntapes; i++)
    if (S->tapes[i] == t) {
      S->tapes[i] = S->tapes[--S->ntapes];
      break;
    }
  t->budget = 0;
}

bool mg_dtr_recording (void) {
  mg_dtr_state *S = mg_ctx()->dtr;
  return S != NULL && budget_now(S) > 0;
}

static void dtr_stats (mg_memory_stats *st) {
  mg_dtr_state *S = mg_ctx()->dtr;
  if (S == NULL) return;
  st->budget = budget_now(S);
  st->evictions = S->evictions;
  st->evicted_bytes = S->evicted_bytes;
  st->rematerialisations = S->remats;
  st->rematerialised_bytes = S->remat_bytes;
}

/* }========================================================== */


/* {======================== the records ======================= */

static mg_tensor **slot_of_node (mg_node *n, int k) { return k < n->nin ? &n->in[k] : &n->out[k - n->nin]; }
static const mg_meta *meta_of_node (const mg_node *n, int k) {
  return k < n->nin ? &n->in_meta[k] : &n->out_meta[k - n->nin];
}

static double numel_of (const mg_meta *m) {
  double e = 1;
  for (int d = 0; d < m->ndim; d++) e *= (double)m->shape[d];
  return e;
}

/* the op's cost, estimated from its shapes: a product's multiply-adds, an
** elementwise op's elements */
static double op_cost (const mg_node *n) {
  if (n->def->macs) return n->def->macs(n);
  double c = numel_of(&n->out_meta[0]);
  for (int j = 0; j < n->nin; j++) c += numel_of(&n->in_meta[j]);
  return c;
}

static bool op_replays (const mg_node *n) {
  const mg_opinfo *op = &n->def->info;
  if (n->nout != 1 || n->hooks != NULL) return false;
  if (n->def->replay) return n->nin <= MAX_REPLAY_IN;
  if (op->kind == MG_OP_UNARY) return n->nin == 1 && op->fn.unary != NULL;
  if (op->kind == MG_OP_BINARY) return n->nin == 2 && op->fn.binary != NULL;
  return false;
}

/* the live node that made id (and which output), or NULL */
static mg_node *maker_of (mg_dtr_state *S, uint64_t id, int *out) {
  mg_node *p = (mg_node *)idmap_get(&S->made, id);
  for (int i = 0; p && i < p->nout; i++)
    if (p->out_meta[i].id == id) { *out = i; return p; }
  return NULL;
}

/* cleared entries pile up (ids are never reused): rebuilt when they outnumber the live ones */
static mg_status compact_made (mg_dtr_state *S) {
  if (S->made.n < 1024 || S->made.n < 4 * (size_t)S->nlive) return MG_OK;
  idmap fresh = {0};
  for (size_t i = 0; i < S->made.cap; i++) {
    if (S->made.keys[i] == 0 || S->made.vals[i] == NULL) continue;
    void **slot = idmap_slot(&fresh, S->made.keys[i]);
    if (slot == NULL) { idmap_free(&fresh); return MG_ERR; }
    *slot = S->made.vals[i];
  }
  idmap_free(&S->made);
  bool inline_arrays = fresh.keys == fresh.ikeys;
  S->made = fresh;
  if (inline_arrays) {                    /* they moved with the struct */
    S->made.keys = S->made.ikeys;
    S->made.vals = S->made.ivals;
  }
  return MG_OK;
}

/*
** n was just recorded under a budget: its provenance. An input some live
** recorded node made points at that node; any other input is a leaf and is
** held, unless the node saves it anyway or a variable holds it.
*/
mg_status mg_dtr_attach (mg_node *n, mg_tensor *const *in) {
  mg_dtr_state *S = state();
  if (S == NULL) return MG_ERR;
  if (n->def->free_ext != NULL || n->nin + n->nout > 32) return MG_OK;   /* custom, recompute: their own */
  size_t nin = (size_t)n->nin;
  struct mg_dtr *d = (struct mg_dtr *)calloc(1, sizeof *d + nin * (2 * sizeof(void *) + sizeof(int)));
  if (d == NULL || compact_made(S) != MG_OK) {
    free(d);
    return mg_seterror("out of memory recording '%s' under a memory budget", n->def->info.name);
  }
  d->src = (mg_node **)(d + 1);
  d->hold = (mg_tensor **)(d->src + nin);
  d->src_out = (int *)(d->hold + nin);
  d->node = n;
  for (int i = 0; i < n->nout; i++) {
    void **slot = idmap_slot(&S->made, n->out_meta[i].id);
    if (slot == NULL) {                       /* the outputs noted so far are not n's after all */
      while (i-- > 0) S->made.vals[slot_of(&S->made, n->out_meta[i].id)] = NULL;
      free(d);
      return mg_seterror("out of memory recording '%s' under a memory budget", n->def->info.name);
    }
    *slot = n;
  }
  d->replayable = op_replays(n);
  for (int j = 0; j < n->nin; j++) {
    mg_node *p = in[j]->storage->holds[MG_ROLE_VARIABLE] > 0 ? NULL : maker_of(S, in[j]->id, &d->src_out[j]);
    if (p != NULL) {
      d->src[j] = p;
      p->refcount++;
      d->replayable &= p->dtr->replayable || n->in[j] != NULL;
    } else if (n->in[j] == NULL) {
      d->hold[j] = mg_tensor_retain(in[j]);   /* a leaf: kept for a rebuild */
    }
  }
  d->cost = op_cost(n);
  d->stamp = ++S->clock;
  d->next = S->head;
  if (S->head) S->head->prev = d;
  S->head = d;
  if (S->nlive++ == 0) S->recorded = 0;
  S->recorded++;
  S->last_op = n->def->info.name;
  n->dtr = d;
  return MG_OK;
}

/* n's refcount reached 0: free_node frees it; the nodes its record held go
** the same way, through a queue rather than recursion */
void mg_dtr_release (mg_node *n, void (*free_node)(mg_node *)) {
  mg_dtr_state *S = mg_ctx()->dtr;
  n->dtr->pending = S->pending;
  S->pending = n;
  if (S->releasing) return;
  S->releasing = true;
  while (S->pending) {
    mg_node *m = S->pending;
    struct mg_dtr *d = m->dtr;
    S->pending = d->pending;
    if (d->prev) d->prev->next = d->next; else S->head = d->next;
    if (d->next) d->next->prev = d->prev;
    if (--S->nlive == 0 && S->walks == 0)
      memset(&S->short_of, 0, sizeof S->short_of);   /* a step short of the budget, never walked */
    for (int i = 0; i < m->nout; i++) {
      uint64_t id = m->out_meta[i].id;
      if (idmap_get(&S->made, id) == m) S->made.vals[slot_of(&S->made, id)] = NULL;
    }
    m->dtr = NULL;
    for (int j = 0; j < m->nin; j++) {
      mg_tensor_release(d->hold[j]);
      mg_node *p = d->src[j];
      if (p && --p->refcount == 0) {
        if (p->dtr) { p->dtr->pending = S->pending; S->pending = p; }
        else free_node(p);
      }
    }
    free(d);
    free_node(m);
  }
  S->releasing = false;
}

/* }========================================================== */


/* {======================== eviction ========================== */

typedef struct cand {
  mg_tensor *t;
  mg_node *maker;               /* replayable, or NULL: not evictable */
  int out;
  int slots;                    /* of records holding it */
  uint64_t stamp;               /* the latest use among them */
  bool gone;
} cand;

static void slot_maker (const mg_node *n, int k, mg_node **p, int *o) {
  *p = NULL;
  if (k >= n->nin) {
    if (n->dtr->replayable) { *p = (mg_node *)n; *o = k - n->nin; }
  } else if (n->dtr->src[k] && n->dtr->src[k]->dtr->replayable) {
    *p = n->dtr->src[k];
    *o = n->dtr->src_out[k];
  }
}

/*
** DTR's evicted neighbourhood, for every record at once: up is what
** rebuilding a node's output costs (its op, and the ops of the inputs it
** lacks, neither saved nor held, back to tensors that are there); down is
** what the evicted tensors whose rebuilds stop at its output cost, which
** evicting it would add to. Records are visited oldest first, so a node's
** makers have their up before it.
*/
static void add_down (mg_node *q, double c, int depth) {
  for (int j = 0; j < q->nin; j++) {
    mg_node *p = q->dtr->src[j];
    if (p == NULL || q->dtr->hold[j]) continue;
    if (q->in[j]) p->dtr->down += c;          /* there: the rebuild stops at it */
    else if (depth < 64) add_down(p, c, depth + 1);
  }
}

static void neighbourhoods (mg_dtr_state *S) {
  struct mg_dtr *last = S->head;
  while (last && last->next) last = last->next;
  for (struct mg_dtr *d = last; d; d = d->prev) {
    mg_node *n = d->node;
    d->up = d->cost;
    d->down = 0;
    for (int j = 0; j < n->nin; j++)
      if (n->in[j] == NULL && d->hold[j] == NULL && d->src[j]) d->up += d->src[j]->dtr->up;
  }
  for (struct mg_dtr *d = S->head; d; d = d->next) {    /* the makers of evicted tensors */
    for (int k = 0; d->evicted && k < d->node->nin + d->node->nout; k++) {
      if (!(d->evicted & (1u << k))) continue;
      mg_node *p = k >= d->node->nin ? d->node : d->src[k];
      if (p) p->dtr->lost = true;
    }
  }
  for (struct mg_dtr *d = S->head; d; d = d->next)
    if (d->lost) {
      d->lost = false;
      add_down(d->node, d->up, 0);
    }
}

/* the candidates: every tensor in a record's slot, keyed by id */
static mg_status gather (mg_dtr_state *S, cand **out, size_t *ncand, size_t *free_bytes) {
  idmap at = {0};
  cand *c = NULL;
  size_t n = 0, cap = 0;
  *free_bytes = 0;
  for (struct mg_dtr *d = S->head; d; d = d->next) {
    mg_node *nd = d->node;
    for (int k = 0; k < nd->nin + nd->nout; k++) {
      mg_tensor *t = *slot_of_node(nd, k);
      if (t == NULL || (nd->packed & (1u << k))) continue;
      /* a pinned record's slots (its backward runs) are counted, and marked to stay */
      mg_storage *s = t->storage;
      if (s->holds[MG_ROLE_VARIABLE] > 0 || s->external || s->refcount != 1) continue;
      void **slot = idmap_slot(&at, t->id);
      if (slot == NULL) goto oom;
      if (*slot == NULL) {
        if (n == cap) {
          cap = cap ? cap * 2 : 64;
          cand *a = (cand *)realloc(c, sizeof(cand) * cap);
          if (a == NULL) goto oom;
          c = a;
        }
        c[n] = (cand){t, NULL, 0, 0, 0, false};
        *slot = (void *)(uintptr_t)++n;
      }
      cand *e = &c[(uintptr_t)*slot - 1];
      if (e->t != t || d->pins > 0) e->gone = true;   /* two tensors under one id: leave them */
      e->slots++;
      if (d->stamp > e->stamp) e->stamp = d->stamp;
      if (e->maker == NULL) slot_maker(nd, k, &e->maker, &e->out);
    }
  }
  for (size_t i = 0; i < n; i++) {
    cand *e = &c[i];
    if (e->maker == NULL || e->slots != e->t->refcount) e->gone = true;
    if (!e->gone) *free_bytes += e->t->storage->nbytes;
  }
  idmap_free(&at);
  *out = c;
  *ncand = n;
  return MG_OK;
oom:
  idmap_free(&at);
  free(c);
  return mg_seterror("out of memory choosing what to evict");
}

/* empties every slot that holds t; t and its storage go */
static void evict (mg_dtr_state *S, mg_tensor *t) {
  size_t bytes = t->storage->nbytes;
  mg_tensor_retain(t);
  for (struct mg_dtr *d = S->head; d; d = d->next) {
    mg_node *nd = d->node;
    for (int k = 0; k < nd->nin + nd->nout; k++) {
      mg_tensor **slot = slot_of_node(nd, k);
      if (*slot != t) continue;
      mg_storage_hold(t->storage, MG_ROLE_SAVED, -1);
      mg_tensor_release(t);
      *slot = NULL;
      d->evicted |= 1u << k;
    }
  }
  mg_tensor_release(t);
  S->evictions++;
  S->evicted_bytes += bytes;
  mg_memory_span("evict", 1);                 /* an instant on the trace */
  mg_memory_span("evict", 0);
}

static const char *human (char *buf, size_t n, double bytes) {
  return mg_human_bytes(buf, n, bytes);
}

/* where the step is: "after 'matmul' (op 4 recorded under the budget)" or
** "in the backward of 'tanh'" */
static void step_place (const mg_dtr_state *S, char *buf, size_t n) {
  if (S->walks > 0 && S->walk_op)
    snprintf(buf, n, "in the backward of '%s'", S->walk_op);
  else if (S->last_op)
    snprintf(buf, n, "after '%s' (op %lld recorded under the budget)", S->last_op, (long long)S->recorded);
  else
    snprintf(buf, n, "in the step");
}

/* the step needs `live` bytes here, more than the budget: noted, for the
** gradient's error (mg_dtr_walk_end) */
static void note_short (mg_dtr_state *S, size_t budget, size_t live) {
  if (live > S->short_of.needed) {
    S->short_of.needed = live;
    step_place(S, S->short_of.most, sizeof S->short_of.most);
  }
  S->short_of.budget = budget;
}

/* a byte count rounded up to what mg_human_bytes prints (two decimals) */
static void human_up (char *buf, size_t n, size_t bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 4) { v /= 1024; u++; }
  if (u == 0) snprintf(buf, n, "%zu B", bytes);
  else snprintf(buf, n, "%.2f %s", ceil(v * 100) / 100, units[u]);
}

/* the step that ran short is over: its error, naming the least it needed
** at once (a lower bound: under a budget that large the backward may keep
** more than this run, which dropped everything it could) and what helps */
static mg_status report_short (mg_dtr_state *S) {
  char b[64], need[64];
  human_up(need, sizeof need, S->short_of.needed);
  mg_human_bytes(b, sizeof b, (double)S->short_of.budget);
  if (strcmp(b, need) == 0)                  /* close: the bytes say which is more */
    snprintf(b + strlen(b), sizeof b - strlen(b), " (%zu B)", S->short_of.budget);
  mg_seterror("memory budget %s is too small for this step: it needs at least %s (what had to stay live at "
              "once %s, with all else dropped). Try mg.memory.budget(\"%s\") or more, or hold less at once: "
              "recompute a block (mg.recompute_grad), a save policy (mg.recompute_grad(f, {policy = ...})), "
              "or float16 packing of what the tape saves (mg.saved_tensors_hooks(\"float16\"))",
              b, need, S->short_of.most, need);
  memset(&S->short_of, 0, sizeof S->short_of);
  return MG_ERR;
}

/* the allocator's question: room for nbytes more within the budget? Evicts
** the cheapest tensors to rebuild per byte and per step of staleness until
** there is; checks first that evicting everything evictable would do, so a
** budget too small fails with nothing changed */
static mg_status make_room (size_t nbytes) {
  mg_context *ctx = mg_ctx();
  mg_dtr_state *S = ctx->dtr;
  size_t budget = budget_now(S);
  mg_memory_state *m = &ctx->memory;
  if (budget == 0 || m->current + nbytes <= budget || S->releasing) return MG_OK;
  cand *c = NULL;
  size_t nc = 0, can = 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    if (gather(S, &c, &nc, &can) != MG_OK) return MG_ERR;
    if (m->current - can + nbytes <= budget || attempt == 1 || S->collect == NULL || S->collecting) break;
    free(c);                                   /* garbage may pin tensors: collect, and look again */
    c = NULL;
    S->collecting = true;
    S->collect(S->collect_ud);
    S->collecting = false;
    if (m->current + nbytes <= budget) return MG_OK;
  }
  if (m->current - can + nbytes > budget && (S->nlive > 0 || S->walks > 0)) {
    note_short(S, budget, m->current - can + nbytes);
    for (size_t i = 0; i < nc; i++)
      if (!c[i].gone) evict(S, c[i].t);      /* all that can go ("gone": must stay) */
    free(c);
    return MG_OK;
  }
  if (m->current - can + nbytes > budget) {   /* no step to finish: nothing can go */
    char b[64], l[64], a[32], where[160] = "";
    if (S->nlive > 0 && S->last_op && S->walks == 0)
      snprintf(where, sizeof where, " after '%s' (op %lld recorded under the budget)", S->last_op,
               (long long)S->recorded);
    free(c);
    size_t live = m->current - can + nbytes;
    human(b, sizeof b, (double)budget);
    human(l, sizeof l, (double)live);
    if (strcmp(b, l) == 0) {                 /* close: the bytes say which is more */
      snprintf(b + strlen(b), sizeof b - strlen(b), " (%zu B)", budget);
      snprintf(l + strlen(l), sizeof l - strlen(l), " (%zu B)", live);
    }
    mg_seterror("memory budget %s is below the %s that must stay live%s (allocating %s)", b, l,
                where, human(a, sizeof a, (double)nbytes));
    snprintf(S->failure, sizeof S->failure, "%s", mg_errmsg_raw());
    return MG_ERR;
  }
  while (m->current + nbytes > budget) {
    cand *best = NULL;
    double best_score = 0;
    neighbourhoods(S);
    for (size_t i = 0; i < nc; i++) {
      if (c[i].gone) continue;
      double stale = (double)(S->clock - c[i].stamp + 1);
      const struct mg_dtr *d = c[i].maker->dtr;
      double score = (d->up + d->down) / ((double)c[i].t->storage->nbytes * stale);
      if (best == NULL || score < best_score) { best = &c[i]; best_score = score; }
    }
    if (best == NULL) break;                    /* cannot happen: the sum said there was room */
    best->gone = true;
    evict(S, best->t);
  }
  free(c);
  return MG_OK;
}

/* }========================================================== */


/* {===================== rematerialisation ==================== */

/* the tensor with p's output o: resident in some slot (not a packed
** stand-in), else NULL */
static mg_tensor *resident (mg_dtr_state *S, mg_node *p, int o) {
  if (p->out[o] && !(p->packed & (1u << (p->nin + o)))) return p->out[o];
  uint64_t id = p->out_meta[o].id;
  for (struct mg_dtr *d = S->head; d; d = d->next)
    for (int j = 0; j < d->node->nin; j++)
      if (d->node->in[j] && d->node->in_meta[j].id == id && !(d->node->packed & (1u << j)))
        return d->node->in[j];
  return NULL;
}

/* a rebuilt tensor goes back into the slots it was evicted from */
static void restore (mg_dtr_state *S, mg_tensor *t) {
  for (struct mg_dtr *d = S->head; d; d = d->next) {
    if (d->evicted == 0) continue;
    mg_node *nd = d->node;
    for (int k = 0; k < nd->nin + nd->nout; k++) {
      if (!(d->evicted & (1u << k)) || meta_of_node(nd, k)->id != t->id) continue;
      *slot_of_node(nd, k) = mg_tensor_retain(t);
      mg_storage_hold(t->storage, MG_ROLE_SAVED, 1);
      d->evicted &= ~(1u << k);
    }
  }
}

static mg_tensor *rebuild (mg_dtr_state *S, mg_node *p, int o, int depth);

/* input j of p: saved, held, resident elsewhere, or rebuilt; a new reference */
static mg_tensor *input_of (mg_dtr_state *S, mg_node *p, int j, int depth) {
  if (p->in[j]) return mg_tensor_retain(p->in[j]);
  if (p->dtr->hold[j]) return mg_tensor_retain(p->dtr->hold[j]);
  mg_node *q = p->dtr->src[j];
  if (q == NULL) return mg_seterror("memory budget: input %d of '%s' is gone", j, p->def->info.name), NULL;
  mg_tensor *r = resident(S, q, p->dtr->src_out[j]);
  return r ? mg_tensor_retain(r) : rebuild(S, q, p->dtr->src_out[j], depth + 1);
}

/* p's output o again: its op run on its inputs, with no tape recording and
** no save policy answering; the result carries the id it had */
static mg_tensor *rebuild (mg_dtr_state *S, mg_node *p, int o, int depth) {
  if (!p->dtr->replayable || depth > 100000)
    return mg_seterror("memory budget: '%s' cannot be run again", p->def->info.name), NULL;
  mg_tensor *in[MAX_REPLAY_IN] = {NULL};      /* held: what the op allocates evicts none of them */
  bool all = true;
  for (int j = 0; j < p->nin && all; j++) all = (in[j] = input_of(S, p, j, depth)) != NULL;
  mg_tensor *out = NULL;
  if (all && mg_pause_all() == MG_OK) {
    mg_context *ctx = mg_ctx();
    mg_replay_state was = ctx->replay;
    int verifying = ctx->verify.n;             /* a rebuild is no op of a verified re-run */
    ctx->replay.recording = NULL;
    ctx->replay.playing = NULL;
    ctx->verify.n = 0;
    mg_memory_span("remat", 1);
    out = p->def->replay ? p->def->replay(p, in)
        : p->nin == 1 ? p->def->info.fn.unary(in[0]) : p->def->info.fn.binary(in[0], in[1]);
    mg_memory_span("remat", 0);
    ctx->verify.n = verifying;
    ctx->replay = was;
    mg_resume_all();
  }
  for (int j = 0; j < p->nin; j++) mg_tensor_release(in[j]);
  if (out == NULL) return NULL;
  out->id = p->out_meta[o].id;
  p->dtr->stamp = ++S->clock;
  S->remats++;
  S->remat_bytes += out->storage->nbytes;
  restore(S, out);
  return out;
}

/* before n's backward: its evicted slots rebuilt, and its slots held so
** that what the rule allocates evicts none of them */
mg_status mg_dtr_pin (mg_node *n) {
  mg_dtr_state *S = mg_ctx()->dtr;
  struct mg_dtr *d = n->dtr;
  d->pins++;
  d->stamp = ++S->clock;
  S->walk_op = n->def->info.name;
  for (int k = 0; k < n->nin + n->nout && d->evicted; k++) {
    if (!(d->evicted & (1u << k))) continue;
    mg_node *p;
    int o = 0;
    slot_maker(n, k, &p, &o);
    mg_tensor *t = p ? rebuild(S, p, o, 0) : NULL;
    if (t == NULL) {
      d->pins--;
      return p ? MG_ERR : mg_seterror("memory budget: a saved tensor of '%s' is gone", n->def->info.name);
    }
    mg_tensor_release(t);                     /* restore put it in the slots */
  }
  return MG_OK;
}

void mg_dtr_unpin (mg_node *n) { n->dtr->pins--; }

/* the budget's refusal since the last call, or NULL: a backward rule that
** failed for it reports it, not the NULL argument it led to */
const char *mg_dtr_take_failure (void) {
  mg_dtr_state *S = mg_ctx()->dtr;
  if (S == NULL || S->failure[0] == 0) return NULL;
  static _Thread_local char msg[400];
  memcpy(msg, S->failure, sizeof msg);
  S->failure[0] = 0;
  return msg;
}

/* a backward walk begins (+1) or ends (-1): a budget's error then names the
** node whose rule ran, not the last op of the forward */
void mg_dtr_walk (int delta) {
  mg_dtr_state *S = mg_ctx()->dtr;
  if (S) S->walks += delta;
}

/* a walk ended: MG_ERR with the error when the step ran short of the budget
** (the outermost walk reports it) */
mg_status mg_dtr_walk_end (void) {
  mg_dtr_state *S = mg_ctx()->dtr;
  if (S == NULL) return MG_OK;
  S->walks--;
  return S->walks == 0 && S->short_of.needed > 0 ? report_short(S) : MG_OK;
}

/* }========================================================== */

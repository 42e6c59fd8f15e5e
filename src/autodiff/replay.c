/*
** replay.c — save policies for recompute (JAX's checkpoint policies).
**
** While a recomputed function first runs, the policy picks ops whose
** outputs to keep (the matrix products, say: expensive to compute, cheap
** to keep); the node holds them as saved bytes. When the function runs
** again for a gradient, each of those ops takes its kept output instead of
** computing it: op k of a kind in the re-run is op k of that kind in the
** first run, since the function is deterministic (counted where each op
** asks for its kept output, in both runs, kept or not). Ops that cannot
** take a kept output just compute it again, which is always right.
*/
#include <stdlib.h>
#include <string.h>

#include "autodiff/autodiff.h"

/* tentative: mg_save_output's pick, kept only while no later op came and
** at the end only if the function returns it */
typedef struct kept { const mg_opdef *op; int64_t ordinal; mg_tensor *t; bool tentative; } kept;
typedef struct seen { const mg_opdef *op; int64_t count; } seen;

struct mg_replay {
  kept *items;                    /* in the order the first run made them */
  int n, cap;
  seen *ops;                      /* how many ops of each kind asked, this run */
  int nops, capops;
};

mg_replay *mg_replay_new (void) {
  mg_replay *r = (mg_replay *)calloc(1, sizeof(mg_replay));
  if (r == NULL) mg_seterror("out of memory keeping outputs for recompute");
  return r;
}

static void drop_item (kept *k) {
  mg_storage_hold(k->t->storage, MG_ROLE_SAVED, -1);
  mg_tensor_release(k->t);
}

void mg_replay_free (mg_replay *r) {
  if (r == NULL) return;
  for (int i = 0; i < r->n; i++) drop_item(&r->items[i]);
  free(r->items);
  free(r->ops);
  free(r);
}

/* op's count in this run, after one more ask when `ask`; -1 when out of memory */
static int64_t count_op (mg_replay *r, const mg_opdef *op, bool ask) {
  int i = 0;
  while (i < r->nops && r->ops[i].op != op) i++;
  if (i == r->nops) {
    if (!ask) return 0;
    if (r->nops == r->capops) {
      int cap = r->capops ? r->capops * 2 : 16;
      seen *a = (seen *)realloc(r->ops, sizeof(seen) * (size_t)cap);
      if (a == NULL) return -1;
      r->ops = a;
      r->capops = cap;
    }
    r->ops[r->nops++] = (seen){op, 0};
  }
  return ask ? ++r->ops[i].count : r->ops[i].count;
}

size_t mg_replay_count (const mg_replay *r) { return r ? (size_t)r->n : 0; }

mg_tensor *mg_replay_kept (const mg_replay *r, int i) {
  return r && i >= 0 && i < r->n ? r->items[i].t : NULL;
}

/* {====================== the first run ======================= */

/* the dispatcher's after-hook (tape.c) calls it for every op's output while a policy records */
mg_status mg_replay_note (const mg_opdef *op, mg_tensor *out) {
  mg_replay_state *s = &mg_ctx()->replay;
  mg_replay *r = s->recording;
  s->recording = NULL;                              /* the policy's own ops are not asked about */
  int keep = s->save(s->save_ud, &op->info, out);
  s->recording = r;
  if (keep <= 0) return keep < 0 ? MG_ERR : MG_OK;           /* < 0: the policy failed */
  if (r->n > 0 && r->items[r->n - 1].tentative) drop_item(&r->items[--r->n]);  /* not the last op */
  if (r->n == r->cap) {
    int cap = r->cap ? r->cap * 2 : 16;
    kept *a = (kept *)realloc(r->items, sizeof(kept) * (size_t)cap);
    if (a == NULL) return mg_seterror("out of memory keeping outputs for recompute");
    r->items = a;
    r->cap = cap;
  }
  mg_storage_hold(out->storage, MG_ROLE_SAVED, 1);          /* saved bytes, as a tape's */
  r->items[r->n++] = (kept){op, count_op(r, op, false) - 1, mg_tensor_retain(out), keep == 2};
  return MG_OK;
}

/* the first run is over: a tentative pick stays only if it is one of the
** function's results (it was the run's last op) */
void mg_replay_settle (mg_replay *r, const mg_list *out) {
  if (r == NULL || r->n == 0 || !r->items[r->n - 1].tentative) return;
  kept *k = &r->items[r->n - 1];
  for (int i = 0; i < out->n; i++) {
    if (out->t[i] && out->t[i]->storage == k->t->storage) {
      k->tentative = false;
      return;
    }
  }
  drop_item(&r->items[--r->n]);
}

/* }========================================================== */


/* {======================== the re-run ======================== */

/* The kept output for this op, as a fresh tensor (new to the tapes), if
** the first run kept the same op of the same ordinal with this shape and
** dtype. In the first run it only counts. */
mg_tensor *mg_replay_take (const mg_opdef *op, const int64_t *shape, int ndim, mg_dtype dt) {
  mg_replay_state *s = &mg_ctx()->replay;
  mg_replay *r = s->playing ? s->playing : s->recording;
  if (r == NULL) return NULL;
  int64_t ordinal = count_op(r, op, true) - 1;
  if (r != s->playing || ordinal < 0) return NULL;   /* (out of memory counting: compute) */
  for (int i = 0; i < r->n; i++) {
    kept *k = &r->items[i];
    if (k->op != op || k->ordinal != ordinal) continue;
    mg_tensor *t = k->t;
    if (t->dtype != dt || !mg_same_shape(t->shape, t->ndim, shape, ndim)) return NULL;
    return mg_tensor_view(t->storage, t->dtype, t->shape, t->ndim, t->strides, t->offset);
  }
  return NULL;
}

/* a re-run starts: the ops count again from the first */
void mg_replay_rewind (mg_replay *r) {
  if (r) r->nops = 0;
}

/* }========================================================== */

/* "dots": the products, JAX's dots_saveable (the fused attention is two;
** dense keeps its output after the bias and activation) */
int mg_save_dots (void *ud, const mg_opinfo *op, const mg_tensor *out) {
  MG_UNUSED(ud);
  MG_UNUSED(out);
  return op->product;
}

/* "output": the function's result, when its last op made it (2: a pick a
** later op replaces); the re-run stops short of that op */
int mg_save_output (void *ud, const mg_opinfo *op, const mg_tensor *out) {
  MG_UNUSED(ud);
  MG_UNUSED(op);
  MG_UNUSED(out);
  return 2;
}

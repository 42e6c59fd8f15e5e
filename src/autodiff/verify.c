/*
** verify.c — recompute's verify: a re-run must compute the very bytes its
** first run did.
**
** PyTorch's checkpoint compares the shapes and dtypes of what a re-run
** saves; a re-run that computes other values passes that and gives wrong
** gradients without a word: a kernel whose summation order changed with
** the thread count, a random op outside the replayed stream, a layer that
** updates its statistics a second time. With verify on, the first run
** notes every op it runs (its name, output shape and a CRC-32 of its
** output's bytes, zlib's) in a log, and the re-run checks each of its ops
** against the log, failing at the first that differs; from Lua the error
** carries the line of that op. A verified re-run may not assign a variable
** either (the first run did, or it would not be the same computation).
**
** Logs nest as recomputes do (an inner one's first run is part of an outer
** one's re-run): every op goes to every open log.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "autodiff.h"

typedef struct entry {
  const char *op;                /* the row's name (static) */
  uint32_t crc;                  /* of every output's bytes, in order */
  mg_dtype dtype;
  int ndim;
  int64_t shape[MG_MAX_DIMS];    /* output 0's */
} entry;

struct mg_verify_log {
  const char *fn;                /* the recomputed function's name, for messages */
  entry *e;
  int64_t n, cap;
  int64_t at;                    /* checking: the next entry to compare; -1 noting */
};

/* {======================= hashing ======================== */

/* a view's elements are copied out first, by the core (an op would be
** recorded, and counted by a save policy) */
static mg_status crc_of (const mg_tensor *t, uint32_t *crc) {
  mg_tensor *c = NULL;
  if (!mg_tensor_is_contiguous(t)) {
    c = mg_empty(t->shape, t->ndim, t->dtype);
    if (c == NULL || mg_copy_into(c, t) != MG_OK) {
      mg_tensor_release(c);
      return MG_ERR;
    }
  }
  const mg_tensor *b = c ? c : t;
  *crc = (uint32_t)crc32_z(*crc, (const Bytef *)mg_ptr(b), (size_t)b->numel * mg_dtype_size(b->dtype));
  mg_tensor_release(c);
  return MG_OK;
}

static mg_status entry_of (const mg_opcall *c, entry *e) {
  const mg_tensor *t = c->out[0];
  *e = (entry){.op = c->def->info.name, .crc = (uint32_t)crc32_z(0, Z_NULL, 0), .dtype = t->dtype,
               .ndim = t->ndim};
  memcpy(e->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  for (int i = 0; i < c->nout; i++)
    if (crc_of(c->out[i], &e->crc) != MG_OK) return MG_ERR;
  return MG_OK;
}

/* }========================================================== */


/* {==================== noting, checking ==================== */

static mg_status note (mg_verify_log *l, const entry *e) {
  if (l->n == l->cap) {
    int64_t cap = l->cap ? 2 * l->cap : 64;
    entry *grown = (entry *)realloc(l->e, sizeof(entry) * (size_t)cap);
    if (grown == NULL) return mg_seterror("%s: verify: out of memory noting the first run's ops", l->fn);
    l->e = grown;
    l->cap = cap;
  }
  l->e[l->n++] = *e;
  return MG_OK;
}

static const char *described (char *buf, size_t n, const entry *e) {
  char s[160];
  snprintf(buf, n, "%s, %s %s", e->op, mg_shape_str(s, sizeof s, e->shape, e->ndim), mg_dtype_name(e->dtype));
  return buf;
}

static mg_status check (mg_verify_log *l, const entry *now) {
  char a[256], b[256];
  if (l->at >= l->n)
    return mg_seterror("%s: verify: the re-run ran more ops than the first run's %lld: op " MG_POS1 " (%s) "
                       "is new; the function must run the same ops each time", l->fn, (long long)l->n,
                       (long long)l->at, described(a, sizeof a, now));
  const entry *was = &l->e[l->at];
  if (was->op != now->op || was->dtype != now->dtype || !mg_same_shape(was->shape, was->ndim, now->shape, now->ndim))
    return mg_seterror("%s: verify: the re-run's op " MG_POS1 " is %s where the first run's was %s; the "
                       "function must run the same ops each time", l->fn, (long long)l->at,
                       described(a, sizeof a, now), described(b, sizeof b, was));
  if (was->crc != now->crc)
    return mg_seterror("%s: verify: the re-run's op " MG_POS1 " (%s) computed other values than in the first "
                       "run (a reduction whose order changed with the thread count? a random number outside "
                       "mg.random? state that changed between the runs?)", l->fn, (long long)l->at,
                       described(a, sizeof a, now));
  l->at++;
  return MG_OK;
}

/* the dispatcher's hook: every op goes to every open log */
static mg_status seen (const mg_opcall *c) {
  mg_context *ctx = mg_ctx();
  if (ctx->verify.n == 0 || c->nout < 1 || c->out[0] == NULL || ctx->dry.on) return MG_OK;   /* dry: no values */
  entry e;
  mg_status st = entry_of(c, &e);
  for (int i = 0; i < ctx->verify.n && st == MG_OK; i++) {
    mg_verify_log *l = ctx->verify.log[i];
    st = l->at < 0 ? note(l, &e) : check(l, &e);
  }
  return st;
}

static mg_status refuse_assign (mg_variable *v) {
  mg_context *ctx = mg_ctx();
  for (int i = ctx->verify.n - 1; i >= 0; i--) {
    const mg_verify_log *l = ctx->verify.log[i];
    if (l->at < 0) continue;
    const char *name = mg_variable_name(v);
    return mg_seterror("%s: verify: the re-run assigned variable%s%s%s: state would change twice for one "
                       "step (a layer's statistics?); guard the update with is_recomputing()", l->fn,
                       name ? " '" : "", name ? name : "", name ? "'" : "");
  }
  return MG_OK;
}

/* }========================================================== */


/* {====================== open, close ====================== */

static mg_status open_log (mg_verify_log *l) {
  mg_context *ctx = mg_ctx();
  if (ctx->verify.n == MG_VERIFY_DEPTH)
    return mg_seterror("%s: verify: more than %d verified recomputes inside one another", l->fn, MG_VERIFY_DEPTH);
  ctx->verify.log[ctx->verify.n++] = l;
  ctx->hooks.seen = seen;
  ctx->hooks.on_assign = refuse_assign;
  return MG_OK;
}

static void close_log (mg_verify_log *l) {
  mg_context *ctx = mg_ctx();
  (void)l;                              /* read by the assertion alone */
  mg_assert(ctx->verify.n > 0 && ctx->verify.log[ctx->verify.n - 1] == l);
  if (--ctx->verify.n == 0) {
    ctx->hooks.seen = NULL;
    ctx->hooks.on_assign = NULL;
  }
}

mg_verify_log *mg_verify_note (const char *fn) {
  mg_verify_log *l = (mg_verify_log *)calloc(1, sizeof *l);
  if (l == NULL) return mg_seterror("%s: verify: out of memory", fn), NULL;
  l->fn = fn;
  l->at = -1;
  if (open_log(l) != MG_OK) {
    free(l);
    return NULL;
  }
  return l;
}

void mg_verify_noted (mg_verify_log *l) {
  if (l) close_log(l);
}

mg_status mg_verify_check (mg_verify_log *l) {
  l->at = 0;
  return open_log(l);
}

mg_status mg_verify_checked (mg_verify_log *l, mg_status st) {
  close_log(l);
  if (st == MG_OK && l->at != l->n)
    return mg_seterror("%s: verify: the re-run ran %lld ops, the first run %lld (the next was " MG_POS1
                       ", %s); the function must run the same ops each time", l->fn, (long long)l->at,
                       (long long)l->n, (long long)l->at, l->e[l->at].op);
  return st;
}

void mg_verify_free (mg_verify_log *l) {
  if (l == NULL) return;
  free(l->e);
  free(l);
}

int mg_recompute_verify (int on) {
  mg_context *ctx = mg_ctx();
  int was = ctx->verify.all;
  if (on >= 0) ctx->verify.all = on != 0;
  return was;
}

bool mg_verify_wanted (const mg_function *fn) {
  return (fn->flags & MG_FN_VERIFY) || mg_ctx()->verify.all;
}

/* }========================================================== */

/*
** overlap.c — gradients reduced while the backward runs (dist.h's
** mg_dist_sync): buckets of whole gradients, filled as the tape's walk
** makes them and sent with nonblocking collectives, last bucket first.
**
** Layout, as ShardedOptimizer's (lua/moongrad/sharded.lua): the entries of
** each dtype end to end in one flat vector (a group), in list order; rank r
** of N owns elements floor(P r / N) .. floor(P (r + 1) / N) of a group of P.
** A bucket is a stretch of whole entries of one group, so a reduce-scatter
** of it gives each rank the part of its shard that falls in the stretch.
*/
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "dist/shared.h"

typedef struct entry {
  mg_tensor *like;            /* shape and dtype (retained) */
  int group, bucket;
  int64_t offset;             /* in the group's flat vector */
  bool filled;                /* its gradient is in the bucket */
} entry;

typedef struct group {
  mg_dtype dtype;
  int64_t total, lo, hi;      /* elements; this rank's shard [lo, hi) */
  mg_tensor *shard;           /* reduce-scatter: this rank's result */
} group;

enum { WAITING, IN_FLIGHT, DONE };

typedef struct bucket {
  int group, first, last;     /* its entries: members[first .. last) */
  int64_t lo, hi;             /* its stretch of the group's vector */
  int missing;                /* entries not filled yet */
  int state;
  mg_tensor *buf;             /* the stretch, made when its first gradient comes */
  int *counts;                /* reduce-scatter: each rank's share of the stretch */
} bucket;

struct mg_dist_sync {
  const char *fn;
  mg_dist_sync_mode mode;
  int n, ngroups, nbuckets;
  int next;                   /* the next bucket to send: they go last to first */
  double pre, post;
  entry *entries;
  group *groups;
  bucket *buckets;
  int *members;               /* entry indices, group after group, list order within one */
  unsigned char *present;     /* n: this rank made the gradient (then: any rank did) */
  MPI_Request *reqs;          /* one per bucket, MPI_REQUEST_NULL when none is in flight */
  int *done;                  /* MPI_Testsome's answer */
  int in_flight;
  double tested_at;           /* when progress last called MPI (MPI_Wtime) */
};

static int64_t numel_of (const entry *e) { return e->like->numel; }

/* {---- the layout ---- */

static mg_status make_groups (mg_dist_sync *s, mg_tensor *const *like) {
  for (int i = 0; i < s->n; i++) {
    int g = 0;
    while (g < s->ngroups && s->groups[g].dtype != like[i]->dtype) g++;
    if (g == s->ngroups) s->groups[s->ngroups++] = (group){.dtype = like[i]->dtype};
    entry *e = &s->entries[i];
    e->like = mg_tensor_retain(like[i]);
    e->group = g;
    e->offset = s->groups[g].total;
    s->groups[g].total += like[i]->numel;
    if (like[i]->numel > INT_MAX)
      return mg_seterror("%s: gradient " MG_POS " has %lld elements; an overlapped sync sends at most %d at once",
                         s->fn, (long long)i, (long long)like[i]->numel, INT_MAX);
  }
  int at = 0;
  for (int g = 0; g < s->ngroups; g++) {
    for (int i = 0; i < s->n; i++)
      if (s->entries[i].group == g) s->members[at++] = i;
    group *gr = &s->groups[g];
    mg_dist_shard_range(gr->total, mg_dist_size(), mg_dist_rank(), &gr->lo, &gr->hi);
  }
  return MG_OK;
}

/* buckets of whole entries, at most fusion bytes each (one entry at least), within a group */
static mg_status make_buckets (mg_dist_sync *s, int64_t fusion) {
  for (int a = 0, b; a < s->n; a = b) {
    const entry *first = &s->entries[s->members[a]];
    size_t es = mg_dtype_size(first->like->dtype);
    int64_t count = numel_of(first);
    for (b = a + 1; b < s->n; b++) {
      const entry *e = &s->entries[s->members[b]];
      if (e->group != first->group || (count + numel_of(e)) * (int64_t)es > fusion || count + numel_of(e) > INT_MAX) break;
      count += numel_of(e);
    }
    bucket *k = &s->buckets[s->nbuckets];
    *k = (bucket){.group = first->group, .first = a, .last = b, .lo = first->offset, .hi = first->offset + count,
                  .missing = b - a, .state = WAITING};
    if (s->mode == MG_DIST_SYNC_REDUCE_SCATTER && (k->counts = calloc((size_t)mg_dist_size(), sizeof(int))) == NULL)
      return mg_seterror("%s: out of memory", s->fn);
    for (int j = a; j < b; j++) s->entries[s->members[j]].bucket = s->nbuckets;
    s->nbuckets++;
  }
  return MG_OK;
}

mg_dist_sync *mg_dist_sync_begin (const char *fn, mg_tensor *const *like, int n, mg_dist_sync_mode mode,
                                  double prescale, double postscale, int64_t fusion_bytes) {
  if (mg_dist_need_init(fn) != MG_OK) return NULL;
  if (n < 0 || n > INT_MAX / MG_DIST_DESC) {
    mg_seterror("%s: %d gradients; at most %d at once", fn, n, INT_MAX / MG_DIST_DESC);
    return NULL;
  }
  mg_dist_sync *s = calloc(1, sizeof *s);
  int64_t *desc = malloc(sizeof(int64_t) * MG_DIST_DESC * (size_t)(n ? n : 1));
  size_t m = (size_t)(n ? n : 1);
  mg_dist_header h = {.kind = mode == MG_DIST_SYNC_ALLREDUCE ? MG_DIST_CALL_SYNC_ALLREDUCE
                                                             : MG_DIST_CALL_SYNC_REDUCE_SCATTER,
                      .op = MG_DIST_SUM, .root = -1, .dtype = -1, .count = n,
                      .fusion = fusion_bytes < 1 ? 1 : fusion_bytes, .prescaled = prescale != 1.0};
  memcpy(&h.scale, &postscale, sizeof postscale);
  if (s != NULL) {
    *s = (mg_dist_sync){.fn = fn, .mode = mode, .n = n, .pre = prescale, .post = postscale,
                        .entries = calloc(m, sizeof(entry)), .groups = calloc(m, sizeof(group)),
                        .buckets = calloc(m, sizeof(bucket)), .members = calloc(m, sizeof(int)),
                        .present = calloc(m, 1), .reqs = malloc(m * sizeof(MPI_Request)),
                        .done = calloc(m, sizeof(int))};
  }
  if (s == NULL || desc == NULL || !s->entries || !s->groups || !s->buckets || !s->members || !s->present ||
      !s->reqs || !s->done) {
    mg_seterror("%s: out of memory for a list of %d gradients", fn, n);
    h.failed = 1;
  }
  if (!h.failed) h.failed = make_groups(s, like) != MG_OK || make_buckets(s, h.fusion) != MG_OK;
  for (int i = 0; i < n && !h.failed; i++) {
    mg_dist_describe_entry(desc + (size_t)i * MG_DIST_DESC, like[i]);
    h.bytes += like[i]->numel * (int64_t)mg_dtype_size(like[i]->dtype);
  }
  h.hash = h.failed ? 0 : mg_dist_hash_list(desc, n);
  mg_status st = mg_dist_agree_list(fn, &h, "gradient", desc);
  for (int g = 0; s && g < s->ngroups && st == MG_OK; g++)   /* the same dtypes everywhere: the same answer */
    if (!mg_is_floating(s->groups[g].dtype))
      st = mg_seterror("%s: the variables must be float tensors to have gradients, got a %s one", fn,
                       mg_dtype_name(s->groups[g].dtype));
  free(desc);
  if (st != MG_OK) {
    mg_dist_sync_free(s);
    return NULL;
  }
  s->next = s->nbuckets - 1;
  for (int k = 0; k < s->nbuckets; k++) s->reqs[k] = MPI_REQUEST_NULL;
  return s;
}

int mg_dist_sync_groups (const mg_dist_sync *s) { return s->ngroups; }

/* }---- */

/* {---- the buckets in flight ---- */

/* the bucket's stretch, made when its first gradient comes (or at its send) */
static mg_status make_buffer (const mg_dist_sync *s, bucket *b) {
  int64_t count = b->hi - b->lo;
  if (b->buf == NULL && (b->buf = mg_empty(&count, 1, s->groups[b->group].dtype)) == NULL) return MG_ERR;
  return MG_OK;
}

static mg_status send (mg_dist_sync *s, bucket *b) {
  group *g = &s->groups[b->group];
  size_t es = mg_dtype_size(g->dtype);
  int64_t count = b->hi - b->lo;
  if (make_buffer(s, b) != MG_OK) return MG_ERR;
  /* the shard is made at its group's first send, not at the walk's start, where the activations peak */
  int64_t len = g->hi - g->lo;
  if (s->mode == MG_DIST_SYNC_REDUCE_SCATTER && g->shard == NULL && (g->shard = mg_empty(&len, 1, g->dtype)) == NULL)
    return MG_ERR;
  char *buf = mg_ptr(b->buf);
  for (int j = b->first; j < b->last; j++) {         /* a gradient no node made here: zeros */
    const entry *e = &s->entries[s->members[j]];
    if (!e->filled) memset(buf + (e->offset - b->lo) * (int64_t)es, 0, (size_t)numel_of(e) * es);
  }
  MPI_Datatype type = mg_dist_mpi_type(g->dtype);
  MPI_Op op = mg_dist_mpi_op(g->dtype, MG_DIST_SUM);
  int rc;
  mg_dist_counts.calls++;
  mg_dist_counts.bytes += count * (int64_t)es;
  if (s->mode == MG_DIST_SYNC_ALLREDUCE) {
    rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, type, op, MPI_COMM_WORLD, &s->reqs[b - s->buckets]);
  } else {
    for (int q = 0; q < mg_dist_size(); q++) {
      int64_t lo, hi;
      mg_dist_shard_range(g->total, mg_dist_size(), q, &lo, &hi);
      lo = lo > b->lo ? lo : b->lo;
      hi = hi < b->hi ? hi : b->hi;
      b->counts[q] = hi > lo ? (int)(hi - lo) : 0;
    }
    int64_t from = b->lo > g->lo ? b->lo : g->lo;     /* where this rank's part of the stretch lands */
    char *recv = b->counts[mg_dist_rank()] ? (char *)mg_ptr(g->shard) + (from - g->lo) * (int64_t)es : NULL;
    rc = MPI_Ireduce_scatter(buf, recv, b->counts, type, op, MPI_COMM_WORLD, &s->reqs[b - s->buckets]);
  }
  if (rc != MPI_SUCCESS) return mg_dist_mpi_fail(s->fn, rc);
  b->state = IN_FLIGHT;
  s->in_flight++;
  return MG_OK;
}

/* a bucket whose collective completed: scaled; a reduce-scatter's buffer goes */
static void landed (mg_dist_sync *s, bucket *b) {
  group *g = &s->groups[b->group];
  b->state = DONE;
  s->in_flight--;
  if (s->mode == MG_DIST_SYNC_ALLREDUCE) {
    mg_dist_scale(mg_ptr(b->buf), b->hi - b->lo, g->dtype, s->post);
    return;
  }
  int64_t from = b->lo > g->lo ? b->lo : g->lo;
  int mine = b->counts[mg_dist_rank()];
  if (mine) mg_dist_scale((char *)mg_ptr(g->shard) + (from - g->lo) * (int64_t)mg_dtype_size(g->dtype), mine, g->dtype, s->post);
  mg_tensor_release(b->buf);
  b->buf = NULL;
}

/* sends the full buckets whose turn it is (last to first, the same order on every rank) */
static mg_status send_ready (mg_dist_sync *s) {
  while (s->next >= 0 && s->buckets[s->next].missing == 0)
    if (send(s, &s->buckets[s->next--]) != MG_OK) return MG_ERR;
  return MG_OK;
}

/* One MPI_Testsome over the buckets in flight moves them on (Open MPI
** progresses a nonblocking collective only inside MPI calls) and lands the
** finished ones. At most every 50 us: each call polls every transport, and
** the walk ticks after every op. */
void mg_dist_sync_progress (mg_dist_sync *s) {
  double now = MPI_Wtime();
  if (s->in_flight == 0 || now - s->tested_at < 50e-6) return;
  s->tested_at = now;
  int count = 0;
  if (MPI_Testsome(s->nbuckets, s->reqs, &count, s->done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return;
  for (int j = 0; j < count && count != MPI_UNDEFINED; j++) landed(s, &s->buckets[s->done[j]]);
}

mg_status mg_dist_sync_ready (mg_dist_sync *s, int i, mg_tensor *grad) {
  if (i < 0 || i >= s->n) return mg_seterror("%s: no gradient " MG_POS " in a list of %d", s->fn, (long long)i, s->n);
  entry *e = &s->entries[i];
  bucket *b = &s->buckets[e->bucket];
  group *g = &s->groups[e->group];
  if (e->filled || b->state != WAITING)
    return mg_seterror("%s: gradient " MG_POS " came twice", s->fn, (long long)i);
  if (!mg_same_shape(grad->shape, grad->ndim, e->like->shape, e->like->ndim)) {
    char a[160], c[160];
    return mg_seterror("%s: gradient " MG_POS " has shape %s, its variable %s", s->fn, (long long)i,
                       mg_shape_str(a, sizeof a, grad->shape, grad->ndim),
                       mg_shape_str(c, sizeof c, e->like->shape, e->like->ndim));
  }
  if (make_buffer(s, b) != MG_OK) return MG_ERR;
  /* a float32 sum of a half variable's gradients (the walk's) is narrowed here */
  mg_tensor *c = grad->dtype == g->dtype ? mg_contiguous(grad) : mg_cast(grad, g->dtype);
  if (c == NULL) return MG_ERR;
  size_t es = mg_dtype_size(g->dtype);
  mg_dist_copy_scaled((char *)mg_ptr(b->buf) + (e->offset - b->lo) * (int64_t)es, mg_ptr(c), c->numel, g->dtype, s->pre);
  mg_tensor_release(c);
  e->filled = true;
  s->present[i] = 1;
  b->missing--;
  mg_status st = send_ready(s);
  mg_dist_sync_progress(s);
  return st;
}

/* }---- */

/* {---- the end ---- */

/* Waits for every bucket in flight, at most the timeout. A nonblocking
** collective moves only while this rank calls MPI, so the first 5 ms spin
** (a nap per test would add its wake-up to every step of the collective's
** schedule); a longer wait naps, leaving the core. */
static mg_status wait_all (mg_dist_sync *s) {
  double start = MPI_Wtime();
  while (s->in_flight > 0) {
    int count = 0, rc = MPI_Testsome(s->nbuckets, s->reqs, &count, s->done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mg_dist_mpi_fail(s->fn, rc);
    for (int j = 0; j < count && count != MPI_UNDEFINED; j++) landed(s, &s->buckets[s->done[j]]);
    if (s->in_flight > 0 && mg_dist_waited_out(start, 5e-3, 0.1)) {
      return mg_seterror("%s: timed out after %g s waiting for the other ranks' gradients: a rank did not send "
                         "them (it failed or hangs, or makes other collective calls); the timeout is "
                         "mg.distributed.init{timeout = seconds} or MOONGRAD_DIST_TIMEOUT (0: no timeout)",
                         s->fn, mg_dist_timeout());
    }
  }
  return MG_OK;
}

/* entry i's gradient: a view of its stretch of the bucket's buffer */
static mg_tensor *view_of (mg_dist_sync *s, int i) {
  const entry *e = &s->entries[i];
  const bucket *b = &s->buckets[e->bucket];
  int64_t strides[MG_MAX_DIMS];
  mg_contiguous_strides(e->like->shape, e->like->ndim, strides);
  return mg_tensor_view(b->buf->storage, e->like->dtype, e->like->shape, e->like->ndim, strides,
                        b->buf->offset + (e->offset - b->lo));
}

mg_status mg_dist_sync_end (mg_dist_sync *s, mg_tensor **out, unsigned char *present) {
  double start = MPI_Wtime();
  mg_status st = MG_OK;
  for (; s->next >= 0 && st == MG_OK; s->next--) st = send(s, &s->buckets[s->next]);
  if (st == MG_OK) st = wait_all(s);
  MPI_Request req;                                    /* which gradients any rank made */
  int rc = st == MG_OK ? MPI_Iallreduce(MPI_IN_PLACE, s->present, s->n, MPI_UNSIGNED_CHAR, MPI_BOR, MPI_COMM_WORLD, &req)
                       : MPI_SUCCESS;
  if (st == MG_OK) {
    mg_dist_counts.calls++;
    st = rc == MPI_SUCCESS ? mg_dist_wait(s->fn, &req) : mg_dist_mpi_fail(s->fn, rc);
  }
  mg_dist_counts.waited += MPI_Wtime() - start;
  if (st != MG_OK) return MG_ERR;
  if (s->mode == MG_DIST_SYNC_REDUCE_SCATTER) {
    for (int g = 0; g < s->ngroups; g++) out[g] = mg_tensor_retain(s->groups[g].shard);
    memcpy(present, s->present, (size_t)s->n);
    return MG_OK;
  }
  for (int i = 0; i < s->n; i++) out[i] = NULL;
  for (int i = 0; i < s->n; i++) {
    if (s->present[i] && (out[i] = view_of(s, i)) == NULL) {
      for (int j = 0; j < i; j++) { mg_tensor_release(out[j]); out[j] = NULL; }
      return MG_ERR;
    }
  }
  return MG_OK;
}

/* A failed walk leaves buckets in flight. The other ranks sent the same
** ones (every rank sends in the same order) or will, so they are finished,
** with the timeout, keeping the walk's error: then the ranks are still in
** step and a pcall may go on. Only if that wait fails is MPI given up. */
static void finish_in_flight (mg_dist_sync *s) {
  char why[1024];
  snprintf(why, sizeof why, "%s", mg_errmsg_raw());
  if (wait_all(s) != MG_OK) mg_dist_broken = 1;
  mg_seterror("%s", why);
}

void mg_dist_sync_free (mg_dist_sync *s) {
  if (s == NULL) return;
  if (s->in_flight > 0) finish_in_flight(s);
  bool pending = false;
  for (int k = 0; s->buckets && k < s->nbuckets; k++) {
    bucket *b = &s->buckets[k];
    int done = 0;
    if (b->state == IN_FLIGHT && !(MPI_Test(&s->reqs[k], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)) {
      pending = true;                                  /* MPI may still write there: left allocated */
      continue;
    }
    mg_tensor_release(b->buf);
    free(b->counts);
  }
  for (int i = 0; s->entries && i < s->n; i++) mg_tensor_release(s->entries[i].like);
  if (pending) {
    mg_dist_broken = 1;
    return;                                            /* the groups' shards too: a receive buffer */
  }
  for (int g = 0; s->groups && g < s->ngroups; g++) mg_tensor_release(s->groups[g].shard);
  free(s->entries);
  free(s->groups);
  free(s->buckets);
  free(s->members);
  free(s->present);
  free(s->reqs);
  free(s->done);
  free(s);
}

/* }---- */

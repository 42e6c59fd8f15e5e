/*
** mpi.c — mg.distributed's collectives on Open MPI (MPI_COMM_WORLD).
**
** Tensors are reduced in one buffer with MPI_IN_PLACE: a tensor's result is
** the only copy made, and a variable nobody else holds is reduced in its own
** storage. Before any buffer is sized, every call exchanges one small header
** (dist.h's mg_dist_header) with every rank: each header is validated (a
** peer's dims, ndim and byte counts are not trusted to size anything) and
** compared with rank 0's, so ranks that disagree on the call, its op, root,
** dtype, shape or list all get the same error, and no data moves. Whatever a
** call allocates is allocated before its agreement, so no rank can fail
** between the agreement and the data; a rank that failed to prepare says so
** in its header. The header exchange is the one wait without a bound in
** MPI's own calls, so it is nonblocking and waited for at most the timeout.
** float16 and bfloat16 reduce through user-defined MPI ops that compute in
** float32. Errors return (MPI_ERRORS_RETURN) and become the caller's Lua error.
*/
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "core/core.h"
#include "dist/dist.h"
#include "dist/shared.h"

static int started;                   /* MPI_Init_thread called by us */
static int world_rank, world_size;
static int local_size = 1;            /* ranks on this rank's machine (MPI_COMM_TYPE_SHARED) */
mg_dist_stats mg_dist_counts;
static MPI_Op half_ops[2][3];         /* [float16, bfloat16][sum, max, min] */
/* the fusion buffer, kept from step to step as Horovod's: a fresh one per
** step cost page faults on every call (64 MiB: 148 ms instead of 20) */
static void *fusion;
static size_t fusion_cap;

/* the agreement's buffers, sized at init: nothing is allocated between a
** call's agreement and its data */
static mg_dist_header *hdrs;          /* every rank's header of the call in progress (world_size) */
static mg_dist_header my_header;      /* the one sent (MPI may read it after a timeout) */
static int64_t *gather_bytes;         /* allgather: each rank's bytes, from its validated header */
static int *gather_counts, *gather_displs;   /* allgatherv's, world_size each */
static double timeout_s = MG_DIST_DEFAULT_TIMEOUT;
static int timeout_given;             /* set by mg_dist_set_timeout: the environment's is not read */
int mg_dist_broken;                    /* an exchange timed out and is still pending */

#define CHUNK    (1 << 28)            /* elements or bytes per MPI call: counts are ints */
#define DESC     MG_DIST_DESC
#define MAX_LIST (INT_MAX / DESC)     /* a list's entries, so that an exchange of them counts in an int */

mg_status mg_dist_mpi_fail (const char *fn, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return mg_seterror("%s: MPI failed on rank %d: %s", fn, world_rank, msg);
}

mg_status mg_dist_need_init (const char *fn) {
  if (started && mg_dist_initialized()) return MG_OK;
  return mg_seterror("%s: mg.distributed is not initialized; call mg.distributed.init() first "
                     "(and start the program with mpirun)", fn);
}

/* {=================== float16 and bfloat16 =================== */

/* combines n values of b into a (float32 copies of both) by op k */
static void combine (float *a, const float *b, int n, int k) {
  for (int i = 0; i < n; i++)
    a[i] = k == 0 ? a[i] + b[i] : k == 1 ? (a[i] > b[i] || a[i] != a[i] ? a[i] : b[i])
                                         : (a[i] < b[i] || a[i] != a[i] ? a[i] : b[i]);
}

static void half_op (void *in, void *inout, int *len, mg_dtype dt, int k) {
  float a[512], b[512];
  for (int done = 0; done < *len; done += 512) {
    int n = *len - done < 512 ? *len - done : 512;
    char *pa = (char *)inout + (size_t)done * 2, *pb = (char *)in + (size_t)done * 2;
    mg_convert(a, MG_FLOAT32, pa, dt, n);
    mg_convert(b, MG_FLOAT32, pb, dt, n);
    combine(a, b, n, k);
    mg_convert(pa, dt, a, MG_FLOAT32, n);
  }
}

#define HALF_OP(name, dt, k) \
  static void name (void *in, void *io, int *len, MPI_Datatype *d) { (void)d; half_op(in, io, len, dt, k); }
HALF_OP(f16_sum, MG_FLOAT16, 0)
HALF_OP(f16_max, MG_FLOAT16, 1)
HALF_OP(f16_min, MG_FLOAT16, 2)
HALF_OP(bf16_sum, MG_BFLOAT16, 0)
HALF_OP(bf16_max, MG_BFLOAT16, 1)
HALF_OP(bf16_min, MG_BFLOAT16, 2)

static void make_half_ops (void) {
  MPI_User_function *fns[2][3] = {{f16_sum, f16_max, f16_min}, {bf16_sum, bf16_max, bf16_min}};
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 3; k++) MPI_Op_create(fns[i][k], 1, &half_ops[i][k]);
}

/* }============================================================ */


/* {========================= the world ========================= */

mg_status mg_dist_set_timeout (double seconds) {
  if (!(seconds >= 0 && seconds <= 1e9))
    return mg_seterror("timeout: seconds must be a number from 0 (no timeout) to 1e9, got %g", seconds);
  timeout_s = seconds;
  timeout_given = 1;
  return MG_OK;
}

double mg_dist_timeout (void) { return timeout_s; }

/* MOONGRAD_DIST_TIMEOUT, unless mg_dist_set_timeout came first */
static mg_status timeout_from_env (void) {
  const char *s = getenv("MOONGRAD_DIST_TIMEOUT");
  if (s == NULL || s[0] == '\0' || timeout_given) return MG_OK;
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= 0 && v <= 1e9))
    return mg_seterror("init: MOONGRAD_DIST_TIMEOUT must be a number of seconds from 0 (no timeout) to 1e9, "
                       "got '%.40s'", s);
  timeout_s = v;
  return MG_OK;
}

mg_status mg_dist_init (void) {
  if (started) return MG_OK;
  if (timeout_from_env() != MG_OK) return MG_ERR;
  int done = 0, provided = 0;
  MPI_Finalized(&done);
  if (done) return mg_seterror("init: MPI was finalized in this process; it cannot start again");
  MPI_Initialized(&done);
  /* The overlapped gradients' MPI_Iallreduce (overlap.c): libnbc's own pick
  ** on 2 ranks over shared memory reduced 12.8 MB in 15 ms, the blocking
  ** allreduce in 5-7, Rabenseifner's (3: a reduce-scatter, then an
  ** allgather) in 5-8. A setting of the user's (mpirun --mca) wins. */
  if (!done) setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
  if (!done && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return mg_seterror("init: MPI_Init_thread failed (is Open MPI installed? make deps)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm node;                               /* the ranks that share this machine's memory */
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
  }
  hdrs = malloc(sizeof *hdrs * (size_t)world_size);
  gather_bytes = malloc(sizeof(int64_t) * (size_t)world_size);
  gather_counts = malloc(sizeof(int) * 2 * (size_t)world_size);
  if (hdrs == NULL || gather_bytes == NULL || gather_counts == NULL) {
    free(hdrs);
    free(gather_bytes);
    free(gather_counts);
    hdrs = NULL;
    gather_bytes = NULL;
    gather_counts = NULL;
    return mg_seterror("init: out of memory for %d ranks' headers", world_size);
  }
  gather_displs = gather_counts + world_size;
  make_half_ops();
  started = 1;
  return MG_OK;
}

int mg_dist_initialized (void) {
  int init = 0, done = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&done);
  return started && init && !done;
}

int mg_dist_rank (void) { return world_rank; }
int mg_dist_size (void) { return world_size; }
int mg_dist_local_size (void) { return local_size; }
mg_dist_stats mg_dist_get_stats (void) { return mg_dist_counts; }

void mg_dist_finalize (void) {
  if (!mg_dist_initialized()) return;
  if (mg_dist_broken) {                 /* MPI_Finalize would wait for the exchange that timed out */
    fprintf(stderr, "moongrad: rank %d of %d had a collective time out; stopping every rank\n", world_rank, world_size);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 3; k++) MPI_Op_free(&half_ops[i][k]);
  free(fusion);
  fusion = NULL;
  fusion_cap = 0;
  free(hdrs);
  free(gather_bytes);
  free(gather_counts);
  hdrs = NULL;
  gather_bytes = NULL;
  gather_counts = gather_displs = NULL;
  MPI_Finalize();
}

void mg_dist_abort (int code) {
  if (!mg_dist_initialized()) return;
  fprintf(stderr, "moongrad: rank %d of %d failed (the error above); stopping every rank\n", world_rank, world_size);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

/* }============================================================ */


/* {================= agreement: the call header ================= */

static const char *const call_names[MG_DIST_CALL__COUNT] = {   /* ORDER mg_dist_call */
  [MG_DIST_CALL_BARRIER] = "barrier", [MG_DIST_CALL_ALLREDUCE] = "allreduce",
  [MG_DIST_CALL_BROADCAST] = "broadcast", [MG_DIST_CALL_ALLGATHER] = "allgather",
  [MG_DIST_CALL_ALLGATHER_READY] = "allgather's second step",
  [MG_DIST_CALL_ALLREDUCE_MANY] = "allreduce of a list (DistributedOptimizer)",
  [MG_DIST_CALL_BROADCAST_MANY] = "broadcast of a list of variables",
  [MG_DIST_CALL_REDUCE_SCATTER] = "reduce_scatter",
  [MG_DIST_CALL_SYNC_ALLREDUCE] = "an overlapped allreduce of the gradients (DistributedOptimizer)",
  [MG_DIST_CALL_SYNC_REDUCE_SCATTER] = "an overlapped reduce-scatter of the gradients (ShardedOptimizer)"};

static const char *const op_names[] = {"'sum'", "'mean'", "'max'", "'min'"};   /* ORDER mg_dist_op */

static void nap (long ns) {
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

bool mg_dist_waited_out (double start, double spin_s, double long_s) {
  double waited = MPI_Wtime() - start;
  if (timeout_s > 0 && waited >= timeout_s) {
    mg_dist_broken = 1;
    return true;
  }
  if (waited > spin_s) nap(waited < long_s ? 20000 : 1000000);
  return false;
}

/* Waits for req at most timeout_s seconds (0: for ever): spinning for the
** first 0.1 ms, for a peer a few microseconds behind, then napping (20 us,
** after 10 ms 1 ms) so that a long wait leaves the core to the others. After
** a timeout the request stays pending (a collective cannot be cancelled):
** MPI is unusable in this process from then on. */
mg_status mg_dist_wait (const char *fn, MPI_Request *req) {
  double start = MPI_Wtime();
  for (;;) {
    int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mg_dist_mpi_fail(fn, rc);
    if (done) return MG_OK;
    if (mg_dist_waited_out(start, 1e-4, 1e-2)) {
      char who[32] = "a rank";
      if (world_size == 2) snprintf(who, sizeof who, "rank %d", 1 - world_rank);
      return mg_seterror("%s: timed out after %g s waiting for the other ranks: %s did not arrive (it hangs, or "
                         "makes fewer collective calls than rank %d); the timeout is "
                         "mg.distributed.init{timeout = seconds} or MOONGRAD_DIST_TIMEOUT (0: no timeout)",
                         fn, timeout_s, who, world_rank);
    }
  }
}

/* n int64 values from every rank into all (n per rank, rank after rank), waited for as above */
static mg_status gather_i64 (const char *fn, const int64_t *mine, int n, int64_t *all) {
  if (mg_dist_broken)
    return mg_seterror("%s: a collective timed out on this rank before; MPI cannot be used again in this process", fn);
  MPI_Request req;
  mg_dist_counts.calls++;
  int rc = MPI_Iallgather(mine, n, MPI_INT64_T, all, n, MPI_INT64_T, MPI_COMM_WORLD, &req);
  return rc != MPI_SUCCESS ? mg_dist_mpi_fail(fn, rc) : mg_dist_wait(fn, &req);
}

/* dims x dtype size of a header whose dims are >= 0, into *out; 0 when it overflows */
static int header_bytes (const mg_dist_header *h, int64_t *out) {
  int64_t n = (int64_t)mg_dtype_size((mg_dtype)h->dtype);
  for (int d = 0; d < h->ndim; d++)
    if (h->dims[d] == 0) n = 0;
  for (int d = 0; d < h->ndim && n > 0; d++) {
    if (n > INT64_MAX / h->dims[d]) return 0;
    n *= h->dims[d];
  }
  *out = n;
  return 1;
}

/* a valid header's tensor, as "float32 (2,3)" */
static void describe (char *buf, size_t n, const mg_dist_header *h) {
  char shape[160];
  if (h->dtype < 0) {
    snprintf(buf, n, "no tensor");
    return;
  }
  snprintf(buf, n, "%s %s", mg_dtype_name((mg_dtype)h->dtype), mg_shape_str(shape, sizeof shape, h->dims, (int)h->ndim));
}

/* rank r's header checked field by field before any of it is used: its
** dims, ndim and bytes would otherwise size buffers */
static mg_status check_header (const char *fn, int r) {
  const mg_dist_header *h = &hdrs[r];
  char why[240] = "", what[200];
  int64_t want = 0;
  if (h->magic != MG_DIST_MAGIC)
    snprintf(why, sizeof why, "it is not a moongrad call header (another program, or another version of moongrad?)");
  else if (h->kind < 1 || h->kind >= MG_DIST_CALL__COUNT) snprintf(why, sizeof why, "unknown call %lld", (long long)h->kind);
  else if (h->failed != 0 && h->failed != 1) snprintf(why, sizeof why, "failure flag %lld", (long long)h->failed);
  else if (h->op < -1 || h->op > MG_DIST_MIN) snprintf(why, sizeof why, "unknown op %lld", (long long)h->op);
  else if (h->dtype < -1 || h->dtype >= MG_DTYPE__COUNT) snprintf(why, sizeof why, "unknown dtype %lld", (long long)h->dtype);
  else if (h->ndim < 0 || h->ndim > MG_MAX_DIMS)
    snprintf(why, sizeof why, "%lld dimensions (at most %d)", (long long)h->ndim, MG_MAX_DIMS);
  else if (h->count < 0 || h->count > MAX_LIST)
    snprintf(why, sizeof why, "a list of %lld entries (at most %d)", (long long)h->count, MAX_LIST);
  else if (h->fusion < 0) snprintf(why, sizeof why, "fusion_bytes %lld", (long long)h->fusion);
  else if (h->prescaled != 0 && h->prescaled != 1) snprintf(why, sizeof why, "prescale flag %lld", (long long)h->prescaled);
  for (int d = 0; !why[0] && d < h->ndim; d++)
    if (h->dims[d] < 0) snprintf(why, sizeof why, "dimension " MG_POS " is %lld", (long long)d, (long long)h->dims[d]);
  if (!why[0] && h->dtype >= 0) {
    describe(what, sizeof what, h);
    if (!header_bytes(h, &want)) snprintf(why, sizeof why, "%s is more than 2^63 bytes", what);
    else if (h->bytes != want)
      snprintf(why, sizeof why, "it gives %lld bytes for %s, which has %lld", (long long)h->bytes, what, (long long)want);
  }
  if (!why[0] && h->bytes < 0) snprintf(why, sizeof why, "it gives %lld bytes", (long long)h->bytes);
  return why[0] ? mg_seterror("%s: rank %d sent an invalid call header: %s", fn, r, why) : MG_OK;
}

/* Sends mine, receives every rank's header into hdrs and checks each. An
** error when a rank could not prepare the call: that rank keeps its own
** message (set before), the others name the first rank that failed. */
static mg_status exchange (const char *fn, const mg_dist_header *mine) {
  my_header = *mine;
  my_header.magic = MG_DIST_MAGIC;
  if (gather_i64(fn, (const int64_t *)(const void *)&my_header, MG_DIST_HEADER_N, (int64_t *)(void *)hdrs) != MG_OK)
    return MG_ERR;
  for (int r = 0; r < world_size; r++)
    if (check_header(fn, r) != MG_OK) return MG_ERR;
  if (hdrs[world_rank].failed) return MG_ERR;
  for (int r = 0; r < world_size; r++)
    if (hdrs[r].failed) return mg_seterror("%s: rank %d could not prepare its side of the call (its own error says why)", fn, r);
  return MG_OK;
}

static mg_status differ (const char *fn, const char *what, int r, const char *a, const char *b) {
  return mg_seterror("%s: ranks disagree on %s: rank 0 gives %s, rank %d gives %s", fn, what, a, r, b);
}

static mg_status differ_num (const char *fn, const char *what, int r, int64_t a, int64_t b) {
  char x[24], y[24];
  snprintf(x, sizeof x, "%lld", (long long)a);
  snprintf(y, sizeof y, "%lld", (long long)b);
  return differ(fn, what, r, x, y);
}

static const char *op_name (int64_t op) { return op < 0 ? "none" : op_names[op]; }

/* The first field, in this order, where a rank's header differs from rank
** 0's: kind, op, root, dtype, the shape from axis `from`, the list's length
** (a number of `plural`), fusion_bytes, the scale. The headers are every
** rank's, so the error is the same on every rank. */
static mg_status agree (const char *fn, int from, const char *plural) {
  const mg_dist_header *a = &hdrs[0], *b;
  char x[240], y[240];
  for (int r = 1; r < world_size; r++)
    if ((b = &hdrs[r])->kind != a->kind)
      return mg_seterror("%s: ranks disagree on the call: rank 0 calls %s, rank %d calls %s", fn, call_names[a->kind], r,
                         call_names[b->kind]);
  for (int r = 1; r < world_size; r++)
    if ((b = &hdrs[r])->op != a->op) return differ(fn, "op", r, op_name(a->op), op_name(b->op));
  for (int r = 1; r < world_size; r++)
    if ((b = &hdrs[r])->root != a->root) return differ_num(fn, "root", r, a->root, b->root);
  for (int r = 1; r < world_size; r++) {
    b = &hdrs[r];
    int same = b->ndim == a->ndim;
    for (int d = from; same && d < a->ndim; d++) same = a->dims[d] == b->dims[d];
    if (b->dtype != a->dtype || !same) {
      describe(x, sizeof x, a);
      describe(y, sizeof y, b);
      return differ(fn, b->dtype != a->dtype ? "the dtype" : from ? "the shape after the first axis" : "the shape", r, x, y);
    }
  }
  snprintf(x, sizeof x, "the number of %s", plural);
  for (int r = 1; r < world_size; r++)
    if ((b = &hdrs[r])->count != a->count) return differ_num(fn, x, r, a->count, b->count);
  for (int r = 1; r < world_size; r++)
    if ((b = &hdrs[r])->fusion != a->fusion) return differ_num(fn, "fusion_bytes", r, a->fusion, b->fusion);
  for (int r = 1; r < world_size; r++)
    if ((b = &hdrs[r])->scale != a->scale) {
      double sa, sb;                                /* the bits of postscale */
      memcpy(&sa, &a->scale, sizeof sa);
      memcpy(&sb, &b->scale, sizeof sb);
      snprintf(x, sizeof x, "%g", sa);
      snprintf(y, sizeof y, "%g", sb);
      return differ(fn, "the scale of the result", r, x, y);
    }
  return MG_OK;
}

/* {--- lists: each entry described by DESC values, hashed into the header */

void mg_dist_describe_entry (int64_t *e, const mg_tensor *t) {
  memset(e, 0, sizeof(int64_t) * DESC);
  if (t == NULL) return;
  e[0] = 1;
  e[1] = t->dtype;
  e[2] = t->ndim;
  memcpy(e + 3, t->shape, sizeof(int64_t) * (size_t)t->ndim);
}

/* FNV-1a over the entries' values */
int64_t mg_dist_hash_list (const int64_t *desc, int64_t n) {
  uint64_t h = UINT64_C(14695981039346656037);
  const unsigned char *p = (const unsigned char *)desc;
  for (size_t i = 0; i < sizeof(int64_t) * (size_t)n * DESC; i++) h = (h ^ p[i]) * UINT64_C(1099511628211);
  int64_t out;
  memcpy(&out, &h, sizeof out);
  return out;
}

/* one entry as "float32 (3,4)", "nil", or "an invalid entry" (a peer's) */
static void entry_str (char *buf, size_t n, const int64_t *e) {
  int ok = e[0] == 0 || (e[0] == 1 && e[1] >= 0 && e[1] < MG_DTYPE__COUNT && e[2] >= 0 && e[2] <= MG_MAX_DIMS);
  for (int d = 0; ok && e[0] && d < e[2]; d++) ok = e[3 + d] >= 0;
  if (!ok) snprintf(buf, n, "an invalid entry");
  else if (e[0] == 0) snprintf(buf, n, "nil");
  else {
    char shape[160];
    snprintf(buf, n, "%s %s", mg_dtype_name((mg_dtype)e[1]), mg_shape_str(shape, sizeof shape, e + 3, (int)e[2]));
  }
}

/* The lists' hashes differ (their lengths agree): one more exchange, of
** every entry, finds the first that differs. Its buffer stays allocated
** when the exchange times out (MPI may still write into it). */
static mg_status list_differs (const char *fn, const char *noun, const int64_t *mine, int64_t n) {
  size_t per = (size_t)n * DESC;
  int64_t *all = malloc(sizeof(int64_t) * per * ((size_t)world_size + 1));
  if (all == NULL) return mg_seterror("%s: ranks disagree on the %ss (out of memory to say which)", fn, noun);
  int64_t *sent = all + per * (size_t)world_size;
  memcpy(sent, mine, sizeof(int64_t) * per);
  if (gather_i64(fn, sent, (int)per, all) != MG_OK) {
    if (!mg_dist_broken) free(all);
    return MG_ERR;
  }
  char x[240], y[240];
  for (int64_t i = 0; i < n; i++)
    for (int r = 1; r < world_size; r++) {
      const int64_t *a = all + i * DESC, *b = all + (size_t)r * per + i * DESC;
      if (memcmp(a, b, sizeof(int64_t) * DESC) == 0) continue;
      entry_str(x, sizeof x, a);
      entry_str(y, sizeof y, b);
      free(all);
      return mg_seterror("%s: ranks disagree on %s " MG_POS ": rank 0 gives %s, rank %d gives %s%s", fn, noun,
                         (long long)i, x, r, y, strcmp(x, "nil") == 0 || strcmp(y, "nil") == 0
                         ? " (every rank must leave out the same ones)" : "");
    }
  free(all);
  return mg_seterror("%s: ranks disagree on the %ss: the same entries give another hash (another version of moongrad?)",
                     fn, noun);
}

/* the agreement on a list: its header (count, hash and the rest), then,
** when the hashes differ, the entry that differs */
mg_status mg_dist_agree_list (const char *fn, const mg_dist_header *mine, const char *noun, const int64_t *desc) {
  char plural[40];
  snprintf(plural, sizeof plural, "%ss", noun);
  if (exchange(fn, mine) != MG_OK || agree(fn, 0, plural) != MG_OK) return MG_ERR;
  for (int r = 1; r < world_size; r++)
    if (hdrs[r].hash != hdrs[0].hash) return list_differs(fn, noun, desc, mine->count);
  return MG_OK;
}

/* }--- */

/* the agreement on a collective over one tensor t (the dtype and shape this
** rank gives); failed: this rank could not prepare its side (its error is set) */
static mg_status agree_tensor (const char *fn, mg_dist_call kind, int op, int64_t root, const mg_tensor *t, int failed,
                               int from) {
  mg_dist_header h = {.kind = kind, .failed = failed, .op = op, .root = root, .dtype = t->dtype, .ndim = t->ndim,
                      .bytes = t->numel * (int64_t)mg_dtype_size(t->dtype)};
  memcpy(h.dims, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  if (exchange(fn, &h) != MG_OK || agree(fn, from, "entries") != MG_OK) return MG_ERR;
  if (kind == MG_DIST_CALL_BROADCAST && (root < 0 || root >= world_size))
    return mg_seterror("%s: root must be a rank from 0 to %d, got %lld", fn, world_size - 1, (long long)root);
  return MG_OK;
}

/* barrier: an agreement on nothing but the call; every rank has arrived
** once every rank's header has */
mg_status mg_dist_barrier (const char *fn) {
  if (mg_dist_need_init(fn) != MG_OK) return MG_ERR;
  mg_dist_header h = {.kind = MG_DIST_CALL_BARRIER, .op = -1, .root = -1, .dtype = -1};
  return exchange(fn, &h) != MG_OK ? MG_ERR : agree(fn, 0, "entries");
}

/* }============================================================ */


/* {=============== raw buffers, after the agreement =============== */

MPI_Datatype mg_dist_mpi_type (mg_dtype dt) {
  switch (dt) {
    case MG_FLOAT32:  return MPI_FLOAT;
    case MG_FLOAT64:  return MPI_DOUBLE;
    case MG_INT64:    return MPI_INT64_T;
    case MG_BOOL:     return MPI_UINT8_T;
    default:          return MPI_UINT16_T;      /* float16, bfloat16: with our ops */
  }
}

static int is_float (mg_dtype dt) {
  return dt == MG_FLOAT32 || dt == MG_FLOAT64 || dt == MG_FLOAT16 || dt == MG_BFLOAT16;
}

MPI_Op mg_dist_mpi_op (mg_dtype dt, mg_dist_op op) {
  int k = op == MG_DIST_MAX ? 1 : op == MG_DIST_MIN ? 2 : 0;
  if (dt == MG_FLOAT16 || dt == MG_BFLOAT16) return half_ops[dt == MG_BFLOAT16][k];
  if (dt == MG_BOOL) return k == 2 ? MPI_LAND : MPI_LOR;     /* sum and max of bools: or */
  return k == 1 ? MPI_MAX : k == 2 ? MPI_MIN : MPI_SUM;
}

/* buf[0..n) *= s, for the float dtypes */
void mg_dist_scale (void *buf, int64_t n, mg_dtype dt, double s) {
  if (s == 1.0) return;
  if (dt == MG_FLOAT32) {
    float *p = buf, f = (float)s;
    for (int64_t i = 0; i < n; i++) p[i] *= f;
  } else if (dt == MG_FLOAT64) {
    double *p = buf;
    for (int64_t i = 0; i < n; i++) p[i] *= s;
  } else {
    float tmp[512];
    for (int64_t done = 0; done < n; done += 512) {
      int m = n - done < 512 ? (int)(n - done) : 512;
      char *p = (char *)buf + done * 2;
      mg_convert(tmp, MG_FLOAT32, p, dt, m);
      for (int i = 0; i < m; i++) tmp[i] *= (float)s;
      mg_convert(p, dt, tmp, MG_FLOAT32, m);
    }
  }
}

/* what op and scaling mean for dtype dt: the same answer on every rank,
** since they agree on both */
mg_status mg_dist_check_op (const char *fn, mg_dtype dt, mg_dist_op op, double pre, double post) {
  if (op == MG_DIST_MEAN && !is_float(dt))
    return mg_seterror("%s: op 'mean' is for float tensors, got %s (use 'sum')", fn, mg_dtype_name(dt));
  if (!is_float(dt) && (pre != 1.0 || post != 1.0))
    return mg_seterror("%s: scaling is for float tensors, got %s", fn, mg_dtype_name(dt));
  return MG_OK;
}

/* n values of dt at buf reduced in place across the ranks, in chunks of
** CHUNK elements (MPI counts are ints) */
static mg_status allreduce_buf (const char *fn, void *buf, int64_t n, mg_dtype dt, mg_dist_op op) {
  double post = 1.0;
  if (op == MG_DIST_MEAN) {
    op = MG_DIST_SUM;
    post = 1.0 / world_size;
  }
  size_t es = mg_dtype_size(dt);
  for (int64_t done = 0; done < n; done += CHUNK) {
    int m = n - done < CHUNK ? (int)(n - done) : CHUNK;
    mg_dist_counts.calls++;
    mg_dist_counts.bytes += (int64_t)m * (int64_t)es;
    int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + done * (int64_t)es, m, mg_dist_mpi_type(dt), mg_dist_mpi_op(dt, op),
                           MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mg_dist_mpi_fail(fn, rc);
  }
  mg_dist_scale(buf, n, dt, post);
  return MG_OK;
}

static mg_status bcast_buf (const char *fn, void *buf, int64_t nbytes, int root) {
  for (int64_t done = 0; done < nbytes; done += CHUNK) {
    int m = nbytes - done < CHUNK ? (int)(nbytes - done) : CHUNK;
    mg_dist_counts.calls++;
    mg_dist_counts.bytes += m;
    int rc = MPI_Bcast((char *)buf + done, m, MPI_BYTE, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mg_dist_mpi_fail(fn, rc);
  }
  return MG_OK;
}

/* every rank's gather_bytes[q], rank after rank, into recv (total bytes in
** all, from the validated headers); this rank's from send. Within INT_MAX
** bytes one MPI_Allgatherv, above it one chunked broadcast per rank. */
static mg_status allgather_buf (const char *fn, const void *send, void *recv, int64_t total) {
  int64_t mine = gather_bytes[world_rank], at = 0;
  if (total <= INT_MAX) {
    for (int q = 0; q < world_size; q++) {
      gather_counts[q] = (int)gather_bytes[q];
      gather_displs[q] = (int)at;
      at += gather_bytes[q];
    }
    mg_dist_counts.calls++;
    mg_dist_counts.bytes += total;
    int rc = MPI_Allgatherv(mine ? send : recv, (int)mine, MPI_BYTE, recv, gather_counts, gather_displs, MPI_BYTE,
                            MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? MG_OK : mg_dist_mpi_fail(fn, rc);
  }
  for (int q = 0; q < world_size; q++) {
    if (q == world_rank) memcpy((char *)recv + at, send, (size_t)mine);
    if (bcast_buf(fn, (char *)recv + at, gather_bytes[q], q) != MG_OK) return MG_ERR;
    at += gather_bytes[q];
  }
  return MG_OK;
}

/* }============================================================ */


/* {========================== tensors ========================== */

/* a contiguous copy of t, the buffer the collective then works in */
static mg_tensor *copy_of (const mg_tensor *t) {
  mg_tensor *r = mg_empty(t->shape, t->ndim, t->dtype);
  if (r != NULL && mg_copy_into(r, t) != MG_OK) {
    mg_tensor_release(r);
    return NULL;
  }
  return r;
}

static int64_t nbytes (const mg_tensor *t) { return t->numel * (int64_t)mg_dtype_size(t->dtype); }

mg_tensor *mg_dist_allreduce (const char *fn, mg_tensor *t, mg_dist_op op) {
  if (mg_dist_need_init(fn) != MG_OK) return NULL;
  mg_tensor *r = copy_of(t);                        /* before the agreement */
  if (agree_tensor(fn, MG_DIST_CALL_ALLREDUCE, op, -1, t, r == NULL, 0) != MG_OK
      || mg_dist_check_op(fn, t->dtype, op, 1.0, 1.0) != MG_OK || allreduce_buf(fn, mg_ptr(r), r->numel, r->dtype, op) != MG_OK) {
    mg_tensor_release(r);
    return NULL;
  }
  return r;
}

mg_tensor *mg_dist_broadcast (const char *fn, mg_tensor *t, int64_t root) {
  if (mg_dist_need_init(fn) != MG_OK) return NULL;
  mg_tensor *r = world_rank == root ? mg_contiguous(t) : mg_empty(t->shape, t->ndim, t->dtype);
  if (agree_tensor(fn, MG_DIST_CALL_BROADCAST, -1, root, t, r == NULL, 0) != MG_OK
      || bcast_buf(fn, mg_ptr(r), nbytes(r), (int)root) != MG_OK) {
    mg_tensor_release(r);
    return NULL;
  }
  return r;
}

/* allgather once the ranks agree: the result is sized from their validated
** headers (kept in gather_bytes: the second exchange overwrites hdrs), then
** a second exchange makes sure every rank could allocate it */
static mg_tensor *gather (const char *fn, mg_tensor *c) {
  int64_t shape[MG_MAX_DIMS], total = 0;
  memcpy(shape, c->shape, sizeof(int64_t) * (size_t)c->ndim);
  shape[0] = 0;
  for (int q = 0; q < world_size; q++) {
    if (hdrs[q].dims[0] > INT64_MAX - shape[0] || hdrs[q].bytes > INT64_MAX - total)
      return mg_seterror("%s: the ranks' tensors have more than 2^63 rows or bytes in all", fn), NULL;
    shape[0] += hdrs[q].dims[0];
    total += hdrs[q].bytes;
    gather_bytes[q] = hdrs[q].bytes;
  }
  mg_tensor *r = mg_empty(shape, c->ndim, c->dtype);
  if (r == NULL) {                                  /* say whose result it was */
    char why[400];
    snprintf(why, sizeof why, "%s", mg_errmsg_raw());
    mg_seterror("%s: %s (every rank's rows together)", fn, why);
  }
  mg_dist_header h = {.kind = MG_DIST_CALL_ALLGATHER_READY, .failed = r == NULL, .op = -1, .root = -1, .dtype = -1};
  if (exchange(fn, &h) != MG_OK || agree(fn, 0, "entries") != MG_OK || allgather_buf(fn, mg_ptr(c), mg_ptr(r), total) != MG_OK) {
    mg_tensor_release(r);
    return NULL;
  }
  return r;
}

/* the ranks' tensors concatenated along the first axis (a 0-d tensor counts
** as one row); the first axes may differ */
mg_tensor *mg_dist_allgather (const char *fn, mg_tensor *t) {
  if (mg_dist_need_init(fn) != MG_OK) return NULL;
  int64_t one = 1;
  mg_tensor *src = t->ndim == 0 ? mg_reshape(t, &one, 1) : mg_tensor_retain(t);
  mg_tensor *c = src != NULL ? mg_contiguous(src) : NULL, *r = NULL;
  if (agree_tensor(fn, MG_DIST_CALL_ALLGATHER, -1, -1, c != NULL ? c : t, c == NULL, 1) == MG_OK) r = gather(fn, c);
  mg_tensor_release(c);
  mg_tensor_release(src);
  return r;
}

void mg_dist_shard_range (int64_t n, int size, int r, int64_t *lo, int64_t *hi) {
  int64_t q = n / size, m = n % size;           /* floor(n r / size) without overflow */
  *lo = q * r + m * r / size;
  *hi = q * (r + 1) + m * (r + 1) / size;
}

mg_tensor *mg_dist_reduce_scatter (const char *fn, mg_tensor *t, mg_dist_op op) {
  if (mg_dist_need_init(fn) != MG_OK) return NULL;
  int64_t lo, hi, n = t->numel;
  mg_dist_shard_range(n, world_size, world_rank, &lo, &hi);
  int64_t one = hi - lo;
  mg_tensor *c = mg_contiguous(t), *r = c ? mg_empty(&one, 1, t->dtype) : NULL;
  if (agree_tensor(fn, MG_DIST_CALL_REDUCE_SCATTER, op, -1, t, r == NULL, 0) != MG_OK
      || mg_dist_check_op(fn, t->dtype, op, 1.0, 1.0) != MG_OK) {
    mg_tensor_release(c);
    mg_tensor_release(r);
    return NULL;
  }
  size_t es = mg_dtype_size(t->dtype);
  mg_status st = MG_OK;
  if (n <= INT_MAX) {                           /* one call; counts are ints */
    for (int q = 0; q < world_size; q++) {
      int64_t a, b;
      mg_dist_shard_range(n, world_size, q, &a, &b);
      gather_counts[q] = (int)(b - a);
    }
    mg_dist_counts.calls++;
    mg_dist_counts.bytes += n * (int64_t)es;
    int rc = MPI_Reduce_scatter(mg_ptr(c), mg_ptr(r), gather_counts, mg_dist_mpi_type(t->dtype),
                                mg_dist_mpi_op(t->dtype, op == MG_DIST_MEAN ? MG_DIST_SUM : op), MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) st = mg_dist_mpi_fail(fn, rc);
    else if (op == MG_DIST_MEAN) mg_dist_scale(mg_ptr(r), one, t->dtype, 1.0 / world_size);
  } else {                                      /* above 2^31 elements: the whole sum, then the shard */
    mg_tensor *all = copy_of(c);
    st = all ? allreduce_buf(fn, mg_ptr(all), n, t->dtype, op) : MG_ERR;
    if (st == MG_OK) memcpy(mg_ptr(r), (char *)mg_ptr(all) + lo * (int64_t)es, (size_t)one * es);
    mg_tensor_release(all);
  }
  mg_tensor_release(c);
  if (st != MG_OK) {
    mg_tensor_release(r);
    return NULL;
  }
  return r;
}

/* v's value when the collective may write into it: nobody else holds it */
static mg_tensor *own_value (mg_variable *v) {
  mg_tensor *cur = mg_variable_peek(v);
  int ok = cur->refcount == 1 && cur->storage->refcount == 1 && mg_tensor_is_contiguous(cur);
  return ok ? cur : NULL;
}

mg_status mg_dist_allreduce_variable (const char *fn, mg_variable *v, mg_dist_op op) {
  if (mg_dist_need_init(fn) != MG_OK) return MG_ERR;
  mg_tensor *cur = own_value(v);
  if (cur != NULL) {
    if (agree_tensor(fn, MG_DIST_CALL_ALLREDUCE, op, -1, cur, 0, 0) != MG_OK || mg_dist_check_op(fn, cur->dtype, op, 1.0, 1.0) != MG_OK)
      return MG_ERR;
    return allreduce_buf(fn, mg_ptr(cur), cur->numel, cur->dtype, op);
  }
  mg_tensor *r = mg_dist_allreduce(fn, mg_variable_peek(v), op);
  if (r == NULL) return MG_ERR;
  mg_status s = mg_variable_assign(v, r);
  mg_tensor_release(r);
  return s;
}

mg_status mg_dist_broadcast_variable (const char *fn, mg_variable *v, int64_t root) {
  if (mg_dist_need_init(fn) != MG_OK) return MG_ERR;
  mg_tensor *cur = mg_variable_peek(v);
  mg_tensor *b = own_value(v) != NULL ? mg_tensor_retain(cur)          /* in place; the root only reads */
               : world_rank == root ? mg_contiguous(cur) : mg_empty(cur->shape, cur->ndim, cur->dtype);
  mg_status s = agree_tensor(fn, MG_DIST_CALL_BROADCAST, -1, root, cur, b == NULL, 0);
  if (s == MG_OK) s = bcast_buf(fn, mg_ptr(b), nbytes(b), (int)root);
  if (s == MG_OK && b != cur && world_rank != root) s = mg_variable_assign(v, b);
  mg_tensor_release(b);
  return s;
}

/* root's values into n variables: each into its own storage when nobody
** else holds it, else into a new value (allocated before the agreement)
** that the variable adopts; the root only reads */
mg_status mg_dist_broadcast_variables (const char *fn, mg_variable *const *vs, int n, int64_t root) {
  if (mg_dist_need_init(fn) != MG_OK) return MG_ERR;
  if (n < 0 || n > MAX_LIST) return mg_seterror("%s: %d variables; at most %d at once", fn, n, MAX_LIST);
  mg_tensor **buf = calloc((size_t)(n ? n : 1), sizeof *buf);
  int64_t *desc = malloc(sizeof(int64_t) * DESC * (size_t)(n ? n : 1));
  mg_dist_header h = {.kind = MG_DIST_CALL_BROADCAST_MANY, .op = -1, .root = root, .dtype = -1, .count = n};
  int failed = buf == NULL || desc == NULL;
  if (failed) mg_seterror("%s: out of memory for a list of %d variables", fn, n);
  for (int i = 0; i < n && !failed; i++) {
    mg_tensor *cur = mg_variable_peek(vs[i]);
    buf[i] = own_value(vs[i]) != NULL ? mg_tensor_retain(cur)
           : world_rank == root ? mg_contiguous(cur) : mg_empty(cur->shape, cur->ndim, cur->dtype);
    failed = buf[i] == NULL;
    mg_dist_describe_entry(desc + (size_t)i * DESC, cur);
    h.bytes += nbytes(cur);
  }
  h.failed = failed;
  h.hash = failed ? 0 : mg_dist_hash_list(desc, n);
  mg_status s = mg_dist_agree_list(fn, &h, "variable", desc);
  if (s == MG_OK && (root < 0 || root >= world_size))
    s = mg_seterror("%s: root must be a rank from 0 to %d, got %lld", fn, world_size - 1, (long long)root);
  for (int i = 0; i < n && s == MG_OK; i++) s = bcast_buf(fn, mg_ptr(buf[i]), nbytes(buf[i]), (int)root);
  for (int i = 0; i < n && buf != NULL; i++) {
    if (s == MG_OK && buf[i] != mg_variable_peek(vs[i]) && world_rank != root) s = mg_variable_assign(vs[i], buf[i]);
    mg_tensor_release(buf[i]);
  }
  free(buf);
  free(desc);
  return s;
}

static void *fusion_buffer (size_t size) {
  if (size <= fusion_cap) return fusion;
  size_t cap = (size + 4095) & ~(size_t)4095;
  void *p = aligned_alloc(64, cap);
  if (p == NULL) return NULL;
  free(fusion);
  fusion = p;
  fusion_cap = cap;
  return p;
}

/* n values from src to dst, times s (float32 and float64 in the same pass;
** the half types copy, then scale) */
void mg_dist_copy_scaled (void *dst, const void *src, int64_t n, mg_dtype dt, double s) {
  if (s != 1.0 && dt == MG_FLOAT32) {
    float *d = dst, f = (float)s;
    const float *x = src;
    for (int64_t i = 0; i < n; i++) d[i] = x[i] * f;
  } else if (s != 1.0 && dt == MG_FLOAT64) {
    double *d = dst;
    const double *x = src;
    for (int64_t i = 0; i < n; i++) d[i] = x[i] * s;
  } else {
    memcpy(dst, src, (size_t)n * mg_dtype_size(dt));
    mg_dist_scale(dst, n, dt, s);
  }
}

/* allreduce_many's plan: everything allocated before the agreement */
typedef struct {
  int n, k;                   /* entries; present ones */
  int *order;                 /* the present entries, grouped by dtype, in order within one (k) */
  mg_tensor **src, **dst;     /* contiguous inputs and the results (n each; NULL: nil) */
  int64_t *desc;              /* n x DESC: each entry described, for the agreement */
} plan;

/* the end of the bucket that starts at order[a]: one dtype, at most fusion bytes (one tensor at least) */
static int bucket_end (const plan *p, int a, int64_t fusion_bytes, int64_t *bytes) {
  mg_tensor *const *s = p->src;
  int b = a + 1;
  *bytes = nbytes(s[p->order[a]]);
  while (b < p->k && s[p->order[b]]->dtype == s[p->order[a]]->dtype && *bytes + nbytes(s[p->order[b]]) <= fusion_bytes)
    *bytes += nbytes(s[p->order[b++]]);
  return b;
}

static mg_status prepare (const char *fn, plan *p, mg_tensor *const *ts, int64_t fusion_bytes) {
  int n = p->n;
  p->order = malloc(sizeof(int) * (size_t)(n ? n : 1));
  p->src = calloc((size_t)(n ? 2 * n : 1), sizeof(mg_tensor *));
  p->dst = p->src ? p->src + n : NULL;
  p->desc = malloc(sizeof(int64_t) * DESC * (size_t)(n ? n : 1));
  if (p->order == NULL || p->src == NULL || p->desc == NULL) return mg_seterror("%s: out of memory for %d tensors", fn, n);
  for (int d = 0; d < MG_DTYPE__COUNT; d++)
    for (int i = 0; i < n; i++)
      if (ts[i] != NULL && (int)ts[i]->dtype == d) p->order[p->k++] = i;
  int64_t most = 0, bytes;
  for (int i = 0; i < n; i++) {
    mg_dist_describe_entry(p->desc + (size_t)i * DESC, ts[i]);
    if (ts[i] == NULL) continue;
    if ((p->src[i] = mg_contiguous(ts[i])) == NULL) return MG_ERR;
    if ((p->dst[i] = mg_empty(ts[i]->shape, ts[i]->ndim, ts[i]->dtype)) == NULL) return MG_ERR;
  }
  for (int a = 0; a < p->k;) {
    a = bucket_end(p, a, fusion_bytes, &bytes);
    if (bytes > most) most = bytes;
  }
  if (fusion_buffer((size_t)most + 1) == NULL)
    return mg_seterror("%s: out of memory for a fusion buffer of %lld bytes", fn, (long long)most);
  return MG_OK;
}

/* one bucket: order[a..b) (one dtype) packed (times pre), reduced, and
** unpacked (times post) into the results: three passes over the bytes
** besides MPI's */
static mg_status bucket (const char *fn, const plan *p, int a, int b, mg_dist_op op, double pre, double post) {
  mg_dtype dt = p->src[p->order[a]]->dtype;
  size_t es = mg_dtype_size(dt);
  char *buf = fusion;
  int64_t at = 0;
  for (int j = a; j < b; j++) {
    const mg_tensor *c = p->src[p->order[j]];
    mg_dist_copy_scaled(buf + at * (int64_t)es, mg_ptr(c), c->numel, dt, pre);
    at += c->numel;
  }
  if (op == MG_DIST_MEAN) {
    op = MG_DIST_SUM;
    post /= world_size;
  }
  if (allreduce_buf(fn, buf, at, dt, op) != MG_OK) return MG_ERR;
  at = 0;
  for (int j = a; j < b; j++) {
    mg_tensor *o = p->dst[p->order[j]];
    mg_dist_copy_scaled(mg_ptr(o), buf + at * (int64_t)es, o->numel, dt, post);
    at += o->numel;
  }
  return MG_OK;
}

mg_status mg_dist_allreduce_many (const char *fn, mg_tensor *const *ts, int n, mg_dist_op op,
                                  double prescale, double postscale, int64_t fusion_bytes, mg_tensor **out) {
  if (mg_dist_need_init(fn) != MG_OK) return MG_ERR;
  if (n < 0 || n > MAX_LIST) return mg_seterror("%s: %d tensors; at most %d at once", fn, n, MAX_LIST);
  for (int i = 0; i < n; i++) out[i] = NULL;
  if (fusion_bytes < 1) fusion_bytes = 1;                /* one tensor per bucket */
  plan p = {.n = n};
  mg_dist_header h = {.kind = MG_DIST_CALL_ALLREDUCE_MANY, .op = op, .root = -1, .dtype = -1, .count = n,
                      .fusion = fusion_bytes};
  memcpy(&h.scale, &postscale, sizeof postscale);
  h.prescaled = prescale != 1.0;
  h.failed = prepare(fn, &p, ts, fusion_bytes) != MG_OK;
  for (int i = 0; i < n && !h.failed; i++) h.bytes += ts[i] ? nbytes(ts[i]) : 0;
  h.hash = h.failed ? 0 : mg_dist_hash_list(p.desc, n);
  mg_status s = mg_dist_agree_list(fn, &h, "gradient", p.desc);
  int prescaled = 0;                                     /* on any rank: the same answer everywhere */
  for (int r = 0; r < world_size && s == MG_OK; r++) prescaled |= hdrs[r].prescaled != 0;
  for (int j = 0; j < p.k && s == MG_OK; j++) s = mg_dist_check_op(fn, p.src[p.order[j]]->dtype, op, prescaled ? 2.0 : 1.0, postscale);
  int64_t bytes;
  for (int a = 0, b; a < p.k && s == MG_OK; a = b) {
    b = bucket_end(&p, a, fusion_bytes, &bytes);
    s = bucket(fn, &p, a, b, op, prescale, postscale);
  }
  for (int i = 0; i < n && p.src != NULL; i++) {
    mg_tensor_release(p.src[i]);
    if (s == MG_OK) out[i] = p.dst[i];
    else mg_tensor_release(p.dst[i]);
  }
  free(p.order);
  free(p.src);
  free(p.desc);
  return s;
}

/* }============================================================ */

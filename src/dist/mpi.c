/*
** mpi.c — mg.distributed's collectives on Open MPI (MPI_COMM_WORLD).
**
** Tensors are reduced in one buffer with MPI_IN_PLACE: a tensor's result is
** the only copy made, and a variable nobody else holds is reduced in its own
** storage. Every collective on tensors first gathers each rank's dtype and
** shape (one small MPI call), so ranks that disagree get an error naming the
** rank and the mismatch instead of a truncated message or a hang. float16 and
** bfloat16 reduce through user-defined MPI ops that compute in float32.
** Errors return (MPI_ERRORS_RETURN) and become the caller's Lua error.
*/
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "moongrad_impl.h"
#include "dist/dist.h"

static int started;                   /* MPI_Init_thread called by us */
static int world_rank, world_size;
static mg_dist_stats stats;
static MPI_Op half_ops[2][3];         /* [float16, bfloat16][sum, max, min] */
/* the fusion buffer, kept from step to step as Horovod's: a fresh one per
** step cost page faults on every call (64 MiB: 148 ms instead of 20) */
static void *fusion;
static size_t fusion_cap;

#define MAX_META (2 + MG_MAX_DIMS)    /* dtype, ndim, shape */
#define CHUNK    (1 << 28)            /* elements or bytes per MPI call: counts are ints */

static mg_status mpi_fail (const char *fn, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return mg_seterror("%s: MPI failed on rank %d: %s", fn, world_rank, msg);
}

static mg_status need_init (const char *fn) {
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

mg_status mg_dist_init (void) {
  if (started) return MG_OK;
  int done = 0, provided = 0;
  MPI_Finalized(&done);
  if (done) return mg_seterror("init: MPI was finalized in this process; it cannot start again");
  MPI_Initialized(&done);
  if (!done && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return mg_seterror("init: MPI_Init_thread failed (is Open MPI installed? make deps)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
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
mg_dist_stats mg_dist_get_stats (void) { return stats; }

mg_status mg_dist_barrier (const char *fn) {
  if (need_init(fn) != MG_OK) return MG_ERR;
  stats.calls++;
  int rc = MPI_Barrier(MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? MG_OK : mpi_fail(fn, rc);
}

void mg_dist_finalize (void) {
  if (!mg_dist_initialized()) return;
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 3; k++) MPI_Op_free(&half_ops[i][k]);
  free(fusion);
  fusion = NULL;
  fusion_cap = 0;
  MPI_Finalize();
}

void mg_dist_abort (int code) {
  if (!mg_dist_initialized()) return;
  fprintf(stderr, "moongrad: rank %d of %d failed (the error above); stopping every rank\n", world_rank, world_size);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

/* }============================================================ */


/* {======================== raw buffers ======================== */

static MPI_Datatype mpi_type (mg_dtype dt) {
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

static MPI_Op mpi_op (mg_dtype dt, mg_dist_op op) {
  int k = op == MG_DIST_MAX ? 1 : op == MG_DIST_MIN ? 2 : 0;
  if (dt == MG_FLOAT16 || dt == MG_BFLOAT16) return half_ops[dt == MG_BFLOAT16][k];
  if (dt == MG_BOOL) return k == 2 ? MPI_LAND : MPI_LOR;     /* sum and max of bools: or */
  return k == 1 ? MPI_MAX : k == 2 ? MPI_MIN : MPI_SUM;
}

/* buf[0..n) *= s, for the float dtypes */
static void scale (void *buf, int64_t n, mg_dtype dt, double s) {
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

mg_status mg_dist_allreduce_buf (const char *fn, void *buf, int64_t n, mg_dtype dt, mg_dist_op op,
                                 double prescale, double postscale) {
  if (need_init(fn) != MG_OK) return MG_ERR;
  if (op == MG_DIST_MEAN && !is_float(dt))
    return mg_seterror("%s: op 'mean' is for float tensors, got %s (use 'sum')", fn, mg_dtype_name(dt));
  if (!is_float(dt) && (prescale != 1.0 || postscale != 1.0))
    return mg_seterror("%s: scaling is for float tensors, got %s", fn, mg_dtype_name(dt));
  if (op == MG_DIST_MEAN) postscale /= world_size;
  scale(buf, n, dt, prescale);
  size_t es = mg_dtype_size(dt);
  for (int64_t done = 0; done < n; done += CHUNK) {
    int m = n - done < CHUNK ? (int)(n - done) : CHUNK;
    stats.calls++;
    stats.bytes += (int64_t)m * (int64_t)es;
    int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + done * (int64_t)es, m, mpi_type(dt), mpi_op(dt, op),
                           MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(fn, rc);
  }
  scale(buf, n, dt, postscale);
  return MG_OK;
}

mg_status mg_dist_bcast_buf (const char *fn, void *buf, int64_t nbytes, int root) {
  if (need_init(fn) != MG_OK) return MG_ERR;
  if (root < 0 || root >= world_size)
    return mg_seterror("%s: root must be a rank from 0 to %d, got %d", fn, world_size - 1, root);
  for (int64_t done = 0; done < nbytes; done += CHUNK) {
    int m = nbytes - done < CHUNK ? (int)(nbytes - done) : CHUNK;
    stats.calls++;
    stats.bytes += m;
    int rc = MPI_Bcast((char *)buf + done, m, MPI_BYTE, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(fn, rc);
  }
  return MG_OK;
}

mg_status mg_dist_allgather_i64 (const char *fn, const int64_t *mine, int n, int64_t *out) {
  if (need_init(fn) != MG_OK) return MG_ERR;
  stats.calls++;
  int rc = MPI_Allgather(mine, n, MPI_INT64_T, out, n, MPI_INT64_T, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? MG_OK : mpi_fail(fn, rc);
}

mg_status mg_dist_allgatherv_buf (const char *fn, const void *send, int64_t nbytes, void *recv,
                                  const int64_t *counts) {
  if (need_init(fn) != MG_OK) return MG_ERR;
  int *cnt = malloc(sizeof(int) * (size_t)world_size * 2);
  if (cnt == NULL) return mg_seterror("%s: out of memory", fn);
  int *disp = cnt + world_size;
  int64_t total = 0;
  for (int r = 0; r < world_size; r++) {
    cnt[r] = (int)counts[r];
    disp[r] = (int)total;
    total += counts[r];
  }
  if (total > INT_MAX) {
    free(cnt);
    return mg_seterror("%s: %lld bytes from all ranks; at most %d can be gathered at once", fn, (long long)total,
                       INT_MAX);
  }
  stats.calls++;
  stats.bytes += total;
  int rc = MPI_Allgatherv(nbytes ? send : recv, (int)nbytes, MPI_BYTE, recv, cnt, disp, MPI_BYTE, MPI_COMM_WORLD);
  free(cnt);
  return rc == MPI_SUCCESS ? MG_OK : mpi_fail(fn, rc);
}

/* }============================================================ */


/* {========================== tensors ========================== */

static void describe (char *buf, size_t n, const int64_t *meta) {
  char shape[160];
  snprintf(buf, n, "%s %s", mg_dtype_name((mg_dtype)meta[0]), mg_shape_str(shape, sizeof shape, meta + 2, (int)meta[1]));
}

/* every rank's dtype and shape into all (world_size * MAX_META values);
** `same_from` 0: they must all match; 1: all but the first axis */
static mg_status agree (const char *fn, const mg_tensor *t, int same_from, int64_t *all) {
  int64_t meta[MAX_META] = {t->dtype, t->ndim};
  memcpy(meta + 2, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  if (mg_dist_allgather_i64(fn, meta, MAX_META, all) != MG_OK) return MG_ERR;
  for (int r = 1; r < world_size; r++) {
    const int64_t *a = all, *b = all + r * MAX_META;
    int ok = a[0] == b[0] && a[1] == b[1];
    for (int d = same_from; ok && d < a[1]; d++) ok = a[2 + d] == b[2 + d];
    if (!ok) {
      char da[200], db[200];
      describe(da, sizeof da, a);
      describe(db, sizeof db, b);
      return mg_seterror(same_from ? "%s: rank 0 gives %s but rank %d gives %s; every rank's tensor must have the "
                                     "same dtype and the same shape after the first axis"
                                   : "%s: rank 0 gives %s but rank %d gives %s; every rank must give the same "
                                     "dtype and shape", fn, da, r, db);
    }
  }
  return MG_OK;
}

/* a contiguous copy of t, the buffer the collective then works in */
static mg_tensor *copy_of (const mg_tensor *t) {
  mg_tensor *r = mg_empty(t->shape, t->ndim, t->dtype);
  if (r != NULL && mg_copy_into(r, t) != MG_OK) {
    mg_tensor_release(r);
    return NULL;
  }
  return r;
}

mg_tensor *mg_dist_allreduce (const char *fn, mg_tensor *t, mg_dist_op op) {
  int64_t all[MAX_META * 64], *meta = world_size <= 64 ? all : malloc(sizeof(int64_t) * MAX_META * (size_t)world_size);
  if (meta == NULL) return mg_seterror("%s: out of memory", fn), NULL;
  mg_status s = need_init(fn) == MG_OK ? agree(fn, t, 0, meta) : MG_ERR;
  if (meta != all) free(meta);
  if (s != MG_OK) return NULL;
  mg_tensor *r = copy_of(t);
  if (r != NULL && mg_dist_allreduce_buf(fn, mg_ptr(r), r->numel, r->dtype, op, 1.0, 1.0) != MG_OK) {
    mg_tensor_release(r);
    return NULL;
  }
  return r;
}

mg_tensor *mg_dist_broadcast (const char *fn, mg_tensor *t, int root) {
  int64_t all[MAX_META * 64], *meta = world_size <= 64 ? all : malloc(sizeof(int64_t) * MAX_META * (size_t)world_size);
  if (meta == NULL) return mg_seterror("%s: out of memory", fn), NULL;
  mg_status s = need_init(fn) == MG_OK ? agree(fn, t, 0, meta) : MG_ERR;
  if (meta != all) free(meta);
  if (s != MG_OK) return NULL;
  if (root < 0 || root >= world_size)
    return mg_seterror("%s: root must be a rank from 0 to %d, got %d", fn, world_size - 1, root), NULL;
  mg_tensor *r = world_rank == root ? mg_contiguous(t) : mg_empty(t->shape, t->ndim, t->dtype);
  if (r != NULL && mg_dist_bcast_buf(fn, mg_ptr(r), r->numel * (int64_t)mg_dtype_size(r->dtype), root) != MG_OK) {
    mg_tensor_release(r);
    return NULL;
  }
  return r;
}

/* the ranks' tensors concatenated along the first axis (a 0-d tensor counts
** as one row); the first axes may differ */
mg_tensor *mg_dist_allgather (const char *fn, mg_tensor *t) {
  if (need_init(fn) != MG_OK) return NULL;
  int64_t *meta = malloc(sizeof(int64_t) * (MAX_META + 1) * (size_t)world_size);
  if (meta == NULL) return mg_seterror("%s: out of memory", fn), NULL;
  int64_t *counts = meta + MAX_META * world_size;
  mg_tensor *c = NULL, *r = NULL;
  int64_t one = 1;
  mg_tensor *src = t->ndim == 0 ? mg_reshape(t, &one, 1) : mg_tensor_retain(t);
  if (src == NULL || agree(fn, src, 1, meta) != MG_OK) goto done;
  int64_t shape[MG_MAX_DIMS];
  memcpy(shape, src->shape, sizeof(int64_t) * (size_t)src->ndim);
  shape[0] = 0;
  int64_t row = 1;                                  /* elements per first-axis entry */
  for (int d = 1; d < src->ndim; d++) row *= src->shape[d];
  for (int q = 0; q < world_size; q++) {
    shape[0] += meta[q * MAX_META + 2];
    counts[q] = meta[q * MAX_META + 2] * row * (int64_t)mg_dtype_size(src->dtype);
  }
  c = mg_contiguous(src);
  r = c ? mg_empty(shape, src->ndim, src->dtype) : NULL;
  if (r != NULL && mg_dist_allgatherv_buf(fn, mg_ptr(c), counts[world_rank], mg_ptr(r), counts) != MG_OK) {
    mg_tensor_release(r);
    r = NULL;
  }
done:
  mg_tensor_release(c);
  mg_tensor_release(src);
  free(meta);
  return r;
}

/* v's value when the collective may write into it: nobody else holds it */
static mg_tensor *own_value (mg_variable *v) {
  mg_tensor *cur = mg_variable_peek(v);
  int ok = cur->refcount == 1 && cur->storage->refcount == 1 && mg_tensor_is_contiguous(cur);
  return ok ? cur : NULL;
}

mg_status mg_dist_allreduce_variable (const char *fn, mg_variable *v, mg_dist_op op) {
  mg_tensor *cur = mg_variable_peek(v);
  if (own_value(v) != NULL) {
    int64_t all[MAX_META * 64], *meta = world_size <= 64 ? all : malloc(sizeof(int64_t) * MAX_META * (size_t)world_size);
    if (meta == NULL) return mg_seterror("%s: out of memory", fn);
    mg_status s = need_init(fn) == MG_OK ? agree(fn, cur, 0, meta) : MG_ERR;
    if (meta != all) free(meta);
    return s != MG_OK ? MG_ERR : mg_dist_allreduce_buf(fn, mg_ptr(cur), cur->numel, cur->dtype, op, 1.0, 1.0);
  }
  mg_tensor *r = mg_dist_allreduce(fn, cur, op);
  if (r == NULL) return MG_ERR;
  mg_status s = mg_variable_assign(v, r);
  mg_tensor_release(r);
  return s;
}

mg_status mg_dist_broadcast_variable (const char *fn, mg_variable *v, int root) {
  mg_tensor *cur = mg_variable_peek(v);
  if (own_value(v) != NULL || root == world_rank) {   /* the root only reads */
    int64_t all[MAX_META * 64], *meta = world_size <= 64 ? all : malloc(sizeof(int64_t) * MAX_META * (size_t)world_size);
    if (meta == NULL) return mg_seterror("%s: out of memory", fn);
    mg_status s = need_init(fn) == MG_OK ? agree(fn, cur, 0, meta) : MG_ERR;
    if (meta != all) free(meta);
    if (s != MG_OK) return MG_ERR;
    if (own_value(v) != NULL) return mg_dist_bcast_buf(fn, mg_ptr(cur), cur->numel * (int64_t)mg_dtype_size(cur->dtype), root);
    mg_tensor *c = mg_contiguous(cur);
    if (c == NULL) return MG_ERR;
    s = mg_dist_bcast_buf(fn, mg_ptr(c), c->numel * (int64_t)mg_dtype_size(c->dtype), root);
    mg_tensor_release(c);
    return s;
  }
  mg_tensor *r = mg_dist_broadcast(fn, cur, root);
  if (r == NULL) return MG_ERR;
  mg_status s = mg_variable_assign(v, r);
  mg_tensor_release(r);
  return s;
}

static void *fusion_buffer (size_t nbytes) {
  if (nbytes <= fusion_cap) return fusion;
  size_t cap = (nbytes + 4095) & ~(size_t)4095;
  void *p = aligned_alloc(64, cap);
  if (p == NULL) return NULL;
  free(fusion);
  fusion = p;
  fusion_cap = cap;
  return p;
}

/* n values from src to dst, times s (float32 and float64 in the same pass;
** the half types copy, then scale) */
static void copy_scaled (void *dst, const void *src, int64_t n, mg_dtype dt, double s) {
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
    scale(dst, n, dt, s);
  }
}

/* one bucket: ts[a..b) (one dtype) packed (times pre), reduced, and unpacked
** (times post) into new tensors: three passes over the bytes besides MPI's */
static mg_status bucket (const char *fn, mg_tensor *const *ts, int a, int b, mg_dist_op op, double pre, double post,
                         mg_tensor **out) {
  int64_t n = 0;
  for (int i = a; i < b; i++) n += ts[i]->numel;
  mg_dtype dt = ts[a]->dtype;
  size_t es = mg_dtype_size(dt);
  char *buf = fusion_buffer((size_t)n * es + 1);
  if (buf == NULL) return mg_seterror("%s: out of memory for a fusion buffer of %lld bytes", fn, (long long)n * (long long)es);
  if ((pre != 1.0 || post != 1.0) && !is_float(dt))
    return mg_seterror("%s: scaling is for float tensors, got %s", fn, mg_dtype_name(dt));
  if (op == MG_DIST_MEAN) {
    if (!is_float(dt)) return mg_seterror("%s: op 'mean' is for float tensors, got %s (use 'sum')", fn, mg_dtype_name(dt));
    op = MG_DIST_SUM;
    post /= world_size;
  }
  int64_t at = 0;
  for (int i = a; i < b; i++) {
    mg_tensor *c = mg_contiguous(ts[i]);
    if (c == NULL) return MG_ERR;
    copy_scaled(buf + at * (int64_t)es, mg_ptr(c), c->numel, dt, pre);
    at += c->numel;
    mg_tensor_release(c);
  }
  if (mg_dist_allreduce_buf(fn, buf, n, dt, op, 1.0, 1.0) != MG_OK) return MG_ERR;
  at = 0;
  for (int i = a; i < b; i++) {
    out[i] = mg_empty(ts[i]->shape, ts[i]->ndim, dt);
    if (out[i] == NULL) return MG_ERR;
    copy_scaled(mg_ptr(out[i]), buf + at * (int64_t)es, ts[i]->numel, dt, post);
    at += ts[i]->numel;
  }
  return MG_OK;
}

mg_status mg_dist_allreduce_many (const char *fn, mg_tensor *const *ts, int n, mg_dist_op op,
                                  double prescale, double postscale, int64_t fusion_bytes, mg_tensor **out) {
  if (need_init(fn) != MG_OK) return MG_ERR;
  for (int i = 0; i < n; i++) out[i] = NULL;
  mg_tensor **sorted = malloc(sizeof(mg_tensor *) * (size_t)(n ? n : 1) * 2);
  int *where = malloc(sizeof(int) * (size_t)(n ? n : 1));
  if (sorted == NULL || where == NULL) {
    free(sorted);
    free(where);
    return mg_seterror("%s: out of memory", fn);
  }
  mg_tensor **res = sorted + n;
  for (int i = 0; i < n; i++) res[i] = NULL;
  int k = 0;                                        /* grouped by dtype, in order within one */
  for (int d = 0; d < MG_DTYPE__COUNT; d++)
    for (int i = 0; i < n; i++)
      if ((int)ts[i]->dtype == d) { where[k] = i; sorted[k++] = ts[i]; }
  mg_status s = MG_OK;
  for (int a = 0; a < n && s == MG_OK;) {
    int b = a + 1;
    int64_t bytes = sorted[a]->numel * (int64_t)mg_dtype_size(sorted[a]->dtype);
    while (b < n && sorted[b]->dtype == sorted[a]->dtype &&
           bytes + sorted[b]->numel * (int64_t)mg_dtype_size(sorted[b]->dtype) <= fusion_bytes)
      bytes += sorted[b++]->numel * (int64_t)mg_dtype_size(sorted[a]->dtype);
    s = bucket(fn, sorted, a, b, op, prescale, postscale, res);
    a = b;
  }
  for (int i = 0; i < n; i++) {
    if (s == MG_OK) out[where[i]] = res[i];
    else mg_tensor_release(res[i]);
  }
  free(sorted);
  free(where);
  return s;
}

/* }============================================================ */

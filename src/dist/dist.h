/*
** dist.h — collectives over MPI for mg.distributed (src/dist/mpi.c).
**
** Not part of libmoongrad.a: the Makefile compiles mpi.c and its binding
** (src/dist/ldistributed.c) into the moongrad binary and moongrad.so only, so
** the core library and its C hosts never need MPI. Plain C: no lua.h here.
** Every function returns MG_OK, or MG_ERR with mg_errmsg() naming `fn`.
**
** Agreement before every collective. Each call first sends every rank a
** header (mg_dist_header below: one MPI_Iallgather of a few int64s) saying
** what this rank is about to do: which collective, its op or root, the
** dtype and shape, or for a list of tensors its length and a hash of each
** entry's dtype and shape. Every rank checks every header (a peer's dims,
** ndim and byte counts are validated before anything is sized from them)
** and compares them with rank 0's, so ranks that disagree all fail with the
** same error, naming the function, the rank and what differs, and no data
** moves. A rank that could not prepare its side (out of memory) says so in
** its header, so the others fail too instead of waiting. The header
** exchange waits at most mg_dist_timeout() seconds for a rank that never
** arrives; after a timeout MPI cannot be used again in the process (the
** pending exchange cannot be cancelled), and the job should end.
**
** Ranks trust each other's bytes: the values a peer sends are not checked,
** and Open MPI's transport does not defend against a hostile peer. What is
** checked is agreement on the call, so a buggy or mismatched rank gives an
** error instead of corruption, a crash or a hang.
*/
#ifndef MG_DIST_H
#define MG_DIST_H

#include <stdint.h>
#include "moongrad.h"

typedef enum { MG_DIST_SUM, MG_DIST_MEAN, MG_DIST_MAX, MG_DIST_MIN } mg_dist_op;

/* the collectives a header announces (ORDER: call_names in mpi.c) */
typedef enum {
  MG_DIST_CALL_BARRIER = 1, MG_DIST_CALL_ALLREDUCE, MG_DIST_CALL_BROADCAST, MG_DIST_CALL_ALLGATHER,
  MG_DIST_CALL_ALLGATHER_READY,          /* allgather's second step: every rank sized its result */
  MG_DIST_CALL_ALLREDUCE_MANY, MG_DIST_CALL_BROADCAST_MANY,
  MG_DIST_CALL_REDUCE_SCATTER,
  MG_DIST_CALL_SYNC_ALLREDUCE, MG_DIST_CALL_SYNC_REDUCE_SCATTER,   /* mg_dist_sync_begin's */
  MG_DIST_CALL__COUNT
} mg_dist_call;

#define MG_DIST_MAGIC INT64_C(0x31306864676d)   /* "mgdh01": this layout */

/* What each rank sends before a collective: MG_DIST_HEADER_N int64 values
** (MPI_INT64_T). Fields a call has no use for are -1 (op, root, dtype) or 0. */
typedef struct mg_dist_header {
  int64_t magic;              /* MG_DIST_MAGIC */
  int64_t kind;               /* mg_dist_call */
  int64_t failed;             /* 1: this rank could not prepare the call (its own error says why) */
  int64_t op;                 /* mg_dist_op, or -1 */
  int64_t root;               /* broadcast's root, or -1 */
  int64_t dtype;              /* one tensor's mg_dtype, or -1 */
  int64_t ndim;               /* one tensor's shape: 0..MG_MAX_DIMS */
  int64_t dims[MG_MAX_DIMS];
  int64_t bytes;              /* this rank's bytes: one tensor's numel x dtype size, a list's sum */
  int64_t count;              /* a list's length (nil entries included) */
  int64_t fusion;             /* allreduce_many's fusion_bytes */
  int64_t scale;              /* allreduce_many's postscale, the double's bits */
  int64_t prescaled;          /* 1: allreduce_many's prescale is not 1 here (may differ by rank) */
  int64_t hash;               /* a list's entries (presence, dtype, shape), FNV-1a */
} mg_dist_header;

#define MG_DIST_HEADER_N ((int)(sizeof(mg_dist_header) / sizeof(int64_t)))

/* seconds a collective waits for every rank to arrive (600 by default, or
** MOONGRAD_DIST_TIMEOUT read at init); 0 waits forever */
#define MG_DIST_DEFAULT_TIMEOUT 600.0
mg_status mg_dist_set_timeout (double seconds);
double    mg_dist_timeout     (void);

mg_status mg_dist_init        (void);          /* MPI_Init_thread once; a no-op after */
int       mg_dist_initialized (void);          /* 1 between init and finalize */
int       mg_dist_rank        (void);
int       mg_dist_size        (void);
int       mg_dist_local_size  (void);          /* ranks on this machine (Horovod's local_size) */
mg_status mg_dist_barrier     (const char *fn);
/* at a normal end (lua_close); after a timed-out collective it aborts the
** job instead (MPI_Finalize would wait for the exchange that never ended) */
void      mg_dist_finalize    (void);
/* a failed rank: says so on stderr and has mpirun stop every rank now;
** nothing when MPI is not running */
void      mg_dist_abort       (int code);

/* MPI calls made (header exchanges included) and bytes reduced, broadcast
** or gathered since init; seconds the overlapped gradient syncs waited at
** their end for communication the backward did not hide (mg_dist_sync_end) */
typedef struct { int64_t calls, bytes; double waited; } mg_dist_stats;
mg_dist_stats mg_dist_get_stats (void);

/* tensors (new references; NULL + error on failure). A root outside
** 0..size-1 is an error on every rank, after the ranks agree on it. */
mg_tensor *mg_dist_allreduce (const char *fn, mg_tensor *t, mg_dist_op op);
mg_tensor *mg_dist_broadcast (const char *fn, mg_tensor *t, int64_t root);
/* along the first axis, which may differ by rank (a 0-d tensor is one row);
** above INT_MAX bytes in all it goes as one broadcast per rank, in chunks */
mg_tensor *mg_dist_allgather (const char *fn, mg_tensor *t);
/* the elements [*lo, *hi) of n that rank r of size holds in a sharded
** collective: nearly equal shares in rank order, the larger ones last
** (floor(n r / size) to floor(n (r + 1) / size): uneven n is fine) */
void       mg_dist_shard_range (int64_t n, int size, int r, int64_t *lo, int64_t *hi);
/* t (any shape; the same on every rank) reduced across the ranks, of which
** this rank gets its shard of the flattened result (mg_dist_shard_range), a
** 1-D tensor: MPI_Reduce_scatter (ZeRO's gradient step), half the bytes an
** allreduce moves. op sum or mean for floats, as allreduce. */
mg_tensor *mg_dist_reduce_scatter (const char *fn, mg_tensor *t, mg_dist_op op);
/* the same collective on a variable's value, in its own storage when nobody
** else holds it (otherwise into a new value the variable adopts) */
mg_status  mg_dist_allreduce_variable (const char *fn, mg_variable *v, mg_dist_op op);
mg_status  mg_dist_broadcast_variable (const char *fn, mg_variable *v, int64_t root);
/* root's values into n variables, after one agreement on the whole list */
mg_status  mg_dist_broadcast_variables (const char *fn, mg_variable *const *vs, int n, int64_t root);
/* n tensors reduced together (ts[i] NULL: a nil gradient, out[i] NULL; the
** ranks must agree on which): packed by dtype into buckets of at most
** fusion_bytes (one MPI call each) in a buffer kept between calls (freed by
** mg_dist_finalize); each rank's values are first multiplied by prescale
** (which may differ by rank) and the result by postscale; out[i] new
** references */
mg_status  mg_dist_allreduce_many (const char *fn, mg_tensor *const *ts, int n, mg_dist_op op,
                                   double prescale, double postscale, int64_t fusion_bytes,
                                   mg_tensor **out);

/*
** Gradients reduced while the backward runs (src/dist/overlap.c), as
** PyTorch's DDP and Horovod do. The list's entries (the variables, shaped
** as like[i]) are laid out per dtype end to end, as ShardedOptimizer lays
** them, and cut into buckets of whole entries of at most fusion_bytes. The
** tape's walk hands each gradient over as soon as it is whole
** (mg_tape_gradient_hooked's ready: mg_dist_sync_ready copies it, times
** prescale, into its bucket); a bucket goes out (MPI_Iallreduce, or
** MPI_Ireduce_scatter of each rank's share of the flat vector) once it is
** full and every bucket after it has gone, so every rank starts the same
** collectives in the same order, last bucket first (the order gradients
** come in); the walk's tick progresses them. mg_dist_sync_end sends what
** is left (a gradient not made here counts as zeros), waits, and agrees on
** which gradients any rank made. The ranks agree on the list first.
** Bucket buffers are allocated during the walk; a rank that fails then
** leaves the others waiting until the timeout (mg.distributed's scripts
** stop every rank at once on a failure: src/cli/main.c).
*/
typedef enum { MG_DIST_SYNC_ALLREDUCE, MG_DIST_SYNC_REDUCE_SCATTER } mg_dist_sync_mode;
typedef struct mg_dist_sync mg_dist_sync;

/* NULL + error on failure (the ranks disagree, out of memory); the result
** is scaled by postscale (the op is a sum) */
mg_dist_sync *mg_dist_sync_begin (const char *fn, mg_tensor *const *like, int n, mg_dist_sync_mode mode,
                                  double prescale, double postscale, int64_t fusion_bytes);
mg_status     mg_dist_sync_ready    (mg_dist_sync *s, int i, mg_tensor *grad);   /* entry i's whole gradient */
void          mg_dist_sync_progress (mg_dist_sync *s);
/* allreduce: out[i] entry i's reduced gradient (n of them, NULL where no
** rank made one); reduce_scatter: out[g] this rank's shard of dtype group
** g's flat vector (mg_dist_sync_groups of them, in the order of their first
** entries) and present[i] whether any rank made entry i's gradient */
mg_status     mg_dist_sync_end    (mg_dist_sync *s, mg_tensor **out, unsigned char *present);
int           mg_dist_sync_groups (const mg_dist_sync *s);
/* frees s; with collectives still in flight (a failed walk) their buffers
** stay allocated for MPI and MPI cannot be used again in the process */
void          mg_dist_sync_free   (mg_dist_sync *s);

#endif

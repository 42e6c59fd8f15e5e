/*
** dist.h — collectives over MPI for mg.distributed (src/dist/mpi.c).
**
** Not part of libmoongrad.a: the Makefile compiles mpi.c and its binding
** (src/lua/ldistributed.c) into the moongrad binary and moongrad.so only, so
** the core library and its C hosts never need MPI. Plain C: no lua.h here.
** Every function returns MG_OK, or MG_ERR with mg_errmsg() naming `fn`.
*/
#ifndef MG_DIST_H
#define MG_DIST_H

#include <stdint.h>
#include "moongrad.h"

typedef enum { MG_DIST_SUM, MG_DIST_MEAN, MG_DIST_MAX, MG_DIST_MIN } mg_dist_op;

mg_status mg_dist_init        (void);          /* MPI_Init_thread once; a no-op after */
int       mg_dist_initialized (void);          /* 1 between init and finalize */
int       mg_dist_rank        (void);
int       mg_dist_size        (void);
mg_status mg_dist_barrier     (const char *fn);
void      mg_dist_finalize    (void);          /* at a normal end (lua_close) */
/* a failed rank: says so on stderr and has mpirun stop every rank now;
** nothing when MPI is not running */
void      mg_dist_abort       (int code);

/* MPI calls made and bytes reduced, broadcast or gathered since init */
typedef struct { int64_t calls, bytes; } mg_dist_stats;
mg_dist_stats mg_dist_get_stats (void);

/* n values of dtype dt at buf, reduced across ranks in place; each rank's
** values are first multiplied by prescale and the result by postscale
** (floats only; 1 and 1 leave them alone) */
mg_status mg_dist_allreduce_buf (const char *fn, void *buf, int64_t n, mg_dtype dt, mg_dist_op op,
                                 double prescale, double postscale);
mg_status mg_dist_bcast_buf     (const char *fn, void *buf, int64_t nbytes, int root);
/* each rank's counts[r] bytes, rank after rank, into recv; counts from every rank */
mg_status mg_dist_allgatherv_buf (const char *fn, const void *send, int64_t nbytes, void *recv,
                                  const int64_t *counts);
/* n int64 values from every rank into out (size * n values, rank after rank) */
mg_status mg_dist_allgather_i64 (const char *fn, const int64_t *mine, int n, int64_t *out);

/* tensors (new references; NULL + error on failure) */
mg_tensor *mg_dist_allreduce (const char *fn, mg_tensor *t, mg_dist_op op);
mg_tensor *mg_dist_broadcast (const char *fn, mg_tensor *t, int root);
mg_tensor *mg_dist_allgather (const char *fn, mg_tensor *t);
/* the same collective on a variable's value, in its own storage when nobody
** else holds it (otherwise into a new value the variable adopts) */
mg_status  mg_dist_allreduce_variable (const char *fn, mg_variable *v, mg_dist_op op);
mg_status  mg_dist_broadcast_variable (const char *fn, mg_variable *v, int root);
/* n tensors reduced together: packed by dtype into buckets of at most
** fusion_bytes (one MPI call each) in a buffer kept between calls (freed by
** mg_dist_finalize); out[i] new references */
mg_status  mg_dist_allreduce_many (const char *fn, mg_tensor *const *ts, int n, mg_dist_op op,
                                   double prescale, double postscale, int64_t fusion_bytes,
                                   mg_tensor **out);

#endif

/*
** shared.h — what mpi.c lends the other files of src/dist (overlap.c): the
** agreement on a list, waiting with the timeout, MPI's names for dtypes and
** ops, scaling, and the counters. Private to src/dist; users see dist.h.
*/
#ifndef MG_DIST_SHARED_H
#define MG_DIST_SHARED_H

#include <mpi.h>

#include "dist/dist.h"

#define MG_DIST_DESC (3 + MG_MAX_DIMS)   /* a list entry: present, dtype, ndim, dims */

extern mg_dist_stats mg_dist_counts;    /* what mg_dist_get_stats reports */
extern int mg_dist_broken;              /* a collective is pending for good: MPI is unusable */

mg_status    mg_dist_need_init (const char *fn);
mg_status    mg_dist_mpi_fail  (const char *fn, int rc);           /* MPI's error string, as ours */
/* waits for req, at most the timeout (then MPI is broken for good) */
mg_status    mg_dist_wait      (const char *fn, MPI_Request *req);
/* one turn of a wait begun at start (MPI_Wtime): true past the timeout (MPI
** broken for good: the request stays pending); else, past spin_s, a nap of
** 20 us, and past long_s one of 1 ms, leaving the core to the others */
bool         mg_dist_waited_out (double start, double spin_s, double long_s);
/* one entry of a list (MG_DIST_DESC values; NULL: nil) and the list's hash */
void         mg_dist_describe_entry (int64_t *e, const mg_tensor *t);
int64_t      mg_dist_hash_list (const int64_t *desc, int64_t n);
/* every rank's header of a list call, checked against rank 0's (the same
** error on every rank); noun names an entry in messages ("gradient") */
mg_status    mg_dist_agree_list (const char *fn, const mg_dist_header *mine, const char *noun, const int64_t *desc);
MPI_Datatype mg_dist_mpi_type  (mg_dtype dt);
MPI_Op       mg_dist_mpi_op    (mg_dtype dt, mg_dist_op op);
mg_status    mg_dist_check_op  (const char *fn, mg_dtype dt, mg_dist_op op, double pre, double post);
void         mg_dist_scale     (void *buf, int64_t n, mg_dtype dt, double s);          /* buf *= s */
void         mg_dist_copy_scaled (void *dst, const void *src, int64_t n, mg_dtype dt, double s);

#endif

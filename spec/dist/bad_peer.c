/*
** bad_peer.c — a buggy MPI rank for spec/30-distributed_spec.lua: it speaks
** moongrad's call header (src/dist/dist.h) but lies in it. Started beside
** two moongrad ranks running spec/dist/bad_header.lua:
**   mpirun -np 2 moongrad spec/dist/bad_header.lua : -np 1 bad_peer
** For each case of bad_header.lua it sends one header (the moongrad ranks
** each call allgather on a float32 (2,3) tensor); the moongrad ranks must
** raise an error from the header alone, before sizing anything by it. Then
** it takes part in a valid allgather (one row: 7 8 9) and a barrier.
*/
#define _POSIX_C_SOURCE 200809L      /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "dist/dist.h"

static int size;

/* every rank's header, as the moongrad ranks exchange them (nonblocking:
** a blocking collective would not match theirs) */
static void exchange (const mg_dist_header *h, mg_dist_header *all) {
  MPI_Request req;
  MPI_Iallgather(h, MG_DIST_HEADER_N, MPI_INT64_T, all, MG_DIST_HEADER_N, MPI_INT64_T, MPI_COMM_WORLD, &req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
}

static mg_dist_header allgather_header (int64_t rows, int64_t cols) {
  mg_dist_header h = {.magic = MG_DIST_MAGIC, .kind = MG_DIST_CALL_ALLGATHER, .op = -1, .root = -1,
                      .dtype = MG_FLOAT32, .ndim = 2, .dims = {rows, cols}, .bytes = rows * cols * 4};
  return h;
}

int main (int argc, char **argv) {
  /* as mg_dist_init: the same MPI_Iallreduce algorithm as the moongrad
  ** ranks (MPI itself uses it to make a communicator), and its one
  ** collective, the ranks per machine */
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
  MPI_Init(&argc, &argv);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_free(&node);
  mg_dist_header all[16], h;
  if (size > 16) MPI_Abort(MPI_COMM_WORLD, 2);

  h = allgather_header(-5, 3);                        /* negative first axis */
  exchange(&h, all);
  h = allgather_header(INT64_C(1) << 40, INT64_C(1) << 40);   /* more than 2^63 bytes */
  h.bytes = 0;
  exchange(&h, all);
  h = allgather_header(2, 3);                         /* ndim out of range */
  h.ndim = 99;
  exchange(&h, all);
  h = allgather_header(2, 3);                         /* bytes that do not match the shape */
  h.bytes = INT64_C(1) << 40;
  exchange(&h, all);
  h = allgather_header(2, 3);                         /* not a header */
  h.magic = 12345;
  exchange(&h, all);
  h = allgather_header(2, 3);                         /* a failure of its own */
  h.failed = 1;
  exchange(&h, all);
  h = allgather_header(2, 4);                         /* a valid header, another second axis */
  exchange(&h, all);
  h = allgather_header(INT64_C(1) << 40, 3);          /* valid, but too many rows to gather */
  exchange(&h, all);
  mg_dist_header ready = {.magic = MG_DIST_MAGIC, .kind = MG_DIST_CALL_ALLGATHER_READY, .op = -1, .root = -1, .dtype = -1};
  exchange(&ready, all);                              /* the others could not allocate: they stop here */

  h = allgather_header(1, 3);                         /* a valid allgather of one row */
  exchange(&h, all);
  exchange(&ready, all);
  float row[3] = {7, 8, 9}, out[16 * 6];          /* the moongrad ranks give 2 rows of 3 each */
  int cnt[16], dsp[16];
  for (int r = 0; r < size; r++) {
    cnt[r] = r == size - 1 ? 12 : 24;
    dsp[r] = r * 24;
  }
  MPI_Allgatherv(row, 12, MPI_BYTE, out, cnt, dsp, MPI_BYTE, MPI_COMM_WORLD);
  mg_dist_header barrier = {.magic = MG_DIST_MAGIC, .kind = MG_DIST_CALL_BARRIER, .op = -1, .root = -1, .dtype = -1};
  exchange(&barrier, all);
  MPI_Finalize();
  return 0;
}

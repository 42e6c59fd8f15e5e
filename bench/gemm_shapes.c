/*
** gemm_shapes.c — the raw libraries on the GEMM shapes a training step
** makes: oneDNN's dnnl_sgemm and OpenBLAS' cblas_sgemm (the OpenMP build,
** which shares moongrad's thread pool), row-major, median GFLOPS of a few
** timed runs after a warm-up. bench/gemm.lua prints them next to mg.matmul.
**   cc -O2 bench/gemm_shapes.c -ldnnl -L$(OPENBLAS_DIR) -lopenblas -fopenmp -o build/gemm_shapes
**   build/gemm_shapes THREADS M N K TA TB    (TA, TB: N or T)
** prints "<dnnl GFLOPS> <openblas GFLOPS>"
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

void openblas_set_num_threads (int);

static double now (void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp (const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct { long m, n, k; char ta, tb; float *a, *b, *c; } gemm;

static void run (const gemm *g, int dnnl) {
  long lda = g->ta == 'N' ? g->k : g->m, ldb = g->tb == 'N' ? g->n : g->k;
  if (dnnl)
    dnnl_sgemm(g->ta, g->tb, g->m, g->n, g->k, 1.0f, g->a, lda, g->b, ldb, 0.0f, g->c, g->n);
  else
    cblas_sgemm(CblasRowMajor, g->ta == 'N' ? CblasNoTrans : CblasTrans,
                g->tb == 'N' ? CblasNoTrans : CblasTrans, (int)g->m, (int)g->n, (int)g->k, 1.0f,
                g->a, (int)lda, g->b, (int)ldb, 0.0f, g->c, (int)g->n);
}

/* median GFLOPS of 7 timings, each of enough calls to take about 20 ms */
static double gflops (const gemm *g, int dnnl) {
  double flop = 2.0 * g->m * g->n * g->k;
  run(g, dnnl);
  double t0 = now();
  run(g, dnnl);
  double one = now() - t0;
  int reps = one > 0.02 ? 1 : (int)(0.02 / (one > 1e-7 ? one : 1e-7)) + 1;
  double ts[7];
  for (int r = 0; r < 7; r++) {
    t0 = now();
    for (int i = 0; i < reps; i++) run(g, dnnl);
    ts[r] = (now() - t0) / reps;
  }
  qsort(ts, 7, sizeof ts[0], cmp);
  return flop / ts[3] / 1e9;
}

int main (int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: gemm_shapes THREADS M N K TA TB\n");
    return 2;
  }
  int threads = atoi(argv[1]);
  gemm g = {atol(argv[2]), atol(argv[3]), atol(argv[4]), argv[5][0], argv[6][0], NULL, NULL, NULL};
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  g.a = malloc(sizeof(float) * (size_t)(g.m * g.k));
  g.b = malloc(sizeof(float) * (size_t)(g.k * g.n));
  g.c = malloc(sizeof(float) * (size_t)(g.m * g.n));
  for (long i = 0; i < g.m * g.k; i++) g.a[i] = (float)(i % 7) * 0.1f;
  for (long i = 0; i < g.k * g.n; i++) g.b[i] = (float)(i % 5) * 0.1f;
  double d = gflops(&g, 1), o = gflops(&g, 0);
  printf("%.2f %.2f\n", d, o);
  return 0;
}

/*
** gemm_ceiling.c — the machine's sgemm ceiling, for bench/bench.lua: raw
** oneDNN dnnl_sgemm and OpenBLAS cblas_sgemm, best of 5, in GFLOPS.
**   cc -O2 bench/gemm_ceiling.c -ldnnl -lopenblas -o build/gemm_ceiling
**   build/gemm_ceiling dnnl|openblas <n>       (threads: OMP_NUM_THREADS)
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <dnnl.h>

static double now (void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main (int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: gemm_ceiling dnnl|openblas <n>\n");
    return 2;
  }
  int dnnl = strcmp(argv[1], "dnnl") == 0, n = atoi(argv[2]);
  float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * n);
  float *c = malloc(sizeof(float) * (size_t)n * n);
  for (long i = 0; i < (long)n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; }
  int reps = n <= 256 ? 200 : (n <= 1024 ? 20 : 5);
  double best = 1e30;
  for (int r = 0; r < 6; r++) {
    double t = now();
    for (int k = 0; k < reps; k++) {
      if (dnnl) dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    }
    t = (now() - t) / reps;
    if (r > 0 && t < best) best = t;               /* the first round warms up */
  }
  printf("%.4f\n", 2.0 * n * n * n / best / 1e9);
  return 0;
}

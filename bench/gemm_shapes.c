/*
** gemm_shapes.c — the raw libraries on the GEMM shapes a training step
** makes: oneDNN's dnnl_sgemm, oneDNN's matmul primitive (made once, as
** moongrad keeps it) and OpenBLAS' cblas_sgemm (the OpenMP build, which
** shares moongrad's thread pool), row-major, median GFLOPS of a few timed
** runs after a warm-up. bench/gemm.lua prints them next to mg.matmul.
**   cc -O2 bench/gemm_shapes.c -ldnnl -L$(OPENBLAS_DIR) -lopenblas -fopenmp -o build/gemm_shapes
**   build/gemm_shapes THREADS M N K TA TB    (TA, TB: N or T)
** prints "<dnnl_sgemm GFLOPS> <openblas GFLOPS> <dnnl matmul primitive GFLOPS>";
**   build/gemm_shapes core   prints the core type whose kernels OpenBLAS runs
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

enum { DNNL_SGEMM, OPENBLAS, DNNL_MATMUL };

/* the matmul primitive for g, made on first use, and its arguments */
static struct { dnnl_engine_t engine; dnnl_stream_t stream; dnnl_primitive_t p; dnnl_exec_arg_t args[4]; int n; } mm;

static void matmul_make (const gemm *g) {
  long lda = g->ta == 'N' ? g->k : g->m, ldb = g->tb == 'N' ? g->n : g->k;
  dnnl_dims_t ad = {g->m, g->k}, bd = {g->k, g->n}, cd = {g->m, g->n};
  dnnl_dims_t as = {g->ta == 'N' ? lda : 1, g->ta == 'N' ? 1 : lda};
  dnnl_dims_t bs = {g->tb == 'N' ? ldb : 1, g->tb == 'N' ? 1 : ldb}, cs = {g->n, 1};
  dnnl_memory_desc_t a, b, c;
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd;
  dnnl_engine_create(&mm.engine, dnnl_cpu, 0);
  dnnl_stream_create(&mm.stream, mm.engine, dnnl_stream_default_flags);
  dnnl_memory_desc_init_by_strides(&a, 2, ad, dnnl_f32, as);
  dnnl_memory_desc_init_by_strides(&b, 2, bd, dnnl_f32, bs);
  dnnl_memory_desc_init_by_strides(&c, 2, cd, dnnl_f32, cs);
  dnnl_matmul_desc_init(&md, &a, &b, NULL, &c);
  if (dnnl_primitive_desc_create(&pd, &md, NULL, mm.engine, NULL) != dnnl_success ||
      dnnl_primitive_create(&mm.p, pd) != dnnl_success) {
    fprintf(stderr, "gemm_shapes: oneDNN made no matmul primitive\n");
    exit(1);
  }
  int args[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  float *ptrs[3] = {g->a, g->b, g->c};
  for (int i = 0; i < 3; i++) {
    mm.args[i].arg = args[i];
    dnnl_memory_create(&mm.args[i].memory, dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, args[i]),
                       mm.engine, ptrs[i]);
  }
  mm.n = 3;
  const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (sp && dnnl_memory_desc_get_size(sp) > 0) {
    mm.args[3].arg = DNNL_ARG_SCRATCHPAD;
    dnnl_memory_create(&mm.args[3].memory, sp, mm.engine, DNNL_MEMORY_ALLOCATE);
    mm.n = 4;
  }
}

static void run (const gemm *g, int lib) {
  long lda = g->ta == 'N' ? g->k : g->m, ldb = g->tb == 'N' ? g->n : g->k;
  if (lib == DNNL_MATMUL) {
    if (mm.p == NULL) matmul_make(g);
    dnnl_primitive_execute(mm.p, mm.stream, mm.n, mm.args);
    dnnl_stream_wait(mm.stream);
  } else if (lib == DNNL_SGEMM)
    dnnl_sgemm(g->ta, g->tb, g->m, g->n, g->k, 1.0f, g->a, lda, g->b, ldb, 0.0f, g->c, g->n);
  else
    cblas_sgemm(CblasRowMajor, g->ta == 'N' ? CblasNoTrans : CblasTrans,
                g->tb == 'N' ? CblasNoTrans : CblasTrans, (int)g->m, (int)g->n, (int)g->k, 1.0f,
                g->a, (int)lda, g->b, (int)ldb, 0.0f, g->c, (int)g->n);
}

/* median GFLOPS of 7 timings, each of enough calls to take about 20 ms */
static double gflops (const gemm *g, int lib) {
  double flop = 2.0 * g->m * g->n * g->k;
  run(g, lib);
  double t0 = now();
  run(g, lib);
  double one = now() - t0;
  int reps = one > 0.02 ? 1 : (int)(0.02 / (one > 1e-7 ? one : 1e-7)) + 1;
  double ts[7];
  for (int r = 0; r < 7; r++) {
    t0 = now();
    for (int i = 0; i < reps; i++) run(g, lib);
    ts[r] = (now() - t0) / reps;
  }
  qsort(ts, 7, sizeof ts[0], cmp);
  return flop / ts[3] / 1e9;
}

int main (int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "core") == 0) {
    printf("%s\n", openblas_get_corename());
    return 0;
  }
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
  double d = gflops(&g, DNNL_SGEMM), o = gflops(&g, OPENBLAS), p = gflops(&g, DNNL_MATMUL);
  printf("%.2f %.2f %.2f\n", d, o, p);
  return 0;
}

/*
** gemm_bf16_ceiling.c — oneDNN's own bfloat16 product on one GEMM shape:
** its matmul primitive with dnnl_bf16 source and weights (float32
** accumulation), made once, called directly, with a bfloat16 output (what
** mg.matmul of two bfloat16 tensors returns) and with a float32 one. Row-
** major; a transposed operand is a transposed view (strides), as the
** gradient rules make them. Median GFLOPS of 7 timings of about 20 ms each,
** after two warm-up calls. bench/autocast.lua prints them next to mg.matmul.
**   cc -O2 bench/gemm_bf16_ceiling.c -ldnnl -fopenmp -o build/gemm_bf16_ceiling
**   build/gemm_bf16_ceiling THREADS M N K TA TB    (TA, TB: N or T)
** prints "<GFLOPS, bf16 output> <GFLOPS, f32 output>";
**   build/gemm_bf16_ceiling isa   prints the ISA oneDNN runs on here
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>
#include <omp.h>

static double now (void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp (const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  dnnl_primitive_t p;
  dnnl_exec_arg_t args[4];
  int n;
} prim;

static void check (dnnl_status_t st, const char *what) {
  if (st == dnnl_unimplemented) {    /* oneDNN 2.6 on an AVX2-only CPU: no ceiling to measure */
    printf("n/a: oneDNN has no bfloat16 %s on this CPU (AVX-512 or AMX needed)\n", what);
    exit(3);
  }
  if (st != dnnl_success) {
    fprintf(stderr, "gemm_bf16_ceiling: %s failed (oneDNN status %d)\n", what, (int)st);
    exit(1);
  }
}

/* the matmul primitive for op(A) (m,k) @ op(B) (k,n) -> C (m,n), bfloat16
** operands, output of type cdt */
static void make (prim *pm, long m, long n, long k, char ta, char tb, void *a, void *b, void *c,
                  dnnl_data_type_t cdt) {
  long lda = ta == 'N' ? k : m, ldb = tb == 'N' ? n : k;
  dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
  dnnl_dims_t as = {ta == 'N' ? lda : 1, ta == 'N' ? 1 : lda};
  dnnl_dims_t bs = {tb == 'N' ? ldb : 1, tb == 'N' ? 1 : ldb}, cs = {n, 1};
  dnnl_memory_desc_t amd, bmd, cmd;
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd;
  check(dnnl_engine_create(&pm->engine, dnnl_cpu, 0), "engine");
  check(dnnl_stream_create(&pm->stream, pm->engine, dnnl_stream_default_flags), "stream");
  check(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as), "A's descriptor");
  check(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs), "B's descriptor");
  check(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, cdt, cs), "C's descriptor");
  check(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd), "matmul descriptor");
  check(dnnl_primitive_desc_create(&pd, &md, NULL, pm->engine, NULL), "matmul primitive descriptor");
  check(dnnl_primitive_create(&pm->p, pd), "matmul primitive");
  int args[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  void *ptrs[3] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    pm->args[i].arg = args[i];
    check(dnnl_memory_create(&pm->args[i].memory, dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, args[i]),
                             pm->engine, ptrs[i]), "memory");
  }
  pm->n = 3;
  const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (sp && dnnl_memory_desc_get_size(sp) > 0) {
    pm->args[3].arg = DNNL_ARG_SCRATCHPAD;
    check(dnnl_memory_create(&pm->args[3].memory, sp, pm->engine, DNNL_MEMORY_ALLOCATE), "scratchpad");
    pm->n = 4;
  }
}

static void run (prim *pm) {
  dnnl_primitive_execute(pm->p, pm->stream, pm->n, pm->args);
  dnnl_stream_wait(pm->stream);
}

/* median GFLOPS of 7 timings, each of enough calls to take about 20 ms */
static double gflops (prim *pm, double flop) {
  run(pm);
  run(pm);
  double t0 = now();
  run(pm);
  double one = now() - t0;
  int reps = one > 0.02 ? 1 : (int)(0.02 / (one > 1e-7 ? one : 1e-7)) + 1;
  double ts[7];
  for (int r = 0; r < 7; r++) {
    t0 = now();
    for (int i = 0; i < reps; i++) run(pm);
    ts[r] = (now() - t0) / reps;
  }
  qsort(ts, 7, sizeof ts[0], cmp);
  return flop / ts[3] / 1e9;
}

/* a float's bfloat16, rounded to nearest even */
static uint16_t bf16 (float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

int main (int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "isa") == 0) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    puts((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx ? "avx512_core_amx"
         : (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16 ? "avx512_core_bf16"
         : "none");
    return 0;
  }
  if (argc < 7) {
    fprintf(stderr, "usage: gemm_bf16_ceiling THREADS M N K TA TB | gemm_bf16_ceiling isa\n");
    return 2;
  }
  int threads = atoi(argv[1]);
  long m = atol(argv[2]), n = atol(argv[3]), k = atol(argv[4]);
  char ta = argv[5][0], tb = argv[6][0];
  omp_set_num_threads(threads);
  uint16_t *a = malloc(sizeof(uint16_t) * (size_t)(m * k)), *b = malloc(sizeof(uint16_t) * (size_t)(k * n));
  void *c = malloc(sizeof(float) * (size_t)(m * n));
  if (!a || !b || !c) return 1;
  for (long i = 0; i < m * k; i++) a[i] = bf16((float)(i % 7) * 0.1f);
  for (long i = 0; i < k * n; i++) b[i] = bf16((float)(i % 5) * 0.1f);
  double flop = 2.0 * (double)m * (double)n * (double)k;
  prim p16 = {0}, p32 = {0};
  make(&p16, m, n, k, ta, tb, a, b, c, dnnl_bf16);
  double g16 = gflops(&p16, flop);
  make(&p32, m, n, k, ta, tb, a, b, c, dnnl_f32);
  double g32 = gflops(&p32, flop);
  printf("%.2f %.2f\n", g16, g32);
  return 0;
}

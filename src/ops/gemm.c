/*
** gemm.c — float32 GEMM through the library that is fastest for the shape
** on this machine: oneDNN's dnnl_sgemm or OpenBLAS' cblas_sgemm (its OpenMP
** build, so both share moongrad's thread pool), at the thread count asked
** for or at one thread.
**
** No library wins everywhere: on AVX2 (AMD EPYC) OpenBLAS leads the square
** products and oneDNN the thin ones, oneDNN's NN kernel runs at half speed
** when B is 64-byte aligned (as every moongrad tensor is), and on AVX-512
** OpenBLAS runs its AVX-512 kernels only with the right core type (Debian's
** build took one Xeon for a Prescott, and an environment may set
** OPENBLAS_CORETYPE=Haswell for every program). So the first product of each
** shape class (transposes, each size rounded to a half power of two,
** threads) times the candidates on its own operands and keeps the fastest,
** and each new shape of a known class is settled before its first product
** (settle_shape), so a shape runs one way in a process; the choices are
** appended to a file under ~/.cache/moongrad/ named for the CPU and the
** libraries' kernels, so later processes (and runs to be resumed bit for
** bit) choose alike.
** MOONGRAD_GEMM=dnnl|openblas forces a library, MOONGRAD_GEMM_CACHE=path
** moves the file ("off": none).
*/
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <omp.h>

#include "dnn.h"

/* {======================== the candidates ===================== */

typedef enum { LIB_DNNL, LIB_OPENBLAS, LIB_DNNL_CT, LIB_GEMV, LIB_GER, LIB_DNNL_MATMUL, LIB__COUNT } gemm_lib;
static const char *const lib_names[LIB__COUNT] = {"dnnl", "openblas", "dnnl-ct", "openblas-gemv",
                                                  "openblas-ger", "dnnl-matmul"};

typedef struct { gemm_lib lib; int threads; } gemm_way;

typedef struct {
  char ta, tb;
  int64_t m, n, k, lda, ldb;
  const float *a, *b;
  float *c;                       /* (m, n), leading dimension n */
} gemm_call;

/* c (m,n) = t (n,m) transposed, in tiles that stay in cache */
static void transpose_into (float *c, const float *t, int64_t m, int64_t n) {
  for (int64_t i0 = 0; i0 < m; i0 += 32)
    for (int64_t j0 = 0; j0 < n; j0 += 32)
      for (int64_t i = i0; i < i0 + 32 && i < m; i++)
        for (int64_t j = j0; j < j0 + 32 && j < n; j++) c[i * n + j] = t[j * m + i];
}

/* C^T = op(B)^T op(A)^T, then transposed: oneDNN runs a few rows times a
** transposed matrix (every backward's dout @ W^T) far below its speed on
** some CPUs, and the transposed product at full speed */
static mg_status dnnl_ct (const gemm_call *g) {
  float *t = (float *)malloc(sizeof(float) * (size_t)(g->m * g->n));
  if (t == NULL) return mg_seterror("matmul: out of memory");
  dnnl_status_t st = dnnl_sgemm(g->tb == 'N' ? 'T' : 'N', g->ta == 'N' ? 'T' : 'N', g->n, g->m, g->k,
                                1.0f, g->b, g->ldb, g->a, g->lda, 0.0f, t, g->m);
  if (st == dnnl_success) transpose_into(g->c, t, g->m, g->n);
  free(t);
  return st == dnnl_success ? MG_OK : mg_seterror("matmul: oneDNN sgemm failed (status %d)", (int)st);
}

/* the matmul primitive's key (dnn.h): the transposes, operand and result
** dtypes, a bias and relu in its epilogue, sizes, leading dimensions and threads */
typedef struct { int32_t kind, nthr, ta, tb, ab, cdt, bias, relu; int64_t m, n, k, lda, ldb; } matmul_key;

static mg_dnn_prim *matmul_prim (mg_dnn *d, const matmul_key *key) {
  /* op(A) (m,k) and op(B) (k,n) as strides over the row-major buffers */
  dnnl_dims_t ad = {key->m, key->k}, bd = {key->k, key->n}, cd = {key->m, key->n};
  dnnl_dims_t as = {key->ta ? 1 : key->lda, key->ta ? key->lda : 1};
  dnnl_dims_t bs = {key->tb ? 1 : key->ldb, key->tb ? key->ldb : 1}, cs = {key->n, 1};
  dnnl_dims_t biasd = {1, key->n};
  dnnl_memory_desc_t a, b, c, bias;
  dnnl_matmul_desc_t md;
  dnnl_data_type_t ab = (dnnl_data_type_t)key->ab, cdt = (dnnl_data_type_t)key->cdt;
  dnnl_status_t st = dnnl_memory_desc_init_by_strides(&a, 2, ad, ab, as);
  if (st == dnnl_success) st = dnnl_memory_desc_init_by_strides(&b, 2, bd, ab, bs);
  if (st == dnnl_success) st = dnnl_memory_desc_init_by_strides(&c, 2, cd, cdt, cs);
  if (st == dnnl_success && key->bias) st = dnnl_memory_desc_init_by_tag(&bias, 2, biasd, dnnl_f32, dnnl_ab);
  if (st == dnnl_success) st = dnnl_matmul_desc_init(&md, &a, &b, key->bias ? &bias : NULL, &c);
  if (st != dnnl_success) return mg_dnn_fail("matmul", "describe a matmul", st), NULL;
  dnnl_primitive_attr_t attr = NULL;   /* relu on the float32 sums: exact, it commutes with the rounding */
  dnnl_post_ops_t po = NULL;
  if (key->relu) {
    st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success) st = dnnl_post_ops_create(&po);
    if (st == dnnl_success) st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, po);
    if (po) dnnl_post_ops_destroy(po);
    if (st != dnnl_success) {
      if (attr) dnnl_primitive_attr_destroy(attr);
      return mg_dnn_fail("matmul", "describe a matmul's relu", st), NULL;
    }
  }
  /* its scratchpad (packed panels) is oneDNN's own, as dnnl_sgemm's and
  ** OpenBLAS' are: counted, it would make the memory a budget admits depend
  ** on the way calibration chose */
  mg_dnn_prim *e = mg_dnn_slot(d, 0);
  st = dnnl_primitive_desc_create(&e->pd, &md, attr, d->engine, NULL);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (st == dnnl_success) st = mg_dnn_finish(d, e, key, sizeof *key);
  if (st != dnnl_success) {
    mg_dnn_destroy(e);
    return mg_dnn_fail("matmul", "make a matmul", st), NULL;
  }
  return e;
}

/* oneDNN's matmul primitive: its brgemm kernels run a few rows times a
** transposed matrix at full speed, where dnnl_sgemm runs it at half */
static mg_status matmul_primitive (const gemm_call *g) {
  mg_dnn *d = mg_dnn_get("matmul");
  if (d == NULL) return MG_ERR;
  matmul_key key = {MG_DNN_MATMUL, omp_get_max_threads(), g->ta == 'T', g->tb == 'T', dnnl_f32, dnnl_f32, 0, 0,
                    g->m, g->n, g->k, g->lda, g->ldb};
  mg_dnn_prim *e = mg_dnn_find(d, &key, sizeof key);
  if (e == NULL && (e = matmul_prim(d, &key)) == NULL) return MG_ERR;
  int args[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  void *ptrs[3] = {(void *)g->a, (void *)g->b, g->c};
  return mg_dnn_execute("matmul", d, e->pd, e->p, e->scratch, 3, args, ptrs, e->mem);
}

/* a product with one row or one column is a matrix times a vector: OpenBLAS'
** sgemv, without GEMM's packing (the element stride of a vector view is
** its leading dimension when it runs down a column) */
static void gemv (const gemm_call *g) {
  if (g->m == 1) {                      /* c^T = op(B)^T a^T */
    int inca = g->ta == 'N' ? 1 : (int)g->lda;
    if (g->tb == 'N')
      cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)g->k, (blasint)g->n, 1.0f, g->b, (blasint)g->ldb,
                  g->a, inca, 0.0f, g->c, 1);
    else
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)g->n, (blasint)g->k, 1.0f, g->b, (blasint)g->ldb,
                  g->a, inca, 0.0f, g->c, 1);
  } else {                              /* n == 1: c = op(A) b */
    int incb = g->tb == 'N' ? (int)g->ldb : 1;
    if (g->ta == 'N')
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)g->m, (blasint)g->k, 1.0f, g->a, (blasint)g->lda,
                  g->b, incb, 0.0f, g->c, 1);
    else
      cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)g->k, (blasint)g->m, 1.0f, g->a, (blasint)g->lda,
                  g->b, incb, 0.0f, g->c, 1);
  }
}

/* k == 1: an outer product, OpenBLAS' sger into zeros */
static void ger (const gemm_call *g) {
  memset(g->c, 0, sizeof(float) * (size_t)(g->m * g->n));
  cblas_sger(CblasRowMajor, (blasint)g->m, (blasint)g->n, 1.0f, g->a, g->ta == 'N' ? (blasint)g->lda : 1,
             g->b, g->tb == 'N' ? 1 : (blasint)g->ldb, g->c, (blasint)g->n);
}

/* whether lib can compute g at all */
static bool lib_fits (gemm_lib lib, const gemm_call *g) {
  switch (lib) {
    case LIB_DNNL_CT: return g->tb == 'T' && g->m <= 256 && g->n > g->m;
    case LIB_GEMV: return g->m == 1 || g->n == 1;
    case LIB_GER: return g->k == 1;
    default: return true;
  }
}

static mg_status run_lib (gemm_lib lib, const gemm_call *g) {
  switch (lib) {
    case LIB_GEMV: gemv(g); return MG_OK;
    case LIB_GER: ger(g); return MG_OK;
    case LIB_OPENBLAS:
      cblas_sgemm(CblasRowMajor, g->ta == 'N' ? CblasNoTrans : CblasTrans,
                  g->tb == 'N' ? CblasNoTrans : CblasTrans, (blasint)g->m, (blasint)g->n,
                  (blasint)g->k, 1.0f, g->a, (blasint)g->lda, g->b, (blasint)g->ldb, 0.0f, g->c,
                  (blasint)g->n);
      return MG_OK;
    case LIB_DNNL_CT:
      return dnnl_ct(g);
    case LIB_DNNL_MATMUL:
      return matmul_primitive(g);
    default: {
      dnnl_status_t st = dnnl_sgemm(g->ta, g->tb, g->m, g->n, g->k, 1.0f, g->a, g->lda, g->b,
                                    g->ldb, 0.0f, g->c, g->n);
      return st == dnnl_success ? MG_OK : mg_seterror("matmul: oneDNN sgemm failed (status %d)", (int)st);
    }
  }
}

/* both libraries read the OpenMP thread count at each call */
static mg_status run_way (gemm_way w, const gemm_call *g) {
  int was = omp_get_max_threads();
  if (w.threads != was) omp_set_num_threads(w.threads);
  mg_status st = run_lib(w.lib, g);
  if (w.threads != was) omp_set_num_threads(was);
  return st;
}

/* }========================================================== */


/* {========================= the choices ======================= */

/* a shape class: the transposes, the sizes rounded to half powers of two,
** the threads asked for */
static uint64_t class_of (char ta, char tb, int64_t m, int64_t n, int64_t k, int threads) {
  uint64_t key = (uint64_t)(ta == 'T') | (uint64_t)(tb == 'T') << 1 | (uint64_t)threads << 2;
  const int64_t d[3] = {m, n, k};
  for (int i = 0; i < 3; i++) {
    int half = (int)ceil(2.0 * log2((double)d[i]));      /* 2^(half/2) >= d */
    key |= (uint64_t)(half & 0xFF) << (16 + 8 * i);
  }
  return key;
}

/* A shape, exactly, for its own choice; the bit that class keys never have
** marks it. */
#define EXACT_KEY (UINT64_C(1) << 63)
static uint64_t exact_of (const gemm_call *g, int threads) {
  const uint64_t f[6] = {(uint64_t)(g->ta == 'T'), (uint64_t)(g->tb == 'T'), (uint64_t)threads,
                         (uint64_t)g->m, (uint64_t)g->n, (uint64_t)g->k};
  uint64_t h = UINT64_C(1469598103934665603);            /* FNV-1a, a word at a time */
  for (int i = 0; i < 6; i++) h = (h ^ f[i]) * UINT64_C(1099511628211);
  return h | EXACT_KEY;
}

/*
** The choices in an open-addressing table (a machine's file holds hundreds,
** and a scan of 600 took 0.18 us of every product): a class's, timed on its
** first shape, and each shape's own (see settle_shape). A key is never 0
** (threads >= 1).
*/
#define MAX_CHOICES 16384
#define MAX_EXACT (MAX_CHOICES * 3 / 4)         /* the rest stays for classes */
#define CHOICE_SLOTS (2 * MAX_CHOICES)          /* a power of two */
typedef struct {
  uint64_t key;                                 /* 0: empty */
  gemm_way way;
  float gflops;                                 /* as timed */
} choice;
static struct {
  pthread_mutex_t lock;
  bool loaded;
  int forced;                                   /* a gemm_lib, or -1 */
  int n, nexact;
  choice c[CHOICE_SLOTS];
  char path[800];                               /* "" when there is no file */
} choices = {.lock = PTHREAD_MUTEX_INITIALIZER, .forced = -1};

static gemm_lib lib_named (const char *s) {
  for (int i = 0; i < LIB__COUNT; i++) if (strcmp(s, lib_names[i]) == 0) return (gemm_lib)i;
  return LIB__COUNT;
}

/* key's slot, or the empty one where it would go */
static int slot_of (uint64_t key) {
  unsigned i = (unsigned)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 40) & (CHOICE_SLOTS - 1);
  while (choices.c[i].key != 0 && choices.c[i].key != key) i = (i + 1) & (CHOICE_SLOTS - 1);
  return (int)i;
}

static choice *find_choice (uint64_t key) {
  int i = slot_of(key);
  return choices.c[i].key == 0 ? NULL : &choices.c[i];
}

static bool has_room (uint64_t key) {
  return choices.n < MAX_CHOICES && ((key & EXACT_KEY) == 0 || choices.nexact < MAX_EXACT);
}

static void add_choice (uint64_t key, gemm_way w, double gflops) {
  int i = slot_of(key);
  if (key == 0 || choices.c[i].key != 0 || !has_room(key)) return;
  choices.c[i] = (choice){key, w, (float)gflops};
  choices.n++;
  choices.nexact += (key & EXACT_KEY) != 0;
}

/* oneDNN's name for the widest ISA it dispatches to (ONEDNN_MAX_CPU_ISA may lower it) */
static const char *dnnl_isa_name (dnnl_cpu_isa_t isa) {
  static const struct { dnnl_cpu_isa_t isa; const char *name; } names[] = {
      {dnnl_cpu_isa_sse41, "sse41"}, {dnnl_cpu_isa_avx, "avx"}, {dnnl_cpu_isa_avx2, "avx2"},
      {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"}, {dnnl_cpu_isa_avx512_core, "avx512_core"},
      {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"}, {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
      {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].isa == isa) return names[i].name;
  return "other";
}

/*
** What the choices depend on besides the shape, as a file name: the CPU's
** model and ISA, and the kernels each library runs on it, which
** OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA or another version of either
** library change (choices timed under one must not serve another).
*/
static void machine_name (char *buf, size_t n) {
  char model[128] = "unknown-cpu", line[512], openblas[32] = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "model name", 10) == 0) {
      char *p = strchr(line, ':');
      if (p) snprintf(model, sizeof model, "%s", p + 2);
      break;
    }
  if (f) fclose(f);
  __builtin_cpu_init();
  sscanf(openblas_get_config(), "OpenBLAS %31s", openblas);
  const dnnl_version_t *v = dnnl_version();
  snprintf(buf, n, "%s-%s-openblas-%s-%s-onednn-%d.%d.%d-%s", model,
           __builtin_cpu_supports("avx512f") ? "avx512" : "avx2", openblas, openblas_get_corename(), v->major,
           v->minor, v->patch, dnnl_isa_name(dnnl_get_effective_cpu_isa()));
  for (char *p = buf; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
          *p == '_'))
      *p = '-';
}

/* the choices file, for reading or appending, when it is a regular file (or,
** appending, a new one); a FIFO or a device ($MOONGRAD_GEMM_CACHE names any
** path) is passed over, never waited on: a stat first, then a non-blocking
** open checked again */
static FILE *open_choices (bool append) {
  struct stat st;
  if (stat(choices.path, &st) == 0 && !S_ISREG(st.st_mode)) return NULL;
  int fd = open(choices.path, (append ? O_WRONLY | O_APPEND | O_CREAT : O_RDONLY) | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                0666);
  if (fd < 0) return NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, append ? "a" : "r");
  if (f == NULL) close(fd);
  return f;
}

/* the environment, and the choices earlier processes made on this machine */
static void load_choices (void) {
  choices.loaded = true;
  const char *force = getenv("MOONGRAD_GEMM");
  if (force && *force && strcmp(force, "auto") != 0) {
    gemm_lib l = lib_named(force);
    if (l != LIB__COUNT) choices.forced = (int)l;
  }
  const char *path = getenv("MOONGRAD_GEMM_CACHE");
  if (path && strcmp(path, "off") == 0) return;
  char machine[300];
  if (path && *path) {
    snprintf(choices.path, sizeof choices.path, "%s", path);
  } else {
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[400];
    if (cache && *cache) snprintf(dir, sizeof dir, "%s/moongrad", cache);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/moongrad", home);
    else return;
    machine_name(machine, sizeof machine);
    mkdir(dir, 0777);                            /* may exist; failing to, there is no file */
    snprintf(choices.path, sizeof choices.path, "%s/gemm-v5-%s.tsv", dir, machine);   /* v5: median rounds */
  }
  FILE *f = open_choices(false);
  char line[256], lib[32];
  unsigned long long key;
  int threads;
  double mflops;
  while (f && fgets(line, sizeof line, f)) {
    if (strchr(line, '\n') == NULL && !feof(f)) {          /* too long: not ours, skipped whole */
      int ch;
      while ((ch = fgetc(f)) != EOF && ch != '\n') {}
      continue;
    }
    if (sscanf(line, "%llx %31s %d %lf", &key, lib, &threads, &mflops) == 4 && lib_named(lib) != LIB__COUNT &&
        threads >= 1 && threads <= MG_MAX_THREADS && isfinite(mflops) && mflops >= 0 && mflops < 1e12)
      add_choice((uint64_t)key, (gemm_way){lib_named(lib), threads}, mflops * 1e-3);
  }
  if (f) fclose(f);
}

/* one line appended: short writes to an O_APPEND file do not interleave.
** The speed in whole MFLOPS: no decimal point for a host's locale to change. */
static void save_choice (uint64_t key, gemm_way w, double gflops) {
  if (choices.path[0] == '\0') return;
  FILE *f = open_choices(true);
  if (f == NULL) return;
  fprintf(f, "%llx %s %d %.0f\n", (unsigned long long)key, lib_names[w.lib], w.threads, gflops * 1e3);
  fclose(f);
}

/* }========================================================== */


/* {========================= calibration ======================= */

/* Below this many flop a product runs on one thread: some 30 us of work,
** where a team saves a few microseconds on an idle machine and costs a time
** slice (milliseconds) when another process holds a core. */
#define TEAM_MIN_FLOP 4e6
/* a team's way is chosen only when it beats one thread's by this factor */
#define TEAM_MARGIN 1.15

static double now (void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* reps calls of way w on g, timed: seconds per call */
static double time_calls (gemm_way w, const gemm_call *g, int reps) {
  double t0 = now();
  for (int i = 0; i < reps; i++)
    if (run_way(w, g) != MG_OK) return INFINITY;
  return (now() - t0) / reps;
}

/* Each way runs once (oneDNN compiles its kernel, OpenMP wakes its threads),
** once more to size its rounds (sized by the first call, a 5-us product on
** AVX-512 got two calls a round, still warming up: oneDNN lost to an
** OpenBLAS at half its speed), then three rounds of a few milliseconds
** each. The rounds take the ways in turn (a burst of other work on a shared
** machine slows one round of each, not every round of one: a 40-us product
** chose one thread, at 0.6x of two, and kept it), each after an untimed call
** that wakes the pool at the way's thread count. A way's median round counts:
** its best would favour the way whose rounds vary most (OpenBLAS' GEMV on
** 1x1024x1024 ran at 43-53 GFLOPS from run to run, oneDNN at 52, and the
** best rounds chose GEMV), and the median still drops one disturbed round. */
static gemm_way calibrate (const gemm_call *g, int threads, double *gflops) {
  enum { ROUNDS = 3 };
  gemm_way ways[2 * LIB__COUNT];
  int n = 0, reps[2 * LIB__COUNT];
  double t[2 * LIB__COUNT][ROUNDS], typical[2 * LIB__COUNT];
  double flop = 2.0 * (double)g->m * (double)g->n * (double)g->k;
  for (int l = 0; l < LIB__COUNT; l++)
    if (lib_fits((gemm_lib)l, g)) ways[n++] = (gemm_way){(gemm_lib)l, threads};
  if (threads > 1 && flop < 2e8)                   /* small: one thread may win */
    for (int i = 0, nt = n; i < nt; i++) ways[n++] = (gemm_way){ways[i].lib, 1};
  for (int i = 0; i < n; i++) {
    time_calls(ways[i], g, 1);                  /* oneDNN compiles its kernel */
    double one = time_calls(ways[i], g, 1);      /* the first call's time would make too few reps */
    reps[i] = one >= 4e-3 ? 1 : (int)(4e-3 / (one > 1e-7 ? one : 1e-7)) + 1;
  }
  int rounds = flop > 2e10 ? 1 : ROUNDS;        /* a big product: once is enough */
  for (int r = 0; r < rounds; r++)
    for (int i = 0; i < n; i++) {
      if (rounds > 1) time_calls(ways[i], g, 1);
      t[i][r] = time_calls(ways[i], g, reps[i]);
    }
  int best = -1, best_one = -1;
  for (int i = 0; i < n; i++) {
    double *x = t[i];
    typical[i] = rounds == 1 ? x[0] : fmax(fmin(x[0], x[1]), fmin(fmax(x[0], x[1]), x[2]));  /* the median */
    int *b = ways[i].threads == 1 ? &best_one : &best;
    if (*b < 0 || typical[i] < typical[*b]) *b = i;
  }
  /* a team must win clearly: a narrow win can be one quiet moment, and on
  ** a busy machine the team loses far more than it won */
  if (best < 0 || (best_one >= 0 && typical[best] * TEAM_MARGIN > typical[best_one])) best = best_one;
  *gflops = flop / typical[best] * 1e-9;
  return ways[best];
}

/* }========================================================== */


/* is a product of g that took `seconds` far below a speed of `expected` GFLOPS? */
static bool too_slow (const gemm_call *g, double seconds, double expected) {
  double gflops = 2.0 * (double)g->m * (double)g->n * (double)g->k / seconds * 1e-9;
  return seconds >= 5e-6 && gflops * 2.5 < expected;    /* (shorter: the clock's noise, little to win) */
}

/*
** A shape new to its class. The class's choice was timed on another of its
** shapes, and can fall off a cliff on this one: OpenBLAS' SkylakeX kernels
** ran batch 1's dout @ W^T at 46 GFLOPS for a 784->1024 layer, the class's
** choice, and at 6.7 for a 1024->1024 one, where oneDNN runs both at 43.
** So it is timed on this shape (its first call may compile a kernel; a slow
** one runs again, warm: a fresh output's pages fault in during the first),
** and at under 1/2.5 of the class's speed the shape gets a choice of its
** own, kept in the file. Settled before the shape's first product, a shape
** runs one way in a process; a shape that keeps its class's way (other
** than the shape the class was timed on) is not written (a file of every
** shape a fuzzer makes would be slow to read), so a later process times it
** again, and only a run on a machine far busier than the class's own
** timing could see it fall below 1/2.5 then.
*/
static gemm_way settle_shape (const gemm_call *g, const choice *c, uint64_t exact, int threads) {
  gemm_way w = c->way;
  double flop = 2.0 * (double)g->m * (double)g->n * (double)g->k, gflops = c->gflops;
  if (!lib_fits(w.lib, g)) {
    w = calibrate(g, threads, &gflops);
  } else {
    time_calls(w, g, 1);
    double t = time_calls(w, g, 1);
    if (too_slow(g, t, c->gflops)) t = fmin(t, time_calls(w, g, 1));
    gflops = flop / t * 1e-9;
    if (too_slow(g, t, c->gflops)) w = calibrate(g, threads, &gflops);
  }
  add_choice(exact, w, gflops);
  if (w.lib != c->way.lib || w.threads != c->way.threads) save_choice(exact, w, gflops);
  return w;
}

/* the way for g at the current thread count: forced, the shape's own, its
** class's (settled for the shape now), or timed now (held: two threads
** would time each other) */
static gemm_way way_for (const gemm_call *g) {
  int threads = omp_get_max_threads();
  if (2.0 * (double)g->m * (double)g->n * (double)g->k < TEAM_MIN_FLOP) threads = 1;
  uint64_t exact = exact_of(g, threads), key = 0;       /* the class's: only for a shape new here */
  gemm_way w;
  pthread_mutex_lock(&choices.lock);
  if (!choices.loaded) load_choices();
  const choice *e = NULL, *c = NULL;
  if (choices.forced >= 0) {
    w = (gemm_way){(gemm_lib)choices.forced, threads};
  } else if ((e = find_choice(exact)) != NULL) {
    w = e->way;
  } else if ((c = find_choice(key = class_of(g->ta, g->tb, g->m, g->n, g->k, threads))) != NULL) {
    w = has_room(exact) ? settle_shape(g, c, exact, threads) : c->way;   /* (full: the class's) */
  } else if (!has_room(key)) {
    w = (gemm_way){LIB_DNNL, threads};      /* (full: a choice timed now could not be kept) */
  } else {
    double gflops = 0;
    w = calibrate(g, threads, &gflops);
    add_choice(key, w, gflops);
    save_choice(key, w, gflops);
    if (has_room(exact)) {                   /* the class's shape: its own choice too, kept, or a later */
      add_choice(exact, w, gflops);          /* process times it again, and on a busy machine may choose anew */
      save_choice(exact, w, gflops);
    }
  }
  if (!lib_fits(w.lib, g)) w.lib = LIB_DNNL;   /* (forced, or a file edited by hand) */
  pthread_mutex_unlock(&choices.lock);
  return w;
}

mg_status mg_sgemm (char ta, char tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c) {
  if (m == 0 || n == 0) return MG_OK;            /* oneDNN's matmul divides by them (fuzz) */
  if (k == 0) {                                  /* a sum of nothing */
    memset(c, 0, sizeof(float) * (size_t)(m * n));
    return MG_OK;
  }
  gemm_call g = {ta, tb, m, n, k, lda, ldb, a, b, c};
  return run_way(way_for(&g), &g);
}

/* where oneDNN has no bfloat16 matmul (oneDNN 2.6 on AVX2-only CPUs):
** float32 copies of the operands as stored, the float32 GEMM, one rounding.
** The copies are the kernel's scratch, like oneDNN's own scratchpads: not
** tensors, so not counted (a dry run, which skips kernels, predicts the
** counters exactly) */
static mg_status gemm_half_widened (char ta, char tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                                    const void *b, int64_t ldb, const mg_epilogue *ep, void *c, mg_dtype cdt) {
  int64_t na = ((ta == 'N' ? m : k) - 1) * lda + (ta == 'N' ? k : m);   /* elements up to the last one read */
  int64_t nb = ((tb == 'N' ? k : n) - 1) * ldb + (tb == 'N' ? n : k);
  int64_t nc = cdt == MG_FLOAT32 ? 0 : m * n;
  float *af = (float *)malloc(sizeof(float) * (size_t)(na + nb + nc) + 1);
  if (af == NULL) return mg_seterror("out of memory: %zu bytes of float32 copies for a bfloat16 product",
                                     sizeof(float) * (size_t)(na + nb + nc));
  float *bf = af + na, *cf = nc ? bf + nb : (float *)c;
  mg_convert(af, MG_FLOAT32, a, MG_BFLOAT16, na);
  mg_convert(bf, MG_FLOAT32, b, MG_BFLOAT16, nb);
  mg_status st = mg_sgemm(ta, tb, m, n, k, af, lda, bf, ldb, cf);
  for (int64_t i = 0; st == MG_OK && ep && i < m; i++) {     /* the epilogue, as oneDNN's */
    float *row = cf + i * n;
    if (ep->bias) for (int64_t j = 0; j < n; j++) row[j] += ep->bias[j];
    if (ep->relu) for (int64_t j = 0; j < n; j++) row[j] = row[j] > 0 ? row[j] : 0;
  }
  if (st == MG_OK && nc) mg_convert(c, cdt, cf, MG_FLOAT32, nc);
  free(af);
  return st;
}

/* one library, one way: oneDNN's matmul primitive with the team (products
** under TEAM_MIN_FLOP on one thread, as float32's), no calibration */
mg_status mg_gemm_half (char ta, char tb, int64_t m, int64_t n, int64_t k, mg_dtype ab, const void *a,
                        int64_t lda, const void *b, int64_t ldb, const mg_epilogue *ep, void *c, mg_dtype cdt) {
  size_t csz = mg_dtype_size(cdt);
  if (m == 0 || n == 0) return MG_OK;
  if (k == 0 && ep == NULL) {
    memset(c, 0, csz * (size_t)(m * n));
    return MG_OK;
  }
  if (k == 0) return gemm_half_widened(ta, tb, m, n, k, a, lda, b, ldb, ep, c, cdt);   /* the bias alone */
  if (ab != MG_BFLOAT16 || (cdt != MG_FLOAT32 && cdt != MG_BFLOAT16))
    return mg_seterror("matmul: no %s product into %s", mg_dtype_name(ab), mg_dtype_name(cdt));
  mg_dnn *d = mg_dnn_get("matmul");
  if (d == NULL) return MG_ERR;
  int was = omp_get_max_threads(), threads = 2.0 * (double)m * (double)n * (double)k < TEAM_MIN_FLOP ? 1 : was;
  bool bias = ep && ep->bias, relu = ep && ep->relu;
  matmul_key key = {MG_DNN_MATMUL, threads, ta == 'T', tb == 'T', dnnl_bf16, cdt == MG_FLOAT32 ? dnnl_f32 : dnnl_bf16,
                    bias, relu,
                    m, n, k, lda, ldb};
  if (threads != was) omp_set_num_threads(threads);
  /* oneDNN made no bfloat16 matmul here once (or none with an epilogue): not asked again */
  static _Thread_local bool declined, declined_epilogue;
  bool skip = declined || ((bias || relu) && declined_epilogue);
  mg_dnn_prim *e = skip ? NULL : mg_dnn_find(d, &key, sizeof key);
  mg_status st = MG_ERR;
  if (!skip && (e != NULL || (e = matmul_prim(d, &key)) != NULL)) {
    int args[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    void *ptrs[4] = {(void *)a, (void *)b, c, bias ? (void *)ep->bias : NULL};
    st = mg_dnn_execute("matmul", d, e->pd, e->p, e->scratch, bias ? 4 : 3, args, ptrs, e->mem);
  }
  if (threads != was) omp_set_num_threads(was);
  if (e == NULL) {                      /* no bfloat16 kernel on this CPU (AVX2 only) */
    if (bias || relu) declined_epilogue = true;   /* (plain products may still have one) */
    else declined = true;
    st = gemm_half_widened(ta, tb, m, n, k, a, lda, b, ldb, ep, c, cdt);
  }
  return st;
}

/* {------- a dense layer's weight and bias gradients in one call -------
** oneDNN's inner product backward_weights (gemm:jit) on the saved bfloat16
** x and the output's gradient: dw = x^T dy and db = the column sums of dy
** together, 5-10% faster than the matmul with a transposed A at a GPT's
** shapes, and the bias sum (another pass over dy) is free. Its weights are
** oneDNN's (out, in), laid out "io": the (in, out) matrix dense keeps. Made
** with its forward primitive as the hint oneDNN asks for, kept beside it. */
typedef struct { int32_t kind, nthr, bias, backward; int64_t rows, k, n; } ipw_key;

static mg_dnn_prim *ipw_prim (mg_dnn *d, const ipw_key *key) {
  mg_dnn_prim *e = mg_dnn_find(d, key, sizeof *key);
  if (e) return e;
  mg_dnn_slot(d, 1);                    /* room for this one and its hint */
  ipw_key fkey = *key;
  fkey.backward = 0;
  mg_dnn_prim *hint = key->backward ? ipw_prim(d, &fkey) : NULL;
  if (key->backward && hint == NULL) return NULL;
  dnnl_dims_t sd = {key->rows, key->k}, wd = {key->n, key->k}, bd = {key->n}, dd = {key->rows, key->n};
  dnnl_memory_desc_t src, w, b, dst;
  dnnl_inner_product_desc_t ipd;
  dnnl_status_t st = dnnl_memory_desc_init_by_tag(&src, 2, sd, dnnl_bf16, dnnl_nc);
  if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&w, 2, wd, dnnl_bf16, dnnl_io);
  if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_a);
  if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&dst, 2, dd, dnnl_bf16, dnnl_nc);
  if (st == dnnl_success)
    st = key->backward ? dnnl_inner_product_backward_weights_desc_init(&ipd, &src, &w, key->bias ? &b : NULL, &dst)
                       : dnnl_inner_product_forward_desc_init(&ipd, dnnl_forward_training, &src, &w,
                                                              key->bias ? &b : NULL, &dst);
  e = mg_dnn_slot(d, 0);
  if (st == dnnl_success) st = dnnl_primitive_desc_create(&e->pd, &ipd, NULL, d->engine, hint ? hint->pd : NULL);
  if (st == dnnl_success) st = mg_dnn_finish(d, e, key, sizeof *key);
  if (st != dnnl_success) {
    mg_dnn_destroy(e);
    return mg_dnn_fail("dense", "make an inner product's weight gradient", st), NULL;
  }
  return e;
}

mg_status mg_dense_weight_grads (int64_t rows, int64_t k, int64_t n, const void *x, const void *dy, void *dw,
                                 float *db) {
  mg_dnn *d = mg_dnn_get("dense");
  if (d == NULL) return MG_ERR;
  ipw_key key = {MG_DNN_IP_BWD_WEIGHTS, omp_get_max_threads(), db != NULL, 1, rows, k, n};
  mg_dnn_prim *e = ipw_prim(d, &key);
  if (e == NULL) return MG_ERR;
  int args[4] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_BIAS};
  void *ptrs[4] = {(void *)x, (void *)dy, dw, db};
  return mg_dnn_execute("dense", d, e->pd, e->p, e->scratch, db ? 4 : 3, args, ptrs, e->mem);
}

/* }------------------------------------------------------------- */

/* the batched matmul's key: dims, the three operands' strides, the result's dtype, threads */
typedef struct { int32_t kind, nthr, cdt, unused; int64_t dims[5], astr[4], bstr[4], cstr[4]; } batched_key;

static mg_dnn_prim *batched_prim (mg_dnn *d, const batched_key *key) {
  const int64_t *n = key->dims;      /* b0, b1, M, N, K */
  dnnl_dims_t ad = {n[0], n[1], n[2], n[4]}, bd = {n[0], n[1], n[4], n[3]}, cd = {n[0], n[1], n[2], n[3]};
  dnnl_dims_t as, bs, cs;
  for (int i = 0; i < 4; i++) as[i] = key->astr[i], bs[i] = key->bstr[i], cs[i] = key->cstr[i];
  dnnl_memory_desc_t a, b, c;
  dnnl_matmul_desc_t md;
  dnnl_status_t st = dnnl_memory_desc_init_by_strides(&a, 4, ad, dnnl_bf16, as);
  if (st == dnnl_success) st = dnnl_memory_desc_init_by_strides(&b, 4, bd, dnnl_bf16, bs);
  if (st == dnnl_success) st = dnnl_memory_desc_init_by_strides(&c, 4, cd, (dnnl_data_type_t)key->cdt, cs);
  if (st == dnnl_success) st = dnnl_matmul_desc_init(&md, &a, &b, NULL, &c);
  if (st != dnnl_success) return mg_dnn_fail("matmul", "describe a batched matmul", st), NULL;
  mg_dnn_prim *e = mg_dnn_slot(d, 0);
  st = dnnl_primitive_desc_create(&e->pd, &md, NULL, d->engine, NULL);
  if (st == dnnl_success) st = mg_dnn_finish(d, e, key, sizeof *key);
  if (st != dnnl_success) {
    mg_dnn_destroy(e);
    return mg_dnn_fail("matmul", "make a batched matmul", st), NULL;
  }
  return e;
}

mg_status mg_gemm_half_batched (const int64_t dims[5], const void *a, const int64_t astr[4], const void *b,
                                const int64_t bstr[4], void *c, const int64_t cstr[4], mg_dtype cdt) {
  if (cdt != MG_FLOAT32 && cdt != MG_BFLOAT16) return mg_seterror("matmul: no bfloat16 product into %s", mg_dtype_name(cdt));
  mg_dnn *d = mg_dnn_get("matmul");
  if (d == NULL) return MG_ERR;
  batched_key key = {MG_DNN_MATMUL_BATCHED, omp_get_max_threads(), cdt == MG_FLOAT32 ? dnnl_f32 : dnnl_bf16, 0,
                     {0}, {0}, {0}, {0}};
  for (int i = 0; i < 5; i++) key.dims[i] = dims[i];
  for (int i = 0; i < 4; i++) key.astr[i] = astr[i], key.bstr[i] = bstr[i], key.cstr[i] = cstr[i];
  mg_dnn_prim *e = mg_dnn_find(d, &key, sizeof key);
  if (e == NULL && (e = batched_prim(d, &key)) == NULL) return MG_ERR;
  int args[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  void *ptrs[3] = {(void *)a, (void *)b, c};
  return mg_dnn_execute("matmul", d, e->pd, e->p, e->scratch, 3, args, ptrs, e->mem);
}

mg_status mg_gemm_use (const char *backend) {
  MG_CHECK_ARG("mg_gemm_use", backend, MG_ERR);
  gemm_lib l = strcmp(backend, "auto") == 0 ? LIB__COUNT : lib_named(backend);
  if (l == LIB__COUNT && strcmp(backend, "auto") != 0) {
    char known[160] = "auto";
    for (int i = 0; i < LIB__COUNT; i++)
      snprintf(known + strlen(known), sizeof known - strlen(known), ", %s", lib_names[i]);
    return mg_seterror("gemm_use: unknown backend '%s' (known: %s)", backend, known);
  }
  pthread_mutex_lock(&choices.lock);
  if (!choices.loaded) load_choices();
  choices.forced = l == LIB__COUNT ? -1 : (int)l;
  pthread_mutex_unlock(&choices.lock);
  return MG_OK;
}

const char *mg_gemm_choice (int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0)
    return mg_seterror("gemm_choice: sizes must be positive, got %lld x %lld x %lld", (long long)m,
                       (long long)n, (long long)k), NULL;
  const int64_t most = (int64_t)1 << 28;          /* elements of an operand (each size first: no overflow) */
  if (m > most || n > most || k > most || m > most / n || m > most / k || k > most / n)
    return mg_seterror("gemm_choice: %lld x %lld x %lld is too large to time", (long long)m,
                       (long long)n, (long long)k), NULL;
  float *a = (float *)calloc((size_t)(m * k), sizeof(float)), *b = (float *)calloc((size_t)(k * n), sizeof(float));
  float *c = (float *)malloc(sizeof(float) * (size_t)(m * n));
  const char *name = NULL;
  if (a && b && c) {
    gemm_call g = {transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k,
                   transpose_a ? m : k, transpose_b ? k : n, a, b, c};
    gemm_way w = way_for(&g);
    static _Thread_local char buf[48];
    snprintf(buf, sizeof buf, "%s/%d", lib_names[w.lib], w.threads);
    name = buf;
  } else {
    mg_seterror("gemm_choice: out of memory");
  }
  free(a);
  free(b);
  free(c);
  return name;
}

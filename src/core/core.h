/*
** core.h — the floor everything stands on: storages and the allocator,
** the context, tensors, strided loops, variables (src/core/). It knows
** nothing of ops or tapes; what the floors above want from it (a variable
** read, every op's run, memory pressure) goes through hooks they install
** in the context. The floors: core <- ops (op.h) <- autodiff
** (autodiff/autodiff.h) <- io, dist <- the Lua binding <- cli, kernel.
*/
#ifndef MG_CORE_H
#define MG_CORE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moongrad.h"

#ifdef MG_ASSERT_ON
#include <assert.h>
#define mg_assert(c)  assert(c)
#else
#define mg_assert(c)  ((void)0)
#endif

#define MG_UNUSED(x)  ((void)(x))

/* Under AddressSanitizer the recycling pools (storages, tensor headers,
** nodes) are off, so a use after free is caught, not served a reused block. */
#if defined(__SANITIZE_ADDRESS__)
#define MG_POOLS 0
#else
#define MG_POOLS 1
#endif

/* "fn: argument 'name' is NULL", keeping the failure that likely caused
** it; always MG_ERR */
mg_status mg_null_arg (const char *fn, const char *name);
/* the usual first line of a public function taking a pointer */
#define MG_CHECK_ARG(fn, x, fail)  do { if ((x) == NULL) return mg_null_arg(fn, #x), (fail); } while (0)

/* elementwise loops run on several threads above this many elements: they
** are memory-bound, and below this waking the threads costs more than it saves */
#define MG_PARALLEL_MIN  (1 << 18)

/* The for statement `...` split across the thread pool when cond holds, else
** run on this thread alone; `clauses` are the pragma's others (collapse(2),
** reduction(...), or nothing). Not an OpenMP `if` clause: one that is false
** still sets up a team of one, which libgomp allocates per region (about
** 2,000 instructions, 0.4 us: more than a small op costs). The loop is
** compiled twice. */
#define MG_PARALLEL_FOR(cond, clauses, ...)  MG_PARALLEL(cond, for clauses, __VA_ARGS__)
/* the block `...` (its loops under `omp for`) run by the thread pool when
** cond holds, else by this thread alone, as MG_PARALLEL_FOR */
#define MG_PARALLEL(cond, clauses, ...) do {                             \
    if (cond) { MG_PRAGMA_(omp parallel clauses) __VA_ARGS__ }           \
    else { __VA_ARGS__ }                                                 \
  } while (0)
#define MG_PRAGMA_(x) _Pragma(#x)

/* fn(ctx, lo, hi) over [0, n) in blocks of 64K values (whole 64-value
** vector blocks, so each value takes the same path at any thread count), on
** the pool's threads from MG_PARALLEL_MIN values: one call per block */
typedef void (*mg_block_fn) (const void *ctx, int64_t lo, int64_t hi);
void mg_for_blocks (int64_t n, mg_block_fn fn, const void *ctx);
/* fn(ctx, lo, hi) over [0, n) in one piece per pool thread (whole 64-value
** runs), from 2 * grain values: for work whose values do not depend on
** one another, on any path alike (IEEE arithmetic, no libm), and cost tens
** of cycles each (an optimizer's update: tens of microseconds a 256 x 256 kernel),
** which mg_for_blocks' thresholds would leave to one thread */
void mg_for_pieces (int64_t n, int64_t grain, mg_block_fn fn, const void *ctx);


/* {========================= storage ========================= */

/* Who holds a storage decides which counter its bytes are in; a storage
** held in several roles counts in the last of this list that holds it. */
typedef enum mg_role {
  MG_ROLE_TENSOR,         /* nothing but tensors (the host's boxes, say) */
  MG_ROLE_GRADIENT,       /* a running gradient's walk: gradients in flight and its results */
  MG_ROLE_SAVED,          /* tape nodes, for their backward */
  MG_ROLE_VARIABLE,       /* variables, as their values */
  MG_ROLE__COUNT
} mg_role;

typedef struct mg_storage {
  mg_context *ctx;        /* whose counters its bytes are in */
  int refcount;           /* tensors viewing it */
  int holds[MG_ROLE__COUNT];   /* holders in each role (holds[MG_ROLE_TENSOR] unused) */
  mg_role role;           /* derived from holds */
  size_t nbytes;
  size_t bucket;          /* capacity, for the reuse cache */
  void *data;             /* 64-byte aligned, unless a host's */
  bool external;          /* a host's buffer or a mapped file: not this allocator's bytes */
  int site;               /* made in a dry run: the host's place that made it (1..), else 0 */
  bool unwritten;         /* a dry run's result: no values (no variable may start from it) */
  void (*release)(void *ud);   /* how to give such a buffer back; may be NULL */
  void *release_ud;
  struct mg_storage *older, *newer;   /* while in the reuse cache: the order it was freed in */
  struct mg_storage **in_bucket;      /* and the link that points to it in its bucket */
} mg_storage;

mg_storage *mg_storage_new     (size_t nbytes);       /* NULL + error on failure */
/* a storage over a host's buffer, counted like the others; release(ud)
** runs when the last tensor viewing it goes */
mg_storage *mg_storage_wrap    (void *data, size_t nbytes, void (*release)(void *ud), void *ud);
/* blocks for small C objects (nodes, tapes), recycled by size; free with the same size */
void       *mg_small_alloc (size_t size);
void        mg_small_free  (void *p, size_t size);
void        mg_storage_release (mg_storage *s);
/* true when an injected allocation failure is due (mg_memory_fail_after);
** the test is on every allocation's path, so its common answer is inline */
bool        mg_alloc_fail_slow (void);
#define mg_alloc_should_fail() (mg_ctx()->memory.fail_countdown != 0 && mg_alloc_fail_slow())
/* between nodes of a backward walk: lets the host collect garbage */
void        mg_memory_safe_point (void);
void        mg_memory_release_small (void);  /* free() the recycled small blocks */
void        mg_storage_hold (mg_storage *s, mg_role role, int delta);   /* a holder in role came (1) or went (-1) */
/* "1.50 MiB" into buf */
const char *mg_human_bytes (char *buf, size_t n, double bytes);
/* What the allocator asks of a memory budget. The budget (autodiff's
** dtr.c) installs it in the context when one is set, so the core never
** calls up into autodiff. */
typedef struct mg_pressure {
  /* room for nbytes more, evicting saved tensors if need be; MG_ERR + error
  ** when the budget cannot hold them */
  mg_status (*make_room)(size_t nbytes);
  void (*stats)(mg_memory_stats *st);       /* its counters into st */
  void (*release)(mg_context *c);           /* its state, when the context goes */
} mg_pressure;

/* }========================================================== */


/* {======================== the context ======================= */
/* Everything the library remembers between calls lives in one context
** (context.c): errors, ids, tensor headers, memory counters and caches, the
** random streams, the active tapes. Each thread has its own, made on first
** use; a host may make more and switch (mg_context_use). An object keeps a
** pointer to the context it was made in, and goes back to that one. */

#define MG_CACHE_BUCKETS 256
#define MG_SMALL_CLASSES 16        /* small blocks up to 1 KiB, by 64 bytes */
#define MG_HEADER_POOL 4096        /* freed tensor headers kept */
#define MG_MAX_PAUSE_DEPTH 200     /* nested recompute forwards */

typedef struct mg_memory_state {
  size_t role_bytes[MG_ROLE__COUNT];
  size_t current, peak, peak_saved;
  size_t peak_roles[MG_ROLE__COUNT];        /* role_bytes when current last reached peak */
  size_t graph;                             /* tapes and their nodes (mg_small_alloc) */
  int64_t live_storages, allocations;
  size_t allocated;                         /* bytes ever allocated */
  void (*hook)(void *ud);                   /* timelines (mg_memory_set_hooks) */
  void (*span)(const char *name, int begin, void *ud);
  void *hook_ud;
  void (*pressure)(void *ud);               /* safe points (mg_memory_set_pressure_hook) */
  void *pressure_ud;
  mg_storage *cache[MG_CACHE_BUCKETS];      /* free storages by size; next in ->data's first word */
  size_t cached, cache_limit;
  mg_storage *oldest, *newest;              /* the cache in the order blocks came back */
  size_t high;                              /* the most current bytes ever (sizes the cache) */
  size_t external;                          /* bytes of host buffers and mapped files tensors view */
  struct { void *head; int n; } small[MG_SMALL_CLASSES];
  int64_t fail_countdown;                   /* injected failures; -1: not read from the env */
} mg_memory_state;

/* The tapes' state in a context (autodiff's: the core keeps it and never
** reads it, spec/45 checks; the tapes free it through hooks.release) */
typedef struct mg_tape_state {
  mg_tape **active;                         /* tapes not stopped, oldest first */
  int nactive, capactive;
  int recording;                            /* active and not paused */
  int watching;                             /* variable-read watchers */
  int recompute_depth;
  int loop_depth;                           /* loop helpers running (mg_loop_enter) */
  struct mg_custom_ctx *custom;             /* custom-gradient forwards running, innermost */
  struct mg_var_watcher *watchers;
  struct { mg_tape **t; int n; } pauses[MG_MAX_PAUSE_DEPTH];
  int npauses;
  struct mg_hooks_ref *hooks;               /* saved-tensor hooks pushed, innermost */
  bool in_hooks;                            /* a pack or unpack runs: no hooks inside */
} mg_tape_state;

/* the outputs a save policy kept for a recompute (replay.c) */
typedef struct mg_replay mg_replay;

typedef struct mg_replay_state {
  mg_replay *recording;                     /* a first run under a policy */
  mg_save_policy save;
  void *save_ud;
  mg_replay *playing;                       /* a re-run: take kept outputs */
  int first_runs;                           /* recomputes' first runs under way (any policy) */
} mg_replay_state;

/* What the floors above install in the context, so that no floor below
** calls up into them: around every op (the dispatcher, src/ops/dispatch.c),
** a variable read, the context's end. The tapes install them (autodiff);
** any may be NULL. */
struct mg_opcall;
typedef struct mg_hooks {
  /* before the kernel: an output to use instead of computing one (a save
  ** policy's kept output during a re-run), or NULL */
  struct mg_tensor *(*before)(const struct mg_opcall *c);
  /* after the kernel: record the op (tapes, a save policy); MG_ERR + error */
  mg_status (*after)(const struct mg_opcall *c);
  /* would an op run now be recorded? (backward rules ask: second order) */
  bool (*listening)(void);
  /* does a tape record now? (mg_op_recording: a forward making residuals) */
  bool (*recording)(void);
  bool (*second_order)(void);               /* mg_op_second_order (op.h) */
  void (*on_read)(mg_variable *v);          /* a variable was read */
  /* every op's outputs, differentiable or not, after the kernel (a
  ** recompute's verify notes or checks them); MG_ERR + error */
  mg_status (*seen)(const struct mg_opcall *c);
  /* a variable is about to be assigned (a verified re-run refuses it); MG_ERR + error */
  mg_status (*on_assign)(mg_variable *v);
  void (*release)(mg_context *c);           /* the context goes: the state the floors above keep in it */
} mg_hooks;

/* Automatic mixed precision (src/ops/autocast.c): the dtype products
** compute in (MG_FLOAT32: off), how many regions are open, the casts of
** variables' values made in the outermost one (a weight is cast once a
** step, however often it is read) and the last cast of any other tensor
** (one activation read by several products, as q, k and v read a layer
** norm's output), valid while the same tapes record and follow them */
typedef struct mg_autocast_cast { struct mg_tensor *value, *half; } mg_autocast_cast;
#define MG_AUTOCAST_DEPTH 32
/* a dry run (mg_dry_run_begin, memory.c): kernels skipped; the peak
** counters in force before it; the saved bytes by the host's place that
** made them, now and when the tapes held the most */
typedef struct mg_dry_state {
  bool on;
  size_t peak, peak_saved, peak_roles[MG_ROLE__COUNT];
  int (*site)(void *ud);                    /* the host's place making a storage now: 1.. (0: none) */
  void *site_ud;
  size_t *saved, *peak_saved_by;            /* [nsites + 1] */
  int nsites;
} mg_dry_state;
#define MG_VERIFY_DEPTH 16                  /* verified recomputes running inside one another */
typedef struct mg_autocast_state {
  mg_dtype dtype;
  int depth;
  mg_dtype outer[MG_AUTOCAST_DEPTH];        /* the dtype each open region replaced */
  mg_autocast_cast *cache;
  int ncache, capcache;
  mg_autocast_cast last;                    /* not a variable's: {NULL, NULL} when none */
  bool float16_emulated;                    /* float16 regions allowed without AVX512-FP16 */
} mg_autocast_state;

/* the thread team's size (threads.c) */
typedef struct mg_pace {
  int nominal;                              /* asked for, or the machine's */
  int team;                                 /* in use now: nominal, or 1 while others hold the cores */
  bool fixed;                               /* asked for: never changes */
  int fd;                                   /* /proc/thread-self/schedstat; -2 unopened, -1 none */
  pthread_t reader;                         /* the thread fd is of */
  int64_t hold;                             /* tape nodes alive (the tapes count): no change meanwhile */
  unsigned ops;                             /* ops dispatched, to look at the clock now and then */
  int64_t last_ns, last_run_ns, last_wait_ns, hold_until_ns, backoff_ns;
  int strikes;                              /* crowded stretches in a row */
  bool trying;                              /* the full team on trial after a hold */
  int64_t changes;
} mg_pace;
void mg_pace_init (mg_pace *p);
void mg_pace_release (mg_pace *p);
void mg_pace_tick (mg_context *c);          /* now and then, between ops */

struct mg_context {
  struct { char msg[512], cause[400], shown[2][512]; bool null_chain; } error;
  struct { uint64_t next, end; } ids;       /* a block of ids taken from the process */
  struct { int64_t live; mg_tensor *pool[MG_HEADER_POOL]; int npool; } tensors;
  mg_memory_state memory;
  struct { mg_rng_state main, init; } rng;
  mg_tape_state tapes;                      /* autodiff's (above) */
  mg_replay_state replay;                   /* autodiff's: save policies */
  mg_hooks hooks;                           /* installed by the tapes */
  bool check_numerics;                      /* mg_check_numerics (numerics.c) */
  struct mg_dtr_state *dtr;                 /* the memory budget (dtr.c); NULL until one is set */
  const mg_pressure *pressure;              /* installed with it: what the allocator calls */
  mg_pace pace;                             /* the thread team (threads.c) */
  mg_autocast_state autocast;               /* products in bfloat16 (ops/autocast.c) */
  /* recompute's verify (autodiff's verify.c): the op logs noting or
  ** checking each op now, innermost last, and the global switch */
  struct { struct mg_verify_log *log[MG_VERIFY_DEPTH]; int n; bool all; } verify;
  mg_dry_state dry;                         /* a dry run (memory.c) */
};

extern _Thread_local mg_context *mg_current_context;
mg_context *mg_context_default (void);      /* the thread's own, made on first use */

static inline mg_context *mg_ctx (void) {
  mg_context *c = mg_current_context;
  return c ? c : mg_context_default();
}

/* }========================================================== */


/* {========================= tensors ========================= */

struct mg_tensor {
  mg_context *ctx;        /* whose live count it is in */
  int refcount;
  mg_dtype dtype;
  int ndim;
  uint64_t id;            /* what tapes key on; a variable's values share its id */
  int64_t numel;
  int64_t offset;         /* in elements */
  mg_storage *storage;
  mg_variable *var;       /* weak: set while this is a live variable's value */
  bool number;            /* mg_scalar's, or made from such alone (PyTorch's wrapped number) */
  int64_t shape[MG_MAX_DIMS];
  int64_t strides[MG_MAX_DIMS];   /* in elements; 0 for broadcast dims */
};

/* a new tensor viewing s (retained) with the given layout; NULL + error */
mg_tensor *mg_tensor_view (mg_storage *s, mg_dtype dt, const int64_t *shape, int ndim,
                           const int64_t *strides, int64_t offset);
uint64_t   mg_new_id      (void);
void       mg_contiguous_strides (const int64_t *shape, int ndim, int64_t *strides);
/* checks a shape and returns its element count, or -1 + error naming fn */
int64_t    mg_shape_numel (const char *fn, const int64_t *shape, int ndim);
bool       mg_same_shape  (const int64_t *a, int na, const int64_t *b, int nb);
/* Positions in messages (axes, dimensions, indices, entries of a list) are
** written 0-based behind a marker, and shown in the caller's convention:
** 0-based to C (mg_errmsg), 1-based to Lua (mg_errmsg_based(1), the binding).
** MG_POS: a negative position counts from the end in both and stays as it
** is; MG_POS1: always shifted (an index the binding already moved down by 1).
** Both take a long long. */
#define MG_POS  "\x01%lld"
#define MG_POS1 "\x02%lld"
/* the message as stored, markers and all: for wrapping it in another one */
const char *mg_errmsg_raw (void);
/* the valid positions of a dimension of size n, for the end of a message,
** in the caller's convention: " (use 1..n or -n..-1)" to Lua, 0..n-1 to C;
** " (the dimension is empty)" when n is 0. Written into buf, returned */
const char *mg_range_hint (char *buf, size_t len, int64_t n);
/* normalizes axis (negative counts from the end) into [0, ndim); -1 + error */
int        mg_check_axis  (const char *fn, int axis, int ndim);
bool       mg_is_float    (mg_dtype dt);
/* float16 and bfloat16, the storage formats products compute in under autocast */
static inline bool mg_is_half (mg_dtype dt) { return dt == MG_FLOAT16 || dt == MG_BFLOAT16; }
/* a dtype gradients flow through: the computing floats and the half ones */
static inline bool mg_is_floating (mg_dtype dt) { return mg_is_float(dt) || mg_is_half(dt); }
/* a bfloat16's value: its bits are float32's top half, so widening is exact */
static inline float mg_bf16_value (uint16_t h) {
  union { uint32_t u; float f; } v = {(uint32_t)h << 16};
  return v.f;
}
/* bytes per element, inline for the hot paths */
static inline size_t mg_dtype_bytes (mg_dtype dt) {
  return dt == MG_FLOAT32 ? 4 : dt == MG_BOOL ? 1 : dt >= MG_FLOAT16 ? 2 : 8;
}
/* float16 and bfloat16 are storage formats: ops other than casts and
** rearrangements refuse them ("fn: not defined for float16 tensors; cast to
** float32 first"); MG_OK for the dtypes that compute */
mg_status mg_check_computable (const char *fn, mg_dtype dt);
mg_status mg_refuse_dtype (const char *fn, mg_dtype dt, int bool_only);  /* always MG_ERR */
/* one element at p as a double, whatever its dtype */
double    mg_load_double (const void *p, mg_dtype dt);
/* pointer to t's first element */
static inline char *mg_ptr (const mg_tensor *t) {
  return (char *)t->storage->data + (size_t)t->offset * mg_dtype_bytes(t->dtype);
}
mg_status  mg_copy_into   (mg_tensor *dst, const mg_tensor *src);  /* same shape, any layout */
bool       mg_add_into    (mg_tensor *acc, const mg_tensor *g);    /* acc += g over acc's buffer when both are
                                      contiguous, of one float dtype and acc's shape (or g one value); else
                                      false, changing nothing; not recorded */


/* }========================================================== */


/* {====================== strided loops ====================== */

/* Up to 4 operands walked together over one shape: operand 0 is the output
** (contiguous), the others may broadcast (stride 0). Dimensions that can be
** merged are, so most loops end up one long contiguous run. */
typedef struct mg_iter {
  int ndim, nops;
  int64_t shape[MG_MAX_DIMS];
  int64_t strides[4][MG_MAX_DIMS];   /* in elements */
} mg_iter;

/* the broadcast of two shapes into shape; returns its ndim, or -1 + an
** error naming fn and showing "a opsym b" */
int  mg_broadcast_shapes (const char *fn, const char *opsym, const int64_t *a, int na,
                          const int64_t *b, int nb, int64_t *shape);
void mg_iter_init (mg_iter *it, const int64_t *shape, int ndim, int nops,
                   const mg_tensor *const *ops);
/* calls run(n, ptrs, strides, ud) for each innermost run, in order, with the
** outer loop split across threads when large */
typedef void (*mg_run_fn)(int64_t n, char **p, const int64_t *s, void *ud);
void mg_iter_run (const mg_iter *it, char **base, const size_t *itemsize, mg_run_fn run,
                  void *ud);

/* }========================================================== */


/* {======================= variables ========================= */

struct mg_variable {
  int refcount;
  uint64_t id;            /* the id every value of this variable carries */
  int trainable;
  mg_tensor *value;       /* owned; value->var == this */
  char *name;
  uint64_t writes;        /* when it was last written (mg_variable_clock's stamps; 0: never):
                          ** a re-run's backward can tell a value moved */
};

/* the stamp of the last variable write anywhere (a clock that only moves on) */
uint64_t mg_variable_clock (void);

/* Makes t (a value v had before: same id) v's value and returns the
** current one, whose reference passes to the caller. recompute uses it to
** show a variable's old value while a forward runs again. */
mg_tensor *mg_variable_exchange (mg_variable *v, mg_tensor *t);
/* where an optimizer's one-pass step writes v's new value: v's own when no
** one else holds it (reads[0..n) are the step's inputs), else a copy (NULL:
** out of memory); end_write makes the copy v's value (done) or drops it */
mg_tensor *mg_variable_begin_write (mg_variable *v, mg_tensor *const *reads, int n);
void       mg_variable_end_write   (mg_variable *v, mg_tensor *dst, bool done);

/* }========================================================== */

#endif

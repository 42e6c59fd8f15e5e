/*
** moongrad_impl.h — private structs and helpers shared by src/.
*/
#ifndef MOONGRAD_IMPL_H
#define MOONGRAD_IMPL_H

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
  void (*release)(void *ud);   /* how to give such a buffer back; may be NULL */
  void *release_ud;
  struct mg_storage *older, *newer;   /* while in the reuse cache: the order it was freed in */
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
  void (*on_read)(mg_variable *v);          /* installed by the tapes: a variable was read */
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
} mg_replay_state;

struct mg_context {
  struct { char msg[512], cause[400], shown[2][512]; bool null_chain; } error;
  struct { uint64_t next, end; } ids;       /* a block of ids taken from the process */
  struct { int64_t live; mg_tensor *pool[MG_HEADER_POOL]; int npool; } tensors;
  mg_memory_state memory;
  struct { mg_rng_state main, init; } rng;
  mg_tape_state tapes;
  mg_replay_state replay;
  bool check_numerics;                      /* mg_check_numerics (numerics.c) */
  struct mg_dtr_state *dtr;                 /* the memory budget (dtr.c); NULL until one is set */
  const mg_pressure *pressure;              /* installed with it: what the allocator calls */
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
/* normalizes axis (negative counts from the end) into [0, ndim); -1 + error */
int        mg_check_axis  (const char *fn, int axis, int ndim);
bool       mg_is_float    (mg_dtype dt);
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
};

/* Makes t (a value v had before: same id) v's value and returns the
** current one, whose reference passes to the caller. recompute uses it to
** show a variable's old value while a forward runs again. */
mg_tensor *mg_variable_exchange (mg_variable *v, mg_tensor *t);

/* }========================================================== */


/* {====================== tape nodes ========================= */

typedef struct mg_node mg_node;

/* one innermost run of an elementwise kernel: p[0] is the output, p[1..]
** the inputs, s their strides in elements (0 where broadcast) */
typedef void (*mg_kernel)(int64_t n, char **p, const int64_t *s);
/* a reduction of x seen as (outer, n, inner), contiguous, into out */
typedef void (*mg_reduce_kernel)(mg_dtype dt, const void *x, void *out, int64_t outer,
                                 int64_t n, int64_t inner);

/* the dtype of an elementwise op's result */
/* the dtype of an op's result: the input's, bool, float64 for int64 input
** (division), or int64 positions (argmax) */
typedef enum mg_result { MG_RESULT_SAME, MG_RESULT_BOOL, MG_RESULT_FLOAT, MG_RESULT_INDEX } mg_result;

/* input j's shape, as the (shape, ndim) pair the ops take */
#define SHAPE_OF(n, j)  (n)->in_meta[j].shape, (n)->in_meta[j].ndim

/*
** One row of the op registry: a primitive op as the binding, the kernels
** and the tape see it. backward reads dout[i] (NULL: no gradient reached
** output i) and writes din[j] for each j with n->needs[j]; it builds them
** with the public ops so that an outer tape records the backward pass too.
** A rule that finds no path from its outputs to input j (a recomputed
** function that does not use an argument) clears needs[j] and leaves din[j]
** NULL: the input is then unconnected through this node, as on the plain tape.
** Rows are written with designated initializers next to their op; each op
** family lists its rows for the registry (registry.c).
*/
struct mg_attr;
#define MG_GRAD_SAVES 3                 /* inputs whose saves depend on their need */
typedef struct mg_opdef {
  mg_opinfo info;                       /* name, kind, symbol, metamethod, doc, entry */
  mg_kernel kernel[MG_DTYPE__COUNT];    /* elementwise: by input dtype; NULL: not defined */
  mg_result result;                     /* elementwise: the result's dtype */
  /* elementwise: checks the kernel cannot make (integer division by zero) */
  mg_status (*check)(const struct mg_opdef *op, const mg_tensor *a, const mg_tensor *b);
  mg_reduce_kernel reduce;              /* reductions */
  unsigned saves;                       /* MG_SAVE_IN(j) | MG_SAVE_OUT(i) */
  /* what it saves when that depends on what it recorded (dense keeps y
  ** only for an activation's gradient); NULL: saves */
  unsigned (*saves_for)(const struct mg_attr *attr);
  /* what input j's gradient needs besides: saved only when a tape that
  ** records the op follows input j (PyTorch's needs_input_grad), so x * w
  ** with only w followed keeps x alone. All zero: saves (or saves_for) is
  ** everything. An input no tape followed when the op ran gets no gradient
  ** through such an op, even if watched later. */
  unsigned grad_saves[MG_GRAD_SAVES];
  mg_status (*backward)(mg_node *n, mg_tensor *const *dout, mg_tensor **din);  /* NULL: none */
  void (*free_ext)(mg_node *n);         /* for ops with private data; may be NULL */
  /* tensors the op keeps besides its saved inputs and outputs (recompute's
  ** kept outputs): the i-th, or NULL past the last; may be NULL */
  mg_tensor *(*saved_extra)(const mg_node *n, int i);
  /* an op of another kind that a memory budget may run again: its output
  ** from its inputs (unary and binary ops are run through info.fn); may be NULL */
  mg_tensor *(*replay)(const struct mg_node *n, mg_tensor *const *in);
  /* its backward may write over an output gradient the walk spares it
  ** (mg_node.spare): only then does the walk look */
  bool reuses_gradient;
  /* its outputs may depend on one another inside it (a recomputed function
  ** returning y and cos(y)): when output i is a source of the gradient, the
  ** walk sets bit i of mg_node.out_sources and the backward writes
  ** din[nin + i], the whole gradient at that output, which replaces the
  ** walk's (the plain tape's d z / d y between two outputs) */
  bool linked_outputs;
  /* a product's multiply-adds, from the node's shapes (what a memory budget
  ** weighs a rebuild by); NULL: an elementwise op, its elements */
  double (*macs)(const struct mg_node *n);
} mg_opdef;

/* an op family's rows, for the registry */
typedef struct mg_opfamily { const mg_opdef *const *rows; int n; } mg_opfamily;
extern const mg_opfamily mg_unary_ops, mg_binary_ops, mg_reduce_ops, mg_matmul_ops, mg_shape_ops,
                         mg_nn_ops, mg_create_ops, mg_maths_ops, mg_index_ops, mg_conv_ops;
extern const mg_opfamily mg_attention_ops;     /* src/ops/attention.c: layer_norm, gelu, attention */
extern const mg_opfamily mg_dense_ops;         /* src/ops/dense.c: dense */

/* the activations fused ops apply themselves */
typedef enum { MG_ACT_LINEAR, MG_ACT_RELU, MG_ACT_TANH, MG_ACT_SIGMOID, MG_ACT__COUNT } mg_activation;
/* act's float kernel (the activation op's own, unary.c; NULL for linear),
** which may run in place */
mg_kernel mg_activation_kernel (mg_activation act, mg_dtype dt);
/* act's backward from its output y, dout * act'(y) (relu_grad, tanh_grad,
** sigmoid_grad; binary.c), written over dout itself when the walk spares it
** to n's rule (mg_node.spare) and the layouts allow, else a new tensor */
mg_tensor *mg_activation_backward (const struct mg_node *n, mg_activation act, mg_tensor *dout, mg_tensor *y);
/* one (M,K) @ (K,N) product of the matrix views a and b (their last two
** dimensions, starting at pa and pb) into contiguous c (matmul.c) */
mg_status mg_matrix_product (const mg_tensor *a, const char *pa, const mg_tensor *b, const char *pb,
                             char *pc, int64_t M, int64_t N, int64_t K);

#define MG_SAVE_IN(j)    (1u << (j))
#define MG_SAVE_OUT(i)   (1u << (16 + (i)))
#define MG_SAVE_INPUTS   0xFFFFu          /* every input */

/* what backward needs to know of a tensor it did not keep */
typedef struct mg_meta {
  uint64_t id;
  mg_dtype dtype;
  int ndim;
  const int64_t *shape;                 /* [ndim], inside the node */
} mg_meta;

/* attributes an op records for its backward rule */
typedef struct mg_attr {
  int axis, keepdims;
  int64_t a[MG_MAX_DIMS], b[MG_MAX_DIMS], c[MG_MAX_DIMS];
  double f;
} mg_attr;

struct mg_node {
  int refcount;           /* tapes holding it */
  size_t size;            /* of its block */
  const mg_opdef *def;
  int nin, nout;
  mg_meta *in_meta, *out_meta;          /* [nin], [nout] */
  mg_tensor **in, **out;                /* saved tensors or NULL, [nin], [nout] */
  bool *needs;                          /* [nin], set by the walk; cleared by a rule: unconnected */
  unsigned followed;                    /* bit j: a recording tape followed input j (j < 32) */
  unsigned out_sources;                 /* linked_outputs: bit i, output i is a source (i < 32) */
  const mg_attr *attr;                  /* what the op recorded; all zero if nothing */
  void *ext;                            /* op-private data (custom, recompute) */
  struct mg_hooks_ref *hooks;           /* saved-tensor hooks its saved tensors went through */
  unsigned packed;                      /* which slots (in, then out) hold packed stand-ins */
  /* set by the walk before the rule: bit i when dout[i] is the walk's
  ** alone (nothing else holds it, nothing records the walk, it is dropped
  ** after the rule), so the rule may write its own result over it */
  unsigned spare;
  /* set by the walk before the rule: the node goes when its rule returns (a
  ** non-persistent tape's gradient, and no other tape holds it), so the rule
  ** may let go of a saved output it is done with (mg_node_unkeep_out) */
  bool going;
  struct mg_dtr *dtr;                   /* its provenance under a memory budget (dtr.c), or NULL */
};

/* saved-tensor hooks, pushed (hooks.c); nodes hold a reference */
typedef struct mg_hooks_ref mg_hooks_ref;
void mg_hooks_retain  (mg_hooks_ref *r);
void mg_hooks_release (mg_hooks_ref *r);
/* pack t through r (no hooks apply while they run); a tensor saved by two
** nodes (tanh's output, the next matmul's input) is packed once. NULL +
** error on failure */
mg_tensor *mg_hooks_pack   (mg_hooks_ref *r, mg_tensor *t);
/* a node lets go of packed, the stand-in of the tensor with id src */
void       mg_hooks_forget (mg_hooks_ref *r, uint64_t src, mg_tensor *packed);
mg_tensor *mg_hooks_unpack (mg_hooks_ref *r, mg_tensor *packed, const mg_meta *m);

/* Records an op on every recording tape that tracks one of its inputs, and
** lets variable watchers see the variables read. Cheap when nothing
** records. Returns MG_ERR only when out of memory. */
mg_status mg_record (const mg_opdef *def, int nin, mg_tensor *const *in, int nout,
                     mg_tensor *const *out, const mg_attr *attr);
/* the same with op-private data: ext goes to the node (freed by
** def->free_ext with it), or is freed at once when no tape records the op;
** *node (may be NULL) gets the node, borrowed */
mg_status mg_record_ex (const mg_opdef *def, int nin, mg_tensor *const *in, int nout,
                        mg_tensor *const *out, const mg_attr *attr, void *ext,
                        mg_node **node);

/* tapes recording now, in this context */
#define mg_recording_tapes  (mg_ctx()->tapes.recording)
static inline bool mg_anyone_listening (void) {
  const mg_tape_state *t = &mg_ctx()->tapes;
  return t->recording > 0 || t->watching > 0;
}

/* MG_ERR + error when out (an output of def, a float) holds NaN or Inf:
** mg_check_numerics's test, run by mg_finish when it is on */
mg_status mg_numerics_check (const mg_opdef *def, int nin, mg_tensor *const *in, const mg_tensor *out);

/* a backward rule lets go of n's saved output i, done with it, when the
** node goes after the rule anyway (n->going; not under a memory budget or
** saved-tensor hooks): its bytes are free for the rest of the rule */
void mg_node_unkeep_out (mg_node *n, int i);

/* records op `def` with one output when anyone listens, releasing the
** output on failure; the usual tail of an op:
**   return mg_finish(&add_op, 2, in, out, NULL); */
double mg_product_macs (const struct mg_node *n);   /* matmul.c: out elements x inner dim */
/* where an optimizer's one-pass step writes v's new value: v's own when no
** one else holds it (reads[0..n) are the step's inputs), else a copy (NULL:
** out of memory); end_write makes the copy v's value (done) or drops it */
mg_tensor *mg_variable_begin_write (mg_variable *v, mg_tensor *const *reads, int n);
void       mg_variable_end_write   (mg_variable *v, mg_tensor *dst, bool done);
/* a one-input elementwise op's common path (unary.c; maths.c's rows too) */
mg_tensor *mg_unary_op (const mg_opdef *op, mg_tensor *x);
mg_tensor *mg_finish (const mg_opdef *def, int nin, mg_tensor *const *in, mg_tensor *out,
                      const mg_attr *attr);

/* Read watchers (recompute_grad, checkpoint_loop and custom_gradient
** forwards): the variables a forward reads and, with captures, the tensors
** from outside it that a paused tape follows (those it closes over, and its
** arguments), so that the node can take them as inputs. */
typedef struct mg_var_watcher {
  mg_variable **vars;
  int n, cap;
  mg_tensor **ts;               /* with captures: tensors read, retained, no repeats */
  int nt, capt;
  bool captures;
  int level;                    /* the pause (tape state's pauses[]) the forward runs under */
  bool failed;                  /* out of memory noting a read */
  struct mg_var_watcher *prev;
} mg_var_watcher;
void mg_watcher_push (mg_var_watcher *w, bool captures);
void mg_watcher_pop  (mg_var_watcher *w);     /* releases nothing; caller frees vars */
void mg_watcher_free (mg_var_watcher *w);
void mg_watcher_note_outputs (mg_var_watcher *w, int n, mg_tensor *const *out);

/* true when a recording or paused tape has seen this id */
bool mg_any_tape_tracks (uint64_t id);
/* pause / resume every tape now active, for recompute forward (nested) */
mg_status mg_pause_all (void);
void mg_resume_all (void);
void mg_recompute_enter (void);
void mg_recompute_leave (void);

/* c (m,n) = op(a) @ op(b), row-major, ta/tb 'N' or 'T' (gemm.c) */
mg_status mg_sgemm (char ta, char tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c);

/* what custom gradients and recompute share (call.c) */
mg_status mg_call_check (const char *fn, const mg_function *f, int nin, mg_tensor *const *in,
                         mg_list *out);
/* a reference on each input for the call: user code may release what was lent */
void mg_call_hold (int nin, mg_tensor *const *in);
void mg_call_unhold (int nin, mg_tensor *const *in);
/* runs f->forward with the tapes paused (how: MG_FN_* flags; recorded
** with MG_FN_RECORD_FORWARD) and w (pushed here, popped after) noting
** variable reads, and with MG_FN_CAPTURES the tensors a paused tape
** follows; on failure out and w are emptied */
mg_status mg_call_forward (const mg_function *f, void *ud, int nin, mg_tensor *const *in,
                           mg_list *out, mg_var_watcher *w, unsigned how);
mg_status mg_call_fresh_outputs (mg_list *out, mg_tensor *const *inputs, int ninputs);
int mg_call_index_of (uint64_t id, mg_tensor *const *xs, int n);   /* -1: not among xs */
void mg_call_drop_passed (mg_var_watcher *w, int nin, mg_tensor *const *in);

/* save policies (replay.c) */
mg_replay *mg_replay_new (void);
void       mg_replay_free (mg_replay *r);
size_t     mg_replay_count (const mg_replay *r);
mg_status  mg_replay_note (const mg_opdef *op, mg_tensor *out);   /* mg_finish, first runs */
void       mg_replay_rewind (mg_replay *r);
mg_tensor *mg_replay_kept (const mg_replay *r, int i);   /* the i-th kept output, or NULL */
/* the kept output an op may take instead of computing (new to the tapes), or NULL */
mg_tensor *mg_replay_take (const mg_opdef *op, const int64_t *shape, int ndim, mg_dtype dt);

/* add-or-set: *acc = *acc ? *acc + g : g; takes over g */
mg_status mg_accumulate (mg_tensor **acc, mg_tensor *g);

/* }========================================================== */


/* {=================== small shared helpers ================== */

/* Temporaries of a backward rule, released together at the end. Every
** public op returns NULL when given NULL, so a failure anywhere in an
** expression comes out as NULL with its message kept. */
typedef struct mg_scope { mg_tensor *t[32]; int n; } mg_scope;
static inline mg_tensor *mg_tmp (mg_scope *s, mg_tensor *t) {
  if (t != NULL) {
    mg_assert(s->n < 32);
    s->t[s->n++] = t;
  }
  return t;
}
static inline mg_tensor *mg_retain_or_null (mg_tensor *t) {
  return t ? mg_tensor_retain(t) : NULL;
}
static inline void mg_scope_end (mg_scope *s) {
  while (s->n > 0) mg_tensor_release(s->t[--s->n]);
}

/* a tensor of zeros shaped like meta */
mg_tensor *mg_zeros_meta (const mg_meta *m);

/* }========================================================== */



#endif

/*
** op.h — the ops' floor (src/ops/): the registry's rows, the dispatcher
** every op runs through, tape nodes as backward rules see them, and the
** helpers those rules share. Stands on core.h alone.
*/
#ifndef MG_OP_H
#define MG_OP_H

#include "core/core.h"

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
  /* the kernel: c->out[0 .. c->nout) from c's inputs, attributes and the
  ** entry's findings (mg_dispatch runs it); MG_ERR + error, with nothing
  ** left in c->out */
  mg_status (*forward)(struct mg_opcall *c);
  mg_kernel kernel[MG_DTYPE__COUNT];    /* elementwise: by input dtype; NULL: not defined */
  mg_kernel mixed;                      /* elementwise: float32 a with bfloat16 b (add's), or NULL */
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
  /* Residuals (JAX's word): what a forward computed that its backward
  ** reads instead of computing it again (attention's weights, gelu's
  ** derivative). A row with this nonzero has one output of its own; its
  ** forward may add residuals (mg_opcall.res) when mg_op_recording(), which
  ** the node keeps as its outputs from 1 on, saving this instead of saves.
  ** The forward also makes its outputs in a dry run, computing nothing. */
  unsigned saves_with_residuals;
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
  /* (with reuses_gradient) the walk hands such a gradient over: bit i of
  ** mg_node.spare set, dout[i] is out of the walk's map and the backward's
  ** to release or pass on (recompute seeds its re-run's walk with it, which
  ** then may write over it in turn) */
  bool takes_gradient;
  /* its outputs may depend on one another inside it (a recomputed function
  ** returning y and cos(y)): when output i is a source of the gradient, the
  ** walk sets bit i of mg_node.out_sources and the backward writes
  ** din[nin + i], the whole gradient at that output, which replaces the
  ** walk's (the plain tape's d z / d y between two outputs) */
  bool linked_outputs;
  /* its backward takes an output gradient of any float dtype (cast): the
  ** walk hands it a float32 sum of half gradients as it is, unrounded */
  bool any_gradient_dtype;
  /* a product's multiply-adds, from the node's shapes (what a memory budget
  ** weighs a rebuild by); NULL: an elementwise op, its elements */
  double (*macs)(const struct mg_node *n);
  /* its output may be a view of its input (reshape, slice): a dry run runs
  ** it, where it gives other ops' float outputs fresh and unwritten */
  bool makes_views;
} mg_opdef;

/* an op family's rows, for the registry */
typedef struct mg_opfamily { const mg_opdef *const *rows; int n; } mg_opfamily;

/*
** A family's rows come from one list at the top of its file, X(ENUM, name)
** per op, e.g. #define UNARY_OPS(X) X(NEG, neg) X(EXP, exp) ...; from it:
**   enum { UNARY_OPS(MG_ROW_ENUM) UNARY__COUNT };    MG_OP_NEG, MG_OP_EXP ...
**   MG_ROW(NEG, neg) = {...};                        each row, beside its op
**   MG_FAMILY(mg_unary_ops, UNARY_OPS, UNARY__COUNT);  the table at the end, indexed by the enum
** A row written without its entry in the list does not compile (MG_ROW
** names its enum constant), nor does an entry without its row (the table
** names it); the table's count is the enum's.
*/
#define MG_ROW_ENUM(E, name)     MG_OP_##E,
#define MG_ROW_ENTRY(E, name)    [MG_OP_##E] = &name##_op,
#define MG_ROW(E, name) \
  _Static_assert(MG_OP_##E >= 0, #name ": a row needs its entry in its family's list"); \
  static const mg_opdef name##_op
#define MG_FAMILY(family, LIST, COUNT) \
  static const mg_opdef *const family##_rows[COUNT] = {LIST(MG_ROW_ENTRY)}; \
  const mg_opfamily family = {family##_rows, COUNT}
extern const mg_opfamily mg_unary_ops, mg_binary_ops, mg_reduce_ops, mg_matmul_ops, mg_shape_ops,
                         mg_nn_ops, mg_create_ops, mg_maths_ops, mg_index_ops, mg_conv_ops;
extern const mg_opfamily mg_attention_ops;     /* src/ops/attention.c: layer_norm, gelu, attention */
extern const mg_opfamily mg_dense_ops;         /* src/ops/dense.c: dense */
extern const mg_opfamily mg_sort_ops;          /* src/ops/sort.c: sort, argsort, topk */
extern const mg_opfamily mg_einsum_ops;        /* src/ops/einsum.c: einsum (a composite of other ops) */

/* the activations fused ops apply themselves */
typedef enum { MG_ACT_LINEAR, MG_ACT_RELU, MG_ACT_TANH, MG_ACT_SIGMOID, MG_ACT__COUNT } mg_activation;
/* act's float kernel (the activation op's own, unary.c; NULL for linear),
** which may run in place */
mg_kernel mg_activation_kernel (mg_activation act, mg_dtype dt);
/* the activation named name (NULL: linear) into *act, or MG_ERR + an error
** naming fn and the names it takes; mg_activation_name is the way back */
mg_status   mg_activation_parse (const char *fn, const char *name, mg_activation *act);
const char *mg_activation_name  (mg_activation act);
/* act's backward from its output y, dout * act'(y) (relu_grad, tanh_grad,
** sigmoid_grad; binary.c), written over dout itself when the walk spares it
** to n's rule (mg_node.spare) and the layouts allow, else a new tensor */
mg_tensor *mg_activation_backward (const struct mg_node *n, mg_activation act, mg_tensor *dout, mg_tensor *y);
/* what a bfloat16 product adds to its float32 sums before their one
** rounding (dense's forward under autocast): a float32 bias of n values
** (or NULL), then relu */
typedef struct mg_epilogue { const float *bias; bool relu; } mg_epilogue;
/* a bfloat16 dense layer's weight gradient dw (k,n) bfloat16 = x^T dy and
** (db not NULL) its bias gradient db (n) float32 = dy's column sums, for
** contiguous bfloat16 x (rows,k) and dy (rows,n), in one oneDNN call (gemm.c) */
mg_status mg_dense_weight_grads (int64_t rows, int64_t k, int64_t n, const void *x, const void *dy, void *dw,
                                 float *db);
/* a batch of bfloat16 products c[b] = a[b] @ b[b] in one oneDNN matmul:
** dims {b0, b1, M, N, K}, each operand a 4-D strided view (strides in
** elements: a (b0,b1,M,K), b (b0,b1,K,N), c (b0,b1,M,N) of dtype cdt,
** float32 or bfloat16); attention's products (gemm.c) */
mg_status mg_gemm_half_batched (const int64_t dims[5], const void *a, const int64_t astr[4], const void *b,
                                const int64_t bstr[4], void *c, const int64_t cstr[4], mg_dtype cdt);
/* one (M,K) @ (K,N) product of the matrix views a and b (their last two
** dimensions, starting at pa and pb) into contiguous c of dtype cdt: a's,
** or float32 for bfloat16 a; ep: bfloat16 products' epilogue, else NULL (matmul.c) */
mg_status mg_matrix_product (const mg_tensor *a, const char *pa, const mg_tensor *b, const char *pb,
                             const mg_epilogue *ep, char *pc, int64_t M, int64_t N, int64_t K, mg_dtype cdt);

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

/* One run of an op, as the dispatcher sees it: what the op's entry
** checked and worked out, then what its kernel made. */
typedef struct mg_opcall {
  const mg_opdef *def;
  int nin;
  mg_tensor *const *in;
  const mg_attr *attr;                  /* recorded for the backward; may be NULL */
  const void *local;                    /* the entry's other findings, for the kernel alone */
  /* output 0 as the entry predicts it (a kept output must match it) */
  const int64_t *shape;
  int ndim;
  mg_dtype dtype;
  int nout;                             /* 1 or 2 */
  mg_tensor *out[2];                    /* the kernel's */
  int nres;                             /* residuals the kernel made for the tapes (0 or 1) */
  mg_tensor *res[1];
} mg_opcall;

#define MG_OPCALL(def_, nin_, in_, attr_, shape_, ndim_, dtype_) \
  ((mg_opcall){.def = (def_), .nin = (nin_), .in = (in_), .attr = (attr_), \
               .shape = (shape_), .ndim = (ndim_), .dtype = (dtype_), .nout = 1})

/* Runs an op: the hooks before (a kept output), the row's forward, the
** hooks after (the tapes' record, a save policy's note, numerics checks).
** Every op goes through here. Returns c->out[0] (c->out[1] too is the
** caller's when nout is 2), or NULL + error with nothing left. */
mg_tensor *mg_dispatch (mg_opcall *c);
/* would an op run now be recorded? (a backward rule choosing between its
** fused kernel and public ops that an outer tape can follow) */
bool mg_op_recorded (void);
/* does a tape record now? (a forward making residuals: not in a recompute's
** first run, whose tapes are paused while its read watchers listen) */
bool mg_op_recording (void);
/* could a tape record the backward of an op run now? (a persistent tape
** records, which may take its gradient while it records, or an outer tape
** does besides: second order, whose rules need the op's inputs) */
bool mg_op_second_order (void);

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
  /* set by the walk before the rule: it may take shortcuts that run fewer
  ** ops (no tape records the walk, no recompute's first run or re-run
  ** counts ops); a rule whose ops differ with it runs the same ops in a
  ** recompute's first run as in its re-run */
  bool shortcuts;
  /* set by the walk before the rule: the node goes when its rule returns (a
  ** non-persistent tape's gradient, and no other tape holds it), so the rule
  ** may let go of a saved output it is done with (mg_node_unkeep_out) */
  bool going;
  struct mg_dtr *dtr;                   /* its provenance under a memory budget (dtr.c), or NULL */
};

/* MG_ERR + error when out (an output of def, a float) holds NaN or Inf:
** mg_check_numerics's test, run by mg_dispatch when it is on */
mg_status mg_numerics_check (const mg_opdef *def, int nin, mg_tensor *const *in, const mg_tensor *out);

/* a backward rule lets go of n's saved output i, done with it, when the
** node goes after the rule anyway (n->going; not under a memory budget or
** saved-tensor hooks): its bytes are free for the rest of the rule */
static inline void mg_node_unkeep_out (mg_node *n, int i) {
  mg_tensor *t = n->out[i];
  if (t == NULL || !n->going || n->dtr || (n->packed & (1u << (n->nin + i)))) return;
  mg_storage_hold(t->storage, MG_ROLE_SAVED, -1);
  mg_tensor_release(t);
  n->out[i] = NULL;
}

double mg_product_macs (const struct mg_node *n);   /* matmul.c: out elements x inner dim */
/* a one-input elementwise op's entry and kernel (unary.c; maths.c's rows too) */
mg_status  mg_unary_forward (struct mg_opcall *c);
mg_tensor *mg_unary_op (const mg_opdef *op, mg_tensor *x);

/* c (m,n) = op(a) @ op(b), row-major, ta/tb 'N' or 'T' (gemm.c) */
mg_status mg_sgemm (char ta, char tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c);

/* c (m,n) = op(a) @ op(b) for a and b of half dtype ab (bfloat16), row-major,
** accumulated in float32, then the epilogue ep (NULL: none), c of dtype cdt
** (float32 or ab), through oneDNN's matmul primitive (gemm.c) */
mg_status mg_gemm_half (char ta, char tb, int64_t m, int64_t n, int64_t k, mg_dtype ab, const void *a,
                        int64_t lda, const void *b, int64_t ldb, const mg_epilogue *ep, void *c, mg_dtype cdt);

/* autocast (autocast.c): a product's operand as it computes under the open
** region (its cast, a variable's cached once), else x; a new reference */
mg_tensor *mg_autocast_operand (mg_tensor *x);
/* any other op's operand: float32 for a half x, else x; a new reference */
mg_tensor *mg_half_to_float32 (mg_tensor *x);
/* do xs mix a half dtype with float32 (or the two half dtypes)? The
** elementwise ops and those that join or choose between tensors (concat,
** stack, where, masked_fill) then compute in float32 and give float32, as
** PyTorch's autocast promotes cat and stack to the widest dtype */
bool mg_half_mixed (mg_tensor *const *xs, int n);
/* in an op's entry of tensor x: when COND holds of x, returns CALL (the
** entry itself again, giving a T, FAIL when the cast fails) made with x
** cast to DT */
#define RETRY_AS_T(T, FAIL, x, COND, DT, CALL) do {                           \
    if (COND) {                                                               \
      mg_tensor *xf_ = mg_cast(x, DT);                                        \
      T r_ = FAIL;                                                            \
      if (xf_) { x = xf_; r_ = CALL; }                                        \
      mg_tensor_release(xf_);                                                 \
      return r_;                                                              \
    }                                                                         \
  } while (0)
#define RETRY_AS(x, COND, DT, CALL) RETRY_AS_T(mg_tensor *, NULL, x, COND, DT, CALL)
/* half x (a product's output under autocast) computes in float32, as the other ops do */
#define HALF_AS_FLOAT32(x, CALL) RETRY_AS(x, mg_is_half((x)->dtype), MG_FLOAT32, CALL)
/* in an op's entry of tensors a and b: when COND holds, returns CALL made
** with both passed through CAST (a new reference each, as the two below) */
#define PAIR_AS(a, b, COND, CAST, CALL) do {                                  \
    if (COND) {                                                               \
      mg_tensor *a_ = CAST(a), *b_ = CAST(b), *r_ = NULL;                     \
      if (a_ && b_) { a = a_; b = b_; r_ = CALL; }                            \
      mg_tensor_release(a_);                                                  \
      mg_tensor_release(b_);                                                  \
      return r_;                                                              \
    }                                                                         \
  } while (0)
/* the same for two operands, either of which may be half */
#define HALF_PAIR_AS_FLOAT32(a, b, COND, CALL) PAIR_AS(a, b, COND, mg_half_to_float32, CALL)
/* a float16 product (oneDNN 2.6 has no float16 kernels on CPUs): both operands
** widened to float32, the float32 product CALL, its result rounded to float16,
** each step a recorded op (so the tapes keep float32 copies for the backward) */
#define FLOAT16_AS_FLOAT32(a, b, CALL)                                        \
  PAIR_AS(a, b, (a)->dtype == MG_FLOAT16 && (b)->dtype == MG_FLOAT16, mg_half_to_float32, \
          mg_rounded_float16(CALL))
/* w cast to float16 (recorded), w released; NULL stays NULL */
mg_tensor *mg_rounded_float16 (mg_tensor *w);
/* opens a region of dt for a re-run (recompute, custom gradients, loops):
** as mg_autocast_push, without the float16 gate its first run passed */
mg_status mg_autocast_reenter (mg_dtype dt);
/* a product's two operands as it computes under the open autocast region */
#define AUTOCAST_PAIR(a, b, CALL) PAIR_AS(a, b, true, mg_autocast_operand, CALL)
/* the tapes recording changed: the cached casts go */
void mg_autocast_forget (mg_context *c);
/* a tape began to follow tensor or variable id: casts of it made before
** (not recorded on that tape) go */
void mg_autocast_forget_id (mg_context *c, uint64_t id);

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

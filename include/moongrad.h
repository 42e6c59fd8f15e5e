/*
** moongrad.h — the one public header of moongrad.
**
** moongrad is an eager tensor library with tape-based automatic
** differentiation. Every op runs when called; a tape that is recording
** remembers what each op needs for its backward rule, and tape_gradient walks
** the record in reverse. Its point is memory-aware training: recompute_grad
** (gradient checkpointing) keeps only a function's arguments on the tape and
** re-runs the function during the backward pass, and every byte of tensor
** memory goes through one counting allocator so the saving is measured.
**
** The C core never raises and never aborts: a function that fails returns
** NULL (or MG_ERR) and leaves a message in mg_errmsg(). Tensors are
** immutable and reference counted: a function returning mg_tensor* hands the
** caller one reference, to be dropped with mg_tensor_release. Inputs are
** borrowed. The active tapes, the random streams and the memory counters
** are one per thread (a context, below): threads work side by side, each
** on its own objects; an object is used by one thread at a time.
**
** A C host that embeds Lua and wants autodiff from both sides:
**
**   lua_State *L = luaL_newstate();
**   luaL_openlibs(L);
**   luaL_requiref(L, "moongrad", luaopen_moongrad, 0);     -- module table
**   lua_pop(L, 1);
**   int64_t shape[2] = {2, 2};
**   mg_tensor *x = mg_full(shape, 2, MG_FLOAT64, 3.0);
**   mg_tape *t = mg_tape_new(0, 1);                         -- starts recording
**   mg_tape_watch(t, x);
**   mg_tensor *y = mg_mul(x, x);                            -- y = x^2
**   mg_tape_stop(t);
**   mg_tensor *dx;
**   mg_tape_gradient(t, 1, &y, 1, &x, NULL, 0, &dx);        -- dx = 2x = 6
**   mgL_pushtensor(L, dx);                                  -- hand it to Lua
**
** (examples/embed_host.c is this, complete and checked by `make check`.)
**
** This file is in sections: types, tensors, creation, ops (elementwise,
** reduce, matmul, shape, nn, random), variables, tapes and gradients, memory,
** and the Lua binding (mgL_*), which is the only part that speaks of Lua.
*/
#ifndef MOONGRAD_H
#define MOONGRAD_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MG_VERSION      "moongrad 0.1.0"
#define MG_VERSION_NUM  100
#define MG_MAX_DIMS     8          /* most dimensions a tensor may have */

#ifndef MG_API
#define MG_API extern
#endif


/* {=========================== types =========================== */

typedef enum mg_dtype {
  MG_FLOAT32,                      /* the default */
  MG_FLOAT64,                      /* for gradient checks and precision */
  MG_INT64,                        /* indices and counts; never differentiated */
  MG_BOOL,                         /* results of comparisons; 1 byte */
  MG_FLOAT16,                      /* IEEE half: ops compute it in float32 */
  MG_BFLOAT16,                     /* bfloat16: ops compute it in float32, products in bfloat16 */
  MG_DTYPE__COUNT
} mg_dtype;

typedef enum mg_status { MG_OK = 0, MG_ERR = -1 } mg_status;

typedef struct mg_tensor   mg_tensor;     /* an immutable view of a storage */
typedef struct mg_variable mg_variable;   /* mutable, trainable state */
typedef struct mg_tape     mg_tape;       /* a gradient tape */

/* }============================================================== */


/* {==================== contexts, errors, threads ==================== */
/* The library keeps its state (the last error, memory counters and
** caches, the random streams, the active tapes) in a context. Each thread
** has its own, made on first use, so threads (say, Lua states on threads of
** their own) work independently. An object belongs to the context it was
** made in; a context and its objects are used by one thread at a time. A
** host may make contexts and switch; mg_context_use(NULL) goes back to the
** thread's own. */

typedef struct mg_context mg_context;
MG_API mg_context *mg_context_new     (void);
MG_API void        mg_context_free    (mg_context *c);   /* its objects must be gone */
MG_API mg_context *mg_context_use     (mg_context *c);   /* returns the previous one */
MG_API mg_context *mg_context_current (void);


MG_API const char *mg_errmsg       (void);   /* text of the last failure */
/* the same text with positions (axes, dimensions, indices) counted from base:
** 0 for C callers (mg_errmsg), 1 for Lua's (the binding); valid until the next call */
MG_API const char *mg_errmsg_based (int base);
MG_API mg_status   mg_seterror     (const char *fmt, ...);   /* always MG_ERR */
/* Threads: by default ("auto") as many as the machine has, and one while
** other processes hold the cores (a team waits for its slowest thread); the
** team changes only between steps (no tape keeps nodes). A count set here
** (or OMP_NUM_THREADS) is fixed: the same bits from run to run on any load.
** Per context, as the rest. */
#define MG_MAX_THREADS  1024       /* most threads mg_set_num_threads accepts */
MG_API mg_status   mg_set_num_threads      (int n);   /* 1 <= n <= MG_MAX_THREADS: fixed */
MG_API mg_status   mg_set_num_threads_auto (void);    /* back to auto */
MG_API int         mg_get_num_threads      (void);    /* the count set, or the machine's */
MG_API int         mg_threads_team         (void);    /* the team ops run on now */
MG_API int         mg_threads_auto         (void);    /* 1: auto, 0: fixed */
/* on: every op whose float output holds a NaN or an infinity fails, naming
** the op and its inputs' shapes (tf.debugging.enable_check_numerics); off
** by default, and then free. Per context; returns the previous setting. */
MG_API int         mg_check_numerics  (int on);
/* float32 products go to oneDNN or OpenBLAS, whichever the first product of
** a shape class measured fastest here (remembered in ~/.cache/moongrad/;
** MOONGRAD_GEMM and MOONGRAD_GEMM_CACHE in the environment). "auto" (the
** default), "dnnl", "openblas" or one of the ways mg_gemm_choice names
** ("dnnl-matmul", "dnnl-ct", "openblas-gemv", "openblas-ger"; where a way
** cannot compute a shape, "dnnl" does) for every product from now on: */
MG_API mg_status   mg_gemm_use (const char *backend);
/* the choice for an (m,k) @ (k,n) product at the current thread count, as
** "library/threads" (measuring it now if it is new); NULL + error when bad */
MG_API const char *mg_gemm_choice (int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k);
/* Asks the running computation to stop: long loops (printing, elementwise
** and reduction kernels, the backward walk) check the flag between chunks
** and fail with "interrupted". Async-signal-safe, so a SIGINT handler may
** call it; the flag stays set until mg_interrupt(0) clears it. */
MG_API void        mg_interrupt       (int on);
MG_API int         mg_interrupted     (void);

/* }============================================================== */


/* {========================== tensors =========================== */

MG_API mg_tensor   *mg_tensor_retain   (mg_tensor *t);   /* +1 reference */
MG_API void         mg_tensor_release  (mg_tensor *t);   /* -1; NULL is fine */
MG_API mg_dtype     mg_tensor_dtype    (const mg_tensor *t);
MG_API int          mg_tensor_ndim     (const mg_tensor *t);
MG_API const int64_t *mg_tensor_shape  (const mg_tensor *t);
MG_API const int64_t *mg_tensor_strides (const mg_tensor *t);  /* in elements; 0 where broadcast */
MG_API int64_t      mg_tensor_numel    (const mg_tensor *t);
MG_API uint64_t     mg_tensor_id       (const mg_tensor *t);  /* unique per tensor */
MG_API int          mg_tensor_is_contiguous (const mg_tensor *t);
/* a contiguous tensor with the same values (t itself, retained, if it is one) */
MG_API mg_tensor   *mg_contiguous      (mg_tensor *t);
/* its first element: float*, double*, int64_t* or uint8_t*; step through
** the others with mg_tensor_strides (in elements), or mg_contiguous first */
MG_API void        *mg_tensor_data     (const mg_tensor *t);
/* one element as a double, index 0-based; NaN + error when out of range */
MG_API double       mg_tensor_get      (const mg_tensor *t, const int64_t *index);
/* 0 for a dry run's float result (mg_dry_run_begin): it has no values (its
** memory is uninitialised). Once the dry run ends, ops, copies and
** mg_tensor_get refuse it: mg_tensor_need_values gives MG_ERR + an error
** naming who; inside the run, MG_OK (its values are meaningless there) */
MG_API int          mg_tensor_has_values  (const mg_tensor *t);
MG_API mg_status    mg_tensor_need_values (const mg_tensor *t, const char *who);
MG_API const char  *mg_dtype_name      (mg_dtype dt);    /* "float32" ... */
MG_API int          mg_dtype_from_name (const char *name);  /* -1 if unknown */
MG_API size_t       mg_dtype_size      (mg_dtype dt);
/* float32, float64, float16, bfloat16: the dtypes gradients flow through */
MG_API bool         mg_dtype_is_float  (mg_dtype dt);
/* n values of src (dtype sdt) into dst (dtype ddt), contiguous both; floats
** to int64 truncate toward zero and saturate, NaN gives 0 */
MG_API void         mg_convert         (void *dst, mg_dtype ddt, const void *src, mg_dtype sdt, int64_t n);
/* "(2,3)" into buf; returns buf */
MG_API char        *mg_shape_str       (char *buf, size_t n, const int64_t *shape, int ndim);
/* readable values with a footer "moongrad.Tensor(2,3) float32"; free() it */
MG_API char        *mg_tensor_format   (const mg_tensor *t);

/* }============================================================== */


/* {========================== creation ========================== */

MG_API mg_tensor *mg_empty     (const int64_t *shape, int ndim, mg_dtype dt);
MG_API mg_tensor *mg_full      (const int64_t *shape, int ndim, mg_dtype dt, double value);
MG_API mg_tensor *mg_full_int64 (const int64_t *shape, int ndim, int64_t value);  /* exact */
/* a number as a 0-d tensor (x * 3's 3; PyTorch's wrapped number): what a
** tape saves of it, or of what ops make from numbers alone, skips the
** saved-tensor hooks. mg_full(NULL, 0, ...) makes a plain 0-d tensor. */
MG_API mg_tensor *mg_scalar    (double value, mg_dtype dt);
/* copies n = prod(shape) values, converting from double */
MG_API mg_tensor *mg_from_doubles (const double *values, const int64_t *shape, int ndim, mg_dtype dt);
MG_API mg_tensor *mg_arange    (double start, double stop, double step, mg_dtype dt);
MG_API mg_tensor *mg_arange_int64 (int64_t start, int64_t stop, int64_t step);   /* exact */
MG_API mg_tensor *mg_eye       (int64_t n, int64_t m, mg_dtype dt);
MG_API mg_tensor *mg_cast      (mg_tensor *x, mg_dtype dt);    /* differentiable float->float */

/* }============================================================== */


/* {===================== the op registry ======================= */
/* Every primitive op is one row of a registry: its name, how it is called,
** its symbol and Lua metamethod, and a one-line description. (The row's
** private part holds its kernels by dtype, its backward rule and what it
** saves.) The Lua binding makes mg.<name>, x:<name>() and the metamethods by
** walking it, so an op is added in one place. */

typedef enum mg_opkind {
  MG_OP_UNARY,           /* mg_tensor *f(mg_tensor *x) */
  MG_OP_BINARY,          /* mg_tensor *f(mg_tensor *a, mg_tensor *b), broadcasting */
  MG_OP_REDUCE,          /* mg_tensor *f(mg_tensor *x, int axis, int keepdims) */
  MG_OP_OTHER            /* its own signature (matmul, reshape, softmax ...) */
} mg_opkind;

typedef struct mg_opinfo {
  const char *name;      /* "add": mg_add in C, mg.add and x:add() in Lua */
  mg_opkind kind;
  const char *symbol;    /* "+" (in messages), or NULL */
  const char *metamethod;/* "__add", or NULL */
  const char *verb;      /* "add": "attempt to add a 'string' with a ...", or NULL */
  const char *doc;       /* one line: what it computes */
  union {
    mg_tensor *(*unary)(mg_tensor *x);
    mg_tensor *(*binary)(mg_tensor *a, mg_tensor *b);
    mg_tensor *(*reduce)(mg_tensor *x, int axis, int keepdims);
  } fn;                  /* NULL for MG_OP_OTHER */
  int product;           /* a product (matmul, dense, conv2d, einsum, attention): "dots" keeps it */
} mg_opinfo;

MG_API int               mg_op_count (void);
MG_API const mg_opinfo  *mg_op_info  (int i);          /* 0 <= i < mg_op_count() */
MG_API const mg_opinfo  *mg_op_find  (const char *name);   /* NULL if none */

/* }============================================================== */


/* {==================== ops: elementwise ======================== */
/* Binary ops broadcast by NumPy's rules and need equal dtypes. */

MG_API mg_tensor *mg_add      (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_sub      (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_mul      (mg_tensor *a, mg_tensor *b);   /* elementwise */
MG_API mg_tensor *mg_div      (mg_tensor *a, mg_tensor *b);   /* int64 / int64 -> float64 */
MG_API mg_tensor *mg_pow      (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_maximum  (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_minimum  (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_floordiv (mg_tensor *a, mg_tensor *b);   /* floor(a / b); no gradient */
MG_API mg_tensor *mg_mod      (mg_tensor *a, mg_tensor *b);   /* a - floor(a/b)*b; no gradient */
/* comparisons give MG_BOOL and no gradient */
MG_API mg_tensor *mg_equal         (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_not_equal     (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_less          (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_less_equal    (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_greater       (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_greater_equal (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_logical_and  (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_logical_or   (mg_tensor *a, mg_tensor *b);
MG_API mg_tensor *mg_logical_not  (mg_tensor *a);
/* which entries are finite, NaN, infinite (MG_BOOL; integer and bool
** tensors are all finite) */
MG_API mg_tensor *mg_isfinite     (mg_tensor *x);
MG_API mg_tensor *mg_isnan        (mg_tensor *x);
MG_API mg_tensor *mg_isinf        (mg_tensor *x);
/* out = cond ? a : b, all three broadcast; cond is MG_BOOL */
MG_API mg_tensor *mg_where    (mg_tensor *cond, mg_tensor *a, mg_tensor *b);

MG_API mg_tensor *mg_neg      (mg_tensor *x);
MG_API mg_tensor *mg_exp      (mg_tensor *x);
MG_API mg_tensor *mg_log      (mg_tensor *x);
MG_API mg_tensor *mg_sqrt     (mg_tensor *x);
MG_API mg_tensor *mg_abs      (mg_tensor *x);
MG_API mg_tensor *mg_sign     (mg_tensor *x);                 /* no gradient */
MG_API mg_tensor *mg_tanh     (mg_tensor *x);
MG_API mg_tensor *mg_sigmoid  (mg_tensor *x);                 /* 1 / (1 + exp(-x)) */
MG_API mg_tensor *mg_relu     (mg_tensor *x);                 /* max(x, 0) */
MG_API mg_tensor *mg_softplus (mg_tensor *x);                 /* log(1 + e^x), stably */
MG_API mg_tensor *mg_silu     (mg_tensor *x);                 /* x * sigmoid(x) (swish) */
/* x where x > 0, else alpha * (e^x - 1) (Keras' and PyTorch's alpha: 1) */
MG_API mg_tensor *mg_elu      (mg_tensor *x, double alpha);
/* x where x > 0, else alpha * x (PyTorch's alpha: 0.01; Keras' 0.2) */
MG_API mg_tensor *mg_leaky_relu (mg_tensor *x, double alpha);
MG_API mg_tensor *mg_relu_grad (mg_tensor *d, mg_tensor *y);   /* y > 0 ? d : 0 (relu's backward) */
MG_API mg_tensor *mg_tanh_grad (mg_tensor *d, mg_tensor *y);   /* d * (1 - y^2) (tanh's, from its output) */
MG_API mg_tensor *mg_sigmoid_grad (mg_tensor *d, mg_tensor *y);   /* d * y * (1 - y) (sigmoid's, from its output) */

/* }============================================================== */


/* {====================== ops: reductions ======================= */
/* axis is 0-based here (the Lua binding is 1-based); MG_ALL_AXES reduces all. */

#define MG_ALL_AXES  (-100)

MG_API mg_tensor *mg_sum     (mg_tensor *x, int axis, int keepdims);
MG_API mg_tensor *mg_mean    (mg_tensor *x, int axis, int keepdims);
MG_API mg_tensor *mg_max     (mg_tensor *x, int axis, int keepdims);
MG_API mg_tensor *mg_min     (mg_tensor *x, int axis, int keepdims);
MG_API mg_tensor *mg_argmax  (mg_tensor *x, int axis, int keepdims);  /* int64, 0-based */
MG_API mg_tensor *mg_argmin  (mg_tensor *x, int axis, int keepdims);
/* sum x over its broadcast dimensions so that it has the given shape */
MG_API mg_tensor *mg_sum_to_shape (mg_tensor *x, const int64_t *shape, int ndim);

/* }============================================================== */


/* {======================== ops: matmul ========================= */

/* out = a @ b;  a: (...,M,K), b: (...,K,N) -> (...,M,N); batch dims
** broadcast; a 1-D operand is a vector as in NumPy. float32 goes to oneDNN's
** sgemm; other dtypes use a blocked C kernel. */
MG_API mg_tensor *mg_matmul  (mg_tensor *a, mg_tensor *b);

/* y = act(x @ w + b), a fully connected layer as one op (src/ops/dense.c):
** x (..., K), w (K, N), b (N) or NULL -> (..., N), one float dtype;
** activation "linear" (or NULL), "relu", "tanh" or "sigmoid". The bias and
** activation run in one pass after the product, with the numbers of the
** separate ops; the tape keeps x, w and y in one node */
MG_API mg_tensor *mg_dense   (mg_tensor *x, mg_tensor *w, mg_tensor *b, const char *activation);

/* }============================================================== */


/* {======================== ops: shape ========================== */
/* Views share storage where the strides allow; otherwise a copy is made. */

MG_API mg_tensor *mg_reshape     (mg_tensor *x, const int64_t *shape, int ndim); /* one -1 allowed */
/* the same data as a new tensor, no copy: identity is recorded (gradient
** dout, as tf.identity); stop_gradient is not, so it is a constant to every
** tape (tf.stop_gradient, torch's detach) */
MG_API mg_tensor *mg_identity      (mg_tensor *x);
MG_API mg_tensor *mg_stop_gradient (mg_tensor *x);
MG_API mg_tensor *mg_permute     (mg_tensor *x, const int *perm);   /* out dim i = x dim perm[i] */
MG_API mg_tensor *mg_transpose   (mg_tensor *x, int axis1, int axis2);
MG_API mg_tensor *mg_expand_dims (mg_tensor *x, int axis);
MG_API mg_tensor *mg_squeeze     (mg_tensor *x, int axis);          /* MG_ALL_AXES: every 1 */
MG_API mg_tensor *mg_broadcast_to(mg_tensor *x, const int64_t *shape, int ndim);
/* out = x[start:stop:step] along each axis; start/stop/step hold ndim entries,
** 0-based, stop exclusive, already clamped by the caller */
MG_API mg_tensor *mg_slice       (mg_tensor *x, const int64_t *start, const int64_t *stop,
                                  const int64_t *step);
/* the adjoint of mg_slice: zeros of `shape` with x placed at start:stop:step */
MG_API mg_tensor *mg_unslice     (mg_tensor *x, const int64_t *shape, const int64_t *start,
                                  const int64_t *step);
MG_API mg_tensor *mg_select      (mg_tensor *x, int axis, int64_t index);  /* drops axis */
MG_API mg_tensor *mg_concat      (mg_tensor *const *xs, int n, int axis);
MG_API mg_tensor *mg_stack       (mg_tensor *const *xs, int n, int axis);
/* out = x gathered along axis at int64 indices (any shape, 0-based; a
** negative index counts from the end, -1 the last) */
MG_API mg_tensor *mg_gather      (mg_tensor *x, mg_tensor *indices, int axis);
/* the adjoint of mg_gather: zeros of x-like `shape`, src rows added at indices */
MG_API mg_tensor *mg_scatter_add (mg_tensor *src, mg_tensor *indices, int axis,
                                  const int64_t *shape, int ndim);

/* }============================================================== */


/* {========================== ops: nn =========================== */

MG_API mg_tensor *mg_softmax     (mg_tensor *x, int axis);
MG_API mg_tensor *mg_log_softmax (mg_tensor *x, int axis);

/* }============================================================== */


/* {================ ops: more maths and reductions =============== */
/* (src/ops/maths.c) Axes as in the reductions above: 0-based, MG_ALL_AXES
** for all; int64 and bool give float64 except in prod and cumsum. */

MG_API mg_tensor *mg_sin   (mg_tensor *x);                  /* radians */
MG_API mg_tensor *mg_cos   (mg_tensor *x);
MG_API mg_tensor *mg_log1p (mg_tensor *x);                  /* log(1 + x), exact near 0 */
MG_API mg_tensor *mg_expm1 (mg_tensor *x);                  /* e^x - 1, exact near 0 */
MG_API mg_tensor *mg_erf   (mg_tensor *x);                  /* the error function */
/* no gradient (as sign); int64 passes through unchanged */
MG_API mg_tensor *mg_floor (mg_tensor *x);
MG_API mg_tensor *mg_ceil  (mg_tensor *x);
MG_API mg_tensor *mg_round (mg_tensor *x);                  /* halves to even: 0.5 -> 0, 1.5 -> 2 */
/* out = min(max(x, lo), hi), the three broadcast, one dtype (one-sided:
** pass -inf or +inf). grad as PyTorch: x where lo <= x <= hi, lo where
** x < lo < hi, hi where x > hi or hi < lo */
MG_API mg_tensor *mg_clamp (mg_tensor *x, mg_tensor *lo, mg_tensor *hi);
MG_API mg_tensor *mg_prod      (mg_tensor *x, int axis, int keepdims);  /* 1 over nothing */
MG_API mg_tensor *mg_logsumexp (mg_tensor *x, int axis, int keepdims);  /* log(sum(e^x)), stably */
/* sum((x - mean)^2) / (n - ddof); ddof 0 is NumPy's default and TF's reduce_variance */
MG_API mg_tensor *mg_var   (mg_tensor *x, int axis, int keepdims, double ddof);
MG_API mg_tensor *mg_std   (mg_tensor *x, int axis, int keepdims, double ddof);  /* sqrt(var) */
/* ord 1: sum |x|, 2: sqrt(sum x^2), INFINITY: max |x|; gradient 0 at 0 */
MG_API mg_tensor *mg_norm  (mg_tensor *x, int axis, int keepdims, double ord);
/* running sums along axis (MG_ALL_AXES: the flattened x, 1-D); exclusive
** leaves out x[k] itself, reverse sums from the end (TensorFlow's cumsum) */
MG_API mg_tensor *mg_cumsum (mg_tensor *x, int axis, int exclusive, int reverse);

/* }============================================================== */


/* {============== ops: convolution and pooling (NHWC) ============= */
/* (src/ops/conv.c) As TensorFlow: images are NHWC, (batch, height, width,
** channels), and filters HWIO, (KH, KW, Cin, Cout). float32 runs on
** oneDNN's convolution and pooling primitives; float64 on plain C loops
** (the reference, and what gradient checks use). Backward passes are ops
** too (the *_backward_* rows below), so gradients of any order exist. */

/* TensorFlow's paddings: VALID adds none; SAME pads so that out =
** ceil(in / stride), the odd pixel after; EXPLICIT takes pads (top,
** bottom, left, right), for convolutions only */
typedef enum mg_padding { MG_PADDING_VALID, MG_PADDING_SAME, MG_PADDING_EXPLICIT } mg_padding;

/* the geometry of a convolution or pool; all zero is the default (NULL too) */
typedef struct mg_conv_params {
  int64_t strides[2];      /* (height, width); 0: 1 for convolutions, the window for pools */
  int64_t dilation[2];     /* 0 or 1: none; d spreads the taps d pixels apart */
  mg_padding padding;      /* MG_PADDING_VALID by default */
  int64_t pads[4];         /* MG_PADDING_EXPLICIT: top, bottom, left, right */
} mg_conv_params;

/* out[n,i,j,o] = b[o] + sum_{u,v,c} x[n, i*sh + u*dh - top, j*sw + v*dw - left, c] w[u,v,c,o];
** x: (N,H,W,C), w: (KH,KW,C,O), b: (O) or NULL -> (N,OH,OW,O).
** grad: dx = conv2d_backward_input(dout, w), dw = conv2d_backward_filter(x, dout),
** db = dout summed over N, OH, OW */
MG_API mg_tensor *mg_conv2d (mg_tensor *x, mg_tensor *w, mg_tensor *b, const mg_conv_params *p);
/* act(conv2d(x, w, b)) in one op (Keras' Conv2D with an activation): activation
** NULL or "linear", "relu", "tanh", "sigmoid", applied to the float32 sum (relu
** as oneDNN's post-op, so no second pass; a bfloat16 result rounds once). The
** tape keeps y for the activation's gradient, one node where it kept two */
MG_API mg_tensor *mg_conv2d_act (mg_tensor *x, mg_tensor *w, mg_tensor *b, const mg_conv_params *p,
                                 const char *activation);
/* the gradient of conv2d with respect to x (its transpose, TensorFlow's
** conv2d_transpose): dy (N,OH,OW,O), w (KH,KW,C,O) -> input_shape (N,H,W,C) */
MG_API mg_tensor *mg_conv2d_backward_input  (mg_tensor *dy, mg_tensor *w, const int64_t input_shape[4],
                                             const mg_conv_params *p);
/* the gradient of conv2d with respect to w: x (N,H,W,C), dy (N,OH,OW,O) ->
** filter_shape (KH,KW,C,O) */
MG_API mg_tensor *mg_conv2d_backward_filter (mg_tensor *x, mg_tensor *dy, const int64_t filter_shape[4],
                                             const mg_conv_params *p);
/* the maximum / mean of each window (KH,KW) = window: x (N,H,W,C) ->
** (N,OH,OW,C). Padding VALID or SAME; the mean counts only the pixels of x
** in the window (TensorFlow's SAME). grad: the *_backward ops below */
MG_API mg_tensor *mg_max_pool2d (mg_tensor *x, const int64_t window[2], const mg_conv_params *p);
MG_API mg_tensor *mg_avg_pool2d (mg_tensor *x, const int64_t window[2], const mg_conv_params *p);
/* dx: each dy to the position of its window's maximum in x (the first, at ties) */
MG_API mg_tensor *mg_max_pool2d_backward (mg_tensor *x, mg_tensor *dy, const int64_t window[2],
                                          const mg_conv_params *p);
/* dx (input_shape): each dy shared evenly among its window's pixels in x */
MG_API mg_tensor *mg_avg_pool2d_backward (mg_tensor *dy, const int64_t input_shape[4],
                                          const int64_t window[2], const mg_conv_params *p);

/* }============================================================== */


/* {=================== ops: transformers ======================== */
/* (src/ops/attention.c) Fused forward and backward kernels; when a tape
** records a backward pass (second-order gradients), the backward rules use
** the public ops instead, so gradients of any order exist. float32 products
** run on oneDNN's sgemm, float64 on plain C loops (the gradient checks'). */

/* y = (x - mean) / sqrt(var + epsilon) * gamma + beta over x's last axis
** (D); gamma and beta are (D) or NULL (1 and 0). Keeps x and gamma; the
** backward recomputes each row's mean and variance */
MG_API mg_tensor *mg_layer_norm (mg_tensor *x, mg_tensor *gamma, mg_tensor *beta, double epsilon);
/* y = x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))); approximate != 0: GPT-2's
** x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) */
MG_API mg_tensor *mg_gelu (mg_tensor *x, int approximate);

/* attention's options; all zero is the default (NULL too) */
typedef struct mg_attention_params {
  int causal;              /* query i attends to keys j <= i only (top-left aligned) */
  double scale;            /* of the scores; 0: 1/sqrt(features) */
} mg_attention_params;

/* out = softmax(q k^T * scale) v per batch entry, the softmax over the keys:
** q (..., Tq, dk), k (..., Tk, dk), v (..., Tk, dv) -> (..., Tq, dv), the
** batch dimensions equal. mask (bool, true: attend) broadcasts to
** (..., Tq, Tk), or NULL; masked weights are 0, and a query with nothing to
** attend to gets zeros (not NaN). Keeps q, k, v (and the mask) only: the
** backward builds each batch entry's weights again, so no (..., Tq, Tk)
** tensor is kept for it. Views with adjacent columns (heads split by a
** transpose) are read in place */
MG_API mg_tensor *mg_scaled_dot_product_attention (mg_tensor *q, mg_tensor *k, mg_tensor *v, mg_tensor *mask,
                                                   const mg_attention_params *p);

/* }============================================================== */


/* {============== ops: indexing, sorting, rearranging ============ */
/* (src/ops/index.c, src/ops/sort.c, src/ops/einsum.c) Indices are int64
** and 0-based; a negative one counts from the end (-1 is the last), as in
** NumPy. Gradients flow to float inputs, never to indices. */

/* Stable sort along axis: equal values keep their order. NaN sorts above
** every number (last ascending, first descending), -0 equals 0. *values
** gets the sorted values, *indices where each came from; either pointer may
** be NULL. A 0-d x is one entry.  grad: dvalues put back where they came from */
MG_API mg_status  mg_sort    (mg_tensor *x, int axis, int descending, mg_tensor **values,
                              mg_tensor **indices);
MG_API mg_tensor *mg_argsort (mg_tensor *x, int axis, int descending);   /* sort's indices */
/* the k largest (largest = 1) or smallest entries along axis, best first
** (sorted = 1) or in their order in x; ties: the earlier position first */
MG_API mg_status  mg_topk    (mg_tensor *x, int64_t k, int axis, int largest, int sorted,
                              mg_tensor **values, mg_tensor **indices);
/* out = x reversed along axes[0..naxes) (NULL: every axis); a view */
MG_API mg_tensor *mg_flip    (mg_tensor *x, const int *axes, int naxes);
/* x repeated reps[d] times along each dimension, as NumPy's tile (the
** shorter of x's shape and reps gets leading 1s) */
MG_API mg_tensor *mg_tile    (mg_tensor *x, const int64_t *reps, int nreps);
/* each entry along axis repeated (np.repeat, torch.repeat_interleave):
** repeats[0] times when nrepeats is 1, else repeats[i] times entry i;
** axis MG_ALL_AXES: of the flattened x (Lua's `repeat` is a keyword) */
MG_API mg_tensor *mg_repeat_interleave (mg_tensor *x, const int64_t *repeats, int64_t nrepeats,
                                        int axis);
/* NumPy's pad modes: value; x mirrored without / with the edge entry; the
** edge entry repeated; x repeated periodically */
typedef enum mg_pad_mode {
  MG_PAD_CONSTANT, MG_PAD_REFLECT, MG_PAD_SYMMETRIC, MG_PAD_EDGE, MG_PAD_WRAP
} mg_pad_mode;
/* before[d] and after[d] entries added around dimension d (>= 0, any width) */
MG_API mg_tensor *mg_pad     (mg_tensor *x, const int64_t *before, const int64_t *after,
                              mg_pad_mode mode, double value);
/* the last two axes' lower (j <= i + k) / upper (j >= i + k) triangle, zeros elsewhere */
MG_API mg_tensor *mg_tril    (mg_tensor *x, int64_t k);
MG_API mg_tensor *mg_triu    (mg_tensor *x, int64_t k);
/* out = mask ? value : x; mask (bool) broadcasts to x's shape, value is 0-d */
MG_API mg_tensor *mg_masked_fill (mg_tensor *x, mg_tensor *mask, mg_tensor *value);
/* out[..., j, ...] = x[..., indices[..., j, ...], ...] along axis (NumPy's
** take_along_axis, torch.gather): indices have x's ndim and broadcast
** against x outside axis */
MG_API mg_tensor *mg_take_along_axis (mg_tensor *x, mg_tensor *indices, int axis);
/* x with values put at indices along axis (its adjoint): add = 0 writes
** (NumPy's put_along_axis; where two go to one place the last wins),
** add = 1 adds (torch.scatter_add); indices: sizes of x or 1 outside axis;
** values broadcast to the indices' shape */
MG_API mg_tensor *mg_put_along_axis  (mg_tensor *x, mg_tensor *indices, mg_tensor *values,
                                      int axis, int add);
/* NumPy's einsum for one or two operands: "ij,jk->ik", "bhqd,bhkd->bhqk",
** "ii->i", "ij->" ...; no ellipsis. Made of permute, reshape, gather, sum
** and one batched matmul, whose rules give its gradient */
MG_API mg_tensor *mg_einsum  (const char *spec, int n, mg_tensor *const *xs);
/* 1-based indices (as Lua's) made 0-based: i > 0 gives i - 1, negative
** ones stay, 0 is an error naming fn */
MG_API mg_tensor *mg_indices_from_1based (mg_tensor *indices, const char *fn);

/* }============================================================== */


/* {======================== ops: random ========================= */
/* A counter-based generator (Philox4x32-10): the state is (seed, offset),
** and each draw advances the offset by the number of values drawn. Saving
** and restoring the state replays a stream exactly. */

typedef struct mg_rng_state { uint64_t seed, offset; } mg_rng_state;

MG_API void          mg_random_seed      (uint64_t seed);
MG_API mg_rng_state  mg_random_get_state (void);
/* switches between the main stream and the initializers' stream (seeded by
** mg_random_seed too); layers draw initial values between two calls */
MG_API void          mg_random_swap_streams (void);
MG_API void          mg_random_set_state (mg_rng_state s);
MG_API mg_tensor    *mg_random_uniform   (const int64_t *shape, int ndim, mg_dtype dt,
                                          double lo, double hi);
MG_API mg_tensor    *mg_random_normal    (const int64_t *shape, int ndim, mg_dtype dt,
                                          double mean, double stddev);

/* }============================================================== */


/* {========================= variables ========================== */
/* A variable owns a value that ops read; reading it is what tapes watch. */

MG_API mg_variable *mg_variable_new     (mg_tensor *init, const char *name, int trainable);
MG_API mg_variable *mg_variable_retain  (mg_variable *v);
MG_API void         mg_variable_release (mg_variable *v);
MG_API mg_tensor   *mg_variable_read    (mg_variable *v);   /* borrowed; tapes notice */
MG_API mg_tensor   *mg_variable_peek    (mg_variable *v);   /* borrowed; nobody notices */
MG_API mg_status    mg_variable_assign  (mg_variable *v, mg_tensor *value);  /* shape/dtype fixed */
/* v = v + alpha * x in one pass, in place unless someone holds v's value;
** x has v's shape, or is 0-d (one number) */
MG_API mg_status    mg_variable_axpy    (mg_variable *v, double alpha, mg_tensor *x);

/* one Adam step (Kingma & Ba, in Keras' form: epsilon outside the bias
** correction) of v by gradient g, in one pass over the four tensors */
typedef struct mg_adam_params {
  double beta1, beta2, epsilon;
  double step_size;   /* lr * sqrt(1 - beta2^t) / (1 - beta1^t) at step t */
  double decay;       /* AdamW's decoupled weight decay, lr * weight_decay; 0: none */
} mg_adam_params;
/* w -= decay * w; m' = beta1 m + (1 - beta1) g; s' = beta2 s + (1 - beta2) g^2;
** w -= step_size * m' / (sqrt(s') + epsilon), with the numbers of those ops
** run one by one. m and s (the slots: v's shape and dtype) may be NULL for
** zeros; *m_out and *s_out get new tensors (m and s are left as they were:
** someone may hold them); w is updated in place unless someone holds it */
MG_API mg_status    mg_variable_adam    (mg_variable *v, mg_tensor *g, mg_tensor *m, mg_tensor *s,
                                         const mg_adam_params *p, mg_tensor **m_out, mg_tensor **s_out);
/* SGD with momentum (PyTorch's rule) in one pass: b' = momentum b + g (b
** NULL, the first step: b' = g itself); w -= lr b', or with nesterov
** w -= lr (g + momentum b'), the separate ops' numbers. *b_out gets b' (a new
** tensor, or g's); b is left as it was; w in place unless someone holds it */
MG_API mg_status    mg_variable_momentum (mg_variable *v, mg_tensor *g, mg_tensor *b, double momentum, double lr,
                                          int nesterov, mg_tensor **b_out);
/* RMSprop (Keras' rule) in one pass: v' = rho v + (1 - rho) g^2; centered:
** a' = rho a + (1 - rho) g and d = v' - a'^2 + epsilon, else d = v' + epsilon;
** s = g / sqrt(d); with momentum b' = momentum b + lr s and w -= b', else
** w -= lr s; the separate ops' numbers. slots: {v, a, b}, each NULL for zeros
** (a, b only read when centered, with momentum); out gets {v', a', b'}, new
** tensors (NULL where unused); the slots are left as they were */
typedef struct mg_rmsprop_params { double lr, rho, epsilon, momentum; int centered; } mg_rmsprop_params;
MG_API mg_status    mg_variable_rmsprop (mg_variable *v, mg_tensor *g, mg_tensor *const slots[3],
                                         const mg_rmsprop_params *p, mg_tensor *out[3]);
MG_API const char  *mg_variable_name    (const mg_variable *v);
MG_API int          mg_variable_trainable (const mg_variable *v);

/* }============================================================== */


/* {=================== tapes and gradients ====================== */

MG_API mg_tape  *mg_tape_new     (int persistent, int watch_accessed_variables);  /* recording */
MG_API mg_tape  *mg_tape_retain  (mg_tape *t);
MG_API void      mg_tape_release (mg_tape *t);
MG_API void      mg_tape_stop    (mg_tape *t);          /* stop recording for good */
MG_API void      mg_tape_pause   (mg_tape *t);          /* nested pause ... */
MG_API void      mg_tape_resume  (mg_tape *t);          /* ... and its end */
MG_API mg_status mg_tape_start   (mg_tape *t);          /* record again after stop */
MG_API int       mg_tape_is_recording (const mg_tape *t);
/* does t follow x: watched by it, or made by an op it recorded? (a target
** it does not follow has no gradient: computed after mg_tape_stop, say) */
MG_API int       mg_tape_follows (const mg_tape *t, const mg_tensor *x);
MG_API mg_status mg_tape_watch   (mg_tape *t, mg_tensor *x);
MG_API mg_status mg_tape_watch_variable (mg_tape *t, mg_variable *v);
MG_API int       mg_tape_nvariables (const mg_tape *t);
MG_API mg_variable *mg_tape_variable (const mg_tape *t, int i);  /* borrowed; 0 <= i < n */
/* forgets everything recorded; refused while the tape's gradient is being
** computed (from a custom gradient's backward, say) */
MG_API mg_status mg_tape_reset   (mg_tape *t);
MG_API size_t    mg_tape_saved_bytes (const mg_tape *t);   /* held for backward */
MG_API size_t    mg_tape_nnodes  (const mg_tape *t);
/* grads[i] = d(sum of targets)/d sources[i], or NULL when unconnected and
** !unconnected_zero. out_grads may be NULL (ones) or hold one per target.
** A non-persistent tape frees what it held and refuses a second call. */
MG_API mg_status mg_tape_gradient (mg_tape *t, int ntargets, mg_tensor *const *targets,
                                   int nsources, mg_tensor *const *sources,
                                   mg_tensor *const *out_grads, int unconnected_zero,
                                   mg_tensor **grads);
/* Hooks into a gradient's walk, for work that can start before the walk
** ends (mg.distributed sends each bucket of gradients as soon as it is
** whole, as PyTorch's DDP does). ready(ud, s, g, &take) is called once per
** source s the targets reach, as soon as no node left in the walk adds to
** its gradient g (borrowed: copy what you need; setting take to 1 lets the
** walk drop g now, and grads[s] is then NULL, even with unconnected_zero;
** take is ignored for a source that a recorded op made, or that is a
** target: its gradient still flows back through the op that made it).
** A source no node reaches gets no call. tick(ud), when not NULL, is called
** after each node the walk runs: a chance to progress communication. A
** hook's MG_ERR stops the walk with its error. */
typedef struct mg_gradient_hooks {
  mg_status (*ready) (void *ud, int source, mg_tensor *grad, int *take);
  void (*tick) (void *ud);
  void *ud;
} mg_gradient_hooks;
/* mg_tape_gradient with hooks (NULL: none, the plain call) */
MG_API mg_status mg_tape_gradient_hooked (mg_tape *t, int ntargets, mg_tensor *const *targets,
                                          int nsources, mg_tensor *const *sources,
                                          mg_tensor *const *out_grads, int unconnected_zero,
                                          const mg_gradient_hooks *hooks, mg_tensor **grads);
/* *out: target.shape ++ source.shape, or NULL when unconnected and
** !unconnected_zero; a jacobian with no elements (an empty target or
** source) is zeros of that shape */
MG_API mg_status mg_tape_jacobian (mg_tape *t, mg_tensor *target, mg_tensor *source,
                                   int unconnected_zero, mg_tensor **out);
/* outs[s]: the jacobian of target by sources[s], as mg_tape_jacobian; one
** reverse walk per target element serves every source */
MG_API mg_status mg_tape_jacobians (mg_tape *t, mg_tensor *target, int nsources,
                                    mg_tensor *const *sources, int unconnected_zero,
                                    mg_tensor **outs);
/* target (B,...), source (B,...) -> (B, target rest..., source rest...);
** empty as mg_tape_jacobian */
MG_API mg_status mg_tape_batch_jacobian (mg_tape *t, mg_tensor *target, mg_tensor *source,
                                         int unconnected_zero, mg_tensor **out);
/* nonzero while recompute_grad re-runs a function for a gradient */
MG_API int       mg_is_recomputing (void);
MG_API int       mg_tapes_recording (void);      /* tapes recording now */
/* Loop helpers (a checkpointed loop) run their body between mg_loop_enter and
** mg_loop_leave; mg_is_in_loop() is nonzero inside, and in the backward or
** re-run of a custom gradient or recompute called there (the seed's
** is_in_while_loop) */
MG_API void      mg_loop_enter (void);
MG_API void      mg_loop_leave (void);
MG_API int       mg_is_in_loop (void);

/* }============================================================== */


/* {============ custom gradients and recompute, from C ============ */
/* Both run a host function as one op on the tapes. The host gives a
** forward (outputs from inputs), for custom gradients a backward, and a
** release for its user data. They are what the Lua binding builds
** mg.custom_gradient and mg.recompute_grad on; examples/recompute_host.c
** uses them from C alone. */

/* a growable list of tensors, for a callback's outputs */
typedef struct mg_list { int n, cap; mg_tensor **t; } mg_list;
/* appends t, taking over the reference; NULL t (a failed op) or no memory:
** MG_ERR, with t released */
MG_API mg_status mg_list_push  (mg_list *l, mg_tensor *t);
MG_API void      mg_list_clear (mg_list *l);     /* releases the tensors, frees */

/* One call of a custom gradient (PyTorch's ctx), made by mg_custom_call. */
typedef struct mg_custom_ctx mg_custom_ctx;

/* What a custom gradient's backward gets. Its inputs are the forward's
** inputs, then the trainable variables the forward read that were not
** inputs, then (MG_FN_CAPTURES) the tensors it closed over; din has one
** slot for each. */
typedef struct mg_grad_args {
  int nout;
  mg_tensor *const *dout;        /* one per output; zeros where no gradient reached it */
  int nin, nvars;                /* din[0..nin) for inputs, din[nin..nin+nvars) for vars */
  mg_variable *const *vars;
  int ncaptured;                 /* with MG_FN_CAPTURES: din[nin+nvars+k] for captured[k] */
  mg_tensor *const *captured;
  const int *needs;              /* needs[j]: din[j] is wanted */
  mg_tensor **din;               /* set wanted ones (new references); left NULL: none flows (TF's None) */
  mg_custom_ctx *ctx;            /* the call's: what its forward saved */
} mg_grad_args;

typedef struct mg_function {
  const char *name;              /* for messages: "custom_gradient", "my_block" */
  /* appends the outputs for in[0..nin) to out; runs with every tape
  ** paused while the variables it reads are noted */
  mg_status (*forward)  (void *ud, int nin, mg_tensor *const *in, mg_list *out);
  /* custom gradients only: fills a->din; ops it runs are recorded by
  ** tapes still recording, so the gradient can be differentiated again */
  mg_status (*backward) (void *ud, const mg_grad_args *a);
  void      (*release)  (void *ud);            /* frees ud; may be NULL */
  unsigned  flags;                             /* MG_FN_*, or 0 */
} mg_function;

/* How a custom gradient's forward runs (mg_function.flags; recompute
** always captures and never records):
** - MG_FN_RECORD_FORWARD: the tapes record its ops, as TensorFlow's
**   custom_gradient does, so that a backward using the forward's tensors
**   (closed over or saved) can be differentiated again; without it the
**   forward runs with the tapes paused (PyTorch's Function.forward) and
**   they hold only what the call saves.
** - MG_FN_CAPTURES: the tensors from outside the forward that a tape
**   follows (those it closes over) become inputs of the node after the
**   variables: a->captured, whose gradients go to din[nin + nvars + k]. */
#define MG_FN_RECORD_FORWARD 1u
#define MG_FN_CAPTURES       2u
/* recompute only: the re-run must compute the very bytes the first run did
** (mg_recompute_verify) */
#define MG_FN_VERIFY         4u
/* the backward runs the forward's code again on the variables' current
** values (checkpoint_loop, reversible layers): a variable written since the
** forward (an optimizer step between it and the gradient) is an error
** there, naming it, where the gradient would be another function's; one
** the forward wrote itself (BatchNorm's moving averages) is its state, not
** checked */
#define MG_FN_REREADS        8u

/* Runs fn->forward once and records one node for it, whose backward is
** fn->backward. out gets the outputs, each new to the tapes. ud belongs to
** the call: released with the node, at once when no tape records it, or on
** failure. */
MG_API mg_status mg_custom_call    (const mg_function *fn, void *ud, int nin,
                                    mg_tensor *const *in, mg_list *out);

/* What a call's forward saves for its backward with mg_custom_save (PyTorch's
** ctx.save_for_backward) is held by the call's node: counted as saved bytes
** (mg_tape_saved_bytes, the saved role of mg_memory_stats) and let go with
** the node. What a host's user data captures is invisible to the counters.
** Saved tensors are not packed by saved-tensor hooks. */
/* the context of the innermost custom-gradient forward running now
** (borrowed), or NULL + error outside one */
MG_API mg_custom_ctx *mg_custom_context     (void);
MG_API mg_custom_ctx *mg_custom_ctx_retain  (mg_custom_ctx *c);
MG_API void           mg_custom_ctx_release (mg_custom_ctx *c);
/* appends ts[0..n) to what the call saves (a NULL keeps its place); only
** while the call's forward runs */
MG_API mg_status  mg_custom_save   (mg_custom_ctx *c, int n, mg_tensor *const *ts);
MG_API int        mg_custom_nsaved (const mg_custom_ctx *c);
/* saved tensor i (borrowed); NULL for a NULL saved, a forgotten one, or
** after the node let go (and + error when i is out of range) */
MG_API mg_tensor *mg_custom_saved  (const mg_custom_ctx *c, int i);
/* lets go of saved tensor i before the node goes (a reversible layer whose
** output the next layer will rebuild) */
MG_API mg_status  mg_custom_forget (mg_custom_ctx *c, int i);
/* 1 while a tape holds the call's node; 0 during its forward, when no tape
** recorded it, and once the node is let go */
MG_API int        mg_custom_recorded (const mg_custom_ctx *c);
/* during the call's backward: 1 if input j's gradient is wanted, else 0;
** -1 + error outside it or when j is out of range */
MG_API int        mg_custom_needs_input_grad (const mg_custom_ctx *c, int j);
/* runs fn(ud) as a re-run of the call's forward: mg_is_recomputing()
** true, the random state as at the call (the current one back after), the
** autocast the call ran under, and mg_is_in_loop() true if the call ran in
** a loop */
MG_API mg_status  mg_custom_rerun  (mg_custom_ctx *c, mg_status (*fn)(void *ud), void *ud);
/* Gradient checkpointing: runs fn->forward now, recording one node that
** holds only the inputs (and the values of the variables read); every
** gradient through it runs fn->forward again under a local tape, with the
** random state of this call restored and mg_is_recomputing() true, and
** those variables showing the values they had at this call. fn->backward
** is not used. A tensor given twice is one input. */
MG_API mg_status mg_recompute_call (const mg_function *fn, void *ud, int nin,
                                    mg_tensor *const *in, mg_list *out);

/* A save policy (JAX's checkpoint policies): while the function first
** runs, save(ud, op, out) says whether to keep an op's output; the node
** holds what it keeps (as saved bytes), and the re-run takes those outputs
** instead of computing those ops again. mg_save_dots keeps the matrix
** products (and convolutions): the costly ops, with cheap ones between;
** mg_save_output keeps the function's result when its last op made it (the
** re-run stops short of that op, and its output is held anyway by whatever
** comes next: a chain of blocks rebuilds each block but its last op).
** A policy answers 1 (keep), 0, or -1 with mg_seterror (the op fails); 2
** keeps an output only if no later op is asked about and the function
** returns it. */
typedef int (*mg_save_policy)(void *ud, const mg_opinfo *op, const mg_tensor *out);
MG_API int       mg_save_dots (void *ud, const mg_opinfo *op, const mg_tensor *out);
MG_API int       mg_save_output (void *ud, const mg_opinfo *op, const mg_tensor *out);
/* Verify (a debugging run): the first run of a recompute notes each op
** it runs (name, output shape, a CRC-32 of the output's bytes) and the
** re-run must match it op for op, or the gradient fails naming the first
** op that differs (a reduction whose order changed with the thread count,
** randomness outside mg_random's replayed stream); a verified re-run may
** not assign a variable (state updated twice for one step). For every
** recompute while on (1), or for one call with MG_FN_VERIFY in its
** function's flags. Returns the previous setting; -1 asks only. */
MG_API int       mg_recompute_verify (int on);

/* mg_recompute_call with a policy (NULL: keep nothing, as mg_recompute_call) */
MG_API mg_status mg_recompute_call_saving (const mg_function *fn, void *ud, int nin,
                                           mg_tensor *const *in, mg_list *out,
                                           mg_save_policy save, void *save_ud);

/* Automatic mixed precision (PyTorch's torch.autocast, Keras' mixed
** policies). While a region is open, products (matmul, dense, conv2d, einsum) cast
** their float32 operands to dt and compute in it through oneDNN, with
** float32 accumulation, giving dt results; every other op computes float16
** and bfloat16 operands in float32 and gives float32 (reductions, softmax,
** norms, losses and optimizer steps stay float32). A variable's value is
** cast once per region while the same tapes record, however often it is
** read; its gradient comes back in its own dtype (float32 master weights).
** dt: MG_BFLOAT16; MG_FLOAT16 on CPUs with AVX512-FP16, or anywhere once
** mg_autocast_emulate_float16(true) (an error saying why otherwise): its
** products run widened to float32 and round their results to float16, as
** oneDNN 2.6 has no float16 kernels for CPUs (float16's numerics, for a loss
** scale to keep gradients in range; not faster); MG_FLOAT32 opens a region
** with autocast off. Regions nest (32 deep); pop closes the innermost. recompute and
** checkpointed loops re-run a function under the autocast it first ran in. */
MG_API mg_status   mg_autocast_push  (mg_dtype dt);
MG_API void        mg_autocast_pop   (void);
MG_API mg_dtype    mg_autocast_dtype (void);       /* MG_FLOAT32 when off */
MG_API int         mg_autocast_depth (void);       /* regions open */
/* the oneDNN ISA that runs dt products here ("avx512_core_bf16",
** "avx512_core_amx"), or NULL when this CPU has no such dot products
** (bfloat16 products are then emulated: correct, slower than float32) */
MG_API const char *mg_half_isa       (mg_dtype dt);
/* does this CPU have AVX512-FP16 (where float16 autocast is allowed)? */
MG_API bool        mg_cpu_has_float16 (void);
/* allow float16 regions on CPUs without AVX512-FP16 (this thread's
** context); returns the previous setting */
MG_API bool        mg_autocast_emulate_float16 (bool on);

/* Saved-tensor hooks (PyTorch's saved_tensors_hooks): while pushed, each
** tensor a tape saves for the backward goes through pack, and the node
** keeps what pack returns (a float16 copy, a tensor over a file); when the
** backward needs it, unpack gives back a tensor of the dtype and shape it
** had. Not for variables' values (variables hold those anyway), nor for the
** inputs of recompute and custom gradients (they need the tensors
** themselves). ud is released when the last node packed with it goes. */
typedef struct mg_saved_hooks {
  mg_tensor *(*pack)   (void *ud, mg_tensor *t);                   /* new ref; NULL: error */
  mg_tensor *(*unpack) (void *ud, mg_tensor *packed, mg_dtype dt); /* new ref; NULL: error */
  void       (*release)(void *ud);                                  /* may be NULL */
} mg_saved_hooks;
MG_API mg_status mg_saved_hooks_push (const mg_saved_hooks *h, void *ud);
MG_API void      mg_saved_hooks_pop  (void);
/* ready to push: saved activations as float16 or bfloat16 (about half
** the bytes, at their rounding), or in files of a directory, mapped */
MG_API const mg_saved_hooks mg_hooks_float16, mg_hooks_bfloat16, mg_hooks_offload;
/* the ud for mg_hooks_offload: dir's spill file (made on the first spill and
** unlinked at once, so nothing is left behind; its space is reused by every
** push for dir, and kept, at the most spilled at once, while the process
** runs); mg_spill_release_idle closes the files nothing is spilled in */
MG_API void     *mg_hooks_offload_dir (const char *dir);
MG_API void      mg_spill_release_idle (void);

/* Checkpointed loops (Griewank's Revolve): mg_checkpoint_loop runs
** state = step(state, i) for i = 1..steps as one node on the tapes, which
** holds `snapshots` states (the first among them) and the state before the
** last step. Every gradient through it reverses the steps from the last,
** running step i again under a local tape from the state before it, which
** comes from the nearest snapshot; the schedule re-runs the fewest steps
** there are for steps and snapshots (mg_revolve_recomputed). Re-runs get
** the random state the step had, mg_is_recomputing() true; mg_is_in_loop()
** is true in every step. Gradients equal the plain tape's bit for bit. */
typedef enum mg_loop_phase {
  MG_LOOP_FORWARD,               /* the loop's own run */
  MG_LOOP_RERUN,                 /* advancing from a snapshot, in the backward */
  MG_LOOP_TAPED                  /* under the local tape whose gradient is taken */
} mg_loop_phase;
typedef struct mg_loop_fn {
  const char *name;              /* for messages: "checkpoint_loop", "rk4" */
  /* appends state i (n tensors, each of in[j]'s shape and dtype) to out,
  ** from state i - 1 in in[0..n); runs with the tapes paused, or under a
  ** local tape (MG_LOOP_TAPED) */
  mg_status (*step)    (void *ud, int64_t i, mg_loop_phase phase, int n,
                        mg_tensor *const *in, mg_list *out);
  void      (*release) (void *ud);   /* frees ud, with the node; may be NULL */
} mg_loop_fn;
/* out gets state `steps` (state itself when steps is 0); ud belongs to
** the call, as mg_custom_call's */
MG_API mg_status mg_checkpoint_loop (const mg_loop_fn *fn, void *ud, int n,
                                     mg_tensor *const *state, int64_t steps, int snapshots,
                                     mg_list *out);
/* the steps a gradient of n steps with k snapshots re-runs besides its n
** taped ones: r n - C(k + r, k + 1) - (n - 1), r the least with
** C(k + r, k) >= n; -1 + error for n < 0 or k < 1 */
MG_API int64_t   mg_revolve_recomputed (int64_t n, int64_t k);

/* }============================================================== */


/* {============ files: safetensors, IDX and CSV datasets ========== */
/* (src/io/) Errors name the function, the file and the problem:
** "load_safetensors: 'w.safetensors': the header length 4096 runs past the
** end of the file (120 bytes; truncated, or not a safetensors file?)".
** Files are regular files: the readers refuse a FIFO (without waiting for a
** writer) or a device, and a save refuses one as its target ("is a FIFO,
** not a regular file") rather than rename over it. */

/* safetensors (Hugging Face's format): an 8-byte little-endian header
** length, a JSON header {"name": {"dtype": "F32", "shape": [2,3],
** "data_offsets": [begin, end]}, "__metadata__": {"key": "value"}}, then
** the raw little-endian bytes. Dtypes: F32 F64 I64 BOOL F16 BF16. The
** header lists the tensors in the order given (unique names, UTF-8). The
** write is atomic: a temporary file beside path, fsync, rename; a failure
** or a crash leaves the previous file as it was, and the new file keeps
** the permissions of the one it replaces. nmeta pairs of strings go in
** "__metadata__" (0 and NULLs for none). */
MG_API mg_status mg_save_safetensors (const char *path, int n, const char *const *names,
                                      mg_tensor *const *tensors, int nmeta,
                                      const char *const *meta_keys,
                                      const char *const *meta_values);
/* what mg_load_safetensors returns: the tensors in the header's order,
** which the struct owns (mg_tensor_retain one to keep it) */
typedef struct mg_named_tensors {
  int n;
  char **names;
  mg_tensor **tensors;
  int nmeta;                                 /* "__metadata__" */
  char **meta_keys, **meta_values;
} mg_named_tensors;
/* Reads every tensor, or none: the header is checked whole first (JSON,
** no NUL in any string, dtypes, shapes against offsets, offsets that tile
** the data with no gap or overlap, unique names); NULL + error on any
** problem. */
MG_API mg_named_tensors *mg_load_safetensors (const char *path);
MG_API void              mg_named_tensors_free (mg_named_tensors *f);   /* NULL is fine */

/* An IDX file (MNIST's format: magic 0x0000TTDD for type and dimensions,
** 0x00000803 for images, then big-endian 32-bit sizes, then
** u8/i8/i16/i32/f32/f64 big-endian elements), gzipped or not. Values are
** kept (pixels 0..255): dtype -1 gives int64 for 1-D files of u8, i8 or
** i16 (labels), float32 for those with more dimensions (images), int64
** for i32, float32 for f32, float64 for f64; any other dtype but bool
** converts to it. */
MG_API mg_tensor *mg_read_idx (const char *path, int dtype);

/* A CSV file of numbers, gzipped or not: x (rows, columns) and, when a
** label column is named, y (rows), as Keras' make_csv_dataset(label_name=):
**
**   mg_csv_column want[2] = {{"sepal_length", 0}, {NULL, 3}};   // by name, by number
**   mg_csv_options o = {.ncolumns = 2, .columns = want, .label = {"species", 0},
**                       .label_dtype = MG_INT64};
**   mg_csv_table *t = mg_read_csv_table("iris.csv", &o);       // NULL + error
**   ... t->x (rows, 2) float32, t->y (rows) int64, t->names[0] "sepal_length"
**   mg_csv_table_free(t);
**
** Fields are split at the delimiter, quoted as RFC 4180 within a line
** ("a,b" is one field, "" a quote in it), trimmed of spaces and tabs; blank
** lines, \r before \n and a UTF-8 byte order mark are skipped. The header,
** the first line that is not blank, is detected (header 0: a first line
** none of whose fields is a number, a line after it), or asked for (1), or
** refused (-1). Its fields name the columns, kept as written (repeated or
** empty names too; picking a name that two columns share is an error).
** The columns picked must hold numbers (strtod's syntax); the others may
** hold anything. An int64 label takes exact integers: digits to 2^63, or
** whole numbers (3.0, 1e3) to 2^53. An empty or non-numeric field, a row
** with another number of fields than the header (or the first row), an
** open quote or a NUL byte is an error naming the file, the line and the
** column; on the first line it asks whether a header was meant. A zeroed
** struct (or NULL) gives the defaults: ',', detected header, float32,
** every column in x, no label. */
typedef struct mg_csv_column {
  const char *name;                          /* a name of the header, or NULL and: */
  int64_t number;                            /* the column's position, from 1 (as the messages count) */
} mg_csv_column;
typedef struct mg_csv_options {
  char delimiter;                            /* 0: ',' */
  int header;                                /* 0: detected, 1: the first line is one, -1: none */
  mg_dtype dtype;                            /* x's: MG_FLOAT32 (0) or MG_FLOAT64 */
  int ncolumns;                              /* x's columns in this order (repeats allowed); */
  const mg_csv_column *columns;              /*   0: every column but the label */
  mg_csv_column label;                       /* y's column; {NULL, 0}: no y */
  mg_dtype label_dtype;                      /* y's: MG_FLOAT32 (0), MG_FLOAT64 or MG_INT64 */
} mg_csv_options;
/* what mg_read_csv_table returns; it owns all (mg_tensor_retain to keep one) */
typedef struct mg_csv_table {
  mg_tensor *x;                              /* (rows, ncols) */
  mg_tensor *y;                              /* (rows), or NULL without a label */
  int64_t ncols;
  char **names;                              /* x's columns' names; NULL without a header */
  char *label_name;                          /* y's; NULL without a header or a label */
} mg_csv_table;
MG_API mg_csv_table *mg_read_csv_table (const char *path, const mg_csv_options *opts);
MG_API void          mg_csv_table_free (mg_csv_table *t);          /* NULL is fine */
/* x alone (a label is refused: it needs mg_read_csv_table) */
MG_API mg_tensor    *mg_read_csv (const char *path, const mg_csv_options *opts);

/* }============================================================== */


/* {=================== exchange without copies ==================== */
/* A tensor over a host's buffer, as torch.from_blob: no byte is copied.
** strides in elements (NULL: contiguous); release(ud) runs when the last
** tensor viewing the buffer goes, or at once when this fails. The buffer
** must stay valid and unchanged until then (tensors are immutable); its
** bytes are not this allocator's: stats count them as external_bytes. */
MG_API mg_tensor *mg_from_blob (void *data, const int64_t *shape, int ndim,
                                const int64_t *strides, mg_dtype dt,
                                void (*release)(void *ud), void *ud);

/* DLPack (dlpack/dlpack.h, Debian's libdlpack-dev), the exchange format of
** NumPy, PyTorch and JAX, on CPU memory. mg_to_dlpack shares t's data and
** holds a reference until the consumer calls the deleter. mg_from_dlpack
** takes over m (its deleter runs when the last tensor viewing the data
** goes, or at once when the layout is refused); it refuses other devices
** and dtypes with m left to the caller. bool travels as uint8. */
struct DLManagedTensor;
MG_API struct DLManagedTensor *mg_to_dlpack   (mg_tensor *t);
MG_API mg_tensor              *mg_from_dlpack (struct DLManagedTensor *m);

/* }============================================================== */


/* {=========================== memory =========================== */
/* Live bytes are split by role: a storage held by a variable counts as
** variable bytes, one saved by a tape node as saved bytes, one a running
** gradient holds (gradients in flight, the results it is summing) as
** gradient bytes, any other as tensor bytes. Freed storages kept for reuse
** count as cached bytes. */

typedef struct mg_memory_stats {
  size_t current_bytes, peak_bytes;          /* tensor + gradient + saved + variable */
  size_t tensor_bytes, saved_bytes, variable_bytes;
  size_t gradient_bytes;                     /* held by a gradient while it runs */
  size_t peak_saved_bytes;
  size_t cached_bytes;                       /* freed, kept for reuse */
  size_t cache_limit;                        /* at most this many; 0 under AddressSanitizer */
  size_t external_bytes;                     /* host buffers and mapped files tensors view */
  size_t graph_bytes;                        /* the tapes' records of ops (nodes), apart from
                                                the tensors they hold: a tape that is garbage
                                                holds them until its host collects it */
  int64_t live_tensors, live_storages;
  int64_t allocations;                       /* storages created, ever */
  size_t allocated_bytes;                    /* their bytes, ever */
  size_t budget;                             /* the memory budget in force; 0: none */
  int64_t evictions, rematerialisations;     /* under a budget, ever */
  size_t evicted_bytes, rematerialised_bytes;
  /* what peak_bytes was made of: the roles' bytes when current_bytes last reached it */
  size_t at_peak_tensor_bytes, at_peak_gradient_bytes, at_peak_saved_bytes, at_peak_variable_bytes;
} mg_memory_stats;

MG_API mg_memory_stats mg_memory_stats_get (void);
/* bytes ever allocated (cheaper than the stats: a host paces its collector by it) */
MG_API size_t          mg_memory_allocated_bytes (void);
MG_API void            mg_memory_reset_peak (void);
/* A dry run (mg.memory.estimate): between begin and end, ops whose result
** is a float tensor allocate it and skip their kernel, so a step runs
** with every allocation it makes and no arithmetic, and the counters see
** its bytes (blocks above malloc's mmap threshold are never touched:
** counted, not resident). Ops with integer or bool results, and views,
** run as usual (their values may steer the step). Variables keep their
** values: assignments and the optimizers' steps allocate what they would
** and write nothing. recompute's checks of values are off. The peak
** counters start from the current bytes at begin; end returns the stats
** as they stand (the run's peak and its parts) and puts back the peak in
** force before. Dry runs do not nest (begin fails). site (may be NULL)
** names the host's place making each storage of the run, as a number from
** 1 (0: none), so that mg_dry_run_saved_by_site(site) gives the bytes made
** there that the tapes held when they held the most (peak_saved_bytes; by
** Lua line, from Lua). Valid until the next dry run begins. */
MG_API mg_status       mg_dry_run_begin (int (*site)(void *ud), void *ud);
MG_API mg_memory_stats mg_dry_run_end   (void);
MG_API int             mg_dry_running   (void);
/* computes for real inside a dry run (a layer building its weights there):
** pause returns whether one was running, resume takes that back */
MG_API int             mg_dry_run_pause  (void);
MG_API void            mg_dry_run_resume (int was);
MG_API size_t          mg_dry_run_saved_by_site (int site);
MG_API void            mg_memory_release_cache (void);             /* free() what is cached */
/* at most min(bytes, 16 MiB + a quarter of the most bytes ever live) wait for reuse,
** the longest-waiting evicted first; default 256 MiB, 0: no cache.
** Returns the limit set before */
MG_API size_t          mg_memory_set_cache_limit (size_t bytes);
/* for timelines: change(ud) runs on every change of the byte counts, and
** span(name, begin, ud) when a phase ("backward", "recompute") begins and
** ends; NULL for none */
MG_API void            mg_memory_set_hooks (void (*change)(void *ud),
                                            void (*span)(const char *name, int begin, void *ud),
                                            void *ud);
MG_API void            mg_memory_span (const char *name, int begin);
/* called at safe points of long C computations (between the nodes of a
** backward walk, where the walk holds everything it uses): lets a host
** with a garbage collector (the Lua binding) collect dead tensors; ud is
** passed to it. Returns the previous ud, for a host to put back when its
** nested uses end */
MG_API void           *mg_memory_set_pressure_hook (void (*pressure)(void *ud), void *ud);
/* for tests: the n-th allocation from now fails as if out of memory (0: off);
** the environment variable MOONGRAD_FAIL_ALLOC=n does it from the start */
MG_API void            mg_memory_fail_after (int64_t n);

/* A memory budget (Dynamic Tensor Rematerialization, Kirisame et al. 2021):
** when an allocation would take the live bytes over it, saved tensors that
** only tapes hold and that an elementwise op or matmul made are evicted, the
** cheapest to rebuild per byte and per step of staleness first, and rebuilt
** (recursively, by running their ops again) when a backward rule needs
** them: the same gradients bit for bit, in less memory. Variables' values,
** tensors the caller still holds and leaves (data, random masks) stay. An
** allocation the budget cannot hold even with everything evictable gone
** fails, evicting nothing: "memory budget 40.00 MiB is below the 52.00 MiB
** that must stay live ...". 0: no budget. Returns the previous one. */
MG_API size_t          mg_memory_set_budget (size_t bytes);
/* the budget in force: the least of the context's and its tapes' (those
** recording or being walked); 0: none */
MG_API size_t          mg_memory_budget (void);
/* a budget for the ops t records and its gradients (0: none) */
MG_API mg_status       mg_tape_set_budget (mg_tape *t, size_t bytes);
/* what a budget runs before it gives up: the host frees its garbage (the
** Lua binding collects), which may let tensors go that it pinned; ud is
** passed to it. Returns the previous ud, as mg_memory_set_pressure_hook */
MG_API void           *mg_memory_set_collect_hook (void (*collect)(void *ud), void *ud);

/* }============================================================== */


/* {================== Lua binding (mgL_*) ======================= */
/* Only this section speaks of Lua; include lua.h before using it. */

struct lua_State;

#define MG_TENSOR_MT    "moongrad.Tensor"
#define MG_VARIABLE_MT  "moongrad.Variable"
#define MG_TAPE_MT      "moongrad.Tape"

/* a tensor or a variable's value (borrowed), or a Lua error naming arg */
MG_API mg_tensor *mgL_checktensor (struct lua_State *L, int arg);
MG_API mg_tensor *mgL_testtensor  (struct lua_State *L, int arg);   /* NULL if not one */
/* push a new userdata taking over the caller's reference; NULL raises mg_errmsg() */
MG_API void       mgL_pushtensor  (struct lua_State *L, mg_tensor *t);
/* raise mg_errmsg() as a Lua error */
MG_API int        mgL_error       (struct lua_State *L);

MG_API int luaopen_moongrad (struct lua_State *L);

/* }============================================================== */

#ifdef __cplusplus
}
#endif

#endif

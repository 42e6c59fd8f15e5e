/*
** dnn.h — oneDNN's engine, stream and primitives, one set per thread (made
** on first use, freed when the thread ends). A primitive descriptor costs
** 100 us or more to make and a training step reuses the same few, so they
** are kept, keyed by the caller's bytes: what it computes, the shapes and
** the thread count (oneDNN sizes its work to the threads at creation).
** Used by conv.c (convolution, pooling) and gemm.c (the matmul primitive,
** the inner product's weight gradient).
*/
#ifndef MG_DNN_H
#define MG_DNN_H

#include <dnnl.h>

#include "ops/op.h"

/* what a primitive computes: the first field of every key */
enum { MG_DNN_CONV_FWD, MG_DNN_CONV_BWD_DATA, MG_DNN_CONV_BWD_WEIGHTS, MG_DNN_POOL_FWD, MG_DNN_POOL_BWD,
       MG_DNN_MATMUL, MG_DNN_MATMUL_BATCHED, MG_DNN_IP_BWD_WEIGHTS };

#define MG_DNN_KEY_BYTES 160
#define MG_DNN_PRIMS 256                /* all go when full: convolutions and matmul shapes share them */
#define MG_DNN_ARGS 6                   /* a primitive's arguments and its scratchpad, at most */

/* a primitive made for one key, with a reorder of its weights (conv.c)
** where it wants them in another layout */
typedef struct mg_dnn_prim {
  uint64_t hash;                    /* of key: a lookup compares these first */
  unsigned char key[MG_DNN_KEY_BYTES];
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t p;
  dnnl_primitive_desc_t wpd;        /* the weights to the primitive's layout (or back); NULL: the same */
  dnnl_primitive_t wp;
  size_t wbytes, scratch;           /* bytes of the reordered weights, of the scratchpad */
  dnnl_memory_t mem[MG_DNN_ARGS];   /* p's arguments (and scratchpad), made on the first run: */
  dnnl_memory_t wmem[MG_DNN_ARGS];  /* later runs only point them at new buffers; wp's */
} mg_dnn_prim;

typedef struct mg_dnn {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  int n;
  mg_dnn_prim p[MG_DNN_PRIMS];
} mg_dnn;

/* this thread's state; NULL + error (naming fn) */
mg_dnn      *mg_dnn_get     (const char *fn);
/* the primitive made for key (n bytes, no padding), or NULL */
mg_dnn_prim *mg_dnn_find    (mg_dnn *d, const void *key, size_t n);
/* an empty entry to fill, with room for `more` after it (all go when full:
** a backward descriptor made with its forward one as a hint goes with it) */
mg_dnn_prim *mg_dnn_slot    (mg_dnn *d, int more);
/* e (from mg_dnn_slot, its pd made): the primitive and its scratchpad's
** size; on success e is kept under key */
dnnl_status_t mg_dnn_finish (mg_dnn *d, mg_dnn_prim *e, const void *key, size_t n);
void         mg_dnn_destroy (mg_dnn_prim *e);
/* attributes asking for a scratchpad the caller passes (moongrad's
** counted memory); NULL when out of memory */
dnnl_primitive_attr_t mg_dnn_user_scratchpad (void);
mg_status    mg_dnn_fail    (const char *fn, const char *what, dnnl_status_t st);
/* runs primitive p (of descriptor pd) on ptrs[i] as args[i], with a
** scratchpad of `scratch` bytes when it needs one, and waits for it;
** mems (n + 1 of them, its entry's mem or wmem) keeps the memory objects
** from run to run (making them took 0.5 us of a 1.5-us product) */
mg_status    mg_dnn_execute (const char *fn, mg_dnn *d, const_dnnl_primitive_desc_t pd, dnnl_primitive_t p,
                             size_t scratch, int n, const int *args, void *const *ptrs, dnnl_memory_t *mems);

#endif

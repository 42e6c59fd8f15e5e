/*
** dnn.c — oneDNN's per-thread engine, stream and primitive cache (dnn.h).
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dnn.h"

static _Thread_local mg_dnn *thread_dnn;
static pthread_key_t dnn_key;
static pthread_once_t dnn_once = PTHREAD_ONCE_INIT;

void mg_dnn_destroy (mg_dnn_prim *e) {
  for (int i = 0; i < MG_DNN_ARGS; i++) {
    if (e->mem[i]) dnnl_memory_destroy(e->mem[i]);
    if (e->wmem[i]) dnnl_memory_destroy(e->wmem[i]);
  }
  if (e->wp) dnnl_primitive_destroy(e->wp);
  if (e->wpd) dnnl_primitive_desc_destroy(e->wpd);
  if (e->p) dnnl_primitive_destroy(e->p);
  if (e->pd) dnnl_primitive_desc_destroy(e->pd);
  memset(e, 0, sizeof *e);
}

static void dnn_flush (mg_dnn *d) {
  for (int i = 0; i < d->n; i++) mg_dnn_destroy(&d->p[i]);
  d->n = 0;
}

static void dnn_free (void *ud) {          /* when the thread ends */
  mg_dnn *d = (mg_dnn *)ud;
  if (d == NULL) return;
  dnn_flush(d);
  if (d->stream) dnnl_stream_destroy(d->stream);
  if (d->engine) dnnl_engine_destroy(d->engine);
  free(d);
}

static void dnn_key_make (void) { pthread_key_create(&dnn_key, dnn_free); }

mg_status mg_dnn_fail (const char *fn, const char *what, dnnl_status_t st) {
  return mg_seterror("%s: oneDNN failed to %s (status %d)", fn, what, (int)st);
}

mg_dnn *mg_dnn_get (const char *fn) {
  if (thread_dnn) return thread_dnn;
  mg_dnn *d = (mg_dnn *)calloc(1, sizeof *d);
  if (d == NULL) return mg_seterror("%s: out of memory", fn), NULL;
  dnnl_status_t st = dnnl_engine_create(&d->engine, dnnl_cpu, 0);
  if (st == dnnl_success) st = dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags);
  if (st != dnnl_success) {
    dnn_free(d);
    return mg_dnn_fail(fn, "make a CPU engine", st), NULL;
  }
  pthread_once(&dnn_once, dnn_key_make);
  pthread_setspecific(dnn_key, d);
  return thread_dnn = d;
}

/* key's n bytes, zero-padded to the entries' size; returns their hash */
static uint64_t key_fill (unsigned char *k, const void *key, size_t n) {
  memset(k, 0, MG_DNN_KEY_BYTES);
  memcpy(k, key, n);
  uint64_t h = 0, w;
  for (size_t i = 0; i < MG_DNN_KEY_BYTES; i += sizeof w) {
    memcpy(&w, k + i, sizeof w);
    h = (h ^ w) * UINT64_C(0x9E3779B97F4A7C15);
  }
  return h;
}

mg_dnn_prim *mg_dnn_find (mg_dnn *d, const void *key, size_t n) {
  unsigned char k[MG_DNN_KEY_BYTES];
  uint64_t h = key_fill(k, key, n);
  for (int i = 0; i < d->n; i++)
    if (d->p[i].hash == h && memcmp(d->p[i].key, k, MG_DNN_KEY_BYTES) == 0) return &d->p[i];
  return NULL;
}

mg_dnn_prim *mg_dnn_slot (mg_dnn *d, int more) {
  if (d->n + more >= MG_DNN_PRIMS) dnn_flush(d);
  mg_dnn_prim *e = &d->p[d->n];
  memset(e, 0, sizeof *e);
  return e;
}

dnnl_status_t mg_dnn_finish (mg_dnn *d, mg_dnn_prim *e, const void *key, size_t n) {
  dnnl_status_t st = dnnl_primitive_create(&e->p, e->pd);
  const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
  e->scratch = sp ? dnnl_memory_desc_get_size(sp) : 0;
  if (st != dnnl_success) return st;
  e->hash = key_fill(e->key, key, n);
  d->n++;
  return st;
}

dnnl_primitive_attr_t mg_dnn_user_scratchpad (void) {
  dnnl_primitive_attr_t attr = NULL;
  if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
  dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  return attr;
}

mg_status mg_dnn_execute (const char *fn, mg_dnn *d, const_dnnl_primitive_desc_t pd, dnnl_primitive_t p,
                          size_t scratch, int n, const int *args, void *const *ptrs, dnnl_memory_t *mems) {
  mg_storage *sp = scratch ? mg_storage_new(scratch) : NULL;
  if (scratch && sp == NULL) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s for oneDNN's scratchpad", mg_errmsg_raw());
    return mg_seterror("%s", msg);
  }
  dnnl_exec_arg_t a[MG_DNN_ARGS] = {{0, NULL}};
  int used = sp ? n + 1 : n;
  dnnl_status_t st = dnnl_success;
  for (int i = 0; i < used && st == dnnl_success; i++) {
    a[i].arg = i < n ? args[i] : DNNL_ARG_SCRATCHPAD;
    void *ptr = i < n ? ptrs[i] : sp->data;
    if (mems[i] == NULL)
      st = dnnl_memory_create(&mems[i], dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, a[i].arg),
                              d->engine, ptr);
    else
      st = dnnl_memory_set_data_handle(mems[i], ptr);
    a[i].memory = mems[i];
  }
  if (st == dnnl_success) st = dnnl_primitive_execute(p, d->stream, used, a);
  if (st == dnnl_success) st = dnnl_stream_wait(d->stream);
  mg_storage_release(sp);
  return st == dnnl_success ? MG_OK : mg_dnn_fail(fn, "run", st);
}

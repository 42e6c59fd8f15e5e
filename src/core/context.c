/*
** context.c — the one place the library keeps state.
**
** A context holds what the library remembers between calls: the last
** error, a block of tensor ids, the pools of freed tensor headers, the
** memory counters and reuse cache, the random streams and the active tapes
** (the struct is in core.h). The current context is thread-local:
** each thread gets its own on first use, so two threads (say, two Lua
** states on two threads of a game engine) train independently and exactly
** as each would alone, with no locks on the hot path. A host may make
** contexts of its own and switch between them with mg_context_use.
**
** Objects (tensors, storages, tapes) belong to the context that made them
** and go back to it when released; like a Lua state, a context and its
** objects are used by one thread at a time.
*/
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#define DEFAULT_CACHE_LIMIT ((size_t)256 << 20)
#define ID_BLOCK ((uint64_t)1 << 20)              /* ids a context takes at a time */
#define INIT_STREAM_KEY 0x6A09E667F3BCC908ULL      /* the initializers' random stream */
#define DEFAULT_SEED 0x2545F4914F6CDD1DULL

_Thread_local mg_context *mg_current_context;
static _Thread_local mg_context *thread_default;

/* ids are unique in the whole process, so a tape never confuses tensors
** of two contexts: contexts take them from a shared counter in blocks */
static atomic_uint_fast64_t next_block = 1;

uint64_t mg_new_id (void) {
  mg_context *c = mg_ctx();
  if (c->ids.next == c->ids.end) {
    c->ids.next = (uint64_t)atomic_fetch_add(&next_block, ID_BLOCK);
    c->ids.end = c->ids.next + ID_BLOCK;
  }
  return c->ids.next++;
}

static void init (mg_context *c) {
  memset(c, 0, sizeof *c);
  c->memory.cache_limit = DEFAULT_CACHE_LIMIT;
  c->memory.fail_countdown = -1;
  c->rng.main = (mg_rng_state){DEFAULT_SEED, 0};
  c->rng.init = (mg_rng_state){DEFAULT_SEED ^ INIT_STREAM_KEY, 0};
  mg_pace_init(&c->pace);
}

mg_context *mg_context_new (void) {
  mg_context *c = (mg_context *)malloc(sizeof(mg_context));
  if (c == NULL) return mg_seterror("out of memory making a context"), NULL;
  init(c);
  return c;
}

/* what a context holds that is not any object's: its pools and caches */
static void release_pools (mg_context *c) {
  mg_context *was = mg_current_context;
  mg_current_context = c;
  for (int i = 0; i < c->autocast.ncache; i++) {     /* autocast's casts (a region left open) */
    mg_tensor_release(c->autocast.cache[i].value);
    mg_tensor_release(c->autocast.cache[i].half);
  }
  mg_tensor_release(c->autocast.last.value);
  mg_tensor_release(c->autocast.last.half);
  free(c->autocast.cache);
  c->autocast = (mg_autocast_state){0};
  free(c->dry.saved);                                 /* a dry run's counters by site */
  free(c->dry.peak_saved_by);
  c->dry.saved = c->dry.peak_saved_by = NULL;
  c->dry.nsites = 0;
  mg_memory_release_cache();
  mg_memory_release_small();
  mg_current_context = was;
  for (int i = 0; i < c->tensors.npool; i++) free(c->tensors.pool[i]);
  c->tensors.npool = 0;
  if (c->hooks.release) c->hooks.release(c);
  if (c->pressure) c->pressure->release(c);
  mg_pace_release(&c->pace);
}

void mg_context_free (mg_context *c) {
  if (c == NULL) return;
  if (mg_current_context == c) mg_current_context = thread_default;
  release_pools(c);
  free(c);
}

mg_context *mg_context_use (mg_context *c) {
  mg_context *was = mg_ctx();
  mg_current_context = c ? c : thread_default;
  return was;
}

mg_context *mg_context_current (void) { return mg_ctx(); }

/* {================= each thread's own context ================= */

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

/* a thread that used the library ends: its context goes with it */
static void thread_ends (void *p) {
  mg_context *c = (mg_context *)p;
  if (mg_current_context == c) mg_current_context = NULL;
  thread_default = NULL;
  release_pools(c);
  free(c);
}

static void make_key (void) { pthread_key_create(&key, thread_ends); }

/* Out of memory for a context of its own, a thread shares this one; it
** only happens when nothing else would work either. */
static mg_context emergency;

mg_context *mg_context_default (void) {
  if (thread_default == NULL) {
    mg_context *c = (mg_context *)malloc(sizeof(mg_context));
    if (c == NULL) {
      if (emergency.memory.cache_limit == 0) init(&emergency);
      return mg_current_context = &emergency;
    }
    init(c);
    pthread_once(&key_once, make_key);
    pthread_setspecific(key, c);
    thread_default = c;
  }
  if (mg_current_context == NULL) mg_current_context = thread_default;
  return mg_current_context;
}

/* }========================================================== */

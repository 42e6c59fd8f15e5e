/*
** memory.c — the one allocator for tensor memory, and its counters.
**
** Every storage is created here, so what mg_memory_stats reports is measured,
** not estimated. A storage's bytes sit in exactly one role counter: variable
** (some variable's value), saved (held by a tape node for backward) or
** tensor (anything else alive). Roles change as tapes and variables take and
** drop references, so the counters follow what holds the memory right now.
**
** Freed storages wait in a cache keyed by their exact size, because a
** training loop asks for the same sizes every step: reuse skips malloc,
** free and the page faults of fresh memory. Cached bytes are counted apart
** (cached_bytes), never as live, and the cache is capped (see cache_put).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moongrad_impl.h"

#define ALIGNMENT 64
#define CACHE_BUCKETS 256
#define DEFAULT_CACHE_LIMIT ((size_t)256 << 20)

static struct {
  size_t role_bytes[MG_ROLE__COUNT];
  size_t current, peak, peak_saved;
  int64_t live_storages, allocations;
  size_t allocated;                         /* bytes ever allocated */
  void (*hook)(void *ud);
  void (*span)(const char *name, int begin, void *ud);
  void *hook_ud;
  void (*pressure)(void);
  mg_storage *cache[CACHE_BUCKETS];        /* free storages by size; next in ->data's first word */
  size_t cached, cache_limit;
} M = {.cache_limit = DEFAULT_CACHE_LIMIT};

/* {====================== small objects ====================== */
/* Tape nodes and tapes come and go at the rate of ops: freed blocks wait
** on a free list per 64-byte size class instead of going back to malloc. */

#define SMALL_CLASSES 16                /* up to 1 KiB */
#define SMALL_KEEP 4096                 /* blocks kept per class */

static struct { void *head; int n; } small[SMALL_CLASSES];

void *mg_small_alloc (size_t size) {
  if (mg_alloc_should_fail()) return NULL;
  size_t c = (size + 63) / 64 - 1;
  if (c < SMALL_CLASSES && small[c].head) {
    void *p = small[c].head;
    small[c].head = *(void **)p;
    small[c].n--;
    return p;
  }
  return malloc(c < SMALL_CLASSES ? (c + 1) * 64 : size);
}

void mg_small_free (void *p, size_t size) {
  if (p == NULL) return;
  size_t c = (size + 63) / 64 - 1;
  if (MG_POOLS && c < SMALL_CLASSES && small[c].n < SMALL_KEEP) {
    *(void **)p = small[c].head;
    small[c].head = p;
    small[c].n++;
    return;
  }
  free(p);
}

/* }========================================================== */


/* {========================= the cache ====================== */
/* A freed storage keeps its block; a bucket holds a list of them, linked
** through a pointer stored in the (unused) data. Sizes that share a bucket
** are told apart by nbytes. */

static size_t bucket_of (size_t nbytes) {
  return (size_t)((nbytes * 0x9E3779B97F4A7C15ULL) >> 56) % CACHE_BUCKETS;
}

static mg_storage **next_of (mg_storage *s) { return (mg_storage **)s->data; }

static mg_storage *cache_take (size_t nbytes) {
  for (mg_storage **p = &M.cache[bucket_of(nbytes)]; *p; p = next_of(*p)) {
    if ((*p)->nbytes != nbytes) continue;
    mg_storage *s = *p;
    *p = *next_of(s);
    M.cached -= nbytes;
    return s;
  }
  return NULL;
}

/* the cache holds at most 16 MiB plus a quarter of the peak, and never
** more than the limit set: spare blocks in proportion to the workload */
static bool cache_put (mg_storage *s) {
  if (!MG_POOLS) return false;
  size_t cap = ((size_t)16 << 20) + M.peak / 4;
  if (cap > M.cache_limit) cap = M.cache_limit;
  if (M.cached + s->nbytes > cap) return false;
  mg_storage **head = &M.cache[bucket_of(s->nbytes)];
  *next_of(s) = *head;
  *head = s;
  M.cached += s->nbytes;
  return true;
}

void mg_memory_release_cache (void) {
  for (int b = 0; b < CACHE_BUCKETS; b++)
    while (M.cache[b]) {
      mg_storage *s = M.cache[b];
      M.cache[b] = *next_of(s);
      free(s);
    }
  M.cached = 0;
}

void mg_memory_set_cache_limit (size_t bytes) {
  M.cache_limit = bytes;
  if (M.cached > bytes) mg_memory_release_cache();
}

/* }========================================================== */

extern int64_t mg_live_tensors;   /* kept by tensor.c */

static void notify (void) {
  if (M.hook) M.hook(M.hook_ud);
}

static mg_role role_of (const mg_storage *s) {
  if (s->var_refs > 0) return MG_ROLE_VARIABLE;
  if (s->tape_refs > 0) return MG_ROLE_SAVED;
  return MG_ROLE_TENSOR;
}

/* moves s's bytes to the counter of the role its references give it now */
static void update_role (mg_storage *s) {
  mg_role r = role_of(s);
  if (r == s->role) return;
  M.role_bytes[s->role] -= s->nbytes;
  M.role_bytes[r] += s->nbytes;
  s->role = r;
  if (M.role_bytes[MG_ROLE_SAVED] > M.peak_saved) M.peak_saved = M.role_bytes[MG_ROLE_SAVED];
  notify();
}

static const char *human_bytes (char *buf, size_t n, double bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) { bytes /= 1024; u++; }
  snprintf(buf, n, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

/*
** A storage of nbytes with its data 64-byte aligned, header and data in one
** block. Fails with "out of memory allocating ..." rather than aborting.
*/
mg_storage *mg_storage_new (size_t nbytes) {
  if (mg_alloc_should_fail()) {
    char buf[32];
    mg_seterror("out of memory allocating %s (injected failure)", human_bytes(buf, sizeof buf, (double)nbytes));
    return NULL;
  }
  mg_storage *s = cache_take(nbytes);
  if (s != NULL) goto ready;
  /* at least a pointer of data, for the cache's link */
  size_t total = sizeof(mg_storage) + ALIGNMENT + (nbytes < sizeof(void *) ? sizeof(void *) : nbytes);
  if (nbytes > ((size_t)1 << 46) || total < nbytes) {   /* 64 TiB: no machine has it */
    char buf[32];
    mg_seterror("out of memory allocating %s", human_bytes(buf, sizeof buf, (double)nbytes));
    return NULL;
  }
  s = (mg_storage *)malloc(total);
  if (s == NULL) {
    mg_memory_release_cache();                /* and try once more */
    s = (mg_storage *)malloc(total);
  }
  if (s == NULL) {
    char buf[32];
    mg_seterror("out of memory allocating %s", human_bytes(buf, sizeof buf, (double)nbytes));
    return NULL;
  }
  uintptr_t p = (uintptr_t)(s + 1);
  p = (p + ALIGNMENT - 1) & ~(uintptr_t)(ALIGNMENT - 1);
  s->data = (void *)p;
ready:
  s->refcount = 1;
  s->tape_refs = s->var_refs = 0;
  s->role = MG_ROLE_TENSOR;
  s->nbytes = nbytes;
  s->bucket = nbytes;
  M.role_bytes[MG_ROLE_TENSOR] += nbytes;
  M.current += nbytes;
  if (M.current > M.peak) M.peak = M.current;
  M.live_storages++;
  M.allocations++;
  M.allocated += nbytes;
  notify();
  return s;
}

void mg_storage_release (mg_storage *s) {
  if (s == NULL || --s->refcount > 0) return;
  mg_assert(s->tape_refs == 0 && s->var_refs == 0);
  M.role_bytes[s->role] -= s->nbytes;
  M.current -= s->nbytes;
  M.live_storages--;
  if (!cache_put(s)) free(s);
  notify();
}

/* a tape node (tape_delta) or a variable (var_delta) took or dropped s */
void mg_storage_add_refs (mg_storage *s, int tape_delta, int var_delta) {
  s->tape_refs += tape_delta;
  s->var_refs += var_delta;
  mg_assert(s->tape_refs >= 0 && s->var_refs >= 0);
  update_role(s);
}

size_t mg_memory_allocated_bytes (void) { return M.allocated; }

mg_memory_stats mg_memory_stats_get (void) {
  mg_memory_stats st;
  memset(&st, 0, sizeof st);
  st.current_bytes = M.current;
  st.peak_bytes = M.peak;
  st.tensor_bytes = M.role_bytes[MG_ROLE_TENSOR];
  st.saved_bytes = M.role_bytes[MG_ROLE_SAVED];
  st.variable_bytes = M.role_bytes[MG_ROLE_VARIABLE];
  st.peak_saved_bytes = M.peak_saved;
  st.cached_bytes = M.cached;
  st.cache_limit = MG_POOLS ? M.cache_limit : 0;
  st.live_tensors = mg_live_tensors;
  st.live_storages = M.live_storages;
  st.allocations = M.allocations;
  st.allocated_bytes = M.allocated;
  return st;
}

void mg_memory_reset_peak (void) {
  M.peak = M.current;
  M.peak_saved = M.role_bytes[MG_ROLE_SAVED];
}

void mg_memory_set_hooks (void (*change)(void *ud), void (*span)(const char *, int, void *),
                          void *ud) {
  M.hook = change;
  M.span = span;
  M.hook_ud = ud;
}

void mg_memory_set_pressure_hook (void (*pressure)(void)) {
  M.pressure = pressure;
}

void mg_memory_safe_point (void) {
  if (M.pressure) M.pressure();
}

/* {================= allocation-failure injection ============= */
/* For tests: the n-th allocation from now (storages, tensor headers, tape
** nodes and tapes) fails as if memory had run out, so a spec can check that
** every failure is a clean error. MOONGRAD_FAIL_ALLOC=n sets it at start. */

static int64_t fail_countdown = -1;           /* -1: not read from the environment yet */

void mg_memory_fail_after (int64_t n) {
  fail_countdown = n > 0 ? n : 0;
}

bool mg_alloc_should_fail (void) {
  if (fail_countdown < 0) {
    const char *e = getenv("MOONGRAD_FAIL_ALLOC");
    fail_countdown = e ? strtoll(e, NULL, 10) : 0;
    if (fail_countdown < 0) fail_countdown = 0;
  }
  if (fail_countdown == 0) return false;
  return --fail_countdown == 0;
}

/* }========================================================== */

void mg_memory_span (const char *name, int begin) {
  if (M.span) M.span(name, begin, M.hook_ud);
}

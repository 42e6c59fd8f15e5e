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

#include "core/core.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(p, n)  ((void)(p), (void)(n))
#endif

#define ALIGNMENT 64
#define CACHE_BUCKETS MG_CACHE_BUCKETS

/* the current context's counters and caches (the state is in context.c) */
static inline mg_memory_state *mem (void) { return &mg_ctx()->memory; }

/* {====================== small objects ====================== */
/* Tape nodes and tapes come and go at the rate of ops: freed blocks wait
** on a free list per 64-byte size class instead of going back to malloc. */

#define SMALL_CLASSES MG_SMALL_CLASSES
#define SMALL_KEEP 4096                 /* blocks kept per class */

void *mg_small_alloc (size_t size) {
  if (mg_alloc_should_fail()) return NULL;
  size_t c = (size + 63) / 64 - 1;
  mg_memory_state *m = mem();
  if (c < SMALL_CLASSES && m->small[c].head) {
    void *p = m->small[c].head;
    m->small[c].head = *(void **)p;
    m->small[c].n--;
    m->graph += size;
    return p;
  }
  void *p = malloc(c < SMALL_CLASSES ? (c + 1) * 64 : size);
  if (p != NULL) m->graph += size;
  return p;
}

void mg_small_free (void *p, size_t size) {
  if (p == NULL) return;
  size_t c = (size + 63) / 64 - 1;
  mg_memory_state *m = mem();
  m->graph -= size;
  if (MG_POOLS && c < SMALL_CLASSES && m->small[c].n < SMALL_KEEP) {
    *(void **)p = m->small[c].head;
    m->small[c].head = p;
    m->small[c].n++;
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

static void unlink_age (mg_memory_state *m, mg_storage *s) {
  if (s->older) s->older->newer = s->newer; else m->oldest = s->newer;
  if (s->newer) s->newer->older = s->older; else m->newest = s->older;
}

/* takes s, found at *p in its bucket, out of the cache */
static mg_storage *cache_remove (mg_memory_state *m, mg_storage **p) {
  mg_storage *s = *p;
  *p = *next_of(s);
  if (*p) (*p)->in_bucket = p;
  unlink_age(m, s);
  m->cached -= s->nbytes;
  return s;
}

static mg_storage *cache_take (mg_memory_state *m, size_t nbytes) {
  for (mg_storage **p = &m->cache[bucket_of(nbytes)]; *p; p = next_of(*p))
    if ((*p)->nbytes == nbytes) return cache_remove(m, p);
  return NULL;
}

/* in O(1): a bucket of thousands of same-size blocks (a 1,000-step loop's
** small tensors) made each eviction a walk to the bucket's far end, and
** 75% of a neural ODE's plain step */
static void cache_evict_oldest (mg_memory_state *m) {
  free(cache_remove(m, m->oldest->in_bucket));
}

/*
** The cache holds at most 16 MiB plus half the most bytes ever live, and
** never more than the limit set. A block that does not fit makes room by
** evicting the blocks that came back longest ago: a training step frees
** its activations in the backward and asks for the same sizes again in the
** next forward, while sizes a script used once (loading, a first step)
** would otherwise fill the cache for good. (Refusing the newcomer instead
** left a CNN step 280,000 page faults a run: its activations came back
** from the kernel zeroed each step. A quarter of the most live left the
** CNN step under autocast 1,500 faults a step, 40% of its time on a
** virtual machine; half leaves 500.)
*/
static bool cache_put (mg_memory_state *m, mg_storage *s) {
  if (!MG_POOLS) return false;
  size_t cap = ((size_t)16 << 20) + m->high / 2;
  if (cap > m->cache_limit) cap = m->cache_limit;
  if (s->nbytes > cap) return false;
  while (m->cached + s->nbytes > cap) cache_evict_oldest(m);
  mg_storage **head = &m->cache[bucket_of(s->nbytes)];
  *next_of(s) = *head;
  if (*head) (*head)->in_bucket = next_of(s);
  *head = s;
  s->in_bucket = head;
  s->older = m->newest;
  s->newer = NULL;
  if (m->newest) m->newest->newer = s; else m->oldest = s;
  m->newest = s;
  m->cached += s->nbytes;
  return true;
}

void mg_memory_release_cache (void) {
  mg_memory_state *m = mem();
  while (m->oldest) cache_evict_oldest(m);
}

void mg_memory_release_small (void) {
  mg_memory_state *m = mem();
  for (int c = 0; c < SMALL_CLASSES; c++)
    while (m->small[c].head) {
      void *p = m->small[c].head;
      m->small[c].head = *(void **)p;
      free(p);
    }
  memset(m->small, 0, sizeof m->small);
}

size_t mg_memory_set_cache_limit (size_t bytes) {
  mg_memory_state *m = mem();
  size_t before = m->cache_limit;
  m->cache_limit = bytes;
  if (m->cached > bytes) mg_memory_release_cache();
  return before;
}

/* }========================================================== */


static void notify (mg_memory_state *m) {
  if (m->hook) m->hook(m->hook_ud);
}

static mg_role role_of (const mg_storage *s) {
  int r = MG_ROLE__COUNT - 1;
  while (r > MG_ROLE_TENSOR && s->holds[r] == 0) r--;
  return (mg_role)r;
}

/* moves s's bytes to the counter of the role its references give it now */
static void update_role (mg_storage *s) {
  mg_role r = role_of(s);
  if (r == s->role || s->external) return;
  mg_memory_state *m = &s->ctx->memory;
  m->role_bytes[s->role] -= s->nbytes;
  m->role_bytes[r] += s->nbytes;
  if (s->site > 0 && s->ctx->dry.on && s->site <= s->ctx->dry.nsites &&
      (r == MG_ROLE_SAVED || s->role == MG_ROLE_SAVED))
    s->ctx->dry.saved[s->site] += r == MG_ROLE_SAVED ? s->nbytes : (size_t)0 - s->nbytes;
  s->role = r;
  if (m->role_bytes[MG_ROLE_SAVED] > m->peak_saved) {
    m->peak_saved = m->role_bytes[MG_ROLE_SAVED];
    mg_dry_state *d = &s->ctx->dry;
    if (d->on && d->nsites > 0) memcpy(d->peak_saved_by, d->saved, sizeof(size_t) * (size_t)(d->nsites + 1));
  }
  notify(m);
}

const char *mg_human_bytes (char *buf, size_t n, double bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) { bytes /= 1024; u++; }
  snprintf(buf, n, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

static mg_storage *out_of_memory (size_t nbytes, const char *why) {
  char buf[32];
  mg_seterror("out of memory allocating %s%s", mg_human_bytes(buf, sizeof buf, (double)nbytes), why);
  return NULL;
}

/* a fresh block: the header, then the data 64-byte aligned */
static mg_storage *fresh_block (size_t nbytes) {
  /* at least a pointer of data, for the cache's link */
  size_t total = sizeof(mg_storage) + ALIGNMENT + (nbytes < sizeof(void *) ? sizeof(void *) : nbytes);
  if (nbytes > ((size_t)1 << 46) || total < nbytes) return NULL;   /* 64 TiB: no machine has it */
  mg_storage *s = (mg_storage *)malloc(total);
  if (s == NULL) {
    mg_memory_release_cache();                /* and try once more */
    s = (mg_storage *)malloc(total);
  }
  if (s == NULL) return NULL;
  uintptr_t p = (uintptr_t)(s + 1);
  p = (p + ALIGNMENT - 1) & ~(uintptr_t)(ALIGNMENT - 1);
  s->data = (void *)p;
  /* the alignment's slack on either side of the data is inside the malloc
  ** block, where AddressSanitizer sees no overflow: poisoned, a kernel that
  ** writes past its output is caught (up to 64 bytes of it went unseen, and
  ** corrupted the heap only where malloc's addresses left no slack) */
  ASAN_POISON_MEMORY_REGION(s + 1, p - (uintptr_t)(s + 1));
  ASAN_POISON_MEMORY_REGION((char *)p + nbytes, (size_t)((char *)s + total - ((char *)p + nbytes)));
  return s;
}

/* a storage made in a dry run: the place that made it, its counter grown
** to hold it (a site it cannot count stays 0) */
static void dry_note (mg_context *c, mg_storage *s) {
  int site = c->dry.site ? c->dry.site(c->dry.site_ud) : 0;
  if (site <= 0) return;
  if (site > c->dry.nsites) {
    int n = site + 64;
    size_t *a = (size_t *)realloc(c->dry.saved, sizeof(size_t) * (size_t)(n + 1));
    if (a != NULL) c->dry.saved = a;
    size_t *b = a ? (size_t *)realloc(c->dry.peak_saved_by, sizeof(size_t) * (size_t)(n + 1)) : NULL;
    if (b != NULL) c->dry.peak_saved_by = b;
    if (a == NULL || b == NULL) return;
    memset(a + c->dry.nsites + 1, 0, sizeof(size_t) * (size_t)(n - c->dry.nsites));
    memset(b + c->dry.nsites + 1, 0, sizeof(size_t) * (size_t)(n - c->dry.nsites));
    c->dry.nsites = n;
  }
  s->site = site;
}

/* a new storage s of nbytes in context c: its fields and the live
** counters; `allocated` only counts what this allocator allocated */
static mg_storage *count_new (mg_context *c, mg_storage *s, size_t nbytes, bool ours) {
  mg_memory_state *m = &c->memory;
  s->ctx = c;
  s->refcount = 1;
  memset(s->holds, 0, sizeof s->holds);
  s->role = MG_ROLE_TENSOR;
  s->nbytes = nbytes;
  s->bucket = nbytes;
  s->external = !ours;
  s->site = 0;
  s->unwritten = false;
  s->release = NULL;
  s->release_ud = NULL;
  if (!ours) {                     /* not memory of ours: counted apart, in no role */
    m->external += nbytes;
    return s;
  }
  m->role_bytes[MG_ROLE_TENSOR] += nbytes;
  m->current += nbytes;
  if (c->dry.on) dry_note(c, s);
  if (m->current > m->peak) {
    m->peak = m->current;
    memcpy(m->peak_roles, m->role_bytes, sizeof m->peak_roles);
  }
  if (m->current > m->high) m->high = m->current;
  m->live_storages++;
  m->allocations++;
  m->allocated += nbytes;
  notify(m);
  return s;
}

/*
** A storage of nbytes, counted in the current context. Fails with "out of
** memory allocating ..." rather than aborting.
*/
mg_storage *mg_storage_new (size_t nbytes) {
  if (mg_alloc_should_fail()) return out_of_memory(nbytes, " (injected failure)");
  mg_context *c = mg_ctx();
  if (c->pressure && c->pressure->make_room(nbytes) != MG_OK) return NULL;   /* a budget: evict first */
  mg_memory_state *m = &c->memory;
  mg_storage *s = cache_take(m, nbytes);
  if (s == NULL && (s = fresh_block(nbytes)) == NULL) return out_of_memory(nbytes, "");
  return count_new(c, s, nbytes, true);
}


/* back to the context that made it: its counters, its cache */
void mg_storage_release (mg_storage *s) {
  if (s == NULL || --s->refcount > 0) return;
  mg_assert(role_of(s) == MG_ROLE_TENSOR);
  mg_memory_state *m = &s->ctx->memory;
  if (s->external) {                          /* a host's buffer goes back to the host */
    m->external -= s->nbytes;
    if (s->release) s->release(s->release_ud);
    free(s);
    return;
  }
  m->role_bytes[s->role] -= s->nbytes;
  m->current -= s->nbytes;
  m->live_storages--;
  if (!cache_put(m, s)) {
    free(s);
  }
  notify(m);
}

mg_storage *mg_storage_wrap (void *data, size_t nbytes, void (*release)(void *ud), void *ud) {
  if (mg_alloc_should_fail()) return out_of_memory(sizeof(mg_storage), " (injected failure)");
  mg_storage *s = (mg_storage *)malloc(sizeof(mg_storage));
  if (s == NULL) return out_of_memory(sizeof(mg_storage), "");
  count_new(mg_ctx(), s, nbytes, false);
  s->data = data;
  s->release = release;
  s->release_ud = ud;
  return s;
}

/* a holder in role (a variable, a tape node, a gradient's walk) took or
** dropped s */
void mg_storage_hold (mg_storage *s, mg_role role, int delta) {
  s->holds[role] += delta;
  mg_assert(s->holds[role] >= 0);
  update_role(s);
}

size_t mg_memory_allocated_bytes (void) { return mem()->allocated; }

mg_memory_stats mg_memory_stats_get (void) {
  mg_memory_state *m = mem();
  mg_memory_stats st;
  memset(&st, 0, sizeof st);
  st.current_bytes = m->current;
  st.peak_bytes = m->peak;
  st.tensor_bytes = m->role_bytes[MG_ROLE_TENSOR];
  st.saved_bytes = m->role_bytes[MG_ROLE_SAVED];
  st.variable_bytes = m->role_bytes[MG_ROLE_VARIABLE];
  st.gradient_bytes = m->role_bytes[MG_ROLE_GRADIENT];
  st.peak_saved_bytes = m->peak_saved;
  st.at_peak_tensor_bytes = m->peak_roles[MG_ROLE_TENSOR];
  st.at_peak_gradient_bytes = m->peak_roles[MG_ROLE_GRADIENT];
  st.at_peak_saved_bytes = m->peak_roles[MG_ROLE_SAVED];
  st.at_peak_variable_bytes = m->peak_roles[MG_ROLE_VARIABLE];
  st.cached_bytes = m->cached;
  st.cache_limit = MG_POOLS ? m->cache_limit : 0;
  st.external_bytes = m->external;
  st.graph_bytes = m->graph;
  st.live_tensors = mg_ctx()->tensors.live;
  st.live_storages = m->live_storages;
  st.allocations = m->allocations;
  st.allocated_bytes = m->allocated;
  if (mg_ctx()->pressure) mg_ctx()->pressure->stats(&st);
  return st;
}

void mg_memory_reset_peak (void) {
  mg_memory_state *m = mem();
  m->peak = m->current;
  m->peak_saved = m->role_bytes[MG_ROLE_SAVED];
  memcpy(m->peak_roles, m->role_bytes, sizeof m->peak_roles);
}

/* A dry run uses the allocator as the step would, with the kernels
** skipped: fresh blocks above malloc's mmap threshold are never touched, so
** the step's bytes are counted without being there. Its peak is its own:
** the one in force before comes back after (raised to the bytes live then:
** let the dry run's tensors go before its end, as estimate does). */
mg_status mg_dry_run_begin (int (*site)(void *ud), void *ud) {
  mg_context *c = mg_ctx();
  if (c->dry.on) return mg_seterror("estimate: a dry run is running already (estimates do not nest)");
  mg_memory_state *m = &c->memory;
  c->dry.on = true;
  c->dry.site = site;
  c->dry.site_ud = ud;
  if (c->dry.nsites > 0) {
    memset(c->dry.saved, 0, sizeof(size_t) * (size_t)(c->dry.nsites + 1));
    memset(c->dry.peak_saved_by, 0, sizeof(size_t) * (size_t)(c->dry.nsites + 1));
  }
  c->dry.peak = m->peak;
  c->dry.peak_saved = m->peak_saved;
  memcpy(c->dry.peak_roles, m->peak_roles, sizeof m->peak_roles);
  mg_memory_reset_peak();
  return MG_OK;
}

mg_memory_stats mg_dry_run_end (void) {
  mg_context *c = mg_ctx();
  mg_memory_stats st = mg_memory_stats_get();
  if (!c->dry.on) return st;
  mg_memory_state *m = &c->memory;
  c->dry.on = false;
  c->dry.site = NULL;
  m->peak = c->dry.peak > m->current ? c->dry.peak : m->current;
  m->peak_saved = c->dry.peak_saved;
  memcpy(m->peak_roles, c->dry.peak_roles, sizeof m->peak_roles);
  return st;
}

int mg_dry_running (void) { return mg_ctx()->dry.on; }

int mg_dry_run_pause (void) {
  mg_context *c = mg_ctx();
  int was = c->dry.on;
  c->dry.on = false;
  return was;
}

void mg_dry_run_resume (int was) { mg_ctx()->dry.on = was != 0; }

size_t mg_dry_run_saved_by_site (int site) {
  mg_context *c = mg_ctx();
  return site > 0 && site <= c->dry.nsites ? c->dry.peak_saved_by[site] : 0;
}

void mg_memory_set_hooks (void (*change)(void *ud), void (*span)(const char *, int, void *),
                          void *ud) {
  mg_memory_state *m = mem();
  m->hook = change;
  m->span = span;
  m->hook_ud = ud;
}

void *mg_memory_set_pressure_hook (void (*pressure)(void *ud), void *ud) {
  mg_memory_state *m = mem();
  void *was = m->pressure_ud;
  m->pressure = pressure;
  m->pressure_ud = ud;
  return was;
}

void mg_memory_safe_point (void) {
  mg_memory_state *m = mem();
  if (m->pressure) m->pressure(m->pressure_ud);
}

/* {================= allocation-failure injection ============= */
/* For tests: the n-th allocation from now (storages, tensor headers, tape
** nodes and tapes) fails as if memory had run out, so a spec can check that
** every failure is a clean error. MOONGRAD_FAIL_ALLOC=n sets it at start. */

void mg_memory_fail_after (int64_t n) {
  mg_memory_state *m = mem();
  m->fail_countdown = n > 0 ? n : 0;
}

bool mg_alloc_fail_slow (void) {
  mg_memory_state *m = mem();
  int64_t *left = &m->fail_countdown;      /* -1: not read from the environment yet */
  if (*left < 0) {
    const char *e = getenv("MOONGRAD_FAIL_ALLOC");
    *left = e ? strtoll(e, NULL, 10) : 0;
    if (*left < 0) *left = 0;
  }
  if (*left == 0) return false;
  return --*left == 0;
}

/* }========================================================== */

void mg_memory_span (const char *name, int begin) {
  mg_memory_state *m = mem();
  if (m->span) m->span(name, begin, m->hook_ud);
}

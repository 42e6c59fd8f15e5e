/*
** memory.c — the one allocator for tensor memory, and its counters.
**
** Every storage is created here, so what mg_memory_stats reports is measured,
** not estimated. A storage's bytes sit in exactly one role counter: variable
** (some variable's value), saved (held by a tape node for backward) or
** tensor (anything else alive). Roles change as tapes and variables take and
** drop references, so the counters follow what holds the memory right now.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moongrad_impl.h"

#define ALIGNMENT 64

static struct {
  size_t role_bytes[MG_ROLE__COUNT];
  size_t current, peak, peak_saved;
  int64_t live_storages, allocations;
  size_t allocated;                         /* bytes ever allocated */
  void (*hook)(void *ud);
  void (*span)(const char *name, int begin, void *ud);
  void *hook_ud;
  void (*pressure)(void);
} M;

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
  size_t total = sizeof(mg_storage) + ALIGNMENT + nbytes;
  if (nbytes > ((size_t)1 << 46) || total < nbytes) {   /* 64 TiB: no machine has it */
    char buf[32];
    mg_seterror("out of memory allocating %s", human_bytes(buf, sizeof buf, (double)nbytes));
    return NULL;
  }
  mg_storage *s = (mg_storage *)malloc(total);
  if (s == NULL) {
    char buf[32];
    mg_seterror("out of memory allocating %s", human_bytes(buf, sizeof buf, (double)nbytes));
    return NULL;
  }
  uintptr_t p = (uintptr_t)(s + 1);
  p = (p + ALIGNMENT - 1) & ~(uintptr_t)(ALIGNMENT - 1);
  s->data = (void *)p;
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
  if (M.pressure) M.pressure();
  return s;
}

void mg_storage_release (mg_storage *s) {
  if (s == NULL || --s->refcount > 0) return;
  mg_assert(s->tape_refs == 0 && s->var_refs == 0);
  M.role_bytes[s->role] -= s->nbytes;
  M.current -= s->nbytes;
  M.live_storages--;
  free(s);
  notify();
}

/* a tape node (tape_delta) or a variable (var_delta) took or dropped s */
void mg_storage_add_refs (mg_storage *s, int tape_delta, int var_delta) {
  s->tape_refs += tape_delta;
  s->var_refs += var_delta;
  mg_assert(s->tape_refs >= 0 && s->var_refs >= 0);
  update_role(s);
}

mg_memory_stats mg_memory_stats_get (void) {
  mg_memory_stats st;
  memset(&st, 0, sizeof st);
  st.current_bytes = M.current;
  st.peak_bytes = M.peak;
  st.tensor_bytes = M.role_bytes[MG_ROLE_TENSOR];
  st.saved_bytes = M.role_bytes[MG_ROLE_SAVED];
  st.variable_bytes = M.role_bytes[MG_ROLE_VARIABLE];
  st.peak_saved_bytes = M.peak_saved;
  st.cached_bytes = 0;
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

void mg_memory_release_cache (void) {
  /* nothing is cached yet */
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

void mg_memory_span (const char *name, int begin) {
  if (M.span) M.span(name, begin, M.hook_ud);
}

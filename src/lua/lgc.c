/*
** lgc.c — pacing Lua's collector by tensor bytes.
**
** Lua's collector sees a tensor as a few bytes of userdata, not the
** megabytes behind it, so garbage tensors would pile up between its cycles
** and inflate the peak well past what is live. mgL_gc_pressure paces
** collections by tensor bytes instead, at the safe points the binding
** offers (before each op makes its result, between the nodes of a
** backward walk):
**   - once tensor bytes allocated since the last collection exceed
**     (pause - 100)% of the most bytes live lately (and at least
**     min_bytes), a young collection runs: in Lua's generational mode (set
**     when the module opens) it costs in proportion to the objects made
**     since, and most garbage tensors are young: the temporaries of the
**     last ops. It runs before the op's result box exists, while the op's
**     arguments are still in use, so a temporary that one op makes and the
**     next uses is young when it dies; one that lives across two
**     collections turns old, and only a full collection finds it;
**   - a full collection runs when two things hold. The tensor bytes no
**     tape, gradient or variable holds (with the bytes of the tapes'
**     records) have grown by the allowance over their floor: old garbage
**     can only be there (last step's gradients, a layer's input, a dropped
**     tape), not in what tapes saved or a gradient holds. And all the bytes
**     but the variables' stand above the most that was known live in the
**     last step (top): below it, garbage cannot raise the peak over the
**     live set's, and a forward pass whose old garbage stays under it pays
**     no full collection at all (one before the gradient finds it all);
**   - a full collection walks the whole Lua heap (300 us for the library's
**     own 360 KiB with the caches cold), so full collections take at most
**     a quarter of the time (GC_FULL_SHARE) on average: a script that keeps
**     a big data set in Lua tables trades some of the peak's tightness for
**     speed instead of paying one per op.
** So the peak stays close to the live set's: bench/timeliness.lua measures
** it against a collection before every allocation, and the time against
** the old pacing.
*/
#include <math.h>
#include <string.h>
#include <time.h>

#include "lbinding.h"

#define GC_PAUSE 110                         /* percent */
#define GC_MIN_BYTES MGL_GC_MIN_BYTES
/* A full collection walks the whole Lua heap: a script that keeps its data
** set in Lua tables (100,000 words) paid 8 ms for each, dozens a step, and
** trained 4x slower. Full collections may take this share of the time, on
** average (see may_run_full), and come this many in a row. */
#define GC_FULL_SHARE 25                     /* percent */
#define GC_FULL_BURST 4
#define HIGH_HALFLIFE 8

/* The pacing is the Lua state's (mgL_state's gc): its collections find its
** garbage only. Its counters are the context's, shared by the states on
** one thread unless the host gives each a context of its own. */
void mgL_gc_init (mgL_gc *gc) {
  memset(gc, 0, sizeof *gc);
  gc->pause = GC_PAUSE;
  gc->min_bytes = GC_MIN_BYTES;
}

void mgL_gc_setpause (mgL_gc *gc, int pause, size_t min_bytes) {
  gc->pause = pause;
  gc->min_bytes = min_bytes;
  gc->allowance = gc->floor = 0;   /* re-derive at the next allocation */
  gc->credit = gc->credited_at = gc->last_full = gc->top = gc->top_now = 0;
}

static double clock_seconds (clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* this thread's CPU time, for the full collections' share: a busy machine
** that preempts the collector makes its wall time, and so the share, swing
** from run to run, and the peaks with it. It is a system call (0.5 us), so
** young collections (2-4 us, every few ops) are timed by the monotonic
** clock (25 ns): for a + b on 1000 elements the CPU clock took 7% of the op. */
static double seconds (void) { return clock_seconds(CLOCK_THREAD_CPUTIME_ID); }
static double wall_seconds (void) { return clock_seconds(CLOCK_MONOTONIC); }

static size_t allowance_for (const mgL_gc *gc, size_t live) {
  size_t grow = live / 100 * (size_t)(gc->pause - 100);
  return grow > gc->min_bytes ? grow : gc->min_bytes;
}

/* What garbage can hold that only a full collection may find: tensors no
** tape, no gradient and no variable holds, and the records of tapes (a tape
** dropped after it lived across a few collections is old; its nodes stay
** until a full one, and a loop that records and drops tapes piled up 700 MB). */
static size_t loose (const mg_memory_stats *st) { return st->tensor_bytes + st->graph_bytes; }

/* all the bytes but the variables' */
static size_t total (const mg_memory_stats *st) { return loose(st) + st->saved_bytes + st->gradient_bytes; }

/* After a collection: the next one once allowance bytes more are
** allocated. Garbage is measured against what is live besides the
** variables (the model's weights must not buy its activations room for
** garbage), at its most lately: within a step the live set swings, and the
** allowance of its low points would collect after every op, which makes
** every tensor that lives across two ops old (a young collection then
** misses it). The most decays by half each HIGH_HALFLIFE x itself of
** allocation, so a smaller model after a big one gets tight peaks again.
** What is known live: all of it after a full collection, what tapes saved
** and gradients hold after a young one. */
static void repace (mgL_gc *gc, const mg_memory_stats *st, bool full) {
  size_t live = st->tensor_bytes + st->saved_bytes + st->gradient_bytes;
  double since = (double)(st->allocated_bytes - gc->mark);
  gc->high = gc->high > 0 ? gc->high * exp2(-since / (HIGH_HALFLIFE * gc->high)) : 0;
  if ((double)live > gc->high) gc->high = (double)live;
  double known = (double)(full ? total(st) : st->saved_bytes + st->gradient_bytes);
  if (known > gc->top_now) gc->top_now = known;
  gc->mark = st->allocated_bytes;
  gc->allowance = allowance_for(gc, (size_t)gc->high);
  if (full || loose(st) < gc->floor) gc->floor = loose(st);
}

/* Each second of other work earns share / (100 - share) seconds of full
** collections, saved up to GC_FULL_BURST times the last one's length: so
** they take at most their share over time, while the few a step needs
** (the one before its gradient above all) may come close together. */
static bool may_run_full (mgL_gc *gc, double now) {
  gc->credit += (now - gc->credited_at) * GC_FULL_SHARE / (100 - GC_FULL_SHARE);
  gc->credited_at = now;
  if (gc->credit > GC_FULL_BURST * gc->last_full) gc->credit = GC_FULL_BURST * gc->last_full;
  return gc->credit >= 0;
}

/* a full collection, paid from the credit; st holds the counters from just
** before it, and gets those from after */
static void collect_full (lua_State *L, mgL_gc *gc, mg_memory_stats *st) {
  gc->full++;
  double start = seconds();
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCSTEP, 0);
  double end = seconds();
  *st = mg_memory_stats_get();
  gc->seconds += end - start;
  gc->last_full = end - start;
  gc->credit -= gc->last_full;
  gc->credited_at = end;
}

/* Garbage that would raise the peak: loose bytes over their floor by the
** allowance, while all the bytes stand over the last step's top (by half
** the allowance: a full collection that would find a few percent of the
** live set is not worth its walk of the heap). */
static bool wants_full (const mgL_gc *gc, const mg_memory_stats *st) {
  if (gc->pause == 100) return true;
  return loose(st) > gc->floor + gc->allowance &&
         (double)total(st) > fmax(gc->top, gc->top_now) + (double)(gc->allowance / 2);
}

void mgL_gc_step (lua_State *L, mgL_state *S) {
  mgL_gc *gc = &S->gc;
  gc->collecting = true;
  double start = wall_seconds();
  lua_gc(L, LUA_GCSTEP, 0);      /* a young collection; finalizers run at a step */
  gc->young++;
  gc->seconds += wall_seconds() - start;
  mg_memory_stats st = mg_memory_stats_get();
  bool full = wants_full(gc, &st) && (gc->pause == 100 || may_run_full(gc, seconds()));
  if (full) collect_full(L, gc, &st);
  gc->collecting = false;
  repace(gc, &st, full);
}

/* A gradient is about to walk a tape: the forward pass's boxes are garbage
** by now, most of them old (each lived across several ops), and each pins
** a tensor the walk will let go of. One full collection here finds them
** all, so the walk frees as it goes. Where the tape saved no more than
** the allowance, the garbage boxes cannot pin more than the pacing lets
** pile up anyway, and a small gradient (the seed chain: a few microseconds)
** does not pay for a walk of the heap. It keeps to the share as the others
** do: a script with a big Lua heap that takes many small gradients would
** pay a full collection for each. A gradient also ends the step whose top
** the next one measures against. */
void mgL_gc_before_gradient (lua_State *L, mgL_state *S) {
  mgL_gc *gc = &S->gc;
  if (mgL_running(S) != NULL || gc->pause == 100) return;
  gc->top = gc->top_now;
  gc->top_now = 0;
  mg_memory_stats st = mg_memory_stats_get();
  if (loose(&st) + st.saved_bytes <= gc->allowance || !may_run_full(gc, seconds())) return;   /* little to find */
  collect_full(L, gc, &st);
  repace(gc, &st, true);
}

/* While a gradient runs, the walk is C code that never returns to Lua, yet
** the forward pass's garbage boxes still pin tensors the tape has let go
** of: collect from the allocator then, on the thread that asked for the
** gradient (the only one it is safe to run finalizers on). */
void mgL_gc_safe_point (void *ud) {
  mgL_state *S = (mgL_state *)ud;
  lua_State *L = S ? mgL_running(S) : NULL;
  if (L != NULL) mgL_gc_pressure(L, S);
}

/* a budget about to fail: garbage boxes may pin tensors it could evict */
void mgL_gc_for_budget (void *ud) {
  mgL_state *S = (mgL_state *)ud;
  lua_State *L = S ? mgL_running(S) : NULL;
  if (L == NULL && S != NULL && S->anchor != NULL) L = S->main;   /* not after lua_close began */
  if (L) lua_gc(L, LUA_GCCOLLECT);
}

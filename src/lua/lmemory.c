/*
** lmemory.c — mg.memory (the allocator's counters) and mg.random.
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
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lbinding.h"

#define GC_PAUSE 110                         /* percent */
#define GC_MIN_BYTES ((size_t)256 << 10)
/* A full collection walks the whole Lua heap: a script that keeps its data
** set in Lua tables (100,000 words) paid 8 ms for each, dozens a step, and
** trained 4x slower. Full collections may take this share of the time, on
** average (see may_run_full), and come this many in a row. */
#define GC_FULL_SHARE 25                     /* percent */
#define GC_FULL_BURST 4
#define HIGH_HALFLIFE 8

/* per thread, as the contexts whose bytes they pace */
static _Thread_local struct {
  int pause;                 /* percent, as lua_gc's setpause */
  size_t min_bytes;
  size_t mark;               /* allocated bytes at the last collection */
  size_t allowance;          /* bytes to allocate before the next one */
  size_t floor;              /* the fewest loose bytes (see loose) since the last full collection */
  double high;               /* the most live bytes lately (decays as bytes are allocated) */
  double top, top_now;       /* the most bytes known live (see repace) in the last step
                                (gradient to gradient) and in this one */
  double credit;             /* CPU seconds full collections may take now (see may_run_full) */
  double credited_at;        /* the CPU time credit was brought up to */
  double last_full;          /* seconds the last full one took */
  int64_t young, full;       /* collections run, for stats() */
  double seconds;            /* CPU seconds spent in them, for stats() */
} gc = {GC_PAUSE, GC_MIN_BYTES, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};

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

static size_t allowance_for (size_t live) {
  size_t grow = live / 100 * (size_t)(gc.pause - 100);
  return grow > gc.min_bytes ? grow : gc.min_bytes;
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
static void repace (const mg_memory_stats *st, bool full) {
  size_t live = st->tensor_bytes + st->saved_bytes + st->gradient_bytes;
  double since = (double)(st->allocated_bytes - gc.mark);
  gc.high = gc.high > 0 ? gc.high * exp2(-since / (HIGH_HALFLIFE * gc.high)) : 0;
  if ((double)live > gc.high) gc.high = (double)live;
  double known = (double)(full ? total(st) : st->saved_bytes + st->gradient_bytes);
  if (known > gc.top_now) gc.top_now = known;
  gc.mark = st->allocated_bytes;
  gc.allowance = allowance_for((size_t)gc.high);
  if (full || loose(st) < gc.floor) gc.floor = loose(st);
}

/* Each second of other work earns share / (100 - share) seconds of full
** collections, saved up to GC_FULL_BURST times the last one's length: so
** they take at most their share over time, while the few a step needs
** (the one before its gradient above all) may come close together. */
static bool may_run_full (double now) {
  gc.credit += (now - gc.credited_at) * GC_FULL_SHARE / (100 - GC_FULL_SHARE);
  gc.credited_at = now;
  if (gc.credit > GC_FULL_BURST * gc.last_full) gc.credit = GC_FULL_BURST * gc.last_full;
  return gc.credit >= 0;
}

/* a full collection, paid from the credit; st holds the counters from just
** before it, and gets those from after */
static void collect_full (lua_State *L, mg_memory_stats *st) {
  gc.full++;
  double start = seconds();
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCSTEP, 0);
  double end = seconds();
  *st = mg_memory_stats_get();
  gc.seconds += end - start;
  gc.last_full = end - start;
  gc.credit -= gc.last_full;
  gc.credited_at = end;
}

/* Garbage that would raise the peak: loose bytes over their floor by the
** allowance, while all the bytes stand over the last step's top (by half
** the allowance: a full collection that would find a few percent of the
** live set is not worth its walk of the heap). */
static bool wants_full (const mg_memory_stats *st) {
  if (gc.pause == 100) return true;
  return loose(st) > gc.floor + gc.allowance &&
         (double)total(st) > fmax(gc.top, gc.top_now) + (double)(gc.allowance / 2);
}

void mgL_gc_pressure (lua_State *L) {
  static _Thread_local bool collecting = false;
  if (collecting || mg_memory_allocated_bytes() - gc.mark <= gc.allowance) return;
  collecting = true;
  double start = wall_seconds();
  lua_gc(L, LUA_GCSTEP, 0);      /* a young collection; finalizers run at a step */
  gc.young++;
  gc.seconds += wall_seconds() - start;
  mg_memory_stats st = mg_memory_stats_get();
  bool full = wants_full(&st) && (gc.pause == 100 || may_run_full(seconds()));
  if (full) collect_full(L, &st);
  collecting = false;
  repace(&st, full);
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
void mgL_gc_before_gradient (lua_State *L) {
  if (mgL_running != NULL || gc.pause == 100) return;
  gc.top = gc.top_now;
  gc.top_now = 0;
  mg_memory_stats st = mg_memory_stats_get();
  if (loose(&st) + st.saved_bytes <= gc.allowance || !may_run_full(seconds())) return;   /* little to find */
  collect_full(L, &st);
  repace(&st, true);
}

/* While a gradient runs, the walk is C code that never returns to Lua, yet
** the forward pass's garbage boxes still pin tensors the tape has let go
** of: collect from the allocator then, on the thread that asked for the
** gradient (the only one it is safe to run finalizers on). */
void mgL_pressure_during_gradient (void) {
  if (mgL_running != NULL) mgL_gc_pressure(mgL_running);
}

static void setfield_int (lua_State *L, const char *k, int64_t v) {
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, k);
}

/* stats(): the counters, in bytes */
static int l_stats (lua_State *L) {
  mg_memory_stats st = mg_memory_stats_get();
  lua_createtable(L, 0, 10);
  setfield_int(L, "current_bytes", (int64_t)st.current_bytes);
  setfield_int(L, "peak_bytes", (int64_t)st.peak_bytes);
  setfield_int(L, "tensor_bytes", (int64_t)st.tensor_bytes);
  setfield_int(L, "saved_bytes", (int64_t)st.saved_bytes);
  setfield_int(L, "variable_bytes", (int64_t)st.variable_bytes);
  setfield_int(L, "gradient_bytes", (int64_t)st.gradient_bytes);
  setfield_int(L, "peak_saved_bytes", (int64_t)st.peak_saved_bytes);
  setfield_int(L, "cached_bytes", (int64_t)st.cached_bytes);
  setfield_int(L, "young_collections", gc.young);    /* run by the pacing, not by Lua */
  setfield_int(L, "full_collections", gc.full);
  lua_pushnumber(L, gc.seconds);
  lua_setfield(L, -2, "collection_seconds");
  setfield_int(L, "cache_limit", (int64_t)st.cache_limit);
  setfield_int(L, "external_bytes", (int64_t)st.external_bytes);
  setfield_int(L, "graph_bytes", (int64_t)st.graph_bytes);
  setfield_int(L, "live_tensors", st.live_tensors);
  setfield_int(L, "live_storages", st.live_storages);
  setfield_int(L, "allocations", st.allocations);
  setfield_int(L, "allocated_bytes", (int64_t)st.allocated_bytes);
  setfield_int(L, "budget", (int64_t)st.budget);
  setfield_int(L, "evictions", st.evictions);
  setfield_int(L, "evicted_bytes", (int64_t)st.evicted_bytes);
  setfield_int(L, "rematerialisations", st.rematerialisations);
  setfield_int(L, "rematerialised_bytes", (int64_t)st.rematerialised_bytes);
  return 1;
}

/* {====================== the memory budget =================== */

static _Thread_local lua_State *main_thread;   /* where the budget collects */

/* a budget about to fail: garbage boxes may pin tensors it could evict */
static void collect_for_budget (void) {
  lua_State *L = mgL_running ? mgL_running : main_thread;
  if (L) lua_gc(L, LUA_GCCOLLECT);
}

/* bytes at arg as a size: an integer, or a number with a unit ("300 MB",
** "1.5 GiB"); raises naming fn */
size_t mgL_checkbytes (lua_State *L, int arg, const char *fn) {
  if (lua_type(L, arg) == LUA_TSTRING) {
    static const struct { const char *unit; double f; } units[] = {
      {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024}, {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"", 1}};
    const char *s = lua_tostring(L, arg);
    char unit[8] = "";
    double v;
    int n = 0;
    if (sscanf(s, "%lf %7s%n", &v, unit, &n) >= 1 && v > 0)
      for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(unit, units[i].unit) == 0) return (size_t)(v * units[i].f);
    luaL_error(L, "%s: '%s' is not a size (a number of bytes, or one with a unit: B, KB, MB, GB, KiB, MiB, GiB)", fn, s);
  }
  lua_Integer n = luaL_checkinteger(L, arg);
  if (n <= 0) luaL_error(L, "%s: the budget must be positive (got %I bytes)", fn, (LUA_INTEGER)n);
  return (size_t)n;
}

static void push_budget (lua_State *L, size_t b) {
  if (b) lua_pushinteger(L, (lua_Integer)b);
  else lua_pushnil(L);
}

/* budget(): the budget in force, or nil; budget(bytes): sets the context's
** (nil or false: none) and returns the previous one */
static int l_budget (lua_State *L) {
  if (lua_gettop(L) == 0) {
    push_budget(L, mg_memory_budget());
    return 1;
  }
  mgL_checknargs(L, 1);
  size_t b = lua_isnil(L, 1) || (lua_isboolean(L, 1) && !lua_toboolean(L, 1))
               ? 0 : mgL_checkbytes(L, 1, "memory.budget");
  push_budget(L, mg_memory_set_budget(b));
  return 1;
}

/* }========================================================== */

static int l_reset_peak (lua_State *L) {
  (void)L;
  mg_memory_reset_peak();
  return 0;
}

static int l_release_cache (lua_State *L) {
  (void)L;
  mg_memory_release_cache();
  return 0;
}

/* setpause(percent [, min_bytes]): a collection once tensor bytes allocated
** since the last one exceed (percent - 100)% of the live bytes (and at
** least min_bytes; defaults 110 and 256 KiB); returns the old pair.
** setpause(100, 0) collects before every allocation: exact peaks, slowly.
** Either way the pacing starts afresh (what it learned of earlier work goes). */
static int l_setpause (lua_State *L) {
  lua_Integer p = luaL_checkinteger(L, 1);
  lua_Integer m = luaL_optinteger(L, 2, (lua_Integer)GC_MIN_BYTES);
  luaL_argcheck(L, p >= 100 && p <= 100000, 1, "pause must be between 100 and 100000 (percent)");
  luaL_argcheck(L, m >= 0, 2, "min_bytes must not be negative");
  lua_pushinteger(L, gc.pause);
  lua_pushinteger(L, (lua_Integer)gc.min_bytes);
  gc.pause = (int)p;
  gc.min_bytes = (size_t)m;
  gc.allowance = gc.floor = 0;   /* re-derive at the next allocation */
  gc.credit = gc.credited_at = gc.last_full = gc.top = gc.top_now = 0;
  return 2;
}

/* set_cache_limit(bytes): how many freed bytes may wait for reuse */
static int l_set_cache_limit (lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0, 1, "limit must not be negative");
  mg_memory_set_cache_limit((size_t)n);
  return 0;
}

/* fail_after(n): for tests, the n-th allocation from now fails as if out
** of memory (0 turns it off) */
static int l_fail_after (lua_State *L) {
  lua_Integer n = mgL_intat(L, 1, 1, "n");
  luaL_argcheck(L, n >= 0, 1, "n must not be negative");
  mg_memory_fail_after((int64_t)n);
  return 0;
}

static const luaL_Reg memory_funcs[] = {
  {"set_cache_limit", l_set_cache_limit}, {"fail_after", l_fail_after},
  {"stats", l_stats}, {"reset_peak", l_reset_peak}, {"release_cache", l_release_cache},
  {"setpause", l_setpause}, {"budget", l_budget}, {NULL, NULL}
};

void mgL_open_memory (lua_State *L) {
  mg_memory_set_pressure_hook(mgL_pressure_during_gradient);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  main_thread = lua_tothread(L, -1);
  lua_pop(L, 1);
  mg_memory_set_collect_hook(collect_for_budget);
  luaL_newlib(L, memory_funcs);
  mgL_open_trace(L);
  lua_setfield(L, -2, "memory");
}

/* {========================= random ========================= */

static int l_seed (lua_State *L) {
  mg_random_seed((uint64_t)luaL_checkinteger(L, 1));
  return 0;
}

static int l_get_state (lua_State *L) {
  mg_rng_state s = mg_random_get_state();
  lua_createtable(L, 0, 2);
  setfield_int(L, "seed", (int64_t)s.seed);
  setfield_int(L, "offset", (int64_t)s.offset);
  return 1;
}

static int l_set_state (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  static const char *const keys[] = {"seed", "offset", NULL};
  mgL_checkoptions(L, 1, keys);
  lua_getfield(L, 1, "seed");
  lua_getfield(L, 1, "offset");
  mg_rng_state s = {(uint64_t)mgL_intat(L, -2, 1, "state.seed"), (uint64_t)mgL_intat(L, -1, 1, "state.offset")};
  mg_random_set_state(s);
  return 0;
}

/* f(shape, p1, p2 [, dtype]) */
static int draw (lua_State *L, double d1, double d2,
                 mg_tensor *(*fn)(const int64_t *, int, mg_dtype, double, double)) {
  int64_t shape[MG_MAX_DIMS];
  int nd = mgL_checkshape(L, 1, shape, false);
  double p1 = luaL_optnumber(L, 2, d1), p2 = luaL_optnumber(L, 3, d2);
  mg_dtype dt = mgL_optdtype(L, 4, MG_FLOAT32);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, fn(shape, nd, dt, p1, p2));
}

static int l_uniform (lua_State *L) { return draw(L, 0.0, 1.0, mg_random_uniform); }
static int l_normal (lua_State *L) { return draw(L, 0.0, 1.0, mg_random_normal); }

/* permutation(n): 1..n shuffled (int64), from the same stream */
static int l_permutation (lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0 && n < ((lua_Integer)1 << 40), 1, "size out of range");
  int64_t shape[1] = {n};
  ltensor *box = mgL_newbox(L);
  mg_tensor *u = mg_random_uniform(shape, 1, MG_FLOAT64, 0.0, 1.0);
  mg_tensor *p = u ? mg_arange(1, (double)n + 1, 1, MG_INT64) : NULL;
  if (p) {                                   /* Fisher-Yates */
    const double *r = (const double *)mg_tensor_data(u);
    int64_t *v = (int64_t *)mg_tensor_data(p);
    for (int64_t i = n - 1; i > 0; i--) {
      int64_t j = (int64_t)(r[i] * (double)(i + 1)), tmp = v[i];
      if (j > i) j = i;
      v[i] = v[j];
      v[j] = tmp;
    }
  }
  mg_tensor_release(u);
  return mgL_fill(L, box, p);
}

/* with_init_stream(fn, ...): fn's draws come from the initializers' stream */
static int l_with_init_stream (lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  mg_random_swap_streams();
  int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  mg_random_swap_streams();
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}

static const luaL_Reg random_funcs[] = {
  {"seed", l_seed}, {"with_init_stream", l_with_init_stream}, {"get_state", l_get_state}, {"set_state", l_set_state},
  {"uniform", l_uniform}, {"normal", l_normal}, {"permutation", l_permutation}, {NULL, NULL}
};

void mgL_open_random (lua_State *L) {
  luaL_newlib(L, random_funcs);
  lua_setfield(L, -2, "random");
}

/* }========================================================== */

/*
** lmemory.c — mg.memory: the allocator's counters, the collector's pacing
** (lgc.c) as a script sees and sets it, and the memory budget.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lbinding.h"

static void setfield_int (lua_State *L, const char *k, int64_t v) {
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, k);
}

/* stats(): the counters, in bytes */
static int l_stats (lua_State *L) {
  const mgL_gc *gc = &mgL_getstate(L)->gc;
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
  setfield_int(L, "young_collections", gc->young);    /* run by the pacing, not by Lua */
  setfield_int(L, "full_collections", gc->full);
  lua_pushnumber(L, gc->seconds);
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
  mg_spill_release_idle();
  return 0;
}

/* setpause(percent [, min_bytes]): a collection once tensor bytes allocated
** since the last one exceed (percent - 100)% of the live bytes (and at
** least min_bytes; defaults 110 and 256 KiB); returns the old pair.
** setpause(100, 0) collects before every allocation: exact peaks, slowly.
** Either way the pacing starts afresh (what it learned of earlier work goes). */
static int l_setpause (lua_State *L) {
  lua_Integer p = luaL_checkinteger(L, 1);
  lua_Integer m = luaL_optinteger(L, 2, (lua_Integer)MGL_GC_MIN_BYTES);
  luaL_argcheck(L, p >= 100 && p <= 100000, 1, "pause must be between 100 and 100000 (percent)");
  luaL_argcheck(L, m >= 0, 2, "min_bytes must not be negative");
  mgL_gc *gc = &mgL_getstate(L)->gc;
  lua_pushinteger(L, gc->pause);
  lua_pushinteger(L, (lua_Integer)gc->min_bytes);
  mgL_gc_setpause(gc, (int)p, (size_t)m);
  return 2;
}

/* set_cache_limit(bytes): how many freed bytes may wait for reuse; returns
** the limit before (to put back, as set_num_threads' callers do) */
static int l_set_cache_limit (lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0, 1, "limit must not be negative");
  lua_pushinteger(L, (lua_Integer)mg_memory_set_cache_limit((size_t)n));
  return 1;
}

/* fail_after(n): for tests, the n-th allocation from now fails as if out
** of memory (0 turns it off) */
static int l_fail_after (lua_State *L) {
  lua_Integer n = mgL_intat(L, 1, 1, "n");
  luaL_argcheck(L, n >= 0, 1, "n must not be negative");
  mg_memory_fail_after((int64_t)n);
  return 0;
}

/* {=================== dry runs (moongrad.planner) ================== */

/* The places of a dry run: the Lua lines that made its storages, the
** first frame outside moongrad's own modules, so a layer's tensors go to
** the line that called the layer. Found without allocating (the
** allocator asks, from inside an op). */
#define MAX_SITES 4096
typedef struct site { char *source; int line; } site;
typedef struct sites { lua_State *L; site *s; int n; } sites;

static int site_of (void *ud) {
  sites *w = (sites *)ud;
  lua_Debug ar;
  for (int level = 0; lua_getstack(w->L, level, &ar); level++) {
    if (!lua_getinfo(w->L, "Sl", &ar) || ar.currentline < 0) continue;
    if (strncmp(ar.source, "@moongrad/", 10) == 0) continue;
    for (int i = 0; i < w->n; i++)
      if (w->s[i].line == ar.currentline && strcmp(w->s[i].source, ar.short_src) == 0) return i + 1;
    if (w->n == MAX_SITES) return 0;
    char *src = (char *)malloc(strlen(ar.short_src) + 1);
    if (src == NULL) return 0;
    strcpy(src, ar.short_src);
    w->s[w->n] = (site){src, ar.currentline};
    return ++w->n;
  }
  return 0;
}

static void free_sites (sites *w) {
  for (int i = 0; i < w->n; i++) free(w->s[i].source);
  free(w->s);
}

/* pushes {{site = "file:line", bytes = n}, ...}: what the tapes held when
** they held the most, by the line that made it */
static void push_saved_by_line (lua_State *L, const sites *w) {
  lua_createtable(L, 0, 0);
  int k = 0;
  for (int i = 0; i < w->n; i++) {
    size_t b = mg_dry_run_saved_by_site(i + 1);
    if (b == 0) continue;
    lua_createtable(L, 0, 2);
    lua_pushfstring(L, "%s:%d", w->s[i].source, w->s[i].line);
    lua_setfield(L, -2, "site");
    setfield_int(L, "bytes", (int64_t)b);
    lua_rawseti(L, -2, ++k);
  }
}

/* dry_run(f, ...): f(...) as a dry run (mg_dry_run_begin); returns the
** stats at its end (the run's peak, its parts, the tapes' most by line,
** the bytes still live once f's results and garbage are let go); f's error
** is raised after the run is closed. For moongrad.planner. */
static int l_dry_run (lua_State *L) {
  mgL_checkcallable(L, 1);
  sites w = {L, (site *)calloc(MAX_SITES, sizeof(site)), 0};
  if (w.s == NULL) return luaL_error(L, "memory.estimate: out of memory");
  if (mg_dry_run_begin(site_of, &w) != MG_OK) {
    free(w.s);
    return mgL_error(L);
  }
  int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  /* the step's results and garbage (a gradient it dropped, its tapes) go
  ** before the end, which would raise the peak to bytes never there */
  if (st == LUA_OK) lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT);
  mg_memory_stats ms = mg_dry_run_end();
  if (st != LUA_OK) {
    free_sites(&w);
    return lua_error(L);
  }
  lua_createtable(L, 0, 8);
  push_saved_by_line(L, &w);
  free_sites(&w);
  lua_setfield(L, -2, "saved_by_line");
  setfield_int(L, "peak_bytes", (int64_t)ms.peak_bytes);
  setfield_int(L, "current_bytes", (int64_t)ms.current_bytes);
  setfield_int(L, "tensor_bytes", (int64_t)ms.at_peak_tensor_bytes);
  setfield_int(L, "gradient_bytes", (int64_t)ms.at_peak_gradient_bytes);
  setfield_int(L, "saved_bytes", (int64_t)ms.at_peak_saved_bytes);
  setfield_int(L, "variable_bytes", (int64_t)ms.at_peak_variable_bytes);
  setfield_int(L, "peak_saved_bytes", (int64_t)ms.peak_saved_bytes);
  return 1;
}

/* _computing(f, ...): f(...) computed for real inside a dry run (a layer
** building its weights); its error raised after the dry run resumes */
static int l_computing (lua_State *L) {
  mgL_checkcallable(L, 1);
  int was = mg_dry_run_pause();
  int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  mg_dry_run_resume(was);
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}

/* }========================================================== */

/* dry_running(): true inside mg.memory.estimate's run of a step */
static int l_dry_running (lua_State *L) {
  mgL_checknargs(L, 0);
  lua_pushboolean(L, mg_dry_running());
  return 1;
}

/* estimate, plan, with_plan, load_plan: moongrad.planner's (the upvalue names which) */
static int l_planner (lua_State *L) {
  mgL_require(L, "moongrad.planner");
  lua_getfield(L, -1, lua_tostring(L, lua_upvalueindex(1)));
  lua_replace(L, -2);
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

static const luaL_Reg memory_funcs[] = {
  {"_dry_run", l_dry_run}, {"_computing", l_computing}, {"dry_running", l_dry_running},
  {"set_cache_limit", l_set_cache_limit}, {"fail_after", l_fail_after},
  {"stats", l_stats}, {"reset_peak", l_reset_peak}, {"release_cache", l_release_cache},
  {"setpause", l_setpause}, {"budget", l_budget}, {NULL, NULL}
};

void mgL_open_memory (lua_State *L) {
  mgL_newlib(L, memory_funcs);
  static const char *const planned[] = {"estimate", "plan", "with_plan", "load_plan"};
  for (int i = 0; i < 4; i++) {
    lua_pushstring(L, planned[i]);
    lua_pushcclosure(L, l_planner, 1);
    lua_setfield(L, -2, planned[i]);
  }
  mgL_open_trace(L);
  lua_setfield(L, -2, "memory");
}

/*
** lstate.c — mgL_state, the binding's state of one Lua state (lbinding.h):
** made, found, and let go with the state; and the gradient computations
** that run Lua callbacks on it (mgL_enter, mgL_leave).
**
** It is a userdata in the registry under the address of state_key: a
** registry lookup finds it from any thread of the state (a coroutine too),
** and a second Lua state, on this thread or another, has its own. Lua frees
** it with the state, after every finalizer has run (its own runs late: it
** was marked for finalization before the boxes were), so a box's finalizer
** can still read it. Its anchor is malloc'd: callbacks the C core keeps
** (a tape's custom gradient) may outlive the state.
*/
#include <stdlib.h>
#include <string.h>

#include "lbinding.h"

static const char state_key = 'M';

void mgL_anchor_release (mgL_anchor *a) {
  if (--a->refs > 0) return;
  free(a->dead);
  free(a);
}

/* the state's finalizer (lua_close): callbacks that outlive it get an
** error, not a dead state; a budget of the context no longer collects here */
static int state_gc (lua_State *L) {
  mgL_state *S = (mgL_state *)lua_touserdata(L, 1);
  void *was = mg_memory_set_collect_hook(NULL, NULL);
  if (was != NULL && was != S) mg_memory_set_collect_hook(mgL_gc_for_budget, was);   /* another state's */
  if (S->anchor) {
    S->anchor->L = NULL;
    S->anchor->running = NULL;
    mgL_anchor_release(S->anchor);
    S->anchor = NULL;
  }
  return 0;
}

/* makes L's state and pushes its userdata */
static mgL_state *new_state (lua_State *L) {
  mgL_state *S = (mgL_state *)lua_newuserdatauv(L, sizeof(mgL_state), MGL_NUSERVALUES);
  memset(S, 0, sizeof *S);
  S->magic = MGL_STATE_MAGIC;
  mgL_gc_init(&S->gc);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  S->main = lua_tothread(L, -1);
  lua_pop(L, 1);
  mgL_anchor *a = (mgL_anchor *)calloc(1, sizeof(mgL_anchor));
  if (a == NULL) luaL_error(L, "out of memory");
  a->L = S->main;
  a->refs = 1;
  S->anchor = a;
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, state_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &state_key);
  return S;
}

mgL_state *mgL_pushstate (lua_State *L) {
  mgL_state *S = mgL_upstate(L);
  if (S != NULL) {
    lua_pushvalue(L, MGL_STATE_UPVALUE);
    return S;
  }
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key) == LUA_TUSERDATA)
    return (mgL_state *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  return new_state(L);
}

mgL_state *mgL_findstate (lua_State *L) {
  mgL_state *S = mgL_pushstate(L);
  lua_pop(L, 1);
  return S;
}

void mgL_setfuncs (lua_State *L, const luaL_Reg *l) {
  mgL_pushstate(L);
  luaL_setfuncs(L, l, 1);
}

/* A budget that fails in an op (no gradient running) collects the state
** that opened the module last on this thread's context, as the hook can
** name one state only. */
void mgL_openstate (lua_State *L) {
  mg_memory_set_collect_hook(mgL_gc_for_budget, mgL_getstate(L));
}

void mgL_sweep (lua_State *L, mgL_anchor *a) {
  while (a->ndead > 0) luaL_unref(L, LUA_REGISTRYINDEX, a->dead[--a->ndead]);
}

/* the refs of calls whose nodes went while no gradient ran (a tape reset
** or released, a tensor holding a node collected), let go now: else they
** would wait for the next recompute or custom call, holding what those
** functions captured (a dry run would count it) */
void mgL_sweep_dead (lua_State *L) {
  mgL_state *S = mgL_getstate(L);
  if (S != NULL && S->anchor != NULL && S->anchor->ndead > 0) mgL_sweep(L, S->anchor);
}

/* The hooks are the context's: each gradient sets them to its state and
** puts back what was there (a gradient of another state may run inside a
** callback of this one). */
mgL_call mgL_enter (lua_State *L) {
  mgL_state *S = mgL_getstate(L);
  mgL_call c = {S, mgL_running(S), NULL, NULL};
  if (S->anchor) S->anchor->running = L;
  c.pressure = mg_memory_set_pressure_hook(mgL_gc_safe_point, S);
  c.collect = mg_memory_set_collect_hook(mgL_gc_for_budget, S);
  return c;
}

void mgL_leave (lua_State *L, mgL_call c) {
  mgL_state *S = c.S;
  mg_memory_set_pressure_hook(c.pressure ? mgL_gc_safe_point : NULL, c.pressure);
  mg_memory_set_collect_hook(c.collect ? mgL_gc_for_budget : NULL, c.collect);
  if (S->anchor == NULL) return;
  S->anchor->running = c.prev;
  if (S->anchor->ndead > 0) mgL_sweep(L, S->anchor);
}

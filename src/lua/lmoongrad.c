/*
** lmoongrad.c — luaopen_moongrad: builds the module table.
**
** The pure-Lua parts (the .lua files of lua/moongrad/) are compiled into the library,
** so moongrad.so and the moongrad interpreter work from any directory:
** each is registered in package.preload (`require "moongrad.nn"` works), and
** the module table loads them on first use (`mg.nn` just works). Nothing
** here sets a global.
*/
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lbinding.h"

/*
** mg.nn, mg.optim, ...: package.loaded["moongrad.<key>"], loaded on first use.
** Not copied into mg: the module stays the one require gives, also after a
** host (or busted's insulation) clears package.loaded to load it afresh.
*/
static int module_index (lua_State *L) {
  const char *k = lua_tostring(L, 2);
  if (lua_type(L, 2) != LUA_TSTRING) return 0;
  for (int i = 0; mgL_embedded_modules[i].name; i++) {
    const char *name = mgL_embedded_modules[i].name;
    if (strncmp(name, "moongrad.", 9) != 0 || strcmp(name + 9, k) != 0) continue;
    mgL_push_module_loader(L, i);
    lua_call(L, 0, 1);
    return 1;
  }
  return 0;
}

static void register_preloads (lua_State *L) {
  if (lua_getglobal(L, "package") != LUA_TTABLE) {   /* a host without the package library */
    lua_pop(L, 1);
    return;
  }
  lua_getfield(L, -1, "preload");
  if (lua_istable(L, -1))
    for (int i = 0; mgL_embedded_modules[i].name; i++) {
      if (lua_getfield(L, -1, mgL_embedded_modules[i].name) == LUA_TNIL) {
        mgL_push_module_loader(L, i);
        lua_setfield(L, -3, mgL_embedded_modules[i].name);
      }
      lua_pop(L, 1);
    }
  lua_pop(L, 2);
}

/* set_num_threads(n | "auto"): a fixed count, or the machine's, one while
** other processes hold the cores */
static int l_set_num_threads (lua_State *L) {
  mgL_checknargs(L, 1);
  if (lua_type(L, 1) == LUA_TSTRING) {
    const char *s = lua_tostring(L, 1);
    luaL_argcheck(L, strcmp(s, "auto") == 0, 1,
                  lua_pushfstring(L, "a thread count or \"auto\", got \"%s\"", s));
    mg_set_num_threads_auto();
    return 0;
  }
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 1 && n <= MG_MAX_THREADS, 1,
                lua_pushfstring(L, "thread count must be between 1 and %d, got %I", MG_MAX_THREADS, n));
  mg_set_num_threads((int)n);
  return 0;
}

/* get_num_threads() -> the count, "auto" or "fixed", the team in use now */
static int l_get_num_threads (lua_State *L) {
  mgL_checknargs(L, 0);
  lua_pushinteger(L, mg_get_num_threads());
  lua_pushstring(L, mg_threads_auto() ? "auto" : "fixed");
  lua_pushinteger(L, mg_threads_team());
  return 3;
}

/* gemm.use(name): "auto", "dnnl" or "openblas" for every float32 product */
static int l_gemm_use (lua_State *L) {
  if (mg_gemm_use(luaL_checkstring(L, 1)) != MG_OK) return mgL_error(L);
  return 0;
}

/* gemm.choice(m, n, k [, {transpose_a=, transpose_b=}]): "library/threads" */
static int l_gemm_choice (lua_State *L) {
  static const char *const keys[] = {"transpose_a", "transpose_b", NULL};
  lua_Integer m = mgL_intat(L, 1, 1, "m"), n = mgL_intat(L, 2, 2, "n"), k = mgL_intat(L, 3, 3, "k");
  int ta = 0, tb = 0;
  if (!lua_isnoneornil(L, 4)) {
    mgL_checkoptions(L, 4, keys);
    ta = mgL_optionfield(L, 4, "transpose_a", LUA_TBOOLEAN) != LUA_TNIL && lua_toboolean(L, -1);
    tb = mgL_optionfield(L, 4, "transpose_b", LUA_TBOOLEAN) != LUA_TNIL && lua_toboolean(L, -1);
  }
  const char *r = mg_gemm_choice(ta, tb, (int64_t)m, (int64_t)n, (int64_t)k);
  if (r == NULL) return mgL_error(L);
  lua_pushstring(L, r);
  return 1;
}

/* clock(): seconds on a monotonic wall clock (os.clock counts CPU time of
** every thread) */
static int l_clock (lua_State *L) {
  mgL_checknargs(L, 0);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

int luaopen_moongrad (lua_State *L) {
  luaL_checkversion(L);
  /* Lua's generational collector: a young collection costs in proportion
  ** to the objects made since the last one, which is what pacing the
  ** collector by tensor bytes needs (lmemory.c) */
  lua_gc(L, LUA_GCGEN, 0, 0);
  mgL_openstate(L);
  lua_newtable(L);
  mgL_open_tensor(L);
  mgL_open_variable(L);
  mgL_remember_metatables(L);
  mgL_open_tape(L);
  mgL_open_loops(L);
  mgL_open_hooks(L);
  mgL_open_autocast(L);
  mgL_open_custom(L);
  mgL_open_recompute(L);
  mgL_open_functions(L);
  mgL_open_maths(L);
  mgL_open_index(L);
  mgL_open_conv(L);
  mgL_open_attention(L);
  mgL_open_dense(L);
  mgL_open_io(L);
  mgL_open_memory(L);
  mgL_open_tidy(L);
  mgL_open_random(L);
  mgL_open_debug(L);
  lua_pushcfunction(L, l_set_num_threads);
  lua_setfield(L, -2, "set_num_threads");
  lua_pushcfunction(L, l_get_num_threads);
  lua_setfield(L, -2, "get_num_threads");
  lua_pushcfunction(L, l_clock);
  lua_setfield(L, -2, "clock");
  static const luaL_Reg gemm[] = {{"use", l_gemm_use}, {"choice", l_gemm_choice}, {NULL, NULL}};
  mgL_newlib(L, gemm);
  lua_setfield(L, -2, "gemm");
  lua_pushliteral(L, MG_VERSION);
  lua_setfield(L, -2, "version");
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, module_index);
  lua_setfield(L, -2, "__index");
  lua_setmetatable(L, -2);
  register_preloads(L);
  return 1;
}

/*
** lautocast.c — mg.autocast: products in bfloat16 for a call or a block
** (PyTorch's torch.autocast), on the core's mg_autocast_push / pop.
*/
#include <stdio.h>

#include "lbinding.h"

#define AUTOCAST_MT "moongrad.autocast"

/* the region's dtype from argument 1: a dtype name, or false (off) */
static mg_dtype check_region_dtype (lua_State *L) {
  if (lua_isboolean(L, 1) && !lua_toboolean(L, 1)) return MG_FLOAT32;
  if (lua_type(L, 1) != LUA_TSTRING)
    return (mg_dtype)luaL_argerror(L, 1, lua_pushfstring(L, "\"bfloat16\", \"float16\", \"float32\" or false "
                                                            "expected, got %s", luaL_typename(L, 1)));
  return mgL_optdtype(L, 1, MG_FLOAT32);
}

/* opens a region; says once per process when its products run emulated */
static void push_region (lua_State *L, mg_dtype dt) {
  static int warned[2];
  if (mg_autocast_push(dt) != MG_OK) mgL_error(L);
  if (dt == MG_BFLOAT16 && mg_half_isa(dt) == NULL && !warned[0]) {
    warned[0] = 1;
    fprintf(stderr, "moongrad: warning: autocast: this CPU has no bfloat16 dot products (avx512_bf16 or "
                    "AMX); bfloat16 products are emulated or run in float32: correct, but slower than float32\n");
  }
  if (dt == MG_FLOAT16 && !warned[1]) {
    warned[1] = 1;
    fprintf(stderr, "moongrad: warning: autocast: float16 products run widened to float32 (this oneDNN has "
                    "no float16 kernels for CPUs): float16's rounding and range, not its speed\n");
  }
}

/* _autocast_emulate_float16(on): allow float16 regions without AVX512-FP16; the previous setting */
static int l_emulate_float16 (lua_State *L) {
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  lua_pushboolean(L, mg_autocast_emulate_float16(lua_toboolean(L, 1)));
  return 1;
}

/* a region a <close> variable holds: closed once, innermost first */
typedef struct region { int depth; } region;

static int region_close (lua_State *L) {
  region *r = (region *)luaL_checkudata(L, 1, AUTOCAST_MT);
  if (r->depth == 0) return 0;
  if (mg_autocast_depth() != r->depth)
    return luaL_error(L, "autocast: regions must close innermost first (this one opened at depth %d, "
                         "%d are open)", r->depth, mg_autocast_depth());
  r->depth = 0;
  mg_autocast_pop();
  return 0;
}

static int region_tostring (lua_State *L) {
  region *r = (region *)luaL_checkudata(L, 1, AUTOCAST_MT);
  lua_pushfstring(L, "autocast region (%s)", r->depth ? "open" : "closed");
  return 1;
}

/* autocast(dtype, fn, ...): fn(...) with products in dtype, its results;
** autocast(dtype): a region open until its <close> variable (or :close()) */
static int l_autocast (lua_State *L) {
  mg_dtype dt = check_region_dtype(L);
  if (lua_gettop(L) < 2) {
    region *r = (region *)lua_newuserdatauv(L, sizeof(region), 0);
    r->depth = 0;
    luaL_setmetatable(L, AUTOCAST_MT);
    push_region(L, dt);
    r->depth = mg_autocast_depth();
    return 1;
  }
  mgL_checkcallable(L, 2);
  push_region(L, dt);
  int st = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
  mg_autocast_pop();
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L) - 1;
}

/* autocast_dtype(): the open region's dtype, or nil when autocast is off */
static int l_autocast_dtype (lua_State *L) {
  if (lua_gettop(L) > 0) return luaL_argerror(L, 1, "no arguments expected");
  mg_dtype dt = mg_autocast_dtype();
  if (dt == MG_FLOAT32) lua_pushnil(L);
  else lua_pushstring(L, mg_dtype_name(dt));
  return 1;
}

/* autocast_isa([dtype]): the ISA oneDNN runs dtype's products on here, or nil */
static int l_autocast_isa (lua_State *L) {
  const char *isa = mg_half_isa(mgL_optdtype(L, 1, MG_BFLOAT16));
  if (isa) lua_pushstring(L, isa);
  else lua_pushnil(L);
  return 1;
}

void mgL_open_autocast (lua_State *L) {
  luaL_newmetatable(L, AUTOCAST_MT);
  static const luaL_Reg mt[] = {{"__close", region_close}, {"__tostring", region_tostring}, {NULL, NULL}};
  luaL_setfuncs(L, mt, 0);
  lua_newtable(L);
  lua_pushcfunction(L, region_close);
  lua_setfield(L, -2, "close");
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  static const luaL_Reg fns[] = {{"autocast", l_autocast}, {"autocast_dtype", l_autocast_dtype},
                                 {"autocast_isa", l_autocast_isa}, {"_autocast_emulate_float16", l_emulate_float16},
                                 {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}

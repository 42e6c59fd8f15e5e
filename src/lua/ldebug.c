/*
** ldebug.c — mg.debug: check_numerics(on) and verify_recompute(on), the
** Lua faces of mg_check_numerics (src/ops/numerics.c) and
** mg_recompute_verify (src/autodiff/verify.c).
*/
#include "lbinding.h"

/* check_numerics(on): on a boolean; returns the previous setting */
static int l_check_numerics (lua_State *L) {
  mgL_checknargs(L, 1);
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  lua_pushboolean(L, mg_check_numerics(lua_toboolean(L, 1)));
  return 1;
}

/* verify_recompute(on): every recompute_grad as with {verify = true};
** returns the previous setting */
static int l_verify_recompute (lua_State *L) {
  mgL_checknargs(L, 1);
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  lua_pushboolean(L, mg_recompute_verify(lua_toboolean(L, 1)));
  return 1;
}

static const luaL_Reg debug_funcs[] = {
  {"check_numerics", l_check_numerics},
  {"verify_recompute", l_verify_recompute},
  {NULL, NULL}
};

void mgL_open_debug (lua_State *L) {
  mgL_newlib(L, debug_funcs);
  lua_setfield(L, -2, "debug");
}

/*
** ldebug.c — mg.debug: check_numerics(on), the Lua face of
** mg_check_numerics (src/ops/numerics.c).
*/
#include "lbinding.h"

/* check_numerics(on): on a boolean; returns the previous setting */
static int l_check_numerics (lua_State *L) {
  mgL_checknargs(L, 1);
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  lua_pushboolean(L, mg_check_numerics(lua_toboolean(L, 1)));
  return 1;
}

static const luaL_Reg debug_funcs[] = {
  {"check_numerics", l_check_numerics},
  {NULL, NULL}
};

void mgL_open_debug (lua_State *L) {
  mgL_newlib(L, debug_funcs);
  lua_setfield(L, -2, "debug");
}

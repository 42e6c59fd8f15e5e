/*
** ldense.c — the Lua side of src/ops/dense.c, as mg.dense and x:dense():
**   dense(x, w [, b [, activation]])   act(x @ w + b); b may be nil,
**                                      activation "linear" (the default),
**                                      "relu", "tanh" or "sigmoid"
** It checks its arguments first (which may raise), then pushes its result
** box, then runs the C op, which never raises.
*/
#include <string.h>

#include "lbinding.h"

static int l_dense (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1), *w = mgL_checktensor(L, 2);
  mg_tensor *b = lua_isnoneornil(L, 3) ? NULL : mgL_checktensor(L, 3);
  size_t len = 0;
  const char *act = luaL_optlstring(L, 4, NULL, &len);
  if (act && strlen(act) != len) luaL_argerror(L, 4, "the activation name holds a zero byte");
  if (!lua_isnoneornil(L, 5)) luaL_argerror(L, 5, "nothing may follow the activation");
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_dense(x, w, b, act));
}

static const luaL_Reg dense_methods[] = {{"dense", l_dense}, {NULL, NULL}};

/* the module table is at the top */
void mgL_open_dense (lua_State *L) {
  mgL_setfuncs(L, dense_methods);
  lua_getfield(L, LUA_REGISTRYINDEX, "moongrad.methods");
  mgL_setfuncs(L, dense_methods);
  lua_pop(L, 1);
}

/*
** lmodules.c — the pure-Lua parts of moongrad (the files of lua/moongrad/, compiled
** into the library: build/embedded.c), loaded as require would load them.
** lmoongrad.c registers them (package.preload, mg.nn on first use); the
** binding's C files that call into a Lua module get it with mgL_require.
*/
#include <stdio.h>
#include <string.h>

#include "lbinding.h"

/* loads embedded module i (upvalue) as require would, caching it in package.loaded */
static int load_embedded (lua_State *L) {
  const mgL_embedded *m = &mgL_embedded_modules[lua_tointeger(L, lua_upvalueindex(1))];
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (lua_getfield(L, -1, m->name) != LUA_TNIL) return 1;
  lua_pop(L, 1);
  char chunkname[128];
  snprintf(chunkname, sizeof chunkname, "@%s.lua", m->name);
  for (char *p = chunkname + 1; *p; p++) if (*p == '.' && strcmp(p, ".lua") != 0) *p = '/';
  if (luaL_loadbuffer(L, (const char *)m->src, m->len, chunkname) != LUA_OK) return lua_error(L);
  lua_pushstring(L, m->name);
  lua_call(L, 1, 1);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_pushboolean(L, 1);
  }
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, m->name);
  return 1;
}

void mgL_push_module_loader (lua_State *L, int i) {
  lua_pushinteger(L, i);
  lua_pushcclosure(L, load_embedded, 1);
}

void mgL_require (lua_State *L, const char *name) {
  for (int i = 0; mgL_embedded_modules[i].name; i++) {
    if (strcmp(mgL_embedded_modules[i].name, name) != 0) continue;
    mgL_push_module_loader(L, i);
    lua_call(L, 0, 1);
    return;
  }
  luaL_error(L, "moongrad: no embedded module '%s'", name);
}

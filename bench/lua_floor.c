/*
** lua_floor.c — what the seed chain costs Lua itself: a module with the
** seed chain's calls (tape, constant, Variable, `*` as a metamethod,
** stop, gradient returning a table of one box), each making what moongrad
** makes (a userdata with a metatable and a C __gc, a table) and nothing
** more. bench/cases.lua `seed_floor` runs the seed chain on it; moongrad's
** own share of the chain is what it costs beyond this floor.
**   cc -O2 -shared -fPIC -I/usr/include/lua5.4 bench/lua_floor.c -o build/lua_floor.so
*/
#include <lauxlib.h>
#include <lua.h>

static const char box_key = 'B';

static int box_gc (lua_State *L) {
  (void)lua_touserdata(L, 1);
  return 0;
}

static void new_box (lua_State *L) {
  lua_newuserdatauv(L, 16, 0);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &box_key);
  lua_setmetatable(L, -2);
}

static int l_new (lua_State *L) {
  new_box(L);
  return 1;
}

static int l_mul (lua_State *L) {
  (void)lua_touserdata(L, 1);
  (void)lua_touserdata(L, 2);
  new_box(L);
  return 1;
}

static int l_stop (lua_State *L) {
  (void)lua_touserdata(L, 1);
  return 0;
}

static int l_gradient (lua_State *L) {
  lua_createtable(L, 1, 0);
  new_box(L);
  lua_rawseti(L, -2, 1);
  return 1;
}

int luaopen_lua_floor (lua_State *L) {
  static const luaL_Reg meta[] = {{"__gc", box_gc}, {"__mul", l_mul}, {NULL, NULL}};
  static const luaL_Reg methods[] = {{"stop", l_stop}, {"gradient", l_gradient}, {NULL, NULL}};
  static const luaL_Reg module[] = {{"tape", l_new}, {"constant", l_new}, {"Variable", l_new}, {NULL, NULL}};
  luaL_newlib(L, meta);
  luaL_newlib(L, methods);
  lua_setfield(L, -2, "__index");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &box_key);
  luaL_newlib(L, module);
  return 1;
}

/*
** binding_states_test.c — two Lua states on one thread keep separate
** binding state (src/lua/lstate.c): the collector's pacing, the open
** mg.tidy scopes, a gradient's thread, and the budget's collect hook after
** one of them closes. State B is driven from inside state A's calls through
** a C function, as a host holding two states might.
**
**   make build/binding_states_test && build/binding_states_test
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "moongrad.h"

static lua_State *B;             /* the other state, for in_b */
static int failures;

static lua_State *open_state (void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "moongrad", luaopen_moongrad, 0);
  lua_setglobal(L, "mg");
  return L;
}

/* runs code in L; its first result, as a string ("error: ..." on failure) */
static const char *run (lua_State *L, const char *code, char *out, size_t n) {
  int top = lua_gettop(L);
  if (luaL_loadstring(L, code) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK)
    snprintf(out, n, "error: %s", lua_tostring(L, -1));
  else
    snprintf(out, n, "%s", luaL_tolstring(L, -1, NULL));
  lua_settop(L, top);
  return out;
}

static void check (lua_State *L, const char *name, const char *code, const char *want) {
  char got[512];
  run(L, code, got, sizeof got);
  if (strcmp(got, want) != 0) {
    fprintf(stderr, "binding_states_test: %s: got '%s', want '%s'\n", name, got, want);
    failures++;
  }
}

/* in_b(code) in state A: code's first result in state B, as a string */
static int in_b (lua_State *L) {
  char got[512];
  lua_pushstring(L, run(B, luaL_checkstring(L, 1), got, sizeof got));
  return 1;
}

int main (void) {
  lua_State *A = open_state();
  B = open_state();
  lua_register(A, "in_b", in_b);

  /* the pacing is each state's own */
  check(A, "A's pause", "return (mg.memory.setpause(150, 0))", "110");
  check(B, "B's pause untouched by A's", "return (mg.memory.setpause(110))", "110");
  check(A, "A's pause kept", "return (mg.memory.setpause(110))", "150");

  /* a tidy scope of A takes no box of B, and B sees no scope open */
  check(A, "B's tensor outlives A's scope",
        "local inner\n"
        "local kept = mg.tidy(function()\n"
        "  local a = mg.tensor{1, 2}\n"
        "  inner = in_b('x = mg.tensor{1, 2}; return select(\"#\", mg.keep(x))')\n"
        "  return a\n"
        "end)\n"
        "return inner .. ' ' .. kept:sum():item()", "1 3.0");
  check(B, "B's x alive", "return x:sum():item()", "3.0");
  check(A, "B's own scope inside A's",
        "return mg.tidy(function()\n"
        "  local a = mg.tensor{5}\n"
        "  local r = in_b('local z; mg.tidy(function() z = mg.tensor{1}; y = mg.tensor{2} end);'\n"
        "              .. 'return tostring(pcall(function() return z:sum() end))')\n"
        "  return r .. ' ' .. a:item()\n"
        "end)", "false 5.0");
  check(A, "A's scope releases A's boxes",
        "local a\n"
        "mg.tidy(function() a = mg.tensor{1} end)\n"
        "return tostring(pcall(function() return a:item() end))", "false");

  /* gradients in both, one asked for inside a custom gradient of the other */
  check(A, "B's gradient inside A's backward",
        "local f = mg.custom_gradient(function(x)\n"
        "  return x * 2, function(dy)\n"
        "    local gb = in_b('local v = mg.Variable(mg.tensor{3}); local t = mg.tape();'\n"
        "                 .. 'local y = mg.recompute_grad(function(a) return a * a end)(v); t:stop();'\n"
        "                 .. 'return t:gradient(y, v):item()')\n"
        "    assert(gb == '6.0', gb)\n"
        "    return dy * 2\n"
        "  end\n"
        "end)\n"
        "local x = mg.Variable(mg.tensor{1})\n"
        "local t = mg.tape()\n"
        "local y = mg.recompute_grad(function(a) return f(a) * 3 end)(x)\n"
        "t:stop()\n"
        "return t:gradient(y, x):item()", "6.0");

  /* A closes; B goes on, its budget collecting in B */
  lua_close(A);
  check(B, "B after A closed",
        "mg.memory.budget('64 MB')\n"
        "local v = mg.Variable(mg.random.normal({64, 64}))\n"
        "local t = mg.tape()\n"
        "local y = mg.sum(mg.tanh(v) * v)\n"
        "t:stop()\n"
        "local g = t:gradient(y, v)\n"
        "mg.memory.budget(nil)\n"
        "return g.shape[1]", "64");
  lua_close(B);
  if (failures) return 1;
  printf("binding_states_test: two Lua states on one thread keep their binding state apart\n");
  return 0;
}

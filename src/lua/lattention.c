/*
** lattention.c — the Lua side of src/ops/attention.c, as mg.f and x:f():
**   layer_norm(x [, gamma [, beta]] [, {epsilon=1e-5}])
**   gelu(x [, approximate])     approximate: false/"none" (erf, the
**                               default) or true/"tanh"; also {approximate=}
**   scaled_dot_product_attention(q, k, v [, {mask=, causal=false, scale=}])
** Each checks its arguments first (which may raise), then pushes its result
** box, then runs the C op, which never raises.
*/
#include <math.h>
#include <string.h>

#include "lbinding.h"

/* a number option at arg: nil leaves *out; otherwise a finite number > 0
** (or >= 0 when zero_ok) */
static void numopt (lua_State *L, int arg, const char *key, double *out, bool zero_ok) {
  if (mgL_optionfield(L, arg, key, LUA_TNUMBER) != LUA_TNIL) {
    double v = lua_tonumber(L, -1);
    if (!(zero_ok ? v >= 0 : v > 0) || v == HUGE_VAL)
      luaL_argerror(L, arg, lua_pushfstring(L, "option '%s' must be a finite number %s, got %s", key,
                                            zero_ok ? ">= 0" : "> 0", luaL_tolstring(L, -1, NULL)));
    *out = v;
  }
  lua_pop(L, 1);
}

/* the tensor at arg, or NULL when it is nil or absent */
static mg_tensor *opttensor (lua_State *L, int arg) {
  return lua_isnoneornil(L, arg) ? NULL : mgL_checktensor(L, arg);
}

/* layer_norm(x [, gamma [, beta]] [, options]): the options table is the
** first plain table after x */
static int l_layer_norm (lua_State *L) {
  static const char *const keys[] = {"epsilon", NULL};
  mg_tensor *x = mgL_checktensor(L, 1);
  int opts = 0, top = lua_gettop(L);
  for (int i = 2; i <= top && i <= 4 && !opts; i++)
    if (lua_type(L, i) == LUA_TTABLE) opts = i;
  if (opts && opts < top)
    luaL_argerror(L, opts + 1, "nothing may follow the options table");
  mg_tensor *gamma = opts == 2 ? NULL : opttensor(L, 2);
  mg_tensor *beta = opts == 2 || opts == 3 ? NULL : opttensor(L, 3);
  double eps = 1e-5;
  if (opts) {
    mgL_checkoptions(L, opts, keys);
    numopt(L, opts, "epsilon", &eps, true);
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_layer_norm(x, gamma, beta, eps));
}

/* the approximation at idx: nil, false, "none" (exact) or true, "tanh" */
static int approximation (lua_State *L, int idx, int arg) {
  int t = lua_type(L, idx);
  if (t == LUA_TNIL || t == LUA_TNONE) return 0;
  if (t == LUA_TBOOLEAN) return lua_toboolean(L, idx);
  if (t == LUA_TSTRING) {
    const char *s = lua_tostring(L, idx);
    if (strcmp(s, "none") == 0) return 0;
    if (strcmp(s, "tanh") == 0) return 1;
  }
  return luaL_argerror(L, arg, lua_pushfstring(L, "approximate must be false, true, 'none' or 'tanh', got %s",
                                               t == LUA_TSTRING ? lua_pushfstring(L, "'%s'", lua_tostring(L, idx))
                                                                : luaL_typename(L, idx)));
}

/* gelu(x [, approximate]) or gelu(x, {approximate=}) */
static int l_gelu (lua_State *L) {
  static const char *const keys[] = {"approximate", NULL};
  mg_tensor *x = mgL_checktensor(L, 1);
  int approx;
  if (lua_type(L, 2) == LUA_TTABLE) {
    mgL_checkoptions(L, 2, keys);
    lua_getfield(L, 2, "approximate");
    approx = approximation(L, -1, 2);
    lua_pop(L, 1);
  } else {
    approx = approximation(L, 2, 2);
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_gelu(x, approx));
}

/* scaled_dot_product_attention(q, k, v [, {mask=, causal=, scale=}]) */
static int l_sdpa (lua_State *L) {
  static const char *const keys[] = {"mask", "causal", "scale", NULL};
  mg_tensor *q = mgL_checktensor(L, 1), *k = mgL_checktensor(L, 2), *v = mgL_checktensor(L, 3), *mask = NULL;
  mg_attention_params p = {0, 0};
  if (!lua_isnoneornil(L, 4)) {
    luaL_checktype(L, 4, LUA_TTABLE);
    mgL_checkoptions(L, 4, keys);
    if (mgL_optionfield(L, 4, "causal", LUA_TBOOLEAN) != LUA_TNIL) p.causal = lua_toboolean(L, -1);
    lua_pop(L, 1);
    numopt(L, 4, "scale", &p.scale, false);
    if (lua_getfield(L, 4, "mask") != LUA_TNIL) {
      if (!mgL_isleaf(L, -1))
        luaL_argerror(L, 4, lua_pushfstring(L, "option 'mask' must be a bool tensor, got %s", luaL_typename(L, -1)));
      mask = mgL_checktensor(L, lua_gettop(L));
    }
    lua_pop(L, 1);          /* the mask stays referenced by the options table */
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_scaled_dot_product_attention(q, k, v, mask, &p));
}

static const luaL_Reg attention_methods[] = {     /* mg.f(x, ...) and x:f(...) */
  {"layer_norm", l_layer_norm},
  {"gelu", l_gelu},
  {"scaled_dot_product_attention", l_sdpa},
  {NULL, NULL}
};

/* the module table is at the top */
void mgL_open_attention (lua_State *L) {
  mgL_setfuncs(L, attention_methods);
  lua_getfield(L, LUA_REGISTRYINDEX, "moongrad.methods");
  mgL_setfuncs(L, attention_methods);
  lua_pop(L, 1);
}

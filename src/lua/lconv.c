/*
** lconv.c — the Lua side of src/ops/conv.c: mg.conv2d, mg.max_pool2d,
** mg.avg_pool2d (also as x:f()), and their backward ops
** mg.conv2d_backward_input, mg.conv2d_backward_filter,
** mg.max_pool2d_backward, mg.avg_pool2d_backward.
**
** Options follow Keras' layers: {strides=, padding=, dilation_rate=} for
** convolutions, {pool_size=, strides=, padding=} for pools; a size is an
** integer (both axes) or a {height, width} pair. Every function checks its
** arguments first (which may raise), then pushes its result box, then runs
** the C op, which never raises.
*/
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "lbinding.h"

/* {======================== options ========================= */

static const char *const conv_options[] = {"strides", "padding", "dilation_rate", NULL};
static const char *const conv2d_options[] = {"strides", "padding", "dilation_rate", "activation", NULL};
static const char *const pool_options[] = {"pool_size", "strides", "padding", NULL};

/* an integer >= min at stack index idx, errors naming option key of arg */
static int64_t sizeat (lua_State *L, int idx, int arg, const char *key, lua_Integer min) {
  char what[64];
  snprintf(what, sizeof what, "option '%s'", key);
  lua_Integer v = mgL_intat(L, idx, arg, what);
  if (v < min || v > (1 << 30))
    luaL_argerror(L, arg, lua_pushfstring(L, "option '%s' must be %s, got %I", key,
                                          min == 0 ? "0 to 2^30" : "1 to 2^30", v));
  return (int64_t)v;
}

/* options[key] of the table at arg: an integer n (n, n) or a pair {h, w}
** of integers >= min into out; returns false (out untouched) when nil */
static bool pairopt (lua_State *L, int arg, const char *key, int64_t out[2], lua_Integer min) {
  if (lua_isnoneornil(L, arg)) return false;
  int t = lua_getfield(L, arg, key);
  bool given = t != LUA_TNIL;
  if (t == LUA_TNUMBER) {
    out[0] = out[1] = sizeat(L, -1, arg, key, min);
  } else if (t == LUA_TTABLE) {
    char what[64];
    snprintf(what, sizeof what, "option '%s'", key);
    if (mgL_checklist(L, -1, arg, what) != 2)
      luaL_argerror(L, arg, lua_pushfstring(L, "option '%s' must be an integer or a {height, width} pair, "
                                               "got a list of %d", key, (int)lua_rawlen(L, -1)));
    for (int i = 0; i < 2; i++) {
      lua_geti(L, -1, i + 1);
      out[i] = sizeat(L, -1, arg, key, min);
      lua_pop(L, 1);
    }
  } else if (given) {
    luaL_argerror(L, arg, lua_pushfstring(L, "option '%s' must be an integer or a {height, width} pair, got %s",
                                          key, luaL_typename(L, -1)));
  }
  lua_pop(L, 1);
  return given;
}

/* a equals b (lowercase) but for case: "SAME" as tf.nn writes it */
static bool same_word (const char *a, const char *b) {
  while (*a && tolower((unsigned char)*a) == *b) a++, b++;
  return *a == 0 && *b == 0;
}

/* padding = "valid" | "same" (any case); for convolutions also explicit:
** an integer, {height, width} or {{top, bottom}, {left, right}} */
static void paddingopt (lua_State *L, int arg, mg_conv_params *p, bool conv) {
  static const char conv_forms[] = "'valid', 'same', an integer, {height, width} or "
                                   "{{top, bottom}, {left, right}}";
  if (lua_isnoneornil(L, arg)) return;
  int t = lua_getfield(L, arg, "padding");
  if (t == LUA_TSTRING) {
    const char *v = lua_tostring(L, -1);
    if (same_word(v, "valid")) p->padding = MG_PADDING_VALID;
    else if (same_word(v, "same")) p->padding = MG_PADDING_SAME;
    else
      luaL_argerror(L, arg, lua_pushfstring(L, "option 'padding' must be %s, got '%s'",
                                            conv ? conv_forms : "'valid' or 'same'", v));
  } else if (conv && t == LUA_TNUMBER) {
    p->padding = MG_PADDING_EXPLICIT;
    p->pads[0] = p->pads[1] = p->pads[2] = p->pads[3] = sizeat(L, -1, arg, "padding", 0);
  } else if (conv && t == LUA_TTABLE) {
    int n = mgL_checklist(L, -1, arg, "option 'padding'");
    if (n != 2) luaL_argerror(L, arg, lua_pushfstring(L, "option 'padding' must be %s, got a list of %d", conv_forms, n));
    p->padding = MG_PADDING_EXPLICIT;
    for (int i = 0; i < 2; i++) {
      int ti = lua_geti(L, -1, i + 1);
      if (ti == LUA_TTABLE) {
        if (mgL_checklist(L, -1, arg, "option 'padding'") != 2)
          luaL_argerror(L, arg, lua_pushfstring(L, "option 'padding' must be %s; entry %d is not a pair",
                                                conv_forms, i + 1));
        lua_geti(L, -1, 1);
        lua_geti(L, -2, 2);
        p->pads[2 * i] = sizeat(L, -2, arg, "padding", 0);
        p->pads[2 * i + 1] = sizeat(L, -1, arg, "padding", 0);
        lua_pop(L, 2);
      } else {
        p->pads[2 * i] = p->pads[2 * i + 1] = sizeat(L, -1, arg, "padding", 0);
      }
      lua_pop(L, 1);
    }
  } else if (t != LUA_TNIL) {
    luaL_argerror(L, arg, lua_pushfstring(L, "option 'padding' must be %s, got %s",
                                          conv ? conv_forms : "'valid' or 'same'", luaL_typename(L, -1)));
  }
  lua_pop(L, 1);
}

/* the options table at arg (nil: defaults) of a convolution, whose keys may be `keys` */
static void conv_params (lua_State *L, int arg, mg_conv_params *p, const char *const *keys) {
  memset(p, 0, sizeof *p);
  if (!lua_isnoneornil(L, arg)) luaL_checktype(L, arg, LUA_TTABLE);
  mgL_checkoptions(L, arg, keys);
  pairopt(L, arg, "strides", p->strides, 1);
  pairopt(L, arg, "dilation_rate", p->dilation, 1);
  paddingopt(L, arg, p, true);
}

/* the options table at arg of a pool; window 2x2 and strides the window by default */
static void pool_params (lua_State *L, int arg, mg_conv_params *p, int64_t window[2]) {
  memset(p, 0, sizeof *p);
  window[0] = window[1] = 2;
  if (!lua_isnoneornil(L, arg)) luaL_checktype(L, arg, LUA_TTABLE);
  mgL_checkoptions(L, arg, pool_options);
  pairopt(L, arg, "pool_size", window, 1);
  pairopt(L, arg, "strides", p->strides, 1);
  paddingopt(L, arg, p, false);
}

/* a shape of 4 sizes at arg, named `what` */
static void shape4 (lua_State *L, int arg, const char *what, int64_t s[4]) {
  int64_t shape[MG_MAX_DIMS];
  int n = mgL_checkshape(L, arg, shape, false);
  if (n != 4)
    luaL_argerror(L, arg, lua_pushfstring(L, "%s must have 4 sizes, got %d", what, n));
  memcpy(s, shape, sizeof(int64_t) * 4);
}

/* }========================================================== */


/* {====================== the functions ====================== */

/* conv2d(x, w [, b] [, {strides=, padding=, dilation_rate=, activation=}]) */
static int l_conv2d (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1), *w = mgL_checktensor(L, 2), *b = NULL;
  int opts = 3;
  if (!lua_isnoneornil(L, 3) && !lua_istable(L, 3)) {
    b = mgL_checktensor(L, 3);
    opts = 4;
  } else if (lua_isnil(L, 3)) {
    opts = 4;                                          /* conv2d(x, w, nil, opts) */
  }
  mg_conv_params p;
  conv_params(L, opts, &p, conv2d_options);
  const char *act = NULL;                              /* the C entry names a wrong one */
  if (!lua_isnoneornil(L, opts)) {
    int t = lua_getfield(L, opts, "activation");
    if (t != LUA_TNIL && t != LUA_TSTRING)
      luaL_argerror(L, opts, lua_pushfstring(L, "option 'activation' must be a string (linear, relu, tanh or "
                                                "sigmoid), got %s", luaL_typename(L, -1)));
    act = lua_tostring(L, -1);                         /* left on the stack, so it stays alive */
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_conv2d_act(x, w, b, &p, act));
}

/* conv2d_backward_input(dy, w, input_shape [, options]) */
static int l_conv2d_backward_input (lua_State *L) {
  mg_tensor *dy = mgL_checktensor(L, 1), *w = mgL_checktensor(L, 2);
  int64_t s[4];
  shape4(L, 3, "input_shape", s);
  mg_conv_params p;
  conv_params(L, 4, &p, conv_options);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_conv2d_backward_input(dy, w, s, &p));
}

/* conv2d_backward_filter(x, dy, filter_shape [, options]) */
static int l_conv2d_backward_filter (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1), *dy = mgL_checktensor(L, 2);
  int64_t s[4];
  shape4(L, 3, "filter_shape", s);
  mg_conv_params p;
  conv_params(L, 4, &p, conv_options);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_conv2d_backward_filter(x, dy, s, &p));
}

/* max_pool2d(x [, {pool_size=2, strides=, padding=}]) and avg_pool2d;
** upvalue 1: true for max */
static int l_pool2d (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  mg_conv_params p;
  int64_t window[2];
  pool_params(L, 2, &p, window);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, lua_toboolean(L, lua_upvalueindex(1)) ? mg_max_pool2d(x, window, &p)
                                                                : mg_avg_pool2d(x, window, &p));
}

/* max_pool2d_backward(x, dy [, options]) */
static int l_max_pool2d_backward (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1), *dy = mgL_checktensor(L, 2);
  mg_conv_params p;
  int64_t window[2];
  pool_params(L, 3, &p, window);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_max_pool2d_backward(x, dy, window, &p));
}

/* avg_pool2d_backward(dy, input_shape [, options]) */
static int l_avg_pool2d_backward (lua_State *L) {
  mg_tensor *dy = mgL_checktensor(L, 1);
  int64_t s[4];
  shape4(L, 2, "input_shape", s);
  mg_conv_params p;
  int64_t window[2];
  pool_params(L, 3, &p, window);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_avg_pool2d_backward(dy, s, window, &p));
}

/* }========================================================== */


static const luaL_Reg conv_methods[] = {          /* mg.f(x, ...) and x:f(...) */
  {"conv2d", l_conv2d},
  {NULL, NULL}
};

static const luaL_Reg conv_funcs[] = {            /* mg.f only */
  {"conv2d_backward_input", l_conv2d_backward_input},
  {"conv2d_backward_filter", l_conv2d_backward_filter},
  {"max_pool2d_backward", l_max_pool2d_backward},
  {"avg_pool2d_backward", l_avg_pool2d_backward},
  {NULL, NULL}
};

/* the module table is at the top */
void mgL_open_conv (lua_State *L) {
  int module = lua_gettop(L);
  mgL_setfuncs(L, conv_methods);
  mgL_setfuncs(L, conv_funcs);
  lua_getfield(L, LUA_REGISTRYINDEX, "moongrad.methods");
  int methods = lua_gettop(L);
  mgL_setfuncs(L, conv_methods);
  for (int is_max = 0; is_max < 2; is_max++) {
    lua_pushboolean(L, is_max);
    lua_pushcclosure(L, l_pool2d, 1);
    lua_pushvalue(L, -1);
    lua_setfield(L, module, is_max ? "max_pool2d" : "avg_pool2d");
    lua_setfield(L, methods, is_max ? "max_pool2d" : "avg_pool2d");
  }
  lua_settop(L, module);
}

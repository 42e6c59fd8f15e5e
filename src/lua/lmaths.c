/*
** lmaths.c — the Lua side of src/ops/maths.c, for the ops whose arguments
** the registry's generic unary/binary/reduce bindings do not cover:
**   clamp(x, lo, hi) and its alias clip_by_value: lo or hi may be nil
**   var, std, norm (x [, axis or {axes}] [, keepdims] [, options])
**   cumsum(x [, axis] [, {exclusive=, reverse=}])
** Each is both mg.f and x:f(). An options table comes last, and is a table
** that is not a list, so var(x, {1, 2}) reduces two axes and var(x,
** {ddof = 1}) takes an option. (sin ... round, prod and logsumexp are bound
** by ltensor.c from the registry.)
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "lbinding.h"

/* {========================= clamp =========================== */

/* the missing bound of a one-sided clamp: -inf or +inf, or the int64 extremes */
static mg_tensor *unbounded (mg_dtype dt, int sign) {
  if (dt == MG_INT64) return mg_full_int64(NULL, 0, sign < 0 ? INT64_MIN : INT64_MAX);
  return mg_scalar(sign < 0 ? -INFINITY : INFINITY, dt);
}

/* upvalue 1: the name the user called ("clamp" or "clip_by_value") */
static int l_clamp (lua_State *L) {
  const char *fn = lua_tostring(L, lua_upvalueindex(1));
  mg_tensor *x = mgL_checktensor(L, 1);
  bool has_lo = !lua_isnoneornil(L, 2), has_hi = !lua_isnoneornil(L, 3);
  if (has_lo) mgL_checkoperandkind(L, 2);
  if (has_hi) mgL_checkoperandkind(L, 3);
  if (!has_lo && !has_hi) return luaL_error(L, "%s: lo and hi are both nil (give at least one bound)", fn);
  mg_dtype dt = mg_tensor_dtype(x);
  ltensor *box = mgL_newbox(L);
  bool olo = true, ohi = true;
  mg_tensor *lo = has_lo ? mgL_operand(L, 2, dt, &olo, fn) : unbounded(dt, -1);
  mg_tensor *hi = lo == NULL ? NULL : has_hi ? mgL_operand(L, 3, dt, &ohi, fn) : unbounded(dt, 1);
  mg_tensor *r = lo && hi ? mg_clamp(x, lo, hi) : NULL;
  if (olo) mg_tensor_release(lo);
  if (ohi) mg_tensor_release(hi);
  return mgL_fill(L, box, r);
}

/* }========================================================== */


/* {=============== reductions with options =================== */

/* is the table at idx a list (keys 1..n only; {} is one)? */
static bool is_list (lua_State *L, int idx) {
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    int isint;
    lua_Integer k = lua_tointegerx(L, -1, &isint);
    if (lua_type(L, -1) != LUA_TNUMBER || !isint || k < 1 || k > n) {
      lua_pop(L, 1);
      return false;
    }
  }
  return true;
}

/* the position of the options table (the last argument, a table that is
** not a list, or any table after `last_list`), or 0 */
static int options_at (lua_State *L, int last_list) {
  int top = lua_gettop(L);
  if (top < 2 || lua_type(L, top) != LUA_TTABLE) return 0;
  return top > last_list || !is_list(L, top) ? top : 0;
}

/* the number at idx for messages, as the user wrote it: "3", "-1", "0.5",
** "NaN", "math.huge" */
static const char *shownum (lua_State *L, int idx) {
  lua_Number v = lua_tonumber(L, idx);
  if (v != v) return "NaN";
  if (v == HUGE_VAL) return "math.huge";
  if (v == -HUGE_VAL) return "-math.huge";
  return luaL_tolstring(L, idx, NULL);
}

typedef mg_tensor *(*param_fn)(mg_tensor *x, int axis, int keepdims, double p);

/* mg_norm's argument order as param_fn's */
static mg_tensor *norm_fn (mg_tensor *x, int axis, int keepdims, double ord) {
  return mg_norm(x, axis, keepdims, ord);
}

/* the list of axes at arg into gone[]; returns how many */
static int read_axes (lua_State *L, int arg, int nd, bool *gone) {
  int n = mgL_checklist(L, arg, arg, "the axes");
  for (int k = 1; k <= n; k++) {
    lua_geti(L, arg, k);
    char what[32];
    snprintf(what, sizeof what, "axis %d in the list", k);
    int a = mgL_axisat(L, -1, arg, nd, what);
    lua_pop(L, 1);
    if (gone[a]) luaL_argerror(L, arg, "axes must be distinct");
    gone[a] = true;
  }
  return n;
}

/*
** f over the axes at arg: nil (all), one axis, or a list. A list of other
** than one axis (or all) moves those axes to the end and merges them into
** one, so f sees a single axis; permute and reshape carry the gradient.
*/
static int reduce_over (lua_State *L, param_fn f, mg_tensor *x, int arg, bool keepdims, double p) {
  int nd = mg_tensor_ndim(x);
  if (!lua_istable(L, arg)) {
    int axis = mgL_optaxis(L, arg, nd);
    ltensor *box = mgL_newbox(L);
    return mgL_fill(L, box, f(x, axis, keepdims, p));
  }
  bool gone[MG_MAX_DIMS] = {false};
  int count = read_axes(L, arg, nd, gone);
  if (count == 1 || (count == nd && nd > 0)) {
    int axis = MG_ALL_AXES;
    for (int a = 0; a < nd && count == 1; a++) if (gone[a]) axis = a;
    ltensor *box = mgL_newbox(L);
    return mgL_fill(L, box, f(x, axis, keepdims, p));
  }
  const int64_t *shape = mg_tensor_shape(x);
  int perm[MG_MAX_DIMS], k = 0;
  int64_t merged[MG_MAX_DIMS + 1], keep[MG_MAX_DIMS], size = 1;
  for (int a = 0; a < nd; a++) if (!gone[a]) { perm[k] = a; merged[k] = shape[a]; k++; }
  int nkept = k;
  for (int a = 0; a < nd; a++) if (gone[a]) { perm[k++] = a; size *= shape[a]; }
  merged[nkept] = size;
  for (int a = 0; a < nd; a++) keep[a] = gone[a] ? 1 : shape[a];
  ltensor *box = mgL_newbox(L);
  mg_tensor *moved = mg_permute(x, perm);
  mg_tensor *flat = moved ? mg_reshape(moved, merged, nkept + 1) : NULL;
  mg_tensor *r = flat ? f(flat, nkept, 0, p) : NULL;
  mg_tensor_release(moved);
  mg_tensor_release(flat);
  if (r && keepdims) {
    mg_tensor *kr = mg_reshape(r, keep, nd);
    mg_tensor_release(r);
    r = kr;
  }
  return mgL_fill(L, box, r);
}

/* var and std: f(x [, axis or {axes}] [, keepdims] [, {ddof=, unbiased=}]);
** upvalue 1 says which (true: std) */
static int l_moment (lua_State *L) {
  static const char *const keys[] = {"ddof", "unbiased", NULL};
  bool is_std = lua_toboolean(L, lua_upvalueindex(1));
  mg_tensor *x = mgL_checktensor(L, 1);
  double ddof = 0;
  int opt = options_at(L, 2);
  if (opt) {
    mgL_checkoptions(L, opt, keys);
    bool has_ddof = mgL_optionfield(L, opt, "ddof", LUA_TNUMBER) != LUA_TNIL;
    if (has_ddof) {
      ddof = lua_tonumber(L, -1);
      if (!(ddof >= 0) || ddof == HUGE_VAL)
        luaL_argerror(L, opt, lua_pushfstring(L, "option 'ddof' must be a finite number >= 0, got %s",
                                              shownum(L, -1)));
    }
    if (mgL_optionfield(L, opt, "unbiased", LUA_TBOOLEAN) != LUA_TNIL) {
      if (has_ddof) luaL_argerror(L, opt, "give ddof or unbiased, not both");
      ddof = lua_toboolean(L, -1) ? 1 : 0;
    }
    lua_settop(L, opt - 1);
  }
  bool keepdims = mgL_optboolean(L, 3, "keepdims");
  return reduce_over(L, is_std ? mg_std : mg_var, x, 2, keepdims, ddof);
}

/* norm(x [, axis or {axes}] [, keepdims] [, {ord = 2 | 1 | math.huge}]) */
static int l_norm (lua_State *L) {
  static const char *const keys[] = {"ord", NULL};
  mg_tensor *x = mgL_checktensor(L, 1);
  double ord = 2;
  int opt = options_at(L, 2);
  if (opt) {
    mgL_checkoptions(L, opt, keys);
    if (mgL_optionfield(L, opt, "ord", LUA_TNUMBER) != LUA_TNIL) {
      ord = lua_tonumber(L, -1);
      if (ord != 1 && ord != 2 && ord != HUGE_VAL)
        luaL_argerror(L, opt, lua_pushfstring(L, "option 'ord' must be 1, 2 or math.huge, got %s",
                                              shownum(L, -1)));
    }
    lua_settop(L, opt - 1);
  }
  bool keepdims = mgL_optboolean(L, 3, "keepdims");
  return reduce_over(L, norm_fn, x, 2, keepdims, ord);
}

/* cumsum(x [, axis] [, {exclusive=, reverse=}]): nil sums the flattened x */
static int l_cumsum (lua_State *L) {
  static const char *const keys[] = {"exclusive", "reverse", NULL};
  mg_tensor *x = mgL_checktensor(L, 1);
  bool exclusive = false, reverse = false;
  int opt = options_at(L, 1);
  if (opt) {
    mgL_checkoptions(L, opt, keys);
    if (mgL_optionfield(L, opt, "exclusive", LUA_TBOOLEAN) != LUA_TNIL) exclusive = lua_toboolean(L, -1);
    if (mgL_optionfield(L, opt, "reverse", LUA_TBOOLEAN) != LUA_TNIL) reverse = lua_toboolean(L, -1);
    lua_settop(L, opt - 1);
  }
  int axis = mgL_optaxis(L, 2, mg_tensor_ndim(x));
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_cumsum(x, axis, exclusive, reverse));
}

/* }========================================================== */


/* elu(x [, alpha=1]) and leaky_relu(x [, alpha=0.01]): PyTorch's defaults */
static int param_activation (lua_State *L, double alpha_default, mg_tensor *(*op)(mg_tensor *x, double alpha)) {
  mg_tensor *x = mgL_checktensor(L, 1);
  double alpha = luaL_optnumber(L, 2, alpha_default);
  mgL_checknargs(L, 2);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, op(x, alpha));
}
static int l_elu (lua_State *L) { return param_activation(L, 1.0, mg_elu); }
static int l_leaky_relu (lua_State *L) { return param_activation(L, 0.01, mg_leaky_relu); }

/* sets module[name] and methods[name] to the function at the top (popped) */
static void set_both (lua_State *L, int module, int methods, const char *name) {
  lua_pushvalue(L, -1);
  lua_setfield(L, module, name);
  lua_setfield(L, methods, name);
}

void mgL_open_maths (lua_State *L) {
  int module = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, "moongrad.methods");
  int methods = lua_gettop(L);
  static const char *const clamp_names[] = {"clamp", "clip_by_value"};
  for (int i = 0; i < 2; i++) {
    lua_pushstring(L, clamp_names[i]);
    lua_pushcclosure(L, l_clamp, 1);
    set_both(L, module, methods, clamp_names[i]);
  }
  for (int is_std = 0; is_std < 2; is_std++) {
    lua_pushboolean(L, is_std);
    lua_pushcclosure(L, l_moment, 1);
    set_both(L, module, methods, is_std ? "std" : "var");
  }
  lua_pushcfunction(L, l_norm);
  set_both(L, module, methods, "norm");
  lua_pushcfunction(L, l_cumsum);
  set_both(L, module, methods, "cumsum");
  lua_pushcfunction(L, l_elu);
  set_both(L, module, methods, "elu");
  lua_pushcfunction(L, l_leaky_relu);
  set_both(L, module, methods, "leaky_relu");
  lua_settop(L, module);
}

/*
** lindex.c — the Lua side of src/ops/index.c, sort.c and einsum.c: sort,
** argsort, topk, take_along_axis, put_along_axis, flip, tile, repeat, pad,
** tril, triu, masked_fill (as mg.f and x:f()) and einsum (mg.einsum).
**
** Axes and indices are 1-based here and negative ones count from the end;
** the C core below is 0-based. Every function checks its arguments first
** (which may raise), then pushes its empty result boxes, then does the C
** work, which never raises, and fills the boxes.
*/
#include <stdio.h>
#include <string.h>

#include "lbinding.h"

/* {======================== helpers ========================= */

/* an optional axis at arg, 0-based; def (C's -1: the last) when nil */
static int axis_or (lua_State *L, int arg, mg_tensor *x, int def) {
  if (lua_isnoneornil(L, arg)) return def;
  return mgL_optaxis(L, arg, mg_tensor_ndim(x));
}

/* a required axis at arg, 0-based */
static int checkaxis (lua_State *L, int arg, mg_tensor *x) {
  if (lua_isnoneornil(L, arg))
    luaL_argerror(L, arg, lua_pushfstring(L, "axis expected (an integer), got %s", luaL_typename(L, arg)));
  return mgL_optaxis(L, arg, mg_tensor_ndim(x));
}

/* the boolean option key of the options table at arg (nil: def) */
static bool boolopt (lua_State *L, int arg, const char *key, bool def) {
  if (lua_isnoneornil(L, arg)) return def;
  bool v = mgL_optionfield(L, arg, key, LUA_TBOOLEAN) == LUA_TNIL ? def : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* pushes the indices at arg (an int64 tensor, or integers in nested
** tables), 1-based, made 0-based; returns them */
static mg_tensor *push_indices (lua_State *L, int arg, const char *fn) {
  mg_tensor *idx = mgL_testtensor(L, arg);
  if (idx == NULL) {
    luaL_argcheck(L, lua_istable(L, arg) || lua_isinteger(L, arg), arg,
                  "indices expected (an int64 tensor or integers)");
    idx = mgL_pushconstant(L, arg, MG_INT64, true, fn);
  }
  if (mg_tensor_dtype(idx) != MG_INT64)
    luaL_argerror(L, arg, lua_pushfstring(L, "indices must be int64, got %s",
                                          mg_dtype_name(mg_tensor_dtype(idx))));
  ltensor *box = mgL_newbox(L);
  mgL_fill(L, box, mg_indices_from_1based(idx, fn));
  return box->t;
}

/* fills box with 0-based indices made 1-based; takes over ix (may be NULL) */
static int fill_one_based (lua_State *L, ltensor *box, mg_tensor *ix) {
  mg_tensor *one = ix ? mg_scalar(1, MG_INT64) : NULL, *r = one ? mg_add(ix, one) : NULL;
  mg_tensor_release(one);
  mg_tensor_release(ix);
  return mgL_fill(L, box, r);
}

/* an int64 tensor's values (0-d or 1-d), as checkints gives a list's */
static int64_t *tensor_ints (lua_State *L, int arg, mg_tensor *t, const char *what, int64_t *n) {
  if (mg_tensor_dtype(t) != MG_INT64 || mg_tensor_ndim(t) > 1)
    luaL_argerror(L, arg, lua_pushfstring(L, "%s as a tensor must be int64 of 0 or 1 dimensions, got %s with %d",
                                          what, mg_dtype_name(mg_tensor_dtype(t)), mg_tensor_ndim(t)));
  *n = mg_tensor_numel(t);
  int64_t *v = (int64_t *)lua_newuserdatauv(L, sizeof(int64_t) * (size_t)(*n ? *n : 1), 0);
  const int64_t *p = (const int64_t *)mg_tensor_data(t);
  int64_t step = mg_tensor_ndim(t) ? mg_tensor_strides(t)[0] : 0;
  for (int64_t i = 0; i < *n; i++) v[i] = p[i * step];
  return v;
}

/* a list of integers at arg (or one integer, as a list of one, or an int64
** tensor of them) into an int64 array anchored on the stack; returns it, *n
** its length */
static int64_t *checkints (lua_State *L, int arg, const char *what, int64_t *n) {
  mg_tensor *t = mgL_testtensor(L, arg);
  if (t) return tensor_ints(L, arg, t, what, n);
  if (lua_type(L, arg) == LUA_TNUMBER) {
    int64_t *v = (int64_t *)lua_newuserdatauv(L, sizeof(int64_t), 0);
    v[0] = (int64_t)mgL_intat(L, arg, arg, what);
    *n = 1;
    return v;
  }
  if (!lua_istable(L, arg))
    luaL_argerror(L, arg, lua_pushfstring(L, "%s expected (an integer, a list of integers or an int64 tensor), got %s", what,
                                          luaL_typename(L, arg)));
  int len = mgL_checklist(L, arg, arg, what);
  int64_t *v = (int64_t *)lua_newuserdatauv(L, sizeof(int64_t) * (size_t)(len ? len : 1), 0);
  for (int i = 0; i < len; i++) {
    char entry[64];
    snprintf(entry, sizeof entry, "%s entry %d", what, i + 1);
    lua_geti(L, arg, i + 1);
    v[i] = (int64_t)mgL_intat(L, -1, arg, entry);
    lua_pop(L, 1);
  }
  *n = len;
  return v;
}

/* }========================================================== */


/* {===================== sort and topk ====================== */

static const char *const sort_options[] = {"descending", NULL};

/* sort(x [, axis=-1] [, {descending=}]): values and 1-based indices;
** the options may come second */
static int sort_args (lua_State *L, mg_tensor **x, int *axis) {
  *x = mgL_checktensor(L, 1);
  int opts = lua_istable(L, 2) ? 2 : 3;
  *axis = opts == 2 ? -1 : axis_or(L, 2, *x, -1);
  mgL_checkoptions(L, opts, sort_options);
  return boolopt(L, opts, "descending", false);
}

static int l_sort (lua_State *L) {
  mg_tensor *x;
  int axis, desc = sort_args(L, &x, &axis);
  ltensor *bv = mgL_newbox(L), *bi = mgL_newbox(L);
  mg_tensor *v, *ix;
  if (mg_sort(x, axis, desc, &v, &ix) != MG_OK) return mgL_error(L);
  bv->t = v;                                   /* anchored before anything else can raise */
  return fill_one_based(L, bi, ix) + 1;
}

static int l_argsort (lua_State *L) {
  mg_tensor *x;
  int axis, desc = sort_args(L, &x, &axis);
  ltensor *box = mgL_newbox(L);
  return fill_one_based(L, box, mg_argsort(x, axis, desc));
}

static const char *const topk_options[] = {"largest", "sorted", NULL};

/* topk(x, k [, axis=-1] [, {largest=true, sorted=true}]): values and 1-based indices */
static int l_topk (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int64_t k = (int64_t)mgL_intat(L, 2, 2, "k");
  int opts = lua_istable(L, 3) ? 3 : 4;
  int axis = opts == 3 ? -1 : axis_or(L, 3, x, -1);
  mgL_checkoptions(L, opts, topk_options);
  bool largest = boolopt(L, opts, "largest", true), sorted = boolopt(L, opts, "sorted", true);
  ltensor *bv = mgL_newbox(L), *bi = mgL_newbox(L);
  mg_tensor *v, *ix;
  if (mg_topk(x, k, axis, largest, sorted, &v, &ix) != MG_OK) return mgL_error(L);
  bv->t = v;
  return fill_one_based(L, bi, ix) + 1;
}

/* }========================================================== */


/* {================ take_along_axis and put ================== */

/* take_along_axis(x, indices, axis): indices 1-based, with x's ndim */
static int l_take_along_axis (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int axis = checkaxis(L, 3, x);
  mg_tensor *idx = push_indices(L, 2, "take_along_axis");
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_take_along_axis(x, idx, axis));
}

static const char *const put_options[] = {"mode", NULL};

/* put_along_axis(x, indices, values, axis [, {mode="set"|"add"}]) */
static int l_put_along_axis (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  mgL_checkoperandkind(L, 3);
  int axis = checkaxis(L, 4, x);
  mgL_checkoptions(L, 5, put_options);
  int add = 0;
  if (!lua_isnoneornil(L, 5)) {
    if (mgL_optionfield(L, 5, "mode", LUA_TSTRING) != LUA_TNIL) {
      const char *m = lua_tostring(L, -1);
      if (strcmp(m, "add") != 0 && strcmp(m, "set") != 0)
        luaL_argerror(L, 5, lua_pushfstring(L, "unknown mode '%s' (use 'set' or 'add')", m));
      add = strcmp(m, "add") == 0;
    }
    lua_pop(L, 1);
  }
  mg_tensor *idx = push_indices(L, 2, "put_along_axis");
  ltensor *box = mgL_newbox(L);
  bool owned;
  mg_tensor *v = mgL_operand(L, 3, mg_tensor_dtype(x), &owned, "put_along_axis");
  mg_tensor *r = v ? mg_put_along_axis(x, idx, v, axis, add) : NULL;
  if (owned) mg_tensor_release(v);
  return mgL_fill(L, box, r);
}

/* }========================================================== */


/* {====================== rearranging ======================= */

/* flip(x [, axes]): axes an integer or a list; every axis when nil */
static int l_flip (lua_State *L) {
  mgL_checknargs(L, 2);
  mg_tensor *x = mgL_checktensor(L, 1);
  int nd = mg_tensor_ndim(x), axes[MG_MAX_DIMS], n = 0;
  bool all = lua_isnoneornil(L, 2);
  if (lua_type(L, 2) == LUA_TNUMBER) {
    axes[n++] = mgL_axisat(L, 2, 2, nd, "axis");
  } else if (!all) {
    if (!lua_istable(L, 2))
      luaL_argerror(L, 2, lua_pushfstring(L, "axes expected (an integer or a list), got %s",
                                          luaL_typename(L, 2)));
    int len = mgL_checklist(L, 2, 2, "the axes");
    if (len > nd)
      luaL_argerror(L, 2, lua_pushfstring(L, "%d axes given for %d dimensions", len, nd));
    for (; n < len; n++) {
      char what[32];
      snprintf(what, sizeof what, "axis %d in the list", n + 1);
      lua_geti(L, 2, n + 1);
      axes[n] = mgL_axisat(L, -1, 2, nd, what);
      lua_pop(L, 1);
    }
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_flip(x, all ? NULL : axes, n));
}

/* tile(x, reps): reps an integer or a list */
static int l_tile (lua_State *L) {
  mgL_checknargs(L, 2);
  mg_tensor *x = mgL_checktensor(L, 1);
  int64_t n, *reps = checkints(L, 2, "reps", &n);
  if (n > MG_MAX_DIMS)
    luaL_argerror(L, 2, lua_pushfstring(L, "%d repetitions given, at most %d allowed", (int)n, MG_MAX_DIMS));
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_tile(x, reps, (int)n));
}

/* repeat_interleave(x, repeats [, axis]): repeats an integer or one per entry; the
** flattened x when axis is nil */
static int l_repeat_interleave (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int axis = axis_or(L, 3, x, MG_ALL_AXES);
  int64_t n, *reps = checkints(L, 2, "repeats", &n);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_repeat_interleave(x, reps, n, axis));
}

static const char *const pad_options[] = {"mode", "value", NULL};
static const char *const pad_modes[] = {"constant", "reflect", "symmetric", "edge", "wrap", NULL};

/* one {before, after} pair of dimension d (1-based) from the table at -1 */
static void pad_pair (lua_State *L, int d, int64_t *before, int64_t *after) {
  char what[64];
  snprintf(what, sizeof what, "the padding of dimension %d", d);
  if (!lua_istable(L, -1) || mgL_checklist(L, -1, 2, what) != 2)
    luaL_argerror(L, 2, lua_pushfstring(L, "%s must be a {before, after} pair", what));
  lua_geti(L, -1, 1);
  lua_geti(L, -2, 2);
  snprintf(what, sizeof what, "the padding before dimension %d", d);
  *before = (int64_t)mgL_intat(L, -2, 2, what);
  snprintf(what, sizeof what, "the padding after dimension %d", d);
  *after = (int64_t)mgL_intat(L, -1, 2, what);
  lua_pop(L, 2);
}

/* pad(x, paddings [, {mode="constant", value=0}]): paddings one
** {before, after} pair per dimension, or one integer for every side */
static int l_pad (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int nd = mg_tensor_ndim(x);
  int64_t before[MG_MAX_DIMS], after[MG_MAX_DIMS];
  if (lua_type(L, 2) == LUA_TNUMBER) {
    int64_t p = (int64_t)mgL_intat(L, 2, 2, "the padding");
    for (int d = 0; d < nd; d++) before[d] = after[d] = p;
  } else {
    if (!lua_istable(L, 2))
      luaL_argerror(L, 2, lua_pushfstring(L, "paddings expected (a list of {before, after} pairs), got %s",
                                          luaL_typename(L, 2)));
    int len = mgL_checklist(L, 2, 2, "the paddings");
    if (len != nd)
      luaL_argerror(L, 2, lua_pushfstring(L, "%d {before, after} pair%s given for %d dimension%s", len,
                                          len == 1 ? "" : "s", nd, nd == 1 ? "" : "s"));
    for (int d = 0; d < nd; d++) {
      lua_geti(L, 2, d + 1);
      pad_pair(L, d + 1, &before[d], &after[d]);
      lua_pop(L, 1);
    }
  }
  mgL_checkoptions(L, 3, pad_options);
  int mode = MG_PAD_CONSTANT;
  double value = 0;
  if (!lua_isnoneornil(L, 3)) {
    if (mgL_optionfield(L, 3, "mode", LUA_TSTRING) != LUA_TNIL) {
      const char *m = lua_tostring(L, -1);
      for (mode = 0; pad_modes[mode] && strcmp(pad_modes[mode], m) != 0; mode++) {}
      if (pad_modes[mode] == NULL)
        luaL_argerror(L, 3, lua_pushfstring(L, "unknown mode '%s' (use constant, reflect, symmetric, edge "
                                               "or wrap)", m));
    }
    int t = lua_getfield(L, 3, "value");
    if (t != LUA_TNIL) {
      if (mode != MG_PAD_CONSTANT)
        luaL_argerror(L, 3, lua_pushfstring(L, "option 'value' applies to mode 'constant' only, not '%s'",
                                            pad_modes[mode]));
      if (t == LUA_TBOOLEAN) value = lua_toboolean(L, -1);
      else if (t != LUA_TNUMBER)
        luaL_argerror(L, 3, lua_pushfstring(L, "option 'value' must be a number, got %s",
                                            luaL_typename(L, -1)));
      else if (mg_tensor_dtype(x) == MG_INT64)
        value = (double)mgL_intat(L, -1, 3, "option 'value' for an int64 tensor");
      else value = lua_tonumber(L, -1);
    }
    lua_pop(L, 2);
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_pad(x, before, after, (mg_pad_mode)mode, value));
}

/* tril(x [, k=0]) and triu(x [, k=0]); upvalue 1: true for triu */
static int l_triangle (lua_State *L) {
  mgL_checknargs(L, 2);
  mg_tensor *x = mgL_checktensor(L, 1);
  int64_t k = lua_isnoneornil(L, 2) ? 0 : (int64_t)mgL_intat(L, 2, 2, "k");
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, lua_toboolean(L, lua_upvalueindex(1)) ? mg_triu(x, k) : mg_tril(x, k));
}

/* masked_fill(x, mask, value): value a number, a boolean or a 0-d tensor */
static int l_masked_fill (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1), *mask = mgL_checktensor(L, 2);
  mgL_checkoperandkind(L, 3);
  ltensor *box = mgL_newbox(L);
  bool owned;
  mg_tensor *v = mgL_operand(L, 3, mg_tensor_dtype(x), &owned, "masked_fill");
  mg_tensor *r = v ? mg_masked_fill(x, mask, v) : NULL;
  if (owned) mg_tensor_release(v);
  return mgL_fill(L, box, r);
}

/* einsum(spec, a [, b]) */
static int l_einsum (lua_State *L) {
  const char *spec = luaL_checkstring(L, 1);
  int n = lua_gettop(L) - 1;
  luaL_argcheck(L, n >= 1, 2, "moongrad.Tensor expected, got no value");
  mg_tensor **xs = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)n, 0);
  for (int k = 0; k < n; k++) xs[k] = mgL_checktensor(L, k + 2);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_einsum(spec, n, xs));
}

/* }========================================================== */


static const luaL_Reg index_funcs[] = {         /* mg.f(x, ...) and x:f(...) */
  {"sort", l_sort}, {"argsort", l_argsort}, {"topk", l_topk},
  {"take_along_axis", l_take_along_axis}, {"put_along_axis", l_put_along_axis},
  {"flip", l_flip}, {"tile", l_tile}, {"repeat_interleave", l_repeat_interleave}, {"pad", l_pad},
  {"masked_fill", l_masked_fill},
  {NULL, NULL}
};

/* the module table is at the top */
void mgL_open_index (lua_State *L) {
  int module = lua_gettop(L);
  mgL_setfuncs(L, index_funcs);
  lua_pushcfunction(L, l_einsum);
  lua_setfield(L, module, "einsum");
  lua_getfield(L, LUA_REGISTRYINDEX, "moongrad.methods");
  int methods = lua_gettop(L);
  mgL_setfuncs(L, index_funcs);
  for (int upper = 0; upper < 2; upper++) {
    lua_pushboolean(L, upper);
    lua_pushcclosure(L, l_triangle, 1);
    lua_pushvalue(L, -1);
    lua_setfield(L, module, upper ? "triu" : "tril");
    lua_setfield(L, methods, upper ? "triu" : "tril");
  }
  lua_settop(L, module);
}

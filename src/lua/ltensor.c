/*
** ltensor.c — the tensor userdata: constructors, metamethods, and every op
** as both a module function (mg.sum(x)) and a method (x:sum()).
**
** Axes and indices are 1-based here, as everywhere in Lua, and negative
** ones count from the end; the C core below is 0-based.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lbinding.h"

/* {======================= metamethods ====================== */

static int tensor_tostring (lua_State *L) {
  mg_tensor *t = mgL_checktensor(L, 1);
  char *s = mg_tensor_format(t);
  if (s == NULL) return luaL_error(L, "tostring: out of memory");
  lua_pushstring(L, s);
  free(s);
  return 1;
}

static int tensor_len (lua_State *L) {
  mg_tensor *t = mgL_checktensor(L, 1);
  if (mg_tensor_ndim(t) == 0) return luaL_error(L, "attempt to get the length of a 0-d tensor");
  lua_pushinteger(L, (lua_Integer)mg_tensor_shape(t)[0]);
  return 1;
}

static int tensor_compare (lua_State *L) {
  return luaL_error(L, "attempt to compare tensors with '<' or '<=' (Lua wants one boolean); "
                       "use mg.less, mg.less_equal, mg.greater ... for elementwise comparison");
}

static int tensor_newindex (lua_State *L) {
  return luaL_error(L, "tensors are immutable (use a mg.Variable for state that changes)");
}

/* x[i]: the i-th entry along the first axis, as a view */
int mgL_index_first_axis (lua_State *L, mg_tensor *t, lua_Integer i) {
  if (mg_tensor_ndim(t) == 0) return luaL_error(L, "attempt to index a 0-d tensor");
  int64_t n = mg_tensor_shape(t)[0];
  int64_t k = i > 0 ? i - 1 : n + i;
  if (i == 0 || k < 0 || k >= n)
    return n == 0 ? luaL_error(L, "index %I is out of bounds for dimension 1 of size 0 (the dimension is empty)", i)
                  : luaL_error(L, "index %I is out of bounds for dimension 1 of size %I (use 1..%I or -%I..-1: "
                                  "indices are 1-based)", i, (lua_Integer)n, (lua_Integer)n, (lua_Integer)n);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_select(t, 0, k));
}

/* __index: methods first, then the fields (mgL_pushfield), then x[i] */
static int tensor_index (lua_State *L) {
  mg_tensor *t = mgL_checktensor(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
    if (!mgL_pushfield(L, t, lua_tostring(L, 2))) lua_pushnil(L);
    return 1;
  }
  if (lua_type(L, 2) == LUA_TNUMBER)          /* x[1.0] is x[1], as for Lua tables */
    return mgL_index_first_axis(L, t, mgL_intat(L, 2, 2, "index"));
  return luaL_error(L, "a tensor's index must be an integer (1-based, negative from the end) or a name, got %s: "
                       "x[i][j] picks one entry, x:slice({a, b}, ...) a range, mg.gather many", luaL_typename(L, 2));
}

/* }========================================================== */


/* {====================== constructors ====================== */

static int l_constant (lua_State *L) {
  luaL_checkany(L, 1);
  bool given = !lua_isnoneornil(L, 2);
  if (!given && lua_type(L, 1) == LUA_TNUMBER) {          /* constant(1.0): the common case */
    ltensor *box = mgL_newbox(L);
    return mgL_fill(L, box, mg_full(NULL, 0, MG_FLOAT32, lua_tonumber(L, 1)));  /* a tensor, not a number */
  }
  mgL_pushconstant(L, 1, mgL_optdtype(L, 2, MG_FLOAT32), given, "constant");
  return 1;
}

/* shape (a table or integers), then an optional dtype; returns ndim, sets *next */
static int shape_args (lua_State *L, int64_t *shape, int *next) {
  int nd = mgL_checkshape(L, 1, shape, true);
  *next = lua_istable(L, 1) ? 2 : 1 + nd;
  return nd;
}

static int filled (lua_State *L, double value) {
  int64_t shape[MG_MAX_DIMS];
  int next, nd = shape_args(L, shape, &next);
  mg_dtype dt = mgL_optdtype(L, next, MG_FLOAT32);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_full(shape, nd, dt, value));
}

static int l_zeros (lua_State *L) { return filled(L, 0.0); }
static int l_ones (lua_State *L) { return filled(L, 1.0); }

static int l_full (lua_State *L) {
  int64_t shape[MG_MAX_DIMS];
  int nd = mgL_checkshape(L, 1, shape, false);
  double v = lua_isboolean(L, 2) ? lua_toboolean(L, 2) : luaL_checknumber(L, 2);
  mg_dtype dt = mgL_optdtype(L, 3, lua_isboolean(L, 2) ? MG_BOOL : MG_FLOAT32);
  if (dt == MG_INT64 && lua_type(L, 2) == LUA_TNUMBER) {   /* exact, not through double */
    lua_Integer iv = mgL_intat(L, 2, 2, "the value for an int64 tensor");
    ltensor *box = mgL_newbox(L);
    return mgL_fill(L, box, mg_full_int64(shape, nd, (int64_t)iv));
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_full(shape, nd, dt, v));
}

static int filled_like (lua_State *L, double value) {
  mg_tensor *x = mgL_checktensor(L, 1);
  mg_dtype dt = mgL_optdtype(L, 2, mg_tensor_dtype(x));
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_full(mg_tensor_shape(x), mg_tensor_ndim(x), dt, value));
}

static int l_zeros_like (lua_State *L) { return filled_like(L, 0.0); }
static int l_ones_like (lua_State *L) { return filled_like(L, 1.0); }

/* arange(stop) / arange(start, stop [, step]) [, dtype]: [start, stop) */
static int l_arange (lua_State *L) {
  int n = 0;
  double v[3];
  while (n < 3 && lua_type(L, n + 1) == LUA_TNUMBER) { v[n] = lua_tonumber(L, n + 1); n++; }
  if (n == 0) luaL_argerror(L, 1, lua_pushfstring(L, "number expected, got %s", luaL_typename(L, 1)));
  mg_dtype dt = mgL_optdtype(L, n + 1, MG_FLOAT32);
  if (dt == MG_INT64) {                        /* exact for every int64 */
    lua_Integer iv[3] = {0, 0, 1};
    for (int k = 0; k < n; k++) iv[n == 1 ? 1 : k] = mgL_intat(L, k + 1, k + 1, "an int64 bound or step");
    ltensor *box = mgL_newbox(L);
    return mgL_fill(L, box, mg_arange_int64(iv[0], iv[1], iv[2]));
  }
  double start = n >= 2 ? v[0] : 0, stop = n >= 2 ? v[1] : v[0], step = n == 3 ? v[2] : 1;
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_arange(start, stop, step, dt));
}

static int l_eye (lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  lua_Integer m = lua_type(L, 2) == LUA_TNUMBER ? luaL_checkinteger(L, 2) : n;
  mg_dtype dt = mgL_optdtype(L, lua_type(L, 2) == LUA_TNUMBER ? 3 : 2, MG_FLOAT32);
  luaL_argcheck(L, n >= 0 && m >= 0, 1, "sizes must not be negative");
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_eye(n, m, dt));
}

/* }========================================================== */


/* {===================== values out ========================= */

static int l_item (lua_State *L) {
  mg_tensor *t = mgL_checktensor(L, 1);
  if (mg_tensor_numel(t) != 1)
    return luaL_error(L, "item: tensor has %I elements, expected 1", (lua_Integer)mg_tensor_numel(t));
  if (mg_tensor_need_values(t, "item") != MG_OK) return mgL_error(L);
  int64_t idx[MG_MAX_DIMS] = {0};
  switch (mg_tensor_dtype(t)) {
    case MG_INT64: lua_pushinteger(L, (lua_Integer)*(const int64_t *)mg_tensor_data(t)); break;   /* exact */
    case MG_BOOL: lua_pushboolean(L, mg_tensor_get(t, idx) != 0); break;
    default: lua_pushnumber(L, mg_tensor_get(t, idx)); break;
  }
  return 1;
}

/* a Lua table holds at most 2^31 entries: refuse at once what cannot fit */
#define MAX_TOTABLE ((int64_t)1 << 31)

/* the tables totable makes: one per index of each leading prefix of the
** shape (an empty tensor of 2^40 rows would need 2^40 empty tables) */
static int64_t tables_needed (const mg_tensor *t) {
  int64_t total = 1, level = 1;
  const int64_t *shape = mg_tensor_shape(t);
  for (int d = 0; d + 1 < mg_tensor_ndim(t) && level > 0; d++) {   /* an empty axis: no tables below it */
    level = shape[d] > MAX_TOTABLE / level ? MAX_TOTABLE + 1 : level * shape[d];
    total += level;
    if (total > MAX_TOTABLE) return MAX_TOTABLE + 1;
  }
  return total;
}

static int l_totable (lua_State *L) {
  mgL_checknargs(L, 1);
  mg_tensor *t = mgL_checktensor(L, 1);
  if (mg_tensor_need_values(t, "totable") != MG_OK) return mgL_error(L);
  if (mg_tensor_numel(t) > MAX_TOTABLE)
    return luaL_error(L, "totable: %I elements are too many for Lua tables (at most %I)",
                      (lua_Integer)mg_tensor_numel(t), (lua_Integer)MAX_TOTABLE);
  if (tables_needed(t) > MAX_TOTABLE) {
    char sh[160];
    mg_shape_str(sh, sizeof sh, mg_tensor_shape(t), mg_tensor_ndim(t));
    return luaL_error(L, "totable: a %s tensor needs more than %I nested tables", sh,
                      (lua_Integer)MAX_TOTABLE);
  }
  mgL_pushvalues(L, t);
  return 1;
}

static int l_numel (lua_State *L) {
  mgL_checknargs(L, 1);
  lua_pushinteger(L, (lua_Integer)mg_tensor_numel(mgL_checktensor(L, 1)));
  return 1;
}

static void setfield_str (lua_State *L, const char *k, const char *v) {
  if (v == NULL) return;
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

/* ops(): the op registry, {name=, kind=, symbol=, metamethod=, doc=, product=} per op */
static int l_ops (lua_State *L) {
  mgL_checknargs(L, 0);
  static const char *const kinds[] = {"unary", "binary", "reduce", "other"};
  int n = mg_op_count();
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    const mg_opinfo *op = mg_op_info(i);
    lua_createtable(L, 0, 6);
    lua_pushboolean(L, op->product);
    lua_setfield(L, -2, "product");
    setfield_str(L, "name", op->name);
    setfield_str(L, "kind", kinds[op->kind]);
    setfield_str(L, "symbol", op->symbol);
    setfield_str(L, "metamethod", op->metamethod);
    setfield_str(L, "doc", op->doc);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_is_tensor (lua_State *L) {
  mgL_checknargs(L, 1);
  lua_pushboolean(L, mgL_testbox(L, 1) != NULL);
  return 1;
}

/* mg.print(...): like tf.print, values (no footer) and strings, to stdout */
static int l_print (lua_State *L) {
  int n = lua_gettop(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 1; i <= n; i++) {
    if (i > 1) luaL_addchar(&b, ' ');
    mg_tensor *t = mgL_testtensor(L, i);
    if (t) {
      char *s = mg_tensor_format(t);
      if (s == NULL) return luaL_error(L, "print: out of memory");
      char *nl = strrchr(s, '\n');                 /* drop the footer line */
      luaL_addlstring(&b, s, nl ? (size_t)(nl - s) : strlen(s));
      free(s);
    } else {
      luaL_tolstring(L, i, NULL);
      luaL_addvalue(&b);
    }
  }
  luaL_addchar(&b, '\n');
  luaL_pushresult(&b);
  size_t len;
  const char *s = lua_tolstring(L, -1, &len);
  fwrite(s, 1, len, stdout);
  fflush(stdout);
  return 0;
}

/* }========================================================== */


/* {================ binary and unary ops ==================== */

/* The registry's ops are closures over the binding's state (upvalue 1,
** lbinding.h), their row (2) and whether they are a metamethod (3). */
static const mg_opinfo *row (lua_State *L) {
  return (const mg_opinfo *)lua_touserdata(L, lua_upvalueindex(2));
}

/* a value's type for messages: its metatable's __name when it has one */
static const char *type_name (lua_State *L, int idx) {
  if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING) {
    const char *n = lua_tostring(L, -1);
    lua_pop(L, 1);                          /* still anchored by the metatable */
    return n;
  }
  return luaL_typename(L, idx);
}

/* raises the error for a bad operand of a binary op */
static int bad_operand (lua_State *L, const mg_opinfo *op, bool meta) {
  if (meta && op->verb)
    return luaL_error(L, "attempt to %s a '%s' with a '%s'", op->verb, type_name(L, 1),
                      type_name(L, 2));
  mgL_checkoperandkind(L, 1);
  mgL_checkoperandkind(L, 2);
  return 0;
}

static bool arithmetic (const mg_opinfo *op) {
  mg_tensor *(*f)(mg_tensor *, mg_tensor *) = op->fn.binary;
  return f == mg_add || f == mg_sub || f == mg_mul || f == mg_div || f == mg_pow || f == mg_floordiv ||
         f == mg_mod || f == mg_maximum || f == mg_minimum;
}

/* upvalue 1: the registry row; upvalue 2: true when called as a metamethod */
static int l_binary (lua_State *L) {
  const mg_opinfo *op = row(L);
  if (!lua_toboolean(L, lua_upvalueindex(3))) mgL_checknargs(L, 2);   /* a metamethod gets 2 */
  mg_tensor *a = mgL_testtensor(L, 1), *b = mgL_testtensor(L, 2);
  if (a && b) {                                  /* the common case, checked once */
    ltensor *box = mgL_newbox(L);
    return mgL_fill(L, box, op->fn.binary(a, b));
  }
  if ((!a && mgL_operandkind(L, 1) == MGL_OTHER) || (!b && mgL_operandkind(L, 2) == MGL_OTHER))
    return bad_operand(L, op, lua_toboolean(L, lua_upvalueindex(3)));
  mg_dtype like = a ? mg_tensor_dtype(a) : b ? mg_tensor_dtype(b) : mgL_likedtype(L, 1, 2, MG_FLOAT32);
  /* a number beside a half tensor enters arithmetic in float32: it computes
  ** halves in float32 and gives float32, so rounding the number to the half
  ** dtype first would only lose it (65536 is infinite in float16, 1e-8 is 0);
  ** comparisons round it, as NumPy and PyTorch do (a float16 0.1 == 0.1) */
  if ((like == MG_FLOAT16 || like == MG_BFLOAT16) && arithmetic(op)) like = MG_FLOAT32;
  ltensor *box = mgL_newbox(L);
  bool oa = false, ob = false;
  if (!a) a = mgL_operand(L, 1, like, &oa, op->name);
  if (a && !b) b = mgL_operand(L, 2, like, &ob, op->name);
  mg_tensor *r = a && b ? op->fn.binary(a, b) : NULL;
  if (oa) mg_tensor_release(a);
  if (ob) mg_tensor_release(b);
  return mgL_fill(L, box, r);
}

static int l_unary (lua_State *L) {
  const mg_opinfo *op = row(L);
  if (!lua_toboolean(L, lua_upvalueindex(3))) mgL_checknargs(L, 1);   /* __unm gets x twice */
  mg_tensor *x = mgL_checktensor(L, 1);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, op->fn.unary(x));
}

static int l_where (lua_State *L) {
  mg_tensor *c = mgL_checktensor(L, 1);
  mgL_checkoperandkind(L, 2);
  mgL_checkoperandkind(L, 3);
  mg_dtype like = mgL_likedtype(L, 2, 3, MG_FLOAT32);
  ltensor *box = mgL_newbox(L);
  bool oa = false, ob = false;
  mg_tensor *a = mgL_operand(L, 2, like, &oa, "where");
  mg_tensor *b = a ? mgL_operand(L, 3, like, &ob, "where") : NULL;
  mg_tensor *r = a && b ? mg_where(c, a, b) : NULL;
  if (oa) mg_tensor_release(a);
  if (ob) mg_tensor_release(b);
  return mgL_fill(L, box, r);
}

static int l_cast (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  mg_dtype dt = mgL_optdtype(L, 2, MG_FLOAT32);
  luaL_checkstring(L, 2);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_cast(x, dt));
}

/* }========================================================== */


/* {======================= reductions ======================= */

typedef mg_tensor *(*reduce_fn)(mg_tensor *, int, int);

/* reduces x over the axes in the list at arg, one at a time */
static mg_tensor *reduce_axes (lua_State *L, int arg, mg_tensor *x, reduce_fn fn, int keepdims) {
  int nd = mg_tensor_ndim(x), n = mgL_checklist(L, arg, arg, "the axes");
  bool gone[MG_MAX_DIMS] = {false};
  for (int k = 1; k <= n; k++) {
    lua_geti(L, arg, k);
    char what[32];
    snprintf(what, sizeof what, "axis %d in the list", k);
    int a = mgL_axisat(L, -1, arg, nd, what);
    lua_pop(L, 1);
    if (gone[a]) luaL_argerror(L, arg, "axes must be distinct");
    gone[a] = true;
  }
  ltensor *tmp = mgL_newbox(L);            /* anchors the intermediate results */
  tmp->t = mg_tensor_retain(x);
  for (int a = nd - 1; a >= 0 && tmp->t; a--) {
    if (!gone[a]) continue;
    mg_tensor *next = fn(tmp->t, a, 1);
    mg_tensor_release(tmp->t);
    tmp->t = next;
  }
  if (tmp->t == NULL) { mgL_error(L); return NULL; }
  int64_t shape[MG_MAX_DIMS];
  int k = 0;
  for (int a = 0; a < nd; a++) if (!gone[a] || keepdims) shape[k++] = gone[a] ? 1 : mg_tensor_shape(x)[a];
  mg_tensor *r = mg_reshape(tmp->t, shape, k);
  lua_pop(L, 1);
  return r;
}

/* upvalue 1: the registry row.  f(x [, axis or {axes}] [, keepdims]) */
static int l_reduce (lua_State *L) {
  reduce_fn fn = row(L)->fn.reduce;
  mgL_checknargs(L, 3);
  mg_tensor *x = mgL_checktensor(L, 1);
  int keepdims = mgL_optboolean(L, 3, "keepdims");
  if (lua_istable(L, 2)) {
    mg_tensor *r = reduce_axes(L, 2, x, fn, keepdims);
    ltensor *box = mgL_newbox(L);
    return mgL_fill(L, box, r);
  }
  int axis = mgL_optaxis(L, 2, mg_tensor_ndim(x));
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, fn(x, axis, keepdims));
}

/* argmax/argmin: 1-based indices; over the flattened tensor without an axis */
static int arg_extreme (lua_State *L, reduce_fn fn) {
  mgL_checknargs(L, 3);
  mg_tensor *x = mgL_checktensor(L, 1);
  int axis = mgL_optaxis(L, 2, mg_tensor_ndim(x));
  int keepdims = mgL_optboolean(L, 3, "keepdims");
  ltensor *box = mgL_newbox(L);
  mg_tensor *i0 = fn(x, axis, keepdims), *one = i0 ? mg_scalar(1, MG_INT64) : NULL;
  mg_tensor *r = one ? mg_add(i0, one) : NULL;
  mg_tensor_release(i0);
  mg_tensor_release(one);
  return mgL_fill(L, box, r);
}

static int l_argmax (lua_State *L) { return arg_extreme(L, mg_argmax); }
static int l_argmin (lua_State *L) { return arg_extreme(L, mg_argmin); }

/* }========================================================== */


/* {======================= shape ops ======================== */

static int l_reshape (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int64_t shape[MG_MAX_DIMS];
  int nd = 0;
  char what[32];
  if (lua_istable(L, 2)) {                    /* -1 allowed: read by hand */
    int n = mgL_checklist(L, 2, 2, "the shape");
    if (n > MG_MAX_DIMS)
      luaL_argerror(L, 2, lua_pushfstring(L, "%d dimensions given, at most %d allowed", n, MG_MAX_DIMS));
    for (; nd < n; nd++) {
      lua_geti(L, 2, nd + 1);
      snprintf(what, sizeof what, "dimension %d", nd + 1);
      shape[nd] = (int64_t)mgL_intat(L, -1, 2, what);
      lua_pop(L, 1);
    }
  } else {
    int top = lua_gettop(L);
    if (top - 1 > MG_MAX_DIMS)
      luaL_argerror(L, 2 + MG_MAX_DIMS, lua_pushfstring(L, "%d dimensions given, at most %d allowed",
                                                        top - 1, MG_MAX_DIMS));
    for (int a = 2; a <= top; a++, nd++) {
      snprintf(what, sizeof what, "dimension %d", nd + 1);
      shape[nd] = (int64_t)mgL_intat(L, a, a, what);
    }
    if (nd == 0) luaL_argerror(L, 2, lua_pushfstring(L, "shape expected, got %s", luaL_typename(L, 2)));
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_reshape(x, shape, nd));
}

/* transpose(x [, perm]): reverses the axes, or permutes them (1-based) */
static int l_transpose (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int nd = mg_tensor_ndim(x), perm[MG_MAX_DIMS];
  if (lua_isnoneornil(L, 2)) {
    for (int i = 0; i < nd; i++) perm[i] = nd - 1 - i;
  } else {
    luaL_checktype(L, 2, LUA_TTABLE);
    int n = mgL_checklist(L, 2, 2, "the permutation");
    if (n != nd)
      luaL_argerror(L, 2, lua_pushfstring(L, "permutation has %d entries for %d dimensions", n, nd));
    for (int i = 0; i < nd; i++) {
      lua_geti(L, 2, i + 1);
      char what[40];
      snprintf(what, sizeof what, "permutation entry %d", i + 1);
      perm[i] = mgL_axisat(L, -1, 2, nd, what);
      lua_pop(L, 1);
    }
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_permute(x, perm));
}

static int l_swapaxes (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int a = mgL_optaxis(L, 2, mg_tensor_ndim(x)), b = mgL_optaxis(L, 3, mg_tensor_ndim(x));
  luaL_argcheck(L, a != MG_ALL_AXES, 2, "axis expected");
  luaL_argcheck(L, b != MG_ALL_AXES, 3, "axis expected");
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_transpose(x, a, b));
}

static int l_expand_dims (lua_State *L) {
  mgL_checknargs(L, 2);
  mg_tensor *x = mgL_checktensor(L, 1);
  int a = mgL_optaxis(L, 2, mg_tensor_ndim(x) + 1);
  luaL_argcheck(L, a != MG_ALL_AXES, 2, "axis expected");
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_expand_dims(x, a));
}

static int l_squeeze (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int a = mgL_optaxis(L, 2, mg_tensor_ndim(x));
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_squeeze(x, a));
}

static int l_broadcast_to (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int64_t shape[MG_MAX_DIMS];
  int nd = mgL_checkshape(L, 2, shape, false);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_broadcast_to(x, shape, nd));
}

/* one position along a dimension of size n, 1-based or negative; -> 0-based */
static int64_t position (lua_State *L, int arg, lua_Integer v, int64_t n, int dim, const char *what) {
  int64_t k = v > 0 ? v - 1 : n + v;
  if (v == 0 || k < 0 || k >= n)
    luaL_argerror(L, arg, n == 0 ? lua_pushfstring(L, "%s %I is out of range for dimension %d of size 0 "
                                                      "(the dimension is empty)", what, v, dim)
                                 : lua_pushfstring(L, "%s %I is out of range for dimension %d of size %I (use 1..%I or "
                                                      "-%I..-1: indices are 1-based)", what, v, dim,
                                                   (lua_Integer)n, (lua_Integer)n, (lua_Integer)n));
  return k;
}

/*
** x:slice(s1, s2, ...): per dimension, nil or {} keeps all of it, an
** integer i picks entry i and drops the dimension, {start, stop, step}
** keeps start..stop inclusive (1-based; negative counts from the end).
*/
static int l_slice (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int nd = mg_tensor_ndim(x), nspec = lua_gettop(L) - 1;
  if (nspec > nd) return luaL_error(L, "slice: %d indices for a tensor with %d dimensions", nspec, nd);
  int64_t start[MG_MAX_DIMS], stop[MG_MAX_DIMS], step[MG_MAX_DIMS], shape[MG_MAX_DIMS];
  int kept = 0;
  for (int d = 0; d < nd; d++) {
    int arg = d + 2;
    int64_t n = mg_tensor_shape(x)[d];
    start[d] = 0; stop[d] = n; step[d] = 1;
    if (d >= nspec || lua_isnil(L, arg)) { shape[kept++] = n; continue; }
    if (lua_type(L, arg) == LUA_TNUMBER) {
      start[d] = position(L, arg, mgL_intat(L, arg, arg, "index"), n, d + 1, "index");
      stop[d] = start[d] + 1;
      continue;                                   /* dimension dropped */
    }
    luaL_argcheck(L, lua_istable(L, arg), arg, "integer or {start, stop, step} expected");
    if (mgL_checklist(L, arg, arg, "a {start, stop, step} range") > 3)
      luaL_argerror(L, arg, "a {start, stop, step} range has at most 3 entries");
    lua_geti(L, arg, 3);
    step[d] = lua_isnil(L, -1) ? 1 : (int64_t)mgL_intat(L, -1, arg, "step");
    lua_pop(L, 1);
    luaL_argcheck(L, step[d] != 0, arg, "step must not be 0");
    lua_geti(L, arg, 1);
    lua_geti(L, arg, 2);
    bool fwd = step[d] > 0;
    start[d] = lua_isnil(L, -2) ? (fwd ? 0 : n - 1) : position(L, arg, mgL_intat(L, -2, arg, "start"), n, d + 1, "start");
    int64_t last = lua_isnil(L, -1) ? (fwd ? n - 1 : 0) : position(L, arg, mgL_intat(L, -1, arg, "stop"), n, d + 1, "stop");
    lua_pop(L, 2);
    stop[d] = fwd ? last + 1 : last - 1;           /* exclusive */
    if (fwd ? stop[d] < start[d] : stop[d] > start[d]) stop[d] = start[d];   /* empty */
    /* entries in [start, stop) by |step|, in unsigned arithmetic: any step is fine */
    uint64_t span = fwd ? (uint64_t)(stop[d] - start[d]) : (uint64_t)(start[d] - stop[d]);
    uint64_t mag = fwd ? (uint64_t)step[d] : 0 - (uint64_t)step[d];
    shape[kept++] = span ? (int64_t)((span - 1) / mag + 1) : 0;
  }
  ltensor *box = mgL_newbox(L);
  mg_tensor *s = mg_slice(x, start, stop, step);
  mg_tensor *r = s && kept != nd ? mg_reshape(s, shape, kept) : (s ? mg_tensor_retain(s) : NULL);
  mg_tensor_release(s);
  return mgL_fill(L, box, r);
}

/* the tensors in the list at arg, borrowed; n returned */
static mg_tensor **tensor_list (lua_State *L, int arg, int *n) {
  luaL_checktype(L, arg, LUA_TTABLE);
  int len = mgL_checklist(L, arg, arg, "the tensors");
  luaL_argcheck(L, len >= 1, arg, "a list of at least one tensor expected");
  mg_tensor **xs = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)len, 0);
  for (int k = 0; k < len; k++) {
    lua_geti(L, arg, k + 1);
    xs[k] = mgL_testtensor(L, -1);
    if (xs[k] == NULL)
      luaL_argerror(L, arg, lua_pushfstring(L, "entry %d is a %s, not a tensor", k + 1, luaL_typename(L, -1)));
    lua_pop(L, 1);
  }
  *n = len;
  return xs;
}

static int joined (lua_State *L, mg_tensor *(*fn)(mg_tensor *const *, int, int), int extra) {
  int n;
  lua_settop(L, 2);
  mg_tensor **xs = tensor_list(L, 1, &n);
  int axis = lua_isnoneornil(L, 2) ? 0 : mgL_optaxis(L, 2, mg_tensor_ndim(xs[0]) + extra);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, fn(xs, n, axis));
}

static int l_concat (lua_State *L) { return joined(L, mg_concat, 0); }
static int l_stack (lua_State *L) { return joined(L, mg_stack, 1); }

/* pushes the indices at arg (int64 tensor or integers, 1-based, negative
** from the end) made 0-based (negative ones stay: C counts them from the end too) */
static mg_tensor *push_zero_based (lua_State *L, int arg, const char *fn) {
  mg_tensor *idx = mgL_testtensor(L, arg);
  if (idx == NULL) {
    luaL_argcheck(L, lua_istable(L, arg) || lua_isinteger(L, arg), arg,
                  "indices expected (an int64 tensor or integers)");
    idx = mgL_pushconstant(L, arg, MG_INT64, true, fn);
  }
  if (mg_tensor_dtype(idx) != MG_INT64)
    luaL_argerror(L, arg, lua_pushfstring(L, "indices must be int64, got %s", mg_dtype_name(mg_tensor_dtype(idx))));
  ltensor *box = mgL_newbox(L);
  mgL_fill(L, box, mg_indices_from_1based(idx, fn));
  return box->t;
}

/* gather(x, indices [, axis]): entries of x at indices along axis (default 1) */
static int l_gather (lua_State *L) {
  mg_tensor *x = mgL_checktensor(L, 1);
  int axis = lua_isnoneornil(L, 3) ? 0 : mgL_optaxis(L, 3, mg_tensor_ndim(x));
  mg_tensor *idx = push_zero_based(L, 2, "gather");
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_gather(x, idx, axis));
}

static int l_softmax (lua_State *L) {
  mgL_checknargs(L, 2);
  mg_tensor *x = mgL_checktensor(L, 1);
  int axis = lua_isnoneornil(L, 2) ? -1 : mgL_optaxis(L, 2, mg_tensor_ndim(x));
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, lua_toboolean(L, lua_upvalueindex(1)) ? mg_log_softmax(x, axis) : mg_softmax(x, axis));
}

/* }========================================================== */


static const luaL_Reg tensor_funcs[] = {       /* mg.f(x, ...) and x:f(...) */
  {"item", l_item}, {"totable", l_totable}, {"numel", l_numel},
  {"where", l_where}, {"cast", l_cast}, {"argmax", l_argmax}, {"argmin", l_argmin},
  {"reshape", l_reshape}, {"transpose", l_transpose}, {"swapaxes", l_swapaxes},
  {"expand_dims", l_expand_dims}, {"squeeze", l_squeeze}, {"broadcast_to", l_broadcast_to},
  {"slice", l_slice}, {"gather", l_gather},
  {NULL, NULL}
};

static const luaL_Reg module_funcs[] = {        /* mg.f only */
  {"constant", l_constant}, {"tensor", l_constant}, {"zeros", l_zeros}, {"ones", l_ones},
  {"full", l_full}, {"zeros_like", l_zeros_like}, {"ones_like", l_ones_like},
  {"arange", l_arange}, {"eye", l_eye}, {"concat", l_concat}, {"stack", l_stack},
  {"print", l_print}, {"is_tensor", l_is_tensor}, {"ops", l_ops},
  {NULL, NULL}
};

/* sets module[name] and methods[name] to a closure of fn over the row */
static void add_op (lua_State *L, int module, int methods, const mg_opinfo *op, lua_CFunction fn) {
  mgL_pushstate(L);
  lua_pushlightuserdata(L, (void *)op);
  lua_pushboolean(L, 0);
  lua_pushcclosure(L, fn, 3);
  lua_pushvalue(L, -1);
  lua_setfield(L, module, op->name);
  lua_setfield(L, methods, op->name);
}

/* mt[op->metamethod] = the op, as a metamethod (its errors say "attempt to ...") */
static void add_metamethod (lua_State *L, int mt, const mg_opinfo *op) {
  mgL_pushstate(L);
  lua_pushlightuserdata(L, (void *)op);
  lua_pushboolean(L, 1);
  lua_pushcclosure(L, op->kind == MG_OP_UNARY ? l_unary : l_binary, 3);
  lua_setfield(L, mt, op->metamethod);
}

/* every unary, binary and reduction op of the registry, as mg.f and x:f() */
static void add_registry (lua_State *L, int module, int methods) {
  for (int i = 0, n = mg_op_count(); i < n; i++) {
    const mg_opinfo *op = mg_op_info(i);
    switch (op->kind) {
      case MG_OP_UNARY: add_op(L, module, methods, op, l_unary); break;
      case MG_OP_BINARY: add_op(L, module, methods, op, l_binary); break;
      case MG_OP_REDUCE: add_op(L, module, methods, op, l_reduce); break;
      default: break;                          /* bound by hand above */
    }
  }
}

/* the table at -1 is the module; adds tensor functions and the metatable */
void mgL_open_tensor (lua_State *L) {
  int module = lua_gettop(L);
  mgL_setfuncs(L, module_funcs);
  mgL_setfuncs(L, tensor_funcs);
  lua_newtable(L);                             /* methods */
  int methods = lua_gettop(L);
  mgL_setfuncs(L, tensor_funcs);
  add_registry(L, module, methods);
  for (int logf = 0; logf < 2; logf++) {
    lua_pushboolean(L, logf);
    lua_pushcclosure(L, l_softmax, 1);
    lua_pushvalue(L, -1);
    lua_setfield(L, module, logf ? "log_softmax" : "softmax");
    lua_setfield(L, methods, logf ? "log_softmax" : "softmax");
  }
  luaL_newmetatable(L, MG_TENSOR_MT);
  int mt = lua_gettop(L);
  static const luaL_Reg meta[] = {
    {"__gc", mgL_tensor_gc}, {"__close", mgL_tensor_gc}, {"__tostring", tensor_tostring},
    {"__len", tensor_len}, {"__lt", tensor_compare}, {"__le", tensor_compare},
    {"__newindex", tensor_newindex}, {NULL, NULL}
  };
  mgL_setfuncs(L, meta);
  for (int i = 0, n = mg_op_count(); i < n; i++)
    if (mg_op_info(i)->metamethod) add_metamethod(L, mt, mg_op_info(i));
  lua_pushvalue(L, methods);
  lua_pushcclosure(L, tensor_index, 1);
  lua_setfield(L, mt, "__index");
  lua_pushvalue(L, methods);                   /* for the variable metatable */
  lua_setfield(L, LUA_REGISTRYINDEX, "moongrad.methods");
  lua_settop(L, module);
}

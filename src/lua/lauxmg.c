/*
** lauxmg.c — the "lauxlib" of moongrad: checking and converting arguments
** (operands, shapes, axes, dtypes, options, paths, sizes), turning Lua
** values into tensors and back, and nested structures of tensors. Boxes
** themselves are lbox.c's.
**
** Binding functions follow one order so nothing leaks when Lua raises:
** check the arguments (may raise), push an empty box (may raise), then do
** the C work, which never raises, and fill the box or raise its error.
*/
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lbinding.h"

mgL_kind mgL_operandkind (lua_State *L, int arg) {
  switch (lua_type(L, arg)) {
    case LUA_TNUMBER: return MGL_NUMBER;
    case LUA_TBOOLEAN: return MGL_BOOLEAN;
    case LUA_TUSERDATA: return mgL_testtensor(L, arg) ? MGL_TENSOR : MGL_OTHER;
    default: return MGL_OTHER;
  }
}

void mgL_checkoperandkind (lua_State *L, int arg) {
  if (mgL_operandkind(L, arg) == MGL_OTHER)
    luaL_argerror(L, arg, lua_pushfstring(L, "moongrad.Tensor or number expected, got %s",
                                          luaL_typename(L, arg)));
}

mg_tensor *mgL_operand (lua_State *L, int arg, mg_dtype like, bool *owned, const char *fn) {
  *owned = false;
  switch (mgL_operandkind(L, arg)) {
    case MGL_TENSOR: return mgL_testtensor(L, arg);
    case MGL_BOOLEAN:
      *owned = true;
      return mg_scalar(lua_toboolean(L, arg), MG_BOOL);
    case MGL_NUMBER: {
      *owned = true;
      int isint;
      lua_Integer iv = lua_tointegerx(L, arg, &isint);   /* 2.0 counts as an integer */
      if (like == MG_INT64 && isint) {                     /* exact, whatever its size */
        mg_tensor *t = mg_empty(NULL, 0, MG_INT64);
        if (t) *(int64_t *)mg_tensor_data(t) = (int64_t)iv;
        return t;
      }
      if (like == MG_INT64 || like == MG_BOOL) {
        *owned = false;
        return mg_seterror("%s: cannot convert %s to %s", fn, lua_tostring(L, arg), mg_dtype_name(like)), NULL;
      }
      return mg_scalar(lua_tonumber(L, arg), like);
    }
    default:
      return mg_seterror("moongrad.Tensor or number expected, got %s", luaL_typename(L, arg)), NULL;
  }
}

mg_dtype mgL_likedtype (lua_State *L, int a, int b, mg_dtype fallback) {
  mg_tensor *t = mgL_testtensor(L, a);
  if (t == NULL) t = mgL_testtensor(L, b);
  if (t) return mg_tensor_dtype(t);
  if (lua_isboolean(L, a) && lua_isboolean(L, b)) return MG_BOOL;
  return fallback;
}

mg_dtype mgL_dtypeat (lua_State *L, int idx, int arg, const char *what) {
  const char *name = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : NULL;
  int dt = name ? mg_dtype_from_name(name) : -1;
  if (name == NULL)
    luaL_argerror(L, arg, lua_pushfstring(L, "%s%sa dtype name expected, got %s", what ? what : "",
                                          what ? ": " : "", luaL_typename(L, idx)));
  if (dt < 0)
    luaL_argerror(L, arg, lua_pushfstring(L, "%s%sunknown dtype '%s' (use float32, float64, int64, bool, float16 or bfloat16)",
                                          what ? what : "", what ? ": " : "", name));
  return (mg_dtype)dt;
}

mg_dtype mgL_optdtype (lua_State *L, int arg, mg_dtype def) {
  if (lua_isnoneornil(L, arg)) return def;
  return mgL_dtypeat(L, arg, arg, NULL);
}

int mgL_optionfield (lua_State *L, int arg, const char *key, int type) {
  int t = lua_getfield(L, arg, key);
  if (t != LUA_TNIL && t != type)
    luaL_argerror(L, arg, lua_pushfstring(L, "option '%s' must be a %s, got %s", key,
                                          lua_typename(L, type), luaL_typename(L, -1)));
  return t;
}

const char *mgL_shownul (lua_State *L, int idx) {
  size_t len;
  const char *s = lua_tolstring(L, idx, &len);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '\0') luaL_addstring(&b, "\\0");
    else luaL_addchar(&b, s[i]);
  }
  luaL_pushresult(&b);
  return lua_tostring(L, -1);
}

bool mgL_hasnul (lua_State *L, int idx) {
  size_t len;
  const char *s = lua_tolstring(L, idx, &len);
  return s != NULL && strlen(s) != len;
}

const char *mgL_checkpath (lua_State *L, int arg, const char *fn) {
  const char *path = luaL_checkstring(L, arg);
  if (mgL_hasnul(L, arg))                             /* C would cut the path at the NUL */
    luaL_error(L, "%s: the path '%s' contains a NUL byte", fn, mgL_shownul(L, arg));
  return path;
}

/* bytes at arg as a size: an integer, or a number with a unit ("300 MB",
** "1.5 GiB"); raises naming fn */
size_t mgL_checkbytes (lua_State *L, int arg, const char *fn) {
  if (lua_type(L, arg) == LUA_TSTRING) {
    static const struct { const char *unit; double f; } units[] = {
      {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024}, {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"", 1}};
    const char *s = lua_tostring(L, arg);
    bool relative = s[0] == '+';         /* "+40 MiB": above what is live now */
    char unit[8] = "";
    double v;
    if (sscanf(s + relative, "%lf %7s", &v, unit) >= 1 && v > 0 && v < 0x1p62)
      for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(unit, units[i].unit) == 0) {
          size_t bytes = (size_t)(v * units[i].f);
          if (!relative) return bytes > 0 ? bytes : 1;
          lua_gc(L, LUA_GCCOLLECT);      /* garbage tensors are not what is live */
          return mg_memory_stats_get().current_bytes + bytes;
        }
    luaL_error(L, "%s: '%s' is not a size (a number of bytes, or one with a unit: B, KB, MB, GB, KiB, MiB, GiB; "
                  "'+40 MiB' for that much above what is live now)", fn, s);
  }
  lua_Number n = luaL_checknumber(L, arg);          /* 1.5e9, or live bytes * 1.2: fractions round down */
  if (!(n >= 1) || n >= 0x1p62)
    luaL_error(L, "%s: the budget must be a positive number of bytes (got %s)", fn,
               n != n ? "NaN" : lua_tostring(L, arg));
  return (size_t)n;
}

/* what the value at idx is, for messages: "1.5", "NaN", "a string" */
static const char *describe (lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TNUMBER) return lua_pushfstring(L, "a %s", luaL_typename(L, idx));
  lua_Number v = lua_tonumber(L, idx);
  if (v != v) return lua_pushliteral(L, "NaN");
  return lua_pushfstring(L, "%s", lua_tostring(L, idx));
}

lua_Integer mgL_intat (lua_State *L, int idx, int arg, const char *what) {
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);    /* 2.0 counts, 2.5 and 2^63 do not */
  if (!isint)
    luaL_argerror(L, arg, lua_pushfstring(L, "%s is %s, not an integer", what, describe(L, idx)));
  return v;
}

int mgL_axisat (lua_State *L, int idx, int arg, int ndim, const char *what) {
  lua_Integer a = mgL_intat(L, idx, arg, what);
  if (a == 0 || a > ndim || a < -ndim) {
    if (ndim == 0)
      luaL_argerror(L, arg, lua_pushfstring(L, "%s %I is out of range for a 0-d tensor", what, a));
    luaL_argerror(L, arg, lua_pushfstring(L, "%s %I is out of range for %d dimensions (use 1..%d or -%d..-1)",
                                          what, a, ndim, ndim, ndim));
  }
  return a > 0 ? (int)a - 1 : (int)a + ndim;
}

int mgL_checklist (lua_State *L, int idx, int arg, const char *what) {
  idx = lua_absindex(L, idx);
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    int isint;
    lua_Integer k = lua_tointegerx(L, -1, &isint);
    if (lua_type(L, -1) != LUA_TNUMBER || !isint || k < 1 || k > n) {
      const char *key = lua_type(L, -1) == LUA_TSTRING ? lua_pushfstring(L, "'%s'", lua_tostring(L, -1))
                                                       : luaL_tolstring(L, -1, NULL);
      luaL_argerror(L, arg, lua_pushfstring(L, "%s must be a list, but has the key %s", what, key));
    }
  }
  return (int)(n > INT32_MAX ? INT32_MAX : n);
}

int mgL_checkshape (lua_State *L, int arg, int64_t *shape, bool varargs) {
  int nd = 0;
  if (lua_istable(L, arg)) {
    int n = mgL_checklist(L, arg, arg, "the shape");
    if (n > MG_MAX_DIMS)
      luaL_argerror(L, arg, lua_pushfstring(L, "%d dimensions given, at most %d allowed", n, MG_MAX_DIMS));
    for (nd = 0; nd < n; nd++) {
      lua_geti(L, arg, nd + 1);
      shape[nd] = mgL_dimat(L, -1, arg, nd + 1);
      lua_pop(L, 1);
    }
    return nd;
  }
  if (!varargs || lua_type(L, arg) != LUA_TNUMBER)
    luaL_argerror(L, arg, lua_pushfstring(L, "shape expected (a table of sizes), got %s", luaL_typename(L, arg)));
  int top = lua_gettop(L);
  for (int a = arg; a <= top && lua_type(L, a) == LUA_TNUMBER; a++) {
    if (nd == MG_MAX_DIMS)
      luaL_argerror(L, a, lua_pushfstring(L, "at most %d dimensions allowed", MG_MAX_DIMS));
    shape[nd] = mgL_dimat(L, a, a, nd + 1);
    nd++;
  }
  return nd;
}

int64_t mgL_dimat (lua_State *L, int idx, int arg, int i) {
  char what[32];
  snprintf(what, sizeof what, "dimension %d", i);
  lua_Integer d = mgL_intat(L, idx, arg, what);
  if (d < 0) luaL_argerror(L, arg, lua_pushfstring(L, "dimension %d is negative (%I)", i, d));
  return (int64_t)d;
}

int mgL_optaxis (lua_State *L, int arg, int ndim) {
  if (lua_isnoneornil(L, arg)) return MG_ALL_AXES;
  if (lua_type(L, arg) != LUA_TNUMBER)
    luaL_argerror(L, arg, lua_pushfstring(L, "axis expected (an integer), got %s", luaL_typename(L, arg)));
  return mgL_axisat(L, arg, arg, ndim, "axis");
}

void mgL_checknargs (lua_State *L, int max) {
  for (int a = lua_gettop(L); a > max; a--)
    if (!lua_isnil(L, a))
      luaL_argerror(L, a, lua_pushfstring(L, "unexpected %s: it takes at most %d argument%s%s", luaL_typename(L, a),
                                          max, max == 1 ? "" : "s",
                                          lua_istable(L, a) ? ", and no options table there" : ""));
}

bool mgL_optboolean (lua_State *L, int arg, const char *what) {
  if (lua_isnoneornil(L, arg)) return false;
  if (!lua_isboolean(L, arg))
    luaL_argerror(L, arg, lua_pushfstring(L, "%s must be a boolean, got %s", what, luaL_typename(L, arg)));
  return lua_toboolean(L, arg);
}

void mgL_pushshape (lua_State *L, const int64_t *shape, int ndim) {
  lua_createtable(L, ndim, 0);
  for (int i = 0; i < ndim; i++) {
    lua_pushinteger(L, (lua_Integer)shape[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/* a tensor's (or variable's value's) field k: shape, dtype, ndim, and
** PyTorch's itemsize (bytes per element) and nbytes (numel x itemsize);
** pushes it and returns 1, or returns 0 for another name */
int mgL_pushfield (lua_State *L, const mg_tensor *t, const char *k) {
  if (strcmp(k, "shape") == 0) mgL_pushshape(L, mg_tensor_shape(t), mg_tensor_ndim(t));
  else if (strcmp(k, "dtype") == 0) lua_pushstring(L, mg_dtype_name(mg_tensor_dtype(t)));
  else if (strcmp(k, "ndim") == 0) lua_pushinteger(L, mg_tensor_ndim(t));
  else if (strcmp(k, "itemsize") == 0) lua_pushinteger(L, (lua_Integer)mg_dtype_size(mg_tensor_dtype(t)));
  else if (strcmp(k, "nbytes") == 0)
    lua_pushinteger(L, (lua_Integer)(mg_tensor_numel(t) * (int64_t)mg_dtype_size(mg_tensor_dtype(t))));
  else return 0;
  return 1;
}

/* {================== Lua values to tensors ================= */

/* the shape of a nested table, read along first elements */
static int nested_shape (lua_State *L, int idx, int64_t *shape, const char *fn) {
  int nd = 0;
  lua_pushvalue(L, idx);
  while (lua_istable(L, -1)) {
    if (nd == MG_MAX_DIMS) luaL_error(L, "%s: nested table is more than %d levels deep", fn, MG_MAX_DIMS);
    shape[nd++] = (int64_t)luaL_len(L, -1);
    if (shape[nd - 1] == 0) break;
    lua_geti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
  return nd;
}

typedef struct fillstate {
  char *p;                  /* next element */
  mg_dtype dt;
  const int64_t *shape;
  int nd;
  const char *fn;
  int arg;                  /* the user's argument, for messages */
  char path[128];           /* "[2][1]" for messages */
} fillstate;

/* the dtype a table of numbers and booleans makes: float32 when any leaf
** is a number (as NumPy makes floats of [True, 2, 0.5]), bool when all are
** booleans; leaves that are neither are left to the fill to report */
static mg_dtype leaf_dtype (lua_State *L, int idx, int depth) {
  if (lua_type(L, idx) == LUA_TBOOLEAN) return MG_BOOL;
  if (!lua_istable(L, idx) || depth > MG_MAX_DIMS) return MG_FLOAT32;
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
  bool any = false;
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);
    mg_dtype d = leaf_dtype(L, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
    if (d != MG_BOOL) return MG_FLOAT32;
    any = true;
  }
  return any ? MG_BOOL : MG_FLOAT32;
}

static void store (lua_State *L, fillstate *f) {
  int t = lua_type(L, -1);
  if (t != LUA_TNUMBER && t != LUA_TBOOLEAN)
    luaL_error(L, "%s: expected a number at %s, got %s", f->fn, f->path[0] ? f->path : "the top",
               luaL_typename(L, -1));
  double num = t == LUA_TBOOLEAN ? (double)lua_toboolean(L, -1) : lua_tonumber(L, -1);
  switch (f->dt) {
    case MG_FLOAT32: *(float *)f->p = (float)num; break;
    case MG_FLOAT64: *(double *)f->p = num; break;
    case MG_INT64: {
      int isint = 1;
      lua_Integer v = t == LUA_TBOOLEAN ? (lua_Integer)num : lua_tointegerx(L, -1, &isint);
      if (!isint)
        luaL_error(L, "%s: cannot convert %s at %s to int64", f->fn, lua_tostring(L, -1),
                   f->path[0] ? f->path : "the top");
      *(int64_t *)f->p = (int64_t)v;
      break;
    }
    case MG_BOOL: *(uint8_t *)f->p = num != 0; break;
    default: mg_convert(f->p, f->dt, &num, MG_FLOAT64, 1); break;     /* float16, bfloat16 */
  }
  f->p += mg_dtype_size(f->dt);
}

/* fills elements from the table at the top, checking it is not ragged */
static void fill_nested (lua_State *L, fillstate *f, int d) {
  if (d == f->nd) {
    store(L, f);
    return;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "%s: ragged nested table: expected a table at %s, got %s", f->fn, f->path,
               luaL_typename(L, -1));
  char what[160];
  snprintf(what, sizeof what, "the table at %s", f->path[0] ? f->path : "the top");
  lua_Integer n = mgL_checklist(L, -1, f->arg, what);
  if (n != f->shape[d])
    luaL_error(L, "%s: ragged nested table: %s has %d entries, expected %d", f->fn,
               f->path[0] ? f->path : "the top table", (int)n, (int)f->shape[d]);
  size_t plen = strlen(f->path);
  for (lua_Integer i = 1; i <= n; i++) {
    snprintf(f->path + plen, sizeof f->path - plen, "[%d]", (int)i);
    lua_geti(L, -1, i);
    fill_nested(L, f, d + 1);
    lua_pop(L, 1);
  }
  f->path[plen] = '\0';
}

mg_tensor *mgL_pushconstant (lua_State *L, int arg, mg_dtype dt, bool dtype_given, const char *fn) {
  arg = lua_absindex(L, arg);
  mg_tensor *src = mgL_testtensor(L, arg);
  if (src) {
    ltensor *box = mgL_newbox(L);
    mgL_fill(L, box, dtype_given ? mg_cast(src, dt) : mg_tensor_retain(src));
    return box->t;
  }
  int t = lua_type(L, arg);
  if (t != LUA_TNUMBER && t != LUA_TBOOLEAN && t != LUA_TTABLE)
    luaL_argerror(L, arg, lua_pushfstring(L, "number, boolean, table or tensor expected, got %s",
                                          luaL_typename(L, arg)));
  int64_t shape[MG_MAX_DIMS];
  int nd = nested_shape(L, arg, shape, fn);
  if (!dtype_given) dt = leaf_dtype(L, arg, 0);
  ltensor *box = mgL_newbox(L);
  mgL_fill(L, box, mg_empty(shape, nd, dt));
  fillstate f = {(char *)mg_tensor_data(box->t), dt, shape, nd, fn, arg, ""};
  lua_pushvalue(L, arg);
  fill_nested(L, &f, 0);
  lua_pop(L, 1);
  return box->t;
}

/* }========================================================== */

/* the element at p; p NULL: a dry run's result, read inside the run */
static void push_element (lua_State *L, const mg_tensor *t, const char *p) {
  if (p == NULL) {
    lua_pushnumber(L, NAN);
    return;
  }
  switch (mg_tensor_dtype(t)) {
    case MG_FLOAT32: lua_pushnumber(L, *(const float *)p); break;
    case MG_FLOAT64: lua_pushnumber(L, *(const double *)p); break;
    case MG_INT64: lua_pushinteger(L, (lua_Integer)*(const int64_t *)p); break;
    case MG_BOOL: lua_pushboolean(L, *(const uint8_t *)p); break;
    default: {                                   /* float16, bfloat16 */
      double d = 0;
      mg_convert(&d, MG_FLOAT64, p, mg_tensor_dtype(t), 1);
      lua_pushnumber(L, d);
      break;
    }
  }
}

static void push_level (lua_State *L, const mg_tensor *t, int d, const char *p) {
  const int64_t *shape = mg_tensor_shape(t);
  if (d == mg_tensor_ndim(t)) {
    push_element(L, t, p);
    return;
  }
  luaL_checkstack(L, 4, "tensor too deep");
  lua_createtable(L, (int)shape[d], 0);
  int64_t step = mg_tensor_strides(t)[d] * (int64_t)mg_dtype_size(mg_tensor_dtype(t));
  for (int64_t i = 0; i < shape[d]; i++) {
    push_level(L, t, d + 1, p ? p + i * step : NULL);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

void mgL_pushvalues (lua_State *L, const mg_tensor *t) {
  push_level(L, t, 0, mg_tensor_has_values(t) ? (const char *)mg_tensor_data(t) : NULL);
}

/* {================ nested structures of tensors ============ */

/* a released box is a leaf too: a re-run's template keeps the boxes of
** the first run's arguments, which the end of a tidy scope may release */
bool mgL_isleaf (lua_State *L, int idx) {
  return lua_type(L, idx) == LUA_TUSERDATA && (mgL_testbox(L, idx) != NULL || mgL_testtensor(L, idx) != NULL);
}

/* plain tables are structure; a table with a metatable (a layer) is a leaf */
static bool is_structure (lua_State *L, int idx) {
  if (!lua_istable(L, idx)) return false;
  if (!lua_getmetatable(L, idx)) return true;
  lua_pop(L, 1);
  return false;
}

/* runs BODY for each entry of the table at idx, in a fixed order (1..#t,
** then the other keys as lua_next gives them), with key and value pushed */
#define FOR_ENTRIES(L, idx, BODY) do {                                          \
    lua_Integer len_ = luaL_len(L, idx);                                        \
    for (lua_Integer i_ = 1; i_ <= len_; i_++) {                                \
      lua_pushinteger(L, i_); lua_geti(L, idx, i_); BODY; lua_pop(L, 2);        \
    }                                                                           \
    lua_pushnil(L);                                                             \
    while (lua_next(L, idx)) {                                                  \
      if (lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1 && lua_tointeger(L, -2) <= len_) { \
        lua_pop(L, 1); continue;                                                \
      }                                                                         \
      lua_pushvalue(L, -2); lua_insert(L, -2); BODY; lua_pop(L, 2);             \
    }                                                                           \
  } while (0)

/* the place of a leaf, for messages: what[1].key[2]... */
typedef struct path { int depth; int keys[32]; const char *names[32]; } path;

/* pushes the place p names: what, then .name, [k] or [?] (another key) for each level */
static void push_place (lua_State *L, const char *what, const path *p) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, what);
  for (int d = 0; d < p->depth && d < 32; d++) {
    if (p->names[d]) { luaL_addchar(&b, '.'); luaL_addstring(&b, p->names[d]); }
    else if (p->keys[d] != INT_MIN) { lua_pushfstring(L, "[%d]", p->keys[d]); luaL_addvalue(&b); }
    else luaL_addstring(&b, "[?]");
  }
  luaL_pushresult(&b);
}

static void bad_leaf (lua_State *L, int idx, const char *what, const path *p) {
  push_place(L, what, p);
  luaL_error(L, "%s is a %s, not a tensor or variable", lua_tostring(L, -1), luaL_typename(L, idx));
}

/* the key at -2 as the path's level d (1-based, while it is on the stack) */
static void set_level (lua_State *L, path *p, int d) {
  bool named = lua_type(L, -2) == LUA_TSTRING;
  p->names[d - 1] = named ? lua_tostring(L, -2) : NULL;
  lua_Integer key = lua_isinteger(L, -2) ? lua_tointeger(L, -2) : INT_MIN;
  p->keys[d - 1] = named || key <= INT_MIN || key > INT_MAX ? INT_MIN : (int)key;
}

static int flatten_at (lua_State *L, int idx, int acc, int n, bool strict, const char *what, path *p) {
  if (mgL_isleaf(L, idx)) {
    lua_pushvalue(L, idx);
    lua_rawseti(L, acc, ++n);
    return n;
  }
  if (!is_structure(L, idx)) {
    if (strict) bad_leaf(L, idx, what, p);
    return n;
  }
  if (p->depth >= 32) luaL_error(L, "%s: nested more than 32 deep (a cycle?)", what);
  luaL_checkstack(L, 8, "structure too deep");
  p->depth++;
  FOR_ENTRIES(L, idx, {
    set_level(L, p, p->depth);
    n = flatten_at(L, lua_gettop(L), acc, n, strict, what, p);
  });
  p->depth--;
  return n;
}

int mgL_flatten (lua_State *L, int idx, int acc, int n, bool strict, const char *what) {
  path p;
  p.depth = 0;
  return flatten_at(L, lua_absindex(L, idx), lua_absindex(L, acc), n, strict, what, &p);
}

/* a growing text: a C array first, then a userdata at stack slot box
** (garbage if an error unwinds: nothing to free) */
typedef struct text { char *s; size_t n, cap; int box; char local[256]; } text;

static void text_add (lua_State *L, text *t, const char *s, size_t len) {
  if (t->n + len > t->cap) {
    size_t cap = t->cap * 2;
    while (cap < t->n + len) cap *= 2;
    char *grown = (char *)lua_newuserdatauv(L, cap, 0);
    memcpy(grown, t->s, t->n);
    lua_replace(L, t->box);
    t->s = grown;
    t->cap = cap;
  }
  memcpy(t->s + t->n, s, len);
  t->n += len;
}

/* adds the places of the leaves of the value at idx to t, ", " between
** them, in flatten_at's order; returns the new count */
static int places_at (lua_State *L, int idx, text *t, int n, const char *what, path *p) {
  if (mgL_isleaf(L, idx)) {
    if (n > 0) text_add(L, t, ", ", 2);
    text_add(L, t, what, strlen(what));
    for (int d = 0; d < p->depth; d++) {
      char key[24];
      if (p->names[d]) {
        text_add(L, t, ".", 1);
        text_add(L, t, p->names[d], strlen(p->names[d]));
      } else {
        int len = p->keys[d] != INT_MIN ? snprintf(key, sizeof key, "[%d]", p->keys[d])
                                        : snprintf(key, sizeof key, "[?]");
        text_add(L, t, key, (size_t)len);
      }
    }
    return n + 1;
  }
  if (!is_structure(L, idx)) return n;
  if (p->depth >= 32) luaL_error(L, "%s: nested more than 32 deep (a cycle?)", what);
  luaL_checkstack(L, 8, "structure too deep");
  p->depth++;
  FOR_ENTRIES(L, idx, {
    set_level(L, p, p->depth);
    n = places_at(L, lua_gettop(L), t, n, what, p);
  });
  p->depth--;
  return n;
}

void mgL_pushplaces (lua_State *L, int first, int count, const char *what) {
  first = lua_absindex(L, first);
  text t;
  t.s = t.local;
  t.n = 0;
  t.cap = sizeof t.local;
  lua_pushnil(L);
  t.box = lua_gettop(L);
  static const char head[] = "tensors at ";
  text_add(L, &t, head, sizeof head - 1);
  int n = 0;
  for (int i = 0; i < count; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s %d", what, i + 1);
    path p;
    p.depth = 0;
    n = places_at(L, first + i, &t, n, name, &p);
  }
  if (n == 0) lua_pushliteral(L, "no tensors");
  else lua_pushlstring(L, t.s, t.n);
  lua_replace(L, t.box);
}

static const char hole_key = 0;

static bool is_hole (lua_State *L, int idx) {
  return lua_islightuserdata(L, idx) && lua_touserdata(L, idx) == (void *)&hole_key;
}

void mgL_hollow (lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  luaL_checkstack(L, 8, "structure too deep");
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (mgL_testbox(L, -1)) {                  /* a tensor (a variable stays) */
      lua_pushvalue(L, -2);
      lua_pushlightuserdata(L, (void *)&hole_key);
      lua_rawset(L, idx);
    } else if (is_structure(L, -1)) {
      mgL_hollow(L, -1);
    }
    lua_pop(L, 1);
  }
}

void mgL_rebuild (lua_State *L, int idx, int acc, int *k) {
  idx = lua_absindex(L, idx);
  acc = lua_absindex(L, acc);
  if (mgL_isleaf(L, idx) || is_hole(L, idx)) {
    lua_geti(L, acc, ++*k);
    return;
  }
  if (!is_structure(L, idx)) {
    lua_pushvalue(L, idx);
    return;
  }
  luaL_checkstack(L, 8, "structure too deep");
  lua_newtable(L);
  int out = lua_gettop(L);
  FOR_ENTRIES(L, idx, {
    mgL_rebuild(L, lua_gettop(L), acc, k);     /* key value copy */
    lua_pushvalue(L, -3);
    lua_insert(L, -2);
    lua_settable(L, out);
  });
}

/* }========================================================== */

/* edit distance of two short strings, for "did you mean" */
static int distance (const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 99;
  int d[64];
  for (size_t j = 0; j <= lb; j++) d[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = d[0];
    d[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = d[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (d[j - 1] + 1 < best) best = d[j - 1] + 1;
      diag = up;
      d[j] = best;
    }
  }
  return d[lb];
}

/* raises for the unknown key at the top: names it, the known ones, and
** the closest one when it looks like a typo */
static void unknown_option (lua_State *L, int arg, const char *const keys[]) {
  int k = lua_gettop(L);
  const char *key = lua_type(L, k) == LUA_TSTRING ? lua_tostring(L, k) : NULL;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  if (key) lua_pushfstring(L, "unknown option '%s'", key);
  else lua_pushfstring(L, "unexpected %s key in the options", luaL_typename(L, k));
  luaL_addvalue(&b);
  const char *near = NULL;
  int best = 3;                            /* at most 2 edits away */
  for (int i = 0; key && keys[i]; i++) {
    int dist = distance(key, keys[i]);
    if (dist < best) { best = dist; near = keys[i]; }
  }
  if (near) { luaL_addstring(&b, " (did you mean '"); luaL_addstring(&b, near); luaL_addstring(&b, "'?)"); }
  luaL_addstring(&b, "; known: ");
  for (int i = 0; keys[i]; i++) {
    if (i) luaL_addstring(&b, ", ");
    luaL_addstring(&b, keys[i]);
  }
  luaL_pushresult(&b);
  luaL_argerror(L, arg, lua_tostring(L, -1));
}

bool mgL_iscallable (lua_State *L, int idx) {
  if (lua_isfunction(L, idx)) return true;
  if (luaL_getmetafield(L, idx, "__call") == LUA_TNIL) return false;
  lua_pop(L, 1);
  return true;
}

void mgL_checkcallable (lua_State *L, int arg) {
  if (!mgL_iscallable(L, arg)) luaL_typeerror(L, arg, "function");
}

void mgL_checkoptions (lua_State *L, int arg, const char *const keys[]) {
  if (lua_isnoneornil(L, arg)) return;
  luaL_checktype(L, arg, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, arg)) {
    lua_pop(L, 1);
    bool known = false;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (int i = 0; keys[i] && !known; i++) known = strcmp(lua_tostring(L, -1), keys[i]) == 0;
    if (!known) unknown_option(L, arg, keys);
  }
}

/*
** lvariable.c — the Variable userdata (tf.Variable): mutable, trainable
** state that every op accepts wherever it accepts a tensor.
**
** One mg_variable has one userdata (lbox.c), so watched_variables() and
** custom gradients hand back the very object the user created.
*/
#include <stdlib.h>
#include <string.h>

#include "lbinding.h"

/* Variable(init, {name=, trainable=true, dtype=}) */
static int l_variable (lua_State *L) {
  luaL_checkany(L, 1);
  const char *name = NULL;
  bool trainable = true, given = false;
  mg_dtype dt = MG_FLOAT32;
  if (!lua_isnoneornil(L, 2)) {
    static const char *const keys[] = {"name", "trainable", "dtype", NULL};
    mgL_checkoptions(L, 2, keys);
    if (mgL_optionfield(L, 2, "name", LUA_TSTRING) != LUA_TNIL) name = lua_tostring(L, -1);
    if (mgL_optionfield(L, 2, "trainable", LUA_TBOOLEAN) != LUA_TNIL) trainable = lua_toboolean(L, -1);
    if (mgL_optionfield(L, 2, "dtype", LUA_TSTRING) != LUA_TNIL) {
      dt = mgL_dtypeat(L, -1, 2, "option 'dtype'");
      given = true;
    }
    lua_pop(L, 3);
  }
  mgL_checkfinalizer(L);
  mg_tensor *init = mgL_pushconstant(L, 1, dt, given, "Variable");
  lvariable *b = mgL_newvariablebox(L);
  b->v = mg_variable_new(init, name, trainable);
  if (b->v == NULL) return mgL_error(L);
  mgL_registervariablebox(L, -1);
  return 1;
}

/* v:value(): the current value as a tensor (a read: tapes notice it) */
static int l_value (lua_State *L) {
  mg_variable *v = mgL_checkvariable(L, 1);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_tensor_retain(mg_variable_read(v)));
}

/* v:assign(value): value has the variable's shape and dtype */
static int l_assign (lua_State *L) {
  mg_variable *v = mgL_checkvariable(L, 1);
  luaL_checkany(L, 2);
  mgL_checkchange(L, "Variable:assign");
  mg_tensor *x = mgL_testtensor(L, 2);
  if (x == NULL) x = mgL_pushconstant(L, 2, mg_tensor_dtype(mg_variable_peek(v)), true, "assign");
  if (mg_variable_assign(v, x) != MG_OK) return mgL_error(L);
  lua_settop(L, 1);
  return 1;
}

/* v:assign_add(d [, scale]) and v:assign_sub(d [, scale]): v = v +- scale * d
** in one pass (the optimizers' update); d has v's shape or is one number */
static int update (lua_State *L, double sign) {
  mg_variable *v = mgL_checkvariable(L, 1);
  luaL_checkany(L, 2);
  mgL_checkchange(L, sign > 0 ? "Variable:assign_add" : "Variable:assign_sub");
  double scale = luaL_optnumber(L, 3, 1.0);
  mg_tensor *x = mgL_testtensor(L, 2);
  if (x == NULL) x = mgL_pushconstant(L, 2, mg_tensor_dtype(mg_variable_peek(v)), true, "assign_add");
  if (mg_variable_axpy(v, sign * scale, x) != MG_OK) return mgL_error(L);
  lua_settop(L, 1);
  return 1;
}

static int l_assign_add (lua_State *L) { return update(L, 1.0); }
static int l_assign_sub (lua_State *L) { return update(L, -1.0); }

/* mg._adam(v, g, m, s, step_size, beta1, beta2, epsilon, decay) -> m', s':
** the optimizers' Adam step in one pass (mg_variable_adam); m, s may be nil */
static int l_adam (lua_State *L) {
  mg_variable *v = mgL_checkvariable(L, 1);
  mg_tensor *g = mgL_checktensor(L, 2);
  mg_tensor *m = lua_isnil(L, 3) ? NULL : mgL_checktensor(L, 3);
  mg_tensor *s = lua_isnil(L, 4) ? NULL : mgL_checktensor(L, 4);
  mg_adam_params p = {luaL_checknumber(L, 6), luaL_checknumber(L, 7), luaL_checknumber(L, 8),
                      luaL_checknumber(L, 5), luaL_checknumber(L, 9)};
  mgL_checkchange(L, "Adam");
  ltensor *mbox = mgL_newbox(L), *sbox = mgL_newbox(L);
  mg_tensor *mo, *so;
  if (mg_variable_adam(v, g, m, s, &p, &mo, &so) != MG_OK) return mgL_error(L);
  mbox->t = mo;
  sbox->t = so;
  return 2;
}

/* mg._momentum(v, g, b, momentum, lr, nesterov) -> b': SGD with momentum's
** step in one pass (mg_variable_momentum); b may be nil (the first step) */
static int l_momentum (lua_State *L) {
  mg_variable *v = mgL_checkvariable(L, 1);
  mg_tensor *g = mgL_checktensor(L, 2);
  mg_tensor *b = lua_isnil(L, 3) ? NULL : mgL_checktensor(L, 3);
  double momentum = luaL_checknumber(L, 4), lr = luaL_checknumber(L, 5);
  int nesterov = lua_toboolean(L, 6);
  mgL_checkchange(L, "SGD");
  ltensor *box = mgL_newbox(L);
  mg_tensor *bo;
  if (mg_variable_momentum(v, g, b, momentum, lr, nesterov, &bo) != MG_OK) return mgL_error(L);
  box->t = bo;
  return 1;
}

/* mg._rmsprop(var, g, v, a, b, lr, rho, epsilon, momentum, centered) -> v', a', b'
** (nil where unused): RMSprop's step in one pass (mg_variable_rmsprop) */
static int l_rmsprop (lua_State *L) {
  mg_variable *var = mgL_checkvariable(L, 1);
  mg_tensor *g = mgL_checktensor(L, 2), *slots[3];
  for (int i = 0; i < 3; i++) slots[i] = lua_isnil(L, 3 + i) ? NULL : mgL_checktensor(L, 3 + i);
  mg_rmsprop_params p = {luaL_checknumber(L, 6), luaL_checknumber(L, 7), luaL_checknumber(L, 8),
                         luaL_checknumber(L, 9), lua_toboolean(L, 10)};
  mgL_checkchange(L, "RMSprop");
  ltensor *box[3];
  for (int i = 0; i < 3; i++) box[i] = mgL_newbox(L);
  mg_tensor *out[3];
  if (mg_variable_rmsprop(var, g, slots, &p, out) != MG_OK) return mgL_error(L);
  for (int i = 0; i < 3; i++) {
    box[i]->t = out[i];
    if (out[i] == NULL) {                         /* unused: nil in its place */
      lua_pushnil(L);
      lua_replace(L, -4 + i);                     /* box i, below the nil just pushed */
    }
  }
  return 3;
}

static int variable_tostring (lua_State *L) {
  mg_variable *v = mgL_checkvariable(L, 1);
  char *s = mg_tensor_format(mg_variable_peek(v));
  if (s == NULL) return luaL_error(L, "tostring: out of memory");
  char *nl = strrchr(s, '\n');
  if (nl) *nl = '\0';
  const mg_tensor *t = mg_variable_peek(v);
  char sh[160];
  lua_pushfstring(L, "%s\n%s '%s' %s %s%s", s, MG_VARIABLE_MT, mg_variable_name(v),
                  mg_shape_str(sh, sizeof sh, mg_tensor_shape(t), mg_tensor_ndim(t)),
                  mg_dtype_name(mg_tensor_dtype(t)),
                  mg_variable_trainable(v) ? "" : " (not trainable)");
  free(s);
  return 1;
}

/* __index: variable methods, then its properties, then tensor methods */
static int variable_index (lua_State *L) {
  mg_variable *v = mgL_checkvariable(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    const char *k = lua_tostring(L, 2);
    const mg_tensor *t = mg_variable_peek(v);
    if (strcmp(k, "name") == 0) { lua_pushstring(L, mg_variable_name(v)); return 1; }
    if (strcmp(k, "trainable") == 0) { lua_pushboolean(L, mg_variable_trainable(v)); return 1; }
    if (mgL_pushfield(L, t, k)) return 1;
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(2));
    return 1;
  }
  if (lua_isinteger(L, 2)) return mgL_index_first_axis(L, mg_variable_peek(v), lua_tointeger(L, 2));
  lua_pushnil(L);
  return 1;
}

static int variable_newindex (lua_State *L) {
  return luaL_error(L, "cannot set fields of a variable (use v:assign(value) to change its value)");
}

static int l_is_variable (lua_State *L) {
  mgL_checknargs(L, 1);
  lua_pushboolean(L, mgL_testvariable(L, 1) != NULL);
  return 1;
}

void mgL_open_variable (lua_State *L) {
  int module = lua_gettop(L);
  lua_pushcfunction(L, l_variable);
  lua_setfield(L, module, "Variable");
  lua_pushcfunction(L, l_is_variable);
  lua_setfield(L, module, "is_variable");
  lua_pushcfunction(L, l_adam);
  lua_setfield(L, module, "_adam");
  lua_pushcfunction(L, l_momentum);
  lua_setfield(L, module, "_momentum");
  lua_pushcfunction(L, l_rmsprop);
  lua_setfield(L, module, "_rmsprop");
  mgL_open_boxes(L);
  luaL_newmetatable(L, MG_VARIABLE_MT);
  int mt = lua_gettop(L);
  static const luaL_Reg meta[] = {
    {"__gc", mgL_variable_gc}, {"__tostring", variable_tostring}, {"__newindex", variable_newindex},
    {NULL, NULL}
  };
  mgL_setfuncs(L, meta);
  /* arithmetic and comparison behave as on the value: share the tensor's */
  luaL_getmetatable(L, MG_TENSOR_MT);
  static const char *const shared[] = {"__len", "__lt", "__le", NULL};
  for (int i = 0; shared[i]; i++) {
    lua_getfield(L, -1, shared[i]);
    lua_setfield(L, mt, shared[i]);
  }
  for (int i = 0, n = mg_op_count(); i < n; i++) {    /* the ops' metamethods, from the registry */
    const char *event = mg_op_info(i)->metamethod;
    if (event == NULL) continue;
    lua_getfield(L, -1, event);
    lua_setfield(L, mt, event);
  }
  lua_pop(L, 1);
  static const luaL_Reg methods[] = {
    {"value", l_value}, {"read_value", l_value}, {"assign", l_assign},
    {"assign_add", l_assign_add}, {"assign_sub", l_assign_sub}, {NULL, NULL}
  };
  mgL_newlib(L, methods);
  lua_getfield(L, LUA_REGISTRYINDEX, "moongrad.methods");
  lua_pushcclosure(L, variable_index, 2);
  lua_setfield(L, mt, "__index");
  lua_settop(L, module);
}

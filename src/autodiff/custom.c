/*
** custom.c — custom_gradient (tf.custom_gradient): a Lua function that
** returns its outputs and the function computing its input gradients.
**
** f runs with the tapes paused (its insides are not recorded) while its
** variable reads are noticed; the tapes then record one node whose inputs
** are f's tensor arguments plus those variables. Its backward calls
**   grad_fn(dy1, ..., dyk [, variables])
** which returns one gradient per tensor argument and, when f read
** variables, a list with one gradient per variable, as TensorFlow's
** `variables` argument does. Ops run by grad_fn are recorded by tapes
** still recording, so custom gradients can be differentiated again.
*/
#include <stdlib.h>

#include "../lua/lcallback.h"

typedef struct custom_ext {
  lua_State *L;                /* the main thread, for luaL_unref */
  int grad_ref;                /* grad_fn in the registry */
  int nargs, nvars;            /* inputs: nargs tensors, then nvars variables */
  mg_variable **vars;          /* retained */
} custom_ext;

static void custom_free (mg_node *n) {
  custom_ext *e = (custom_ext *)n->ext;
  if (e == NULL) return;
  luaL_unref(e->L, LUA_REGISTRYINDEX, e->grad_ref);
  for (int k = 0; k < e->nvars; k++) mg_variable_release(e->vars[k]);
  free(e->vars);
  free(e);
}

/* protected: calls grad_fn and collects what it returns into din */
static int custom_backward_body (lua_State *L) {
  mg_node *n;
  mg_tensor *const *dout;
  mg_tensor **din;
  mgL_backward_ctx(L, &n, &dout, &din);
  custom_ext *e = (custom_ext *)n->ext;
  luaL_checkstack(L, n->nout + 8, "too many outputs");
  lua_rawgeti(L, LUA_REGISTRYINDEX, e->grad_ref);
  for (int i = 0; i < n->nout; i++) mgL_pushdout(L, n, dout, i);
  if (e->nvars > 0) {
    lua_createtable(L, e->nvars, 0);
    for (int k = 0; k < e->nvars; k++) {
      mgL_pushvariable(L, e->vars[k]);
      lua_rawseti(L, -2, k + 1);
    }
  }
  int nres = e->nargs + (e->nvars > 0);
  lua_call(L, n->nout + (e->nvars > 0), nres);
  int base = lua_gettop(L) - nres + 1;
  for (int j = 0; j < e->nargs; j++) mgL_takegrad(L, base + j, n, din, j, "custom_gradient: grad_fn");
  if (e->nvars > 0) {
    int vt = base + e->nargs;
    if (!lua_istable(L, vt) && !lua_isnil(L, vt))
      return luaL_error(L, "custom_gradient: grad_fn must return a list of variable gradients "
                           "after the input gradients (f read %d variables), got a %s",
                        e->nvars, luaL_typename(L, vt));
    for (int k = 0; k < e->nvars; k++) {
      if (lua_isnil(L, vt)) lua_pushnil(L);
      else lua_geti(L, vt, k + 1);
      mgL_takegrad(L, lua_gettop(L), n, din, e->nargs + k, "custom_gradient: grad_fn");
      lua_pop(L, 1);
    }
  }
  return 0;
}

static mg_status custom_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  custom_ext *e = (custom_ext *)n->ext;
  return mgL_backward_call(mgL_running ? mgL_running : e->L, n, dout, din, custom_backward_body,
                           NULL, "custom_gradient");
}

static const mg_opdef custom_op = {"custom_gradient", 0, custom_backward, custom_free};

/* g(...): upvalue 1 is f */
static int custom_call (lua_State *L) {
  int nargs = lua_gettop(L);
  luaL_checkstack(L, nargs + 8, "too many arguments");
  lua_pushvalue(L, lua_upvalueindex(1));
  for (int i = 1; i <= nargs; i++) lua_pushvalue(L, i);
  mg_var_watcher w;
  if (mgL_call_paused(L, nargs, &w) != LUA_OK) {
    mg_watcher_free(&w);
    return lua_error(L);
  }
  int first = nargs + 1, last = lua_gettop(L), nout = last - first;
  if (nout < 1 || !lua_isfunction(L, last)) {
    mg_watcher_free(&w);
    return luaL_error(L, "custom_gradient: f must return its outputs and then a gradient function");
  }
  for (int i = first; i < last; i++)
    if (mgL_testtensor(L, i) == NULL) {
      mg_watcher_free(&w);
      return luaL_error(L, "custom_gradient: output %d of f is a %s, not a tensor", i - nargs,
                        luaL_typename(L, i));
    }
  /* the tensor arguments, in a list */
  lua_newtable(L);
  int list = lua_gettop(L), ntensors = 0;
  for (int i = 1; i <= nargs; i++)
    if (mgL_isleaf(L, i)) {
      lua_pushvalue(L, i);
      lua_rawseti(L, list, ++ntensors);
    }
  int nvars;
  mg_tensor **in = mgL_inputs(L, list, ntensors, &w, &nvars);
  for (int i = first; i < last; i++) mgL_rehead(L, i, in, ntensors + nvars);
  mg_tensor **out = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)nout, 0);
  for (int i = 0; i < nout; i++) out[i] = mgL_testtensor(L, first + i);
  if (mg_recording_tapes > 0) {
    custom_ext *e = (custom_ext *)calloc(1, sizeof(custom_ext));
    if (e == NULL) {
      mg_watcher_free(&w);
      return luaL_error(L, "custom_gradient: out of memory");
    }
    e->L = mgL_main_thread(L);
    lua_pushvalue(L, last);
    e->grad_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    e->nargs = ntensors;
    e->nvars = nvars;
    e->vars = w.vars;                /* the node takes the watcher's references */
    w.vars = NULL;
    w.n = 0;
    if (mg_record_ex(&custom_op, ntensors + nvars, in, nout, out, NULL, e, NULL) != MG_OK)
      return mgL_error(L);
  }
  mg_watcher_free(&w);
  lua_settop(L, last - 1);
  return nout;
}

/* custom_gradient(f): g with g(...) == first results of f(...) */
static int l_custom_gradient (lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_pushcclosure(L, custom_call, 1);
  return 1;
}

void mgL_open_custom (lua_State *L) {
  lua_pushcfunction(L, l_custom_gradient);
  lua_setfield(L, -2, "custom_gradient");
}

/*
** lcallback.c — what custom_gradient and recompute_grad share: running a
** Lua function with the tapes paused while its variable reads are noticed,
** giving its outputs ids of their own, recording one node for it, and
** calling back into Lua from a backward rule in protected mode.
*/
#include <stdlib.h>
#include <string.h>

#include "lbinding.h"
#include "lcallback.h"

lua_State *mgL_main_thread (lua_State *L) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lua_State *main = lua_tothread(L, -1);
  lua_pop(L, 1);
  return main;
}

int mgL_call_paused (lua_State *L, int nargs, mg_var_watcher *w) {
  mg_watcher_push(w);
  if (mg_pause_all() != MG_OK) {
    mg_watcher_pop(w);
    lua_pushstring(L, mg_errmsg());
    return LUA_ERRRUN;
  }
  int st = lua_pcall(L, nargs, LUA_MULTRET, 0);
  mg_resume_all();
  mg_watcher_pop(w);
  return st;
}

/* is t one of xs[0..n)? */
static bool among (const mg_tensor *t, mg_tensor *const *xs, int n) {
  for (int i = 0; i < n; i++) if (xs[i]->id == t->id) return true;
  return false;
}

void mgL_rehead (lua_State *L, int idx, mg_tensor *const *inputs, int nin) {
  mg_tensor *t = mgL_testtensor(L, idx);
  if (!(t->var || among(t, inputs, nin) || mg_any_tape_tracks(t->id))) return;
  idx = lua_absindex(L, idx);
  ltensor *box = mgL_newbox(L);
  mgL_fill(L, box, mg_tensor_view(t->storage, t->dtype, t->shape, t->ndim, t->strides, t->offset));
  lua_replace(L, idx);
}

mg_tensor **mgL_inputs (lua_State *L, int list, int nargs, mg_var_watcher *w, int *nvars_out) {
  int nvars = 0;
  for (int i = 0; i < w->n; i++) {            /* variables passed as arguments are inputs already */
    bool passed = false;
    for (int j = 1; j <= nargs && !passed; j++) {
      lua_geti(L, list, j);
      passed = mgL_testvariable(L, -1) == w->vars[i];
      lua_pop(L, 1);
    }
    if (!passed) w->vars[nvars++] = w->vars[i];
    else mg_variable_release(w->vars[i]);
  }
  w->n = nvars;
  mg_tensor **in = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(nargs + nvars + 1), 0);
  for (int j = 0; j < nargs; j++) {
    lua_geti(L, list, j + 1);
    in[j] = mgL_testtensor(L, -1);
    lua_pop(L, 1);
  }
  for (int k = 0; k < nvars; k++) in[nargs + k] = mg_variable_peek(w->vars[k]);
  *nvars_out = nvars;
  return in;
}

/* {================== calling back from C =================== */

typedef struct protected_call {
  mg_node *n;
  mg_tensor *const *dout;
  mg_tensor **din;
  lua_CFunction body;
  void *ud;
} protected_call;

static int run_protected (lua_State *L) {
  protected_call *c = (protected_call *)lua_touserdata(L, 1);
  lua_settop(L, 0);
  lua_pushlightuserdata(L, c);
  return c->body(L);
}

mg_status mgL_backward_call (lua_State *L, mg_node *n, mg_tensor *const *dout, mg_tensor **din,
                             lua_CFunction body, void *ud, const char *what) {
  if (L == NULL) return mg_seterror("%s: no Lua state to run the gradient in", what);
  protected_call c = {n, dout, din, body, ud};
  int top = lua_gettop(L);
  lua_pushcfunction(L, run_protected);
  lua_pushlightuserdata(L, &c);
  int st = lua_pcall(L, 1, 0, 0);
  if (st != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    mg_seterror("%s", msg ? msg : "error object is not a string");
  }
  lua_settop(L, top);
  return st == LUA_OK ? MG_OK : MG_ERR;
}

void *mgL_backward_ctx (lua_State *L, mg_node **n, mg_tensor *const **dout, mg_tensor ***din) {
  protected_call *c = (protected_call *)lua_touserdata(L, 1);
  *n = c->n;
  *dout = c->dout;
  *din = c->din;
  return c->ud;
}

void mgL_pushdout (lua_State *L, mg_node *n, mg_tensor *const *dout, int i) {
  ltensor *box = mgL_newbox(L);
  mgL_fill(L, box, dout[i] ? mg_tensor_retain(dout[i]) : mg_zeros_meta(&n->out_meta[i]));
}

void mgL_takegrad (lua_State *L, int idx, mg_node *n, mg_tensor **din, int j, const char *who) {
  if (!n->needs[j]) return;
  if (lua_isnil(L, idx)) {            /* nil: no gradient, which is zero */
    din[j] = mg_zeros_meta(&n->in_meta[j]);
    if (din[j] == NULL) mgL_error(L);
    return;
  }
  mg_tensor *g = mgL_testtensor(L, idx);
  if (g == NULL)
    luaL_error(L, "%s must return tensors or nil, got a %s for input %d", who, luaL_typename(L, idx),
               j + 1);
  din[j] = mg_tensor_retain(g);
}

/* }========================================================== */

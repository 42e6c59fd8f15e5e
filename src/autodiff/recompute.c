/*
** recompute.c — recompute_grad (tf.recompute_grad): gradient checkpointing.
**
** g = recompute_grad(f) runs f with the tapes paused, noticing the
** variables it reads, and records one node whose inputs are f's tensor
** arguments and those variables, holding only the arguments. Its backward
** rule re-runs f under a fresh local tape, with the random state of the
** forward call restored (dropout masks match) and mg.is_recomputing()
** true, then takes that tape's gradient seeded with the incoming output
** gradients. Tapes still recording see the re-run and the backward pass,
** so second-order gradients through g equal those through f.
*/
#include <stdlib.h>
#include <string.h>

#include "../lua/lcallback.h"

#define RECOMPUTE_MT "moongrad.recompute_grad"

typedef struct lrecompute { bool pass_flag; } lrecompute;   /* uservalue 1: f */

typedef struct recompute_ext {
  lua_State *L;                /* the main thread, for luaL_unref */
  int f_ref, args_ref;         /* f, and its arguments {n=, ...}, in the registry */
  int nflat, nvars;            /* inputs: nflat distinct tensors, then variables */
  mg_variable **vars;          /* retained */
  mg_rng_state rng;            /* the random state when f first ran */
  bool pass_flag;              /* call f(..., {is_recomputing=}) */
} recompute_ext;

static void recompute_free (mg_node *n) {
  recompute_ext *e = (recompute_ext *)n->ext;
  if (e == NULL) return;
  luaL_unref(e->L, LUA_REGISTRYINDEX, e->f_ref);
  luaL_unref(e->L, LUA_REGISTRYINDEX, e->args_ref);
  for (int k = 0; k < e->nvars; k++) mg_variable_release(e->vars[k]);
  free(e->vars);
  free(e);
}

/* pushes f's arguments from the table at t, and the flag table when asked;
** returns how many */
static int push_args (lua_State *L, int t, bool pass_flag, bool recomputing) {
  int n = (int)(lua_getfield(L, t, "n"), lua_tointeger(L, -1));
  lua_pop(L, 1);
  luaL_checkstack(L, n + 4, "too many arguments");
  for (int i = 1; i <= n; i++) lua_geti(L, t, i);
  if (pass_flag) {
    lua_createtable(L, 0, 1);
    lua_pushboolean(L, recomputing);
    lua_setfield(L, -2, "is_recomputing");
  }
  return n + pass_flag;
}

/* the distinct tensors among the leaves of the arguments in table t, as a
** list pushed on the stack; returns their count */
static int distinct_leaves (lua_State *L, int t) {
  lua_newtable(L);
  int all = lua_gettop(L), n = 0;
  int nargs = (int)(lua_getfield(L, t, "n"), lua_tointeger(L, -1));
  lua_pop(L, 1);
  for (int i = 1; i <= nargs; i++) {
    lua_geti(L, t, i);
    n = mgL_flatten(L, -1, all, n, false, "argument");
    lua_pop(L, 1);
  }
  lua_newtable(L);
  int uniq = lua_gettop(L), k = 0;
  for (int i = 1; i <= n; i++) {
    lua_geti(L, all, i);
    mg_tensor *x = mgL_testtensor(L, -1);
    bool seen = false;
    for (int j = 1; j <= k && !seen; j++) {
      lua_geti(L, uniq, j);
      seen = mgL_testtensor(L, -1)->id == x->id;
      lua_pop(L, 1);
    }
    if (!seen) lua_rawseti(L, uniq, ++k);
    else lua_pop(L, 1);
  }
  lua_remove(L, all);
  return k;
}

/* flattens results first..last into a list pushed on the stack */
static int flatten_results (lua_State *L, int first, int last, const char *who) {
  lua_newtable(L);
  int list = lua_gettop(L), n = 0;
  for (int i = first; i <= last; i++) {
    char what[64];
    snprintf(what, sizeof what, "%s: result %d of f", who, i - first + 1);
    n = mgL_flatten(L, i, list, n, true, what);
  }
  return n;
}

/* {====================== the backward ====================== */

typedef struct recompute_state { mg_tape *tape; } recompute_state;

static void check_same (lua_State *L, const mg_meta *m, const mg_tensor *t, int i) {
  if (mg_same_shape(m->shape, m->ndim, t->shape, t->ndim) && m->dtype == t->dtype) return;
  char a[160], b[160];
  luaL_error(L, "recompute_grad: the recomputed f gave output %d as %s %s, the forward gave %s %s "
                "(f must be deterministic)", i + 1, mg_shape_str(a, sizeof a, t->shape, t->ndim),
             mg_dtype_name(t->dtype), mg_shape_str(b, sizeof b, m->shape, m->ndim), mg_dtype_name(m->dtype));
}

/* protected: re-runs f under the local tape and takes its gradient */
static int recompute_backward_body (lua_State *L) {
  mg_node *n;
  mg_tensor *const *dout;
  mg_tensor **din;
  recompute_state *s = (recompute_state *)mgL_backward_ctx(L, &n, &dout, &din);
  recompute_ext *e = (recompute_ext *)n->ext;
  lua_rawgeti(L, LUA_REGISTRYINDEX, e->args_ref);
  int args = lua_gettop(L);
  int nflat = distinct_leaves(L, args), flat = lua_gettop(L);
  for (int i = 1; i <= nflat; i++) {
    lua_geti(L, flat, i);
    mg_tape_watch(s->tape, mgL_testtensor(L, -1));
    lua_pop(L, 1);
  }
  for (int k = 0; k < e->nvars; k++) mg_tape_watch_variable(s->tape, e->vars[k]);
  int base = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, e->f_ref);
  lua_call(L, push_args(L, args, e->pass_flag, true), LUA_MULTRET);
  mg_tape_stop(s->tape);
  int nouts = flatten_results(L, base + 1, lua_gettop(L), "recompute_grad");
  int outs = lua_gettop(L);
  if (nouts != n->nout)
    return luaL_error(L, "recompute_grad: the recomputed f gave %d outputs, the forward gave %d "
                         "(f must be deterministic)", nouts, n->nout);
  int ntargets = 0, nsources = e->nflat + e->nvars;
  mg_tensor **targets = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(nouts + 1), 0);
  mg_tensor **seeds = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(nouts + 1), 0);
  mg_tensor **sources = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(nsources + 1), 0);
  mg_tensor **grads = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(nsources + 1), 0);
  for (int i = 0; i < nouts; i++) {
    lua_geti(L, outs, i + 1);
    mg_tensor *y = mgL_testtensor(L, -1);
    lua_pop(L, 1);
    check_same(L, &n->out_meta[i], y, i);
    if (dout[i] == NULL || !mg_is_float(y->dtype)) continue;
    targets[ntargets] = y;
    seeds[ntargets++] = dout[i];
  }
  /* only the inputs the outer walk asked for: no work for the others */
  int *which = (int *)lua_newuserdatauv(L, sizeof(int) * (size_t)(nsources + 1), 0);
  int nwanted = 0;
  for (int j = 0; j < nsources; j++) {
    if (!n->needs[j]) continue;
    if (j < e->nflat) {
      lua_geti(L, flat, j + 1);
      sources[nwanted] = mgL_testtensor(L, -1);
      lua_pop(L, 1);
    } else {
      sources[nwanted] = mg_variable_peek(e->vars[j - e->nflat]);
    }
    which[nwanted++] = j;
  }
  if (mg_tape_gradient(s->tape, ntargets, targets, nwanted, sources, seeds, 1, grads) != MG_OK)
    return mgL_error(L);
  for (int k = 0; k < nwanted; k++) din[which[k]] = grads[k];     /* zeros when unconnected */
  return 0;
}

static mg_status recompute_backward (mg_node *n, mg_tensor *const *dout, mg_tensor **din) {
  recompute_ext *e = (recompute_ext *)n->ext;
  recompute_state s;
  mg_rng_state now = mg_random_get_state();
  s.tape = mg_tape_new(0, 1);
  if (s.tape == NULL) return MG_ERR;
  mg_random_set_state(e->rng);
  mg_recompute_enter();
  mg_memory_span("recompute", 1);
  mg_status st = mgL_backward_call(mgL_running ? mgL_running : e->L, n, dout, din,
                                   recompute_backward_body, &s, "recompute_grad");
  mg_memory_span("recompute", 0);
  mg_recompute_leave();
  mg_random_set_state(now);           /* as if no recompute had happened */
  mg_tape_release(s.tape);
  return st;
}

static const mg_opdef recompute_op = {"recompute_grad", MG_SAVE_INPUTS, recompute_backward, recompute_free};

/* }========================================================== */


/* {====================== the forward ======================= */

static int ref_new (lua_State *L, int idx) {
  lua_pushvalue(L, idx);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* g(...): f(...) with one node on the tapes instead of f's insides */
static int recompute_call (lua_State *L) {
  lrecompute *r = (lrecompute *)luaL_checkudata(L, 1, RECOMPUTE_MT);
  int nargs = lua_gettop(L) - 1;
  lua_createtable(L, nargs, 1);                    /* the arguments, kept for the re-run */
  int args = lua_gettop(L);
  for (int i = 1; i <= nargs; i++) {
    lua_pushvalue(L, i + 1);
    lua_rawseti(L, args, i);
  }
  lua_pushinteger(L, nargs);
  lua_setfield(L, args, "n");
  int base = lua_gettop(L);
  lua_getiuservalue(L, 1, 1);                      /* f */
  int fidx = base + 1;
  if (mg_recording_tapes == 0) {                   /* nothing to save memory from */
    lua_call(L, push_args(L, args, r->pass_flag, false), LUA_MULTRET);
    return lua_gettop(L) - base;
  }
  int nflat = distinct_leaves(L, args), flat = lua_gettop(L);
  lua_pushvalue(L, fidx);
  mg_rng_state rng = mg_random_get_state();
  mg_var_watcher w;
  if (mgL_call_paused(L, push_args(L, args, r->pass_flag, false), &w) != LUA_OK) {
    mg_watcher_free(&w);
    return lua_error(L);
  }
  int first = flat + 1, last = lua_gettop(L);
  if (last < first) {
    mg_watcher_free(&w);
    return luaL_error(L, "recompute_grad: f returned nothing; it must return tensors");
  }
  int nouts = flatten_results(L, first, last, "recompute_grad"), outs = lua_gettop(L);
  int nvars;
  mg_tensor **in = mgL_inputs(L, flat, nflat, &w, &nvars);
  for (int i = 1; i <= nouts; i++) {               /* outputs must be new tensors */
    lua_geti(L, outs, i);
    mgL_rehead(L, -1, in, nflat + nvars);
    lua_rawseti(L, outs, i);
  }
  mg_tensor **out = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(nouts + 1), 0);
  for (int i = 0; i < nouts; i++) {
    lua_geti(L, outs, i + 1);
    out[i] = mgL_testtensor(L, -1);
    lua_pop(L, 1);
  }
  recompute_ext *e = (recompute_ext *)calloc(1, sizeof(recompute_ext));
  if (e == NULL) {
    mg_watcher_free(&w);
    return luaL_error(L, "recompute_grad: out of memory");
  }
  e->L = mgL_main_thread(L);
  e->f_ref = ref_new(L, fidx);
  e->args_ref = ref_new(L, args);
  e->nflat = nflat;
  e->nvars = nvars;
  e->vars = w.vars;                                /* the node takes the references */
  w.vars = NULL;
  w.n = 0;
  e->rng = rng;
  e->pass_flag = r->pass_flag;
  if (mg_record_ex(&recompute_op, nflat + nvars, in, nouts, out, NULL, e, NULL) != MG_OK)
    return mgL_error(L);
  /* the results again, with their tensors replaced by the new ones */
  int k = 0;
  for (int i = first; i <= last; i++) mgL_rebuild(L, i, outs, &k);
  return last - first + 1;
}

static int recompute_index (lua_State *L) {
  luaL_checkudata(L, 1, RECOMPUTE_MT);
  lua_getiuservalue(L, 1, 1);
  if (lua_type(L, 2) == LUA_TSTRING && strcmp(lua_tostring(L, 2), "__wrapped__") == 0) return 1;
  if (!lua_istable(L, -1) && !lua_isuserdata(L, -1)) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushvalue(L, 2);
  lua_gettable(L, -2);                             /* f[k], metamethods included */
  return 1;
}

static int recompute_tostring (lua_State *L) {
  luaL_checkudata(L, 1, RECOMPUTE_MT);
  lua_getiuservalue(L, 1, 1);
  lua_pushfstring(L, "%s(%s)", RECOMPUTE_MT, luaL_tolstring(L, -1, NULL));
  return 1;
}

static bool callable (lua_State *L, int idx) {
  if (lua_isfunction(L, idx)) return true;
  if (luaL_getmetafield(L, idx, "__call") == LUA_TNIL) return false;
  lua_pop(L, 1);
  return true;
}

/* recompute_grad(f [, {pass_is_recomputing=false}]) */
static int l_recompute_grad (lua_State *L) {
  luaL_checkany(L, 1);
  if (!callable(L, 1))
    return luaL_argerror(L, 1, lua_pushfstring(L, "f must be callable (a function, or a table with "
                                                  "__call), got %s", luaL_typename(L, 1)));
  bool pass = false;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "pass_is_recomputing");
    pass = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lrecompute *r = (lrecompute *)lua_newuserdatauv(L, sizeof(lrecompute), 1);
  r->pass_flag = pass;
  luaL_setmetatable(L, RECOMPUTE_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  return 1;
}

void mgL_open_recompute (lua_State *L) {
  lua_pushcfunction(L, l_recompute_grad);
  lua_setfield(L, -2, "recompute_grad");
  luaL_newmetatable(L, RECOMPUTE_MT);
  static const luaL_Reg meta[] = {
    {"__call", recompute_call}, {"__index", recompute_index}, {"__tostring", recompute_tostring},
    {NULL, NULL}
  };
  luaL_setfuncs(L, meta, 0);
  lua_pop(L, 1);
}

/* }========================================================== */

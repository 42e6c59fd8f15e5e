/*
** lrecompute.c — mg.recompute_grad: a Lua function as the forward of
** mg_recompute_call (autodiff's recompute.c), re-run in the backward.
**
** recompute_grad captures its arguments at the call: their table
** structure is copied (a template whose tensor leaves are replaced by the
** node's saved inputs at the re-run), so the re-run gets exactly what the
** forward got whatever the caller does to its tables afterwards. Variables
** are kept as themselves (f may use their methods); the C side shows them
** with the values they had at the call. Any other value passes through, in
** and out: f's results come back as it gave them (tables rebuilt around the
** node's outputs); the re-run's tensors must sit where the first run's did,
** its other values are dropped.
*/
#include <string.h>

#include "lfunction.h"

/* {================= the first run and re-runs ================ */

/* recompute's first run: (fa, f, args...) -> f's results, whatever they
** are. Where its tensors are goes to the lfn table, for the re-run to
** check; with none, the call records nothing (first->untaped). */
static int recompute_first_body (lua_State *L) {
  forward_args *fa = (forward_args *)lua_touserdata(L, 1);
  int n = lua_gettop(L) - 2 + mgL_push_flag(L, fa->u->pass_flag);
  lua_call(L, n, LUA_MULTRET);
  int last = lua_gettop(L);
  if (mgL_collect_outputs(L, 2, last, fa) == 0) {
    fa->u->first->untaped = true;
  } else {
    lua_rawgeti(L, LUA_REGISTRYINDEX, fa->u->ref);
    mgL_pushplaces(L, 2, last - 1, "result");
    lua_setfield(L, -2, "places");
    lua_pop(L, 1);
  }
  return last - 1;
}

/* pushes the place list s (mgL_pushplaces's) from the entry at `at`:
** "tensors at ..., <that entry>[, ...]" */
static void push_excerpt (lua_State *L, const char *s, size_t at) {
  size_t len = strlen(s), end = at;
  while (end < len && !(s[end] == ',' && s[end + 1] == ' ')) end++;
  const char *entry = lua_pushlstring(L, s + at, end - at);
  lua_pushfstring(L, "tensors at %s%s%s", at > sizeof "tensors at " - 1 ? "..., " : "", entry,
                  end < len ? ", ..." : "");
  lua_remove(L, -2);
}

/* raises for a re-run whose tensors (at -2) are not where the first run's
** (at -1) were: both lists when short, else from the first entry that differs */
static int moved_tensors (lua_State *L) {
  const char *now = lua_tostring(L, -2), *then = lua_tostring(L, -1);
  static const char head[] = "tensors at ";
  size_t hl = sizeof head - 1;
  if (strlen(now) + strlen(then) > 300 && strncmp(now, head, hl) == 0 && strncmp(then, head, hl) == 0) {
    size_t c = 0, at = hl;
    while (now[c] && now[c] == then[c]) c++;
    for (size_t i = hl; i + 2 <= c; i++)
      if (now[i] == ',' && now[i + 1] == ' ') at = i + 2;
    push_excerpt(L, now, at);
    push_excerpt(L, then, at);
    now = lua_tostring(L, -2);
    then = lua_tostring(L, -1);
  }
  return luaL_error(L, "the recomputed function gave %s, the first run gave %s (it must be "
                    "deterministic)", now, then);
}

/* A re-run: the arguments are rebuilt from the template with the tensors
** the node kept (in the template's own leaf order) and the variables. */
static int rerun_inner (lua_State *L) {
  forward_args *fa = (forward_args *)lua_touserdata(L, 1);
  lua_settop(L, 0);
  lua_rawgeti(L, LUA_REGISTRYINDEX, fa->u->ref);           /* 1: the lfn table */
  lua_getfield(L, 1, "kinds");                             /* 2 */
  lua_createtable(L, fa->nin, 0);                          /* 3: the leaves */
  for (int k = 0; k < fa->nin; k++) {
    if (lua_geti(L, 2, k + 1) == LUA_TBOOLEAN) {           /* false: a tensor */
      lua_pop(L, 1);
      mgL_pushretained(L, fa->in[k]);
    }
    lua_rawseti(L, 3, k + 1);
  }
  lua_getfield(L, 1, "f");                                 /* 4 */
  lua_getfield(L, 1, "template");                          /* 5 */
  lua_Integer nargs = (lua_getfield(L, 5, "n"), lua_tointeger(L, -1));
  lua_pop(L, 1);
  luaL_checkstack(L, (int)nargs + 8, "too many arguments");
  lua_pushvalue(L, 4);
  int fidx = lua_gettop(L), k = 0;
  for (lua_Integer i = 1; i <= nargs; i++) {
    lua_geti(L, 5, i);
    mgL_rebuild(L, -1, 3, &k);
    lua_remove(L, -2);
  }
  lua_call(L, (int)nargs + mgL_push_flag(L, fa->u->pass_flag), LUA_MULTRET);
  int last = lua_gettop(L);
  mgL_pushplaces(L, fidx, last - fidx + 1, "result");
  lua_getfield(L, 1, "places");
  if (!lua_rawequal(L, -1, -2)) return moved_tensors(L);
  lua_pop(L, 2);
  mgL_collect_outputs(L, fidx, last, fa);
  return 0;
}

/* The outputs are in fa->out once it is done: every box the re-run made,
** its arguments' too, can go at once (see ltidy.c). */
static int rerun_body (lua_State *L) {
  lua_pushcfunction(L, rerun_inner);
  lua_insert(L, 1);
  if (mgL_tidy_pcall(L, 1, false) != LUA_OK) return lua_error(L);
  return 0;
}

/* }========================================================== */


/* {===================== recompute_grad ===================== */

#define RECOMPUTE_MT "moongrad.recompute_grad"

/* what a save policy is: keep nothing (recompute all), keep the matrix
** products, keep everything (no recompute: the plain tape), keep the
** result when the last op made it (the re-run stops short of it), or ask a Lua
** function (uservalue 2) */
typedef enum { KEEP_NOTHING, KEEP_DOTS, KEEP_EVERYTHING, KEEP_OUTPUT, KEEP_ASK } keep_rule;

typedef struct lrecompute { bool pass_flag, verify; keep_rule policy; } lrecompute;  /* uservalues: f, policy */

/* a policy written in Lua: policy(op_name, out_shape, dtype, is_product) -> boolean.
** It is asked from inside ops, whose frames are above the caller's: the
** function is reached through the registry, not a stack index. */
typedef struct lua_policy { lua_State *L; int ref; } lua_policy;

static int ask_body (lua_State *L) {
  const mg_opinfo *op = (const mg_opinfo *)lua_touserdata(L, 2);
  const mg_tensor *out = (const mg_tensor *)lua_touserdata(L, 3);
  lua_settop(L, 1);                                /* the policy */
  lua_pushstring(L, op->name);
  mgL_pushshape(L, mg_tensor_shape(out), mg_tensor_ndim(out));
  lua_pushstring(L, mg_dtype_name(mg_tensor_dtype(out)));
  lua_pushboolean(L, op->product);
  lua_call(L, 4, 1);
  return 1;
}

static int ask_lua (void *ud, const mg_opinfo *op, const mg_tensor *out) {
  lua_policy *p = (lua_policy *)ud;
  lua_State *L = p->L;
  if (!lua_checkstack(L, 8)) return mg_seterror("recompute_grad: Lua stack overflow in the policy"), -1;
  lua_pushcfunction(L, ask_body);
  lua_rawgeti(L, LUA_REGISTRYINDEX, p->ref);
  lua_pushlightuserdata(L, (void *)op);
  lua_pushlightuserdata(L, (void *)out);
  if (lua_pcall(L, 3, 1, 0) != LUA_OK) {
    mg_seterror("recompute_grad: the policy failed: %s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return -1;
  }
  int keep = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return keep;
}

static mg_status recompute_forward (void *ud, int nin, mg_tensor *const *in, mg_list *out) {
  lfn *u = (lfn *)ud;
  forward_args fa = {u, nin, in, out, "recompute_grad"};
  if (u->first) {                                /* the call itself; later ones re-run */
    mg_status st = mgL_run_first(&fa, recompute_first_body);
    u->first = NULL;
    return st;
  }
  lua_State *L = mgL_lfn_thread(u, "recompute_grad");
  return L ? mgL_protected(L, rerun_body, &fa) : MG_ERR;
}

static const mg_function recompute_fn = {"recompute_grad", recompute_forward, NULL, mgL_lfn_release, 0};
static const mg_function recompute_verified_fn = {"recompute_grad", recompute_forward, NULL, mgL_lfn_release,
                                                  MG_FN_VERIFY};

/* Pushes the template of the n arguments from `first`: {n=, ...} with plain
** tables copied, variables kept and tensors as holes (mgL_hollow); then
** its leaves (the boxes, while the call runs) in its own order, then
** their kinds (the variable, or false for a tensor). Returns the count. */
static int capture (lua_State *L, int first, int n, int *leaves, int *kinds) {
  lua_createtable(L, n, 1);
  int tmpl = lua_gettop(L);
  lua_createtable(L, n, 0);                 /* the arguments as a list, to copy */
  int orig = lua_gettop(L);
  for (int i = 0; i < n; i++) {
    lua_pushvalue(L, first + i);
    lua_rawseti(L, orig, i + 1);
  }
  lua_newtable(L);                          /* its leaves, to put back as they are */
  for (int i = 1, nl = 0; i <= n; i++) {    /* one by one, as rebuilt: nil holes keep the order */
    lua_geti(L, orig, i);
    nl = mgL_flatten(L, -1, orig + 1, nl, false, "recompute_grad: an argument");
    lua_pop(L, 1);
  }
  int k = 0;
  for (int i = 1; i <= n; i++) {
    lua_geti(L, orig, i);
    mgL_rebuild(L, -1, orig + 1, &k);
    lua_rawseti(L, tmpl, i);
    lua_pop(L, 1);
  }
  lua_pushinteger(L, n);
  lua_setfield(L, tmpl, "n");
  lua_settop(L, tmpl);
  lua_newtable(L);                          /* the template's leaves, in its order */
  *leaves = lua_gettop(L);
  int nl = 0;
  for (int i = 1; i <= n; i++) {
    lua_geti(L, tmpl, i);
    nl = mgL_flatten(L, -1, *leaves, nl, false, "recompute_grad: an argument");
    lua_pop(L, 1);
  }
  lua_createtable(L, nl, 0);
  *kinds = lua_gettop(L);
  for (int i = 1; i <= nl; i++) {
    lua_geti(L, *leaves, i);
    if (mgL_testvariable(L, -1) == NULL) {
      lua_pop(L, 1);
      lua_pushboolean(L, 0);
    }
    lua_rawseti(L, *kinds, i);
  }
  mgL_hollow(L, tmpl);       /* the node keeps the template: boxes there would pin what it let go */
  return nl;
}

/* Where an output is the very tensor f returned, f's box stands for it in
** the list `outs` instead of the new one: a second box would hold it too,
** and, left to the collector, keep it after the tape let go. */
static void reuse_boxes (lua_State *L, int first, int n, int outs) {
  lua_newtable(L);
  int mine = lua_gettop(L), nl = 0;
  for (int i = 0; i < n; i++)
    nl = mgL_flatten(L, first + i, mine, nl, false, "recompute_grad: a result of f");
  for (int i = 1; i <= nl; i++) {
    lua_geti(L, mine, i);
    lua_geti(L, outs, i);
    ltensor *own = mgL_testbox(L, -2), *made = mgL_testbox(L, -1);
    if (own && made && own->t == made->t) {
      mgL_releasebox(made);
      lua_pushvalue(L, -2);
      lua_rawseti(L, outs, i);
    }
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
}

/* g(...): f(...) with one node on the tapes instead of f's insides */
static int recompute_call (lua_State *L) {
  lrecompute *r = (lrecompute *)luaL_checkudata(L, 1, RECOMPUTE_MT);
  bool pass_flag = r->pass_flag;
  const mg_function *fn = r->verify ? &recompute_verified_fn : &recompute_fn;
  keep_rule policy = r->policy;
  int nargs = lua_gettop(L) - 1;
  luaL_checkstack(L, nargs + 8, "too many arguments");
  lua_policy ask = {L, LUA_NOREF};
  lua_getiuservalue(L, 1, 1);                      /* f */
  int fidx = lua_gettop(L);
  /* nothing to save memory from, or a policy that keeps everything: f as it is */
  if (mg_tapes_recording() == 0 || policy == KEEP_EVERYTHING) {
    for (int i = 0; i < nargs; i++) lua_pushvalue(L, 2 + i);
    lua_call(L, nargs + mgL_push_flag(L, pass_flag), LUA_MULTRET);
    return lua_gettop(L) - fidx + 1;
  }
  int leaves, kinds;
  int nl = capture(L, 2, nargs, &leaves, &kinds);
  int tmpl = leaves - 1;
  mg_tensor **in = mgL_tensor_array(L, leaves, nl);
  lua_createtable(L, 0, 3);                        /* the lfn table */
  lua_pushvalue(L, fidx);
  lua_setfield(L, -2, "f");
  lua_pushvalue(L, tmpl);
  lua_setfield(L, -2, "template");
  lua_pushvalue(L, kinds);
  lua_setfield(L, -2, "kinds");
  first_run first = {L, fidx, 2, nargs, 0, 0, 0, false};
  lfn *u = mgL_lfn_new(L, pass_flag, &first);
  mg_list out = {0};
  if (policy == KEEP_ASK) {
    lua_getiuservalue(L, 1, 2);
    ask.ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  mg_status st = mg_recompute_call_saving(fn, u, nl, in, &out,
                                          policy == KEEP_DOTS ? mg_save_dots
                                          : policy == KEEP_OUTPUT ? mg_save_output
                                          : policy == KEEP_ASK ? ask_lua : NULL, &ask);
  luaL_unref(L, LUA_REGISTRYINDEX, ask.ref);
  /* u may be gone by now (when no tape recorded the call): only `first` is read */
  if (st != MG_OK && first.error == 0 && first.untaped)
    return first.nresults;     /* no tensor to record (the core refused the empty call): f's results */
  if (st != MG_OK) return mgL_raise_call_error(L, &first);
  mgL_tidy_keep_captured(L, fidx);                 /* f runs again after an enclosing re-run */
  int outs = mgL_push_outputs(L, &out), k = 0;
  reuse_boxes(L, first.results, first.nresults, outs);
  for (int i = 0; i < first.nresults; i++) mgL_rebuild(L, first.results + i, outs, &k);
  return first.nresults;
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

/* the policy option at the top: a name or a function (left on the stack) */
static keep_rule policy_of (lua_State *L, int arg) {
  if (lua_isnil(L, -1)) return KEEP_NOTHING;
  if (lua_isfunction(L, -1)) return KEEP_ASK;
  static const char *const names[] = {"nothing", "dots", "everything", "output", NULL};
  const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  for (int i = 0; s && names[i]; i++)
    if (strcmp(s, names[i]) == 0) return (keep_rule)i;
  return (keep_rule)luaL_argerror(L, arg, lua_pushfstring(L, "option 'policy' must be \"nothing\", "
                                  "\"dots\", \"everything\", \"output\" or a function, got %s",
                                  s ? lua_pushfstring(L, "\"%s\"", s) : luaL_typename(L, -1)));
}

/* recompute_grad(f [, {pass_is_recomputing=false, policy="nothing", verify=false}]) */
static int l_recompute_grad (lua_State *L) {
  luaL_checkany(L, 1);
  if (!mgL_iscallable(L, 1))
    return luaL_argerror(L, 1, lua_pushfstring(L, "f must be callable (a function, or a table with "
                                                  "__call), got %s", luaL_typename(L, 1)));
  bool pass = false, verify = false;
  lua_settop(L, 2);
  lua_pushnil(L);                                  /* 3: the policy */
  if (!lua_isnil(L, 2)) {
    static const char *const keys[] = {"pass_is_recomputing", "policy", "verify", NULL};
    mgL_checkoptions(L, 2, keys);
    if (mgL_optionfield(L, 2, "pass_is_recomputing", LUA_TBOOLEAN) != LUA_TNIL) pass = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (mgL_optionfield(L, 2, "verify", LUA_TBOOLEAN) != LUA_TNIL) verify = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, 2, "policy");
    lua_replace(L, 3);
  }
  lua_pushvalue(L, 3);
  keep_rule policy = policy_of(L, 2);
  lua_pop(L, 1);
  lrecompute *r = (lrecompute *)lua_newuserdatauv(L, sizeof(lrecompute), 2);
  r->pass_flag = pass;
  r->verify = verify;
  r->policy = policy;
  luaL_setmetatable(L, RECOMPUTE_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, -2, 2);
  return 1;
}

/* }========================================================== */

void mgL_open_recompute (lua_State *L) {
  lua_pushcfunction(L, l_recompute_grad);
  lua_setfield(L, -2, "recompute_grad");
  luaL_newmetatable(L, RECOMPUTE_MT);
  static const luaL_Reg meta[] = {
    {"__call", recompute_call}, {"__index", recompute_index}, {"__tostring", recompute_tostring},
    {NULL, NULL}
  };
  mgL_setfuncs(L, meta);
  lua_pop(L, 1);
}

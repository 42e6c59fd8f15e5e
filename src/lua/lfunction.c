/*
** lfunction.c — mg.custom_gradient and mg.recompute_grad: Lua functions
** as C callbacks for mg_custom_call and mg_recompute_call.
**
** Each call gets a `lfn`, the user data of its callbacks: the Lua values
** it needs (f, grad_fn, the argument template) live in a registry table,
** and an anchor (the binding state's, lstate.c) says which Lua state they
** belong to. The anchor outlives the state: when lua_close runs, the
** state's finalizer clears its state pointer, so a C-owned tape that asks
** for the gradient later gets an error, not a dead state. Callbacks run Lua in protected mode: a Lua error must never
** unwind through the C walk.
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
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "lbinding.h"

/* {==================== callbacks' user data ================= */

/* The first run of f, from the binding's own stack frame: f and its
** arguments are there, and f's results (or its error) stay there. */
typedef struct first_run {
  lua_State *L;
  int f, args, nargs;          /* stack indices of f and its first argument; the count */
  int results, nresults;       /* f's results, after the run */
  int error;                   /* the error object's index, 0 if none */
  bool untaped;                /* recompute: f gave no tensor, so nothing is recorded */
} first_run;

typedef struct lfn {
  mgL_anchor *a;
  int ref;                     /* registry: {f=, grad_fn=, template=, kinds=} */
  bool pass_flag;              /* recompute_grad(f, {pass_is_recomputing=true}), or
                               ** custom_gradient(f, {context=true}) */
  first_run *first;            /* the call in progress; NULL after it */
} lfn;

/* Called by the C core: during a gradient (the walk frees nodes as it
** passes them) the asking thread runs, and the registry ref goes at once,
** so what the call captured is garbage as soon as the node is; otherwise
** (a finalizer, maybe on another thread) no Lua state is touched and the
** ref waits for the next sweep. */
static void lfn_release (void *ud) {
  lfn *u = (lfn *)ud;
  mgL_anchor *a = u->a;
  if (a->running != NULL) {
    luaL_unref(a->running, LUA_REGISTRYINDEX, u->ref);
  } else if (a->L != NULL) {
    if (a->ndead == a->capdead) {
      int cap = a->capdead ? a->capdead * 2 : 16;
      int *d = (int *)realloc(a->dead, sizeof(int) * (size_t)cap);
      if (d) { a->dead = d; a->capdead = cap; }
    }
    if (a->ndead < a->capdead) a->dead[a->ndead++] = u->ref;   /* else: one leaked ref */
  }
  mgL_anchor_release(a);
  free(u);
}

/* a new lfn for the registry table at the top (popped) */
static lfn *lfn_new (lua_State *L, bool pass_flag, first_run *first) {
  mgL_anchor *a = mgL_getstate(L)->anchor;
  if (a == NULL) luaL_error(L, "moongrad: the Lua state is closing");
  mgL_sweep(L, a);
  lfn *u = (lfn *)malloc(sizeof(lfn));
  if (u == NULL) luaL_error(L, "out of memory");
  u->a = a;
  a->refs++;
  u->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  u->pass_flag = pass_flag;
  u->first = first;
  return u;
}

/* the thread callbacks of u run on, or NULL + error when its state closed */
static lua_State *lfn_thread (const lfn *u, const char *what) {
  if (u->a->L == NULL)
    return mg_seterror("%s: the Lua state that defined this function has been closed", what), NULL;
  return u->a->running ? u->a->running : u->a->L;
}

/* runs body(L) protected, with ud as a light userdata argument; a Lua error
** becomes MG_ERR with its text */
static mg_status protected (lua_State *L, lua_CFunction body, void *ud) {
  if (!lua_checkstack(L, 4)) return mg_seterror("Lua stack overflow in a gradient callback");
  int top = lua_gettop(L);
  lua_pushcfunction(L, body);
  lua_pushlightuserdata(L, ud);
  int st = lua_pcall(L, 1, 0, 0);
  if (st != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    mg_seterror("%s", msg ? msg : "(error object is not a string)");
  }
  lua_settop(L, top);
  return st == LUA_OK ? MG_OK : MG_ERR;
}

/* pushes t as a new tensor box holding one more reference */
static void push_tensor (lua_State *L, mg_tensor *t) {
  ltensor *box = mgL_newbox(L);
  box->t = mg_tensor_retain(t);
}

/* }========================================================== */


/* {===================== running f ========================== */

typedef struct forward_args {
  lfn *u;
  int nin;
  mg_tensor *const *in;
  mg_list *out;
  const char *who;
} forward_args;

/* the tensors and variables among f's results first..last (in nested
** plain tables too; other values pass by) into fa->out; returns how many */
static int collect_outputs (lua_State *L, int first, int last, forward_args *fa) {
  lua_newtable(L);
  int list = lua_gettop(L), n = 0;
  for (int i = first; i <= last; i++)
    n = mgL_flatten(L, i, list, n, false, "recompute_grad: a result of f");
  for (int i = 1; i <= n; i++) {
    lua_geti(L, list, i);
    if (mg_list_push(fa->out, mg_tensor_retain(mgL_testtensor(L, -1))) != MG_OK) mgL_error(L);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return n;
}

/* pushes the flag table of recompute_grad(f, {pass_is_recomputing=true}) */
static int push_flag (lua_State *L, bool pass_flag) {
  if (!pass_flag) return 0;
  lua_createtable(L, 0, 1);
  lua_pushboolean(L, mg_is_recomputing());
  lua_setfield(L, -2, "is_recomputing");
  return 1;
}

/* Runs body(fa, f, args...) protected in the binding's frame; body
** leaves f's results, which stay on the stack; an error object stays too,
** for the binding to raise as it is. */
static mg_status run_first (forward_args *fa, lua_CFunction body) {
  first_run *r = fa->u->first;
  lua_State *L = r->L;
  if (!lua_checkstack(L, r->nargs + 8)) return mg_seterror("%s: too many arguments", fa->who);
  int top = lua_gettop(L);
  lua_pushcfunction(L, body);
  lua_pushlightuserdata(L, fa);
  lua_pushvalue(L, r->f);
  for (int i = 0; i < r->nargs; i++) lua_pushvalue(L, r->args + i);
  if (lua_pcall(L, r->nargs + 2, LUA_MULTRET, 0) != LUA_OK) {
    r->error = top + 1;
    const char *msg = lua_tostring(L, -1);
    return mg_seterror("%s", msg ? msg : "(error object is not a string)");
  }
  r->results = top + 1;
  r->nresults = lua_gettop(L) - top;
  return MG_OK;
}

/* recompute's first run: (fa, f, args...) -> f's results, whatever they
** are. Where its tensors are goes to the lfn table, for the re-run to
** check; with none, the call records nothing (first->untaped). */
static int recompute_first_body (lua_State *L) {
  forward_args *fa = (forward_args *)lua_touserdata(L, 1);
  int n = lua_gettop(L) - 2 + push_flag(L, fa->u->pass_flag);
  lua_call(L, n, LUA_MULTRET);
  int last = lua_gettop(L);
  if (collect_outputs(L, 2, last, fa) == 0) {
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
      push_tensor(L, fa->in[k]);
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
  lua_call(L, (int)nargs + push_flag(L, fa->u->pass_flag), LUA_MULTRET);
  int last = lua_gettop(L);
  mgL_pushplaces(L, fidx, last - fidx + 1, "result");
  lua_getfield(L, 1, "places");
  if (!lua_rawequal(L, -1, -2)) return moved_tensors(L);
  lua_pop(L, 2);
  collect_outputs(L, fidx, last, fa);
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
** products, keep everything (no recompute: the plain tape), or ask a Lua
** function (uservalue 2) */
typedef enum { KEEP_NOTHING, KEEP_DOTS, KEEP_EVERYTHING, KEEP_ASK } keep_rule;

typedef struct lrecompute { bool pass_flag; keep_rule policy; } lrecompute;  /* uservalues: f, policy */

/* a policy written in Lua: policy(op_name, out_shape, dtype) -> boolean.
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
  lua_call(L, 3, 1);
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
    mg_status st = run_first(&fa, recompute_first_body);
    u->first = NULL;
    return st;
  }
  lua_State *L = lfn_thread(u, "recompute_grad");
  return L ? protected(L, rerun_body, &fa) : MG_ERR;
}

static const mg_function recompute_fn = {"recompute_grad", recompute_forward, NULL, lfn_release, 0};

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

/* the tensors at list[1..n] as a C array in a userdata pushed on the stack */
static mg_tensor **tensor_array (lua_State *L, int list, int n) {
  mg_tensor **xs = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(n + 1), 0);
  for (int i = 0; i < n; i++) {
    lua_geti(L, list, i + 1);
    xs[i] = mgL_checktensor(L, -1);
    lua_pop(L, 1);
  }
  return xs;
}

/* raises after a failed call: f's own error object when it raised one */
static int raise_call_error (lua_State *L, const first_run *r) {
  if (r->error == 0) return mgL_error(L);
  lua_pushvalue(L, r->error);
  return lua_error(L);
}

/* the outputs in out, as new boxes in a list pushed on the stack; the
** boxes take over out's references */
static int push_outputs (lua_State *L, mg_list *out) {
  lua_createtable(L, out->n, 0);
  int list = lua_gettop(L);
  for (int i = 0; i < out->n; i++) {
    ltensor *box = mgL_newbox(L);
    box->t = out->t[i];
    out->t[i] = NULL;
    lua_rawseti(L, list, i + 1);
  }
  mg_list_clear(out);
  return list;
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
  keep_rule policy = r->policy;
  int nargs = lua_gettop(L) - 1;
  luaL_checkstack(L, nargs + 8, "too many arguments");
  lua_policy ask = {L, LUA_NOREF};
  lua_getiuservalue(L, 1, 1);                      /* f */
  int fidx = lua_gettop(L);
  /* nothing to save memory from, or a policy that keeps everything: f as it is */
  if (mg_tapes_recording() == 0 || policy == KEEP_EVERYTHING) {
    for (int i = 0; i < nargs; i++) lua_pushvalue(L, 2 + i);
    lua_call(L, nargs + push_flag(L, pass_flag), LUA_MULTRET);
    return lua_gettop(L) - fidx + 1;
  }
  int leaves, kinds;
  int nl = capture(L, 2, nargs, &leaves, &kinds);
  int tmpl = leaves - 1;
  mg_tensor **in = tensor_array(L, leaves, nl);
  lua_createtable(L, 0, 3);                        /* the lfn table */
  lua_pushvalue(L, fidx);
  lua_setfield(L, -2, "f");
  lua_pushvalue(L, tmpl);
  lua_setfield(L, -2, "template");
  lua_pushvalue(L, kinds);
  lua_setfield(L, -2, "kinds");
  first_run first = {L, fidx, 2, nargs, 0, 0, 0, false};
  lfn *u = lfn_new(L, pass_flag, &first);
  mg_list out = {0};
  if (policy == KEEP_ASK) {
    lua_getiuservalue(L, 1, 2);
    ask.ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  mg_status st = mg_recompute_call_saving(&recompute_fn, u, nl, in, &out,
                                          policy == KEEP_DOTS ? mg_save_dots
                                          : policy == KEEP_ASK ? ask_lua : NULL, &ask);
  luaL_unref(L, LUA_REGISTRYINDEX, ask.ref);
  /* u may be gone by now (when no tape recorded the call): only `first` is read */
  if (st != MG_OK && first.error == 0 && first.untaped)
    return first.nresults;     /* no tensor to record (the core refused the empty call): f's results */
  if (st != MG_OK) return raise_call_error(L, &first);
  mgL_tidy_keep_captured(L, fidx);                 /* f runs again after an enclosing re-run */
  int outs = push_outputs(L, &out), k = 0;
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

static bool callable (lua_State *L, int idx) {
  if (lua_isfunction(L, idx)) return true;
  if (luaL_getmetafield(L, idx, "__call") == LUA_TNIL) return false;
  lua_pop(L, 1);
  return true;
}

/* the policy option at the top: a name or a function (left on the stack) */
static keep_rule policy_of (lua_State *L, int arg) {
  if (lua_isnil(L, -1)) return KEEP_NOTHING;
  if (lua_isfunction(L, -1)) return KEEP_ASK;
  static const char *const names[] = {"nothing", "dots", "everything", NULL};
  const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  for (int i = 0; s && names[i]; i++)
    if (strcmp(s, names[i]) == 0) return (keep_rule)i;
  return (keep_rule)luaL_argerror(L, arg, lua_pushfstring(L, "option 'policy' must be \"nothing\", "
                                  "\"dots\", \"everything\" or a function, got %s",
                                  s ? lua_pushfstring(L, "\"%s\"", s) : luaL_typename(L, -1)));
}

/* recompute_grad(f [, {pass_is_recomputing=false, policy="nothing"}]) */
static int l_recompute_grad (lua_State *L) {
  luaL_checkany(L, 1);
  if (!callable(L, 1))
    return luaL_argerror(L, 1, lua_pushfstring(L, "f must be callable (a function, or a table with "
                                                  "__call), got %s", luaL_typename(L, 1)));
  bool pass = false;
  lua_settop(L, 2);
  lua_pushnil(L);                                  /* 3: the policy */
  if (!lua_isnil(L, 2)) {
    static const char *const keys[] = {"pass_is_recomputing", "policy", NULL};
    mgL_checkoptions(L, 2, keys);
    if (mgL_optionfield(L, 2, "pass_is_recomputing", LUA_TBOOLEAN) != LUA_TNIL) pass = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, 2, "policy");
    lua_replace(L, 3);
  }
  lua_pushvalue(L, 3);
  keep_rule policy = policy_of(L, 2);
  lua_pop(L, 1);
  lrecompute *r = (lrecompute *)lua_newuserdatauv(L, sizeof(lrecompute), 2);
  r->pass_flag = pass;
  r->policy = policy;
  luaL_setmetatable(L, RECOMPUTE_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, -2, 2);
  return 1;
}

/* }========================================================== */


/* {==================== custom_gradient ===================== */

static void push_ctx (lua_State *L, mg_custom_ctx *c);

/* custom's first run: (fa, f, args...) -> outputs; f's last result,
** grad_fn, goes to the lfn table for the backward. With {context = true}
** (pass_flag) f gets the call's context first. */
static int custom_first_body (lua_State *L) {
  forward_args *fa = (forward_args *)lua_touserdata(L, 1);
  if (fa->u->pass_flag) {
    mg_custom_ctx *c = mg_custom_context();
    if (c == NULL) return mgL_error(L);
    push_ctx(L, c);
    lua_insert(L, 3);
  }
  lua_call(L, lua_gettop(L) - 2, LUA_MULTRET);
  int first = 2, last = lua_gettop(L);
  if (last - first < 1 || !lua_isfunction(L, last))
    return luaL_error(L, "custom_gradient: f must return its outputs and then a gradient function");
  for (int i = first; i < last; i++) {
    mg_tensor *t = mgL_testtensor(L, i);
    if (t == NULL)
      return luaL_error(L, "custom_gradient: output %d of f is a %s, not a tensor", i - first + 1,
                        luaL_typename(L, i));
    if (mg_list_push(fa->out, mg_tensor_retain(t)) != MG_OK) return mgL_error(L);
  }
  mgL_tidy_keep_captured(L, last);         /* made in a re-run, used after it */
  lua_rawgeti(L, LUA_REGISTRYINDEX, fa->u->ref);
  lua_pushvalue(L, last);
  lua_setfield(L, -2, "grad_fn");
  return 0;
}

static mg_status custom_forward (void *ud, int nin, mg_tensor *const *in, mg_list *out) {
  lfn *u = (lfn *)ud;
  forward_args fa = {u, nin, in, out, "custom_gradient"};
  mg_status st = run_first(&fa, custom_first_body);
  u->first = NULL;
  return st;
}

typedef struct backward_args { lfn *u; const mg_grad_args *g; } backward_args;

/* din[j] from the value at idx (nil: unconnected, left to the C side) */
static void take_grad (lua_State *L, int idx, const mg_grad_args *g, int j) {
  if (!g->needs[j] || lua_isnil(L, idx)) return;
  mg_tensor *t = mgL_testtensor(L, idx);
  if (t == NULL)
    luaL_error(L, "grad_fn must return tensors or nil, got a %s for input %d", luaL_typename(L, idx),
               j + 1);
  g->din[j] = mg_tensor_retain(t);
}

/* what f read from outside it: its variables, then (captures) the tensors
** it closed over; grad_fn gets them as one list and returns their gradients
** as one list */
static int noutside (const mg_grad_args *g) { return g->nvars + g->ncaptured; }

/* the list of variable gradients at vt: one per variable, nil allowed
** inside it ({g1, nil, g3}) or at the end with n set ({g1, nil, n = 2}) */
static void take_var_grads (lua_State *L, int vt, const mg_grad_args *g) {
  int nx = noutside(g);
  if (!lua_istable(L, vt))
    luaL_error(L, "grad_fn must return a list of variable gradients after the input gradients "
                  "(f read %d variables%s), got a %s", nx, g->ncaptured ? " and closed-over tensors" : "",
               luaL_typename(L, vt));
  lua_Integer n = (lua_Integer)lua_rawlen(L, vt);
  if (lua_getfield(L, vt, "n") == LUA_TNUMBER) n = lua_tointeger(L, -1);
  lua_pop(L, 1);
  if (n != nx)
    luaL_error(L, "grad_fn returned %I variable gradients for the %d variables%s f read (use nil for "
                  "none; a trailing nil needs n = %d in the list)", n, nx,
               g->ncaptured ? " and closed-over tensors" : "", nx);
  for (int k = 0; k < nx; k++) {
    lua_geti(L, vt, k + 1);
    take_grad(L, lua_gettop(L), g, g->nin + k);
    lua_pop(L, 1);
  }
}

/* calls grad_fn(dy1, ..., dyk [, variables]) and takes what it returns */
static int custom_backward_body (lua_State *L) {
  backward_args *b = (backward_args *)lua_touserdata(L, 1);
  const mg_grad_args *g = b->g;
  int nx = noutside(g);
  lua_settop(L, 0);
  luaL_checkstack(L, g->nout + g->nin + 8, "too many outputs");
  lua_rawgeti(L, LUA_REGISTRYINDEX, b->u->ref);
  lua_getfield(L, 1, "grad_fn");
  for (int i = 0; i < g->nout; i++) push_tensor(L, g->dout[i]);
  if (nx > 0) {
    lua_createtable(L, nx, 0);
    for (int k = 0; k < g->nvars; k++) {
      mgL_pushvariable(L, g->vars[k]);
      lua_rawseti(L, -2, k + 1);
    }
    for (int k = 0; k < g->ncaptured; k++) {
      push_tensor(L, g->captured[k]);
      lua_rawseti(L, -2, g->nvars + k + 1);
    }
  }
  int want = g->nin + (nx > 0), top = lua_gettop(L) - (g->nout + (nx > 0)) - 1;
  lua_call(L, g->nout + (nx > 0), LUA_MULTRET);
  int got = lua_gettop(L) - top, base = top + 1;
  if (got != want)                   /* a forgotten gradient must not become a silent zero */
    return luaL_error(L, "grad_fn returned %d values; it must return %d: one gradient per tensor "
                         "argument (nil for none)%s", got, want,
                      nx > 0 ? ", then a list of the gradients of the variables f read" : "");
  for (int j = 0; j < g->nin; j++) take_grad(L, base + j, g, j);
  if (nx > 0) take_var_grads(L, base + g->nin, g);
  return 0;
}

static mg_status custom_backward (void *ud, const mg_grad_args *g) {
  lfn *u = (lfn *)ud;
  lua_State *L = lfn_thread(u, "custom_gradient");
  backward_args b = {u, g};
  return L ? protected(L, custom_backward_body, &b) : MG_ERR;
}

/* Without a context (TensorFlow's form) the forward is recorded, so a
** grad_fn using the forward's tensors can be differentiated again (TF's
** log1pexp to any order); with one (PyTorch's Function) it runs paused and
** the tapes hold what ctx:save keeps. */
static const mg_function custom_fn = {"custom_gradient", custom_forward, custom_backward,
                                      lfn_release, MG_FN_RECORD_FORWARD};
static const mg_function custom_ctx_fn = {"custom_gradient", custom_forward, custom_backward,
                                          lfn_release, 0};
/* with captures: the tensors f closes over that a tape follows come after
** the variables, in the list grad_fn gets and returns (ReversibleLayer) */
static const mg_function custom_captures_fn = {"custom_gradient", custom_forward, custom_backward,
                                               lfn_release, MG_FN_CAPTURES};
static const mg_function *const custom_forms[3] = {&custom_fn, &custom_ctx_fn, &custom_captures_fn};

/* g(...): upvalue 1 is f, upvalue 2 whether f takes a context */
static int custom_call (lua_State *L) {
  int nargs = lua_gettop(L);
  luaL_checkstack(L, nargs + 8, "too many arguments");
  lua_pushvalue(L, lua_upvalueindex(1));
  int fidx = lua_gettop(L);
  lua_newtable(L);                                 /* the tensor arguments */
  int list = lua_gettop(L), ntensors = 0;
  for (int i = 1; i <= nargs; i++)
    if (mgL_isleaf(L, i)) {
      lua_pushvalue(L, i);
      lua_rawseti(L, list, ++ntensors);
    }
  mg_tensor **in = tensor_array(L, list, ntensors);
  lua_newtable(L);                                 /* the lfn table */
  first_run first = {L, fidx, 1, nargs, 0, 0, 0, false};
  lua_Integer form = lua_tointeger(L, lua_upvalueindex(2));
  lfn *u = lfn_new(L, form > 0, &first);
  mg_list out = {0};
  mg_status st = mg_custom_call(custom_forms[form], u, ntensors, in, &out);
  if (st != MG_OK) return raise_call_error(L, &first);
  int outs = push_outputs(L, &out), n = (int)lua_rawlen(L, outs);
  for (int i = 1; i <= n; i++) lua_geti(L, outs, i);
  return n;
}

/* custom_gradient(f [, {context = false}]): g with g(...) == first results
** of f(...), or of f(ctx, ...) with a context */
static int l_custom_gradient (lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  bool context = false, captures = false;
  if (!lua_isnoneornil(L, 2)) {
    static const char *const keys[] = {"context", "captures", NULL};
    mgL_checkoptions(L, 2, keys);
    if (mgL_optionfield(L, 2, "context", LUA_TBOOLEAN) != LUA_TNIL) context = lua_toboolean(L, -1);
    if (mgL_optionfield(L, 2, "captures", LUA_TBOOLEAN) != LUA_TNIL) captures = lua_toboolean(L, -1);
  }
  if (captures && !context)
    return luaL_error(L, "custom_gradient: captures = true needs context = true (without a context the "
                         "forward is recorded, and what it closes over gets its gradient through it)");
  lua_settop(L, 1);
  lua_pushinteger(L, context + captures);          /* the form: 0, 1 context, 2 and captures */
  lua_pushcclosure(L, custom_call, 2);
  return 1;
}

/* }========================================================== */


/* {================ custom gradient contexts ================= */
/* ctx, the context of one custom_gradient call (PyTorch's ctx): save()
** in the forward, saved() in the backward; what it saves is the node's,
** counted by the tapes. */

#define CTX_MT "moongrad.CustomContext"

typedef struct lctx { mg_custom_ctx *c; } lctx;

/* a ctx box's user value: the boxes ctx:save was given, by index, held
** weakly (ctx:saved gives the same objects back while they live, as
** PyTorch's saved_tensors does; the counters see only what the node keeps) */
static void push_ctx (lua_State *L, mg_custom_ctx *c) {
  lctx *b = (lctx *)lua_newuserdatauv(L, sizeof(lctx), 1);
  b->c = NULL;
  luaL_setmetatable(L, CTX_MT);
  lua_createtable(L, 0, 0);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setiuservalue(L, -2, 1);
  b->c = mg_custom_ctx_retain(c);
}

static mg_custom_ctx *checkctx (lua_State *L) {
  lctx *b = (lctx *)luaL_checkudata(L, 1, CTX_MT);
  luaL_argcheck(L, b->c != NULL, 1, "context has been released");
  return b->c;
}

static int ctx_gc (lua_State *L) {
  lctx *b = (lctx *)luaL_checkudata(L, 1, CTX_MT);
  mg_custom_ctx_release(b->c);
  b->c = NULL;
  return 0;
}

/* the C core's last error, with its function name replaced by `who` */
static int ctx_error (lua_State *L, const char *who) {
  const char *msg = mg_errmsg_based(1), *colon = strstr(msg, ": ");
  return luaL_error(L, "%s: %s", who, colon ? colon + 2 : msg);
}

/* ctx:save(...): tensors (a variable: its value now; nil keeps its place)
** for the backward */
static int ctx_save (lua_State *L) {
  mg_custom_ctx *c = checkctx(L);
  int n = lua_gettop(L) - 1, first = mg_custom_nsaved(c);
  mg_tensor **ts = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(n + 1), 0);
  for (int i = 0; i < n; i++) {
    if (lua_isnil(L, i + 2)) {
      ts[i] = NULL;
    } else if ((ts[i] = mgL_testtensor(L, i + 2)) == NULL) {
      return luaL_error(L, "ctx:save: argument %d is a %s, not a tensor (or nil)", i + 1,
                        luaL_typename(L, i + 2));
    }
  }
  if (mg_custom_save(c, n, ts) != MG_OK) return ctx_error(L, "ctx:save");
  lua_getiuservalue(L, 1, 1);
  for (int i = 0; i < n; i++)
    if (mgL_testbox(L, i + 2) != NULL) {
      lua_pushvalue(L, i + 2);
      lua_rawseti(L, -2, first + i + 1);
    }
  return 0;
}

/* ctx:saved(): what the forward saved, in order (nil where nil was saved,
** or forgotten) */
static int ctx_saved (lua_State *L) {
  mg_custom_ctx *c = checkctx(L);
  int n = mg_custom_nsaved(c);
  if (n > 0 && !mg_custom_recorded(c))
    return luaL_error(L, "ctx:saved: what this call saved is gone (no tape recorded the call, "
                         "or its tape let go of it)");
  luaL_checkstack(L, n + 2, "too many saved tensors");
  lua_getiuservalue(L, 1, 1);
  int given = lua_gettop(L);
  for (int i = 0; i < n; i++) {
    mg_tensor *t = mg_custom_saved(c, i);
    ltensor *box = lua_rawgeti(L, given, i + 1) == LUA_TNIL ? NULL : mgL_testbox(L, -1);
    if (t == NULL) lua_pushnil(L);
    else if (box && box->t == t) continue;         /* the object that was saved, still there */
    else push_tensor(L, t);
    lua_remove(L, -2);
  }
  return n;
}

/* ctx:forget(i): lets go of saved tensor i now */
static int ctx_forget (lua_State *L) {
  mg_custom_ctx *c = checkctx(L);
  lua_Integer i = luaL_checkinteger(L, 2);
  int n = mg_custom_nsaved(c);
  if (i < 1 || i > n)
    return luaL_argerror(L, 2, lua_pushfstring(L, "index %I is out of range (%d saved)", i, n));
  return mg_custom_forget(c, (int)i - 1) == MG_OK ? 0 : ctx_error(L, "ctx:forget");
}

/* ctx:needs_input_grad(j): in the backward, whether tensor argument j's
** gradient is wanted (nil may be returned for it when not) */
static int ctx_needs_input_grad (lua_State *L) {
  mg_custom_ctx *c = checkctx(L);
  lua_Integer j = luaL_checkinteger(L, 2);
  luaL_argcheck(L, j >= 1 && j <= INT_MAX, 2, "input numbers start at 1");
  int r = mg_custom_needs_input_grad(c, (int)j - 1);
  if (r < 0) return ctx_error(L, "ctx:needs_input_grad");
  lua_pushboolean(L, r);
  return 1;
}

static int ctx_is_recorded (lua_State *L) {
  lua_pushboolean(L, mg_custom_recorded(checkctx(L)));
  return 1;
}

typedef struct ctx_rerun_args { lua_State *L; int nargs, status; } ctx_rerun_args;

static mg_status ctx_rerun_body (void *ud) {
  ctx_rerun_args *r = (ctx_rerun_args *)ud;
  r->status = mgL_tidy_pcall(r->L, r->nargs, true);      /* fn's temporaries go at its end */
  return r->status == LUA_OK ? MG_OK : MG_ERR;
}

/* ctx:recompute(fn, ...): fn(...) as a re-run of the forward:
** mg.is_recomputing() true, the random state as at the call (dropout masks
** match), is_in_loop() as at the call; returns fn's results */
static int ctx_recompute (lua_State *L) {
  mg_custom_ctx *c = checkctx(L);
  luaL_checkany(L, 2);
  ctx_rerun_args r = {L, lua_gettop(L) - 2, LUA_OK};
  mg_status st = mg_custom_rerun(c, ctx_rerun_body, &r);
  if (r.status != LUA_OK) return lua_error(L);     /* fn's own error, as it was */
  if (st != MG_OK) return mgL_error(L);
  return lua_gettop(L) - 1;
}

static int ctx_tostring (lua_State *L) {
  mg_custom_ctx *c = checkctx(L);
  lua_pushfstring(L, CTX_MT " (%d saved, %s)", mg_custom_nsaved(c),
                  mg_custom_recorded(c) ? "recorded" : "not recorded");
  return 1;
}

static void open_ctx (lua_State *L) {
  static const luaL_Reg methods[] = {
    {"save", ctx_save}, {"saved", ctx_saved}, {"forget", ctx_forget},
    {"needs_input_grad", ctx_needs_input_grad}, {"is_recorded", ctx_is_recorded},
    {"recompute", ctx_recompute}, {NULL, NULL}
  };
  luaL_newmetatable(L, CTX_MT);
  luaL_newlib(L, methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, ctx_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, ctx_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}

/* }========================================================== */


/* {========================= loops =========================== */

/* in_loop(fn, ...): runs fn(...) as a loop helper's body: mg.is_in_loop()
** is true inside (and in the backward of what it records) */
static int l_in_loop (lua_State *L) {
  luaL_checkany(L, 1);
  mg_loop_enter();
  int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  mg_loop_leave();
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}

static int l_is_in_loop (lua_State *L) {
  mgL_checknargs(L, 0);
  lua_pushboolean(L, mg_is_in_loop());
  return 1;
}

/* }========================================================== */

/* {================== saved-tensor hooks ===================== */

/* Lua's pack and unpack, in an lfn whose table is {pack=, unpack=}; they
** run on the thread asking for a gradient, or else on the one that pushed
** them (the forward runs there) */
typedef struct lhooks { lfn u; lua_State *pusher; } lhooks;

typedef struct hook_args { lhooks *hk; const char *which; mg_tensor *t; mg_tensor *out; } hook_args;

static int hook_body (lua_State *L) {
  hook_args *a = (hook_args *)lua_touserdata(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, a->hk->u.ref);
  lua_getfield(L, -1, a->which);
  push_tensor(L, a->t);
  lua_call(L, 1, 1);
  mg_tensor *r = mgL_testtensor(L, -1);
  if (r == NULL)
    return luaL_error(L, "saved_tensors_hooks: %s must return a tensor, got %s", a->which,
                      luaL_typename(L, -1));
  a->out = mg_tensor_retain(r);
  return 0;
}

static mg_tensor *run_hook (void *ud, mg_tensor *t, const char *which) {
  lhooks *hk = (lhooks *)ud;
  if (hk->u.a->L == NULL)
    return mg_seterror("saved_tensors_hooks: the Lua state that pushed them has been closed"), NULL;
  lua_State *L = hk->u.a->running ? hk->u.a->running : hk->pusher;
  hook_args a = {hk, which, t, NULL};
  return protected(L, hook_body, &a) == MG_OK ? a.out : NULL;
}

static mg_tensor *lua_pack (void *ud, mg_tensor *t) { return run_hook(ud, t, "pack"); }
static mg_tensor *lua_unpack (void *ud, mg_tensor *p, mg_dtype dt) {
  (void)dt;
  return run_hook(ud, p, "unpack");
}
static void lua_hooks_release (void *ud) { lfn_release(ud); }   /* lfn is lhooks' first field */

static const mg_saved_hooks lua_hooks = {lua_pack, lua_unpack, lua_hooks_release};

/* pushes the hooks named by the arguments from 1, once every argument is
** checked (a bad call must leave no hooks behind); returns where fn is */
static int push_hooks (lua_State *L) {
  if (lua_isfunction(L, 1)) {                       /* pack, unpack, fn, ... */
    luaL_checktype(L, 2, LUA_TFUNCTION);
    luaL_checktype(L, 3, LUA_TFUNCTION);
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, 1);
    lua_setfield(L, -2, "pack");
    lua_pushvalue(L, 2);
    lua_setfield(L, -2, "unpack");
    lhooks *hk = (lhooks *)malloc(sizeof(lhooks));
    if (hk == NULL) return luaL_error(L, "out of memory");
    lfn *u = lfn_new(L, false, NULL);
    hk->u = *u;                                     /* the lfn's fields, owned by hk now */
    free(u);
    hk->pusher = L;
    if (mg_saved_hooks_push(&lua_hooks, hk) != MG_OK) return mgL_error(L);
    return 3;
  }
  if (lua_type(L, 1) == LUA_TSTRING) {              /* "float16" or "bfloat16", fn, ... */
    const char *name = lua_tostring(L, 1);
    const mg_saved_hooks *h = strcmp(name, "float16") == 0 ? &mg_hooks_float16
                            : strcmp(name, "bfloat16") == 0 ? &mg_hooks_bfloat16 : NULL;
    if (h == NULL)
      return luaL_argerror(L, 1, lua_pushfstring(L, "\"float16\", \"bfloat16\", {offload = dir} or a "
                                                    "pack function expected, got \"%s\"", name));
    luaL_checktype(L, 2, LUA_TFUNCTION);
    if (mg_saved_hooks_push(h, NULL) != MG_OK) return mgL_error(L);
    return 2;
  }
  if (lua_istable(L, 1)) {                          /* {offload = dir}, fn, ... */
    static const char *const keys[] = {"offload", NULL};
    mgL_checkoptions(L, 1, keys);
    if (mgL_optionfield(L, 1, "offload", LUA_TSTRING) == LUA_TNIL)
      return luaL_argerror(L, 1, "option 'offload' (a directory) expected");
    luaL_checktype(L, 2, LUA_TFUNCTION);
    void *dir = mg_hooks_offload_dir(mgL_checkpath(L, lua_gettop(L), "saved_tensors_hooks"));
    if (dir == NULL || mg_saved_hooks_push(&mg_hooks_offload, dir) != MG_OK) return mgL_error(L);
    lua_pop(L, 1);
    return 2;
  }
  return luaL_argerror(L, 1, lua_pushfstring(L, "\"float16\", \"bfloat16\", {offload = dir} or a pack "
                                                "function expected, got %s", luaL_typename(L, 1)));
}

/* saved_tensors_hooks(hooks..., fn, ...): runs fn(...) with every tensor a
** tape saves going through the hooks; returns fn's results */
static int l_saved_tensors_hooks (lua_State *L) {
  int f = push_hooks(L);
  lua_pushvalue(L, f);
  lua_insert(L, f + 1);
  int base = f;                                     /* fn's copy sits at f + 1 */
  int st = lua_pcall(L, lua_gettop(L) - base - 1, LUA_MULTRET, 0);
  mg_saved_hooks_pop();
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L) - base;
}

/* {================= checkpoint_loop's steps ================= */
/* mg._loop.run(step, n, k, x1, ..., xL): mg_checkpoint_loop with
** step(i, phase, x1, ..., xL) -> L tensors as its C step (moongrad.
** checkpoint_loop gives the structure and the checks). The loop's own run
** happens inside the call, on the binding's thread; the backward's steps
** run on the thread asking for the gradient. */

typedef struct loop_step_args {
  lfn *u;
  int64_t i;
  mg_loop_phase phase;
  int n;
  mg_tensor *const *in;
  mg_list *out;
} loop_step_args;

static int loop_step_body (lua_State *L) {
  static const char *const phases[] = {"forward", "rerun", "taped"};
  loop_step_args *a = (loop_step_args *)lua_touserdata(L, 1);
  lua_settop(L, 0);
  luaL_checkstack(L, a->n + 8, "too many tensors in a loop's state");
  lua_rawgeti(L, LUA_REGISTRYINDEX, a->u->ref);
  lua_getfield(L, 1, "f");
  lua_pushinteger(L, (lua_Integer)a->i);
  lua_pushstring(L, phases[a->phase]);
  for (int j = 0; j < a->n; j++) push_tensor(L, a->in[j]);
  lua_call(L, a->n + 2, LUA_MULTRET);
  for (int k = 2; k <= lua_gettop(L); k++) {
    mg_tensor *t = mgL_testtensor(L, k);
    if (t == NULL)
      return luaL_error(L, "checkpoint_loop: step %I gave a %s, not a tensor", (lua_Integer)a->i,
                        luaL_typename(L, k));
    if (mg_list_push(a->out, mg_tensor_retain(t)) != MG_OK) return mgL_error(L);
  }
  return 0;
}

static mg_status loop_step (void *ud, int64_t i, mg_loop_phase phase, int n,
                            mg_tensor *const *in, mg_list *out) {
  lfn *u = (lfn *)ud;
  /* u->first points into l_loop_run's frame: read only while it runs */
  lua_State *L = phase == MG_LOOP_FORWARD ? u->first->L : lfn_thread(u, "checkpoint_loop");
  loop_step_args a = {u, i, phase, n, in, out};
  return L ? protected(L, loop_step_body, &a) : MG_ERR;
}

static const mg_loop_fn lua_loop_fn = {"checkpoint_loop", loop_step, lfn_release};

static int l_loop_run (lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_Integer steps = luaL_checkinteger(L, 2), k = luaL_checkinteger(L, 3);
  int n = lua_gettop(L) - 3;
  luaL_argcheck(L, k >= 1, 3, "snapshots must be at least 1");
  if (k > INT_MAX) k = INT_MAX;
  mg_tensor **in = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(n + 1), 0);
  for (int j = 0; j < n; j++) in[j] = mgL_checktensor(L, 4 + j);
  lua_createtable(L, 0, 1);                        /* the lfn table */
  lua_pushvalue(L, 1);
  lua_setfield(L, -2, "f");
  first_run first = {L, 1, 4, n, 0, 0, 0, false};
  lfn *u = lfn_new(L, false, &first);
  mg_list out = {0};
  if (mg_checkpoint_loop(&lua_loop_fn, u, n, in, (int64_t)steps, (int)k, &out) != MG_OK)
    return mgL_error(L);
  luaL_checkstack(L, out.n, "too many tensors in a loop's state");
  for (int j = 0; j < out.n; j++) push_tensor(L, out.t[j]);
  int got = out.n;
  mg_list_clear(&out);
  return got;
}

/* mg._loop.recomputed(n, k): mg_revolve_recomputed */
static int l_loop_recomputed (lua_State *L) {
  int64_t r = mg_revolve_recomputed((int64_t)luaL_checkinteger(L, 1), (int64_t)luaL_checkinteger(L, 2));
  if (r < 0) return mgL_error(L);
  lua_pushinteger(L, (lua_Integer)r);
  return 1;
}

/* }========================================================== */

/* }========================================================== */

/* what mg._layer_call does once the layer returned (also when a yield in it
** resumes): the note */
static int layer_called (lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  int nres = lua_gettop(L) - 1;
  lua_pushliteral(L, "_output_shape");
  if (nres >= 2 && mgL_testbox(L, 3)) lua_pushliteral(L, "multiple");
  else if (nres >= 1 && mgL_testbox(L, 2)) lua_getfield(L, 2, "shape");
  else lua_pushnil(L);
  if (lua_isnil(L, -1)) lua_pop(L, 2);
  else lua_rawset(L, 1);
  return nres;
}

/* mg._layer_call(self, ...): the __call of mg.nn's layer classes:
** self:call(...), then the shape of what it returned noted in self for
** summary() ("multiple" for several tensors; nn.lua's note_shape). In C
** because a Lua wrapper's frame would hold the layer's input until the layer
** returned: each input would outlive two young collections and grow old,
** garbage that only a full collection finds. lua_call takes the arguments
** off this frame instead (lua_callk: a layer may yield, as in Lua). */
static int l_layer_call (lua_State *L) {
  int nargs = lua_gettop(L);                 /* self, ... */
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_pushvalue(L, 1);
  lua_insert(L, 1);                          /* self (for the note), self, ... */
  lua_getfield(L, 2, "call");
  lua_insert(L, 2);                          /* self, call, self, ... */
  lua_callk(L, nargs, LUA_MULTRET, 0, layer_called);
  return layer_called(L, LUA_OK, 0);
}

void mgL_open_functions (lua_State *L) {
  lua_pushcfunction(L, l_in_loop);
  lua_setfield(L, -2, "in_loop");
  lua_pushcfunction(L, l_is_in_loop);
  lua_setfield(L, -2, "is_in_loop");
  open_ctx(L);
  lua_pushcfunction(L, l_saved_tensors_hooks);
  lua_setfield(L, -2, "saved_tensors_hooks");
  lua_pushcfunction(L, l_custom_gradient);
  lua_setfield(L, -2, "custom_gradient");
  lua_pushcfunction(L, l_recompute_grad);
  lua_setfield(L, -2, "recompute_grad");
  lua_pushcfunction(L, l_layer_call);
  lua_setfield(L, -2, "_layer_call");
  static const luaL_Reg loop[] = {{"run", l_loop_run}, {"recomputed", l_loop_recomputed}, {NULL, NULL}};
  luaL_newlib(L, loop);
  lua_setfield(L, -2, "_loop");
  luaL_newmetatable(L, RECOMPUTE_MT);
  static const luaL_Reg meta[] = {
    {"__call", recompute_call}, {"__index", recompute_index}, {"__tostring", recompute_tostring},
    {NULL, NULL}
  };
  luaL_setfuncs(L, meta, 0);
  lua_pop(L, 1);
}

/*
** lfunction.c — what the bindings of Lua functions as C callbacks share
** (lfunction.h), and mg._layer_call.
**
** Each call gets a `lfn`, the user data of its callbacks: the Lua values
** it needs (f, grad_fn, the argument template) live in a registry table,
** and an anchor (the binding state's, lstate.c) says which Lua state they
** belong to. The anchor outlives the state: when lua_close runs, the state's
** finalizer clears its state pointer, so a C-owned tape that asks for the
** gradient later gets an error, not a dead state. Callbacks run Lua in
** protected mode: a Lua error must never unwind through the C walk.
*/
#include <stdlib.h>

#include "lfunction.h"

/* {==================== callbacks' user data ================= */

/* Called by the C core: during a gradient (the walk frees nodes as it
** passes them) the asking thread runs, and the registry ref goes at once,
** so what the call captured is garbage as soon as the node is; otherwise
** (a finalizer, maybe on another thread) no Lua state is touched and the
** ref waits for the next sweep. */
void mgL_lfn_release (void *ud) {
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
lfn *mgL_lfn_new (lua_State *L, bool pass_flag, first_run *first) {
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
lua_State *mgL_lfn_thread (const lfn *u, const char *what) {
  if (u->a->L == NULL)
    return mg_seterror("%s: the Lua state that defined this function has been closed", what), NULL;
  return u->a->running ? u->a->running : u->a->L;
}

/* runs body(L) protected, with ud as a light userdata argument; a Lua error
** becomes MG_ERR with its text */
mg_status mgL_protected (lua_State *L, lua_CFunction body, void *ud) {
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
void mgL_pushretained (lua_State *L, mg_tensor *t) {
  ltensor *box = mgL_newbox(L);
  box->t = mg_tensor_retain(t);
}

/* }========================================================== */


/* {===================== running f ========================== */

/* the tensors and variables among f's results first..last (in nested
** plain tables too; other values pass by) into fa->out; returns how many */
int mgL_collect_outputs (lua_State *L, int first, int last, forward_args *fa) {
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
int mgL_push_flag (lua_State *L, bool pass_flag) {
  if (!pass_flag) return 0;
  lua_createtable(L, 0, 1);
  lua_pushboolean(L, mg_is_recomputing());
  lua_setfield(L, -2, "is_recomputing");
  return 1;
}

/* Runs body(fa, f, args...) protected in the binding's frame; body
** leaves f's results, which stay on the stack; an error object stays too,
** for the binding to raise as it is. */
mg_status mgL_run_first (forward_args *fa, lua_CFunction body) {
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

/* the tensors at list[1..n] as a C array in a userdata pushed on the stack */
mg_tensor **mgL_tensor_array (lua_State *L, int list, int n) {
  mg_tensor **xs = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(n + 1), 0);
  for (int i = 0; i < n; i++) {
    lua_geti(L, list, i + 1);
    xs[i] = mgL_checktensor(L, -1);
    lua_pop(L, 1);
  }
  return xs;
}

/* raises after a failed call: f's own error object when it raised one */
int mgL_raise_call_error (lua_State *L, const first_run *r) {
  if (r->error == 0) return mgL_error(L);
  lua_pushvalue(L, r->error);
  return lua_error(L);
}

/* the outputs in out, as new boxes in a list pushed on the stack; the
** boxes take over out's references */
int mgL_push_outputs (lua_State *L, mg_list *out) {
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

/* }========================================================== */

/* the memory planner's hook (moongrad.planner), while one measures or
** applies a plan over the layer calls of a model that is not a Sequential:
** around(self) before each layer call gives what to call in place of
** self.call (nil: self.call itself), and around() after it returned or
** failed (the same function: it stays on this frame). The call's arguments
** stay on this C frame until lua_call moves them to the callee, so a layer
** that lets go of its input early still can (a Lua wrapper's frame would
** hold it). A registry slot: a plain call pays one lookup. */
static const char layer_around = 0;

/* moongrad.check's handler of a layer call's error (a registry slot set by
** mg._layer_errors): it gives an error that a built-in layer's call raised
** inside moongrad's Lua modules ("moongrad/nn.lua:306: conv2d: ...") the
** position of the user's line that called the layer, and raises it */
static const char layer_errors = 0;

/* a failed layer call's error, on top, raised again through the handler
** (a runtime error only: out of memory stays as it is) */
static int layer_failed (lua_State *L, int status) {
  if (status == LUA_ERRRUN && lua_rawgetp(L, LUA_REGISTRYINDEX, &layer_errors) == LUA_TFUNCTION) {
    lua_insert(L, -2);
    lua_call(L, 1, 0);                       /* raises */
  }
  return lua_error(L);
}

/* what mg._layer_call does once the layer returned or failed (also when a
** yield in it resumes): with a hook (ctx; the stack is hook, self, results),
** its "returned"; the error raised again if the call failed; the note */
static int layer_called (lua_State *L, int status, lua_KContext ctx) {
  int self = ctx ? 2 : 1;
  if (ctx) {
    lua_pushvalue(L, 1);
    lua_call(L, 0, 0);
  }
  if (status != LUA_OK && status != LUA_YIELD) return layer_failed(L, status);   /* its error object is on top */
  int nres = lua_gettop(L) - self;
  lua_pushliteral(L, "_output_shape");
  if (nres >= 2 && mgL_testbox(L, self + 2)) lua_pushliteral(L, "multiple");
  else if (nres >= 1 && mgL_testbox(L, self + 1)) lua_getfield(L, self + 1, "shape");
  else lua_pushnil(L);
  if (lua_isnil(L, -1)) lua_pop(L, 2);
  else lua_rawset(L, self);
  return nres;
}

/* mg._layer_around(f or nil): sets the hook; returns the one before */
static int l_layer_around (lua_State *L) {
  if (!lua_isnoneornil(L, 1)) luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &layer_around);
  lua_pushvalue(L, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &layer_around);
  return 1;
}

/* mg._layer_call(self, ...): the __call of mg.nn's layer classes:
** self:call(...), then the shape of what it returned noted in self for
** summary() ("multiple" for several tensors; nn.lua's note_shape). In C
** because a Lua wrapper's frame would hold the layer's input until the layer
** returned: each input would outlive two young collections and grow old,
** garbage that only a full collection finds. lua_call takes the arguments
** off this frame instead (lua_pcallk: a layer may yield, as in Lua). */
static int l_layer_call (lua_State *L) {
  int nargs = lua_gettop(L);                 /* self, ... */
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_pushliteral(L, "_build_pending");      /* a Layer:subclass with a build of its own, unbuilt */
  int pending = lua_rawget(L, 1) != LUA_TNIL;
  lua_pop(L, 1);
  if (pending) {                             /* self:_build_first(first argument) */
    lua_getfield(L, 1, "_build_first");
    lua_pushvalue(L, 1);
    if (nargs >= 2) lua_pushvalue(L, 2); else lua_pushnil(L);
    lua_call(L, 2, 0);
  }
  lua_pushvalue(L, 1);
  lua_insert(L, 1);                          /* self (for the note), self, ... */
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &layer_around) == LUA_TNIL) {
    lua_pop(L, 1);
    lua_getfield(L, 2, "call");
    lua_insert(L, 2);                        /* self, call, self, ... */
    int status = lua_pcallk(L, nargs, LUA_MULTRET, 0, 0, layer_called);
    return layer_called(L, status, 0);
  }
  lua_insert(L, 1);                          /* around, self (for the note), self, ... */
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 3);
  lua_call(L, 1, 1);                         /* around(self): what to call instead, or nil */
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_getfield(L, 3, "call");
  }
  lua_insert(L, 3);                          /* around, self, call, self, ... */
  /* a failing call still tells the hook (its count of calls stays right) */
  int status = lua_pcallk(L, nargs, LUA_MULTRET, 0, 1, layer_called);
  return layer_called(L, status, 1);
}

/* mg._layer_errors(f): sets the handler of layer calls' errors (moongrad.check's) */
static int l_layer_errors (lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &layer_errors);
  return 0;
}

void mgL_open_functions (lua_State *L) {
  lua_pushcfunction(L, l_layer_call);
  lua_setfield(L, -2, "_layer_call");
  lua_pushcfunction(L, l_layer_around);
  lua_setfield(L, -2, "_layer_around");
  lua_pushcfunction(L, l_layer_errors);
  lua_setfield(L, -2, "_layer_errors");
}

/*
** lloop.c — loops: mg.in_loop and mg.is_in_loop, and mg._loop, the C half of
** moongrad.checkpoint_loop (autodiff's loop.c): a Lua step function as the
** C step of mg_checkpoint_loop.
*/
#include <limits.h>

#include "lfunction.h"

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
  for (int j = 0; j < a->n; j++) mgL_pushretained(L, a->in[j]);
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
  lua_State *L = phase == MG_LOOP_FORWARD ? u->first->L : mgL_lfn_thread(u, "checkpoint_loop");
  loop_step_args a = {u, i, phase, n, in, out};
  return L ? mgL_protected(L, loop_step_body, &a) : MG_ERR;
}

static const mg_loop_fn lua_loop_fn = {"checkpoint_loop", loop_step, mgL_lfn_release};

static int l_loop_run (lua_State *L) {
  mgL_checkcallable(L, 1);
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
  lfn *u = mgL_lfn_new(L, false, &first);
  mg_list out = {0};
  if (mg_checkpoint_loop(&lua_loop_fn, u, n, in, (int64_t)steps, (int)k, &out) != MG_OK)
    return mgL_error(L);
  luaL_checkstack(L, out.n, "too many tensors in a loop's state");
  for (int j = 0; j < out.n; j++) mgL_pushretained(L, out.t[j]);
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

void mgL_open_loops (lua_State *L) {
  lua_pushcfunction(L, l_in_loop);
  lua_setfield(L, -2, "in_loop");
  lua_pushcfunction(L, l_is_in_loop);
  lua_setfield(L, -2, "is_in_loop");
  static const luaL_Reg loop[] = {{"run", l_loop_run}, {"recomputed", l_loop_recomputed}, {NULL, NULL}};
  mgL_newlib(L, loop);
  lua_setfield(L, -2, "_loop");
}

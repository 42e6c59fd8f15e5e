/*
** lcustom.c — mg.custom_gradient: a Lua function and its gradient function
** as an mg_function of mg_custom_call (autodiff's custom.c), and ctx, the
** context of one call (PyTorch's Function ctx).
*/
#include <limits.h>
#include <string.h>

#include "lfunction.h"

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
  mg_status st = mgL_run_first(&fa, custom_first_body);
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
  for (int i = 0; i < g->nout; i++) mgL_pushretained(L, g->dout[i]);
  if (nx > 0) {
    lua_createtable(L, nx, 0);
    for (int k = 0; k < g->nvars; k++) {
      mgL_pushvariable(L, g->vars[k]);
      lua_rawseti(L, -2, k + 1);
    }
    for (int k = 0; k < g->ncaptured; k++) {
      mgL_pushretained(L, g->captured[k]);
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
  lua_State *L = mgL_lfn_thread(u, "custom_gradient");
  backward_args b = {u, g};
  return L ? mgL_protected(L, custom_backward_body, &b) : MG_ERR;
}

/* Without a context (TensorFlow's form) the forward is recorded, so a
** grad_fn using the forward's tensors can be differentiated again (TF's
** log1pexp to any order); with one (PyTorch's Function) it runs paused and
** the tapes hold what ctx:save keeps. */
/* With captures, the tensors f closes over that a tape follows come after
** the variables, in the list grad_fn gets and returns (ReversibleLayer);
** with rereads, grad_fn runs f's code again on the variables' values, so a
** variable assigned since the forward is an error (MG_FN_REREADS). By form:
** 0 no context, then with one: 1 + captures + 2 * rereads. */
#define FORM(flags) {"custom_gradient", custom_forward, custom_backward, mgL_lfn_release, flags}
static const mg_function custom_forms[5] = {FORM(MG_FN_RECORD_FORWARD), FORM(0), FORM(MG_FN_CAPTURES),
                                            FORM(MG_FN_REREADS), FORM(MG_FN_CAPTURES | MG_FN_REREADS)};
#undef FORM

/* g(...): upvalue 1 is the binding's state (lbinding.h), 2 is f, 3 the form
** (whether f takes a context, and captures) */
static int custom_call (lua_State *L) {
  int nargs = lua_gettop(L);
  luaL_checkstack(L, nargs + 8, "too many arguments");
  lua_pushvalue(L, lua_upvalueindex(2));
  int fidx = lua_gettop(L);
  lua_newtable(L);                                 /* the tensor arguments */
  int list = lua_gettop(L), ntensors = 0;
  for (int i = 1; i <= nargs; i++)
    if (mgL_isleaf(L, i)) {
      lua_pushvalue(L, i);
      lua_rawseti(L, list, ++ntensors);
    }
  mg_tensor **in = mgL_tensor_array(L, list, ntensors);
  lua_newtable(L);                                 /* the lfn table */
  first_run first = {L, fidx, 1, nargs, 0, 0, 0, false};
  lua_Integer form = lua_tointeger(L, lua_upvalueindex(3));
  lfn *u = mgL_lfn_new(L, form > 0, &first);   /* (a context from form 1 on) */
  mg_list out = {0};
  mg_status st = mg_custom_call(&custom_forms[form], u, ntensors, in, &out);
  if (st != MG_OK) return mgL_raise_call_error(L, &first);
  int outs = mgL_push_outputs(L, &out), n = (int)lua_rawlen(L, outs);
  for (int i = 1; i <= n; i++) lua_geti(L, outs, i);
  return n;
}

/* custom_gradient(f [, {context = false, captures = false, rereads = false}]):
** g with g(...) == first results of f(...), or of f(ctx, ...) with a context */
static int l_custom_gradient (lua_State *L) {
  mgL_checkcallable(L, 1);
  bool context = false, captures = false, rereads = false;
  if (!lua_isnoneornil(L, 2)) {
    static const char *const keys[] = {"context", "captures", "rereads", NULL};
    mgL_checkoptions(L, 2, keys);
    if (mgL_optionfield(L, 2, "context", LUA_TBOOLEAN) != LUA_TNIL) context = lua_toboolean(L, -1);
    if (mgL_optionfield(L, 2, "captures", LUA_TBOOLEAN) != LUA_TNIL) captures = lua_toboolean(L, -1);
    if (mgL_optionfield(L, 2, "rereads", LUA_TBOOLEAN) != LUA_TNIL) rereads = lua_toboolean(L, -1);
  }
  if ((captures || rereads) && !context)
    return luaL_error(L, "custom_gradient: %s = true needs context = true (without a context the "
                         "forward is recorded, and what it closes over gets its gradient through it)",
                      captures ? "captures" : "rereads");
  lua_settop(L, 1);
  mgL_pushstate(L);
  lua_insert(L, 1);
  lua_pushinteger(L, context ? 1 + captures + 2 * rereads : 0);   /* the form (custom_forms) */
  lua_pushcclosure(L, custom_call, 3);
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
    else mgL_pushretained(L, t);
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
  mgL_newlib(L, methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, ctx_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, ctx_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}

/* }========================================================== */

void mgL_open_custom (lua_State *L) {
  open_ctx(L);
  lua_pushcfunction(L, l_custom_gradient);
  lua_setfield(L, -2, "custom_gradient");
}

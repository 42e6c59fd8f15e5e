/*
** ltape.c — the Tape userdata (tf.GradientTape).
**
** A tape records from its creation until stop() or the end of a
** `local t <close> = mg.tape()` scope. gradient() takes sources as one
** tensor/variable or any nesting of plain tables, and answers in the same
** shape.
*/
#include <stdio.h>
#include <string.h>

#include "lbinding.h"

static const char tape_key = 'P';       /* the metatable, by address (see lauxmg.c) */

static ltape *tapebox (lua_State *L, int arg) {
  ltape *b = (ltape *)lua_touserdata(L, arg);
  if (b != NULL && lua_getmetatable(L, arg)) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &tape_key);
    bool ok = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    if (ok) return b;
  }
  return (ltape *)luaL_checkudata(L, arg, MG_TAPE_MT);    /* raises the usual message */
}

/* a tape whose __gc ran (by hand, or resurrected by a finalizer) is dead */
static ltape *checktape (lua_State *L, int arg) {
  ltape *b = tapebox(L, arg);
  if (b->t == NULL) luaL_error(L, "tape has been released");
  return b;
}

static int tape_gc (lua_State *L) {
  ltape *b = tapebox(L, 1);
  if (b->t == NULL) return 0;
  mgL_checkrelease(L, "tape");
  mg_tape_release(b->t);
  b->t = NULL;
  mgL_sweep_dead(L);
  return 0;
}

static int tape_close (lua_State *L) {       /* end of a <close> scope: stop */
  mg_tape_stop(tapebox(L, 1)->t);
  return 0;
}

/* tape{persistent=false, watch_accessed_variables=true, budget=nil} */
static int l_tape (lua_State *L) {
  bool persistent = false, watch = true, warn = true;
  size_t budget = 0;
  if (!lua_isnoneornil(L, 1)) {
    static const char *const keys[] = {"persistent", "watch_accessed_variables", "budget", "warn", NULL};
    mgL_checkoptions(L, 1, keys);
    if (mgL_optionfield(L, 1, "persistent", LUA_TBOOLEAN) != LUA_TNIL) persistent = lua_toboolean(L, -1);
    if (mgL_optionfield(L, 1, "watch_accessed_variables", LUA_TBOOLEAN) != LUA_TNIL) watch = lua_toboolean(L, -1);
    if (mgL_optionfield(L, 1, "warn", LUA_TBOOLEAN) != LUA_TNIL) warn = lua_toboolean(L, -1);
    lua_getfield(L, 1, "budget");
    if (!lua_isnil(L, -1)) budget = mgL_checkbytes(L, lua_gettop(L), "tape: option 'budget'");
    lua_pop(L, 4);
  }
  mgL_checkfinalizer(L);
  ltape *b = (ltape *)lua_newuserdatauv(L, sizeof(ltape), 0);
  b->t = NULL;
  b->warn = warn;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &tape_key);
  lua_setmetatable(L, -2);
  b->t = mg_tape_new(persistent, watch);
  if (b->t == NULL || (budget && mg_tape_set_budget(b->t, budget) != MG_OK)) return mgL_error(L);
  return 1;
}

static int l_stop (lua_State *L) {
  mg_tape_stop(checktape(L, 1)->t);
  return 0;
}

/* watch(x): a tensor, a variable, or nested tables of them */
static int l_watch (lua_State *L) {
  mg_tape *t = checktape(L, 1)->t;
  luaL_checkany(L, 2);
  lua_newtable(L);
  int n = mgL_flatten(L, 2, 3, 0, true, "tape:watch: argument");
  for (int i = 1; i <= n; i++) {
    lua_geti(L, 3, i);
    mg_variable *v = mgL_testvariable(L, -1);
    if ((v ? mg_tape_watch_variable(t, v) : mg_tape_watch(t, mgL_testtensor(L, -1))) != MG_OK)
      return mgL_error(L);
    lua_pop(L, 1);
  }
  return 0;
}

static int l_watched_variables (lua_State *L) {
  mg_tape *t = checktape(L, 1)->t;
  int n = mg_tape_nvariables(t);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    mgL_pushvariable(L, mg_tape_variable(t, i));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_reset (lua_State *L) {
  if (mg_tape_reset(checktape(L, 1)->t) != MG_OK) return mgL_error(L);
  mgL_sweep_dead(L);
  return 0;
}

static int l_saved_bytes (lua_State *L) {
  lua_pushinteger(L, (lua_Integer)mg_tape_saved_bytes(checktape(L, 1)->t));
  return 1;
}

static int l_is_recording (lua_State *L) {
  lua_pushboolean(L, mg_tape_is_recording(checktape(L, 1)->t));
  return 1;
}

/* "none" (default) or "zero" from opts.unconnected at arg */
static int unconnected_zero (lua_State *L, int arg) {
  if (lua_isnoneornil(L, arg)) return 0;
  static const char *const keys[] = {"unconnected", NULL};
  mgL_checkoptions(L, arg, keys);
  mgL_optionfield(L, arg, "unconnected", LUA_TSTRING);
  const char *u = lua_isnil(L, -1) ? "none" : lua_tostring(L, -1);
  lua_pop(L, 1);
  if (strcmp(u, "zero") == 0) return 1;
  if (strcmp(u, "none") != 0)
    luaL_argerror(L, arg, lua_pushfstring(L, "unconnected must be \"none\" or \"zero\", got \"%s\"", u));
  return 0;
}

/* the tensors at acc[1..n], as a C array in a userdata left on the stack */
static mg_tensor **leaves (lua_State *L, int acc, int n) {
  mg_tensor **xs = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(n > 0 ? n : 1), 0);
  for (int i = 0; i < n; i++) {
    lua_geti(L, acc, i + 1);
    xs[i] = mgL_testtensor(L, -1);
    lua_pop(L, 1);
  }
  return xs;
}

/* runs a gradient computation with L running it for Lua backward rules */
static mg_status run_gradient (lua_State *L, mg_tape *t, int nt, mg_tensor **targets, int ns,
                               mg_tensor **sources, mg_tensor **seeds, int zero, mg_tensor **grads) {
  mgL_call prev = mgL_enter(L);
  mg_status st = mg_tape_gradient(t, nt, targets, ns, sources, seeds, zero, grads);
  mgL_leave(L, prev);
  return st;
}


/* the list of boxes for answer: ns of them, empty */
static int new_answers (lua_State *L) {
  int ns = (int)lua_tointeger(L, 1);
  lua_createtable(L, ns, 0);
  for (int i = 1; i <= ns; i++) {
    mgL_newbox(L);
    lua_rawseti(L, -2, i);
  }
  return 1;
}

/*
** Pushes the list of results[0..n) as tensors (nil where NULL) and returns
** its stack index; takes over results. The boxes are made after the walk:
** the young collections during it would make boxes made before it old, and
** the step's gradients, garbage after its update, would wait for a full
** collection. A protected call makes them, so running out of memory there
** cannot leak the results.
*/
int mgL_box_answers (lua_State *L, int n, mg_tensor **results) {
  lua_pushcfunction(L, new_answers);
  lua_pushinteger(L, n);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    for (int i = 0; i < n; i++) mg_tensor_release(results[i]);
    lua_error(L);
  }
  int answers = lua_gettop(L);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, answers, i + 1);
    ((ltensor *)lua_touserdata(L, -1))->t = results[i];
    lua_pop(L, 1);
    if (results[i] == NULL) {
      lua_pushnil(L);
      lua_rawseti(L, answers, i + 1);
    }
  }
  return answers;
}

/* the list of gradients of the targets for the sources (nil where
** unconnected), as mgL_box_answers; raises on failure */
static int answer (lua_State *L, mg_tape *t, int nt, mg_tensor **targets, int ns,
                   mg_tensor **sources, mg_tensor **seeds, int zero, mg_tensor **grads) {
  if (run_gradient(L, t, nt, targets, ns, sources, seeds, zero, grads) != MG_OK) mgL_error(L);
  return mgL_box_answers(L, ns, grads);
}

/*
** The common call, gradient(y, x) or gradient(y, {x1, x2, ...}) with leaf
** sources and no seeds, without building the general structures; -1 when
** the call is not of that shape.
*/
/* A target the tape never recorded (computed after t:stop(), or from
** nothing it watches) adds nothing to the gradient: nil, as TensorFlow's,
** where PyTorch raises. When no target was recorded (one of several is
** normal), said once per tape after the walk, on stderr with the caller's
** line; mg.tape{warn = false} keeps quiet, and so does unconnected = "zero". */
enum { RECORDED, UNRECORDED, INTEGERS };   /* what none_recorded found */

static int none_recorded (ltape *b, int n, mg_tensor *const *targets, int zero) {
  if (!b->warn || zero || n == 0) return RECORDED;
  bool integers = true;
  for (int i = 0; i < n; i++) {          /* one target recorded: the sum has its gradient */
    if (mg_tape_follows(b->t, targets[i])) return RECORDED;
    mg_dtype dt = mg_tensor_dtype(targets[i]);
    integers = integers && !mg_dtype_is_float(dt);
  }
  return integers ? INTEGERS : UNRECORDED;
}

/* said after the walk (a call that raises says only why); whether to was
** asked before it, as a non-persistent tape forgets its record */
static void warn_unrecorded (lua_State *L, ltape *b, int n, int why) {
  b->warn = false;
  luaL_where(L, 1);
  if (why == INTEGERS)
    fprintf(stderr, "moongrad: warning: %stape:gradient: the target%s integer or bool, and such tensors "
                    "have no gradient (nil); cast to float32 or float64 before the ops to differentiate; "
                    "mg.tape{warn = false} silences this\n", lua_tostring(L, -1), n > 1 ? "s are" : " is");
  else
    fprintf(stderr, "moongrad: warning: %stape:gradient: the target%s not recorded by this tape "
                    "(computed after t:stop(), from nothing the tape watches, or by ops without a "
                    "gradient such as sign, floor or //), so it has no gradient (nil); "
                    "mg.tape{warn = false} silences this\n", lua_tostring(L, -1),
            n > 1 ? "s were" : " was");
  fflush(stderr);
  lua_pop(L, 1);
}

mg_status mgL_gradient_hooked (lua_State *L, int arg, mg_tensor *target, int ns, mg_tensor **sources,
                               const mg_gradient_hooks *hooks, mg_tensor **grads) {
  ltape *b = checktape(L, arg);
  mgL_checkfinalizer(L);
  mgL_gc_before_gradient(L, mgL_getstate(L));
  int warn = none_recorded(b, 1, &target, 0);
  mgL_call prev = mgL_enter(L);
  mg_status st = mg_tape_gradient_hooked(b->t, 1, &target, ns, sources, NULL, 0, hooks, grads);
  mgL_leave(L, prev);
  if (warn && st == MG_OK) warn_unrecorded(L, b, 1, warn);
  return st;
}

static int gradient_plain (lua_State *L, ltape *b, int zero) {
  mg_tape *t = b->t;
  mg_tensor *y = mgL_testtensor(L, 2);
  if (y == NULL) return -1;
  mg_tensor *one = mgL_testtensor(L, 3);
  int ns = one ? 1 : (lua_istable(L, 3) && !lua_getmetatable(L, 3) ? (int)lua_rawlen(L, 3) : -1);
  if (ns < 0 || ns > 64) return -1;
  mg_tensor *sources[64], *grads[64];
  if (one) sources[0] = one;
  for (int i = 0; !one && i < ns; i++) {
    lua_rawgeti(L, 3, i + 1);
    sources[i] = mgL_testtensor(L, -1);
    lua_pop(L, 1);
    if (sources[i] == NULL) return -1;
  }
  if (!one) {                                             /* nothing but the list? */
    if (ns > 0) lua_pushinteger(L, ns);
    else lua_pushnil(L);
    if (lua_next(L, 3)) {
      lua_pop(L, 2);
      return -1;
    }
  }
  int warn = none_recorded(b, 1, &y, zero);
  int answers = answer(L, t, 1, &y, ns, sources, NULL, zero, grads);
  if (warn) warn_unrecorded(L, b, 1, warn);
  if (one) lua_rawgeti(L, answers, 1);
  return 1;
}

/*
** gradient(target, sources [, output_gradients] [, {unconnected=}]):
** the gradient of the sum of the targets with respect to each source.
*/
static int l_gradient (lua_State *L) {
  ltape *b = checktape(L, 1);
  mg_tape *t = b->t;
  mgL_checkfinalizer(L);                 /* before the walk: its results are boxed after it */
  if (lua_isnoneornil(L, 2)) luaL_argerror(L, 2, "moongrad.Tensor expected, got nil");
  if (lua_isnoneornil(L, 3))
    luaL_argerror(L, 3, "sources expected (a tensor, a variable or a table of them), got nil");
  int opts = 5, seeds_arg = 4;           /* gradient(y, x, {unconnected=...}) is allowed too */
  if (lua_istable(L, 4) && lua_isnoneornil(L, 5)) {
    if (lua_getfield(L, 4, "unconnected") != LUA_TNIL) { opts = 4; seeds_arg = 0; }
    lua_pop(L, 1);
  }
  int zero = unconnected_zero(L, opts);
  lua_settop(L, 5);
  mgL_gc_before_gradient(L, mgL_getstate(L));
  if (seeds_arg == 0 || lua_isnil(L, seeds_arg)) {
    int r = gradient_plain(L, b, zero);
    if (r >= 0) return r;
  }
  lua_newtable(L);                                        /* 6: targets */
  lua_newtable(L);                                        /* 7: sources */
  lua_newtable(L);                                        /* 8: seeds */
  int nt = mgL_flatten(L, 2, 6, 0, true, "tape:gradient: target");
  int ns = mgL_flatten(L, 3, 7, 0, true, "tape:gradient: sources");
  int ng = seeds_arg && !lua_isnil(L, seeds_arg)
               ? mgL_flatten(L, seeds_arg, 8, 0, true, "tape:gradient: output_gradients") : 0;
  if (ng != 0 && ng != nt)
    return luaL_error(L, "tape:gradient: %d output_gradients for %d targets", ng, nt);
  mg_tensor **targets = leaves(L, 6, nt), **sources = leaves(L, 7, ns);
  mg_tensor **seeds = ng ? leaves(L, 8, ng) : NULL;
  mg_tensor **grads = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(ns ? ns : 1), 0);
  int warn = none_recorded(b, nt, targets, zero);
  int answers = answer(L, t, nt, targets, ns, sources, seeds, zero, grads);
  if (warn) warn_unrecorded(L, b, nt, warn);
  int k = 0;
  mgL_rebuild(L, 3, answers, &k);
  return 1;
}

/*
** jacobian(target, sources [, {unconnected=}]): sources is a tensor, a
** variable, or nested tables of them (TensorFlow's tape.jacobian(y, [x, z])
** or a dict), and the answer has their structure, as gradient's. One walk
** per element of the target serves every source.
*/
static int l_jacobian (lua_State *L) {
  mg_tape *t = checktape(L, 1)->t;
  mg_tensor *y = mgL_checktensor(L, 2);
  if (lua_isnoneornil(L, 3))
    luaL_argerror(L, 3, "sources expected (a tensor, a variable or a table of them), got nil");
  int zero = unconnected_zero(L, 4);
  lua_settop(L, 4);
  lua_newtable(L);                                        /* 5: sources */
  int ns = mgL_flatten(L, 3, 5, 0, true, "tape:jacobian: sources");
  mg_tensor **sources = leaves(L, 5, ns);
  mg_tensor **outs = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(ns ? ns : 1), 0);
  mgL_call prev = mgL_enter(L);
  mg_status st = mg_tape_jacobians(t, y, ns, sources, zero, outs);
  mgL_leave(L, prev);
  if (st != MG_OK) return mgL_error(L);
  int answers = mgL_box_answers(L, ns, outs);
  int k = 0;
  mgL_rebuild(L, 3, answers, &k);
  return 1;
}

/* batch_jacobian(target, source [, {unconnected=}]): one source, as TensorFlow's */
static int l_batch_jacobian (lua_State *L) {
  mg_tape *t = checktape(L, 1)->t;
  mg_tensor *y = mgL_checktensor(L, 2);
  if (lua_istable(L, 3) && !mgL_isleaf(L, 3))
    return luaL_error(L, "tape:batch_jacobian: source must be one tensor or variable, got a table "
                         "(it takes one source, as TensorFlow's; t:jacobian takes several)");
  mg_tensor *x = mgL_checktensor(L, 3);
  int zero = unconnected_zero(L, 4);
  mg_tensor *out = NULL;
  mgL_call prev = mgL_enter(L);
  mg_status st = mg_tape_batch_jacobian(t, y, x, zero, &out);
  mgL_leave(L, prev);
  if (st != MG_OK) return mgL_error(L);
  lua_rawgeti(L, mgL_box_answers(L, 1, &out), 1);
  return 1;
}

/* calls the function at 2 with the arguments after it, in protected mode */
static int pcall_rest (lua_State *L) {
  mgL_checkcallable(L, 2);
  return lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
}

/* record(fn, ...): records during fn (the body of a `with tape:` block) */
static int l_record (lua_State *L) {
  mg_tape *t = checktape(L, 1)->t;
  mgL_checkcallable(L, 2);
  bool was = mg_tape_is_recording(t);
  if (!was && mg_tape_start(t) != MG_OK) return mgL_error(L);
  mg_tape_retain(t);                    /* fn may release the tape's box */
  int st = pcall_rest(L);
  if (!was) mg_tape_stop(t);
  mg_tape_release(t);
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L) - 1;
}

/* stop_recording(fn, ...): fn runs with this tape paused */
static int l_stop_recording (lua_State *L) {
  mg_tape *t = checktape(L, 1)->t;
  mgL_checkcallable(L, 2);
  mg_tape_pause(mg_tape_retain(t));     /* fn may release the tape's box */
  int st = pcall_rest(L);
  mg_tape_resume(t);
  mg_tape_release(t);
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L) - 1;
}

static int tape_tostring (lua_State *L) {
  mg_tape *t = checktape(L, 1)->t;
  lua_pushfstring(L, "%s (%s, %d ops, %d bytes saved)", MG_TAPE_MT,
                  mg_tape_is_recording(t) ? "recording" : "stopped", (int)mg_tape_nnodes(t),
                  (int)mg_tape_saved_bytes(t));
  return 1;
}

static int l_is_recomputing (lua_State *L) {
  mgL_checknargs(L, 0);
  lua_pushboolean(L, mg_is_recomputing());
  return 1;
}

void mgL_open_tape (lua_State *L) {
  int module = lua_gettop(L);
  lua_pushcfunction(L, l_tape);
  lua_setfield(L, module, "tape");
  lua_pushcfunction(L, l_is_recomputing);
  lua_setfield(L, module, "is_recomputing");
  luaL_newmetatable(L, MG_TAPE_MT);
  static const luaL_Reg meta[] = {
    {"__gc", tape_gc}, {"__close", tape_close}, {"__tostring", tape_tostring}, {NULL, NULL}
  };
  mgL_setfuncs(L, meta);
  static const luaL_Reg methods[] = {
    {"stop", l_stop}, {"watch", l_watch}, {"watched_variables", l_watched_variables},
    {"reset", l_reset}, {"saved_bytes", l_saved_bytes}, {"is_recording", l_is_recording},
    {"gradient", l_gradient}, {"jacobian", l_jacobian}, {"batch_jacobian", l_batch_jacobian},
    {"record", l_record}, {"stop_recording", l_stop_recording}, {NULL, NULL}
  };
  mgL_newlib(L, methods);
  lua_setfield(L, -2, "__index");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &tape_key);
  lua_settop(L, module);
}

/*
** ldistributed.c — the C half of mg.distributed: require "moongrad.mpi".
**
** Built into the moongrad binary and moongrad.so only (not libmoongrad.a:
** see the Makefile's DIST_SRC), so hosts of the core library never link MPI.
** lua/moongrad/distributed.lua is the module users see; it loads this one
** and says so plainly when it is missing (a build without Open MPI).
*/
#define _GNU_SOURCE                  /* on_exit, dladdr, RTLD_NODELETE */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "lua/lbinding.h"
#include "dist/dist.h"

static mg_dist_op check_op (lua_State *L, int arg, const char *fn, mg_dist_op def) {
  static const char *const keys[] = {"op", NULL};
  if (lua_isnoneornil(L, arg)) return def;
  mgL_checkoptions(L, arg, keys);
  lua_getfield(L, arg, "op");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return def;
  }
  static const char *const names[] = {"sum", "mean", "max", "min", NULL};
  const char *s = lua_tostring(L, -1);
  for (int i = 0; s && lua_type(L, -1) == LUA_TSTRING && names[i]; i++)
    if (strcmp(s, names[i]) == 0) {
      lua_pop(L, 1);
      return (mg_dist_op)i;
    }
  return luaL_error(L, "%s: op must be 'sum', 'mean', 'max' or 'min', got %s", fn,
                    lua_type(L, -1) == LUA_TSTRING ? lua_pushfstring(L, "'%s'", s) : luaL_typename(L, -1)), def;
}

static int l_init (lua_State *L) {
  if (mg_dist_init() != MG_OK) return mgL_error(L);
  lua_pushinteger(L, mg_dist_rank());
  lua_pushinteger(L, mg_dist_size());
  return 2;
}

static int l_is_initialized (lua_State *L) {
  lua_pushboolean(L, mg_dist_initialized());
  return 1;
}

static int need_init (lua_State *L, const char *fn) {
  if (!mg_dist_initialized())
    return luaL_error(L, "%s: mg.distributed is not initialized; call mg.distributed.init() first "
                         "(and start the program with mpirun)", fn);
  return 0;
}

static int l_rank (lua_State *L) {
  need_init(L, "rank");
  lua_pushinteger(L, mg_dist_rank());
  return 1;
}

static int l_size (lua_State *L) {
  need_init(L, "size");
  lua_pushinteger(L, mg_dist_size());
  return 1;
}

static int l_local_size (lua_State *L) {
  need_init(L, "local_size");
  lua_pushinteger(L, mg_dist_local_size());
  return 1;
}

static int l_barrier (lua_State *L) {
  if (mg_dist_barrier("barrier") != MG_OK) return mgL_error(L);
  return 0;
}

static int l_finalize (lua_State *L) {
  (void)L;
  mg_dist_finalize();
  return 0;
}

/* allreduce(t [, {op = "sum"}]): a new tensor; on a variable, in place, returning it */
static int l_allreduce (lua_State *L) {
  mg_dist_op op = check_op(L, 2, "allreduce", MG_DIST_SUM);
  mg_variable *v = mgL_testvariable(L, 1);
  if (v != NULL) {
    mgL_checkchange(L, "allreduce");
    if (mg_dist_allreduce_variable("allreduce", v, op) != MG_OK) return mgL_error(L);
    lua_settop(L, 1);
    return 1;
  }
  mgL_pushtensor(L, mg_dist_allreduce("allreduce", mgL_checktensor(L, 1), op));
  return 1;
}

/* root is checked after the ranks agree on it: out of range on one rank is
** a disagreement, out of range on all an error on all */
static lua_Integer check_root (lua_State *L, int arg) {
  return luaL_optinteger(L, arg, 0);
}

/* broadcast(t [, root = 0]): root's values; on a variable, in place, returning it */
static int l_broadcast (lua_State *L) {
  lua_Integer root = check_root(L, 2);
  mg_variable *v = mgL_testvariable(L, 1);
  if (v != NULL) {
    mgL_checkchange(L, "broadcast");
    if (mg_dist_broadcast_variable("broadcast", v, root) != MG_OK) return mgL_error(L);
    lua_settop(L, 1);
    return 1;
  }
  mgL_pushtensor(L, mg_dist_broadcast("broadcast", mgL_checktensor(L, 1), root));
  return 1;
}

static int l_allgather (lua_State *L) {
  mgL_pushtensor(L, mg_dist_allgather("allgather", mgL_checktensor(L, 1)));
  return 1;
}

/* reduce_scatter(t [, {op = "sum"} [, who]]): this rank's shard of the flattened reduction */
static int l_reduce_scatter (lua_State *L) {
  const char *fn = luaL_optstring(L, 3, "reduce_scatter");
  mg_dist_op op = check_op(L, 2, fn, MG_DIST_SUM);
  mgL_pushtensor(L, mg_dist_reduce_scatter(fn, mgL_checktensor(L, 1), op));
  return 1;
}

/* shard_range(n [, size, rank]): this rank's (or rank's of size) shard of n
** elements, 1-based: first, last (last = first - 1 when empty) */
static int l_shard_range (lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0, 1, "a count >= 0 expected");
  int size, rank;
  if (lua_isnoneornil(L, 2)) {
    need_init(L, "shard_range");
    size = mg_dist_size();
    rank = mg_dist_rank();
  } else {
    lua_Integer s = luaL_checkinteger(L, 2), r = luaL_checkinteger(L, 3);
    luaL_argcheck(L, s >= 1 && s <= INT32_MAX, 2, "a number of ranks >= 1 expected");
    luaL_argcheck(L, r >= 0 && r < s, 3, "a rank from 0 to size - 1 expected");
    size = (int)s;
    rank = (int)r;
  }
  int64_t lo, hi;
  mg_dist_shard_range(n, size, rank, &lo, &hi);
  lua_pushinteger(L, lo + 1);
  lua_pushinteger(L, hi);
  return 2;
}

/* allreduce_many(list, op, prescale, postscale, fusion_bytes [, n = #list,
** who]): the list's n tensors (nil: a nil gradient, which every rank must
** leave out too) reduced in buckets; a list of n new tensors with the same
** holes, and its n (DistributedOptimizer) */
static int l_allreduce_many (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  static const char *const names[] = {"sum", "mean", "max", "min", NULL};
  mg_dist_op op = (mg_dist_op)luaL_checkoption(L, 2, "mean", names);
  double pre = luaL_optnumber(L, 3, 1.0), post = luaL_optnumber(L, 4, 1.0);
  lua_Integer fusion = luaL_optinteger(L, 5, 64 << 20);
  lua_Integer n = lua_isnoneornil(L, 6) ? luaL_len(L, 1) : luaL_checkinteger(L, 6);
  const char *fn = luaL_optstring(L, 7, "DistributedOptimizer");
  luaL_argcheck(L, n >= 0 && n <= 1 << 24, 6, "a list length from 0 to 2^24 expected");
  mg_tensor **ts = lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(n ? 2 * n : 1), 0);
  mg_tensor **out = ts + n;
  for (int i = 0; i < n; i++) {
    ts[i] = lua_geti(L, 1, i + 1) == LUA_TNIL ? NULL : mgL_checktensor(L, -1);   /* borrowed: the list keeps it */
    lua_pop(L, 1);
  }
  if (mg_dist_allreduce_many(fn, ts, (int)n, op, pre, post, fusion, out) != MG_OK) return mgL_error(L);
  lua_createtable(L, (int)n, 1);
  for (int i = 0; i < n; i++) {
    if (out[i] == NULL) continue;
    mgL_pushtensor(L, out[i]);
    out[i] = NULL;
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushinteger(L, n);
  lua_setfield(L, -2, "n");
  return 1;
}

/* {---- gradients reduced while the backward runs (overlap.c) ---- */

#define SYNC_MT "moongrad.mpi.sync"

/* one call's sync, in a userdata: an error raised from the walk frees it */
typedef struct lsync { mg_dist_sync *s; } lsync;

static int sync_gc (lua_State *L) {
  lsync *b = (lsync *)luaL_checkudata(L, 1, SYNC_MT);
  mg_dist_sync_free(b->s);
  b->s = NULL;
  return 0;
}

static mg_status on_ready (void *ud, int i, mg_tensor *g, int *take) {
  *take = 1;                                   /* its bucket holds it now: the walk lets it go */
  return mg_dist_sync_ready((mg_dist_sync *)ud, i, g);
}

static void on_tick (void *ud) { mg_dist_sync_progress((mg_dist_sync *)ud); }

/* the results of a sync: allreduce, the list of n gradients (nil where no
** rank made one); reduce_scatter, the list of this rank's shards (one per
** dtype group) and the list of n booleans saying which gradients exist */
static int push_results (lua_State *L, mg_dist_sync_mode mode, int n, int ngroups, mg_tensor **out,
                         const unsigned char *present) {
  int count = mode == MG_DIST_SYNC_ALLREDUCE ? n : ngroups;
  mgL_box_answers(L, count, out);                /* the tensors are the list's now, even if it raises */
  lua_pushinteger(L, count);
  lua_setfield(L, -2, "n");
  if (mode == MG_DIST_SYNC_ALLREDUCE) return 1;
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushboolean(L, present[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 2;
}

/* gradient(tape, target, vars, mode, prescale, postscale, fusion_bytes [, who]):
** tape:gradient(target, vars) with each bucket of gradients reduced across
** the ranks as soon as the backward has made it; mode "allreduce" or
** "reduce_scatter" (see push_results) */
static int l_gradient (lua_State *L) {
  const char *fn = luaL_optstring(L, 8, "DistributedOptimizer");
  mg_tensor *target = mgL_checktensor(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  static const char *const modes[] = {"allreduce", "reduce_scatter", NULL};
  mg_dist_sync_mode mode = (mg_dist_sync_mode)luaL_checkoption(L, 4, NULL, modes);
  double pre = luaL_checknumber(L, 5), post = luaL_checknumber(L, 6);
  lua_Integer fusion = luaL_checkinteger(L, 7);
  lua_Integer n = luaL_len(L, 3);
  luaL_argcheck(L, n >= 0 && n <= 1 << 24, 3, "a list of at most 2^24 variables expected");
  mg_tensor **src = lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(n ? 3 * n : 3), 0);
  mg_tensor **grads = src + (n ? n : 1), **out = grads + (n ? n : 1);
  for (int i = 0; i < n; i++) {
    lua_geti(L, 3, i + 1);
    src[i] = mgL_checktensor(L, -1);            /* borrowed: the list keeps it */
    lua_pop(L, 1);
    grads[i] = out[i] = NULL;
  }
  unsigned char *present = lua_newuserdatauv(L, (size_t)(n ? n : 1), 0);
  need_init(L, fn);
  lsync *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->s = NULL;
  luaL_setmetatable(L, SYNC_MT);
  if ((b->s = mg_dist_sync_begin(fn, src, (int)n, mode, pre, post, fusion)) == NULL) return mgL_error(L);
  mg_gradient_hooks hooks = {on_ready, on_tick, b->s};
  mg_status st = mgL_gradient_hooked(L, 1, target, (int)n, src, &hooks, grads);
  for (int i = 0; i < n; i++) mg_tensor_release(grads[i]);   /* none: the buckets took them */
  int ngroups = mg_dist_sync_groups(b->s);
  if (st == MG_OK) st = mg_dist_sync_end(b->s, out, present);
  mg_dist_sync_free(b->s);
  b->s = NULL;
  if (st != MG_OK) return mgL_error(L);
  return push_results(L, mode, (int)n, ngroups, out, present);
}

/* }---- */

/* broadcast_variables(list, root [, who]): root's values into the list's
** variables, in place, after one agreement on the whole list */
static int l_broadcast_variables (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer root = check_root(L, 2);
  const char *fn = luaL_optstring(L, 3, "broadcast_variables");
  lua_Integer n = luaL_len(L, 1);
  luaL_argcheck(L, n >= 0 && n <= 1 << 24, 1, "a list of at most 2^24 variables expected");
  mg_variable **vs = lua_newuserdatauv(L, sizeof(mg_variable *) * (size_t)(n ? n : 1), 0);
  for (int i = 0; i < n; i++) {
    lua_geti(L, 1, i + 1);
    vs[i] = mgL_checkvariable(L, -1);             /* borrowed: the list keeps it */
    lua_pop(L, 1);
  }
  mgL_checkchange(L, fn);
  if (mg_dist_broadcast_variables(fn, vs, (int)n, root) != MG_OK) return mgL_error(L);
  lua_settop(L, 1);
  return 1;
}

/* set_timeout(seconds): how long a collective waits for every rank (0: for ever) */
static int l_set_timeout (lua_State *L) {
  if (mg_dist_set_timeout(luaL_checknumber(L, 1)) != MG_OK) return mgL_error(L);
  return 0;
}

static int l_timeout (lua_State *L) {
  lua_pushnumber(L, mg_dist_timeout());
  return 1;
}

static int l_stats (lua_State *L) {
  mg_dist_stats s = mg_dist_get_stats();
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, s.calls);
  lua_setfield(L, -2, "calls");
  lua_pushinteger(L, s.bytes);
  lua_setfield(L, -2, "bytes");
  lua_pushnumber(L, s.waited);
  lua_setfield(L, -2, "waited");
  return 1;
}

/* the moongrad binary's way out of a failed script (src/cli/main.c) */
void mgL_dist_abort (int code);
void mgL_dist_abort (int code) { mg_dist_abort(code); }

/* At exit: MPI_Finalize after a success; after a failure (a status other
** than 0: stock lua5.4's uncaught error, os.exit(1)) MPI_Abort, since
** MPI_Finalize would wait for ranks that may be waiting for this one */
static void at_exit (int status, void *ud) {
  (void)ud;
  if (status != 0) mg_dist_abort(status);
  mg_dist_finalize();
}

/* the library holding this code stays loaded until exit (lua_close would
** dlclose moongrad.so before at_exit runs) */
static void pin_library (void) {
  Dl_info info;
  if (dladdr((void *)at_exit, &info) && info.dli_fname) dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

int luaopen_moongrad_mpi (lua_State *L);
int luaopen_moongrad_mpi (lua_State *L) {
  static const luaL_Reg fns[] = {
    {"init", l_init}, {"is_initialized", l_is_initialized}, {"rank", l_rank}, {"size", l_size}, {"local_size", l_local_size},
    {"barrier", l_barrier}, {"finalize", l_finalize}, {"allreduce", l_allreduce}, {"broadcast", l_broadcast},
    {"allgather", l_allgather}, {"allreduce_many", l_allreduce_many}, {"reduce_scatter", l_reduce_scatter},
    {"shard_range", l_shard_range}, {"gradient", l_gradient},
    {"broadcast_variables", l_broadcast_variables}, {"set_timeout", l_set_timeout}, {"timeout", l_timeout},
    {"stats", l_stats}, {NULL, NULL}};
  static int registered;
  if (!registered) {                                             /* os.exit too */
    pin_library();
    registered = on_exit(at_exit, NULL) == 0;
  }
  if (luaL_newmetatable(L, SYNC_MT)) {
    lua_pushcfunction(L, sync_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  luaL_newlib(L, fns);
  return 1;
}

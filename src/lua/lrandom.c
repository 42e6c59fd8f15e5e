/*
** lrandom.c — mg.random: seeding, the generator's state, and drawing
** tensors (from the context's streams).
*/
#include "lbinding.h"

static void setfield_int (lua_State *L, const char *k, int64_t v) {
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, k);
}

static int l_seed (lua_State *L) {
  mg_random_seed((uint64_t)luaL_checkinteger(L, 1));
  return 0;
}

static int l_get_state (lua_State *L) {
  mg_rng_state s = mg_random_get_state();
  lua_createtable(L, 0, 2);
  setfield_int(L, "seed", (int64_t)s.seed);
  setfield_int(L, "offset", (int64_t)s.offset);
  return 1;
}

static int l_set_state (lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  static const char *const keys[] = {"seed", "offset", NULL};
  mgL_checkoptions(L, 1, keys);
  lua_getfield(L, 1, "seed");
  lua_getfield(L, 1, "offset");
  mg_rng_state s = {(uint64_t)mgL_intat(L, -2, 1, "state.seed"), (uint64_t)mgL_intat(L, -1, 1, "state.offset")};
  mg_random_set_state(s);
  return 0;
}

/* The shape at arg, in mg.zeros' forms: a table {2, 3} (*next = arg + 1) or
** the integers from arg on, 2, 3 (*next: the argument after them). The same
** checks, so the same error texts, as mg.zeros. */
static int shape_from (lua_State *L, int arg, int64_t *shape, int *next) {
  int nd = mgL_checkshape(L, arg, shape, true);
  *next = lua_istable(L, arg) ? arg + 1 : arg + nd;
  return nd;
}

/* f(shape, p1, p2 [, dtype]), f(shape [, dtype]) or f(d1, d2, ... [, dtype]):
** numbers after a table shape are p1, p2 (mean, std or low, high); numbers
** first are all dimensions (as in mg.zeros), with the default p1, p2 */
static int draw (lua_State *L, double d1, double d2,
                 mg_tensor *(*fn)(const int64_t *, int, mg_dtype, double, double)) {
  int64_t shape[MG_MAX_DIMS];
  int next, nd = shape_from(L, 1, shape, &next);
  double p1 = d1, p2 = d2;
  if (lua_istable(L, 1) && lua_type(L, 2) != LUA_TSTRING) {   /* not normal({2, 3}, "float64") */
    p1 = luaL_optnumber(L, 2, d1);
    p2 = luaL_optnumber(L, 3, d2);
    next = 4;
  }
  mg_dtype dt = mgL_optdtype(L, next, MG_FLOAT32);
  mgL_checknargs(L, next);
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, fn(shape, nd, dt, p1, p2));
}

static int l_uniform (lua_State *L) { return draw(L, 0.0, 1.0, mg_random_uniform); }
static int l_normal (lua_State *L) { return draw(L, 0.0, 1.0, mg_random_normal); }

/* randint(low, high, shape...): int64 draws from low..high-1, each as
** likely (PyTorch's torch.randint: high is not drawn); the shape in
** mg.zeros' forms. One float64 uniform per draw, so the width high - low is
** at most 2^53 (exact in a double) */
static int l_randint (lua_State *L) {
  lua_Integer lo = mgL_intat(L, 1, 1, "low"), hi = mgL_intat(L, 2, 2, "high");
  if (hi <= lo) luaL_argerror(L, 2, lua_pushfstring(L, "high (%I) must be above low (%I); high is not drawn", hi, lo));
  uint64_t width = (uint64_t)hi - (uint64_t)lo;
  if (width > ((uint64_t)1 << 53))
    luaL_argerror(L, 2, lua_pushfstring(L, "high - low must be at most 2^53, got %I .. %I", lo, hi));
  int64_t shape[MG_MAX_DIMS];
  int next, nd = shape_from(L, 3, shape, &next);
  mgL_checknargs(L, next - 1);
  ltensor *box = mgL_newbox(L);
  mg_tensor *u = mg_random_uniform(shape, nd, MG_FLOAT64, 0.0, 1.0);
  mg_tensor *r = u ? mg_full_int64(shape, nd, lo) : NULL;
  const double *ud = u ? (const double *)mg_tensor_data(u) : NULL;
  int64_t *rd = r ? (int64_t *)mg_tensor_data(r) : NULL;
  if (ud && rd) {                            /* NULL data: a dry run, no values */
    for (int64_t i = 0, n = mg_tensor_numel(r); i < n; i++) {
      uint64_t k = (uint64_t)(ud[i] * (double)width);
      rd[i] = (int64_t)((uint64_t)lo + (k < width ? k : width - 1));
    }
  }
  mg_tensor_release(u);
  return mgL_fill(L, box, r);
}

/* permutation(n): 1..n shuffled (int64), from the same stream */
static int l_permutation (lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0 && n < ((lua_Integer)1 << 40), 1, "size out of range");
  int64_t shape[1] = {n};
  ltensor *box = mgL_newbox(L);
  mg_tensor *u = mg_random_uniform(shape, 1, MG_FLOAT64, 0.0, 1.0);
  mg_tensor *p = u ? mg_arange(1, (double)n + 1, 1, MG_INT64) : NULL;
  if (p) {                                   /* Fisher-Yates */
    const double *r = (const double *)mg_tensor_data(u);
    int64_t *v = (int64_t *)mg_tensor_data(p);
    for (int64_t i = n - 1; i > 0; i--) {
      int64_t j = (int64_t)(r[i] * (double)(i + 1)), tmp = v[i];
      if (j > i) j = i;
      v[i] = v[j];
      v[j] = tmp;
    }
  }
  mg_tensor_release(u);
  return mgL_fill(L, box, p);
}

/* with_init_stream(fn, ...): fn's draws come from the initializers' stream */
static int l_with_init_stream (lua_State *L) {
  mgL_checkcallable(L, 1);
  mg_random_swap_streams();
  int dry = mg_dry_run_pause();     /* initial weights are real even in a dry run (mg.memory.estimate) */
  int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  mg_dry_run_resume(dry);
  mg_random_swap_streams();
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}

static const luaL_Reg random_funcs[] = {
  {"seed", l_seed}, {"with_init_stream", l_with_init_stream}, {"get_state", l_get_state}, {"set_state", l_set_state},
  {"uniform", l_uniform}, {"normal", l_normal}, {"randint", l_randint}, {"permutation", l_permutation},
  {NULL, NULL}
};

void mgL_open_random (lua_State *L) {
  mgL_newlib(L, random_funcs);
  lua_setfield(L, -2, "random");
}

/*
** embed_host.c — a C program that embeds Lua and moongrad, and uses
** autodiff from both sides: C builds tensors and takes a gradient, hands
** the result to a Lua script, and reads back what the script computed.
**
**   make build/embed_host && build/embed_host      (make check does both)
**
** It checks its own answers and exits non-zero when one is wrong, so it
** doubles as the test of the embedding API.
*/
#include <math.h>
#include <stdio.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "moongrad.h"

static int failures = 0;

static void expect (const char *what, double got, double want) {
  if (fabs(got - want) > 1e-9 * (1 + fabs(want))) {
    fprintf(stderr, "embed_host: %s: got %.12g, want %.12g\n", what, got, want);
    failures++;
  }
}

int main (void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "moongrad", luaopen_moongrad, 0);    /* package.loaded.moongrad */
  lua_pop(L, 1);

  /* C side: y = sum(x * x) for x = (1, 2, 3); dy/dx = 2x */
  double vals[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  mg_tensor *x = mg_from_doubles(vals, shape, 1, MG_FLOAT64);
  mg_tape *t = mg_tape_new(0, 1);
  mg_tape_watch(t, x);
  mg_tensor *sq = mg_mul(x, x);
  mg_tensor *y = mg_sum(sq, MG_ALL_AXES, 0);
  mg_tape_stop(t);
  mg_tensor *dx = NULL;
  if (mg_tape_gradient(t, 1, &y, 1, &x, NULL, 0, &dx) != MG_OK) {
    fprintf(stderr, "embed_host: %s\n", mg_errmsg());
    return 1;
  }
  const int64_t i1[1] = {1};
  expect("dy/dx[2] from C", mg_tensor_get(dx, i1), 4.0);

  /* a failing op is an error value, not a crash */
  int64_t s23[2] = {2, 3}, s45[2] = {4, 5};
  mg_tensor *a = mg_full(s23, 2, MG_FLOAT32, 1), *b = mg_full(s45, 2, MG_FLOAT32, 1);
  if (mg_matmul(a, b) != NULL) failures++;
  printf("C sees: %s\n", mg_errmsg());

  /* Lua side: the gradient goes in as a global; Lua differentiates again */
  mgL_pushtensor(L, dx);                                /* Lua takes over dx */
  lua_setglobal(L, "dx");
  const char *script =
      "local mg = require 'moongrad'\n"
      "local w = mg.Variable(mg.constant({0.5, 0.5, 0.5}, 'float64'))\n"
      "local t = mg.tape()\n"
      "local loss = mg.sum(dx * w * w)\n"
      "t:stop()\n"
      "local g = t:gradient(loss, w)\n"      /* 2 * dx * w = dx */
      "print('Lua sees: ' .. tostring(g):gsub('\\n', ' '))\n"
      "return g\n";
  if (luaL_dostring(L, script) != LUA_OK) {
    fprintf(stderr, "embed_host: %s\n", lua_tostring(L, -1));
    return 1;
  }
  mg_tensor *g = mgL_checktensor(L, -1);               /* borrowed from the Lua value */
  const int64_t i2[1] = {2};
  expect("d loss/dw[3] from Lua", mg_tensor_get(g, i2), 6.0);

  mg_memory_stats st = mg_memory_stats_get();
  printf("tensor memory in use: %zu bytes in %lld tensors\n", st.current_bytes,
         (long long)st.live_tensors);

  mg_tensor_release(a);
  mg_tensor_release(b);
  mg_tensor_release(sq);
  mg_tensor_release(y);
  mg_tensor_release(x);
  mg_tape_release(t);
  lua_close(L);
  st = mg_memory_stats_get();
  expect("tensors left after lua_close", (double)st.live_tensors, 0);
  expect("bytes left after lua_close", (double)st.current_bytes, 0);
  if (failures == 0) printf("embed_host: all checks passed\n");
  return failures == 0 ? 0 : 1;
}

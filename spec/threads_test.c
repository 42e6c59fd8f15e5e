/*
** threads_test.c — two Lua states on two threads train independently and
** get exactly what one state gets alone. Each thread has its own context
** (errors, counters, random streams, tapes), so nothing is shared but the
** read-only code. `make tsan` runs it under ThreadSanitizer.
**
**   make build/threads_test && build/threads_test     (make test runs it)
*/
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "moongrad.h"

/* a short training run with recompute, dropout, a tape per step and an
** optimizer; returns the last loss and a checksum of the weights */
static const char *const script =
  "local mg = require 'moongrad'\n"
  "mg.random.seed(...)\n"
  "local model = mg.nn.Sequential{mg.nn.Dense(32, {activation = 'tanh'}), mg.nn.Dropout(0.1),\n"
  "                               mg.nn.Dense(4)}\n"
  "local block = mg.recompute_grad(model)\n"
  "local opt = mg.optim.Adam{learning_rate = 0.01}\n"
  "local x = mg.random.normal({64, 16})\n"
  "local labels = mg.cast(mg.random.uniform({64}, 1, 4.999), 'int64')\n"
  "local loss\n"
  "for step = 1, 30 do\n"
  "  local t = mg.tape()\n"
  "  loss = mg.nn.softmax_cross_entropy(block(x), labels)\n"
  "  t:stop()\n"
  "  opt:apply_gradients(t:gradient(loss, model.trainable_variables), model.trainable_variables)\n"
  "end\n"
  "local sum = 0\n"
  "for _, v in ipairs(model.variables) do sum = sum + mg.sum(mg.abs(v)):item() end\n"
  "return loss:item(), sum, mg.memory.stats().live_tensors\n";

typedef struct run { int seed; double loss, checksum; long long live; int ok; char err[256]; } run;

static void *train (void *p) {
  run *r = (run *)p;
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "moongrad", luaopen_moongrad, 0);
  lua_pop(L, 1);
  r->ok = 0;
  if (luaL_loadstring(L, script) != LUA_OK) {
    snprintf(r->err, sizeof r->err, "%s", lua_tostring(L, -1));
  } else {
    lua_pushinteger(L, r->seed);
    if (lua_pcall(L, 1, 3, 0) != LUA_OK) {
      snprintf(r->err, sizeof r->err, "%s", lua_tostring(L, -1));
    } else {
      r->loss = lua_tonumber(L, -3);
      r->checksum = lua_tonumber(L, -2);
      r->live = (long long)lua_tointeger(L, -1);
      r->ok = 1;
    }
  }
  lua_close(L);
  return NULL;
}

static int same (const run *a, const run *b) {
  return a->ok && b->ok && a->loss == b->loss && a->checksum == b->checksum;
}

int main (void) {
  run alone[2] = {{.seed = 1}, {.seed = 2}}, both[2] = {{.seed = 1}, {.seed = 2}};
  train(&alone[0]);
  train(&alone[1]);
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, train, &both[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  int failures = 0;
  for (int i = 0; i < 2; i++) {
    if (!alone[i].ok || !both[i].ok) {
      fprintf(stderr, "threads_test: seed %d failed: %s%s\n", alone[i].seed, alone[i].err, both[i].err);
      failures++;
    } else if (!same(&alone[i], &both[i])) {
      fprintf(stderr, "threads_test: seed %d differs on a thread: loss %.17g vs %.17g, weights %.17g vs %.17g\n",
              alone[i].seed, alone[i].loss, both[i].loss, alone[i].checksum, both[i].checksum);
      failures++;
    }
  }
  if (alone[0].ok && alone[1].ok && alone[0].loss == alone[1].loss) {
    fprintf(stderr, "threads_test: two seeds gave the same run\n");
    failures++;
  }
  if (failures) return 1;
  printf("threads_test: two states on two threads train as alone (losses %.6f and %.6f)\n",
         both[0].loss, both[1].loss);
  return 0;
}

/*
** random.c — a counter-based generator: Philox4x32-10 (Salmon et al. 2011).
**
** The whole state is (seed, offset). Block b of a draw is philox(seed,
** offset + b), so any block can be computed on its own (threads split the
** work freely) and restoring the pair replays a stream exactly, which is
** what recompute_grad needs for dropout masks to match.
*/
#include <math.h>

#include "ops/op.h"
#include "vecmath.h"

#define INIT_STREAM_KEY 0x6A09E667F3BCC908ULL

/* The streams are the context's: rng.main, and a second one for initial
** values (rng.init), so building a layer never shifts the main stream that
** recompute_grad replays; both are seeded together. */

typedef struct { uint32_t v[4]; } philox_block;

static inline void mulhilo (uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

static philox_block philox (uint64_t seed, uint64_t counter) {
  uint32_t c[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c[0], &hi0, &lo0);
    mulhilo(0xCD9E8D57u, c[2], &hi1, &lo1);
    uint32_t n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  philox_block b = {{c[0], c[1], c[2], c[3]}};
  return b;
}

void mg_random_seed (uint64_t seed) {
  mg_context *c = mg_ctx();
  c->rng.main = (mg_rng_state){seed, 0};
  c->rng.init = (mg_rng_state){seed ^ INIT_STREAM_KEY, 0};
}

void mg_random_swap_streams (void) {
  mg_context *c = mg_ctx();
  mg_rng_state t = c->rng.main;
  c->rng.main = c->rng.init;
  c->rng.init = t;
}

mg_rng_state mg_random_get_state (void) { return mg_ctx()->rng.main; }
void mg_random_set_state (mg_rng_state s) { mg_ctx()->rng.main = s; }

/* [0, 1) from 24 or 53 random bits */
static inline double u24 (uint32_t x) { return (double)(x >> 8) * (1.0 / 16777216.0); }
static inline double u53 (uint32_t hi, uint32_t lo) {
  return (double)((((uint64_t)hi << 32) | lo) >> 11) * (1.0 / 9007199254740992.0);
}

/*
** Fills t with n values from consecutive blocks: float32 takes 4 values per
** block, float64 2. Normal values come in Box-Muller pairs.
*/
static mg_tensor *draw (const char *fn, const int64_t *shape, int ndim, mg_dtype dt, double p1,
                        double p2, bool normal) {
  if (!mg_is_float(dt))
    return mg_seterror("%s: needs a float dtype, got %s", fn, mg_dtype_name(dt)), NULL;
  if (!(p1 == p1) || !(p2 == p2) || isinf(p1) || isinf(p2))
    return mg_seterror("%s: parameters must be finite numbers", fn), NULL;
  if (normal && p2 < 0) return mg_seterror("%s: stddev must not be negative", fn), NULL;
  mg_tensor *t = mg_empty(shape, ndim, dt);
  if (t == NULL) return NULL;
  int per = dt == MG_FLOAT32 ? 4 : 2;
  int64_t n = t->numel, blocks = (n + per - 1) / per;
  mg_rng_state *rng = &mg_ctx()->rng.main;
  uint64_t seed = rng->seed, base = rng->offset;
  MG_PARALLEL_FOR(n > 65536, ,
  for (int64_t b = 0; b < blocks; b++) {
    philox_block r = philox(seed, base + (uint64_t)b);
    double u[4];
    if (per == 4) for (int j = 0; j < 4; j++) u[j] = u24(r.v[j]);
    else { u[0] = u53(r.v[0], r.v[1]); u[1] = u53(r.v[2], r.v[3]); }
    if (normal) {
      for (int j = 0; j < per; j += 2) {          /* Box-Muller on (0,1] x [0,1) */
        double rad = sqrt(-2.0 * log(1.0 - u[j])), th = 6.283185307179586 * u[j + 1];
        u[j] = p1 + p2 * rad * cos(th);
        u[j + 1] = p1 + p2 * rad * sin(th);
      }
    } else {
      for (int j = 0; j < per; j++) u[j] = p1 + (p2 - p1) * u[j];
    }
    for (int j = 0; j < per && b * per + j < n; j++) {
      int64_t i = b * per + j;
      if (dt == MG_FLOAT32) {
        float f = (float)u[j];
        if (!normal && f >= (float)p2 && p2 > p1) f = nextafterf((float)p2, (float)p1);  /* keep [lo, hi) */
        ((float *)mg_ptr(t))[i] = f;
      } else {
        ((double *)mg_ptr(t))[i] = u[j];
      }
    }
  });
  rng->offset = base + (uint64_t)blocks;
  return t;
}

mg_tensor *mg_random_uniform (const int64_t *shape, int ndim, mg_dtype dt, double lo, double hi) {
  if (hi < lo) return mg_seterror("uniform: the upper bound %g is below the lower bound %g", hi, lo), NULL;
  return draw("uniform", shape, ndim, dt, lo, hi, false);
}

mg_tensor *mg_random_normal (const int64_t *shape, int ndim, mg_dtype dt, double mean, double stddev) {
  return draw("normal", shape, ndim, dt, mean, stddev, true);
}

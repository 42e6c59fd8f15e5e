/*
** loop_host.c — a checkpointed loop from C alone (mg_checkpoint_loop).
**
** A recurrent cell, h_i = tanh(h_(i-1) @ W + x_i) + 0.5 h_(i-1), runs 200
** steps, once on a plain tape and once through mg_checkpoint_loop with 5
** snapshots. The gradients must be equal bit for bit, the loop's tape must
** hold 5 states and the one before the last step, and the backward must
** re-run exactly Revolve's minimum of steps (mg_revolve_recomputed). Bad
** arguments and a step that changes the state's shape are errors.
**
**   make build/loop_host && build/loop_host     (make test runs it)
*/
#include <stdio.h>
#include <string.h>

#include "moongrad.h"

enum { STEPS = 200, SNAPSHOTS = 5, B = 16, D = 32 };

typedef struct cell {
  mg_variable *w;
  mg_tensor *xs;               /* (STEPS, B, D): the inputs, x_i = xs[i - 1] */
  int runs[3];                 /* step calls by phase */
  int bad_at;                  /* a step that returns the wrong shape, or 0 */
} cell;

/* the step callback: state i from state i - 1, one tensor (B,D) */
static mg_status cell_step (void *ud, int64_t i, mg_loop_phase phase, int n,
                            mg_tensor *const *in, mg_list *out) {
  cell *c = (cell *)ud;
  (void)n;
  c->runs[phase]++;
  if (i == c->bad_at) return mg_list_push(out, mg_sum(in[0], 0, 0));
  int64_t starts[3] = {i - 1, 0, 0}, stops[3] = {i, B, D}, steps[3] = {1, 1, 1};
  mg_tensor *xi = mg_slice(c->xs, starts, stops, steps);
  int64_t shape[2] = {B, D};
  mg_tensor *x2 = xi ? mg_reshape(xi, shape, 2) : NULL;
  mg_tensor *a = mg_matmul(in[0], mg_variable_read(c->w));
  mg_tensor *z = mg_add(a, x2), *t = mg_tanh(z);
  mg_tensor *half = mg_full(NULL, 0, MG_FLOAT64, 0.5), *r = mg_mul(in[0], half);
  mg_tensor *h = mg_add(t, r);
  mg_tensor *tmp[] = {xi, x2, a, z, t, half, r};
  for (size_t k = 0; k < sizeof tmp / sizeof tmp[0]; k++) mg_tensor_release(tmp[k]);
  return mg_list_push(out, h);             /* a NULL h (a failed op) comes back as MG_ERR */
}

static const mg_loop_fn cell_fn = {"rnn", cell_step, NULL};

/* sum(h_n) and its gradients for h_0 and W, plainly or through the loop */
static int run (cell *c, mg_tensor *h0, int looped, mg_tensor **g, size_t *held) {
  mg_tape *t = mg_tape_new(0, 1);
  mg_tape_watch(t, h0);
  mg_tensor *h = NULL;
  if (looped) {
    mg_list out = {0};
    if (mg_checkpoint_loop(&cell_fn, c, 1, &h0, STEPS, SNAPSHOTS, &out) == MG_OK) h = out.t[0];
    out.n = 0;
    mg_list_clear(&out);
  } else {
    h = mg_tensor_retain(h0);
    for (int64_t i = 1; i <= STEPS && h; i++) {
      mg_list out = {0};
      mg_status st = cell_step(c, i, MG_LOOP_FORWARD, 1, &h, &out);
      mg_tensor_release(h);
      h = st == MG_OK ? out.t[0] : NULL;
      out.n = 0;
      mg_list_clear(&out);
    }
  }
  mg_tensor *y = h ? mg_sum(h, MG_ALL_AXES, 0) : NULL;
  mg_tensor_release(h);
  mg_tape_stop(t);
  *held = mg_tape_saved_bytes(t);
  mg_tensor *src[2] = {h0, mg_variable_peek(c->w)};
  mg_status st = y ? mg_tape_gradient(t, 1, &y, 2, src, NULL, 0, g) : MG_ERR;
  mg_tensor_release(y);
  mg_tape_release(t);
  return st == MG_OK;
}

static int equal (mg_tensor *a, mg_tensor *b) {
  return mg_tensor_numel(a) == mg_tensor_numel(b) &&
         memcmp(mg_tensor_data(a), mg_tensor_data(b), sizeof(double) * (size_t)mg_tensor_numel(a)) == 0;
}

/* the error of a call must mention want */
static int says (int failed, const char *want) {
  if (failed && strstr(mg_errmsg(), want)) return 1;
  fprintf(stderr, "loop_host: expected an error with \"%s\", got \"%s\"\n", want,
          failed ? mg_errmsg() : "(no error)");
  return 0;
}

int main (void) {
  mg_random_seed(3);
  int64_t sw[2] = {D, D}, sx[3] = {STEPS, B, D}, sh[2] = {B, D};
  mg_tensor *w0 = mg_random_normal(sw, 2, MG_FLOAT64, 0, 0.2);
  cell c = {mg_variable_new(w0, "W", 1), mg_random_normal(sx, 3, MG_FLOAT64, 0, 1), {0, 0, 0}, 0};
  mg_tensor_release(w0);
  mg_tensor *h0 = mg_random_normal(sh, 2, MG_FLOAT64, 0, 1);
  mg_tensor *gp[2], *gl[2];
  size_t held_plain, held_loop;
  if (!run(&c, h0, 0, gp, &held_plain)) return fprintf(stderr, "loop_host: %s\n", mg_errmsg()), 1;
  memset(c.runs, 0, sizeof c.runs);
  if (!run(&c, h0, 1, gl, &held_loop)) return fprintf(stderr, "loop_host: %s\n", mg_errmsg()), 1;
  int64_t want = mg_revolve_recomputed(STEPS, SNAPSHOTS);
  size_t state = sizeof(double) * B * D;
  printf("tape held: plain %zu bytes, checkpoint_loop %zu bytes (%zu states)\n", held_plain,
         held_loop, held_loop / state);
  printf("steps: %d forward, %d re-run (Revolve's minimum for %d steps, %d snapshots: %lld), "
         "%d taped\n", c.runs[MG_LOOP_FORWARD], c.runs[MG_LOOP_RERUN], STEPS, SNAPSHOTS,
         (long long)want, c.runs[MG_LOOP_TAPED]);
  int ok = equal(gp[0], gl[0]) && equal(gp[1], gl[1]);
  printf("gradients equal bit for bit: %s\n", ok ? "yes" : "no");
  ok = ok && held_loop == (SNAPSHOTS + 1) * state && c.runs[MG_LOOP_FORWARD] == STEPS &&
       c.runs[MG_LOOP_RERUN] == want && c.runs[MG_LOOP_TAPED] == STEPS;
  /* bad input */
  mg_list out = {0};
  ok &= says(mg_checkpoint_loop(NULL, NULL, 1, &h0, 3, 2, &out) == MG_ERR,
             "mg_checkpoint_loop: argument 'fn' is NULL");
  ok &= says(mg_checkpoint_loop(&cell_fn, &c, 1, &h0, -1, 2, &out) == MG_ERR, "steps is negative (-1)");
  ok &= says(mg_checkpoint_loop(&cell_fn, &c, 1, &h0, 3, 0, &out) == MG_ERR,
             "snapshots must be at least 1, got 0");
  ok &= says(mg_revolve_recomputed(10, 0) == -1, "snapshots must be at least 1");
  c.bad_at = 2;
  ok &= says(mg_checkpoint_loop(&cell_fn, &c, 1, &h0, 3, 2, &out) == MG_ERR,
             "rnn: step 2 gave tensor 0 of the state as (32) float64; it was (16,32) float64");
  ok &= out.n == 0;
  for (int k = 0; k < 2; k++) { mg_tensor_release(gp[k]); mg_tensor_release(gl[k]); }
  mg_tensor_release(h0);
  mg_tensor_release(c.xs);
  mg_variable_release(c.w);
  if (!ok) {
    fprintf(stderr, "loop_host: FAILED\n");
    return 1;
  }
  printf("loop_host: all checks passed\n");
  return 0;
}

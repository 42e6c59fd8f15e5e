/*
** recompute_host.c — gradient checkpointing from C alone, with C callbacks.
**
** A block of two dense layers, h = tanh(x @ W1) @ W2, runs four times in a
** chain. Once on a plain tape, and once through mg_recompute_call, which
** keeps only each block's input on the tape and runs the block again during
** the backward pass. The gradients must be the same, and the tape must hold
** less: the counters say how much.
**
**   make build/recompute_host && build/recompute_host     (make test runs it)
*/
#include <math.h>
#include <stdio.h>

#include "moongrad.h"

typedef struct block { mg_variable *w1, *w2; int runs; } block;

/* the forward callback: one output, new references only */
static mg_status block_forward (void *ud, int nin, mg_tensor *const *in, mg_list *out) {
  block *b = (block *)ud;
  (void)nin;
  b->runs++;
  mg_tensor *a = mg_matmul(in[0], mg_variable_read(b->w1));
  mg_tensor *h = mg_tanh(a);
  mg_tensor *y = mg_matmul(h, mg_variable_read(b->w2));
  mg_tensor_release(a);
  mg_tensor_release(h);
  return mg_list_push(out, y);          /* a NULL y (a failed op) comes back as MG_ERR */
}

/* the block is the host's; the call keeps no data of its own to free */
static const mg_function block_fn = {"dense_block", block_forward, NULL, NULL, 0};

static mg_tensor *run_plain (block *b, mg_tensor *x) {
  mg_list out = {0};
  if (block_forward(b, 1, &x, &out) != MG_OK) return NULL;
  mg_tensor *y = out.t[0];
  out.n = 0;
  mg_list_clear(&out);
  return y;
}

static mg_tensor *run_recomputed (block *b, mg_tensor *x) {
  mg_list out = {0};
  if (mg_recompute_call(&block_fn, b, 1, &x, &out) != MG_OK) return NULL;
  mg_tensor *y = out.t[0];
  out.n = 0;
  mg_list_clear(&out);
  return y;
}

/* four blocks in a chain; returns the gradients of sum(y) for the weights
** of block 1 and the bytes the tape held */
static int chain (block *blocks, mg_tensor *x, int recompute, mg_tensor **g, size_t *held) {
  mg_tape *t = mg_tape_new(0, 1);
  mg_tensor *h = mg_tensor_retain(x);
  for (int i = 0; i < 4 && h; i++) {
    mg_tensor *next = recompute ? run_recomputed(&blocks[i], h) : run_plain(&blocks[i], h);
    mg_tensor_release(h);
    h = next;
  }
  mg_tensor *y = mg_sum(h, MG_ALL_AXES, 0);
  mg_tensor_release(h);
  mg_tape_stop(t);
  *held = mg_tape_saved_bytes(t);
  mg_tensor *src[2] = {mg_variable_peek(blocks[0].w1), mg_variable_peek(blocks[0].w2)};
  mg_status st = y ? mg_tape_gradient(t, 1, &y, 2, src, NULL, 0, g) : MG_ERR;
  mg_tensor_release(y);
  mg_tape_release(t);
  return st == MG_OK;
}

static double max_diff (mg_tensor *a, mg_tensor *b) {
  mg_tensor *d = mg_sub(a, b), *ad = mg_abs(d), *m = mg_max(ad, MG_ALL_AXES, 0);
  int64_t none[1] = {0};
  double v = m ? mg_tensor_get(m, none) : INFINITY;   /* any failure above: NULL here */
  mg_tensor_release(d);
  mg_tensor_release(ad);
  mg_tensor_release(m);
  return v;
}

int main (void) {
  const int64_t B = 64, W = 256, H = 1024;
  mg_random_seed(7);
  block blocks[4];
  int64_t s1[2] = {W, H}, s2[2] = {H, W}, sx[2] = {B, W};
  for (int i = 0; i < 4; i++) {
    mg_tensor *w1 = mg_random_normal(s1, 2, MG_FLOAT64, 0, 0.05);
    mg_tensor *w2 = mg_random_normal(s2, 2, MG_FLOAT64, 0, 0.05);
    blocks[i] = (block){mg_variable_new(w1, "w1", 1), mg_variable_new(w2, "w2", 1), 0};
    mg_tensor_release(w1);
    mg_tensor_release(w2);
  }
  mg_tensor *x = mg_random_normal(sx, 2, MG_FLOAT64, 0, 1);
  mg_tensor *gp[2], *gr[2];
  size_t held_plain, held_rec;
  if (!chain(blocks, x, 0, gp, &held_plain) || !chain(blocks, x, 1, gr, &held_rec)) {
    fprintf(stderr, "recompute_host: %s\n", mg_errmsg());
    return 1;
  }
  double d1 = max_diff(gp[0], gr[0]), d2 = max_diff(gp[1], gr[1]);
  printf("tape held: plain %zu bytes, recomputed %zu bytes (%.1fx less)\n", held_plain, held_rec,
         (double)held_plain / (double)held_rec);
  printf("block 1 ran %d times (plain forward, recomputed forward, re-run for the gradient)\n",
         blocks[0].runs);
  printf("largest gradient difference: %.3g (W1), %.3g (W2)\n", d1, d2);
  int ok = d1 < 1e-12 && d2 < 1e-12 && held_rec * 4 < held_plain && blocks[0].runs == 3;
  for (int k = 0; k < 2; k++) { mg_tensor_release(gp[k]); mg_tensor_release(gr[k]); }
  for (int i = 0; i < 4; i++) { mg_variable_release(blocks[i].w1); mg_variable_release(blocks[i].w2); }
  mg_tensor_release(x);
  if (!ok) {
    fprintf(stderr, "recompute_host: FAILED (gradients differ or nothing was saved)\n");
    return 1;
  }
  printf("recompute_host: gradients equal, tape %zu bytes smaller\n", held_plain - held_rec);
  return 0;
}

/*
** dispatch.c — the one way every op runs.
**
** An op's entry checks its arguments and works out what its output will
** be (an mg_opcall); mg_dispatch then runs the context's hooks around the
** row's forward kernel. The hooks are how autodiff (the tapes, save
** policies) and checks see every op without the ops knowing of them:
** PyTorch's dispatcher, kept small.
*/
#include <string.h>

#include "ops/op.h"

static void release_residuals (mg_opcall *c) {
  for (int i = 0; i < c->nres; i++) {
    mg_tensor_release(c->res[i]);
    c->res[i] = NULL;
  }
  c->nres = 0;
}

static void release_outputs (mg_opcall *c) {
  for (int i = 0; i < c->nout; i++) {
    mg_tensor_release(c->out[i]);
    c->out[i] = NULL;
  }
  release_residuals(c);
}

/* outputs of ops on numbers alone are numbers (PyTorch's wrapped numbers) */
static void mark_numbers (mg_opcall *c) {
  if (c->nin == 0) return;
  for (int j = 0; j < c->nin; j++)
    if (!c->in[j]->number) return;
  for (int i = 0; i < c->nout; i++) c->out[i]->number = true;
}

/* in a dry run (memory.c), a float result of float inputs, or of an input
** without values, is allocated and not computed; views, ops of two results,
** ops of no input (zeros, random draws: a weight's initializer) and ops that
** read integers or bools run as usual (a cast of indices to bfloat16 and
** back, a gather at them: their values must survive) */
static bool dry_output (const mg_context *ctx, const mg_opcall *c) {
  if (!ctx->dry.on || c->nout != 1 || c->nin == 0 || !mg_is_floating(c->dtype) || c->def->makes_views ||
      c->def->saves_with_residuals)   /* its forward makes them, residuals too, and computes nothing */
    return false;
  bool floats = true;
  for (int j = 0; j < c->nin; j++) {
    if (c->in[j]->storage->unwritten) return true;
    if (!mg_is_floating(c->in[j]->dtype)) floats = false;
  }
  return floats;
}

/* an op a dry run runs for real (a comparison, a cast to integers, an op of
** two results) on an input without values reads it: zeroed first, so what
** it gives is defined (and meaningless, as all a dry run's values); true
** when it did, and then its float results have no values either */
static bool dry_zero_inputs (const mg_context *ctx, const mg_opcall *c) {
  if (!ctx->dry.on || c->def->makes_views) return false;
  bool any = false;
  for (int j = 0; j < c->nin; j++) {
    mg_storage *s = c->in[j]->storage;
    if (s->unwritten) {
      memset(s->data, 0, s->nbytes);
      any = true;
    }
  }
  return any;
}

static void dry_mark (mg_opcall *c, mg_tensor *t) {
  bool own = true;                            /* not an input given back */
  for (int j = 0; j < c->nin; j++) own = own && c->in[j]->storage != t->storage;
  if (own && mg_is_floating(t->dtype)) t->storage->unwritten = true;
}

static void dry_mark_outputs (mg_opcall *c) {
  for (int i = 0; i < c->nout; i++) dry_mark(c, c->out[i]);
  for (int i = 0; i < c->nres; i++) dry_mark(c, c->res[i]);
}

mg_tensor *mg_dispatch (mg_opcall *c) {
  mg_assert(c->def->forward != NULL);   /* a composite row (einsum) is never dispatched */
  mg_context *ctx = mg_ctx();
  const mg_hooks *h = &ctx->hooks;
  if (ctx->pace.hold == 0 && (++ctx->pace.ops & 15) == 0) mg_pace_tick(ctx);   /* between steps */
  for (int j = 0; j < c->nin; j++)                 /* a result kept past a dry run has no values */
    if (mg_tensor_need_values(c->in[j], c->def->info.name) != MG_OK) return NULL;
  /* what a tape could record: a float result of an op with a backward */
  bool differentiable = c->def->backward != NULL && mg_is_floating(c->dtype);
  mg_tensor *kept = differentiable && c->nout == 1 && h->before ? h->before(c) : NULL;
  if (kept != NULL) {
    c->out[0] = kept;
  } else if (dry_output(ctx, c)) {
    if ((c->out[0] = mg_empty(c->shape, c->ndim, c->dtype)) == NULL) return NULL;
    c->out[0]->storage->unwritten = true;
  } else {
    bool none = !c->def->saves_with_residuals && dry_zero_inputs(ctx, c);   /* those read nothing in a dry run */
    c->nres = 0;
    if (c->def->forward(c) != MG_OK) return NULL;
    if (none || (ctx->dry.on && c->def->saves_with_residuals)) dry_mark_outputs(c);
  }
  mark_numbers(c);
  if (differentiable && ctx->check_numerics && !ctx->dry.on &&
      mg_numerics_check(c->def, c->nin, c->in, c->out[0]) != MG_OK) {
    release_outputs(c);
    return NULL;
  }
  if ((differentiable && h->after && h->after(c) != MG_OK) || (h->seen && h->seen(c) != MG_OK)) {
    release_outputs(c);
    return NULL;
  }
  release_residuals(c);                 /* the tapes' now, if they recorded the op */
  return c->out[0];
}

bool mg_op_second_order (void) {
  bool (*second_order)(void) = mg_ctx()->hooks.second_order;
  return second_order != NULL && second_order();
}

bool mg_op_recording (void) {
  bool (*recording)(void) = mg_ctx()->hooks.recording;
  return recording != NULL && recording();
}

bool mg_op_recorded (void) {
  bool (*listening)(void) = mg_ctx()->hooks.listening;
  return listening != NULL && listening();
}

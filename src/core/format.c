/*
** format.c — tensors as text: nested braces (so a small tensor reads like
** the Lua table that would build it), one number format per tensor chosen
** from the values shown, rows wrapped at 80 columns, big tensors cut to
** their first and last 3 entries per dimension, and a footer with shape
** and dtype: "moongrad.Tensor(2,3) float32".
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#define SUMMARY_OVER 1000     /* more elements than this get cut, as NumPy */
#define EDGE 3
#define LINE_WIDTH 80

typedef struct sbuf { char *s; size_t n, cap; bool failed; } sbuf;

static void put (sbuf *b, const char *fmt, ...) {
  if (b->failed) return;
  va_list ap;
  va_start(ap, fmt);
  int need = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (b->n + (size_t)need + 1 > b->cap) {
    size_t cap = (b->cap + (size_t)need + 1) * 2;
    char *s = (char *)realloc(b->s, cap);
    if (s == NULL) { b->failed = true; return; }
    b->s = s;
    b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
  va_end(ap);
  b->n += (size_t)need;
}

typedef struct style {
  const mg_tensor *t;
  bool cut;
  enum { F_INTEGRAL, F_FIXED, F_SCI } kind;      /* for floats */
  int width;
} style;

/* the first index at or after i along dimension d that is shown: a cut
** dimension jumps over its middle, so printing never walks what it skips */
static int64_t next_shown (const style *st, int d, int64_t i) {
  int64_t n = st->t->shape[d];
  if (st->cut && n > 2 * EDGE && i >= EDGE && i < n - EDGE) return n - EDGE;
  return i;
}

/* one element, formatted from its own dtype: int64 never goes through double */
static int fmt_value (char *buf, size_t n, const style *st, const char *p) {
  switch (st->t->dtype) {
    case MG_INT64: return snprintf(buf, n, "%lld", (long long)*(const int64_t *)p);
    case MG_BOOL: return snprintf(buf, n, "%s", *(const uint8_t *)p ? "true" : "false");
    default: break;
  }
  double v = mg_load_double(p, st->t->dtype);
  if (isnan(v)) return snprintf(buf, n, "nan");
  if (isinf(v)) return snprintf(buf, n, v > 0 ? "inf" : "-inf");
  if (st->kind == F_INTEGRAL) return snprintf(buf, n, "%.1f", v);
  if (st->kind == F_SCI) return snprintf(buf, n, "%.4e", v);
  return snprintf(buf, n, "%.4f", v);
}

static const char *element_at (const mg_tensor *t, const int64_t *idx) {
  int64_t off = 0;
  for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
  return mg_ptr(t) + off * (int64_t)mg_dtype_size(t->dtype);
}

/* calls fn for every element that will be shown */
static void visit (style *st, int d, int64_t *idx, void (*fn)(style *, const char *, void *), void *ud) {
  const mg_tensor *t = st->t;
  if (d == t->ndim) {
    fn(st, element_at(t, idx), ud);
    return;
  }
  for (int64_t i = next_shown(st, d, 0); i < t->shape[d]; i = next_shown(st, d, i + 1)) {
    idx[d] = i;
    visit(st, d + 1, idx, fn, ud);
  }
}

typedef struct { double maxabs, minabs; bool integral; } range;

static void scan_value (style *st, const char *p, void *ud) {
  range *r = (range *)ud;
  double v = mg_load_double(p, st->t->dtype);
  if (!isfinite(v)) return;
  double a = fabs(v);
  if (a > r->maxabs) r->maxabs = a;
  if (a > 0 && a < r->minabs) r->minabs = a;
  if (v != floor(v)) r->integral = false;
}

static void measure_value (style *st, const char *p, void *ud) {
  char buf[64];
  int w = fmt_value(buf, sizeof buf, st, p);
  MG_UNUSED(ud);
  if (w > st->width) st->width = w;
}

static void emit (sbuf *b, const style *st, int d, int64_t *idx) {
  const mg_tensor *t = st->t;
  char buf[64];
  if (d == t->ndim) {
    int w = fmt_value(buf, sizeof buf, st, element_at(t, idx));
    put(b, "%*s%s", st->width - w, "", buf);
    return;
  }
  put(b, "{");
  for (int64_t i = next_shown(st, d, 0); i < t->shape[d]; i = next_shown(st, d, i + 1)) {
    if (i > 0 && next_shown(st, d, i - 1) != i - 1)
      put(b, d == t->ndim - 1 ? "..., " : "...,\n%*s", d + 1, "");
    idx[d] = i;
    if (d == t->ndim - 1 && i > 0) {   /* wrap long rows */
      size_t col = 0;
      for (size_t k = b->n; k > 0 && b->s[k - 1] != '\n'; k--) col++;
      if (col + (size_t)st->width + 2 > LINE_WIDTH) put(b, "\n%*s", d + 1, "");
    }
    emit(b, st, d + 1, idx);
    if (i < t->shape[d] - 1) {
      if (d == t->ndim - 1) put(b, ", ");
      else put(b, ",\n%.*s%*s", t->ndim - d - 2, "\n\n\n\n\n\n\n\n", d + 1, "");
    }
  }
  put(b, "}");
}

char *mg_tensor_format (const mg_tensor *t) {
  MG_CHECK_ARG("mg_tensor_format", t, NULL);
  sbuf b = {NULL, 0, 0, false};
  style st = {t, t->numel > SUMMARY_OVER, F_FIXED, 1};
  int64_t idx[MG_MAX_DIMS] = {0};
  bool floats = mg_is_float(t->dtype) || t->dtype == MG_FLOAT16 || t->dtype == MG_BFLOAT16;
  bool none = t->storage->unwritten;    /* a dry run's result: nothing to show */
  if (floats && t->numel > 0 && !none) {   /* (an empty tensor may still have 2^40 rows) */
    range r = {0, INFINITY, true};
    visit(&st, 0, idx, scan_value, &r);
    if (r.integral && r.maxabs < 1e15) st.kind = F_INTEGRAL;
    else if (r.maxabs >= 1e8 || r.minabs < 1e-4) st.kind = F_SCI;
  }
  if (none) {
    put(&b, "(no values: computed in a dry run, mg.memory.estimate)");
  } else if (t->numel == 0) {
    put(&b, "{}");
  } else {
    visit(&st, 0, idx, measure_value, NULL);
    if (t->ndim == 0) {
      char buf[64];
      fmt_value(buf, sizeof buf, &st, element_at(t, idx));
      put(&b, "%s", buf);
    } else {
      emit(&b, &st, 0, idx);
    }
  }
  char sh[160];
  put(&b, "\n%s%s %s", MG_TENSOR_MT, mg_shape_str(sh, sizeof sh, t->shape, t->ndim),
      mg_dtype_name(t->dtype));
  if (b.failed) {
    free(b.s);
    return NULL;
  }
  return b.s;
}

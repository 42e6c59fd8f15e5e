/*
** error.c — the last failure's message, and the thread count.
**
** The C core never raises: a failing function returns NULL or MG_ERR and
** leaves its message here, and the Lua binding turns it into a Lua error in
** one place (mgL_error).
*/
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"

/* the message lives in the current context (context.c): per thread */

const char *mg_errmsg_raw (void) {
  const char *m = mg_ctx()->error.msg;
  return m[0] ? m : "unknown error";
}

/* writes the stored message with each marked position (MG_POS, MG_POS1)
** counted from base */
const char *mg_errmsg_based (int base) {
  mg_context *c = mg_ctx();
  char *out = c->error.shown[base != 0], *end = out + sizeof c->error.shown[0];
  const char *p = mg_errmsg_raw();
  char *o = out;
  while (*p && o < end - 1) {
    if (*p != '\x01' && *p != '\x02') {
      *o++ = *p++;
      continue;
    }
    bool always = *p++ == '\x02';
    char *num;
    long long v = strtoll(p, &num, 10);
    p = num;
    unsigned long long shifted = (unsigned long long)v + (unsigned long long)(base != 0);
    int n = (v < 0 && !always) || base == 0 ? snprintf(o, (size_t)(end - o), "%lld", v)
          : v < 0 ? snprintf(o, (size_t)(end - o), "%lld", (long long)shifted)
          : snprintf(o, (size_t)(end - o), "%llu", shifted);
    o += n < 0 ? 0 : n < end - o ? n : end - o - 1;
  }
  *o = '\0';
  return out;
}

const char *mg_errmsg (void) { return mg_errmsg_based(0); }

mg_status mg_seterror (const char *fmt, ...) {
  mg_context *c = mg_ctx();
  if (fmt == NULL) fmt = "mg_seterror: fmt is NULL";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->error.msg, sizeof c->error.msg, fmt, ap);
  va_end(ap);
  c->error.null_chain = false;
  return MG_ERR;
}

/* A NULL argument is most often the result of a call that just failed
** (ops chain: mg_add(mg_mul(a, b), c)), so the message keeps that failure;
** "the last error" and not "because", since a host may pass NULL for
** reasons of its own. */
const char *mg_range_hint (char *buf, size_t len, int64_t n) {
  if (n <= 0) snprintf(buf, len, " (the dimension is empty)");
  else snprintf(buf, len, " (use " MG_POS1 ".." MG_POS1 " or %lld..-1)", 0LL, (long long)(n - 1), -(long long)n);
  return buf;
}

mg_status mg_null_arg (const char *fn, const char *name) {
  mg_context *c = mg_ctx();
  char *msg = c->error.msg, *cause = c->error.cause;
  if (!c->error.null_chain) snprintf(cause, sizeof c->error.cause, "%.399s", msg);
  if (cause[0])
    snprintf(msg, sizeof c->error.msg, "%s: argument '%s' is NULL (the last error was: %.400s)", fn, name, cause);
  else
    snprintf(msg, sizeof c->error.msg, "%s: argument '%s' is NULL", fn, name);
  c->error.null_chain = true;
  return MG_ERR;
}

/* process-wide on purpose: a signal reaches the process, not a thread */
static volatile sig_atomic_t interrupt_flag;

void mg_interrupt (int on) { interrupt_flag = on != 0; }
int mg_interrupted (void) { return interrupt_flag != 0; }


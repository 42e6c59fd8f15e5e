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

#ifdef _OPENMP
#include <omp.h>
#endif

#include "moongrad_impl.h"

static _Thread_local char errbuf[512];
static _Thread_local char cause[400];         /* the failure before a chain of NULLs */
static _Thread_local bool null_chain;          /* errbuf says an argument was NULL */

const char *mg_errmsg (void) {
  return errbuf[0] ? errbuf : "unknown error";
}

mg_status mg_seterror (const char *fmt, ...) {
  if (fmt == NULL) fmt = "mg_seterror: fmt is NULL";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
  null_chain = false;
  return MG_ERR;
}

/* A NULL argument is most often the result of a call that just failed
** (ops chain: mg_add(mg_mul(a, b), c)), so the message keeps that failure;
** "the last error" and not "because", since a host may pass NULL for
** reasons of its own. */
mg_status mg_null_arg (const char *fn, const char *name) {
  if (!null_chain) snprintf(cause, sizeof cause, "%.399s", errbuf);
  if (cause[0])
    snprintf(errbuf, sizeof errbuf, "%s: argument '%s' is NULL (the last error was: %.400s)", fn, name, cause);
  else
    snprintf(errbuf, sizeof errbuf, "%s: argument '%s' is NULL", fn, name);
  null_chain = true;
  return MG_ERR;
}

/* process-wide on purpose: a signal reaches the process, not a thread */
static volatile sig_atomic_t interrupt_flag;

void mg_interrupt (int on) { interrupt_flag = on != 0; }
int mg_interrupted (void) { return interrupt_flag != 0; }

mg_status mg_set_num_threads (int n) {
  if (n < 1 || n > MG_MAX_THREADS)
    return mg_seterror("set_num_threads: %d threads is out of range (1 to %d)", n, MG_MAX_THREADS);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  return MG_OK;
}

int mg_get_num_threads (void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

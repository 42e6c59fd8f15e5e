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

const char *mg_errmsg (void) {
  return errbuf[0] ? errbuf : "unknown error";
}

mg_status mg_seterror (const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
  return MG_ERR;
}

/* process-wide on purpose: a signal reaches the process, not a thread */
static volatile sig_atomic_t interrupt_flag;

void mg_interrupt (int on) { interrupt_flag = on != 0; }
int mg_interrupted (void) { return interrupt_flag != 0; }

void mg_set_num_threads (int n) {
#ifdef _OPENMP
  if (n >= 1) omp_set_num_threads(n);
#else
  MG_UNUSED(n);
#endif
}

int mg_get_num_threads (void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

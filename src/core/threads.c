/*
** threads.c — how many threads the next op may use.
**
** One OpenMP pool runs moongrad's loops, oneDNN and OpenBLAS. A team only
** pays when every thread in it runs: a parallel region ends at a barrier,
** so when other processes hold the cores, a thread the kernel has not
** scheduled makes the whole step wait for its turn (a time slice of
** milliseconds, on work of microseconds). On a 2-core machine with two busy
** processes beside it, a small MLP's step took 3-17 ms with two threads
** against 0.13 with one.
**
** So by default ("auto") the team follows the machine: every 20 ms or more
** the thread reads how long it ran and how long it waited to run (the
** kernel's schedstat); when it waited for more than a tenth of that time in
** two stretches running, others hold the cores and ops run on this thread
** alone, with the library choices timed for one thread.
** Every hold ends with a try of the full team, and a try that finds the
** cores still taken doubles the next hold (to 2 s at most), so a machine
** that stays busy costs one short try now and then.
**
** A team changes only while no tape keeps nodes (`hold`, counted by the
** tapes), so a step runs at one team size from its forward through its
** re-runs and backward: recomputed outputs match the forward's bit for bit.
** A fixed count (mg_set_num_threads, or OMP_NUM_THREADS in the environment)
** never changes: the way to the same bits from run to run on any load.
*/
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/core.h"

enum {
  WINDOW_NS = 20 * 1000 * 1000,          /* the shortest stretch judged */
  FIRST_HOLD_NS = 100 * 1000 * 1000,
  LONGEST_HOLD_NS = 2000 * 1000 * 1000,
};
#define CROWDED 0.10                     /* share of the time spent waiting to run */

static int machine_threads (void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

static void use_team (mg_pace *p, int team) {
  p->team = team;
#ifdef _OPENMP
  omp_set_num_threads(team);
#endif
}

void mg_pace_init (mg_pace *p) {
  p->nominal = p->team = machine_threads();
  p->fixed = getenv("OMP_NUM_THREADS") != NULL;
  p->fd = -2;                            /* schedstat not opened yet */
  p->backoff_ns = FIRST_HOLD_NS;
}

void mg_pace_release (mg_pace *p) {
  if (p->fd >= 0) close(p->fd);
  p->fd = -2;
}

static int64_t now_ns (void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* this thread's time on a CPU and waiting on a run queue since it began, in
** nanoseconds; false where the kernel does not say
** (/proc/thread-self/schedstat: run, wait, slices) */
static bool sched_times (mg_pace *p, int64_t *run, int64_t *wait) {
  if (p->fd >= 0 && !pthread_equal(p->reader, pthread_self())) {   /* the context moved thread */
    close(p->fd);
    p->fd = -2;
  }
  if (p->fd == -2) {
    p->fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    p->reader = pthread_self();
    p->last_ns = 0;                      /* the first look starts a stretch */
  }
  if (p->fd < 0) return false;
  char buf[96];
  ssize_t n = pread(p->fd, buf, sizeof buf - 1, 0);
  unsigned long long r, w;
  if (n > 0) buf[n] = '\0';
  if (n <= 0 || sscanf(buf, "%llu %llu", &r, &w) != 2) {
    close(p->fd);
    p->fd = -1;                          /* never again */
    return false;
  }
  *run = (int64_t)r;
  *wait = (int64_t)w;
  return true;
}

/* the share of the time it could run that the thread spent waiting: above
** CROWDED, others hold the cores */
static void judge (mg_pace *p, int64_t now, double share) {
  bool crowded = share > CROWDED;
  p->strikes = crowded ? p->strikes + 1 : 0;
  if (crowded && p->team > 1 && (p->trying || p->strikes >= 2)) {   /* a try, or the team twice running */
    p->trying = false;
    use_team(p, 1);
    p->hold_until_ns = now + p->backoff_ns;
    p->backoff_ns = p->backoff_ns * 2 > LONGEST_HOLD_NS ? LONGEST_HOLD_NS : p->backoff_ns * 2;
    p->changes++;
  } else if (crowded && p->team == 1) {          /* still taken: hold on */
    if (p->hold_until_ns < now + p->backoff_ns / 2) p->hold_until_ns = now + p->backoff_ns / 2;
  } else if (!crowded && p->team == 1 && now >= p->hold_until_ns) {
    use_team(p, p->nominal);                     /* try the full team */
    p->trying = true;
    p->changes++;
  } else if (!crowded && p->team > 1) {
    p->trying = false;
    p->backoff_ns = FIRST_HOLD_NS;               /* the team ran a whole stretch unhindered */
  }
}

void mg_pace_tick (mg_context *c) {
  mg_pace *p = &c->pace;
  if (p->fixed || p->nominal == 1 || p->hold > 0 || p->fd == -1) return;
  int64_t now = now_ns(), run, wait;
  if (now - p->last_ns < WINDOW_NS) return;
  if (!sched_times(p, &run, &wait)) return;      /* nothing to go by: the full team */
  int64_t d_run = run - p->last_run_ns, d_wait = wait - p->last_wait_ns;
  bool first = p->last_ns == 0;                  /* the thread's start: no stretch yet */
  p->last_ns = now;
  if (!first && d_run + d_wait < WINDOW_NS / 4) return;   /* it hardly ran: the stretch goes on */
  if (!first) judge(p, now, (double)d_wait / (double)(d_run + d_wait));
  p->last_run_ns = run;
  p->last_wait_ns = wait;
}

mg_status mg_set_num_threads (int n) {
  if (n < 1 || n > MG_MAX_THREADS)
    return mg_seterror("set_num_threads: %d threads is out of range (1 to %d)", n, MG_MAX_THREADS);
  mg_pace *p = &mg_ctx()->pace;
  p->fixed = true;
  p->nominal = n;
  use_team(p, n);
  return MG_OK;
}

mg_status mg_set_num_threads_auto (void) {
  mg_pace *p = &mg_ctx()->pace;
  p->fixed = false;
#ifdef _OPENMP
  p->nominal = omp_get_num_procs();
#endif
  p->last_ns = 0;
  p->last_run_ns = p->last_wait_ns = 0;
  p->backoff_ns = FIRST_HOLD_NS;
  use_team(p, p->nominal);
  return MG_OK;
}

int mg_get_num_threads (void) { return mg_ctx()->pace.nominal; }
int mg_threads_team (void) { return mg_ctx()->pace.team; }
int mg_threads_auto (void) { return !mg_ctx()->pace.fixed; }

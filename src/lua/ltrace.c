/*
** ltrace.c — mg.memory.trace: a memory timeline as a Chrome trace (JSON
** that Perfetto and chrome://tracing open).
**
** Three tracks: "memory" counters (tensor, saved and variable bytes at every
** change), "phases" (forward between gradients, backward during them), and
** "recompute" (each re-run of a recompute_grad function), plus a track of
** the caller's own spans from mg.memory.span(name, fn).
*/
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "lbinding.h"

#define MAX_COUNTER_EVENTS 2000000      /* beyond this, counters stop (the file says so) */

enum { TID_SPANS = 1, TID_PHASES = 2, TID_RECOMPUTE = 3 };

typedef struct mgL_tracer {
  FILE *f;
  double t0;
  int depth;                  /* nested backward passes */
  long counters;
  size_t last[4];
} tracer;

/* The running trace is the Lua state's (S->trace): one at a time. Its hooks
** are the context's, whose counters it records. */

static double now_us (void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* a name as a JSON string, quotes included (cJSON escapes it) */
static void put_string (FILE *f, const char *s) {
  cJSON *j = cJSON_CreateString(s);
  char *text = j ? cJSON_PrintUnformatted(j) : NULL;
  fputs(text ? text : "\"?\"", f);
  cJSON_free(text);
  cJSON_Delete(j);
}

static void event (tracer *tr, const char *name, char ph, int tid) {
  fputs(",\n{\"name\":", tr->f);
  put_string(tr->f, name);
  fprintf(tr->f, ",\"ph\":\"%c\",\"ts\":%.3f,\"pid\":1,\"tid\":%d}", ph, now_us() - tr->t0, tid);
}

static void on_change (void *ud) {
  tracer *tr = (tracer *)ud;
  mg_memory_stats st = mg_memory_stats_get();
  size_t v[4] = {st.tensor_bytes, st.saved_bytes, st.variable_bytes, st.gradient_bytes};
  if (memcmp(v, tr->last, sizeof v) == 0 || tr->counters >= MAX_COUNTER_EVENTS) return;
  memcpy(tr->last, v, sizeof v);
  if (++tr->counters == MAX_COUNTER_EVENTS) event(tr, "counter events stop here (limit)", 'i', TID_SPANS);
  fprintf(tr->f, ",\n{\"name\":\"memory\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":1,"
                 "\"args\":{\"tensors\":%zu,\"saved\":%zu,\"variables\":%zu,\"gradients\":%zu}}",
          now_us() - tr->t0, v[0], v[1], v[2], v[3]);
}

/* backward at depth 0 ends a forward phase; its end starts the next one */
static void on_span (const char *name, int begin, void *ud) {
  tracer *tr = (tracer *)ud;
  if (strcmp(name, "backward") == 0) {
    if (begin && tr->depth++ == 0) event(tr, "forward", 'E', TID_PHASES);
    event(tr, "backward", begin ? 'B' : 'E', TID_PHASES);
    if (!begin && --tr->depth == 0) event(tr, "forward", 'B', TID_PHASES);
  } else {
    event(tr, name, begin ? 'B' : 'E', TID_RECOMPUTE);
  }
}

static void thread_name (tracer *tr, int tid, const char *name) {
  fprintf(tr->f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                 "\"args\":{\"name\":\"%s\"}}", tid, name);
}

/* raises "memory.trace: 'path': is a FIFO, not a regular file" */
static int not_regular (lua_State *L, const char *path, mode_t m) {
  const char *kind = S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
                   : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "something other than a file";
  return luaL_error(L, "memory.trace: '%s': is %s, not a regular file", path, kind);
}

/* path opened for the trace: a regular file (emptied) or a new one. What
** is not a regular file raises (a FIFO is never waited on: the stat comes
** first and the open is non-blocking); NULL with errno when it cannot be
** opened */
static FILE *open_trace (lua_State *L, const char *path) {
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) not_regular(L, path, st.st_mode);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
  if (fd < 0) return NULL;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return NULL;
  }
  if (!S_ISREG(st.st_mode)) {                        /* made since the stat */
    close(fd);
    not_regular(L, path, st.st_mode);
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, "w");
  if (f == NULL) close(fd);
  return f;
}

/* flushes and closes the trace: 0, or the errno of a write that failed */
static int close_trace (FILE *f) {
  errno = 0;
  int bad = fflush(f) != 0 || ferror(f), e = bad ? errno : 0;
  if (fclose(f) != 0 && !bad) bad = 1, e = errno;
  return bad ? (e ? e : EIO) : 0;
}

/* trace(path, fn, ...): runs fn(...) recording its timeline into path;
** returns fn's results, or nil and a message when path cannot be opened or
** written. A path that is not a regular file (or a new one) raises. */
static int l_trace (lua_State *L) {
  const char *path = mgL_checkpath(L, 1, "memory.trace");
  mgL_checkcallable(L, 2);
  mgL_state *S = mgL_getstate(L);
  if (S->trace) return luaL_error(L, "memory.trace: a trace is already running");
  tracer tr = {open_trace(L, path), now_us(), 0, 0, {0, 0, 0, 0}};
  if (tr.f == NULL) {                            /* nil, "memory.trace: 'path': why", errno */
    int en = errno;
    luaL_pushfail(L);
    lua_pushfstring(L, "memory.trace: '%s': %s", path, strerror(en));
    lua_pushinteger(L, en);
    return 3;
  }
  fprintf(tr.f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"moongrad\"}}");
  thread_name(&tr, TID_SPANS, "spans");
  thread_name(&tr, TID_PHASES, "phases");
  thread_name(&tr, TID_RECOMPUTE, "recompute");
  S->trace = &tr;
  on_change(&tr);
  event(&tr, "forward", 'B', TID_PHASES);
  mg_memory_set_hooks(on_change, on_span, &tr);
  int st = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
  mg_memory_set_hooks(NULL, NULL, NULL);
  while (tr.depth > 0) on_span("backward", 0, &tr);      /* an error mid-backward */
  event(&tr, "forward", 'E', TID_PHASES);
  fprintf(tr.f, "\n]}\n");
  int werr = close_trace(tr.f);
  S->trace = NULL;
  if (st != LUA_OK) return lua_error(L);
  if (werr) {
    luaL_pushfail(L);
    lua_pushfstring(L, "memory.trace: '%s': writing the trace failed: %s", path, strerror(werr));
    return 2;
  }
  return lua_gettop(L) - 1;
}

/* span(name, fn, ...): fn(...) as a named span of the running trace */
static int l_span (lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  mgL_checkcallable(L, 2);
  mgL_state *S = mgL_getstate(L);
  tracer *tr = S->trace;
  if (tr) event(tr, name, 'B', TID_SPANS);
  int st = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
  if (tr && S->trace == tr) event(tr, name, 'E', TID_SPANS);
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L) - 1;
}

void mgL_open_trace (lua_State *L) {       /* the memory table is at -1 */
  lua_pushcfunction(L, l_trace);
  lua_setfield(L, -2, "trace");
  lua_pushcfunction(L, l_span);
  lua_setfield(L, -2, "span");
}

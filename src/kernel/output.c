/*
** output.c — a kernel's output as it happens: fds 1 and 2 become pipes that
** a reader thread reads, handing what comes to a callback (the kernel sends
** it as stream messages), so print, io.write, the library's C writes and
** child processes all reach the notebook. Output is gathered for up to
** FLUSH_MS before it goes out (a loop printing 10^5 lines makes a dozen
** messages, not 10^5: a PUB socket drops what is past its high-water mark),
** and cut only between whole UTF-8 characters. mg_kout_sync flushes and waits
** until the reader has handed over everything written so far: output then
** comes before a result, a display or a reply.
*/
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernel/kernel.h"

#define OUTCHUNK 65536                  /* bytes handed over at most at once */
#define FLUSH_MS 50                     /* output gathered at most this long */

typedef struct stream { int fd; const char *name; size_t have; char buf[OUTCHUNK]; } stream;

struct mg_kout {
  mg_kout_fn fn;
  void *ud;
  stream s[2];                          /* stdout, stderr */
  int out[2], err[2];                   /* the pipes behind fds 1 and 2 */
  int wake[2], done[2];                 /* to the reader: 'd' drain, 'q' quit; from it: drained */
  int origout, origerr;                 /* fds 1 and 2 as they were */
  pthread_t reader;
  int started;
};

/* how much of buf[0..n) ends with whole UTF-8 characters */
static size_t utf8_whole (const char *buf, size_t n) {
  size_t i = n, back = 0;
  while (i > 0 && back < 3 && ((unsigned char)buf[i - 1] & 0xC0) == 0x80) { i--; back++; }
  if (i == 0) return n;
  unsigned char lead = (unsigned char)buf[i - 1];
  size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return need > back + 1 ? i - 1 : n;
}

/* hands over what s holds (all: even a cut character) */
static void stream_send (mg_kout *o, stream *s, int all) {
  size_t n = all ? s->have : utf8_whole(s->buf, s->have);
  if (n == 0) return;
  o->fn(o->ud, s->name, s->buf, n);
  memmove(s->buf, s->buf + n, s->have - n);
  s->have -= n;
}

/* reads what the pipe holds (its read end does not block); drain: until
** empty, and hands it all over; otherwise only a full buffer */
static void stream_read (mg_kout *o, stream *s, int drain) {
  for (;;) {
    ssize_t r = read(s->fd, s->buf + s->have, OUTCHUNK - s->have);
    if (r < 0 && errno == EINTR) continue;
    if (r > 0) s->have += (size_t)r;
    if (r > 0 && s->have == OUTCHUNK) stream_send(o, s, 0);
    if (r <= 0 || !drain) break;
  }
  if (drain) stream_send(o, s, 1);
}

static long now_ms (void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *reader (void *arg) {
  mg_kout *o = arg;
  stream *s = o->s;
  long since = -1;                               /* when the oldest byte not handed over came */
  for (;;) {
    struct pollfd p[3] = {{s[0].fd, POLLIN, 0}, {s[1].fd, POLLIN, 0}, {o->wake[0], POLLIN, 0}};
    long wait = since < 0 ? -1 : since + FLUSH_MS - now_ms();
    if (poll(p, 3, wait < 0 && since >= 0 ? 0 : (int)wait) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; i++)
      if (p[i].revents) stream_read(o, &s[i], 0);
    if (since < 0 && (s[0].have || s[1].have)) since = now_ms();
    char c;
    if ((p[2].revents & POLLIN) && read(o->wake[0], &c, 1) == 1) {
      stream_read(o, &s[0], 1);
      stream_read(o, &s[1], 1);
      since = -1;
      if (c == 'q') break;
      while (write(o->done[1], "", 1) < 0 && errno == EINTR) {}
    } else if (since >= 0 && now_ms() - since >= FLUSH_MS) {
      stream_send(o, &s[0], 0);
      stream_send(o, &s[1], 0);
      since = s[0].have || s[1].have ? now_ms() : -1;    /* a cut character waits */
    }
  }
  return NULL;
}

void mg_kout_sync (mg_kout *o) {
  fflush(stdout);
  fflush(stderr);
  if (o == NULL || !o->started) return;
  char c = 'd';
  while (write(o->wake[1], &c, 1) < 0 && errno == EINTR) {}
  while (read(o->done[0], &c, 1) < 0 && errno == EINTR) {}
}

static int cloexec (int fd, int nonblock) {
  int fl = fcntl(fd, F_GETFL);
  return fcntl(fd, F_SETFD, FD_CLOEXEC) == 0 && (!nonblock || fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0);
}

/* fds 1 and 2 into the pipes; stdin from /dev/null */
static int redirect (mg_kout *o) {
  o->origout = dup(1);
  o->origerr = dup(2);
  if (o->origout < 0 || o->origerr < 0 || pipe(o->out) != 0 || pipe(o->err) != 0 || pipe(o->wake) != 0 ||
      pipe(o->done) != 0)
    return -1;
  int nul = open("/dev/null", O_RDONLY);
  if (nul >= 0) { dup2(nul, 0); close(nul); }
  fflush(stdout);
  fflush(stderr);
  if (dup2(o->out[1], 1) < 0 || dup2(o->err[1], 2) < 0) return -1;
  close(o->out[1]);
  close(o->err[1]);
  o->out[1] = o->err[1] = -1;
  int fds[] = {o->origout, o->origerr, o->wake[0], o->wake[1], o->done[0], o->done[1]};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) cloexec(fds[i], 0);
  cloexec(o->out[0], 1);
  cloexec(o->err[0], 1);
  setvbuf(stdout, NULL, _IOLBF, 0);              /* lines reach the notebook as they come */
  return 0;
}

/* the reader starts with SIGINT blocked: it is the main thread's */
static int start (mg_kout *o) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  int rc = pthread_create(&o->reader, NULL, reader, o);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

mg_kout *mg_kout_start (mg_kout_fn fn, void *ud, int *origerr) {
  mg_kout *o = calloc(1, sizeof *o);
  if (o == NULL) return NULL;
  o->fn = fn;
  o->ud = ud;
  int *fds[] = {&o->out[0], &o->out[1], &o->err[0], &o->err[1], &o->wake[0], &o->wake[1],
                &o->done[0], &o->done[1], &o->origout, &o->origerr};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) *fds[i] = -1;
  int ok = redirect(o) == 0;
  o->s[0].fd = o->out[0]; o->s[0].name = "stdout";
  o->s[1].fd = o->err[0]; o->s[1].name = "stderr";
  if (!ok || start(o) != 0) {
    int saved = errno;
    mg_kout_stop(o);
    errno = saved;
    return NULL;
  }
  o->started = 1;
  *origerr = dup(o->origerr);
  return o;
}

void mg_kout_stop (mg_kout *o) {
  if (o == NULL) return;
  fflush(stdout);
  fflush(stderr);
  if (o->started) {
    while (write(o->wake[1], "q", 1) < 0 && errno == EINTR) {}
    pthread_join(o->reader, NULL);
  }
  if (o->origout >= 0) dup2(o->origout, 1);
  if (o->origerr >= 0) dup2(o->origerr, 2);
  int fds[] = {o->out[0], o->out[1], o->err[0], o->err[1], o->wake[0], o->wake[1], o->done[0], o->done[1],
               o->origout, o->origerr};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(o);
}

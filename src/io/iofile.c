/*
** iofile.c — helpers shared by the file formats of src/io/: messages that
** name the function and the file, reading through zlib, byte order.
*/
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io.h"

mg_status mg_io_error (const char *fn, const char *path, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mg_seterror("%s: '%s': %s", fn, path ? path : "(null)", msg);
}

const char *mg_io_strerror (int err, char *buf, size_t n) {
  if (strerror_r(err, buf, n) != 0) snprintf(buf, n, "error %d", err);
  return buf;
}

void mg_io_swap (void *p, int64_t n, size_t esize) {
  unsigned char *b = (unsigned char *)p;
  if (esize < 2) return;
  for (int64_t i = 0; i < n; i++, b += esize)
    for (size_t j = 0; j < esize / 2; j++) {
      unsigned char t = b[j];
      b[j] = b[esize - 1 - j];
      b[esize - 1 - j] = t;
    }
}

const char *mg_io_kind (unsigned mode) {
  return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device"
       : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : S_ISLNK(mode) ? "a symbolic link"
       : "something other than a file";
}

/* "fn: 'path': is a FIFO, not a regular file" */
static mg_status not_regular (const char *fn, const char *path, unsigned mode) {
  return mg_io_error(fn, path, "is %s, not a regular file", mg_io_kind(mode));
}

/*
** Opens path for reading, refusing what is not a regular file: a stat
** first, so a device is never opened, then the open itself with O_NONBLOCK
** (a FIFO that appeared since answers at once instead of waiting for a
** writer) and an fstat of what was opened. Returns the descriptor, in
** blocking mode again, with *size set; or -1 and an error naming fn.
*/
int mg_io_open_regular (const char *fn, const char *path, int64_t *size) {
  char eb[128];
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return not_regular(fn, path, st.st_mode), -1;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return mg_io_error(fn, path, "cannot open: %s", mg_io_strerror(errno, eb, sizeof eb)), -1;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return mg_io_error(fn, path, "cannot stat: %s", mg_io_strerror(e, eb, sizeof eb)), -1;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return not_regular(fn, path, st.st_mode), -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  *size = (int64_t)st.st_size;
  return fd;
}

mg_status mg_io_check_target (const char *fn, const char *path, int *mode) {
  char eb[128];
  struct stat st;
  *mode = -1;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT) return MG_OK;                /* a new file (or a dangling link: replaced) */
    return mg_io_error(fn, path, "cannot stat: %s", mg_io_strerror(errno, eb, sizeof eb));
  }
  if (!S_ISREG(st.st_mode)) return not_regular(fn, path, st.st_mode);
  *mode = (int)(st.st_mode & 07777);
  return MG_OK;
}

mg_status mg_io_open (mg_infile *f, const char *fn, const char *path) {
  f->gz = NULL;
  f->size = 0;
  if (path == NULL) return mg_null_arg(fn, "path");
  int fd = mg_io_open_regular(fn, path, &f->size);
  if (fd < 0) return MG_ERR;
  f->gz = gzdopen(fd, "rb");
  if (f->gz == NULL) {
    close(fd);
    return mg_io_error(fn, path, "cannot open: out of memory");
  }
  gzbuffer(f->gz, 1 << 17);
  return MG_OK;
}

mg_status mg_io_read (mg_infile *f, const char *fn, const char *path, void *buf, size_t n,
                      const char *what, size_t *got) {
  size_t done = 0;
  char *p = (char *)buf;
  while (done < n) {
    unsigned chunk = n - done > (1u << 30) ? (1u << 30) : (unsigned)(n - done);
    int r = gzread(f->gz, p + done, chunk);
    if (r < 0) {
      int zerr;
      const char *m = gzerror(f->gz, &zerr);
      char eb[128];
      if (got) *got = done;
      return mg_io_error(fn, path, "reading %s: %s", what,
                         zerr == Z_ERRNO ? mg_io_strerror(errno, eb, sizeof eb) : m);
    }
    if (r == 0) break;
    done += (size_t)r;
  }
  if (got) *got = done;
  if (done < n) {
    int zerr;
    const char *m = gzerror(f->gz, &zerr);
    if (zerr != Z_OK && zerr != Z_BUF_ERROR)
      return mg_io_error(fn, path, "reading %s: %s", what, m);
    return mg_io_error(fn, path, "truncated: %s needs %zu bytes, only %zu remain%s", what, n, done,
                       zerr == Z_BUF_ERROR ? " (the gzip stream ends early)"
                       : mg_io_gzipped(f) ? " (after decompression)" : "");
  }
  return MG_OK;
}

int mg_io_gzipped (mg_infile *f) { return f->gz && !gzdirect(f->gz); }

void mg_io_close (mg_infile *f) {
  if (f->gz) gzclose_r(f->gz);
  f->gz = NULL;
}

/*
** harness.h — what the libFuzzer harnesses of spec/fuzz/harness/ share:
** the input as a file the readers open by name (a memfd, named
** /proc/self/fd/N: the readers take paths only), gzip, and a check that
** aborts (a finding) when an oracle fails.
**
** Each harness is one C file defining LLVMFuzzerTestOneInput, built with
** clang -fsanitize=fuzzer,address,undefined against the parser sources it
** fuzzes (also instrumented) and the rest of the library built by GCC
** (uninstrumented: clang 14 has no _Float16); see the Makefile's fuzz part.
*/
#ifndef MG_FUZZ_HARNESS_H
#define MG_FUZZ_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "moongrad.h"

/* an oracle: not a crash, but a wrong answer; libFuzzer saves the input */
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "harness check failed (%s:%d): ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      abort();                                                             \
    }                                                                      \
  } while (0)

/* data[0..n) as the content of one memfd (made once); its path */
static inline const char *as_file (const uint8_t *data, size_t n) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("moongrad-fuzz", MFD_CLOEXEC);
    CHECK(fd >= 0, "memfd_create failed");
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  CHECK(ftruncate(fd, 0) == 0, "ftruncate failed");
  for (size_t done = 0; done < n;) {
    ssize_t w = pwrite(fd, data + done, n - done, (off_t)done);
    CHECK(w > 0, "pwrite failed");
    done += (size_t)w;
  }
  return path;
}

/* data gzipped at level (0..9) into a malloc'd buffer of *out bytes */
static inline uint8_t *gzip (const uint8_t *data, size_t n, int level, size_t *out) {
  z_stream z;
  memset(&z, 0, sizeof z);
  CHECK(deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK, "deflateInit2");
  size_t cap = deflateBound(&z, (uLong)n) + 64;
  uint8_t *buf = (uint8_t *)malloc(cap);
  CHECK(buf != NULL, "out of memory");
  z.next_in = (Bytef *)(uintptr_t)data;
  z.avail_in = (uInt)n;
  z.next_out = buf;
  z.avail_out = (uInt)cap;
  CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
  *out = cap - z.avail_out;
  deflateEnd(&z);
  return buf;
}

/* a failure's message names the function and the file: "fn: 'path': ..." */
static inline void check_error (const char *fn, const char *path) {
  const char *msg = mg_errmsg();
  char want[128];
  snprintf(want, sizeof want, "%s: '%s': ", fn, path);
  CHECK(msg != NULL && strncmp(msg, want, strlen(want)) == 0 && strlen(msg) > strlen(want),
        "the error '%s' does not start with '%s'", msg ? msg : "(null)", want);
}

#endif

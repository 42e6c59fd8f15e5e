/*
** io.h — what the readers and writers of src/io/ share: messages that name
** the function and the file, opening a file that may be gzipped, and the
** host's byte order.
*/
#ifndef MG_IO_H
#define MG_IO_H

#include <stdio.h>
#include <zlib.h>

#include "ops/op.h"

/* the files are little-endian (safetensors) or big-endian (IDX) on disk */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define MG_HOST_BIG_ENDIAN 1
#else
#define MG_HOST_BIG_ENDIAN 0
#endif

/* "fn: 'path': <fmt formatted>"; always MG_ERR */
mg_status   mg_io_error    (const char *fn, const char *path, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 3, 4)))
#endif
  ;
/* errno's text, thread-safe */
const char *mg_io_strerror (int err, char *buf, size_t n);
/* reverses the bytes of n elements of esize bytes each, in place */
void        mg_io_swap     (void *p, int64_t n, size_t esize);

/* "a FIFO", "a character device", ... for a stat mode that is not a regular file */
const char *mg_io_kind     (unsigned mode);
/* opens path for reading; refuses what is not a regular file, and a FIFO
** without waiting for a writer: "fn: 'path': is a FIFO, not a regular
** file". The descriptor (blocking) with *size, or -1 + error naming fn */
int         mg_io_open_regular (const char *fn, const char *path, int64_t *size);
/* path as a file to replace: a regular file (its permission bits in *mode)
** or nothing yet (*mode = -1): MG_OK; anything else is an error naming fn */
mg_status   mg_io_check_target (const char *fn, const char *path, int *mode);

/* A file opened for reading through zlib: gzread reads gzipped and plain
** files alike. size is the file's size on disk, gzipped says which it is
** (known once the first bytes are read: call mg_io_gzipped after a read). */
typedef struct mg_infile {
  gzFile gz;
  int64_t size;
} mg_infile;

/* opens path (mg_io_open_regular); NULL gz + error naming fn */
mg_status   mg_io_open     (mg_infile *f, const char *fn, const char *path);
/* reads exactly n bytes; short (end of file) or failed: an error naming
** fn, the file and `what` ("the header"); *got says how many came */
mg_status   mg_io_read     (mg_infile *f, const char *fn, const char *path, void *buf,
                            size_t n, const char *what, size_t *got);
int         mg_io_gzipped  (mg_infile *f);
void        mg_io_close    (mg_infile *f);     /* NULL gz is fine */

/* the most bytes a gzip file of `size` bytes can inflate to (deflate
** compresses at most about 1032:1), so a header claiming more is refused
** before anything is allocated */
#define MG_IO_MAX_INFLATE(size)  ((size) > INT64_MAX / 1100 ? INT64_MAX : (size) * 1032 + 4096)

#endif

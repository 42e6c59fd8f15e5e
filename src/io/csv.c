/*
** csv.c — numeric CSV files, gzipped or not, into a 2-D tensor (rows,
** columns).
**
** Every field must be a number (strtod's syntax: 1, -2.5, 1e-3, nan, inf;
** spaces around it and one pair of double quotes are allowed) and every
** row must have as many fields as the first. Blank lines are skipped; an
** optional first line is a header, skipped; \r\n ends lines too. A field
** that is not a number, an empty field, a ragged row or a NUL byte is an
** error naming the file, the line and the column.
*/
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"

static const char *const FN = "read_csv";

typedef struct reader {
  mg_infile f;
  const char *path;
  unsigned char buf[1 << 16];
  int pos, end;
  bool eof;
  char *line;                 /* the current line, NUL-terminated */
  size_t len, cap;
  int64_t lineno;
} reader;

static bool append (reader *r, const unsigned char *s, size_t k) {
  if (r->len + k + 1 > r->cap) {
    size_t cap = r->cap ? r->cap : 256;
    while (cap < r->len + k + 1) cap *= 2;
    char *p = (char *)realloc(r->line, cap);
    if (p == NULL) return false;
    r->line = p;
    r->cap = cap;
  }
  memcpy(r->line + r->len, s, k);
  r->len += k;
  r->line[r->len] = '\0';
  return true;
}

/* the next line into r->line, without its \n or \r\n: 1, or 0 at the end
** of the file, or -1 + error */
static int next_line (reader *r) {
  r->len = 0;
  bool any = false, newline = false;
  while (!newline) {
    if (r->pos == r->end) {
      if (r->eof) break;
      int k = gzread(r->f.gz, r->buf, sizeof r->buf);
      int zerr = Z_OK;
      const char *m = k <= 0 ? gzerror(r->f.gz, &zerr) : NULL;
      if (k < 0 || (k == 0 && zerr != Z_OK))
        return mg_io_error(FN, r->path, "after line %" PRId64 ": %s", r->lineno,
                           zerr == Z_BUF_ERROR ? "truncated (the gzip stream ends early)" : m), -1;
      if (k == 0) {
        r->eof = true;
        break;
      }
      r->pos = 0;
      r->end = k;
    }
    const unsigned char *s = r->buf + r->pos;
    const unsigned char *nl = (const unsigned char *)memchr(s, '\n', (size_t)(r->end - r->pos));
    size_t k = nl ? (size_t)(nl - s) : (size_t)(r->end - r->pos);
    if (!append(r, s, k)) return mg_io_error(FN, r->path, "out of memory at line %" PRId64, r->lineno + 1), -1;
    r->pos += (int)k + (nl != NULL);
    newline = nl != NULL;
    any = any || k > 0 || newline;
  }
  if (!any) return 0;
  r->lineno++;
  if (r->len > 0 && r->line[r->len - 1] == '\r') r->line[--r->len] = '\0';
  if (memchr(r->line, '\0', r->len) != NULL)
    return mg_io_error(FN, r->path, "line %" PRId64 " has a NUL byte (not a text file?)", r->lineno), -1;
  return 1;
}

static bool blank (const char *s) {
  while (*s == ' ' || *s == '\t') s++;
  return *s == '\0';
}

typedef struct values { double *v; int64_t n, cap; } values;

static bool push (values *vs, double v) {
  if (vs->n == vs->cap) {
    int64_t cap = vs->cap ? vs->cap * 2 : 4096;
    double *p = (double *)realloc(vs->v, sizeof(double) * (size_t)cap);
    if (p == NULL) return false;
    vs->v = p;
    vs->cap = cap;
  }
  vs->v[vs->n++] = v;
  return true;
}

/* the fields of r->line appended to vs; *ncols gets their count */
static mg_status parse_line (reader *r, char delim, values *vs, int64_t *ncols) {
  char *p = r->line;
  int64_t col = 0;
  for (;;) {
    char *start = p;
    while (*p && *p != delim) p++;
    char last = *p;
    char *end = p;
    *p = '\0';
    col++;
    while (*start == ' ' || *start == '\t') start++;
    while (end > start && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
    if (end - start >= 2 && *start == '"' && end[-1] == '"') {
      start++;
      *--end = '\0';
    }
    if (*start == '\0')
      return mg_io_error(FN, r->path, "line %" PRId64 ", column %" PRId64 ": the field is empty", r->lineno, col);
    char *stop;
    double v = strtod(start, &stop);
    if (stop != end)
      return mg_io_error(FN, r->path, "line %" PRId64 ", column %" PRId64 ": '%.40s' is not a number",
                         r->lineno, col, start);
    if (!push(vs, v)) return mg_io_error(FN, r->path, "out of memory at line %" PRId64, r->lineno);
    if (last == '\0') break;
    p++;
  }
  *ncols = col;
  return MG_OK;
}

mg_tensor *mg_read_csv (const char *path, const mg_csv_options *opts) {
  mg_csv_options o = opts ? *opts : (mg_csv_options){0};
  if (path == NULL) return mg_null_arg(FN, "path"), NULL;
  if (o.delimiter == 0) o.delimiter = ',';
  if (o.delimiter == '\n' || o.delimiter == '\r' || o.delimiter == '"' || o.delimiter == '.' ||
      o.delimiter == '-' || o.delimiter == '+' || (o.delimiter >= '0' && o.delimiter <= '9'))
    return mg_io_error(FN, path, "'%c' cannot be the delimiter (it is part of numbers or lines)", o.delimiter), NULL;
  if (o.dtype != MG_FLOAT32 && o.dtype != MG_FLOAT64)
    return mg_io_error(FN, path, "dtype must be float32 or float64, got %s",
                       (unsigned)o.dtype < MG_DTYPE__COUNT ? mg_dtype_name(o.dtype) : "an unknown one"), NULL;
  reader *r = (reader *)calloc(1, sizeof(reader));
  if (r == NULL) return mg_io_error(FN, path, "out of memory"), NULL;
  r->path = path;
  values vs = {0};
  mg_tensor *t = NULL;
  int64_t rows = 0, cols = -1, first = 0, n = 0;
  bool header = o.header != 0;
  int got;
  if (mg_io_open(&r->f, FN, path) != MG_OK) goto done;
  while ((got = next_line(r)) == 1) {
    if (blank(r->line)) continue;
    if (header) {                                   /* the first line that is not blank */
      header = false;
      continue;
    }
    if (parse_line(r, o.delimiter, &vs, &n) != MG_OK) goto done;
    if (cols < 0) {
      cols = n;
      first = r->lineno;
    } else if (n != cols) {
      mg_io_error(FN, path, "line %" PRId64 " has %" PRId64 " field%s, line %" PRId64 " has %" PRId64
                  " (every row must have as many)", r->lineno, n, n == 1 ? "" : "s", first, cols);
      goto done;
    }
    rows++;
  }
  if (got == 0) {
    int64_t shape[2] = {rows, cols < 0 ? 0 : cols};
    t = mg_empty(shape, 2, o.dtype);
    if (t != NULL) mg_convert(mg_ptr(t), o.dtype, vs.v, MG_FLOAT64, vs.n);
    else {
      char why[300];
      snprintf(why, sizeof why, "%s", mg_errmsg_raw());
      mg_io_error(FN, path, "%s", why);
    }
  }
done:
  mg_io_close(&r->f);
  free(r->line);
  free(r);
  free(vs.v);
  return t;
}

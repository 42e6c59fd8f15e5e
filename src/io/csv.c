/*
** csv.c — CSV files of numbers, gzipped or not, into tensors: x (rows,
** columns) and, when a label column is named, y (rows).
**
** Lines end at \n or \r\n; blank lines are skipped; a UTF-8 byte order mark
** opening the file is dropped. Fields are split at the delimiter, quoted as
** RFC 4180 within a line ("a,b" is one field, "" inside quotes is one
** quote; a quote does not span lines), with spaces and tabs around them
** trimmed. The header is the first line that is not blank: asked for,
** refused, or detected (a first line none of whose fields is a number,
** with a line after it).
** Its fields are the columns' names, kept as written, repeats and empty
** ones too; a pick by a name that several columns share is an error.
**
** The columns picked (all but the label by default) must be numbers
** (strtod's syntax: 1, -2.5, 1e-3, nan, inf); the others may hold anything.
** A label read as int64 takes exact integers (digits, to 2^63; or a whole
** number such as 3.0 or 1e3 up to 2^53). Every row must have as many fields
** as the header (or the first row). An empty or non-numeric field, a
** ragged row, an open quote or a NUL byte is an error naming the file, the
** line and the column.
*/
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"

static const char *const FN = "read_csv";

/* {========================= lines ========================= */

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

/* fills r->buf: 1, or 0 at the end of the file, or -1 + error */
static int refill (reader *r) {
  int k = gzread(r->f.gz, r->buf, sizeof r->buf);
  int zerr = Z_OK;
  const char *m = k <= 0 ? gzerror(r->f.gz, &zerr) : NULL;
  if (k < 0 || (k == 0 && zerr != Z_OK))
    return mg_io_error(FN, r->path, "after line %" PRId64 ": %s", r->lineno,
                       zerr == Z_BUF_ERROR ? "truncated (the gzip stream ends early)" : m), -1;
  if (k == 0) return r->eof = true, 0;
  r->pos = 0;
  r->end = k;
  return 1;
}

/* the next line into r->line, without its \n or \r\n (nor, on line 1, a
** byte order mark): 1, or 0 at the end of the file, or -1 + error */
static int next_line (reader *r) {
  r->len = 0;
  bool any = false, newline = false;
  while (!newline) {
    if (r->pos == r->end) {
      int got = r->eof ? 0 : refill(r);
      if (got < 0) return -1;
      if (got == 0) break;
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
  if (r->lineno == 1 && r->len >= 3 && memcmp(r->line, "\xEF\xBB\xBF", 3) == 0) {
    memmove(r->line, r->line + 3, r->len - 2);
    r->len -= 3;
  }
  if (memchr(r->line, '\0', r->len) != NULL)
    return mg_io_error(FN, r->path, "line %" PRId64 " has a NUL byte (not a text file?)", r->lineno), -1;
  return 1;
}

/* the next line that is not blank: as next_line */
static int next_content (reader *r) {
  int got;
  while ((got = next_line(r)) == 1) {
    const char *s = r->line;
    while (*s == ' ' || *s == '\t') s++;
    if (*s != '\0') break;
  }
  return got;
}

/* }========================================================== */


/* {========================= fields ========================= */

typedef struct fields { char **f; int64_t n, cap; } fields;

/* s as a message shows it: 40 bytes at most, control bytes as '?' */
static const char *shown (char out[48], const char *s) {
  size_t i = 0;
  for (; s[i] && i < 40; i++) out[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
  if (s[i]) memcpy(out + i++, "...", 3), i += 2;
  out[i] = '\0';
  return out;
}

static bool space (char c, char delim) { return (c == ' ' || c == '\t') && c != delim; }

static bool push_field (fields *fs, char *f) {
  if (fs->n == fs->cap) {
    int64_t cap = fs->cap ? fs->cap * 2 : 64;
    char **p = (char **)realloc(fs->f, sizeof(char *) * (size_t)cap);
    if (p == NULL) return false;
    fs->f = p;
    fs->cap = cap;
  }
  fs->f[fs->n++] = f;
  return true;
}

/* the quoted field at *pp (on its opening quote), unquoted in place, the
** quote itself becoming its first byte; *pp after the closing quote; its
** end, or NULL at the end of the line */
static char *unquote (char **pp) {
  char *p = *pp + 1, *w = *pp;
  for (;; p++) {
    if (*p == '\0') return NULL;
    if (*p == '"' && *++p != '"') break;
    *w++ = *p;
  }
  *pp = p;
  return w;
}

/* splits r->line in place into fs: each field NUL-terminated, trimmed and
** unquoted */
static mg_status split (reader *r, char delim, fields *fs) {
  char *p = r->line;
  fs->n = 0;
  for (int64_t col = 1;; col++) {
    while (space(*p, delim)) p++;
    char *start = p, *end;
    if (*p == '"') {
      if ((end = unquote(&p)) == NULL)
        return mg_io_error(FN, r->path, "line %" PRId64 ", column %" PRId64 ": the quote is not closed "
                           "(a quoted field cannot span lines)", r->lineno, col);
      while (space(*p, delim)) p++;
      if (*p != '\0' && *p != delim)
        return mg_io_error(FN, r->path, "line %" PRId64 ", column %" PRId64 ": text after the closing quote",
                           r->lineno, col);
    } else {
      while (*p && *p != delim) p++;
      end = p;
      while (end > start && space(end[-1], delim)) end--;
    }
    char last = *p;
    *end = '\0';
    if (!push_field(fs, start)) return mg_io_error(FN, r->path, "out of memory at line %" PRId64, r->lineno);
    if (last == '\0') return MG_OK;
    p++;
  }
}

/* s as a number, all of it */
static bool number (const char *s, double *v) {
  char *stop;
  *v = strtod(s, &stop);
  while (*stop == ' ' || *stop == '\t') stop++;
  return *s != '\0' && stop != s && *stop == '\0';
}

/* s as an exact int64: decimal digits, or a whole number to 2^53; 0, or a
** message's end ("is not an integer") */
static const char *integer (const char *s, int64_t *v) {
  char *stop;
  errno = 0;
  long long k = strtoll(s, &stop, 10);
  while (*stop == ' ' || *stop == '\t') stop++;
  if (stop != s && *stop == '\0') {
    *v = (int64_t)k;
    return errno == ERANGE ? "is beyond int64's range" : NULL;
  }
  double d;
  if (!number(s, &d)) return "is not a number";
  if (!isfinite(d) || d != floor(d)) return "is not an integer (the label is read as int64)";
  if (fabs(d) > 0x1p53) return "is not exact as a float beyond 2^53 (write the integer's digits)";
  *v = (int64_t)d;
  return NULL;
}

/* }========================================================== */


/* {===================== the whole file ===================== */

typedef struct values { double *v; int64_t n, cap; } values;
typedef struct ivalues { int64_t *v; int64_t n, cap; } ivalues;

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

static bool ipush (ivalues *vs, int64_t v) {
  if (vs->n == vs->cap) {
    int64_t cap = vs->cap ? vs->cap * 2 : 4096;
    int64_t *p = (int64_t *)realloc(vs->v, sizeof(int64_t) * (size_t)cap);
    if (p == NULL) return false;
    vs->v = p;
    vs->cap = cap;
  }
  vs->v[vs->n++] = v;
  return true;
}

typedef struct csv {
  reader *r;
  mg_csv_options o;
  fields fs;
  int64_t ncols, width_line;  /* the file's columns, and the line that set them */
  bool header;
  char **names;               /* the header's fields, ncols of them; NULL without one */
  int64_t *src, nx;           /* x's columns in the file, 0-based */
  int64_t label;              /* y's, or -1 */
  unsigned char *need;        /* per column: 1 read as a number */
  double *tmp;                /* per column: this row's numbers */
  values xs, ys;
  ivalues yi;
  int64_t rows;
} csv;

static void free_names (char **names, int64_t n) {
  if (names == NULL) return;
  for (int64_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

/* the fields of the current line as the header */
static mg_status keep_names (csv *c) {
  c->names = (char **)calloc((size_t)c->fs.n + 1, sizeof(char *));
  if (c->names == NULL) return mg_io_error(FN, c->r->path, "out of memory for the header");
  for (int64_t i = 0; i < c->fs.n; i++) {
    size_t k = strlen(c->fs.f[i]) + 1;
    if ((c->names[i] = (char *)malloc(k)) == NULL) return mg_io_error(FN, c->r->path, "out of memory for the header");
    memcpy(c->names[i], c->fs.f[i], k);
  }
  return MG_OK;
}

/* "'a', 'b', 'c'": the header's first names (and how many there are) */
static void list_names (const csv *c, char *out, size_t n) {
  size_t k = 0;
  int64_t i = 0;
  out[0] = '\0';
  for (; i < c->ncols && k + 60 < n; i++) {
    char s[48];
    k += (size_t)snprintf(out + k, n - k, "%s'%s'", i ? ", " : "", shown(s, c->names[i]));
  }
  if (i < c->ncols) snprintf(out + k, n - k, ", ... (%" PRId64 " in all)", c->ncols);
  if (c->ncols == 0) snprintf(out, n, "no column");
}

/* the column pick p (which names `what`: "option 'columns', item 2") in
** the file, 0-based, or -1 + error */
static int64_t find (const csv *c, mg_csv_column p, const char *what) {
  const char *path = c->r->path;
  char s[48], list[240];
  if (p.name == NULL) {
    if (p.number >= 1 && p.number <= c->ncols) return p.number - 1;
    return mg_io_error(FN, path, "%s: column %" PRId64 " is asked for; the file has %" PRId64 " column%s",
                       what, p.number, c->ncols, c->ncols == 1 ? "" : "s"), -1;
  }
  if (!c->header)
    return mg_io_error(FN, path, "%s: the column '%s' is asked for by name, but the file has no header "
                       "(pick columns by number, or pass {header = true})", what, shown(s, p.name)), -1;
  int64_t at = -1;
  for (int64_t i = 0; i < c->ncols; i++) {
    if (strcmp(c->names[i], p.name) != 0) continue;
    if (at >= 0)
      return mg_io_error(FN, path, "%s: columns %" PRId64 " and %" PRId64 " are both named '%s' "
                         "(pick one by number)", what, at + 1, i + 1, shown(s, p.name)), -1;
    at = i;
  }
  if (at < 0) {
    list_names(c, list, sizeof list);
    mg_io_error(FN, path, "%s: no column is named '%s'; the header names %s", what, shown(s, p.name), list);
  }
  return at;
}

/* x's columns and y's from the options, with the columns read as numbers */
static mg_status resolve (csv *c) {
  const mg_csv_options *o = &c->o;
  char what[64];
  c->label = -1;
  if (o->label.name != NULL || o->label.number != 0) {
    if ((c->label = find(c, o->label, "option 'label'")) < 0) return MG_ERR;
  }
  int64_t nx = o->ncolumns > 0 ? o->ncolumns : c->ncols - (c->label >= 0);
  c->src = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nx + 1));
  c->need = (unsigned char *)calloc((size_t)c->ncols + 1, 1);
  c->tmp = (double *)malloc(sizeof(double) * (size_t)(c->ncols + 1));
  if (c->src == NULL || c->need == NULL || c->tmp == NULL) return mg_io_error(FN, c->r->path, "out of memory");
  for (int64_t j = 0, i = 0; j < nx; j++) {
    if (o->ncolumns > 0) {
      snprintf(what, sizeof what, "option 'columns', item %" PRId64, j + 1);
      if ((c->src[j] = find(c, o->columns[j], what)) < 0) return MG_ERR;
    } else {
      if (i == c->label) i++;
      c->src[j] = i++;
    }
    c->need[c->src[j]] = 1;
  }
  c->nx = nx;
  if (c->label >= 0 && o->label_dtype != MG_INT64) c->need[c->label] = 1;
  return MG_OK;
}

/* the fields (split) of line `line` as a row; first: the file's first line
** that is not blank (a header, perhaps: the message says so) */
static mg_status row (csv *c, int64_t line, bool first) {
  const char *path = c->r->path, *hint = first ? " (a header line? pass {header = true})" : "";
  char s[48];
  if (c->fs.n != c->ncols) {
    int64_t n = c->fs.n;
    char ref[64];
    snprintf(ref, sizeof ref, c->header ? "the header (line %" PRId64 ")" : "line %" PRId64, c->width_line);
    return mg_io_error(FN, path, "line %" PRId64 " has %" PRId64 " field%s, %s has %" PRId64
                       " (every row must have as many)", line, n, n == 1 ? "" : "s", ref, c->ncols);
  }
  for (int64_t i = 0; i < c->ncols; i++) {
    const char *f = c->fs.f[i];
    if (!c->need[i] && i != c->label) continue;
    if (*f == '\0')
      return mg_io_error(FN, path, "line %" PRId64 ", column %" PRId64 ": the field is empty%s", line, i + 1, hint);
    if (c->need[i] && !number(f, &c->tmp[i]))
      return mg_io_error(FN, path, "line %" PRId64 ", column %" PRId64 ": '%s' is not a number%s", line, i + 1,
                         shown(s, f), hint);
    int64_t v;
    const char *bad = i == c->label && c->o.label_dtype == MG_INT64 ? integer(f, &v) : NULL;
    if (bad)
      return mg_io_error(FN, path, "line %" PRId64 ", column %" PRId64 ": '%s' %s%s", line, i + 1, shown(s, f), bad,
                         hint);
    if (i == c->label && c->o.label_dtype == MG_INT64 && !ipush(&c->yi, v)) goto oom;
  }
  for (int64_t j = 0; j < c->nx; j++)
    if (!push(&c->xs, c->tmp[c->src[j]])) goto oom;
  if (c->label >= 0 && c->o.label_dtype != MG_INT64 && !push(&c->ys, c->tmp[c->label])) goto oom;
  c->rows++;
  return MG_OK;
oom:
  return mg_io_error(FN, path, "out of memory at line %" PRId64, line);
}

/* With the header detected, the first line is one when none of its fields
** is a number and a line follows: its names kept, the next line read. *got
** says whether there is one (1), none (0: the first line is a row after
** all, its fields now the names' copies) or an error (-1). */
static mg_status detect (csv *c, int *got) {
  double v;
  *got = 0;
  for (int64_t i = 0; i < c->fs.n; i++)
    if (number(c->fs.f[i], &v)) return MG_OK;
  if (keep_names(c) != MG_OK) return MG_ERR;
  if ((*got = next_content(c->r)) < 0) return MG_ERR;
  c->header = *got == 1;
  for (int64_t i = 0; !c->header && i < c->fs.n; i++) c->fs.f[i] = c->names[i];
  return MG_OK;
}

/* the first line that is not blank: the header, or the first row; then
** the columns picked */
static mg_status first_line (csv *c) {
  int got = next_content(c->r), next = 0;
  if (got < 0) return MG_ERR;
  c->header = c->o.header > 0;
  if (got == 0) return (c->header ? keep_names(c) : MG_OK) == MG_OK ? resolve(c) : MG_ERR;
  if (split(c->r, c->o.delimiter, &c->fs) != MG_OK) return MG_ERR;
  c->ncols = c->fs.n;
  c->width_line = c->r->lineno;
  if (c->header && keep_names(c) != MG_OK) return MG_ERR;
  if (c->o.header == 0 && detect(c, &next) != MG_OK) return MG_ERR;
  if (resolve(c) != MG_OK) return MG_ERR;
  if (!c->header) return row(c, c->width_line, true);
  if (next == 1 && (split(c->r, c->o.delimiter, &c->fs) != MG_OK || row(c, c->r->lineno, false) != MG_OK))
    return MG_ERR;
  return MG_OK;
}

static mg_status rest (csv *c) {
  int got;
  while ((got = next_content(c->r)) == 1)
    if (split(c->r, c->o.delimiter, &c->fs) != MG_OK || row(c, c->r->lineno, false) != MG_OK) return MG_ERR;
  return got == 0 ? MG_OK : MG_ERR;
}

/* the tensors and names of what was read into t */
static mg_status result (csv *c, mg_csv_table *t) {
  int64_t xshape[2] = {c->rows, c->nx}, yshape[1] = {c->rows};
  if ((t->x = mg_empty(xshape, 2, c->o.dtype)) == NULL) goto fail;
  mg_convert(mg_ptr(t->x), c->o.dtype, c->xs.v, MG_FLOAT64, c->xs.n);
  if (c->label >= 0) {
    bool i64 = c->o.label_dtype == MG_INT64;
    if ((t->y = mg_empty(yshape, 1, c->o.label_dtype)) == NULL) goto fail;
    if (i64) mg_convert(mg_ptr(t->y), MG_INT64, c->yi.v, MG_INT64, c->yi.n);
    else mg_convert(mg_ptr(t->y), c->o.label_dtype, c->ys.v, MG_FLOAT64, c->ys.n);
  }
  t->ncols = c->nx;
  if (!c->header) return MG_OK;
  if ((t->names = (char **)calloc((size_t)c->nx + 1, sizeof(char *))) == NULL) goto oom;
  for (int64_t j = 0; j < c->nx; j++)
    if ((t->names[j] = strdup(c->names[c->src[j]])) == NULL) goto oom;
  if (c->label >= 0 && (t->label_name = strdup(c->names[c->label])) == NULL) goto oom;
  return MG_OK;
fail: {
    char why[300];
    snprintf(why, sizeof why, "%s", mg_errmsg_raw());
    return mg_io_error(FN, c->r->path, "%s", why);
  }
oom:
  return mg_io_error(FN, c->r->path, "out of memory for the names");
}

static mg_status check_options (const char *path, const mg_csv_options *o) {
  char d = o->delimiter;
  if (d == '\n' || d == '\r' || d == '"' || d == '.' || d == '-' || d == '+' || (d >= '0' && d <= '9'))
    return mg_io_error(FN, path, "'%c' cannot be the delimiter (it is part of numbers or lines)", d);
  if (o->dtype != MG_FLOAT32 && o->dtype != MG_FLOAT64)
    return mg_io_error(FN, path, "dtype must be float32 or float64, got %s",
                       (unsigned)o->dtype < MG_DTYPE__COUNT ? mg_dtype_name(o->dtype) : "an unknown one");
  if (o->label_dtype != MG_FLOAT32 && o->label_dtype != MG_FLOAT64 && o->label_dtype != MG_INT64)
    return mg_io_error(FN, path, "label_dtype must be float32, float64 or int64, got %s",
                       (unsigned)o->label_dtype < MG_DTYPE__COUNT ? mg_dtype_name(o->label_dtype) : "an unknown one");
  if (o->ncolumns < 0 || (o->ncolumns > 0 && o->columns == NULL))
    return mg_io_error(FN, path, "ncolumns is %d with columns %s", o->ncolumns, o->columns ? "given" : "NULL");
  if (o->label.name == NULL && o->label.number < 0)
    return mg_io_error(FN, path, "the label's column number is %" PRId64 " (columns count from 1)", o->label.number);
  return MG_OK;
}

static void release (csv *c) {
  if (c->r) {
    mg_io_close(&c->r->f);
    free(c->r->line);
  }
  free(c->r);
  free(c->fs.f);
  free_names(c->names, c->ncols);
  free(c->src);
  free(c->need);
  free(c->tmp);
  free(c->xs.v);
  free(c->ys.v);
  free(c->yi.v);
}

mg_csv_table *mg_read_csv_table (const char *path, const mg_csv_options *opts) {
  if (path == NULL) return mg_null_arg(FN, "path"), NULL;
  csv c = {.o = opts ? *opts : (mg_csv_options){0}};
  if (c.o.delimiter == 0) c.o.delimiter = ',';
  if (check_options(path, &c.o) != MG_OK) return NULL;
  mg_csv_table *t = (mg_csv_table *)calloc(1, sizeof(mg_csv_table));
  c.r = (reader *)calloc(1, sizeof(reader));
  if (t == NULL || c.r == NULL) {
    free(t);
    free(c.r);
    return mg_io_error(FN, path, "out of memory"), NULL;
  }
  c.r->path = path;
  bool ok = mg_io_open(&c.r->f, FN, path) == MG_OK && first_line(&c) == MG_OK && rest(&c) == MG_OK &&
            result(&c, t) == MG_OK;
  release(&c);
  if (!ok) {
    mg_csv_table_free(t);
    return NULL;
  }
  return t;
}

void mg_csv_table_free (mg_csv_table *t) {
  if (t == NULL) return;
  mg_tensor_release(t->x);
  mg_tensor_release(t->y);
  free_names(t->names, t->ncols);
  free(t->label_name);
  free(t);
}

mg_tensor *mg_read_csv (const char *path, const mg_csv_options *opts) {
  if (path == NULL) return mg_null_arg(FN, "path"), NULL;
  if (opts && (opts->label.name != NULL || opts->label.number != 0))
    return mg_io_error(FN, path, "a label column needs mg_read_csv_table (mg_read_csv returns x alone)"), NULL;
  mg_csv_table *t = mg_read_csv_table(path, opts);
  if (t == NULL) return NULL;
  mg_tensor *x = t->x;
  t->x = NULL;
  mg_csv_table_free(t);
  return x;
}

/* }========================================================== */

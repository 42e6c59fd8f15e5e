/*
** fuzz_csv.c — mg_read_csv_table on any bytes, plain or gzipped. The first
** byte of the input chooses: bit 0, gzip the file here (a raw gzip stream
** in it is read through zlib too); bit 1, a header line (else detected);
** bit 2, float64; bits 3-5, the delimiter (',' ';' tab ' ' '|' ':', and '0'
** and '\n', which are refused); bit 7, a second byte follows, which picks
** columns and a label:
**   bits 0-1  the header: 0 and 3 detected, 1 asked for, 2 refused
**   bit 2     the label as int64
**   bits 3-4  the label: 0 none, 1 column number k, 2 the name NAMES[k],
**             3 column 1000000 (beyond the file)
**   bits 5-6  k: the number is k + 1
**   bit 7     the columns {NAMES[(k + 1) & 3], 1} (else all but the label);
** bit 6, the next byte p puts a blank line of 65536 - p bytes (spaces,
** '\n') before the rest, so that the reader's 64 KiB buffer ends p bytes
** into it. The rest is the file.
**
** Oracles: a read that succeeds gives a 2-D x of the dtype asked for, with
** no more rows than the file has lines and as many columns as picked, a y
** of as many rows with a label, names when a header was asked for (none
** when refused), each no longer than the file; a read that fails says so
** as "read_csv: '<path>': ...".
*/
#include <stdbool.h>

#include "harness.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static const char delims[8] = {',', ';', '\t', ' ', '|', ':', '0', '\n'};
static const char *const NAMES[4] = {"a", "b", "", "a,b"};

/* the options the first bytes choose; *used, how many bytes they take */
static mg_csv_options options (const uint8_t *data, size_t size, size_t *used, mg_csv_column cols[2]) {
  int mode = data[0];
  mg_csv_options o = {.delimiter = delims[(mode >> 3) & 7], .header = (mode >> 1) & 1,
                      .dtype = (mode & 4) ? MG_FLOAT64 : MG_FLOAT32};
  o.label_dtype = o.dtype;
  *used = 1;
  if (!(mode & 128) || size < 2) return o;
  int c = data[(*used)++], k = (c >> 5) & 3;
  o.header = (int[]){0, 1, -1, 0}[c & 3];
  if (c & 4) o.label_dtype = MG_INT64;
  int label = (c >> 3) & 3;
  if (label == 1) o.label.number = k + 1;
  if (label == 2) o.label.name = NAMES[k];
  if (label == 3) o.label.number = 1000000;
  if (c & 128) {
    cols[0] = (mg_csv_column){NAMES[(k + 1) & 3], 0};
    cols[1] = (mg_csv_column){NULL, 1};
    o.ncolumns = 2;
    o.columns = cols;
  }
  return o;
}

static void check_table (const mg_csv_table *t, const mg_csv_options *o, const uint8_t *text, size_t tn) {
  const mg_tensor *x = t->x;
  CHECK(o->delimiter != '0' && o->delimiter != '\n', "delimiter '%c' accepted", o->delimiter);
  CHECK(mg_tensor_ndim(x) == 2 && mg_tensor_dtype(x) == o->dtype, "a (rows, columns) tensor of the dtype asked");
  CHECK(mg_tensor_shape(x)[1] == t->ncols, "x has %lld columns, ncols %lld",
        (long long)mg_tensor_shape(x)[1], (long long)t->ncols);
  CHECK(o->ncolumns == 0 || t->ncols == o->ncolumns, "%lld columns for %d picked", (long long)t->ncols, o->ncolumns);
  bool label = o->label.name || o->label.number;
  CHECK(label == (t->y != NULL), "a y %s a label", label ? "missing with" : "without");
  if (t->y)
    CHECK(mg_tensor_ndim(t->y) == 1 && mg_tensor_dtype(t->y) == o->label_dtype &&
          mg_tensor_shape(t->y)[0] == mg_tensor_shape(x)[0], "y (rows) of label_dtype");
  if (o->header > 0) CHECK(t->names != NULL, "no names though a header was asked for");
  if (o->header < 0) CHECK(t->names == NULL && t->label_name == NULL, "names though no header");
  if (t->label_name && o->label.name) CHECK(strcmp(t->label_name, o->label.name) == 0, "the label's name");
  if (tn >= 2 && text[0] == 0x1f && text[1] == 0x8b) return;       /* a raw gzip stream: inflated, longer */
  for (int64_t i = 0; t->names && i < t->ncols; i++)
    CHECK(strlen(t->names[i]) <= tn, "a name longer than the file");
  size_t lines = 1;
  for (size_t i = 0; i < tn; i++) lines += text[i] == '\n';
  CHECK(mg_tensor_shape(x)[0] <= (int64_t)lines, "%lld rows from %zu lines", (long long)mg_tensor_shape(x)[0], lines);
  CHECK(o->ncolumns > 0 || t->ncols <= (int64_t)tn + 1, "%lld columns from %zu bytes", (long long)t->ncols, tn);
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t used;
  mg_csv_column cols[2];
  mg_csv_options o = options(data, size, &used, cols);
  const uint8_t *file = data + used;
  size_t n = size - used;
  uint8_t *gz = NULL, *padded = NULL;
  if ((data[0] & 64) && n >= 1) {                  /* a blank line, then the rest */
    size_t pad = 65536 - file[0];
    padded = (uint8_t *)malloc(pad + n - 1 + 1);
    CHECK(padded != NULL, "out of memory");
    memset(padded, ' ', pad - 1);
    padded[pad - 1] = '\n';
    memcpy(padded + pad, file + 1, n - 1);
    file = padded;
    n = pad + n - 1;
  }
  const uint8_t *text = file;
  size_t tn = n;
  if (data[0] & 1) file = gz = gzip(text, tn, 6, &n);
  const char *path = as_file(file, n);
  mg_csv_table *t = mg_read_csv_table(path, &o);
  if (t == NULL) {
    check_error("read_csv", path);
  } else {
    check_table(t, &o, text, tn);
    mg_csv_table_free(t);
  }
  if (o.label.name == NULL && o.label.number == 0) {        /* mg_read_csv agrees */
    mg_tensor *x = mg_read_csv(path, &o);
    CHECK((x == NULL) == (t == NULL), "mg_read_csv and mg_read_csv_table disagree");
    mg_tensor_release(x);
  }
  free(gz);
  free(padded);
  return 0;
}

/*
** fuzz_csv.c — mg_read_csv on any bytes, plain or gzipped. The first byte
** of the input chooses: bit 0, gzip the rest here (a raw gzip stream in the
** rest is read through zlib too); bit 1, a header line; bit 2, float64;
** bits 3-5, the delimiter (',' ';' tab ' ' '|' ':', and '0' and '\n',
** which are refused); bit 6, the next byte k puts a blank line of 65536 -
** k bytes (spaces, '\n') before the rest, so that the reader's 64 KiB
** buffer ends k bytes into it.
** The rest is the file.
**
** Oracles: a read that succeeds gives a 2-D tensor of the dtype asked for,
** with no more rows than the file has lines; a read that fails says so as
** "read_csv: '<path>': ...".
*/
#include "harness.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static const char delims[8] = {',', ';', '\t', ' ', '|', ':', '0', '\n'};

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int mode = data[0];
  mg_csv_options o = {delims[(mode >> 3) & 7], (mode >> 1) & 1, (mode & 4) ? MG_FLOAT64 : MG_FLOAT32};
  const uint8_t *file = data + 1;
  size_t n = size - 1;
  uint8_t *gz = NULL, *padded = NULL;
  if ((mode & 64) && size >= 2) {                 /* a blank line, then data + 2 */
    size_t pad = 65536 - data[1];
    padded = (uint8_t *)malloc(pad + size - 2 + 1);
    CHECK(padded != NULL, "out of memory");
    memset(padded, ' ', pad - 1);
    padded[pad - 1] = '\n';
    memcpy(padded + pad, data + 2, size - 2);
    file = padded;
    n = pad + size - 2;
  }
  const uint8_t *text = file;
  size_t tn = n;
  if (mode & 1) file = gz = gzip(text, tn, 6, &n);
  const char *path = as_file(file, n);
  mg_tensor *t = mg_read_csv(path, &o);
  if (t == NULL) {
    check_error("read_csv", path);
  } else {
    CHECK(o.delimiter != '0' && o.delimiter != '\n', "delimiter '%c' accepted", o.delimiter);
    CHECK(mg_tensor_ndim(t) == 2 && mg_tensor_dtype(t) == o.dtype, "a (rows, columns) tensor of the dtype asked");
    size_t lines = 1;
    if (!(tn >= 2 && text[0] == 0x1f && text[1] == 0x8b)) {
      for (size_t i = 0; i < tn; i++) lines += text[i] == '\n';
      CHECK(mg_tensor_shape(t)[0] <= (int64_t)lines, "%lld rows from %zu lines", (long long)mg_tensor_shape(t)[0], lines);
      CHECK(mg_tensor_shape(t)[1] <= (int64_t)tn + 1, "%lld columns from %zu bytes", (long long)mg_tensor_shape(t)[1], tn);
    }
    mg_tensor_release(t);
  }
  free(gz);
  free(padded);
  return 0;
}

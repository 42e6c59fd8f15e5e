/*
** fuzz_idx.c — mg_read_idx on any bytes, plain or gzipped. The first byte
** of the input chooses: bit 0, gzip the rest here (so the fuzzer mutates
** what is inside a valid gzip stream; a raw gzip stream in the rest is read
** through zlib too); bits 1-3, the dtype asked for (-1, float32, float64,
** int64, float16, bfloat16, and bool and 42, which are refused). The rest
** is the file.
**
** Oracles: a read that succeeds gives the magic number's dimensions (and,
** for a plain file, exactly the file's bytes: header and data); a read
** that fails says so as "read_idx: '<path>': ...".
*/
#include "harness.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static const int dtypes[8] = {-1, MG_FLOAT32, MG_FLOAT64, MG_INT64, MG_FLOAT16, MG_BFLOAT16, MG_BOOL, 42};

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int mode = data[0], dtype = dtypes[(mode >> 1) & 7];
  const uint8_t *file = data + 1;
  size_t n = size - 1;
  uint8_t *gz = NULL;
  if (mode & 1) file = gz = gzip(data + 1, size - 1, (mode >> 4) % 10, &n);
  const char *path = as_file(file, n);
  mg_tensor *t = mg_read_idx(path, dtype);
  if (t == NULL) {
    check_error("read_idx", path);
  } else {
    /* the header as it was before any gzip: data + 1 when the harness gzipped it */
    const uint8_t *h = (mode & 1) ? data + 1 : file;
    size_t hn = (mode & 1) ? size - 1 : n;
    CHECK(dtype != MG_BOOL && dtype != 42, "dtype %d accepted", dtype);
    if (hn >= 4 && !(h[0] == 0x1f && h[1] == 0x8b)) {
      int nd = h[3];
      CHECK(mg_tensor_ndim(t) == nd && hn >= 4 + 4 * (size_t)nd, "%d dimensions, the magic says %d",
            mg_tensor_ndim(t), nd);
      unsigned __int128 numel = 1;          /* no overflow: 8 dims of 32 bits, capped below */
      for (int d = 0; d < nd; d++) {
        const uint8_t *b = h + 4 + 4 * d;
        int64_t dim = (int64_t)((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]);
        CHECK(mg_tensor_shape(t)[d] == dim, "dimension %d is %lld, the header says %lld", d,
              (long long)mg_tensor_shape(t)[d], (long long)dim);
        numel = numel * (uint64_t)dim;
        if (numel > ((unsigned __int128)1 << 64)) numel = (unsigned __int128)1 << 64;
      }
      int esize = h[2] == 0x08 || h[2] == 0x09 ? 1 : h[2] == 0x0B ? 2 : h[2] == 0x0E ? 8 : 4;
      CHECK((unsigned __int128)(4 + 4 * nd) + numel * (unsigned)esize == hn, "%llu elements of %d bytes in %zu",
            (unsigned long long)numel, esize, hn);
    }
    if (dtype >= 0) CHECK((int)mg_tensor_dtype(t) == dtype, "dtype %d asked, %d given", dtype, mg_tensor_dtype(t));
    mg_tensor_release(t);
  }
  free(gz);
  return 0;
}

/*
** idx.c — the IDX format of the MNIST family (MNIST, Fashion-MNIST,
** EMNIST, KMNIST), gzipped or not.
**
** A file is a magic number: two zero bytes, an element type (0x08 u8, 0x09
** i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64) and the number of dimensions;
** then each dimension as a big-endian 32-bit size; then the elements,
** big-endian, in C order. train-images-idx3-ubyte is 0x00000803: (60000,
** 28, 28) unsigned bytes.
**
** Values are kept as they are (pixels 0..255, labels 0..9) and converted to
** a moongrad dtype: by default a 1-D file of u8, i8 or i16 (labels) gives
** int64 and a file with more dimensions (images) float32, where every such
** value is exact; i32 gives int64, f32 float32 and f64 float64. A dtype
** asked for converts instead. gzread reads gzipped and plain files alike.
*/
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"

static const char *const FN = "read_idx";

static const struct { unsigned char code; const char *name; int size; } types[] = {
  {0x08, "u8", 1}, {0x09, "i8", 1}, {0x0B, "i16", 2}, {0x0C, "i32", 4}, {0x0D, "f32", 4}, {0x0E, "f64", 8},
};
#define NTYPES ((int)(sizeof types / sizeof types[0]))

#define CHUNK 65536     /* elements decoded at a time */

/* k big-endian elements of type code from raw into out (int64, float or double) */
static void decode (unsigned char code, const unsigned char *raw, int64_t k, void *out) {
  int64_t *o64 = (int64_t *)out;
  switch (code) {
    case 0x08: for (int64_t i = 0; i < k; i++) o64[i] = raw[i]; break;
    case 0x09: for (int64_t i = 0; i < k; i++) o64[i] = (int8_t)raw[i]; break;
    case 0x0B:
      for (int64_t i = 0; i < k; i++) o64[i] = (int16_t)(uint16_t)(raw[2 * i] << 8 | raw[2 * i + 1]);
      break;
    case 0x0C:
      for (int64_t i = 0; i < k; i++) {
        const unsigned char *b = raw + 4 * i;
        o64[i] = (int32_t)((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]);
      }
      break;
    case 0x0D:
      for (int64_t i = 0; i < k; i++) {
        const unsigned char *b = raw + 4 * i;
        uint32_t u = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
        float f;
        memcpy(&f, &u, 4);
        ((float *)out)[i] = f;
      }
      break;
    default:                                        /* 0x0E */
      for (int64_t i = 0; i < k; i++) {
        uint64_t u = 0;
        for (int j = 0; j < 8; j++) u = u << 8 | raw[8 * i + j];
        double d;
        memcpy(&d, &u, 8);
        ((double *)out)[i] = d;
      }
  }
}

mg_tensor *mg_read_idx (const char *path, int dtype) {
  if (path == NULL) return mg_null_arg(FN, "path"), NULL;
  if (dtype >= MG_DTYPE__COUNT || dtype < -1 || dtype == MG_BOOL)
    return mg_io_error(FN, path, "dtype %d is not one to read into (float32, float64, int64, float16 or "
                       "bfloat16; -1 for the default)", dtype), NULL;
  mg_infile f;
  if (mg_io_open(&f, FN, path) != MG_OK) return NULL;
  unsigned char magic[4], dims[4 * MG_MAX_DIMS];
  int64_t shape[MG_MAX_DIMS];
  mg_tensor *t = NULL;
  unsigned char *raw = NULL;
  void *vals = NULL;
  if (mg_io_read(&f, FN, path, magic, 4, "the magic number", NULL) != MG_OK) goto fail;
  uint32_t m = (uint32_t)magic[0] << 24 | (uint32_t)magic[1] << 16 | (uint32_t)magic[2] << 8 | magic[3];
  int ti = 0;
  while (ti < NTYPES && types[ti].code != magic[2]) ti++;
  if (magic[0] != 0 || magic[1] != 0 || ti == NTYPES) {
    mg_io_error(FN, path, "wrong magic number 0x%08x: an IDX file starts with two zero bytes, a type "
                "(08 u8, 09 i8, 0B i16, 0C i32, 0D f32, 0E f64) and the number of dimensions, as 0x00000803%s",
                m, magic[0] == 0x1f && magic[1] == 0x8b ? " (a gzip file inside a gzip file?)" : "");
    goto fail;
  }
  int nd = magic[3];
  if (nd < 1 || nd > MG_MAX_DIMS) {
    mg_io_error(FN, path, "%d dimensions in the magic number 0x%08x; moongrad takes 1 to %d", nd, m, MG_MAX_DIMS);
    goto fail;
  }
  if (mg_io_read(&f, FN, path, dims, 4 * (size_t)nd, "the dimensions", NULL) != MG_OK) goto fail;
  int esize = types[ti].size;
  int64_t numel = 1;
  bool over = false;
  for (int d = 0; d < nd; d++) {
    const unsigned char *b = dims + 4 * d;
    shape[d] = (int64_t)((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]);
    if (shape[d] > 0 && numel > INT64_MAX / 16 / shape[d]) over = true;
    numel *= over ? 1 : shape[d];
  }
  int64_t header = 4 + 4 * (int64_t)nd, limit = f.size - header;
  if (mg_io_gzipped(&f)) limit = MG_IO_MAX_INFLATE(f.size);
  char sh[160];
  mg_shape_str(sh, sizeof sh, shape, nd);
  if (over || numel * esize > limit) {
    mg_io_error(FN, path, "truncated: shape %s of %s needs %s%" PRId64 " bytes of data, the file %s %" PRId64,
                sh, types[ti].name, over ? "more than " : "", over ? limit : numel * esize,
                mg_io_gzipped(&f) ? "(gzipped) can hold at most" : "has", limit);
    goto fail;
  }
  if (!mg_io_gzipped(&f) && numel * esize < limit) {
    mg_io_error(FN, path, "shape %s of %s needs %" PRId64 " bytes of data, the file has %" PRId64
                " (%" PRId64 " too many)", sh, types[ti].name, numel * esize, limit, limit - numel * esize);
    goto fail;
  }
  int code = types[ti].code;
  mg_dtype src = code == 0x0D ? MG_FLOAT32 : code == 0x0E ? MG_FLOAT64 : MG_INT64;
  mg_dtype dt = dtype >= 0 ? (mg_dtype)dtype
              : src != MG_INT64 ? src : (nd >= 2 && esize <= 2) ? MG_FLOAT32 : MG_INT64;
  if ((t = mg_empty(shape, nd, dt)) == NULL) {     /* zero elements, sizes too big for a tensor */
    char why[300];
    snprintf(why, sizeof why, "%s", mg_errmsg_raw());
    mg_io_error(FN, path, "%s", why);
    goto fail;
  }
  raw = (unsigned char *)malloc((size_t)CHUNK * (size_t)esize);
  vals = malloc((size_t)CHUNK * 8);
  if (raw == NULL || vals == NULL) {
    mg_io_error(FN, path, "out of memory");
    goto fail;
  }
  size_t dsize = mg_dtype_size(dt);
  for (int64_t i = 0; i < numel; i += CHUNK) {
    int64_t k = numel - i < CHUNK ? numel - i : CHUNK;
    size_t got;
    if (mg_io_read(&f, FN, path, raw, (size_t)(k * esize), "the data", &got) != MG_OK) {
      if (got < (size_t)(k * esize))              /* say how much of the whole is there */
        mg_io_error(FN, path, "truncated: shape %s of %s needs %" PRId64 " bytes of data, the file has %" PRId64
                    "%s", sh, types[ti].name, numel * esize, i * esize + (int64_t)got,
                    mg_io_gzipped(&f) ? " (after decompression)" : "");
      goto fail;
    }
    decode((unsigned char)code, raw, k, vals);
    mg_convert(mg_ptr(t) + (size_t)i * dsize, dt, vals, src, k);
  }
  unsigned char extra;
  if (mg_io_gzipped(&f) && gzread(f.gz, &extra, 1) > 0) {
    mg_io_error(FN, path, "shape %s of %s needs %" PRId64 " bytes of data, the file has more after them",
                sh, types[ti].name, numel * esize);
    goto fail;
  }
  free(raw);
  free(vals);
  mg_io_close(&f);
  return t;

fail:
  mg_tensor_release(t);
  free(raw);
  free(vals);
  mg_io_close(&f);
  return NULL;
}

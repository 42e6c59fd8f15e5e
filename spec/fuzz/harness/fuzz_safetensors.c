/*
** fuzz_safetensors.c — mg_load_safetensors on any bytes: the 8-byte header
** length, the JSON header (cJSON, dtypes, shapes against offsets, the
** tiling, names, metadata) and the data reader. The input is the file.
**
** Oracles: a load that succeeds holds tensors whose bytes tile the data
** exactly (file size - 8 - header length); a load that fails says so as
** "load_safetensors: '<path>': ...".
*/
#include "harness.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size) {
  const char *path = as_file(data, size);
  mg_named_tensors *f = mg_load_safetensors(path);
  if (f == NULL) {
    check_error("load_safetensors", path);
    return 0;
  }
  CHECK(size >= 8, "a %zu-byte file loaded", size);
  uint64_t n = 0;
  for (int b = 7; b >= 0; b--) n = n << 8 | data[b];
  CHECK(n <= size - 8, "header length %llu past the end", (unsigned long long)n);
  uint64_t bytes = 0;
  for (int i = 0; i < f->n; i++) {
    mg_tensor *t = f->tensors[i];
    CHECK(t != NULL && f->names[i] != NULL, "tensor %d missing", i);
    CHECK(strcmp(f->names[i], "__metadata__") != 0, "a tensor named __metadata__");
    bytes += (uint64_t)mg_tensor_numel(t) * mg_dtype_size(mg_tensor_dtype(t));
    if (mg_tensor_dtype(t) == MG_BOOL) {
      const unsigned char *b = (const unsigned char *)mg_tensor_data(t);
      for (int64_t q = 0; q < mg_tensor_numel(t); q++) CHECK(b[q] <= 1, "a bool byte %d", b[q]);
    }
  }
  CHECK(bytes == size - 8 - n, "the tensors hold %llu bytes, the data is %llu", (unsigned long long)bytes,
        (unsigned long long)(size - 8 - n));
  for (int i = 0; i < f->nmeta; i++) CHECK(f->meta_keys[i] && f->meta_values[i], "metadata %d missing", i);
  mg_named_tensors_free(f);
  return 0;
}

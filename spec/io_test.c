/*
** io_test.c — a C host uses the file functions alone (no Lua): a
** safetensors round trip with metadata, a failed save that keeps the old
** file, corrupt files and bad arguments as errors, the IDX and CSV readers
** (names, columns and labels too).
**
**   make build/io_test && build/io_test
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moongrad.h"

static int failures = 0, checks = 0;

static void ok (const char *what, int cond) {
  checks++;
  if (!cond) {
    fprintf(stderr, "io_test: %s: failed (last error: %s)\n", what, mg_errmsg());
    failures++;
  }
}

/* the call failed and the last message contains want */
static void says (const char *what, int failed, const char *want) {
  checks++;
  if (!failed) {
    fprintf(stderr, "io_test: %s: did not fail\n", what);
    failures++;
  } else if (strstr(mg_errmsg(), want) == NULL) {
    fprintf(stderr, "io_test: %s: message \"%s\" lacks \"%s\"\n", what, mg_errmsg(), want);
    failures++;
  }
}

static void write_file (const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(bytes, 1, n, f) != n) {
    fprintf(stderr, "io_test: cannot write %s\n", path);
    exit(1);
  }
  fclose(f);
}

static void safetensors (const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/c.safetensors", dir);
  int64_t s23[2] = {2, 3}, s0[1] = {0};
  double v[6] = {1, 2, 3, 4, 5, 6};
  mg_tensor *t[3] = {mg_from_doubles(v, s23, 2, MG_FLOAT32), mg_scalar(2.5, MG_FLOAT64),
                     mg_empty(s0, 1, MG_INT64)};
  const char *names[3] = {"w", "s", "empty"};
  const char *keys[1] = {"format"}, *values[1] = {"c host"};
  ok("save", mg_save_safetensors(path, 3, names, t, 1, keys, values) == MG_OK);

  mg_named_tensors *f = mg_load_safetensors(path);
  ok("load", f != NULL);
  if (f) {
    ok("three tensors in the header's order", f->n == 3 && strcmp(f->names[0], "w") == 0 &&
       strcmp(f->names[1], "s") == 0 && strcmp(f->names[2], "empty") == 0);
    ok("metadata", f->nmeta == 1 && strcmp(f->meta_keys[0], "format") == 0 && strcmp(f->meta_values[0], "c host") == 0);
    ok("shape and values", mg_tensor_ndim(f->tensors[0]) == 2 && mg_tensor_shape(f->tensors[0])[1] == 3 &&
       ((float *)mg_tensor_data(f->tensors[0]))[5] == 6.0f);
    ok("0-d float64", mg_tensor_ndim(f->tensors[1]) == 0 && mg_tensor_dtype(f->tensors[1]) == MG_FLOAT64 &&
       *(double *)mg_tensor_data(f->tensors[1]) == 2.5);
    ok("0-size int64", mg_tensor_numel(f->tensors[2]) == 0 && mg_tensor_dtype(f->tensors[2]) == MG_INT64);
  }
  mg_named_tensors_free(f);
  mg_named_tensors_free(NULL);

  /* a failure mid-save: the old file stays */
  mg_tensor *big = mg_full(s23, 2, MG_FLOAT64, 1.0), *tr = mg_transpose(t[0], 0, 1);
  mg_tensor *two[2] = {big, tr};
  const char *n2[2] = {"big", "transposed"};
  mg_memory_fail_after(1);
  says("save failing mid-write", mg_save_safetensors(path, 2, n2, two, 0, NULL, NULL) != MG_OK,
       "tensor 'transposed': ");
  mg_memory_fail_after(0);
  f = mg_load_safetensors(path);
  ok("the old file is whole", f != NULL && f->n == 3);
  mg_named_tensors_free(f);

  says("NULL path", mg_save_safetensors(NULL, 0, NULL, NULL, 0, NULL, NULL) != MG_OK,
       "save_safetensors: argument 'path' is NULL");
  const char *dup[2] = {"a", "a"};
  says("duplicate names", mg_save_safetensors(path, 2, dup, two, 0, NULL, NULL) != MG_OK,
       "the name 'a' is given to two tensors");
  mg_tensor *withnull[1] = {NULL};
  says("NULL tensor", mg_save_safetensors(path, 1, dup, withnull, 0, NULL, NULL) != MG_OK, "tensor 'a' is NULL");
  says("load NULL", mg_load_safetensors(NULL) == NULL, "load_safetensors: argument 'path' is NULL");

  char bad[512];
  snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
  write_file(bad, "\x10\0\0\0\0\0\0\0{\"a\":", 13);
  says("truncated header", mg_load_safetensors(bad) == NULL, "runs past the end of the file");
  says("a device", mg_load_safetensors("/dev/zero") == NULL,
       "load_safetensors: '/dev/zero': is a character device, not a regular file");
  char link[512];
  snprintf(link, sizeof link, "%s/full", dir);
  ok("link to /dev/full", symlink("/dev/full", link) == 0);
  says("save onto a device", mg_save_safetensors(link, 2, n2, two, 0, NULL, NULL) != MG_OK,
       "is a character device, not a regular file");
  unlink(link);
  for (int i = 0; i < 3; i++) mg_tensor_release(t[i]);
  mg_tensor_release(big);
  mg_tensor_release(tr);
}

/* mg_read_csv_table: the header detected and kept, columns picked by name
** and number, an int64 label exact beyond 2^53 */
static void csv_table (const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/named.csv", dir);
  const char *text = "\xEF\xBB\xBF\"a, b\",c,id\r\n1,2,9007199254740993\r\n3,4,-5\r\n";
  write_file(path, text, strlen(text));
  mg_csv_table *t = mg_read_csv_table(path, NULL);
  ok("csv header detected", t && t->ncols == 3 && t->names && strcmp(t->names[0], "a, b") == 0 &&
     strcmp(t->names[2], "id") == 0 && t->y == NULL && t->label_name == NULL && mg_tensor_shape(t->x)[0] == 2);
  mg_csv_table_free(t);
  mg_csv_column pick[2] = {{"c", 0}, {NULL, 1}};
  mg_csv_options o = {.ncolumns = 2, .columns = pick, .label = {"id", 0}, .label_dtype = MG_INT64};
  t = mg_read_csv_table(path, &o);
  ok("csv picked columns and an int64 label", t && t->ncols == 2 && strcmp(t->names[0], "c") == 0 &&
     strcmp(t->names[1], "a, b") == 0 && strcmp(t->label_name, "id") == 0 &&
     ((float *)mg_tensor_data(t->x))[2] == 4 && mg_tensor_dtype(t->y) == MG_INT64 &&
     ((int64_t *)mg_tensor_data(t->y))[0] == 9007199254740993LL && ((int64_t *)mg_tensor_data(t->y))[1] == -5);
  mg_csv_table_free(t);
  mg_csv_table_free(NULL);
  says("csv label through mg_read_csv", mg_read_csv(path, &o) == NULL, "a label column needs mg_read_csv_table");
  pick[0].name = "d";
  says("csv unknown name", mg_read_csv_table(path, &o) == NULL,
       "option 'columns', item 1: no column is named 'd'; the header names 'a, b', 'c', 'id'");
  o.header = -1;
  says("csv name without a header", mg_read_csv_table(path, &o) == NULL, "but the file has no header");
  write_file(path, "x,y\n1,2.5\n", 10);
  mg_csv_options half = {.label = {NULL, 2}, .label_dtype = MG_INT64};
  says("csv int64 label not an integer", mg_read_csv_table(path, &half) == NULL,
       "line 2, column 2: '2.5' is not an integer (the label is read as int64)");
}

static void datasets (const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/labels.idx", dir);
  write_file(path, "\0\0\x08\x01\0\0\0\x03\x07\x00\x09", 11);
  mg_tensor *y = mg_read_idx(path, -1);
  ok("idx labels", y && mg_tensor_dtype(y) == MG_INT64 && mg_tensor_numel(y) == 3 &&
     ((int64_t *)mg_tensor_data(y))[2] == 9);
  mg_tensor_release(y);
  y = mg_read_idx(path, MG_FLOAT64);
  ok("idx as float64", y && mg_tensor_dtype(y) == MG_FLOAT64 && ((double *)mg_tensor_data(y))[0] == 7);
  mg_tensor_release(y);
  write_file(path, "\0\1\x08\x01", 4);
  says("idx magic", mg_read_idx(path, -1) == NULL, "wrong magic number 0x00010801");
  says("idx bool", mg_read_idx(path, MG_BOOL) == NULL, "is not one to read into");

  snprintf(path, sizeof path, "%s/a.csv", dir);
  write_file(path, "x;y\n1;2\n3;4\n", 12);
  mg_csv_options o = {.delimiter = ';', .header = 1, .dtype = MG_FLOAT64};
  mg_tensor *c = mg_read_csv(path, &o);
  ok("csv", c && mg_tensor_shape(c)[0] == 2 && mg_tensor_shape(c)[1] == 2 && ((double *)mg_tensor_data(c))[3] == 4);
  mg_tensor_release(c);
  mg_csv_options none = {.delimiter = ';', .header = -1, .dtype = MG_FLOAT64};
  says("csv header refused", mg_read_csv(path, &none) == NULL,
       "line 1, column 1: 'x' is not a number (a header line? pass {header = true})");
  says("csv ';' read with ','", mg_read_csv(path, NULL) == NULL, "line 2, column 1: '1;2' is not a number");
  csv_table(dir);
  says("csv from a device", mg_read_csv("/dev/null", NULL) == NULL,
       "read_csv: '/dev/null': is a character device, not a regular file");
  says("idx from a directory", mg_read_idx(dir, -1) == NULL, "is a directory, not a regular file");
}

int main (void) {
  char dir[] = "/tmp/moongrad-io-test-XXXXXX";
  if (mkdtemp(dir) == NULL) {
    perror("io_test: mkdtemp");
    return 1;
  }
  safetensors(dir);
  datasets(dir);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "io_test: could not remove %s\n", dir);
  mg_memory_stats m = mg_memory_stats_get();
  ok("no tensor left", m.live_tensors == 0);
  if (failures) {
    fprintf(stderr, "io_test: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  printf("io_test: %d checks passed\n", checks);
  return 0;
}

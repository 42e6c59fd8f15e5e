/*
** safetensors.c — the Hugging Face safetensors format, written and read.
**
** A file is 8 bytes, the little-endian length N of a JSON header; then N
** bytes of JSON:
**   {"__metadata__": {"key": "value"},
**    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
** padded with spaces; then the tensors' bytes, little-endian, in C order, at
** [begin, end) counted from the end of the header. The offsets tile the
** byte buffer exactly: no gap, no overlap, nothing after the last tensor.
**
** Writing goes to a temporary file in the target's directory, which is
** fsynced and then renamed over the target: a reader sees the old file or
** the new one, and a crash mid-save leaves the old file as it was. The
** target is a regular file (whose permissions the new one keeps) or a new
** name: a FIFO or a device is refused, never replaced by the rename. The
** header lists the tensors in the order given; their bytes are laid out by
** element size (8-byte dtypes first), so each is aligned to its element in
** a mapped file, as the format's own writer does.
**
** Reading opens regular files only (a FIFO is refused without waiting),
** checks the whole header (JSON through cJSON, no NUL in any string, dtypes,
** shapes against offsets, the tiling, duplicate names) before it allocates,
** then reads every tensor or hands back none.
*/
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/io.h"

#define MAX_HEADER    100000000     /* the format's own limit on N */
#define MAX_EXACT     9007199254740992.0     /* 2^53: JSON numbers read exactly */

static const struct { const char *code; mg_dtype dt; } codes[] = {
  {"F32", MG_FLOAT32}, {"F64", MG_FLOAT64}, {"I64", MG_INT64},
  {"BOOL", MG_BOOL}, {"F16", MG_FLOAT16}, {"BF16", MG_BFLOAT16},
};
#define NCODES ((int)(sizeof codes / sizeof codes[0]))

static const char *code_of (mg_dtype dt) {
  for (int i = 0; i < NCODES; i++) if (codes[i].dt == dt) return codes[i].code;
  return NULL;
}

/* is s (n bytes) valid UTF-8? JSON text must be */
static bool valid_utf8 (const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    int extra = *p < 0x80 ? 0 : (*p >> 5) == 6 ? 1 : (*p >> 4) == 14 ? 2 : (*p >> 3) == 30 ? 3 : -1;
    if (extra < 0) return false;
    unsigned cp = extra == 0 ? *p : *p & (0x3F >> extra);
    for (int k = 1; k <= extra; k++) {
      if ((p[k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[k] & 0x3F);
    }
    if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    p += extra + 1;
  }
  return true;
}

static int compare_strings (const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* the first name given twice among names[0..n), or NULL; scratch holds n pointers */
static const char *duplicate (const char *const *names, int n, const char **scratch) {
  if (n < 2) return NULL;
  memcpy(scratch, names, sizeof(char *) * (size_t)n);
  qsort(scratch, (size_t)n, sizeof(char *), compare_strings);
  for (int i = 1; i < n; i++) if (strcmp(scratch[i - 1], scratch[i]) == 0) return scratch[i];
  return NULL;
}


/* {========================== writing ========================== */

static const char *const SAVE = "save_safetensors";

/* writes n bytes, retrying short writes */
static int write_all (int fd, const void *buf, size_t n) {
  const char *p = (const char *)buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* a tensor's bytes, little-endian (swapped through a small buffer on a big-endian host) */
static int write_data (int fd, const void *data, int64_t n, size_t esize) {
  if (!MG_HOST_BIG_ENDIAN || esize == 1) return write_all(fd, data, (size_t)n * esize);
  unsigned char buf[1 << 16];
  int64_t per = (int64_t)(sizeof buf / esize);
  for (int64_t i = 0; i < n; i += per) {
    int64_t k = n - i < per ? n - i : per;
    memcpy(buf, (const char *)data + (size_t)i * esize, (size_t)k * esize);
    mg_io_swap(buf, k, esize);
    if (write_all(fd, buf, (size_t)k * esize) != 0) return -1;
  }
  return 0;
}

/* Creates ".<name>.tmp-<pid>-<k>" beside path (O_EXCL: never someone
** else's), mode 0666 less the umask as for any new file. */
static int open_temp (const char *path, char **tmp) {
  static atomic_uint counter;
  const char *slash = strrchr(path, '/');
  size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0, n = strlen(path) + 64;
  *tmp = (char *)malloc(n);
  if (*tmp == NULL) {
    errno = ENOMEM;
    return -1;
  }
  for (int attempt = 0; attempt < 1000; attempt++) {
    snprintf(*tmp, n, "%.*s.%s.tmp-%ld-%u", (int)dirlen, path, path + dirlen, (long)getpid(),
             atomic_fetch_add(&counter, 1u));
    int fd = open(*tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

/* fsync the directory holding path, so the rename itself is durable (best effort) */
static void sync_dir (const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (slash == NULL) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

/* the header's JSON text (cJSON's), or NULL + error */
static char *header_json (const char *path, int n, const char *const *names, mg_tensor *const *tensors,
                          const int64_t *begin, int nmeta, const char *const *keys,
                          const char *const *values) {
  cJSON *root = cJSON_CreateObject();
  bool ok = root != NULL;
  if (ok && nmeta > 0) {
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    ok = meta != NULL;
    for (int i = 0; ok && i < nmeta; i++) ok = cJSON_AddStringToObject(meta, keys[i], values[i]) != NULL;
  }
  for (int i = 0; ok && i < n; i++) {
    const mg_tensor *t = tensors[i];
    cJSON *e = cJSON_AddObjectToObject(root, names[i]);
    ok = e && cJSON_AddStringToObject(e, "dtype", code_of(t->dtype));
    cJSON *shape = ok ? cJSON_AddArrayToObject(e, "shape") : NULL;
    ok = shape != NULL;
    char num[32];
    for (int d = 0; ok && d < t->ndim; d++) {             /* exact integers, whatever their size */
      snprintf(num, sizeof num, "%" PRId64, t->shape[d]);
      ok = cJSON_AddItemToArray(shape, cJSON_CreateRaw(num));
    }
    cJSON *offs = ok ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
    int64_t end = begin[i] + t->numel * (int64_t)mg_dtype_size(t->dtype);
    ok = offs != NULL;
    snprintf(num, sizeof num, "%" PRId64, begin[i]);
    ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateRaw(num));
    snprintf(num, sizeof num, "%" PRId64, end);
    ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateRaw(num));
  }
  char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (text == NULL) mg_io_error(SAVE, path, "out of memory building the header");
  return text;
}

/* the arguments' problem, or MG_OK */
static mg_status check_save_args (const char *path, int n, const char *const *names,
                                  mg_tensor *const *tensors, int nmeta, const char *const *keys,
                                  const char *const *values) {
  if (n < 0 || nmeta < 0) return mg_io_error(SAVE, path, "negative count (%d tensors, %d metadata)", n, nmeta);
  if (n > 0 && names == NULL) return mg_null_arg(SAVE, "names");
  if (n > 0 && tensors == NULL) return mg_null_arg(SAVE, "tensors");
  if (nmeta > 0 && (keys == NULL || values == NULL)) return mg_null_arg(SAVE, keys ? "meta_values" : "meta_keys");
  for (int i = 0; i < n; i++) {
    if (names[i] == NULL) return mg_io_error(SAVE, path, "names[%d] is NULL", i);
    if (tensors[i] == NULL) return mg_io_error(SAVE, path, "tensor '%s' is NULL", names[i]);
    if (strcmp(names[i], "__metadata__") == 0)
      return mg_io_error(SAVE, path, "'__metadata__' is reserved for the metadata, not a tensor name");
    if (!valid_utf8(names[i])) return mg_io_error(SAVE, path, "tensor name '%s' is not valid UTF-8", names[i]);
    if (code_of(tensors[i]->dtype) == NULL)
      return mg_io_error(SAVE, path, "tensor '%s' has dtype %d, which has no safetensors code", names[i],
                         (int)tensors[i]->dtype);
  }
  for (int i = 0; i < nmeta; i++) {
    if (keys[i] == NULL || values[i] == NULL)
      return mg_io_error(SAVE, path, "metadata entry %d has a NULL %s", i, keys[i] ? "value" : "key");
    if (!valid_utf8(keys[i]) || !valid_utf8(values[i]))
      return mg_io_error(SAVE, path, "metadata '%s' is not valid UTF-8", keys[i]);
  }
  const char **scratch = (const char **)malloc(sizeof(char *) * (size_t)(n > nmeta ? n : nmeta) + 1);
  if (scratch == NULL) return mg_io_error(SAVE, path, "out of memory");
  const char *dup = duplicate(names, n, scratch);
  const char *mdup = dup ? NULL : duplicate(keys, nmeta, scratch);
  mg_status st = MG_OK;
  if (dup) st = mg_io_error(SAVE, path, "the name '%s' is given to two tensors", dup);
  else if (mdup) st = mg_io_error(SAVE, path, "the metadata key '%s' is given twice", mdup);
  free(scratch);
  return st;
}

mg_status mg_save_safetensors (const char *path, int n, const char *const *names,
                               mg_tensor *const *tensors, int nmeta, const char *const *meta_keys,
                               const char *const *meta_values) {
  char eb[128];
  if (path == NULL) return mg_null_arg(SAVE, "path");
  if (check_save_args(path, n, names, tensors, nmeta, meta_keys, meta_values) != MG_OK) return MG_ERR;
  int mode;                                         /* the replaced file's permissions, or -1 */
  if (mg_io_check_target(SAVE, path, &mode) != MG_OK) return MG_ERR;   /* a FIFO, a device: left alone */

  /* the data's layout: by element size, 8 bytes first, stable */
  int *order = (int *)malloc(sizeof(int) * (size_t)n + 1);
  int64_t *begin = (int64_t *)malloc(sizeof(int64_t) * (size_t)n + 1);
  char *text = NULL, *tmp = NULL;
  int fd = -1;
  bool created = false;
  if (order == NULL || begin == NULL) {
    mg_io_error(SAVE, path, "out of memory");
    goto fail;
  }
  int k = 0;
  int64_t offset = 0;
  for (size_t size = 8; size >= 1; size /= 2)
    for (int i = 0; i < n; i++)
      if (mg_dtype_size(tensors[i]->dtype) == size) {
        order[k++] = i;
        begin[i] = offset;
        offset += tensors[i]->numel * (int64_t)size;
      }
  text = header_json(path, n, names, tensors, begin, nmeta, meta_keys, meta_values);
  if (text == NULL) goto fail;
  size_t len = strlen(text), padded = (len + 7) / 8 * 8;
  unsigned char head[8];
  for (int b = 0; b < 8; b++) head[b] = (unsigned char)((uint64_t)padded >> (8 * b));

  fd = open_temp(path, &tmp);
  if (fd < 0) {
    const char *slash = strrchr(path, '/');
    int e = errno;
    mg_io_error(SAVE, path, "cannot create a temporary file in '%.*s': %s",
                slash ? (int)(slash - path + (slash == path)) : 1, slash ? path : ".",
                mg_io_strerror(e, eb, sizeof eb));
    goto fail;
  }
  created = true;
  if (mode >= 0) fchmod(fd, (mode_t)(mode & 0777));   /* a private file stays private (best effort) */
  if (write_all(fd, head, 8) != 0 || write_all(fd, text, len) != 0 ||
      write_all(fd, "        ", padded - len) != 0)
    goto write_failed;
  for (int j = 0; j < n; j++) {
    mg_tensor *t = tensors[order[j]];
    if (t->numel == 0) continue;
    mg_tensor *c = mg_contiguous(t);                /* one copy at a time, when not contiguous */
    if (c == NULL) {
      char why[300];
      snprintf(why, sizeof why, "%s", mg_errmsg_raw());
      mg_io_error(SAVE, path, "tensor '%s': %s", names[order[j]], why);
      goto fail;
    }
    int r = write_data(fd, mg_ptr(c), c->numel, mg_dtype_size(c->dtype));
    mg_tensor_release(c);
    if (r != 0) goto write_failed;
  }
  if (fsync(fd) != 0) goto write_failed;
  int cr = close(fd);
  fd = -1;
  if (cr != 0) goto write_failed;
  if (rename(tmp, path) != 0) {
    int e = errno;
    mg_io_error(SAVE, path, "cannot replace the file: %s", mg_io_strerror(e, eb, sizeof eb));
    goto fail;
  }
  sync_dir(path);
  free(tmp);
  cJSON_free(text);
  free(order);
  free(begin);
  return MG_OK;

write_failed: {
    int e = errno;
    mg_io_error(SAVE, path, "writing the temporary file '%s' failed: %s", tmp,
                mg_io_strerror(e, eb, sizeof eb));
  }
fail:
  if (fd >= 0) close(fd);
  if (created) unlink(tmp);                         /* the old file, if any, is untouched */
  free(tmp);
  cJSON_free(text);
  free(order);
  free(begin);
  return MG_ERR;
}

/* }========================================================== */


/* {========================== reading ========================== */

static const char *const LOAD = "load_safetensors";

typedef struct entry {
  const char *name;
  mg_dtype dt;
  int ndim;
  int64_t shape[MG_MAX_DIMS];
  int64_t begin, end;
} entry;

/* a JSON number that is a whole number in [0, 2^53], into *v */
static bool whole (const cJSON *j, int64_t *v) {
  if (!cJSON_IsNumber(j)) return false;
  double d = j->valuedouble;
  if (!(d >= 0 && d <= MAX_EXACT) || d != (double)(int64_t)d) return false;
  *v = (int64_t)d;
  return true;
}

static const char *json_kind (const cJSON *j) {
  return cJSON_IsString(j) ? "a string" : cJSON_IsNumber(j) ? "a number" : cJSON_IsArray(j) ? "an array"
       : cJSON_IsObject(j) ? "an object" : cJSON_IsBool(j) ? "a boolean" : "null";
}

/* one tensor's header entry, checked, into e */
static mg_status parse_entry (const char *path, const cJSON *j, entry *e, int64_t datasize) {
  const char *name = e->name;
  if (!cJSON_IsObject(j))
    return mg_io_error(LOAD, path, "tensor '%s': its header entry is %s, not an object", name, json_kind(j));
  const cJSON *dtype = NULL, *shape = NULL, *offs = NULL, *f;
  cJSON_ArrayForEach(f, j) {
    const cJSON **slot = strcmp(f->string, "dtype") == 0 ? &dtype : strcmp(f->string, "shape") == 0 ? &shape
                       : strcmp(f->string, "data_offsets") == 0 ? &offs : NULL;
    if (slot == NULL)
      return mg_io_error(LOAD, path, "tensor '%s': unknown field '%s' (a tensor has dtype, shape and "
                         "data_offsets)", name, f->string);
    if (*slot) return mg_io_error(LOAD, path, "tensor '%s': field '%s' is given twice", name, f->string);
    *slot = f;
  }
  if (!dtype || !shape || !offs)
    return mg_io_error(LOAD, path, "tensor '%s': the field '%s' is missing", name,
                       !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
  if (!cJSON_IsString(dtype))
    return mg_io_error(LOAD, path, "tensor '%s': dtype is %s, not a string", name, json_kind(dtype));
  int c = 0;
  while (c < NCODES && strcmp(codes[c].code, dtype->valuestring) != 0) c++;
  if (c == NCODES)
    return mg_io_error(LOAD, path, "tensor '%s': dtype '%.40s' is not supported (moongrad reads F32, F64, "
                       "I64, BOOL, F16 and BF16)", name, dtype->valuestring);
  e->dt = codes[c].dt;
  if (!cJSON_IsArray(shape))
    return mg_io_error(LOAD, path, "tensor '%s': shape is %s, not an array", name, json_kind(shape));
  int nd = cJSON_GetArraySize(shape);
  if (nd > MG_MAX_DIMS)
    return mg_io_error(LOAD, path, "tensor '%s': %d dimensions, moongrad takes at most %d", name, nd, MG_MAX_DIMS);
  e->ndim = 0;
  cJSON_ArrayForEach(f, shape) {
    if (!whole(f, &e->shape[e->ndim]))
      return mg_io_error(LOAD, path, "tensor '%s': shape entry %d is not a whole number >= 0", name, e->ndim + 1);
    e->ndim++;
  }
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !whole(offs->child, &e->begin) ||
      !whole(offs->child->next, &e->end))
    return mg_io_error(LOAD, path, "tensor '%s': data_offsets must be [begin, end], two whole numbers", name);
  if (e->begin > e->end)
    return mg_io_error(LOAD, path, "tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] end before they begin",
                       name, e->begin, e->end);
  if (e->end > datasize)
    return mg_io_error(LOAD, path, "tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] run past the end of "
                       "the data (%" PRId64 " bytes)", name, e->begin, e->end, datasize);
  /* the bytes the shape needs, which must be exactly what the offsets hold */
  const int64_t cap = INT64_C(1) << 62;                    /* no overflow: beyond it, "more than" */
  int64_t need = (int64_t)mg_dtype_size(e->dt), have = e->end - e->begin;
  bool over = false;
  for (int d = 0; d < e->ndim; d++) if (e->shape[d] == 0) need = 0;
  for (int d = 0; d < e->ndim && need > 0 && !over; d++) {
    if (need > cap / e->shape[d]) over = true;
    else need *= e->shape[d];
  }
  if (over || need != have) {
    char sh[160];
    mg_shape_str(sh, sizeof sh, e->shape, e->ndim);
    return mg_io_error(LOAD, path, "tensor '%s': shape %s %s needs %s%" PRId64 " bytes, but data_offsets "
                       "[%" PRId64 ", %" PRId64 "] hold %" PRId64, name, sh, codes[c].code,
                       over ? "more than " : "", over ? cap : need, e->begin, e->end, have);
  }
  return MG_OK;
}

static int compare_offsets (const void *a, const void *b) {
  const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* the entries tile [0, datasize): sorted by offset, each begins where the last ended */
static mg_status check_tiling (const char *path, entry **by, int n, int64_t datasize) {
  qsort(by, (size_t)n, sizeof(entry *), compare_offsets);
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    const entry *e = by[i];
    if (e->begin < at)
      return mg_io_error(LOAD, path, "tensors '%s' and '%s' overlap (data_offsets [%" PRId64 ", %" PRId64
                         "] and [%" PRId64 ", %" PRId64 "])", by[i - 1]->name, e->name, by[i - 1]->begin,
                         by[i - 1]->end, e->begin, e->end);
    if (e->begin > at)
      return mg_io_error(LOAD, path, "a gap of %" PRId64 " bytes before tensor '%s' (data_offsets [%" PRId64
                         ", %" PRId64 "]): no tensor holds bytes %" PRId64 " to %" PRId64, e->begin - at,
                         e->name, e->begin, e->end, at, e->begin);
    at = e->end;
  }
  if (at != datasize)
    return mg_io_error(LOAD, path, "the data is %" PRId64 " bytes but the tensors hold %" PRId64 "; the "
                       "rest belongs to no tensor", datasize, at);
  return MG_OK;
}

void mg_named_tensors_free (mg_named_tensors *f) {
  if (f == NULL) return;
  for (int i = 0; i < f->n; i++) {
    free(f->names[i]);
    mg_tensor_release(f->tensors[i]);
  }
  for (int i = 0; i < f->nmeta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->names);
  free(f->tensors);
  free(f->meta_keys);
  free(f->meta_values);
  free(f);
}

static char *dup_string (const char *s) {
  size_t n = strlen(s) + 1;
  char *d = (char *)malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* the metadata object into f */
static mg_status parse_metadata (const char *path, const cJSON *meta, mg_named_tensors *f) {
  if (!cJSON_IsObject(meta))
    return mg_io_error(LOAD, path, "__metadata__ is %s, not an object of strings", json_kind(meta));
  int n = cJSON_GetArraySize(meta);
  f->meta_keys = (char **)calloc((size_t)n + 1, sizeof(char *));
  f->meta_values = (char **)calloc((size_t)n + 1, sizeof(char *));
  if (f->meta_keys == NULL || f->meta_values == NULL) return mg_io_error(LOAD, path, "out of memory");
  const cJSON *m;
  cJSON_ArrayForEach(m, meta) {
    if (!cJSON_IsString(m))
      return mg_io_error(LOAD, path, "__metadata__ '%s' is %s, not a string", m->string, json_kind(m));
    int i = f->nmeta++;
    f->meta_keys[i] = dup_string(m->string);
    f->meta_values[i] = dup_string(m->valuestring);
    if (f->meta_keys[i] == NULL || f->meta_values[i] == NULL) return mg_io_error(LOAD, path, "out of memory");
  }
  const char **scratch = (const char **)malloc(sizeof(char *) * (size_t)n + 1);
  if (scratch == NULL) return mg_io_error(LOAD, path, "out of memory");
  const char *dup = duplicate((const char *const *)f->meta_keys, f->nmeta, scratch);
  mg_status st = dup ? mg_io_error(LOAD, path, "__metadata__ has the key '%s' twice", dup) : MG_OK;
  free(scratch);
  return st;
}

/* the header (the JSON text h, n bytes) checked into f's names and entries */
static mg_status parse_header (const char *path, const char *h, size_t n, int64_t datasize,
                               mg_named_tensors *f, entry **entries) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(h, n, &end, 0);
  if (root == NULL) {
    size_t at = end && end >= h && end <= h + n ? (size_t)(end - h) : 0;
    return mg_io_error(LOAD, path, "the header is not valid JSON (at byte %zu of %zu: '%.20s')", at, n, h + at);
  }
  mg_status st = MG_OK;
  for (const char *p = end; p < h + n && st == MG_OK; p++)     /* the format pads with spaces */
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
      st = mg_io_error(LOAD, path, "the header has bytes after its JSON object (at byte %zu)", (size_t)(p - h));
  if (st == MG_OK && !cJSON_IsObject(root))
    st = mg_io_error(LOAD, path, "the header is %s, not a JSON object", json_kind(root));
  int count = 0;
  const cJSON *j, *meta = NULL;
  if (st == MG_OK) {
    cJSON_ArrayForEach(j, root) {
      if (strcmp(j->string, "__metadata__") != 0) count++;
      else if (meta) st = mg_io_error(LOAD, path, "__metadata__ is given twice");
      else meta = j;
    }
  }
  if (st == MG_OK && meta) st = parse_metadata(path, meta, f);
  entry *es = NULL;
  if (st == MG_OK) {
    es = (entry *)calloc((size_t)count + 1, sizeof(entry));
    f->names = (char **)calloc((size_t)count + 1, sizeof(char *));
    f->tensors = (mg_tensor **)calloc((size_t)count + 1, sizeof(mg_tensor *));
    if (es == NULL || f->names == NULL || f->tensors == NULL) st = mg_io_error(LOAD, path, "out of memory");
  }
  if (st == MG_OK) {
    cJSON_ArrayForEach(j, root) {
      if (j == meta) continue;
      int i = f->n;
      if ((f->names[i] = dup_string(j->string)) == NULL) {
        st = mg_io_error(LOAD, path, "out of memory");
        break;
      }
      f->n++;
      es[i].name = f->names[i];
      if ((st = parse_entry(path, j, &es[i], datasize)) != MG_OK) break;
    }
  }
  cJSON_Delete(root);
  *entries = es;
  return st;
}

/* reads the data into tensors made for the entries, in the order of their
** offsets (by); the stream is at the first byte of the data */
static mg_status read_data (const char *path, FILE *fp, entry *es, entry **by, mg_named_tensors *f) {
  for (int i = 0; i < f->n; i++) {
    if ((f->tensors[i] = mg_empty(es[i].shape, es[i].ndim, es[i].dt)) == NULL) {
      char why[300];
      snprintf(why, sizeof why, "%s", mg_errmsg_raw());
      return mg_io_error(LOAD, path, "tensor '%s': %s", es[i].name, why);
    }
  }
  for (int k = 0; k < f->n; k++) {
    const entry *e = by[k];
    mg_tensor *t = f->tensors[e - es];
    size_t nbytes = (size_t)(e->end - e->begin);
    if (nbytes > 0 && fread(mg_ptr(t), 1, nbytes, fp) != nbytes)
      return mg_io_error(LOAD, path, "tensor '%s': %s", e->name,
                         ferror(fp) ? "a read error" : "the file ended early (was it changed while read?)");
    if (MG_HOST_BIG_ENDIAN) mg_io_swap(mg_ptr(t), t->numel, mg_dtype_size(t->dtype));
    if (t->dtype == MG_BOOL) {                      /* one byte each: 0 or 1 */
      unsigned char *b = (unsigned char *)mg_ptr(t);
      for (int64_t q = 0; q < t->numel; q++) b[q] = b[q] != 0;
    }
  }
  return MG_OK;
}

/* the offset of the first NUL in the header's strings (a raw NUL byte, or
** the escape \u0000 that cJSON would decode into one and so cut a name
** short), or -1; h is n bytes */
static int64_t find_nul (const char *h, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (h[i] == '\0') return (int64_t)i;
    if (h[i] != '\\' || i + 1 >= n) continue;
    if (h[i + 1] == 'u' && i + 5 < n && memcmp(h + i + 2, "0000", 4) == 0) return (int64_t)i;
    i++;                                            /* the escaped character: "\\u0000" is no NUL */
  }
  return -1;
}

mg_named_tensors *mg_load_safetensors (const char *path) {
  if (path == NULL) return mg_null_arg(LOAD, "path"), NULL;
  int64_t size = 0;
  int fd = mg_io_open_regular(LOAD, path, &size);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "rb");
  if (fp == NULL) {
    close(fd);
    return mg_io_error(LOAD, path, "cannot open: out of memory"), NULL;
  }
  mg_named_tensors *f = (mg_named_tensors *)calloc(1, sizeof(mg_named_tensors));
  char *h = NULL;
  entry *es = NULL, **by = NULL;
  mg_status st = MG_OK;
  unsigned char head[8];
  uint64_t n = 0;
  int64_t nul = -1;
  if (f == NULL) st = mg_io_error(LOAD, path, "out of memory");
  else if (size < 8)
    st = mg_io_error(LOAD, path, "the file is %" PRId64 " bytes, too short for the 8-byte header length "
                     "(not a safetensors file?)", size);
  else if (fread(head, 1, 8, fp) != 8) st = mg_io_error(LOAD, path, "cannot read the header length");
  if (st == MG_OK) {
    for (int b = 7; b >= 0; b--) n = n << 8 | head[b];
    if (n > (uint64_t)(size - 8))
      st = mg_io_error(LOAD, path, "the header length %" PRIu64 " runs past the end of the file (%" PRId64
                       " bytes; truncated, or not a safetensors file?)", n, size);
    else if (n > MAX_HEADER)
      st = mg_io_error(LOAD, path, "the header length %" PRIu64 " is above the format's limit of %d bytes", n,
                       MAX_HEADER);
    else if (n < 2)
      st = mg_io_error(LOAD, path, "the header length %" PRIu64 " is too short for a JSON object", n);
  }
  if (st == MG_OK && (h = (char *)malloc((size_t)n + 1)) == NULL) st = mg_io_error(LOAD, path, "out of memory");
  if (st == MG_OK && fread(h, 1, (size_t)n, fp) != (size_t)n) st = mg_io_error(LOAD, path, "cannot read the header");
  if (st == MG_OK && (nul = find_nul(h, (size_t)n)) >= 0)
    st = mg_io_error(LOAD, path, "the header has a NUL character at byte %" PRId64 "; tensor names and metadata "
                     "cannot hold NUL", nul);
  if (st == MG_OK) {
    h[n] = '\0';
    st = parse_header(path, h, (size_t)n, size - 8 - (int64_t)n, f, &es);
  }
  if (st == MG_OK) {
    const char **scratch = (const char **)malloc(sizeof(char *) * (size_t)f->n + 1);
    by = (entry **)malloc(sizeof(entry *) * (size_t)f->n + 1);
    if (scratch == NULL || by == NULL) st = mg_io_error(LOAD, path, "out of memory");
    const char *dup = st == MG_OK ? duplicate((const char *const *)f->names, f->n, scratch) : NULL;
    if (dup) st = mg_io_error(LOAD, path, "two tensors are named '%s'", dup);
    free(scratch);
  }
  if (st == MG_OK) {
    for (int i = 0; i < f->n; i++) by[i] = &es[i];
    st = check_tiling(path, by, f->n, size - 8 - (int64_t)n);
  }
  if (st == MG_OK) st = read_data(path, fp, es, by, f);
  fclose(fp);
  free(h);
  free(es);
  free(by);
  if (st != MG_OK) {
    mg_named_tensors_free(f);
    return NULL;
  }
  return f;
}

/* }========================================================== */

/*
** replay.c — a main for a harness built without libFuzzer (make
** run-c-tests, by GCC, under make asan with its sanitizers): runs
** LLVMFuzzerTestOneInput once on every file named, or in a folder named
** (its seeds, its reproducers), and prints "<harness>: N inputs". A failed
** oracle aborts; a sanitizer report ends it as under libFuzzer.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);
int LLVMFuzzerInitialize (int *argc, char ***argv) __attribute__((weak));

static int one (const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "replay: cannot open '%s'\n", path);
    exit(2);
  }
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t k; buf && (k = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += k;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  if (buf == NULL) {
    fprintf(stderr, "replay: out of memory reading '%s'\n", path);
    exit(2);
  }
  uint8_t *exact = malloc(n ? n : 1);                  /* its own size: overreads show */
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 1;
}

static int compare (const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* every file of dir, in name order; how many */
static int folder (const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return 0;                             /* none yet: no reproducers */
  char **names = NULL;
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    names = realloc(names, (n + 1) * sizeof *names);
    if (asprintf(&names[n], "%s/%s", dir, e->d_name) < 0) exit(2);
    n++;
  }
  closedir(d);
  if (n > 1) qsort(names, n, sizeof *names, compare);
  int count = 0;
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) count += one(names[i]);
    free(names[i]);
  }
  free(names);
  return count;
}

int main (int argc, char **argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  int count = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    count += stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode) ? folder(argv[i]) : one(argv[i]);
  }
  const char *name = strrchr(argv[0], '/');
  printf("%s: %d inputs\n", name ? name + 1 : argv[0], count);
  return 0;
}

/*
** install.c — moongrad --install-kernel [--user] [--prefix P]: writes the
** kernelspec (a folder "moongrad" holding kernel.json) where Jupyter looks
** for kernels, as `jupyter kernelspec install` would:
**
**   --user      $JUPYTER_DATA_DIR/kernels, else $XDG_DATA_HOME/jupyter/kernels,
**               else ~/.local/share/jupyter/kernels
**   --prefix P  P/share/jupyter/kernels
**   neither     /usr/local/share/jupyter/kernels (system-wide)
**
** kernel.json runs this very binary (its absolute path) with --kernel.
*/
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kernel/kernel.h"

#define DISPLAY_NAME "moongrad (Lua 5.4)"

/* mkdir -p; 0 or -1 (errno set) */
static int mkdirs (char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    int rc = mkdir(path, 0755);
    *p = '/';
    if (rc != 0 && errno != EEXIST) return -1;
  }
  return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* the kernels folder the options name, into dir */
static int kernels_dir (int user, const char *prefix, char *dir, size_t n) {
  const char *env;
  if (prefix) return snprintf(dir, n, "%s/share/jupyter/kernels", prefix);
  if (!user) return snprintf(dir, n, "/usr/local/share/jupyter/kernels");
  if ((env = getenv("JUPYTER_DATA_DIR")) && env[0]) return snprintf(dir, n, "%s/kernels", env);
  if ((env = getenv("XDG_DATA_HOME")) && env[0]) return snprintf(dir, n, "%s/jupyter/kernels", env);
  if ((env = getenv("HOME")) && env[0]) return snprintf(dir, n, "%s/.local/share/jupyter/kernels", env);
  fprintf(stderr, "moongrad --install-kernel: --user needs $HOME (or $JUPYTER_DATA_DIR)\n");
  return -1;
}

static char *spec_json (const char *exe) {
  cJSON *j = cJSON_CreateObject();
  cJSON *argv = cJSON_AddArrayToObject(j, "argv");
  cJSON_AddItemToArray(argv, cJSON_CreateString(exe));
  cJSON_AddItemToArray(argv, cJSON_CreateString("--kernel"));
  cJSON_AddItemToArray(argv, cJSON_CreateString("{connection_file}"));
  cJSON_AddStringToObject(j, "display_name", DISPLAY_NAME);
  cJSON_AddStringToObject(j, "language", "lua");
  cJSON_AddStringToObject(j, "interrupt_mode", "signal");
  cJSON_AddItemToObject(j, "metadata", cJSON_CreateObject());
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  return s;
}

int mg_kernel_install (int argc, char **argv) {
  int user = 0;
  const char *prefix = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--user") == 0) user = 1;
    else if (strcmp(argv[i], "--prefix") == 0 && i + 1 < argc) prefix = argv[++i];
    else {
      fprintf(stderr, "moongrad --install-kernel: unknown option '%s'\n"
                      "usage: moongrad --install-kernel [--user] [--prefix PREFIX]\n", argv[i]);
      return -1;
    }
  }
  if (user && prefix) {
    fprintf(stderr, "moongrad --install-kernel: --user and --prefix are two different places: give one\n");
    return -1;
  }
  char exe[PATH_MAX], dir[PATH_MAX], file[PATH_MAX + 16];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) {
    fprintf(stderr, "moongrad --install-kernel: cannot find this program's path (%s)\n", strerror(errno));
    return -1;
  }
  exe[k] = '\0';
  int n = kernels_dir(user, prefix, dir, sizeof dir - sizeof "/moongrad");
  if (n < 0 || (size_t)n >= sizeof dir - sizeof "/moongrad") return -1;
  strcat(dir, "/moongrad");
  if (mkdirs(dir) != 0) {
    fprintf(stderr, "moongrad --install-kernel: cannot create '%s' (%s)%s\n", dir, strerror(errno),
            user || prefix ? "" : "; --user installs for you alone");
    return -1;
  }
  snprintf(file, sizeof file, "%s/kernel.json", dir);
  char *json = spec_json(exe);
  FILE *f = json ? fopen(file, "w") : NULL;
  int ok = f != NULL && fputs(json, f) >= 0 && fputc('\n', f) != EOF;
  if (f != NULL && fclose(f) != 0) ok = 0;
  free(json);
  if (!ok) {
    fprintf(stderr, "moongrad --install-kernel: cannot write '%s' (%s)\n", file, strerror(errno));
    return -1;
  }
  printf("installed the kernel \"%s\" in %s\n(jupyter notebook and jupyter lab list it now)\n", DISPLAY_NAME, dir);
  return 0;
}

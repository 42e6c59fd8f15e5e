/*
** spill.c — the offload hooks: what a tape saves, written to a file and
** mapped back read-only, so its bytes leave the process's tensor memory
** and come back page by page when the backward reads them.
**
** Spilled tensors share one unlinked file per directory, whose space is
** reused from one tensor to the next and one step to the next: writing over
** pages the file already has is a copy, where a new file's pages are each
** allocated and reserved by the filesystem first (on ext4, 128 MiB in 15 ms
** against 47 ms, and a new file's write stalled for hundreds of ms at
** times). The file is unlinked at once, so nothing is left behind; it stays
** open, at the most that was spilled at once, until mg_spill_release_idle
** (mg.memory.release_cache) finds nothing spilled in it, or the process ends;
** or until another directory is taken into use while those of KEEP_IDLE
** directories used since lie idle (a new directory each step must not leave
** a file descriptor and its disk space behind for good).
*/
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "autodiff.h"

typedef struct extent { size_t off, len; } extent;

typedef struct spill_file {
  char *dir;
  bool seen;                   /* dev and ino name the directory ("/tmp", "/tmp/", "/var/../tmp") */
  dev_t dev;
  ino_t ino;
  int fd;                      /* -1 until the first spill makes the file */
  int refs;                    /* pushes of the hooks and spilled tensors */
  size_t end;                  /* the file's length */
  extent *free;                /* [nfree], by offset, none adjacent */
  size_t nfree, capfree;
  struct spill_file *next;
} spill_file;

/* the files by directory, the last used first; one lock for the list and
** every file's space (held for bookkeeping only, never while writing) */
static spill_file *files;
enum { KEEP_IDLE = 4 };
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void file_close (spill_file *f) {
  if (f->fd >= 0) close(f->fd);
  free(f->free);
  free(f->dir);
  free(f);
}

/* {====================== a file's space ====================== */

/* the offset of len bytes: a free extent's (the first that fits), or the
** file's end */
static size_t take_space (spill_file *f, size_t len) {
  for (size_t i = 0; i < f->nfree; i++) {
    extent *e = &f->free[i];
    if (e->len < len) continue;
    size_t off = e->off;
    e->off += len;
    e->len -= len;
    if (e->len == 0) memmove(e, e + 1, (f->nfree - i - 1) * sizeof *e), f->nfree--;
    return off;
  }
  f->end += len;
  return f->end - len;
}

/* gives [off, off + len) back, merged with its neighbours; a free list that
** cannot grow loses the extent (the file only keeps a hole) */
static void give_space (spill_file *f, size_t off, size_t len) {
  size_t i = 0;
  while (i < f->nfree && f->free[i].off < off) i++;
  bool after_prev = i > 0 && f->free[i - 1].off + f->free[i - 1].len == off;
  bool before_next = i < f->nfree && off + len == f->free[i].off;
  if (after_prev && before_next) {
    f->free[i - 1].len += len + f->free[i].len;
    memmove(&f->free[i], &f->free[i + 1], (f->nfree - i - 1) * sizeof *f->free);
    f->nfree--;
  } else if (after_prev) {
    f->free[i - 1].len += len;
  } else if (before_next) {
    f->free[i].off = off;
    f->free[i].len += len;
  } else {
    if (f->nfree == f->capfree) {
      size_t cap = f->capfree ? 2 * f->capfree : 16;
      extent *grown = (extent *)realloc(f->free, cap * sizeof *grown);
      if (grown == NULL) return;
      f->free = grown;
      f->capfree = cap;
    }
    memmove(&f->free[i + 1], &f->free[i], (f->nfree - i) * sizeof *f->free);
    f->free[i] = (extent){off, len};
    f->nfree++;
  }
}

/* }========================================================== */


/* {==================== the files, shared ===================== */

/* one holder fewer (the hooks' release, and each mapping's end) */
static void release_dir (void *ud) {
  pthread_mutex_lock(&lock);
  ((spill_file *)ud)->refs--;
  pthread_mutex_unlock(&lock);
}

/* closes the idle files past the first `keep` of the list (under the lock) */
static void close_idle (size_t keep) {
  size_t seen = 0;
  for (spill_file **p = &files; *p;) {
    spill_file *f = *p;
    if (f->refs == 0 && seen++ >= keep) {
      *p = f->next;
      file_close(f);
    } else {
      p = &f->next;
    }
  }
}

/* a directory's entry, with no file yet; NULL when out of memory */
static spill_file *file_new (const char *dir, const struct stat *st) {
  spill_file *f = (spill_file *)calloc(1, sizeof *f);
  if (f && (f->dir = strdup(dir)) == NULL) {
    free(f);
    return NULL;
  }
  if (f) *f = (spill_file){.dir = f->dir, .seen = st != NULL, .dev = st ? st->st_dev : 0,
                           .ino = st ? st->st_ino : 0, .fd = -1};
  return f;
}

/* is f the directory dir (st: its stat, or NULL when it has none)? */
static bool same_dir (const spill_file *f, const char *dir, const struct stat *st) {
  if (st && f->seen) return f->dev == st->st_dev && f->ino == st->st_ino;
  return !st && !f->seen && strcmp(f->dir, dir) == 0;
}

void *mg_hooks_offload_dir (const char *dir) {
  MG_CHECK_ARG("mg_hooks_offload_dir", dir, NULL);
  struct stat sb, *st = stat(dir, &sb) == 0 ? &sb : NULL;   /* none: the first spill says why */
  pthread_mutex_lock(&lock);
  spill_file **p = &files;
  while (*p && !same_dir(*p, dir, st)) p = &(*p)->next;
  spill_file *f = *p;
  if (f) *p = f->next;                           /* to the front: the last used */
  else f = file_new(dir, st);
  if (f) {
    f->next = files;
    files = f;
    f->refs++;
    close_idle(KEEP_IDLE);
  }
  pthread_mutex_unlock(&lock);
  if (f == NULL) mg_seterror("out of memory");
  return f;
}

void mg_spill_release_idle (void) {
  pthread_mutex_lock(&lock);
  close_idle(0);
  pthread_mutex_unlock(&lock);
}

/* }========================================================== */


/* {===================== the offload hooks ==================== */

typedef struct mapping { spill_file *f; void *addr; size_t off, len; } mapping;

static void unmap (void *ud) {
  mapping *m = (mapping *)ud;
  if (m->addr) munmap(m->addr, m->len);
  if (m->len) {
    pthread_mutex_lock(&lock);
    give_space(m->f, m->off, m->len);
    pthread_mutex_unlock(&lock);
  }
  release_dir(m->f);
  free(m);
}

static mg_status write_all (int fd, const char *p, size_t len, size_t off) {
  for (size_t done = 0; done < len;) {
    ssize_t w = pwrite(fd, p + done, len - done, (off_t)(off + done));
    if (w <= 0) return MG_ERR;
    done += (size_t)w;
  }
  return MG_OK;
}

/* makes the file on the first spill (under the lock) */
static mg_status file_open (spill_file *f) {
  if (f->fd >= 0) return MG_OK;
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/moongrad-saved-XXXXXX", f->dir) >= sizeof path)
    return mg_seterror("offload: the directory's path is too long");
  if ((f->fd = mkstemp(path)) < 0) return mg_seterror("offload: cannot make a file in %s", f->dir);
  unlink(path);
  fcntl(f->fd, F_SETFD, FD_CLOEXEC);             /* kept open: no child of os.execute inherits it */
  return MG_OK;
}

/* the bytes of t written into the directory's file and mapped back: a
** stand-in that keeps its stretch of the file until the last view goes */
static mg_tensor *pack_file (void *ud, mg_tensor *t) {
  spill_file *f = (spill_file *)ud;
  mg_tensor *c = mg_contiguous(t);
  if (c == NULL) return NULL;
  size_t bytes = (size_t)c->numel * mg_dtype_size(c->dtype);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t len = (bytes + page - 1) / page * page;   /* mappings start on pages */
  mapping *m = (mapping *)malloc(sizeof(mapping));
  mg_tensor *out = NULL;
  pthread_mutex_lock(&lock);
  mg_status st = m ? file_open(f) : mg_seterror("out of memory spilling a saved tensor");
  if (st == MG_OK) {
    *m = (mapping){f, NULL, take_space(f, len), len};
    f->refs++;
  }
  pthread_mutex_unlock(&lock);
  if (st != MG_OK) {
    free(m);
    mg_tensor_release(c);
    return NULL;
  }
  void *addr = NULL;
  if (write_all(f->fd, (const char *)mg_ptr(c), bytes, m->off) != MG_OK) {
    mg_seterror("offload: cannot write %zu bytes to %s", bytes, f->dir);
  } else if (len && (addr = mmap(NULL, len, PROT_READ, MAP_SHARED, f->fd, (off_t)m->off)) == MAP_FAILED) {
    mg_seterror("offload: cannot map the file's %zu bytes", bytes);
  } else {
    m->addr = addr;
    out = mg_from_blob(addr ? addr : (void *)m, c->shape, c->ndim, NULL, c->dtype, unmap, m);
    m = NULL;                                  /* the stand-in's now, even when it failed */
  }
  if (m) unmap(m);
  mg_tensor_release(c);
  return out;
}

static mg_tensor *unpack_file (void *ud, mg_tensor *p, mg_dtype dt) {
  MG_UNUSED(ud);
  MG_UNUSED(dt);
  return mg_tensor_retain(p);
}

const mg_saved_hooks mg_hooks_offload = {pack_file, unpack_file, release_dir};

/* }========================================================== */

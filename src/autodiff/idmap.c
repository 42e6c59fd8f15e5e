/*
** idmap.c — maps and sets keyed by tensor id, for tapes and walks.
**
** Open addressing with linear probing; id 0 never occurs, so it marks an
** empty slot. Nothing is ever deleted (a walk clears an entry by setting its
** value), and the first 16 entries live inside the map, so most maps never
** touch the heap.
*/
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

/* {===================== id maps and sets ==================== */
/* Open addressing, linear probing; id 0 never occurs, so it marks empty.
** Nothing is ever deleted: a map entry is cleared by setting its value. */

mg_status idmap_grow (idmap *m) {
  if (m->cap == 0) {                    /* start in the inline arrays */
    memset(m->ikeys, 0, sizeof m->ikeys);
    memset(m->ivals, 0, sizeof m->ivals);
    m->keys = m->ikeys;
    m->vals = m->ivals;
    m->cap = IDMAP_INLINE;
    return MG_OK;
  }
  size_t cap = m->cap * 4;
  uint64_t *keys = (uint64_t *)calloc(cap, sizeof(uint64_t));
  void **vals = (void **)calloc(cap, sizeof(void *));
  if (keys == NULL || vals == NULL) {
    free(keys);
    free(vals);
    return mg_seterror("out of memory growing a tape");
  }
  uint64_t *ok = m->keys;
  void **ov = m->vals;
  size_t ocap = m->cap;
  m->keys = keys;
  m->vals = vals;
  m->cap = cap;
  for (size_t i = 0; i < ocap; i++)
    if (ok[i]) {
      size_t s = slot_of(m, ok[i]);
      keys[s] = ok[i];
      vals[s] = ov[i];
    }
  if (ok != m->ikeys) {
    free(ok);
    free(ov);
  }
  return MG_OK;
}

/* the value slot for id, created (NULL) if absent; NULL when out of memory */


void idmap_free (idmap *m) {
  if (m->cap > 0 && m->keys != m->ikeys) {
    free(m->keys);
    free(m->vals);
  }
  m->keys = NULL;
  m->vals = NULL;
  m->cap = m->n = 0;
}

/* }========================================================== */

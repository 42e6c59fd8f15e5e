/*
** autodiff.h — what the files of src/autodiff/ share: id maps, the tape's
** layout, and the reverse walk (tape.c) that jacobian.c drives row by row.
*/
#ifndef AUTODIFF_H
#define AUTODIFF_H

#include "ops/op.h"

/* {================= what the tapes offer the floors above ================= */

/* saved-tensor hooks, pushed (hooks.c); nodes hold a reference */
typedef struct mg_hooks_ref mg_hooks_ref;
void mg_hooks_retain  (mg_hooks_ref *r);
void mg_hooks_release (mg_hooks_ref *r);
/* pack t through r (no hooks apply while they run); a tensor saved by two
** nodes (tanh's output, the next matmul's input) is packed once. NULL +
** error on failure */
mg_tensor *mg_hooks_pack   (mg_hooks_ref *r, mg_tensor *t);
/* a node lets go of packed, the stand-in of the tensor with id src */
void       mg_hooks_forget (mg_hooks_ref *r, uint64_t src, mg_tensor *packed);
mg_tensor *mg_hooks_unpack (mg_hooks_ref *r, mg_tensor *packed, const mg_meta *m);

/* Records an op on every recording tape that tracks one of its inputs, and
** lets variable watchers see the variables read. Cheap when nothing
** records. Returns MG_ERR only when out of memory. */
mg_status mg_record (const mg_opdef *def, int nin, mg_tensor *const *in, int nout,
                     mg_tensor *const *out, const mg_attr *attr);
/* the same with op-private data: ext goes to the node (freed by
** def->free_ext with it), or is freed at once when no tape records the op;
** *node (may be NULL) gets the node, borrowed */
mg_status mg_record_ex (const mg_opdef *def, int nin, mg_tensor *const *in, int nout,
                        mg_tensor *const *out, const mg_attr *attr, void *ext,
                        mg_node **node);

/* tapes recording now, in this context */
#define mg_recording_tapes  (mg_ctx()->tapes.recording)
static inline bool mg_anyone_listening (void) {
  const mg_tape_state *t = &mg_ctx()->tapes;
  return t->recording > 0 || t->watching > 0;
}

/* Read watchers (recompute_grad, checkpoint_loop and custom_gradient
** forwards): the variables a forward reads and, with captures, the tensors
** from outside it that a paused tape follows (those it closes over, and its
** arguments), so that the node can take them as inputs. */
typedef struct mg_var_watcher {
  mg_variable **vars;
  int n, cap;
  mg_tensor **ts;               /* with captures: tensors read, retained, no repeats */
  int nt, capt;
  bool captures;
  int level;                    /* the pause (tape state's pauses[]) the forward runs under */
  bool failed;                  /* out of memory noting a read */
  struct mg_var_watcher *prev;
} mg_var_watcher;
void mg_watcher_push (mg_var_watcher *w, bool captures);
void mg_watcher_pop  (mg_var_watcher *w);     /* releases nothing; caller frees vars */
void mg_watcher_free (mg_var_watcher *w);
void mg_watcher_note_outputs (mg_var_watcher *w, int n, mg_tensor *const *out);

/* true when a recording or paused tape has seen this id */
bool mg_any_tape_tracks (uint64_t id);
/* pause / resume every tape now active, for recompute forward (nested) */
mg_status mg_pause_all (void);
void mg_resume_all (void);
void mg_recompute_enter (void);
void mg_recompute_leave (void);

/* recompute's verify (verify.c): a log opened on the first run notes each
** op until noted; opened again on the re-run, each op is checked against it
** until checked, which fails if the re-run ran fewer */
typedef struct mg_verify_log mg_verify_log;
bool           mg_verify_wanted  (const mg_function *fn);   /* MG_FN_VERIFY, or verify for all */
mg_verify_log *mg_verify_note    (const char *fn);          /* NULL + error */
void           mg_verify_noted   (mg_verify_log *l);
mg_status      mg_verify_check   (mg_verify_log *l);
mg_status      mg_verify_checked (mg_verify_log *l, mg_status st);   /* st, or the shortfall's error */
void           mg_verify_free    (mg_verify_log *l);

/* what custom gradients and recompute share (call.c) */
mg_status mg_call_check (const char *fn, const mg_function *f, int nin, mg_tensor *const *in,
                         mg_list *out);
/* a reference on each input for the call: user code may release what was lent */
void mg_call_hold (int nin, mg_tensor *const *in);
void mg_call_unhold (int nin, mg_tensor *const *in);
/* runs f->forward with the tapes paused (how: MG_FN_* flags; recorded
** with MG_FN_RECORD_FORWARD) and w (pushed here, popped after) noting
** variable reads, and with MG_FN_CAPTURES the tensors a paused tape
** follows; on failure out and w are emptied */
mg_status mg_call_forward (const mg_function *f, void *ud, int nin, mg_tensor *const *in,
                           mg_list *out, mg_var_watcher *w, unsigned how);
mg_status mg_call_fresh_outputs (mg_list *out, mg_tensor *const *inputs, int ninputs);
int mg_call_index_of (uint64_t id, mg_tensor *const *xs, int n);   /* -1: not among xs */
void mg_call_drop_passed (mg_var_watcher *w, int nin, mg_tensor *const *in);

/* save policies (replay.c) */
mg_replay *mg_replay_new (void);
void       mg_replay_free (mg_replay *r);
size_t     mg_replay_count (const mg_replay *r);
mg_status  mg_replay_note (const mg_opdef *op, mg_tensor *out);   /* the tapes' after-hook, first runs */
void       mg_replay_rewind (mg_replay *r);
void       mg_replay_settle (mg_replay *r, const mg_list *out);   /* the first run ended well */
mg_tensor *mg_replay_kept (const mg_replay *r, int i);   /* the i-th kept output, or NULL */
/* the kept output an op may take instead of computing (new to the tapes), or NULL */
mg_tensor *mg_replay_take (const mg_opdef *op, const int64_t *shape, int ndim, mg_dtype dt);

/* add-or-set: *acc = *acc ? *acc + g : g; takes over g */
mg_status mg_accumulate (mg_tensor **acc, mg_tensor *g);

/* }========================================================== */

/* {======================= id maps (idmap.c) ================== */
/* Open addressing keyed by tensor id (never 0); a map entry is cleared by
** setting its value, nothing is deleted. Small maps live inline. */

#define IDMAP_INLINE 16                 /* most maps never need the heap */

typedef struct idmap {
  uint64_t *keys;
  void **vals;
  size_t cap, n;                        /* cap 0: empty, not started */
  uint64_t ikeys[IDMAP_INLINE];
  void *ivals[IDMAP_INLINE];
} idmap;                                /* never copied once used: keys may point inside */

mg_status idmap_grow (idmap *m);          /* to 4x, or into the inline arrays first */
void      idmap_free (idmap *m);

/* lookups are on every recorded op's path: inline */
static inline size_t slot_of (const idmap *m, uint64_t id) {
  size_t i = (size_t)(id * 0x9E3779B97F4A7C15ULL) & (m->cap - 1);
  while (m->keys[i] != 0 && m->keys[i] != id) i = (i + 1) & (m->cap - 1);
  return i;
}

static inline bool idmap_has (const idmap *m, uint64_t id) {
  return m->cap > 0 && m->keys[slot_of(m, id)] == id;
}

/* the value slot for id, created (NULL) if absent; NULL when out of memory */
static inline void **idmap_slot (idmap *m, uint64_t id) {
  if ((m->n + 1) * 4 > m->cap * 3 && idmap_grow(m) != MG_OK) return NULL;
  size_t s = slot_of(m, id);
  if (m->keys[s] == 0) {
    m->keys[s] = id;
    m->vals[s] = NULL;
    m->n++;
  }
  return &m->vals[s];
}

/* NULL if absent */
static inline void *idmap_get (const idmap *m, uint64_t id) {
  if (m->cap == 0) return NULL;
  size_t s = slot_of(m, id);
  return m->keys[s] == id ? m->vals[s] : NULL;
}

/* }========================================================== */


/* {=========================== tapes ========================== */

struct mg_tape {
  mg_context *ctx;            /* whose active list it is in */
  int refcount;
  bool persistent, watch_accessed;
  bool active;                /* in the active list: recording unless paused */
  int paused;                 /* nested pauses */
  bool used;                  /* a non-persistent tape gave its gradient */
  int walking;                /* gradients of this tape being computed now */
  idmap tracked;              /* ids this tape follows (values unused) */
  mg_node **nodes;
  size_t nnodes, capnodes;
  mg_variable **vars;         /* watched variables, retained */
  int nvars, capvars;
  size_t budget;              /* a memory budget of its own (mg_tape_set_budget); 0: none */
};

/* A walk runs host code (custom gradients, recompute) that may drop its
** own references to the tape and to the tensors it asked about, or ask
** this tape for another gradient: the walk holds references of its own,
** and a tape being walked refuses to walk or reset again. */
/* what a walk holds while it runs; it runs with autocast off (the backward
** of each op computes in the dtypes its forward ran in) */
typedef struct mg_held { mg_tape *t; bool paused, autocast_off; mg_tensor **xs; int n; mg_tensor *small[8]; } mg_held;

/* holds t and the tensors of a, b and c (c may be NULL, or have NULLs; c[k]
** with bit k of c_not_held set is not held: a seed handed to the walk) */
mg_status mg_walk_begin (mg_held *h, mg_tape *t, const char *fn, int na, mg_tensor *const *a,
                         int nb, mg_tensor *const *b, int nc, mg_tensor *const *c, unsigned c_not_held);
void      mg_walk_end   (mg_held *h);    /* last: it may drop the final reference to t */

/* grads gets d(sum of targets . seeds)/d source for each source the tape
** reaches; fn names the caller in messages ("gradient", "jacobian"); hooks (or
** NULL) as mg_tape_gradient_hooked's, taken[s] set where ready took one.
** Seed k < 32 with bit k of given set is the caller's reference, handed
** over: the walk owns it from the call on, whatever happens */
mg_status mg_walk (mg_tape *t, int ntargets, mg_tensor *const *targets, mg_tensor *const *seeds,
                   unsigned given, int nsources, mg_tensor *const *sources, idmap *grads, bool free_as_you_go,
                   const mg_gradient_hooks *hooks, char *taken, const char *fn);
/* mg_tape_gradient with the seeds given (as mg_walk's): a recompute's
** re-run seeded with the output gradient its node was handed; a half
** source's gradient comes back as the walk's float32 sum where it summed
** one (the rule hands it on unrounded: the outer walk rounds it once) */
mg_status mg_tape_gradient_given (mg_tape *t, int ntargets, mg_tensor *const *targets, int nsources,
                                  mg_tensor *const *sources, mg_tensor *const *seeds, unsigned given,
                                  mg_tensor **grads);
void      mg_release_grads (idmap *g);   /* releases the gradients a walk left */
/* releases ts[k] for each k < n (and < 32) with bit k of mask set: the
** references handed over (given seeds, handed output gradients) not passed on */
void      mg_release_masked (int n, mg_tensor *const *ts, unsigned mask);
mg_status mg_tape_check_usable (const mg_tape *t, const char *fn);
/* after a gradient: a non-persistent tape lets go of what it saved */
void      mg_tape_consume (mg_tape *t);

/* }========================================================== */


/* the tapes' hooks into the dispatcher and variable reads, in c (tape.c);
** installed when a tape, a watcher or a save policy is made */
void mg_autodiff_install (mg_context *c);

/* {================== the memory budget (dtr.c) =============== */

bool      mg_dtr_recording (void);     /* a budget is in force: nodes get provenance */
/* n was recorded with inputs in: its provenance record */
mg_status mg_dtr_attach (mg_node *n, mg_tensor *const *in);
/* n (with a record) reached refcount 0: free_node frees it, and the nodes
** its record held go too, without recursion */
void      mg_dtr_release (mg_node *n, void (*free_node)(mg_node *));
/* around n's backward rule: evicted slots rebuilt, all of them held */
mg_status mg_dtr_pin (mg_node *n);
void      mg_dtr_unpin (mg_node *n);
void      mg_dtr_walk (int delta);     /* a backward walk begins (+1) */
mg_status mg_dtr_walk_end (void);      /* ... and ends: MG_ERR when its step ran short of the budget */
const char *mg_dtr_take_failure (void); /* the budget's last refusal (cleared), or NULL */
void      mg_dtr_forget_tape (mg_tape *t);

/* }========================================================== */

#endif

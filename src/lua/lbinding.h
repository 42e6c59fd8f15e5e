/*
** lbinding.h — what the Lua binding files share.
*/
#ifndef LBINDING_H
#define LBINDING_H

#include <lua.h>
#include <lauxlib.h>

#include <stdbool.h>
#include <stdint.h>
#include "moongrad.h"

/* A tensor or variable box starts with its kind's mark, a 64-bit constant
** of lauxmg.c: with the block's size, it tells the box from any other
** userdata without fetching its metatable, on every argument of every op.
** Lua code cannot write a userdata's bytes (only C, or memory a freed box
** left to a userdata made after it and shown by the debug library). */
typedef struct ltensor { uint64_t mark; mg_tensor *t; } ltensor;     /* t: one reference, or NULL */
typedef struct lvariable { uint64_t mark; mg_variable *v; } lvariable;
typedef struct ltape { mg_tape *t; bool warn; } ltape;   /* warn: a warning is still to be given */

/* {==================== the binding's state ===================== */
/* What the binding keeps for one Lua state (lstate.c): a userdata in its
** registry, made when the module opens (or on first use by a C host), shared
** by the state's coroutines and by no other state, on whatever thread the
** state runs. The C core's hooks get it as their ud. Lua frees it with the
** state, after the last finalizer; its anchor may outlive it. */

/* The part that C objects holding Lua functions (a tape's custom gradient,
** saved-tensor hooks) reach, maybe after lua_close, maybe on another thread:
** malloc'd and counted. */
typedef struct mgL_anchor {
  lua_State *L;                /* the main thread; NULL once the state closed */
  lua_State *running;          /* the thread asking for a gradient now, if any */
  int refs;                    /* the state, plus one per live callback */
  int *dead, ndead, capdead;   /* registry refs of released callbacks, to unref */
} mgL_anchor;

/* the collector's pacing by tensor bytes (lgc.c) */
typedef struct mgL_gc {
  int pause;                 /* percent, as lua_gc's setpause */
  size_t min_bytes;
  size_t mark;               /* allocated bytes at the last collection */
  size_t allowance;          /* bytes to allocate before the next one */
  size_t floor;              /* the fewest loose bytes (see loose) since the last full collection */
  double high;               /* the most live bytes lately (decays as bytes are allocated) */
  double top, top_now;       /* the most bytes known live (see repace) in the last step
                                (gradient to gradient) and in this one */
  double credit;             /* CPU seconds full collections may take now (see may_run_full) */
  double credited_at;        /* the CPU time credit was brought up to */
  double last_full;          /* seconds the last full one took */
  int64_t young, full;       /* collections run, for stats() */
  double seconds;            /* CPU seconds spent in them, for stats() */
  bool collecting;           /* one runs now (its finalizers may make boxes) */
} mgL_gc;

#define MGL_STATE_MAGIC 0x6d674c7374617465ull   /* "mgLstate" */

typedef struct mgL_state {
  uint64_t magic;            /* MGL_STATE_MAGIC: tells it from another userdata */
  lua_State *main;           /* the main thread */
  mgL_anchor *anchor;        /* NULL once the state's finalizer ran (lua_close) */
  mgL_gc gc;
  int tidy_depth;            /* mg.tidy scopes open (ltidy.c) */
  struct mgL_tracer *trace;  /* the mg.memory.trace running (ltrace.c), or NULL */
} mgL_state;

/* the userdata's user values */
enum { MGL_UV_TENSOR_MT = 1, MGL_UV_VARIABLE_MT, MGL_UV_SCOPES, MGL_NUSERVALUES = MGL_UV_SCOPES };

/* L's state (made if missing), from the registry; mgL_pushstate leaves its
** userdata on the stack */
mgL_state *mgL_findstate  (lua_State *L);
mgL_state *mgL_pushstate  (lua_State *L);
/* The binding's functions carry the state as their first upvalue
** (mgL_setfuncs, the registry's op closures): one registry lookup fewer for
** every box an op makes. The rule that keeps it safe: a closure of the
** binding has the state or no full userdata as its first upvalue. L's
** state when the running function is one of them, else NULL (then
** mgL_findstate). */
#define MGL_STATE_UPVALUE lua_upvalueindex(1)
static inline mgL_state *mgL_upstate (lua_State *L) {
  if (lua_type(L, MGL_STATE_UPVALUE) != LUA_TUSERDATA) return NULL;
  mgL_state *S = (mgL_state *)lua_touserdata(L, MGL_STATE_UPVALUE);
  return S->magic == MGL_STATE_MAGIC ? S : NULL;
}
static inline mgL_state *mgL_getstate (lua_State *L) {
  mgL_state *S = mgL_upstate(L);
  return S ? S : mgL_findstate(L);
}
/* luaL_setfuncs and luaL_newlib with the state as every function's upvalue */
void mgL_setfuncs (lua_State *L, const luaL_Reg *l);
#define mgL_newlib(L, l)  (luaL_newlibtable(L, l), mgL_setfuncs(L, l))
/* luaopen: makes the state, and budgets of this thread's context collect here */
void       mgL_openstate  (lua_State *L);
/* the thread asking for a gradient now, or NULL */
static inline lua_State *mgL_running (const mgL_state *S) {
  return S->anchor ? S->anchor->running : NULL;
}
/* around a gradient computation asked for from L: Lua callbacks of L's
** state (custom gradients, recompute) run on L, and the collector's hooks
** collect there; returns what to restore */
typedef struct mgL_call { mgL_state *S; lua_State *prev; void *pressure, *collect; } mgL_call;
mgL_call   mgL_enter (lua_State *L);
void       mgL_leave (lua_State *L, mgL_call c);
/* the anchor's registry refs of released callbacks go now */
void       mgL_sweep (lua_State *L, mgL_anchor *a);
void       mgL_sweep_dead (lua_State *L);   /* the same, when dead refs wait (after a tape goes) */
/* one reference less; frees it at the last */
void       mgL_anchor_release (mgL_anchor *a);

/* lgc.c: the pacing's defaults into gc; a new pause (percent) and min_bytes,
** the pacing starting afresh */
#define MGL_GC_MIN_BYTES ((size_t)256 << 10)
void       mgL_gc_init (mgL_gc *gc);
void       mgL_gc_setpause (mgL_gc *gc, int pause, size_t min_bytes);
/* collects garbage tensors when tensor memory has grown enough (mgL_newbox
** calls it, before the op's result box exists) */
void       mgL_gc_step (lua_State *L, mgL_state *S);
static inline void mgL_gc_pressure (lua_State *L, mgL_state *S) {
  const mgL_gc *gc = &S->gc;
  if (!gc->collecting && mg_memory_allocated_bytes() - gc->mark > gc->allowance) mgL_gc_step(L, S);
}
/* a full collection (within its share of the CPU time) before a gradient that
** no other gradient runs around: the forward's boxes are garbage by then */
void       mgL_gc_before_gradient (lua_State *L, mgL_state *S);
/* the core's hooks, ud the mgL_state: at the safe points of a gradient
** walk, and before a budget gives up */
void       mgL_gc_safe_point (void *ud);
void       mgL_gc_for_budget (void *ud);

/* }============================================================== */

/* an empty tensor box on the stack, safe to collect, before any work; a
** box made while an mg.tidy scope is open joins it */
ltensor   *mgL_newbox      (lua_State *L);
/* an empty variable box on the stack (v NULL), its metatable set */
lvariable *mgL_newvariablebox (lua_State *L);
/* the __gc (and __close) of tensor boxes, and the __gc of variable boxes */
int        mgL_tensor_gc   (lua_State *L);
int        mgL_variable_gc (lua_State *L);
/* makes the registry's weak table from variables to their boxes */
void       mgL_open_boxes  (lua_State *L);
/* the variable box at idx, filled, is the one mgL_pushvariable gives */
void       mgL_registervariablebox (lua_State *L, int box);
/* lua_pcall of the function below nargs arguments in a tidy scope: boxes
** made meanwhile are released after, except among the results if
** keep_results */
int        mgL_tidy_pcall  (lua_State *L, int nargs, bool keep_results);
/* the tensors the function at idx closes over leave every open tidy scope */
void       mgL_tidy_keep_captured (lua_State *L, int fn);
/* raises inside a finalizer: what is made there may never be released */
void       mgL_checkfinalizer (lua_State *L);
void       mgL_checkrelease (lua_State *L, const char *what);
void       mgL_checkchange (lua_State *L, const char *what);   /* a variable's value, in a finalizer */
/* drops the box's reference: the box is dead ("tensor has been released"),
** the tensor lives on where something else holds it */
void       mgL_releasebox  (ltensor *box);
/* the tensor box at arg, or NULL */
ltensor   *mgL_testbox     (lua_State *L, int arg);
/* the variable box at arg (released or not), or NULL */
lvariable *mgL_testvariablebox (lua_State *L, int arg);
/* keeps the tensor and variable metatables where new boxes find them (the
** state's user values) */
void       mgL_remember_metatables (lua_State *L);
/* fills the box at the top with t (a new reference); raises on NULL */
int        mgL_fill        (lua_State *L, ltensor *box, mg_tensor *t);
/* what kind of operand arg is: a tensor or variable, a number, a boolean */
typedef enum { MGL_TENSOR, MGL_NUMBER, MGL_BOOLEAN, MGL_OTHER } mgL_kind;
mgL_kind   mgL_operandkind (lua_State *L, int arg);
/* arg (already checked by mgL_operandkind) as a tensor: a number becomes a
** 0-d tensor of dtype like, and *owned says the caller must release it.
** Never raises: NULL + mg_errmsg() on failure */
mg_tensor *mgL_operand     (lua_State *L, int arg, mg_dtype like, bool *owned, const char *fn);
/* raises "bad argument" unless arg is a tensor, variable or number */
void       mgL_checkoperandkind (lua_State *L, int arg);
/* the dtype of the first tensor or variable among args a, b; else fallback */
mg_dtype   mgL_likedtype   (lua_State *L, int a, int b, mg_dtype fallback);
/* optional dtype name at arg ("float32", ...) */
mg_dtype   mgL_optdtype    (lua_State *L, int arg, mg_dtype def);
/* the dtype name at stack index idx; errors name argument arg and `what`
** (an option's name, or NULL) */
mg_dtype   mgL_dtypeat     (lua_State *L, int idx, int arg, const char *what);
/* pushes options[key] from the table at arg and returns its type, raising
** unless it is nil or of `type` (LUA_TBOOLEAN, LUA_TSTRING ...) */
int        mgL_optionfield (lua_State *L, int arg, const char *key, int type);
/* a shape given as a table {2,3}, or as integers from arg on when varargs;
** returns ndim */
int        mgL_checkshape  (lua_State *L, int arg, int64_t *shape, bool varargs);
/* 1-based axis (negative counts from the end) into 0-based; nil gives
** MG_ALL_AXES; raises on a bad axis */
int        mgL_optaxis     (lua_State *L, int arg, int ndim);
/* Values read from stack index idx, with errors naming argument arg (a
** table's entries are checked at a stack index of their own, but the
** user's argument is the table) and `what` ("axis", "dimension 2"). */
lua_Integer mgL_intat      (lua_State *L, int idx, int arg, const char *what);
int        mgL_axisat      (lua_State *L, int idx, int arg, int ndim, const char *what);
int64_t    mgL_dimat       (lua_State *L, int idx, int arg, int i);    /* a size >= 0 */
/* the length of the list at idx, raising when it has other keys */
int        mgL_checklist   (lua_State *L, int idx, int arg, const char *what);
/* raises when an argument past max is given (not nil): an options table
** (x:exp{inplace=true}) or any extra value would otherwise be ignored */
void       mgL_checknargs  (lua_State *L, int max);
/* nil (false) or a boolean; anything else raises */
bool       mgL_optboolean  (lua_State *L, int arg, const char *what);
mg_variable *mgL_testvariable  (lua_State *L, int arg);
mg_variable *mgL_checkvariable (lua_State *L, int arg);
/* pushes a table {d1, d2, ...} */
void       mgL_pushshape   (lua_State *L, const int64_t *shape, int ndim);
/* t's field k (shape, dtype, ndim, itemsize, nbytes) pushed: 1, or 0 for another name */
int        mgL_pushfield   (lua_State *L, const mg_tensor *t, const char *k);
/* pushes a new tensor built from the number, boolean, nested table or
** tensor at arg, and returns it (borrowed from the box on the stack) */
mg_tensor *mgL_pushconstant (lua_State *L, int arg, mg_dtype dt, bool dtype_given, const char *fn);
/* pushes t's values as nested tables (a number for a 0-d tensor) */
void       mgL_pushvalues  (lua_State *L, const mg_tensor *t);

/* pushes x[i], the i-th entry along the first axis (a view); raises when out of range */
int        mgL_index_first_axis (lua_State *L, mg_tensor *t, lua_Integer i);
/* pushes the userdata of v (the same one each time while it lives) */
void       mgL_pushvariable (lua_State *L, mg_variable *v);
/* is the value at idx a tensor or a variable? */
bool       mgL_isleaf      (lua_State *L, int idx);
/* Appends the tensor and variable leaves of the value at idx (a leaf, or
** nested plain tables of them) to the list at acc, starting after entry n;
** returns the new count. strict: any other leaf raises, naming `what` and
** its place; otherwise other leaves are skipped (and kept by rebuild). */
int        mgL_flatten     (lua_State *L, int idx, int acc, int n, bool strict, const char *what);
/* pushes where the tensor and variable leaves of the count values from
** first are, in mgL_flatten's order: "tensors at what 1, what 3.h[2]", or
** "no tensors" */
void       mgL_pushplaces  (lua_State *L, int first, int count, const char *what);
/* pushes a copy of the value at idx with its leaves replaced, in the same
** order, by acc[*k], acc[*k+1], ... */
void       mgL_rebuild     (lua_State *L, int idx, int acc, int *k);
/* replaces the tensor leaves of the structure at idx (plain tables, changed
** in place) by holes, which mgL_rebuild fills as leaves: a structure kept
** for later no longer keeps its tensors alive */
void       mgL_hollow      (lua_State *L, int idx);

/* a memory size at arg: positive bytes, or a string with a unit ("300 MB",
** "1.5 GiB"); raises naming fn */
size_t     mgL_checkbytes  (lua_State *L, int arg, const char *fn);
/* the string at arg as a file path; one with a NUL byte inside (which C
** would cut short there) raises "fn: the path 'a\0b' contains a NUL byte" */
const char *mgL_checkpath  (lua_State *L, int arg, const char *fn);
/* does the string at idx hold a NUL byte? */
bool       mgL_hasnul      (lua_State *L, int idx);
/* pushes the string at idx with each NUL written as \0, for messages */
const char *mgL_shownul    (lua_State *L, int idx);
/* is the value at idx callable (a function, or a table or userdata whose
** metatable has __call: a model)? */
bool       mgL_iscallable  (lua_State *L, int idx);
/* raises "function expected" unless the value at arg is callable */
void       mgL_checkcallable (lua_State *L, int arg);
/* raises unless the table at arg (if not nil) has only these string keys */
void       mgL_checkoptions (lua_State *L, int arg, const char *const keys[]);

void mgL_open_tensor    (lua_State *L);    /* each adds its functions to the table at -1 */
void mgL_open_variable  (lua_State *L);
void mgL_open_tape      (lua_State *L);
/* tape:gradient(target, sources) with hooks into its walk, for the C
** halves that start work before it ends (mg.distributed's overlapped
** gradients): the tape at arg; grads[ns] set; MG_ERR with the error set */
/* results[0..n) as a new list of tensors, nil where NULL (its stack index);
** takes them over, also when it raises (out of memory: released) */
int       mgL_box_answers (lua_State *L, int n, mg_tensor **results);
mg_status mgL_gradient_hooked (lua_State *L, int arg, mg_tensor *target, int ns, mg_tensor **sources,
                               const mg_gradient_hooks *hooks, mg_tensor **grads);
void mgL_open_memory    (lua_State *L);
/* the embedded Lua modules (lmodules.c): pushes module `name`
** ("moongrad.planner"), loaded as require would; or the loader of the i-th */
void mgL_require (lua_State *L, const char *name);
void mgL_push_module_loader (lua_State *L, int i);
void mgL_open_tidy      (lua_State *L);    /* mg.tidy, mg.dispose */
void mgL_open_trace     (lua_State *L);    /* into the memory table at -1 */
void mgL_open_random    (lua_State *L);
void mgL_open_debug     (lua_State *L);    /* mg.debug */
void mgL_open_functions (lua_State *L);   /* lfunction.c: _layer_call */
void mgL_open_custom    (lua_State *L);   /* lcustom.c: custom_gradient */
void mgL_open_recompute (lua_State *L);   /* lrecompute.c: recompute_grad */
void mgL_open_loops     (lua_State *L);   /* lloop.c: in_loop, is_in_loop, _loop */
void mgL_open_hooks     (lua_State *L);   /* lhooks.c: saved_tensors_hooks */
void mgL_open_autocast  (lua_State *L);   /* lautocast.c: autocast */
void mgL_open_maths     (lua_State *L);   /* lmaths.c: more maths and reductions */
void mgL_open_index     (lua_State *L);   /* lindex.c: indexing, sorting, rearranging */
void mgL_open_conv      (lua_State *L);   /* lconv.c: convolution and pooling */
void mgL_open_io        (lua_State *L);   /* lio.c: safetensors, dataset readers */
void mgL_open_attention (lua_State *L);   /* lattention.c: layer_norm, gelu, attention */
void mgL_open_dense     (lua_State *L);   /* ldense.c: dense */

/* Lua sources of the .lua files of lua/moongrad/ compiled into the library */
typedef struct mgL_embedded { const char *name; const unsigned char *src; size_t len; } mgL_embedded;
extern const mgL_embedded mgL_embedded_modules[];

#endif

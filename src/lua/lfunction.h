/*
** lfunction.h — what the files that bind Lua functions as C callbacks of
** the autodiff core share (lfunction.c): lcustom.c (custom gradients),
** lrecompute.c (recompute_grad), lloop.c (checkpoint loops) and lhooks.c
** (saved-tensor hooks).
*/
#ifndef LFUNCTION_H
#define LFUNCTION_H

#include "lbinding.h"

/* The first run of f, from the binding's own stack frame: f and its
** arguments are there, and f's results (or its error) stay there. */
typedef struct first_run {
  lua_State *L;
  int f, args, nargs;          /* stack indices of f and its first argument; the count */
  int results, nresults;       /* f's results, after the run */
  int error;                   /* the error object's index, 0 if none */
  bool untaped;                /* recompute: f gave no tensor, so nothing is recorded */
} first_run;

typedef struct lfn {
  mgL_anchor *a;
  int ref;                     /* registry: {f=, grad_fn=, template=, kinds=} */
  bool pass_flag;              /* recompute_grad(f, {pass_is_recomputing=true}), or
                               ** custom_gradient(f, {context=true}) */
  first_run *first;            /* the call in progress; NULL after it */
} lfn;

/* the C core lets go of u (the lfn of a callback) */
void       mgL_lfn_release (void *ud);
/* a new lfn for the registry table at the top (popped) */
lfn       *mgL_lfn_new     (lua_State *L, bool pass_flag, first_run *first);
/* the thread callbacks of u run on, or NULL + error when its state closed */
lua_State *mgL_lfn_thread  (const lfn *u, const char *what);
/* runs body(L) protected, with ud as a light userdata argument; a Lua error
** becomes MG_ERR with its text */
mg_status  mgL_protected   (lua_State *L, lua_CFunction body, void *ud);
/* pushes t as a new tensor box holding one more reference */
void       mgL_pushretained (lua_State *L, mg_tensor *t);

/* the call of a function f whose results are the outputs of a node */
typedef struct forward_args {
  lfn *u;
  int nin;
  mg_tensor *const *in;
  mg_list *out;
  const char *who;
} forward_args;

/* the tensors and variables among f's results first..last (in nested
** plain tables too; other values pass by) into fa->out; returns how many */
int        mgL_collect_outputs (lua_State *L, int first, int last, forward_args *fa);
/* pushes the flag table of recompute_grad(f, {pass_is_recomputing=true});
** returns how many values it pushed */
int        mgL_push_flag   (lua_State *L, bool pass_flag);
/* runs body(fa, f, args...) protected in the binding's frame */
mg_status  mgL_run_first   (forward_args *fa, lua_CFunction body);
/* the tensors at list[1..n] as a C array in a userdata pushed on the stack */
mg_tensor **mgL_tensor_array (lua_State *L, int list, int n);
/* raises after a failed call: f's own error object when it raised one */
int        mgL_raise_call_error (lua_State *L, const first_run *r);
/* the outputs in out, as new boxes in a list pushed on the stack */
int        mgL_push_outputs (lua_State *L, mg_list *out);

#endif

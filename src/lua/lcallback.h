/*
** lcallback.h — helpers shared by custom_gradient and recompute_grad.
*/
#ifndef LCALLBACK_H
#define LCALLBACK_H

#include "lbinding.h"

/* the state's main thread: it outlives any coroutine, so a node keeps it
** to release its registry references */
lua_State *mgL_main_thread (lua_State *L);

/* calls the function below the top nargs values like lua_pcall(L, nargs,
** LUA_MULTRET), with every active tape paused and w collecting the
** variables it reads; returns the lua_pcall status */
int  mgL_call_paused (lua_State *L, int nargs, mg_var_watcher *w);

/* replaces the tensor at idx by a fresh view (same data, new id) when it
** is one of the inputs, a variable's value, or followed by a tape: an op's
** output must be new to the tapes, or the record would loop */
void mgL_rehead (lua_State *L, int idx, mg_tensor *const *inputs, int nin);

/* The node inputs for a call: the tensors at list[1..nargs], then the
** variables w saw that were not passed as arguments (w keeps just those).
** The array lives in a userdata pushed on the stack. */
mg_tensor **mgL_inputs (lua_State *L, int list, int nargs, mg_var_watcher *w, int *nvars);

/* Runs body(L) in protected mode on L for a backward rule; body gets the
** rule's node, gradients and ud from mgL_backward_ctx (which returns ud).
** A Lua error becomes MG_ERR with its message. */
mg_status mgL_backward_call (lua_State *L, mg_node *n, mg_tensor *const *dout, mg_tensor **din,
                             lua_CFunction body, void *ud, const char *what);
void *mgL_backward_ctx (lua_State *L, mg_node **n, mg_tensor *const **dout, mg_tensor ***din);
/* pushes dout[i] as a tensor, zeros when no gradient reached output i */
void  mgL_pushdout (lua_State *L, mg_node *n, mg_tensor *const *dout, int i);
/* din[j] from the value at idx (nil means zeros) when input j needs one */
void  mgL_takegrad (lua_State *L, int idx, mg_node *n, mg_tensor **din, int j, const char *who);

#endif

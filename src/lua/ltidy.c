/*
** ltidy.c — mg.tidy and mg.dispose: freeing tensors at a known point
** instead of when the collector finds them (TF.js's tidy and dispose).
**
** PyTorch frees a tensor when its last reference goes; here a tensor box
** is freed when Lua's collector finds it garbage. The pacing (lmemory.c)
** runs young collections often, but a box that lived across several ops
** has grown old and only a full collection finds it. Code that knows a
** block's temporaries are dead says so:
**   - mg.tidy(fn, ...) runs fn; every tensor box made while it runs is
**     released when it returns (or raises), except the tensors among its
**     results (in tables too), which pass to the enclosing tidy, if any;
**   - mg.dispose(x, ...) releases tensors (or tables of them) now;
**   - mg.keep(x, ...) takes tensors out of the open scopes: state that
**     code in a scope stores for later (an optimizer's slots).
** Releasing a box drops its reference: a tape or a view that shares the
** tensor keeps it, so this never frees what something else still needs;
** only the box is dead ("tensor has been released" if used again).
** The library itself runs every re-run of a forward (recompute_grad, a
** custom gradient's ctx:recompute, RevBlock's backward) in a tidy scope.
*/
#include "lbinding.h"

/* The scopes open in this Lua state: S->tidy_depth of them, and the
** state's user value MGL_UV_SCOPES, where scopes[depth] is a weak-keyed
** table of the boxes made in scope depth (weak: a box the collector finds
** garbage inside the scope goes as usual). mgL_newbox (lbox.c) adds to it. */

/* pushes the scopes table, made on first use; returns the state */
static mgL_state *push_scopes (lua_State *L) {
  mgL_state *S = mgL_pushstate(L);
  if (lua_getiuservalue(L, -1, MGL_UV_SCOPES) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, -3, MGL_UV_SCOPES);
  }
  lua_remove(L, -2);
  return S;
}

/* set[value at idx] = true */
static void set_add (lua_State *L, int set, int idx) {
  lua_pushvalue(L, idx);
  lua_pushboolean(L, 1);
  lua_rawset(L, set);
}

/* marks in table `keep` every tensor box reachable from the value at idx
** through tables (each table once), and with upvalues through functions'
** upvalues too */
static void mark_from (lua_State *L, int idx, int keep, bool upvalues) {
  idx = lua_absindex(L, idx);
  if (mgL_testbox(L, idx) != NULL) {
    set_add(L, keep, idx);
    return;
  }
  int type = lua_type(L, idx);
  if (type != LUA_TTABLE && !(upvalues && type == LUA_TFUNCTION)) return;
  lua_pushvalue(L, idx);
  if (lua_rawget(L, keep) != LUA_TNIL) { lua_pop(L, 1); return; }   /* seen */
  lua_pop(L, 1);
  set_add(L, keep, idx);
  luaL_checkstack(L, 4, "mg.tidy: results nested too deeply");
  if (type == LUA_TFUNCTION) {
    for (int i = 1; lua_getupvalue(L, idx, i) != NULL; i++) {
      mark_from(L, -1, keep, upvalues);
      lua_pop(L, 1);
    }
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    mark_from(L, -1, keep, upvalues);
    mark_from(L, -2, keep, upvalues);
    lua_pop(L, 1);
  }
}

static void mark (lua_State *L, int idx, int keep) { mark_from(L, idx, keep, false); }

/* Takes the innermost scope off (nothing that can raise: an error later
** only leaves its boxes to the collector) and pushes its boxes, then the
** enclosing scope's (or nil). */
static void pop_scope (lua_State *L) {
  mgL_state *S = push_scopes(L);
  int depth = S->tidy_depth;
  lua_rawgeti(L, -1, depth);
  lua_rawgeti(L, -2, depth - 1);             /* nil at the outermost */
  lua_pushnil(L);
  lua_rawseti(L, -4, depth);
  S->tidy_depth--;
  lua_remove(L, -3);
}

/* Releases the boxes at idx but those in table `keep` (0: none), which
** join the enclosing scope at idx + 1 (if any). */
static void release_boxes (lua_State *L, int boxes, int keep) {
  int parent = boxes + 1;
  lua_pushnil(L);
  while (lua_next(L, boxes)) {
    lua_pop(L, 1);
    bool kept = false;
    if (keep) {
      lua_pushvalue(L, -1);
      kept = lua_rawget(L, keep) != LUA_TNIL;
      lua_pop(L, 1);
    }
    if (!kept) mgL_releasebox((ltensor *)lua_touserdata(L, -1));
    else if (lua_istable(L, parent)) set_add(L, parent, lua_gettop(L));
  }
}

/* runs the function below its nargs arguments at the top in a new scope,
** protected; afterwards the stack holds its results or its error value, as
** lua_pcall leaves them. keep_results: the results (and the tensors in
** tables among them) stay; otherwise every box made in the scope goes. */
int mgL_tidy_pcall (lua_State *L, int nargs, bool keep_results) {
  int base = lua_gettop(L) - nargs;              /* the function */
  luaL_checkstack(L, 8, "mg.tidy");
  mgL_state *S = push_scopes(L);
  lua_createtable(L, 0, 16);                     /* this scope's boxes, weak keys */
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawseti(L, -2, S->tidy_depth + 1);
  lua_pop(L, 1);
  S->tidy_depth++;
  int st = lua_pcall(L, nargs, LUA_MULTRET, 0);
  int results = lua_gettop(L);
  pop_scope(L);
  int boxes = results + 1, keep = 0;
  if (keep_results || st != LUA_OK) {            /* an error value keeps its tensors */
    lua_newtable(L);
    keep = lua_gettop(L);
    for (int i = base; i <= results; i++) mark(L, i, keep);
  }
  release_boxes(L, boxes, keep);
  lua_settop(L, results);
  return st;
}

/* tidy(fn, ...) -> fn(...)'s results */
static int l_tidy (lua_State *L) {
  mgL_checkcallable(L, 1);
  if (mgL_tidy_pcall(L, lua_gettop(L) - 1, true) != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}

/* pushes the set of the tensor boxes in arguments 1..n (tensors or tables
** of them), found as tidy finds its results */
static int mark_arguments (lua_State *L, int n) {
  lua_newtable(L);
  for (int i = 1; i <= n; i++) mark(L, i, n + 1);
  return n + 1;
}

/* dispose(x, ...): tensors, tables of tensors, or nil */
static int l_dispose (lua_State *L) {
  int n = lua_gettop(L);
  for (int i = 1; i <= n; i++) {
    int t = lua_type(L, i);
    if (t != LUA_TNIL && t != LUA_TTABLE && mgL_testbox(L, i) == NULL) {
      const char *what = mgL_testvariable(L, i) ? "a Variable (it lives as long as its box)"
                                                : lua_pushfstring(L, "a %s", luaL_typename(L, i));
      return luaL_error(L, "dispose: argument %d is %s; it takes tensors or tables of them", i, what);
    }
  }
  mgL_checkrelease(L, "dispose");
  int set = mark_arguments(L, n);
  lua_pushnil(L);
  while (lua_next(L, set)) {
    lua_pop(L, 1);
    ltensor *b = mgL_testbox(L, -1);
    if (b != NULL) mgL_releasebox(b);
  }
  return 0;
}

/* the tensor boxes in set leave every open scope */
static void leave_scopes (lua_State *L, int set) {
  mgL_state *S = push_scopes(L);
  for (int d = 1; d <= S->tidy_depth; d++) {
    if (lua_rawgeti(L, -1, d) == LUA_TTABLE) {
      lua_pushnil(L);
      while (lua_next(L, set)) {
        lua_pop(L, 1);
        if (mgL_testbox(L, -1) != NULL) {
          lua_pushvalue(L, -1);
          lua_pushnil(L);
          lua_rawset(L, -4);
        }
      }
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* keep(x, ...) -> x, ...: the tensors in them (or tables of them) leave
** every open tidy scope, to live on as usual (TF.js's keep): what a scope's
** code stores for later, as an optimizer's slots */
static int l_keep (lua_State *L) {
  int n = lua_gettop(L);
  if (mgL_getstate(L)->tidy_depth == 0) return n;
  leave_scopes(L, mark_arguments(L, n));
  lua_settop(L, n);
  return n;
}

/* The tensors a function closes over (through its upvalues and their
** tables, not into loaded modules) leave every open scope: a custom
** gradient's grad_fn, or a recomputed function called in a re-run, runs
** again after the re-run that made it has ended, and needs what it
** captured. */
void mgL_tidy_keep_captured (lua_State *L, int fn) {
  if (mgL_getstate(L)->tidy_depth == 0) return;
  fn = lua_absindex(L, fn);
  luaL_checkstack(L, 8, "mg.tidy");
  lua_newtable(L);
  int set = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);   /* modules count as seen: not walked */
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    if (lua_istable(L, -1)) set_add(L, set, lua_gettop(L));
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  mark_from(L, fn, set, true);
  leave_scopes(L, set);
  lua_settop(L, set - 1);
}

void mgL_open_tidy (lua_State *L) {
  lua_pushcfunction(L, l_tidy);
  lua_setfield(L, -2, "tidy");
  lua_pushcfunction(L, l_dispose);
  lua_setfield(L, -2, "dispose");
  lua_pushcfunction(L, l_keep);
  lua_setfield(L, -2, "keep");
}

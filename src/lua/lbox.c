/*
** lbox.c — tensor and variable boxes: the userdata that stand for a tensor
** or a variable in Lua. Making them (with their metatable, joining an open
** mg.tidy scope), telling them from other values, filling and releasing
** them, their finalizers, and what may and may not happen inside one.
**
** A box is made before the C work that fills it (lauxmg.c's order): making
** it is where the collector is paced (lgc.c), before the op's result exists.
*/
#include <stdatomic.h>
#include <string.h>

#include "lbinding.h"

/* The boxes' marks (lbinding.h): constants, the same in every copy of the
** library, so two copies loaded into one state take each other's boxes,
** as they did when a box was told by its metatable. */
#define TENSOR_MARK UINT64_C(0x6d67546e73724d6b)      /* "mgTnsrMk" */
#define VARIABLE_MARK UINT64_C(0x6d6756726961626b)    /* "mgVriabk" */

#define BOXES "moongrad.variable_boxes"     /* weak: mg_variable* -> box */

_Static_assert(sizeof(ltensor) == sizeof(lvariable), "one size tells both kinds of box");

/* The tensor and variable metatables are also kept as user values of the
** binding's state: an array slot, where luaL_setmetatable hashes a name. */
void mgL_remember_metatables (lua_State *L) {
  mgL_pushstate(L);
  luaL_getmetatable(L, MG_TENSOR_MT);
  lua_setiuservalue(L, -2, MGL_UV_TENSOR_MT);
  luaL_getmetatable(L, MG_VARIABLE_MT);
  lua_setiuservalue(L, -2, MGL_UV_VARIABLE_MT);
  lua_pop(L, 1);
}

/* what the value at idx is, by its mark: TENSOR_MARK, VARIABLE_MARK or 0;
** *p gets the block (a light userdata's length is 0) */
static uint64_t box_kind (lua_State *L, int idx, void **p) {
  *p = lua_touserdata(L, idx);
  if (*p == NULL || lua_rawlen(L, idx) != sizeof(ltensor)) return 0;
  uint64_t mark = ((const ltensor *)*p)->mark;
  return mark == TENSOR_MARK || mark == VARIABLE_MARK ? mark : 0;
}

/* the userdata at idx when it is a box of that kind */
static void *udata_with (lua_State *L, int idx, uint64_t kind) {
  void *p;
  return box_kind(L, idx, &p) == kind ? p : NULL;
}

/* {==================== inside a finalizer ==================== */

/* Lua runs no finalizer for an object made while lua_close runs the
** finalizers, so a tensor made then would never be released. Inside a
** finalizer (where lua_gc answers -1) making tensors, variables or tapes is
** therefore an error. */
void mgL_checkfinalizer (lua_State *L) {
  if (lua_gc(L, LUA_GCISRUNNING) < 0)
    luaL_error(L, "moongrad: tensors, variables and tapes cannot be made inside a finalizer (__gc)");
}

/* *seen: where s was when it matched before (no strcmp per release). Lua
** names a finalizer with string literals of its own code, the same for
** every state in the process: a cache of the process, not of a state. */
static bool same_string (const char *s, const char *literal, _Atomic(const char *) *seen) {
  if (s == NULL) return false;
  if (s == atomic_load_explicit(seen, memory_order_relaxed)) return true;
  if (strcmp(s, literal) != 0) return false;
  atomic_store_explicit(seen, s, memory_order_relaxed);
  return true;
}

/* Finalizers run at any allocation, so one can run in the middle of a
** binding that holds raw pointers fetched from its arguments: releasing a
** tensor, variable or tape there (dispose, <close>, a __gc called by hand)
** would free what that binding is using. Lua's own finalization of an object
** is the one release allowed inside a finalizer: nothing can reach that
** object any more. (Lua marks the frame it interrupts to run a finalizer,
** and names the finalizer "__gc", kind "metamethod", from it.) */
void mgL_checkrelease (lua_State *L, const char *what) {
  static _Atomic(const char *) metamethod, gc_name;
  if (lua_gc(L, LUA_GCISRUNNING) >= 0) return;        /* not inside a finalizer */
  lua_Debug ar;
  if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar) && same_string(ar.namewhat, "metamethod", &metamethod) &&
      same_string(ar.name, "__gc", &gc_name))
    return;
  luaL_error(L, "%s: cannot release tensors, variables or tapes inside a finalizer (__gc): "
                "moongrad may be using them where the finalizer interrupted it", what);
}

/* A binding reads a variable's value without a reference of its own (the
** variable holds it): a finalizer that assigned the variable there freed the
** value under the op (fuzz finding M2). Inside a finalizer, changing a
** variable is an error, as releasing one is. */
void mgL_checkchange (lua_State *L, const char *what) {
  if (lua_gc(L, LUA_GCISRUNNING) < 0)
    luaL_error(L, "%s: cannot change a variable inside a finalizer (__gc): moongrad may be using its value "
                  "where the finalizer interrupted it", what);
}

/* }========================================================== */

/* Pushes an empty box (its mark, then NULL) with the metatable of user
** value uv of the state's userdata at index state. */
static void *new_box (lua_State *L, int state, uint64_t mark, int uv) {
  void *b = lua_newuserdatauv(L, sizeof(ltensor), 0);
  memset(b, 0, sizeof(ltensor));
  *(uint64_t *)b = mark;
  lua_getiuservalue(L, state, uv);
  lua_setmetatable(L, -2);
  return b;
}

/* The box at the top joins the innermost open mg.tidy scope (ltidy.c):
** scopes[depth] is a weak-keyed table of the boxes made in it. */
static void tidy_track (lua_State *L, int depth) {
  mgL_pushstate(L);
  lua_getiuservalue(L, -1, MGL_UV_SCOPES);
  lua_replace(L, -2);
  if (lua_type(L, -1) != LUA_TTABLE || lua_rawgeti(L, -1, depth) != LUA_TTABLE) {
    lua_pop(L, lua_istable(L, -1) ? 1 : 2);
    return;
  }
  lua_pushvalue(L, -3);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 2);
}

ltensor *mgL_newbox (lua_State *L) {
  mgL_checkfinalizer(L);
  mgL_state *S = mgL_upstate(L);
  int state = MGL_STATE_UPVALUE;        /* one of the binding's functions: its upvalue */
  if (S == NULL) {                      /* else the registry's, pushed for the while */
    S = mgL_pushstate(L);
    state = lua_gettop(L);
  }
  mgL_gc_pressure(L, S);
  ltensor *b = (ltensor *)new_box(L, state, TENSOR_MARK, MGL_UV_TENSOR_MT);
  if (state != MGL_STATE_UPVALUE) lua_remove(L, state);
  if (S->tidy_depth > 0) tidy_track(L, S->tidy_depth);
  return b;
}

lvariable *mgL_newvariablebox (lua_State *L) {
  mgL_pushstate(L);
  lvariable *b = (lvariable *)new_box(L, lua_gettop(L), VARIABLE_MARK, MGL_UV_VARIABLE_MT);
  lua_remove(L, -2);
  return b;
}

void mgL_releasebox (ltensor *box) {
  mg_tensor_release(box->t);
  box->t = NULL;
}

ltensor *mgL_testbox (lua_State *L, int arg) {
  return (ltensor *)udata_with(L, arg, TENSOR_MARK);
}

lvariable *mgL_testvariablebox (lua_State *L, int arg) {
  return (lvariable *)udata_with(L, arg, VARIABLE_MARK);
}

int mgL_fill (lua_State *L, ltensor *box, mg_tensor *t) {
  if (t == NULL) return mgL_error(L);
  box->t = t;
  return 1;
}

int mgL_error (lua_State *L) {
  return luaL_error(L, "%s", mg_errmsg_based(1));   /* positions 1-based, as Lua counts */
}

void mgL_pushtensor (lua_State *L, mg_tensor *t) {
  if (t == NULL) {
    mgL_error(L);
    return;
  }
  mgL_newbox(L)->t = t;
}

int mgL_tensor_gc (lua_State *L) {      /* also __close */
  ltensor *b = mgL_testbox(L, 1);
  if (b == NULL) return luaL_checkudata(L, 1, MG_TENSOR_MT), 0;
  if (b->t == NULL) return 0;
  mgL_checkrelease(L, "tensor");
  mgL_releasebox(b);
  mgL_sweep_dead(L);                    /* a node it held may have been a recompute's */
  return 0;
}

/* {==================== what a box holds ===================== */

/* A box whose __gc ran (called by hand, or resurrected by a finalizer)
** holds nothing: using it is an error, never a crash. */
static mg_variable *variable_in (lua_State *L, lvariable *b) {
  if (b->v == NULL) luaL_error(L, "variable has been released");
  return b->v;
}

mg_variable *mgL_testvariable (lua_State *L, int arg) {
  lvariable *b = mgL_testvariablebox(L, arg);
  return b ? variable_in(L, b) : NULL;
}

mg_variable *mgL_checkvariable (lua_State *L, int arg) {
  mg_variable *v = mgL_testvariable(L, arg);
  if (v == NULL) luaL_typeerror(L, arg, MG_VARIABLE_MT);     /* luaL_checkudata's message */
  return v;
}

mg_tensor *mgL_testtensor (lua_State *L, int arg) {
  void *p;
  uint64_t kind = box_kind(L, arg, &p);
  if (kind == TENSOR_MARK) {
    ltensor *b = (ltensor *)p;
    if (b->t == NULL) luaL_error(L, "tensor has been released (by mg.dispose, mg.tidy, a <close> variable, or the end of a "
                                    "re-run: keep nothing from a run where mg.is_recomputing() is true)");
    return b->t;
  }
  return kind == VARIABLE_MARK ? mg_variable_peek(variable_in(L, (lvariable *)p)) : NULL;
}

mg_tensor *mgL_checktensor (lua_State *L, int arg) {
  mg_tensor *t = mgL_testtensor(L, arg);
  if (t == NULL) {
    const char *msg = lua_pushfstring(L, "moongrad.Tensor expected, got %s", luaL_typename(L, arg));
    luaL_argerror(L, arg, msg);
  }
  return t;
}

/* }========================================================== */

/* {===================== variable boxes ====================== */
/* One mg_variable has one userdata: a weak table in the registry maps the
** C object to its box, so watched_variables() and custom gradients hand
** back the very object the user created. */

void mgL_open_boxes (lua_State *L) {
  lua_newtable(L);                                /* the weak box table */
  lua_newtable(L);
  lua_pushstring(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, BOXES);
}

void mgL_registervariablebox (lua_State *L, int box) {
  box = lua_absindex(L, box);
  lua_getfield(L, LUA_REGISTRYINDEX, BOXES);
  lua_pushvalue(L, box);
  lua_rawsetp(L, -2, ((lvariable *)lua_touserdata(L, box))->v);
  lua_pop(L, 1);
}

int mgL_variable_gc (lua_State *L) {     /* may run twice: by hand, then by Lua */
  lvariable *b = mgL_testvariablebox(L, 1);
  if (b == NULL) return luaL_checkudata(L, 1, MG_VARIABLE_MT), 0;   /* another userdata in its metatable */
  if (b->v == NULL) return 0;
  mgL_checkrelease(L, "Variable");
  mg_variable_release(b->v);
  b->v = NULL;
  return 0;
}

void mgL_pushvariable (lua_State *L, mg_variable *v) {
  lua_getfield(L, LUA_REGISTRYINDEX, BOXES);
  if (lua_rawgetp(L, -1, v) != LUA_TNIL && ((lvariable *)lua_touserdata(L, -1))->v != NULL) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 1);
  lvariable *b = mgL_newvariablebox(L);
  b->v = mg_variable_retain(v);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, -3, v);
  lua_remove(L, -2);
}

/* }========================================================== */

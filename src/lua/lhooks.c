/*
** lhooks.c — mg.saved_tensors_hooks: Lua's pack and unpack, or the core's
** float16, bfloat16 and offload hooks, around what tapes save (autodiff's
** hooks.c).
*/
#include <stdlib.h>
#include <string.h>

#include "lfunction.h"

/* {================== saved-tensor hooks ===================== */

/* Lua's pack and unpack, in an lfn whose table is {pack=, unpack=}; they
** run on the thread asking for a gradient, or else on the one that pushed
** them (the forward runs there) */
typedef struct lhooks { lfn u; lua_State *pusher; } lhooks;

typedef struct hook_args { lhooks *hk; const char *which; mg_tensor *t; mg_tensor *out; } hook_args;

static int hook_body (lua_State *L) {
  hook_args *a = (hook_args *)lua_touserdata(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, a->hk->u.ref);
  lua_getfield(L, -1, a->which);
  mgL_pushretained(L, a->t);
  lua_call(L, 1, 1);
  mg_tensor *r = mgL_testtensor(L, -1);
  if (r == NULL)
    return luaL_error(L, "saved_tensors_hooks: %s must return a tensor, got %s", a->which,
                      luaL_typename(L, -1));
  a->out = mg_tensor_retain(r);
  return 0;
}

static mg_tensor *run_hook (void *ud, mg_tensor *t, const char *which) {
  lhooks *hk = (lhooks *)ud;
  if (hk->u.a->L == NULL)
    return mg_seterror("saved_tensors_hooks: the Lua state that pushed them has been closed"), NULL;
  lua_State *L = hk->u.a->running ? hk->u.a->running : hk->pusher;
  hook_args a = {hk, which, t, NULL};
  return mgL_protected(L, hook_body, &a) == MG_OK ? a.out : NULL;
}

static mg_tensor *lua_pack (void *ud, mg_tensor *t) { return run_hook(ud, t, "pack"); }
static mg_tensor *lua_unpack (void *ud, mg_tensor *p, mg_dtype dt) {
  (void)dt;
  return run_hook(ud, p, "unpack");
}
static void lua_hooks_release (void *ud) { mgL_lfn_release(ud); }   /* lfn is lhooks' first field */

static const mg_saved_hooks lua_hooks = {lua_pack, lua_unpack, lua_hooks_release};

/* pushes the hooks named by the arguments from 1, once every argument is
** checked (a bad call must leave no hooks behind); returns where fn is */
static int push_hooks (lua_State *L) {
  if (lua_isfunction(L, 1)) {                       /* pack, unpack, fn, ... */
    luaL_checktype(L, 2, LUA_TFUNCTION);
    mgL_checkcallable(L, 3);
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, 1);
    lua_setfield(L, -2, "pack");
    lua_pushvalue(L, 2);
    lua_setfield(L, -2, "unpack");
    lhooks *hk = (lhooks *)malloc(sizeof(lhooks));
    if (hk == NULL) return luaL_error(L, "out of memory");
    lfn *u = mgL_lfn_new(L, false, NULL);
    hk->u = *u;                                     /* the lfn's fields, owned by hk now */
    free(u);
    hk->pusher = L;
    if (mg_saved_hooks_push(&lua_hooks, hk) != MG_OK) return mgL_error(L);
    return 3;
  }
  if (lua_type(L, 1) == LUA_TSTRING) {              /* "float16" or "bfloat16", fn, ... */
    const char *name = lua_tostring(L, 1);
    const mg_saved_hooks *h = strcmp(name, "float16") == 0 ? &mg_hooks_float16
                            : strcmp(name, "bfloat16") == 0 ? &mg_hooks_bfloat16 : NULL;
    if (h == NULL)
      return luaL_argerror(L, 1, lua_pushfstring(L, "\"float16\", \"bfloat16\", {offload = dir} or a "
                                                    "pack function expected, got \"%s\"", name));
    mgL_checkcallable(L, 2);
    if (mg_saved_hooks_push(h, NULL) != MG_OK) return mgL_error(L);
    return 2;
  }
  if (lua_istable(L, 1)) {                          /* {offload = dir}, fn, ... */
    static const char *const keys[] = {"offload", NULL};
    mgL_checkoptions(L, 1, keys);
    if (mgL_optionfield(L, 1, "offload", LUA_TSTRING) == LUA_TNIL)
      return luaL_argerror(L, 1, "option 'offload' (a directory) expected");
    mgL_checkcallable(L, 2);
    void *dir = mg_hooks_offload_dir(mgL_checkpath(L, lua_gettop(L), "saved_tensors_hooks"));
    if (dir == NULL || mg_saved_hooks_push(&mg_hooks_offload, dir) != MG_OK) return mgL_error(L);
    lua_pop(L, 1);
    return 2;
  }
  return luaL_argerror(L, 1, lua_pushfstring(L, "\"float16\", \"bfloat16\", {offload = dir} or a pack "
                                                "function expected, got %s", luaL_typename(L, 1)));
}

/* saved_tensors_hooks(hooks..., fn, ...): runs fn(...) with every tensor a
** tape saves going through the hooks; returns fn's results */
static int l_saved_tensors_hooks (lua_State *L) {
  int f = push_hooks(L);
  lua_pushvalue(L, f);
  lua_insert(L, f + 1);
  int base = f;                                     /* fn's copy sits at f + 1 */
  int st = lua_pcall(L, lua_gettop(L) - base - 1, LUA_MULTRET, 0);
  mg_saved_hooks_pop();
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L) - base;
}

/* }========================================================== */

void mgL_open_hooks (lua_State *L) {
  lua_pushcfunction(L, l_saved_tensors_hooks);
  lua_setfield(L, -2, "saved_tensors_hooks");
}

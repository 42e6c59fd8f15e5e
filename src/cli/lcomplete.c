/*
** lcomplete.c — the names that complete a word, for the REPL's Tab
** (src/cli/main.c, through readline) and the Jupyter kernel's complete_request
** (src/kernel/lkernel.c): one rule for both.
**
** A word is "name", "a.b.name" or "a.b:name": the path before the last '.'
** or ':' is looked up from the globals, and its fields (its callable fields
** after ':') that start with name are the candidates, each with the path in
** front; keywords complete a bare name. Everything is read raw, so no
** metamethod runs, except the __index of the moongrad module and of mg.nn,
** which load mg.nn, nn.RevBlock and the like on first use.
*/
#include <ctype.h>
#include <string.h>

#include <lua.h>
#include <lauxlib.h>

#include "cli/lcomplete.h"

#define MAXCHAIN 8                      /* __index tables completion follows */

static const char *const keywords[] = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
  "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while", NULL
};

/* can s (of length len) follow a '.' or a ':'? */
static int isname (const char *s, size_t len) {
  if (strlen(s) != len || (!isalpha((unsigned char)s[0]) && s[0] != '_')) return 0;
  for (const char *p = s; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_') return 0;
  for (int i = 0; keywords[i]; i++)
    if (strcmp(s, keywords[i]) == 0) return 0;
  return 1;
}

/* pushes t[k] for the table at t, without metamethods; returns its type */
static int rawfield (lua_State *L, int t, const char *k) {
  t = lua_absindex(L, t);
  lua_pushstring(L, k);
  return lua_rawget(L, t);
}

/* is the value at v the same as registry[k]? */
static int isregistered (lua_State *L, int v, const char *k) {
  v = lua_absindex(L, v);
  lua_getfield(L, LUA_REGISTRYINDEX, k);       /* the registry has no metatable: raw */
  int same = lua_rawequal(L, v, -1);
  lua_pop(L, 1);
  return same;
}

/* is the value at v the moongrad module or mg.nn? Their __index loads
** parts on first use (mg.nn, nn.RevBlock), and is safe to call */
static int ismodule (lua_State *L, int v) {
  static const char *const modules[] = {"moongrad", "moongrad.nn"};
  v = lua_absindex(L, v);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  int same = 0;
  for (int i = 0; i < 2 && !same; i++) {
    rawfield(L, -1, modules[i]);
    same = lua_rawequal(L, v, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return same;
}

static int callable (lua_State *L, int v) {
  if (lua_type(L, v) == LUA_TFUNCTION) return 1;
  if (!lua_getmetatable(L, v)) return 0;
  int t = rawfield(L, -1, "__call");
  lua_pop(L, 2);
  return t != LUA_TNIL;
}

/* appends the value at the top to the list at `list` if it is a table; pops it */
static void addsource (lua_State *L, int list) {
  if (lua_istable(L, -1)) lua_rawseti(L, list, (lua_Integer)lua_rawlen(L, list) + 1);
  else lua_pop(L, 1);
}

/*
** Where the fields behind an __index function (fn, of metatable mt) live,
** found without calling it: moongrad tensors and variables keep methods in
** the registry's "moongrad.methods" and in the function's upvalues, and
** compute a few properties; other metatables are taken as class tables
** holding their methods (with __parent for inheritance, as moongrad.nn).
*/
static void hiddensources (lua_State *L, int mt, int fn, int list) {
  int tensor = isregistered(L, mt, "moongrad.Tensor");
  if (tensor || isregistered(L, mt, "moongrad.Variable")) {
    static const char *const props[] = {"shape", "dtype", "ndim", "name", "trainable"};
    lua_getfield(L, LUA_REGISTRYINDEX, "moongrad.methods");
    addsource(L, list);
    for (int i = 1; lua_getupvalue(L, fn, i) != NULL; i++) addsource(L, list);
    lua_createtable(L, 0, 5);
    for (int i = 0; i < (tensor ? 3 : 5); i++) {
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, props[i]);
    }
    addsource(L, list);
    return;
  }
  lua_pushvalue(L, mt);
  for (int depth = 0; depth < MAXCHAIN && lua_istable(L, -1); depth++) {
    lua_pushvalue(L, -1);
    addsource(L, list);
    rawfield(L, -1, "__parent");
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
}

/*
** Pushes a list of the tables whose keys are the fields of the value at v,
** nearest first: v itself, then the chain of __index tables. Everything is
** read raw, so no metamethod runs; returns the list's index.
*/
static int getsources (lua_State *L, int v) {
  v = lua_absindex(L, v);
  lua_newtable(L);
  int list = lua_gettop(L);
  lua_pushvalue(L, v);
  addsource(L, list);                                    /* v itself, if a table */
  lua_pushvalue(L, v);                                   /* list obj */
  for (int depth = 0; depth < MAXCHAIN && lua_getmetatable(L, -1); depth++) {
    lua_replace(L, -2);                                  /* list mt */
    int mt = lua_gettop(L);
    int t = rawfield(L, mt, "__index");                  /* list mt index */
    if (t == LUA_TFUNCTION) hiddensources(L, mt, mt + 1, list);
    if (t != LUA_TTABLE) break;
    lua_pushvalue(L, -1);
    addsource(L, list);
    lua_replace(L, mt);                                  /* list index: on to its metatable */
  }
  lua_settop(L, list);
  return list;
}

/* pushes field k of the value at v, or nil; the only __index it calls is
** the moongrad module's and mg.nn's, which load parts on first use */
static void safefield (lua_State *L, int v, const char *k) {
  v = lua_absindex(L, v);
  if (ismodule(L, v)) {
    lua_getfield(L, v, k);
    return;
  }
  int list = getsources(L, v);
  int n = (int)lua_rawlen(L, list);
  lua_pushnil(L);
  for (int i = 1; i <= n && lua_isnil(L, -1); i++) {
    lua_pop(L, 1);
    lua_rawgeti(L, list, i);
    rawfield(L, -1, k);
    lua_remove(L, -2);
  }
  lua_remove(L, list);
}

/* replaces the value at the top by the value of the dotted path p[0..len)
** in it; returns 0 (the top is then undefined) if there is none */
static int walkpath (lua_State *L, const char *p, size_t len) {
  const char *end = p + len;
  while (p < end) {
    const char *dot = memchr(p, '.', (size_t)(end - p));
    if (dot == NULL) dot = end;
    size_t lk = (size_t)(dot - p);
    const char *k = lua_pushlstring(L, p, lk);                     /* v k */
    if (!isname(k, lk)) return 0;                                  /* "a:b.c", "a..b", "1.5" */
    safefield(L, -2, k);                                           /* v k v.k */
    lua_replace(L, -3);
    lua_pop(L, 1);
    if (lua_isnil(L, -1)) return 0;
    p = dot + 1;
  }
  return 1;
}

/* set[prefix .. key] = true for each key at -2 that completes word; after a ':'
** (methods) only callable values; _names only when word starts with '_' */
static void addmatch (lua_State *L, int set, const char *prefix, const char *word,
                      int methods) {
  size_t len, lw = strlen(word);
  if (lua_type(L, -2) != LUA_TSTRING) return;
  const char *k = lua_tolstring(L, -2, &len);
  if (len < lw || memcmp(k, word, lw) != 0 || !isname(k, len)) return;
  if (k[0] == '_' && word[0] != '_') return;
  if (methods && !callable(L, -1)) return;
  lua_pushfstring(L, "%s%s", prefix, k);
  lua_pushboolean(L, 1);
  lua_rawset(L, set);
}

/* adds the fields of the value at v that complete word to the set at set */
static void addfields (lua_State *L, int v, int set, const char *prefix, const char *word,
                       int methods) {
  int list = getsources(L, v);
  for (lua_Integer i = 1; lua_rawgeti(L, list, i) == LUA_TTABLE; i++) {   /* list t */
    lua_pushnil(L);
    while (lua_next(L, -2)) {                                          /* list t k v */
      addmatch(L, set, prefix, word, methods);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_settop(L, list - 1);
}

/* mg.nn, mg.optim, ... before they are loaded: package.preload["moongrad.nn"] */
static void addsubmodules (lua_State *L, int set, const char *prefix, const char *word) {
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return; }
  lua_pushnil(L);
  while (lua_next(L, -2)) {                                            /* preload k v */
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "";
    if (strncmp(k, "moongrad.", 9) == 0) {
      lua_pushstring(L, k + 9);
      lua_insert(L, -2);                                               /* preload k name v */
      addmatch(L, set, prefix, word, 0);
      lua_remove(L, -2);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/*
** The completions of text (a light userdata), run under lua_pcall; returns
** them as an array of strings. text is "name", "a.b.name" or "a.b:name":
** the path before the last '.' or ':' is looked up from the globals, and
** its fields (its callable fields after ':') that start with name are the
** candidates, each with the path in front; keywords complete a bare name.
*/
int mgL_complete (lua_State *L) {
  const char *text = (const char *)lua_touserdata(L, 1);
  const char *sep = NULL;
  for (const char *p = text; *p; p++)
    if (*p == '.' || *p == ':') sep = p;
  lua_newtable(L);                                       /* 2: set of completions */
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);   /* 3: the value of the path */
  if (sep == NULL) {
    for (int i = 0; keywords[i]; i++)
      if (strncmp(keywords[i], text, strlen(text)) == 0) {
        lua_pushboolean(L, 1);
        lua_setfield(L, 2, keywords[i]);
      }
    addfields(L, 3, 2, "", text, 0);
  } else if (walkpath(L, text, (size_t)(sep - text))) {
    const char *prefix = lua_pushlstring(L, text, (size_t)(sep + 1 - text));
    addfields(L, 3, 2, prefix, sep + 1, *sep == ':');
    if (*sep == '.' && ismodule(L, 3)) addsubmodules(L, 2, prefix, sep + 1);
  }
  lua_newtable(L);
  int n = 0;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_rawseti(L, -3, ++n);
  }
  return 1;
}

/*
** lio.c — the Lua side of src/io/: mg.save and mg.load (safetensors), and
** the dataset readers, which mg.data (lua/moongrad/data.lua) exposes from
** mg._io.
*/
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lbinding.h"

#define FILE_MT "moongrad.io.File"      /* a loaded file's tensors, until boxed */
#define CSV_MT "moongrad.io.CsvTable"   /* a CSV file's tensors and names, until boxed */
#define MAX_DEPTH 64                    /* nesting of the tables mg.save flattens */

/* raises mg_errmsg(), with the C function's name cname replaced by luaname */
static int raise_as (lua_State *L, const char *cname, const char *luaname) {
  const char *m = mg_errmsg_based(1);
  size_t k = strlen(cname);
  if (strncmp(m, cname, k) == 0 && m[k] == ':') return luaL_error(L, "%s%s", luaname, m + k);
  return luaL_error(L, "%s", m);
}


/* {======================== mg.save ========================== */

/* the key at -2 as a name part: a string (without NUL, which C would cut
** the name at), or an integer in decimal */
static const char *key_part (lua_State *L, const char *prefix) {
  if (lua_type(L, -2) == LUA_TSTRING) {
    if (mgL_hasnul(L, -2))
      luaL_error(L, "save: the tensor name '%s%s%s' contains a NUL byte", prefix, *prefix ? "/" : "",
                 mgL_shownul(L, -2));
    return lua_tostring(L, -2);
  }
  if (lua_isinteger(L, -2)) return lua_pushfstring(L, "%I", lua_tointeger(L, -2));   /* left on the stack */
  return luaL_error(L, "save: the tensors table%s%s has a key of type %s; names are strings (or integers)",
                    *prefix ? " at " : "", prefix, luaL_typename(L, -2)), NULL;
}

/* Adds the tensors of the table at idx (nested tables too, their names
** joined with "/") to the table out: name -> tensor. seen holds the tables
** on the way down. */
static void flatten (lua_State *L, int idx, const char *prefix, int out, int seen, int depth) {
  if (depth > MAX_DEPTH) luaL_error(L, "save: the tensors table nests more than %d deep at '%s'", MAX_DEPTH, prefix);
  luaL_checkstack(L, 8, "save: the tensors table nests too deep");
  lua_pushvalue(L, idx);
  if (lua_rawget(L, seen) != LUA_TNIL) luaL_error(L, "save: the tensors table contains itself at '%s'", prefix);
  lua_pop(L, 1);
  lua_pushvalue(L, idx);
  lua_pushboolean(L, 1);
  lua_rawset(L, seen);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int top = lua_gettop(L);
    const char *part = key_part(L, prefix);
    const char *name = *prefix ? lua_pushfstring(L, "%s/%s", prefix, part) : lua_pushstring(L, part);
    if (mgL_testtensor(L, top)) {
      if (lua_getfield(L, out, name) != LUA_TNIL)
        luaL_error(L, "save: the name '%s' is given twice (a nested table's names are joined with '/')", name);
      lua_pop(L, 1);
      lua_pushvalue(L, top);
      lua_setfield(L, out, name);
    } else if (lua_type(L, top) == LUA_TTABLE && lua_getmetatable(L, top) == 0) {
      flatten(L, top, name, out, seen, depth + 1);
    } else {
      luaL_error(L, "save: tensors['%s'] is %s, not a tensor (or a table of tensors)", name,
                 luaL_typename(L, top));
    }
    lua_settop(L, top - 1);                           /* the key, for lua_next */
  }
  lua_pushvalue(L, idx);
  lua_pushnil(L);
  lua_rawset(L, seen);
}

static int compare_names (const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* save(path, tensors [, {metadata = {key = "value"}}]): tensors is name ->
** tensor (or variable); nested tables are flattened, their names joined
** with "/". The header lists them sorted by name. A NUL byte in the path, a
** name or the metadata is an error (C strings would end there). */
static int l_save (lua_State *L) {
  const char *path = mgL_checkpath(L, 1, "save");
  luaL_checktype(L, 2, LUA_TTABLE);
  static const char *const keys[] = {"metadata", NULL};
  mgL_checkoptions(L, 3, keys);
  lua_settop(L, 3);
  lua_newtable(L);                                    /* 4: name -> tensor */
  lua_newtable(L);                                    /* 5: tables on the way down */
  flatten(L, 2, "", 4, 5, 0);
  int n = 0, nmeta = 0;
  lua_pushnil(L);
  while (lua_next(L, 4)) { lua_pop(L, 1); n++; }
  if (!lua_isnil(L, 3) && mgL_optionfield(L, 3, "metadata", LUA_TTABLE) == LUA_TTABLE) {
    lua_replace(L, 5);                                /* 5: the metadata */
    lua_pushnil(L);
    while (lua_next(L, 5)) {
      if (lua_type(L, -2) != LUA_TSTRING)
        luaL_argerror(L, 3, lua_pushfstring(L, "metadata keys must be strings, got %s", luaL_typename(L, -2)));
      if (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER)
        luaL_argerror(L, 3, lua_pushfstring(L, "metadata['%s'] must be a string, got %s", lua_tostring(L, -2),
                                            luaL_typename(L, -1)));
      if (mgL_hasnul(L, -2))
        luaL_argerror(L, 3, lua_pushfstring(L, "metadata key '%s' contains a NUL byte", mgL_shownul(L, -2)));
      if (lua_type(L, -1) == LUA_TSTRING && mgL_hasnul(L, -1))
        luaL_argerror(L, 3, lua_pushfstring(L, "metadata['%s'] contains a NUL byte", lua_tostring(L, -2)));
      lua_pop(L, 1);
      nmeta++;
    }
  } else {
    lua_settop(L, 4);
    lua_pushnil(L);                                   /* 5: no metadata */
  }
  /* the C arrays live in userdata, so an error cannot leak them */
  const char **names = (const char **)lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);  /* 6 */
  mg_tensor **tensors = (mg_tensor **)lua_newuserdatauv(L, sizeof(mg_tensor *) * (size_t)(n + 1), 0);  /* 7 */
  const char **mk = (const char **)lua_newuserdatauv(L, sizeof(char *) * (size_t)(2 * nmeta + 1), 0);  /* 8 */
  int i = 0;
  lua_pushnil(L);
  while (lua_next(L, 4)) {
    lua_pop(L, 1);
    names[i++] = lua_tostring(L, -1);                 /* kept alive as a key of table 4 */
  }
  qsort(names, (size_t)n, sizeof(char *), compare_names);
  for (i = 0; i < n; i++) {
    lua_getfield(L, 4, names[i]);
    tensors[i] = mgL_checktensor(L, -1);              /* held by table 4 */
    lua_pop(L, 1);
  }
  if (nmeta > 0) {                                    /* sorted too: the same table, the same bytes */
    i = 0;
    lua_pushnil(L);
    while (lua_next(L, 5)) {
      lua_pop(L, 1);
      mk[i++] = lua_tostring(L, -1);                  /* kept alive as a key of table 5 */
    }
    qsort(mk, (size_t)nmeta, sizeof(char *), compare_names);
    lua_createtable(L, nmeta, 0);                     /* 9: the values as strings, kept alive */
    for (i = 0; i < nmeta; i++) {
      lua_getfield(L, 5, mk[i]);
      lua_tostring(L, -1);                            /* a number becomes a string */
      lua_rawseti(L, 9, i + 1);
      lua_rawgeti(L, 9, i + 1);
      mk[nmeta + i] = lua_tostring(L, -1);
      lua_pop(L, 1);
    }
  }
  if (mg_save_safetensors(path, n, names, tensors, nmeta, mk, mk + nmeta) != MG_OK)
    return raise_as(L, "save_safetensors", "save");
  return 0;
}

/* }========================================================== */


/* {======================== mg.load ========================== */

typedef struct lfile { mg_named_tensors *f; } lfile;

static int file_gc (lua_State *L) {
  lfile *h = (lfile *)luaL_checkudata(L, 1, FILE_MT);
  mg_named_tensors_free(h->f);
  h->f = NULL;
  return 0;
}

/* load(path) -> tensors (name -> tensor), metadata (key -> string) */
static int l_load (lua_State *L) {
  const char *path = mgL_checkpath(L, 1, "load");
  lfile *h = (lfile *)lua_newuserdatauv(L, sizeof(lfile), 0);
  h->f = NULL;
  luaL_setmetatable(L, FILE_MT);
  if ((h->f = mg_load_safetensors(path)) == NULL) return raise_as(L, "load_safetensors", "load");
  mg_named_tensors *f = h->f;
  lua_createtable(L, 0, f->n);
  for (int i = 0; i < f->n; i++) {
    ltensor *box = mgL_newbox(L);
    mgL_fill(L, box, mg_tensor_retain(f->tensors[i]));
    lua_setfield(L, -2, f->names[i]);
  }
  lua_createtable(L, 0, f->nmeta);
  for (int i = 0; i < f->nmeta; i++) {
    lua_pushstring(L, f->meta_values[i]);
    lua_setfield(L, -2, f->meta_keys[i]);
  }
  mg_named_tensors_free(h->f);                        /* the boxes hold the tensors now */
  h->f = NULL;
  return 2;
}

/* }========================================================== */


/* {===================== dataset readers ===================== */

/* read_idx(path [, {dtype=}]) */
static int l_read_idx (lua_State *L) {
  const char *path = mgL_checkpath(L, 1, "read_idx");
  static const char *const keys[] = {"dtype", NULL};
  mgL_checkoptions(L, 2, keys);
  int dt = -1;
  if (!lua_isnoneornil(L, 2) && lua_getfield(L, 2, "dtype") != LUA_TNIL) {
    dt = (int)mgL_dtypeat(L, -1, 2, "option 'dtype'");
    if (dt == MG_BOOL) luaL_argerror(L, 2, "option 'dtype': an IDX file cannot be read as bool");
  }
  ltensor *box = mgL_newbox(L);
  return mgL_fill(L, box, mg_read_idx(path, dt));
}

/* a column picked at idx (a name, or a number from 1) into *c; what names
** it in errors ("option 'label'") */
static void check_column (lua_State *L, int idx, mg_csv_column *c, const char *what) {
  c->name = NULL;
  c->number = 0;
  if (lua_type(L, idx) == LUA_TSTRING) {
    if (mgL_hasnul(L, idx))
      luaL_argerror(L, 2, lua_pushfstring(L, "%s: the name '%s' contains a NUL byte", what, mgL_shownul(L, idx)));
    c->name = lua_tostring(L, idx);
  } else if (lua_isinteger(L, idx) && lua_tointeger(L, idx) >= 1) {
    c->number = lua_tointeger(L, idx);
  } else {
    const char *got = lua_type(L, idx) == LUA_TNUMBER ? lua_pushfstring(L, "%s", luaL_tolstring(L, idx, NULL))
                                                      : luaL_typename(L, idx);
    luaL_argerror(L, 2, lua_pushfstring(L, "%s must be a column's name or its number (from 1), got %s", what, got));
  }
}

/* option 'columns' (a list of names and numbers) into o; what it leaves on
** the stack keeps the names alive */
static void check_columns (lua_State *L, mg_csv_options *o) {
  if (mgL_optionfield(L, 2, "columns", LUA_TTABLE) == LUA_TNIL) return;
  int list = lua_gettop(L);
  lua_Integer n = (lua_Integer)lua_rawlen(L, list);
  if (n == 0) luaL_argerror(L, 2, "option 'columns' must list at least one column (a name or a number)");
  if (n > INT_MAX / (lua_Integer)sizeof(mg_csv_column)) luaL_argerror(L, 2, "option 'columns' is too long");
  mg_csv_column *cols = (mg_csv_column *)lua_newuserdatauv(L, sizeof(mg_csv_column) * (size_t)n, 0);
  for (lua_Integer i = 1; i <= n; i++) {
    char what[64];
    snprintf(what, sizeof what, "option 'columns', item %lld", (long long)i);
    lua_rawgeti(L, list, i);                          /* kept alive by the list */
    check_column(L, -1, &cols[i - 1], what);
    lua_pop(L, 1);
  }
  o->ncolumns = (int)n;
  o->columns = cols;
}

/* the options at 2 into o, leaving on the stack what keeps names alive */
static void check_csv_options (lua_State *L, mg_csv_options *o) {
  if (mgL_optionfield(L, 2, "header", LUA_TBOOLEAN) != LUA_TNIL) o->header = lua_toboolean(L, -1) ? 1 : -1;
  if (mgL_optionfield(L, 2, "delimiter", LUA_TSTRING) != LUA_TNIL) {
    size_t len;
    const char *d = lua_tolstring(L, -1, &len);
    if (len != 1) luaL_argerror(L, 2, lua_pushfstring(L, "option 'delimiter' must be one character, got '%s'", d));
    if (d[0] == '\0')                                 /* the C reader would take it for the default ',' */
      luaL_argerror(L, 2, "option 'delimiter' must be one character other than NUL");
    o->delimiter = d[0];
  }
  if (lua_getfield(L, 2, "dtype") != LUA_TNIL) {
    o->dtype = mgL_dtypeat(L, -1, 2, "option 'dtype'");
    if (o->dtype != MG_FLOAT32 && o->dtype != MG_FLOAT64)
      luaL_argerror(L, 2, lua_pushfstring(L, "option 'dtype' must be float32 or float64, got %s",
                                          mg_dtype_name(o->dtype)));
  }
  o->label_dtype = o->dtype;
  if (lua_getfield(L, 2, "label_dtype") != LUA_TNIL) {
    o->label_dtype = mgL_dtypeat(L, -1, 2, "option 'label_dtype'");
    if (o->label_dtype != MG_FLOAT32 && o->label_dtype != MG_FLOAT64 && o->label_dtype != MG_INT64)
      luaL_argerror(L, 2, lua_pushfstring(L, "option 'label_dtype' must be float32, float64 or int64, got %s",
                                          mg_dtype_name(o->label_dtype)));
  }
  if (lua_getfield(L, 2, "label") != LUA_TNIL) check_column(L, -1, &o->label, "option 'label'");
  else if (lua_getfield(L, 2, "label_dtype") != LUA_TNIL)
    luaL_argerror(L, 2, "option 'label_dtype' is given without a label (label = a column's name or number)");
  check_columns(L, o);
}

typedef struct lcsv { mg_csv_table *t; } lcsv;

static int csv_gc (lua_State *L) {
  lcsv *h = (lcsv *)luaL_checkudata(L, 1, CSV_MT);
  mg_csv_table_free(h->t);
  h->t = NULL;
  return 0;
}

/* read_csv(path [, {header=, delimiter=",", dtype="float32", columns=, label=,
** label_dtype=}]) -> x, names; with a label: x, y, names. names lists x's
** columns' names, or is nil when the file has no header. */
static int l_read_csv (lua_State *L) {
  const char *path = mgL_checkpath(L, 1, "read_csv");
  static const char *const keys[] = {"header", "delimiter", "dtype", "columns", "label", "label_dtype", NULL};
  mgL_checkoptions(L, 2, keys);
  lua_settop(L, 2);
  mg_csv_options o = {.delimiter = ',', .dtype = MG_FLOAT32, .label_dtype = MG_FLOAT32};
  if (!lua_isnil(L, 2)) check_csv_options(L, &o);
  lcsv *h = (lcsv *)lua_newuserdatauv(L, sizeof(lcsv), 0);
  h->t = NULL;
  luaL_setmetatable(L, CSV_MT);
  if ((h->t = mg_read_csv_table(path, &o)) == NULL) return mgL_error(L);
  mg_csv_table *t = h->t;
  mgL_fill(L, mgL_newbox(L), t->x);                   /* the box owns it now */
  t->x = NULL;
  if (t->y != NULL) {
    mgL_fill(L, mgL_newbox(L), t->y);
    t->y = NULL;
  }
  if (t->names == NULL) lua_pushnil(L);
  else {
    lua_createtable(L, t->ncols > INT_MAX ? INT_MAX : (int)t->ncols, 0);
    for (int64_t i = 0; i < t->ncols; i++) {
      lua_pushstring(L, t->names[i]);
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
  }
  bool label = o.label.name != NULL || o.label.number != 0;
  mg_csv_table_free(h->t);
  h->t = NULL;
  return label ? 3 : 2;
}

/* }========================================================== */

static const luaL_Reg io_funcs[] = {
  {"read_idx", l_read_idx}, {"read_csv", l_read_csv}, {"save", l_save}, {"load", l_load}, {NULL, NULL}
};

void mgL_open_io (lua_State *L) {
  if (luaL_newmetatable(L, FILE_MT)) {
    lua_pushcfunction(L, file_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, CSV_MT)) {
    lua_pushcfunction(L, csv_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  mgL_newlib(L, io_funcs);                           /* mg._io: for mg.data */
  lua_getfield(L, -1, "save");
  lua_setfield(L, -3, "save");
  lua_getfield(L, -1, "load");
  lua_setfield(L, -3, "load");
  lua_setfield(L, -2, "_io");
}

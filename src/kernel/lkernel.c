/*
** lkernel.c — moongrad --kernel CONNECTION_FILE: a Jupyter kernel (messaging
** protocol 5.3), as IPython is for Python and xeus-lua for plain Lua.
**
** The sockets are the connection file's (bound to its transport and ip
** only): shell and control (ROUTER) are served by the main thread, which
** runs the Lua code; heartbeat (REP) echoes on a thread of its own; iopub
** (PUB) carries status, the code being run, its output and results; stdin
** is bound but input is not asked for (io.read reads /dev/null). The wire
** format and its HMAC signatures are src/kernel/wire.c. Every socket takes
** frames of at most MG_KMAXFRAME bytes (16 MiB, kernel.h).
**
** Output: fds 1 and 2 are pipes read by a thread (src/kernel/output.c), sent
** as stream messages (stdout, stderr), so print, io.write, the library's C
** writes and child processes all reach the notebook as they happen. Before
** a result, a display or a reply, everything written so far is sent first.
**
** Interrupt: SIGINT (Jupyter's interrupt_mode "signal") stops the running
** Lua code with an error, as lua.c's laction does (a hook at the next step,
** and mg_interrupt for the library's long C loops); the state is kept. An
** interrupt_request on the control socket does the same, seen by a count
** hook while code runs.
**
** A cell that fails makes the executes queued behind it (a "Run All") answer
** "aborted" without running, as IPython does.
**
** Lua code reaches the kernel through package.loaded["moongrad.kernel"]
** (send, base64), which lua/moongrad/notebook.lua uses: results, displays,
** plots and progress bars as rich output.
*/
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>
#include <cjson/cJSON.h>

#include <lua.h>
#include <lauxlib.h>

#include "moongrad.h"
#include "kernel/kernel.h"
#include "cli/lcomplete.h"
#include "kernel/lkernel.h"

#define EOFMARK    "<eof>"
#define KMODULE    "moongrad.kernel"     /* package.loaded[KMODULE]: the notebook's link */
#define POLL_EVERY 100000                /* Lua instructions between looks at control */
#define LINGER_MS  1000                  /* what may still go out at shutdown */

typedef struct Kernel {
  lua_State *L;
  mg_kconn conn;
  char session[37];
  void *ctx, *sock[5];
  pthread_t hb;
  int hb_started;
  pthread_mutex_t lock;        /* iopub and parent: the reader thread publishes too */
  const cJSON *parent;         /* the header of the request being served */
  mg_kout *out;                /* fds 1 and 2, read as they are written */
  int logfd;                   /* fd 2 as Jupyter gave it: the kernel's log */
  int count;                   /* execution_count */
  const mg_kmsg *request;      /* the execute_request running, for input_request */
  int allow_stdin;             /* its allow_stdin */
  cJSON *history;              /* [[1, n, code], ...] */
  mg_kseen seen;               /* every good signature so far: replays are refused */
  int quit, restart;
} Kernel;

static Kernel *K;                        /* the signal handler's way in */
static volatile sig_atomic_t running;    /* Lua code is running: SIGINT stops it */

/* {========================= iopub ========================== */

static void publish (Kernel *k, const char *type, cJSON *content) {
  pthread_mutex_lock(&k->lock);
  mg_kmsg_send(k->sock[MG_KIOPUB], k->conn.key, k->session, NULL, k->parent, type, content);
  pthread_mutex_unlock(&k->lock);
}

static void set_parent (Kernel *k, const cJSON *header) {
  pthread_mutex_lock(&k->lock);
  k->parent = header;
  pthread_mutex_unlock(&k->lock);
}

static void status (Kernel *k, const char *state) {
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "execution_state", state);
  publish(k, "status", c);
}

static void reply (Kernel *k, int which, const mg_kmsg *m, const char *type, cJSON *content) {
  mg_kmsg_send(k->sock[which], k->conn.key, k->session, m, m->header, type, content);
}

/* }========================================================== */


/* {========================= output ========================= */

/* the output thread's text, as a stream message (src/kernel/output.c) */
static void on_output (void *ud, const char *name, const char *text, size_t n) {
  cJSON *content = cJSON_CreateObject();
  cJSON_AddStringToObject(content, "name", name);
  cJSON_AddItemToObject(content, "text", mg_ktext(text, n));
  publish((Kernel *)ud, "stream", content);
}

/* everything written so far is sent before what comes next */
static void sync_output (Kernel *k) {
  mg_kout_sync(k->out);
}

/* }========================================================== */


/* {======================== Lua values ======================= */

/* the value at idx as JSON: a table with a sequence is an array, any other an
** object of its string keys (so {} is {}); functions and the like are null */
static cJSON *tojson (lua_State *L, int idx, int depth) {
  idx = lua_absindex(L, idx);
  switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: return cJSON_CreateBool(lua_toboolean(L, idx));
    case LUA_TNUMBER: return cJSON_CreateNumber(lua_tonumber(L, idx));
    case LUA_TSTRING: {
      size_t n;
      const char *s = lua_tolstring(L, idx, &n);
      return mg_ktext(s, n);
    }
    case LUA_TTABLE: break;
    default: return cJSON_CreateNull();
  }
  if (depth > 32 || !lua_checkstack(L, 3)) return cJSON_CreateNull();
  lua_Unsigned n = lua_rawlen(L, idx);
  cJSON *out = n > 0 ? cJSON_CreateArray() : cJSON_CreateObject();
  if (n > 0) {
    for (lua_Unsigned i = 1; i <= n; i++) {
      lua_rawgeti(L, idx, (lua_Integer)i);
      cJSON_AddItemToArray(out, tojson(L, -1, depth + 1));
      lua_pop(L, 1);
    }
    return out;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) == LUA_TSTRING) cJSON_AddItemToObject(out, lua_tostring(L, -2), tojson(L, -1, depth + 1));
    lua_pop(L, 1);
  }
  return out;
}

static Kernel *upkernel (lua_State *L) {
  return (Kernel *)lua_touserdata(L, lua_upvalueindex(1));
}

/* kernel.send(msg_type, content): a display message on iopub, after the output so far */
static int k_send (lua_State *L) {
  static const char *const types[] = {"display_data", "update_display_data", "clear_output", NULL};
  int t = luaL_checkoption(L, 1, NULL, types);
  luaL_checktype(L, 2, LUA_TTABLE);
  Kernel *k = upkernel(L);
  sync_output(k);
  publish(k, types[t], tojson(L, 2, 0));
  return 0;
}

/* kernel.base64(s): the text of a PNG in a message */
static int k_base64 (lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  char *b = mg_kbase64(s, n);
  if (b == NULL) return luaL_error(L, "base64: not enough memory");
  lua_pushstring(L, b);
  free(b);
  return 1;
}

static int getbool (const cJSON *j, const char *key, int dflt);
static const char *getstring (const cJSON *j, const char *key);
static void serve_control_busy (Kernel *k, mg_kmsg *m, int *stop);

/* the reply's value as io.read's format fmt would read it from a line */
static int push_read (lua_State *L, const char *v, int fmt) {
  switch (fmt) {
    case 'n':
      if (lua_stringtonumber(L, v) == 0) lua_pushnil(L);
      return 1;
    case 'L': lua_pushfstring(L, "%s\n", v); return 1;
    default: lua_pushstring(L, v); return 1;            /* 'l', 'a' */
  }
}

/*
** io.read([fmt]) in a cell: the notebook asks for a line (input_request on
** the stdin channel), as Python's input() does under IPython; nil (end of
** input) where the client allows no input (allow_stdin false: nbconvert).
** The wait is interruptible. Only io.read is the notebook's: io.stdin and
** io.lines() read /dev/null.
*/
static int k_read (lua_State *L) {
  Kernel *k = upkernel(L);
  int fmt = 'l';
  if (lua_type(L, 1) == LUA_TSTRING) {
    const char *f = lua_tostring(L, 1);
    fmt = f[0] == '*' ? f[1] : f[0];
    luaL_argcheck(L, fmt == 'l' || fmt == 'L' || fmt == 'n' || fmt == 'a', 1, "invalid format");
  } else if (!lua_isnoneornil(L, 1)) {
    return luaL_argerror(L, 1, "in a notebook io.read takes a format: \"l\", \"L\", \"n\" or \"a\"");
  }
  if (k->request == NULL || !k->allow_stdin) {
    lua_pushnil(L);
    return 1;
  }
  sync_output(k);
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "prompt", "");
  cJSON_AddBoolToObject(c, "password", 0);
  mg_kmsg_send(k->sock[MG_KSTDIN], k->conn.key, k->session, k->request, k->request->header, "input_request", c);
  for (;;) {
    zmq_pollitem_t it[2] = {{k->sock[MG_KSTDIN], 0, ZMQ_POLLIN, 0}, {k->sock[MG_KCONTROL], 0, ZMQ_POLLIN, 0}};
    int rc = zmq_poll(it, 2, 100);
    if (mg_interrupted()) return luaL_error(L, "interrupted!");
    if (rc < 0 && errno != EINTR) return luaL_error(L, "io.read: the notebook's input channel failed (%s)", zmq_strerror(errno));
    if (rc <= 0) continue;
    mg_kmsg m;
    if ((it[1].revents & ZMQ_POLLIN) && mg_kmsg_recv(k->sock[MG_KCONTROL], k->conn.key, &k->seen, &m) == 1) {
      int stop = 0;
      serve_control_busy(k, &m, &stop);
      mg_kmsg_free(&m);
      if (stop) return luaL_error(L, "interrupted!");
    }
    if (!(it[0].revents & ZMQ_POLLIN) || mg_kmsg_recv(k->sock[MG_KSTDIN], k->conn.key, &k->seen, &m) != 1) continue;
    int isreply = strcmp(mg_kmsg_type(&m), "input_reply") == 0;
    if (isreply) push_read(L, getstring(m.content, "value"), fmt);
    mg_kmsg_free(&m);
    if (isreply) return 1;
  }
}

static void open_kmodule (Kernel *k) {
  lua_State *L = k->L;
  static const luaL_Reg fns[] = {{"send", k_send}, {"base64", k_base64}, {NULL, NULL}};
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  luaL_newlibtable(L, fns);
  lua_pushlightuserdata(L, k);
  luaL_setfuncs(L, fns, 1);
  lua_setfield(L, -2, KMODULE);
  lua_pop(L, 1);
  lua_getglobal(L, "io");                       /* io.read asks the notebook */
  if (lua_istable(L, -1)) {
    lua_pushlightuserdata(L, k);
    lua_pushcclosure(L, k_read, 1);
    lua_setfield(L, -2, "read");
  }
  lua_pop(L, 1);
}

/* }========================================================== */


/* {====================== running code ====================== */

static void lstop (lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}

/* SIGINT: stop the running code (as lua.c's laction); idle, nothing to stop */
static void onsigint (int sig) {
  (void)sig;
  if (!running) return;
  mg_interrupt(1);
  lua_sethook(K->L, lstop, LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
}

/* while code runs: a look at the control socket every POLL_EVERY instructions */
static void peek_control (lua_State *L, lua_Debug *ar) {
  (void)ar;
  zmq_pollitem_t it = {K->sock[MG_KCONTROL], 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&it, 1, 0) <= 0) return;
  mg_kmsg m;
  int stop = 0;
  if (mg_kmsg_recv(K->sock[MG_KCONTROL], K->conn.key, &K->seen, &m) == 1) {
    serve_control_busy(K, &m, &stop);
    mg_kmsg_free(&m);
  }
  if (stop) {
    mg_interrupt(1);
    lstop(L, NULL);
  }
}

/* the message handler: adds a traceback (the interpreter's too) */
int mgL_msghandler (lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* calls the function below the top narg values with interrupts armed */
static int kcall (lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, mgL_msghandler);
  lua_insert(L, base);
  mg_interrupt(0);
  lua_sethook(L, peek_control, LUA_MASKCOUNT, POLL_EVERY);
  running = 1;
  int st = lua_pcall(L, narg, nres, base);
  running = 0;
  lua_sethook(L, NULL, 0, 0);
  mg_interrupt(0);
  lua_remove(L, base);
  return st;
}

/* loads prefix "return " expr ";" under name; 1 (the chunk pushed) or 0 (nothing pushed) */
static int load_return (lua_State *L, const char *prefix, size_t lprefix, const char *expr, const char *name) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addlstring(&b, prefix, lprefix);
  luaL_addstring(&b, "return ");
  luaL_addstring(&b, expr);
  luaL_addchar(&b, ';');
  luaL_pushresult(&b);
  size_t n;
  const char *chunk = lua_tolstring(L, -1, &n);
  if (luaL_loadbuffer(L, chunk, n, name) == LUA_OK) {
    lua_remove(L, -2);
    return 1;
  }
  lua_pop(L, 2);
  return 0;
}

/*
** Loads a cell: as the REPL, "return <code>;" first, so an expression gives
** its value; then, as IPython, a last line that is an expression gives the
** cell's value ("x = f(2)\nx"); else the code as it is.
*/
static int load_cell (lua_State *L, const char *code, const char *name) {
  if (load_return(L, "", 0, code, name)) return LUA_OK;
  size_t end = strlen(code);
  while (end > 0 && strchr(" \t\r\n", code[end - 1])) end--;
  size_t start = end;
  while (start > 0 && code[start - 1] != '\n') start--;
  if (start > 0 && end > start) {
    char *last = strndup(code + start, end - start);
    int ok = last != NULL && load_return(L, code, start, last, name);
    free(last);
    if (ok) return LUA_OK;
  }
  return luaL_loadbuffer(L, code, strlen(code), name);
}

/* is the syntax error at the top only an unfinished statement? (the REPL's rule) */
static int incomplete (lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return 0;
  size_t lmsg, lmark = sizeof(EOFMARK) - 1;
  const char *msg = lua_tolstring(L, -1, &lmsg);
  return msg && lmsg >= lmark && strcmp(msg + lmsg - lmark, EOFMARK) == 0;
}

/* pushes require("moongrad.notebook")[name] */
static int notebook_fn (lua_State *L) {
  const char *name = lua_tostring(L, 1);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "moongrad.notebook");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, name);
  return 1;
}

/* replaces the nres values at the top by notebook[name](values...); LUA_OK or an error */
static int call_notebook (lua_State *L, const char *name, int nres, int nout) {
  lua_pushcfunction(L, notebook_fn);
  lua_pushstring(L, name);
  int st = lua_pcall(L, 1, 1, 0);
  if (st != LUA_OK) return st;
  lua_insert(L, -(nres + 1));
  return kcall(L, nres, nout);
}

/* the error at the top as error content: ename, evalue, traceback */
static cJSON *error_content (lua_State *L, int status) {
  const char *msg = lua_tostring(L, -1);
  if (msg == NULL) msg = "(error object is not a string)";
  const char *tb = strstr(msg, "\nstack traceback:");
  size_t lvalue = tb ? (size_t)(tb - msg) : strlen(msg);
  size_t lv = lvalue > 0 && msg[lvalue - 1] == '!' ? lvalue - 1 : lvalue, lmark = sizeof "interrupted" - 1;
  int stopped = lv >= lmark && memcmp(msg + lv - lmark, "interrupted", lmark) == 0;   /* lstop's, or the library's */
  const char *ename = status == LUA_ERRSYNTAX ? "SyntaxError" : stopped ? "Interrupted" : "LuaError";
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "status", "error");
  cJSON_AddStringToObject(c, "ename", ename);
  cJSON_AddItemToObject(c, "evalue", mg_ktext(msg, lvalue));
  cJSON *lines = cJSON_AddArrayToObject(c, "traceback");
  for (const char *p = msg; *p;) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    cJSON_AddItemToArray(lines, mg_ktext(p, n));
    p += n + (nl != NULL);
  }
  return c;
}

/* the cell's results (nres values at the top) as an execute_result */
static int show_result (Kernel *k, int nres) {
  sync_output(k);
  int st = call_notebook(k->L, "_result", nres, 1);
  if (st != LUA_OK) return st;
  sync_output(k);
  cJSON *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "execution_count", k->count);
  cJSON_AddItemToObject(c, "data", tojson(k->L, -1, 0));
  cJSON_AddItemToObject(c, "metadata", cJSON_CreateObject());
  publish(k, "execute_result", c);
  return LUA_OK;
}

static int getbool (const cJSON *j, const char *key, int dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static const char *getstring (const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  return cJSON_IsString(v) ? v->valuestring : "";
}

static void take_queued (Kernel *k);

static void execute (Kernel *k, mg_kmsg *m) {
  lua_State *L = k->L;
  const char *code = getstring(m->content, "code");
  int silent = getbool(m->content, "silent", 0);
  int store = getbool(m->content, "store_history", !silent);
  if (store) k->count++;
  if (!silent) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "code", code);
    cJSON_AddNumberToObject(c, "execution_count", k->count);
    publish(k, "execute_input", c);
  }
  if (store) {
    cJSON *h = cJSON_CreateArray();
    cJSON_AddItemToArray(h, cJSON_CreateNumber(1));
    cJSON_AddItemToArray(h, cJSON_CreateNumber(k->count));
    cJSON_AddItemToArray(h, cJSON_CreateString(code));
    cJSON_AddItemToArray(k->history, h);
  }
  lua_settop(L, 0);
  char name[32];
  snprintf(name, sizeof name, "=In[%d]", k->count);
  int st = load_cell(L, code, name);
  k->request = m;
  k->allow_stdin = getbool(m->content, "allow_stdin", 0);
  if (st == LUA_OK) st = kcall(L, 0, LUA_MULTRET);
  if (st == LUA_OK && lua_gettop(L) > 0 && !silent) st = show_result(k, lua_gettop(L));
  sync_output(k);
  cJSON *c;
  if (st != LUA_OK) {
    if (getbool(m->content, "stop_on_error", 1)) take_queued(k);
    publish(k, "error", error_content(L, st));
    c = error_content(L, st);
  } else {
    c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "status", "ok");
    cJSON_AddItemToObject(c, "user_expressions", cJSON_CreateObject());
    cJSON_AddItemToObject(c, "payload", cJSON_CreateArray());
  }
  cJSON_AddNumberToObject(c, "execution_count", k->count);
  reply(k, MG_KSHELL, m, "execute_reply", c);
  k->request = NULL;
  lua_settop(L, 0);
}

/* }========================================================== */


/* {================ completion, inspection ================== */

/* the byte offset of code point cp in s (Jupyter counts code points) */
static size_t byte_of (const char *s, long cp) {
  size_t i = 0;
  for (long n = 0; s[i] && n < cp; n++) {
    i++;
    while (((unsigned char)s[i] & 0xC0) == 0x80) i++;
  }
  return i;
}

static long cp_of (const char *s, size_t byte) {
  long n = 0;
  for (size_t i = 0; i < byte && s[i]; i++)
    if (((unsigned char)s[i] & 0xC0) != 0x80) n++;
  return n;
}

/* cursor_pos, a code point in [0, the code's length]; else the end */
static long cursor (const cJSON *content, const char *code) {
  long end = cp_of(code, strlen(code)), pos;
  return mg_kjson_index(content, "cursor_pos", 0, end + 1, &pos) ? pos : end;
}

static int cmpstr (const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* the REPL's completions of the word before the cursor, sorted */
static void complete (Kernel *k, mg_kmsg *m) {
  lua_State *L = k->L;
  const char *code = getstring(m->content, "code");
  long pos = cursor(m->content, code);
  size_t end = byte_of(code, pos), start = end;
  while (start > 0 && strchr(MG_WORD_BREAKS, code[start - 1]) == NULL) start--;
  char *word = strndup(code + start, end - start);
  cJSON *matches = cJSON_CreateArray();
  lua_settop(L, 0);
  lua_pushcfunction(L, mgL_complete);
  lua_pushlightuserdata(L, word);
  if (word && lua_pcall(L, 1, 1, 0) == LUA_OK) {
    size_t n = lua_rawlen(L, -1);
    const char **list = calloc(n + 1, sizeof *list);
    for (size_t i = 0; list && i < n; i++) {
      lua_rawgeti(L, 1, (lua_Integer)i + 1);
      list[i] = lua_tostring(L, -1);               /* the array keeps the strings */
      lua_pop(L, 1);
    }
    if (list) qsort(list, n, sizeof *list, cmpstr);
    for (size_t i = 0; list && i < n; i++) cJSON_AddItemToArray(matches, cJSON_CreateString(list[i]));
    free(list);
  }
  free(word);
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "status", "ok");
  cJSON_AddItemToObject(c, "matches", matches);
  cJSON_AddNumberToObject(c, "cursor_start", (double)cp_of(code, start));
  cJSON_AddNumberToObject(c, "cursor_end", (double)pos);
  cJSON_AddItemToObject(c, "metadata", cJSON_CreateObject());
  reply(k, MG_KSHELL, m, "complete_reply", c);
  lua_settop(L, 0);
}

static int isnamechar (char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':';
}

/* mg.help's text for the name under the cursor (or before a '(' there) */
static void inspect (Kernel *k, mg_kmsg *m) {
  lua_State *L = k->L;
  const char *code = getstring(m->content, "code");
  size_t at = byte_of(code, cursor(m->content, code)), start, end;
  if (at > 0 && !isnamechar(code[at]) && code[at - 1] == '(') at--;
  for (start = at; start > 0 && isnamechar(code[start - 1]); start--) {}
  for (end = at; code[end] && isnamechar(code[end]); end++) {}
  cJSON *data = cJSON_CreateObject();
  int found = 0;
  lua_settop(L, 0);
  lua_pushlstring(L, code + start, end - start);
  if (end > start && call_notebook(L, "_inspect", 1, 1) == LUA_OK && lua_isstring(L, -1)) {
    cJSON_AddStringToObject(data, "text/plain", lua_tostring(L, -1));
    found = 1;
  }
  sync_output(k);
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "status", "ok");
  cJSON_AddBoolToObject(c, "found", found);
  cJSON_AddItemToObject(c, "data", data);
  cJSON_AddItemToObject(c, "metadata", cJSON_CreateObject());
  reply(k, MG_KSHELL, m, "inspect_reply", c);
  lua_settop(L, 0);
}

/* complete, incomplete (more lines to come, as the REPL decides) or invalid */
static void is_complete (Kernel *k, mg_kmsg *m) {
  lua_State *L = k->L;
  const char *code = getstring(m->content, "code");
  lua_settop(L, 0);
  int st = load_cell(L, code, "=cell");
  const char *verdict = st == LUA_OK ? "complete" : incomplete(L, st) ? "incomplete" : "invalid";
  lua_settop(L, 0);
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "status", verdict);
  if (strcmp(verdict, "incomplete") == 0) cJSON_AddStringToObject(c, "indent", "");
  reply(k, MG_KSHELL, m, "is_complete_reply", c);
}

/* }========================================================== */


/* {======================= the requests ====================== */

static void kernel_info (Kernel *k, int which, mg_kmsg *m) {
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "status", "ok");
  cJSON_AddStringToObject(c, "protocol_version", "5.3");
  cJSON_AddStringToObject(c, "implementation", "moongrad");
  cJSON_AddStringToObject(c, "implementation_version", MG_VERSION);
  cJSON *li = cJSON_AddObjectToObject(c, "language_info");
  cJSON_AddStringToObject(li, "name", "lua");
  cJSON_AddStringToObject(li, "version", "5.4");
  cJSON_AddStringToObject(li, "mimetype", "text/x-lua");
  cJSON_AddStringToObject(li, "file_extension", ".lua");
  cJSON_AddStringToObject(li, "codemirror_mode", "lua");
  cJSON_AddStringToObject(li, "pygments_lexer", "lua");
  cJSON_AddStringToObject(c, "banner", MG_VERSION " (Lua 5.4): tensors, tapes and memory-aware training. help() lists the API");
  cJSON_AddBoolToObject(c, "debugger", 0);
  cJSON_AddItemToObject(c, "help_links", cJSON_CreateArray());
  reply(k, which, m, "kernel_info_reply", c);
}

static void history (Kernel *k, mg_kmsg *m) {
  const char *how = getstring(m->content, "hist_access_type");
  int total = cJSON_GetArraySize(k->history);
  long n = 0, from = 0;
  if (strcmp(how, "tail") == 0 && mg_kjson_index(m->content, "n", 0, total, &n))   /* else all, as IPython */
    from = total - n;
  cJSON *list = cJSON_CreateArray();
  long i = 0;
  for (cJSON *h = k->history ? k->history->child : NULL; h; h = h->next, i++)
    if (i >= from) cJSON_AddItemToArray(list, cJSON_Duplicate(h, 1));
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "status", "ok");
  cJSON_AddItemToObject(c, "history", list);
  reply(k, MG_KSHELL, m, "history_reply", c);
}

static void shutdown_ (Kernel *k, int which, mg_kmsg *m) {
  k->restart = getbool(m->content, "restart", 0);
  k->quit = 1;
  for (int i = 0; i < 2; i++) {          /* the reply, and on iopub for the other clients */
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "status", "ok");
    cJSON_AddBoolToObject(c, "restart", k->restart);
    if (i == 0) reply(k, which, m, "shutdown_reply", c);
    else publish(k, "shutdown_reply", c);
  }
}

static void ok_reply (Kernel *k, int which, mg_kmsg *m, const char *type, const char *field) {
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "status", "ok");
  if (field) cJSON_AddItemToObject(c, field, cJSON_CreateObject());
  reply(k, which, m, type, c);
}

/* a control message while code runs: an interrupt or a shutdown stops it */
static void serve_control_busy (Kernel *k, mg_kmsg *m, int *stop) {
  const char *type = mg_kmsg_type(m);
  if (strcmp(type, "interrupt_request") == 0) {
    ok_reply(k, MG_KCONTROL, m, "interrupt_reply", NULL);
    *stop = 1;
  } else if (strcmp(type, "shutdown_request") == 0) {
    shutdown_(k, MG_KCONTROL, m);
    *stop = 1;
  } else if (strcmp(type, "kernel_info_request") == 0) {
    kernel_info(k, MG_KCONTROL, m);
  } else {
    mg_klog("ignored a %s on the control channel while code runs", type);
  }
}

/* one request, between status busy and idle */
static void handle (Kernel *k, int which, mg_kmsg *m) {
  const char *type = mg_kmsg_type(m);
  set_parent(k, m->header);
  status(k, "busy");
  if (strcmp(type, "execute_request") == 0 && which == MG_KSHELL) execute(k, m);
  else if (strcmp(type, "kernel_info_request") == 0) kernel_info(k, which, m);
  else if (strcmp(type, "complete_request") == 0) complete(k, m);
  else if (strcmp(type, "inspect_request") == 0) inspect(k, m);
  else if (strcmp(type, "is_complete_request") == 0) is_complete(k, m);
  else if (strcmp(type, "history_request") == 0) history(k, m);
  else if (strcmp(type, "comm_info_request") == 0) ok_reply(k, which, m, "comm_info_reply", "comms");
  else if (strcmp(type, "shutdown_request") == 0) shutdown_(k, which, m);
  else if (strcmp(type, "interrupt_request") == 0) ok_reply(k, which, m, "interrupt_reply", NULL);
  else mg_klog("ignored a %s (not a request this kernel knows)", type);
  status(k, "idle");
  set_parent(k, NULL);
}

static void handle (Kernel *k, int which, mg_kmsg *m);

/*
** After a failed execute (stop_on_error): the executes already queued, as a
** "Run All" sends them, are answered "aborted" and not run, as IPython does.
** They are taken before the failed one is answered, so a request sent after
** seeing that answer is never taken for a queued one.
*/
#define MAXQUEUED 256
static mg_kmsg queued[MAXQUEUED];
static int nqueued;

static void take_queued (Kernel *k) {
  zmq_pollitem_t it = {k->sock[MG_KSHELL], 0, ZMQ_POLLIN, 0};
  while (nqueued < MAXQUEUED && zmq_poll(&it, 1, 0) > 0) {
    int got = mg_kmsg_recv(k->sock[MG_KSHELL], k->conn.key, &k->seen, &queued[nqueued]);
    if (got < 0) break;
    nqueued += got;
  }
}

static void answer_queued (Kernel *k) {
  int n = nqueued;
  nqueued = 0;
  for (int i = 0; i < n; i++) {
    mg_kmsg *m = &queued[i];
    if (k->quit) {
      /* shut down meanwhile: the rest go unanswered */
    } else if (strcmp(mg_kmsg_type(m), "execute_request") == 0) {
      set_parent(k, m->header);
      status(k, "busy");
      cJSON *c = cJSON_CreateObject();
      cJSON_AddStringToObject(c, "status", "aborted");
      cJSON_AddNumberToObject(c, "execution_count", k->count);
      reply(k, MG_KSHELL, m, "execute_reply", c);
      status(k, "idle");
      set_parent(k, NULL);
    } else {
      handle(k, MG_KSHELL, m);
    }
    mg_kmsg_free(m);
  }
}

static void serve (Kernel *k, int which) {
  mg_kmsg m;
  if (mg_kmsg_recv(k->sock[which], k->conn.key, &k->seen, &m) != 1) return;
  handle(k, which, &m);
  mg_kmsg_free(&m);
  answer_queued(k);
}

/* }========================================================== */


/* {===================== start and stop ===================== */

static void *heartbeat (void *arg) {
  Kernel *k = arg;
  zmq_proxy(k->sock[MG_KHB], k->sock[MG_KHB], NULL);      /* echoes until the context ends */
  return NULL;
}

static int open_sockets (Kernel *k) {
  static const int types[5] = {ZMQ_ROUTER, ZMQ_PUB, ZMQ_ROUTER, ZMQ_ROUTER, ZMQ_REP};
  static const char *const names[5] = {"shell", "iopub", "stdin", "control", "hb"};
  k->ctx = zmq_ctx_new();
  if (k->ctx == NULL) return -1;
  for (int i = 0; i < 5; i++) {
    char ep[320];
    int linger = LINGER_MS;
    mg_kconn_endpoint(&k->conn, i, ep, sizeof ep);
    k->sock[i] = zmq_socket(k->ctx, types[i]);
    if (k->sock[i] == NULL) return -1;
    int64_t maxframe = MG_KMAXFRAME;                 /* before bind: for every connection */
    zmq_setsockopt(k->sock[i], ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(k->sock[i], ZMQ_MAXMSGSIZE, &maxframe, sizeof maxframe);
    if (zmq_bind(k->sock[i], ep) != 0) {
      mg_klog("cannot bind the %s socket to %s (%s)", names[i], ep, zmq_strerror(errno));
      return -1;
    }
  }
  return 0;
}

/* threads started with SIGINT blocked: it is the main thread's */
static int start_thread (pthread_t *t, void *(*fn)(void *), Kernel *k) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  int rc = pthread_create(t, NULL, fn, k);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

static void stop (Kernel *k) {
  mg_kout_stop(k->out);                          /* the output's rest, and fds 1 and 2 back */
  k->out = NULL;
  if (k->ctx) zmq_ctx_shutdown(k->ctx);
  if (k->hb_started) pthread_join(k->hb, NULL);
  for (int i = 0; i < 5; i++)
    if (k->sock[i]) zmq_close(k->sock[i]);
  if (k->ctx) zmq_ctx_term(k->ctx);
  cJSON_Delete(k->history);
  mg_kseen_free(&k->seen);
  pthread_mutex_destroy(&k->lock);
  mg_klog_to(-1);                                /* closes logfd */
}

int mgL_kernel_run (lua_State *L, const char *connection_file) {
  static Kernel kernel;
  Kernel *k = &kernel;
  char err[256];
  memset(k, 0, sizeof *k);
  k->logfd = -1;
  k->L = L;
  K = k;
  pthread_mutex_init(&k->lock, NULL);
  k->history = cJSON_CreateArray();
  mg_kuuid(k->session);
  if (mg_kconn_read(connection_file, &k->conn, err, sizeof err) != 0) {
    mg_klog("%s", err);
    stop(k);
    return 1;
  }
  if (k->conn.key[0] == '\0') mg_klog("the connection file's key is empty: messages are not signed (anyone who can reach the ports can run code)");
  if (open_sockets(k) != 0 || (k->hb_started = start_thread(&k->hb, heartbeat, k) == 0) == 0 ||
      (k->out = mg_kout_start(on_output, k, &k->logfd)) == NULL) {
    mg_klog("could not start (%s)", strerror(errno));
    stop(k);
    return 1;
  }
  mg_klog_to(k->logfd);                          /* the log stays Jupyter's stderr */
  open_kmodule(k);
  struct sigaction sa;
  sa.sa_handler = onsigint;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  set_parent(k, NULL);
  status(k, "starting");
  while (!k->quit) {
    zmq_pollitem_t items[2] = {{k->sock[MG_KCONTROL], 0, ZMQ_POLLIN, 0}, {k->sock[MG_KSHELL], 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, 2, -1) < 0) {
      if (errno == EINTR) continue;
      mg_klog("zmq_poll failed (%s)", zmq_strerror(errno));
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) serve(k, MG_KCONTROL);
    if (!k->quit && (items[1].revents & ZMQ_POLLIN)) serve(k, MG_KSHELL);
  }
  signal(SIGINT, SIG_DFL);
  stop(k);
  K = NULL;
  return 0;
}

/* }========================================================== */

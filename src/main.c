/*
** main.c — moongrad, a Lua 5.4 interpreter with the library built in.
**
** Modelled on Lua's own lua.c: the same options (-e -i -l -v -E -W and -),
** `arg` set the same way, and the same REPL rules: a line is first tried as
** `return <line>` so expressions print, input continues while the syntax
** error ends at <eof>, and results print through the global `print` (so a
** tensor shows through its __tostring). The module is preloaded as global
** `mg`, and tape, Variable, constant, recompute_grad and custom_gradient are
** globals too.
*/
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "moongrad.h"

#define PROGNAME "moongrad"
#define PROMPT   "> "
#define PROMPT2  ">> "
#define MAXINPUT 4096
#define EOFMARK  "<eof>"
#define LUA_INIT_VAR        "LUA_INIT"
#define LUA_INITVARVERSION  LUA_INIT_VAR LUA_VERSUFFIX

#ifdef MG_USE_READLINE
#include <readline/readline.h>
#include <readline/history.h>
#define mg_readline(b, p)   ((void)b, ((b) = readline(p)) != NULL)
#define mg_saveline(line)   add_history(line)
#define mg_freeline(b)      free(b)
#else
#define mg_readline(b, p) \
  (fputs(p, stdout), fflush(stdout), fgets(b, MAXINPUT, stdin) != NULL)
#define mg_saveline(line)   ((void)line)
#define mg_freeline(b)      ((void)b)
#endif

static lua_State *globalL = NULL;
static const char *progname = PROGNAME;

/* {===================== interruption ======================= */

static void lstop (lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}

static void laction (int i) {
  int flag = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
  signal(i, SIG_DFL);
  lua_sethook(globalL, lstop, flag, 1);
}

/* }========================================================== */

static void print_usage (const char *badoption) {
  fprintf(stderr, "%s: ", progname);
  if (badoption[1] == 'e' || badoption[1] == 'l')
    fprintf(stderr, "'%s' needs argument\n", badoption);
  else
    fprintf(stderr, "unrecognized option '%s'\n", badoption);
  fprintf(stderr,
          "usage: %s [options] [script [args]]\n"
          "Available options are:\n"
          "  -e stat   execute string 'stat'\n"
          "  -i        enter interactive mode after executing 'script'\n"
          "  -l mod    require library 'mod' into global 'mod'\n"
          "  -v        show version information\n"
          "  -E        ignore environment variables\n"
          "  -W        turn warnings on\n"
          "  --        stop handling options\n"
          "  -         stop handling options and execute stdin\n",
          progname);
}

static void l_message (const char *pname, const char *msg) {
  if (pname) fprintf(stderr, "%s: ", pname);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
}

/* prints an error message (if any) and returns status */
static int report (lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    l_message(progname, msg ? msg : "(error object is not a string)");
    lua_pop(L, 1);
  }
  return status;
}

/* the message handler: adds a traceback */
static int msghandler (lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* calls the chunk below the top narg values, with Ctrl-C and a traceback */
static int docall (lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  globalL = L;
  signal(SIGINT, laction);
  int status = lua_pcall(L, narg, nres, base);
  signal(SIGINT, SIG_DFL);
  lua_remove(L, base);
  return status;
}

static void print_version (void) {
  printf("%s, with %s\n", MG_VERSION, LUA_COPYRIGHT);
  fflush(stdout);
}

/* arg = {[-n] = interpreter, ..., [0] = script, [1..] = its arguments} */
static void createargtable (lua_State *L, char **argv, int argc, int script) {
  if (script == argc) script = 0;               /* no script: arg[0] is the interpreter */
  int narg = argc - (script + 1);
  lua_createtable(L, narg, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int dochunk (lua_State *L, int status) {
  if (status == LUA_OK) status = docall(L, 0, 0);
  return report(L, status);
}

static int dofile (lua_State *L, const char *name) {
  return dochunk(L, luaL_loadfile(L, name));
}

static int dostring (lua_State *L, const char *s, const char *name) {
  return dochunk(L, luaL_loadbuffer(L, s, strlen(s), name));
}

/* -l mod: global mod = require "mod" */
static int dolibrary (lua_State *L, const char *name) {
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  int status = docall(L, 1, 1);
  if (status == LUA_OK) lua_setglobal(L, name);
  return report(L, status);
}

static int pushargs (lua_State *L) {
  if (lua_getglobal(L, "arg") != LUA_TTABLE) luaL_error(L, "'arg' is not a table");
  int n = (int)luaL_len(L, -1);
  luaL_checkstack(L, n + 3, "too many arguments to script");
  for (int i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -(n + 1));
  return n;
}

static int handle_script (lua_State *L, char **argv) {
  const char *fname = argv[0];
  if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0) fname = NULL;   /* stdin */
  int status = luaL_loadfile(L, fname);
  if (status == LUA_OK) {
    int n = pushargs(L);
    status = docall(L, n, LUA_MULTRET);
  }
  return report(L, status);
}

/* {===================== options =========================== */

#define has_error 1
#define has_i     2
#define has_v     4
#define has_e     8
#define has_E     16

/* scans options; returns the flags, *first the index of the script or argc */
static int collectargs (char **argv, int *first) {
  int args = 0;
  int i;
  for (i = 1; argv[i] != NULL; i++) {
    *first = i;
    if (argv[i][0] != '-') return args;
    switch (argv[i][1]) {
      case '-':
        if (argv[i][2] != '\0') return has_error;
        *first = i + 1;
        return args;
      case '\0': return args;
      case 'E': if (argv[i][2] != '\0') return has_error; args |= has_E; break;
      case 'W': if (argv[i][2] != '\0') return has_error; break;
      case 'i': args |= has_i;  /* FALLTHROUGH: -i implies -v */
      /* fallthrough */
      case 'v': if (argv[i][2] != '\0') return has_error; args |= has_v; break;
      case 'e': args |= has_e;  /* FALLTHROUGH */
      /* fallthrough */
      case 'l':
        if (argv[i][2] == '\0') {
          i++;
          if (argv[i] == NULL || argv[i][0] == '-') return has_error;
        }
        break;
      default: return has_error;
    }
  }
  *first = i;
  return args;
}

static int runargs (lua_State *L, char **argv, int n) {
  for (int i = 1; i < n; i++) {
    int option = argv[i][1];
    switch (option) {
      case 'e': case 'l': {
        const char *extra = argv[i] + 2;
        if (*extra == '\0') extra = argv[++i];
        int status = option == 'e' ? dostring(L, extra, "=(command line)") : dolibrary(L, extra);
        if (status != LUA_OK) return 0;
        break;
      }
      case 'W': lua_warning(L, "@on", 0); break;
      default: break;
    }
  }
  return 1;
}

static int handle_luainit (lua_State *L) {
  const char *name = "=" LUA_INITVARVERSION;
  const char *init = getenv(name + 1);
  if (init == NULL) {
    name = "=" LUA_INIT_VAR;
    init = getenv(name + 1);
  }
  if (init == NULL) return LUA_OK;
  if (init[0] == '@') return dofile(L, init + 1);
  return dostring(L, init, name);
}

/* }========================================================== */


/* {======================== the REPL ======================== */

static const char *get_prompt (lua_State *L, int firstline) {
  if (lua_getglobal(L, firstline ? "_PROMPT" : "_PROMPT2") == LUA_TNIL)
    return firstline ? PROMPT : PROMPT2;
  const char *p = luaL_tolstring(L, -1, NULL);
  lua_remove(L, -2);
  return p;
}

/* is the syntax error at the top only an unfinished statement? */
static int incomplete (lua_State *L, int status) {
  if (status == LUA_ERRSYNTAX) {
    size_t lmsg;
    const char *msg = lua_tolstring(L, -1, &lmsg);
    size_t lmark = sizeof(EOFMARK) - 1;
    if (lmsg >= lmark && strcmp(msg + lmsg - lmark, EOFMARK) == 0) {
      lua_pop(L, 1);
      return 1;
    }
  }
  return 0;
}

static int pushline (lua_State *L, int firstline) {
  char buffer[MAXINPUT];
  char *b = buffer;
  const char *prmt = get_prompt(L, firstline);
  int readstatus = mg_readline(b, prmt);
  lua_pop(L, 1);                                /* the prompt */
  if (readstatus == 0) return 0;
  size_t l = strlen(b);
  if (l > 0 && b[l - 1] == '\n') b[--l] = '\0';
  if (firstline && b[0] == '=') lua_pushfstring(L, "return %s", b + 1);   /* 5.2 habit */
  else lua_pushlstring(L, b, l);
  mg_freeline(b);
  return 1;
}

/* tries "return <line>" so that expressions print */
static int addreturn (lua_State *L) {
  const char *line = lua_tostring(L, -1);
  const char *retline = lua_pushfstring(L, "return %s;", line);
  int status = luaL_loadbuffer(L, retline, strlen(retline), "=stdin");
  if (status == LUA_OK) {
    lua_remove(L, -2);
    if (line[0] != '\0') mg_saveline(line);
  } else {
    lua_pop(L, 2);
  }
  return status;
}

/* reads lines until they make a complete statement */
static int multiline (lua_State *L) {
  for (;;) {
    size_t len;
    const char *line = lua_tolstring(L, 1, &len);
    int status = luaL_loadbuffer(L, line, len, "=stdin");
    if (!incomplete(L, status) || !pushline(L, 0)) {
      mg_saveline(line);
      return status;
    }
    lua_pushliteral(L, "\n");
    lua_insert(L, -2);
    lua_concat(L, 3);
  }
}

static int loadline (lua_State *L) {
  lua_settop(L, 0);
  if (!pushline(L, 1)) return -1;
  int status = addreturn(L);
  if (status != LUA_OK) status = multiline(L);
  lua_remove(L, 1);
  return status;
}

static void l_print (lua_State *L) {
  int n = lua_gettop(L);
  if (n > 0) {
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    lua_getglobal(L, "print");
    lua_insert(L, 1);
    if (lua_pcall(L, n, 0, 0) != LUA_OK)
      l_message(progname, lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
  }
}

static void doREPL (lua_State *L) {
  int status;
  const char *oldprogname = progname;
  progname = NULL;                              /* no "moongrad:" before REPL errors */
  while ((status = loadline(L)) != -1) {
    if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
    if (status == LUA_OK) l_print(L);
    else report(L, status);
  }
  lua_settop(L, 0);
  fputs("\n", stdout);
  fflush(stdout);
  progname = oldprogname;
}

/* }========================================================== */

/* mg and the names DESIGN.md makes global in the interpreter */
static void open_moongrad (lua_State *L) {
  luaL_requiref(L, "moongrad", luaopen_moongrad, 0);
  lua_pushvalue(L, -1);
  lua_setglobal(L, "mg");
  static const char *const globals[] = {"tape", "Variable", "constant", "recompute_grad",
                                        "custom_gradient", NULL};
  for (int i = 0; globals[i]; i++) {
    lua_getfield(L, -1, globals[i]);
    lua_setglobal(L, globals[i]);
  }
  lua_pop(L, 1);
}

static int pmain (lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  int script;
  int args = collectargs(argv, &script);
  luaL_checkversion(L);
  if (argv[0] && argv[0][0]) progname = argv[0];
  if (args == has_error) {
    print_usage(argv[script]);
    return 0;
  }
  if (args & has_v) print_version();
  if (args & has_E) {
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
  }
  luaL_openlibs(L);
  open_moongrad(L);
  createargtable(L, argv, argc, script);
  lua_gc(L, LUA_GCGEN, 0, 0);
  if (!(args & has_E) && handle_luainit(L) != LUA_OK) return 0;
  if (!runargs(L, argv, script)) return 0;
  if (script < argc && handle_script(L, argv + script) != LUA_OK) return 0;
  if (args & has_i) {
    doREPL(L);
  } else if (script == argc && !(args & (has_e | has_v))) {
    if (isatty(0)) {
      print_version();
      doREPL(L);
    } else {
      dofile(L, NULL);                          /* stdin as a file */
    }
  }
  lua_pushboolean(L, 1);
  return 1;
}

int main (int argc, char **argv) {
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    l_message(argv[0], "cannot create state: not enough memory");
    return EXIT_FAILURE;
  }
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  int status = lua_pcall(L, 2, 1, 0);
  int result = lua_toboolean(L, -1);
  report(L, status);
  lua_close(L);
  return (result && status == LUA_OK) ? EXIT_SUCCESS : EXIT_FAILURE;
}

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
**
** With readline (MG_USE_READLINE) the REPL also completes names on Tab
** (globals, keywords, `t.field`, `x:method`), keeps its history in
** ~/.moongrad_history (or $MOONGRAD_HISTORY), and Ctrl-C at the prompt
** drops the line being typed instead of ending the session.
*/
#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "moongrad.h"
#include "cli/lcomplete.h"
#include "kernel/lkernel.h"
#include "kernel/kernel.h"

#define PROGNAME "moongrad"
#define PROMPT   "> "
#define PROMPT2  ">> "
#define MAXINPUT 4096
#define EOFMARK  "<eof>"
#define LUA_INIT_VAR        "LUA_INIT"
#define LUA_INITVARVERSION  LUA_INIT_VAR LUA_VERSUFFIX
#define HISTFILE "/.moongrad_history"   /* in $HOME, unless $MOONGRAD_HISTORY names one */
#define HISTSIZE 1000                   /* lines kept, in memory and in the file */

/* mg_readline: 1 with a line in b, 0 at end of input, -1 if Ctrl-C dropped it */
#ifdef MG_USE_READLINE
#include <fcntl.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <readline/readline.h>
#include <readline/history.h>
#define mg_readline(b, p)   edit_read(&(b), p)
#define mg_saveline(line)   edit_saveline(line)
#define mg_freeline(b)      free(b)
#define mg_openedit(L)      edit_open(L)
#define mg_closeedit()      edit_close()
#else
#define mg_readline(b, p) \
  (fputs(p, stdout), fflush(stdout), fgets(b, MAXINPUT, stdin) != NULL)
#define mg_saveline(line)   ((void)line)
#define mg_freeline(b)      ((void)b)
#define mg_openedit(L)      ((void)L)
#define mg_closeedit()      ((void)0)
#endif

static lua_State *globalL = NULL;
static const char *progname = PROGNAME;

/* {===================== interruption ======================= */

/*
** Ctrl-C while code runs: the hook stops Lua code at its next step and
** mg_interrupt(1) makes the library's long C loops fail; either way the
** chunk ends in an error. The handler is one-shot, as in lua.c: a second
** Ctrl-C while a computation ignores the first kills the process.
*/
static void lstop (lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}

/* sigaction, since signal() may be one-shot (System V) under strict POSIX */
static void setsignal (int sig, void (*handler)(int)) {
  struct sigaction sa;
  sa.sa_handler = handler;
  sa.sa_flags = 0;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

static void laction (int i) {
  int flag = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
  setsignal(i, SIG_DFL);
  mg_interrupt(1);
  lua_sethook(globalL, lstop, flag, 1);
}

/* lua_pcall with Ctrl-C armed for the call; leaves no request behind */
static int icall (lua_State *L, int narg, int nres, int msgh) {
  globalL = L;
  mg_interrupt(0);                              /* a stale request must not stop this call */
  struct sigaction old;
  sigaction(SIGINT, NULL, &old);
  setsignal(SIGINT, laction);
  int status = lua_pcall(L, narg, nres, msgh);
  sigaction(SIGINT, &old, NULL);
  lua_sethook(L, NULL, 0, 0);                   /* a Ctrl-C that came as the call ended */
  mg_interrupt(0);
  return status;
}

/* }========================================================== */

/* every option, Lua's and moongrad's own (moongrad --help) */
static void write_usage (FILE *f) {
  fprintf(f,
          "usage: %s [options] [script [args]]\n"
          "       %s --kernel CONNECTION_FILE\n"
          "       %s --install-kernel [--user] [--prefix PREFIX]\n"
          "Available options are:\n"
          "  -e stat   execute string 'stat'\n"
          "  -i        enter interactive mode after executing 'script'\n"
          "  -l mod    require library 'mod' into global 'mod'\n"
          "  -v        show version information (also --version)\n"
          "  -E        ignore environment variables\n"
          "  -W        turn warnings on\n"
          "  -h        show this help (also --help)\n"
          "  --        stop handling options\n"
          "  -         stop handling options and execute stdin\n"
          "  --kernel CONNECTION_FILE\n"
          "            run as a Jupyter kernel (Jupyter starts it so)\n"
          "  --install-kernel [--user] [--prefix PREFIX]\n"
          "            tell Jupyter of this kernel: for everyone, for you alone (--user),\n"
          "            or under PREFIX/share/jupyter/kernels\n"
          "With no script and a terminal, an interactive session (the REPL) starts;\n"
          "help() in it (or in a script) lists the library. Documentation: docs/README.md.\n",
          progname, progname, progname);
}

static void print_usage (const char *badoption) {
  fprintf(stderr, "%s: ", progname);
  if (badoption[1] == 'e' || badoption[1] == 'l')
    fprintf(stderr, "'%s' needs argument\n", badoption);
  else
    fprintf(stderr, "unrecognized option '%s'\n", badoption);
  write_usage(stderr);
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

/* calls the chunk below the top narg values, with Ctrl-C and a traceback */
static int docall (lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, mgL_msghandler);
  lua_insert(L, base);
  int status = icall(L, narg, nres, base);
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


/* {==================== line editing (readline) ==================== */
#ifdef MG_USE_READLINE

static lua_State *editL;                        /* the state completion looks into */
static int sigpipe[2] = {-1, -1};               /* Ctrl-C at the prompt wakes edit_read */
static char *histfile;                          /* where lines are appended, or NULL */

/* readline's generator over the array at the top of editL's stack */
static char *nextmatch (const char *text, int state) {
  static lua_Integer i;
  (void)text;
  if (state == 0) i = 0;
  lua_rawgeti(editL, -1, ++i);
  const char *s = lua_tostring(editL, -1);
  char *m = s ? strdup(s) : NULL;                        /* readline frees it */
  lua_pop(editL, 1);
  return m;
}

/*
** The completion hook: Lua names everywhere but inside a string, where
** readline's file names are more use. Lua runs only under lua_pcall, so an
** error (memory included) just means no completions.
*/
static char **complete (const char *text, int start, int end) {
  (void)start; (void)end;
  rl_completion_append_character = '\0';     /* "mg.nn" may go on with '.' */
  if (rl_completion_quote_character) return NULL;
  rl_attempted_completion_over = 1;
  lua_State *L = editL;
  int top = lua_gettop(L);
  char **matches = NULL;
  if (lua_checkstack(L, 4)) {
    lua_pushcfunction(L, mgL_complete);
    lua_pushlightuserdata(L, (void *)text);
    if (lua_pcall(L, 1, 1, 0) == LUA_OK) matches = rl_completion_matches(text, nextmatch);
  }
  lua_settop(L, top);
  return matches;
}

/* $MOONGRAD_HISTORY (empty: none), else ~/.moongrad_history; malloc'd */
static char *history_path (void) {
  const char *env = getenv("MOONGRAD_HISTORY");
  if (env != NULL) return env[0] ? strdup(env) : NULL;
  const char *home = getenv("HOME");
  if (home == NULL || home[0] == '\0') return NULL;
  size_t n = strlen(home) + sizeof(HISTFILE);
  char *path = malloc(n);
  if (path != NULL) snprintf(path, n, "%s%s", home, HISTFILE);
  return path;
}

static void history_warn (const char *path, int err) {
  fprintf(stderr, "%s: history not saved: cannot write '%s' (%s)\n", PROGNAME, path,
          strerror(err));
  fflush(stderr);
}

static const char *file_kind (mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
       : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "something other than a file";
}

/*
** Makes sure the history file exists (append_history wants it to) as a
** regular file, created readable by its owner only (0600, as bash and
** readline make theirs; an existing file keeps its mode), then loads it.
** A FIFO or a device is refused with a warning, before anything opens it
** (reading a FIFO would wait for a writer); /dev/null quietly means none.
*/
static void history_open (void) {
  char *path = history_path();
  if (path == NULL) return;
  struct stat st;
  int fd = -1;
  if (strcmp(path, "/dev/null") == 0) goto none;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) goto refuse;
  fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
  if (fd < 0 || fstat(fd, &st) != 0) {
    history_warn(path, errno);
    goto none;
  }
  if (!S_ISREG(st.st_mode)) goto refuse;
  close(fd);
  read_history(path);                           /* empty is fine */
  history_truncate_file(path, HISTSIZE);
  histfile = path;
  return;
refuse:
  fprintf(stderr, "%s: history not saved: '%s': is %s, not a regular file\n", PROGNAME, path,
          file_kind(st.st_mode));
  fflush(stderr);
none:
  if (fd >= 0) close(fd);
  free(path);
}

/* adds a statement to the history and to the file at once, so that a
** session killed by a second Ctrl-C keeps it; a file that fails is dropped */
static void edit_saveline (const char *line) {
  HIST_ENTRY *last = history_get(history_base + history_length - 1);
  if (last != NULL && strcmp(last->line, line) == 0) return;   /* no repeats */
  add_history(line);
  int err = histfile ? append_history(1, histfile) : 0;
  if (err != 0) {
    history_warn(histfile, err);
    free(histfile);
    histfile = NULL;
  }
}

/* SIGINT at the prompt: wake edit_read (async-signal-safe) */
static void onsigint (int i) {
  int saved = errno;
  (void)i;
  if (write(sigpipe[1], "", 1) < 0) { /* pipe full: a wake-up is pending anyway */ }
  errno = saved;
}

static char *edit_line;                         /* what the line handler got */
static int edit_done;

/* readline's line handler: keeps the line (NULL at end of input) */
static void online (char *line) {
  edit_line = line;
  edit_done = 1;
  rl_callback_handler_remove();
}

/* Ctrl-C: drop the line, as readline's manual says for the callback interface */
static void cancel_line (void) {
  char buf[64];
  while (read(sigpipe[0], buf, sizeof buf) > 0) {}
  rl_free_line_state();
  rl_callback_sigcleanup();
  rl_echo_signal_char(SIGINT);                  /* "^C" */
  rl_cleanup_after_signal();
  rl_callback_handler_remove();
  fputc('\n', rl_outstream);
  fflush(rl_outstream);
}

/*
** Reads a line with readline. Why the callback interface: readline() cannot
** be left cleanly from a signal handler (its own SIGINT handling re-sends
** the signal and reads on), so we wait in select() for a key or for a byte
** from onsigint's pipe, and feed keys to rl_callback_read_char. The pipe
** works whichever thread the signal lands on, with no race between a check
** and the wait. Returns as mg_readline; *line is malloc'd.
*/
static int edit_read (char **line, const char *prompt) {
  if (sigpipe[0] < 0) return (*line = readline(prompt)) != NULL;   /* no pipe */
  char buf[64];
  while (read(sigpipe[0], buf, sizeof buf) > 0) {}   /* a Ctrl-C between prompts */
  edit_line = NULL;
  edit_done = 0;
  rl_callback_handler_install(prompt, online);
  int in = fileno(rl_instream), nfds = (in > sigpipe[0] ? in : sigpipe[0]) + 1;
  while (!edit_done) {
    fd_set fds;
    FD_ZERO(&fds);
    FD_SET(in, &fds);
    FD_SET(sigpipe[0], &fds);
    if (select(nfds, &fds, NULL, NULL, NULL) < 0) {
      if (errno == EINTR) {
        rl_check_signals();                     /* a resize redraws at once */
        continue;
      }
      rl_callback_handler_remove();             /* cannot wait: end of input */
      break;
    }
    if (FD_ISSET(sigpipe[0], &fds)) {
      cancel_line();
      *line = NULL;
      return -1;
    }
    rl_callback_read_char();
  }
  *line = edit_line;
  return edit_line != NULL;
}

/* the handler must never block on the pipe, nor a drain on it */
static int setflags (int fd) {
  return fcntl(fd, F_SETFL, O_NONBLOCK) == 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) == 0;
}

/* readline for the REPL on L: completion, Ctrl-C, and a history file when a
** person types (stdin a terminal) */
static void edit_open (lua_State *L) {
  /* no '/': readline would skip a leading one in "/path (file names in strings) */
  static const char *const breaks = MG_WORD_BREAKS;
  editL = L;
  rl_readline_name = PROGNAME;                  /* for "$if moongrad" in ~/.inputrc */
  rl_attempted_completion_function = complete;
  rl_basic_word_break_characters = breaks;
  rl_completer_word_break_characters = breaks;
  rl_completer_quote_characters = "\"'";
  rl_catch_signals = 0;                         /* SIGINT is ours: see edit_read */
  rl_persistent_signal_handlers = 1;            /* but SIGWINCH is readline's all along */
  stifle_history(HISTSIZE);
  if (isatty(0)) history_open();
  if (pipe(sigpipe) == 0 && setflags(sigpipe[0]) && setflags(sigpipe[1])) {
    setsignal(SIGINT, onsigint);                /* between prompts too: never SIG_DFL */
  } else {
    if (sigpipe[0] >= 0) { close(sigpipe[0]); close(sigpipe[1]); }
    sigpipe[0] = sigpipe[1] = -1;
  }
}

static void edit_close (void) {
  setsignal(SIGINT, SIG_DFL);
  if (sigpipe[0] >= 0) { close(sigpipe[0]); close(sigpipe[1]); }
  sigpipe[0] = sigpipe[1] = -1;
  free(histfile);
  histfile = NULL;
}

#endif
/* }================================================================== */


/* {======================== the REPL ======================== */

static const char *get_prompt (lua_State *L, int firstline) {
  if (lua_getglobal(L, firstline ? "_PROMPT" : "_PROMPT2") == LUA_TNIL)
    return firstline ? PROMPT : PROMPT2;
  const char *p = luaL_tolstring(L, -1, NULL);
  lua_remove(L, -2);
  return p;
}

#define ENDINPUT  (-1)     /* loadline: no more input */
#define CANCELLED (-2)     /* loadline: Ctrl-C dropped the statement */

/* is the syntax error at the top only an unfinished statement? */
static int incomplete (lua_State *L, int status) {
  if (status == LUA_ERRSYNTAX) {
    size_t lmsg;
    const char *msg = lua_tolstring(L, -1, &lmsg);
    size_t lmark = sizeof(EOFMARK) - 1;
    return lmsg >= lmark && strcmp(msg + lmsg - lmark, EOFMARK) == 0;
  }
  return 0;
}

/* reads a line and pushes it; returns as mg_readline (nothing pushed unless 1) */
static int pushline (lua_State *L, int firstline) {
  char buffer[MAXINPUT];
  char *b = buffer;
  const char *prmt = get_prompt(L, firstline);
  int readstatus = mg_readline(b, prmt);
  lua_pop(L, 1);                                /* the prompt */
  if (readstatus <= 0) return readstatus;
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

/* reads lines until they make a complete statement; CANCELLED on Ctrl-C */
static int multiline (lua_State *L) {
  for (;;) {
    size_t len;
    const char *line = lua_tolstring(L, 1, &len);
    int status = luaL_loadbuffer(L, line, len, "=stdin");
    int more = incomplete(L, status) ? pushline(L, 0) : 0;   /* above the message */
    if (more < 0) return CANCELLED;
    if (more == 0) {                            /* complete, or input ended inside it */
      mg_saveline(line);
      return status;
    }
    lua_remove(L, -2);                          /* the <eof> message */
    lua_pushliteral(L, "\n");
    lua_insert(L, -2);
    lua_concat(L, 3);
  }
}

/* loads the next statement; returns its load status, ENDINPUT or CANCELLED */
static int loadline (lua_State *L) {
  lua_settop(L, 0);
  int got = pushline(L, 1);
  if (got <= 0) return got == 0 ? ENDINPUT : CANCELLED;
  int status = addreturn(L);
  if (status != LUA_OK) status = multiline(L);
  lua_remove(L, 1);
  return status;
}

/* each result through moongrad.repr (a plain table reads as a constructor,
** byte counts with units), then print; print alone if repr is not there */
static int repr_all (lua_State *L) {
  int n = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "moongrad.repr");
  lua_call(L, 1, 1);                                      /* args... repr */
  for (int i = 1; i <= n; i++) {
    lua_pushvalue(L, -1);
    lua_pushvalue(L, i);
    lua_call(L, 1, 1);
    lua_replace(L, i);
  }
  lua_pop(L, 1);
  return n;
}

static void l_print (lua_State *L) {
  int n = lua_gettop(L);
  if (n > 0) {
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    lua_pushcfunction(L, repr_all);
    lua_insert(L, 1);
    if (icall(L, n, LUA_MULTRET, 0) != LUA_OK) {   /* printing a big tensor can be stopped too */
      l_message(progname, lua_pushfstring(L, "error showing the results (%s)", lua_tostring(L, -1)));
      lua_settop(L, 0);
      return;
    }
    lua_getglobal(L, "print");
    lua_insert(L, 1);
    if (icall(L, n, 0, 0) != LUA_OK)
      l_message(progname, lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
  }
}

static void doREPL (lua_State *L) {
  int status;
  const char *oldprogname = progname;
  progname = NULL;                              /* no "moongrad:" before REPL errors */
  mg_openedit(L);
  while ((status = loadline(L)) != ENDINPUT) {
    if (status == CANCELLED) continue;
    if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
    if (status == LUA_OK) l_print(L);
    else report(L, status);
  }
  mg_closeedit();
  lua_settop(L, 0);
  fputs("\n", stdout);
  fflush(stdout);
  progname = oldprogname;
}

/* }========================================================== */

#ifdef MG_HAVE_MPI
/* mg.distributed's C half (src/dist/ldistributed.c), outside libmoongrad.a */
int  luaopen_moongrad_mpi (lua_State *L);
void mgL_dist_abort (int code);
#define dist_abort(code)  mgL_dist_abort(code)
#else
#define dist_abort(code)  ((void)(code))
#endif

/* help([x]): prints mg.help(x) (upvalue 1: mg); a global of the interpreter
** only, so moongrad.help loads on first use, not at every start */
static int l_help (lua_State *L) {
  lua_settop(L, 1);
  lua_getfield(L, lua_upvalueindex(1), "help");
  lua_getfield(L, -1, "show");
  lua_pushvalue(L, 1);
  lua_call(L, 1, 0);
  return 0;
}

/* mg, and the names docs/tensors.md lists as the interpreter's globals */
static void open_moongrad (lua_State *L) {
#ifdef MG_HAVE_MPI
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_moongrad_mpi);
  lua_setfield(L, -2, "moongrad.mpi");
  lua_pop(L, 1);
#endif
  luaL_requiref(L, "moongrad", luaopen_moongrad, 0);
  lua_pushvalue(L, -1);
  lua_setglobal(L, "mg");
  static const char *const globals[] = {"tape", "Variable", "constant", "recompute_grad",
                                        "custom_gradient", NULL};
  for (int i = 0; globals[i]; i++) {
    lua_getfield(L, -1, globals[i]);
    lua_setglobal(L, globals[i]);
  }
  lua_pushcclosure(L, l_help, 1);
  lua_setglobal(L, "help");
}

/* moongrad --kernel CONNECTION_FILE: a Jupyter kernel (src/kernel/lkernel.c) on
** a state set up as the interpreter's */
static int kernelmain (lua_State *L, int argc, char **argv) {
  if (argc != 3) {
    l_message(progname, "usage: moongrad --kernel CONNECTION_FILE (Jupyter starts it so; "
                        "moongrad --install-kernel [--user] tells Jupyter how)");
    return 0;
  }
  luaL_openlibs(L);
  open_moongrad(L);
  createargtable(L, argv, argc, argc);
  lua_gc(L, LUA_GCGEN, 0, 0);
  lua_pushboolean(L, mgL_kernel_run(L, argv[2]) == 0);
  return 1;
}

static int pmain (lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  int script;
  if (argv[0] && argv[0][0]) progname = argv[0];
  if (argc > 1 && strcmp(argv[1], "--kernel") == 0) return kernelmain(L, argc, argv);
  int args = collectargs(argv, &script);
  luaL_checkversion(L);
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

/* glibc's malloc moves its thresholds after what was freed (mmap for big
** blocks, heap trimming), so a training step's blocks came back from the
** kernel as fresh pages on some runs and not on others: the CNN's float32
** step took 17 or 42 ms (2,600 page faults a step) as OPENBLAS_CORETYPE
** shifted OpenBLAS's own allocations. Fixed thresholds keep freed blocks of
** up to 32 MiB in the heap; MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_
** in the environment still win. (The interpreter's choice: a host embedding
** the library keeps its own malloc settings.) */
static void steady_malloc (void) {
#ifdef __GLIBC__
  if (getenv("MALLOC_MMAP_THRESHOLD_") == NULL) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (getenv("MALLOC_TRIM_THRESHOLD_") == NULL) mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

int main (int argc, char **argv) {
  steady_malloc();
  if (argc > 1 && strcmp(argv[1], "--install-kernel") == 0)      /* no Lua needed */
    return mg_kernel_install(argc - 2, argv + 2) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
  if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    if (argv[0] && argv[0][0]) progname = argv[0];
    write_usage(stdout);
    return EXIT_SUCCESS;
  }
  if (argc > 1 && strcmp(argv[1], "--version") == 0) {
    print_version();
    return EXIT_SUCCESS;
  }
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
  if (!(result && status == LUA_OK)) dist_abort(1);    /* under mpirun: stop every rank now */
  lua_close(L);
  return (result && status == LUA_OK) ? EXIT_SUCCESS : EXIT_FAILURE;
}

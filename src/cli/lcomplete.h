/*
** lcomplete.h — completion of Lua names (src/cli/lcomplete.c), shared by
** the REPL and the Jupyter kernel.
*/
#ifndef MG_LCOMPLETE_H
#define MG_LCOMPLETE_H

#include <lua.h>

/* where a word to complete starts: after one of these (readline's word
** breaks; no '/', so a path in a string stays one word) */
#define MG_WORD_BREAKS " \t\n\"'`><=;|&{}()[],+-*%^~#"

/* the completions of the word given as a light userdata (a C string), as a
** Lua array of strings; run it under lua_pcall */
int mgL_complete (lua_State *L);

#endif

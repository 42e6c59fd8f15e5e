/*
** lkernel.h — moongrad as a Jupyter kernel (src/kernel/lkernel.c).
*/
#ifndef MG_LKERNEL_H
#define MG_LKERNEL_H

#include <lua.h>

/* serves the connection file's sockets with L (set up as the interpreter's)
** until a shutdown_request; 0 then, 1 when it could not start (said on stderr) */
int mgL_kernel_run (lua_State *L, const char *connection_file);

/* a lua_pcall message handler: the error with a traceback, as lua.c's */
int mgL_msghandler (lua_State *L);

#endif

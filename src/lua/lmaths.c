/*
** lmaths.c — the Lua side of src/ops/maths.c, for the ops whose arguments
** the registry's generic unary/binary/reduce bindings do not cover.
*/
#include "lbinding.h"

void mgL_open_maths (lua_State *L) {
  (void)L;
}

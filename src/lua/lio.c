/*
** lio.c — the Lua side of src/io/: mg.save, mg.load (safetensors) and the
** dataset readers under mg.data.
*/
#include "lbinding.h"

void mgL_open_io (lua_State *L) {
  (void)L;
}

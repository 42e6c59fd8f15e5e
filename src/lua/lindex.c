/*
** lindex.c — the Lua side of src/ops/index.c and src/ops/sort.c.
*/
#include "lbinding.h"

void mgL_open_index (lua_State *L) {
  (void)L;
}

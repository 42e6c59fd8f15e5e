/*
** lconv.c — the Lua side of src/ops/conv.c: mg.conv2d, mg.max_pool2d,
** mg.avg_pool2d.
*/
#include "lbinding.h"

void mgL_open_conv (lua_State *L) {
  (void)L;
}

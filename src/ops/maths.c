/*
** maths.c — more elementwise maths and reductions: sin, cos, log1p, expm1,
** erf, floor, ceil, round, clamp, prod, cumsum, logsumexp, var, std, norm.
*/
#include "moongrad_impl.h"

static const mg_opdef *const rows[] = {NULL};
const mg_opfamily mg_maths_ops = {rows, 0};

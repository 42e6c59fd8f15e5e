/*
** index.c — indexing and rearranging: take_along_axis and its adjoint,
** flip, tile, repeat, pad, tril, triu, masked_fill, einsum; sort.c sorts.
*/
#include "moongrad_impl.h"

static const mg_opdef *const rows[] = {NULL};
const mg_opfamily mg_index_ops = {rows, 0};

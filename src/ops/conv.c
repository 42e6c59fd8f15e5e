/*
** conv.c — convolution and pooling on NHWC tensors, through oneDNN's
** primitives, with a float64 reference path.
*/
#include "moongrad_impl.h"

static const mg_opdef *const rows[] = {NULL};
const mg_opfamily mg_conv_ops = {rows, 0};

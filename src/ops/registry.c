/*
** registry.c — the op registry: every op family's rows, in one list.
**
** Each family file (binary.c, unary.c, reduce.c, ...) keeps its rows next
** to its ops and exports them as an mg_opfamily; this file only strings the
** families together. Adding an op to a family touches that family's file
** alone; adding a family adds one line here.
*/
#include <string.h>

#include "ops/op.h"

static const mg_opfamily *const families[] = {
  &mg_unary_ops, &mg_binary_ops, &mg_reduce_ops, &mg_matmul_ops, &mg_shape_ops, &mg_nn_ops,
  &mg_create_ops, &mg_maths_ops, &mg_index_ops, &mg_conv_ops, &mg_attention_ops,
  &mg_dense_ops, &mg_sort_ops, &mg_einsum_ops,
};

#define NFAMILIES ((int)(sizeof families / sizeof families[0]))

int mg_op_count (void) {
  int n = 0;
  for (int f = 0; f < NFAMILIES; f++) n += families[f]->n;
  return n;
}

const mg_opinfo *mg_op_info (int i) {
  if (i < 0) return mg_seterror("mg_op_info: index %d is negative", i), NULL;
  for (int f = 0; f < NFAMILIES; f++) {
    if (i < families[f]->n) return &families[f]->rows[i]->info;
    i -= families[f]->n;
  }
  return mg_seterror("mg_op_info: index out of range (there are %d ops)", mg_op_count()), NULL;
}

const mg_opinfo *mg_op_find (const char *name) {
  MG_CHECK_ARG("mg_op_find", name, NULL);
  for (int f = 0; f < NFAMILIES; f++)
    for (int i = 0; i < families[f]->n; i++)
      if (strcmp(families[f]->rows[i]->info.name, name) == 0) return &families[f]->rows[i]->info;
  return NULL;
}

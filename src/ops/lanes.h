/*
** lanes.h — sums and maxima of a row that the compiler vectorises.
**
** One running sum is a chain of dependent adds that the compiler must keep
** in order (no -ffast-math here), so it runs one element a cycle or slower.
** LANES independent partial results, combined at the end, let it use full
** vector registers; the order of the adds changes, not their precision.
*/
#ifndef LANES_H
#define LANES_H

#define LANES 16

/* s = the sum over j in [0, n) of EXPR, an expression of j (it may assign) */
#define LANE_SUM(T, s, n, EXPR) do {                                                \
    T lane_[LANES] = {0};                                                           \
    int64_t j0_ = 0;                                                                \
    for (; j0_ + LANES <= (n); j0_ += LANES)                                        \
      for (int64_t j = j0_; j < j0_ + LANES; j++) lane_[j - j0_] += (EXPR);         \
    for (int64_t j = j0_; j < (n); j++) lane_[j - j0_] += (EXPR);                   \
    (s) = 0;                                                                        \
    for (int l_ = 0; l_ < LANES; l_++) (s) += lane_[l_];                            \
  } while (0)

/* m = the largest of row[0 .. n), -INFINITY when n is 0 */
#define LANE_MAX(T, m, row, n) do {                                                 \
    T lane_[LANES];                                                                 \
    for (int l_ = 0; l_ < LANES; l_++) lane_[l_] = -INFINITY;                       \
    int64_t j0_ = 0;                                                                \
    for (; j0_ + LANES <= (n); j0_ += LANES)                                        \
      for (int l_ = 0; l_ < LANES; l_++)                                            \
        lane_[l_] = (row)[j0_ + l_] > lane_[l_] ? (row)[j0_ + l_] : lane_[l_];      \
    for (int64_t j = j0_; j < (n); j++)                                             \
      lane_[j - j0_] = (row)[j] > lane_[j - j0_] ? (row)[j] : lane_[j - j0_];       \
    (m) = -INFINITY;                                                                \
    for (int l_ = 0; l_ < LANES; l_++) (m) = lane_[l_] > (m) ? lane_[l_] : (m);     \
  } while (0)

#endif

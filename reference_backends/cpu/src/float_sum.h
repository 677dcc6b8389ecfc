/* Sums of float32 rows that vectorize at the full vector width: 16 float lanes per block of
   256 elements (a zmm register wide, and blocks short enough to stay accurate), the blocks
   added in double. Summing in double lanes instead would halve the width (each float
   converted), and one chain of float adds would lose accuracy on long rows. Include after
   kernels.h, in files whose row functions are REFCPU_VECTOR_CLONES. */
#pragma once

#include <stdint.h>

#define REFCPU_FLOAT_SUM_LANES 16
#define REFCPU_FLOAT_SUM_BLOCK 256

/* The lanes added pairwise into lanes[0]. */
REFCPU_ALWAYS_INLINE double refcpu_float_lanes_total(float* lanes) {
  for (int width = REFCPU_FLOAT_SUM_LANES / 2; width > 0; width /= 2)
    for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
  return (double)lanes[0];
}

/* sum of f over x[0..n), f an expression of the element v (v itself, or refcpu_expf(v - top)). */
#define REFCPU_FLOAT_SUM_OF(x, n, f)                                                                  \
  ({                                                                                                   \
    const float* sum_x_ = (x);                                                                         \
    int64_t sum_n_ = (n), sum_i_ = 0;                                                                  \
    double sum_total_ = 0.0;                                                                           \
    for (; sum_i_ + REFCPU_FLOAT_SUM_BLOCK <= sum_n_; sum_i_ += REFCPU_FLOAT_SUM_BLOCK) {              \
      float sum_lanes_[REFCPU_FLOAT_SUM_LANES] = {0};                                                  \
      for (int64_t at_ = sum_i_; at_ < sum_i_ + REFCPU_FLOAT_SUM_BLOCK; at_ += REFCPU_FLOAT_SUM_LANES) \
        for (int l_ = 0; l_ < REFCPU_FLOAT_SUM_LANES; l_++) {                                          \
          float v = sum_x_[at_ + l_];                                                                  \
          sum_lanes_[l_] += (f);                                                                       \
        }                                                                                              \
      sum_total_ += refcpu_float_lanes_total(sum_lanes_);                                              \
    }                                                                                                  \
    double sum_tail_[8] = {0};                                                                         \
    for (; sum_i_ + 8 <= sum_n_; sum_i_ += 8)                                                          \
      for (int l_ = 0; l_ < 8; l_++) {                                                                 \
        float v = sum_x_[sum_i_ + l_];                                                                 \
        sum_tail_[l_] += (double)(f);                                                                  \
      }                                                                                                \
    for (; sum_i_ < sum_n_; sum_i_++) {                                                                \
      float v = sum_x_[sum_i_];                                                                        \
      sum_tail_[0] += (double)(f);                                                                     \
    }                                                                                                  \
    for (int l_ = 0; l_ < 8; l_++) sum_total_ += sum_tail_[l_];                                        \
    sum_total_;                                                                                        \
  })

/* sum x[0..n) */
REFCPU_ALWAYS_INLINE double refcpu_float_sum(const float* x, int64_t n) { return REFCPU_FLOAT_SUM_OF(x, n, v); }

/* Max pooling by columns, shared by max_pool2d_backward (kernels_nn_typed.h) and adaptive max
   pooling (kernels_resize.c). Per row of windows, one pass over whole input rows keeps each
   column's maximum and the row of its first occurrence (the first NaN wins): a loop that
   vectorizes, where a scan per window does not. Each window's maximum, and its first element in
   row-major order (the one torch's indices name), then come from the window's columns.
   COLUMN_MAX_DEFINE(T, S) defines the helpers for element type T, named with suffix S. */
#pragma once

#include "kernels.h"

#include <stdint.h>

#define COLUMN_MAX_DEFINE(T, S)                                                                        \
  /* col[c] = max of x[r][c] over rows [r0, r1), arg[c] = the row of its first occurrence. */          \
  REFCPU_ALWAYS_INLINE void column_max_rows_##S(const T* x, int64_t x_row, int64_t x_col, int64_t r0,   \
                                                int64_t r1, int64_t w, T* restrict col,                \
                                                int32_t* restrict arg) {                               \
    for (int64_t c = 0; c < w; c++) col[c] = x[r0 * x_row + c * x_col], arg[c] = (int32_t)r0;          \
    for (int64_t r = r0 + 1; r < r1; r++)                                                              \
      for (int64_t c = 0; c < w; c++) {                                                                \
        T v = x[r * x_row + c * x_col], b = col[c];                                                    \
        bool take = (v > b) | ((v != v) & (b == b));                                                   \
        col[c] = take ? v : b;                                                                         \
        arg[c] = take ? (int32_t)r : arg[c];                                                           \
      }                                                                                                \
  }                                                                                                    \
                                                                                                       \
  /* The maximum of columns [c0, c1) (NaN if one is NaN); with at, also *at = r * w + c of the        \
     window's first element holding it: the smallest (arg[c], c) among the columns that do. */         \
  REFCPU_ALWAYS_INLINE T column_max_window_##S(const T* col, const int32_t* arg, int64_t c0, int64_t c1, \
                                               int64_t w, int64_t* at) {                               \
    T m = col[c0];                                                                                     \
    bool nan = m != m;                                                                                 \
    for (int64_t c = c0 + 1; c < c1; c++) { /* no branch: a max instruction and a NaN flag */          \
      m = col[c] > m ? col[c] : m;                                                                     \
      nan |= col[c] != col[c];                                                                         \
    }                                                                                                  \
    if (at) {                                                                                          \
      int64_t first = INT64_MAX;                                                                       \
      for (int64_t c = c0; c < c1; c++) {                                                              \
        bool holds = nan ? col[c] != col[c] : col[c] == m;                                             \
        int64_t key = (int64_t)arg[c] * w + c;                                                         \
        first = holds & (key < first) ? key : first;                                                   \
      }                                                                                                \
      *at = first;                                                                                     \
    }                                                                                                  \
    return nan ? (T)NAN : m;                                                                           \
  }

COLUMN_MAX_DEFINE(float, f32)
COLUMN_MAX_DEFINE(double, f64)
#undef COLUMN_MAX_DEFINE

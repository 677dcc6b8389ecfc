/* reduce.cl -- sum, mean, max, min, argmax, var over the inner items of each
 * row of a g_rows (tensor 0 out, 1 x). Included once per family with T, ACC
 * (accumulator), FAM(name), LD and ST defined: F (float in, acc_t sums), D
 * (double) and L (long: integer sums wrap in int64, bool sums to int64).
 *
 * max / min take NaN as the result once seen; argmax takes the first largest,
 * NaN counting as largest. var divides by max(0, n - correction). Two
 * variants: one work item per row (short rows) and one group per row. */

/* Loads of x: float32 / float64 inputs are T itself (typed, so the loop vectorizes); the
   integer family converts int32 / int64 / bool. */
#ifdef FAMILY_L
#define RLD(p, dt, i) ld_L((p), (dt), (i))
#else
#define RLD(p, dt, i) (((global const T*)(p))[i])
#endif

/* Whether (v, i) beats (w, j) for max (want_max) or min; j < 0 is "none yet". */
inline bool FAM(beats)(T v, long i, T w, long j, bool want_max) {
  if (j < 0) return true;
  bool v_nan = v != v, w_nan = w != w;
  if (v_nan || w_nan) return v_nan && (!w_nan || i < j);
  if (v == w) return i < j;
  return want_max ? v > w : v < w;
}

inline void FAM(reduce_store)(int op, int dto, global uchar* po, long at, ACC sum, ACC extra, T best,
                              long best_index, long n, long correction) {
  switch (op) {
    case RED_SUM: ST(po, dto, at, (T)sum); break;
    case RED_MEAN: ST(po, dto, at, (T)(sum / (ACC)n)); break;
    case RED_MAX:
    case RED_MIN: ST(po, dto, at, best); break;
    case RED_ARGMAX: st_L(po, dto, at, best_index); break;
    case RED_VAR: {
      long divisor = n - correction > 0 ? n - correction : 0;
      ST(po, dto, at, (T)(extra / (ACC)divisor));
      break;
    }
  }
}

kernel void FAM(reduce_serial)(g_rows g, int op, int dtx, int dto, long correction, global uchar* po,
                               global const uchar* px) {
  long n = g.inner_numel;
  bool want_max = op != RED_MIN;
  for (long o = get_global_id(0); o < g.outer_numel; o += get_global_size(0)) {
    long base[2];
    rows_outer(&g, o, base, 2);
    ACC sum = 0;
    T best = 0;
    long best_index = -1;
    if (op == RED_SUM || op == RED_MEAN || op == RED_VAR) { /* a plain loop the compiler vectorizes */
      if (g.inner_ndim == 1) {
        long stride = g.inner_stride[1][0];
        for (long r = 0; r < n; r++) sum += (ACC)RLD(px, dtx, base[1] + r * stride);
      } else {
        for (long r = 0; r < n; r++) sum += (ACC)RLD(px, dtx, base[1] + rows_inner(&g, r, 1));
      }
    } else {
      for (long r = 0; r < n; r++) {
        T v = RLD(px, dtx, base[1] + rows_inner(&g, r, 1));
        if (FAM(beats)(v, r, best, best_index, want_max)) {
          best = v;
          best_index = r;
        }
      }
    }
    ACC extra = 0;
    if (op == RED_VAR) {
      ACC mean = sum / (ACC)n;
      for (long r = 0; r < n; r++) {
        ACC d = (ACC)RLD(px, dtx, base[1] + rows_inner(&g, r, 1)) - mean;
        extra += d * d;
      }
    }
    FAM(reduce_store)(op, dto, po, base[0], sum, extra, best, best_index, n, correction);
  }
}

kernel void FAM(reduce_group)(g_rows g, int op, int dtx, int dto, long correction, global uchar* po,
                              global const uchar* px) {
  local ACC s_sum[LOCAL_SIZE];
  local T s_best[LOCAL_SIZE];
  local long s_index[LOCAL_SIZE];
  int lid = get_local_id(0);
  long n = g.inner_numel;
  bool want_max = op != RED_MIN;
  for (long o = get_group_id(0); o < g.outer_numel; o += get_num_groups(0)) {
    long base[2];
    rows_outer(&g, o, base, 2);
    ACC sum = 0;
    T best = 0;
    long best_index = -1;
    for (long r = lid; r < n; r += LOCAL_SIZE) {
      T v = RLD(px, dtx, base[1] + rows_inner(&g, r, 1));
      sum += (ACC)v;
      if (FAM(beats)(v, r, best, best_index, want_max)) {
        best = v;
        best_index = r;
      }
    }
    s_sum[lid] = sum;
    s_best[lid] = best;
    s_index[lid] = best_index;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int step = LOCAL_SIZE / 2; step > 0; step >>= 1) {
      if (lid < step) {
        s_sum[lid] += s_sum[lid + step];
        if (s_index[lid + step] >= 0 &&
            FAM(beats)(s_best[lid + step], s_index[lid + step], s_best[lid], s_index[lid], want_max)) {
          s_best[lid] = s_best[lid + step];
          s_index[lid] = s_index[lid + step];
        }
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    ACC total = s_sum[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    ACC extra = 0;
    if (op == RED_VAR) {
      ACC mean = total / (ACC)n;
      for (long r = lid; r < n; r += LOCAL_SIZE) {
        ACC d = (ACC)RLD(px, dtx, base[1] + rows_inner(&g, r, 1)) - mean;
        extra += d * d;
      }
    }
    s_sum[lid] = extra;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int step = LOCAL_SIZE / 2; step > 0; step >>= 1) {
      if (lid < step) s_sum[lid] += s_sum[lid + step];
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
      FAM(reduce_store)(op, dto, po, base[0], total, s_sum[0], s_best[0], s_index[0], n, correction);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

#undef RLD

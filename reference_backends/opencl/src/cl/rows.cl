/* rows.cl -- row kernels of the floating families (T float / double, ACC the
 * accumulator: double where the device has it): softmax / log_softmax, the
 * layer / rms norms and their input gradients, cross_entropy. Tensors are
 * typed T pointers; offsets are in elements. */

/* Sum of one value per work item over the group (every item gets the total). */
inline ACC FAM(group_sum)(local ACC* scratch, ACC value) {
  int lid = get_local_id(0);
  scratch[lid] = value;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int step = LOCAL_SIZE / 2; step > 0; step >>= 1) {
    if (lid < step) scratch[lid] += scratch[lid + step];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  ACC total = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return total;
}

/* Max with NaN kept (NaN once seen stays). */
inline T FAM(nan_max)(T m, T v) { return (v > m || v != v || m != m) ? (m != m ? m : v) : m; }

inline T FAM(group_max)(local T* scratch, T value) {
  int lid = get_local_id(0);
  scratch[lid] = value;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int step = LOCAL_SIZE / 2; step > 0; step >>= 1) {
    if (lid < step) scratch[lid] = FAM(nan_max)(scratch[lid], scratch[lid + step]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  T total = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return total;
}

/* ---- softmax / log_softmax along the inner items (tensor 0 out, 1 x) --------------------- */

kernel void FAM(softmax_serial)(g_rows g, int log_form, global T* po, global const T* px) {
  long n = g.inner_numel;
  for (long o = get_global_id(0); o < g.outer_numel; o += get_global_size(0)) {
    long base[2];
    rows_outer(&g, o, base, 2);
    T m = -INFINITY;
    for (long r = 0; r < n; r++) m = FAM(nan_max)(m, px[base[1] + rows_inner(&g, r, 1)]);
    ACC sum = 0;
    for (long r = 0; r < n; r++) sum += (ACC)exp(px[base[1] + rows_inner(&g, r, 1)] - m);
    T log_sum = (T)log(sum);
    for (long r = 0; r < n; r++) {
      T shifted = px[base[1] + rows_inner(&g, r, 1)] - m;
      po[base[0] + rows_inner(&g, r, 0)] = log_form ? shifted - log_sum : (T)((ACC)exp(shifted) / sum);
    }
  }
}

kernel void FAM(softmax_group)(g_rows g, int log_form, global T* po, global const T* px) {
  local ACC s_acc[LOCAL_SIZE];
  local T s_t[LOCAL_SIZE];
  int lid = get_local_id(0);
  long n = g.inner_numel;
  for (long o = get_group_id(0); o < g.outer_numel; o += get_num_groups(0)) {
    long base[2];
    rows_outer(&g, o, base, 2);
    T m = -INFINITY;
    for (long r = lid; r < n; r += LOCAL_SIZE) m = FAM(nan_max)(m, px[base[1] + rows_inner(&g, r, 1)]);
    m = FAM(group_max)(s_t, m);
    ACC sum = 0;
    for (long r = lid; r < n; r += LOCAL_SIZE) sum += (ACC)exp(px[base[1] + rows_inner(&g, r, 1)] - m);
    sum = FAM(group_sum)(s_acc, sum);
    T log_sum = (T)log(sum);
    for (long r = lid; r < n; r += LOCAL_SIZE) {
      T shifted = px[base[1] + rows_inner(&g, r, 1)] - m;
      po[base[0] + rows_inner(&g, r, 0)] = log_form ? shifted - log_sum : (T)((ACC)exp(shifted) / sum);
    }
  }
}

/* ---- norms: tensor 0 out, 1 x, 2 weight (outer stride 0), 3 bias (forward) or grad (backward) ---- */

#define NORM_LAYER 0
#define NORM_RMS 1
#define NORM_LAYER_BACKWARD 2
#define NORM_RMS_BACKWARD 3

/* One row: statistics in ACC, then the output. sum_fn reduces a per-item partial
   (identity for the serial variant, a group sum for the group one). */
#define NORM_ROW(first, step, SUM)                                                                   \
  do {                                                                                               \
    bool rms = mode == NORM_RMS || mode == NORM_RMS_BACKWARD;                                       \
    bool backward = mode >= NORM_LAYER_BACKWARD;                                                     \
    ACC mean = 0;                                                                                    \
    if (!rms) {                                                                                      \
      ACC s = 0;                                                                                     \
      for (long r = (first); r < n; r += (step)) s += (ACC)px[base[1] + rows_inner(&g, r, 1)];       \
      mean = SUM(s) / (ACC)n;                                                                        \
    }                                                                                                \
    ACC sq = 0;                                                                                      \
    for (long r = (first); r < n; r += (step)) {                                                     \
      ACC d = (ACC)px[base[1] + rows_inner(&g, r, 1)] - mean;                                        \
      sq += d * d;                                                                                   \
    }                                                                                                \
    ACC rstd = (ACC)1 / sqrt(SUM(sq) / (ACC)n + (ACC)eps);                                           \
    ACC mean_g = 0, mean_gx = 0;                                                                     \
    if (backward) {                                                                                  \
      ACC sg = 0, sgx = 0;                                                                           \
      for (long r = (first); r < n; r += (step)) {                                                   \
        ACC gv = (ACC)pextra[base[3] + rows_inner(&g, r, 3)];                                        \
        if (has_weight) gv *= (ACC)pw[base[2] + rows_inner(&g, r, 2)];                               \
        ACC xhat = ((ACC)px[base[1] + rows_inner(&g, r, 1)] - mean) * rstd;                          \
        sg += gv;                                                                                    \
        sgx += gv * xhat;                                                                            \
      }                                                                                              \
      mean_g = rms ? (ACC)0 : SUM(sg) / (ACC)n;                                                      \
      mean_gx = SUM(sgx) / (ACC)n;                                                                   \
    }                                                                                                \
    for (long r = (first); r < n; r += (step)) {                                                     \
      ACC xhat = ((ACC)px[base[1] + rows_inner(&g, r, 1)] - mean) * rstd;                            \
      ACC w = has_weight ? (ACC)pw[base[2] + rows_inner(&g, r, 2)] : (ACC)1;                         \
      ACC value;                                                                                     \
      if (backward) {                                                                                \
        ACC gv = (ACC)pextra[base[3] + rows_inner(&g, r, 3)] * w;                                    \
        value = rstd * (gv - mean_g - xhat * mean_gx);                                               \
      } else {                                                                                       \
        value = xhat * w;                                                                            \
        if (has_bias) value += (ACC)pextra[base[3] + rows_inner(&g, r, 3)];                          \
      }                                                                                              \
      po[base[0] + rows_inner(&g, r, 0)] = (T)value;                                                 \
    }                                                                                                \
  } while (0)

#define SUM_IDENTITY(x) (x)

kernel void FAM(norm_serial)(g_rows g, int mode, int has_weight, int has_bias, T eps, global T* po,
                             global const T* px, global const T* pw, global const T* pextra) {
  long n = g.inner_numel;
  for (long o = get_global_id(0); o < g.outer_numel; o += get_global_size(0)) {
    long base[4];
    rows_outer(&g, o, base, 4);
    NORM_ROW(0, 1, SUM_IDENTITY);
  }
}

kernel void FAM(norm_group)(g_rows g, int mode, int has_weight, int has_bias, T eps, global T* po,
                            global const T* px, global const T* pw, global const T* pextra) {
  local ACC s_acc[LOCAL_SIZE];
  long n = g.inner_numel;
  int lid = get_local_id(0);
#define SUM_GROUP(x) FAM(group_sum)(s_acc, (x))
  for (long o = get_group_id(0); o < g.outer_numel; o += get_num_groups(0)) {
    long base[4];
    rows_outer(&g, o, base, 4);
    NORM_ROW(lid, LOCAL_SIZE, SUM_GROUP);
  }
#undef SUM_GROUP
}

/* ---- cross_entropy: logits [N, C] (strides ls0, ls1), target [N] (int32/int64) ----------- */

/* loss_i = logsumexp(logits_i) - logits_i[t_i], 0 where t_i == ignore_index; into out
   (reduction none: stride os) or into the scratch rows (ACC) for ce_finish. */
kernel void FAM(ce_forward)(long rows, long classes, long ls0, long ls1, long loff, int tdt, long ts,
                            long toff, long ignore, int to_scratch, long os, long ooff, ulong seq,
                            global const ulong* status, global T* po, global const T* pl,
                            global const uchar* pt, global ACC* scratch) {
  if (GATE_FAILED(status, seq)) return;
  for (long i = get_global_id(0); i < rows; i += get_global_size(0)) {
    long t = ld_L(pt, tdt, toff + i * ts);
    ACC loss = 0;
    if (t != ignore) {
      global const T* row = pl + loff + i * ls0;
      T m = -INFINITY;
      for (long c = 0; c < classes; c++) m = FAM(nan_max)(m, row[c * ls1]);
      ACC sum = 0;
      for (long c = 0; c < classes; c++) sum += (ACC)exp(row[c * ls1] - m);
      loss = (ACC)m + (ACC)log(sum) - (ACC)row[t * ls1];
    }
    if (to_scratch) scratch[i] = loss;
    else po[ooff + i * os] = (T)loss;
  }
}

/* One work item: the count of targets not ignored into scratch[rows]; with
   finish, out = the row-order sum of scratch (mean: / count, NaN for none). */
kernel void FAM(ce_reduce)(long rows, int tdt, long ts, long toff, long ignore, int finish, int mean,
                           long ooff, ulong seq, global const ulong* status, global T* po,
                           global const uchar* pt, global ACC* scratch) {
  if (get_global_id(0) != 0 || GATE_FAILED(status, seq)) return;
  long count = 0;
  for (long i = 0; i < rows; i++) count += ld_L(pt, tdt, toff + i * ts) != ignore;
  scratch[rows] = (ACC)count;
  if (!finish) return;
  ACC total = 0;
  for (long i = 0; i < rows; i++) total += scratch[i];
  if (mean) total = count ? total / (ACC)count : (ACC)NAN;
  po[ooff] = (T)total;
}

/* out[i, c] = (softmax(logits_i)_c - (c == t_i)) * g_i * scale, 0 rows where ignored;
   g_i = grad (a scalar: gs = 0) or grad[i]; scale = 1 / count for mean. */
kernel void FAM(ce_backward)(long rows, long classes, long ls0, long ls1, long loff, int tdt, long ts,
                             long toff, long ignore, int mean, long gs, long goff, long os0, long os1,
                             long ooff, ulong seq, global const ulong* status, global T* po,
                             global const T* pl, global const uchar* pt, global const T* pg,
                             global const ACC* scratch) {
  if (GATE_FAILED(status, seq)) return;
  ACC count = scratch[rows];
  for (long i = get_global_id(0); i < rows; i += get_global_size(0)) {
    long t = ld_L(pt, tdt, toff + i * ts);
    global T* out_row = po + ooff + i * os0;
    if (t == ignore) {
      for (long c = 0; c < classes; c++) out_row[c * os1] = (T)0;
      continue;
    }
    global const T* row = pl + loff + i * ls0;
    T m = -INFINITY;
    for (long c = 0; c < classes; c++) m = FAM(nan_max)(m, row[c * ls1]);
    ACC sum = 0;
    for (long c = 0; c < classes; c++) sum += (ACC)exp(row[c * ls1] - m);
    ACC scale = (ACC)pg[goff + i * gs];
    if (mean) scale /= count;
    for (long c = 0; c < classes; c++) {
      ACC p = (ACC)exp(row[c * ls1] - m) / sum - (c == t ? (ACC)1 : (ACC)0);
      out_row[c * os1] = (T)(p * scale);
    }
  }
}

/* Row kernels of kernels_nn.c for one float type, included once per type with
 *   NN_T     the element type (float or double)
 *   NN_FN(n) the name n with the type's suffix
 *   NN_EXP   exp for NN_T
 * Rows are contiguous here (the caller packs strided ones). Sums accumulate in independent
 * lanes, which vectorize without reassociating: double lanes, or for the hottest loops lanes of
 * the element type over blocks of NN_BLOCK elements (a vector register wide, and short enough to
 * stay accurate), the blocks added in double. */

#define NN_BLOCK_LANES 16
#define NN_BLOCK 256

/* The NN_BLOCK_LANES lanes added pairwise, as a double. */
NN_INLINE double NN_FN(lane_total)(NN_T* lanes) {
  for (int width = NN_BLOCK_LANES / 2; width > 0; width /= 2)
    for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
  return (double)lanes[0];
}

/* ---- layer_norm / rms_norm: one pass of statistics, one of output --------------- */

/* s1 = sum (x - k), s2 = sum (x - k)^2 in one pass around the shift k (x[0]
   for layer_norm, 0 for rms_norm): the shift keeps the variance from
   cancelling, so no second pass over the row is needed. */
NN_INLINE void NN_FN(row_moments)(const NN_T* restrict x, int64_t n, double k, double* s1, double* s2) {
  double a[8] = {0}, b[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) {
      double d = (double)x[i + l] - k;
      a[l] += d;
      b[l] += d * d;
    }
  double sa = 0, sb = 0;
  for (int l = 0; l < 8; l++) {
    sa += a[l];
    sb += b[l];
  }
  for (; i < n; i++) {
    double d = (double)x[i] - k;
    sa += d;
    sb += d * d;
  }
  *s1 = sa;
  *s2 = sb;
}

/* The same moments and, with g = grad * weight (weight may be NULL), sum g and
   sum g * (x - k): all a backward row needs, in one pass, in NN_BLOCK_LANES lanes per block. */
NN_INLINE void NN_FN(row_backward_sums)(const NN_T* restrict grad, const NN_T* restrict x,
                                     const NN_T* restrict weight, int64_t n, double k,
                                     double sums[4]) {
  NN_T shift = (NN_T)k; /* k is an element of x or 0: exact */
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + NN_BLOCK <= n; i += NN_BLOCK) {
    NN_T a[NN_BLOCK_LANES] = {0}, b[NN_BLOCK_LANES] = {0}, c[NN_BLOCK_LANES] = {0}, e[NN_BLOCK_LANES] = {0};
    for (int64_t at = i; at < i + NN_BLOCK; at += NN_BLOCK_LANES)
      for (int l = 0; l < NN_BLOCK_LANES; l++) {
        NN_T d = x[at + l] - shift;
        NN_T g = weight ? grad[at + l] * weight[at + l] : grad[at + l];
        a[l] += d;
        b[l] += d * d;
        c[l] += g;
        e[l] += g * d;
      }
    s[0] += NN_FN(lane_total)(a);
    s[1] += NN_FN(lane_total)(b);
    s[2] += NN_FN(lane_total)(c);
    s[3] += NN_FN(lane_total)(e);
  }
  for (; i < n; i++) {
    double d = (double)x[i] - k;
    double g = weight ? (double)grad[i] * (double)weight[i] : (double)grad[i];
    s[0] += d;
    s[1] += d * d;
    s[2] += g;
    s[3] += g * d;
  }
  for (int j = 0; j < 4; j++) sums[j] = s[j];
}

/* mean and variance (biased) from the shifted moments; rms_norm: mean 0. */
NN_INLINE void NN_FN(row_stats)(const NN_T* restrict x, double s1, double s2, int64_t n, bool rms,
                             double* mean, double* var) {
  double count = (double)n;
  if (rms) {
    *mean = 0.0;
    *var = s2 / count;
    return;
  }
  *mean = (double)x[0] + s1 / count;
  double v = (s2 - s1 * s1 / count) / count;
  *var = v > 0.0 ? v : (v == v ? 0.0 : v); /* rounding may dip below 0; NaN stays */
}

/* out = (x - mean) * rstd * weight + bias (rms_norm: mean 0, no bias). */
NN_ROW_CLONES static void NN_FN(norm_row)(const NN_T* restrict x, const NN_T* restrict weight,
                            const NN_T* restrict bias, NN_T* restrict out, int64_t n, double eps,
                            bool rms) {
  double s1, s2, mean, var;
  NN_FN(row_moments)(x, n, rms ? 0.0 : (double)x[0], &s1, &s2);
  NN_FN(row_stats)(x, s1, s2, n, rms, &mean, &var);
  NN_T m = (NN_T)mean, r = (NN_T)(1.0 / sqrt(var + eps));
  if (weight && bias) {
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] - m) * r * weight[i] + bias[i];
  } else if (weight) {
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] - m) * r * weight[i];
  } else if (bias) {
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] - m) * r + bias[i];
  } else {
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] - m) * r;
  }
}

/* layer_norm: out = rstd * (g - mean(g) - xhat * mean(g * xhat));
   rms_norm:   out = rstd * (g - xhat * mean(g * xhat)); g = grad * weight. */
NN_ROW_CLONES static void NN_FN(norm_backward_row)(const NN_T* restrict grad, const NN_T* restrict x,
                                     const NN_T* restrict weight, NN_T* restrict out, int64_t n,
                                     double eps, bool rms) {
  double sums[4], mean, var;
  double k = rms ? 0.0 : (double)x[0];
  NN_FN(row_backward_sums)(grad, x, weight, n, k, sums);
  NN_FN(row_stats)(x, sums[0], sums[1], n, rms, &mean, &var);
  double rstd = 1.0 / sqrt(var + eps);
  double count = (double)n;
  /* sum g * (x - mean) = sum g * (x - k) - (mean - k) * sum g */
  double sum_gx = sums[3] - (mean - k) * sums[2];
  /* xhat * mean(g * xhat) = (x - mean) * rstd^2 * sum_gx / n */
  NN_T r = (NN_T)rstd, m = (NN_T)mean;
  NN_T shift = rms ? (NN_T)0 : (NN_T)(sums[2] / count);
  NN_T slope = (NN_T)(rstd * rstd * sum_gx / count);
  if (weight) {
    for (int64_t i = 0; i < n; i++)
      out[i] = r * (grad[i] * weight[i] - shift - (x[i] - m) * slope);
  } else {
    for (int64_t i = 0; i < n; i++) out[i] = r * (grad[i] - shift - (x[i] - m) * slope);
  }
}

/* ---- cross_entropy --------------------------------------------------------------- */

/* max of a row, NaN if any is NaN; in 32-byte GCC vectors, as gcc leaves a select-max
   reduction scalar (the baseline clone runs each as two SSE operations). */
NN_INLINE NN_T NN_FN(row_max)(const NN_T* restrict x, int64_t n) {
  typedef NN_T vec __attribute__((vector_size(32)));
  enum { W = 32 / sizeof(NN_T) };
  NN_T best = x[0];
  bool nan = false;
  int64_t i = 0;
  if (n >= W) {
    vec top;
    memcpy(&top, x, sizeof top);
    __typeof__(top != top) nans = top != top;
    for (i = W; i + W <= n; i += W) {
      vec v;
      memcpy(&v, x + i, sizeof v);
      __typeof__(v > top) take = v > top;
      top = (vec)(((__typeof__(take))v & take) | ((__typeof__(take))top & ~take));
      nans |= v != v;
    }
    best = top[0];
    for (int l = 0; l < W; l++) {
      best = top[l] > best ? top[l] : best;
      nan |= nans[l] != 0;
    }
  }
  for (; i < n; i++) {
    best = x[i] > best ? x[i] : best;
    nan |= x[i] != x[i];
  }
  return nan ? (NN_T)NAN : best;
}

/* exp(x - max) into out (when not NULL) and its sum, in NN_BLOCK_LANES lanes per block. */
NN_INLINE double NN_FN(row_exp_sum)(const NN_T* restrict x, NN_T* restrict out, int64_t n, NN_T max) {
  double sum = 0;
  int64_t i = 0;
  for (; i + NN_BLOCK <= n; i += NN_BLOCK) {
    NN_T lanes[NN_BLOCK_LANES] = {0};
    for (int64_t at = i; at < i + NN_BLOCK; at += NN_BLOCK_LANES)
      for (int l = 0; l < NN_BLOCK_LANES; l++) {
        NN_T e = NN_EXP(x[at + l] - max);
        if (out) out[at + l] = e;
        lanes[l] += e;
      }
    sum += NN_FN(lane_total)(lanes);
  }
  for (; i < n; i++) {
    NN_T e = NN_EXP(x[i] - max);
    if (out) out[i] = e;
    sum += (double)e;
  }
  return sum;
}

/* logsumexp(x) - x[target] */
NN_ROW_CLONES static double NN_FN(cross_entropy_row)(const NN_T* restrict x, int64_t n, int64_t target) {
  NN_T max = NN_FN(row_max)(x, n);
  double sum = NN_FN(row_exp_sum)(x, NULL, n, max);
  return log(sum) + (double)max - (double)x[target];
}

/* out = (softmax(x) - one_hot(target)) * scale */
NN_ROW_CLONES static void NN_FN(cross_entropy_backward_row)(const NN_T* restrict x, NN_T* restrict out,
                                              int64_t n, int64_t target, double scale) {
  NN_T max = NN_FN(row_max)(x, n);
  double sum = NN_FN(row_exp_sum)(x, out, n, max);
  NN_T factor = (NN_T)(scale / sum);
  for (int64_t i = 0; i < n; i++) out[i] *= factor;
  out[target] -= (NN_T)scale;
}

/* ---- pooling (one N*C plane: x [H, W] with strides, out [OH, OW] with strides) ----- */

typedef struct NN_FN(pool_plane) {
  const NN_T* x;
  int64_t x_row, x_col; /* element strides */
  NN_T* out;
  int64_t out_row, out_col;
} NN_FN(pool_plane);

enum { NN_FN(POOL_ROW_TILE) = 256 };

/* The windows of output row oh, columns [ow_begin, ow_end): best[ow - ow_begin] is each
   window's maximum and where[...] = h * in_w + w its first maximum (the first NaN wins), -1 for
   a window with no element. The window's elements are visited in the same order as a window at
   a time (kernel row, then kernel column), but each (kh, kw) over the whole tile of columns, so
   that loop vectorizes. x_col is a constant where the caller passes one. */
REFCPU_ALWAYS_INLINE void NN_FN(max_pool_scan_row)(const pool_geometry* g, const NN_T* x, int64_t x_row,
                                                   int64_t x_col, int64_t oh, int64_t ow_begin,
                                                   int64_t ow_end, NN_T* restrict best,
                                                   int64_t* restrict where) {
  int64_t count = ow_end - ow_begin, sw = g->stride[1], in_w = g->in_w;
  for (int64_t i = 0; i < count; i++) {
    best[i] = -(NN_T)INFINITY;
    where[i] = -1;
  }
  int64_t h0 = oh * g->stride[0] - g->padding[0];
  for (int64_t kh = 0; kh < g->kernel[0]; kh++) {
    int64_t h = h0 + kh;
    if (h < 0 || h >= g->in_h) continue;
    const NN_T* x_h = x + h * x_row;
    for (int64_t kw = 0; kw < g->kernel[1]; kw++) {
      int64_t shift = kw - g->padding[1]; /* w = ow * sw + shift */
      int64_t lo = ow_begin, hi = ow_end; /* no division: a few steps over the padding */
      while (lo < hi && lo * sw + shift < 0) lo++;
      while (hi > lo && (hi - 1) * sw + shift >= in_w) hi--;
      for (int64_t ow = lo; ow < hi; ow++) {
        int64_t w = ow * sw + shift, i = ow - ow_begin;
        NN_T v = x_h[w * x_col], b = best[i];
        bool take = (where[i] < 0) | (v > b) | ((v != v) & (b == b));
        best[i] = take ? v : b;
        where[i] = take ? h * in_w + w : where[i];
      }
    }
  }
}

/* Calls BODY(oh, ow_begin, count, best, where) per tile of each output row after the scan. */
#define NN_MAX_POOL_ROWS(g, x, x_row, x_col, BODY)                                            \
  do {                                                                                        \
    NN_T best_[NN_FN(POOL_ROW_TILE)];                                                         \
    int64_t where_[NN_FN(POOL_ROW_TILE)];                                                     \
    for (int64_t oh_ = 0; oh_ < (g)->out_h; oh_++)                                            \
      for (int64_t ow0_ = 0; ow0_ < (g)->out_w; ow0_ += NN_FN(POOL_ROW_TILE)) {               \
        int64_t ow1_ = ow0_ + NN_FN(POOL_ROW_TILE) < (g)->out_w ? ow0_ + NN_FN(POOL_ROW_TILE)   \
                                                                 : (g)->out_w;                \
        if ((x_col) == 1)                                                                     \
          NN_FN(max_pool_scan_row)(g, x, x_row, 1, oh_, ow0_, ow1_, best_, where_);           \
        else                                                                                  \
          NN_FN(max_pool_scan_row)(g, x, x_row, x_col, oh_, ow0_, ow1_, best_, where_);       \
        BODY(oh_, ow0_, ow1_ - ow0_, best_, where_);                                          \
      }                                                                                       \
  } while (0)

#define NN_MAX_POOL_STORE(oh, ow0, count, best, where)                                        \
  for (int64_t i_ = 0; i_ < (count); i_++) p->out[(oh) * p->out_row + ((ow0) + i_) * p->out_col] = best[i_]

REFCPU_VECTOR_CLONES static void NN_FN(max_pool_plane)(const pool_geometry* g, const NN_FN(pool_plane) * p) {
  NN_MAX_POOL_ROWS(g, p->x, p->x_row, p->x_col, NN_MAX_POOL_STORE);
}

/* out[oh * out_row + ow * out_col] = h * in_w + w of each window's first maximum. */
REFCPU_VECTOR_CLONES static void NN_FN(max_pool_indices_plane)(const pool_geometry* g, const NN_T* x,
                                                               int64_t x_row, int64_t x_col,
                                                               int64_t* out, int64_t out_row,
                                                               int64_t out_col) {
#define NN_MAX_POOL_STORE_INDICES(oh, ow0, count, best, where) \
  for (int64_t i_ = 0; i_ < (count); i_++) out[(oh) * out_row + ((ow0) + i_) * out_col] = where[i_]
  NN_MAX_POOL_ROWS(g, x, x_row, x_col, NN_MAX_POOL_STORE_INDICES);
#undef NN_MAX_POOL_STORE_INDICES
}

/* The widest input row whose column maxima max_pool_route_plane keeps on the stack. */
enum { NN_FN(POOL_COLUMNS_MAX) = 4096 };

/* max_pool2d_backward of one plane by columns (kernels_column_max.h): per output row, one pass
   over the window's input rows (contiguous when x_col is 1, so it vectorizes), then each
   window's first maximum in row-major order, the element max_pool_scan_row picks. */
REFCPU_ALWAYS_INLINE void NN_FN(max_pool_route_plane)(const pool_geometry* g, const NN_FN(pool_plane) * p,
                                                     int64_t x_col, NN_T* restrict dx) {
  NN_T col[NN_FN(POOL_COLUMNS_MAX)];
  int32_t arg[NN_FN(POOL_COLUMNS_MAX)];
  int64_t in_h = g->in_h, in_w = g->in_w;
  for (int64_t i = 0; i < in_h * in_w; i++) dx[i] = 0;
  for (int64_t oh = 0; oh < g->out_h; oh++) {
    int64_t h0 = oh * g->stride[0] - g->padding[0], h1 = h0 + g->kernel[0];
    h0 = h0 < 0 ? 0 : h0;
    h1 = h1 > in_h ? in_h : h1;
    if (h0 >= h1) continue;
    NN_FN(column_max_rows)(p->x, p->x_row, x_col, h0, h1, in_w, col, arg);
    for (int64_t ow = 0; ow < g->out_w; ow++) {
      int64_t w0 = ow * g->stride[1] - g->padding[1], w1 = w0 + g->kernel[1];
      w0 = w0 < 0 ? 0 : w0;
      w1 = w1 > in_w ? in_w : w1;
      if (w0 >= w1) continue;
      int64_t at;
      NN_FN(column_max_window)(col, arg, w0, w1, in_w, &at);
      dx[at] += p->out[oh * p->out_row + ow * p->out_col];
    }
  }
}

/* grad is the plane of the forward's out shape (read through out/out_row/out_col),
   x the forward input, dx (x's shape, compact rows) receives the gradient. */
REFCPU_VECTOR_CLONES static void NN_FN(max_pool_backward_plane)(const pool_geometry* g,
                                                                const NN_FN(pool_plane) * p,
                                                                NN_T* restrict dx) {
  if (g->in_w <= NN_FN(POOL_COLUMNS_MAX) && g->in_h <= INT32_MAX) {
    if (p->x_col == 1) NN_FN(max_pool_route_plane)(g, p, 1, dx); /* a constant: contiguous loads */
    else NN_FN(max_pool_route_plane)(g, p, p->x_col, dx);
    return;
  }
  for (int64_t i = 0; i < g->in_h * g->in_w; i++) dx[i] = 0;
#define NN_MAX_POOL_ROUTE(oh, ow0, count, best, where)                                    \
  for (int64_t i_ = 0; i_ < (count); i_++)                                                \
    if (where[i_] >= 0) dx[where[i_]] += p->out[(oh) * p->out_row + ((ow0) + i_) * p->out_col]
  NN_MAX_POOL_ROWS(g, p->x, p->x_row, p->x_col, NN_MAX_POOL_ROUTE);
#undef NN_MAX_POOL_ROUTE
}

#undef NN_MAX_POOL_STORE
#undef NN_MAX_POOL_ROWS

static void NN_FN(avg_pool_plane)(const pool_geometry* g, const NN_FN(pool_plane) * p) {
  double divisor = (double)(g->kernel[0] * g->kernel[1]);
  for (int64_t oh = 0; oh < g->out_h; oh++)
    for (int64_t ow = 0; ow < g->out_w; ow++) {
      int64_t h0 = oh * g->stride[0] - g->padding[0], w0 = ow * g->stride[1] - g->padding[1];
      double sum = 0;
      for (int64_t kh = 0; kh < g->kernel[0]; kh++) {
        int64_t h = h0 + kh;
        if (h < 0 || h >= g->in_h) continue;
        for (int64_t kw = 0; kw < g->kernel[1]; kw++) {
          int64_t w = w0 + kw;
          if (w < 0 || w >= g->in_w) continue;
          sum += (double)p->x[h * p->x_row + w * p->x_col];
        }
      }
      p->out[oh * p->out_row + ow * p->out_col] = (NN_T)(sum / divisor);
    }
}

static void NN_FN(avg_pool_backward_plane)(const pool_geometry* g, const NN_FN(pool_plane) * p,
                                           NN_T* restrict dx) {
  for (int64_t i = 0; i < g->in_h * g->in_w; i++) dx[i] = 0;
  NN_T inverse = (NN_T)(1.0 / (double)(g->kernel[0] * g->kernel[1]));
  for (int64_t oh = 0; oh < g->out_h; oh++)
    for (int64_t ow = 0; ow < g->out_w; ow++) {
      int64_t h0 = oh * g->stride[0] - g->padding[0], w0 = ow * g->stride[1] - g->padding[1];
      NN_T share = p->out[oh * p->out_row + ow * p->out_col] * inverse;
      for (int64_t kh = 0; kh < g->kernel[0]; kh++) {
        int64_t h = h0 + kh;
        if (h < 0 || h >= g->in_h) continue;
        for (int64_t kw = 0; kw < g->kernel[1]; kw++) {
          int64_t w = w0 + kw;
          if (w < 0 || w >= g->in_w) continue;
          dx[h * g->in_w + w] += share;
        }
      }
    }
}

/* ---- convolution: im2col / col2im over one sample and group ------------------------ */

/* col [ck, (oh_end - oh_begin) * out_w] (row (c * k_h + i) * k_w + j) for the
   output rows [oh_begin, oh_end) from the group's input channels x (element
   strides c_stride, h_stride, w_stride); padding reads 0. */
REFCPU_VECTOR_CLONES static void NN_FN(im2col)(const NN_T* x, int64_t c_stride, int64_t h_stride, int64_t w_stride,
                          const conv_geometry* g, int64_t oh_begin, int64_t oh_end, NN_T* restrict col) {
  int64_t out_w = g->out_w, spatial = (oh_end - oh_begin) * g->out_w;
  for (int64_t c = 0; c < g->group_in; c++)
    for (int64_t i = 0; i < g->k_h; i++)
      for (int64_t j = 0; j < g->k_w; j++) {
        NN_T* row = col + ((c * g->k_h + i) * g->k_w + j) * spatial;
        int64_t begin, end;
        conv_valid_range(g, j, &begin, &end);
        int64_t w_shift = j * g->dilation[1] - g->padding[1];
        for (int64_t oh = oh_begin; oh < oh_end; oh++) {
          NN_T* target = row + (oh - oh_begin) * out_w;
          int64_t h = oh * g->stride[0] - g->padding[0] + i * g->dilation[0];
          if (h < 0 || h >= g->in_h) {
            for (int64_t ow = 0; ow < out_w; ow++) target[ow] = 0;
            continue;
          }
          const NN_T* source = x + c * c_stride + h * h_stride;
          for (int64_t ow = 0; ow < begin; ow++) target[ow] = 0;
          if (g->stride[1] == 1 && w_stride == 1) {
            for (int64_t ow = begin; ow < end; ow++) target[ow] = source[ow + w_shift];
          } else if (g->stride[1] == 2 && w_stride == 1) { /* a constant stride: vector deinterleaves */
            for (int64_t ow = begin; ow < end; ow++) target[ow] = source[2 * ow + w_shift];
          } else {
            for (int64_t ow = begin; ow < end; ow++)
              target[ow] = source[(ow * g->stride[1] + w_shift) * w_stride];
          }
          for (int64_t ow = end; ow < out_w; ow++) target[ow] = 0;
        }
      }
}

/* dx [group_in, in_h, in_w] (compact) += the columns of col (output rows
   [oh_begin, oh_end), as im2col lays them out), the adjoint of im2col. */
static void NN_FN(col2im_add)(const NN_T* restrict col, const conv_geometry* g, int64_t oh_begin, int64_t oh_end,
                              NN_T* restrict dx) {
  int64_t out_w = g->out_w, spatial = (oh_end - oh_begin) * g->out_w, plane = g->in_h * g->in_w;
  for (int64_t c = 0; c < g->group_in; c++)
    for (int64_t i = 0; i < g->k_h; i++)
      for (int64_t j = 0; j < g->k_w; j++) {
        const NN_T* row = col + ((c * g->k_h + i) * g->k_w + j) * spatial;
        int64_t begin, end;
        conv_valid_range(g, j, &begin, &end);
        int64_t w_shift = j * g->dilation[1] - g->padding[1];
        for (int64_t oh = oh_begin; oh < oh_end; oh++) {
          int64_t h = oh * g->stride[0] - g->padding[0] + i * g->dilation[0];
          if (h < 0 || h >= g->in_h) continue;
          NN_T* target = dx + c * plane + h * g->in_w;
          const NN_T* source = row + (oh - oh_begin) * out_w;
          if (g->stride[1] == 1) {
            for (int64_t ow = begin; ow < end; ow++) target[ow + w_shift] += source[ow];
          } else {
            for (int64_t ow = begin; ow < end; ow++) target[ow * g->stride[1] + w_shift] += source[ow];
          }
        }
      }
}

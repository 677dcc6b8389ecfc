/* The typed loops of kernels_norm.c, included once per element type with
   NORM_T (float or double) and NORM_FN(name) (name##_f32 / name##_f64) defined.
   Every pointer is to compact data; sums accumulate in double. */

/* Mean and biased variance (two passes) of channel c of x [N, C, S]. */
static void NORM_FN(channel_stats)(const NORM_T* x, int64_t n, int64_t channels, int64_t s, int64_t c,
                                   double* mean, double* var) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const NORM_T* p = x + (i * channels + c) * s;
    for (int64_t k = 0; k < s; k++) sum += p[k];
  }
  double m = sum / (double)(n * s), squares = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const NORM_T* p = x + (i * channels + c) * s;
    for (int64_t k = 0; k < s; k++) {
      double d = p[k] - m;
      squares += d * d;
    }
  }
  *mean = m;
  *var = squares / (double)(n * s);
}

/* Mean and biased variance of count consecutive elements. */
static void NORM_FN(block_stats)(const NORM_T* x, int64_t count, double* mean, double* var) {
  double sum = 0.0;
  for (int64_t k = 0; k < count; k++) sum += x[k];
  double m = sum / (double)count, squares = 0.0;
  for (int64_t k = 0; k < count; k++) {
    double d = x[k] - m;
    squares += d * d;
  }
  *mean = m;
  *var = squares / (double)count;
}

/* out = x * scale + shift over s elements. */
static void NORM_FN(affine_run)(const NORM_T* x, NORM_T* out, int64_t s, double scale, double shift) {
  NORM_T a = (NORM_T)scale, b = (NORM_T)shift;
  for (int64_t k = 0; k < s; k++) out[k] = x[k] * a + b;
}

/* sum(g) and sum(g * (x - mean)) over s elements. */
static void NORM_FN(grad_sums)(const NORM_T* g, const NORM_T* x, int64_t s, double mean, double* sum_g,
                               double* sum_gx) {
  double a = 0.0, b = 0.0;
  for (int64_t k = 0; k < s; k++) {
    a += g[k];
    b += (double)g[k] * ((double)x[k] - mean);
  }
  *sum_g += a;
  *sum_gx += b;
}

/* dx = a * g + b * (x - mean) + c over s elements (the norms' input gradient, per channel). */
static void NORM_FN(grad_run)(const NORM_T* g, const NORM_T* x, NORM_T* dx, int64_t s, double a, double b,
                              double mean, double c) {
  for (int64_t k = 0; k < s; k++) dx[k] = (NORM_T)(a * (double)g[k] + b * ((double)x[k] - mean) + c);
}

/* The typed loops of kernels_norm.c, included once per element type with
   NORM_T (float or double) and NORM_FN(name) (name##_f32 / name##_f64) defined.
   Every pointer is to compact data; sums accumulate in double. */

/* Mean and biased variance (two passes) of channel c of x [N, C, S]. */
static double NORM_FN(run_sum)(const NORM_T* x, int64_t count);
static double NORM_FN(run_squares)(const NORM_T* x, int64_t count, double m);
static void NORM_FN(channel_stats)(const NORM_T* x, int64_t n, int64_t channels, int64_t s, int64_t c,
                                   double* mean, double* var) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) sum += NORM_FN(run_sum)(x + (i * channels + c) * s, s);
  double m = sum / (double)(n * s), squares = 0.0;
  for (int64_t i = 0; i < n; i++) squares += NORM_FN(run_squares)(x + (i * channels + c) * s, s, m);
  *mean = m;
  *var = squares / (double)(n * s);
}

/* Sum and sum of squared deviations from m of count consecutive elements, in NORM_LANES partial
   double sums: independent chains that fill the vector units (an add's latency hides behind the
   other lanes). */
REFCPU_VECTOR_CLONES static double NORM_FN(run_sum)(const NORM_T* x, int64_t count) {
  double a[NORM_LANES] = {0.0};
  int64_t k = 0;
  for (; k + NORM_LANES <= count; k += NORM_LANES)
    for (int j = 0; j < NORM_LANES; j++) a[j] += x[k + j];
  for (; k < count; k++) a[0] += x[k];
  return norm_lane_total(a);
}

REFCPU_VECTOR_CLONES static double NORM_FN(run_squares)(const NORM_T* x, int64_t count, double m) {
  double a[NORM_LANES] = {0.0};
  int64_t k = 0;
  for (; k + NORM_LANES <= count; k += NORM_LANES)
    for (int j = 0; j < NORM_LANES; j++) {
      double d = x[k + j] - m;
      a[j] += d * d;
    }
  for (; k < count; k++) {
    double d = x[k] - m;
    a[0] += d * d;
  }
  return norm_lane_total(a);
}

/* Mean and biased variance of count consecutive elements (two passes). */
static void NORM_FN(block_stats)(const NORM_T* x, int64_t count, double* mean, double* var) {
  double m = NORM_FN(run_sum)(x, count) / (double)count;
  *mean = m;
  *var = NORM_FN(run_squares)(x, count, m) / (double)count;
}

/* out = x * scale + shift over s elements. */
REFCPU_VECTOR_CLONES static void NORM_FN(affine_run)(const NORM_T* x, NORM_T* out, int64_t s, double scale, double shift) {
  NORM_T a = (NORM_T)scale, b = (NORM_T)shift;
  for (int64_t k = 0; k < s; k++) out[k] = x[k] * a + b;
}

/* sum(g) and sum(g * (x - mean)) over s elements: NORM_LANES partial double sums of g and g * x. */
REFCPU_VECTOR_CLONES static void NORM_FN(grad_sums)(const NORM_T* g, const NORM_T* x, int64_t s, double mean,
                                                    double* sum_g, double* sum_gx) {
  double a[NORM_LANES] = {0.0}, b[NORM_LANES] = {0.0};
  int64_t k = 0;
  for (; k + NORM_LANES <= s; k += NORM_LANES)
    for (int j = 0; j < NORM_LANES; j++) {
      a[j] += g[k + j];
      b[j] += (double)g[k + j] * (double)x[k + j];
    }
  for (; k < s; k++) {
    a[0] += g[k];
    b[0] += (double)g[k] * (double)x[k];
  }
  double total_g = norm_lane_total(a);
  *sum_g += total_g;
  *sum_gx += norm_lane_total(b) - mean * total_g;
}

/* dx = a * g + b * (x - mean) + c over s elements (the norms' input gradient, per channel), as
   A g + B x + C in the element type. */
REFCPU_VECTOR_CLONES static void NORM_FN(grad_run)(const NORM_T* g, const NORM_T* x, NORM_T* dx, int64_t s, double a, double b,
                              double mean, double c) {
  NORM_T A = (NORM_T)a, B = (NORM_T)b, C = (NORM_T)(c - b * mean);
  for (int64_t k = 0; k < s; k++) dx[k] = A * g[k] + B * x[k] + C;
}

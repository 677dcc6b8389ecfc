/* Creation ops (full, arange, rand, randn) and dropout: kernels whose values
   depend on the element's row-major index. Philox-4x32-10 and the exact
   mapping from (seed, offset, index) to numbers are documented in oar/refcpu.h. */
#include "kernels.h"

#include <stdlib.h>

/* ---- Philox-4x32-10 (Salmon et al., SC'11; as Random123's philox4x32_10) ---- */

void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* The first two words of Philox-4x32-10 at counter (c, c >> 32, 0, 0): the
   ones the mapping uses; written for the vectorizer (no arrays, no calls). */
REFCPU_ALWAYS_INLINE void philox_two_words(uint64_t seed, uint64_t counter, uint32_t* w0, uint32_t* w1) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  *w0 = c0;
  *w1 = c1;
}

static inline void philox_words(uint64_t seed, uint64_t counter, uint32_t words[4]) {
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  const uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  philox4x32_10(ctr, key, words);
}

REFCPU_ALWAYS_INLINE float uniform24(uint64_t seed, uint64_t counter) {
  uint32_t w0, w1;
  philox_two_words(seed, counter, &w0, &w1);
  return (float)(w0 >> 8) * 0x1.0p-24f;
}

float philox_uniform_f32(uint64_t seed, uint64_t counter) {
  uint32_t w[4];
  philox_words(seed, counter, w);
  return (float)(w[0] >> 8) * 0x1.0p-24f;
}

double philox_uniform_f64(uint64_t seed, uint64_t counter) {
  uint32_t w[4];
  philox_words(seed, counter, w);
  uint64_t bits = ((uint64_t)w[0] << 32) | w[1];
  return (double)(bits >> 11) * 0x1.0p-53;
}

/* ---- index-ordered generation ------------------------------------------------------ */

/* Writes count elements of out starting at row-major index first; elements
   lie stride bytes apart. */
typedef void (*generate_fn)(char* out, int64_t stride, int64_t first, int64_t count, void* context);

typedef struct generate_job {
  generate_fn fn;
  void* context;
  char* data;
  int64_t size;
  int64_t next_index; /* serial walk: index of the next row */
} generate_job;

static void generate_range(int64_t begin, int64_t end, void* opaque) {
  const generate_job* job = opaque;
  job->fn(job->data + begin * job->size, job->size, begin, end - begin, job->context);
}

static void generate_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  generate_job* job = opaque;
  job->fn(p[0], s[0], job->next_index, n, job->context);
  job->next_index += n;
}

/* Contiguous out: split over the pool; else one ordered walk. */
static void generate(const tensor_view* out, generate_fn fn, void* context, int64_t grain) {
  int64_t numel = view_numel(out);
  if (numel == 0) return;
  generate_job job = {.fn = fn, .context = context, .data = out->data, .size = out->elem_size};
  if (view_is_contiguous(out)) {
    refcpu_parallel_for(numel, grain, generate_range, &job);
    return;
  }
  const tensor_view* views[1] = {out};
  strided_plan plan;
  strided_plan_views(&plan, 1, views);
  char* bases[1] = {out->data};
  strided_for_each_row(&plan, bases, generate_row, &job);
}

/* ---- full ------------------------------------------------------------------------- */

typedef struct fill_context {
  unsigned char element[8];
  int elem_size;
  bool all_bytes_equal;
} fill_context;

static void fill_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  const fill_context* fill = opaque;
  int size = fill->elem_size;
  if (s[0] == size && fill->all_bytes_equal) {
    memset(p[0], fill->element[0], (size_t)(n * size));
    return;
  }
  if (s[0] == size && size == 4) { /* contiguous: a loop the vectorizer takes */
    uint32_t v, *out = (uint32_t*)p[0];
    memcpy(&v, fill->element, 4);
    for (int64_t i = 0; i < n; i++) out[i] = v;
    return;
  }
  if (s[0] == size && size == 8) {
    uint64_t v, *out = (uint64_t*)p[0];
    memcpy(&v, fill->element, 8);
    for (int64_t i = 0; i < n; i++) out[i] = v;
    return;
  }
  switch (size) {
    case 1: { uint8_t v = fill->element[0]; for (int64_t i = 0; i < n; i++) *(uint8_t*)(p[0] + i * s[0]) = v; break; }
    case 2: { uint16_t v; memcpy(&v, fill->element, 2); for (int64_t i = 0; i < n; i++) *(uint16_t*)(p[0] + i * s[0]) = v; break; }
    case 4: { uint32_t v; memcpy(&v, fill->element, 4); for (int64_t i = 0; i < n; i++) *(uint32_t*)(p[0] + i * s[0]) = v; break; }
    default: { uint64_t v; memcpy(&v, fill->element, 8); for (int64_t i = 0; i < n; i++) *(uint64_t*)(p[0] + i * s[0]) = v; break; }
  }
}

oar_status refcpu_run_full(const kernel_command* cmd) {
  const tensor_view* out = &cmd->outputs[0];
  const kernel_attr* value = &cmd->attrs[ATTR_full_value];
  fill_context fill = {.elem_size = out->elem_size};
  /* An OAR_ATTR_INT value stays exact for 64-bit ints. */
  if (value->exact_int) store_from_int(out->dtype, (char*)fill.element, value->i);
  else store_from_double(out->dtype, (char*)fill.element, value->f);
  fill.all_bytes_equal = true;
  for (int i = 1; i < fill.elem_size; i++)
    if (fill.element[i] != fill.element[0]) fill.all_bytes_equal = false;
  const tensor_view* views[1] = {out};
  strided_plan plan;
  strided_plan_views(&plan, 1, views);
  char* bases[1] = {out->data};
  strided_for_each_row_parallel(&plan, bases, fill_row, &fill);
  return OAR_SUCCESS;
}

/* ---- arange ------------------------------------------------------------------------ */

oar_status refcpu_check_arange(kernel_command* cmd) {
  if (cmd->outputs[0].ndim != 1)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: arange: out must be 1-D (its length is the count), not %d-D",
                       cmd->outputs[0].ndim);
  return OAR_SUCCESS;
}

typedef struct arange_context {
  uint8_t dtype;
  bool exact; /* integral out with integral start and step: int64 arithmetic */
  double start, step;
  int64_t start_i, step_i;
} arange_context;

/* Indices below 2^31 convert to double as int32, which vectorizes on AVX2 too (AVX-512 only has
   a vector int64 -> double). */
REFCPU_VECTOR_CLONES static void arange_fill(char* out, int64_t stride, int64_t first, int64_t count,
                                             void* opaque) {
  const arange_context* a = opaque;
  if (a->dtype == DTYPE_F32 && stride == 4) {
    float* o = (float*)out;
    if (first + count <= INT32_MAX) {
      int32_t base = (int32_t)first;
      for (int32_t i = 0; i < (int32_t)count; i++) o[i] = (float)(a->start + (double)(base + i) * a->step);
    } else {
      for (int64_t i = 0; i < count; i++) o[i] = (float)(a->start + (double)(first + i) * a->step);
    }
    return;
  }
  for (int64_t i = 0; i < count; i++) {
    int64_t index = first + i;
    if (a->exact)
      store_from_int(a->dtype, out + i * stride, (int64_t)((uint64_t)a->start_i + (uint64_t)index * (uint64_t)a->step_i));
    else
      store_from_double(a->dtype, out + i * stride, a->start + (double)index * a->step);
  }
}

oar_status refcpu_run_arange(const kernel_command* cmd) {
  const kernel_attr* start = &cmd->attrs[ATTR_arange_start];
  const kernel_attr* step = &cmd->attrs[ATTR_arange_step];
  arange_context a = {.dtype = cmd->outputs[0].dtype, .start = start->f, .step = step->f};
  /* Integral out and integral-valued start/step: exact int64 (defaults are 0.0 and 1.0). */
  if (!dtype_is_floating(a.dtype) && start->f == floor(start->f) && step->f == floor(step->f) &&
      fabs(start->f) < 9.2e18 && fabs(step->f) < 9.2e18) {
    a.exact = true;
    a.start_i = start->exact_int ? start->i : (int64_t)start->f;
    a.step_i = step->exact_int ? step->i : (int64_t)step->f;
  }
  generate(&cmd->outputs[0], arange_fill, &a, 1 << 15);
  return OAR_SUCCESS;
}

/* ---- rand / randn ---------------------------------------------------------------------- */

typedef struct random_context {
  uint64_t seed;
  uint64_t offset;
  uint8_t dtype;
} random_context;

REFCPU_VECTOR_CLONES
static void rand_fill(char* out, int64_t stride, int64_t first, int64_t count, void* opaque) {
  const random_context* r = opaque;
  uint64_t base = r->offset + (uint64_t)first; /* counters wrap mod 2^64 */
  if (r->dtype == DTYPE_F32 && stride == (int64_t)sizeof(float)) {
    float* o = (float*)out;
    for (int64_t i = 0; i < count; i++) o[i] = uniform24(r->seed, base + (uint64_t)i);
  } else if (r->dtype == DTYPE_F32) {
    for (int64_t i = 0; i < count; i++) *(float*)(out + i * stride) = uniform24(r->seed, base + (uint64_t)i);
  } else {
    for (int64_t i = 0; i < count; i++) *(double*)(out + i * stride) = philox_uniform_f64(r->seed, base + (uint64_t)i);
  }
}

/* ---- Box-Muller in double, vectorizable: fdlibm's log and sin/cos kernels (< 1 ulp, as
   libm's), branch-free and without calls, so the float32 results round to the same floats
   as the reference's (numpy's log1p/cos/sin) and the float64 ones stay within a few ulps. */

REFCPU_ALWAYS_INLINE uint64_t bm_bits(double x) {
  uint64_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}
REFCPU_ALWAYS_INLINE double bm_double(uint64_t b) {
  double x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/* log(x) for a normal x > 0 (here 1 - u1 in [2^-53, 1], exact): fdlibm's e_log.c. */
REFCPU_ALWAYS_INLINE double bm_log(double x) {
  const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  const double lg1 = 6.666666666666735130e-01, lg2 = 3.999999999940941908e-01,
               lg3 = 2.857142874366239149e-01, lg4 = 2.222219843214978396e-01,
               lg5 = 1.818357216161805012e-01, lg6 = 1.531383769920937332e-01,
               lg7 = 1.479819860511658591e-01;
  uint64_t bits = bm_bits(x);
  int32_t hx = (int32_t)(bits >> 32);
  int32_t k = (hx >> 20) - 1023;
  hx &= 0x000fffff;
  int32_t i = (hx + 0x95f64) & 0x100000; /* the mantissa into [sqrt(2)/2, sqrt(2)) */
  k += i >> 20;
  double f = bm_double(((uint64_t)(uint32_t)(hx | (i ^ 0x3ff00000)) << 32) | (bits & 0xffffffffu)) - 1.0;
  double s = f / (2.0 + f), dk = (double)k, z = s * s, w = z * z;
  double t1 = w * (lg2 + w * (lg4 + w * lg6));
  double t2 = z * (lg1 + w * (lg3 + w * (lg5 + w * lg7)));
  double r = t2 + t1, hfsq = 0.5 * f * f;
  bool large_f = ((hx - 0x6147a) | (0x6b851 - hx)) > 0;
  double with_hfsq = dk * ln2_hi - ((hfsq - (s * (hfsq + r) + dk * ln2_lo)) - f);
  double without = dk * ln2_hi - ((s * (f - r) - dk * ln2_lo) - f);
  return large_f ? with_hfsq : without;
}

/* fdlibm's __kernel_sin / __kernel_cos on |x + y| <= pi/4 (y the tail of x). */
REFCPU_ALWAYS_INLINE double bm_kernel_sin(double x, double y) {
  const double s1 = -1.66666666666666324348e-01, s2 = 8.33333333332248946124e-03,
               s3 = -1.98412698298579493134e-04, s4 = 2.75573137070700676789e-06,
               s5 = -2.50507602534068634195e-08, s6 = 1.58969099521155010221e-10;
  double z = x * x, v = z * x;
  double r = s2 + z * (s3 + z * (s4 + z * (s5 + z * s6)));
  return x - ((z * (0.5 * y - v * r) - y) - v * s1);
}
REFCPU_ALWAYS_INLINE double bm_kernel_cos(double x, double y) {
  const double c1 = 4.16666666666666019037e-02, c2 = -1.38888888888741095749e-03,
               c3 = 2.48015872894767294178e-05, c4 = -2.75573143513906633035e-07,
               c5 = 2.08757232129817482790e-09, c6 = -1.13596475577881948265e-11;
  int32_t ix = (int32_t)(bm_bits(x) >> 32) & 0x7fffffff;
  double z = x * x;
  double r = z * (c1 + z * (c2 + z * (c3 + z * (c4 + z * (c5 + z * c6)))));
  /* qx: 0 below 0.3 (then a - hz is 1 - z/2), x/4 to 20 bits up to 0.78125, else 0.28125 */
  double qx = ix < 0x3fd33333 ? 0.0
              : ix > 0x3fe90000 ? 0.28125
                                : bm_double((uint64_t)(uint32_t)(ix - 0x00200000) << 32);
  double hz = 0.5 * z - qx, a = 1.0 - qx;
  return a - (hz - (z * r - x * y));
}

/* sin and cos of theta in [0, 2 pi): theta - n pi/2 with pi/2 in three parts, then the kernels. */
REFCPU_ALWAYS_INLINE void bm_sincos(double theta, double* sin_out, double* cos_out) {
  const double pio2_1 = 1.57079632673412561417e+00, pio2_2 = 6.07710050630396597660e-11,
               pio2_2t = 2.02226624879595063154e-21, two_over_pi = 6.36619772367581382433e-01;
  double n = floor(theta * two_over_pi + 0.5);
  double r = theta - n * pio2_1; /* exact: n <= 4 and pio2_1 has 33 bits */
  double w = n * pio2_2;
  double y0 = r - w;
  double y1 = ((r - y0) - w) - n * pio2_2t;
  double y = y0 + y1;
  y1 = (y0 - y) + y1;
  double ks = bm_kernel_sin(y, y1), kc = bm_kernel_cos(y, y1);
  int32_t q = (int32_t)n & 3;
  double sin_v = (q & 1) ? kc : ks, cos_v = (q & 1) ? ks : kc;
  *sin_out = (q & 2) ? -sin_v : sin_v;
  *cos_out = ((q + 1) & 2) ? -cos_v : cos_v;
}

/* philox_uniform_f64's (((w0 << 32) | w1) >> 11) 2^-53 from int32 halves (exact), which
   vectorize without AVX-512DQ's int64 conversions. */
REFCPU_ALWAYS_INLINE double bm_uniform53(uint32_t w0, uint32_t w1) {
  int32_t high = (int32_t)(w0 >> 1), low = (int32_t)(((w0 & 1u) << 21) | (w1 >> 11));
  return ((double)high * 0x1.0p22 + (double)low) * 0x1.0p-53;
}

/* z0, z1 of the Box-Muller pairs at counters base, base + 2, ... (base even): cosine and
   sine of the pair of uniforms (base + 2j, base + 2j + 1), as the reference's randn. */
REFCPU_VECTOR_CLONES
static void normal_pairs(uint64_t seed, uint64_t base, int64_t pairs, double* z0, double* z1) {
  for (int64_t j = 0; j < pairs; j++) {
    uint32_t a0, a1, b0, b1;
    philox_two_words(seed, base + 2 * (uint64_t)j, &a0, &a1);
    philox_two_words(seed, base + 2 * (uint64_t)j + 1, &b0, &b1);
    double u1 = bm_uniform53(a0, a1), u2 = bm_uniform53(b0, b1);
    double radius = sqrt(-2.0 * bm_log(1.0 - u1)); /* 1 - u1 is exact: log1p(-u1) */
    double sin_v, cos_v;
    bm_sincos(6.283185307179586 * u2, &sin_v, &cos_v);
    z0[j] = radius * cos_v;
    z1[j] = radius * sin_v;
  }
}

/* The same pairs with libm's log1p, cos and sin: exact to the documented mapping, which float64
   output must be bit for bit (normal_pairs is within 3 ulps of it; float32 rounds that away). */
static void normal_pairs_libm(uint64_t seed, uint64_t base, int64_t pairs, double* z0, double* z1) {
  for (int64_t j = 0; j < pairs; j++) {
    uint32_t a0, a1, b0, b1;
    philox_two_words(seed, base + 2 * (uint64_t)j, &a0, &a1);
    philox_two_words(seed, base + 2 * (uint64_t)j + 1, &b0, &b1);
    double radius = sqrt(-2.0 * log1p(-bm_uniform53(a0, a1)));
    double theta = 6.283185307179586 * bm_uniform53(b0, b1);
    z0[j] = radius * cos(theta);
    z1[j] = radius * sin(theta);
  }
}

static void store_normal(const random_context* r, char* p, double z) {
  if (r->dtype == DTYPE_F32) *(float*)p = (float)z;
  else *(double*)p = z;
}

#define RANDN_BLOCK_PAIRS 128

static void randn_fill(char* out, int64_t stride, int64_t first, int64_t count, void* opaque) {
  const random_context* r = opaque;
  void (*pairs_of)(uint64_t, uint64_t, int64_t, double*, double*) =
      r->dtype == DTYPE_F32 ? normal_pairs : normal_pairs_libm;
  int64_t i = 0;
  double z0[RANDN_BLOCK_PAIRS], z1[RANDN_BLOCK_PAIRS];
  if (count > 0 && ((r->offset + (uint64_t)first) & 1) == 1) { /* an odd first counter: a sine */
    pairs_of(r->seed, r->offset + (uint64_t)first - 1, 1, z0, z1);
    store_normal(r, out, z1[0]);
    i = 1;
  }
  while (i < count) {
    int64_t pairs = (count - i + 1) / 2 < RANDN_BLOCK_PAIRS ? (count - i + 1) / 2 : RANDN_BLOCK_PAIRS;
    pairs_of(r->seed, r->offset + (uint64_t)(first + i), pairs, z0, z1);
    for (int64_t j = 0; j < pairs; j++, i += 2) {
      store_normal(r, out + i * stride, z0[j]);
      if (i + 1 < count) store_normal(r, out + (i + 1) * stride, z1[j]);
    }
  }
}

oar_status refcpu_run_rand(const kernel_command* cmd) {
  random_context r = {.seed = (uint64_t)attr_int(cmd, ATTR_rand_seed),
                      .offset = (uint64_t)attr_int(cmd, ATTR_rand_offset),
                      .dtype = cmd->outputs[0].dtype};
  generate(&cmd->outputs[0], rand_fill, &r, 1 << 14);
  return OAR_SUCCESS;
}

oar_status refcpu_run_randn(const kernel_command* cmd) {
  random_context r = {.seed = (uint64_t)attr_int(cmd, ATTR_randn_seed),
                      .offset = (uint64_t)attr_int(cmd, ATTR_randn_offset),
                      .dtype = cmd->outputs[0].dtype};
  /* Even chunk sizes keep Box-Muller pairs within one task (only a speed matter). */
  generate(&cmd->outputs[0], randn_fill, &r, 1 << 12);
  return OAR_SUCCESS;
}

/* ---- dropout ------------------------------------------------------------------------------ */

oar_status refcpu_check_dropout(kernel_command* cmd) {
  double p = attr_float(cmd, ATTR_dropout_p);
  if (!(p >= 0.0 && p <= 1.0))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: dropout: p is %g, not in [0, 1]", p);
  return OAR_SUCCESS;
}

typedef struct dropout_context {
  uint64_t seed, offset;
  double p;
  uint8_t dtype;
  float scale_f32;
  double scale_f64;
  const char* x;       /* contiguous path: x's base */
  char* out;
  int64_t x_stride, out_stride; /* bytes (serial path: per row) */
  int64_t next_index;
} dropout_context;

/* keep(i) = U24(offset + i) >= p with rand's float32 uniform, for both dtypes. */
REFCPU_VECTOR_CLONES
static void dropout_elements(const dropout_context* d, const char* x, int64_t xs, char* out,
                             int64_t os, int64_t first, int64_t count) {
  uint64_t base = d->offset + (uint64_t)first;
  if (d->dtype == DTYPE_F32 && xs == 4 && os == 4) {
    const float* in = (const float*)x;
    float* o = (float*)out;
    for (int64_t i = 0; i < count; i++) {
      float scaled = in[i] * d->scale_f32; /* read unconditionally: a select, not a branch */
      o[i] = (double)uniform24(d->seed, base + (uint64_t)i) >= d->p ? scaled : 0.0f;
    }
  } else if (d->dtype == DTYPE_F32) {
    for (int64_t i = 0; i < count; i++) {
      bool keep = (double)uniform24(d->seed, base + (uint64_t)i) >= d->p;
      *(float*)(out + i * os) = keep ? *(const float*)(x + i * xs) * d->scale_f32 : 0.0f;
    }
  } else {
    for (int64_t i = 0; i < count; i++) {
      bool keep = (double)uniform24(d->seed, base + (uint64_t)i) >= d->p;
      *(double*)(out + i * os) = keep ? *(const double*)(x + i * xs) * d->scale_f64 : 0.0;
    }
  }
}

static void dropout_range(int64_t begin, int64_t end, void* opaque) {
  const dropout_context* d = opaque;
  dropout_elements(d, d->x + begin * d->x_stride, d->x_stride, d->out + begin * d->out_stride,
                   d->out_stride, begin, end - begin);
}

static void dropout_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  dropout_context* d = opaque;
  dropout_elements(d, p[0], s[0], p[1], s[1], d->next_index, n);
  d->next_index += n;
}

oar_status refcpu_run_dropout(const kernel_command* cmd) {
  const tensor_view* x = &cmd->inputs[0];
  const tensor_view* out = &cmd->outputs[0];
  double p = attr_float(cmd, ATTR_dropout_p);
  dropout_context d = {.seed = (uint64_t)attr_int(cmd, ATTR_dropout_seed),
                       .offset = (uint64_t)attr_int(cmd, ATTR_dropout_offset),
                       .p = p, .dtype = out->dtype,
                       .scale_f32 = (float)(1.0 / (1.0 - p)), .scale_f64 = 1.0 / (1.0 - p)};
  int64_t numel = view_numel(out);
  if (numel == 0) return OAR_SUCCESS;
  if (view_is_contiguous(x) && view_is_contiguous(out)) {
    d.x = x->data;
    d.out = out->data;
    d.x_stride = x->elem_size;
    d.out_stride = out->elem_size;
    refcpu_parallel_for(numel, 1 << 14, dropout_range, &d);
    return OAR_SUCCESS;
  }
  const tensor_view* views[2] = {x, out};
  strided_plan plan;
  strided_plan_views(&plan, 2, views);
  char* bases[2] = {x->data, out->data};
  strided_for_each_row(&plan, bases, dropout_row, &d);
  return OAR_SUCCESS;
}

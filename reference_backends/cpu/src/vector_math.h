/* float32 log, log1p, expm1, sin and cos written as branch-free selects that
   gcc vectorizes inside REFCPU_VECTOR_CLONES rows (libm's are scalar calls).
   Errors vs float64 are checked by tests/test_kernel_accuracy.py. */
#ifndef OAR_REFCPU_VECTOR_MATH_H_
#define OAR_REFCPU_VECTOR_MATH_H_

#include "kernels.h"

/* ln x within 1 ulp (Cephes' logf, evaluated with fmaf): x = m 2^e with m in [sqrt(1/2), sqrt 2),
   ln m by a polynomial in m - 1; subnormals scaled by 2^23 first; 0 -> -Inf,
   x < 0 -> NaN, +Inf and NaN pass through. */
REFCPU_ALWAYS_INLINE float refcpu_logf(float x) {
  bool tiny = x < 1.17549435e-38f;
  float scaled = tiny ? x * 8388608.0f : x;
  uint32_t bits;
  memcpy(&bits, &scaled, sizeof bits);
  int32_t e = (int32_t)((bits >> 23) & 0xffu) - 126 - (tiny ? 23 : 0);
  uint32_t mantissa_bits = (bits & 0x007fffffu) | 0x3f000000u; /* m in [0.5, 1) */
  float m;
  memcpy(&m, &mantissa_bits, sizeof m);
  bool low = m < 0.707106781186547524f;
  e = low ? e - 1 : e;
  float f = low ? m + m - 1.0f : m - 1.0f;
  float z = f * f;
  float y = 7.0376836292e-2f;
  y = __builtin_fmaf(y, f, -1.1514610310e-1f);
  y = __builtin_fmaf(y, f, 1.1676998740e-1f);
  y = __builtin_fmaf(y, f, -1.2420140846e-1f);
  y = __builtin_fmaf(y, f, 1.4249322787e-1f);
  y = __builtin_fmaf(y, f, -1.6668057665e-1f);
  y = __builtin_fmaf(y, f, 2.0000714765e-1f);
  y = __builtin_fmaf(y, f, -2.4999993993e-1f);
  y = __builtin_fmaf(y, f, 3.3333331174e-1f);
  y = y * f * z;
  float fe = (float)e;
  y = __builtin_fmaf(fe, -2.12194440e-4f, y);
  y = __builtin_fmaf(-0.5f, z, y);
  float r = f + y;
  r = __builtin_fmaf(fe, 0.693359375f, r);
  r = x == 0.0f ? -__builtin_inff() : r;
  r = x < 0.0f ? __builtin_nanf("") : r;
  r = x == __builtin_inff() ? x : r;
  return x != x ? x : r;
}

/* ln(1 + x) (Goldberg): log(u) * x / (u - 1) with u = 1 + x rounded, which
   cancels u's rounding error; x itself where u == 1 (keeps -0). */
REFCPU_ALWAYS_INLINE float refcpu_log1pf(float x) {
  float u = 1.0f + x;
  float r = refcpu_logf(u) * (x / (u - 1.0f));
  r = u == 1.0f ? x : r;
  return x == __builtin_inff() ? x : r;
}

/* e^x - 1 (Kahan): (u - 1) x / ln u with u = e^x rounded; x where u == 1
   (keeps -0), -1 where u - 1 rounds to -1, +Inf on overflow. */
REFCPU_ALWAYS_INLINE float refcpu_expm1f(float x) {
  float u = refcpu_expf(x);
  float um1 = u - 1.0f;
  float r = um1 * (x / refcpu_logf(u));
  r = um1 == -1.0f ? -1.0f : r;
  r = u == 1.0f ? x : r;
  return u == __builtin_inff() ? u : r;
}

/* sin/cos reduce x by pi/2 in float64 (fdlibm's 33-bit pio2_1 + pio2_1t: exact
   products for |x| < REFCPU_TRIG_LIMIT) and evaluate FreeBSD's float kernels
   __kernel_sindf/__kernel_cosdf (float64, |r| <= pi/4) with fma: under 1 ulp.
   Both kernels are y (1 + z P(z)), z = r^2, with y = r for sin and 1 for cos,
   so each lane evaluates one polynomial whose coefficients its quadrant picks.
   Larger, Inf and NaN arguments are the caller's (libm). */
#define REFCPU_TRIG_LIMIT 1048576.0f

/* sin(q pi/2 + r) where x = q' pi/2 + r and q = q' + shift (cos: shift 1). */
REFCPU_ALWAYS_INLINE double refcpu_sin_quadrant(float x, int64_t shift) {
  const double shifter = 6755399441055744.0; /* 1.5 * 2^52: rounds to an integer */
  double xd = (double)x;
  double t = __builtin_fma(xd, 6.36619772367581382433e-01, shifter);
  double j = t - shifter;
  int64_t q;
  memcpy(&q, &t, sizeof q); /* j in the low bits */
  q += shift;
  double r = __builtin_fma(-j, 1.57079632673412561417e+00, xd);
  r = __builtin_fma(-j, 6.07710050650619224932e-11, r);
  bool odd = (q & 1) != 0; /* cos kernel */
  double z = r * r;
  double y = odd ? 1.0 : r;
  double p = odd ? 0.0000243904487962774090654 : 0.0000027183114939898219064;
  p = __builtin_fma(p, z, odd ? -0.00138867637746099294692 : -0.000198393348360966317347);
  p = __builtin_fma(p, z, odd ? 0.0416666233237390631894 : 0.0083333293858894631756);
  p = __builtin_fma(p, z, odd ? -0.499999997251031003120 : -0.166666666416265235595);
  double v = __builtin_fma(y * z, p, y);
  return (q & 2) ? -v : v;
}

/* sin x for |x| <= REFCPU_TRIG_LIMIT; sin(+-0) = +-0. */
REFCPU_ALWAYS_INLINE float refcpu_sinf_reduced(float x) {
  float v = (float)refcpu_sin_quadrant(x, 0);
  return x == 0.0f ? x : v;
}

/* cos x for |x| <= REFCPU_TRIG_LIMIT. */
REFCPU_ALWAYS_INLINE float refcpu_cosf_reduced(float x) { return (float)refcpu_sin_quadrant(x, 1); }

/* x^y for 0 < x < Inf (subnormals included) and finite y, in float64 with
   one final rounding to float (which also gives Inf on overflow, subnormals
   and 0 on underflow): log2 x = e + 2 atanh(s) / ln 2 with x = m 2^e,
   m in [sqrt(1/2), sqrt 2), s = (m - 1) / (m + 1) (series to s^17: 3e-14
   relative), and 2^v = 2^n 2^f, |f| <= 1/2, by a degree-10 Taylor polynomial
   (2e-13). The float64 error is ~1e-9 of a float ulp: within 0.5 ulp but for
   near-ties. Other bases and exponents are the caller's (libm). */
REFCPU_ALWAYS_INLINE float refcpu_powf_positive(float x, float y) {
  double xd = (double)x;
  uint64_t bits;
  memcpy(&bits, &xd, sizeof bits);
  uint64_t mantissa_bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* m in [1, 2) */
  uint64_t exponent_bits = (bits >> 52) | 0x4330000000000000ull; /* 2^52 + biased exponent */
  double m, e;
  memcpy(&m, &mantissa_bits, sizeof m);
  memcpy(&e, &exponent_bits, sizeof e);
  e = e - (4503599627370496.0 + 1023.0);
  bool high = m > 1.41421356237309504880;
  m = high ? 0.5 * m : m;
  e = high ? e + 1.0 : e;
  double s = (m - 1.0) / (m + 1.0);
  double z = s * s;
  double series = 1.0 / 17.0;
  series = __builtin_fma(series, z, 1.0 / 15.0);
  series = __builtin_fma(series, z, 1.0 / 13.0);
  series = __builtin_fma(series, z, 1.0 / 11.0);
  series = __builtin_fma(series, z, 1.0 / 9.0);
  series = __builtin_fma(series, z, 1.0 / 7.0);
  series = __builtin_fma(series, z, 1.0 / 5.0);
  series = __builtin_fma(series, z, 1.0 / 3.0);
  series = __builtin_fma(series, z, 1.0);
  double log2x = __builtin_fma(s * 2.88539008177792681472, series, e);
  double v = (double)y * log2x;
  v = v < 200.0 ? v : 200.0; /* 2^200 rounds to Inf in float, 2^-200 to 0 */
  v = v > -200.0 ? v : -200.0;
  const double shifter = 6755399441055744.0; /* 1.5 * 2^52: rounds to an integer */
  double t = v + shifter;
  double n = t - shifter;
  double f = v - n;
  double p = 7.05491162080112332988e-9;
  p = __builtin_fma(p, f, 1.01780860092396997275e-7);
  p = __builtin_fma(p, f, 1.32154867901443094884e-6);
  p = __builtin_fma(p, f, 1.525273380405984028e-5);
  p = __builtin_fma(p, f, 1.54035303933816099544e-4);
  p = __builtin_fma(p, f, 1.33335581464284434234e-3);
  p = __builtin_fma(p, f, 9.61812910762847716198e-3);
  p = __builtin_fma(p, f, 5.55041086648215799531e-2);
  p = __builtin_fma(p, f, 2.40226506959100712334e-1);
  p = __builtin_fma(p, f, 6.93147180559945309417e-1);
  p = __builtin_fma(p, f, 1.0);
  uint64_t t_bits;
  memcpy(&t_bits, &t, sizeof t_bits);
  uint64_t scale_bits = (t_bits + 1023u) << 52; /* t's low bits hold n, |n| <= 200 */
  double scale;
  memcpy(&scale, &scale_bits, sizeof scale);
  return (float)(p * scale);
}

#endif /* OAR_REFCPU_VECTOR_MATH_H_ */

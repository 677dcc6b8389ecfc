/* ew_float.cl -- elementwise kernels of a floating compute family, included
 * once per family with T (float / double), FAM(name) (name##_F / name##_D),
 * LD (ld_F / ld_D) and ST (st_F / st_D) defined by the program assembly.
 *
 * Tensors of a g_nd: 0 is out, 1.. are the inputs. Inputs of any dtype are
 * converted to T on load and the result converted to out's dtype on store, so
 * float16 / bfloat16 compute in float32 and mixed dtypes in the promoted one. */

inline T FAM(ew_op)(int op, T a, T b, T c, T s0, T s1) {
  switch (op) {
    case EW_IDENTITY: return a;
    case EW_NEG: return -a;
    case EW_ABS: return fabs(a);
    case EW_SIGN: return a > (T)0 ? (T)1 : (a < (T)0 ? (T)-1 : (a != a ? a : (T)0));
    case EW_EXP: return exp(a);
    case EW_LOG: return log(a);
    case EW_SQRT: return sqrt(a);
    case EW_RSQRT: return (T)1 / sqrt(a);
    case EW_RECIPROCAL: return (T)1 / a;
    case EW_SIN: return sin(a);
    case EW_COS: return cos(a);
    case EW_TANH: return tanh(a);
    case EW_SIGMOID: return (T)1 / ((T)1 + exp(-a));
    case EW_RELU: return a < (T)0 ? (T)0 : a;
    /* x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation for negative x */
    case EW_GELU_ERF: return (T)0.5 * a * erfc(a * (T)-0.70710678118654752440);
    /* 0.5 x (1 + tanh u) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
    case EW_GELU_TANH: return a / ((T)1 + exp((T)-1.5957691216057307 * (a + (T)0.044715 * a * a * a)));
    case EW_SILU: return a / ((T)1 + exp(-a));
    case EW_ERF: return erf(a);
    case EW_LOGICAL_NOT: return a == (T)0 ? (T)1 : (T)0;
    case EW_ISNAN: return a != a ? (T)1 : (T)0;
    case EW_CLAMP: {
      if (s0 != s0) return s0;
      if (s1 != s1) return s1;
      T low = a < s0 ? s0 : a;
      return low > s1 ? s1 : low;
    }
    case EW_ADD: return a + b;
    case EW_SUB: return a - b;
    case EW_MUL: return a * b;
    case EW_DIV: return a / b;
    case EW_POW: return b == (T)2 ? a * a : pow(a, b);
    case EW_MAXIMUM: return (a > b || a != a) ? a : b;
    case EW_MINIMUM: return (a < b || a != a) ? a : b;
    case EW_EQ: return a == b ? (T)1 : (T)0;
    case EW_NE: return a != b ? (T)1 : (T)0;
    case EW_LT: return a < b ? (T)1 : (T)0;
    case EW_LE: return a <= b ? (T)1 : (T)0;
    case EW_GT: return a > b ? (T)1 : (T)0;
    case EW_GE: return a >= b ? (T)1 : (T)0;
    case EW_LOGICAL_AND: return (a != (T)0 && b != (T)0) ? (T)1 : (T)0;
    case EW_LOGICAL_OR: return (a != (T)0 || b != (T)0) ? (T)1 : (T)0;
    /* d gelu / dx = Phi(x) + x phi(x) */
    case EW_GELU_BACKWARD_ERF:
      return a * ((T)0.5 * erfc(b * (T)-0.70710678118654752440) +
                  b * (T)0.39894228040143267794 * exp((T)-0.5 * b * b));
    /* s = sigmoid(2u): d/dx = s + 2 x s (1 - s) k (1 + 3 c x^2) */
    case EW_GELU_BACKWARD_TANH: {
      T s = (T)1 / ((T)1 + exp((T)-1.5957691216057307 * (b + (T)0.044715 * b * b * b)));
      return a * (s + (T)2 * b * s * ((T)1 - s) * (T)0.7978845608028654 * ((T)1 + (T)0.134145 * b * b));
    }
    case EW_WHERE: return a != (T)0 ? b : c;
  }
  return a;
}

/* out = op(inputs) over g (nin inputs of dtypes dt1..dt3, out of dto). */
kernel void FAM(ew)(g_nd g, int op, int nin, int dto, int dt1, int dt2, int dt3, T s0, T s1,
                    global uchar* po, global const uchar* p1, global const uchar* p2,
                    global const uchar* p3) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    T a = LD(p1, dt1, off[1]);
    T b = nin > 1 ? LD(p2, dt2, off[2]) : (T)0;
    T c = nin > 2 ? LD(p3, dt3, off[3]) : (T)0;
    ST(po, dto, off[0], FAM(ew_op)(op, a, b, c, s0, s1));
  }
}

/* arange: out[i] = start + i * step (out 1-D, tensor 0). */
kernel void FAM(arange)(g_nd g, int dto, T start, T step, global uchar* po) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0))
    ST(po, dto, g.offset[0] + i * g.stride[0][0], start + (T)i * step);
}

/* dropout: out = keep ? x * scale : 0, keep = (w0 >> 8) >= threshold (U24 >= p, exactly). */
kernel void FAM(dropout)(g_nd g, int dt, ulong seed, ulong offset, uint threshold, T scale,
                         global uchar* po, global const uchar* px) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    uint2 w = philox_w01(seed, offset + (ulong)i);
    T x = LD(px, dt, off[1]);
    ST(po, dt, off[0], (w.x >> 8) >= threshold ? x * scale : (T)0);
  }
}

/* The fast path: out and inputs of dtype T over at most 3 (coalesced) dims, one
   work item per element on a 3-D range (cols, rows, planes). The op is a
   compile-time constant per kernel, so the switch folds away and the compiler
   vectorizes (strided and broadcast (stride 0) inputs included; no division may
   enter the index math, or PoCL stops vectorizing). ewc_<code>_F / _D.
   s holds per tensor t (0 out, 1, 2 the inputs) {offset, plane, row, col stride}. */
#define EW_FAST(code)                                                                                             \
  kernel void FAM(ewc_##code)(long cols, long rows, long planes, T s0, T s1, long16 s, global T* po,              \
                              global const T* p1, global const T* p2) {                                           \
    long c = get_global_id(0), r = get_global_id(1), p = get_global_id(2);                                         \
    if (c >= cols || r >= rows || p >= planes) return;                                                            \
    po[s.s0 + p * s.s1 + r * s.s2 + c * s.s3] =                                                                   \
        FAM(ew_op)(code, p1[s.s4 + p * s.s5 + r * s.s6 + c * s.s7], p2[s.s8 + p * s.s9 + r * s.sa + c * s.sb],     \
                   (T)0, s0, s1);                                                                                 \
  }
/* EW_IDENTITY .. EW_ERF, EW_CLAMP, EW_ADD .. EW_MINIMUM, the gelu gradients: the ops whose result is T */
EW_FAST(0) EW_FAST(1) EW_FAST(2) EW_FAST(3) EW_FAST(4) EW_FAST(5) EW_FAST(6) EW_FAST(7) EW_FAST(8) EW_FAST(9)
EW_FAST(10) EW_FAST(11) EW_FAST(12) EW_FAST(13) EW_FAST(14) EW_FAST(15) EW_FAST(16) EW_FAST(17) EW_FAST(20)
EW_FAST(32) EW_FAST(33) EW_FAST(34) EW_FAST(35) EW_FAST(36) EW_FAST(37) EW_FAST(38) EW_FAST(47) EW_FAST(48)
#undef EW_FAST

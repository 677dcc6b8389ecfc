/* common.cl -- helpers every program of the kernel library starts with (after
 * cl_shared.h): element loads and stores with dtype conversion in three
 * compute families (F: float, D: double, L: long), raw element moves, n-d
 * offsets, the status-block gate and Philox-4x32-10.
 *
 * Conversions follow oar/refcpu.h's cast rules: float -> int truncates toward
 * zero and saturates (NaN -> 0); int -> narrower int wraps; -> bool is x != 0;
 * to float16 / bfloat16 rounds to nearest even (once, from the source value).
 * OAR_FP64 is defined by the plugin when the device has cl_khr_fp64. */

#ifdef OAR_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t; /* accumulator of float32 sums */
#else
typedef float acc_t;
#endif

#define LOCAL_SIZE 128 /* the local size of every library kernel launched with groups */

/* ---- bfloat16 ------------------------------------------------------------------ */

inline ushort bf16_from_float(float value) {
  uint u = as_uint(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u); /* quiet NaN */
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float float_from_bf16(ushort bits) { return as_float((uint)bits << 16); }

#ifdef OAR_FP64
/* One rounding from double: round toward zero to float and make the result
   odd when inexact (round-to-odd keeps the sticky bit), then round to even. */
inline ushort bf16_from_double(double value) {
  if (isnan(value)) return bf16_from_float((float)value);
  float truncated = convert_float_rtz(value);
  uint u = as_uint(truncated);
  if ((double)truncated != value && (u & 0x7fffffffu) < 0x7f800000u) u |= 1u;
  return bf16_from_float(as_float(u));
}
#endif

/* ---- F family: float ------------------------------------------------------------- */

inline float ld_F(global const uchar* p, int dt, long i) {
  switch (dt) {
    case DT_F32: return ((global const float*)p)[i];
#ifdef OAR_FP64
    case DT_F64: return (float)((global const double*)p)[i];
#endif
    case DT_F16: return vload_half((size_t)i, (global const half*)p);
    case DT_BF16: return float_from_bf16(((global const ushort*)p)[i]);
    case DT_I8: return (float)((global const char*)p)[i];
    case DT_I16: return (float)((global const short*)p)[i];
    case DT_I32: return (float)((global const int*)p)[i];
    case DT_I64: return (float)((global const long*)p)[i];
    case DT_U8: return (float)((global const uchar*)p)[i];
    case DT_BOOL: return ((global const uchar*)p)[i] != 0 ? 1.0f : 0.0f;
  }
  return 0.0f;
}

inline void st_F(global uchar* p, int dt, long i, float v) {
  switch (dt) {
    case DT_F32: ((global float*)p)[i] = v; break;
#ifdef OAR_FP64
    case DT_F64: ((global double*)p)[i] = (double)v; break;
#endif
    case DT_F16: vstore_half_rte(v, (size_t)i, (global half*)p); break;
    case DT_BF16: ((global ushort*)p)[i] = bf16_from_float(v); break;
    case DT_I8: ((global char*)p)[i] = convert_char_sat_rtz(v); break;
    case DT_I16: ((global short*)p)[i] = convert_short_sat_rtz(v); break;
    case DT_I32: ((global int*)p)[i] = convert_int_sat_rtz(v); break;
    case DT_I64: ((global long*)p)[i] = convert_long_sat_rtz(v); break;
    case DT_U8: ((global uchar*)p)[i] = convert_uchar_sat_rtz(v); break;
    case DT_BOOL: ((global uchar*)p)[i] = v != 0.0f; break;
  }
}

/* ---- D family: double -------------------------------------------------------------- */

#ifdef OAR_FP64
inline double ld_D(global const uchar* p, int dt, long i) {
  switch (dt) {
    case DT_F32: return (double)((global const float*)p)[i];
    case DT_F64: return ((global const double*)p)[i];
    case DT_F16: return (double)vload_half((size_t)i, (global const half*)p);
    case DT_BF16: return (double)float_from_bf16(((global const ushort*)p)[i]);
    case DT_I8: return (double)((global const char*)p)[i];
    case DT_I16: return (double)((global const short*)p)[i];
    case DT_I32: return (double)((global const int*)p)[i];
    case DT_I64: return (double)((global const long*)p)[i];
    case DT_U8: return (double)((global const uchar*)p)[i];
    case DT_BOOL: return ((global const uchar*)p)[i] != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

inline void st_D(global uchar* p, int dt, long i, double v) {
  switch (dt) {
    case DT_F32: ((global float*)p)[i] = (float)v; break;
    case DT_F64: ((global double*)p)[i] = v; break;
    case DT_F16: vstore_half_rte(v, (size_t)i, (global half*)p); break;
    case DT_BF16: ((global ushort*)p)[i] = bf16_from_double(v); break;
    case DT_I8: ((global char*)p)[i] = convert_char_sat_rtz(v); break;
    case DT_I16: ((global short*)p)[i] = convert_short_sat_rtz(v); break;
    case DT_I32: ((global int*)p)[i] = convert_int_sat_rtz(v); break;
    case DT_I64: ((global long*)p)[i] = convert_long_sat_rtz(v); break;
    case DT_U8: ((global uchar*)p)[i] = convert_uchar_sat_rtz(v); break;
    case DT_BOOL: ((global uchar*)p)[i] = v != 0.0; break;
  }
}
#endif

/* ---- L family: long (integers wrap, bool is 0/1) ------------------------------------- */

inline long ld_L(global const uchar* p, int dt, long i) {
  switch (dt) {
    case DT_F32: return convert_long_sat_rtz(((global const float*)p)[i]);
#ifdef OAR_FP64
    case DT_F64: return convert_long_sat_rtz(((global const double*)p)[i]);
#endif
    case DT_F16: return convert_long_sat_rtz(vload_half((size_t)i, (global const half*)p));
    case DT_BF16: return convert_long_sat_rtz(float_from_bf16(((global const ushort*)p)[i]));
    case DT_I8: return (long)((global const char*)p)[i];
    case DT_I16: return (long)((global const short*)p)[i];
    case DT_I32: return (long)((global const int*)p)[i];
    case DT_I64: return ((global const long*)p)[i];
    case DT_U8: return (long)((global const uchar*)p)[i];
    case DT_BOOL: return ((global const uchar*)p)[i] != 0;
  }
  return 0;
}

inline void st_L(global uchar* p, int dt, long i, long v) {
  switch (dt) {
    case DT_F32: ((global float*)p)[i] = (float)v; break;
#ifdef OAR_FP64
    case DT_F64: ((global double*)p)[i] = (double)v; break;
    case DT_F16: vstore_half_rte((double)v, (size_t)i, (global half*)p); break;
    case DT_BF16: ((global ushort*)p)[i] = bf16_from_double((double)v); break;
#else
    case DT_F16: vstore_half_rte((float)v, (size_t)i, (global half*)p); break;
    case DT_BF16: ((global ushort*)p)[i] = bf16_from_float((float)v); break;
#endif
    case DT_I8: ((global char*)p)[i] = as_char((uchar)as_ulong(v)); break;
    case DT_I16: ((global short*)p)[i] = as_short((ushort)as_ulong(v)); break;
    case DT_I32: ((global int*)p)[i] = as_int((uint)as_ulong(v)); break;
    case DT_I64: ((global long*)p)[i] = v; break;
    case DT_U8: ((global uchar*)p)[i] = (uchar)as_ulong(v); break;
    case DT_BOOL: ((global uchar*)p)[i] = v != 0; break;
  }
}

/* ---- raw elements of 1, 2, 4 or 8 bytes ---------------------------------------------- */

inline ulong ld_raw(global const uchar* p, int size, long i) {
  switch (size) {
    case 1: return p[i];
    case 2: return ((global const ushort*)p)[i];
    case 4: return ((global const uint*)p)[i];
    default: return ((global const ulong*)p)[i];
  }
}

inline void st_raw(global uchar* p, int size, long i, ulong v) {
  switch (size) {
    case 1: p[i] = (uchar)v; break;
    case 2: ((global ushort*)p)[i] = (ushort)v; break;
    case 4: ((global uint*)p)[i] = (uint)v; break;
    default: ((global ulong*)p)[i] = v; break;
  }
}

/* ---- n-d offsets ------------------------------------------------------------------------ */

/* Element offsets of row-major element i in the first g->ntensors tensors;
   *coord_dim receives the coordinate along dim (if dim >= 0). */
inline void nd_offsets(const g_nd* g, long i, long* off, int dim, long* coord_dim) {
  int nt = g->ntensors;
  for (int t = 0; t < nt; t++) off[t] = g->offset[t];
  if (g->ndim == 1) {
    for (int t = 0; t < nt; t++) off[t] += i * g->stride[t][0];
    if (dim == 0) *coord_dim = i;
    return;
  }
  long rest = i;
  for (int d = g->ndim - 1; d >= 0; d--) {
    long size = g->shape[d];
    long c = rest % size;
    rest /= size;
    if (d == dim) *coord_dim = c;
    for (int t = 0; t < nt; t++) off[t] += c * g->stride[t][d];
  }
}

/* Offsets of row o's first element and of item r within a row, g_rows style. */
inline void rows_outer(const g_rows* g, long o, long* off, int nt) {
  for (int t = 0; t < nt; t++) off[t] = g->offset[t];
  long rest = o;
  for (int d = g->outer_ndim - 1; d >= 0; d--) {
    long size = g->outer_shape[d];
    long c = rest % size;
    rest /= size;
    for (int t = 0; t < nt; t++) off[t] += c * g->outer_stride[t][d];
  }
}

inline long rows_inner(const g_rows* g, long r, int t) {
  if (g->inner_ndim == 1) return r * g->inner_stride[t][0];
  long rest = r, off = 0;
  for (int d = g->inner_ndim - 1; d >= 0; d--) {
    long size = g->inner_shape[d];
    off += (rest % size) * g->inner_stride[t][d];
    rest /= size;
  }
  return off;
}

/* ---- the status-block gate ------------------------------------------------------------ */

/* True when the launch with sequence number seq failed its index check. */
#define GATE_FAILED(status, seq) ((seq) != 0 && (status)[SB_LAST_FAILED] == (seq))

/* ---- Philox-4x32-10: the first two words at counter (c, c >> 32, 0, 0) -------------------- */

inline uint2 philox_w01(ulong seed, ulong counter) {
  uint c0 = (uint)counter, c1 = (uint)(counter >> 32), c2 = 0, c3 = 0;
  uint k0 = (uint)seed, k1 = (uint)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    uint hi0 = mul_hi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint hi1 = mul_hi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    uint n0 = hi1 ^ c1 ^ k0;
    uint n2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return (uint2)(c0, c1);
}

/* ew_long.cl -- elementwise kernels of the integer family (L): int8 / int32 /
 * int64 / bool compute in long; add, sub, mul, neg and abs wrap through ulong
 * and the store truncates, so int32 results wrap as int32 arithmetic does. */

inline long wrap_add(long a, long b) { return as_long(as_ulong(a) + as_ulong(b)); }
inline long wrap_sub(long a, long b) { return as_long(as_ulong(a) - as_ulong(b)); }
inline long wrap_mul(long a, long b) { return as_long(as_ulong(a) * as_ulong(b)); }

inline long ew_op_L(int op, long a, long b, long c, long s0, long s1) {
  switch (op) {
    case EW_IDENTITY: return a;
    case EW_NEG: return wrap_sub(0, a);
    case EW_ABS: return a < 0 ? wrap_sub(0, a) : a;
    case EW_SIGN: return (long)(a > 0) - (long)(a < 0);
    case EW_RELU: return a < 0 ? 0 : a;
    case EW_LOGICAL_NOT: return a == 0;
    case EW_ISNAN: return 0;
    case EW_CLAMP: {
      long low = a < s0 ? s0 : a;
      return low > s1 ? s1 : low;
    }
    case EW_ADD: return wrap_add(a, b);
    case EW_SUB: return wrap_sub(a, b);
    case EW_MUL: return wrap_mul(a, b);
    case EW_MAXIMUM: return a > b ? a : b;
    case EW_MINIMUM: return a < b ? a : b;
    case EW_EQ: return a == b;
    case EW_NE: return a != b;
    case EW_LT: return a < b;
    case EW_LE: return a <= b;
    case EW_GT: return a > b;
    case EW_GE: return a >= b;
    case EW_LOGICAL_AND: return a != 0 && b != 0;
    case EW_LOGICAL_OR: return a != 0 || b != 0;
    case EW_WHERE: return a != 0 ? b : c;
  }
  return a;
}

kernel void ew_L(g_nd g, int op, int nin, int dto, int dt1, int dt2, int dt3, long s0, long s1,
                 global uchar* po, global const uchar* p1, global const uchar* p2,
                 global const uchar* p3) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    long a = ld_L(p1, dt1, off[1]);
    long b = nin > 1 ? ld_L(p2, dt2, off[2]) : 0;
    long c = nin > 2 ? ld_L(p3, dt3, off[3]) : 0;
    st_L(po, dto, off[0], ew_op_L(op, a, b, c, s0, s1));
  }
}

/* arange with integral start and step: out[i] = start + i * step in wrapping int64. */
kernel void arange_L(g_nd g, int dto, long start, long step, global uchar* po) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0))
    st_L(po, dto, g.offset[0] + i * g.stride[0][0], wrap_add(start, wrap_mul(i, step)));
}

/* ---- raw moves --------------------------------------------------------------------- */

/* out = x, same dtype (size bytes an element), any strides; skipped when the
   launch seq failed its index check (the copy that starts scatter / index_add). */
kernel void copy_raw(g_nd g, int size, ulong seq, global const ulong* status, global uchar* po,
                     global const uchar* px) {
  if (GATE_FAILED(status, seq)) return;
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    st_raw(po, size, off[0], ld_raw(px, size, off[1]));
  }
}

/* every element of out = the bits value (full). */
kernel void fill_raw(g_nd g, int size, ulong value, global uchar* po) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    st_raw(po, size, off[0], value);
  }
}

/* tril (upper == 0) / triu (upper == 1): out = x on the kept side of the
   diagonal of the last two dims, 0 elsewhere. g's last two dims are rows, cols. */
kernel void tri_raw(g_nd g, int size, long diagonal, int upper, global uchar* po,
                    global const uchar* px) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS] = {0, 0, 0, 0};
    long rest = i, row = 0, col = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
      long c = rest % g.shape[d];
      rest /= g.shape[d];
      if (d == g.ndim - 1) col = c;
      if (d == g.ndim - 2) row = c;
      off[0] += c * g.stride[0][d];
      off[1] += c * g.stride[1][d];
    }
    bool keep = upper ? (col - row >= diagonal) : (col - row <= diagonal);
    st_raw(po, size, g.offset[0] + off[0], keep ? ld_raw(px, size, g.offset[1] + off[1]) : 0);
  }
}

/* Bytes of one buffer to another, for overlapping device copies (undefined
   contents by the ABI, but no error). */
kernel void copy_bytes(ulong n, ulong dst_offset, ulong src_offset, global uchar* dst,
                       global const uchar* src) {
  for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) dst[dst_offset + i] = src[src_offset + i];
}

/* ---- random numbers (the mapping of oar/refcpu.h) --------------------------------------- */

/* rand: float32 U24, float64 U53 of counter offset + i. */
kernel void rand_any(g_nd g, int dto, ulong seed, ulong offset, global uchar* po) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    uint2 w = philox_w01(seed, offset + (ulong)i);
    if (dto == DT_F32) {
      ((global float*)po)[off[0]] = (float)(w.x >> 8) * 0x1.0p-24f;
    }
#ifdef OAR_FP64
    else {
      ulong bits = ((ulong)w.x << 32) | (ulong)w.y;
      ((global double*)po)[off[0]] = (double)(bits >> 11) * 0x1.0p-53;
    }
#endif
  }
}

#ifdef OAR_FP64
inline double u53(ulong seed, ulong counter) {
  uint2 w = philox_w01(seed, counter);
  return (double)((((ulong)w.x << 32) | (ulong)w.y) >> 11) * 0x1.0p-53;
}
#endif

/* randn: Box-Muller over the pair (c & ~1, (c & ~1) + 1), cos for even c, sin for odd. */
kernel void randn_any(g_nd g, int dto, ulong seed, ulong offset, global uchar* po) {
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    ulong counter = offset + (ulong)i;
    ulong even = counter & ~(ulong)1;
#ifdef OAR_FP64
    double r = sqrt(-2.0 * log1p(-u53(seed, even)));
    double theta = 6.283185307179586 * u53(seed, even + 1);
    double z = (counter & 1) ? r * sin(theta) : r * cos(theta);
    if (dto == DT_F32) ((global float*)po)[off[0]] = (float)z;
    else ((global double*)po)[off[0]] = z;
#else
    /* no double on this device: the same mapping in float (not bit-exact) */
    uint2 w1 = philox_w01(seed, even), w2 = philox_w01(seed, even + 1);
    float u1 = (float)(w1.x >> 8) * 0x1.0p-24f, u2 = (float)(w2.x >> 8) * 0x1.0p-24f;
    float r = sqrt(-2.0f * log1p(-u1));
    float theta = 6.2831853f * u2;
    ((global float*)po)[off[0]] = (counter & 1) ? r * sin(theta) : r * cos(theta);
#endif
  }
}

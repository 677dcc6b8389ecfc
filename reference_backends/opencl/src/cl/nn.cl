/* nn.cl -- matmul (tiled, any strides, batched; sums in T), conv2d and its
 * gradients (direct; sums in ACC), max / avg pooling and their gradients, for T float / double
 * (FAM(name) -> name_F / name_D). Every output element is written by one work
 * item that sums in a fixed order, so results do not depend on the launch. */

#define MM_TILE 16
#define MM_WORK 4 /* each work item computes MM_WORK x MM_WORK outputs */
#define MM_BLOCK (MM_TILE * MM_WORK)

inline void FAM(mm_batch)(const g_matmul* g, long batch, long* off) {
  for (int t = 0; t < 3; t++) off[t] = g->offset[t];
  long rest = batch;
  for (int d = g->batch_ndim - 1; d >= 0; d--) {
    long c = rest % g->batch_shape[d];
    rest /= g->batch_shape[d];
    for (int t = 0; t < 3; t++) off[t] += c * g->batch_stride[t][d];
  }
}

/* Groups of MM_TILE x MM_TILE work items; one group computes an MM_BLOCK x
   MM_BLOCK block of out, staging MM_BLOCK x MM_TILE slices of a and b in local
   memory. global = (ceil(n / MM_BLOCK) * MM_TILE, ceil(m / MM_BLOCK) * MM_TILE, batch). */
kernel void FAM(matmul)(g_matmul g, global T* po, global const T* pa, global const T* pb) {
  local T tile_a[MM_TILE][MM_BLOCK + 1]; /* [k][m] */
  local T tile_b[MM_TILE][MM_BLOCK + 1]; /* [k][n] */
  int tx = get_local_id(0), ty = get_local_id(1);
  long block_n = (long)get_group_id(0) * MM_BLOCK, block_m = (long)get_group_id(1) * MM_BLOCK;
  long off[3];
  FAM(mm_batch)(&g, get_global_id(2), off);
  T acc[MM_WORK][MM_WORK];
  for (int i = 0; i < MM_WORK; i++)
    for (int j = 0; j < MM_WORK; j++) acc[i][j] = (T)0;
  int flat = ty * MM_TILE + tx; /* 0 .. MM_TILE^2 - 1 */
  for (long k0 = 0; k0 < g.k; k0 += MM_TILE) {
    /* MM_BLOCK * MM_TILE elements of each tile, MM_WORK per work item */
    for (int e = flat; e < MM_BLOCK * MM_TILE; e += MM_TILE * MM_TILE) {
      int kk = e % MM_TILE, mm = e / MM_TILE;
      long row = block_m + mm, col = k0 + kk;
      tile_a[kk][mm] = (row < g.m && col < g.k) ? pa[off[0] + row * g.a_row + col * g.a_col] : (T)0;
      int nn = e % MM_BLOCK, kb = e / MM_BLOCK;
      long krow = k0 + kb, ncol = block_n + nn;
      tile_b[kb][nn] = (krow < g.k && ncol < g.n) ? pb[off[1] + krow * g.b_row + ncol * g.b_col] : (T)0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < MM_TILE; kk++) {
      T a_reg[MM_WORK], b_reg[MM_WORK];
      for (int i = 0; i < MM_WORK; i++) a_reg[i] = tile_a[kk][ty + i * MM_TILE];
      for (int j = 0; j < MM_WORK; j++) b_reg[j] = tile_b[kk][tx + j * MM_TILE];
      for (int i = 0; i < MM_WORK; i++)
        for (int j = 0; j < MM_WORK; j++) acc[i][j] += a_reg[i] * b_reg[j];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int i = 0; i < MM_WORK; i++) {
    long row = block_m + ty + i * MM_TILE;
    if (row >= g.m) continue;
    for (int j = 0; j < MM_WORK; j++) {
      long col = block_n + tx + j * MM_TILE;
      if (col < g.n) po[off[2] + row * g.out_row + col * g.out_col] = acc[i][j];
    }
  }
}

/* ---- matmul for CPU devices: explicit vectors instead of local-memory tiles ---------------- */

#ifdef FAMILY_F
#define MV_VEC float16
#define MV_LOAD vload16
#define MV_STORE vstore16
#define MV_WIDTH 16
#else
#define MV_VEC double8
#define MV_LOAD vload8
#define MV_STORE vstore8
#define MV_WIDTH 8
#endif
#define MV_ROWS 4

/* b rows contiguous (b_col == 1), out rows contiguous (out_col == 1): one work item
   computes MV_ROWS x MV_WIDTH outputs as rows of vectors, k in order.
   global = (ceil(n / MV_WIDTH), ceil(m / MV_ROWS), batch). */
kernel void FAM(matmul_rows)(g_matmul g, global T* po, global const T* pa, global const T* pb) {
  long n0 = (long)get_global_id(0) * MV_WIDTH, m0 = (long)get_global_id(1) * MV_ROWS;
  if (n0 >= g.n || m0 >= g.m) return;
  long off[3];
  FAM(mm_batch)(&g, get_global_id(2), off);
  long rows[MV_ROWS];
  for (int i = 0; i < MV_ROWS; i++) rows[i] = off[0] + min(m0 + i, g.m - 1) * g.a_row;
  if (n0 + MV_WIDTH <= g.n) {
    MV_VEC acc0 = (MV_VEC)(0), acc1 = (MV_VEC)(0), acc2 = (MV_VEC)(0), acc3 = (MV_VEC)(0);
    global const T* b = pb + off[1] + n0;
    for (long k = 0; k < g.k; k++) {
      MV_VEC bv = MV_LOAD(0, b + k * g.b_row);
      long ak = k * g.a_col;
      acc0 += pa[rows[0] + ak] * bv;
      acc1 += pa[rows[1] + ak] * bv;
      acc2 += pa[rows[2] + ak] * bv;
      acc3 += pa[rows[3] + ak] * bv;
    }
    global T* out = po + off[2] + n0;
    MV_STORE(acc0, 0, out + m0 * g.out_row);
    if (m0 + 1 < g.m) MV_STORE(acc1, 0, out + (m0 + 1) * g.out_row);
    if (m0 + 2 < g.m) MV_STORE(acc2, 0, out + (m0 + 2) * g.out_row);
    if (m0 + 3 < g.m) MV_STORE(acc3, 0, out + (m0 + 3) * g.out_row);
    return;
  }
  for (int i = 0; i < MV_ROWS && m0 + i < g.m; i++) /* the last, partial column strip */
    for (long col = n0; col < g.n; col++) {
      T acc = (T)0;
      for (long k = 0; k < g.k; k++) acc += pa[rows[i] + k * g.a_col] * pb[off[1] + k * g.b_row + col];
      po[off[2] + (m0 + i) * g.out_row + col] = acc;
    }
}

#undef MV_VEC
#undef MV_LOAD
#undef MV_STORE
#undef MV_WIDTH
#undef MV_ROWS

/* ---- conv2d (NCHW), direct, sums in ACC (double where the device has it) -------------------------------------------------------------- */

inline long FAM(x_at)(const g_conv* g, long n, long c, long h, long w) {
  return g->x_offset + n * g->x_stride[0] + c * g->x_stride[1] + h * g->x_stride[2] + w * g->x_stride[3];
}
inline long FAM(w_at)(const g_conv* g, long o, long c, long h, long w) {
  return g->w_offset + o * g->w_stride[0] + c * g->w_stride[1] + h * g->w_stride[2] + w * g->w_stride[3];
}
inline long FAM(o_at)(const g_conv* g, long n, long o, long h, long w) {
  return g->out_offset + n * g->out_stride[0] + o * g->out_stride[1] + h * g->out_stride[2] +
         w * g->out_stride[3];
}

/* out[n, o, oh, ow] = bias[o] + sum_{c, kh, kw} x[n, g*C/G + c, ih, iw] * w[o, c, kh, kw]. */
kernel void FAM(conv2d)(g_conv g, global T* po, global const T* px, global const T* pw,
                        global const T* pbias) {
  long total = g.batch * g.out_c * g.out_h * g.out_w;
  long group_in = g.in_c / g.groups, group_out = g.out_c / g.groups;
  for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
    long ow = i % g.out_w, oh = (i / g.out_w) % g.out_h, o = (i / (g.out_w * g.out_h)) % g.out_c;
    long n = i / (g.out_w * g.out_h * g.out_c);
    long c0 = (o / group_out) * group_in;
    ACC acc = g.has_bias ? (ACC)pbias[g.bias_offset + o * g.bias_stride] : (ACC)0;
    for (long c = 0; c < group_in; c++)
      for (long kh = 0; kh < g.k_h; kh++) {
        long ih = oh * g.stride_h - g.pad_h + kh * g.dil_h;
        if (ih < 0 || ih >= g.in_h) continue;
        for (long kw = 0; kw < g.k_w; kw++) {
          long iw = ow * g.stride_w - g.pad_w + kw * g.dil_w;
          if (iw < 0 || iw >= g.in_w) continue;
          acc += (ACC)px[FAM(x_at)(&g, n, c0 + c, ih, iw)] * (ACC)pw[FAM(w_at)(&g, o, c, kh, kw)];
        }
      }
    po[FAM(o_at)(&g, n, o, oh, ow)] = (T)acc;
  }
}

/* grad x[n, ci, ih, iw] = sum over the outputs it fed of grad[n, o, oh, ow] * w[o, c, kh, kw].
   x_* describe out (grad x), out_* the incoming grad. */
kernel void FAM(conv2d_backward_input)(g_conv g, global T* pgx, global const T* pgrad, global const T* pw) {
  long total = g.batch * g.in_c * g.in_h * g.in_w;
  long group_in = g.in_c / g.groups, group_out = g.out_c / g.groups;
  for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
    long iw = i % g.in_w, ih = (i / g.in_w) % g.in_h, ci = (i / (g.in_w * g.in_h)) % g.in_c;
    long n = i / (g.in_w * g.in_h * g.in_c);
    long grp = ci / group_in, c = ci % group_in;
    ACC acc = (ACC)0;
    for (long kh = 0; kh < g.k_h; kh++) {
      long th = ih + g.pad_h - kh * g.dil_h;
      if (th < 0 || th % g.stride_h != 0) continue;
      long oh = th / g.stride_h;
      if (oh >= g.out_h) continue;
      for (long kw = 0; kw < g.k_w; kw++) {
        long tw = iw + g.pad_w - kw * g.dil_w;
        if (tw < 0 || tw % g.stride_w != 0) continue;
        long ow = tw / g.stride_w;
        if (ow >= g.out_w) continue;
        for (long oo = 0; oo < group_out; oo++) {
          long o = grp * group_out + oo;
          acc += (ACC)pgrad[FAM(o_at)(&g, n, o, oh, ow)] * (ACC)pw[FAM(w_at)(&g, o, c, kh, kw)];
        }
      }
    }
    pgx[FAM(x_at)(&g, n, ci, ih, iw)] = (T)acc;
  }
}

/* grad w[o, c, kh, kw] = sum_{n, oh, ow} grad[n, o, oh, ow] * x[n, g*C/G + c, ih, iw].
   w_* describe out (grad w). */
kernel void FAM(conv2d_backward_weight)(g_conv g, global T* pgw, global const T* pgrad, global const T* px) {
  long group_in = g.in_c / g.groups, group_out = g.out_c / g.groups;
  long total = g.out_c * group_in * g.k_h * g.k_w;
  for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
    long kw = i % g.k_w, kh = (i / g.k_w) % g.k_h, c = (i / (g.k_w * g.k_h)) % group_in;
    long o = i / (g.k_w * g.k_h * group_in);
    long ci = (o / group_out) * group_in + c;
    ACC acc = (ACC)0;
    for (long n = 0; n < g.batch; n++)
      for (long oh = 0; oh < g.out_h; oh++) {
        long ih = oh * g.stride_h - g.pad_h + kh * g.dil_h;
        if (ih < 0 || ih >= g.in_h) continue;
        for (long ow = 0; ow < g.out_w; ow++) {
          long iw = ow * g.stride_w - g.pad_w + kw * g.dil_w;
          if (iw < 0 || iw >= g.in_w) continue;
          acc += (ACC)pgrad[FAM(o_at)(&g, n, o, oh, ow)] * (ACC)px[FAM(x_at)(&g, n, ci, ih, iw)];
        }
      }
    pgw[FAM(w_at)(&g, o, c, kh, kw)] = (T)acc;
  }
}

/* ---- pooling: planes = N * C planes of in_h x in_w; x_* input-shaped, y_* pooled ---------- */

inline long FAM(pool_at)(const i64* stride, i64 offset, long channels, long plane, long h, long w) {
  return offset + (plane / channels) * stride[0] + (plane % channels) * stride[1] + h * stride[2] + w * stride[3];
}

/* The first maximum of window (oh, ow) (NaN counts as the maximum); -1 if the
   window holds only padding. */
inline long FAM(window_argmax)(const g_pool* g, global const T* px, long plane, long oh, long ow, T* best) {
  long found = -1;
  T m = (T)0;
  for (long kh = 0; kh < g->k_h; kh++) {
    long ih = oh * g->stride_h - g->pad_h + kh;
    if (ih < 0 || ih >= g->in_h) continue;
    for (long kw = 0; kw < g->k_w; kw++) {
      long iw = ow * g->stride_w - g->pad_w + kw;
      if (iw < 0 || iw >= g->in_w) continue;
      T v = px[FAM(pool_at)(g->x_stride, g->x_offset, g->channels, plane, ih, iw)];
      if (found < 0 || (m == m && (v > m || v != v))) {
        m = v;
        found = ih * g->in_w + iw;
      }
    }
  }
  *best = found < 0 ? -INFINITY : m;
  return found;
}

/* max (is_max) or average (padding counted in the divisor) over each window. */
kernel void FAM(pool2d)(g_pool g, int is_max, global T* py, global const T* px) {
  long total = g.planes * g.out_h * g.out_w;
  for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
    long ow = i % g.out_w, oh = (i / g.out_w) % g.out_h, plane = i / (g.out_w * g.out_h);
    T value;
    if (is_max) {
      FAM(window_argmax)(&g, px, plane, oh, ow, &value);
    } else {
      T sum = (T)0;
      for (long kh = 0; kh < g.k_h; kh++) {
        long ih = oh * g.stride_h - g.pad_h + kh;
        if (ih < 0 || ih >= g.in_h) continue;
        for (long kw = 0; kw < g.k_w; kw++) {
          long iw = ow * g.stride_w - g.pad_w + kw;
          if (iw >= 0 && iw < g.in_w) sum += px[FAM(pool_at)(g.x_stride, g.x_offset, g.channels, plane, ih, iw)];
        }
      }
      value = sum / (T)(g.k_h * g.k_w);
    }
    py[FAM(pool_at)(g.y_stride, g.y_offset, g.channels, plane, oh, ow)] = value;
  }
}

/* Gradient: out (x-shaped, dx_*) gathers grad (pooled, y_*) from every window
   holding the element: max routes to the window's first maximum, avg spreads
   evenly. px is the forward input (max only). */
kernel void FAM(pool2d_backward)(g_pool g, int is_max, global T* pout, global const T* pgrad,
                                 global const T* px) {
  long total = g.planes * g.in_h * g.in_w;
  for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
    long iw = i % g.in_w, ih = (i / g.in_w) % g.in_h, plane = i / (g.in_w * g.in_h);
    /* windows (oh, ow) with oh * stride - pad <= ih < oh * stride - pad + k */
    long oh_lo = ih + g.pad_h - g.k_h + 1, ow_lo = iw + g.pad_w - g.k_w + 1;
    oh_lo = oh_lo <= 0 ? 0 : (oh_lo + g.stride_h - 1) / g.stride_h;
    ow_lo = ow_lo <= 0 ? 0 : (ow_lo + g.stride_w - 1) / g.stride_w;
    long oh_hi = min((ih + g.pad_h) / g.stride_h, g.out_h - 1);
    long ow_hi = min((iw + g.pad_w) / g.stride_w, g.out_w - 1);
    T acc = (T)0;
    for (long oh = oh_lo; oh <= oh_hi; oh++)
      for (long ow = ow_lo; ow <= ow_hi; ow++) {
        T grad = pgrad[FAM(pool_at)(g.y_stride, g.y_offset, g.channels, plane, oh, ow)];
        if (is_max) {
          T unused;
          if (FAM(window_argmax)(&g, px, plane, oh, ow, &unused) == ih * g.in_w + iw) acc += grad;
        } else {
          acc += grad / (T)(g.k_h * g.k_w);
        }
      }
    pout[FAM(pool_at)(g.dx_stride, g.dx_offset, g.channels, plane, ih, iw)] = acc;
  }
}

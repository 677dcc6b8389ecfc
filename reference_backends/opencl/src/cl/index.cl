/* index.cl -- index checks and the index ops (embedding, gather, scatter,
 * scatter_add, index_select, index_add, one_hot). Indices are int32 or int64
 * (idt). A launch with index values gets a sequence number seq: ix_check runs
 * first, and every later kernel of the launch returns at once if it failed,
 * so a bad index writes nothing (see SB_* in cl_shared.h). Writes that could
 * collide (scatter, scatter_add, index_add) are done by one work item per
 * line in index order: deterministic, no atomics. */

inline long ld_index(global const uchar* p, int idt, long i) {
  return idt == DT_I64 ? ((global const long*)p)[i] : (long)((global const int*)p)[i];
}

/* One group: finds the first element (row-major) of the indices (tensor 0 of
   g) outside [0, limit) and not equal to ignore (has_ignore), and records it. */
kernel void ix_check(g_nd g, int idt, long limit, int has_ignore, long ignore, int op, ulong seq,
                     global ulong* status, global const uchar* pidx) {
  local long s_first[LOCAL_SIZE];
  int lid = get_local_id(0);
  long first = LONG_MAX;
  for (long i = lid; i < g.numel; i += LOCAL_SIZE) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    long v = ld_index(pidx, idt, off[0]);
    if ((v < 0 || v >= limit) && !(has_ignore && v == ignore)) {
      first = i;
      break; /* later elements of this item are larger */
    }
  }
  s_first[lid] = first;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int step = LOCAL_SIZE / 2; step > 0; step >>= 1) {
    if (lid < step) s_first[lid] = min(s_first[lid], s_first[lid + step]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0 && s_first[0] != LONG_MAX) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, s_first[0], off, -1, &unused);
    if (status[SB_FIRST_SEQ] == 0) {
      status[SB_OP] = (ulong)op;
      status[SB_VALUE] = (ulong)ld_index(pidx, idt, off[0]);
      status[SB_ELEMENT] = (ulong)s_first[0];
      status[SB_LIMIT] = (ulong)limit;
      status[SB_IGNORE] = (ulong)ignore;
      status[SB_HAS_IGNORE] = (ulong)has_ignore;
      status[SB_FIRST_SEQ] = seq;
    }
    status[SB_LAST_FAILED] = seq;
  }
}

/* embedding: g over out [..., D] (tensor 0 out, 1 indices with stride 0 on the
   last dim); weight rows at ws0, columns at ws1. */
kernel void ix_embedding(g_nd g, int size, int idt, long ws0, long ws1, long woff, ulong seq,
                         global const ulong* status, global uchar* po, global const uchar* pidx,
                         global const uchar* pw) {
  if (GATE_FAILED(status, seq)) return;
  int last = g.ndim - 1;
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long col = 0;
    nd_offsets(&g, i, off, last, &col);
    long row = ld_index(pidx, idt, off[1]);
    st_raw(po, size, off[0], ld_raw(pw, size, woff + row * ws0 + col * ws1));
  }
}

/* gather: g over out = indices' shape (tensor 0 out, 1 indices, 2 x with
   stride 0 along dim); x's stride along dim is xs. */
kernel void ix_gather(g_nd g, int size, int idt, long xs, ulong seq, global const ulong* status,
                      global uchar* po, global const uchar* pidx, global const uchar* px) {
  if (GATE_FAILED(status, seq)) return;
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    long index = ld_index(pidx, idt, off[1]);
    st_raw(po, size, off[0], ld_raw(px, size, off[2] + index * xs));
  }
}

/* target += source for the arithmetic dtypes (integers wrap). */
inline void add_element(global uchar* pt, long at, global const uchar* ps, long from, int dt) {
  switch (dt) {
    case DT_F32: ((global float*)pt)[at] += ((global const float*)ps)[from]; break;
#ifdef OAR_FP64
    case DT_F64: ((global double*)pt)[at] += ((global const double*)ps)[from]; break;
#endif
    case DT_I32:
      ((global uint*)pt)[at] += ((global const uint*)ps)[from];
      break;
    case DT_I64:
      ((global ulong*)pt)[at] += ((global const ulong*)ps)[from];
      break;
  }
}

/* scatter (add = 0) / scatter_add (add = 1) along dim: g over the lines (the
   indices' shape without dim; tensor 0 out, 1 indices, 2 source); each line
   walks j < len in order: out[.., idx[.., j, ..], ..] (=|+=) source[.., j, ..]. */
kernel void ix_scatter(g_nd g, int add, int size, int dt, int idt, long len, long idx_ds, long src_ds,
                       long out_ds, ulong seq, global const ulong* status, global uchar* po,
                       global const uchar* pidx, global const uchar* psrc) {
  if (GATE_FAILED(status, seq)) return;
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    for (long j = 0; j < len; j++) {
      long index = ld_index(pidx, idt, off[1] + j * idx_ds);
      long target = off[0] + index * out_ds, from = off[2] + j * src_ds;
      if (add) add_element(po, target, psrc, from, dt);
      else st_raw(po, size, target, ld_raw(psrc, size, from));
    }
  }
}

/* index_select: g over out (tensor 0 out, 1 x with stride 0 along dim);
   out[.., i, ..] = x[.., idx[i], ..]; indices 1-D with stride is, x's stride along dim xs. */
kernel void ix_index_select(g_nd g, int size, int idt, int dim, long is, long ioff, long xs, ulong seq,
                            global const ulong* status, global uchar* po, global const uchar* pidx,
                            global const uchar* px) {
  if (GATE_FAILED(status, seq)) return;
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long along = 0;
    nd_offsets(&g, i, off, dim, &along);
    long index = ld_index(pidx, idt, ioff + along * is);
    st_raw(po, size, off[0], ld_raw(px, size, off[1] + index * xs));
  }
}

/* index_add: g over the lines of source without dim (tensor 0 out, 1 source);
   each line walks i < count in order: out[.., idx[i], ..] += source[.., i, ..]. */
kernel void ix_index_add(g_nd g, int dt, int idt, long count, long is, long ioff, long out_ds, long src_ds,
                         ulong seq, global const ulong* status, global uchar* po, global const uchar* pidx,
                         global const uchar* psrc) {
  if (GATE_FAILED(status, seq)) return;
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long unused;
    nd_offsets(&g, i, off, -1, &unused);
    for (long j = 0; j < count; j++) {
      long index = ld_index(pidx, idt, ioff + j * is);
      add_element(po, off[0] + index * out_ds, psrc, off[1] + j * src_ds, dt);
    }
  }
}

/* one_hot: g over out [..., C] (tensor 0 out int64, 1 indices with stride 0 on the last dim). */
kernel void ix_one_hot(g_nd g, int idt, ulong seq, global const ulong* status, global long* po,
                       global const uchar* pidx) {
  if (GATE_FAILED(status, seq)) return;
  int last = g.ndim - 1;
  for (long i = get_global_id(0); i < g.numel; i += get_global_size(0)) {
    long off[G_MAX_TENSORS];
    long c = 0;
    nd_offsets(&g, i, off, last, &c);
    po[off[0]] = ld_index(pidx, idt, off[1]) == c ? 1 : 0;
  }
}

/* _opencl_fault (OAR_OPENCL_FAULT_INJECTION=1): fails its launch on the device. */
kernel void fault_inject(ulong seq, global ulong* status) {
  if (get_global_id(0) != 0) return;
  if (status[SB_FIRST_SEQ] == 0) {
    status[SB_OP] = IX_FAULT;
    status[SB_HAS_IGNORE] = 0;
    status[SB_FIRST_SEQ] = seq;
  }
  status[SB_LAST_FAILED] = seq;
}

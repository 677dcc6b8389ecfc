/* Low-bit ops of interface/ops.yaml: weight_only_linear (int8 / packed int4 codes
   with per-group scales and zeros, dequantized inside the matmul).

   Output rows (columns of out) are split into blocks over the plugin's pool; each
   block either dots the codes straight with the few rows of x, scales applied per
   group (decode: M <= QUANT_DOT_MAX_ROWS), or dequantizes its rows into a float
   scratch of the chunk for the BLAS (prefill); the weight is read at 1 or 0.5 byte. */
#include "kernels.h"
#include "kernels_nn_util.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define QUANT_DOT_MAX_ROWS 8
#define QUANT_BLOCK_ROWS 64
#define QUANT_PARALLEL_MIN_WORK (1 << 20) /* multiply-adds */
/* The inner loops get AVX-512 and AVX2+FMA clones picked at load time (the plugin is built for baseline
   x86-64); one "arch=" level per clone, since "avx2,fma" would make two clones, neither with both. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* -std=c11 turns FMA contraction off: the hot loops ask for it back */
#define QUANT_HOT                                                                \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), \
                 optimize("associative-math,no-signed-zeros,fp-contract=fast")))
#else
#define QUANT_HOT
#endif
/* The dot products inline into decode_row's clones: one dispatch per weight row, not one per group. */
#define QUANT_INLINE static inline __attribute__((always_inline))

typedef struct quant_job {
  const float* x;       /* [m, k] contiguous */
  const uint8_t* codes; /* [n, k or k/2] contiguous */
  const float *scales, *zeros; /* [n, groups] each */
  float* out;           /* [m, n] contiguous */
  int64_t m, n, k, group;
  int bits;
  float* scratch;       /* QUANT_BLOCK_ROWS * k floats per chunk (the BLAS path) */
  const float* xs;      /* decode path, per row of x: k floats (4 bits: even features, then odd ones),
                           then the sum of x over each group */
} quant_job;

/* Weight row r of the job into w[k]: (code - zero) * scale. */
QUANT_HOT static void dequantize_row(const quant_job* job, int64_t r, float* w) {
  int64_t k = job->k, g = job->group, groups = k / g;
  const float* scale = job->scales + r * groups;
  const float* zero = job->zeros + r * groups;
  if (job->bits == 8) {
    const int8_t* c = (const int8_t*)job->codes + r * k;
    for (int64_t gi = 0; gi < groups; gi++) {
      float s = scale[gi], off = -zero[gi] * s;
      for (int64_t j = gi * g; j < (gi + 1) * g; j++) w[j] = (float)c[j] * s + off;
    }
  } else {
    const uint8_t* c = job->codes + r * (k / 2);
    for (int64_t gi = 0; gi < groups; gi++) {
      float s = scale[gi], off = (-8.0f - zero[gi]) * s;
      for (int64_t j = gi * g / 2; j < (gi + 1) * g / 2; j++) {
        uint8_t u = c[j] ^ 0x80; /* the int8 byte + 128: code + 8 of the even feature low, the odd one high */
        w[2 * j] = (float)(u & 15) * s + off;
        w[2 * j + 1] = (float)(u >> 4) * s + off;
      }
    }
  }
}

/* sum_j x[j] * c[j] over n codes (reassociated, so it vectorizes). */
QUANT_INLINE float dot_int8(const float* restrict x, const int8_t* restrict c, int64_t n) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; j++) sum += x[j] * (float)c[j];
  return sum;
}

/* sum_j xe[j] * lo(u_j) + xo[j] * hi(u_j), u_j = c[j] + 128 (the codes + 8 of two features). */
QUANT_INLINE float dot_int4(const float* restrict xe, const float* restrict xo, const uint8_t* restrict c,
                                int64_t n) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; j++) {
    uint8_t u = c[j] ^ 0x80;
    sum += xe[j] * (float)(u & 15) + xo[j] * (float)(u >> 4);
  }
  return sum;
}

/* sum_j x[j] * w[j] over n floats (reassociated, so it vectorizes). */
QUANT_INLINE float dot_f32(const float* restrict x, const float* restrict w, int64_t n) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; j++) sum += x[j] * w[j];
  return sum;
}

/* n code bytes into floats: int8 codes into we; int4 bytes into we (the even feature's code + 8) and
   wo (the odd one's). */
QUANT_INLINE void unpack_codes(const uint8_t* restrict c, float* restrict we, float* restrict wo, int64_t n,
                                   int bits) {
  if (bits == 8) {
    for (int64_t j = 0; j < n; j++) we[j] = (float)(int8_t)c[j];
    return;
  }
  for (int64_t j = 0; j < n; j++) {
    uint8_t u = c[j] ^ 0x80;
    we[j] = (float)(u & 15);
    wo[j] = (float)(u >> 4);
  }
}

/* Code bytes unpacked at a time when several rows of x share them (stays in L1). */
#define QUANT_TILE_BYTES 128

/* Decode: out[i, r] = sum over groups of scale * (sum x * code_bits - (zero + offset) * sum x), the
   codes read straight from qweight (no float copy of the weight). One row of x dots the codes fused;
   several rows share each tile of codes unpacked once into floats. */
QUANT_HOT static void decode_row(const quant_job* job, int64_t r) {
  int64_t k = job->k, g = job->group, groups = k / g, stride = k + groups, m = job->m;
  int64_t row_bytes = job->bits == 8 ? k : k / 2, group_bytes = job->bits == 8 ? g : g / 2;
  const uint8_t* codes = job->codes + r * row_bytes;
  const float* scale = job->scales + r * groups;
  const float* zero = job->zeros + r * groups;
  float total[QUANT_DOT_MAX_ROWS] = {0.0f}, part[QUANT_DOT_MAX_ROWS];
  float we[QUANT_TILE_BYTES], wo[QUANT_TILE_BYTES];
  float offset = job->bits == 8 ? 0.0f : 8.0f;
  for (int64_t gi = 0; gi < groups; gi++) {
    const uint8_t* c = codes + gi * group_bytes;
    /* 4 bits: the even features of group gi at x + gi * g/2, the odd ones k/2 further */
    int64_t even = job->bits == 8 ? gi * g : gi * (g / 2), odd = even + k / 2;
    if (m == 1) {
      part[0] = job->bits == 8 ? dot_int8(job->xs + even, (const int8_t*)c, g)
                               : dot_int4(job->xs + even, job->xs + odd, c, g / 2);
    } else {
      for (int64_t i = 0; i < m; i++) part[i] = 0.0f;
      for (int64_t t = 0; t < group_bytes; t += QUANT_TILE_BYTES) {
        int64_t len = group_bytes - t < QUANT_TILE_BYTES ? group_bytes - t : QUANT_TILE_BYTES;
        unpack_codes(c + t, we, wo, len, job->bits);
        for (int64_t i = 0; i < m; i++) {
          const float* x = job->xs + i * stride;
          part[i] += dot_f32(x + even + t, we, len) + (job->bits == 8 ? 0.0f : dot_f32(x + odd + t, wo, len));
        }
      }
    }
    for (int64_t i = 0; i < m; i++)
      total[i] += scale[gi] * (part[i] - (offset + zero[gi]) * job->xs[i * stride + k + gi]);
  }
  for (int64_t i = 0; i < m; i++) job->out[i * job->n + r] = total[i];
}

static void quant_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const quant_job* job = opaque;
  int64_t k = job->k, n = job->n, m = job->m;
  for (int64_t block = begin; block < end; block++) {
    int64_t r0 = block * QUANT_BLOCK_ROWS;
    int64_t rows = r0 + QUANT_BLOCK_ROWS <= n ? QUANT_BLOCK_ROWS : n - r0;
    if (m <= QUANT_DOT_MAX_ROWS) {
      for (int64_t r = 0; r < rows; r++) decode_row(job, r0 + r);
      continue;
    }
    float* w = job->scratch + (size_t)chunk * QUANT_BLOCK_ROWS * (size_t)k;
    for (int64_t r = 0; r < rows; r++) dequantize_row(job, r0 + r, w + r * k);
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)rows, (blasint)k, 1.0f,
                      job->x, (blasint)k, w, (blasint)k, 0.0f, job->out + r0, (blasint)n);
  }
}

oar_status refcpu_check_weight_only_linear(kernel_command* cmd) {
  const char* names[4] = {"x", "qweight", "scales", "zeros"};
  const tensor_view *x = &cmd->inputs[0], *q = &cmd->inputs[1], *out = &cmd->outputs[0];
  int64_t bits = attr_int(cmd, ATTR_weight_only_linear_bits);
  int64_t group = attr_int(cmd, ATTR_weight_only_linear_group_size);
  if (bits != 4 && bits != 8)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: weight_only_linear: bits must be 4 or 8, not %lld",
                       (long long)bits);
  if (x->ndim < 1 || q->ndim != 2 || !view_is_contiguous(out) || out->ndim != x->ndim)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: weight_only_linear: x must be [..., K], qweight 2-D, out [..., N] contiguous");
  int64_t k = x->shape[x->ndim - 1], n = q->shape[0];
  if (group <= 0 || k % group || (bits == 4 && group % 2) || q->shape[1] != (bits == 8 ? k : k / 2))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: weight_only_linear: qweight [%lld, %lld] does not fit K=%lld, bits=%lld, "
                       "group_size=%lld", (long long)q->shape[0], (long long)q->shape[1], (long long)k,
                       (long long)bits, (long long)group);
  for (int i = 2; i < 4; i++)
    if (cmd->inputs[i].ndim != 2 || cmd->inputs[i].shape[0] != n || cmd->inputs[i].shape[1] != k / group)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: weight_only_linear: %s must be [%lld, %lld]",
                         names[i], (long long)n, (long long)(k / group));
  for (int d = 0; d < x->ndim; d++)
    if (out->shape[d] != (d == x->ndim - 1 ? n : x->shape[d]))
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: weight_only_linear: out has the wrong shape");
  return OAR_SUCCESS;
}

/* The data of input i, packed into a fresh buffer (*owned) when the view is strided. */
static const void* packed_input(const kernel_command* cmd, int i, void** owned) {
  const tensor_view* v = &cmd->inputs[i];
  *owned = NULL;
  if (view_is_contiguous(v)) return v->data;
  int64_t count = shape_numel(v->ndim, v->shape);
  *owned = malloc((size_t)(count ? count : 1) * (size_t)v->elem_size);
  if (*owned) nn_pack(*owned, v->data, v->ndim, v->shape, v->strides, v->elem_size);
  return *owned;
}

static oar_status run_packed(const kernel_command* cmd, const void* const* data);

oar_status refcpu_run_weight_only_linear(const kernel_command* cmd) {
  void* owned[4];
  const void* data[4];
  bool ok = true;
  for (int i = 0; i < 4; i++) ok = (data[i] = packed_input(cmd, i, &owned[i])) != NULL && ok;
  oar_status status = ok ? run_packed(cmd, data)
                         : refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel weight_only_linear: out of host memory "
                                                                "for a packed copy of a strided input");
  for (int i = 0; i < 4; i++) free(owned[i]);
  return status;
}

static oar_status run_packed(const kernel_command* cmd, const void* const* data) {
  const tensor_view* x = &cmd->inputs[0];
  quant_job job = {
      .x = data[0], .codes = data[1], .scales = data[2], .zeros = data[3],
      .out = (float*)cmd->outputs[0].data, .k = x->shape[x->ndim - 1], .n = cmd->inputs[1].shape[0],
      .group = attr_int(cmd, ATTR_weight_only_linear_group_size), .bits = (int)attr_int(cmd, ATTR_weight_only_linear_bits)};
  job.m = 1;
  for (int d = 0; d < x->ndim - 1; d++) job.m *= x->shape[d];
  if (job.m == 0 || job.n == 0) return OAR_SUCCESS;
  if (job.k == 0) {
    for (int64_t i = 0; i < job.m * job.n; i++) job.out[i] = 0.0f;
    return OAR_SUCCESS;
  }
  refcpu_blas_one_thread();
  int64_t blocks = (job.n + QUANT_BLOCK_ROWS - 1) / QUANT_BLOCK_ROWS;
  /* Waking the pool costs tens of microseconds: a decode step's small layers run inline. */
  double work = (double)job.m * (double)job.k * (double)job.n;
  int chunks = work < QUANT_PARALLEL_MIN_WORK ? 1 : nn_chunk_count(blocks, 2.0 * work / (double)blocks);
  int64_t groups = job.k / job.group, stride = job.k + groups;
  bool decode = job.m <= QUANT_DOT_MAX_ROWS;
  size_t floats = decode ? (size_t)(job.m * stride) : (size_t)QUANT_BLOCK_ROWS * (size_t)job.k * (size_t)chunks;
  float* scratch = malloc(sizeof(float) * floats);
  if (!scratch)
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel weight_only_linear: out of host memory for the scratch");
  if (decode) {
    for (int64_t i = 0; i < job.m; i++) {
      const float* x = job.x + i * job.k;
      float* xs = scratch + i * stride;
      for (int64_t j = 0; j < job.k; j++)  /* 4 bits: even features first, then odd ones */
        xs[job.bits == 8 ? j : (j % 2) * (job.k / 2) + j / 2] = x[j];
      for (int64_t gi = 0; gi < groups; gi++) {
        float sum = 0.0f;
        for (int64_t j = gi * job.group; j < (gi + 1) * job.group; j++) sum += x[j];
        xs[job.k + gi] = sum;
      }
    }
    job.xs = scratch;
  } else {
    job.scratch = scratch;
  }
  nn_parallel_for(blocks, chunks, quant_range, &job);
  free(scratch);
  return OAR_SUCCESS;
}

/* Scans along one dim: cumsum and cumprod. Each line along dim (every other dim fixed) is
   scanned in order; float inputs accumulate in double, integer and bool inputs in int64
   (wrapping, as numpy). Lines are split over the plugin's pool. */
#include "kernels.h"

#include "kernels_lines.h"

typedef struct scan_job {
  tensor_view x, out;
  int dim;
  bool product;
} scan_job;

enum { SCAN_GROUP = 8 };

/* float32 / float64 lines (x and out of one dtype), SCAN_GROUP at a time: each accumulator is
   a serial chain of double adds or multiplies, so interleaving lines hides their latency. The
   order within each line, and so every result, is the generic loop's. */
#define DEFINE_SCAN_TYPED(name, T)                                                                \
  static void name(const scan_job* job, int64_t begin, int64_t end) {                             \
    const tensor_view *x = &job->x, *out = &job->out;                                             \
    int64_t n = x->shape[job->dim], sx = x->strides[job->dim], so = out->strides[job->dim];       \
    bool product = job->product;                                                                  \
    for (int64_t line = begin; line < end; line += SCAN_GROUP) {                                  \
      int group = end - line < SCAN_GROUP ? (int)(end - line) : SCAN_GROUP;                       \
      const T* src[SCAN_GROUP];                                                                   \
      T* dst[SCAN_GROUP];                                                                         \
      double acc[SCAN_GROUP];                                                                     \
      for (int l = 0; l < group; l++) {                                                           \
        src[l] = (const T*)x->data + line_offset(x, job->dim, line + l);                          \
        dst[l] = (T*)out->data + line_offset(out, job->dim, line + l);                            \
        acc[l] = product ? 1.0 : 0.0;                                                             \
      }                                                                                           \
      if (group == SCAN_GROUP && !product) {                                                      \
        for (int64_t i = 0; i < n; i++)                                                           \
          for (int l = 0; l < SCAN_GROUP; l++) {                                                  \
            acc[l] += (double)src[l][i * sx];                                                     \
            dst[l][i * so] = (T)acc[l];                                                           \
          }                                                                                       \
      } else if (group == SCAN_GROUP) {                                                           \
        for (int64_t i = 0; i < n; i++)                                                           \
          for (int l = 0; l < SCAN_GROUP; l++) {                                                  \
            acc[l] *= (double)src[l][i * sx];                                                     \
            dst[l][i * so] = (T)acc[l];                                                           \
          }                                                                                       \
      } else {                                                                                    \
        for (int l = 0; l < group; l++)                                                           \
          for (int64_t i = 0; i < n; i++) {                                                       \
            double v = (double)src[l][i * sx];                                                    \
            acc[l] = product ? acc[l] * v : acc[l] + v;                                           \
            dst[l][i * so] = (T)acc[l];                                                           \
          }                                                                                       \
      }                                                                                           \
    }                                                                                             \
  }
DEFINE_SCAN_TYPED(scan_lines_f32, float)
DEFINE_SCAN_TYPED(scan_lines_f64, double)

static void scan_lines(int64_t begin, int64_t end, void* opaque) {
  const scan_job* job = opaque;
  if (job->x.dtype == job->out.dtype && job->x.dtype == DTYPE_F32) {
    scan_lines_f32(job, begin, end);
    return;
  }
  if (job->x.dtype == job->out.dtype && job->x.dtype == DTYPE_F64) {
    scan_lines_f64(job, begin, end);
    return;
  }
  const tensor_view *x = &job->x, *out = &job->out;
  int64_t n = x->shape[job->dim], sx = x->strides[job->dim], so = out->strides[job->dim];
  bool is_float = dtype_is_float(x->dtype);
  for (int64_t line = begin; line < end; line++) {
    const char* src = x->data + line_offset(x, job->dim, line) * x->elem_size;
    char* dst = out->data + line_offset(out, job->dim, line) * out->elem_size;
    if (is_float) {
      double acc = job->product ? 1.0 : 0.0;
      for (int64_t i = 0; i < n; i++) {
        double v = load_as_double(x->dtype, src + i * sx * x->elem_size);
        acc = job->product ? acc * v : acc + v;
        store_from_double(out->dtype, dst + i * so * out->elem_size, acc);
      }
    } else {
      uint64_t acc = job->product ? 1u : 0u;
      for (int64_t i = 0; i < n; i++) {
        uint64_t v = (uint64_t)load_as_int(x->dtype, src + i * sx * x->elem_size);
        acc = job->product ? acc * v : acc + v;
        store_from_int(out->dtype, dst + i * so * out->elem_size, (int64_t)acc);
      }
    }
  }
}

static oar_status run_scan(const kernel_command* cmd, int64_t dim_attr, bool product) {
  scan_job job = {.x = lines_rank1(&cmd->inputs[0]), .out = lines_rank1(&cmd->outputs[0]), .product = product};
  int32_t dim = 0;
  REFCPU_TRY(normalize_dim(cmd->op->name, "dim", dim_attr, job.x.ndim, &dim));
  job.dim = dim;
  int64_t length = job.x.shape[dim];
  if (length == 0 || view_numel(&job.x) == 0) return OAR_SUCCESS;
  int64_t lines = view_numel(&job.x) / length;
  refcpu_parallel_for(lines, (1 << 14) / (length + 1) + 1, scan_lines, &job);
  return OAR_SUCCESS;
}

oar_status refcpu_run_cumsum(const kernel_command* cmd) {
  return run_scan(cmd, attr_int(cmd, ATTR_cumsum_dim), false);
}

oar_status refcpu_run_cumprod(const kernel_command* cmd) {
  return run_scan(cmd, attr_int(cmd, ATTR_cumprod_dim), true);
}

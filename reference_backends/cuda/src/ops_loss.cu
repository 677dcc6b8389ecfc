/* cross_entropy and cross_entropy_backward over logits [N, C] and class indices target [N]
 * (int32 / int64). The targets are checked on the device first (a value outside [0, C)
 * other than ignore_index fails the launch and nothing is written). One block per row:
 * the row's max (NaN propagating), sum exp(x - max) in double; losses of sum / mean land in
 * per-row scratch and one block adds them in a fixed order (the same bits on every run);
 * the mean over no counted target is NaN, its gradient 0. */
#include <cmath>
#include <cstring>

#include "block_reduce.cuh"
#include "device.cuh"
#include "index_check.cuh"
#include "ops.h"

namespace {
enum ce_reduction { CE_MEAN, CE_SUM, CE_NONE };

struct ce_args {
  cu_tensor logits, target, grad, out; /* grad: backward only */
  int64_t ignore_index;
  int32_t reduction;
  double* losses;  /* forward, sum / mean: one per row */
  double* counted; /* backward, mean: the count of targets not ignored */
};

/* logsumexp pieces of a row: its max and sum exp(x - max) */
__device__ inline void row_softmax_terms(const ce_args& a, int64_t row, double* shared, double* max, double* sum) {
  int64_t classes = a.logits.shape[1];
  int64_t base = row * a.logits.strides[0], step = a.logits.strides[1];
  double m = -INFINITY;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) m = pick(m, load_f(a.logits, base + c * step), true);
  m = block_pick(m, shared, true);
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) s += exp(load_f(a.logits, base + c * step) - m);
  *max = m;
  *sum = block_sum(s, shared);
}

__global__ void ce_forward_rows(ce_args a, const cu_device_status* status) {
  __shared__ double shared[CU_THREADS];
  if (launch_failed(status)) return;
  int64_t rows = a.logits.shape[0];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t t = load_i(a.target, row * a.target.strides[0]);
    double loss = 0.0;
    if (t != a.ignore_index) {
      double max, sum;
      row_softmax_terms(a, row, shared, &max, &sum);
      loss = log(sum) + max - load_f(a.logits, row * a.logits.strides[0] + t * a.logits.strides[1]);
    }
    if (threadIdx.x == 0) {
      if (a.reduction == CE_NONE) store_f(a.out, row * a.out.strides[0], loss);
      else a.losses[row] = loss;
    }
  }
}

/* One block: the count of targets not ignored, and (forward) the sum of the row losses. */
__global__ void ce_totals(ce_args a, bool forward, const cu_device_status* status) {
  __shared__ double shared[CU_THREADS];
  if (launch_failed(status)) return;
  int64_t rows = a.logits.shape[0];
  double count = 0.0, total = 0.0;
  for (int64_t row = threadIdx.x; row < rows; row += blockDim.x) {
    count += load_i(a.target, row * a.target.strides[0]) != a.ignore_index;
    if (forward) total += a.losses[row];
  }
  count = block_sum(count, shared);
  total = block_sum(total, shared);
  if (threadIdx.x != 0) return;
  if (forward) store_f(a.out, 0, a.reduction == CE_MEAN ? (count > 0 ? total / count : NAN) : total);
  else *a.counted = count;
}

/* out = (softmax(logits) - one_hot(target)) * scale, zero rows where ignored */
__global__ void ce_backward_rows(ce_args a, const cu_device_status* status) {
  __shared__ double shared[CU_THREADS];
  if (launch_failed(status)) return;
  int64_t rows = a.logits.shape[0], classes = a.logits.shape[1];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t t = load_i(a.target, row * a.target.strides[0]);
    int64_t out_base = row * a.out.strides[0];
    if (t == a.ignore_index) {
      for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) store_f(a.out, out_base + c * a.out.strides[1], 0.0);
      continue;
    }
    double g = load_f(a.grad, a.reduction == CE_NONE ? row * a.grad.strides[0] : 0);
    double scale = a.reduction == CE_MEAN ? (*a.counted > 0 ? g / *a.counted : 0.0) : g;
    double max, sum;
    row_softmax_terms(a, row, shared, &max, &sum);
    int64_t base = row * a.logits.strides[0];
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
      double p = exp(load_f(a.logits, base + c * a.logits.strides[1]) - max) / sum;
      store_f(a.out, out_base + c * a.out.strides[1], (p - (c == t ? 1.0 : 0.0)) * scale);
    }
  }
}

oar_status parse_reduction(const cu_launch* L, const char* text, int32_t* reduction) {
  if (strcmp(text, "mean") == 0) *reduction = CE_MEAN;
  else if (strcmp(text, "sum") == 0) *reduction = CE_SUM;
  else if (strcmp(text, "none") == 0) *reduction = CE_NONE;
  else return op_fail(L, "reduction is '%s', not mean, sum or none", text);
  return OAR_SUCCESS;
}

/* logits [N, C], target [N]; the loss (forward out, backward grad) [N] for none, else 0-d. */
oar_status check_shapes(const cu_launch* L, const ce_args& a, const cu_tensor& loss, const char* loss_role) {
  if (a.logits.ndim != 2) return op_fail(L, "logits must be 2-D [N, C], got %d dims", (int)a.logits.ndim);
  if (a.target.ndim != 1 || a.target.shape[0] != a.logits.shape[0])
    return op_fail(L, "target must be 1-D [%lld] like the rows of logits", (long long)a.logits.shape[0]);
  bool none = a.reduction == CE_NONE;
  if (loss.ndim != (none ? 1 : 0) || (none && loss.shape[0] != a.logits.shape[0]))
    return op_fail(L, "%s must be %s", loss_role, none ? "1-D like target (reduction none)" : "0-d (reduction sum or mean)");
  return OAR_SUCCESS;
}

unsigned row_blocks(int64_t rows) { return (unsigned)(rows < 65535 * 8 ? rows : 65535 * 8); }
}  // namespace

oar_status cu_op_cross_entropy(cu_launch* L) {
  ce_args a{};
  a.logits = L->in[0];
  a.target = L->in[1];
  a.out = L->out[0];
  a.ignore_index = attr_int(L, ATTR_cross_entropy_ignore_index);
  oar_status status = parse_reduction(L, attr_string(L, ATTR_cross_entropy_reduction), &a.reduction);
  if (status != OAR_SUCCESS || (status = check_shapes(L, a, a.out, "out")) != OAR_SUCCESS) return status;
  int64_t rows = a.logits.shape[0];
  if ((status = check_indices(L, CHECK_CROSS_ENTROPY, a.target, a.logits.shape[1], true, a.ignore_index)) != OAR_SUCCESS)
    return status;
  cudaStream_t stream = L->stream->stream;
  cu_scratch scratch(stream);
  if (a.reduction != CE_NONE &&
      (status = scratch.take(L, (size_t)rows * sizeof(double), (char**)&a.losses)) != OAR_SUCCESS)
    return status;
  if (rows > 0) {
    ce_forward_rows<<<row_blocks(rows), CU_THREADS, 0, stream>>>(a, L->stream->status);
    if ((status = launch_result(L, "the per-row loss kernel")) != OAR_SUCCESS) return status;
  }
  if (a.reduction == CE_NONE) return OAR_SUCCESS;
  ce_totals<<<1, CU_THREADS, 0, stream>>>(a, true, L->stream->status);
  return launch_result(L, "the loss total kernel");
}

oar_status cu_op_cross_entropy_backward(cu_launch* L) {
  ce_args a{};
  a.grad = L->in[0];
  a.logits = L->in[1];
  a.target = L->in[2];
  a.out = L->out[0];
  a.ignore_index = attr_int(L, ATTR_cross_entropy_backward_ignore_index);
  oar_status status = parse_reduction(L, attr_string(L, ATTR_cross_entropy_backward_reduction), &a.reduction);
  if (status != OAR_SUCCESS || (status = check_shapes(L, a, a.grad, "grad")) != OAR_SUCCESS) return status;
  if (a.out.ndim != 2 || a.out.shape[0] != a.logits.shape[0] || a.out.shape[1] != a.logits.shape[1])
    return op_fail(L, "out is not shaped like logits");
  int64_t rows = a.logits.shape[0];
  if ((status = check_indices(L, CHECK_CROSS_ENTROPY_BACKWARD, a.target, a.logits.shape[1], true, a.ignore_index)) !=
          OAR_SUCCESS ||
      rows == 0 || a.logits.shape[1] == 0)
    return status;
  cudaStream_t stream = L->stream->stream;
  cu_scratch scratch(stream);
  if (a.reduction == CE_MEAN) {
    if ((status = scratch.take(L, sizeof(double), (char**)&a.counted)) != OAR_SUCCESS) return status;
    ce_totals<<<1, CU_THREADS, 0, stream>>>(a, false, L->stream->status);
    if ((status = launch_result(L, "the target count kernel")) != OAR_SUCCESS) return status;
  }
  ce_backward_rows<<<row_blocks(rows), CU_THREADS, 0, stream>>>(a, L->stream->status);
  return launch_result(L, "the gradient kernel");
}

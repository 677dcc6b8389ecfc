/* Kernel-level quirks for the ops and models levels:
 * - "exp" and "gelu" compute a wrong first element (a memset after the real
 *   kernel), and so does "avg_pool2d_backward": avg_pool2d's values are right
 *   and only its gradient is wrong; OAR_QUIRK_WRONG=<op> in the environment
 *   adds one more op;
 * - "sum" has no kernel at all (OAR_ERROR_NOT_SUPPORTED), so the runtime runs
 *   it through its host fallback;
 * - with OAR_QUIRK_TRUNCATE=<op> in the environment, that op's float32
 *   outputs lose their 13 low mantissa bits (about 1e-3 relative error: a
 *   device whose kernel is less accurate than float32, not plainly wrong). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define MAX_KERNELS 64

static oar_kernel wrong_kernels[MAX_KERNELS];
static int wrong_count;
static oar_kernel truncated_kernels[MAX_KERNELS];
static int truncated_count;

static int is_wrong_op(const char* op) {
  const char* extra = getenv("OAR_QUIRK_WRONG");
  return strcmp(op, "exp") == 0 || strcmp(op, "gelu") == 0 || strcmp(op, "avg_pool2d_backward") == 0 ||
         (extra && strcmp(op, extra) == 0);
}

static oar_status quirky_kernel_query(int32_t device, const char* op, const oar_dl_data_type* dtypes,
                                      size_t num_dtypes, oar_kernel* kernel) {
  if (op && strcmp(op, "sum") == 0) return OAR_ERROR_NOT_SUPPORTED;
  oar_status status = inner->kernel_query(device, op, dtypes, num_dtypes, kernel);
  if (status != OAR_SUCCESS || !op) return status;
  if (is_wrong_op(op) && wrong_count < MAX_KERNELS) wrong_kernels[wrong_count++] = *kernel;
  const char* truncate = getenv("OAR_QUIRK_TRUNCATE");
  if (truncate && strcmp(op, truncate) == 0 && truncated_count < MAX_KERNELS)
    truncated_kernels[truncated_count++] = *kernel;
  return status;
}

static int64_t numel(const oar_dl_tensor* t) {
  int64_t count = 1;
  for (int32_t i = 0; i < t->ndim; i++) count *= t->shape[i];
  return count;
}

static int listed(const oar_kernel* kernels, int count, oar_kernel kernel) {
  for (int i = 0; i < count; i++)
    if (kernels[i] == kernel) return 1;
  return 0;
}

static int compact(const oar_dl_tensor* t) {
  if (!t->strides) return 1;
  int64_t expected = 1;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return 0;
    expected *= t->shape[i];
  }
  return 1;
}

/* Round a compact float32 output toward zero to 10 mantissa bits, through the host. */
static oar_status truncate_output(oar_stream stream, const oar_dl_tensor* out) {
  if (out->dtype.code != OAR_DL_FLOAT || out->dtype.bits != 32 || !compact(out)) return OAR_SUCCESS;
  int64_t count = numel(out);
  if (count <= 0) return OAR_SUCCESS;
  oar_status status = inner->stream_synchronize(stream);
  if (status != OAR_SUCCESS) return status;
  size_t bytes = (size_t)count * sizeof(uint32_t);
  uint32_t* host = malloc(bytes);
  if (!host) return OAR_ERROR_OUT_OF_MEMORY;
  char* data = (char*)out->data + out->byte_offset;
  status = inner->memcpy_d2h(out->device.device_id, host, data, bytes);
  if (status == OAR_SUCCESS) {
    for (int64_t i = 0; i < count; i++) host[i] &= 0xFFFFE000u;
    status = inner->memcpy_h2d(out->device.device_id, data, host, bytes);
  }
  free(host);
  return status;
}

static oar_status quirky_kernel_launch(oar_stream stream, oar_kernel kernel, const oar_dl_tensor* inputs,
                                       size_t num_inputs, const oar_dl_tensor* outputs, size_t num_outputs,
                                       const oar_attr* attrs, size_t num_attrs) {
  oar_status status = inner->kernel_launch(stream, kernel, inputs, num_inputs, outputs, num_outputs, attrs,
                                           num_attrs);
  if (status != OAR_SUCCESS || num_outputs != 1 || !outputs[0].data || numel(&outputs[0]) <= 0) return status;
  if (listed(wrong_kernels, wrong_count, kernel))
    status = inner->mem_set_async(stream, (char*)outputs[0].data + outputs[0].byte_offset, 0x7F,
                                  outputs[0].dtype.bits / 8u);
  if (status == OAR_SUCCESS && listed(truncated_kernels, truncated_count, kernel))
    status = truncate_output(stream, &outputs[0]);
  return status;
}

static void shim_customize(oar_device_table* table) {
  table->kernel_query = quirky_kernel_query;
  table->kernel_launch = quirky_kernel_launch;
}

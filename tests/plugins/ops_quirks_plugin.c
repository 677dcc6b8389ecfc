/* Kernel-level quirks for the ops and models levels: "exp" and "gelu" compute a
 * wrong first element (a memset after the real kernel), and "sum" has no kernel
 * at all (OAR_ERROR_NOT_SUPPORTED), so the runtime runs it through its host
 * fallback. */
#include <string.h>

#include "shim.h"

static oar_kernel wrong_kernels[64];
static int wrong_count;

static oar_status quirky_kernel_query(int32_t device, const char* op, const oar_dl_data_type* dtypes,
                                      size_t num_dtypes, oar_kernel* kernel) {
  if (op && strcmp(op, "sum") == 0) return OAR_ERROR_NOT_SUPPORTED;
  oar_status status = inner->kernel_query(device, op, dtypes, num_dtypes, kernel);
  if (status == OAR_SUCCESS && op && (strcmp(op, "exp") == 0 || strcmp(op, "gelu") == 0) && wrong_count < 64)
    wrong_kernels[wrong_count++] = *kernel;
  return status;
}

static oar_status quirky_kernel_launch(oar_stream stream, oar_kernel kernel, const oar_dl_tensor* inputs,
                                       size_t num_inputs, const oar_dl_tensor* outputs, size_t num_outputs,
                                       const oar_attr* attrs, size_t num_attrs) {
  oar_status status = inner->kernel_launch(stream, kernel, inputs, num_inputs, outputs, num_outputs, attrs,
                                           num_attrs);
  for (int i = 0; i < wrong_count && status == OAR_SUCCESS; i++)
    if (wrong_kernels[i] == kernel && num_outputs == 1 && outputs[0].data)
      status = inner->mem_set_async(stream, (char*)outputs[0].data + outputs[0].byte_offset, 0x7F,
                                    outputs[0].dtype.bits / 8u);
  return status;
}

static void shim_customize(oar_device_table* table) {
  table->kernel_query = quirky_kernel_query;
  table->kernel_launch = quirky_kernel_launch;
}

/* memcpy_d2h and memcpy_d2h_async write 4 bytes past the end of the host buffer (an off-by-a-few in the
 * copy's length), with the data otherwise right: the host overrun of issue 20. */
#include "shim.h"

#define OVERRUN 4

static oar_status overrun_memcpy_d2h(int32_t device, void* dst, const void* src, size_t size) {
  oar_status status = inner->memcpy_d2h(device, dst, src, size);
  if (status == OAR_SUCCESS && size > 0) memset((unsigned char*)dst + size, 0xA5, OVERRUN);
  return status;
}

static oar_status overrun_memcpy_d2h_async(oar_stream stream, void* dst, const void* src, size_t size) {
  oar_status status = inner->memcpy_d2h_async(stream, dst, src, size);
  if (status == OAR_SUCCESS && size > 0) memset((unsigned char*)dst + size, 0xA5, OVERRUN);
  return status;
}

static void shim_customize(oar_device_table* table) {
  table->memcpy_d2h = overrun_memcpy_d2h;
  if (table->memcpy_d2h_async) table->memcpy_d2h_async = overrun_memcpy_d2h_async;
}

/* memcpy_d2h returns wrong data: the middle byte of every copy of 2 bytes or more is flipped. */
#include "shim.h"

static oar_status broken_memcpy_d2h(int32_t device, void* dst, const void* src, size_t size) {
  oar_status status = inner->memcpy_d2h(device, dst, src, size);
  if (status == OAR_SUCCESS && size >= 2) ((unsigned char*)dst)[size / 2] ^= 0x5A;
  return status;
}

static void shim_customize(oar_device_table* table) { table->memcpy_d2h = broken_memcpy_d2h; }

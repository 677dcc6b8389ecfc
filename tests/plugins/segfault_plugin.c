/* Segfaults in mem_free(device, NULL) (the ABI says: OAR_SUCCESS, nothing done). */
#include "shim.h"

static oar_status broken_mem_free(int32_t device, void* ptr) {
  if (ptr == NULL) {
    volatile int* nowhere = (volatile int*)(uintptr_t)ptr;
    *nowhere = 1; /* SIGSEGV */
  }
  return inner->mem_free(device, ptr);
}

static void shim_customize(oar_device_table* table) { table->mem_free = broken_mem_free; }

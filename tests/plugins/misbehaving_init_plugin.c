/* Misbehaves while loading, as chosen by -DMISBEHAVE=1..4: 1 crashes (SIGSEGV) in
 * oar_plugin_init, 2 exits the process there, 3 hangs there, 4 reports INT32_MAX devices. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim.h"

static oar_status too_many_devices(int32_t* count) {
  if (!count) return OAR_ERROR_INVALID_ARGUMENT;
  *count = INT32_MAX;
  return OAR_SUCCESS;
}

static void shim_customize(oar_device_table* table) {
#if MISBEHAVE == 1
  raise(SIGSEGV);
#elif MISBEHAVE == 2
  exit(3);
#elif MISBEHAVE == 3
  for (;;) pause();
#else
  table->device_count = too_many_devices;
#endif
  (void)table;
  (void)too_many_devices;
}

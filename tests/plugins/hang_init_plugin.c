/* Hangs forever in init, as a device that never answers when opened. */
#include <unistd.h>

#include "shim.h"

static oar_status hanging_init(void) {
  for (;;) pause();
  return OAR_SUCCESS;
}

static void shim_customize(oar_device_table* table) { table->init = hanging_init; }

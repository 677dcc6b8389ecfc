/* Hangs forever in event_synchronize, as a device whose completion interrupt got lost. */
#include <unistd.h>

#include "shim.h"

static oar_status broken_event_synchronize(oar_event event) {
  (void)event;
  for (;;) pause();
  return OAR_SUCCESS;
}

static void shim_customize(oar_device_table* table) { table->event_synchronize = broken_event_synchronize; }

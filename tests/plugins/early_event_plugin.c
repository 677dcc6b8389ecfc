/* An event completes early: event_query and event_synchronize report a recorded event done while the
 * work before it in its stream is still queued (handles are still checked). The early event of
 * issue 20. */
#include "shim.h"

static oar_status early_event_synchronize(oar_event event) {
  oar_status status = inner->event_query(event);
  return status == OAR_ERROR_NOT_READY ? OAR_SUCCESS : inner->event_synchronize(event);
}

static oar_status early_event_query(oar_event event) {
  oar_status status = inner->event_query(event);
  return status == OAR_ERROR_NOT_READY ? OAR_SUCCESS : status;
}

static void shim_customize(oar_device_table* table) {
  table->event_synchronize = early_event_synchronize;
  table->event_query = early_event_query;
}

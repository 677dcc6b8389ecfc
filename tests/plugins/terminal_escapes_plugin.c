/* Terminal escapes in every string it gives: version, device name, a log message at init and
 * the last error message (OSC window title "pwned", clear screen, a C1 CSI). */
#include <stdio.h>

#define ESCAPES "\x1b]0;pwned\x07\x1b[2J\xc2\x9b" "31m"
#define SHIM_VERSION "1.0" ESCAPES
#define oar_plugin_init shim_plugin_init
#include "shim.h"
#undef oar_plugin_init

static void (*host_log)(void*, int32_t, const char*);
static void* host_log_data;

static oar_status escaping_properties(int32_t device, oar_device_properties* props) {
  oar_status status = inner->device_get_properties(device, props);
  if (status == OAR_SUCCESS) snprintf(props->name, sizeof props->name, "%s", "NPU" ESCAPES);
  return status;
}

static oar_status escaping_init(void) {
  oar_status status = inner->init();
  if (host_log) host_log(host_log_data, OAR_LOG_WARNING, "init says" ESCAPES);
  return status;
}

static const char* escaping_last_error(void) { return "bad" ESCAPES; }

static oar_status failing_synchronize(int32_t device) { (void)device; return OAR_ERROR_INTERNAL; }

static void shim_customize(oar_device_table* table) {
  table->device_get_properties = escaping_properties;
  table->init = escaping_init;
  table->get_last_error_message = escaping_last_error;
  table->device_synchronize = failing_synchronize;
}

OAR_PLUGIN_EXPORT oar_status oar_plugin_init(oar_plugin_params* params) {
  host_log = params->log;
  host_log_data = params->log_user_data;
  return shim_plugin_init(params);
}

/* Names and messages full of HTML, XML and rich markup, control characters and
 * terminal escapes: every report must show them as text. device_count(NULL)
 * returns OAR_ERROR_INTERNAL (not INVALID_ARGUMENT), so one test fails and
 * quotes the plugin's message. */
#include <stdio.h>

#define SHIM_VERSION "<b>1.0</b>[red]rc[/red]<script>alert('v')</script>"
#include "shim.h"

#define HOSTILE "<script>alert('x')</script> [bold red]markup[/bold red] ]]> & \"q\" \x01\x1b[31m"

static _Thread_local char message[512];

static const char* hostile_last_error(void) {
  snprintf(message, sizeof message, "%s | %s", HOSTILE, inner->get_last_error_message());
  return message;
}

static oar_status hostile_device_count(int32_t* count) {
  if (!count) return OAR_ERROR_INTERNAL;
  return inner->device_count(count);
}

static oar_status hostile_properties(int32_t device, oar_device_properties* props) {
  oar_status status = inner->device_get_properties(device, props);
  if (status == OAR_SUCCESS && props->struct_size >= offsetof(oar_device_properties, vendor))
    snprintf(props->name, sizeof props->name, "%s", "<script>alert(1)</script>[bold red]NPU[/bold red]&amp;");
  return status;
}

static void shim_customize(oar_device_table* table) {
  table->get_last_error_message = hostile_last_error;
  table->device_count = hostile_device_count;
  table->device_get_properties = hostile_properties;
}

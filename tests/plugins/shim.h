/* A test plugin in a few lines: every entry point forwards to the CPU reference
 * plugin (its path compiled in as OAR_TEST_INNER), and the including file
 * replaces the entries it breaks in shim_customize(). Device type: the macro
 * SHIM_DEVICE_TYPE (default "npu"). Built by tests/conformance_plugins.py. */
#ifndef OAR_TEST_SHIM_H_
#define OAR_TEST_SHIM_H_

#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#include "oar/device_api.h"

#ifndef SHIM_DEVICE_TYPE
#define SHIM_DEVICE_TYPE "npu"
#endif
#ifndef SHIM_VERSION
#define SHIM_VERSION "0.0-shim"
#endif

static const oar_device_table* inner;   /* the reference plugin's table */
static oar_device_table shim_table;     /* what this plugin hands out */

static void shim_customize(oar_device_table* table);

OAR_PLUGIN_EXPORT oar_status oar_plugin_init(oar_plugin_params* params) {
  void* library = dlopen(OAR_TEST_INNER, RTLD_NOW | RTLD_LOCAL);
  if (!library) return OAR_ERROR_INTERNAL;
  oar_plugin_init_fn inner_init = (oar_plugin_init_fn)dlsym(library, "oar_plugin_init");
  if (!inner_init) return OAR_ERROR_INTERNAL;
  oar_status status = inner_init(params);
  if (status != OAR_SUCCESS) return status;
  inner = params->table;
  memcpy(&shim_table, inner, sizeof shim_table);
  shim_customize(&shim_table);
  params->table = &shim_table;
  params->device_type = SHIM_DEVICE_TYPE;
  params->plugin_version = SHIM_VERSION;
  return OAR_SUCCESS;
}

#endif /* OAR_TEST_SHIM_H_ */

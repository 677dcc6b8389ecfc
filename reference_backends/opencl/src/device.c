/* The plugin-and-device group: init / finalize, device selection from the
 * environment, device count, binding, properties. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

ocl_plugin g_ocl;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int32_t bound_device;

oar_status ocl_check_ready(const char* entry) {
  if (!g_ocl.initialized)
    return ocl_fail(OAR_ERROR_NOT_INITIALIZED, "%s: the OpenCL plugin is not initialized (call init first)",
                    entry);
  return OAR_SUCCESS;
}

oar_status ocl_check_device(const char* entry, int32_t device) {
  if (device < 0 || device >= g_ocl.device_count)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: device %d is out of range (%d device%s)", entry, device,
                    g_ocl.device_count, g_ocl.device_count == 1 ? "" : "s");
  return OAR_SUCCESS;
}

/* ---- environment ------------------------------------------------------------------ */

bool ocl_valid_type_name(const char* name) {
  size_t length = strlen(name);
  if (length < 1 || length > 32 || !(name[0] >= 'a' && name[0] <= 'z')) return false;
  for (size_t i = 1; i < length; i++)
    if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '_'))
      return false;
  return true;
}

static oar_status read_config(ocl_config* config) {
  memset(config, 0, sizeof *config);
  const char* name = getenv("OAR_OPENCL_NAME");
  if (name && *name) {
    if (!ocl_valid_type_name(name))
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                      "OAR_OPENCL_NAME='%.64s' is not a device-type name ([a-z][a-z0-9_]{0,31})", name);
    snprintf(config->device_type_name, sizeof config->device_type_name, "%s", name);
  } else {
    snprintf(config->device_type_name, sizeof config->device_type_name, "opencl");
  }
  const char* fault = getenv("OAR_OPENCL_FAULT_INJECTION");
  config->fault_injection = fault && strcmp(fault, "1") == 0;
  const char* platform = getenv("OAR_OPENCL_PLATFORM");
  if (platform) snprintf(config->platform_filter, sizeof config->platform_filter, "%s", platform);
  const char* type = getenv("OAR_OPENCL_DEVICE_TYPE");
  if (!type || !*type || strcmp(type, "default") == 0) config->device_type = 0;
  else if (strcmp(type, "cpu") == 0) config->device_type = CL_DEVICE_TYPE_CPU;
  else if (strcmp(type, "gpu") == 0) config->device_type = CL_DEVICE_TYPE_GPU;
  else if (strcmp(type, "accelerator") == 0) config->device_type = CL_DEVICE_TYPE_ACCELERATOR;
  else if (strcmp(type, "all") == 0) config->device_type = CL_DEVICE_TYPE_ALL;
  else
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                    "OAR_OPENCL_DEVICE_TYPE='%.64s' is not one of cpu, gpu, accelerator, all", type);
  return OAR_SUCCESS;
}

static bool contains_case_insensitive(const char* text, const char* needle) {
  size_t n = strlen(needle);
  if (n == 0) return true;
  for (const char* p = text; *p; p++) {
    size_t i = 0;
    while (i < n && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)needle[i])) i++;
    if (i == n) return true;
  }
  return false;
}

/* ---- device discovery --------------------------------------------------------------- */

static void info_string(cl_device_id id, cl_device_info what, char* out, size_t bytes) {
  out[0] = 0;
  if (clGetDeviceInfo(id, what, bytes, out, NULL) != CL_SUCCESS) out[0] = 0;
  out[bytes - 1] = 0;
}

static oar_status open_device(ocl_device* dev, cl_platform_id platform, cl_device_id id, int32_t index) {
  memset(dev, 0, sizeof *dev);
  dev->platform = platform;
  dev->id = id;
  clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof dev->platform_name, dev->platform_name, NULL);
  dev->platform_name[sizeof dev->platform_name - 1] = 0;
  info_string(id, CL_DEVICE_NAME, dev->name, sizeof dev->name);
  info_string(id, CL_DEVICE_VENDOR, dev->vendor, sizeof dev->vendor);
  info_string(id, CL_DRIVER_VERSION, dev->driver, sizeof dev->driver);
  info_string(id, CL_DEVICE_VERSION, dev->version, sizeof dev->version);
  char extensions[8192];
  info_string(id, CL_DEVICE_EXTENSIONS, extensions, sizeof extensions);
  dev->fp64 = strstr(extensions, "cl_khr_fp64") != NULL;
  cl_device_fp_config single = 0;
  clGetDeviceInfo(id, CL_DEVICE_SINGLE_FP_CONFIG, sizeof single, &single, NULL);
  dev->correctly_rounded_divide = (single & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
  clGetDeviceInfo(id, CL_DEVICE_TYPE, sizeof dev->type, &dev->type, NULL);
  clGetDeviceInfo(id, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof dev->max_work_group, &dev->max_work_group, NULL);
  clGetDeviceInfo(id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof dev->max_item, dev->max_item, NULL);
  clGetDeviceInfo(id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof dev->global_memory, &dev->global_memory, NULL);
  clGetDeviceInfo(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof dev->max_alloc, &dev->max_alloc, NULL);
  clGetDeviceInfo(id, CL_DEVICE_LOCAL_MEM_SIZE, sizeof dev->local_memory, &dev->local_memory, NULL);
  clGetDeviceInfo(id, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof dev->compute_units, &dev->compute_units, NULL);
  clGetDeviceInfo(id, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof dev->clock_mhz, &dev->clock_mhz, NULL);
  clGetDeviceInfo(id, CL_DEVICE_MAX_PARAMETER_SIZE, sizeof dev->max_parameter, &dev->max_parameter, NULL);
  cl_uint vector_width = 1;
  clGetDeviceInfo(id, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, sizeof vector_width, &vector_width, NULL);
  dev->simd_width = vector_width ? vector_width : 1;
  if (dev->compute_units == 0) dev->compute_units = 1;
  /* grid-stride launches: enough groups to fill the device a few times over */
  size_t groups = (size_t)dev->compute_units * ((dev->type & CL_DEVICE_TYPE_CPU) ? 4096 : 16);
  dev->wide_global = groups * 128;
  if (dev->max_parameter < 1024) {
    return ocl_fail(OAR_ERROR_DEVICE_LOST,
                    "init: OpenCL device '%s' takes %zu bytes of kernel arguments; the plugin needs 1024 "
                    "(OpenCL 1.2's minimum)", dev->name, dev->max_parameter);
  }
  cl_int error = CL_SUCCESS;
  dev->context = clCreateContext(NULL, 1, &id, NULL, NULL, &error);
  if (!dev->context) return ocl_fail_cl(error, "init", "clCreateContext");
  dev->sync_queue = clCreateCommandQueue(dev->context, id, 0, &error);
  if (!dev->sync_queue) {
    clReleaseContext(dev->context);
    dev->context = NULL;
    return ocl_fail_cl(error, "init", "clCreateCommandQueue");
  }
  dev->va_base = UINT64_C(0x0A00000000000000) + ((uint64_t)index << 40);
  dev->va_span = UINT64_C(1) << 40;
  pthread_rwlock_init(&dev->alloc_lock, NULL);
  pthread_mutex_init(&dev->lock, NULL);
  pthread_mutex_init(&dev->profile_lock, NULL);
  for (int k = 0; k < K_COUNT; k++) pthread_mutex_init(&dev->kernels[k].lock, NULL);
  return OAR_SUCCESS;
}

static void close_device(ocl_device* dev) {
  if (!dev->context) return;
  clFinish(dev->sync_queue);
  ocl_streams_release_all(dev);
  ocl_profiler_release(dev);
  ocl_library_release(dev);
  ocl_memory_release_all(dev);
  clReleaseCommandQueue(dev->sync_queue);
  clReleaseContext(dev->context);
  pthread_rwlock_destroy(&dev->alloc_lock);
  pthread_mutex_destroy(&dev->lock);
  pthread_mutex_destroy(&dev->profile_lock);
  for (int k = 0; k < K_COUNT; k++) pthread_mutex_destroy(&dev->kernels[k].lock);
  memset(dev, 0, sizeof *dev);
}

/* Devices of the selected platforms and type, in platform then device order. */
static oar_status discover(const ocl_config* config) {
  cl_uint platform_count = 0;
  cl_int error = clGetPlatformIDs(0, NULL, &platform_count);
  if (error != CL_SUCCESS || platform_count == 0)
    return ocl_fail(OAR_ERROR_DEVICE_LOST,
                    "init: no OpenCL platform found (%s); install an OpenCL driver (on Debian: "
                    "apt-get install pocl-opencl-icd for the CPU, or your GPU vendor's ICD)",
                    error == CL_SUCCESS ? "the ICD loader lists none" : ocl_error_name(error));
  cl_platform_id platforms[16];
  if (platform_count > 16) platform_count = 16;
  clGetPlatformIDs(platform_count, platforms, NULL);
  bool selected[16] = {false};
  char names[16][256];
  int selected_count = 0;
  for (cl_uint p = 0; p < platform_count; p++) {
    char vendor[128] = "";
    names[p][0] = 0;
    clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof names[p], names[p], NULL);
    clGetPlatformInfo(platforms[p], CL_PLATFORM_VENDOR, sizeof vendor, vendor, NULL);
    names[p][sizeof names[p] - 1] = 0;
    vendor[sizeof vendor - 1] = 0;
    selected[p] = contains_case_insensitive(names[p], config->platform_filter) ||
                  contains_case_insensitive(vendor, config->platform_filter);
    selected_count += selected[p];
  }
  if (selected_count == 0) {
    char list[1024] = "";
    for (cl_uint p = 0; p < platform_count; p++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%.60s'", p ? ", " : "", names[p]);
    return ocl_fail(OAR_ERROR_DEVICE_LOST, "init: no OpenCL platform matches OAR_OPENCL_PLATFORM='%s' (platforms: %s)",
                    config->platform_filter, list);
  }
  cl_device_type type = config->device_type;
  if (type == 0) { /* default: GPUs when there are any */
    type = CL_DEVICE_TYPE_ALL;
    for (cl_uint p = 0; p < platform_count; p++) {
      cl_uint count = 0;
      if (selected[p] && clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_GPU, 0, NULL, &count) == CL_SUCCESS &&
          count > 0)
        type = CL_DEVICE_TYPE_GPU;
    }
  }
  int32_t total = 0;
  for (cl_uint p = 0; p < platform_count && total < OCL_MAX_DEVICES; p++) {
    if (!selected[p]) continue;
    cl_uint count = 0;
    if (clGetDeviceIDs(platforms[p], type, 0, NULL, &count) != CL_SUCCESS || count == 0) continue;
    cl_device_id ids[OCL_MAX_DEVICES];
    if (count > OCL_MAX_DEVICES) count = OCL_MAX_DEVICES;
    clGetDeviceIDs(platforms[p], type, count, ids, NULL);
    for (cl_uint d = 0; d < count && total < OCL_MAX_DEVICES; d++) {
      oar_status status = open_device(&g_ocl.devices[total], platforms[p], ids[d], total);
      if (status != OAR_SUCCESS) {
        for (int32_t k = 0; k < total; k++) close_device(&g_ocl.devices[k]);
        return status;
      }
      total++;
    }
  }
  if (total == 0)
    return ocl_fail(OAR_ERROR_DEVICE_LOST, "init: no OpenCL device of type %s on the selected platform(s)%s%s",
                    getenv("OAR_OPENCL_DEVICE_TYPE") && *getenv("OAR_OPENCL_DEVICE_TYPE")
                        ? getenv("OAR_OPENCL_DEVICE_TYPE")
                        : "any",
                    config->platform_filter[0] ? " matching OAR_OPENCL_PLATFORM=" : "", config->platform_filter);
  g_ocl.device_count = total;
  return OAR_SUCCESS;
}

/* ---- init / finalize ------------------------------------------------------------------- */

oar_status ocl_init(void) {
  pthread_mutex_lock(&init_lock);
  if (g_ocl.initialized) {
    pthread_mutex_unlock(&init_lock);
    return ocl_fail(OAR_ERROR_INTERNAL, "init: the plugin is already initialized");
  }
  oar_status status = read_config(&g_ocl.config);
  if (status == OAR_SUCCESS) status = discover(&g_ocl.config);
  if (status == OAR_SUCCESS) {
    g_ocl.initialized = true;
    g_ocl.epoch++;
    for (int32_t d = 0; d < g_ocl.device_count; d++)
      ocl_log(OAR_LOG_DEBUG, "opencl device %d: %s (%s, %s)%s", d, g_ocl.devices[d].name,
              g_ocl.devices[d].platform_name, g_ocl.devices[d].driver, g_ocl.devices[d].fp64 ? ", fp64" : "");
  } else {
    ocl_log(OAR_LOG_ERROR, "%s", ocl_get_last_error_message());
  }
  pthread_mutex_unlock(&init_lock);
  return status;
}

oar_status ocl_finalize(void) {
  pthread_mutex_lock(&init_lock);
  if (!g_ocl.initialized) {
    pthread_mutex_unlock(&init_lock);
    return ocl_fail(OAR_ERROR_NOT_INITIALIZED, "finalize: the plugin is not initialized");
  }
  for (int32_t d = 0; d < g_ocl.device_count; d++) {
    ocl_device* dev = &g_ocl.devices[d];
    for (ocl_stream* s = dev->streams; s; s = s->next_in_device) clFinish(s->queue);
    clFinish(dev->sync_queue);
  }
  ocl_events_release_all();
  ocl_modules_release_all();
  ocl_kernels_release_all();
  for (int32_t d = 0; d < g_ocl.device_count; d++) close_device(&g_ocl.devices[d]);
  ocl_host_memory_release_all();
  g_ocl.device_count = 0;
  g_ocl.initialized = false;
  pthread_mutex_unlock(&init_lock);
  return OAR_SUCCESS;
}

/* ---- devices ----------------------------------------------------------------------------- */

oar_status ocl_device_count(int32_t* count) {
  OCL_TRY(ocl_check_ready("device_count"));
  if (!count) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = g_ocl.device_count;
  return OAR_SUCCESS;
}

oar_status ocl_set_device(int32_t device) {
  OCL_TRY(ocl_check_ready("set_device"));
  OCL_TRY(ocl_check_device("set_device", device));
  bound_device = device;
  return OAR_SUCCESS;
}

oar_status ocl_get_device(int32_t* device) {
  OCL_TRY(ocl_check_ready("get_device"));
  if (!device) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "get_device: device is NULL");
  *device = bound_device < g_ocl.device_count ? bound_device : 0;
  return OAR_SUCCESS;
}

static uint32_t clamp_u32(size_t value) { return value > UINT32_MAX ? UINT32_MAX : (uint32_t)value; }

oar_status ocl_device_get_properties(int32_t device, oar_device_properties* props) {
  OCL_TRY(ocl_check_ready("device_get_properties"));
  OCL_TRY(ocl_check_device("device_get_properties", device));
  if (!props) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "device_get_properties: props is NULL");
  if (props->struct_size < offsetof(oar_device_properties, name))
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "device_get_properties: props->struct_size %zu is too small",
                    props->struct_size);
  const ocl_device* dev = &g_ocl.devices[device];
  oar_device_properties mine;
  memset(&mine, 0, sizeof mine);
  mine.struct_size = sizeof mine;
  snprintf(mine.name, sizeof mine.name, "%s", dev->name);
  snprintf(mine.vendor, sizeof mine.vendor, "%s", dev->vendor);
  snprintf(mine.driver_version, sizeof mine.driver_version, "%s", dev->driver);
  mine.total_memory = dev->global_memory;
  mine.compute_units = dev->compute_units;
  mine.clock_mhz = dev->clock_mhz;
  for (int i = 0; i < 3; i++) {
    mine.max_grid[i] = UINT32_MAX; /* global sizes are size_t: grid * block always fits */
    mine.max_block[i] = clamp_u32(dev->max_item[i]);
  }
  mine.max_threads_per_block = clamp_u32(dev->max_work_group);
  mine.simd_width = dev->simd_width;
  mine.memory_alignment = OCL_ALIGNMENT;
  mine.stream_priority_lowest = 0;
  mine.stream_priority_highest = 0;
  mine.max_shared_memory_bytes = clamp_u32(dev->local_memory);
  size_t bytes = props->struct_size < sizeof mine ? props->struct_size : sizeof mine;
  size_t host_size = props->struct_size;
  memcpy((char*)props + sizeof(size_t), (const char*)&mine + sizeof(size_t), bytes - sizeof(size_t));
  props->struct_size = host_size;
  return OAR_SUCCESS;
}

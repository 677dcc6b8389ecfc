/* The plugin-and-device group: init / finalize, device count, binding, properties, memory info. */
#include <cstdio>
#include <cstring>

#include "collectives.h"
#include "entries.h"
#include "internal.h"

cu_plugin g_cu;

namespace {
std::mutex init_lock;
thread_local int32_t bound_device = 0;
}  // namespace

oar_status cu_check_device(const char* entry, int32_t device) {
  if (device < 0 || device >= g_cu.device_count)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: device %d is out of range [0, %d)", entry, (int)device,
                   g_cu.device_count);
  return OAR_SUCCESS;
}

oar_status cu_use_device(const char* entry, int32_t device) {
  oar_status status = cu_check_device(entry, device);
  if (status != OAR_SUCCESS) return status;
  cudaError_t error = cudaSetDevice(g_cu.devices[device].cuda_ordinal);
  if (error != cudaSuccess) {
    char call[128];
    snprintf(call, sizeof call, "%s: cudaSetDevice(%d)", entry, g_cu.devices[device].cuda_ordinal);
    return cu_fail_cuda(error, call);
  }
  return OAR_SUCCESS;
}

oar_status cu_init(void) {
  std::lock_guard<std::mutex> guard(init_lock);
  if (g_cu.initialized.load()) return OAR_SUCCESS;
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    cudaGetLastError();
    if (error != cudaSuccess)
      cu_fail(OAR_ERROR_DEVICE_LOST, "init: no CUDA device: cudaGetDeviceCount returned %s (%s)",
              cudaGetErrorName(error), cudaGetErrorString(error));
    else
      cu_fail(OAR_ERROR_DEVICE_LOST, "init: no CUDA device: cudaGetDeviceCount returned 0 devices "
                                     "(CUDA_VISIBLE_DEVICES selects none?)");
    return cu_log_failure(OAR_ERROR_DEVICE_LOST);
  }
  cu_device* devices = new cu_device[count]();
  int made = 0;
  oar_status status = OAR_SUCCESS;
  for (; made < count; made++) {
    cu_device* dev = &devices[made];
    dev->cuda_ordinal = made;
    if ((error = cudaSetDevice(made)) != cudaSuccess ||
        (error = cudaGetDeviceProperties(&dev->props, made)) != cudaSuccess ||
        (error = cudaDeviceGetStreamPriorityRange(&dev->priority_lowest, &dev->priority_highest)) != cudaSuccess ||
        (error = cudaStreamCreateWithFlags(&dev->control, cudaStreamNonBlocking)) != cudaSuccess) {
      char call[96];
      snprintf(call, sizeof call, "init: setting up CUDA device %d", made);
      status = cu_fail_cuda(error, call);
      break;
    }
  }
  if (status != OAR_SUCCESS) {
    for (int d = 0; d < made; d++) {
      cudaSetDevice(d);
      cudaStreamDestroy(devices[d].control);
    }
    delete[] devices;
    return cu_log_failure(status == OAR_ERROR_OUT_OF_MEMORY ? status : OAR_ERROR_DEVICE_LOST);
  }
  g_cu.devices = devices;
  g_cu.device_count = count;
  g_cu.initialized.store(true, std::memory_order_release);
  return OAR_SUCCESS;
}

oar_status cu_finalize(void) {
  std::lock_guard<std::mutex> guard(init_lock);
  if (!g_cu.initialized.load()) return OAR_SUCCESS;
  cu_collectives_release_all(); /* aborts communicators the host left, so no NCCL kernel waits for a peer */
  for (int d = 0; d < g_cu.device_count; d++) {
    cudaSetDevice(d);
    cudaDeviceSynchronize();
  }
  /* objects the host left behind: functions before their modules, events before streams */
  cu_handle_clear(CU_COMM);
  cu_handle_clear(CU_FUNCTION);
  cu_handle_clear(CU_MODULE);
  cu_handle_clear(CU_KERNEL);
  cu_handle_clear(CU_EVENT);
  cu_handle_clear(CU_STREAM);
  cu_memory_release_all();
  for (int d = 0; d < g_cu.device_count; d++) {
    cudaSetDevice(d);
    cudaStreamDestroy(g_cu.devices[d].control);
  }
  g_cu.initialized.store(false, std::memory_order_release);
  delete[] g_cu.devices;
  g_cu.devices = nullptr;
  g_cu.device_count = 0;
  return OAR_SUCCESS;
}

const char* cu_get_last_error_message(void) { return cu_last_error(); }

oar_status cu_device_count(int32_t* count) {
  CU_REQUIRE_INIT("device_count");
  if (!count) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = g_cu.device_count;
  return OAR_SUCCESS;
}

oar_status cu_set_device(int32_t device) {
  CU_REQUIRE_INIT("set_device");
  oar_status status = cu_use_device("set_device", device);
  if (status == OAR_SUCCESS) bound_device = device;
  return status;
}

oar_status cu_get_device(int32_t* device) {
  CU_REQUIRE_INIT("get_device");
  if (!device) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "get_device: device is NULL");
  *device = bound_device;
  return OAR_SUCCESS;
}

oar_status cu_device_get_properties(int32_t device, oar_device_properties* props) {
  CU_REQUIRE_INIT("device_get_properties");
  oar_status status = cu_check_device("device_get_properties", device);
  if (status != OAR_SUCCESS) return status;
  if (!props || props->struct_size < offsetof(oar_device_properties, name))
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "device_get_properties: props is NULL or its struct_size too small");
  oar_device_properties p;
  memset(&p, 0, sizeof p);
  const cudaDeviceProp& cp = g_cu.devices[device].props;
  snprintf(p.name, sizeof p.name, "%s", cp.name);
  snprintf(p.vendor, sizeof p.vendor, "NVIDIA");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  snprintf(p.driver_version, sizeof p.driver_version, "driver %d.%d, runtime %d.%d, sm_%d%d", driver / 1000,
           driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10, cp.major, cp.minor);
  p.total_memory = cp.totalGlobalMem;
  p.compute_units = (uint32_t)cp.multiProcessorCount;
  int clock_khz = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, g_cu.devices[device].cuda_ordinal) != cudaSuccess) {
    cudaGetLastError();
    clock_khz = 0;
  }
  p.clock_mhz = (uint32_t)(clock_khz / 1000);
  for (int i = 0; i < 3; i++) {
    p.max_grid[i] = (uint32_t)cp.maxGridSize[i];
    p.max_block[i] = (uint32_t)cp.maxThreadsDim[i];
  }
  p.max_threads_per_block = (uint32_t)cp.maxThreadsPerBlock;
  p.simd_width = (uint32_t)cp.warpSize;
  p.memory_alignment = 256; /* cudaMalloc aligns to at least 256 bytes */
  p.stream_priority_lowest = g_cu.devices[device].priority_lowest;
  p.stream_priority_highest = g_cu.devices[device].priority_highest;
  p.max_shared_memory_bytes = (uint32_t)cp.sharedMemPerBlockOptin;
  /* write only what lies within both struct sizes; struct_size stays the host's */
  size_t limit = props->struct_size < sizeof p ? props->struct_size : sizeof p;
  memcpy((char*)props + sizeof(size_t), (char*)&p + sizeof(size_t), limit - sizeof(size_t));
  return OAR_SUCCESS;
}

oar_status cu_device_memory_info(int32_t device, size_t* free_bytes, size_t* total_bytes) {
  CU_REQUIRE_INIT("device_memory_info");
  if (!free_bytes || !total_bytes)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "device_memory_info: a result pointer is NULL");
  oar_status status = cu_use_device("device_memory_info", device);
  if (status != OAR_SUCCESS) return status;
  CU_CHECK(cudaMemGetInfo(free_bytes, total_bytes), "device_memory_info: cudaMemGetInfo");
  return OAR_SUCCESS;
}

/* The CUDA libraries the plugin does not link: the driver API (resolved
 * through the runtime's cudaGetDriverEntryPointByVersion, so no libcuda.so at
 * build time) and dlopen() of NVRTC and cuBLAS from the system or from the
 * PyPI wheels (nvidia-cuda-nvrtc, nvidia-cublas) named by OAR_CUDA_LIB_DIRS. */
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "internal.h"

namespace {
std::once_flag driver_once;
cu_driver_api driver;
std::string driver_error;

template <typename F>
bool resolve(const char* name, F* out, bool required) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t error = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn) {
    cudaGetLastError();
    if (required && driver_error.empty())
      driver_error = std::string("cudaGetDriverEntryPointByVersion(\"") + name + "\") found no entry: " +
                     cudaGetErrorString(error);
    return false;
  }
  *out = reinterpret_cast<F>(fn);
  return true;
}

void load_driver() {
  bool ok = resolve("cuModuleLoadData", &driver.ModuleLoadData, true) &&
            resolve("cuModuleUnload", &driver.ModuleUnload, true) &&
            resolve("cuModuleGetFunction", &driver.ModuleGetFunction, true) &&
            resolve("cuLaunchKernel", &driver.LaunchKernel, true) &&
            resolve("cuFuncGetAttribute", &driver.FuncGetAttribute, true) &&
            resolve("cuFuncSetAttribute", &driver.FuncSetAttribute, true) &&
            resolve("cuGetErrorName", &driver.GetErrorName, true) &&
            resolve("cuGetErrorString", &driver.GetErrorString, true);
  resolve("cuFuncGetParamInfo", &driver.FuncGetParamInfo, false);
  driver.loaded = ok;
}
}  // namespace

oar_status cu_driver(const char* entry, const cu_driver_api** api) {
  std::call_once(driver_once, load_driver);
  if (!driver.loaded) return cu_fail(OAR_ERROR_INTERNAL, "%s: the CUDA driver API: %s", entry, driver_error.c_str());
  *api = &driver;
  return OAR_SUCCESS;
}

oar_status cu_fail_driver(CUresult result, const char* call) {
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "unknown error";
  if (driver.loaded) {
    driver.GetErrorName(result, &name);
    driver.GetErrorString(result, &text);
  }
  oar_status status = OAR_ERROR_INTERNAL;
  if (result == CUDA_ERROR_OUT_OF_MEMORY) status = OAR_ERROR_OUT_OF_MEMORY;
  else if (result == CUDA_ERROR_INVALID_IMAGE || result == CUDA_ERROR_NO_BINARY_FOR_GPU ||
           result == CUDA_ERROR_NOT_FOUND || result == CUDA_ERROR_INVALID_PTX || result == CUDA_ERROR_INVALID_VALUE)
    status = OAR_ERROR_INVALID_ARGUMENT;
  else if (result == CUDA_ERROR_ILLEGAL_ADDRESS || result == CUDA_ERROR_LAUNCH_FAILED)
    status = OAR_ERROR_DEVICE_LOST;
  return cu_fail(status, "%s: %s (%s)", call, name ? name : "?", text ? text : "?");
}

void* cu_open_library(const char* const* names, std::string* tried) {
  const char* dirs = std::getenv("OAR_CUDA_LIB_DIRS");
  tried->clear();
  if (dirs && *dirs) {
    std::string list(dirs);
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find(':', start);
      if (end == std::string::npos) end = list.size();
      std::string dir = list.substr(start, end - start);
      for (const char* const* name = names; *name && !dir.empty(); name++) {
        std::string path = dir + "/" + *name;
        if (void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
      }
      start = end + 1;
    }
    *tried += std::string("OAR_CUDA_LIB_DIRS=") + dirs + ", ";
  }
  for (const char* const* name = names; *name; name++) {
    if (void* library = dlopen(*name, RTLD_NOW | RTLD_LOCAL)) return library;
    *tried += std::string(*name) + (name[1] ? ", " : "");
  }
  return nullptr;
}

/* Modules of lang "cuda": module_compile through NVRTC (loaded at run time),
 * module_load / module_get_function / launch through the CUDA driver API
 * (cuModuleLoadData, cuLaunchKernel). Binary format: oar/cuda.h. */
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "entries.h"
#include "internal.h"
#include "oar/cuda.h"

namespace {
/* NVRTC's C API, declared here as its documentation gives it (no nvrtc.h needed to build). */
typedef struct nvrtc_program_st* nvrtc_program;
typedef int nvrtc_result; /* NVRTC_SUCCESS == 0 */
struct nvrtc_api {
  nvrtc_result (*CreateProgram)(nvrtc_program*, const char*, const char*, int, const char* const*,
                                const char* const*);
  nvrtc_result (*CompileProgram)(nvrtc_program, int, const char* const*);
  nvrtc_result (*GetProgramLogSize)(nvrtc_program, size_t*);
  nvrtc_result (*GetProgramLog)(nvrtc_program, char*);
  nvrtc_result (*GetCUBINSize)(nvrtc_program, size_t*);
  nvrtc_result (*GetCUBIN)(nvrtc_program, char*);
  nvrtc_result (*DestroyProgram)(nvrtc_program*);
  const char* (*GetErrorString)(nvrtc_result);
};

std::once_flag nvrtc_once;
nvrtc_api nvrtc;
bool nvrtc_loaded = false;
std::string nvrtc_error;

void load_nvrtc() {
  static const char* const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", nullptr};
  std::string tried;
  void* library = cu_open_library(names, &tried);
  if (!library) {
    nvrtc_error = "NVRTC not found (tried " + tried + ")";
    return;
  }
  struct {
    const char* name;
    void** slot;
  } symbols[] = {{"nvrtcCreateProgram", (void**)&nvrtc.CreateProgram},
                 {"nvrtcCompileProgram", (void**)&nvrtc.CompileProgram},
                 {"nvrtcGetProgramLogSize", (void**)&nvrtc.GetProgramLogSize},
                 {"nvrtcGetProgramLog", (void**)&nvrtc.GetProgramLog},
                 {"nvrtcGetCUBINSize", (void**)&nvrtc.GetCUBINSize},
                 {"nvrtcGetCUBIN", (void**)&nvrtc.GetCUBIN},
                 {"nvrtcDestroyProgram", (void**)&nvrtc.DestroyProgram},
                 {"nvrtcGetErrorString", (void**)&nvrtc.GetErrorString}};
  for (auto& symbol : symbols)
    if (!(*symbol.slot = dlsym(library, symbol.name))) {
      nvrtc_error = std::string("NVRTC has no ") + symbol.name;
      dlclose(library);
      return;
    }
  nvrtc_loaded = true; /* the library stays loaded until the process exits */
}

uint64_t fnv1a(const void* data, size_t size) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < size; i++) hash = (hash ^ ((const uint8_t*)data)[i]) * 1099511628211ull;
  return hash;
}

/* Options that keep IEEE semantics and touch nothing outside the compile. */
bool option_allowed(const std::string& option) {
  static const char* const prefixes[] = {"-D", "-U", "--std=c++", "-std=c++", "-maxrregcount="};
  static const char* const exact[] = {"-lineinfo", "-G", "-w", "--restrict", "--device-debug", "--generate-line-info"};
  for (const char* p : prefixes)
    if (option.compare(0, strlen(p), p) == 0 && option.size() > strlen(p)) return true;
  for (const char* e : exact)
    if (option == e) return true;
  return false;
}

struct cu_module {
  int32_t device;
  CUmodule module = nullptr;
  ~cu_module() {
    const cu_driver_api* api = nullptr;
    if (module && cu_driver("module_unload", &api) == OAR_SUCCESS) {
      cudaSetDevice(g_cu.devices[device].cuda_ordinal);
      api->ModuleUnload(module);
    }
  }
};

struct cu_function {
  int32_t device;
  uint64_t module_handle; /* the function dies with its module */
  CUfunction function;
  std::string name;
  int max_threads;
};

int device_sm(int32_t device) { return g_cu.devices[device].props.major * 10 + g_cu.devices[device].props.minor; }
}  // namespace

oar_status cu_module_compile(int32_t device, const char* lang, const char* source, const char* options,
                             void** binary, size_t* binary_size) {
  CU_REQUIRE_INIT("module_compile");
  oar_status status = cu_check_device("module_compile", device);
  if (status != OAR_SUCCESS) return status;
  if (!lang || !source || !binary || !binary_size)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: lang, source, binary or binary_size is NULL");
  if (strcmp(lang, "cuda") != 0)
    return cu_fail(OAR_ERROR_NOT_SUPPORTED, "module_compile: lang \"%s\" is not supported (only \"cuda\")", lang);
  std::call_once(nvrtc_once, load_nvrtc);
  if (!nvrtc_loaded) return cu_fail(OAR_ERROR_NOT_SUPPORTED, "module_compile: %s", nvrtc_error.c_str());

  int sm = device_sm(device);
  std::vector<std::string> args = {"--gpu-architecture=sm_" + std::to_string(sm), "-default-device", "--std=c++17"};
  if (options) {
    std::string list(options);
    size_t start = 0;
    while (start < list.size()) {
      size_t end = list.find(' ', start);
      if (end == std::string::npos) end = list.size();
      std::string option = list.substr(start, end - start);
      if (!option.empty()) {
        if (!option_allowed(option))
          return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: option \"%s\" is not accepted (see oar/cuda.h)",
                         option.c_str());
        args.push_back(option);
      }
      start = end + 1;
    }
  }
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());

  nvrtc_program program = nullptr;
  nvrtc_result result = nvrtc.CreateProgram(&program, source, "oar_module.cu", 0, nullptr, nullptr);
  if (result != 0)
    return cu_fail(OAR_ERROR_INTERNAL, "module_compile: nvrtcCreateProgram: %s", nvrtc.GetErrorString(result));
  result = nvrtc.CompileProgram(program, (int)argv.size(), argv.data());
  if (result != 0) {
    size_t log_size = 0;
    std::string log;
    if (nvrtc.GetProgramLogSize(program, &log_size) == 0 && log_size > 0) {
      log.resize(log_size);
      nvrtc.GetProgramLog(program, &log[0]);
      log.resize(strlen(log.c_str()));
    }
    nvrtc.DestroyProgram(&program);
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: NVRTC build failed: %s (sm_%d); log:\n%.3500s",
                   nvrtc.GetErrorString(result), sm, log.c_str());
  }
  size_t cubin_size = 0;
  result = nvrtc.GetCUBINSize(program, &cubin_size);
  oar_cuda_binary_header* header = nullptr;
  if (result == 0) {
    header = (oar_cuda_binary_header*)calloc(1, sizeof *header + cubin_size);
    if (!header) {
      nvrtc.DestroyProgram(&program);
      return cu_fail(OAR_ERROR_OUT_OF_MEMORY, "module_compile: no host memory for a %zu-byte cubin", cubin_size);
    }
    result = nvrtc.GetCUBIN(program, (char*)(header + 1));
  }
  nvrtc.DestroyProgram(&program);
  if (result != 0) {
    free(header);
    return cu_fail(OAR_ERROR_INTERNAL, "module_compile: nvrtcGetCUBIN: %s", nvrtc.GetErrorString(result));
  }
  memcpy(header->magic, OAR_CUDA_BINARY_MAGIC, sizeof OAR_CUDA_BINARY_MAGIC);
  header->format_version = OAR_CUDA_BINARY_FORMAT;
  header->header_bytes = sizeof *header;
  header->payload_bytes = cubin_size;
  header->checksum = fnv1a(header + 1, cubin_size);
  header->sm = (uint32_t)sm;
  *binary = header;
  *binary_size = sizeof *header + cubin_size;
  return OAR_SUCCESS;
}

oar_status cu_module_binary_free(void* binary) {
  free(binary);
  return OAR_SUCCESS;
}

oar_status cu_module_load(int32_t device, const void* binary, size_t binary_size, oar_module* module) {
  CU_REQUIRE_INIT("module_load");
  oar_status status = cu_use_device("module_load", device);
  if (status != OAR_SUCCESS) return status;
  if (!binary || !module) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: binary or module is NULL");
  oar_cuda_binary_header header;
  if (binary_size < sizeof header)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: %zu bytes are too few for a module binary", binary_size);
  memcpy(&header, binary, sizeof header);
  const uint8_t* payload = (const uint8_t*)binary + sizeof header;
  if (memcmp(header.magic, OAR_CUDA_BINARY_MAGIC, sizeof OAR_CUDA_BINARY_MAGIC) != 0 ||
      header.format_version != OAR_CUDA_BINARY_FORMAT || header.header_bytes != sizeof header)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: not a binary of the CUDA plugin (magic or format)");
  if (header.payload_bytes != binary_size - sizeof header || fnv1a(payload, header.payload_bytes) != header.checksum)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: the binary is truncated or corrupt (size or checksum)");
  if ((int)header.sm != device_sm(device))
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: the binary is for sm_%u, device %d is sm_%d", header.sm,
                   (int)device, device_sm(device));
  const cu_driver_api* api = nullptr;
  if ((status = cu_driver("module_load", &api)) != OAR_SUCCESS) return status;
  /* cuModuleLoadData wants the cubin aligned as an ELF image: copy it out of the header */
  std::vector<uint64_t> image((header.payload_bytes + 7) / 8);
  memcpy(image.data(), payload, header.payload_bytes);
  auto m = std::make_shared<cu_module>();
  m->device = device;
  CUresult result = api->ModuleLoadData(&m->module, image.data());
  if (result != CUDA_SUCCESS) return cu_fail_driver(result, "module_load: cuModuleLoadData");
  *module = (oar_module)(uintptr_t)cu_handle_add(CU_MODULE, m);
  return OAR_SUCCESS;
}

oar_status cu_module_unload(oar_module module) {
  CU_REQUIRE_INIT("module_unload");
  if (!cu_handle_remove(CU_MODULE, (uint64_t)(uintptr_t)module))
    return cu_fail(OAR_ERROR_INVALID_HANDLE, "module_unload: module %p is not a live module", (void*)module);
  return OAR_SUCCESS;
}

oar_status cu_module_get_function(oar_module module, const char* name, oar_function* function) {
  CU_REQUIRE_INIT("module_get_function");
  if (!name || !function)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_get_function: name or function is NULL");
  auto m = std::static_pointer_cast<cu_module>(cu_handle_get(CU_MODULE, (uint64_t)(uintptr_t)module));
  if (!m) return cu_fail(OAR_ERROR_INVALID_HANDLE, "module_get_function: module %p is not live", (void*)module);
  const cu_driver_api* api = nullptr;
  oar_status status = cu_driver("module_get_function", &api);
  if (status != OAR_SUCCESS || (status = cu_use_device("module_get_function", m->device)) != OAR_SUCCESS)
    return status;
  auto f = std::make_shared<cu_function>();
  f->device = m->device;
  f->module_handle = (uint64_t)(uintptr_t)module;
  f->name = name;
  CUresult result = api->ModuleGetFunction(&f->function, m->module, name);
  if (result == CUDA_ERROR_NOT_FOUND)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT,
                   "module_get_function: the module has no function \"%s\" (declare it extern \"C\" __global__)", name);
  if (result != CUDA_SUCCESS) return cu_fail_driver(result, "module_get_function: cuModuleGetFunction");
  result = api->FuncGetAttribute(&f->max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f->function);
  if (result != CUDA_SUCCESS) return cu_fail_driver(result, "module_get_function: cuFuncGetAttribute");
  *function = (oar_function)(uintptr_t)cu_handle_add(CU_FUNCTION, f);
  return OAR_SUCCESS;
}

oar_status cu_module_launch(oar_stream stream, oar_function function, const oar_launch_config* config,
                     const oar_kernel_arg* args, size_t num_args) {
  CU_REQUIRE_INIT("launch");
  std::shared_ptr<cu_stream> s;
  oar_status status = cu_stream_get("launch", stream, &s);
  if (status != OAR_SUCCESS) return status;
  auto f = std::static_pointer_cast<cu_function>(cu_handle_get(CU_FUNCTION, (uint64_t)(uintptr_t)function));
  std::shared_ptr<void> module = f ? cu_handle_get(CU_MODULE, f->module_handle) : nullptr;
  if (!f || !module)
    return cu_fail(OAR_ERROR_INVALID_HANDLE, "launch: function %p is not live (or its module was unloaded)",
                   (void*)function);
  if (f->device != s->device)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: the function is of device %d, the stream of device %d",
                   (int)f->device, (int)s->device);
  if (!config || config->struct_size < offsetof(oar_launch_config, reserved) || (num_args && !args))
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: config is NULL or too small, or args is NULL");
  const cudaDeviceProp& props = g_cu.devices[s->device].props;
  uint64_t threads = (uint64_t)config->block[0] * config->block[1] * config->block[2];
  for (int i = 0; i < 3; i++)
    if (config->grid[i] == 0 || config->block[i] == 0 || config->grid[i] > (uint32_t)props.maxGridSize[i] ||
        config->block[i] > (uint32_t)props.maxThreadsDim[i])
      return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: grid (%u, %u, %u) / block (%u, %u, %u) is zero or too large",
                     config->grid[0], config->grid[1], config->grid[2], config->block[0], config->block[1],
                     config->block[2]);
  if (threads > (uint64_t)f->max_threads)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: a block of %llu threads exceeds %s's limit of %d",
                   (unsigned long long)threads, f->name.c_str(), f->max_threads);
  if (config->shared_memory_bytes > props.sharedMemPerBlockOptin)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %u bytes of shared memory exceed the device's %zu",
                   config->shared_memory_bytes, props.sharedMemPerBlockOptin);
  const cu_driver_api* api = nullptr;
  if ((status = cu_driver("launch", &api)) != OAR_SUCCESS || (status = cu_use_device("launch", s->device)) != OAR_SUCCESS)
    return status;

  /* the kernel's parameters, where the driver can say them */
  if (api->FuncGetParamInfo) {
    size_t offset = 0, size = 0;
    if (api->FuncGetParamInfo(f->function, num_args, &offset, &size) == CUDA_SUCCESS)
      return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s takes more than the %zu arguments given", f->name.c_str(),
                     num_args);
    for (size_t i = 0; i < num_args; i++) {
      if (api->FuncGetParamInfo(f->function, i, &offset, &size) != CUDA_SUCCESS)
        return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s takes %zu arguments, %zu given", f->name.c_str(), i,
                       num_args);
      if (size != args[i].size)
        return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: argument %zu of %s has %zu bytes, the kernel wants %zu", i,
                       f->name.c_str(), args[i].size, size);
    }
  }
  std::vector<void*> params(num_args);
  for (size_t i = 0; i < num_args; i++) {
    const oar_kernel_arg& a = args[i];
    if (!a.value || a.size == 0 || (a.kind != OAR_ARG_DEVICE_PTR && a.kind != OAR_ARG_BYTES))
      return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: argument %zu has no value, size 0 or unknown kind %d", i,
                     (int)a.kind);
    if (a.kind == OAR_ARG_DEVICE_PTR) {
      if (a.size != sizeof(void*))
        return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: device pointer argument %zu has size %zu", i, a.size);
      void* ptr = *(void* const*)a.value;
      char what[48];
      snprintf(what, sizeof what, "device pointer argument %zu", i);
      if ((status = cu_check_range("launch", what, s->device, ptr, 0)) != OAR_SUCCESS) return status;
    }
    params[i] = const_cast<void*>(a.value); /* cuLaunchKernel copies the values before it returns */
  }
  if (config->shared_memory_bytes > props.sharedMemPerBlock) {
    CUresult result = api->FuncSetAttribute(f->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            (int)config->shared_memory_bytes);
    if (result != CUDA_SUCCESS) return cu_fail_driver(result, "launch: cuFuncSetAttribute (dynamic shared memory)");
  }
  CUresult result = api->LaunchKernel(f->function, config->grid[0], config->grid[1], config->grid[2], config->block[0],
                                      config->block[1], config->block[2], config->shared_memory_bytes,
                                      (CUstream)s->stream, num_args ? params.data() : nullptr, nullptr);
  if (result != CUDA_SUCCESS) return cu_fail_driver(result, "launch: cuLaunchKernel");
  return OAR_SUCCESS;
}

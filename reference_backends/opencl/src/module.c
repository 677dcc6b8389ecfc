/* Modules of lang "opencl": module_compile (clBuildProgram, the build log in
 * the error), binaries (header + CL_PROGRAM_BINARIES), module_load,
 * module_get_function and launch (see oar/opencl.h for the convention). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct ocl_module {
  int32_t device;
  uint64_t handle;
  cl_program program;
  pthread_mutex_t lock;
  struct ocl_function* functions;
} ocl_module;

typedef struct ocl_function {
  ocl_module* module;
  uint64_t handle;
  int32_t device;
  cl_kernel kernel;
  cl_uint num_args;
  size_t work_group_size;
  char name[128];
  pthread_mutex_t lock;
  struct ocl_function* next;
} ocl_function;

static const char PRELUDE[] =
    "#define OAR_OPENCL 1\n"
    "#define OAR_PTR(T, base, offset_bytes) ((global T*)((global char*)(base) + (offset_bytes)))\n";

static uint64_t fnv1a(const void* data, size_t size, uint64_t hash) {
  const unsigned char* p = data;
  for (size_t i = 0; i < size; i++) {
    hash ^= p[i];
    hash *= UINT64_C(0x100000001b3);
  }
  return hash;
}

static uint64_t device_fingerprint(const ocl_device* dev) {
  uint64_t hash = UINT64_C(0xcbf29ce484222325);
  hash = fnv1a(dev->platform_name, strlen(dev->platform_name) + 1, hash);
  hash = fnv1a(dev->name, strlen(dev->name) + 1, hash);
  hash = fnv1a(dev->driver, strlen(dev->driver) + 1, hash);
  return fnv1a(dev->version, strlen(dev->version) + 1, hash);
}

/* Options the plugin passes on; anything else (the fast-math family included) is refused. */
static oar_status check_options(const char* options) {
  static const char* const exact[] = {"-w", "-Werror", "-cl-opt-disable", "-cl-denorms-are-zero",
                                      "-cl-no-signed-zeros", "-cl-single-precision-constant", "-cl-kernel-arg-info",
                                      "-cl-fp32-correctly-rounded-divide-sqrt"};
  if (!options) return OAR_SUCCESS;
  const char* p = options;
  while (*p) {
    while (*p == ' ') p++;
    if (!*p) break;
    const char* end = p;
    while (*end && *end != ' ') end++;
    size_t length = (size_t)(end - p);
    bool ok = (length > 2 && strncmp(p, "-D", 2) == 0) || (length > 8 && strncmp(p, "-cl-std=", 8) == 0);
    for (size_t i = 0; i < sizeof exact / sizeof exact[0] && !ok; i++)
      ok = strlen(exact[i]) == length && strncmp(p, exact[i], length) == 0;
    for (const char* c = p; c < end && ok; c++)
      if (*c == '"' || *c == '\'' || *c == '\\' || (unsigned char)*c < 0x20) ok = false;
    if (!ok)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                      "module_compile: option '%.*s' is not accepted (allowed: -D<name>[=<value>], -cl-std=<v>, -w, "
                      "-Werror, -cl-opt-disable, -cl-denorms-are-zero, -cl-no-signed-zeros, "
                      "-cl-single-precision-constant, -cl-kernel-arg-info, -cl-fp32-correctly-rounded-divide-sqrt)",
                      (int)(length > 64 ? 64 : length), p);
    p = end;
  }
  return OAR_SUCCESS;
}

static char* program_build_log(cl_program program, cl_device_id id) {
  size_t size = 0;
  clGetProgramBuildInfo(program, id, CL_PROGRAM_BUILD_LOG, 0, NULL, &size);
  char* log = malloc(size + 1);
  if (!log) return NULL;
  log[0] = 0;
  clGetProgramBuildInfo(program, id, CL_PROGRAM_BUILD_LOG, size, log, NULL);
  log[size] = 0;
  return log;
}

static void build_options(const ocl_device* dev, const char* user, char* out, size_t bytes) {
  snprintf(out, bytes, "-cl-std=CL1.2%s%s %s", dev->correctly_rounded_divide ? " -cl-fp32-correctly-rounded-divide-sqrt" : "",
           dev->fp64 ? " -DOAR_OPENCL_FP64=1" : "", user ? user : "");
}

oar_status ocl_module_compile(int32_t device, const char* lang, const char* source, const char* options, void** binary,
                              size_t* binary_size) {
  OCL_TRY(ocl_check_ready("module_compile"));
  OCL_TRY(ocl_check_device("module_compile", device));
  if (!lang || !source || !binary || !binary_size)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: %s is NULL",
                    !lang ? "lang" : !source ? "source" : !binary ? "binary" : "binary_size");
  if (strcmp(lang, "opencl") != 0)
    return ocl_fail(OAR_ERROR_NOT_SUPPORTED, "module_compile: lang '%.32s' is not supported (this plugin compiles \"opencl\")",
                    lang);
  OCL_TRY(check_options(options));
  if (options && strlen(options) > 4000)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: options are longer than 4000 bytes");
  ocl_device* dev = &g_ocl.devices[device];
  const char* sources[2] = {PRELUDE, source};
  cl_int error = CL_SUCCESS;
  cl_program program = clCreateProgramWithSource(dev->context, 2, sources, NULL, &error);
  if (!program) return ocl_fail_cl(error, "module_compile", "clCreateProgramWithSource");
  char flags[4200];
  build_options(dev, options, flags, sizeof flags);
  error = clBuildProgram(program, 1, &dev->id, flags, NULL, NULL);
  if (error != CL_SUCCESS) {
    char* log = program_build_log(program, dev->id);
    oar_status status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: the OpenCL build failed (%s) on '%s':\n%.1800s",
                                 ocl_error_name(error), dev->name, log && *log ? log : "(no build log)");
    free(log);
    clReleaseProgram(program);
    return status;
  }
  size_t payload = 0;
  error = clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof payload, &payload, NULL);
  if (error != CL_SUCCESS || payload == 0) {
    clReleaseProgram(program);
    return ocl_fail(OAR_ERROR_NOT_SUPPORTED, "module_compile: the driver of '%s' gives no program binary (%s)", dev->name,
                    ocl_error_name(error));
  }
  size_t total = sizeof(oar_opencl_binary_header) + payload;
  unsigned char* bytes = malloc(total);
  if (!bytes) {
    clReleaseProgram(program);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "module_compile: out of host memory for a %zu-byte binary", total);
  }
  unsigned char* body = bytes + sizeof(oar_opencl_binary_header);
  error = clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof body, &body, NULL);
  clReleaseProgram(program);
  if (error != CL_SUCCESS) {
    free(bytes);
    return ocl_fail_cl(error, "module_compile", "clGetProgramInfo(CL_PROGRAM_BINARIES)");
  }
  oar_opencl_binary_header header;
  memset(&header, 0, sizeof header);
  memcpy(header.magic, OAR_OPENCL_BINARY_MAGIC, sizeof OAR_OPENCL_BINARY_MAGIC);
  header.format_version = OAR_OPENCL_BINARY_FORMAT;
  header.header_bytes = sizeof header;
  header.payload_bytes = payload;
  header.checksum = fnv1a(body, payload, UINT64_C(0xcbf29ce484222325));
  header.device_fingerprint = device_fingerprint(dev);
  snprintf(header.device_name, sizeof header.device_name, "%.63s", dev->name);
  memcpy(bytes, &header, sizeof header);
  *binary = bytes;
  *binary_size = total;
  return OAR_SUCCESS;
}

oar_status ocl_module_binary_free(void* binary) {
  free(binary);
  return OAR_SUCCESS;
}

static oar_status module_lookup(oar_module handle, const char* entry, ocl_module** module) {
  ocl_module* found = handle ? registry_get(HANDLE_MODULE, (uint64_t)(uintptr_t)handle) : NULL;
  if (!found) return ocl_fail(OAR_ERROR_INVALID_HANDLE, "%s: module %p is not loaded", entry, (void*)handle);
  *module = found;
  return OAR_SUCCESS;
}

oar_status ocl_module_load(int32_t device, const void* binary, size_t binary_size, oar_module* handle) {
  OCL_TRY(ocl_check_ready("module_load"));
  OCL_TRY(ocl_check_device("module_load", device));
  if (!binary || !handle)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: %s is NULL", !binary ? "binary" : "module");
  ocl_device* dev = &g_ocl.devices[device];
  oar_opencl_binary_header header;
  if (binary_size < sizeof header)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: %zu bytes are too few for an OpenCL plugin binary",
                    binary_size);
  memcpy(&header, binary, sizeof header);
  if (memcmp(header.magic, OAR_OPENCL_BINARY_MAGIC, sizeof OAR_OPENCL_BINARY_MAGIC) != 0)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: not a binary of the OpenCL plugin (bad magic)");
  if (header.format_version != OAR_OPENCL_BINARY_FORMAT || header.header_bytes != sizeof header)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: binary format %u (header %u bytes), this plugin reads %u",
                    header.format_version, header.header_bytes, OAR_OPENCL_BINARY_FORMAT);
  if (header.payload_bytes != binary_size - sizeof header)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: the binary is truncated or padded (%zu payload bytes, header says %llu)",
                    binary_size - sizeof header, (unsigned long long)header.payload_bytes);
  const unsigned char* payload = (const unsigned char*)binary + sizeof header;
  if (fnv1a(payload, header.payload_bytes, UINT64_C(0xcbf29ce484222325)) != header.checksum)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: the binary is corrupt (checksum mismatch)");
  header.device_name[sizeof header.device_name - 1] = 0;
  if (header.device_fingerprint != device_fingerprint(dev))
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                    "module_load: the binary was built for '%s' (or another driver version), not for device %d ('%s')",
                    header.device_name, device, dev->name);
  size_t length = header.payload_bytes;
  cl_int error = CL_SUCCESS, binary_status = CL_SUCCESS;
  cl_program program =
      clCreateProgramWithBinary(dev->context, 1, &dev->id, &length, &payload, &binary_status, &error);
  if (!program || binary_status != CL_SUCCESS) {
    if (program) clReleaseProgram(program);
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: the driver refuses the binary: %s",
                    ocl_error_name(error != CL_SUCCESS ? error : binary_status));
  }
  error = clBuildProgram(program, 1, &dev->id, NULL, NULL, NULL);
  if (error != CL_SUCCESS) {
    char* log = program_build_log(program, dev->id);
    oar_status status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: the binary does not build (%s): %.1500s",
                                 ocl_error_name(error), log ? log : "");
    free(log);
    clReleaseProgram(program);
    return status;
  }
  ocl_module* module = calloc(1, sizeof *module);
  if (!module) {
    clReleaseProgram(program);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "module_load: out of host memory");
  }
  module->device = device;
  module->program = program;
  pthread_mutex_init(&module->lock, NULL);
  module->handle = registry_add(HANDLE_MODULE, module);
  if (!module->handle) {
    clReleaseProgram(program);
    pthread_mutex_destroy(&module->lock);
    free(module);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "module_load: too many modules");
  }
  *handle = (oar_module)(uintptr_t)module->handle;
  return OAR_SUCCESS;
}

static void module_free(ocl_module* module) {
  while (module->functions) {
    ocl_function* next = module->functions->next;
    registry_remove(HANDLE_FUNCTION, module->functions->handle);
    clReleaseKernel(module->functions->kernel);
    pthread_mutex_destroy(&module->functions->lock);
    free(module->functions);
    module->functions = next;
  }
  clReleaseProgram(module->program);
  pthread_mutex_destroy(&module->lock);
  free(module);
}

oar_status ocl_module_unload(oar_module handle) {
  OCL_TRY(ocl_check_ready("module_unload"));
  ocl_module* module = handle ? registry_remove(HANDLE_MODULE, (uint64_t)(uintptr_t)handle) : NULL;
  if (!module) return ocl_fail(OAR_ERROR_INVALID_HANDLE, "module_unload: module %p is not loaded", (void*)handle);
  module_free(module);
  return OAR_SUCCESS;
}

void ocl_modules_release_all(void) {
  ocl_module* module;
  while ((module = registry_pop_any(HANDLE_MODULE)) != NULL) module_free(module);
}

oar_status ocl_module_get_function(oar_module handle, const char* name, oar_function* function) {
  OCL_TRY(ocl_check_ready("module_get_function"));
  if (!name || !function)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_get_function: %s is NULL", !name ? "name" : "function");
  ocl_module* module = NULL;
  OCL_TRY(module_lookup(handle, "module_get_function", &module));
  pthread_mutex_lock(&module->lock);
  ocl_function* found = module->functions;
  while (found && strcmp(found->name, name) != 0) found = found->next;
  oar_status status = OAR_SUCCESS;
  if (!found) {
    cl_int error = CL_SUCCESS;
    cl_kernel kernel = strlen(name) < sizeof found->name ? clCreateKernel(module->program, name, &error) : NULL;
    if (!kernel) {
      status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "module_get_function: the module has no kernel '%.96s' (%s)", name,
                        ocl_error_name(error != CL_SUCCESS ? error : CL_INVALID_KERNEL_NAME));
    } else {
      found = calloc(1, sizeof *found);
      if (found) {
        found->module = module;
        found->device = module->device;
        found->kernel = kernel;
        snprintf(found->name, sizeof found->name, "%s", name);
        clGetKernelInfo(kernel, CL_KERNEL_NUM_ARGS, sizeof found->num_args, &found->num_args, NULL);
        clGetKernelWorkGroupInfo(kernel, g_ocl.devices[module->device].id, CL_KERNEL_WORK_GROUP_SIZE,
                                 sizeof found->work_group_size, &found->work_group_size, NULL);
        pthread_mutex_init(&found->lock, NULL);
        found->handle = registry_add(HANDLE_FUNCTION, found);
      }
      if (!found || !found->handle) {
        clReleaseKernel(kernel);
        if (found) pthread_mutex_destroy(&found->lock);
        free(found);
        found = NULL;
        status = ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "module_get_function: out of host memory");
      } else {
        found->next = module->functions;
        module->functions = found;
      }
    }
  }
  pthread_mutex_unlock(&module->lock);
  if (status == OAR_SUCCESS) *function = (oar_function)(uintptr_t)found->handle;
  return status;
}

oar_status ocl_module_launch(oar_stream stream_handle, oar_function function_handle, const oar_launch_config* config,
                      const oar_kernel_arg* args, size_t num_args) {
  OCL_TRY(ocl_check_ready("launch"));
  ocl_stream* stream = NULL;
  OCL_TRY(ocl_stream_lookup(stream_handle, "launch", &stream));
  ocl_function* function =
      function_handle ? registry_get(HANDLE_FUNCTION, (uint64_t)(uintptr_t)function_handle) : NULL;
  if (!function)
    return ocl_fail(OAR_ERROR_INVALID_HANDLE, "launch: function %p is not live", (void*)function_handle);
  if (function->device != stream->device)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s belongs to device %d, the stream to device %d", function->name,
                    function->device, stream->device);
  if (!config) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: config is NULL");
  if (config->struct_size < offsetof(oar_launch_config, reserved))
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: config->struct_size %zu is too small", config->struct_size);
  if (num_args && !args) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: args is NULL");
  ocl_device* dev = &g_ocl.devices[stream->device];
  size_t global[3], local[3], threads = 1;
  for (int i = 0; i < 3; i++) {
    if (config->grid[i] == 0 || config->block[i] == 0)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: grid[%d] = %u, block[%d] = %u; both must be >= 1",
                      function->name, i, config->grid[i], i, config->block[i]);
    if (config->block[i] > dev->max_item[i])
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: block[%d] = %u exceeds the device's %zu", function->name, i,
                      config->block[i], dev->max_item[i]);
    local[i] = config->block[i];
    global[i] = (size_t)config->grid[i] * config->block[i];
    threads *= local[i];
  }
  size_t limit = function->work_group_size && function->work_group_size < dev->max_work_group ? function->work_group_size
                                                                                                : dev->max_work_group;
  if (threads > limit)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: a block of %zu threads exceeds the %zu this kernel allows",
                    function->name, threads, limit);
  if (config->shared_memory_bytes > dev->local_memory)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: %u bytes of shared memory exceed the device's %llu",
                    function->name, config->shared_memory_bytes, (unsigned long long)dev->local_memory);
  cl_uint expected = config->shared_memory_bytes ? 1 : 0;
  for (size_t i = 0; i < num_args; i++) {
    const oar_kernel_arg* arg = &args[i];
    if (arg->kind == OAR_ARG_DEVICE_PTR) {
      if (arg->size != sizeof(void*) || !arg->value)
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: args[%zu] (OAR_ARG_DEVICE_PTR) needs a value of %zu bytes",
                        function->name, i, sizeof(void*));
      expected += 2;
    } else if (arg->kind == OAR_ARG_BYTES) {
      if (arg->size == 0 || !arg->value)
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: args[%zu] (OAR_ARG_BYTES) has no bytes", function->name, i);
      expected += 1;
    } else {
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: args[%zu] has an unknown kind %d", function->name, i,
                      arg->kind);
    }
  }
  /* resolve every pointer before touching the kernel */
  cl_mem* mems = num_args ? calloc(num_args, sizeof *mems) : NULL;
  cl_ulong* offsets = num_args ? calloc(num_args, sizeof *offsets) : NULL;
  if (num_args && (!mems || !offsets)) {
    free(mems);
    free(offsets);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "launch: out of host memory");
  }
  oar_status status = OAR_SUCCESS;
  for (size_t i = 0; i < num_args && status == OAR_SUCCESS; i++) {
    if (args[i].kind != OAR_ARG_DEVICE_PTR) continue;
    const void* ptr = *(const void* const*)args[i].value;
    if (!ptr) {
      status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: args[%zu] is a NULL device pointer", function->name, i);
      break;
    }
    char what[48];
    snprintf(what, sizeof what, "args[%zu]", i);
    uint64_t offset = 0;
    status = ocl_resolve(dev, "launch", what, ptr, 0, &mems[i], &offset);
    offsets[i] = offset;
  }
  if (status == OAR_SUCCESS && expected != function->num_args)
    status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                      "launch: %s takes %u OpenCL arguments, the %zu oar args give %u (each device pointer is two: "
                      "global T* base, ulong offset_bytes; shared memory adds one local pointer last)",
                      function->name, function->num_args, num_args, expected);
  if (status == OAR_SUCCESS) {
    pthread_mutex_lock(&function->lock);
    cl_uint index = 0;
    cl_int error = CL_SUCCESS;
    size_t failed_arg = 0;
    for (size_t i = 0; i < num_args && error == CL_SUCCESS; i++) {
      failed_arg = i;
      if (args[i].kind == OAR_ARG_DEVICE_PTR) {
        error = clSetKernelArg(function->kernel, index++, sizeof(cl_mem), &mems[i]);
        if (error == CL_SUCCESS) error = clSetKernelArg(function->kernel, index++, sizeof(cl_ulong), &offsets[i]);
      } else {
        error = clSetKernelArg(function->kernel, index++, args[i].size, args[i].value);
      }
    }
    if (error == CL_SUCCESS && config->shared_memory_bytes)
      error = clSetKernelArg(function->kernel, index++, config->shared_memory_bytes, NULL);
    if (error != CL_SUCCESS) {
      status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %s: args[%zu] does not fit its kernel argument: %s",
                        function->name, failed_arg, ocl_error_name(error));
    } else {
      cl_event event = NULL;
      error = clEnqueueNDRangeKernel(stream->queue, function->kernel, 3, NULL, global, local, 0, NULL, &event);
      if (error != CL_SUCCESS) status = ocl_fail_cl(error, "launch", function->name);
      else ocl_stream_enqueued(stream, event, function->name, "kernel");
    }
    pthread_mutex_unlock(&function->lock);
  }
  free(mems);
  free(offsets);
  return status;
}

/* Thread-local last error, the host's log sink, OpenCL error names. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static _Thread_local char last_error[OCL_ERROR_BYTES];
static void (*log_sink)(void*, int32_t, const char*);
static void* log_user_data;

oar_status ocl_fail(oar_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(last_error, sizeof last_error, format, args);
  va_end(args);
  return status;
}

const char* ocl_get_last_error_message(void) { return last_error; }

void ocl_set_log_sink(void (*sink)(void*, int32_t, const char*), void* user_data) {
  log_sink = sink;
  log_user_data = user_data;
}

void ocl_log(int32_t level, const char* format, ...) {
  if (!log_sink) return;
  char message[OCL_ERROR_BYTES];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  log_sink(log_user_data, level, message);
}

const char* ocl_error_name(cl_int error) {
  switch (error) {
#define NAME(code) case code: return #code;
    NAME(CL_SUCCESS)
    NAME(CL_DEVICE_NOT_FOUND)
    NAME(CL_DEVICE_NOT_AVAILABLE)
    NAME(CL_COMPILER_NOT_AVAILABLE)
    NAME(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    NAME(CL_OUT_OF_RESOURCES)
    NAME(CL_OUT_OF_HOST_MEMORY)
    NAME(CL_PROFILING_INFO_NOT_AVAILABLE)
    NAME(CL_MEM_COPY_OVERLAP)
    NAME(CL_BUILD_PROGRAM_FAILURE)
    NAME(CL_MAP_FAILURE)
    NAME(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    NAME(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    NAME(CL_COMPILE_PROGRAM_FAILURE)
    NAME(CL_LINKER_NOT_AVAILABLE)
    NAME(CL_LINK_PROGRAM_FAILURE)
    NAME(CL_INVALID_VALUE)
    NAME(CL_INVALID_DEVICE_TYPE)
    NAME(CL_INVALID_PLATFORM)
    NAME(CL_INVALID_DEVICE)
    NAME(CL_INVALID_CONTEXT)
    NAME(CL_INVALID_QUEUE_PROPERTIES)
    NAME(CL_INVALID_COMMAND_QUEUE)
    NAME(CL_INVALID_HOST_PTR)
    NAME(CL_INVALID_MEM_OBJECT)
    NAME(CL_INVALID_BUFFER_SIZE)
    NAME(CL_INVALID_BINARY)
    NAME(CL_INVALID_BUILD_OPTIONS)
    NAME(CL_INVALID_PROGRAM)
    NAME(CL_INVALID_PROGRAM_EXECUTABLE)
    NAME(CL_INVALID_KERNEL_NAME)
    NAME(CL_INVALID_KERNEL_DEFINITION)
    NAME(CL_INVALID_KERNEL)
    NAME(CL_INVALID_ARG_INDEX)
    NAME(CL_INVALID_ARG_VALUE)
    NAME(CL_INVALID_ARG_SIZE)
    NAME(CL_INVALID_KERNEL_ARGS)
    NAME(CL_INVALID_WORK_DIMENSION)
    NAME(CL_INVALID_WORK_GROUP_SIZE)
    NAME(CL_INVALID_WORK_ITEM_SIZE)
    NAME(CL_INVALID_GLOBAL_OFFSET)
    NAME(CL_INVALID_EVENT_WAIT_LIST)
    NAME(CL_INVALID_EVENT)
    NAME(CL_INVALID_OPERATION)
    NAME(CL_INVALID_GLOBAL_WORK_SIZE)
    NAME(CL_INVALID_PROPERTY)
#undef NAME
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR (no OpenCL driver is installed)";
    default: return "an unknown OpenCL error";
  }
}

oar_status ocl_fail_cl(cl_int error, const char* entry, const char* what) {
  oar_status status = (error == CL_OUT_OF_RESOURCES || error == CL_OUT_OF_HOST_MEMORY ||
                       error == CL_MEM_OBJECT_ALLOCATION_FAILURE)
                          ? OAR_ERROR_OUT_OF_MEMORY
                          : OAR_ERROR_INTERNAL;
  return ocl_fail(status, "%s: %s failed: %s (%d)", entry, what, ocl_error_name(error), (int)error);
}

int64_t ocl_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

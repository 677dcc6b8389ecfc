/* Thread-local last error message, the host's log sink, and clocks. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static _Thread_local char last_error[REFCPU_ERROR_BYTES];
static void (*_Atomic log_sink)(void* user_data, int32_t level, const char* message);
static void* _Atomic log_user_data;

oar_status refcpu_fail(oar_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(last_error, sizeof last_error, format, args);
  va_end(args);
  return status;
}

void refcpu_set_message(const char* message) {
  snprintf(last_error, sizeof last_error, "%s", message ? message : "");
}

const char* refcpu_get_last_error_message(void) { return last_error; }

void refcpu_set_log_sink(void (*sink)(void* user_data, int32_t level, const char* message),
                         void* user_data) {
  atomic_store(&log_user_data, user_data);
  atomic_store(&log_sink, sink);
}

void refcpu_log(int32_t level, const char* format, ...) {
  void (*sink)(void*, int32_t, const char*) = atomic_load(&log_sink);
  if (!sink) return;
  char message[REFCPU_ERROR_BYTES];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  sink(atomic_load(&log_user_data), level, message);
}

int64_t refcpu_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

void refcpu_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

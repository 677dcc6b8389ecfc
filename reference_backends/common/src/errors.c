/* oar/plugin_support.h groups 1 and 2: the thread-local message, the log sink, the clock. */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime, CLOCK_MONOTONIC under a strict -std */
#endif
#include "oar/plugin_support.h"

#include <stdio.h>
#include <time.h>

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define OAR_PS_THREAD_LOCAL _Thread_local
#else
#define OAR_PS_THREAD_LOCAL __thread /* GCC and Clang in C99 mode */
#endif

static OAR_PS_THREAD_LOCAL char last_error[OAR_PS_MESSAGE_BYTES];
/* The sink and its user data change together only at init; loads are atomic so a
   concurrent oar_ps_log sees one or the other, never a torn pointer. */
static oar_ps_log_sink log_sink;
static void* log_user_data;

oar_status oar_ps_vfail(oar_status status, const char* format, va_list args) {
  vsnprintf(last_error, sizeof last_error, format, args);
  return status;
}

oar_status oar_ps_fail(oar_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  oar_ps_vfail(status, format, args);
  va_end(args);
  return status;
}

void oar_ps_set_message(const char* message) {
  snprintf(last_error, sizeof last_error, "%s", message ? message : "");
}

const char* oar_ps_last_error_message(void) { return last_error; }

void oar_ps_set_log_sink(oar_ps_log_sink sink, void* user_data) {
  __atomic_store_n(&log_user_data, user_data, __ATOMIC_RELEASE);
  __atomic_store_n(&log_sink, sink, __ATOMIC_RELEASE);
}

void oar_ps_log(int32_t level, const char* format, ...) {
  oar_ps_log_sink sink = __atomic_load_n(&log_sink, __ATOMIC_ACQUIRE);
  if (!sink) return;
  char message[OAR_PS_MESSAGE_BYTES];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  sink(__atomic_load_n(&log_user_data, __ATOMIC_ACQUIRE), level, message);
}

int64_t oar_ps_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

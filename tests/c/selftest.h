/* The harness of Oar's C self-tests: one check counter, failure lines, the
 * summary line and the exit status, shared by every self-test that drives a
 * plugin through interface/include/oar/device_api.h.
 *
 * Include it once, in the test's only translation unit (everything here is
 * static). The test sets `api` once oar_plugin_init has filled the table; the
 * EXPECT macros read its last error message.
 *
 * Checks (each counts one pass or one failure):
 *   CHECK(condition)                  the failure line shows the condition's text
 *   CHECK_MSG(condition, format, ...) the failure line shows the printf-style message
 *   EXPECT_OK(call)                   call returns OAR_SUCCESS
 *   EXPECT_STATUS(call, status, needle)
 *       call returns status; for a failing status with needle non-NULL, the
 *       plugin's last error message must also contain needle
 *   check(ok, file, line, format, ...) the function under all of them, for
 *       helpers that report the caller's line
 *   selftest_count(ok)                counts without printing (a test that
 *       prints its own verdict line)
 *
 * Output: a failure prints "FAIL <selftest_fail_prefix><file>:<line>: <message>"
 * to stderr; passes print nothing. selftest_finish() prints the summary line
 * "N passed, M failed" on stdout; it is the last line of a run.
 *
 * Exit status (what selftest_finish / selftest_skip / selftest_setup_failed return):
 *   0   every check passed
 *   1   a check failed, or the plugin could not be set up (counted as one failure)
 *   2   usage error: the test did not run (the test returns it itself)
 *   77  skipped: nothing to test here, e.g. no device (Makefile and CTest
 *       count it as a pass), with "skipped: <why>" and "0 passed, 0 failed"
 */
#ifndef OAR_TESTS_SELFTEST_H
#define OAR_TESTS_SELFTEST_H

#include <oar/device_api.h>

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define SELFTEST_EXIT_SKIPPED 77

/* The plugin's function table under test; NULL until the test sets it. */
static const oar_device_table* api;

static int selftest_passed, selftest_failed;

/* Put between "FAIL " and the file name, e.g. "rank 2 " in a forked rank. */
static char selftest_fail_prefix[32];

/* Failures printed at most (0: all); the rest are counted only, so one broken
   thing cannot flood the log. */
static int selftest_max_printed_failures;

static inline void selftest_count(bool ok) {
  if (ok) selftest_passed++;
  else selftest_failed++;
}

static inline void check(bool ok, const char* file, int line, const char* format, ...) {
  selftest_count(ok);
  if (ok || (selftest_max_printed_failures > 0 && selftest_failed > selftest_max_printed_failures)) return;
  va_list args;
  va_start(args, format);
  fprintf(stderr, "FAIL %s%s:%d: ", selftest_fail_prefix, file, line);
  vfprintf(stderr, format, args);
  fprintf(stderr, "\n");
  va_end(args);
}

#define CHECK(condition) check((condition), __FILE__, __LINE__, "%s", #condition)
#define CHECK_MSG(condition, ...) check((condition), __FILE__, __LINE__, __VA_ARGS__)

static inline const char* last_error(void) { return api ? api->get_last_error_message() : ""; }

static inline const char* status_name(oar_status status) {
  static const char* const names[] = {"SUCCESS",       "INVALID_ARGUMENT", "INVALID_HANDLE", "OUT_OF_MEMORY",
                                      "NOT_SUPPORTED", "NOT_READY",        "TIMEOUT",        "DEVICE_LOST",
                                      "INTERNAL",      "NOT_INITIALIZED"};
  return status >= 0 && status <= 9 ? names[status] : "?";
}

static inline void selftest_expect(oar_status got, oar_status want, const char* needle, const char* file, int line,
                                   const char* text) {
  if (got == want && want != OAR_SUCCESS && needle && !strstr(last_error(), needle)) {
    check(false, file, line, "%s: message does not name '%s': \"%s\"", text, needle, last_error());
    return;
  }
  check(got == want, file, line, "%s returned %s, expected %s (message: \"%s\")", text, status_name(got),
        status_name(want), got ? last_error() : "");
}

#define EXPECT_OK(call) selftest_expect((call), OAR_SUCCESS, NULL, __FILE__, __LINE__, #call)
#define EXPECT_STATUS(call, status, needle) selftest_expect((call), (status), (needle), __FILE__, __LINE__, #call)

/* Prints the summary line; returns the exit status: 1 on any failure, else 0. */
static inline int selftest_finish(void) {
  printf("%d passed, %d failed\n", selftest_passed, selftest_failed);
  return selftest_failed ? 1 : 0;
}

/* The plugin could not be loaded or initialized: says why on stderr, counts
   one failure and finishes. */
static inline int selftest_setup_failed(const char* format, ...) {
  va_list args;
  va_start(args, format);
  vfprintf(stderr, format, args);
  fprintf(stderr, "\n");
  va_end(args);
  selftest_failed++;
  return selftest_finish();
}

/* Nothing to test here (no device): "skipped: <why>", the summary, exit 77. */
static inline int selftest_skip(const char* format, ...) {
  va_list args;
  va_start(args, format);
  printf("skipped: ");
  vprintf(format, args);
  printf("\n");
  va_end(args);
  selftest_finish();
  return SELFTEST_EXIT_SKIPPED;
}

#endif /* OAR_TESTS_SELFTEST_H */

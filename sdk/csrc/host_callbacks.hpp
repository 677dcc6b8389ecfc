// Calls from plugin threads into Python: the plugin's log sink and stream
// callbacks. They take the GIL, and never touch Python once it shuts down.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every unit: one set of type casters (ODR)

#include <string>

#include "oar/device_api.h"

namespace oar {

namespace py = pybind11;

// Where one plugin's log messages go: oar_plugin_params.log_user_data points to it.
struct LogTarget;
LogTarget* new_log_target(const std::string& label);
void relabel_log_target(LogTarget* target, const std::string& label);
// The last warning or error the plugin logged ("" if none): the only explanation
// there is when oar_plugin_init fails, as no table exists to ask.
std::string last_logged_problem(LogTarget* target);
// Only once the plugin will not log again (finalized, or never initialized).
void delete_log_target(LogTarget* target);
// oar_plugin_params.log: forwards to Python's "oar.plugin" logger.
void plugin_log_sink(void* user_data, int32_t level, const char* message);

// user_data for stream_add_callback: owns a reference to the Python callable
// until the trampoline has called it once.
void* retain_stream_callback(const py::object& callable);
void release_unused_stream_callback(void* user_data);  // the enqueue failed: never called
void stream_callback_trampoline(oar_stream stream, oar_status status, void* user_data);

// At interpreter exit (GIL held): from now on plugin threads write to stderr
// instead of entering Python; waits for the calls already inside Python.
void stop_python_entries();

// Whether Python still takes threads back (false once stop_python_entries ran).
bool python_open();
// Called without the GIL by a thread that must not return into a closing interpreter
// (a daemon thread coming back from a plugin call at exit): sleeps until the process ends.
[[noreturn]] void park_thread_forever();
// Take the GIL back after a plugin call. Not a destructor on purpose: at exit CPython may end a
// daemon thread inside PyEval_RestoreThread by unwinding it, which a destructor cannot survive.
void reenter_python(PyThreadState* state);
bool on_main_thread();
void remember_main_thread();  // at module import

// Run a plugin call with the GIL released (plugin threads may need it meanwhile: callbacks, logs).
template <class Fn>
auto without_gil(Fn&& call) -> decltype(call()) {
  if (!python_open()) {
    // At exit only the main thread may still call a plugin, and plugin threads no longer
    // enter Python, so it keeps the GIL; any other thread parks.
    if (!on_main_thread()) {
      PyEval_SaveThread();
      park_thread_forever();
    }
    return call();
  }
  PyThreadState* state = PyEval_SaveThread();
  auto result = call();
  reenter_python(state);
  return result;
}

}  // namespace oar

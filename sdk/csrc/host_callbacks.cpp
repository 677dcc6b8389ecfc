#include "python_hooks.hpp"
#include "host_callbacks.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "errors.hpp"

namespace oar {

namespace {

std::atomic<bool> g_python_open{true};
std::atomic<int> g_calls_in_python{0};

bool interpreter_running() {
  if (!Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsFinalizing();
#else
  return !_Py_IsFinalizing();
#endif
}

// Holds the GIL for a plugin thread, unless Python is shutting down. The
// counter is raised before the open flag is read, so stop_python_entries sees
// every call that got in.
class PythonEntry {
 public:
  PythonEntry() {
    g_calls_in_python.fetch_add(1);
    entered_ = g_python_open.load() && interpreter_running();
    if (entered_) {
      gil_ = PyGILState_Ensure();
    } else {
      g_calls_in_python.fetch_sub(1);
    }
  }
  ~PythonEntry() {
    if (entered_) {
      PyGILState_Release(gil_);
      g_calls_in_python.fetch_sub(1);
    }
  }
  PythonEntry(const PythonEntry&) = delete;
  PythonEntry& operator=(const PythonEntry&) = delete;
  bool entered() const { return entered_; }

 private:
  bool entered_ = false;
  PyGILState_STATE gil_{};
};

// ---- log sink ----------------------------------------------------------------

const char* level_word(int32_t level) {
  switch (level) {
    case OAR_LOG_DEBUG: return "DEBUG";
    case OAR_LOG_INFO: return "INFO";
    case OAR_LOG_WARNING: return "WARNING";
    case OAR_LOG_ERROR: return "ERROR";
    default: return "WARNING";
  }
}

int python_log_level(int32_t level) {
  switch (level) {
    case OAR_LOG_DEBUG: return 10;
    case OAR_LOG_INFO: return 20;
    case OAR_LOG_ERROR: return 40;
    default: return 30;  // WARNING and unknown levels
  }
}

}  // namespace

struct LogTarget {
  std::mutex mutex;
  std::string label;
  std::string last_problem;  // last WARNING/ERROR message
};

LogTarget* new_log_target(const std::string& label) {
  auto* target = new LogTarget;
  target->label = label;
  return target;
}

void relabel_log_target(LogTarget* target, const std::string& label) {
  std::lock_guard<std::mutex> lock(target->mutex);
  target->label = label;
}

std::string last_logged_problem(LogTarget* target) {
  std::lock_guard<std::mutex> lock(target->mutex);
  return target->last_problem;
}

void delete_log_target(LogTarget* target) { delete target; }

void plugin_log_sink(void* user_data, int32_t level, const char* message) {
  auto* target = static_cast<LogTarget*>(user_data);
  std::string label;
  std::string text = copy_plugin_text(message);
  {
    std::lock_guard<std::mutex> lock(target->mutex);
    label = target->label;
    if (level >= OAR_LOG_WARNING) target->last_problem = text;
  }
  PythonEntry entry;
  if (!entry.entered()) {
    // Python is gone: keep warnings and errors visible, drop the chatter.
    if (level >= OAR_LOG_WARNING || level < OAR_LOG_DEBUG) {
      std::fprintf(stderr, "oar.plugin %s: %s: %s\n", level_word(level), label.c_str(), text.c_str());
    }
    return;
  }
  try {
    hooks::plugin_logger().attr("log")(python_log_level(level), "%s: %s", to_python_text(label),
                                   to_python_text(text));
  } catch (py::error_already_set& error) {
    error.discard_as_unraisable("oar: forwarding a plugin log message");
  } catch (const std::exception&) {
    // a message that cannot be logged is dropped; the plugin thread must not unwind
  }
}

// ---- stream callbacks -----------------------------------------------------------

void* retain_stream_callback(const py::object& callable) {
  return callable.inc_ref().ptr();
}

void release_unused_stream_callback(void* user_data) {
  Py_XDECREF(static_cast<PyObject*>(user_data));
}

void stream_callback_trampoline(oar_stream, oar_status status, void* user_data) {
  PythonEntry entry;
  if (!entry.entered()) return;  // Python is gone: the callable is leaked, never released late
  PyObject* callable = static_cast<PyObject*>(user_data);
  PyObject* result = PyObject_CallFunction(callable, "i", static_cast<int>(status));
  if (result == nullptr) {
    PyErr_WriteUnraisable(callable);
  } else {
    Py_DECREF(result);
  }
  Py_DECREF(callable);
}

namespace {
unsigned long g_main_thread_ident = 0;  // threading.main_thread().ident, read on first use
}

bool python_open() { return g_python_open.load(); }

bool on_main_thread() {
  if (g_main_thread_ident == 0) return true;  // before init (never in practice): treat as main
  return PyThread_get_thread_ident() == g_main_thread_ident;
}

void remember_main_thread() {
  g_main_thread_ident = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
}

void park_thread_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void reenter_python(PyThreadState* state) {
  if (!g_python_open.load() && !on_main_thread()) park_thread_forever();
  PyEval_RestoreThread(state);
}

void stop_python_entries() {
  g_python_open.store(false);
  py::gil_scoped_release release;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (g_calls_in_python.load() > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "oar: a plugin thread is still inside Python at exit; not waiting longer\n");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace oar

// The fork handler: see fork_guard.hpp.
#include "fork_guard.hpp"

#include <pthread.h>
#include <unistd.h>

#include <mutex>

#include "errors.hpp"

namespace oar {

std::atomic<uint64_t> g_fork_generation{0};

namespace {

pid_t g_parent_pid = 0;  // the process the current generation was forked from

void prepare_fork() { g_parent_pid = getpid(); }

// Async-signal-safe: an atomic increment only.
void after_fork_in_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

void raise_forked_child(const std::string& label) {
  throw_oar_error("the " + label + " was initialised in process " + std::to_string(g_parent_pid) +
                  ", and this process (" + std::to_string(getpid()) +
                  ") is a fork of it: a forked child cannot use the parent's devices (their threads and "
                  "driver state are not copied by fork). Start worker processes with the 'spawn' start method "
                  "(multiprocessing.get_context(\"spawn\"), or set_start_method(\"spawn\")), or fork before "
                  "the first use of a device.");
}

void register_fork_guard(py::module_& module) {
  static std::once_flag installed;
  std::call_once(installed, [] { pthread_atfork(prepare_fork, nullptr, after_fork_in_child); });
  module.def("_fork_generation", &fork_generation,
             "How many forks separate this process from the one that imported oar._C.");
}

}  // namespace oar

// fork() after a plugin was initialised: the child has the parent's plugin state but none of its
// threads, so nothing may call the plugin there (not even finalize at exit, which would wait on
// workers that do not exist). pthread_atfork bumps a generation in each child; a plugin compares
// it with the generation it was initialised in.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace oar {

namespace py = pybind11;

extern std::atomic<uint64_t> g_fork_generation;

// 0 in the process that imported oar._C, then one more in each forked child.
inline uint64_t fork_generation() { return g_fork_generation.load(std::memory_order_relaxed); }

// OarError: what was made before the fork (the plugin named by label) cannot be used; use spawn.
[[noreturn]] void raise_forked_child(const std::string& label);

// Installs the pthread_atfork handler (once) and binds _C._fork_generation.
void register_fork_guard(py::module_& module);

}  // namespace oar

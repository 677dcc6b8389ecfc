/* dlopen() of NCCL (see nccl_api.h): once per process, kept loaded until it exits. */
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "internal.h"
#include "nccl_api.h"

namespace {
std::once_flag once;
cu_nccl_api api;
bool loaded = false;
std::string failure;

/* The nvidia-nccl-cu* wheel installs nvidia/nccl/lib beside nvidia/<other>/lib: for each
   directory of OAR_CUDA_LIB_DIRS that is such a lib dir, its nccl sibling. */
std::string wheel_siblings() {
  const char* dirs = std::getenv("OAR_CUDA_LIB_DIRS");
  std::string list = dirs ? dirs : "", siblings;
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find(':', start);
    if (end == std::string::npos) end = list.size();
    std::string dir = list.substr(start, end - start);
    while (!dir.empty() && dir.back() == '/') dir.pop_back();
    size_t lib = dir.rfind("/lib"), package = lib == std::string::npos ? lib : dir.rfind('/', lib - 1);
    if (lib != std::string::npos && lib + 4 == dir.size() && package != std::string::npos) {
      std::string nccl = dir.substr(0, package) + "/nccl/lib";
      if (nccl != dir && siblings.find(nccl) == std::string::npos) siblings += (siblings.empty() ? "" : ":") + nccl;
    }
    start = end + 1;
  }
  return siblings;
}

void load() {
  static const char* const names[] = {"libnccl.so.2", "libnccl.so", nullptr};
  std::string tried;
  void* library = cu_open_library(names, &tried);
  if (!library) {
    std::string siblings = wheel_siblings();
    for (size_t start = 0; !library && start < siblings.size();) {
      size_t end = siblings.find(':', start);
      if (end == std::string::npos) end = siblings.size();
      std::string path = siblings.substr(start, end - start) + "/libnccl.so.2";
      library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!library) tried += ", " + path;
      start = end + 1;
    }
  }
  if (!library) {
    failure = "NCCL not found (tried " + tried + ")";
    return;
  }
  struct {
    const char* name;
    void** slot;
  } symbols[] = {{"ncclGetVersion", (void**)&api.GetVersion},
                 {"ncclGetUniqueId", (void**)&api.GetUniqueId},
                 {"ncclCommInitRankConfig", (void**)&api.CommInitRankConfig},
                 {"ncclCommGetAsyncError", (void**)&api.CommGetAsyncError},
                 {"ncclCommFinalize", (void**)&api.CommFinalize},
                 {"ncclCommDestroy", (void**)&api.CommDestroy},
                 {"ncclCommAbort", (void**)&api.CommAbort},
                 {"ncclGetErrorString", (void**)&api.GetErrorString},
                 {"ncclGetLastError", (void**)&api.GetLastError},
                 {"ncclAllReduce", (void**)&api.AllReduce},
                 {"ncclBroadcast", (void**)&api.Broadcast},
                 {"ncclReduce", (void**)&api.Reduce},
                 {"ncclAllGather", (void**)&api.AllGather},
                 {"ncclReduceScatter", (void**)&api.ReduceScatter},
                 {"ncclSend", (void**)&api.Send},
                 {"ncclRecv", (void**)&api.Recv},
                 {"ncclGroupStart", (void**)&api.GroupStart},
                 {"ncclGroupEnd", (void**)&api.GroupEnd}};
  for (auto& symbol : symbols)
    if (!(*symbol.slot = dlsym(library, symbol.name))) {
      failure = std::string("NCCL has no ") + symbol.name + " (NCCL 2.18 or later is needed)";
      return;
    }
  if (api.GetVersion(&api.version) != NCCL_OK || api.version < 21800) {
    char text[96];
    snprintf(text, sizeof text, "NCCL %d.%d.%d is too old (2.18 or later is needed)", api.version / 10000,
             api.version / 100 % 100, api.version % 100);
    failure = text;
    return;
  }
  loaded = true;
}
}  // namespace

const cu_nccl_api* cu_nccl(std::string* why) {
  std::call_once(once, load);
  if (!loaded && why) *why = failure;
  return loaded ? &api : nullptr;
}

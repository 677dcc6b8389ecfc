/* Modules of lang "c": compiled by the system C compiler into a shared object,
   wrapped in a checked binary format, loaded with dlopen, launched over a grid. */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_OPTIONS 64
#define MAX_LAUNCH_ARGS 1024
#define MAX_ARG_BYTES (1u << 16)
#define MAX_BINARY_BYTES ((uint64_t)1 << 31)
#define COMPILER_LOG_BYTES 1600 /* what fits in an error message with its preamble */

typedef struct refcpu_function {
  struct refcpu_module* module;
  oar_refcpu_function entry;
  uint64_t handle;
  char* name;
  struct refcpu_function* next;
} refcpu_function;

typedef struct refcpu_module {
  int32_t device;
  void* library;
  char path[PATH_MAX];
  refcpu_function* functions;
} refcpu_module;

/* Guards the function lists of all modules. */
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t file_counter;

static uint64_t fnv1a(const unsigned char* bytes, size_t size) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; i++) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

static void machine_name(char out[16]) {
  struct utsname host;
  memset(out, 0, 16);
  if (uname(&host) == 0) memcpy(out, host.machine, strnlen(host.machine, 15));
}

/* ---- module_compile ---------------------------------------------------- */

static bool starts_with(const char* text, const char* prefix) {
  return strncmp(text, prefix, strlen(prefix)) == 0;
}

/* Flags that would drop NaN/Inf semantics, load code into the compiler, or
   reach the linker/assembler are refused even though their prefix is allowed. */
static bool option_allowed(const char* option) {
  static const char* const refused[] = {"-Ofast", "-ffast-math", "-ffinite-math-only",
                                        "-funsafe-math-optimizations", "-fno-honor-nans",
                                        "-fno-honor-infinities", "-fplugin", "-Wl,", "-Wa,",
                                        "-Wp,", "-fdump", "-fprofile", "-fcoverage"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    if (starts_with(option, refused[i])) return false;
  static const char* const allowed[] = {"-O", "-D", "-f", "-m", "-W", "-g", "-std="};
  for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
    if (starts_with(option, allowed[i])) return true;
  return false;
}

/* Splits options in place into argv entries; fails naming the refused one. */
static oar_status split_options(char* options, char** argv, int* argc) {
  for (char* token = strtok(options, " \t\n"); token; token = strtok(NULL, " \t\n")) {
    if (!option_allowed(token))
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "module_compile: option '%s' is not accepted (allowed: -O*, -D*, -f*, -m*, "
                         "-W*, -g*, -std=*; not fast-math, -Ofast, -fplugin, -Wl,/-Wa,/-Wp,)",
                         token);
    if (*argc >= MAX_OPTIONS)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: more than %d options",
                         MAX_OPTIONS - 16);
    argv[(*argc)++] = token;
  }
  return OAR_SUCCESS;
}

static oar_status write_file(const char* entry, const char* path, const void* bytes, size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return refcpu_fail(OAR_ERROR_INTERNAL, "%s: cannot create %s: %s", entry, path, strerror(errno));
  const char* cursor = bytes;
  while (size > 0) {
    ssize_t written = write(fd, cursor, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      int error = errno;
      close(fd);
      unlink(path);
      return refcpu_fail(OAR_ERROR_INTERNAL, "%s: cannot write %s: %s", entry, path, strerror(error));
    }
    cursor += written;
    size -= (size_t)written;
  }
  close(fd);
  return OAR_SUCCESS;
}

/* Runs argv with fork/execvp (no shell), its stdout+stderr captured in log. */
static oar_status run_compiler(char* const* argv, char* log, size_t log_bytes, int* wait_status) {
  int output[2], exec_error[2];
  if (pipe2(output, O_CLOEXEC) != 0)
    return refcpu_fail(OAR_ERROR_INTERNAL, "module_compile: pipe: %s", strerror(errno));
  if (pipe2(exec_error, O_CLOEXEC) != 0) {
    close(output[0]);
    close(output[1]);
    return refcpu_fail(OAR_ERROR_INTERNAL, "module_compile: pipe: %s", strerror(errno));
  }
  pid_t child = fork();
  if (child < 0) {
    int error = errno;
    close(output[0]), close(output[1]), close(exec_error[0]), close(exec_error[1]);
    return refcpu_fail(OAR_ERROR_INTERNAL, "module_compile: fork: %s", strerror(error));
  }
  if (child == 0) {
    /* Only async-signal-safe calls between fork and exec. */
    dup2(output[1], STDOUT_FILENO);
    dup2(output[1], STDERR_FILENO);
    execvp(argv[0], argv);
    int error = errno;
    ssize_t ignored = write(exec_error[1], &error, sizeof error);
    (void)ignored;
    _exit(127);
  }
  close(output[1]);
  close(exec_error[1]);
  size_t used = 0;
  char chunk[4096];
  for (;;) {
    ssize_t got = read(output[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    size_t keep = (size_t)got < log_bytes - 1 - used ? (size_t)got : log_bytes - 1 - used;
    memcpy(log + used, chunk, keep);
    used += keep; /* the rest is drained so the compiler never blocks */
  }
  log[used] = '\0';
  close(output[0]);
  int exec_errno = 0;
  ssize_t got = read(exec_error[0], &exec_errno, sizeof exec_errno);
  close(exec_error[0]);
  while (waitpid(child, wait_status, 0) < 0 && errno == EINTR) {
  }
  if (got == (ssize_t)sizeof exec_errno)
    return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                       "module_compile: cannot run the C compiler '%s': %s (set OAR_REFCPU_CC)",
                       argv[0], strerror(exec_errno));
  return OAR_SUCCESS;
}

static oar_status read_file(const char* path, unsigned char** bytes, size_t* size, size_t prefix) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat info;
  if (fd < 0 || fstat(fd, &info) != 0) {
    int error = errno;
    if (fd >= 0) close(fd);
    return refcpu_fail(OAR_ERROR_INTERNAL, "module_compile: cannot read %s: %s", path, strerror(error));
  }
  size_t file_size = (size_t)info.st_size;
  unsigned char* buffer = malloc(prefix + file_size);
  if (!buffer) {
    close(fd);
    return refcpu_fail(OAR_ERROR_INTERNAL, "module_compile: out of host memory");
  }
  size_t done = 0;
  while (done < file_size) {
    ssize_t got = read(fd, buffer + prefix + done, file_size - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += (size_t)got;
  }
  close(fd);
  if (done != file_size) {
    free(buffer);
    return refcpu_fail(OAR_ERROR_INTERNAL, "module_compile: short read of %s", path);
  }
  *bytes = buffer;
  *size = file_size;
  return OAR_SUCCESS;
}

oar_status refcpu_module_compile(int32_t device, const char* lang, const char* source,
                                 const char* options, void** binary, size_t* binary_size) {
  REFCPU_TRY(refcpu_check_ready("module_compile"));
  REFCPU_TRY(refcpu_check_device("module_compile", device));
  if (!lang || !source || !binary || !binary_size)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: %s is NULL",
                       !lang ? "lang" : !source ? "source" : !binary ? "binary" : "binary_size");
  if (strcmp(lang, "c") != 0)
    return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                       "module_compile: lang '%s' is not supported (this plugin compiles \"c\")", lang);

  char* options_copy = strdup(options ? options : "");
  if (!options_copy) return refcpu_fail(OAR_ERROR_INTERNAL, "module_compile: out of host memory");
  const char* compiler = getenv("OAR_REFCPU_CC");
  if (!compiler || !*compiler) compiler = "cc";
  char* argv[MAX_OPTIONS + 16];
  int argc = 0;
  argv[argc++] = (char*)compiler;
  const char* defaults[] = {"-O3", "-std=c11", "-fPIC", "-shared", "-march=native"};
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) argv[argc++] = (char*)defaults[i];
  oar_status status = split_options(options_copy, argv, &argc);
  const char* directory = NULL;
  if (status == OAR_SUCCESS) status = workdir_get("module_compile", &directory);
  if (status != OAR_SUCCESS) {
    free(options_copy);
    return status;
  }
  uint64_t serial = atomic_fetch_add(&file_counter, 1);
  char source_path[PATH_MAX], object_path[PATH_MAX];
  snprintf(source_path, sizeof source_path, "%s/compile-%llu.c", directory, (unsigned long long)serial);
  snprintf(object_path, sizeof object_path, "%s/compile-%llu.so", directory, (unsigned long long)serial);
  argv[argc++] = "-o";
  argv[argc++] = object_path;
  argv[argc++] = source_path;
  argv[argc] = NULL;

  status = write_file("module_compile", source_path, source, strlen(source));
  char log[COMPILER_LOG_BYTES];
  int wait_status = 0;
  if (status == OAR_SUCCESS) {
    status = run_compiler(argv, log, sizeof log, &wait_status);
    unlink(source_path);
  }
  free(options_copy);
  if (status == OAR_SUCCESS && !(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0)) {
    unlink(object_path);
    if (WIFEXITED(wait_status))
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: %s exited with %d:\n%s",
                         compiler, WEXITSTATUS(wait_status), log);
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_compile: %s was killed by signal %d:\n%s",
                       compiler, WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0, log);
  }
  if (status != OAR_SUCCESS) return status;

  unsigned char* bytes = NULL;
  size_t payload_size = 0;
  oar_refcpu_binary_header header = {.magic = OAR_REFCPU_BINARY_MAGIC,
                                     .format_version = OAR_REFCPU_BINARY_FORMAT,
                                     .header_bytes = sizeof header};
  status = read_file(object_path, &bytes, &payload_size, sizeof header);
  unlink(object_path);
  if (status != OAR_SUCCESS) return status;
  header.payload_bytes = payload_size;
  header.checksum = fnv1a(bytes + sizeof header, payload_size);
  machine_name(header.machine);
  memcpy(bytes, &header, sizeof header);
  *binary = bytes;
  *binary_size = sizeof header + payload_size;
  return OAR_SUCCESS;
}

oar_status refcpu_module_binary_free(void* binary) {
  free(binary); /* plain heap memory: valid even across init/finalize */
  return OAR_SUCCESS;
}

/* ---- module_load / unload / get_function ------------------------------- */

static oar_status check_binary(const void* binary, size_t size) {
  oar_refcpu_binary_header header;
  if (size < sizeof header)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "module_load: %zu bytes are too few for a binary of this plugin (header: %zu)",
                       size, sizeof header);
  memcpy(&header, binary, sizeof header);
  if (memcmp(header.magic, OAR_REFCPU_BINARY_MAGIC, sizeof OAR_REFCPU_BINARY_MAGIC) != 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "module_load: not a binary of this plugin (bad magic; made by module_compile?)");
  if (header.format_version != OAR_REFCPU_BINARY_FORMAT || header.header_bytes != sizeof header)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "module_load: binary format %u with a %u-byte header; this plugin reads format %u",
                       header.format_version, header.header_bytes, OAR_REFCPU_BINARY_FORMAT);
  if (header.payload_bytes != size - sizeof header || header.payload_bytes > MAX_BINARY_BYTES)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "module_load: binary is truncated or padded: header says %llu payload bytes, got %zu",
                       (unsigned long long)header.payload_bytes, size - sizeof header);
  char machine[16];
  machine_name(machine);
  if (memcmp(header.machine, machine, sizeof machine) != 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: binary was built for '%.16s', this is '%.16s'",
                       header.machine, machine);
  const unsigned char* payload = (const unsigned char*)binary + sizeof header;
  if (fnv1a(payload, header.payload_bytes) != header.checksum)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: binary is corrupt (checksum mismatch)");
  if (header.payload_bytes < 4 || memcmp(payload, "\x7f" "ELF", 4) != 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: payload is not a shared object");
  return OAR_SUCCESS;
}

oar_status refcpu_module_load(int32_t device, const void* binary, size_t binary_size,
                              oar_module* handle) {
  REFCPU_TRY(refcpu_check_ready("module_load"));
  REFCPU_TRY(refcpu_check_device("module_load", device));
  if (!binary || !handle)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: %s is NULL", binary ? "module" : "binary");
  REFCPU_TRY(check_binary(binary, binary_size));
  const char* directory;
  REFCPU_TRY(workdir_get("module_load", &directory));
  refcpu_module* module = calloc(1, sizeof *module);
  if (!module) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "module_load: out of host memory");
  module->device = device;
  snprintf(module->path, sizeof module->path, "%s/module-%llu.so", directory,
           (unsigned long long)atomic_fetch_add(&file_counter, 1));
  size_t header_bytes = sizeof(oar_refcpu_binary_header);
  oar_status status = write_file("module_load", module->path, (const char*)binary + header_bytes,
                                 binary_size - header_bytes);
  if (status != OAR_SUCCESS) {
    free(module);
    return status;
  }
  module->library = dlopen(module->path, RTLD_NOW | RTLD_LOCAL);
  if (!module->library) {
    const char* reason = dlerror();
    status = refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_load: dlopen failed: %s",
                         reason ? reason : "unknown error");
    unlink(module->path);
    free(module);
    return status;
  }
  uint64_t id = registry_add(&g_refcpu.modules, module);
  if (!id) {
    dlclose(module->library);
    unlink(module->path);
    free(module);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "module_load: out of host memory");
  }
  *handle = (oar_module)(uintptr_t)id;
  return OAR_SUCCESS;
}

static void free_module(refcpu_module* module) {
  pthread_mutex_lock(&modules_lock);
  refcpu_function* function = module->functions;
  module->functions = NULL;
  pthread_mutex_unlock(&modules_lock);
  while (function) {
    refcpu_function* next = function->next;
    registry_remove(&g_refcpu.functions, function->handle);
    free(function->name);
    free(function);
    function = next;
  }
  dlclose(module->library);
  unlink(module->path);
  free(module);
}

oar_status refcpu_module_unload(oar_module handle) {
  REFCPU_TRY(refcpu_check_ready("module_unload"));
  refcpu_module* module = handle ? registry_remove(&g_refcpu.modules, (uint64_t)(uintptr_t)handle) : NULL;
  if (!module)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "module_unload: module %p is not live (unloaded twice, or not from this plugin)",
                       (void*)handle);
  free_module(module);
  return OAR_SUCCESS;
}

void module_unload_all(void) {
  refcpu_module* module;
  while ((module = registry_pop_any(&g_refcpu.modules))) free_module(module);
}

oar_status refcpu_module_get_function(oar_module handle, const char* name, oar_function* function) {
  REFCPU_TRY(refcpu_check_ready("module_get_function"));
  if (!name || !function)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_get_function: %s is NULL",
                       name ? "function" : "name");
  refcpu_module* module = handle ? registry_get(&g_refcpu.modules, (uint64_t)(uintptr_t)handle) : NULL;
  if (!module)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE, "module_get_function: module %p is not live",
                       (void*)handle);
  pthread_mutex_lock(&modules_lock);
  refcpu_function* found = module->functions;
  while (found && strcmp(found->name, name) != 0) found = found->next;
  pthread_mutex_unlock(&modules_lock);
  if (found) {
    *function = (oar_function)(uintptr_t)found->handle;
    return OAR_SUCCESS;
  }
  dlerror();
  void* symbol = dlsym(module->library, name);
  /* dlsym also searches the module's dependencies (libc); only its own symbols count. */
  Dl_info info;
  if (!symbol || !dladdr(symbol, &info) || !info.dli_fname || strcmp(info.dli_fname, module->path) != 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "module_get_function: no function '%s' in the module",
                       name);
  found = calloc(1, sizeof *found);
  char* name_copy = strdup(name);
  if (!found || !name_copy) {
    free(found);
    free(name_copy);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "module_get_function: out of host memory");
  }
  found->module = module;
  found->name = name_copy;
  /* A data pointer to a function pointer: POSIX guarantees dlsym results convert. */
  memcpy(&found->entry, &symbol, sizeof symbol);
  found->handle = registry_add(&g_refcpu.functions, found);
  if (!found->handle) {
    free(name_copy);
    free(found);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "module_get_function: out of host memory");
  }
  pthread_mutex_lock(&modules_lock);
  found->next = module->functions;
  module->functions = found;
  pthread_mutex_unlock(&modules_lock);
  *function = (oar_function)(uintptr_t)found->handle;
  return OAR_SUCCESS;
}

/* ---- launch ------------------------------------------------------------ */

static size_t round16(size_t size) { return (size + 15) & ~(size_t)15; }

static oar_status check_config(const oar_launch_config* config) {
  if (!config) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: config is NULL");
  size_t needed = offsetof(oar_launch_config, block) + sizeof config->block;
  if (config->struct_size < needed)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: config->struct_size %zu is smaller than %zu",
                       config->struct_size, needed);
  static const uint32_t max_grid[3] = {2147483647u, 65535u, 65535u};
  static const uint32_t max_block[3] = {1024u, 1024u, 64u};
  for (int i = 0; i < 3; i++) {
    if (config->grid[i] == 0 || config->grid[i] > max_grid[i])
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: grid[%d] = %u is outside 1..%u", i,
                         config->grid[i], max_grid[i]);
    if (config->block[i] == 0 || config->block[i] > max_block[i])
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: block[%d] = %u is outside 1..%u", i,
                         config->block[i], max_block[i]);
  }
  uint64_t threads = (uint64_t)config->block[0] * config->block[1] * config->block[2];
  if (threads > 1024)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: block has %llu threads, more than 1024",
                       (unsigned long long)threads);
  bool has_shared_memory_field = config->struct_size >= offsetof(oar_launch_config, shared_memory_bytes) +
                                                           sizeof config->shared_memory_bytes;
  if (has_shared_memory_field && config->shared_memory_bytes > 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "launch: shared_memory_bytes = %u, but C functions have no shared memory (max 0)",
                       config->shared_memory_bytes);
  return OAR_SUCCESS;
}

oar_status refcpu_launch(oar_stream stream_handle, oar_function function_handle,
                         const oar_launch_config* config, const oar_kernel_arg* args,
                         size_t num_args) {
  refcpu_stream* stream = NULL;
  REFCPU_TRY(stream_lookup(stream_handle, "launch", &stream));
  refcpu_function* function =
      function_handle ? registry_get(&g_refcpu.functions, (uint64_t)(uintptr_t)function_handle) : NULL;
  if (!function)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "launch: function %p is not live (its module unloaded, or not from this plugin)",
                       (void*)function_handle);
  if (function->module->device != stream->device)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "launch: %s was loaded on device %d, the stream is on device %d", function->name,
                       function->module->device, stream->device);
  REFCPU_TRY(check_config(config));
  if (num_args && !args) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: args is NULL");
  if (num_args > MAX_LAUNCH_ARGS)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: %zu args, at most %d", num_args, MAX_LAUNCH_ARGS);

  /* First pass: kinds and sizes, to size the storage. */
  size_t storage_bytes = round16(num_args * sizeof(uint32_t));
  for (size_t i = 0; i < num_args; i++) {
    const oar_kernel_arg* arg = &args[i];
    if (arg->kind == OAR_ARG_DEVICE_PTR) {
      if (arg->size != sizeof(void*) || !arg->value)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "launch: args[%zu] is a device pointer with size %zu (must be %zu) or NULL value",
                           i, arg->size, sizeof(void*));
      storage_bytes += round16(sizeof(void*));
    } else if (arg->kind == OAR_ARG_BYTES) {
      if (arg->size == 0 || arg->size > MAX_ARG_BYTES || !arg->value)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "launch: args[%zu] has %zu bytes (must be 1..%u) or a NULL value", i,
                           arg->size, MAX_ARG_BYTES);
      storage_bytes += round16(arg->size);
    } else {
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "launch: args[%zu] has unknown kind %d", i, arg->kind);
    }
  }

  command launch = {.kind = COMMAND_LAUNCH};
  launch_command* cmd = &launch.u.launch;
  cmd->function = function->entry;
  cmd->name = function->name;
  memcpy(cmd->grid, config->grid, sizeof cmd->grid);
  memcpy(cmd->block, config->block, sizeof cmd->block);
  cmd->num_args = (uint32_t)num_args;
  unsigned char* storage = cmd->storage;
  if (storage_bytes > LAUNCH_INLINE_BYTES) {
    cmd->heap = aligned_alloc(16, storage_bytes);
    if (!cmd->heap) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "launch: out of host memory");
    storage = cmd->heap;
  }
  /* Second pass: translate device pointers and copy values. */
  size_t offset = round16(num_args * sizeof(uint32_t));
  for (size_t i = 0; i < num_args; i++) {
    const oar_kernel_arg* arg = &args[i];
    uint32_t at = (uint32_t)offset;
    memcpy(storage + i * sizeof(uint32_t), &at, sizeof at);
    if (arg->kind == OAR_ARG_DEVICE_PTR) {
      void* device_pointer;
      memcpy(&device_pointer, arg->value, sizeof device_pointer);
      char what[32];
      snprintf(what, sizeof what, "args[%zu]", i);
      char* host_pointer = NULL;
      oar_status status = arena_resolve(&g_refcpu.devices[stream->device].arena, "launch", what,
                                        device_pointer, 0, &host_pointer);
      if (status != OAR_SUCCESS) {
        free(cmd->heap);
        return status;
      }
      memcpy(storage + offset, &host_pointer, sizeof host_pointer);
      offset += round16(sizeof(void*));
    } else {
      memcpy(storage + offset, arg->value, arg->size);
      offset += round16(arg->size);
    }
  }
  oar_status status = stream_submit(stream, &launch, "launch");
  if (status != OAR_SUCCESS) free(cmd->heap);
  return status;
}

oar_status launch_execute(const launch_command* launch) {
  unsigned char* storage = launch->heap ? launch->heap : (unsigned char*)launch->storage;
  void* inline_pointers[64] = {0};
  void** pointers = inline_pointers;
  if (launch->num_args > 64) {
    pointers = malloc(launch->num_args * sizeof *pointers);
    if (!pointers) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "launch: %s: out of host memory", launch->name);
  }
  for (uint32_t i = 0; i < launch->num_args; i++) {
    uint32_t at;
    memcpy(&at, storage + i * sizeof(uint32_t), sizeof at);
    pointers[i] = storage + at;
  }
  thread_pool_run_grid(launch->function, launch->grid, launch->block, pointers);
  if (pointers != inline_pointers) free(pointers);
  return OAR_SUCCESS;
}

void launch_release(launch_command* launch) {
  free(launch->heap);
  launch->heap = NULL;
}

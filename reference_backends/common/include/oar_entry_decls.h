/* Prototypes of a plugin's entry points, by group, with the signatures of
 * interface/include/oar/device_api.h's function table: OAR_DECLARE_MEMORY_ENTRIES(cu)
 * declares cu_mem_alloc, cu_mem_free, ... . A plugin uses the groups it
 * implements in files of its own; its other entries (device, collectives, the
 * module launch, its own helpers) it declares itself. C and C++. */
#ifndef OAR_REFERENCE_ENTRY_DECLS_H_
#define OAR_REFERENCE_ENTRY_DECLS_H_

#include "oar/device_api.h"

/* mem_alloc, mem_free, memcpy_{h2d,d2h,d2d}[_async], mem_set[_async] */
#define OAR_DECLARE_MEMORY_ENTRIES(P)                                                         \
  oar_status P##_mem_alloc(int32_t device, size_t size, void** ptr);                        \
  oar_status P##_mem_free(int32_t device, void* ptr);                                        \
  oar_status P##_memcpy_h2d(int32_t device, void* dst, const void* src, size_t size);        \
  oar_status P##_memcpy_d2h(int32_t device, void* dst, const void* src, size_t size);        \
  oar_status P##_memcpy_d2d(int32_t device, void* dst, const void* src, size_t size);        \
  oar_status P##_memcpy_h2d_async(oar_stream stream, void* dst, const void* src, size_t size); \
  oar_status P##_memcpy_d2h_async(oar_stream stream, void* dst, const void* src, size_t size); \
  oar_status P##_memcpy_d2d_async(oar_stream stream, void* dst, const void* src, size_t size); \
  oar_status P##_mem_set(int32_t device, void* dst, uint8_t value, size_t size);            \
  oar_status P##_mem_set_async(oar_stream stream, void* dst, uint8_t value, size_t size)

/* host_alloc, host_free (pinned host memory) */
#define OAR_DECLARE_HOST_MEMORY_ENTRIES(P)                             \
  oar_status P##_host_alloc(int32_t device, size_t size, void** ptr); \
  oar_status P##_host_free(int32_t device, void* ptr)

/* stream_create, stream_destroy, stream_synchronize, stream_query, stream_wait_event, stream_add_callback */
#define OAR_DECLARE_STREAM_ENTRIES(P)                                                            \
  oar_status P##_stream_create(int32_t device, uint32_t flags, int32_t priority, oar_stream* stream); \
  oar_status P##_stream_destroy(oar_stream stream);                                             \
  oar_status P##_stream_synchronize(oar_stream stream);                                         \
  oar_status P##_stream_query(oar_stream stream);                                               \
  oar_status P##_stream_wait_event(oar_stream stream, oar_event event);                         \
  oar_status P##_stream_add_callback(oar_stream stream, oar_stream_callback callback, void* user_data)

/* event_create, event_destroy, event_record, event_synchronize, event_query, event_elapsed_time */
#define OAR_DECLARE_EVENT_ENTRIES(P)                                           \
  oar_status P##_event_create(int32_t device, uint32_t flags, oar_event* event); \
  oar_status P##_event_destroy(oar_event event);                              \
  oar_status P##_event_record(oar_event event, oar_stream stream);            \
  oar_status P##_event_synchronize(oar_event event);                          \
  oar_status P##_event_query(oar_event event);                                \
  oar_status P##_event_elapsed_time(oar_event start, oar_event end, float* ms)

/* kernel_query, kernel_launch (the library kernels of ops.yaml) */
#define OAR_DECLARE_KERNEL_ENTRIES(P)                                                                           \
  oar_status P##_kernel_query(int32_t device, const char* op, const oar_dl_data_type* dtypes, size_t num_dtypes, \
                              oar_kernel* kernel);                                                              \
  oar_status P##_kernel_launch(oar_stream stream, oar_kernel kernel, const oar_dl_tensor* inputs,               \
                               size_t num_inputs, const oar_dl_tensor* outputs, size_t num_outputs,             \
                               const oar_attr* attrs, size_t num_attrs)

/* module_compile, module_binary_free, module_load, module_unload, module_get_function
   (the launch of a module's function each plugin names itself) */
#define OAR_DECLARE_MODULE_ENTRIES(P)                                                                     \
  oar_status P##_module_compile(int32_t device, const char* lang, const char* source, const char* options, \
                                void** binary, size_t* binary_size);                                      \
  oar_status P##_module_binary_free(void* binary);                                                        \
  oar_status P##_module_load(int32_t device, const void* binary, size_t binary_size, oar_module* module); \
  oar_status P##_module_unload(oar_module module);                                                        \
  oar_status P##_module_get_function(oar_module module, const char* name, oar_function* function)

#endif /* OAR_REFERENCE_ENTRY_DECLS_H_ */

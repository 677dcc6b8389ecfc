/* The entry points of the function table defined outside plugin.cpp, one
 * group per file (see device_api.h for what each does). */
#ifndef OAR_CUDA_ENTRIES_H_
#define OAR_CUDA_ENTRIES_H_

#include "oar/device_api.h"

/* memory.cpp */
oar_status cu_mem_alloc(int32_t device, size_t size, void** ptr);
oar_status cu_mem_free(int32_t device, void* ptr);
oar_status cu_host_alloc(int32_t device, size_t size, void** ptr);
oar_status cu_host_free(int32_t device, void* ptr);
oar_status cu_memcpy_h2d(int32_t device, void* dst, const void* src, size_t size);
oar_status cu_memcpy_d2h(int32_t device, void* dst, const void* src, size_t size);
oar_status cu_memcpy_d2d(int32_t device, void* dst, const void* src, size_t size);
oar_status cu_memcpy_h2d_async(oar_stream stream, void* dst, const void* src, size_t size);
oar_status cu_memcpy_d2h_async(oar_stream stream, void* dst, const void* src, size_t size);
oar_status cu_memcpy_d2d_async(oar_stream stream, void* dst, const void* src, size_t size);
oar_status cu_mem_set(int32_t device, void* dst, uint8_t value, size_t size);
oar_status cu_mem_set_async(oar_stream stream, void* dst, uint8_t value, size_t size);

/* stream.cpp */
oar_status cu_device_synchronize(int32_t device);
oar_status cu_stream_create(int32_t device, uint32_t flags, int32_t priority, oar_stream* stream);
oar_status cu_stream_destroy(oar_stream stream);
oar_status cu_stream_synchronize(oar_stream stream);
oar_status cu_stream_query(oar_stream stream);
oar_status cu_stream_wait_event(oar_stream stream, oar_event event);
oar_status cu_stream_add_callback(oar_stream stream, oar_stream_callback callback, void* user_data);
oar_status cu_event_create(int32_t device, uint32_t flags, oar_event* event);
oar_status cu_event_destroy(oar_event event);
oar_status cu_event_record(oar_event event, oar_stream stream);
oar_status cu_event_synchronize(oar_event event);
oar_status cu_event_query(oar_event event);
oar_status cu_event_elapsed_time(oar_event start, oar_event end, float* ms);

/* kernels.cpp */
oar_status cu_kernel_query(int32_t device, const char* op, const oar_dl_data_type* dtypes, size_t num_dtypes,
                           oar_kernel* kernel);
oar_status cu_kernel_launch(oar_stream stream, oar_kernel kernel, const oar_dl_tensor* inputs, size_t num_inputs,
                            const oar_dl_tensor* outputs, size_t num_outputs, const oar_attr* attrs,
                            size_t num_attrs);

/* module.cpp */
oar_status cu_module_compile(int32_t device, const char* lang, const char* source, const char* options,
                             void** binary, size_t* binary_size);
oar_status cu_module_binary_free(void* binary);
oar_status cu_module_load(int32_t device, const void* binary, size_t binary_size, oar_module* module);
oar_status cu_module_unload(oar_module module);
oar_status cu_module_get_function(oar_module module, const char* name, oar_function* function);
oar_status cu_module_launch(oar_stream stream, oar_function function, const oar_launch_config* config,
                     const oar_kernel_arg* args, size_t num_args);

#endif /* OAR_CUDA_ENTRIES_H_ */

/* The entry points of the function table (plugin.cpp fills it), one
 * group per file (see device_api.h for what each does; the groups' prototypes
 * are common/include/oar_entry_decls.h). */
#ifndef OAR_CUDA_ENTRIES_H_
#define OAR_CUDA_ENTRIES_H_

#include "oar/device_api.h"
#include "oar_entry_decls.h"

/* device.cpp (device_synchronize is stream.cpp's: it drains the streams) */
oar_status cu_init(void);
oar_status cu_finalize(void);
const char* cu_get_last_error_message(void);
oar_status cu_device_count(int32_t* count);
oar_status cu_set_device(int32_t device);
oar_status cu_get_device(int32_t* device);
oar_status cu_device_get_properties(int32_t device, oar_device_properties* props);
oar_status cu_device_memory_info(int32_t device, size_t* free_bytes, size_t* total_bytes);

/* memory.cpp */
OAR_DECLARE_MEMORY_ENTRIES(cu);
OAR_DECLARE_HOST_MEMORY_ENTRIES(cu);

/* stream.cpp */
oar_status cu_device_synchronize(int32_t device);
OAR_DECLARE_STREAM_ENTRIES(cu);

/* event.cpp */
OAR_DECLARE_EVENT_ENTRIES(cu);

/* kernels.cpp */
OAR_DECLARE_KERNEL_ENTRIES(cu);

/* module.cpp */
OAR_DECLARE_MODULE_ENTRIES(cu);
oar_status cu_module_launch(oar_stream stream, oar_function function, const oar_launch_config* config,
                            const oar_kernel_arg* args, size_t num_args);

#endif /* OAR_CUDA_ENTRIES_H_ */

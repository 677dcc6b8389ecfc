/* Element types of library kernels and the float16/bfloat16 conversions. */
#ifndef OAR_REFCPU_DTYPE_H_
#define OAR_REFCPU_DTYPE_H_

#include <oar/device_api.h>

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef enum refcpu_dtype {
  DTYPE_F32,
  DTYPE_F64,
  DTYPE_F16,
  DTYPE_BF16,
  DTYPE_I8,
  DTYPE_I16,
  DTYPE_I32,
  DTYPE_I64,
  DTYPE_U8,
  DTYPE_U16,
  DTYPE_U32,
  DTYPE_U64,
  DTYPE_BOOL,
  DTYPE_COUNT
} refcpu_dtype;

/* False for lanes != 1 or a code/bits pair the plugin does not know. */
bool dtype_from_dl(oar_dl_data_type dl, uint8_t* dtype);
/* The DLPack dtype of a valid id (lanes 1). */
oar_dl_data_type dtype_to_dl(uint8_t dtype);
const char* dtype_name(uint8_t dtype);
int dtype_size(uint8_t dtype);
bool dtype_is_floating(uint8_t dtype);
/* The dtypes cast and fill convert between. */
bool dtype_is_castable(uint8_t dtype);

/* Round to nearest even; NaN stays NaN (quiet), overflow becomes Inf. */
uint16_t dtype_double_to_half(double value);
uint16_t dtype_double_to_bfloat16(double value);
float dtype_half_to_float(uint16_t bits);

static inline float dtype_bfloat16_to_float(uint16_t bits) {
  uint32_t widened = (uint32_t)bits << 16;
  float value;
  memcpy(&value, &widened, sizeof value);
  return value;
}

#endif /* OAR_REFCPU_DTYPE_H_ */

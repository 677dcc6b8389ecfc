/* Element types and exact float16/bfloat16 rounding. */
#include "dtype.h"

typedef struct dtype_info {
  const char* name;
  uint8_t code;
  uint8_t bits;
  bool floating;
  bool castable;
} dtype_info;

static const dtype_info infos[DTYPE_COUNT] = {
    [DTYPE_F32] = {"float32", OAR_DL_FLOAT, 32, true, true},
    [DTYPE_F64] = {"float64", OAR_DL_FLOAT, 64, true, true},
    [DTYPE_F16] = {"float16", OAR_DL_FLOAT, 16, true, true},
    [DTYPE_BF16] = {"bfloat16", OAR_DL_BFLOAT, 16, true, true},
    [DTYPE_I8] = {"int8", OAR_DL_INT, 8, false, true},
    [DTYPE_I16] = {"int16", OAR_DL_INT, 16, false, false},
    [DTYPE_I32] = {"int32", OAR_DL_INT, 32, false, true},
    [DTYPE_I64] = {"int64", OAR_DL_INT, 64, false, true},
    [DTYPE_U8] = {"uint8", OAR_DL_UINT, 8, false, false},
    [DTYPE_U16] = {"uint16", OAR_DL_UINT, 16, false, false},
    [DTYPE_U32] = {"uint32", OAR_DL_UINT, 32, false, false},
    [DTYPE_U64] = {"uint64", OAR_DL_UINT, 64, false, false},
    [DTYPE_BOOL] = {"bool", OAR_DL_BOOL, 8, false, true},
};

bool dtype_from_dl(oar_dl_data_type dl, uint8_t* dtype) {
  if (dl.lanes != 1) return false;
  for (uint8_t i = 0; i < DTYPE_COUNT; i++) {
    if (infos[i].code == dl.code && infos[i].bits == dl.bits) {
      *dtype = i;
      return true;
    }
  }
  return false;
}

oar_dl_data_type dtype_to_dl(uint8_t dtype) { return (oar_dl_data_type){infos[dtype].code, infos[dtype].bits, 1}; }

const char* dtype_name(uint8_t dtype) { return dtype < DTYPE_COUNT ? infos[dtype].name : "?"; }
int dtype_size(uint8_t dtype) { return infos[dtype].bits / 8; }
bool dtype_is_floating(uint8_t dtype) { return infos[dtype].floating; }
bool dtype_is_castable(uint8_t dtype) { return infos[dtype].castable; }

/* Rounds a double to a binary float of exponent_bits/mantissa_bits (binary16
   or bfloat16) with one rounding step, ties to even. */
static uint16_t round_double(double value, int exponent_bits, int mantissa_bits) {
  uint64_t bits;
  memcpy(&bits, &value, sizeof bits);
  uint16_t sign = (uint16_t)((bits >> 63) << (exponent_bits + mantissa_bits));
  int32_t exponent = (int32_t)((bits >> 52) & 0x7ff);
  uint64_t mantissa = bits & ((UINT64_C(1) << 52) - 1);
  uint16_t exponent_all_ones = (uint16_t)(((1u << exponent_bits) - 1) << mantissa_bits);
  if (exponent == 0x7ff) {
    if (mantissa == 0) return sign | exponent_all_ones;
    uint16_t payload = (uint16_t)(mantissa >> (52 - mantissa_bits));
    return sign | exponent_all_ones | (uint16_t)(1u << (mantissa_bits - 1)) | payload;
  }
  if (exponent == 0) return sign; /* double subnormals are far below the target's */
  int32_t bias = (1 << (exponent_bits - 1)) - 1;
  int32_t target_exponent = exponent - 1023 + bias;
  uint64_t significand = mantissa | (UINT64_C(1) << 52);
  int shift = 52 - mantissa_bits + (target_exponent < 1 ? 1 - target_exponent : 0);
  if (shift > 63) return sign;
  uint64_t quotient = significand >> shift;
  uint64_t remainder = significand & ((UINT64_C(1) << shift) - 1);
  uint64_t half = UINT64_C(1) << (shift - 1);
  if (remainder > half || (remainder == half && (quotient & 1))) quotient++;
  if (target_exponent < 1) return sign | (uint16_t)quotient; /* carry makes the smallest normal */
  if (quotient == (UINT64_C(1) << (mantissa_bits + 1))) {
    quotient >>= 1;
    target_exponent++;
  }
  if (target_exponent >= (1 << exponent_bits) - 1) return sign | exponent_all_ones;
  return sign | (uint16_t)((uint32_t)target_exponent << mantissa_bits) |
         (uint16_t)(quotient & ((UINT64_C(1) << mantissa_bits) - 1));
}

uint16_t dtype_double_to_half(double value) { return round_double(value, 5, 10); }
uint16_t dtype_double_to_bfloat16(double value) { return round_double(value, 8, 7); }

float dtype_half_to_float(uint16_t half) {
  uint32_t sign = (uint32_t)(half & 0x8000) << 16;
  uint32_t exponent = (half >> 10) & 0x1f;
  uint32_t mantissa = half & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    /* Subnormal half: normalize into a float. */
    int shift = 0;
    while (!(mantissa & 0x400)) {
      mantissa <<= 1;
      shift++;
    }
    mantissa &= 0x3ff;
    bits = sign | ((uint32_t)(113 - shift) << 23) | (mantissa << 13);
  }
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

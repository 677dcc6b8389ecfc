/* oar/plugin_support.h group 7: dtype promotion. */
#include "oar/plugin_support.h"

int oar_ps_promote_rank(oar_dl_data_type dtype) {
  if (dtype.lanes != 1) return -1;
  switch (dtype.code) {
    case OAR_DL_BOOL: return dtype.bits == 8 ? 0 : -1;
    case OAR_DL_UINT:
      if (dtype.bits == 8) return 1;
      return dtype.bits == 16 || dtype.bits == 32 || dtype.bits == 64 ? 5 : -1; /* beside int64 */
    case OAR_DL_INT:
      switch (dtype.bits) {
        case 8: return 2;
        case 16: return 3;
        case 32: return 4;
        case 64: return 5;
        default: return -1;
      }
    case OAR_DL_BFLOAT: return dtype.bits == 16 ? 6 : -1;
    case OAR_DL_FLOAT:
      switch (dtype.bits) {
        case 16: return 6;
        case 32: return 7;
        case 64: return 8;
        default: return -1;
      }
    default: return -1;
  }
}

static bool same_dtype(oar_dl_data_type a, oar_dl_data_type b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

bool oar_ps_promote(oar_dl_data_type a, oar_dl_data_type b, oar_dl_data_type* out) {
  int rank_a = oar_ps_promote_rank(a), rank_b = oar_ps_promote_rank(b);
  if (rank_a < 0 || rank_b < 0) return false;
  if (same_dtype(a, b)) {
    *out = a;
  } else if (rank_a == 6 && rank_b == 6) { /* float16 with bfloat16: neither holds the other */
    *out = (oar_dl_data_type){OAR_DL_FLOAT, 32, 1};
  } else {
    *out = rank_a >= rank_b ? a : b;
  }
  return true;
}

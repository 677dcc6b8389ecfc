/* oar/plugin_support.h group 7: dtype promotion and the ops' dtype rules. */
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

static bool is_floating(oar_dl_data_type dtype) {
  return dtype.code == OAR_DL_FLOAT || dtype.code == OAR_DL_BFLOAT;
}

static bool is_dtype(oar_dl_data_type dtype, uint8_t code, uint8_t bits) {
  return dtype.code == code && dtype.bits == bits && dtype.lanes == 1;
}

/* The data inputs' first dtype and their promotion; false if none, or one has no rank. */
static bool data_dtypes(const oar_ps_dtype_rule* rule, const oar_dl_data_type* dtypes, uint32_t num_inputs,
                        oar_dl_data_type* first, oar_dl_data_type* promoted) {
  bool have_data = false;
  for (uint32_t i = 0; i < num_inputs; i++) {
    if (rule->input_roles[i] != OAR_PS_ROLE_DATA) continue;
    if (!have_data) {
      *first = *promoted = dtypes[i];
      if (oar_ps_promote_rank(dtypes[i]) < 0) return false;
    } else if (!oar_ps_promote(*promoted, dtypes[i], promoted)) {
      return false;
    }
    have_data = true;
  }
  return have_data;
}

bool oar_ps_expected_out_dtype(const oar_ps_dtype_rule* rule, const oar_dl_data_type* dtypes, uint32_t num_inputs,
                               oar_dl_data_type* out) {
  if (rule->out == OAR_PS_OUT_FIXED) {
    *out = rule->out_fixed;
    return true;
  }
  oar_dl_data_type first, promoted;
  if (rule->out == OAR_PS_OUT_ATTR || !data_dtypes(rule, dtypes, num_inputs, &first, &promoted)) return false;
  switch (rule->out) {
    case OAR_PS_OUT_SAME: *out = first; return true;
    case OAR_PS_OUT_PROMOTE: *out = promoted; return true;
    case OAR_PS_OUT_FLOAT:
      *out = is_floating(promoted) ? promoted : (oar_dl_data_type){OAR_DL_FLOAT, 32, 1};
      return true;
    case OAR_PS_OUT_ACCUMULATE:
      *out = is_floating(first) ? first : (oar_dl_data_type){OAR_DL_INT, 64, 1};
      return true;
    default: return false;
  }
}

static bool role_allows(uint8_t role, oar_dl_data_type dtype) {
  switch (role) {
    case OAR_PS_ROLE_INDEX: return is_dtype(dtype, OAR_DL_INT, 32) || is_dtype(dtype, OAR_DL_INT, 64);
    case OAR_PS_ROLE_CONDITION: return is_dtype(dtype, OAR_DL_BOOL, 8);
    case OAR_PS_ROLE_QUANTIZED: return is_dtype(dtype, OAR_DL_INT, 8) || is_dtype(dtype, OAR_DL_UINT, 8);
    default: return false;
  }
}

bool oar_ps_dtypes_allowed(const oar_ps_dtype_rule* rule, const oar_dl_data_type* dtypes, uint32_t num_inputs,
                           uint32_t num_outputs, oar_ps_dtype_test listed, oar_ps_dtype_test castable,
                           const void* context) {
  const oar_dl_data_type* first_data = NULL;
  for (uint32_t i = 0; i < num_inputs; i++) {
    if (rule->input_roles[i] != OAR_PS_ROLE_DATA) {
      if (!role_allows(rule->input_roles[i], dtypes[i])) return false;
      continue;
    }
    if (!listed || !listed(context, dtypes[i])) return false;
    if (first_data && !rule->promotes && !same_dtype(*first_data, dtypes[i])) return false;
    if (!first_data) first_data = &dtypes[i];
  }
  oar_dl_data_type expected;
  bool single = oar_ps_expected_out_dtype(rule, dtypes, num_inputs, &expected);
  for (uint32_t o = 0; o < num_outputs; o++) {
    oar_dl_data_type out = dtypes[num_inputs + o];
    if (single) {
      bool int32_kept = rule->out == OAR_PS_OUT_ACCUMULATE && is_dtype(*first_data, OAR_DL_INT, 32) &&
                        is_dtype(out, OAR_DL_INT, 32);
      if (!same_dtype(out, expected) && !int32_kept) return false;
    } else if (rule->out == OAR_PS_OUT_ATTR) {
      if (!castable || !castable(context, out)) return false;
    } else if (rule->out != OAR_PS_OUT_SAME || first_data || !listed || !listed(context, out)) {
      return false; /* only same with no data input leaves the choice to the op's dtypes */
    }
  }
  return true;
}

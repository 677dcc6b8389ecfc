/* oar/plugin_support.h group 3: kernel_launch's attributes against their declarations. */
#include "oar/plugin_support.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const char* oar_ps_attr_type_name(int32_t type) {
  switch (type) {
    case OAR_ATTR_INT: return "OAR_ATTR_INT";
    case OAR_ATTR_FLOAT: return "OAR_ATTR_FLOAT";
    case OAR_ATTR_BOOL: return "OAR_ATTR_BOOL";
    case OAR_ATTR_INTS: return "OAR_ATTR_INTS";
    case OAR_ATTR_FLOATS: return "OAR_ATTR_FLOATS";
    case OAR_ATTR_STRING: return "OAR_ATTR_STRING";
    case OAR_ATTR_DTYPE: return "OAR_ATTR_DTYPE";
    default: return "an unknown type";
  }
}

void oar_ps_attr_default(const oar_ps_attr_def* def, oar_ps_attr* value) {
  memset(value, 0, sizeof *value);
  value->type = def->type;
  value->i = def->default_int;
  value->f = def->default_float;
  if (def->type == OAR_ATTR_INTS || def->type == OAR_ATTR_FLOATS) {
    int32_t count = def->default_count < OAR_PS_ATTR_MAX_ITEMS ? def->default_count : OAR_PS_ATTR_MAX_ITEMS;
    value->count = count;
    for (int32_t k = 0; k < count; k++) {
      if (def->type == OAR_ATTR_INTS) value->v.ints[k] = def->default_ints[k];
      else value->v.floats[k] = def->default_floats[k];
    }
  } else if (def->type == OAR_ATTR_STRING && def->default_string) {
    snprintf(value->v.s, sizeof value->v.s, "%s", def->default_string);
    value->count = (int32_t)strlen(value->v.s);
  }
}

/* Checks one caller attribute against its declaration and stores it. */
static oar_status attr_take(const char* op, const oar_ps_attr_def* def, const oar_attr* attr,
                            oar_ps_attr* value, oar_ps_dtype_reader read_dtype) {
  const char* name = def->name;
  int32_t type = attr->type;
  bool ok = def->type == OAR_ATTR_FLOAT ? (type == OAR_ATTR_FLOAT || type == OAR_ATTR_INT) : type == def->type;
  if (!ok)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' must be %s%s, not %s", op,
                       name, oar_ps_attr_type_name(def->type),
                       def->type == OAR_ATTR_FLOAT ? " (or OAR_ATTR_INT)" : "", oar_ps_attr_type_name(type));
  value->given = true;
  switch (def->type) {
    case OAR_ATTR_INT:
      value->i = attr->value.i;
      value->f = (double)attr->value.i;
      break;
    case OAR_ATTR_BOOL:
      if (attr->value.i != 0 && attr->value.i != 1)
        return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "kernel_launch: %s: attribute '%s' (OAR_ATTR_BOOL) is %" PRId64 ", not 0 or 1", op, name,
                           attr->value.i);
      value->i = attr->value.i;
      break;
    case OAR_ATTR_FLOAT:
      if (type == OAR_ATTR_INT) {
        value->exact_int = true;
        value->i = attr->value.i;
        value->f = (double)attr->value.i;
      } else {
        value->f = attr->value.f;
      }
      break;
    case OAR_ATTR_INTS:
    case OAR_ATTR_FLOATS:
      if (attr->count < 0 || attr->count > OAR_PS_ATTR_MAX_ITEMS)
        return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "kernel_launch: %s: attribute '%s' has %" PRId64 " entries, not 0..%d", op, name,
                           attr->count, OAR_PS_ATTR_MAX_ITEMS);
      if (attr->count > 0 &&
          !(def->type == OAR_ATTR_INTS ? (const void*)attr->value.ints : (const void*)attr->value.floats))
        return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "kernel_launch: %s: attribute '%s' has %" PRId64 " entries but a NULL array", op, name,
                           attr->count);
      value->count = (int32_t)attr->count;
      for (int64_t k = 0; k < attr->count; k++) {
        if (def->type == OAR_ATTR_INTS) value->v.ints[k] = attr->value.ints[k];
        else value->v.floats[k] = attr->value.floats[k];
      }
      break;
    case OAR_ATTR_STRING: {
      if (!attr->value.s)
        return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' is a NULL string", op,
                           name);
      size_t length = 0;
      while (length < OAR_PS_ATTR_MAX_STRING && attr->value.s[length]) length++;
      if (length >= OAR_PS_ATTR_MAX_STRING)
        return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' is longer than %d bytes",
                           op, name, OAR_PS_ATTR_MAX_STRING - 1);
      value->count = (int32_t)length;
      memcpy(value->v.s, attr->value.s, length + 1);
      break;
    }
    case OAR_ATTR_DTYPE:
      if (!read_dtype || !read_dtype(attr->value.dtype, &value->dtype))
        return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "kernel_launch: %s: attribute '%s' is dtype {code %u, bits %u, lanes %u}, "
                           "which this plugin does not know",
                           op, name, attr->value.dtype.code, attr->value.dtype.bits, attr->value.dtype.lanes);
      break;
    default:
      return oar_ps_fail(OAR_ERROR_INTERNAL, "kernel_launch: %s: attribute '%s' has a bad declaration", op, name);
  }
  return OAR_SUCCESS;
}

int oar_ps_find_attr(const oar_ps_attr_def* defs, uint32_t num_defs, const char* name) {
  for (uint32_t a = 0; a < num_defs; a++)
    if (strcmp(defs[a].name, name) == 0) return (int)a;
  return -1;
}

oar_status oar_ps_parse_attrs(const char* op, const oar_ps_attr_def* defs, uint32_t num_defs,
                              const oar_attr* attrs, size_t num_attrs, oar_ps_attr* values,
                              oar_ps_dtype_reader read_dtype) {
  if (num_attrs && !attrs)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attrs is NULL", op);
  for (uint32_t a = 0; a < num_defs; a++) oar_ps_attr_default(&defs[a], &values[a]);
  for (size_t i = 0; i < num_attrs; i++) {
    const oar_attr* attr = &attrs[i];
    if (!attr->name)
      return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attrs[%zu].name is NULL", op, i);
    int a = oar_ps_find_attr(defs, num_defs, attr->name);
    if (a < 0) {
      char known[160] = "";
      for (uint32_t k = 0; k < num_defs; k++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", defs[k].name);
      return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: unknown attribute '%.64s' (%s%s)", op,
                         attr->name, num_defs ? "it takes: " : "it takes none", known);
    }
    if (values[a].given)
      return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' given twice", op,
                         defs[a].name);
    oar_status status = attr_take(op, &defs[a], attr, &values[a], read_dtype);
    if (status != OAR_SUCCESS) return status;
  }
  for (uint32_t a = 0; a < num_defs; a++)
    if (defs[a].required && !values[a].given)
      return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' (%s) is required", op,
                         defs[a].name, oar_ps_attr_type_name(defs[a].type));
  return OAR_SUCCESS;
}

oar_status oar_ps_attr_pair(const char* op, const char* name, const oar_ps_attr* value, int64_t minimum,
                            int64_t pair[2]) {
  int32_t count = value->type == OAR_ATTR_INTS ? value->count : 1;
  if (count != 1 && count != 2)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' needs 1 or 2 entries, got %d",
                       op, name, (int)count);
  for (int k = 0; k < 2; k++) {
    pair[k] = value->type == OAR_ATTR_INTS ? value->v.ints[count == 2 ? k : 0] : value->i;
    if (pair[k] < minimum || pair[k] > INT32_MAX)
      return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: %s: %s %" PRId64 " is out of range [%" PRId64 ", %d]", op, name, pair[k],
                         minimum, INT32_MAX);
  }
  return OAR_SUCCESS;
}

/*
 * oar/plugin_support.h -- the launch-time checks every Oar device plugin needs
 * ===========================================================================
 *
 * A small C99 library (liboar_plugin_support.a, sources beside this header in
 * Oar's sources: reference_backends/common/src/) that the reference plugins
 * (CPU, OpenCL, CUDA) and the project `oar new-backend` generates link
 * statically. It holds what is the same for every device: the thread-local
 * last-error message and the host's log sink, the checks of kernel_launch's
 * attributes against the op's declaration in ops.yaml (defaults filled in),
 * the checks of an oar_dl_tensor descriptor (shape, strides, overflow,
 * alignment), dim normalisation and conv2d / pool geometry. Nothing here
 * touches device memory or a driver.
 *
 * Conventions
 * -----------
 * - Every function returning oar_status returns OAR_SUCCESS, or a failure
 *   after writing the calling thread's message with oar_ps_fail; the message
 *   starts "kernel_launch: <op>: " where an op is named, so a plugin can
 *   return the status as is.
 * - Nothing allocates; nothing keeps a pointer it was given after it returns.
 * - Thread-safe: the only state is the thread-local message and the log sink.
 * - Build it with hidden visibility (the CMake target does): each plugin
 *   gets its own copy, so two plugins in one process never share a message.
 *
 * Groups: 1 errors, 2 log and clock, 3 attributes, 4 tensor descriptors,
 * 5 dims and shapes, 6 conv2d and pool geometry, 7 dtype promotion and the
 * ops' dtype rules.
 *
 * C99 and C++ compatible; depends on oar/device_api.h and the C standard
 * headers only.
 */
#ifndef OAR_PLUGIN_SUPPORT_H_
#define OAR_PLUGIN_SUPPORT_H_

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "oar/device_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define OAR_PS_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define OAR_PS_PRINTF(f, a)
#endif

/* Bytes of the thread's message (NUL included): longer text is cut. */
#define OAR_PS_MESSAGE_BYTES 2048
/* Dims of a tensor descriptor the checks accept. */
#define OAR_PS_MAX_DIMS 8
/* Entries of an ints / floats attribute, bytes of a string attribute (NUL
   included): what ops.yaml's attrs need. */
#define OAR_PS_ATTR_MAX_ITEMS 8
#define OAR_PS_ATTR_MAX_STRING 32

/* ======================================================================== */
/* 1. Errors: the thread-local message of get_last_error_message            */
/* ======================================================================== */

/* oar_ps_fail: format the calling thread's message (printf rules) and
 * return status unchanged, so `return oar_ps_fail(OAR_ERROR_..., ...)`
 * reports and fails in one statement. */
oar_status oar_ps_fail(oar_status status, const char* format, ...) OAR_PS_PRINTF(2, 3);
/* oar_ps_vfail: oar_ps_fail with a va_list (for a plugin's own wrapper). */
oar_status oar_ps_vfail(oar_status status, const char* format, va_list args);
/* oar_ps_set_message: set the thread's message to message (NULL: empty). */
void oar_ps_set_message(const char* message);
/* oar_ps_last_error_message: the thread's message; never NULL, "" before any
 * failure. Valid until the thread's next oar_ps_fail. A plugin's
 * get_last_error_message entry may return it directly. */
const char* oar_ps_last_error_message(void);

/* ======================================================================== */
/* 2. Log and clock                                                          */
/* ======================================================================== */

/* The host's sink (oar_plugin_params.log): level is OAR_LOG_*. */
typedef void (*oar_ps_log_sink)(void* user_data, int32_t level, const char* message);
/* oar_ps_set_log_sink: where oar_ps_log goes (NULL: nowhere). Safe against
 * concurrent oar_ps_log. */
void oar_ps_set_log_sink(oar_ps_log_sink sink, void* user_data);
/* oar_ps_log: format (printf rules, cut at OAR_PS_MESSAGE_BYTES) and hand to
 * the sink; nothing when there is none. */
void oar_ps_log(int32_t level, const char* format, ...) OAR_PS_PRINTF(2, 3);
/* oar_ps_now_ns: CLOCK_MONOTONIC in nanoseconds (the profiler's clock). */
int64_t oar_ps_now_ns(void);

/* ======================================================================== */
/* 3. Attributes of kernel_launch                                           */
/* ======================================================================== */

/* One attribute of an op as ops.yaml declares it (the rows of a generated op
   table): its OAR_ATTR_* type and, unless required, its default. */
typedef struct oar_ps_attr_def {
  const char* name;
  int32_t type; /* OAR_ATTR_* */
  bool required;
  int64_t default_int; /* int, bool */
  double default_float;
  int32_t default_count; /* entries of default_ints / default_floats */
  const int64_t* default_ints;
  const double* default_floats;
  const char* default_string;
} oar_ps_attr_def;

/* One attribute of a launch as a kernel reads it: the caller's value
   (checked against its declaration) or the default, copied so that it
   outlives the kernel_launch call (queued work may read it later). */
typedef struct oar_ps_attr {
  int32_t type;   /* OAR_ATTR_* as declared */
  bool given;     /* passed by the caller; false: the default */
  bool exact_int; /* a float attribute passed as OAR_ATTR_INT: i holds it exactly */
  int32_t count;  /* entries of ints / floats; bytes of s without the NUL */
  int64_t i;      /* int, bool (0 or 1), exact_int float */
  double f;       /* float (also set for an int) */
  uint8_t dtype;  /* dtype: the plugin's own dtype id (see oar_ps_dtype_reader) */
  union {
    int64_t ints[OAR_PS_ATTR_MAX_ITEMS];
    double floats[OAR_PS_ATTR_MAX_ITEMS];
    char s[OAR_PS_ATTR_MAX_STRING];
  } v;
} oar_ps_attr;

/* The plugin's reading of a dtype attribute: true and *id for a dtype it can
   produce, false for any other (the launch is then refused). */
typedef bool (*oar_ps_dtype_reader)(oar_dl_data_type dtype, uint8_t* id);

/* oar_ps_attr_type_name: "OAR_ATTR_INT" ... for a type tag, "an unknown
 * type" for anything else. Never NULL. */
const char* oar_ps_attr_type_name(int32_t type);

/* oar_ps_attr_default: *value = def's default (given false). */
void oar_ps_attr_default(const oar_ps_attr_def* def, oar_ps_attr* value);

/* oar_ps_parse_attrs: read a launch's attrs into values[0 .. num_defs) in the
 * declared order: each caller attribute is matched by name and checked
 * against its declaration, the others get their default.
 * Accepted: the declared type; OAR_ATTR_INT for a float attribute (exact_int
 * set). Refused (OAR_ERROR_INVALID_ARGUMENT, the message names the op and
 * the attribute): attrs NULL with num_attrs > 0, a NULL name, an unknown
 * name (the message lists the known ones), a name given twice, another type,
 * a bool not 0 or 1, more than OAR_PS_ATTR_MAX_ITEMS entries or a NULL array,
 * a NULL string or one of OAR_PS_ATTR_MAX_STRING bytes or more, a dtype
 * read_dtype refuses (read_dtype NULL: every dtype is refused), a missing
 * required attribute. OAR_ERROR_INTERNAL for a declaration of unknown type. */
oar_status oar_ps_parse_attrs(const char* op, const oar_ps_attr_def* defs, uint32_t num_defs,
                              const oar_attr* attrs, size_t num_attrs, oar_ps_attr* values,
                              oar_ps_dtype_reader read_dtype);

/* oar_ps_find_attr: the index of the declaration named name, -1 if none. */
int oar_ps_find_attr(const oar_ps_attr_def* defs, uint32_t num_defs, const char* name);

/* oar_ps_attr_pair: an ints attribute of 1 or 2 entries as a (height, width)
 * pair (one entry: both), each in [minimum, INT32_MAX]; else
 * OAR_ERROR_INVALID_ARGUMENT naming op and name. */
oar_status oar_ps_attr_pair(const char* op, const char* name, const oar_ps_attr* value, int64_t minimum,
                            int64_t pair[2]);

/* ======================================================================== */
/* 4. Tensor descriptors                                                     */
/* ======================================================================== */

/* A descriptor after its checks: strides filled in (compact row-major when
   the descriptor's are NULL), the element count and the bytes from the first
   element to one past the farthest. */
typedef struct oar_ps_layout {
  int32_t ndim;
  int32_t elem_size;
  int64_t shape[OAR_PS_MAX_DIMS];
  int64_t strides[OAR_PS_MAX_DIMS]; /* elements; 0 for a broadcast dim */
  int64_t numel;
  uint64_t extent_bytes; /* 0 when numel is 0 */
  void* start;           /* data + byte_offset; NULL when numel is 0 */
} oar_ps_layout;

/* oar_ps_check_descriptor: check tensor (role: "input 'x'", "out", ... for
 * the message) as kernel_launch's rules require, for elements of elem_size
 * bytes, and fill *layout. The dtype is the plugin's to check (its dtypes
 * are its own). Refused (OAR_ERROR_INVALID_ARGUMENT): ndim outside
 * 0..OAR_PS_MAX_DIMS, a NULL shape with ndim > 0, a negative size or stride,
 * a shape/strides whose element count or byte extent overflows (numel above
 * INT64_MAX / 2), and, when it has elements, NULL data or data + byte_offset
 * not a multiple of elem_size. A tensor with no elements passes whatever its
 * data (the ABI never touches it). Whether start .. start + extent_bytes lies
 * in a live allocation of the stream's device is the plugin's check. */
oar_status oar_ps_check_descriptor(const char* op, const char* role, const oar_dl_tensor* tensor,
                                   int32_t elem_size, oar_ps_layout* layout);

/* ======================================================================== */
/* 5. Dims and shapes                                                        */
/* ======================================================================== */

/* oar_ps_normalize_dim: dim of a tensor of ndim dims (negative: from the end;
 * a 0-d tensor takes 0 and -1) into *out in [0, max(ndim, 1)); else
 * OAR_ERROR_INVALID_ARGUMENT naming op, attr and the range. */
oar_status oar_ps_normalize_dim(const char* op, const char* attr, int64_t dim, int32_t ndim, int32_t* out);

/* oar_ps_collapse_dims: fewer dims that walk num_tensors tensors of one shape
 * in the same row-major order, in place over shape[0 .. ndim) and each
 * tensor's strides[t][0 .. ndim) (any unit: elements or bytes; 0 for a
 * broadcast dim). Dims of size 1 are dropped, and a dim merges into the kept
 * dim before it when every tensor steps evenly across both
 * (strides[t][before] == strides[t][d] * shape[d]). Returns the new ndim,
 * at least 1: a shape with a 0 becomes {0}, a 0-d or all-ones one {1}, each
 * with strides 0. Any ndim >= 0 (not bounded by OAR_PS_MAX_DIMS). */
int32_t oar_ps_collapse_dims(int32_t ndim, int64_t* shape, int32_t num_tensors, int64_t* const* strides);

/* oar_ps_format_shape: "[2, 3]" into text (cut to bytes, always terminated). */
void oar_ps_format_shape(char* text, size_t bytes, int32_t ndim, const int64_t* shape);

/* oar_ps_same_shape: equal ndim and sizes. */
bool oar_ps_same_shape(int32_t ndim_a, const int64_t* shape_a, int32_t ndim_b, const int64_t* shape_b);

/* oar_ps_shape_mismatch: OAR_ERROR_INVALID_ARGUMENT "kernel_launch: <op>:
 * <role> shape [..] differs from <other_role> shape [..]". */
oar_status oar_ps_shape_mismatch(const char* op, const char* role, int32_t ndim, const int64_t* shape,
                                 const char* other_role, int32_t other_ndim, const int64_t* other_shape);

/* ======================================================================== */
/* 6. conv2d and pool geometry                                               */
/* ======================================================================== */

/* The geometry of a 2-D convolution (NCHW) or pooling window. */
typedef struct oar_ps_conv2d {
  int64_t batch, in_c, in_h, in_w;
  int64_t out_c, k_h, k_w;   /* pool: out_c = in_c */
  int64_t groups, group_in, group_out;
  int64_t stride[2], padding[2], dilation[2]; /* (h, w) */
  int64_t out_h, out_w;
} oar_ps_conv2d;

/* oar_ps_conv2d_geometry: from x [N, C, H, W], weight [O, C / groups, kH, kW]
 * and the attrs stride, padding, dilation (ints of 1 or 2 entries) and
 * groups (int). Refused (OAR_ERROR_INVALID_ARGUMENT, naming op): a pair out
 * of range (stride, dilation >= 1; padding >= 0), groups < 1 or not dividing
 * both channel counts, weight's channels not C / groups, a kernel below 1x1,
 * a dilated kernel larger than the padded input. */
oar_status oar_ps_conv2d_geometry(const char* op, const int64_t x_shape[4], const int64_t w_shape[4],
                                  const oar_ps_attr* stride, const oar_ps_attr* padding,
                                  const oar_ps_attr* dilation, const oar_ps_attr* groups, oar_ps_conv2d* g);

/* The geometry of a 2-D pooling window over x [N, C, H, W] (or [C, H, W]). */
typedef struct oar_ps_pool2d {
  int64_t planes, channels, in_h, in_w; /* planes: N * C (C for 3-D x) */
  int64_t kernel[2], stride[2], padding[2]; /* (h, w) */
  int64_t out_h, out_w;
} oar_ps_pool2d;

/* oar_ps_pool2d_geometry: from x's ndim and shape and the ints attrs
 * kernel_size (1 or 2 entries), stride (0 to 2; none: kernel_size) and
 * padding (1 or 2), each as (count, entries). Refused
 * (OAR_ERROR_INVALID_ARGUMENT, naming op): x not 3-D or 4-D, an entry count
 * out of range, a kernel or stride below 1, a negative padding, any of them
 * above INT32_MAX, a window larger than the padded input. */
oar_status oar_ps_pool2d_geometry(const char* op, int32_t ndim, const int64_t* shape, int32_t kernel_count,
                                  const int64_t* kernel, int32_t stride_count, const int64_t* stride,
                                  int32_t padding_count, const int64_t* padding, oar_ps_pool2d* g);

/* ======================================================================== */
/* 7. dtype promotion and the ops' dtype rules                               */
/* ======================================================================== */

/* oar_ps_promote_rank: dtype's place in the order of ops.yaml's "promote"
 * rule: bool < uint8 < int8 < int16 < int32 < int64 (uint16, uint32, uint64
 * beside it) < float16 = bfloat16 < float32 < float64; -1 for a dtype
 * outside it (lanes != 1, another code or width). */
int oar_ps_promote_rank(oar_dl_data_type dtype);

/* oar_ps_promote: the dtype a and b promote to: the higher rank (a on a
 * tie), float32 for float16 with bfloat16. False (out untouched) if either
 * has no rank. */
bool oar_ps_promote(oar_dl_data_type a, oar_dl_data_type b, oar_dl_data_type* out);

/* What an input of an op is, for its dtype (ops.yaml's input role). */
typedef enum oar_ps_input_role {
  OAR_PS_ROLE_DATA,      /* one of the op's dtypes */
  OAR_PS_ROLE_INDEX,     /* int32 or int64 */
  OAR_PS_ROLE_CONDITION, /* bool */
  OAR_PS_ROLE_QUANTIZED  /* int8 or uint8 low-bit codes */
} oar_ps_input_role;

/* How an op's output dtype follows from its data inputs (ops.yaml's out_dtype). */
typedef enum oar_ps_out_rule {
  OAR_PS_OUT_SAME,      /* "same": the first data input's; with no data input (creation
                           ops), any of the op's dtypes */
  OAR_PS_OUT_PROMOTE,   /* "promote": the data inputs promoted (oar_ps_promote) */
  OAR_PS_OUT_FLOAT,     /* "float": promoted, float32 where that is integral or bool */
  OAR_PS_OUT_FIXED,     /* a dtype name: that dtype, whatever the inputs */
  OAR_PS_OUT_ATTR,      /* "attr": the op's dtype attribute, any dtype the plugin casts to */
  OAR_PS_OUT_ACCUMULATE /* "accumulate": a floating first data input's dtype, int64 for an
                           integer or bool one (int32 may also stay int32) */
} oar_ps_out_rule;

/* One op's dtype rule, as ops.yaml declares it. */
typedef struct oar_ps_dtype_rule {
  const uint8_t* input_roles; /* oar_ps_input_role of each input (at least num_inputs) */
  bool promotes;              /* data inputs may differ and promote (elementwise binary and
                                 ternary ops); otherwise they share the first one's dtype */
  oar_ps_out_rule out;
  oar_dl_data_type out_fixed; /* OAR_PS_OUT_FIXED's dtype; ignored by the other rules */
} oar_ps_dtype_rule;

/* A set of dtypes that is the plugin's to say (the op's dtypes it lists, those it
   casts to): true for a member. context is the caller's, passed through. */
typedef bool (*oar_ps_dtype_test)(const void* context, oar_dl_data_type dtype);

/* oar_ps_dtypes_allowed: whether kernel_query's dtypes (num_inputs inputs, then
 * num_outputs outputs) follow rule: an index, condition or quantized input has
 * its role's dtype; a data input is listed and, unless rule->promotes, the first
 * data input's dtype; each output is the one dtype rule->out gives for the data
 * inputs, or, where it leaves the choice to the plugin, listed (same with no
 * data input) or castable (attr). False for anything else: a rule that needs a
 * data input and has none, a data dtype outside the promotion order, a NULL
 * listed or castable the rule would ask. */
bool oar_ps_dtypes_allowed(const oar_ps_dtype_rule* rule, const oar_dl_data_type* dtypes, uint32_t num_inputs,
                           uint32_t num_outputs, oar_ps_dtype_test listed, oar_ps_dtype_test castable,
                           const void* context);

/* oar_ps_expected_out_dtype: the one output dtype rule->out gives for the data
 * inputs among dtypes[0 .. num_inputs) into *out (for a message); false where
 * it gives none (attr, same with no data input: the plugin's choice; a rule
 * that needs a data input and has none; a dtype outside the promotion order). */
bool oar_ps_expected_out_dtype(const oar_ps_dtype_rule* rule, const oar_dl_data_type* dtypes, uint32_t num_inputs,
                               oar_dl_data_type* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OAR_PLUGIN_SUPPORT_H_ */

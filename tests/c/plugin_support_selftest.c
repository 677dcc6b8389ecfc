/* The plugin support library (reference_backends/common, oar/plugin_support.h) on its own:
 * each group's contract, the refusals with the message they promise, and the thread-local
 * message. Built and run by tests/test_plugin_support.py (plain and, where the compiler has it,
 * under ASan + UBSan). */
#include <oar/plugin_support.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures, checks;
#define CHECK(cond, ...)                                          \
  do {                                                            \
    checks++;                                                     \
    if (!(cond)) {                                                \
      failures++;                                                 \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, " [message: %s]\n", oar_ps_last_error_message()); \
    }                                                             \
  } while (0)
#define HAS(text) (strstr(oar_ps_last_error_message(), text) != NULL)

static bool read_float_only(oar_dl_data_type dl, uint8_t* id) {
  if (dl.code != OAR_DL_FLOAT || dl.lanes != 1) return false;
  *id = (uint8_t)dl.bits;
  return true;
}

static void* other_thread(void* arg) {
  (void)arg;
  return (void*)(uintptr_t)(oar_ps_last_error_message()[0] == '\0');
}

static void test_errors(void) {
  CHECK(oar_ps_fail(OAR_ERROR_INVALID_HANDLE, "x %d", 7) == OAR_ERROR_INVALID_HANDLE, "fail returns its status");
  CHECK(strcmp(oar_ps_last_error_message(), "x 7") == 0, "the message is formatted");
  pthread_t thread;
  void* empty = NULL;
  pthread_create(&thread, NULL, other_thread, NULL);
  pthread_join(thread, &empty);
  CHECK(empty != NULL, "another thread sees its own, empty message");
  oar_ps_set_message(NULL);
  CHECK(oar_ps_last_error_message()[0] == '\0', "set_message(NULL) empties it");
  char long_text[OAR_PS_MESSAGE_BYTES * 2];
  memset(long_text, 'a', sizeof long_text - 1);
  long_text[sizeof long_text - 1] = '\0';
  oar_ps_set_message(long_text);
  CHECK(strlen(oar_ps_last_error_message()) == OAR_PS_MESSAGE_BYTES - 1, "a long message is cut");
}

static int logged_level;
static char logged[64];
static void sink(void* user_data, int32_t level, const char* message) {
  logged_level = level + *(int*)user_data;
  snprintf(logged, sizeof logged, "%s", message);
}

static void test_log(void) {
  oar_ps_log(OAR_LOG_ERROR, "dropped");  /* no sink: nothing */
  int offset = 100;
  oar_ps_set_log_sink(sink, &offset);
  oar_ps_log(OAR_LOG_WARNING, "w %s", "1");
  CHECK(logged_level == OAR_LOG_WARNING + 100 && strcmp(logged, "w 1") == 0, "the sink gets level, text, user data");
  oar_ps_set_log_sink(NULL, NULL);
  int64_t a = oar_ps_now_ns(), b = oar_ps_now_ns();
  CHECK(a > 0 && b >= a, "the clock is monotonic");
}

static const int64_t default_stride[] = {1};
static const oar_ps_attr_def defs[] = {
    {.name = "dim", .type = OAR_ATTR_INTS, .default_count = 0},
    {.name = "keepdim", .type = OAR_ATTR_BOOL, .default_int = 0},
    {.name = "alpha", .type = OAR_ATTR_FLOAT, .default_float = 1.5},
    {.name = "stride", .type = OAR_ATTR_INTS, .default_count = 1, .default_ints = default_stride},
    {.name = "mode", .type = OAR_ATTR_STRING, .default_string = "mean"},
    {.name = "dtype", .type = OAR_ATTR_DTYPE, .required = true},
};
#define NUM_DEFS (uint32_t)(sizeof defs / sizeof defs[0])

static oar_status parse(const oar_attr* attrs, size_t n, oar_ps_attr* values) {
  return oar_ps_parse_attrs("op", defs, NUM_DEFS, attrs, n, values, read_float_only);
}

static void test_attrs(void) {
  oar_ps_attr values[NUM_DEFS];
  int64_t dims[] = {0, -1};
  oar_attr attrs[] = {
      {.name = "dtype", .type = OAR_ATTR_DTYPE, .value.dtype = {OAR_DL_FLOAT, 64, 1}},
      {.name = "dim", .type = OAR_ATTR_INTS, .count = 2, .value.ints = dims},
      {.name = "alpha", .type = OAR_ATTR_INT, .value.i = 3},
  };
  CHECK(parse(attrs, 3, values) == OAR_SUCCESS, "a good launch's attrs parse");
  CHECK(values[0].given && values[0].count == 2 && values[0].v.ints[1] == -1, "ints copied");
  CHECK(!values[1].given && values[1].i == 0, "bool default");
  CHECK(values[2].exact_int && values[2].f == 3.0 && values[2].i == 3, "an int for a float attr");
  CHECK(values[3].count == 1 && values[3].v.ints[0] == 1, "ints default");
  CHECK(strcmp(values[4].v.s, "mean") == 0 && values[4].count == 4, "string default");
  CHECK(values[5].dtype == 64, "the reader's dtype id");
  CHECK(oar_ps_find_attr(defs, NUM_DEFS, "mode") == 4 && oar_ps_find_attr(defs, NUM_DEFS, "nope") == -1, "find_attr");

  CHECK(parse(attrs + 1, 2, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("'dtype'") && HAS("is required"), "missing required");
  oar_attr unknown[] = {attrs[0], {.name = "bogus", .type = OAR_ATTR_INT}};
  CHECK(parse(unknown, 2, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("unknown attribute 'bogus'") && HAS("keepdim"),
        "unknown names the known ones");
  oar_attr twice[] = {attrs[0], attrs[0]};
  CHECK(parse(twice, 2, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("given twice"), "twice");
  oar_attr bad_bool[] = {attrs[0], {.name = "keepdim", .type = OAR_ATTR_BOOL, .value.i = 2}};
  CHECK(parse(bad_bool, 2, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("not 0 or 1"), "bool 2");
  oar_attr bad_type[] = {attrs[0], {.name = "keepdim", .type = OAR_ATTR_INT, .value.i = 1}};
  CHECK(parse(bad_type, 2, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("must be OAR_ATTR_BOOL, not OAR_ATTR_INT"),
        "wrong type");
  oar_attr null_array[] = {attrs[0], {.name = "dim", .type = OAR_ATTR_INTS, .count = 2, .value.ints = NULL}};
  CHECK(parse(null_array, 2, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("NULL array"), "NULL array");
  oar_attr too_many[] = {attrs[0], {.name = "dim", .type = OAR_ATTR_INTS, .count = OAR_PS_ATTR_MAX_ITEMS + 1, .value.ints = dims}};
  CHECK(parse(too_many, 2, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("entries, not 0.."), "too many entries");
  char long_string[OAR_PS_ATTR_MAX_STRING + 4];
  memset(long_string, 's', sizeof long_string - 1);
  long_string[sizeof long_string - 1] = '\0';
  oar_attr too_long[] = {attrs[0], {.name = "mode", .type = OAR_ATTR_STRING, .value.s = long_string}};
  CHECK(parse(too_long, 2, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("longer than"), "long string");
  oar_attr int_dtype[] = {{.name = "dtype", .type = OAR_ATTR_DTYPE, .value.dtype = {OAR_DL_INT, 32, 1}}};
  CHECK(parse(int_dtype, 1, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("does not know"), "dtype refused by the reader");
  CHECK(parse(NULL, 1, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("attrs is NULL"), "NULL attrs");
  oar_attr no_name[] = {{.name = NULL}};
  CHECK(parse(no_name, 1, values) == OAR_ERROR_INVALID_ARGUMENT && HAS("attrs[0].name is NULL"), "NULL name");

  int64_t pair[2];
  oar_ps_attr one = {.type = OAR_ATTR_INTS, .count = 1, .v.ints = {3}};
  CHECK(oar_ps_attr_pair("op", "stride", &one, 1, pair) == OAR_SUCCESS && pair[0] == 3 && pair[1] == 3, "pair of one");
  oar_ps_attr three = {.type = OAR_ATTR_INTS, .count = 3};
  CHECK(oar_ps_attr_pair("op", "stride", &three, 1, pair) == OAR_ERROR_INVALID_ARGUMENT && HAS("1 or 2 entries"), "pair of 3");
  oar_ps_attr zero = {.type = OAR_ATTR_INTS, .count = 2, .v.ints = {1, 0}};
  CHECK(oar_ps_attr_pair("op", "stride", &zero, 1, pair) == OAR_ERROR_INVALID_ARGUMENT && HAS("out of range"), "pair below min");
}

static void test_descriptors(void) {
  float data[16];
  int64_t shape[] = {2, 3}, strides[] = {0, 1}, negative[] = {-1, 1}, huge[] = {INT64_MAX / 2, 4};
  oar_dl_tensor t = {.data = data, .ndim = 2, .dtype = {OAR_DL_FLOAT, 32, 1}, .shape = shape};
  oar_ps_layout layout;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_SUCCESS, "compact");
  CHECK(layout.numel == 6 && layout.strides[0] == 3 && layout.strides[1] == 1 && layout.extent_bytes == 24 &&
            layout.start == (void*)data, "compact layout");
  t.strides = strides;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_SUCCESS && layout.extent_bytes == 12,
        "a broadcast dim reaches only one row");
  t.strides = negative;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_ERROR_INVALID_ARGUMENT && HAS("strides[0] is negative"),
        "negative stride");
  t.strides = NULL;
  t.shape = huge;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_ERROR_INVALID_ARGUMENT && HAS("overflow"), "overflow");
  t.shape = shape;
  t.byte_offset = 2;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_ERROR_INVALID_ARGUMENT && HAS("not aligned"), "misaligned");
  t.byte_offset = 0;
  t.data = NULL;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_ERROR_INVALID_ARGUMENT && HAS("data is NULL"), "NULL data");
  int64_t empty[] = {0, 3};
  t.shape = empty;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_SUCCESS && layout.numel == 0 && !layout.start,
        "an empty tensor may have NULL data");
  t.ndim = OAR_PS_MAX_DIMS + 1;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_ERROR_INVALID_ARGUMENT && HAS("has ndim 9"), "too many dims");
  t.ndim = 1;
  t.shape = NULL;
  CHECK(oar_ps_check_descriptor("op", "x", &t, 4, &layout) == OAR_ERROR_INVALID_ARGUMENT && HAS("shape is NULL"), "NULL shape");

  int32_t dim = -9;
  CHECK(oar_ps_normalize_dim("op", "dim", -1, 3, &dim) == OAR_SUCCESS && dim == 2, "-1 of 3 dims");
  CHECK(oar_ps_normalize_dim("op", "dim", -1, 0, &dim) == OAR_SUCCESS && dim == 0, "a scalar takes -1");
  CHECK(oar_ps_normalize_dim("op", "dim", 3, 3, &dim) == OAR_ERROR_INVALID_ARGUMENT && HAS("dim 3 is out of range for 3 dims"),
        "out of range");
  char text[8];
  int64_t big[] = {123, 456};
  oar_ps_format_shape(text, sizeof text, 2, big);
  CHECK(strcmp(text, "[123, 4") == 0, "a cut shape stays terminated: %s", text);
  CHECK(oar_ps_same_shape(2, shape, 2, shape) && !oar_ps_same_shape(2, shape, 1, shape), "same_shape");
  CHECK(oar_ps_shape_mismatch("op", "a", 2, shape, "out", 2, big) == OAR_ERROR_INVALID_ARGUMENT &&
            HAS("a shape [2, 3] differs from out shape [123, 456]"), "shape_mismatch");
}

static void test_conv2d(void) {
  int64_t x[] = {2, 4, 9, 9}, w[] = {6, 2, 3, 3};
  oar_ps_attr stride = {.type = OAR_ATTR_INTS, .count = 1, .v.ints = {2}};
  oar_ps_attr padding = {.type = OAR_ATTR_INTS, .count = 2, .v.ints = {1, 0}};
  oar_ps_attr dilation = {.type = OAR_ATTR_INTS, .count = 1, .v.ints = {1}};
  oar_ps_attr groups = {.type = OAR_ATTR_INT, .i = 2};
  oar_ps_conv2d g;
  CHECK(oar_ps_conv2d_geometry("conv2d", x, w, &stride, &padding, &dilation, &groups, &g) == OAR_SUCCESS, "geometry");
  /* torch: floor((9 + 2*1 - 1*(3-1) - 1) / 2) + 1 = 5; width: floor((9 - 2 - 1) / 2) + 1 = 4 */
  CHECK(g.out_h == 5 && g.out_w == 4 && g.group_in == 2 && g.group_out == 3, "out %lldx%lld", (long long)g.out_h,
        (long long)g.out_w);
  groups.i = 3;
  CHECK(oar_ps_conv2d_geometry("conv2d", x, w, &stride, &padding, &dilation, &groups, &g) == OAR_ERROR_INVALID_ARGUMENT &&
            HAS("groups 3 must be >= 1 and divide"), "groups");
  groups.i = 2;
  int64_t big_w[] = {6, 2, 12, 3};
  CHECK(oar_ps_conv2d_geometry("conv2d", x, big_w, &stride, &padding, &dilation, &groups, &g) == OAR_ERROR_INVALID_ARGUMENT &&
            HAS("larger than the padded"), "kernel larger than the input");
  int64_t wrong_c[] = {6, 4, 3, 3};
  CHECK(oar_ps_conv2d_geometry("conv2d", x, wrong_c, &stride, &padding, &dilation, &groups, &g) == OAR_ERROR_INVALID_ARGUMENT &&
            HAS("input channels per group"), "channels per group");
}

static void test_pool2d(void) {
  int64_t x[] = {2, 3, 9, 8}, kernel[] = {3}, padding[] = {1}, none[] = {0};
  oar_ps_pool2d g;
  /* torch: max_pool2d(zeros(2, 3, 9, 8), 3, padding=1) is [2, 3, 3, 3] (stride defaults to the kernel) */
  CHECK(oar_ps_pool2d_geometry("max_pool2d", 4, x, 1, kernel, 0, none, 1, padding, &g) == OAR_SUCCESS &&
            g.out_h == 3 && g.out_w == 3 && g.planes == 6 && g.stride[0] == 3 && g.stride[1] == 3,
        "pool out %lldx%lld", (long long)g.out_h, (long long)g.out_w);
  /* torch: avg_pool2d(zeros(2, 3, 9, 8), (3, 2), stride=(2, 1), padding=(1, 0)) is [2, 3, 5, 7] */
  int64_t kernel2[] = {3, 2}, stride2[] = {2, 1}, padding2[] = {1, 0};
  CHECK(oar_ps_pool2d_geometry("avg_pool2d", 4, x, 2, kernel2, 2, stride2, 2, padding2, &g) == OAR_SUCCESS &&
            g.out_h == 5 && g.out_w == 7,
        "pool out %lldx%lld", (long long)g.out_h, (long long)g.out_w);
  CHECK(oar_ps_pool2d_geometry("max_pool2d", 3, x + 1, 1, kernel, 0, none, 1, padding, &g) == OAR_SUCCESS &&
            g.planes == 3 && g.channels == 3,
        "[C, H, W] input");
  CHECK(oar_ps_pool2d_geometry("max_pool2d", 2, x, 1, kernel, 0, none, 1, padding, &g) == OAR_ERROR_INVALID_ARGUMENT &&
            HAS("kernel_launch: max_pool2d: x must be [N, C, H, W] (or [C, H, W]), got 2 dims"),
        "rank");
  int64_t big[] = {12};
  CHECK(oar_ps_pool2d_geometry("max_pool2d", 4, x, 1, big, 0, none, 1, padding, &g) == OAR_ERROR_INVALID_ARGUMENT &&
            HAS("window does not fit the padded 11x10 input"),
        "window larger than the input");
  CHECK(oar_ps_pool2d_geometry("max_pool2d", 4, x, 3, kernel2, 0, none, 1, padding, &g) == OAR_ERROR_INVALID_ARGUMENT &&
            HAS("need 1 or 2 entries"),
        "entry counts");
  int64_t negative[] = {-1};
  CHECK(oar_ps_pool2d_geometry("max_pool2d", 4, x, 1, kernel, 0, none, 1, negative, &g) == OAR_ERROR_INVALID_ARGUMENT &&
            HAS("padding -1 >= 0"),
        "negative padding");
}

static bool promotes_to(oar_dl_data_type a, oar_dl_data_type b, oar_dl_data_type expected) {
  oar_dl_data_type out = {0, 0, 0};
  return oar_ps_promote(a, b, &out) && out.code == expected.code && out.bits == expected.bits && out.lanes == 1;
}

static void test_promote(void) {
  const oar_dl_data_type f16 = {OAR_DL_FLOAT, 16, 1}, bf16 = {OAR_DL_BFLOAT, 16, 1}, f32 = {OAR_DL_FLOAT, 32, 1},
                         f64 = {OAR_DL_FLOAT, 64, 1}, i8 = {OAR_DL_INT, 8, 1}, i32 = {OAR_DL_INT, 32, 1},
                         i64 = {OAR_DL_INT, 64, 1}, u8 = {OAR_DL_UINT, 8, 1}, b8 = {OAR_DL_BOOL, 8, 1};
  /* as torch.promote_types */
  CHECK(promotes_to(i32, f16, f16) && promotes_to(f16, i32, f16), "int32 with float16");
  CHECK(promotes_to(f16, bf16, f32) && promotes_to(bf16, f16, f32), "float16 with bfloat16");
  CHECK(promotes_to(i64, f32, f32) && promotes_to(f64, i64, f64), "int with float");
  CHECK(promotes_to(b8, i8, i8) && promotes_to(i32, i64, i64) && promotes_to(b8, u8, u8), "integers");
  /* ops.yaml's order, where torch widens instead: uint8 with int8 is int8 */
  CHECK(promotes_to(u8, i8, i8), "uint8 with int8");
  oar_dl_data_type out = f32, vector = {OAR_DL_FLOAT, 32, 4}, odd = {OAR_DL_INT, 24, 1};
  CHECK(!oar_ps_promote(vector, f32, &out) && !oar_ps_promote(f32, odd, &out) && out.bits == 32 && out.lanes == 1,
        "no rank: false, out untouched");
  CHECK(oar_ps_promote_rank(b8) == 0 && oar_ps_promote_rank(f64) == 8 && oar_ps_promote_rank(odd) == -1, "ranks");
}

/* The dtype rules: the plugin's own sets, here "listed" = float32, float16, int32, int64, bool
   and "castable" = anything but int16. */
static const oar_dl_data_type F32 = {OAR_DL_FLOAT, 32, 1}, F16 = {OAR_DL_FLOAT, 16, 1},
                              F64 = {OAR_DL_FLOAT, 64, 1}, I16 = {OAR_DL_INT, 16, 1}, I32 = {OAR_DL_INT, 32, 1},
                              I64 = {OAR_DL_INT, 64, 1}, I8 = {OAR_DL_INT, 8, 1}, U8 = {OAR_DL_UINT, 8, 1},
                              B8 = {OAR_DL_BOOL, 8, 1};

static bool same(oar_dl_data_type a, oar_dl_data_type b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

static bool listed(const void* context, oar_dl_data_type dtype) {
  (*(int*)context)++; /* the context reaches the test */
  return same(dtype, F32) || same(dtype, F16) || same(dtype, I32) || same(dtype, I64) || same(dtype, B8);
}

static bool castable(const void* context, oar_dl_data_type dtype) {
  (void)context;
  return !same(dtype, I16);
}

/* Whether dtypes (num_inputs inputs, one output) follow rule. */
static bool allowed(const oar_ps_dtype_rule* rule, uint32_t num_inputs, oar_dl_data_type a, oar_dl_data_type b,
                    oar_dl_data_type out) {
  int calls = 0;
  oar_dl_data_type dtypes[3] = {a, b, out};
  if (num_inputs == 1) dtypes[1] = out;
  if (num_inputs == 0) dtypes[0] = out;
  return oar_ps_dtypes_allowed(rule, dtypes, num_inputs, 1, listed, castable, &calls);
}

static void test_dtype_rules(void) {
  const uint8_t data2[] = {OAR_PS_ROLE_DATA, OAR_PS_ROLE_DATA};
  const uint8_t where[] = {OAR_PS_ROLE_CONDITION, OAR_PS_ROLE_DATA};
  const uint8_t gather[] = {OAR_PS_ROLE_DATA, OAR_PS_ROLE_INDEX};
  const uint8_t quant[] = {OAR_PS_ROLE_DATA, OAR_PS_ROLE_QUANTIZED};
  oar_ps_dtype_rule same_rule = {data2, false, OAR_PS_OUT_SAME, {0, 0, 0}};
  oar_ps_dtype_rule promote = {data2, true, OAR_PS_OUT_PROMOTE, {0, 0, 0}};
  oar_ps_dtype_rule to_float = {data2, true, OAR_PS_OUT_FLOAT, {0, 0, 0}};
  oar_ps_dtype_rule fixed_bool = {data2, true, OAR_PS_OUT_FIXED, B8};
  oar_ps_dtype_rule attr = {data2, false, OAR_PS_OUT_ATTR, {0, 0, 0}};
  oar_ps_dtype_rule accumulate = {data2, false, OAR_PS_OUT_ACCUMULATE, {0, 0, 0}};

  CHECK(allowed(&same_rule, 2, F32, F32, F32) && !allowed(&same_rule, 2, F32, F32, F16), "same: the first's dtype");
  CHECK(!allowed(&same_rule, 2, F32, F16, F32), "data inputs share a dtype unless the rule promotes");
  CHECK(!allowed(&same_rule, 1, F64, F64, F64), "a data input the plugin does not list");
  CHECK(allowed(&same_rule, 0, F16, F16, F16) && !allowed(&same_rule, 0, I16, I16, I16),
        "same without data inputs (creation): any listed dtype");

  CHECK(allowed(&promote, 2, I32, F16, F16) && allowed(&promote, 2, F16, I64, F16) && !allowed(&promote, 2, I32, F16, F32),
        "promote: the promoted dtype");
  CHECK(allowed(&promote, 2, F16, F16, F16) && allowed(&promote, 2, B8, I32, I32), "promote: equal, bool with int");
  CHECK(!allowed(&promote, 0, F32, F32, F32), "promote needs a data input");

  CHECK(allowed(&to_float, 2, I32, I64, F32) && !allowed(&to_float, 2, I32, I64, I64), "float: int to float32");
  CHECK(allowed(&to_float, 2, F16, F16, F16) && allowed(&to_float, 1, B8, B8, F32), "float: floats kept, bool to float32");

  CHECK(allowed(&fixed_bool, 2, F32, I32, B8) && !allowed(&fixed_bool, 2, F32, I32, F32), "fixed: that dtype");
  CHECK(allowed(&fixed_bool, 0, B8, B8, B8), "fixed needs no data input");

  CHECK(allowed(&attr, 1, F32, F32, I8) && allowed(&attr, 1, F32, F32, F64) && !allowed(&attr, 1, F32, F32, I16),
        "attr: any castable dtype");
  int calls = 0;
  oar_dl_data_type cast[2] = {F32, I8};
  CHECK(!oar_ps_dtypes_allowed(&attr, cast, 1, 1, listed, NULL, &calls) && calls == 1,
        "attr with no castable set: refused; the context is passed through");

  CHECK(allowed(&accumulate, 1, I32, I32, I64) && allowed(&accumulate, 1, I32, I32, I32), "accumulate: int32");
  CHECK(allowed(&accumulate, 1, B8, B8, I64) && !allowed(&accumulate, 1, B8, B8, B8), "accumulate: bool to int64");
  CHECK(allowed(&accumulate, 1, F16, F16, F16) && !allowed(&accumulate, 1, F16, F16, F32), "accumulate: floats kept");
  CHECK(!allowed(&accumulate, 1, I64, I64, I32), "accumulate: int64 does not narrow");

  oar_ps_dtype_rule condition = {where, true, OAR_PS_OUT_SAME, {0, 0, 0}};
  CHECK(allowed(&condition, 2, B8, F32, F32) && !allowed(&condition, 2, I32, F32, F32), "a condition is bool");
  oar_ps_dtype_rule index = {gather, false, OAR_PS_OUT_SAME, {0, 0, 0}};
  CHECK(allowed(&index, 2, F16, I32, F16) && allowed(&index, 2, F16, I64, F16) && !allowed(&index, 2, F16, I8, F16),
        "an index is int32 or int64; the output follows the data input");
  oar_ps_dtype_rule codes = {quant, false, OAR_PS_OUT_SAME, {0, 0, 0}};
  CHECK(allowed(&codes, 2, F32, I8, F32) && allowed(&codes, 2, F32, U8, F32) && !allowed(&codes, 2, F32, F32, F32),
        "quantized codes are int8 or uint8, whatever the op lists");

  oar_dl_data_type dtypes[2] = {I32, F16}, out = I8;
  CHECK(oar_ps_expected_out_dtype(&promote, dtypes, 2, &out) && same(out, F16), "expected: promote");
  CHECK(oar_ps_expected_out_dtype(&to_float, dtypes, 1, &out) && same(out, F32), "expected: float of int32");
  CHECK(oar_ps_expected_out_dtype(&fixed_bool, dtypes, 0, &out) && same(out, B8), "expected: fixed");
  out = I8;
  CHECK(!oar_ps_expected_out_dtype(&attr, dtypes, 1, &out) && !oar_ps_expected_out_dtype(&same_rule, dtypes, 0, &out) &&
            same(out, I8),
        "expected: none for attr and creation, out untouched");
  oar_dl_data_type vector[2] = {{OAR_DL_FLOAT, 32, 4}, F32};
  CHECK(!oar_ps_expected_out_dtype(&promote, vector, 2, &out) && !allowed(&promote, 2, vector[0], F32, F32),
        "a dtype without promotion rank");
}

/* Collapses shape (ndim dims) with two tensors' strides; true if it gives want_shape and the strides. */
static bool collapses_to(int32_t ndim, const int64_t* shape, const int64_t* a, const int64_t* b, int32_t want_ndim,
                         const int64_t* want_shape, const int64_t* want_a, const int64_t* want_b) {
  int64_t s[OAR_PS_MAX_DIMS], sa[OAR_PS_MAX_DIMS], sb[OAR_PS_MAX_DIMS];
  memcpy(s, shape, sizeof(int64_t) * (size_t)ndim);
  memcpy(sa, a, sizeof(int64_t) * (size_t)ndim);
  memcpy(sb, b, sizeof(int64_t) * (size_t)ndim);
  int64_t* strides[2] = {sa, sb};
  int32_t got = oar_ps_collapse_dims(ndim, s, 2, strides);
  if (got != want_ndim) return false;
  for (int32_t d = 0; d < got; d++)
    if (s[d] != want_shape[d] || sa[d] != want_a[d] || sb[d] != want_b[d]) return false;
  return true;
}

static void test_collapse_dims(void) {
  /* contiguous [2, 3, 4] with itself: one row of 24 */
  CHECK(collapses_to(3, (int64_t[]){2, 3, 4}, (int64_t[]){12, 4, 1}, (int64_t[]){12, 4, 1}, 1, (int64_t[]){24},
                     (int64_t[]){1}, (int64_t[]){1}),
        "contiguous: one dim");
  /* b transposed in its last two dims: no neighbours step evenly in both */
  CHECK(collapses_to(3, (int64_t[]){2, 3, 4}, (int64_t[]){12, 4, 1}, (int64_t[]){12, 1, 3}, 3, (int64_t[]){2, 3, 4},
                     (int64_t[]){12, 4, 1}, (int64_t[]){12, 1, 3}),
        "a transposed tensor keeps the dims");
  /* b broadcast along dim 0 (stride 0): dims 1 and 2 merge, dim 0 stays */
  CHECK(collapses_to(3, (int64_t[]){5, 3, 4}, (int64_t[]){12, 4, 1}, (int64_t[]){0, 4, 1}, 2, (int64_t[]){5, 12},
                     (int64_t[]){12, 1}, (int64_t[]){0, 1}),
        "a broadcast dim stays apart");
  /* size-1 dims dropped whatever their strides; byte strides work the same */
  CHECK(collapses_to(4, (int64_t[]){1, 6, 1, 2}, (int64_t[]){99, 8, 7, 4}, (int64_t[]){0, 16, 3, 8}, 1,
                     (int64_t[]){12}, (int64_t[]){4}, (int64_t[]){8}),
        "size-1 dims dropped, bytes merge");
  /* every other element of rows of 8: one even stride of 2, so it merges */
  CHECK(collapses_to(2, (int64_t[]){3, 4}, (int64_t[]){8, 2}, (int64_t[]){4, 1}, 1, (int64_t[]){12},
                     (int64_t[]){2}, (int64_t[]){1}),
        "an evenly strided view merges");
  /* rows of 4 out of rows of 10: the row dim stays */
  CHECK(collapses_to(2, (int64_t[]){3, 4}, (int64_t[]){10, 1}, (int64_t[]){4, 1}, 2, (int64_t[]){3, 4},
                     (int64_t[]){10, 1}, (int64_t[]){4, 1}),
        "a padded row keeps its row dim");
  CHECK(collapses_to(3, (int64_t[]){2, 0, 4}, (int64_t[]){4, 4, 1}, (int64_t[]){4, 4, 1}, 1, (int64_t[]){0},
                     (int64_t[]){0}, (int64_t[]){0}),
        "an empty shape: {0}");
  CHECK(collapses_to(2, (int64_t[]){1, 1}, (int64_t[]){5, 5}, (int64_t[]){1, 1}, 1, (int64_t[]){1}, (int64_t[]){0},
                     (int64_t[]){0}),
        "all ones: {1}");
  int64_t scalar_shape[1] = {7}, scalar_stride[1] = {7};
  int64_t* scalar_strides[1] = {scalar_stride};
  CHECK(oar_ps_collapse_dims(0, scalar_shape, 1, scalar_strides) == 1 && scalar_shape[0] == 1 && scalar_stride[0] == 0,
        "0-d: {1}");
}

int main(void) {
  test_errors();
  test_log();
  test_attrs();
  test_descriptors();
  test_conv2d();
  test_pool2d();
  test_promote();
  test_dtype_rules();
  test_collapse_dims();
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
}

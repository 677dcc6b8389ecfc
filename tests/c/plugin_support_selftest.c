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

int main(void) {
  test_errors();
  test_log();
  test_attrs();
  test_descriptors();
  test_conv2d();
  test_pool2d();
  test_promote();
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
}

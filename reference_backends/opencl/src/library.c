/* The kernel library: its programs (assembled from the embedded OpenCL C,
 * built once per device on first use), kernel objects, argument packing and
 * enqueueing; dtype and geometry helpers of the ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ocl_cl_sources.inc"

static pthread_mutex_t build_locks[OCL_MAX_DEVICES] = {
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};

static const struct {
  int program;
  const char* name;
} kernel_table[K_COUNT] = {
    [K_EW_F] = {PROGRAM_EW, "ew_F"}, [K_EW_D] = {PROGRAM_EW, "ew_D"}, [K_EW_L] = {PROGRAM_EW, "ew_L"},
    [K_ARANGE_F] = {PROGRAM_EW, "arange_F"}, [K_ARANGE_D] = {PROGRAM_EW, "arange_D"},
    [K_ARANGE_L] = {PROGRAM_EW, "arange_L"}, [K_DROPOUT_F] = {PROGRAM_EW, "dropout_F"},
    [K_DROPOUT_D] = {PROGRAM_EW, "dropout_D"}, [K_COPY_RAW] = {PROGRAM_EW, "copy_raw"},
    [K_FILL_RAW] = {PROGRAM_EW, "fill_raw"}, [K_TRI_RAW] = {PROGRAM_EW, "tri_raw"},
    [K_COPY_BYTES] = {PROGRAM_EW, "copy_bytes"}, [K_RAND] = {PROGRAM_EW, "rand_any"},
    [K_RANDN] = {PROGRAM_EW, "randn_any"},
    [K_REDUCE_SERIAL_F] = {PROGRAM_REDUCE, "reduce_serial_F"},
    [K_REDUCE_SERIAL_D] = {PROGRAM_REDUCE, "reduce_serial_D"},
    [K_REDUCE_SERIAL_L] = {PROGRAM_REDUCE, "reduce_serial_L"},
    [K_REDUCE_GROUP_F] = {PROGRAM_REDUCE, "reduce_group_F"}, [K_REDUCE_GROUP_D] = {PROGRAM_REDUCE, "reduce_group_D"},
    [K_REDUCE_GROUP_L] = {PROGRAM_REDUCE, "reduce_group_L"},
    [K_SOFTMAX_SERIAL_F] = {PROGRAM_REDUCE, "softmax_serial_F"},
    [K_SOFTMAX_SERIAL_D] = {PROGRAM_REDUCE, "softmax_serial_D"},
    [K_SOFTMAX_GROUP_F] = {PROGRAM_REDUCE, "softmax_group_F"},
    [K_SOFTMAX_GROUP_D] = {PROGRAM_REDUCE, "softmax_group_D"},
    [K_NORM_SERIAL_F] = {PROGRAM_REDUCE, "norm_serial_F"}, [K_NORM_SERIAL_D] = {PROGRAM_REDUCE, "norm_serial_D"},
    [K_NORM_GROUP_F] = {PROGRAM_REDUCE, "norm_group_F"}, [K_NORM_GROUP_D] = {PROGRAM_REDUCE, "norm_group_D"},
    [K_CE_FORWARD_F] = {PROGRAM_REDUCE, "ce_forward_F"}, [K_CE_FORWARD_D] = {PROGRAM_REDUCE, "ce_forward_D"},
    [K_CE_REDUCE_F] = {PROGRAM_REDUCE, "ce_reduce_F"}, [K_CE_REDUCE_D] = {PROGRAM_REDUCE, "ce_reduce_D"},
    [K_CE_BACKWARD_F] = {PROGRAM_REDUCE, "ce_backward_F"}, [K_CE_BACKWARD_D] = {PROGRAM_REDUCE, "ce_backward_D"},
    [K_MATMUL_F] = {PROGRAM_NN, "matmul_F"}, [K_MATMUL_D] = {PROGRAM_NN, "matmul_D"},
    [K_MATMUL_ROWS_F] = {PROGRAM_NN, "matmul_rows_F"}, [K_MATMUL_ROWS_D] = {PROGRAM_NN, "matmul_rows_D"},
    [K_CONV2D_F] = {PROGRAM_NN, "conv2d_F"}, [K_CONV2D_D] = {PROGRAM_NN, "conv2d_D"},
    [K_CONV2D_BI_F] = {PROGRAM_NN, "conv2d_backward_input_F"},
    [K_CONV2D_BI_D] = {PROGRAM_NN, "conv2d_backward_input_D"},
    [K_CONV2D_BW_F] = {PROGRAM_NN, "conv2d_backward_weight_F"},
    [K_CONV2D_BW_D] = {PROGRAM_NN, "conv2d_backward_weight_D"},
    [K_POOL2D_F] = {PROGRAM_NN, "pool2d_F"}, [K_POOL2D_D] = {PROGRAM_NN, "pool2d_D"},
    [K_POOL2D_BACKWARD_F] = {PROGRAM_NN, "pool2d_backward_F"},
    [K_POOL2D_BACKWARD_D] = {PROGRAM_NN, "pool2d_backward_D"},
    [K_IX_CHECK] = {PROGRAM_INDEX, "ix_check"}, [K_IX_EMBEDDING] = {PROGRAM_INDEX, "ix_embedding"},
    [K_IX_GATHER] = {PROGRAM_INDEX, "ix_gather"}, [K_IX_SCATTER] = {PROGRAM_INDEX, "ix_scatter"},
    [K_IX_INDEX_SELECT] = {PROGRAM_INDEX, "ix_index_select"},
    [K_IX_INDEX_ADD] = {PROGRAM_INDEX, "ix_index_add"}, [K_IX_ONE_HOT] = {PROGRAM_INDEX, "ix_one_hot"},
    [K_FAULT] = {PROGRAM_INDEX, "fault_inject"},
};

/* Name and program of kernel id (the fast elementwise ones are numbered by op code). */
static int kernel_program(ocl_kernel_id id) { return id >= K_EWC_F ? PROGRAM_EW : kernel_table[id].program; }

static const char* kernel_name(ocl_kernel_id id, char* buffer, size_t bytes) {
  if (id < K_EWC_F) return kernel_table[id].name;
  snprintf(buffer, bytes, "ewc_%d_%c", (int)(id < K_EWC_D ? id - K_EWC_F : id - K_EWC_D), id < K_EWC_D ? 'F' : 'D');
  return buffer;
}

static const char* const program_names[PROGRAM_COUNT] = {"elementwise", "reduce", "nn", "index"};

/* ---- program assembly ------------------------------------------------------------------ */

typedef struct text {
  char* data;
  size_t used, capacity;
  bool failed;
} text;

static void append(text* t, const char* s) {
  size_t n = strlen(s);
  if (t->failed) return;
  if (t->used + n + 1 > t->capacity) {
    size_t grown = (t->used + n + 1) * 2;
    char* data = realloc(t->data, grown);
    if (!data) {
      t->failed = true;
      return;
    }
    t->data = data;
    t->capacity = grown;
  }
  memcpy(t->data + t->used, s, n + 1);
  t->used += n;
}

/* body instantiated for a family: T, ACC, FAM(name), LD, ST */
static void instantiate(text* t, const char* body, char family) {
  static const char* const heads[] = {
      "#define T float\n#define ACC acc_t\n#define FAM(name) name##_F\n#define LD ld_F\n#define ST st_F\n"
      "#define FAMILY_F 1\n",
      "#define T double\n#define ACC double\n#define FAM(name) name##_D\n#define LD ld_D\n#define ST st_D\n"
      "#define FAMILY_D 1\n",
      "#define T long\n#define ACC long\n#define FAM(name) name##_L\n#define LD ld_L\n#define ST st_L\n"
      "#define FAMILY_L 1\n"};
  append(t, heads[family == 'F' ? 0 : family == 'D' ? 1 : 2]);
  append(t, body);
  append(t, "\n#undef T\n#undef ACC\n#undef FAM\n#undef LD\n#undef ST\n#undef FAMILY_F\n#undef FAMILY_D\n"
            "#undef FAMILY_L\n");
}

static char* program_source(const ocl_device* dev, int program) {
  text t = {0};
  append(&t, ocl_src_shared);
  append(&t, ocl_src_common);
  switch (program) {
    case PROGRAM_EW:
      instantiate(&t, ocl_src_ew_float, 'F');
      if (dev->fp64) instantiate(&t, ocl_src_ew_float, 'D');
      append(&t, ocl_src_ew_long);
      break;
    case PROGRAM_REDUCE:
      instantiate(&t, ocl_src_reduce, 'F');
      if (dev->fp64) instantiate(&t, ocl_src_reduce, 'D');
      instantiate(&t, ocl_src_reduce, 'L');
      instantiate(&t, ocl_src_rows, 'F');
      if (dev->fp64) instantiate(&t, ocl_src_rows, 'D');
      break;
    case PROGRAM_NN:
      instantiate(&t, ocl_src_nn, 'F');
      if (dev->fp64) instantiate(&t, ocl_src_nn, 'D');
      break;
    default:
      append(&t, ocl_src_index);
  }
  if (t.failed) {
    free(t.data);
    return NULL;
  }
  return t.data;
}

static char* build_log(cl_program program, cl_device_id id) {
  size_t size = 0;
  clGetProgramBuildInfo(program, id, CL_PROGRAM_BUILD_LOG, 0, NULL, &size);
  char* log = malloc(size + 1);
  if (!log) return NULL;
  log[0] = 0;
  clGetProgramBuildInfo(program, id, CL_PROGRAM_BUILD_LOG, size, log, NULL);
  log[size] = 0;
  return log;
}

oar_status ocl_program_ready(ocl_device* dev, int program) {
  int device = (int)(dev - g_ocl.devices);
  pthread_mutex_lock(&build_locks[device]);
  oar_status status = OAR_SUCCESS;
  if (!dev->programs[program] && dev->program_status[program] == CL_SUCCESS) {
    char* source = program_source(dev, program);
    cl_int error = CL_OUT_OF_HOST_MEMORY;
    cl_program built = NULL;
    if (source) {
      const char* sources[1] = {source};
      built = clCreateProgramWithSource(dev->context, 1, sources, NULL, &error);
      free(source);
    }
    if (built) {
      char options[256];
      snprintf(options, sizeof options, "-cl-std=CL1.2%s%s",
               dev->correctly_rounded_divide ? " -cl-fp32-correctly-rounded-divide-sqrt" : "",
               dev->fp64 ? " -DOAR_FP64" : "");
      error = clBuildProgram(built, 1, &dev->id, options, NULL, NULL);
      if (error != CL_SUCCESS) {
        dev->program_log[program] = build_log(built, dev->id);
        clReleaseProgram(built);
        built = NULL;
      }
    }
    if (built) dev->programs[program] = built;
    else dev->program_status[program] = error != CL_SUCCESS ? error : CL_BUILD_PROGRAM_FAILURE;
  }
  if (!dev->programs[program])
    status = ocl_fail(OAR_ERROR_INTERNAL, "the plugin's %s kernels do not build on '%s': %s; build log:\n%.1500s",
                      program_names[program], dev->name, ocl_error_name(dev->program_status[program]),
                      dev->program_log[program] ? dev->program_log[program] : "(none)");
  pthread_mutex_unlock(&build_locks[device]);
  return status;
}

void ocl_library_release(ocl_device* dev) {
  for (int k = 0; k < K_COUNT; k++)
    if (dev->kernels[k].kernel) {
      clReleaseKernel(dev->kernels[k].kernel);
      dev->kernels[k].kernel = NULL;
    }
  for (int p = 0; p < PROGRAM_COUNT; p++) {
    if (dev->programs[p]) clReleaseProgram(dev->programs[p]);
    dev->programs[p] = NULL;
    free(dev->program_log[p]);
    dev->program_log[p] = NULL;
    dev->program_status[p] = CL_SUCCESS;
  }
}

/* ---- arguments and enqueue ------------------------------------------------------------------- */

static void arg_push(ocl_args* args, const void* value, size_t size, bool local) {
  if (args->count >= 32 || args->used + size > sizeof args->bytes) {
    args->overflow = true;
    return;
  }
  args->sizes[args->count] = size;
  if (local) {
    args->offsets[args->count] = SIZE_MAX;
  } else {
    args->offsets[args->count] = args->used;
    memcpy(args->bytes + args->used, value, size);
    args->used += (size + 7) / 8 * 8;
  }
  args->count++;
}

void arg_mem(ocl_args* args, cl_mem mem) { arg_push(args, &mem, sizeof mem, false); }
void arg_local(ocl_args* args, size_t bytes) { arg_push(args, NULL, bytes, true); }
void arg_bytes(ocl_args* args, const void* value, size_t size) { arg_push(args, value, size, false); }

oar_status ocl_enqueue(ocl_stream* stream, ocl_kernel_id id, ocl_args* args, cl_uint dims, const size_t* global,
                       const size_t* local, const char* name) {
  ocl_device* dev = &g_ocl.devices[stream->device];
  if (args->overflow) return ocl_fail(OAR_ERROR_INTERNAL, "kernel_launch: %s: too many kernel arguments", name);
  for (cl_uint d = 0; d < dims; d++)
    if (global[d] == 0) return OAR_SUCCESS;
  ocl_library_kernel* slot = &dev->kernels[id];
  char buffer[32];
  const char* kernel = kernel_name(id, buffer, sizeof buffer);
  pthread_mutex_lock(&slot->lock);
  if (!slot->kernel) {
    oar_status status = ocl_program_ready(dev, kernel_program(id));
    if (status != OAR_SUCCESS) {
      pthread_mutex_unlock(&slot->lock);
      return status;
    }
    cl_int error = CL_SUCCESS;
    slot->kernel = clCreateKernel(dev->programs[kernel_program(id)], kernel, &error);
    if (!slot->kernel) {
      pthread_mutex_unlock(&slot->lock);
      return ocl_fail_cl(error, name, kernel);
    }
  }
  cl_int error = CL_SUCCESS;
  for (cl_uint i = 0; i < args->count && error == CL_SUCCESS; i++)
    error = clSetKernelArg(slot->kernel, i, args->sizes[i],
                           args->offsets[i] == SIZE_MAX ? NULL : args->bytes + args->offsets[i]);
  if (error != CL_SUCCESS) {
    pthread_mutex_unlock(&slot->lock);
    return ocl_fail(OAR_ERROR_INTERNAL, "kernel_launch: %s: clSetKernelArg of %s: %s", name, kernel,
                    ocl_error_name(error));
  }
  cl_event event = NULL;
  error = clEnqueueNDRangeKernel(stream->queue, slot->kernel, dims, NULL, global, local, 0, NULL, &event);
  pthread_mutex_unlock(&slot->lock);
  if (error != CL_SUCCESS)
    return ocl_fail_cl(error, "kernel_launch", kernel);
  ocl_stream_enqueued(stream, event, name, "kernel");
  return OAR_SUCCESS;
}

size_t ocl_wide_global(const ocl_device* dev, int64_t count) {
  uint64_t rounded = ((uint64_t)count + 127) / 128 * 128;
  if (rounded < 128) rounded = 128;
  return rounded < dev->wide_global ? (size_t)rounded : dev->wide_global;
}

oar_status launch_wide(ocl_launch* L, ocl_kernel_id id, ocl_args* args, int64_t count) {
  if (count <= 0) return OAR_SUCCESS;
  size_t global = ocl_wide_global(L->dev, count), local = 128;
  return ocl_enqueue(L->stream, id, args, 1, &global, &local, L->op->name);
}

oar_status launch_groups(ocl_launch* L, ocl_kernel_id id, ocl_args* args, int64_t count) {
  if (count <= 0) return OAR_SUCCESS;
  uint64_t groups_cap = L->dev->wide_global / 128 * 4;
  uint64_t groups = (uint64_t)count < groups_cap ? (uint64_t)count : groups_cap;
  size_t global = (size_t)groups * 128, local = 128;
  return ocl_enqueue(L->stream, id, args, 1, &global, &local, L->op->name);
}

oar_status launch_single(ocl_launch* L, ocl_kernel_id id, ocl_args* args) {
  size_t global = 1, local = 1;
  return ocl_enqueue(L->stream, id, args, 1, &global, &local, L->op->name);
}

cl_mem launch_status(const ocl_launch* L) { return L->stream->status->mem; }

/* ---- dtypes ---------------------------------------------------------------------------------- */

static const struct {
  const char* name;
  uint8_t code, bits;
  bool floating;
} dtype_infos[DT_COUNT] = {
    [DT_F32] = {"float32", OAR_DL_FLOAT, 32, true}, [DT_F64] = {"float64", OAR_DL_FLOAT, 64, true},
    [DT_F16] = {"float16", OAR_DL_FLOAT, 16, true}, [DT_BF16] = {"bfloat16", OAR_DL_BFLOAT, 16, true},
    [DT_I8] = {"int8", OAR_DL_INT, 8, false},       [DT_I16] = {"int16", OAR_DL_INT, 16, false},
    [DT_I32] = {"int32", OAR_DL_INT, 32, false},    [DT_I64] = {"int64", OAR_DL_INT, 64, false},
    [DT_U8] = {"uint8", OAR_DL_UINT, 8, false},     [DT_BOOL] = {"bool", OAR_DL_BOOL, 8, false},
};

bool dtype_from_dl(oar_dl_data_type dl, uint8_t* dtype) {
  if (dl.lanes != 1) return false;
  for (uint8_t i = 0; i < DT_COUNT; i++)
    if (dtype_infos[i].code == dl.code && dtype_infos[i].bits == dl.bits) {
      *dtype = i;
      return true;
    }
  return false;
}

const char* dtype_name(uint8_t dtype) { return dtype < DT_COUNT ? dtype_infos[dtype].name : "?"; }
int dtype_size(uint8_t dtype) { return dtype_infos[dtype].bits / 8; }
bool dtype_is_floating(uint8_t dtype) { return dtype_infos[dtype].floating; }
oar_dl_data_type dtype_to_dl(uint8_t dtype) { return (oar_dl_data_type){dtype_infos[dtype].code, dtype_infos[dtype].bits, 1}; }

/* The plugin support library's promotion (group 7), on this plugin's dtype ids. */
uint8_t dtype_promote(uint8_t a, uint8_t b) {
  if (a == b || a >= DT_COUNT || b >= DT_COUNT) return a;
  oar_dl_data_type promoted;
  uint8_t id;
  return oar_ps_promote(dtype_to_dl(a), dtype_to_dl(b), &promoted) && dtype_from_dl(promoted, &id) ? id : a;
}

int family_of(uint8_t dtype) {
  switch (dtype) {
    case DT_F64: return FAMILY_D;
    case DT_F32:
    case DT_F16:
    case DT_BF16: return FAMILY_F;
    default: return FAMILY_L;
  }
}

/* Round a double to a binary float of ebits / mbits (half, bfloat16), once, to nearest even. */
static uint16_t round_to_narrow(double value, int ebits, int mbits) {
  uint64_t bits;
  memcpy(&bits, &value, sizeof bits);
  uint16_t sign = (uint16_t)((bits >> 63) << (ebits + mbits));
  int exponent = (int)((bits >> 52) & 0x7ff);
  uint64_t mantissa = bits & ((UINT64_C(1) << 52) - 1);
  uint16_t all_ones = (uint16_t)(((1u << ebits) - 1) << mbits);
  if (exponent == 0x7ff)
    return mantissa ? (uint16_t)(sign | all_ones | (1u << (mbits - 1))) : (uint16_t)(sign | all_ones);
  if (exponent == 0) return sign;
  int bias = (1 << (ebits - 1)) - 1;
  int target = exponent - 1023 + bias;
  uint64_t significand = mantissa | (UINT64_C(1) << 52);
  int shift = 52 - mbits + (target < 1 ? 1 - target : 0);
  if (shift > 63) return sign;
  uint64_t quotient = significand >> shift, remainder = significand & ((UINT64_C(1) << shift) - 1);
  uint64_t half = UINT64_C(1) << (shift - 1);
  if (remainder > half || (remainder == half && (quotient & 1))) quotient++;
  if (target < 1) return (uint16_t)(sign | quotient);
  if (quotient == (UINT64_C(1) << (mbits + 1))) {
    quotient >>= 1;
    target++;
  }
  if (target >= (1 << ebits) - 1) return (uint16_t)(sign | all_ones);
  return (uint16_t)(sign | ((uint32_t)target << mbits) | (quotient & ((UINT64_C(1) << mbits) - 1)));
}

static int64_t saturate(double value, double low, double high_exclusive, int64_t high) {
  if (value != value) return 0;
  if (value <= low) return (int64_t)low;
  if (value >= high_exclusive) return high;
  return (int64_t)value;
}

uint64_t dtype_bits_from_double(uint8_t dtype, double value) {
  switch (dtype) {
    case DT_F32: {
      float f = (float)value;
      uint32_t u;
      memcpy(&u, &f, 4);
      return u;
    }
    case DT_F64: {
      uint64_t u;
      memcpy(&u, &value, 8);
      return u;
    }
    case DT_F16: return round_to_narrow(value, 5, 10);
    case DT_BF16: return round_to_narrow(value, 8, 7);
    case DT_I8: return (uint8_t)saturate(value, -128.0, 128.0, 127);
    case DT_I16: return (uint16_t)saturate(value, -32768.0, 32768.0, 32767);
    case DT_I32: return (uint32_t)saturate(value, -2147483648.0, 2147483648.0, INT32_MAX);
    case DT_I64: return (uint64_t)saturate(value, -9223372036854775808.0, 9223372036854775808.0, INT64_MAX);
    case DT_U8: return (uint8_t)saturate(value, 0.0, 256.0, 255);
    default: return value != 0.0;
  }
}

uint64_t dtype_bits_from_int(uint8_t dtype, int64_t value) {
  switch (dtype) {
    case DT_I8:
    case DT_U8: return (uint8_t)(uint64_t)value;
    case DT_I16: return (uint16_t)(uint64_t)value;
    case DT_I32: return (uint32_t)(uint64_t)value;
    case DT_I64: return (uint64_t)value;
    case DT_BOOL: return value != 0;
    default: return dtype_bits_from_double(dtype, (double)value);
  }
}

/* ---- shapes and geometry ----------------------------------------------------------------------- */

int64_t shape_numel(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

void format_shape(char* text_out, size_t bytes, int ndim, const int64_t* shape) {
  oar_ps_format_shape(text_out, bytes, ndim, shape);
}

bool shape_equals(const ocl_tensor* t, int ndim, const int64_t* shape) {
  if (t->ndim != ndim) return false;
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d]) return false;
  return true;
}

oar_status shape_error(const char* op, const char* role, const ocl_tensor* got, int ndim, const int64_t* expected) {
  char got_text[160], expected_text[160];
  format_shape(got_text, sizeof got_text, got->ndim, got->shape);
  format_shape(expected_text, sizeof expected_text, ndim, expected);
  return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s has shape %s, expected %s", op, role, got_text,
                  expected_text);
}

oar_status normalize_dim(const char* op, const char* attr, int64_t dim, int32_t ndim, int32_t* out) {
  return oar_ps_normalize_dim(op, attr, dim, ndim, out);
}

void nd_geometry_strided(g_nd* g, int ndim, const int64_t* shape, const int64_t* const* strides,
                         const int64_t* offsets, int n, bool coalesce) {
  memset(g, 0, sizeof *g);
  g->ntensors = n;
  int64_t* rows[G_MAX_TENSORS];
  for (int t = 0; t < n; t++) {
    g->offset[t] = offsets[t];
    rows[t] = g->stride[t];
    for (int d = 0; d < ndim; d++) g->stride[t][d] = strides[t][d];
  }
  for (int d = 0; d < ndim; d++) g->shape[d] = shape[d];
  g->numel = shape_numel(ndim, shape);
  if (coalesce) { /* size-1 dims dropped, dims every tensor steps evenly across merged */
    g->ndim = oar_ps_collapse_dims(ndim, g->shape, n, rows);
  } else if (ndim == 0) { /* a scalar */
    g->shape[0] = 1;
    g->ndim = 1;
  } else {
    g->ndim = ndim;
  }
}

void nd_geometry(g_nd* g, int ndim, const int64_t* shape, const ocl_tensor* const* ts, int n, bool coalesce) {
  const int64_t* strides[G_MAX_TENSORS];
  int64_t offsets[G_MAX_TENSORS];
  for (int t = 0; t < n; t++) {
    strides[t] = ts[t]->strides;
    offsets[t] = ts[t]->offset;
  }
  nd_geometry_strided(g, ndim, shape, strides, offsets, n, coalesce);
}

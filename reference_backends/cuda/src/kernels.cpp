/* kernel_query / kernel_launch: the op table generated from interface/ops.yaml,
 * the dtype rules of oar/plugin_support.h, the descriptor / attribute / shape checks
 * every op shares, then the op's cu_op_<name> (see ops.h). */
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>

#include "entries.h"
#include "ops.h"
#include "cu_op_table.inc"

/* The index checks a device kernel can report (cu_device_status::op, enum cu_index_check): "op tensor". */
const char* const cu_index_check_names[] = {"embedding indices", "index_select indices", "gather indices",
                                            "scatter indices", "scatter_add indices", "index_add indices",
                                            "one_hot indices", "cross_entropy target",
                                            "cross_entropy_backward target"};
const int cu_index_check_count = (int)(sizeof cu_index_check_names / sizeof *cu_index_check_names);

namespace {
constexpr int kMaxDtypes = CU_KERNEL_MAX_INPUTS + CU_KERNEL_MAX_OUTPUTS;

struct cu_kernel {
  const op_def* op;
  int32_t device;
  uint32_t num_inputs, num_dtypes;
  uint8_t dtypes[kMaxDtypes];
};

const char* const dtype_names[DTYPE_COUNT] = {"float32", "float64", "float16", "bfloat16", "int8",
                                              "int16",   "int32",   "int64",   "uint8",    "bool"};
const int dtype_sizes[DTYPE_COUNT] = {4, 8, 2, 2, 1, 2, 4, 8, 1, 1};

bool dtype_from_dl(oar_dl_data_type dl, uint8_t* out) {
  if (dl.lanes != 1) return false;
  int id = -1;
  if (dl.code == OAR_DL_FLOAT) id = dl.bits == 32 ? DTYPE_F32 : dl.bits == 64 ? DTYPE_F64 : dl.bits == 16 ? DTYPE_F16 : -1;
  else if (dl.code == OAR_DL_BFLOAT && dl.bits == 16) id = DTYPE_BF16;
  else if (dl.code == OAR_DL_INT) id = dl.bits == 8 ? DTYPE_I8 : dl.bits == 16 ? DTYPE_I16 : dl.bits == 32 ? DTYPE_I32 : dl.bits == 64 ? DTYPE_I64 : -1;
  else if (dl.code == OAR_DL_UINT && dl.bits == 8) id = DTYPE_U8;
  else if (dl.code == OAR_DL_BOOL && dl.bits == 8) id = DTYPE_BOOL;
  if (id < 0) return false;
  *out = (uint8_t)id;
  return true;
}

/* The DLPack dtype of a valid id. */
oar_dl_data_type dtype_to_dl(uint8_t d) {
  static const oar_dl_data_type dl[DTYPE_COUNT] = {
      {OAR_DL_FLOAT, 32, 1}, {OAR_DL_FLOAT, 64, 1}, {OAR_DL_FLOAT, 16, 1}, {OAR_DL_BFLOAT, 16, 1}, {OAR_DL_INT, 8, 1},
      {OAR_DL_INT, 16, 1},   {OAR_DL_INT, 32, 1},   {OAR_DL_INT, 64, 1},   {OAR_DL_UINT, 8, 1},   {OAR_DL_BOOL, 8, 1}};
  return dl[d];
}

const op_def* find_op(const char* name) {
  for (size_t i = 0; i < GENERATED_OP_COUNT; i++)
    if (strcmp(generated_ops[i].name, name) == 0) return &generated_ops[i];
  return nullptr;
}

/* The dtypes ops.yaml lists for the op (context: the op_def). */
bool listed_dtype(const void* op, oar_dl_data_type dl) {
  uint8_t id = 0;
  return dtype_from_dl(dl, &id) && (static_cast<const op_def*>(op)->dtype_mask & (1u << id));
}

/* The dtypes a cast writes (context unused). */
bool castable_dtype(const void*, oar_dl_data_type dl) {
  uint8_t id = 0;
  return dtype_from_dl(dl, &id) && id != DTYPE_I16 && id != DTYPE_U8;
}

/* The op's dtype rule (the support library's group 7). */
bool supports(const op_def* op, const oar_dl_data_type* dtypes, uint32_t num_inputs, uint32_t num_dtypes) {
  oar_ps_dtype_rule rule{op->input_roles, op->kind == OP_KIND_BINARY || op->kind == OP_KIND_TERNARY, op->out_dtype,
                         dtype_to_dl(op->out_fixed_dtype)};
  return oar_ps_dtypes_allowed(&rule, dtypes, num_inputs, num_dtypes - num_inputs, listed_dtype, castable_dtype, op);
}

oar_status resolve_tensor(const cu_launch* L, const char* role, const oar_dl_tensor* t, uint8_t want,
                          cu_tensor* out) {
  const char* op = L->op->name;
  uint8_t dtype = 0;
  if (!dtype_from_dl(t->dtype, &dtype) || dtype != want)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s has dtype code %d bits %d, queried %s", op, role,
                   t->dtype.code, t->dtype.bits, dtype_names[want]);
  int size = dtype_sizes[dtype];
  oar_ps_layout layout;
  oar_status checked = oar_ps_check_descriptor(op, role, t, size, &layout);
  if (checked != OAR_SUCCESS) return checked;
  memset(out, 0, sizeof *out);
  out->dtype = dtype;
  out->ndim = t->ndim;
  for (int d = 0; d < t->ndim; d++) {
    out->shape[d] = layout.shape[d];
    out->strides[d] = layout.strides[d];
  }
  out->numel = layout.numel;
  if (layout.numel == 0) return OAR_SUCCESS; /* never touched; data may be NULL */
  if (t->device.device_type != OAR_DL_EXT_DEV || t->device.device_id != L->device)
    return cu_fail(OAR_ERROR_INVALID_HANDLE, "kernel_launch: %s: %s is on device (%d, %d), the stream on (%d, %d)", op,
                   role, (int)t->device.device_type, (int)t->device.device_id, OAR_DL_EXT_DEV, (int)L->device);
  char* data = (char*)layout.start;
  char what[64];
  snprintf(what, sizeof what, "%s: %s", op, role);
  oar_status status = cu_check_range("kernel_launch", what, L->device, data, (size_t)layout.extent_bytes);
  out->data = data;
  return status;
}

oar_status resolve_attrs(cu_launch* L, const oar_attr* attrs, size_t num_attrs) {
  return oar_ps_parse_attrs(L->op->name, L->op->attrs, L->op->num_attrs, attrs, num_attrs, L->attrs, dtype_from_dl);
}

bool same_shape(const cu_tensor& a, const cu_tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; d++)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

/* The generic shape rules of the elementwise kinds and of reductions. */
oar_status check_generic_shapes(cu_launch* L) {
  const op_def* op = L->op;
  const cu_tensor& out = L->out[0];
  if (op->kind == OP_KIND_UNARY || op->kind == OP_KIND_BINARY || op->kind == OP_KIND_TERNARY) {
    for (uint32_t i = 0; i < L->num_inputs; i++)
      if (!same_shape(L->in[i], out)) return op_fail(L, "input %s is not shaped like out (the host broadcasts)", op->input_names[i]);
    return OAR_SUCCESS;
  }
  if (op->kind != OP_KIND_REDUCTION || L->num_inputs != 1 || op->num_attrs == 0) return OAR_SUCCESS;
  const cu_tensor& x = L->in[0];
  const kernel_attr& dim = L->attrs[0];
  L->reduce_mask = 0;
  L->keepdim = false;
  for (uint32_t a = 0; a < op->num_attrs; a++)
    if (strcmp(op->attrs[a].name, "keepdim") == 0) L->keepdim = L->attrs[a].i != 0;
  if (dim.type == OAR_ATTR_INT) { /* softmax, log_softmax (out shaped like x), argmax */
    int32_t d = 0;
    if (x.ndim == 0 && (dim.i == 0 || dim.i == -1)) return OAR_SUCCESS;
    oar_status status = normalize_dim(L, "dim", dim.i, x.ndim, &d);
    if (status != OAR_SUCCESS) return status;
    L->reduce_mask = 1u << d;
    if (strcmp(op->name, "softmax") == 0 || strcmp(op->name, "log_softmax") == 0) {
      L->keepdim = true;
      return same_shape(x, out) ? OAR_SUCCESS : op_fail(L, "out is not shaped like x");
    }
  } else {
    if (dim.count == 0) L->reduce_mask = (1u << x.ndim) - 1;
    for (int32_t j = 0; j < dim.count; j++) {
      int32_t d = 0;
      oar_status status = normalize_dim(L, "dim", dim.v.ints[j], x.ndim, &d);
      if (status != OAR_SUCCESS) return status;
      if (L->reduce_mask & (1u << d)) return op_fail(L, "dim %d is given twice", d);
      L->reduce_mask |= 1u << d;
    }
  }
  int64_t want[CU_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < x.ndim; d++) {
    if (!(L->reduce_mask & (1u << d))) want[n++] = x.shape[d];
    else if (L->keepdim) want[n++] = 1;
  }
  bool ok = out.ndim == n;
  for (int d = 0; ok && d < n; d++) ok = out.shape[d] == want[d];
  return ok ? OAR_SUCCESS : op_fail(L, "out's shape does not match the reduction of x over dim (keepdim %d)", (int)L->keepdim);
}
}  // namespace

oar_status op_fail(const cu_launch* L, const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof text, format, args);
  va_end(args);
  return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s", L->op->name, text);
}

oar_status normalize_dim(const cu_launch* L, const char* attr, int64_t dim, int32_t ndim, int32_t* out) {
  return oar_ps_normalize_dim(L->op->name, attr, dim, ndim, out);
}

oar_status launch_result(const cu_launch* L, const char* what) {
  cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return OAR_SUCCESS;
  char call[128];
  snprintf(call, sizeof call, "kernel_launch: %s: launching %s", L->op->name, what);
  return cu_fail_cuda(error, call);
}

unsigned grid_for(int64_t count) {
  int64_t blocks = (count + CU_THREADS - 1) / CU_THREADS;
  return (unsigned)(blocks < 1 ? 1 : blocks > 65535 * 8 ? 65535 * 8 : blocks);
}

void expect_status(cu_launch* L) { L->stream->checked.store(true); }

cu_scratch::~cu_scratch() {
  for (void* block : blocks) cudaFreeAsync(block, stream);
}

oar_status cu_scratch::take(const cu_launch* L, size_t bytes, char** out) {
  void* block = nullptr;
  cudaError_t error = cudaMallocAsync(&block, bytes ? bytes : 1, stream);
  if (error != cudaSuccess) {
    char call[128];
    snprintf(call, sizeof call, "kernel_launch: %s: cudaMallocAsync of %zu scratch bytes", L->op->name, bytes);
    return cu_fail_cuda(error, call);
  }
  blocks.push_back(block);
  *out = (char*)block;
  return OAR_SUCCESS;
}

oar_status cu_kernel_query(int32_t device, const char* op_name, const oar_dl_data_type* dtypes, size_t num_dtypes,
                           oar_kernel* kernel) {
  CU_REQUIRE_INIT("kernel_query");
  oar_status status = cu_check_device("kernel_query", device);
  if (status != OAR_SUCCESS) return status;
  if (!op_name || !dtypes || !kernel) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_query: op, dtypes or kernel is NULL");
  const op_def* op = find_op(op_name);
  if (!op) return cu_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: the CUDA plugin has no kernel for op \"%s\"", op_name);
  if (num_dtypes < op->min_inputs + op->num_outputs || num_dtypes > op->max_inputs + op->num_outputs)
    return cu_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: %s takes %u..%u inputs and %u outputs, %zu dtypes given", op_name,
                   op->min_inputs, op->max_inputs, op->num_outputs, num_dtypes);
  cu_kernel k;
  memset(&k, 0, sizeof k);
  k.op = op;
  k.device = device;
  k.num_dtypes = (uint32_t)num_dtypes;
  k.num_inputs = (uint32_t)num_dtypes - op->num_outputs;
  std::string names;
  for (size_t i = 0; i < num_dtypes; i++) {
    if (!dtype_from_dl(dtypes[i], &k.dtypes[i]))
      return cu_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: %s: dtype %zu (code %d, bits %d) is not supported", op_name, i,
                     dtypes[i].code, dtypes[i].bits);
    names += (i ? ", " : "") + std::string(dtype_names[k.dtypes[i]]);
  }
  if (!supports(op, dtypes, k.num_inputs, k.num_dtypes))
    return cu_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: %s has no kernel for dtypes (%s)", op_name, names.c_str());
  std::string why;
  if (op->kind == OP_KIND_MATMUL && !cu_cublas_available(&why))
    return cu_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: %s runs on cuBLAS: %s", op_name, why.c_str());
  *kernel = (oar_kernel)(uintptr_t)cu_handle_add(CU_KERNEL, std::make_shared<cu_kernel>(k));
  return OAR_SUCCESS;
}

oar_status cu_kernel_launch(oar_stream stream, oar_kernel kernel, const oar_dl_tensor* inputs, size_t num_inputs,
                            const oar_dl_tensor* outputs, size_t num_outputs, const oar_attr* attrs, size_t num_attrs) {
  CU_REQUIRE_INIT("kernel_launch");
  std::shared_ptr<cu_stream> s;
  oar_status status = cu_stream_get("kernel_launch", stream, &s);
  if (status != OAR_SUCCESS) return status;
  auto k = std::static_pointer_cast<cu_kernel>(cu_handle_get(CU_KERNEL, (uint64_t)(uintptr_t)kernel));
  if (!k) return cu_fail(OAR_ERROR_INVALID_HANDLE, "kernel_launch: kernel %p is not a kernel of this plugin", (void*)kernel);
  if (k->device != s->device)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s was queried for device %d, the stream is on device %d",
                   k->op->name, (int)k->device, (int)s->device);
  cu_launch* L = new cu_launch();
  std::unique_ptr<cu_launch> owner(L);
  L->stream = s.get();
  L->device = s->device;
  L->op = k->op;
  L->num_inputs = (uint32_t)num_inputs;
  L->num_outputs = (uint32_t)num_outputs;
  if (num_inputs != k->num_inputs || num_outputs != k->op->num_outputs || (num_inputs && !inputs) || (num_outputs && !outputs))
    return op_fail(L, "%zu inputs and %zu outputs given, queried %u and %u", num_inputs, num_outputs, k->num_inputs,
                   k->op->num_outputs);
  for (size_t i = 0; i < num_inputs; i++)
    if ((status = resolve_tensor(L, k->op->input_names[i], &inputs[i], k->dtypes[i], &L->in[i])) != OAR_SUCCESS) return status;
  for (size_t o = 0; o < num_outputs; o++)
    if ((status = resolve_tensor(L, k->op->output_names[o], &outputs[o], k->dtypes[num_inputs + o], &L->out[o])) != OAR_SUCCESS)
      return status;
  if ((status = resolve_attrs(L, attrs, num_attrs)) != OAR_SUCCESS || (status = check_generic_shapes(L)) != OAR_SUCCESS ||
      (status = cu_use_device("kernel_launch", s->device)) != OAR_SUCCESS)
    return status;
  std::lock_guard<std::mutex> guard(s->launch_lock);
  return k->op->run(L);
}

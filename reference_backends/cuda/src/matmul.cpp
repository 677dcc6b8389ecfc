/* matmul and bmm through cuBLAS (cublasSgemmStridedBatched /
 * cublasDgemmStridedBatched, loaded at run time), one cuBLAS handle per
 * stream. Operands that are not compact row-major are copied into
 * stream-ordered scratch (cudaMallocAsync) first; so is the result when out
 * is strided. */
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "ops.h"

namespace {
/* cuBLAS's C API as its documentation gives it (no cublas_v2.h needed to build). */
typedef struct cublas_context* cublas_handle;
typedef int cublas_status; /* CUBLAS_STATUS_SUCCESS == 0 */
enum { CUBLAS_OP_N_ = 0 };
struct cublas_api {
  cublas_status (*Create)(cublas_handle*);
  cublas_status (*Destroy)(cublas_handle);
  cublas_status (*SetStream)(cublas_handle, cudaStream_t);
  cublas_status (*SgemmStridedBatched)(cublas_handle, int, int, int, int, int, const float*, const float*, int,
                                       long long, const float*, int, long long, const float*, float*, int, long long,
                                       int);
  cublas_status (*DgemmStridedBatched)(cublas_handle, int, int, int, int, int, const double*, const double*, int,
                                       long long, const double*, int, long long, const double*, double*, int,
                                       long long, int);
};

std::once_flag cublas_once;
cublas_api cublas;
bool cublas_loaded = false;
std::string cublas_error;

void load_cublas() {
  static const char* const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so", nullptr};
  std::string tried;
  void* library = cu_open_library(names, &tried);
  if (!library) {
    cublas_error = "cuBLAS not found (tried " + tried + ")";
    return;
  }
  struct {
    const char* name;
    void** slot;
  } symbols[] = {{"cublasCreate_v2", (void**)&cublas.Create},
                 {"cublasDestroy_v2", (void**)&cublas.Destroy},
                 {"cublasSetStream_v2", (void**)&cublas.SetStream},
                 {"cublasSgemmStridedBatched", (void**)&cublas.SgemmStridedBatched},
                 {"cublasDgemmStridedBatched", (void**)&cublas.DgemmStridedBatched}};
  for (auto& symbol : symbols)
    if (!(*symbol.slot = dlsym(library, symbol.name))) {
      cublas_error = std::string("cuBLAS has no ") + symbol.name;
      return;
    }
  cublas_loaded = true; /* stays loaded until the process exits */
}

bool compact(const cu_tensor& t) {
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; d--) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

cu_tensor compact_like(const cu_tensor& t, char* data) {
  cu_tensor c = t;
  c.data = data;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; d--) {
    c.strides[d] = stride;
    stride *= t.shape[d];
  }
  return c;
}

}  // namespace

struct cu_cublas {
  cublas_handle handle;
};

void cu_cublas_release(cu_cublas* c) {
  if (!c) return;
  cublas.Destroy(c->handle);
  delete c;
}

bool cu_cublas_available(std::string* why) {
  std::call_once(cublas_once, load_cublas);
  if (!cublas_loaded) *why = cublas_error;
  return cublas_loaded;
}

static oar_status run_gemm(cu_launch* L) {
  const cu_tensor &a = L->in[0], &b = L->in[1], &out = L->out[0];
  int n = a.ndim;
  if (n < 2 || b.ndim != n || out.ndim != n) return op_fail(L, "a, b and out need the same ndim >= 2");
  int64_t M = a.shape[n - 2], K = a.shape[n - 1], N = b.shape[n - 1], batch = 1;
  if (b.shape[n - 2] != K || out.shape[n - 2] != M || out.shape[n - 1] != N)
    return op_fail(L, "a [.., %lld, %lld] @ b [.., %lld, %lld] does not give out [.., %lld, %lld]", (long long)M,
                   (long long)K, (long long)b.shape[n - 2], (long long)N, (long long)out.shape[n - 2],
                   (long long)out.shape[n - 1]);
  for (int d = 0; d < n - 2; d++) {
    if (a.shape[d] != out.shape[d] || b.shape[d] != out.shape[d])
      return op_fail(L, "batch dim %d differs between a, b and out (the host expands them)", d);
    batch *= out.shape[d];
  }
  if (out.numel == 0) return OAR_SUCCESS;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX)
    return op_fail(L, "a dimension exceeds cuBLAS's int range");
  std::string why;
  if (!cu_cublas_available(&why)) return cu_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_launch: %s: %s", L->op->name, why.c_str());
  cu_stream* s = L->stream;
  if (!s->cublas) {
    cublas_handle handle = nullptr;
    cublas_status result = cublas.Create(&handle);
    if (result != 0) return cu_fail(OAR_ERROR_INTERNAL, "kernel_launch: %s: cublasCreate failed with status %d", L->op->name, result);
    if ((result = cublas.SetStream(handle, s->stream)) != 0) {
      cublas.Destroy(handle);
      return cu_fail(OAR_ERROR_INTERNAL, "kernel_launch: %s: cublasSetStream failed with status %d", L->op->name, result);
    }
    s->cublas = new cu_cublas{handle};
  }
  size_t elem = out.dtype == DTYPE_F64 ? 8 : 4;
  cu_scratch temp(s->stream);
  oar_status status = OAR_SUCCESS;
  cu_tensor ca = a, cb = b, cc = out;
  if (!compact(a) && ((status = temp.take(L, a.numel * elem, &ca.data)) != OAR_SUCCESS ||
                      (status = cu_copy_tensor(L, ca = compact_like(a, ca.data), a)) != OAR_SUCCESS))
    return status;
  if (!compact(b) && ((status = temp.take(L, b.numel * elem, &cb.data)) != OAR_SUCCESS ||
                      (status = cu_copy_tensor(L, cb = compact_like(b, cb.data), b)) != OAR_SUCCESS))
    return status;
  bool out_compact = compact(out);
  if (!out_compact) {
    if ((status = temp.take(L, out.numel * elem, &cc.data)) != OAR_SUCCESS) return status;
    cc = compact_like(out, cc.data);
  }
  /* row-major C = A B is column-major C^T = B^T A^T: swap the operands */
  cublas_status result;
  if (out.dtype == DTYPE_F64) {
    const double one = 1.0, zero = 0.0;
    result = cublas.DgemmStridedBatched(s->cublas->handle, CUBLAS_OP_N_, CUBLAS_OP_N_, (int)N, (int)M, (int)K, &one,
                                        (const double*)cb.data, (int)N, K * N, (const double*)ca.data, (int)K, M * K,
                                        &zero, (double*)cc.data, (int)N, M * N, (int)batch);
  } else {
    const float one = 1.0f, zero = 0.0f;
    result = cublas.SgemmStridedBatched(s->cublas->handle, CUBLAS_OP_N_, CUBLAS_OP_N_, (int)N, (int)M, (int)K, &one,
                                        (const float*)cb.data, (int)N, K * N, (const float*)ca.data, (int)K, M * K,
                                        &zero, (float*)cc.data, (int)N, M * N, (int)batch);
  }
  if (result != 0)
    return cu_fail(OAR_ERROR_INTERNAL, "kernel_launch: %s: cublas%cgemmStridedBatched (m %lld, n %lld, k %lld, batch %lld) failed with status %d",
                   L->op->name, out.dtype == DTYPE_F64 ? 'D' : 'S', (long long)N, (long long)M, (long long)K,
                   (long long)batch, result);
  if (!out_compact) return cu_copy_tensor(L, out, cc);
  return OAR_SUCCESS;
}

oar_status cu_op_matmul(cu_launch* L) { return run_gemm(L); }
oar_status cu_op_bmm(cu_launch* L) {
  if (L->in[0].ndim != 3) return op_fail(L, "a and b must be 3-D");
  return run_gemm(L);
}

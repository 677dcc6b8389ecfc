/* matmul: a [..., M, K] @ b [..., K, N] -> out [..., M, N] through the BLAS
   (scipy_cblas_sgemm); matrices BLAS cannot address go through a scratch copy. */
#include "kernels.h"

#include <cblas.h>
#include <stdlib.h>

/* How BLAS reads one operand: in place (row- or column-major) or via scratch. */
typedef struct matrix_access {
  tensor_view view;  /* the last two dims; data set per batch */
  bool direct;
  bool transposed;   /* true: stored column-major */
  int64_t ld;
  float* scratch;    /* compact row-major copy when !direct */
} matrix_access;

typedef struct matmul_context {
  int64_t m, n, k;
  matrix_access a, b, out;
  bool out_column_major;
} matmul_context;

/* A rows x cols matrix with element strides is BLAS-addressable when one stride
   is 1 and the other covers the row (or column); strides of size-1 dims are free. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                        bool* transposed, int64_t* ld) {
  int64_t row_major_ld = cols > 1 ? cols : 1;
  if ((cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= row_major_ld)) {
    *transposed = false;
    *ld = rows <= 1 ? row_major_ld : row_stride;
    return *ld <= INT32_MAX;
  }
  int64_t column_major_ld = rows > 1 ? rows : 1;
  if ((rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= column_major_ld)) {
    *transposed = true;
    *ld = cols <= 1 ? column_major_ld : col_stride;
    return *ld <= INT32_MAX;
  }
  return false;
}

static void plan_access(matrix_access* access, const tensor_view* full, int64_t rows, int64_t cols) {
  int n = full->ndim;
  access->view = (tensor_view){.ndim = 2, .elem_size = full->elem_size, .dtype = full->dtype,
                               .shape = {rows, cols},
                               .strides = {full->strides[n - 2], full->strides[n - 1]}};
  access->direct = blas_layout(rows, cols, full->strides[n - 2], full->strides[n - 1],
                               &access->transposed, &access->ld);
  if (!access->direct) {
    access->transposed = false;
    access->ld = cols > 1 ? cols : 1;
  }
}

static tensor_view compact_view(const matrix_access* access, float* data) {
  tensor_view view = access->view;
  view.data = (char*)data;
  view.strides[0] = access->view.shape[1];
  view.strides[1] = 1;
  return view;
}

static void gemm_one(const matmul_context* mm, char* a_data, char* b_data, char* out_data) {
  const float* a = (const float*)a_data;
  const float* b = (const float*)b_data;
  float* out = mm->out.direct ? (float*)out_data : mm->out.scratch;
  if (!mm->a.direct) {
    tensor_view source = mm->a.view, target = compact_view(&mm->a, mm->a.scratch);
    source.data = a_data;
    copy_strided(&target, &source);
    a = mm->a.scratch;
  }
  if (!mm->b.direct) {
    tensor_view source = mm->b.view, target = compact_view(&mm->b, mm->b.scratch);
    source.data = b_data;
    copy_strided(&target, &source);
    b = mm->b.scratch;
  }
  if (mm->out_column_major) {
    /* Column-major call: an operand stored row-major is its own transpose there. */
    scipy_cblas_sgemm(CblasColMajor, mm->a.transposed ? CblasNoTrans : CblasTrans,
                      mm->b.transposed ? CblasNoTrans : CblasTrans, (blasint)mm->m,
                      (blasint)mm->n, (blasint)mm->k, 1.0f, a, (blasint)mm->a.ld, b,
                      (blasint)mm->b.ld, 0.0f, out, (blasint)mm->out.ld);
  } else {
    scipy_cblas_sgemm(CblasRowMajor, mm->a.transposed ? CblasTrans : CblasNoTrans,
                      mm->b.transposed ? CblasTrans : CblasNoTrans, (blasint)mm->m,
                      (blasint)mm->n, (blasint)mm->k, 1.0f, a, (blasint)mm->a.ld, b,
                      (blasint)mm->b.ld, 0.0f, out, (blasint)mm->out.ld);
  }
  if (!mm->out.direct) {
    tensor_view target = mm->out.view, source = compact_view(&mm->out, mm->out.scratch);
    target.data = out_data;
    copy_strided(&target, &source);
  }
}

/* One row of the batch odometer: one gemm per batch index. */
static void batch_row(char* const* p, const int64_t* s, int64_t count, void* opaque) {
  const matmul_context* mm = opaque;
  for (int64_t i = 0; i < count; i++) gemm_one(mm, p[0] + i * s[0], p[1] + i * s[1], p[2] + i * s[2]);
}

static void zero_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  (void)opaque;
  for (int64_t i = 0; i < n; i++) *(float*)(p[0] + i * s[0]) = 0.0f;
}

oar_status run_matmul(const kernel_command* kernel) {
  const tensor_view *a = &kernel->inputs[0], *b = &kernel->inputs[1], *out = &kernel->output;
  int n = a->ndim;
  matmul_context mm = {.m = a->shape[n - 2], .k = a->shape[n - 1], .n = b->shape[n - 1]};
  if (shape_numel(out->ndim, out->shape) == 0) return OAR_SUCCESS;
  if (mm.k == 0) {
    /* An empty sum: zeros, without reading a or b (they hold no data). */
    const tensor_view* views[1] = {out};
    strided_plan plan;
    strided_plan_views(&plan, 1, views);
    char* base[1] = {out->data};
    strided_for_each_row(&plan, base, zero_row, NULL);
    return OAR_SUCCESS;
  }
  plan_access(&mm.a, a, mm.m, mm.k);
  plan_access(&mm.b, b, mm.k, mm.n);
  plan_access(&mm.out, out, mm.m, mm.n);
  mm.out_column_major = mm.out.direct && mm.out.transposed;

  oar_status status = OAR_SUCCESS;
  matrix_access* accesses[3] = {&mm.a, &mm.b, &mm.out};
  for (int i = 0; i < 3; i++) {
    matrix_access* access = accesses[i];
    if (access->direct) continue;
    access->scratch = malloc((size_t)(access->view.shape[0] * access->view.shape[1]) * sizeof(float));
    if (!access->scratch)
      status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel matmul: out of host memory for a scratch matrix");
  }
  if (status == OAR_SUCCESS) {
    const int64_t* batch_strides[3] = {a->strides, b->strides, out->strides};
    int sizes[3] = {sizeof(float), sizeof(float), sizeof(float)};
    strided_plan batches;
    strided_plan_make(&batches, n - 2, a->shape, 3, batch_strides, sizes);
    char* bases[3] = {a->data, b->data, out->data};
    strided_for_each_row(&batches, bases, batch_row, &mm);
  }
  for (int i = 0; i < 3; i++) free(accesses[i]->scratch);
  return status;
}

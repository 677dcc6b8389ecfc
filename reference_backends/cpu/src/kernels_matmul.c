/* matmul and bmm: a [..., M, K] @ b [..., K, N] -> out [..., M, N] through the
   BLAS (scipy_cblas_sgemm / scipy_cblas_dgemm). Operands stored row- or
   column-major are passed as BLAS (trans)poses in place; others go through a
   compact scratch copy. Batch dims that b broadcasts (stride 0) fold into M
   when a and out allow, so x [B, T, K] @ w [K, N] is one gemm. Many gemms (or
   row / column blocks of a small one) run on the plugin's pool, the BLAS
   single-threaded; a large gemm is one BLAS call on all threads, so B is
   packed once. */
#include "kernels_nn_util.h"

#include <cblas.h>
#include <inttypes.h>
#include <stdlib.h>

/* How BLAS reads one matrix operand: in place (row- or column-major) or via scratch. */
typedef struct matrix_access {
  tensor_view view;  /* the matrix (2 dims); data set per batch */
  bool direct;
  bool transposed;   /* true: stored column-major */
  int64_t ld;
} matrix_access;

typedef struct matmul_plan {
  bool f64;
  int64_t m, n, k;
  matrix_access a, b, out;
  bool out_column_major;
  int batch_ndim;                   /* batch dims left after folding */
  int64_t batch_shape[REFCPU_MAX_DIMS];
  int64_t batch_strides[3][REFCPU_MAX_DIMS]; /* elements: a, b, out */
  int64_t batches;
  char *a_data, *b_data, *out_data;
  char* scratch;                    /* per chunk: the non-direct matrices */
  size_t scratch_per_chunk;         /* bytes */
  int64_t row_blocks, col_blocks;   /* blocks per gemm for the pool */
  int64_t block_rows, block_cols;
} matmul_plan;

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

static void plan_access(matrix_access* access, const tensor_view* full, int64_t rows, int64_t cols,
                        int64_t row_stride, int64_t col_stride) {
  access->view = (tensor_view){.ndim = 2, .elem_size = full->elem_size, .dtype = full->dtype,
                               .shape = {rows, cols}, .strides = {row_stride, col_stride}};
  access->direct = blas_layout(rows, cols, row_stride, col_stride, &access->transposed, &access->ld);
  if (!access->direct) {
    access->transposed = false;
    access->ld = cols > 1 ? cols : 1;
  }
}

static size_t access_scratch_bytes(const matrix_access* access) {
  if (access->direct) return 0;
  return (size_t)(access->view.shape[0] * access->view.shape[1] * access->view.elem_size);
}

static void gemm_call(bool f64, bool column_major, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb, void* c,
                      int64_t ldc) {
  enum CBLAS_ORDER order = column_major ? CblasColMajor : CblasRowMajor;
  enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if (f64)
    scipy_cblas_dgemm(order, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0, a, (blasint)lda, b,
                      (blasint)ldb, 0.0, c, (blasint)ldc);
  else
    scipy_cblas_sgemm(order, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0f, a, (blasint)lda, b,
                      (blasint)ldb, 0.0f, c, (blasint)ldc);
}

/* Element offset of (row, col) in a matrix as BLAS reads it (packed ones are row-major). */
static int64_t element_at(const matrix_access* x, int64_t row, int64_t col) {
  return x->transposed ? row + col * x->ld : row * x->ld + col;
}

/* Rows [row0, row0 + rows) x columns [col0, col0 + cols) of one gemm; scratch
   holds room for the non-direct operands (then the block is the whole matrix). */
static void gemm_block(const matmul_plan* mm, char* a_data, char* b_data, char* out_data,
                       int64_t row0, int64_t rows, int64_t col0, int64_t cols, char* scratch) {
  int elem = mm->a.view.elem_size;
  const char* a = a_data;
  const char* b = b_data;
  char* out = out_data;
  if (!mm->a.direct) {
    nn_pack(scratch, a_data, 2, mm->a.view.shape, mm->a.view.strides, elem);
    a = scratch;
    scratch += access_scratch_bytes(&mm->a);
  }
  if (!mm->b.direct) {
    nn_pack(scratch, b_data, 2, mm->b.view.shape, mm->b.view.strides, elem);
    b = scratch;
    scratch += access_scratch_bytes(&mm->b);
  }
  if (!mm->out.direct) out = scratch;
  a += element_at(&mm->a, row0, 0) * elem;
  b += element_at(&mm->b, 0, col0) * elem;
  out += element_at(&mm->out, row0, col0) * elem;
  if (mm->out_column_major) {
    /* Column-major call computes out^T = b^T a^T: an operand stored row-major
       is its own transpose there. */
    gemm_call(mm->f64, true, !mm->a.transposed, !mm->b.transposed, rows, cols, mm->k, a,
              mm->a.ld, b, mm->b.ld, out, mm->out.ld);
  } else {
    gemm_call(mm->f64, false, mm->a.transposed, mm->b.transposed, rows, cols, mm->k, a, mm->a.ld,
              b, mm->b.ld, out, mm->out.ld);
  }
  if (!mm->out.direct)
    nn_unpack(out_data, out, 2, mm->out.view.shape, mm->out.view.strides, elem);
}

/* Items are (batch, row block, column block), row-major. */
static void block_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const matmul_plan* mm = opaque;
  char* scratch = mm->scratch ? mm->scratch + (size_t)chunk * mm->scratch_per_chunk : NULL;
  int elem = mm->a.view.elem_size;
  int64_t per_batch = mm->row_blocks * mm->col_blocks;
  for (int64_t item = begin; item < end; item++) {
    int64_t batch = item / per_batch, block = item % per_batch;
    int64_t row0 = (block / mm->col_blocks) * mm->block_rows;
    int64_t col0 = (block % mm->col_blocks) * mm->block_cols;
    int64_t rows = mm->m - row0 < mm->block_rows ? mm->m - row0 : mm->block_rows;
    int64_t cols = mm->n - col0 < mm->block_cols ? mm->n - col0 : mm->block_cols;
    char* a = mm->a_data + nn_offset_of(batch, mm->batch_ndim, mm->batch_shape, mm->batch_strides[0]) * elem;
    char* b = mm->b_data + nn_offset_of(batch, mm->batch_ndim, mm->batch_shape, mm->batch_strides[1]) * elem;
    char* out = mm->out_data + nn_offset_of(batch, mm->batch_ndim, mm->batch_shape, mm->batch_strides[2]) * elem;
    gemm_block(mm, a, b, out, row0, rows, col0, cols, scratch);
  }
}


/* A gemm with m, n and k all at least this runs as one BLAS call on all
   threads: row blocks of it would each re-pack B (0.43x numpy at 1024^3 on an
   idle AVX-512 Xeon). Skinny gemms keep the pool split: on a loaded machine
   OpenBLAS's threaded [64,1024]@[1024,1024] ran at 0.6-1.0 GFLOP/s, the pool's
   at 3-5. */
#define THREADED_GEMM_MIN_DIM 512

/* OpenBLAS's thread count is process-wide: one threaded call at a time, and
   no one resets the count while it runs. */
static pthread_mutex_t threaded_gemm_lock = PTHREAD_MUTEX_INITIALIZER;

/* The BLAS runs one thread per call by default: the plugin's pool splits the
   work. Every BLAS user (matmul, conv, weight_only_linear) calls this before
   its BLAS calls; only run_threaded_gemms raises the count, and restores it. */
void refcpu_blas_one_thread(void) {
  if (scipy_openblas_get_num_threads() == 1) return; /* the common case: no lock */
  pthread_mutex_lock(&threaded_gemm_lock);
  scipy_openblas_set_num_threads(1);
  pthread_mutex_unlock(&threaded_gemm_lock);
}

/* Runs the gemms of mm one after another, each one BLAS call on all threads. */
static void run_threaded_gemms(const matmul_plan* mm, int threads) {
  pthread_mutex_lock(&threaded_gemm_lock);
  scipy_openblas_set_num_threads(threads);
  block_range((void*)mm, 0, mm->batches, 0);
  scipy_openblas_set_num_threads(1);
  pthread_mutex_unlock(&threaded_gemm_lock);
}

/* True when the BLAS should thread the gemms itself: few, large in every dim, all operands direct. */
static bool wants_threaded_gemm(const matmul_plan* mm, int threads) {
  return threads >= 2 && mm->batches < (int64_t)threads * 4 && mm->m >= THREADED_GEMM_MIN_DIM &&
         mm->n >= THREADED_GEMM_MIN_DIM && mm->k >= THREADED_GEMM_MIN_DIM && mm->a.direct &&
         mm->b.direct && mm->out.direct;
}

/* Splits the gemms of mm into blocks for the pool: whole gemms when there are
   enough of them, else row (or column) blocks of at least 32, all operands direct. */
static void plan_blocks(matmul_plan* mm) {
  mm->row_blocks = mm->col_blocks = 1;
  mm->block_rows = mm->m;
  mm->block_cols = mm->n;
  int threads = g_refcpu.config.threads;
  int64_t wanted = (int64_t)threads * 4;
  if (threads < 2 || mm->batches >= wanted || !mm->a.direct || !mm->b.direct || !mm->out.direct)
    return;
  int64_t per_gemm = (wanted + mm->batches - 1) / mm->batches;
  if (mm->m >= mm->n) {
    int64_t blocks = mm->m / 32 < per_gemm ? mm->m / 32 : per_gemm;
    if (blocks > 1) {
      mm->block_rows = (mm->m + blocks - 1) / blocks;
      mm->row_blocks = (mm->m + mm->block_rows - 1) / mm->block_rows;
    }
  } else {
    int64_t blocks = mm->n / 32 < per_gemm ? mm->n / 32 : per_gemm;
    if (blocks > 1) {
      mm->block_cols = (mm->n + blocks - 1) / blocks;
      mm->col_blocks = (mm->n + mm->block_cols - 1) / mm->block_cols;
    }
  }
}

/* Folds the batch dims into M when b does not move along them (stride 0) and
   a's and out's batch + M dims are one run each that BLAS reads row-major. */
static bool fold_batches_into_m(const tensor_view* a, const tensor_view* b, const tensor_view* out,
                                int64_t* a_row_stride, int64_t* out_row_stride) {
  int n = a->ndim;
  bool any = false;
  for (int d = 0; d < n - 2; d++) {
    if (a->shape[d] == 1) continue;
    if (b->strides[d] != 0) return false;
    any = true;
  }
  if (!any || shape_numel(n - 1, a->shape) > INT32_MAX) return false; /* the 32-bit BLAS */
  if (!nn_block_is_linear(n - 1, a->shape, a->strides, a_row_stride) ||
      !nn_block_is_linear(n - 1, out->shape, out->strides, out_row_stride))
    return false;
  /* Row-major with a full row per stride, or BLAS would need a copy of it all. */
  int64_t k = a->shape[n - 1], cols = out->shape[n - 1];
  return (k <= 1 || a->strides[n - 1] == 1) && *a_row_stride >= k &&
         (cols <= 1 || out->strides[n - 1] == 1) && *out_row_stride >= cols;
}

static oar_status run_matmul_common(const kernel_command* cmd, const char* op) {
  const tensor_view *a = &cmd->inputs[0], *b = &cmd->inputs[1], *out = &cmd->outputs[0];
  int n = a->ndim;
  matmul_plan mm = {.f64 = out->dtype == DTYPE_F64, .m = a->shape[n - 2], .k = a->shape[n - 1],
                    .n = b->shape[n - 1], .a_data = a->data, .b_data = b->data,
                    .out_data = out->data};
  if (view_numel(out) == 0) return OAR_SUCCESS;
  if (mm.k == 0) {
    nn_zero_view(out); /* an empty sum, without reading a or b (they hold no data) */
    return OAR_SUCCESS;
  }
  int64_t a_row_stride = 0, out_row_stride = 0;
  if (fold_batches_into_m(a, b, out, &a_row_stride, &out_row_stride)) {
    int64_t folded_m = shape_numel(n - 1, a->shape);
    mm.m = folded_m;
    mm.batch_ndim = 0;
    plan_access(&mm.a, a, folded_m, mm.k, a_row_stride, a->strides[n - 1]);
    plan_access(&mm.out, out, folded_m, mm.n, out_row_stride, out->strides[n - 1]);
  } else {
    mm.batch_ndim = n - 2;
    for (int d = 0; d < n - 2; d++) {
      mm.batch_shape[d] = a->shape[d];
      mm.batch_strides[0][d] = a->strides[d];
      mm.batch_strides[1][d] = b->strides[d];
      mm.batch_strides[2][d] = out->strides[d];
    }
    plan_access(&mm.a, a, mm.m, mm.k, a->strides[n - 2], a->strides[n - 1]);
    plan_access(&mm.out, out, mm.m, mm.n, out->strides[n - 2], out->strides[n - 1]);
  }
  plan_access(&mm.b, b, mm.k, mm.n, b->strides[n - 2], b->strides[n - 1]);
  mm.out_column_major = mm.out.direct && mm.out.transposed;
  mm.batches = shape_numel(mm.batch_ndim, mm.batch_shape);

  refcpu_blas_one_thread();
  int threads = g_refcpu.config.threads;
  if (wants_threaded_gemm(&mm, threads)) {
    mm.row_blocks = mm.col_blocks = 1;
    mm.block_rows = mm.m;
    mm.block_cols = mm.n;
    run_threaded_gemms(&mm, threads);
    return OAR_SUCCESS;
  }
  plan_blocks(&mm);
  int64_t items = mm.batches * mm.row_blocks * mm.col_blocks;
  double volume = (double)mm.m * (double)mm.n * (double)mm.k;
  int chunks = nn_chunk_count(items, 2.0 * volume / (double)(mm.row_blocks * mm.col_blocks));
  mm.scratch_per_chunk =
      access_scratch_bytes(&mm.a) + access_scratch_bytes(&mm.b) + access_scratch_bytes(&mm.out);
  if (mm.scratch_per_chunk) {
    mm.scratch = malloc(mm.scratch_per_chunk * (size_t)chunks);
    if (!mm.scratch)
      return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory for a scratch matrix", op);
  }
  nn_parallel_for(items, chunks, block_range, &mm);
  free(mm.scratch);
  return OAR_SUCCESS;
}

static oar_status check_matmul_common(const kernel_command* cmd, const char* op) {
  const tensor_view *a = &cmd->inputs[0], *b = &cmd->inputs[1], *out = &cmd->outputs[0];
  int n = a->ndim;
  if (n < 2 || b->ndim != n || out->ndim != n)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: a, b and out need the same ndim >= 2 (got %d, %d, %d; "
                       "the host broadcasts batch dims)",
                       op, a->ndim, b->ndim, out->ndim);
  for (int d = 0; d < n - 2; d++)
    if (a->shape[d] != b->shape[d] || a->shape[d] != out->shape[d])
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: %s: batch dim %d differs: a %" PRId64 ", b %" PRId64
                         ", out %" PRId64,
                         op, d, a->shape[d], b->shape[d], out->shape[d]);
  int64_t m = a->shape[n - 2], k = a->shape[n - 1], n_cols = b->shape[n - 1];
  if (b->shape[n - 2] != k)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: a is [..., %" PRId64 ", %" PRId64 "] but b is [..., %" PRId64
                       ", %" PRId64 "]",
                       op, m, k, b->shape[n - 2], n_cols);
  if (out->shape[n - 2] != m || out->shape[n - 1] != n_cols)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: out is [..., %" PRId64 ", %" PRId64 "], expected [..., %" PRId64
                       ", %" PRId64 "]",
                       op, out->shape[n - 2], out->shape[n - 1], m, n_cols);
  if (m > INT32_MAX || k > INT32_MAX || n_cols > INT32_MAX)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: M, N, K must fit the 32-bit BLAS", op);
  return OAR_SUCCESS;
}

oar_status refcpu_check_matmul(kernel_command* cmd) { return check_matmul_common(cmd, "matmul"); }
oar_status refcpu_run_matmul(const kernel_command* cmd) { return run_matmul_common(cmd, "matmul"); }

oar_status refcpu_check_bmm(kernel_command* cmd) {
  if (cmd->inputs[0].ndim != 3 || cmd->inputs[1].ndim != 3 || cmd->outputs[0].ndim != 3)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: bmm: a, b and out must be 3-D (got %d, %d, %d dims)",
                       cmd->inputs[0].ndim, cmd->inputs[1].ndim, cmd->outputs[0].ndim);
  return check_matmul_common(cmd, "bmm");
}
oar_status refcpu_run_bmm(const kernel_command* cmd) { return run_matmul_common(cmd, "bmm"); }

/* Recurrent cell kernels: lstm_cell and gru_cell, the pointwise part of one LSTM/GRU step after
   the gate matmuls (float32, float64; torch's gate order). Every operand is [N, k*H]; strided
   operands are packed into a compact copy first and a strided output is written through one.
   Rows are split over the plugin's pool; the loop over a row's H columns has no dependences. */
#include "kernels.h"

#include "kernels_nn_util.h"

#include <math.h>
#include <stdlib.h>

#define RNN_MAX_OPERANDS 4

typedef struct rnn_job {
  bool f64;
  int64_t h;
  const char* in[RNN_MAX_OPERANDS - 1]; /* compact inputs, in launch order */
  char* out;                            /* compact output */
} rnn_job;

/* ---- typed rows ------------------------------------------------------------------------------ */

#define RNN_ROWS(T, SUFFIX, EXP, TANH)                                                                 \
  static inline T sigmoid_##SUFFIX(T x) { return (T)1 / ((T)1 + EXP(-x)); }                          \
                                                                                                       \
  /* gates [4H] = [i | f | g | o], c_prev [H] -> out [2H] = [h | c] */                                \
  static void lstm_row_##SUFFIX(const T* restrict gates, const T* restrict c_prev, T* restrict out,     \
                                int64_t h) {                                                           \
    for (int64_t k = 0; k < h; k++) {                                                                  \
      T c = sigmoid_##SUFFIX(gates[h + k]) * c_prev[k] + sigmoid_##SUFFIX(gates[k]) * TANH(gates[2 * h + k]); \
      out[k] = sigmoid_##SUFFIX(gates[3 * h + k]) * TANH(c);                                           \
      out[h + k] = c;                                                                                  \
    }                                                                                                  \
  }                                                                                                    \
                                                                                                       \
  /* x [3H] = [r | z | n] input gates, hg [3H] the hidden ones, h_prev [H] -> out [H] */               \
  static void gru_row_##SUFFIX(const T* restrict x, const T* restrict hg, const T* restrict h_prev,    \
                               T* restrict out, int64_t h) {                                           \
    for (int64_t k = 0; k < h; k++) {                                                                  \
      T r = sigmoid_##SUFFIX(x[k] + hg[k]);                                                            \
      T z = sigmoid_##SUFFIX(x[h + k] + hg[h + k]);                                                    \
      T n = TANH(x[2 * h + k] + r * hg[2 * h + k]);                                                    \
      out[k] = n + z * (h_prev[k] - n);                                                                \
    }                                                                                                  \
  }

RNN_ROWS(float, f32, expf, tanhf)
RNN_ROWS(double, f64, exp, tanh)

static void lstm_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const rnn_job* job = opaque;
  int64_t h = job->h;
  for (int64_t row = begin; row < end; row++) {
    if (job->f64) {
      lstm_row_f64((const double*)job->in[0] + row * 4 * h, (const double*)job->in[1] + row * h,
                   (double*)job->out + row * 2 * h, h);
    } else {
      lstm_row_f32((const float*)job->in[0] + row * 4 * h, (const float*)job->in[1] + row * h,
                   (float*)job->out + row * 2 * h, h);
    }
  }
}

static void gru_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const rnn_job* job = opaque;
  int64_t h = job->h;
  for (int64_t row = begin; row < end; row++) {
    if (job->f64) {
      gru_row_f64((const double*)job->in[0] + row * 3 * h, (const double*)job->in[1] + row * 3 * h,
                  (const double*)job->in[2] + row * h, (double*)job->out + row * h, h);
    } else {
      gru_row_f32((const float*)job->in[0] + row * 3 * h, (const float*)job->in[1] + row * 3 * h,
                  (const float*)job->in[2] + row * h, (float*)job->out + row * h, h);
    }
  }
}

/* ---- operands -------------------------------------------------------------------------------- */

static bool is_compact(const tensor_view* v) {
  int64_t stride = 1;
  return nn_block_is_linear(v->ndim, v->shape, v->strides, &stride) && stride == 1;
}

/* Shapes (the runtime's shape rule checks the same; a plugin is called directly too): the last
   input is the state [N, H], input k is [N, blocks[k] * H], the output [N, out_blocks * H]. */
static oar_status check_cell(const kernel_command* cmd, const char* op, const char* const* names,
                             const int64_t* blocks, int64_t out_blocks) {
  uint32_t last = cmd->num_inputs - 1;
  const tensor_view* state = &cmd->inputs[last];
  if (state->ndim != 2)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s must be [N, H]", op, names[last]);
  int64_t n = state->shape[0], h = state->shape[1];
  for (uint32_t k = 0; k < last; k++) {
    int64_t expected[2] = {n, blocks[k] * h};
    if (!nn_shape_equals(&cmd->inputs[k], 2, expected)) return nn_shape_error(op, names[k], &cmd->inputs[k], 2, expected);
  }
  int64_t expected[2] = {n, out_blocks * h};
  if (!nn_shape_equals(&cmd->outputs[0], 2, expected)) return nn_shape_error(op, "out", &cmd->outputs[0], 2, expected);
  return OAR_SUCCESS;
}

/* Packs the strided operands, runs fn over the rows, writes a strided output back. */
static oar_status run_cell(const kernel_command* cmd, const char* op, nn_range_fn fn, double cost_per_row) {
  const tensor_view *state = &cmd->inputs[cmd->num_inputs - 1], *out = &cmd->outputs[0];
  rnn_job job = {.f64 = state->dtype == DTYPE_F64, .h = state->shape[1]};
  int64_t rows = state->shape[0];
  if (rows * job.h == 0) return OAR_SUCCESS;
  char* owned[RNN_MAX_OPERANDS] = {NULL, NULL, NULL, NULL};
  oar_status status = OAR_SUCCESS;
  for (uint32_t k = 0; k <= cmd->num_inputs && status == OAR_SUCCESS; k++) {
    const tensor_view* v = k < cmd->num_inputs ? &cmd->inputs[k] : out;
    if (is_compact(v)) {
      if (k < cmd->num_inputs) job.in[k] = v->data;
      else job.out = v->data;
      continue;
    }
    owned[k] = malloc((size_t)(view_numel(v) * v->elem_size) + 1);
    if (!owned[k]) {
      status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
    } else if (k < cmd->num_inputs) {
      nn_pack(owned[k], v->data, v->ndim, v->shape, v->strides, v->elem_size);
      job.in[k] = owned[k];
    } else {
      job.out = owned[k];
    }
  }
  if (status == OAR_SUCCESS) {
    nn_parallel_for(rows, nn_chunk_count(rows, cost_per_row * (double)job.h), fn, &job);
    if (owned[cmd->num_inputs]) nn_unpack(out->data, owned[cmd->num_inputs], out->ndim, out->shape, out->strides, out->elem_size);
  }
  for (int k = 0; k < RNN_MAX_OPERANDS; k++) free(owned[k]);
  return status;
}

/* ---- ops ------------------------------------------------------------------------------------- */

static const char* const kLstmNames[] = {"gates", "c_prev"};
static const int64_t kLstmBlocks[] = {4, 1};
static const char* const kGruNames[] = {"input_gates", "hidden_gates", "h_prev"};
static const int64_t kGruBlocks[] = {3, 3, 1};

oar_status refcpu_check_lstm_cell(kernel_command* cmd) { return check_cell(cmd, "lstm_cell", kLstmNames, kLstmBlocks, 2); }

oar_status refcpu_run_lstm_cell(const kernel_command* cmd) { return run_cell(cmd, "lstm_cell", lstm_range, 40.0); }

oar_status refcpu_check_gru_cell(kernel_command* cmd) { return check_cell(cmd, "gru_cell", kGruNames, kGruBlocks, 1); }

oar_status refcpu_run_gru_cell(const kernel_command* cmd) { return run_cell(cmd, "gru_cell", gru_range, 40.0); }

/* Recurrent cell kernels: lstm_cell and gru_cell, the pointwise part of one LSTM/GRU step after
   the gate matmuls, and their backward ops (float32, float64; torch's gate order). Every operand is [N, k*H]; strided
   operands are packed into a compact copy first and a strided output is written through one.
   Rows are split over the plugin's pool; the loop over a row's H columns has no dependences and
   float32 uses kernels.h's vectorizable exp/tanh, compiled per ISA. */
#include "kernels.h"

#include "kernels_nn_util.h"

#include <math.h>
#include <stdlib.h>

#define RNN_MAX_OPERANDS 5 /* gru_cell_backward: 4 inputs and the output */

/* One row of a cell: operand k of the row at in[k], the output row at out (compact, H columns per block). */
typedef void (*rnn_row_fn)(const char* const* in, char* out, int64_t h);

typedef struct rnn_job {
  rnn_row_fn row;
  int64_t h;
  uint32_t num_inputs;
  const char* in[RNN_MAX_OPERANDS - 1]; /* compact inputs, in launch order */
  int64_t in_row_bytes[RNN_MAX_OPERANDS - 1];
  char* out;                            /* compact output */
  int64_t out_row_bytes;
} rnn_job;

/* ---- typed rows ------------------------------------------------------------------------------ */

#define RNN_ROWS(T, SUFFIX, EXP, TANH)                                                                 \
  REFCPU_ALWAYS_INLINE T sigmoid_##SUFFIX(T x) { return (T)1 / ((T)1 + EXP(-x)); }                          \
                                                                                                       \
  /* gates [4H] = [i | f | g | o], c_prev [H] -> out [2H] = [h | c] */                                \
  REFCPU_VECTOR_CLONES static void lstm_row_##SUFFIX(const char* const* in, char* out_row, int64_t h) {  \
    const T* restrict gates = (const T*)in[0];                                                         \
    const T* restrict c_prev = (const T*)in[1];                                                        \
    T* restrict out = (T*)out_row;                                                                     \
    _Pragma("GCC ivdep") /* the column blocks of one row never overlap */                           \
    for (int64_t k = 0; k < h; k++) {                                                                  \
      T c = sigmoid_##SUFFIX(gates[h + k]) * c_prev[k] + sigmoid_##SUFFIX(gates[k]) * TANH(gates[2 * h + k]); \
      out[k] = sigmoid_##SUFFIX(gates[3 * h + k]) * TANH(c);                                           \
      out[h + k] = c;                                                                                  \
    }                                                                                                  \
  }                                                                                                    \
                                                                                                       \
  /* x [3H] = [r | z | n] input gates, hg [3H] the hidden ones, h_prev [H] -> out [H] */               \
  REFCPU_VECTOR_CLONES static void gru_row_##SUFFIX(const char* const* in, char* out_row, int64_t h) {   \
    const T* restrict x = (const T*)in[0];                                                             \
    const T* restrict hg = (const T*)in[1];                                                            \
    const T* restrict h_prev = (const T*)in[2];                                                        \
    T* restrict out = (T*)out_row;                                                                     \
    _Pragma("GCC ivdep") /* the column blocks of one row never overlap */                           \
    for (int64_t k = 0; k < h; k++) {                                                                  \
      T r = sigmoid_##SUFFIX(x[k] + hg[k]);                                                            \
      T z = sigmoid_##SUFFIX(x[h + k] + hg[h + k]);                                                    \
      T n = TANH(x[2 * h + k] + r * hg[2 * h + k]);                                                    \
      out[k] = n + z * (h_prev[k] - n);                                                                \
    }                                                                                                  \
  }                                                                                                    \
                                                                                                       \
  /* grad [2H] = [dh | dc], gates [4H], c_prev [H] -> out [5H] = [d i | d f | d g | d o | d c_prev] */ \
  REFCPU_VECTOR_CLONES static void lstm_backward_row_##SUFFIX(const char* const* in, char* out_row,     \
                                                               int64_t h) {                            \
    const T* restrict grad = (const T*)in[0];                                                          \
    const T* restrict gates = (const T*)in[1];                                                         \
    const T* restrict c_prev = (const T*)in[2];                                                        \
    T* restrict out = (T*)out_row;                                                                     \
    _Pragma("GCC ivdep") /* the column blocks of one row never overlap */                           \
    for (int64_t k = 0; k < h; k++) {                                                                  \
      T i = sigmoid_##SUFFIX(gates[k]), f = sigmoid_##SUFFIX(gates[h + k]);                            \
      T g = TANH(gates[2 * h + k]), o = sigmoid_##SUFFIX(gates[3 * h + k]);                            \
      T tc = TANH(f * c_prev[k] + i * g), dh = grad[k];                                                \
      T dc = grad[h + k] + dh * o * ((T)1 - tc * tc);                                                  \
      out[k] = dc * g * i * ((T)1 - i);                                                                \
      out[h + k] = dc * c_prev[k] * f * ((T)1 - f);                                                    \
      out[2 * h + k] = dc * i * ((T)1 - g * g);                                                        \
      out[3 * h + k] = dh * tc * o * ((T)1 - o);                                                       \
      out[4 * h + k] = dc * f;                                                                         \
    }                                                                                                  \
  }                                                                                                    \
                                                                                                       \
  /* grad [H], x [3H], hg [3H], h_prev [H] -> out [7H] = [d x (3H) | d hg (3H) | d h_prev] */          \
  REFCPU_VECTOR_CLONES static void gru_backward_row_##SUFFIX(const char* const* in, char* out_row,      \
                                                              int64_t h) {                             \
    const T* restrict grad = (const T*)in[0];                                                          \
    const T* restrict x = (const T*)in[1];                                                             \
    const T* restrict hg = (const T*)in[2];                                                            \
    const T* restrict h_prev = (const T*)in[3];                                                        \
    T* restrict out = (T*)out_row;                                                                     \
    _Pragma("GCC ivdep") /* the column blocks of one row never overlap */                           \
    for (int64_t k = 0; k < h; k++) {                                                                  \
      T r = sigmoid_##SUFFIX(x[k] + hg[k]);                                                            \
      T z = sigmoid_##SUFFIX(x[h + k] + hg[h + k]);                                                    \
      T n = TANH(x[2 * h + k] + r * hg[2 * h + k]);                                                    \
      T dn = grad[k] * ((T)1 - z) * ((T)1 - n * n);                                                    \
      T dz = grad[k] * (h_prev[k] - n) * z * ((T)1 - z);                                               \
      T dr = dn * hg[2 * h + k] * r * ((T)1 - r);                                                      \
      out[k] = out[3 * h + k] = dr;                                                                    \
      out[h + k] = out[4 * h + k] = dz;                                                                \
      out[2 * h + k] = dn;                                                                             \
      out[5 * h + k] = dn * r;                                                                         \
      out[6 * h + k] = grad[k] * z;                                                                    \
    }                                                                                                  \
  }

RNN_ROWS(float, f32, refcpu_expf, refcpu_tanhf) /* vectorizable float math (kernels.h) */
RNN_ROWS(double, f64, exp, tanh)

static void cell_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const rnn_job* job = opaque;
  const char* in[RNN_MAX_OPERANDS - 1];
  for (int64_t row = begin; row < end; row++) {
    for (uint32_t k = 0; k < job->num_inputs; k++) in[k] = job->in[k] + row * job->in_row_bytes[k];
    job->row(in, job->out + row * job->out_row_bytes, job->h);
  }
}

/* ---- operands -------------------------------------------------------------------------------- */

static bool is_compact(const tensor_view* v) {
  int64_t stride = 1;
  return nn_block_is_linear(v->ndim, v->shape, v->strides, &stride) && stride == 1;
}

/* One cell op: its operand names, each input's and the output's width in blocks of H, its rows. */
typedef struct cell_kind {
  const char* op;
  const char* const* names;
  const int64_t* blocks;
  int64_t out_blocks;
  rnn_row_fn row_f32, row_f64;
  double cost_per_column; /* for the pool's chunking */
} cell_kind;

/* Shapes (the runtime's shape rule checks the same; a plugin is called directly too): the last
   input is the state [N, H], input k is [N, blocks[k] * H], the output [N, out_blocks * H]. */
static oar_status check_cell(const kernel_command* cmd, const cell_kind* kind) {
  const char* op = kind->op;
  uint32_t last = cmd->num_inputs - 1;
  const tensor_view* state = &cmd->inputs[last];
  if (state->ndim != 2)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s must be [N, H]", op, kind->names[last]);
  int64_t n = state->shape[0], h = state->shape[1];
  for (uint32_t k = 0; k < last; k++) {
    int64_t expected[2] = {n, kind->blocks[k] * h};
    if (!nn_shape_equals(&cmd->inputs[k], 2, expected))
      return nn_shape_error(op, kind->names[k], &cmd->inputs[k], 2, expected);
  }
  int64_t expected[2] = {n, kind->out_blocks * h};
  if (!nn_shape_equals(&cmd->outputs[0], 2, expected)) return nn_shape_error(op, "out", &cmd->outputs[0], 2, expected);
  return OAR_SUCCESS;
}

/* Packs the strided operands, runs the rows, writes a strided output back. */
static oar_status run_cell(const kernel_command* cmd, const cell_kind* kind) {
  const tensor_view *state = &cmd->inputs[cmd->num_inputs - 1], *out = &cmd->outputs[0];
  bool f64 = state->dtype == DTYPE_F64;
  rnn_job job = {.row = f64 ? kind->row_f64 : kind->row_f32, .h = state->shape[1], .num_inputs = cmd->num_inputs};
  int64_t rows = state->shape[0], row_bytes = job.h * (int64_t)out->elem_size;
  if (rows * job.h == 0) return OAR_SUCCESS;
  for (uint32_t k = 0; k < cmd->num_inputs; k++) job.in_row_bytes[k] = kind->blocks[k] * row_bytes;
  job.out_row_bytes = kind->out_blocks * row_bytes;
  char* owned[RNN_MAX_OPERANDS] = {NULL, NULL, NULL, NULL, NULL};
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
      status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", kind->op);
    } else if (k < cmd->num_inputs) {
      nn_pack(owned[k], v->data, v->ndim, v->shape, v->strides, v->elem_size);
      job.in[k] = owned[k];
    } else {
      job.out = owned[k];
    }
  }
  if (status == OAR_SUCCESS) {
    nn_parallel_for(rows, nn_chunk_count(rows, kind->cost_per_column * (double)job.h), cell_range, &job);
    if (owned[cmd->num_inputs]) nn_unpack(out->data, owned[cmd->num_inputs], out->ndim, out->shape, out->strides, out->elem_size);
  }
  for (int k = 0; k < RNN_MAX_OPERANDS; k++) free(owned[k]);
  return status;
}

/* ---- ops ------------------------------------------------------------------------------------- */

static const cell_kind kLstm = {"lstm_cell", (const char* const[]){"gates", "c_prev"}, (const int64_t[]){4, 1}, 2,
                                lstm_row_f32, lstm_row_f64, 12.0};
static const cell_kind kGru = {"gru_cell", (const char* const[]){"input_gates", "hidden_gates", "h_prev"},
                               (const int64_t[]){3, 3, 1}, 1, gru_row_f32, gru_row_f64, 12.0};
static const cell_kind kLstmBackward = {"lstm_cell_backward", (const char* const[]){"grad", "gates", "c_prev"},
                                        (const int64_t[]){2, 4, 1}, 5, lstm_backward_row_f32,
                                        lstm_backward_row_f64, 16.0};
static const cell_kind kGruBackward = {"gru_cell_backward",
                                       (const char* const[]){"grad", "input_gates", "hidden_gates", "h_prev"},
                                       (const int64_t[]){1, 3, 3, 1}, 7, gru_backward_row_f32,
                                       gru_backward_row_f64, 16.0};

oar_status refcpu_check_lstm_cell(kernel_command* cmd) { return check_cell(cmd, &kLstm); }
oar_status refcpu_run_lstm_cell(const kernel_command* cmd) { return run_cell(cmd, &kLstm); }
oar_status refcpu_check_gru_cell(kernel_command* cmd) { return check_cell(cmd, &kGru); }
oar_status refcpu_run_gru_cell(const kernel_command* cmd) { return run_cell(cmd, &kGru); }
oar_status refcpu_check_lstm_cell_backward(kernel_command* cmd) { return check_cell(cmd, &kLstmBackward); }
oar_status refcpu_run_lstm_cell_backward(const kernel_command* cmd) { return run_cell(cmd, &kLstmBackward); }
oar_status refcpu_check_gru_cell_backward(kernel_command* cmd) { return check_cell(cmd, &kGruBackward); }
oar_status refcpu_run_gru_cell_backward(const kernel_command* cmd) { return run_cell(cmd, &kGruBackward); }

"""Every op with a backward formula in interface/ops.yaml, checked against central
finite differences in float64 on small shapes, on the CPU reference plugin.

A case is (op, inputs, attrs): the loss is sum(out * w) for a fixed random w,
its gradient comes from oar's autograd (the ops.yaml formulas run on the
device), and each differentiable input is perturbed element by element.
"""

from __future__ import annotations

import numpy as np
import pytest

import oar
from oar.autograd import compile_all
from oar.autograd.schema import ops_schema

EPS = 1e-6
RTOL, ATOL = 1e-6, 1e-7


def rnd(seed, *shape, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape)


def away(seed, *shape, margin=0.2):
    """Uniform in [-1, 1] with |x| >= margin: no kink of abs/relu/sign at 0 within EPS."""
    x = rnd(seed, *shape)
    return np.where(np.abs(x) < margin, np.sign(x + 1e-12) * margin, x) + 0.0


def distinct(seed, *shape):
    """A permutation of well-separated values: no ties for max/min/maximum/pools."""
    n = int(np.prod(shape))
    return (np.random.default_rng(seed).permutation(n) * 0.1 - n * 0.05).reshape(shape) + 0.0


def idx(values):
    return np.asarray(values, dtype=np.int64)


# (case id, op, [(name, array, differentiable)], attrs)
CASES = [
    ("neg", "neg", [("x", rnd(0, 3, 4), True)], {}),
    ("abs", "abs", [("x", away(1, 3, 4), True)], {}),
    ("exp", "exp", [("x", rnd(2, 3, 4), True)], {}),
    ("log", "log", [("x", rnd(3, 3, 4, low=0.5, high=2.0), True)], {}),
    ("sqrt", "sqrt", [("x", rnd(4, 3, 4, low=0.5, high=2.0), True)], {}),
    ("rsqrt", "rsqrt", [("x", rnd(5, 3, 4, low=0.5, high=2.0), True)], {}),
    ("reciprocal", "reciprocal", [("x", away(6, 3, 4, margin=0.5), True)], {}),
    ("sin", "sin", [("x", rnd(7, 3, 4), True)], {}),
    ("cos", "cos", [("x", rnd(8, 3, 4), True)], {}),
    ("tanh", "tanh", [("x", rnd(9, 3, 4), True)], {}),
    ("sigmoid", "sigmoid", [("x", rnd(10, 3, 4), True)], {}),
    ("relu", "relu", [("x", away(11, 3, 4), True)], {}),
    ("gelu", "gelu", [("x", rnd(12, 3, 4, low=-3, high=3), True)], {}),
    ("gelu_tanh", "gelu", [("x", rnd(13, 3, 4, low=-3, high=3), True)], {"approximate": "tanh"}),
    ("silu", "silu", [("x", rnd(14, 3, 4, low=-3, high=3), True)], {}),
    ("erf", "erf", [("x", rnd(15, 3, 4), True)], {}),
    ("clamp", "clamp", [("x", np.array([[-0.9, -0.3, 0.1, 0.45, 0.8]]), True)], {"min": -0.5, "max": 0.5}),
    ("cast", "cast", [("x", rnd(16, 3, 4), True)], {"dtype": "float64"}),
    ("copy", "copy", [("x", rnd(17, 3, 4), True)], {}),
    ("add", "add", [("a", rnd(18, 3, 4), True), ("b", rnd(19, 3, 4), True)], {}),
    ("add_broadcast", "add", [("a", rnd(20, 2, 3, 4), True), ("b", rnd(21, 3, 1), True)], {}),
    ("sub_broadcast", "sub", [("a", rnd(22, 4), True), ("b", rnd(23, 3, 4), True)], {}),
    ("mul_broadcast", "mul", [("a", rnd(24, 3, 4), True), ("b", rnd(25, 1, 4), True)], {}),
    ("div", "div", [("a", rnd(26, 3, 4), True), ("b", away(27, 3, 4, margin=0.5), True)], {}),
    ("div_broadcast", "div", [("a", rnd(28, 3, 4), True), ("b", away(29, 3, 1, margin=0.5), True)], {}),
    ("pow", "pow", [("a", rnd(30, 3, 4, low=0.5, high=2.0), True), ("b", rnd(31, 3, 4), True)], {}),
    ("maximum", "maximum", [("a", distinct(32, 3, 4), True), ("b", distinct(33, 3, 4) + 0.05, True)], {}),
    ("minimum", "minimum", [("a", distinct(34, 3, 4), True), ("b", distinct(35, 3, 4) + 0.05, True)], {}),
    ("where", "where", [("condition", rnd(36, 3, 4) > 0, False), ("a", rnd(37, 3, 4), True),
                        ("b", rnd(38, 4), True)], {}),
    ("softmax", "softmax", [("x", rnd(39, 3, 5), True)], {"dim": -1}),
    ("softmax_dim0", "softmax", [("x", rnd(40, 3, 5), True)], {"dim": 0}),
    ("log_softmax", "log_softmax", [("x", rnd(41, 3, 5), True)], {"dim": -1}),
    ("log_softmax_dim0", "log_softmax", [("x", rnd(42, 2, 3, 4), True)], {"dim": 1}),
    ("sum_all", "sum", [("x", rnd(43, 3, 4), True)], {}),
    ("sum_dim", "sum", [("x", rnd(44, 2, 3, 4), True)], {"dim": [0, 2]}),
    ("sum_keepdim", "sum", [("x", rnd(45, 2, 3, 4), True)], {"dim": [1], "keepdim": True}),
    ("mean_all", "mean", [("x", rnd(46, 3, 4), True)], {}),
    ("mean_dim", "mean", [("x", rnd(47, 2, 3, 4), True)], {"dim": [-1]}),
    ("mean_keepdim", "mean", [("x", rnd(48, 2, 3, 4), True)], {"dim": [0, 1], "keepdim": True}),
    ("max_all", "max", [("x", distinct(49, 3, 4), True)], {}),
    ("max_dim", "max", [("x", distinct(50, 3, 4), True)], {"dim": [1]}),
    ("min_keepdim", "min", [("x", distinct(51, 2, 3, 4), True)], {"dim": [0], "keepdim": True}),
    ("var_all", "var", [("x", rnd(52, 3, 4), True)], {}),
    ("var_dim", "var", [("x", rnd(53, 2, 3, 4), True)], {"dim": [1], "correction": 0}),
    ("var_keepdim", "var", [("x", rnd(54, 3, 4), True)], {"dim": [-1], "keepdim": True}),
    ("matmul", "matmul", [("a", rnd(55, 3, 4), True), ("b", rnd(56, 4, 5), True)], {}),
    ("matmul_batched", "matmul", [("a", rnd(57, 2, 3, 4), True), ("b", rnd(58, 4, 5), True)], {}),
    ("matmul_bcast", "matmul", [("a", rnd(59, 3, 4), True), ("b", rnd(60, 2, 4, 5), True)], {}),
    ("bmm", "bmm", [("a", rnd(61, 2, 3, 4), True), ("b", rnd(62, 2, 4, 5), True)], {}),
    ("conv2d", "conv2d", [("x", rnd(63, 2, 3, 5, 5), True), ("weight", rnd(64, 4, 3, 3, 3), True),
                          ("bias", rnd(65, 4), True)], {}),
    ("conv2d_strided", "conv2d", [("x", rnd(66, 1, 4, 6, 6), True), ("weight", rnd(67, 4, 2, 3, 3), True)],
     {"stride": [2, 2], "padding": [1, 1], "groups": 2}),
    ("conv2d_dilated", "conv2d", [("x", rnd(68, 1, 2, 7, 7), True), ("weight", rnd(69, 3, 2, 2, 3), True),
                                  ("bias", rnd(70, 3), True)], {"dilation": [2, 1], "padding": [1, 0]}),
    ("max_pool2d", "max_pool2d", [("x", distinct(71, 1, 2, 4, 4), True)], {"kernel_size": [2, 2]}),
    ("max_pool2d_overlap", "max_pool2d", [("x", distinct(72, 1, 1, 5, 5), True)],
     {"kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1]}),
    ("avg_pool2d", "avg_pool2d", [("x", rnd(73, 1, 2, 4, 4), True)], {"kernel_size": [2, 2]}),
    ("avg_pool2d_pad", "avg_pool2d", [("x", rnd(74, 1, 1, 5, 5), True)],
     {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
    ("layer_norm", "layer_norm", [("x", rnd(75, 3, 5), True), ("weight", rnd(76, 5), True),
                                  ("bias", rnd(77, 5), True)], {}),
    ("layer_norm_2d_noaffine", "layer_norm", [("x", rnd(78, 2, 3, 4), True)], {"normalized_ndim": 2}),
    ("rms_norm", "rms_norm", [("x", rnd(79, 3, 5), True), ("weight", rnd(80, 5), True)], {}),
    ("rms_norm_noweight", "rms_norm", [("x", rnd(81, 2, 3, 4), True)], {"normalized_ndim": 2}),
    ("embedding", "embedding", [("weight", rnd(82, 6, 3), True), ("indices", idx([[0, 2, 2], [5, 0, 1]]), False)], {}),
    ("cross_entropy", "cross_entropy", [("logits", rnd(83, 4, 5), True), ("target", idx([1, 0, 4, 1]), False)], {}),
    ("cross_entropy_sum", "cross_entropy", [("logits", rnd(84, 4, 5), True), ("target", idx([1, 0, 4, 1]), False)],
     {"reduction": "sum"}),
    ("cross_entropy_none_ignore", "cross_entropy", [("logits", rnd(85, 4, 5), True),
                                                    ("target", idx([1, -100, 4, 1]), False)], {"reduction": "none"}),
    ("cross_entropy_mean_ignore", "cross_entropy", [("logits", rnd(86, 4, 5), True),
                                                    ("target", idx([3, 2, -1, 0]), False)], {"ignore_index": -1}),
    ("dropout", "dropout", [("x", rnd(87, 4, 8), True)], {"p": 0.3, "seed": 123, "offset": 7}),
    ("gather", "gather", [("x", rnd(88, 3, 4), True), ("indices", idx([[0, 3], [1, 1], [2, 0]]), False)], {"dim": 1}),
    ("scatter_add", "scatter_add", [("x", rnd(89, 3, 4), True), ("indices", idx([[0, 3], [1, 1], [2, 0]]), False),
                                    ("source", rnd(90, 3, 2), True)], {"dim": 1}),
    # distinct indices per row: with duplicates "last write wins" has no derivative
    ("scatter", "scatter", [("x", rnd(94, 3, 4), True), ("indices", idx([[0, 3], [1, 2], [2, 0]]), False),
                            ("source", rnd(95, 3, 2), True)], {"dim": 1}),
    ("index_select", "index_select", [("x", rnd(91, 4, 3), True), ("indices", idx([3, 0, 3]), False)], {"dim": 0}),
    ("index_add", "index_add", [("x", rnd(92, 3, 4), True), ("source", rnd(93, 3, 2), True),
                                ("indices", idx([3, 3]), False)], {"dim": 1}),
    ("tril", "tril", [("x", rnd(94, 2, 4, 4), True)], {"diagonal": -1}),
    ("triu", "triu", [("x", rnd(95, 4, 5), True)], {"diagonal": 1}),
    ("reshape", "reshape", [("x", rnd(96, 3, 4), True)], {"shape": [2, -1, 3]}),
    ("transpose", "transpose", [("x", rnd(97, 2, 3, 4), True)], {"dim0": 0, "dim1": 2}),
    ("permute", "permute", [("x", rnd(98, 2, 3, 4), True)], {"dims": [2, 0, 1]}),
    ("permute_neg", "permute", [("x", rnd(99, 2, 3, 4), True)], {"dims": [-1, 0, -2]}),
    ("expand", "expand", [("x", rnd(100, 3, 1), True)], {"shape": [2, 3, 4]}),
    ("slice", "slice", [("x", rnd(101, 3, 7), True)], {"dim": 1, "start": 1, "stop": 6, "step": 2}),
    ("slice_neg", "slice", [("x", rnd(102, 5, 2), True)], {"dim": 0, "start": -3, "stop": 100}),
    ("concat", "concat", [("tensors", [rnd(103, 2, 3), rnd(104, 2, 1), rnd(105, 2, 2)], True)], {"dim": -1}),
    ("split", "split", [("x", rnd(106, 5, 3), True)], {"sizes": [2, 1, 2], "dim": 0}),
    # the fused backward ops that have formulas (for second-order gradients)
    ("gelu_backward", "gelu_backward", [("grad", rnd(107, 3, 4), True), ("x", rnd(108, 3, 4, low=-3, high=3), True)],
     {}),
    ("gelu_backward_tanh", "gelu_backward", [("grad", rnd(109, 3, 4), True),
                                             ("x", rnd(110, 3, 4, low=-3, high=3), True)], {"approximate": "tanh"}),
    ("conv2d_backward_input", "conv2d_backward_input", [("grad", rnd(111, 1, 4, 3, 3), True),
                                                        ("weight", rnd(112, 4, 2, 3, 3), True)],
     {"input_shape": [1, 4, 6, 6], "stride": [2, 2], "padding": [1, 1], "groups": 2}),
    ("conv2d_backward_weight", "conv2d_backward_weight", [("grad", rnd(113, 2, 3, 3, 3), True),
                                                          ("x", rnd(114, 2, 2, 5, 5), True)],
     {"weight_shape": [3, 2, 3, 3]}),
    ("max_pool2d_backward", "max_pool2d_backward", [("grad", rnd(117, 1, 1, 5, 5), True),
                                                    ("x", distinct(118, 1, 1, 5, 5), False)],
     {"kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1]}),
    ("avg_pool2d_backward", "avg_pool2d_backward", [("grad", rnd(115, 1, 1, 3, 3), True),
                                                    ("x", rnd(116, 1, 1, 5, 5), False)],
     {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
    ("layer_norm_backward_input", "layer_norm_backward_input",
     [("grad", rnd(119, 3, 5), True), ("x", rnd(120, 3, 5), True), ("weight", rnd(121, 5), True)], {}),
    ("layer_norm_backward_input_2d_noweight", "layer_norm_backward_input",
     [("grad", rnd(122, 2, 3, 4), True), ("x", rnd(123, 2, 3, 4), True)], {"normalized_ndim": 2, "eps": 0.1}),
    ("rms_norm_backward_input", "rms_norm_backward_input",
     [("grad", rnd(124, 3, 5), True), ("x", rnd(125, 3, 5), True), ("weight", rnd(126, 5), True)], {}),
    ("rms_norm_backward_input_2d_noweight", "rms_norm_backward_input",
     [("grad", rnd(127, 2, 3, 4), True), ("x", rnd(128, 2, 3, 4), True)], {"normalized_ndim": 2, "eps": 0.1}),
    # grad is a scalar for reduction mean/sum, one value per row for none
    ("cross_entropy_backward", "cross_entropy_backward",
     [("grad", rnd(129), True), ("logits", rnd(130, 4, 5), True), ("target", idx([1, 0, 4, 1]), False)], {}),
    ("cross_entropy_backward_sum", "cross_entropy_backward",
     [("grad", rnd(131), True), ("logits", rnd(132, 4, 5), True), ("target", idx([1, 0, 4, 1]), False)],
     {"reduction": "sum"}),
    ("cross_entropy_backward_none_ignore", "cross_entropy_backward",
     [("grad", rnd(133, 4), True), ("logits", rnd(134, 4, 5), True), ("target", idx([1, -100, 4, 1]), False)],
     {"reduction": "none"}),
    ("cross_entropy_backward_mean_ignore", "cross_entropy_backward",
     [("grad", rnd(135), True), ("logits", rnd(136, 4, 5), True), ("target", idx([3, 2, -1, 0]), False)],
     {"ignore_index": -1}),
    # ops for real models (A): values away from each kink (+-1, +-3, 0) by more than EPS
    ("hardtanh", "hardtanh", [("x", np.array([[-1.7, -0.6, 0.2, 0.7, 1.4]]), True)], {"min_val": -1.0, "max_val": 1.0}),
    ("hardswish", "hardswish", [("x", np.array([[-3.6, -2.1, -0.4, 0.9, 2.6, 3.3]]), True)], {}),
    ("hardsigmoid", "hardsigmoid", [("x", np.array([[-3.6, -2.1, -0.4, 0.9, 2.6, 3.3]]), True)], {}),
    ("leaky_relu", "leaky_relu", [("x", away(90, 3, 4), True)], {"negative_slope": 0.2}),
    ("elu", "elu", [("x", away(91, 3, 4), True)], {"alpha": 0.7}),
    ("softplus", "softplus", [("x", rnd(92, 3, 4, low=-3, high=3), True)], {"beta": 2.0, "threshold": 4.0}),
    ("mish", "mish", [("x", rnd(93, 3, 4, low=-3, high=3), True)], {}),
    ("log1p", "log1p", [("x", rnd(94, 3, 4, low=-0.5, high=2.0), True)], {}),
    ("expm1", "expm1", [("x", rnd(95, 3, 4), True)], {}),
    ("remainder", "remainder", [("a", rnd(96, 3, 4, low=0.1, high=0.9), True),
                                ("b", rnd(97, 3, 4, low=1.0, high=2.0), True)], {}),
    ("floor_divide", "floor_divide", [("a", rnd(102, 3, 4, low=0.1, high=0.9), True),
                                      ("b", rnd(103, 4, low=1.0, high=2.0), True)], {}),
    ("logsumexp", "logsumexp", [("x", rnd(98, 3, 4), True)], {"dim": [1]}),
    ("logsumexp_all", "logsumexp", [("x", rnd(99, 2, 3), True)], {"keepdim": True}),
    ("cumsum", "cumsum", [("x", rnd(100, 3, 4), True)], {"dim": 1}),
    ("cumprod", "cumprod", [("x", rnd(101, 3, 4, low=0.5, high=1.5), True)], {"dim": 0}),
    # ops for real models (B): batch_norm with given stats (training's dependence on x is checked
    # against torch in test_ops_nn_norm.py); x, weight, bias are differentiated here
    ("batch_norm", "batch_norm", [("x", rnd(140, 2, 3, 4), True),
                                  ("stats", np.stack([rnd(141, 3), rnd(142, 3, low=0.5, high=1.5)]), False),
                                  ("weight", rnd(143, 3), True), ("bias", rnd(144, 3), True)], {}),
    ("group_norm", "group_norm", [("x", rnd(145, 2, 4, 3), True), ("weight", rnd(146, 4), True),
                                  ("bias", rnd(147, 4), True)], {"num_groups": 2}),
    ("adaptive_avg_pool2d", "adaptive_avg_pool2d", [("x", rnd(148, 1, 2, 5, 7), True)], {"output_size": [3, 4]}),
    ("adaptive_avg_pool2d_backward", "adaptive_avg_pool2d_backward", [("grad", rnd(149, 1, 2, 3, 4), True)],
     {"input_shape": [1, 2, 5, 7]}),
    ("adaptive_max_pool2d", "adaptive_max_pool2d", [("x", distinct(150, 1, 2, 5, 7), True)], {"output_size": [3, 4]}),
    ("upsample_nearest2d", "upsample_nearest2d", [("x", rnd(151, 1, 2, 3, 4), True)], {"output_size": [5, 7]}),
    ("upsample_nearest2d_backward", "upsample_nearest2d_backward", [("grad", rnd(152, 1, 2, 5, 7), True)],
     {"input_shape": [1, 2, 3, 4]}),
    ("upsample_bilinear2d", "upsample_bilinear2d", [("x", rnd(153, 1, 2, 3, 4), True)], {"output_size": [5, 7]}),
    ("upsample_bilinear2d_aligned", "upsample_bilinear2d", [("x", rnd(154, 1, 2, 3, 4), True)],
     {"output_size": [5, 7], "align_corners": True}),
    ("upsample_bilinear2d_backward", "upsample_bilinear2d_backward", [("grad", rnd(155, 1, 2, 5, 7), True)],
     {"input_shape": [1, 2, 3, 4], "scales": [1.5, 1.8]}),
    ("pad_reflect", "pad", [("x", rnd(156, 2, 3, 4), True)], {"pad": [1, 2, 2, 1], "mode": "reflect"}),
    ("pad_constant", "pad", [("x", rnd(157, 2, 3, 4), True)], {"pad": [1, -1, 2, 1], "value": 0.5}),
    ("batch_norm_backward", "batch_norm_backward",
     [("grad", rnd(159, 2, 3, 4), True), ("x", rnd(160, 2, 3, 4), True),
      ("stats", np.stack([rnd(161, 3), rnd(162, 3, low=0.5, high=1.5)]), False), ("weight", rnd(163, 3), True)], {}),
    ("group_norm_backward", "group_norm_backward",
     [("grad", rnd(164, 2, 4, 3), True), ("x", rnd(165, 2, 4, 3), True), ("weight", rnd(166, 4), True)],
     {"num_groups": 2}),
    ("adaptive_max_pool2d_backward", "adaptive_max_pool2d_backward",
     [("grad", rnd(167, 1, 2, 3, 4), True), ("x", distinct(168, 1, 2, 5, 7), False)], {}),
    ("pad_backward", "pad_backward", [("grad", rnd(158, 2, 6, 7), True)],
     {"input_shape": [2, 3, 4], "pad": [1, 2, 2, 1], "mode": "replicate"}),
    ("index", "index", [("x", rnd(102, 3, 4, 5), True), ("indices", idx([[0, -1, 0], [1, 3, -4]]), False)],
     {"dim": 1}),
    ("index_put_accumulate", "index_put", [("x", rnd(103, 3, 4), True), ("indices", idx([[2, -1, 0]]), False),
                                           ("values", rnd(104, 3, 4), True)], {"accumulate": True}),
    # distinct positions: with duplicates "last write wins" has no derivative
    ("index_put", "index_put", [("x", rnd(105, 3, 4), True), ("indices", idx([[2, 0]]), False),
                                ("values", rnd(106, 2, 4), True)], {}),
    # recurrent cells, issue 14 (gates wider than [-1, 1] to reach the saturating parts)
    ("lstm_cell", "lstm_cell", [("gates", rnd(170, 3, 8, low=-3, high=3), True), ("c_prev", rnd(171, 3, 2), True)],
     {}),
    ("gru_cell", "gru_cell", [("input_gates", rnd(172, 3, 6, low=-3, high=3), True),
                              ("hidden_gates", rnd(173, 3, 6, low=-3, high=3), True), ("h_prev", rnd(174, 3, 2), True)],
     {}),
]

CASE_OPS = {case[1] for case in CASES}


def _to_device(value, dev, requires_grad):
    if isinstance(value, list):
        return [_to_device(v, dev, requires_grad) for v in value]
    t = oar.tensor(value, device=dev)
    if requires_grad:
        t.requires_grad = True
    return t


def _call(op, inputs, attrs):
    fn = getattr(oar, op)
    return fn(*inputs, **attrs)


def _outputs(result):
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _loss_value(op, arrays, attrs, weights, dev) -> float:
    with oar.no_grad():
        outs = _outputs(_call(op, [_to_device(a, dev, False) for a in arrays], attrs))
    return float(sum(np.sum(o.numpy() * w) for o, w in zip(outs, weights)))


def test_every_op_with_a_backward_formula_has_a_case():
    assert set(compile_all()) <= CASE_OPS, sorted(set(compile_all()) - CASE_OPS)


def test_backward_formulas_all_compile():
    compiled = compile_all()
    assert len(compiled) == sum(1 for spec in ops_schema().values() if spec.backward)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(case, dev):
    _, op, spec, attrs = case
    arrays = [array for _, array, _ in spec]
    tensors = [_to_device(array, dev, diff) for _, array, diff in spec]
    outs = _outputs(_call(op, tensors, attrs))
    rng = np.random.default_rng(1234)
    weights = [rng.uniform(-1, 1, size=o.shape) for o in outs]
    oar.autograd.backward(outs, [oar.tensor(w, device=dev) for w in weights])

    for k, (name, array, diff) in enumerate(spec):
        if not diff:
            assert not isinstance(tensors[k], list) and tensors[k].grad is None
            continue
        parts = array if isinstance(array, list) else [array]
        got_parts = tensors[k] if isinstance(tensors[k], list) else [tensors[k]]
        for p, (part, got) in enumerate(zip(parts, got_parts)):
            assert got.grad is not None, f"{op}: no gradient for {name}"
            analytic = got.grad.numpy()
            assert analytic.shape == part.shape, f"{op}: grad of {name} has shape {analytic.shape}"
            numeric = np.zeros_like(part)
            for i in np.ndindex(part.shape):
                values = []
                for sign in (1, -1):
                    bumped = [np.array(a, copy=True) if not isinstance(a, list) else [np.array(x) for x in a]
                              for a in arrays]
                    target = bumped[k][p] if isinstance(bumped[k], list) else bumped[k]
                    target[i] += sign * EPS
                    values.append(_loss_value(op, bumped, attrs, weights, dev))
                numeric[i] = (values[0] - values[1]) / (2 * EPS)
            np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{op} ({case[0]}): d/d{name}[{p}]")

"""The C++ shape rules of the nn, index and misc ops (ported from oar/shapes.py): output
shapes against PyTorch's, and the errors naming the op and the input."""

import pytest
import torch

import oar
from oar import _C, reference


def _t(*shape, dtype=oar.float32):
    return oar.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1), ([2, 1], [0, 2], [1, 2], 2)])
def test_conv2d_output_shape_matches_torch(stride, padding, dilation, groups):
    x, w = torch.zeros(2, 4, 9, 8), torch.zeros(6, 4 // groups, 3, 2)
    expected = torch.nn.functional.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    out = oar.conv2d(_t(2, 4, 9, 8), _t(6, 4 // groups, 3, 2), stride=stride, padding=padding, dilation=dilation,
                     groups=groups)
    assert out.shape == tuple(expected.shape)


def test_pool_shapes_match_torch():
    x = torch.zeros(1, 2, 7, 6)
    assert oar.max_pool2d(_t(1, 2, 7, 6), kernel_size=3, stride=2, padding=1).shape == tuple(
        torch.nn.functional.max_pool2d(x, 3, 2, 1).shape)
    assert oar.avg_pool2d(_t(1, 2, 7, 6), kernel_size=[2, 3]).shape == tuple(
        torch.nn.functional.avg_pool2d(x, [2, 3]).shape)


def test_index_and_misc_shapes():
    x = _t(3, 4)
    i = oar.zeros(3, 2, dtype=oar.int64)
    assert oar.gather(x, i, dim=1).shape == (3, 2)
    assert oar.index_select(x, oar.zeros(5, dtype=oar.int64), dim=1).shape == (3, 5)
    assert oar.embedding(x, oar.zeros(2, 5, dtype=oar.int64)).shape == (2, 5, 4)
    assert oar.one_hot(oar.zeros(2, 3, dtype=oar.int64), num_classes=4).shape == (2, 3, 4)
    assert oar.cross_entropy(x, oar.zeros(3, dtype=oar.int64), reduction="none").shape == (3,)
    assert oar.cross_entropy(x, oar.zeros(3, dtype=oar.int64)).shape == ()
    assert oar.triu(x).shape == (3, 4)


@pytest.mark.parametrize("call,error,message", [
    (lambda: oar.conv2d(_t(1, 4, 5, 5), _t(2, 4, 3)), oar.ShapeError, r"conv2d: input 'weight' must be 4-d, got shape \(2, 4, 3\)"),
    (lambda: oar.conv2d(_t(1, 4, 5, 5), _t(3, 2, 3, 3), groups=2), oar.ShapeError,
     r"conv2d: groups=2 must divide the input channels 4 and output channels 3"),
    (lambda: oar.conv2d(_t(1, 4, 5, 5), _t(2, 3, 3, 3)), oar.ShapeError,
     r"conv2d: weight \(2, 3, 3, 3\) expects 3 input channels \(C/groups = 3\), x has 4"),
    (lambda: oar.conv2d(_t(1, 4, 5, 5), _t(2, 4, 3, 3), _t(3)), oar.ShapeError, r"conv2d: bias must have shape \(2,\), got \(3,\)"),
    (lambda: oar.conv2d(_t(1, 4, 5, 5), _t(2, 4, 3, 3), stride=[1, 2, 3]), oar.ShapeError,
     r"conv2d: attr 'stride' must have 1 or 2 entries, got \[1, 2, 3\]"),
    (lambda: oar.conv2d(_t(1, 4, 2, 2), _t(2, 4, 3, 3)), oar.ShapeError,
     r"conv2d: the window \(3, dilation 1\) does not fit an input of size 2 with padding 0"),
    (lambda: oar.conv2d(_t(1, 4, 5, 5), _t(2, 4, 3, 3), stride=0), oar.ShapeError,
     r"conv2d: kernel, stride and dilation must be positive and padding >= 0"),
    (lambda: oar.max_pool2d(_t(1, 1, 5, 5), kernel_size=2, padding=2), oar.ShapeError,
     r"max_pool2d: padding \(2, 2\) must be at most half the kernel \(2, 2\)"),
    (lambda: oar.ops.max_pool2d_backward(_t(1, 1, 3, 3), _t(1, 1, 4, 4), kernel_size=2), oar.ShapeError,
     r"max_pool2d_backward: grad has shape \(1, 1, 3, 3\), the forward output of x \(1, 1, 4, 4\) has \(1, 1, 2, 2\)"),
    (lambda: oar.layer_norm(_t(2, 3), normalized_ndim=3), oar.ShapeError,
     r"layer_norm: normalized_ndim=3 must be between 1 and x's ndim 2"),
    (lambda: oar.layer_norm(_t(2, 3), _t(2)), oar.ShapeError,
     r"layer_norm: input 'weight' must have the normalized shape \(3,\), got \(2,\)"),
    (lambda: oar.ops.rms_norm_backward_input(_t(2, 4), _t(2, 3), _t(3)), oar.ShapeError,
     r"rms_norm_backward_input: grad has shape \(2, 4\), x has \(2, 3\)"),
    (lambda: oar.embedding(_t(3), oar.zeros(2, dtype=oar.int64)), oar.ShapeError,
     r"embedding: input 'weight' must be 2-d, got shape \(3,\)"),
    (lambda: oar.cross_entropy(_t(3, 4), oar.zeros(2, dtype=oar.int64)), oar.ShapeError,
     r"cross_entropy: target must have shape \(3,\), got \(2,\)"),
    (lambda: oar.cross_entropy(_t(3, 4), oar.zeros(3, dtype=oar.int64), reduction="avg"), oar.ShapeError,
     r"cross_entropy: reduction must be 'mean', 'sum' or 'none', not 'avg'"),
    (lambda: oar.ops.cross_entropy_backward(_t(3), _t(3, 4), oar.zeros(3, dtype=oar.int64)), oar.ShapeError,
     r"cross_entropy_backward: grad has shape \(3,\), expected \(\)"),
    (lambda: oar.gather(_t(3, 4), oar.zeros(3, dtype=oar.int64), dim=0), oar.ShapeError,
     r"gather: indices must have x's ndim 2, got shape \(3,\)"),
    (lambda: oar.gather(_t(3, 4), oar.zeros(3, 1, dtype=oar.int64), dim=2), IndexError,
     r"gather: dim 2 is out of range for a 2-d tensor$"),
    (lambda: oar.scatter(_t(3, 4), oar.zeros(3, 5, dtype=oar.int64), _t(3, 4), dim=1), oar.ShapeError,
     r"scatter: indices \(3, 5\) must not be larger than source \(3, 4\) in any dim"),
    (lambda: oar.scatter_add(_t(3, 4), oar.zeros(3, dtype=oar.int64), _t(3, 4), dim=1), oar.ShapeError,
     r"scatter_add: x, indices and source must have one ndim, got \(3, 4\), \(3,\), \(3, 4\)"),
    (lambda: oar.index_select(_t(), oar.zeros(1, dtype=oar.int64), dim=0), oar.ShapeError,
     r"index_select: x must have at least 1 dim"),
    (lambda: oar.index_add(_t(3, 4), _t(3, 3), oar.zeros(2, dtype=oar.int64), dim=0), oar.ShapeError,
     r"index_add: source must have shape \(2, 4\) \(x's with dim 0 of len\(indices\)\), got \(3, 3\)"),
    (lambda: oar.one_hot(oar.zeros(2, dtype=oar.int64), num_classes=-1), oar.ShapeError,
     r"one_hot: num_classes must be >= 0, got -1"),
    (lambda: oar.tril(_t(3)), oar.ShapeError, r"tril: x must have at least 2 dims, got shape \(3,\)"),
    (lambda: oar.ops.conv2d_backward_input(_t(1, 2, 3, 3), _t(2, 4, 3, 3), input_shape=[1, 4, 5]), oar.ShapeError,
     r"conv2d_backward_input: input_shape must have 4 entries, got \[1, 4, 5\]"),
])
def test_shape_errors_name_the_op_and_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_shape_rules_make_no_python_call():
    # The old path called oar.shapes; the rules now run in C++ (no module to patch).
    import importlib.util
    assert importlib.util.find_spec("oar.shapes") is None
    assert oar.conv2d(_t(1, 1, 4, 4), _t(1, 1, 3, 3)).shape == (1, 1, 2, 2)


def test_reference_uses_the_runtime_geometry_and_promotion():
    assert _C._window_output_size(7, 3, 2, 1) == 4 == (7 + 2 - 2 - 1) // 2 + 1
    assert _C._window_output_size(2, 3, 1, 0) == 0  # floor division of a negative span
    assert _C._window_output_size(1, 3, 2, 0, 2) == -1
    assert _C._promote_types("float16", "bfloat16") == "float32"
    assert _C._promote_types("int8", "int64") == "int64"
    assert reference.output_dtype("promote", ["int32", "float16"]) == "float16"
    assert reference.output_dtype("float", ["int32"]) == "float32"
    assert reference.output_dtype("accumulate", ["bool"]) == "int64"
    with pytest.raises(ValueError, match="unknown dtype 'int17'"):
        reference.output_dtype("promote", ["int17"])

"""The table from Oar ops (interface/ops.yaml) to ONNX nodes: every op is mapped or refused with a reason.

Each mapping is a function ``emit(g, ins, attrs, in_dtypes, out_dtype) -> [output names]`` over a
:class:`GraphBuilder`-like ``g`` (``g.node(op_type, inputs, **attrs)`` returns the output name,
``g.const(array)`` a constant's name, ``g.int_tensor(values)`` an int64 1-D constant).
tests/test_jit.py checks the table against oar_opset's op set, so a new op in ops.yaml must land here.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, numpy_helper

# oar dtype name -> ONNX element type
ONNX_TYPE = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
             "bfloat16": TensorProto.BFLOAT16, "int8": TensorProto.INT8, "int32": TensorProto.INT32,
             "int64": TensorProto.INT64, "bool": TensorProto.BOOL}

# Ops the exporter refuses, with why (the error names the op and this reason).
REFUSED = {
    "rand": "random numbers differ per call; export a model whose forward draws none",
    "randn": "random numbers differ per call; export a model whose forward draws none",
    "dropout": "training-only randomness; call model.eval() before oar.jit.save",
    "cross_entropy": "a training loss; export the forward that gives logits",
    "cross_entropy_backward": "a gradient op; export runs under no_grad",
    "gelu_backward": "a gradient op; export runs under no_grad",
    "conv2d_backward_input": "a gradient op; export runs under no_grad",
    "conv2d_backward_weight": "a gradient op; export runs under no_grad",
    "max_pool2d_backward": "a gradient op; export runs under no_grad",
    "avg_pool2d_backward": "a gradient op; export runs under no_grad",
    "layer_norm_backward_input": "a gradient op; export runs under no_grad",
    "rms_norm_backward_input": "a gradient op; export runs under no_grad",
    **{op: "a gradient op; export runs under no_grad" for op in (
        "batch_norm_backward", "group_norm_backward", "adaptive_avg_pool2d_backward", "adaptive_max_pool2d_backward",
        "upsample_nearest2d_backward", "upsample_bilinear2d_backward", "pad_backward",
        "lstm_cell_backward", "gru_cell_backward")},
    "index": "no mapping yet (advanced indexing would be a Gather per index tensor)",
    "index_put": "in-place index_put has no mapping yet",
    "max_pool2d_indices": "no mapping yet (ONNX MaxPool's indices count across the batch and channels)",
    "batch_norm_stats": "training-mode batch statistics; call model.eval() before oar.jit.save",
    "scatter": "in-place scatter has no mapping yet",
    "scatter_add": "in-place scatter has no mapping yet",
    "index_add": "in-place index_add has no mapping yet",
    "var": "no mapping yet (decompose with mean in the model)",
    "argsort": "no mapping yet (ONNX TopK differs on ties)",
    "cumprod": "no CumProd in the ONNX opsets onnxruntime runs",
    "one_hot": "no mapping yet",
    "any": "no mapping yet",
    "all": "no mapping yet",
    "floor_divide": "no mapping yet",
    "remainder": "no mapping yet",
    "argmin": "no mapping yet",
    "setitem": "view ops reach the exporter as strided operands; a launched setitem has no mapping",
    "reshape": "view ops reach the exporter as strided operands; a launched reshape has no mapping",
    "transpose": "view ops reach the exporter as strided operands; a launched transpose has no mapping",
    "permute": "view ops reach the exporter as strided operands; a launched permute has no mapping",
    "expand": "view ops reach the exporter as strided operands; a launched expand has no mapping",
    "slice": "view ops reach the exporter as strided operands; a launched slice has no mapping",
    "split": "view ops reach the exporter as strided operands; a launched split has no mapping",
}

_UNARY = {"neg": "Neg", "abs": "Abs", "sign": "Sign", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tanh": "Tanh", "sigmoid": "Sigmoid",
          "relu": "Relu", "erf": "Erf", "isnan": "IsNaN", "copy": "Identity", "mish": "Mish",
          "hardswish": "HardSwish"}
_ARITH = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "maximum": "Max",
          "minimum": "Min"}
_COMPARE = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin",
           "logsumexp": "ReduceLogSumExp"}


def _cast(g, name, have, want):
    return name if have == want else g.node("Cast", [name], to=ONNX_TYPE[want])


def _scalar(g, value, dtype):
    return g.const(np.array(value, dtype=np.dtype(dtype if dtype != "bfloat16" else "float32")))


def _unary(onnx_op):
    return lambda g, ins, attrs, dts, out: [g.node(onnx_op, [ins[0]])]


def _arith(onnx_op):
    def emit(g, ins, attrs, dts, out):
        return [g.node(onnx_op, [_cast(g, n, d, out) for n, d in zip(ins, dts)])]
    return emit


def _compare(onnx_op, negate=False):
    def emit(g, ins, attrs, dts, out):
        common = str(np.result_type(*[np.dtype(d) for d in dts])) if len(set(dts)) > 1 else dts[0]
        y = g.node(onnx_op, [_cast(g, n, d, common) for n, d in zip(ins, dts)])
        return [g.node("Not", [y]) if negate else y]
    return emit


def _logical(onnx_op):
    def emit(g, ins, attrs, dts, out):
        return [g.node(onnx_op, [_cast(g, n, d, "bool") for n, d in zip(ins, dts)])]
    return emit


def _reduce(onnx_op):
    def emit(g, ins, attrs, dts, out):
        dims = list(attrs.get("dim") or [])
        inputs = [ins[0]] + ([g.int_tensor(dims)] if dims else [])
        return [g.node(onnx_op, inputs, keepdims=int(bool(attrs.get("keepdim"))))]
    return emit


def _rms_norm(g, ins, attrs, dts, out):
    axes = g.int_tensor(list(range(-int(attrs["normalized_ndim"]), 0)))
    x = ins[0]
    mean_sq = g.node("ReduceMean", [g.node("Mul", [x, x]), axes], keepdims=1)
    denom = g.node("Sqrt", [g.node("Add", [mean_sq, _scalar(g, attrs["eps"], out)])])
    return [g.node("Mul", [g.node("Div", [x, denom]), ins[1]])]


def _layer_norm(g, ins, attrs, dts, out):
    return [g.node("LayerNormalization", list(ins), axis=-int(attrs["normalized_ndim"]), epsilon=float(attrs["eps"]))]


def _gelu(g, ins, attrs, dts, out):
    x = ins[0]
    half = g.node("Mul", [x, _scalar(g, 0.5, out)])
    if attrs.get("approximate", "none") == "tanh":
        cube = g.node("Mul", [g.node("Mul", [x, x]), x])
        inner = g.node("Add", [x, g.node("Mul", [cube, _scalar(g, 0.044715, out)])])
        t = g.node("Tanh", [g.node("Mul", [inner, _scalar(g, math.sqrt(2 / math.pi), out)])])
    else:
        t = g.node("Erf", [g.node("Mul", [x, _scalar(g, 1 / math.sqrt(2), out)])])
    return [g.node("Mul", [half, g.node("Add", [t, _scalar(g, 1.0, out)])])]


def _clip(lo_key, hi_key):
    def emit(g, ins, attrs, dts, out):
        x = ins[0]
        lo, hi = float(attrs[lo_key]), float(attrs[hi_key])
        if lo != -math.inf:
            x = g.node("Max", [x, _scalar(g, lo, out)])
        if hi != math.inf:
            x = g.node("Min", [x, _scalar(g, hi, out)])
        return [x if x != ins[0] else g.node("Identity", [x])]
    return emit


def _softplus(g, ins, attrs, dts, out):
    x, beta, threshold = ins[0], float(attrs["beta"]), float(attrs["threshold"])
    scaled = g.node("Mul", [x, _scalar(g, beta, out)])
    soft = g.node("Div", [g.node("Softplus", [scaled]), _scalar(g, beta, out)])
    return [g.node("Where", [g.node("Greater", [scaled, _scalar(g, threshold, out)]), x, soft])]


def _conv2d(g, ins, attrs, dts, out):
    p = list(attrs["padding"])
    return [g.node("Conv", list(ins), strides=list(attrs["stride"]), pads=p + p, dilations=list(attrs["dilation"]),
                   group=int(attrs["groups"]))]


def _pool(onnx_op, **extra):
    def emit(g, ins, attrs, dts, out):
        kernel = list(attrs["kernel_size"])
        p = list(attrs["padding"])
        return [g.node(onnx_op, [ins[0]], kernel_shape=kernel, strides=list(attrs["stride"]) or kernel, pads=p + p,
                       **extra)]
    return emit


def _filled_like(g, name, value, dtype):
    """A tensor of ``name``'s shape filled with ``value``."""
    fill = numpy_helper.from_array(np.array([value], dtype=np.dtype(dtype)))
    return g.node("ConstantOfShape", [g.node("Shape", [name])], value=fill)


def _per_channel(g, vector, like):
    """A [C] vector shaped [C, 1, ...] to broadcast over ``like``'s (N, C, *) dims."""
    ones = g.node("ConstantOfShape", [g.node("Sub", [g.node("Shape", [g.node("Shape", [like])]), g.int_tensor([2])])],
                  value=numpy_helper.from_array(np.array([1], dtype=np.int64)))
    return g.node("Reshape", [vector, g.node("Concat", [g.int_tensor([-1]), ones], axis=0)])


def _batch_norm(g, ins, attrs, dts, out):
    if attrs.get("training"):
        raise ValueError("batch_norm in training mode; call model.eval() before oar.jit.save")
    x, stats = ins[0], ins[1]
    mean, var = (g.node("Gather", [stats, g.scalar_int(row)], axis=0) for row in (0, 1))
    scale = ins[2] if len(ins) > 2 and ins[2] else _filled_like(g, mean, 1.0, out)
    bias = ins[3] if len(ins) > 3 and ins[3] else _filled_like(g, mean, 0.0, out)
    return [g.node("BatchNormalization", [x, scale, bias, mean, var], epsilon=float(attrs["eps"]))]


def _group_norm(g, ins, attrs, dts, out):
    x, groups = ins[0], int(attrs["num_groups"])
    grouped = g.node("Reshape", [x, g.int_tensor([0, groups, -1])])
    unit = g.const(np.ones(groups, np.dtype(out)))
    zero = g.const(np.zeros(groups, np.dtype(out)))
    normed = g.node("InstanceNormalization", [grouped, unit, zero], epsilon=float(attrs["eps"]))
    y = g.node("Reshape", [normed, g.node("Shape", [x])])
    if len(ins) > 1 and ins[1]:
        y = g.node("Mul", [y, _per_channel(g, ins[1], x)])
    if len(ins) > 2 and ins[2]:
        y = g.node("Add", [y, _per_channel(g, ins[2], x)])
    return [y]


def _gate_blocks(g, gates, count):
    """gates [N, count*H] as its count [N, H] blocks (Reshape to [N, count, H], Gather per block)."""
    blocks = g.node("Reshape", [gates, g.int_tensor([0, count, -1])])
    return [g.node("Gather", [blocks, g.scalar_int(k)], axis=1) for k in range(count)]


def _lstm_cell(g, ins, attrs, dts, out):
    i, f, gate, o = _gate_blocks(g, ins[0], 4)
    c = g.node("Add", [g.node("Mul", [g.node("Sigmoid", [f]), ins[1]]),
                       g.node("Mul", [g.node("Sigmoid", [i]), g.node("Tanh", [gate])])])
    h = g.node("Mul", [g.node("Sigmoid", [o]), g.node("Tanh", [c])])
    return [g.node("Concat", [h, c], axis=1)]


def _gru_cell(g, ins, attrs, dts, out):
    (xr, xz, xn), (hr, hz, hn) = _gate_blocks(g, ins[0], 3), _gate_blocks(g, ins[1], 3)
    r = g.node("Sigmoid", [g.node("Add", [xr, hr])])
    z = g.node("Sigmoid", [g.node("Add", [xz, hz])])
    n = g.node("Tanh", [g.node("Add", [xn, g.node("Mul", [r, hn])])])
    return [g.node("Add", [n, g.node("Mul", [z, g.node("Sub", [ins[2], n])])])]  # (1 - z) n + z h

def _adaptive_pool(global_op):
    def emit(g, ins, attrs, dts, out):
        if list(attrs["output_size"]) != [1, 1]:
            raise ValueError(f"adaptive pooling to {list(attrs['output_size'])}: only a 1x1 output has an ONNX op "
                             f"({global_op})")
        return [g.node(global_op, [ins[0]])]
    return emit


def _pad(g, ins, attrs, dts, out):
    pad = list(attrs["pad"])  # (before, after) pairs, last dim first, as torch's F.pad
    axes = [-1 - i for i in range(len(pad) // 2)]
    pads = [pad[2 * i] for i in range(len(axes))] + [pad[2 * i + 1] for i in range(len(axes))]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}[attrs.get("mode", "constant")]
    inputs = [ins[0], g.int_tensor(pads), _scalar(g, attrs.get("value", 0.0), out) if mode == "constant" else "",
              g.int_tensor(axes)]
    return [g.node("Pad", inputs, mode=mode)]


def _upsample(mode):
    def emit(g, ins, attrs, dts, out):
        scales = [float(v) for v in attrs.get("scales") or []]
        options = {"mode": mode, "axes": [2, 3]}
        if mode == "nearest":
            options.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        else:
            options["coordinate_transformation_mode"] = ("align_corners" if attrs.get("align_corners")
                                                         else "pytorch_half_pixel")
        if scales:
            return [g.node("Resize", [ins[0], "", g.const(np.array(scales, np.float32))], **options)]
        return [g.node("Resize", [ins[0], "", "", g.int_tensor(list(attrs["output_size"]))], **options)]
    return emit


def _where(g, ins, attrs, dts, out):
    return [g.node("Where", [_cast(g, ins[0], dts[0], "bool"), _cast(g, ins[1], dts[1], out),
                             _cast(g, ins[2], dts[2], out)])]


def _trilu(upper):
    def emit(g, ins, attrs, dts, out):
        return [g.node("Trilu", [ins[0], g.scalar_int(int(attrs["diagonal"]))], upper=upper)]
    return emit


def _cumsum(g, ins, attrs, dts, out):
    return [g.node("CumSum", [_cast(g, ins[0], dts[0], out), g.scalar_int(int(attrs["dim"]))])]


def _argmax(g, ins, attrs, dts, out):
    x, keep = ins[0], int(bool(attrs.get("keepdim")))
    if attrs.get("dim") is None:
        return [g.node("ArgMax", [g.node("Reshape", [x, g.int_tensor([-1])])], axis=0, keepdims=keep)]
    return [g.node("ArgMax", [x], axis=int(attrs["dim"]), keepdims=keep)]


def _weight_only_linear(g, ins, attrs, dts, out):
    """x @ W^T with W = (code - zeros) * scales per group of K, dequantized in the graph (ops.yaml's semantics)."""
    x, qweight, scales, zeros = ins
    bits, group = int(attrs["bits"]), int(attrs["group_size"])
    if bits == 4:  # u = q + 128; code[2j] = (u & 15) - 8, code[2j+1] = (u >> 4) - 8
        u = g.node("Add", [g.node("Cast", [qweight], to=TensorProto.INT32), g.const(np.array(128, np.int32))])
        high = g.node("Div", [u, g.const(np.array(16, np.int32))])
        low = g.node("Sub", [u, g.node("Mul", [high, g.const(np.array(16, np.int32))])])
        eight = g.const(np.array(8, np.int32))
        pairs = [g.node("Unsqueeze", [g.node("Sub", [v, eight]), g.int_tensor([-1])]) for v in (low, high)]
        code = g.node("Reshape", [g.node("Concat", pairs, axis=-1), g.int_tensor([0, -1])])
    elif bits == 8:
        code = qweight
    else:
        raise ValueError(f"weight_only_linear: bits={bits} is not 4 or 8")
    grouped = g.node("Reshape", [g.node("Cast", [code], to=ONNX_TYPE[out]), g.int_tensor([0, -1, group])])
    per_group = [g.node("Unsqueeze", [_cast(g, v, d, out), g.int_tensor([-1])])
                 for v, d in ((zeros, dts[3]), (scales, dts[2]))]
    weight = g.node("Mul", [g.node("Sub", [grouped, per_group[0]]), per_group[1]])
    weight = g.node("Reshape", [weight, g.int_tensor([0, -1])])
    return [g.node("MatMul", [x, g.node("Transpose", [weight], perm=[1, 0])])]


MAPPED = {
    **{op: _unary(o) for op, o in _UNARY.items()},
    **{op: _arith(o) for op, o in _ARITH.items()},
    **{op: _compare(o) for op, o in _COMPARE.items()},
    **{op: _reduce(o) for op, o in _REDUCE.items()},
    "ne": _compare("Equal", negate=True),
    "logical_and": _logical("And"), "logical_or": _logical("Or"), "logical_not": _logical("Not"),
    "rsqrt": lambda g, ins, a, d, o: [g.node("Reciprocal", [g.node("Sqrt", [ins[0]])])],
    "silu": lambda g, ins, a, d, o: [g.node("Mul", [ins[0], g.node("Sigmoid", [ins[0]])])],
    "log1p": lambda g, ins, a, d, o: [g.node("Log", [g.node("Add", [ins[0], _scalar(g, 1.0, o)])])],
    "expm1": lambda g, ins, a, d, o: [g.node("Sub", [g.node("Exp", [ins[0]]), _scalar(g, 1.0, o)])],
    "gelu": _gelu,
    "clamp": _clip("min", "max"),
    "hardtanh": _clip("min_val", "max_val"),
    "hardsigmoid": lambda g, ins, a, d, o: [g.node("HardSigmoid", [ins[0]], alpha=1 / 6, beta=0.5)],
    "leaky_relu": lambda g, ins, a, d, o: [g.node("LeakyRelu", [ins[0]], alpha=float(a["negative_slope"]))],
    "elu": lambda g, ins, a, d, o: [g.node("Elu", [ins[0]], alpha=float(a["alpha"]))],
    "softplus": _softplus,
    "cast": lambda g, ins, a, d, o: [g.node("Cast", [ins[0]], to=ONNX_TYPE[o])],
    "where": _where,
    "softmax": lambda g, ins, a, d, o: [g.node("Softmax", [ins[0]], axis=int(a["dim"]))],
    "log_softmax": lambda g, ins, a, d, o: [g.node("LogSoftmax", [ins[0]], axis=int(a["dim"]))],
    "argmax": _argmax,
    "cumsum": _cumsum,
    "matmul": lambda g, ins, a, d, o: [g.node("MatMul", list(ins))],
    "bmm": lambda g, ins, a, d, o: [g.node("MatMul", list(ins))],
    "conv2d": _conv2d,
    "max_pool2d": _pool("MaxPool"),
    "avg_pool2d": _pool("AveragePool", count_include_pad=1),
    "layer_norm": _layer_norm,
    "batch_norm": _batch_norm,
    "group_norm": _group_norm,
    "lstm_cell": _lstm_cell,
    "gru_cell": _gru_cell,
    "adaptive_avg_pool2d": _adaptive_pool("GlobalAveragePool"),
    "adaptive_max_pool2d": _adaptive_pool("GlobalMaxPool"),
    "pad": _pad,
    "upsample_nearest2d": _upsample("nearest"),
    "upsample_bilinear2d": _upsample("linear"),
    "rms_norm": _rms_norm,
    "embedding": lambda g, ins, a, d, o: [g.node("Gather", [ins[0], ins[1]], axis=0)],
    "gather": lambda g, ins, a, d, o: [g.node("GatherElements", [ins[0], ins[1]], axis=int(a["dim"]))],
    "index_select": lambda g, ins, a, d, o: [g.node("Gather", [ins[0], ins[1]], axis=int(a["dim"]))],
    "tril": _trilu(0),
    "triu": _trilu(1),
    "weight_only_linear": _weight_only_linear,
    "concat": lambda g, ins, a, d, o: [g.node("Concat", list(ins), axis=int(a["dim"]))],
}
# Ops whose ONNX nodes broadcast their operands as numpy does (all operands of the same rank here).
BROADCASTING = frozenset({*_ARITH, *_COMPARE, "ne", "logical_and", "logical_or", "where"})
# Creation ops (full, arange) take their output shape from the launch: the exporter emits them itself.
CREATION = ("full", "arange")


def mapping_problem(op: str) -> str | None:
    """Why ``op`` cannot be exported (None: it can)."""
    if op in MAPPED or op in CREATION:
        return None
    if op in REFUSED:
        return REFUSED[op]
    return "not in oar.jit's ONNX table (an op added to ops.yaml after the exporter)"

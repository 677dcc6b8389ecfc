"""Loading an ONNX model: parse, upgrade old opsets, check, infer shapes, and describe its types."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from oar.onnx.errors import OnnxModelError

MIN_OPSET = 13
# ONNX element types Oar tensors hold, and the oar dtype name of each.
OAR_DTYPE_OF_ONNX = {
    TensorProto.FLOAT: "float32",
    TensorProto.DOUBLE: "float64",
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.INT8: "int8",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
    TensorProto.BOOL: "bool",
}
# ONNX integer types Oar has no dtype for, held in a wider signed integer: values are exact while
# they fit; Cast into them wraps as ONNX does; run() returns them in their own numpy dtype.
WIDENED_ONNX = {
    TensorProto.UINT8: "int32",
    TensorProto.INT16: "int32",
    TensorProto.UINT16: "int32",
    TensorProto.UINT32: "int64",
    TensorProto.UINT64: "int64",
}
ONNX_TYPE_NAME = {v: "tensor(" + k.lower() + ")" for k, v in TensorProto.DataType.items()}


def newest_opset() -> int:
    """The newest default-domain opset the installed onnx package knows."""
    return onnx.defs.onnx_opset_version()


@dataclass(frozen=True)
class NodeArg:
    """An input or output of the model, as onnxruntime's NodeArg: name, shape (ints, symbolic names
    as str, None where unknown) and type ("tensor(float)")."""

    name: str
    shape: list
    type: str
    elem_type: int

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def describe_value(value: onnx.ValueInfoProto) -> NodeArg:
    tensor = value.type.tensor_type
    shape: list = []
    if tensor.HasField("shape"):
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                shape.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                shape.append(dim.dim_param)
            else:
                shape.append(None)
    else:
        shape = None  # rank unknown
    elem = tensor.elem_type
    return NodeArg(value.name, shape, ONNX_TYPE_NAME.get(elem, f"tensor(type {elem})"), elem)


def model_name(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(source, onnx.ModelProto):
        return f"model '{source.graph.name}'" if source.graph.name else "<ModelProto>"
    return "<bytes>"


def load_model(source) -> tuple[onnx.ModelProto, str]:
    """The checked, shape-inferred model of a path, bytes or ModelProto, and the name errors use."""
    name = model_name(source)
    if isinstance(source, onnx.ModelProto):
        model = source
    elif isinstance(source, (bytes, bytearray, memoryview)):
        try:
            model = onnx.load_model_from_string(bytes(source))
        except (DecodeError, RuntimeError, ValueError) as error:
            raise OnnxModelError(f"{name}: not a valid ONNX model ({len(source)} bytes): {error}") from None
        if model.graph.name:
            name = f"model '{model.graph.name}'"
    elif isinstance(source, (str, os.PathLike)):
        if not os.path.isfile(source):
            raise OnnxModelError(f"{name}: no such model file")
        try:
            model = onnx.load(os.fspath(source))
        except (DecodeError, RuntimeError, ValueError, OSError) as error:
            raise OnnxModelError(f"{name}: not a valid ONNX model file "
                                 f"({os.path.getsize(source)} bytes; truncated or not ONNX?): {error}") from None
    else:
        raise TypeError(f"InferenceSession takes a path, bytes or onnx.ModelProto, not {type(source).__name__}")
    if not model.graph.node and not model.graph.output:
        raise OnnxModelError(f"{name}: the model has an empty graph (truncated or not ONNX?)")
    model = _upgrade_opset(model, name)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise OnnxModelError(f"{name}: onnx's checker rejects the model: {error}") from None
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError) as error:
        raise OnnxModelError(f"{name}: onnx's shape inference rejects the model: {error}") from None
    return model, name


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def _upgrade_opset(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    version = default_opset(model)
    if version > newest_opset():
        raise OnnxModelError(f"{name}: opset {version} is newer than the installed onnx knows ({newest_opset()})")
    if 0 < version < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as error:  # noqa: BLE001 -- the converter raises many kinds
            raise OnnxModelError(f"{name}: opset {version} is older than {MIN_OPSET} and onnx's version "
                                 f"converter cannot upgrade it: {error}") from None
        # the converter keeps the IR version: IR < 4 wants every initializer listed as a graph input
        # (old PyTorch exports break that), and opset 13 needs IR 7 anyway
        model.ir_version = max(model.ir_version, onnx.helper.find_min_ir_version_for(
            [onnx.helper.make_opsetid("", MIN_OPSET)]))
    return model


def oar_dtype(elem_type: int) -> str | None:
    """The oar dtype that holds an ONNX element type (its own, or a wider integer), or None."""
    return OAR_DTYPE_OF_ONNX.get(elem_type) or WIDENED_ONNX.get(elem_type)


def numpy_dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))

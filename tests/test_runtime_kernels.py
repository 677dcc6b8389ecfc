"""Library kernels through the oar API: kernel_query (cached), kernel_launch with
TensorDesc and typed attributes, results against numpy, errors as DeviceError."""

from __future__ import annotations

import numpy as np
import pytest

import oar


def to_device(array: np.ndarray, dev: str) -> oar.raw.DeviceBuffer:
    buffer = oar.raw.DeviceBuffer(max(array.nbytes, 1), dev)
    buffer.copy_from_host(np.ascontiguousarray(array))
    return buffer


def run(op: str, inputs: list[np.ndarray], out_shape, dev: str, out_dtype="float32", attrs=None,
        input_strides=None) -> np.ndarray:
    buffers = [to_device(a, dev) for a in inputs]
    out = oar.raw.DeviceBuffer(max(int(np.prod(out_shape)) * np.dtype(out_dtype).itemsize, 1), dev)
    descs = []
    for i, (array, buffer) in enumerate(zip(inputs, buffers)):
        strides = input_strides[i] if input_strides else None
        shape = out_shape if strides is not None else array.shape
        descs.append(buffer.desc(list(shape), array.dtype, strides=strides))
    kernel = oar.raw.kernel_query(op, [a.dtype.name for a in inputs] + [out_dtype], dev)
    oar.raw.kernel_launch(kernel, descs, [out.desc(list(out_shape), out_dtype)], attrs)
    return out.to_numpy(out_dtype, out_shape)


@pytest.mark.parametrize("op, reference", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                           ("div", np.divide)])
def test_binary_ops(dev, op, reference):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 33)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (8, 33)).astype(np.float32)
    np.testing.assert_allclose(run(op, [a, b], a.shape, dev), reference(a, b), rtol=1e-6)


def test_broadcast_with_zero_strides(dev):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    row = np.array([10, 20, 30], dtype=np.float32)
    got = run("add", [a, row], (4, 3), dev, input_strides=[None, [0, 1]])
    np.testing.assert_array_equal(got, a + row)


@pytest.mark.parametrize("op, reference", [
    ("neg", np.negative), ("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt),
    ("rsqrt", lambda x: 1 / np.sqrt(x)), ("tanh", np.tanh), ("relu", lambda x: np.maximum(x, 0)),
])
def test_unary_ops(dev, op, reference):
    x = np.linspace(0.1, 4.0, 50, dtype=np.float32)
    if op in ("neg", "tanh", "relu"):
        x = x - 2
    np.testing.assert_allclose(run(op, [x], x.shape, dev), reference(x), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("op, reference", [("sum", np.sum), ("mean", np.mean), ("max", np.max)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_with_attributes(dev, op, reference, keepdim):
    x = np.random.default_rng(3).standard_normal((4, 5, 6)).astype(np.float32)
    expected = reference(x, axis=1, keepdims=keepdim)
    got = run(op, [x], expected.shape, dev, attrs={"dim": [1], "keepdim": keepdim})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    everything = run(op, [x], (), dev)  # no dim: all dims
    np.testing.assert_allclose(everything, reference(x), rtol=1e-5)


def test_matmul(dev):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((17, 9)).astype(np.float32)
    b = rng.standard_normal((9, 5)).astype(np.float32)
    np.testing.assert_allclose(run("matmul", [a, b], (17, 5), dev), a @ b, rtol=1e-5, atol=1e-5)


def test_full_copy_and_cast(dev):
    np.testing.assert_array_equal(run("full", [], (3, 4), dev, attrs={"value": 2.5}), np.full((3, 4), 2.5))
    np.testing.assert_array_equal(run("full", [], (5,), dev, out_dtype="int64", attrs={"value": 7}),
                                  np.full(5, 7))
    x = np.array([1.7, -2.2, 3.9], dtype=np.float32)
    np.testing.assert_array_equal(run("copy", [x], x.shape, dev), x)
    np.testing.assert_array_equal(run("cast", [x], x.shape, dev, out_dtype="int32",
                                      attrs={"dtype": oar.raw.TypedAttr("dtype", "int32")}), [1, -2, 3])


def test_kernels_are_cached(dev):
    first = oar.raw.kernel_query("add", ["float32"] * 3, dev)
    again = oar.raw.kernel_query("add", [np.float32, "float32", oar.raw.DataType("float32")], dev)
    assert first is again
    assert first.op == "add" and first.dtypes == ["float32"] * 3
    assert first.device_name == dev
    other_device = oar.raw.kernel_query("add", ["float32"] * 3, f"{oar.device(dev).type}:1")
    assert other_device is not first


def test_missing_kernel(dev):
    with pytest.raises(oar.DeviceError) as error:
        oar.raw.kernel_query("add", ["int8"] * 3, dev)
    assert error.value.status_name == "OAR_ERROR_NOT_SUPPORTED"
    assert error.value.call == "kernel_query"
    assert "add" in error.value.plugin_message
    assert oar.raw.kernel_query("add", ["int8"] * 3, dev, allow_missing=True) is None
    assert oar.raw.kernel_query("no_such_op", ["float32"], dev, allow_missing=True) is None
    with pytest.raises(ValueError, match="unknown dtype"):
        oar.raw.kernel_query("add", ["float33"], dev)


def test_launch_errors_name_the_problem(dev):
    a, b = oar.raw.DeviceBuffer(64, dev), oar.raw.DeviceBuffer(64, dev)
    add = oar.raw.kernel_query("add", ["float32"] * 3, dev)
    with pytest.raises(oar.DeviceError) as error:
        oar.raw.kernel_launch(add, [a.desc([16]), b.desc([8])], [a.desc([16])])
    assert error.value.call == "kernel_launch"
    assert error.value.status_name == "OAR_ERROR_INVALID_ARGUMENT"
    assert "shape" in error.value.plugin_message
    with pytest.raises(oar.DeviceError, match="OAR_ERROR_INVALID_ARGUMENT"):
        oar.raw.kernel_launch(add, [a.desc([16])], [b.desc([16])])
    with pytest.raises(oar.DeviceError, match="OAR_ERROR_INVALID_ARGUMENT"):
        oar.raw.kernel_launch(add, [a.desc([16]), b.desc([16])], [a.desc([16])], {"bogus": 1})
    with pytest.raises(TypeError, match="TensorDesc"):
        oar.raw.kernel_launch(add, [a.desc([16]), "b"], [a.desc([16])])
    with pytest.raises(TypeError, match="list or tuple"):
        oar.raw.kernel_launch(add, a.desc([16]), [a.desc([16])])
    other = oar.raw.DeviceBuffer(64, f"{oar.device(dev).type}:1")
    with pytest.raises(ValueError, match="device 1"):
        oar.raw.kernel_launch(add, [a.desc([16]), other.desc([16])], [a.desc([16])])
    with pytest.raises(ValueError, match="cannot run on a stream"):
        oar.raw.kernel_launch(add, [a.desc([16]), b.desc([16])], [a.desc([16])], stream=oar.Stream(other.device))


def test_attribute_conversion():
    attrs = oar.raw.Attrs({
        "i": 3, "f": 2.5, "b": True, "ints": [1, -2], "floats": (1.5, 2), "s": "text",
        "dt": oar.raw.DataType("int64"), "np_int": np.int64(9), "np_float": np.float32(0.5),
        "np_array": np.array([1, 2, 3]), "forced": oar.raw.TypedAttr("floats", [1, 2]),
        "empty": [], "as_float": oar.raw.TypedAttr("float", 3),
    })
    assert len(attrs) == 13
    assert attrs.to_dict() == {
        "i": ("int", 3), "f": ("float", 2.5), "b": ("bool", True), "ints": ("ints", [1, -2]),
        "floats": ("floats", [1.5, 2.0]), "s": ("string", "text"), "dt": ("dtype", oar.raw.DataType("int64")),
        "np_int": ("int", 9), "np_float": ("float", 0.5), "np_array": ("ints", [1, 2, 3]),
        "forced": ("floats", [1.0, 2.0]), "empty": ("ints", []), "as_float": ("float", 3.0),
    }
    with pytest.raises(TypeError, match="'bad'"):
        oar.raw.Attrs({"bad": object()})
    with pytest.raises(TypeError, match="names must be str"):
        oar.raw.Attrs({1: 2})
    with pytest.raises(TypeError, match="'x'.*integers"):
        oar.raw.Attrs({"x": oar.raw.TypedAttr("ints", [1.5])})
    with pytest.raises(ValueError, match="unknown attribute type"):
        oar.raw.TypedAttr("complex", 1)


def test_prebuilt_attrs_are_reusable(dev):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    source = to_device(x, dev)
    out = oar.raw.DeviceBuffer(4 * 8, dev)
    kernel = oar.raw.kernel_query("sum", ["float32", "float32"], dev)
    attrs = oar.raw.Attrs({"dim": [1], "keepdim": False})
    for _ in range(3):
        oar.raw.kernel_launch(kernel, [source.desc([2, 3, 4])], [out.desc([2, 4])], attrs)
    np.testing.assert_array_equal(out.to_numpy(np.float32, (2, 4)), x.sum(axis=1))


def test_tensor_desc():
    desc = oar.raw.TensorDesc(0x1000, [2, 3], "float32", strides=[3, 1], byte_offset=8, device=1)
    assert (desc.shape, desc.strides, desc.ndim, desc.numel, desc.device) == ((2, 3), (3, 1), 2, 6, 1)
    assert desc.dtype.itemsize == 4 and str(desc.dtype) == "float32"
    desc.data = 0x2000
    assert desc.data == 0x2000
    scalar = oar.raw.TensorDesc(0x1000, [], "int64")
    assert scalar.ndim == 0 and scalar.numel == 1
    with pytest.raises(ValueError, match="strides has"):
        oar.raw.TensorDesc(0, [2, 3], "float32", strides=[1])
    with pytest.raises(ValueError, match=">= 0"):
        oar.raw.TensorDesc(0, [2, -1], "float32")
    with pytest.raises(ValueError, match=">= 0"):
        oar.raw.TensorDesc(0, [2], "float32", strides=[-1])

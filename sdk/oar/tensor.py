"""oar.Tensor: an n-d array in device memory, and the functions that make one.

The data lives in the device's memory (from its caching allocator) and never
on the host unless asked for: ``t.numpy()``, ``t.item()``, ``t.tolist()`` and
``repr(t)`` copy it back through the plugin after the current stream's work.
Everything else (ops, views, indexing) is enqueued on the current stream of
the tensor's device and returns at once.

The C++ core (``oar._C.TensorBase``) holds the storage and the metadata
(shape, strides and offset in elements, dtype), the autograd slots
(``requires_grad``, ``grad``, ``grad_fn``) and the version counter of in-place
changes, and implements the operators, views and indexing. This class adds
the host round trips, conversions, in-place methods and the methods generated
from ops.yaml (``t.exp()``, ``t.sum(dim=1)``, ...).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Iterable, Sequence

import numpy as np

from oar import _C, ops as _ops
from oar import devices as _devices
from oar import random as _random
from oar.devices import DeviceLike
from oar.errors import DTypeError

__all__ = [
    "Tensor", "DType", "float32", "float16", "bfloat16", "float64", "int8", "int32", "int64", "bool_",
    "to_tensor", "tensor", "from_dlpack", "empty", "zeros", "ones", "full", "arange", "rand", "randn",
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "manual_seed",
    "concat", "cat", "stack", "is_tensor", "dtype_of", "is_floating_point", "numpy_dtype",
]

DType = _C.DataType
float32, float16, bfloat16, float64, int8, int32, int64, bool_ = _C.tensor_dtypes  # oar.bool is bool_
_BY_NAME = {d.name: d for d in _C.tensor_dtypes}
_FLOATING = frozenset(("float32", "float16", "bfloat16", "float64"))

DLPACK_CPU = 1
DLPACK_EXT_DEV = 12

manual_seed = _random.manual_seed

_numpy_dtypes: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
_numpy_lock = threading.Lock()


def numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype of an oar dtype (bfloat16 is ml_dtypes.bfloat16)."""
    name = dtype_of(dtype).name
    found = _numpy_dtypes.get(name)
    if found is None:
        with _numpy_lock:
            try:
                import ml_dtypes
            except ImportError as error:  # pragma: no cover - a dependency of oar
                raise DTypeError("bfloat16 tensors need the ml_dtypes package on the host "
                                 "(pip install ml_dtypes), or convert first: t.to(oar.float32)") from error
            found = _numpy_dtypes[name] = np.dtype(ml_dtypes.bfloat16)
    return found


def dtype_of(value: Any) -> DType:
    """The oar dtype for an oar dtype, a name ("float32"), or a numpy dtype/type."""
    if isinstance(value, DType):
        found = _BY_NAME.get(value.name)
    elif isinstance(value, str):
        found = _BY_NAME.get(value.removeprefix("oar."))
    else:
        try:
            found = _BY_NAME.get(np.dtype(value).name)
        except TypeError:
            found = None
    if found is None:
        raise DTypeError(f"{value!r} is not a tensor dtype of oar (float32, float16, bfloat16, float64, int8, "
                         "int32, int64, bool)")
    return found


def _category(dtype: DType) -> int:
    """0 bool, 1 integer, 2 floating: the order in which torch lets a result be stored in place."""
    return 2 if dtype.name in _FLOATING else (0 if dtype.name == "bool" else 1)


def is_floating_point(value: Any) -> bool:
    """Whether a tensor or dtype is a floating-point type."""
    return (value.dtype if isinstance(value, Tensor) else dtype_of(value)).name in _FLOATING


def is_tensor(value: Any) -> bool:
    return isinstance(value, _C.TensorBase)


_resolved: dict[Any, tuple[Any, Any]] = {}


def resolve(device: DeviceLike) -> tuple[Any, Any]:
    """oar.devices.resolve, cached per device spec (the factories' hot path): (plugin, device)."""
    if device is None:
        device = getattr(_devices._thread_state, "device", None)  # set_device / `with stream:`
        # else the default device (the first loaded plugin's): cached under None
    try:
        hit = _resolved.get(device)
    except TypeError:  # unhashable: let resolve explain
        return _devices.resolve(device)
    if hit is None or hit[0].finalized:
        hit = _devices.resolve(device)
        if len(_resolved) > 64:
            _resolved.clear()
        _resolved[device] = hit
    return hit


def _shape_tuple(shape: Any) -> tuple[int, ...]:
    if type(shape) in (tuple, list) and all(type(s) is int for s in shape):
        return tuple(shape)  # the common case: plain ints
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    if isinstance(shape, Tensor):
        raise TypeError("a shape is ints, not a tensor")
    return tuple(int(s) for s in shape)


def _varargs_shape(shape: tuple) -> tuple[int, ...]:
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        return _shape_tuple(shape[0])
    return _shape_tuple(shape)


def _host_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 view (any dtype, 0-d included)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class Tensor(_C.TensorBase):
    """An n-d array on a device. Make one with :func:`oar.tensor`, :func:`oar.zeros`, ... or an op.

    ``shape``, ``dtype``, ``device``, ``ndim``, ``strides`` (in elements) and
    ``numel()`` describe it; ``requires_grad``, ``grad``, ``grad_fn``,
    ``is_leaf`` and ``backward()`` connect it to :mod:`oar.autograd`.
    """

    # numpy defers to our reflected operators instead of treating a tensor as an object.
    __array_ufunc__ = None
    __array_priority__ = 1000

    # ---- host round trips ------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """A new numpy array with the values (waits for the current stream's work first).
        A failure of earlier asynchronous work (an index out of range in gather...)
        surfaces here as an oar.DeviceError naming the kernel."""
        source = self if self.is_contiguous() else self.contiguous()
        out = np.empty(self.shape, dtype=numpy_dtype(self.dtype))
        _C._copy_to_host(source, _host_bytes(out) if out.size else out.view(np.uint8))
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number."""
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has {self.numel()} "
                             f"(shape {tuple(self.shape)})")
        value = self.numpy().reshape(())
        if self.dtype is bfloat16:
            return float(value)
        return value.item()

    def tolist(self) -> Any:
        """The values as (nested) Python lists of numbers."""
        array = self.numpy()
        if self.dtype is bfloat16:
            array = array.astype(np.float32)
        return array.tolist()

    def __repr__(self) -> str:
        try:
            array = self.numpy()
            if self.dtype in (bfloat16, float16):
                array = array.astype(np.float32)
            options = {}
            if array.dtype.kind == "f" and array.size:
                finite = array[np.isfinite(array)]
                if finite.size and not np.all(finite == np.round(finite)) and np.abs(finite).max() < 1e8 \
                        and np.abs(finite[finite != 0]).min(initial=1.0) >= 1e-4:
                    options = {"floatmode": "fixed", "precision": 4}  # like torch: 1.5000, 2.2500
            body = np.array2string(array, separator=", ", prefix="tensor(", threshold=1000, edgeitems=3, **options)
        except Exception as error:  # noqa: BLE001 -- a repr must not raise
            body = f"<values unavailable: {type(error).__name__}: {error}>"
        extras = [f"device='{self.device}'", f"dtype=oar.{self.dtype.name}"]
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{_node_name(self.grad_fn)}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return f"tensor({body}, {', '.join(extras)})"

    def __format__(self, spec: str) -> str:
        if self.ndim == 0 and spec:
            return format(self.item(), spec)
        return format(repr(self), spec)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        for i in range(self.shape[0]):
            yield self[i]

    def __reduce_ex__(self, protocol: int):
        return (_rebuild, (self.numpy(), self.dtype.name, str(self.device), self.requires_grad))

    def __dlpack_info__(self) -> str:  # pragma: no cover - documentation hook
        return ("kDLExtDev device memory: zero-copy between users of the same plugin; numpy and torch "
                "cannot read it (use t.numpy())")

    # ---- conversions ----------------------------------------------------------------------------

    def to(self, *args: Any, dtype: Any = None, device: DeviceLike = None, copy: bool = False) -> "Tensor":
        """A tensor on another device and/or of another dtype: ``t.to("npu:1")``,
        ``t.to(oar.float16)``, ``t.to("npu:1", oar.float64)``. Returns self when nothing
        changes (unless copy). dtype changes use the cast op (recorded by autograd);
        device changes go through the host."""
        for arg in args:
            if isinstance(arg, DType) or (isinstance(arg, str) and arg.removeprefix("oar.") in _BY_NAME):
                dtype = arg
            elif isinstance(arg, Tensor):
                dtype, device = arg.dtype, arg.device
            else:
                device = arg
        result = self
        if device is not None:
            _, target = resolve(device)
            if target != self.device:
                moved = to_tensor(self.numpy(), device=target)
                result = moved
        if dtype is not None and dtype_of(dtype) is not result.dtype:
            result = _ops.cast(result, dtype=dtype_of(dtype))
        if copy and result is self:
            result = self.clone()
        return result

    def clone(self) -> "Tensor":
        """A contiguous copy (the copy op; recorded by autograd)."""
        return _ops.copy(self)

    def float(self) -> "Tensor":
        return self.to(float32)

    def double(self) -> "Tensor":
        return self.to(float64)

    def half(self) -> "Tensor":
        return self.to(float16)

    def bfloat16(self) -> "Tensor":
        return self.to(bfloat16)

    def int(self) -> "Tensor":
        return self.to(int32)

    def long(self) -> "Tensor":
        return self.to(int64)

    def bool(self) -> "Tensor":
        return self.to(bool_)

    def is_floating_point(self) -> bool:
        return self.dtype.name in _FLOATING

    def element_size(self) -> int:
        return self.itemsize

    def type_as(self, other: "Tensor") -> "Tensor":
        return self.to(other.dtype)

    # ---- autograd -------------------------------------------------------------------------------

    def backward(self, gradient: "Tensor | None" = None, retain_graph: bool | None = None,
                 create_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into each leaf's ``.grad`` (see oar.autograd.backward)."""
        from oar import autograd

        autograd.backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph)

    def record_stream(self, stream: Any) -> None:
        """Tell the caching allocator that work on ``stream`` (not the stream the memory was
        allocated on) uses this tensor: its memory is not reused before that work ends."""
        _C._record_stream(self, stream._c)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        self.requires_grad = requires_grad
        return self

    # ---- in-place (bump the version counter; not recorded by autograd) ----------------------------

    def copy_(self, source: Any) -> "Tensor":
        """Copy source (a tensor, a number or array-like) into this tensor, broadcast and cast."""
        _C._check_inplace(self, source, "copy_")
        if isinstance(source, Tensor) and source.device != self.device:
            source = source.to(self.device)
        _C._copy_into(self, source)
        return self

    def fill_(self, value: Any) -> "Tensor":
        _C._copy_into(self, value)
        return self

    def zero_(self) -> "Tensor":
        _C._copy_into(self, 0)
        return self

    def register_post_accumulate_grad_hook(self, hook) -> Any:
        """Call ``hook(self)`` after backward stored this leaf's gradient into ``.grad`` for good
        (as torch's); returns a function that removes it."""
        from oar.autograd.engine import register_post_accumulate_grad_hook

        return register_post_accumulate_grad_hook(self, hook)

    def _store_inplace(self, result: "Tensor", what: str) -> "Tensor":
        # torch refuses a result its target's dtype cannot hold (float into int, int into bool)
        if _category(result.dtype) > _category(self.dtype):
            raise DTypeError(f"{what}: the result dtype {result.dtype.name} cannot be stored in a tensor of "
                             f"dtype {self.dtype.name} in place (use the out-of-place op, or convert first)")
        _C._copy_into(self, result)
        return self

    def add_(self, other: Any, alpha: Any = 1) -> "Tensor":
        _C._check_inplace(self, other, "add_")
        value = (other if alpha == 1 else other * alpha)
        if _C._run_inplace("add", self, value):  # the kernel wrote self
            return self
        return self._store_inplace(self + value, "add_")

    def sub_(self, other: Any, alpha: Any = 1) -> "Tensor":
        _C._check_inplace(self, other, "sub_")
        value = (other if alpha == 1 else other * alpha)
        if _C._run_inplace("sub", self, value):  # the kernel wrote self
            return self
        return self._store_inplace(self - value, "sub_")

    def mul_(self, other: Any) -> "Tensor":
        _C._check_inplace(self, other, "mul_")
        if _C._run_inplace("mul", self, other):  # the kernel wrote self
            return self
        return self._store_inplace(self * other, "mul_")

    def div_(self, other: Any) -> "Tensor":
        _C._check_inplace(self, other, "div_")
        if _C._run_inplace("div", self, other):  # the kernel wrote self
            return self
        return self._store_inplace(self / other, "div_")

    def clamp_(self, min: Any = None, max: Any = None) -> "Tensor":  # noqa: A002
        _C._check_inplace(self, None, "clamp_")
        if self.dtype.name not in _FLOATING:
            for bound in (min, max):
                if bound is not None and not isinstance(bound, Tensor) and not (math.isinf(float(bound)) or float(bound).is_integer()):
                    raise DTypeError(f"clamp_: the bound {bound!r} is not integral, so the result cannot be "
                                     f"stored in a tensor of dtype {self.dtype.name} in place")
        return self._store_inplace(
            self.clamp(min=-math.inf if min is None else min, max=math.inf if max is None else max), "clamp_")

    # ---- shape helpers (views, recorded as reshape/permute/transpose/split) -----------------------

    def squeeze(self, dim: int | None = None) -> "Tensor":
        if dim is None:
            return self.reshape([s for s in self.shape if s != 1])
        ndim = max(self.ndim, 1)
        if not -ndim <= dim < ndim:
            raise IndexError(f"squeeze: dim {dim} is out of range for a {self.ndim}-d tensor")
        if self.ndim == 0 or self.shape[dim % ndim] != 1:
            return self.reshape(self.shape)
        shape = list(self.shape)
        del shape[dim % ndim]
        return self.reshape(shape)

    def unsqueeze(self, dim: int) -> "Tensor":
        ndim = self.ndim + 1
        if not -ndim <= dim < ndim:
            raise IndexError(f"unsqueeze: dim {dim} is out of range for a result of {ndim} dims")
        shape = list(self.shape)
        shape.insert(dim % ndim, 1)
        return self.reshape(shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape([1])
        start, end = start_dim % self.ndim, end_dim % self.ndim
        if start > end:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        shape = list(self.shape[:start]) + [math.prod(self.shape[start:end + 1])] + list(self.shape[end + 1:])
        return self.reshape(shape)

    def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple["Tensor", ...]:
        """Views of consecutive pieces along dim: chunks of split_size (the last may be smaller),
        or the given sizes."""
        if isinstance(split_size_or_sections, (int, np.integer)):
            size = int(split_size_or_sections)
            if size <= 0:
                raise ValueError(f"split: the chunk size must be positive, not {size}")
            total = self.shape[dim]
            sizes = [size] * (total // size) + ([total % size] if total % size else [])
        else:
            sizes = [int(s) for s in split_size_or_sections]
        return _ops.split(self, sizes, dim=dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple["Tensor", ...]:
        return self.split(max(1, -(-self.shape[dim] // chunks)), dim)

    def expand_as(self, other: "Tensor") -> "Tensor":
        return self.expand(other.shape)

    def view_as(self, other: "Tensor") -> "Tensor":
        return self.view(other.shape)

    def reshape_as(self, other: "Tensor") -> "Tensor":
        return self.reshape(other.shape)

    @property
    def T(self) -> "Tensor":
        """The dims reversed (a transpose of a matrix)."""
        return self.permute(list(range(self.ndim - 1, -1, -1))) if self.ndim > 1 else self.reshape(self.shape)

    @property
    def mT(self) -> "Tensor":
        """The last two dims swapped."""
        return self.transpose(-2, -1)

    @property
    def data(self) -> "Tensor":
        """This tensor outside the autograd graph (shares the storage)."""
        return self.detach()

    @property
    def is_cpu(self) -> bool:
        return False


def _node_name(node: Any) -> str:
    name = getattr(node, "name", None)
    name = name() if callable(name) else name
    return str(name) if name else type(node).__name__


def _rebuild(array: np.ndarray, dtype: str, device: str, requires_grad: bool) -> Tensor:
    return to_tensor(array, dtype=dtype, device=device, requires_grad=requires_grad)


def _install_op_methods() -> None:
    """t.exp(), t.sum(dim=1), t.clamp(0, 1), ...: the op functions of the ops ops.yaml marks
    ``method: true``, except where Tensor has its own method of that name (reshape, split, ...)."""
    for op in _ops.opset:
        if op.method and not hasattr(Tensor, op.name):
            setattr(Tensor, op.name, getattr(_ops, op.name))


_install_op_methods()
_C._set_tensor_class(Tensor)


# ---- making tensors -------------------------------------------------------------------------------

def _default_dtype(value: Any) -> DType:
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return int64
    return float32


def to_tensor(data: Any, dtype: Any = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """A new tensor on ``device`` (default: the current device) with a copy of ``data``: a
    number, nested lists, a numpy array, anything with ``__array__`` or ``__dlpack__`` (host
    memory), or a tensor. Python floats become float32, ints int64, bools bool; numpy
    arrays keep their dtype (unless ``dtype`` is given)."""
    target = None if dtype is None else dtype_of(dtype)
    if isinstance(data, Tensor):
        out = data.detach().to(device if device is not None else data.device, dtype=target, copy=True)
        if requires_grad:
            out.requires_grad = True
        return out
    array = _host_array(data, target)
    out = _C._empty(array.shape, array.dtype.name if target is None else target, device)
    if array.size:
        _C._copy_from_host(out, _host_bytes(array))
    if requires_grad:
        out.requires_grad = True
    return out


def _host_array(data: Any, target: DType | None) -> np.ndarray:
    if isinstance(data, np.ndarray):
        array = data
    elif hasattr(data, "__dlpack__") and not isinstance(data, np.generic) and not hasattr(data, "__array_interface__"):
        array = _dlpack_to_numpy(data)
    else:
        array = np.asarray(data)
        if array.dtype == np.float64 and not _has_float64(data):
            array = array.astype(np.float32)  # Python floats: the default float dtype
    if array.dtype == object:
        raise TypeError(f"cannot make a tensor of {type(data).__name__}: values must be numbers (got an object array)")
    if not array.dtype.isnative:  # e.g. '>f4': device memory holds native (little-endian) bytes
        array = array.astype(array.dtype.newbyteorder("="))
    if target is not None:
        array = array.astype(numpy_dtype(target), copy=False)
    else:
        try:
            dtype_of(array.dtype)
        except DTypeError:
            raise DTypeError(f"numpy dtype {array.dtype} has no oar dtype (float32, float16, bfloat16, "
                             f"float64, int8, int32, int64, bool): pass dtype=..., e.g. dtype=oar.int32") from None
    return array if array.flags.c_contiguous else np.array(array, order="C")  # (ascontiguousarray makes 0-d 1-d)


def _has_float64(data: Any) -> bool:
    """Whether data is (or nests) numpy float64 values, not Python floats."""
    if isinstance(data, (np.ndarray, np.generic)):
        return data.dtype == np.float64
    if isinstance(data, (list, tuple)) and data:
        return _has_float64(data[0])
    return False


def _dlpack_to_numpy(obj: Any) -> np.ndarray:
    if hasattr(obj, "detach") and getattr(obj, "requires_grad", False):
        obj = obj.detach()  # torch refuses to export tensors that require grad
    try:
        return np.from_dlpack(obj)
    except (BufferError, TypeError, RuntimeError):
        # e.g. bfloat16, which numpy cannot import: through oar's own importer, then back
        return from_dlpack(obj).numpy()


tensor = to_tensor


def from_dlpack(obj: Any, device: DeviceLike = None) -> Tensor:
    """A tensor from a DLPack producer (numpy array, torch tensor, ... or a capsule).

    Host memory (kDLCPU) is copied to ``device`` (default: the current device): a plugin
    device cannot alias host memory. An oar tensor comes back as a view of the same
    storage (zero-copy). The reverse direction, ``numpy.from_dlpack(t)`` of an oar tensor,
    is not possible (device memory): use ``t.numpy()``."""
    if isinstance(obj, Tensor):
        if device is not None and resolve(device)[1] != obj.device:
            return obj.to(device)
        return obj.detach()
    if type(obj).__name__ == "PyCapsule":
        capsule = obj
    else:
        if hasattr(obj, "__dlpack_device__"):
            kind, index = obj.__dlpack_device__()
            if int(kind) != DLPACK_CPU:
                raise BufferError(f"oar.from_dlpack imports host memory (kDLCPU) only; this object lives on "
                                  f"DLPack device ({int(kind)}, {int(index)})")
        if hasattr(obj, "detach") and getattr(obj, "requires_grad", False):
            obj = obj.detach()
        capsule = obj.__dlpack__()
    plugin, dev = resolve(device)
    return _C._from_dlpack_capsule(capsule, plugin, dev.index)


def _grad_if(out: Tensor, requires_grad: bool) -> Tensor:
    if requires_grad:
        out.requires_grad = True
    return out


def empty(*shape: Any, dtype: Any = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """An uninitialized tensor (memory from the caching allocator, no kernel)."""
    return _grad_if(_C._empty(_varargs_shape(shape), dtype_of(dtype or float32), device), requires_grad)


def full(shape: Any, fill_value: Any, dtype: Any = None, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (the full op). The dtype defaults to the
    value's: bool, int64 for ints, float32 for floats."""
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    target = dtype_of(dtype) if dtype is not None else _default_dtype(fill_value)
    shape = _shape_tuple(shape)
    _check_fill_value(fill_value, target)
    if isinstance(fill_value, (int, np.integer)) and not isinstance(fill_value, bool) and abs(int(fill_value)) > 2 ** 53:
        # beyond float64's exact integers: the full op's float attr would round it
        return to_tensor(np.full(shape, int(fill_value), dtype=numpy_dtype(target)), device=device,
                         requires_grad=requires_grad)
    return _grad_if(_ops.full(shape, dtype=target, device=device, value=float(fill_value)), requires_grad)


# Each dtype's range for fill values: torch refuses a value beyond it rather than saturating.
_FLOAT_FILL_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38,
                   "float32": float(np.finfo(np.float32).max), "float64": float(np.finfo(np.float64).max)}
_INT_FILL_RANGE = {name: (int(np.iinfo(kind).min), int(np.iinfo(kind).max))
                   for name, kind in (("int8", np.int8), ("int32", np.int32), ("int64", np.int64))}


def _check_fill_value(value: Any, target: DType) -> None:
    """torch's rule: a fill value the dtype cannot represent (beyond its range, NaN or inf for an
    integer dtype, a finite value beyond a float dtype's max) is an error, not a saturation."""
    name = target.name
    if name == "bool":
        return
    limit = _FLOAT_FILL_MAX.get(name)
    if limit is not None:
        number = float(value)
        if abs(number) > limit and math.isfinite(number):
            raise OverflowError(f"full: value {value!r} cannot be converted to {name} without overflow")
        return
    low, high = _INT_FILL_RANGE[name]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        raise OverflowError(f"full: value {value!r} cannot be converted to {name} without overflow")
    whole = int(value)  # floats truncate toward zero, as torch
    if not low <= whole <= high:
        raise OverflowError(f"full: value {value!r} cannot be converted to {name} without overflow "
                            f"(its range is {low} to {high})")


def zeros(*shape: Any, dtype: Any = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    return full(_varargs_shape(shape), 0, dtype=dtype or float32, device=device, requires_grad=requires_grad)


def ones(*shape: Any, dtype: Any = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    return full(_varargs_shape(shape), 1, dtype=dtype or float32, device=device, requires_grad=requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None, device: DeviceLike = None,
           requires_grad: bool = False) -> Tensor:
    """Values start, start + step, ... below end (the arange op). int64 when start, end and
    step are ints, else float32."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must not be 0")
    all_ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, end, step))
    target = dtype_of(dtype) if dtype is not None else (int64 if all_ints else float32)
    if target.name not in _FLOATING:
        # torch converts the bounds and step to the integer dtype first (toward zero)
        start, end, step = int(start), int(end), int(step)
        if step == 0:
            raise ValueError("arange: step truncates to 0 for an integer dtype")
    count = max(0, math.ceil((end - start) / step))
    return _grad_if(_ops.arange((count,), dtype=target, device=device, start=float(start), step=float(step)),
                    requires_grad)


def rand(*shape: Any, dtype: Any = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """Uniform [0, 1) from the Philox stream of the global seed (oar.manual_seed)."""
    shape = _varargs_shape(shape)
    seed, offset = _random.next_seed_offset(math.prod(shape))
    return _grad_if(_ops.rand(shape, dtype=dtype_of(dtype or float32), device=device, seed=seed, offset=offset),
                    requires_grad)


def randn(*shape: Any, dtype: Any = None, device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """Standard normal (Box-Muller over the Philox stream of the global seed)."""
    shape = _varargs_shape(shape)
    seed, offset = _random.next_seed_offset(math.prod(shape))
    return _grad_if(_ops.randn(shape, dtype=dtype_of(dtype or float32), device=device, seed=seed, offset=offset),
                    requires_grad)


def _like(make, t: Tensor, dtype: Any, device: DeviceLike, **kwargs: Any) -> Tensor:
    return make(tuple(t.shape), dtype=dtype or t.dtype, device=device or t.device, **kwargs)


def empty_like(t: Tensor, dtype: Any = None, device: DeviceLike = None) -> Tensor:
    return _like(empty, t, dtype, device)


def zeros_like(t: Tensor, dtype: Any = None, device: DeviceLike = None) -> Tensor:
    return _like(zeros, t, dtype, device)


def ones_like(t: Tensor, dtype: Any = None, device: DeviceLike = None) -> Tensor:
    return _like(ones, t, dtype, device)


def full_like(t: Tensor, fill_value: Any, dtype: Any = None, device: DeviceLike = None) -> Tensor:
    return full(tuple(t.shape), fill_value, dtype=dtype or t.dtype, device=device or t.device)


def rand_like(t: Tensor, dtype: Any = None, device: DeviceLike = None) -> Tensor:
    return _like(rand, t, dtype, device)


def randn_like(t: Tensor, dtype: Any = None, device: DeviceLike = None) -> Tensor:
    return _like(randn, t, dtype, device)


def concat(tensors: Iterable[Tensor], dim: int = 0) -> Tensor:
    """Tensors joined along dim (the concat view op: copy kernels into slices of the result)."""
    return _C._concat(list(tensors), dim)


cat = concat


def stack(tensors: Iterable[Tensor], dim: int = 0) -> Tensor:
    """Tensors of one shape joined along a new dim."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    return concat([t.unsqueeze(dim) for t in tensors], dim=dim)

"""Oar: a device plugin ABI and the framework runtime on top of it.

``import oar`` is cheap: plugins are discovered and initialized on the first
call that needs a device (see :mod:`oar.plugin_manager`), and finalized at
interpreter exit.
"""

from __future__ import annotations

import atexit as _atexit

from oar import _C
from oar.devices import (
    MemoryInfo,
    device,
    device_count,
    get_device,
    get_device_properties,
    mem_get_info,
    set_device,
    synchronize,
)
from oar.errors import (
    DeviceError,
    DeviceMismatchError,
    DTypeError,
    FallbackWarning,
    InvalidDeviceError,
    OarError,
    OpNotSupportedError,
    OutOfMemoryError,
    PluginLoadError,
    PluginWarning,
    ShapeError,
)
from oar.info import plugins_info
from oar.memory_stats import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_peak_memory_stats,
)
from oar.plugin_manager import load_plugin
from oar.streams import Event, Stream, current_stream, default_stream

__version__ = "0.1.0"
HOST_ABI_VERSION = _C.HOST_ABI_VERSION

__all__ = [
    "HOST_ABI_VERSION", "DeviceError", "Event", "InvalidDeviceError", "MemoryInfo", "OarError",
    "OutOfMemoryError", "PluginLoadError", "PluginWarning", "Stream", "current_stream", "default_stream",
    "device", "device_count", "get_device", "get_device_properties", "load_plugin", "mem_get_info",
    "plugins_info", "set_device", "synchronize", "empty_cache", "max_memory_allocated", "max_memory_reserved",
    "memory_allocated", "memory_reserved", "memory_stats", "reset_peak_memory_stats",
]

# ---- tensors and ops (oar.tensor, oar.ops: generated from interface/ops.yaml) ----
from oar import ops  # noqa: E402
from oar.fallback import fallback_stats, reset_fallback_stats  # noqa: E402
from oar.random import get_rng_state, initial_seed, manual_seed, set_rng_state  # noqa: E402
from oar.tensor import (  # noqa: E402
    DType, Tensor, arange, bfloat16, cat, concat, dtype_of, empty, empty_like, float16, float32, float64,
    from_dlpack, full, full_like, int8, int32, int64, is_floating_point, is_tensor, ones, ones_like, rand,
    rand_like, randn, randn_like, stack, tensor, to_tensor, zeros, zeros_like,
)
from oar.tensor import bool_ as bool  # noqa: E402,A001  -- oar.bool, like torch.bool

# Every op of ops.yaml as oar.<name>, except where a factory above has the friendlier signature.
for _name in ops.names:
    if _name not in globals():
        globals()[_name] = getattr(ops, _name)
del _name
# torch's signatures over the ops (rounding_mode, tensor bounds, no dim, ...; oar.add stays the op,
# Tensor.add / Tensor.sub take alpha) and the
# compositions of oar.composite (it also installs tensor indexing, //, % and the Tensor methods)
from oar.composite import (  # noqa: E402,A004
    addmm, amax, amin, argmax, argmin, baddbmm, clamp, div, einsum, masked_fill, multinomial, narrow, relu6,
    repeat_interleave, sort, std, topk, var,
)

__all__ += [
    "DType", "DTypeError", "DeviceMismatchError", "FallbackWarning", "OpNotSupportedError", "ShapeError",
    "Tensor", "arange", "bfloat16", "bool", "cat", "concat", "dtype_of", "empty", "empty_like",
    "fallback_stats", "float16", "float32", "float64", "from_dlpack", "full", "full_like", "get_rng_state",
    "initial_seed", "int8", "int32", "int64", "is_floating_point", "is_tensor", "manual_seed", "ones",
    "ones_like", "ops", "rand", "rand_like", "randn", "randn_like", "reset_fallback_stats", "set_rng_state",
    "stack", "tensor", "to_tensor", "zeros", "zeros_like",
] + [n for n in ops.names if n not in ("full", "arange", "rand", "randn")] + [
    "addmm", "amax", "amin", "baddbmm", "einsum", "masked_fill", "multinomial", "narrow", "relu6", "repeat_interleave", "sort",
    "std", "topk",
]

# ---- autograd, nn, optim, checkpoints ----
from oar import autograd  # noqa: E402
from oar.autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: E402
from oar import nn, optim  # noqa: E402
from oar.checkpoint import CheckpointError, load, save  # noqa: E402

# ---- the Python functions the C++ core calls, installed once ----
def _install_core_hooks() -> None:
    import logging

    from oar import errors as _errors
    from oar.devices import device as _device
    from oar.fallback import _run as _fallback_run
    from oar.tensor import resolve as _resolve
    from oar.tensor import to_tensor as _to_tensor

    _C._install_hooks(errors=_errors, record=autograd._record, fallback=_fallback_run, device=_device,
                      wrap_stream=Stream._wrap, to_tensor=_to_tensor, resolve_device=_resolve,
                      plugin_logger=logging.getLogger("oar.plugin"))


_install_core_hooks()

__all__ += ["CheckpointError", "autograd", "enable_grad", "is_grad_enabled", "load", "nn", "no_grad", "optim",
            "save", "set_grad_enabled"]

# ---- the compiler (oar_codegen, imported on first use) and the capture interface it is built on ----
from oar import capture  # noqa: E402
from oar.compiler import compile  # noqa: E402,A001

__all__ += ["capture", "compile"]

# ---- the profiler (installs nothing until a profile() starts) ----
from oar import profiler  # noqa: E402

__all__ += ["profiler"]

# ---- the raw device layer (DeviceBuffer, kernel_query/launch, modules): oar.raw ----
from oar import raw  # noqa: E402
from oar._moved import __getattr__  # noqa: E402  -- the moved names published material used

__all__ += ["raw"]

# ---- distributed (torch is imported only when a process group is made) ----
from oar import distributed  # noqa: E402

__all__ += ["distributed"]

from oar import jit  # noqa: E402,F401  -- oar.jit.save/load; onnx loads on first use

# Plugins finalize before the interpreter goes away (atexit runs after non-daemon threads end).
_atexit.register(_C._shutdown)

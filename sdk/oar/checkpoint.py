"""Checkpoints: ``oar.save(obj, path)`` / ``oar.load(path, device=None)`` in the
safetensors format.

``obj`` is a state_dict (name -> tensor) or any nest of dicts, lists and tuples
holding tensors and plain values (an optimizer's state_dict, a training step,
a config). Tensors are stored under dotted keys (``optimizer.state.0.exp_avg``);
everything else, and the shape of the nest, goes into one JSON entry of the
header's metadata (``oar``). A file written by other safetensors tools loads as
a flat name -> tensor dict.

Writes are atomic: a temp file in the same directory, fsync, rename over the
target, fsync the directory. A failure at any point leaves the previous file
as it was and removes the temp file; a temp file left by a killed process is
removed by the next save of the same path. A file that is not a valid
checkpoint raises :class:`CheckpointError` naming the file and the problem.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

import numpy as np

from oar.errors import OarError

__all__ = ["save", "load", "CheckpointError"]

FORMAT = "oar.checkpoint"
FORMAT_VERSION = 1
_META_KEY = "oar"
# safetensors dtype code -> (oar dtype name, itemsize)
_DTYPES = {
    "F32": ("float32", 4), "F64": ("float64", 8), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I8": ("int8", 1), "I32": ("int32", 4), "I64": ("int64", 8), "BOOL": ("bool", 1),
    "U8": ("uint8", 1), "I16": ("int16", 2), "U16": ("uint16", 2), "U32": ("uint32", 4), "U64": ("uint64", 8),
}
_HOST_TYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16,
               "int8": np.int8, "int32": np.int32, "int64": np.int64, "bool": np.bool_, "uint8": np.uint8,
               "int16": np.int16, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64}
_MAX_HEADER = 100 * 1024 * 1024


class CheckpointError(OarError):
    """A checkpoint file cannot be read (``path``, ``problem``) or written."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"checkpoint {self.path}: {problem}")

    def __reduce__(self):
        return (type(self), (self.path, self.problem))


# ---- tensors <-> host ---------------------------------------------------------------------------

def _is_tensor(value) -> bool:
    import oar
    return isinstance(value, oar.Tensor)


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).replace("oar.", "")


def _tensor_to_host(t) -> tuple[str, np.ndarray]:
    """(dtype name, a C-contiguous little-endian host array holding t's bytes)."""
    name = _dtype_name(t.dtype)
    array = t.numpy() if name != "bfloat16" else _bfloat16_bits(t)
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.byteswap().view(array.dtype.newbyteorder("<"))
    return name, array


def _bfloat16_bits(t) -> np.ndarray:
    """bfloat16 values as their uint16 bit patterns."""
    array = t.numpy()
    if array.dtype.itemsize == 2:
        return array.view(np.uint16)
    # a float32 array of bfloat16 values: the top half of each float32 is exact
    return (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _host_to_tensor(name: str, shape: list[int], data, device):
    import oar
    array = np.frombuffer(data, dtype=_HOST_TYPES[name]).reshape(shape)
    if name == "bfloat16":
        wide = (array.astype(np.uint32) << 16).view(np.float32)
        return oar.tensor(wide, device=device).to(dtype=oar.bfloat16)
    return oar.tensor(array, device=device)


# ---- nests <-> (tensors, JSON tree) --------------------------------------------------------------

def _flatten(obj: Any, path: str, tensors: dict) -> Any:
    """The JSON tree of obj; its tensors go into ``tensors`` under dotted keys."""
    if _is_tensor(obj):
        key = path or "tensor"
        if key in tensors:
            raise ValueError(f"two tensors of the object map to the checkpoint key {key!r}")
        tensors[key] = obj
        return {"__tensor__": key}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"checkpoint dict keys are str or int, not {type(k).__name__} ({k!r}) at "
                                f"{path or 'the top level'}")
            items.append([k, _flatten(v, f"{path}.{k}" if path else str(k), tensors)])
        return {"__dict__": items}
    if isinstance(obj, (list, tuple)):
        values = [_flatten(v, f"{path}.{i}" if path else str(i), tensors) for i, v in enumerate(obj)]
        return {"__tuple__": values} if isinstance(obj, tuple) else {"__list__": values}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint (at {path or 'the top level'}): "
                    f"tensors, dicts, lists, tuples, numbers, strings, bools and None are stored")


def _unflatten(tree: Any, tensors: dict, path: str) -> Any:
    if isinstance(tree, dict):
        if "__tensor__" in tree:
            key = tree["__tensor__"]
            if key not in tensors:
                raise CheckpointError(path, f"the metadata names tensor {key!r}, which the file does not hold")
            return tensors[key]
        if "__dict__" in tree:
            return {k: _unflatten(v, tensors, path) for k, v in tree["__dict__"]}
        if "__list__" in tree:
            return [_unflatten(v, tensors, path) for v in tree["__list__"]]
        if "__tuple__" in tree:
            return tuple(_unflatten(v, tensors, path) for v in tree["__tuple__"])
        raise CheckpointError(path, f"unknown entry in the metadata tree: {sorted(tree)}")
    return tree


# ---- save -------------------------------------------------------------------------------------------

def save(obj: Any, path: str | os.PathLike) -> None:
    """Writes ``obj`` (a state_dict, or a nest of them) to ``path`` atomically."""
    import safetensors

    path = os.fspath(path)
    tensors: dict = {}
    tree = _flatten(obj, "", tensors)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CheckpointError(path, f"directory {directory} does not exist")
    _remove_stale_temps(path)

    specs, keep_alive = {}, []
    for key, t in tensors.items():
        name, array = _tensor_to_host(t)
        keep_alive.append(array)
        specs[key] = safetensors.TensorSpec(dtype=name, shape=list(array.shape) if array.ndim else [],
                                            data_ptr=array.ctypes.data, data_len=array.nbytes)
    metadata = {_META_KEY: json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "tree": tree},
                                      allow_nan=True, separators=(",", ":"))}
    base = os.path.basename(path)
    temp = _create_temp(directory, f".{base}.tmp-{os.getpid()}-")
    try:
        safetensors.serialize_file(specs, temp, metadata=metadata)
        _fsync_file(temp)
        os.replace(temp, path)
        _fsync_dir(directory)
    except BaseException as e:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        if isinstance(e, (OSError, safetensors.SafetensorError)):
            raise CheckpointError(path, f"write failed ({e}); the previous file, if any, is unchanged") from e
        raise
    finally:
        del keep_alive


def _create_temp(directory: str, prefix: str) -> str:
    """A new empty file (mode 0666 less the umask, as a plain open would give)."""
    for _ in range(100):
        candidate = os.path.join(directory, prefix + os.urandom(6).hex())
        try:
            fd = os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return candidate
    raise CheckpointError(directory, "cannot create a temp file")


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # a platform without directory fds (Windows)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temps(path: str) -> None:
    """Temp files of this path left by a process that no longer runs."""
    directory = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}.tmp-"
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or _process_alive(int(pid_text)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- load -------------------------------------------------------------------------------------------

def _read_header(path: str, data: bytes) -> dict:
    if len(data) < 8:
        raise CheckpointError(path, f"truncated: {len(data)} bytes, shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _MAX_HEADER:
        raise CheckpointError(path, f"not a safetensors file: header length {header_len} is implausible")
    if 8 + header_len > len(data):
        raise CheckpointError(path, f"truncated: the header needs {header_len} bytes, the file has "
                                    f"{len(data) - 8} after the length")
    try:
        header = json.loads(data[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(path, f"corrupt header (not JSON: {e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "corrupt header (not a JSON object)")
    body = len(data) - 8 - header_len
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (begin, stop) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(path, f"corrupt header entry for tensor {key!r}") from None
        if dtype not in _DTYPES:
            raise CheckpointError(path, f"tensor {key!r} has dtype {dtype}, which oar does not load")
        expected = math.prod(shape) * _DTYPES[dtype][1]
        if stop - begin != expected:
            raise CheckpointError(path, f"tensor {key!r}: {stop - begin} bytes for shape {shape} of {dtype}")
        if stop > body:
            raise CheckpointError(path, f"truncated: tensor {key!r} ends at byte {stop} of the data, which has "
                                        f"{body} bytes")
        end = max(end, stop)
    if end != body:
        raise CheckpointError(path, f"corrupt: the tensors cover {end} bytes of data, the file holds {body}")
    return header


def load(path: str | os.PathLike, device=None) -> Any:
    """Reads a checkpoint written by :func:`save` (or any safetensors file) with its
    tensors on ``device`` (default: the current device)."""
    import safetensors

    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(path, "no such file") from None
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e}") from None
    header = _read_header(path, data)
    try:
        entries = safetensors.deserialize(data)
    except safetensors.SafetensorError as e:
        raise CheckpointError(path, f"corrupt: {e}") from None
    tensors = {}
    for key, entry in entries:
        name = _DTYPES[entry["dtype"]][0]
        if name not in ("float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool"):
            raise CheckpointError(path, f"tensor {key!r} has dtype {name}, which oar tensors do not have")
        tensors[key] = _host_to_tensor(name, list(entry["shape"]), entry["data"], device)
    metadata = header.get("__metadata__") or {}
    text = metadata.get(_META_KEY) if isinstance(metadata, dict) else None
    if text is None:
        return tensors
    try:
        info = json.loads(text)
        if info.get("format") != FORMAT:
            raise ValueError(f"format {info.get('format')!r}")
        if int(info.get("version", 0)) > FORMAT_VERSION:
            raise CheckpointError(path, f"written by a newer oar (checkpoint format {info['version']}, this oar "
                                        f"reads up to {FORMAT_VERSION})")
        tree = info["tree"]
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(path, f"corrupt oar metadata ({e})") from None
    return _unflatten(tree, tensors, path)

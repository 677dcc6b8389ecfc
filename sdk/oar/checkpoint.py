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
import stat
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
    if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        array = np.array(array, order="C")
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
    """The nest the metadata tree describes; any shape :func:`_flatten` does not write is refused."""
    if isinstance(tree, list):
        raise CheckpointError(path, "corrupt oar metadata (a bare list in the tree)")
    if not isinstance(tree, dict):
        return tree
    if len(tree) != 1:
        raise CheckpointError(path, f"unknown entry in the metadata tree: {sorted(tree)}")
    (kind, value), = tree.items()
    if kind == "__tensor__":
        if not isinstance(value, str) or value not in tensors:
            raise CheckpointError(path, f"the metadata names tensor {value!r}, which the file does not hold")
        return tensors[value]
    if kind == "__dict__":
        if not (isinstance(value, list) and all(isinstance(item, list) and len(item) == 2
                                                and isinstance(item[0], (str, int)) for item in value)):
            raise CheckpointError(path, "corrupt oar metadata (a __dict__ that is not a list of [key, value] pairs)")
        return {k: _unflatten(v, tensors, path) for k, v in value}
    if kind in ("__list__", "__tuple__"):
        if not isinstance(value, list):
            raise CheckpointError(path, f"corrupt oar metadata (a {kind} that is not a list)")
        items = [_unflatten(v, tensors, path) for v in value]
        return items if kind == "__list__" else tuple(items)
    raise CheckpointError(path, f"unknown entry in the metadata tree: {sorted(tree)}")


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
    try:
        temp = _create_temp(directory, f".{base}.tmp-{os.getpid()}-")
    except OSError as e:
        raise CheckpointError(path, f"cannot write to directory {directory} ({e.strerror or e}); "
                                    f"nothing was written") from None
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

_LOADED_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool")


def _is_count(value) -> bool:
    """A non-negative JSON integer (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_file(path: str) -> bytes:
    """The whole file, refusing anything but a regular file before reading (a FIFO would block,
    /dev/zero never ends) and reading no more than the size fstat gave."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise CheckpointError(path, "no such file") from None
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket"
                    if stat.S_ISSOCK(info.st_mode) else "a special file")
            raise CheckpointError(path, f"not a regular file ({kind}); a checkpoint is a file")
        chunks, left = [], info.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break  # shrunk while read: the size check below reports it
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _read_header(path: str, data: bytes) -> dict:
    """The header, every field checked: dtypes, shapes, offsets within the data, no overlaps, no gaps."""
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
    except RecursionError:
        raise CheckpointError(path, "corrupt header (JSON nested too deeply)") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "corrupt header (not a JSON object)")
    metadata = header.get("__metadata__")
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise CheckpointError(path, "corrupt header: __metadata__ must map names to strings")
    body = len(data) - 8 - header_len
    ranges = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not (isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list)
                and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2):
            raise CheckpointError(path, f"corrupt header entry for tensor {key!r} (needs dtype, shape and "
                                        f"two data_offsets)")
        dtype, shape, (begin, stop) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPES:
            raise CheckpointError(path, f"tensor {key!r} has dtype {dtype!r}, which oar does not load")
        if not all(_is_count(d) for d in shape):
            raise CheckpointError(path, f"tensor {key!r} has shape {shape}: dims must be non-negative integers")
        if not (_is_count(begin) and _is_count(stop) and begin <= stop):
            raise CheckpointError(path, f"tensor {key!r} has data_offsets {[begin, stop]}: need 0 <= begin <= end")
        expected = math.prod(shape) * _DTYPES[dtype][1]
        if stop - begin != expected:
            raise CheckpointError(path, f"tensor {key!r}: {stop - begin} bytes for shape {shape} of {dtype}")
        if stop > body:
            raise CheckpointError(path, f"truncated: tensor {key!r} ends at byte {stop} of the data, which has "
                                        f"{body} bytes")
        ranges.append((begin, stop, key))
    end = 0
    for begin, stop, key in sorted(ranges):
        if begin < end:
            raise CheckpointError(path, f"corrupt: tensor {key!r} (bytes {begin}..{stop}) overlaps another tensor")
        if begin > end:
            raise CheckpointError(path, f"corrupt: bytes {end}..{begin} of the data belong to no tensor")
        end = stop
    if end != body:
        raise CheckpointError(path, f"corrupt: the tensors cover {end} bytes of data, the file holds {body}")
    return header


def load(path: str | os.PathLike, device=None) -> Any:
    """Reads a checkpoint written by :func:`save` (or any safetensors file) with its
    tensors on ``device`` (default: the current device). A file that is not one raises
    :class:`CheckpointError`, whatever is wrong with it."""
    path = os.fspath(path)
    data = _read_file(path)
    header = _read_header(path, data)
    try:
        return _load_checked(path, data, header, device)
    except RecursionError:
        raise CheckpointError(path, "corrupt oar metadata (nested too deeply)") from None


def _load_checked(path: str, data: bytes, header: dict, device) -> Any:
    import safetensors

    try:
        entries = safetensors.deserialize(data)
    except Exception as e:  # SafetensorError, and whatever else the parser raises for a bad file
        raise CheckpointError(path, f"corrupt: {e}") from None
    tensors = {}
    for key, entry in entries:
        name = _DTYPES[entry["dtype"]][0]
        if name not in _LOADED_DTYPES:
            raise CheckpointError(path, f"tensor {key!r} has dtype {name}, which oar tensors do not have")
        tensors[key] = _host_to_tensor(name, list(entry["shape"]), entry["data"], device)
    metadata = header.get("__metadata__") or {}
    text = metadata.get(_META_KEY)
    if text is None:
        return tensors
    try:
        info = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(path, f"corrupt oar metadata (not JSON: {e})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT or "tree" not in info:
        raise CheckpointError(path, "corrupt oar metadata (not an oar.checkpoint object with a tree)")
    version = info.get("version", 0)
    if not _is_count(version):
        raise CheckpointError(path, f"corrupt oar metadata (format version {version!r})")
    if version > FORMAT_VERSION:
        raise CheckpointError(path, f"written by a newer oar (checkpoint format {version}, this oar "
                                    f"reads up to {FORMAT_VERSION})")
    return _unflatten(info["tree"], tensors, path)

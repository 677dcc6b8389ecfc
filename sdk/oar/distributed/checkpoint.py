"""The unified checkpoint: save under one layout or world size, load under any other.

    from oar.distributed import checkpoint
    checkpoint.save(distributed_state_dict(model), "ckpt/")                 # every rank calls it
    handle = checkpoint.save(state, "ckpt/", async_save=True); ...; handle.wait()
    checkpoint.load(distributed_state_dict(model), "ckpt/")                  # any mesh, world size

A directory holds one safetensors file per rank and generation (``shard-g<gen>-r<rank>.safetensors``,
each chunk of a tensor written by exactly one rank: replicated chunks by the lowest rank holding
them) and ``index.json``: for each tensor its global shape, dtype, the placements it was saved
with, and which file holds which slice (offsets, lengths). The index is written last, by rank 0,
after every rank reported its file written, atomically (temp file, fsync, rename): a save that
fails or a rank that dies part-way leaves the previous index and its files in place, so the
previous checkpoint still loads; the previous generation's files are removed after the new index
is in place. The ranks agree through the process group's store, with its timeout.

``load`` fills the given state dict in place (DTensors and plain tensors alike), reading from
each file only the slices this rank's shards overlap (the files are memory-mapped). It also
reads a plain ``oar.save`` file. A key the checkpoint lacks or a global shape that contradicts
it raises CheckpointError naming both.

``async_save=True`` copies the rank's chunks to host memory, returns a SaveHandle at once and
writes (and commits) in a background thread; ``handle.wait()`` raises its error, if any.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from typing import Any

import numpy as np

import oar
from oar.checkpoint import CheckpointError
from oar.distributed import process_group as _pg
from oar.distributed.dtensor import DTensor, reshard
from oar.distributed.placement import Partial, Replicate, Shard

__all__ = ["save", "load", "SaveHandle", "CheckpointError", "INDEX"]

INDEX = "index.json"
FORMAT = "oar.distributed.checkpoint"
_HOST = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16,
         "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "bool": np.bool_,
         "uint8": np.uint8}
_ST_DTYPES = {"F32": "float32", "F64": "float64", "F16": "float16", "BF16": "bfloat16", "I8": "int8",
              "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool", "U8": "uint8"}
_saves = 0  # saves made by this process: with the directory, names the save in the store


# ---- what a rank holds --------------------------------------------------------------------------

def _flatten(state: Any, prefix: str, out: dict) -> dict:
    if isinstance(state, dict):
        for k, v in state.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(state, (DTensor, oar.Tensor)):
        out[prefix] = state
    else:
        raise TypeError(f"checkpoint: {prefix or 'the state dict'} is a {type(state).__name__}; the distributed "
                        f"checkpoint stores tensors and DTensors (in nested dicts)")
    return out


def _region(t: Any) -> tuple[list[int], list[int], list[int]]:
    """(global shape, this rank's offsets, lengths) of a tensor or DTensor (no Partial)."""
    if isinstance(t, DTensor):
        shape, offsets, lengths = list(t.shape), [0] * t.ndim, list(t.shape)
        for m, p in enumerate(t.placements):
            if isinstance(p, Shard):
                n = t.mesh.shape[m]
                lengths[p.dim] = shape[p.dim] // n
                offsets[p.dim] = t.mesh.coordinate[m] * lengths[p.dim]
        return shape, offsets, lengths
    shape = [int(s) for s in t.shape]
    return shape, [0] * len(shape), shape


def _host(t: Any) -> np.ndarray:
    """A host copy of a local tensor (bfloat16 as its uint16 bits)."""
    local = t.to_local() if isinstance(t, DTensor) else t
    local = local.detach()
    if local.dtype is oar.bfloat16:
        array = local.numpy()
        array = array.view(np.uint16) if array.dtype.itemsize == 2 else \
            (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else:
        array = local.numpy()
    return np.ascontiguousarray(array)  # numpy() already made a new host array: no second copy


def _rank_world() -> tuple[int, int]:
    return (_pg.get_rank(), _pg.get_world_size()) if _pg.is_initialized() else (0, 1)


# ---- the store: agreeing on a save ---------------------------------------------------------------

class _Agreement:
    """Per-save keys in the process group's store (a single process needs none)."""

    def __init__(self, token: str):
        self.rank, self.world = _rank_world()
        self.store = _pg._state.store if self.world > 1 else None
        self.timeout_s = _pg._state.timeout_s
        self.token = token
        self.values: dict[str, str] = {}

    def post(self, key: str, value: str) -> None:
        if self.store is None:
            self.values[key] = value
        else:
            self.store.set(f"{self.token}/{key}", value)

    def get_all(self, key: str, ranks: list[int], what: str) -> list[str]:
        """Each rank's posted value of key<rank>, waiting up to the timeout; a rank that never posts is
        named in the error (it died or hung)."""
        if self.store is None:
            return [self.values[f"{key}{r}"] for r in ranks]
        import datetime

        deadline = time.monotonic() + self.timeout_s
        out = []
        for r in ranks:
            full = f"{self.token}/{key}{r}"
            while True:
                try:
                    self.store.wait([full], datetime.timedelta(seconds=min(5.0, max(0.1, deadline - time.monotonic()))))
                    break
                except Exception:  # noqa: BLE001 - the store raises its own timeout error type
                    if time.monotonic() >= deadline:
                        raise CheckpointError(self.token.split("#")[0], f"rank {r} did not {what} within "
                                              f"{self.timeout_s:g} s (it died or hung); the previous checkpoint, "
                                              f"if any, is unchanged") from None
            out.append(bytes(self.store.get(full)).decode())
        return out


def _read_index(directory: str) -> dict | None:
    path = os.path.join(directory, INDEX)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(path, f"the index cannot be read ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or not isinstance(index.get("tensors"), dict):
        raise CheckpointError(path, f"not an index of {FORMAT}")
    return index


# ---- save --------------------------------------------------------------------------------------

class SaveHandle:
    """An async save in progress: ``wait()`` blocks until it is committed (raises its error);
    ``done()`` does not block."""

    def __init__(self, thread: threading.Thread | None, box: dict):
        self._thread, self._box = thread, box

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the checkpoint save is still writing after {timeout} s")
        if "error" in self._box:
            raise self._box["error"]


def save(state_dict: dict, directory: str | os.PathLike, async_save: bool = False) -> SaveHandle | None:
    """Write ``state_dict`` (name -> DTensor or tensor, nested dicts allowed) into ``directory``.
    Every rank calls it with the same keys. Returns a SaveHandle when ``async_save``."""
    global _saves
    directory = os.path.abspath(os.fspath(directory))
    rank, world = _rank_world()
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
    items = _flatten(state_dict, "", {})
    # Partial values are reduced before they are written (a collective: every rank, same order)
    items = {k: reshard(v, v.mesh, [Replicate() if p.is_partial() else p for p in v.placements])
             if isinstance(v, DTensor) and any(isinstance(p, Partial) for p in v.placements) else v
             for k, v in items.items()}
    _saves += 1
    agree = _Agreement(f"oar/ckpt/{directory}#{_saves}")
    mine = {}
    for name, t in items.items():
        shape, offsets, lengths = _region(t)
        mine[name] = {"shape": shape, "dtype": t.dtype.name, "offsets": offsets, "lengths": lengths,
                      "placements": [repr(p) for p in t.placements] if isinstance(t, DTensor) else ["Replicate()"],
                      "mesh": t.mesh.ranks.tolist() if isinstance(t, DTensor) else None}
    # async: every local chunk is copied to the host now (no communication), the rest runs in the
    # background; sync: the chunks this rank writes are copied after planning
    snapshot = {name: _host(t) for name, t in items.items()} if async_save else None
    box: dict = {}

    def plan() -> tuple[int, list[dict], dict]:
        generation = None
        if rank == 0:
            previous = _read_index(directory) if os.path.isdir(directory) else None
            generation = (int(previous.get("generation", 0)) + 1) if previous else 1
        agree.post(f"plan{rank}", json.dumps({"generation": generation, "chunks": mine}))
        plans = [json.loads(p) for p in agree.get_all("plan", list(range(world)), "plan the save")]
        _check_plans(plans, directory)
        writer: dict[tuple, int] = {}  # each distinct chunk is written by the lowest rank holding it
        for r, rank_plan in enumerate(plans):
            for name, c in rank_plan["chunks"].items():
                writer.setdefault((name, tuple(c["offsets"])), r)
        return plans[0]["generation"], plans, writer

    def finish() -> None:
        try:
            generation, plans, writer = plan()
            names = [name for name, c in mine.items() if writer[(name, tuple(c["offsets"]))] == rank]
            to_write = {name: snapshot[name] if snapshot is not None else _host(items[name]) for name in names}
            file = f"shard-g{generation}-r{rank}.safetensors"
            try:
                _write_file(os.path.join(directory, file), to_write, {n: mine[n]["dtype"] for n in to_write})
                agree.post(f"written{rank}", "ok")
            except Exception as e:  # noqa: BLE001 - every failure is reported to rank 0 and raised here
                agree.post(f"written{rank}", f"error: {e}")
                raise
            if rank == 0:
                reports = agree.get_all("written", list(range(world)), "write its file")
                failed = [f"rank {r}: {m[7:]}" for r, m in enumerate(reports) if m != "ok"]
                if failed:
                    agree.post("committed", "error: " + "; ".join(failed))
                    raise CheckpointError(directory, "the save failed (" + "; ".join(failed) +
                                          "); the previous checkpoint, if any, is unchanged")
                _commit(directory, generation, world, plans, writer)
                agree.post("committed", "ok")
            else:
                outcome = agree.get_all("committed", [""], "commit the index")[0]  # type: ignore[list-item]
                if outcome != "ok":
                    raise CheckpointError(directory, f"the save failed ({outcome[7:]}); the previous "
                                                     f"checkpoint, if any, is unchanged")
        except BaseException as e:  # noqa: BLE001 - kept for SaveHandle.wait()
            box["error"] = e

    if not async_save:
        finish()
        if "error" in box:
            raise box["error"]
        return None
    thread = threading.Thread(target=finish, name="oar-checkpoint-save", daemon=True)
    thread.start()
    return SaveHandle(thread, box)


def _check_plans(plans: list[dict], directory: str) -> None:
    """Every rank saves the same keys with the same global shapes and dtypes."""
    first = plans[0]["chunks"]
    for r, plan in enumerate(plans[1:], start=1):
        chunks = plan["chunks"]
        if set(chunks) != set(first):
            extra, missing = sorted(set(chunks) - set(first)), sorted(set(first) - set(chunks))
            raise CheckpointError(directory, f"rank {r} saves keys {extra} that rank 0 does not and lacks "
                                             f"{missing}; every rank must save the same keys")
        for name, c in chunks.items():
            if c["shape"] != first[name]["shape"] or c["dtype"] != first[name]["dtype"]:
                raise CheckpointError(directory, f"{name!r} is {first[name]['dtype']} {first[name]['shape']} on rank "
                                                 f"0 but {c['dtype']} {c['shape']} on rank {r}")


def _write_file(path: str, arrays: dict, dtypes: dict) -> None:
    import safetensors

    specs = {name: safetensors.TensorSpec(dtype=dtypes[name], shape=list(a.shape), data_ptr=a.ctypes.data,
                                          data_len=a.nbytes) for name, a in arrays.items()}
    temp = f"{path}.tmp-{os.getpid()}"
    try:
        safetensors.serialize_file(specs, temp, metadata={"format": FORMAT})
        with open(temp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def _commit(directory: str, generation: int, world: int, plans: list[dict], writer: dict) -> None:
    tensors: dict = {}
    for name, c in plans[0]["chunks"].items():
        tensors[name] = {"shape": c["shape"], "dtype": c["dtype"], "placements": c["placements"], "mesh": c["mesh"],
                         "chunks": []}
    for (name, offsets), r in writer.items():
        c = plans[r]["chunks"][name]
        tensors[name]["chunks"].append({"file": f"shard-g{generation}-r{r}.safetensors", "offsets": c["offsets"],
                                        "lengths": c["lengths"]})
    index = {"format": FORMAT, "version": 1, "generation": generation, "world_size": world, "tensors": tensors}
    path = os.path.join(directory, INDEX)
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as f:
        json.dump(index, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    keep = {chunk["file"] for t in tensors.values() for chunk in t["chunks"]}
    for entry in os.listdir(directory):
        if entry.startswith("shard-g") and entry.endswith(".safetensors") and entry not in keep:
            os.unlink(os.path.join(directory, entry))


# ---- load --------------------------------------------------------------------------------------

class _File:
    """A safetensors file, memory-mapped: its header, and any slice of a tensor read on demand."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                if length > 100 * 1024 * 1024:
                    raise CheckpointError(path, f"not a safetensors file (header length {length})")
                self.header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error) as e:
            raise CheckpointError(path, f"cannot read the file ({e})") from None
        self.base = 8 + length
        self.map = np.memmap(path, dtype=np.uint8, mode="r")

    def dtype(self, key: str) -> str:
        code = self.header[key]["dtype"]
        if code not in _ST_DTYPES:
            raise CheckpointError(self.path, f"{key!r} has dtype {code}, which oar does not read")
        return _ST_DTYPES[code]

    def array(self, key: str) -> np.ndarray:
        entry = self.header[key]
        start, end = entry["data_offsets"]
        dtype = _HOST[self.dtype(key)]
        return self.map[self.base + start:self.base + end].view(dtype).reshape(entry["shape"])


def _plain_index(path: str) -> tuple[dict, dict]:
    """A plain oar.save file seen as a checkpoint: each tensor one chunk of the whole."""
    f = _File(path)
    tensors = {key: {"shape": list(e["shape"]), "dtype": f.dtype(key), "placements": ["Replicate()"], "mesh": None,
                     "chunks": [{"file": os.path.basename(path), "offsets": [0] * len(e["shape"]),
                                 "lengths": list(e["shape"])}]}
               for key, e in f.header.items() if key != "__metadata__"}
    return tensors, {os.path.basename(path): f}


def load(state_dict: dict, directory: str | os.PathLike) -> dict:
    """Fill every tensor / DTensor of ``state_dict`` in place from the checkpoint at ``directory`` (a
    directory of this module's save, or a plain oar.save file), reading only the slices this rank
    holds. Returns state_dict."""
    directory = os.fspath(directory)
    if os.path.isfile(directory):
        tensors, files = _plain_index(directory)
        base = os.path.dirname(os.path.abspath(directory))
    else:
        index = _read_index(directory)
        if index is None:
            raise CheckpointError(directory, f"no {INDEX}: not a checkpoint directory (or its first save never "
                                             f"completed)")
        tensors, files, base = index["tensors"], {}, directory
    items = _flatten(state_dict, "", {})
    for name, target in items.items():
        if name not in tensors:
            held = ", ".join(sorted(tensors)[:8]) + (", ..." if len(tensors) > 8 else "")
            raise CheckpointError(directory, f"the state dict's {name!r} is not in the checkpoint (it holds "
                                             f"{len(tensors)} tensors: {held})")
        entry = tensors[name]
        shape, offsets, lengths = _region(target)
        if list(entry["shape"]) != shape:
            raise CheckpointError(directory, f"{name!r} is {shape} in the state dict but {entry['shape']} in the "
                                             f"checkpoint (saved with placements {entry['placements']})")
        if isinstance(target, DTensor) and any(isinstance(p, Partial) for p in target.placements):
            raise CheckpointError(directory, f"{name!r}: cannot load into a Partial DTensor")
        buffer = np.empty(lengths, dtype=_HOST[entry["dtype"]])
        covered = 0
        for chunk in entry["chunks"]:
            lo = [max(a, b) for a, b in zip(offsets, chunk["offsets"])]
            hi = [min(a + la, b + lb) for a, la, b, lb in zip(offsets, lengths, chunk["offsets"], chunk["lengths"])]
            if any(h <= lo_ for lo_, h in zip(lo, hi)) and shape:
                continue
            file = files.get(chunk["file"])
            if file is None:
                file = files[chunk["file"]] = _File(os.path.join(base, chunk["file"]))
            source = file.array(name)
            src = tuple(slice(l_ - c, h - c) for l_, h, c in zip(lo, hi, chunk["offsets"]))
            dst = tuple(slice(l_ - o, h - o) for l_, h, o in zip(lo, hi, offsets))
            buffer[dst] = source[src]
            covered += int(np.prod([h - l_ for l_, h in zip(lo, hi)])) if shape else 1
        if covered != int(np.prod(lengths)):
            raise CheckpointError(directory, f"{name!r}: the checkpoint's chunks cover {covered} of the "
                                             f"{int(np.prod(lengths))} elements this rank needs (a corrupt index)")
        _copy_into(target, buffer, entry["dtype"], name, directory)
    return state_dict


def _copy_into(target: Any, buffer: np.ndarray, dtype: str, name: str, directory: str) -> None:
    local = target.to_local() if isinstance(target, DTensor) else target
    if local.dtype.name != dtype:
        raise CheckpointError(directory, f"{name!r} is {local.dtype.name} in the state dict but {dtype} in the "
                                         f"checkpoint")
    if dtype == "bfloat16":
        value = oar.tensor((buffer.astype(np.uint32) << 16).view(np.float32), device=local.device).to(
            dtype=oar.bfloat16)
    else:
        value = oar.tensor(buffer, device=local.device)
    with oar.no_grad():
        local.copy_(value)

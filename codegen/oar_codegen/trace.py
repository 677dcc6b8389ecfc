"""Capture: the launches a function makes, seen through the runtime's launch observer.

Tracing runs the function eagerly once while a launch observer (:mod:`oar.capture`)
records every kernel launch: the op, its attributes, and each tensor operand as
the kernel sees it (storage, offset, shape, strides, dtype). Storages are
numbered in order of first appearance ("slots"); every tensor the launches
touch is held until the call ends, so the caching allocator never hands one
storage to two values of the same call. A host read of device memory (``numpy()``,
``item()``) is recorded as a barrier.

Replaying (:mod:`oar_codegen.compiled`) runs the function again under an
observer that matches each launch against the trace and takes it instead of
running it; each unit of the compiled plan runs once all its launches were
seen. A launch that does not match (the function took another path) ends the
replay: the taken launches not yet run go one by one as they were made, and
the rest of the call is traced afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from oar import capture, profiler

__all__ = ["Ref", "Launch", "Trace", "Recorder", "HOST_READ", "host_read_signature", "operand_key", "signature_of",
           "observing", "referenced_elsewhere"]

HOST_READ = "host_read"  # the pseudo-launch of a host read: a barrier


@dataclass(frozen=True)
class Ref:
    """A tensor operand of a launch: storage slot, element offset, shape, strides, dtype."""
    slot: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    wrapped: bool  # a Python number made a 0-d tensor by the runtime: read-only, any value

    @property
    def dense(self) -> bool:
        """Its elements lie row-major and contiguous (size-1 dims' strides do not matter)."""
        expected = 1
        for size, stride in reversed(list(zip(self.shape, self.strides))):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


@dataclass
class Launch:
    op: str
    attrs: dict
    inputs: tuple[Ref, ...]
    outputs: tuple[Ref, ...]
    fresh: bool  # the outputs were allocated for this launch (False: it writes into an existing tensor)
    signature: tuple = field(repr=False, default=())


@dataclass
class Trace:
    """What one call launched. slot_kinds: "fresh" (made by a launch of the call), "external"
    (existed before, or came from the host) or "wrapped"; observable: the fresh slots still
    referenced when the call returned (their values must be written)."""
    launches: list[Launch]
    slot_kinds: list[str]
    observable: set[int]
    device: str


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def operand_key(t) -> tuple:
    """What a launch operand must keep for a replay: shape, strides, offset, dtype, is-a-number."""
    return (t.shape, t.strides, t.storage_offset(), t.dtype.name, capture.is_wrapped_number(t))


def host_read_signature(tensor) -> tuple:
    """What must be equal for a host read to replay a traced one."""
    return (HOST_READ, operand_key(tensor))


def signature_of(op: str, inputs, outputs, attrs: dict, fresh: bool) -> tuple:
    """What must be equal for a launch to replay a traced one (storages are matched separately)."""
    return (op, tuple(sorted((k, _freeze(v)) for k, v in attrs.items())),
            tuple(operand_key(t) for t in inputs), tuple(operand_key(t) for t in outputs), fresh)


class Recorder(capture.Observer):
    """The launch observer of a tracing call: records, lets every launch run."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.slots: dict[int, int] = {}      # storage address -> slot
        self.slot_kinds: list[str] = []
        self.held: list = []                 # every operand tensor: keeps storages unique for the call
        self.devices: set[str] = set()

    def slot_of(self, tensor, kind_if_new: str) -> int:
        address = capture.storage_address(tensor)
        slot = self.slots.get(address)
        if slot is None:
            slot = self.slots[address] = len(self.slot_kinds)
            self.slot_kinds.append(kind_if_new)
        return slot

    def ref(self, tensor, kind_if_new: str) -> Ref:
        self.held.append(tensor)
        self.devices.add(str(tensor.device))
        wrapped = capture.is_wrapped_number(tensor)
        slot = self.slot_of(tensor, "wrapped" if wrapped else kind_if_new)
        return Ref(slot, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.strides), tensor.dtype.name,
                   wrapped)

    def add(self, op: str, inputs, outputs, attrs: dict, fresh: bool) -> None:
        refs_in = tuple(self.ref(t, "external") for t in inputs)
        refs_out = tuple(self.ref(t, "fresh" if fresh else "external") for t in outputs)
        self.launches.append(Launch(op, dict(attrs), refs_in, refs_out, fresh,
                                    signature_of(op, inputs, outputs, attrs, fresh)))

    def launch(self, op: str, inputs, outputs, attrs: dict, fresh: bool) -> bool:
        self.add(op, inputs, outputs, attrs, fresh)
        if outputs and profiler.records_this_thread():  # the launch runs eagerly: a profiler outside sees it
            profiler.record_launch(op, outputs[0].device, lambda: capture.launch_now(op, inputs, outputs, attrs),
                                   inputs, outputs)
            return True
        return False

    def before_host_read(self, tensor) -> None:
        self.launches.append(Launch(HOST_READ, {}, (self.ref(tensor, "external"),), (), True,
                                    host_read_signature(tensor)))

    def finish(self) -> Trace:
        """The trace, once the call returned: which fresh storages are still referenced elsewhere."""
        fresh = {address: slot for address, slot in self.slots.items() if self.slot_kinds[slot] == "fresh"}
        observable = referenced_elsewhere(self.held, fresh)
        device = next(iter(self.devices)) if len(self.devices) == 1 else ""
        trace = Trace(self.launches, self.slot_kinds, observable, device)
        self.held = []
        return trace


def referenced_elsewhere(held: Iterable, slot_of_storage: dict[int, int]) -> set[int]:
    """The slots (by storage address) whose storage something besides the held tensors references:
    its use count exceeds the holds of these tensors (each view holds the storage once)."""
    holds: dict[int, int] = {}
    sample: dict[int, Any] = {}
    for t in held:
        slot = slot_of_storage.get(capture.storage_address(t))
        if slot is not None:
            holds[slot] = holds.get(slot, 0) + 1
            sample.setdefault(slot, t)
    return {slot for slot, t in sample.items() if capture.storage_refcount(t) > holds[slot]}


def observing(observer: Any | None, fn: Callable, *args, **kwargs):
    """Call fn with this thread's launch observer set (restored afterwards, whatever happens)."""
    with capture.observe(observer):
        return fn(*args, **kwargs)

"""Tracing a model's forward at several sizes of its dynamic dims, and fitting every integer of the trace.

Each trace is the model run once eagerly under oar_codegen's launch Recorder (oar.capture). The integers
of a trace (operand offsets, shapes, strides, storage extents) are fitted across traces as functions of
the dynamic dims: a constant, ``c * d1 * d2 ...`` or ``a * d + b``; a last trace with every dim changed
checks each fit. Traces that differ in anything but these integers (another op, attr or dtype) are
refused: the forward's graph depends on the sizes in a way a static graph cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

import oar
from oar import capture
from oar.jit.errors import ExportError
from oar_codegen.trace import HOST_READ, Recorder


class _OperandRecorder(Recorder):
    """oar_codegen's Recorder that also keeps each launch's operand tensors (to read constants' values)."""

    def __init__(self) -> None:
        super().__init__()
        self.operands: list[tuple[tuple, tuple]] = []

    def add(self, op, inputs, outputs, attrs, fresh) -> None:
        super().add(op, inputs, outputs, attrs, fresh)
        self.operands.append((tuple(inputs), tuple(outputs)))

    def before_host_read(self, tensor) -> None:
        super().before_host_read(tensor)
        self.operands.append(((tensor,), ()))


@dataclass
class Traced:
    """One eager run: launches (oar_codegen Launch records), their operand tensors, the slot of each
    model input, the model outputs as (slot, offset, shape, strides, dtype), and the dim sizes used."""
    sizes: dict[str, int]
    launches: list
    operands: list
    slot_kinds: list[str]
    input_slots: dict[int, int]
    outputs: list[tuple]
    input_shapes: list[tuple[int, ...]]
    extents: list[int] = field(default_factory=list)  # per slot: 1 + the largest element index touched


def _resized(array: np.ndarray, axes: dict[int, int]) -> np.ndarray:
    """``array`` cut or cyclically repeated along each axis to the given size (values stay valid inputs)."""
    for axis, size in axes.items():
        array = np.take(array, np.arange(size) % array.shape[axis], axis=axis)
    return np.ascontiguousarray(array)


def trace_once(model, examples: list, dynamic: dict[int, dict[int, str]], sizes: dict[str, int]) -> Traced:
    arrays = []
    for i, example in enumerate(examples):
        axes = {axis: sizes[name] for axis, name in dynamic.get(i, {}).items()}
        arrays.append(oar.tensor(_resized(example.numpy(), axes), device=example.device) if axes else example)
    addresses = {capture.storage_address(t): i for i, t in enumerate(arrays)}
    with oar.no_grad():
        model(*arrays)  # a warm-up run: what the forward caches (a causal mask) is made before the trace
    recorder = _OperandRecorder()
    with oar.no_grad(), capture.observe(recorder):
        result = model(*arrays)
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    kinds = [type(t).__name__ for t in outputs]
    if not outputs or not all(isinstance(t, oar.Tensor) for t in outputs):
        raise ExportError(f"oar.jit.save: the model returned {type(result).__name__} {kinds}; it must return an "
                          "oar.Tensor or a tuple of them (wrap the model to return its tensors only)")
    for launch in recorder.launches:
        if launch.op == HOST_READ:
            raise ExportError("oar.jit.save: the forward reads a tensor's value on the host (.item(), .numpy(), "
                              "bool(tensor), ...), so its graph may depend on the data; a static graph cannot "
                              "hold that: compute it with tensor ops instead")
    input_slots = {}
    for address, slot in recorder.slots.items():
        if address in addresses:
            input_slots[slot] = addresses[address]
    out_refs = []
    for k, t in enumerate(outputs):
        address = capture.storage_address(t)
        if address in addresses:
            slot = next(s for s, i in input_slots.items() if i == addresses[address])
        elif address in recorder.slots:
            slot = recorder.slots[address]
        else:
            raise ExportError(f"oar.jit.save: output {k} was not computed by the forward's ops (a tensor made "
                              "outside it); export a forward whose outputs come from its inputs")
        out_refs.append((slot, t.storage_offset(), tuple(t.shape), tuple(t.strides), t.dtype.name))
    trace = recorder.finish()
    extents = [1] * len(trace.slot_kinds)
    for launch in trace.launches:
        for ref in launch.inputs + launch.outputs:
            extent = ref.offset + sum((n - 1) * s for n, s in zip(ref.shape, ref.strides)) + 1
            extents[ref.slot] = max(extents[ref.slot], extent)
    return Traced(dict(sizes), trace.launches, recorder.operands, trace.slot_kinds, input_slots, out_refs,
                  [tuple(a.shape) for a in arrays], extents)


# ---------------------------------------------------------------- the integers of a trace, fitted

def _strides(shape, strides) -> list[int]:
    """Strides with a size-1 dim's stride as 0: it never moves, and the runtime sets it freely."""
    return [0 if n == 1 else s for n, s in zip(shape, strides)]


def structure(t: Traced) -> tuple[list, list[int]]:
    """(what must be equal between traces, the integers that may vary) of one trace, in a fixed order."""
    keys, ints = [], []
    for launch in t.launches:
        refs = launch.inputs + launch.outputs
        keys.append((launch.op, sorted((k, str(v)) for k, v in launch.attrs.items()), launch.fresh,
                     [(r.slot, r.dtype, r.wrapped, len(r.shape)) for r in refs]))
        for r in refs:
            ints += [r.offset, *r.shape, *_strides(r.shape, r.strides)]
    keys.append(("outputs", [(slot, dtype, len(shape)) for slot, _, shape, _, dtype in t.outputs]))
    for slot, offset, shape, strides, _ in t.outputs:
        ints += [offset, *shape, *_strides(shape, strides)]
    keys.append(("slots", t.slot_kinds, sorted(t.input_slots.items())))
    ints += t.extents
    return keys, ints


@dataclass(frozen=True)
class IntExpr:
    """An integer of the graph as a function of the dynamic dims: coef * prod(dims) + const (a dim repeats
    for a power, as in heads * seq * seq), with one dim when const != 0 (an affine size such as ``seq - 1``)."""
    coef: int
    dims: tuple[str, ...]
    const: int = 0

    def __call__(self, sizes: dict[str, int]) -> int:
        value = self.coef
        for d in self.dims:
            value *= sizes[d]
        return value + self.const

    @property
    def is_const(self) -> bool:
        return not self.dims or self.coef == 0

    @property
    def value(self) -> int:
        """The value of a constant expression."""
        return (0 if self.dims else self.coef) + self.const


def constant(value: int) -> IntExpr:
    return IntExpr(int(value), ())


def fit_value(values: list[int], traces: list[Traced]) -> IntExpr | None:
    """The IntExpr through ``values`` (one per trace: base, one per varied dim in order, the check), or
    None when no product/power or affine function of the dims fits them all."""
    base, check = traces[0], traces[-1]
    v0, check_value = values[0], values[-1]
    varied = {name: (t, v) for t, v in zip(traces[1:-1], values[1:-1])
              for name in t.sizes if t.sizes[name] != base.sizes[name]}
    moved = [name for name, (_, v) in varied.items() if v != v0]
    expr = None
    if not moved:
        expr = constant(v0)
    else:
        b = {n: base.sizes[n] for n in moved}
        alt = {n: varied[n][0].sizes[n] for n in moved}
        powers = {}
        for n in moved:  # v0 * (alt / base) ** e == v: the dim's power in a product such as heads * seq**2
            powers[n] = next((e for e in (1, 2, 3) if varied[n][1] * b[n] ** e == v0 * alt[n] ** e), None)
        denom = int(np.prod([b[n] ** (powers[n] or 0) for n in moved]))
        if all(powers.values()) and v0 % denom == 0:
            expr = IntExpr(v0 // denom, tuple(sorted(n for n in moved for _ in range(powers[n]))))
        elif len(moved) == 1:
            n = moved[0]
            slope, rest = divmod(varied[n][1] - v0, alt[n] - b[n])
            if rest == 0:
                expr = IntExpr(slope, (n,), v0 - slope * b[n])
    return expr if expr is not None and expr(check.sizes) == check_value else None


def fit_ints(base: Traced, varied: dict[str, Traced], check: Traced, where) -> list[IntExpr]:
    """Fit each integer of ``base`` over the traces with one dim changed each; verify on ``check``."""
    traces = [base, *varied.values(), check]
    all_ints = [structure(t)[1] for t in traces]
    exprs = []
    for j in range(len(all_ints[0])):
        expr = fit_value([ints[j] for ints in all_ints], traces)
        if expr is None:
            raise ExportError(f"oar.jit.save: {where(j)} varies with the dynamic dims as no product or affine "
                              f"function of them does ({[(t.sizes, ints[j]) for t, ints in zip(traces, all_ints)]})"
                              ": the graph's shape arithmetic is not static")
        exprs.append(expr)
    return exprs


def compare_structure(base: Traced, other: Traced) -> None:
    keys0, _ = structure(base)
    keys1, _ = structure(other)
    if len(keys0) != len(keys1):
        raise ExportError(f"oar.jit.save: the forward launches {len(base.launches)} ops at sizes {base.sizes} "
                          f"but {len(other.launches)} at {other.sizes}: its graph depends on the dynamic dims")
    for j, (a, b) in enumerate(zip(keys0, keys1)):
        if a != b:
            what = f"launch {j} ({base.launches[j].op})" if j < len(base.launches) else a[0]
            raise ExportError(f"oar.jit.save: {what} differs between sizes {base.sizes} and {other.sizes} in more "
                              f"than its sizes ({a} vs {b}): the graph depends on the dynamic dims")


def describe_int(base: Traced):
    """A function naming the j-th integer of structure(base) for error messages."""
    names = []
    for i, launch in enumerate(base.launches):
        for k, r in enumerate(launch.inputs + launch.outputs):
            role = f"input {k}" if k < len(launch.inputs) else f"output {k - len(launch.inputs)}"
            label = f"launch {i} ({launch.op}) {role}"
            names += [f"{label} offset"] + [f"{label} dim {a}" for a in range(len(r.shape))] + \
                     [f"{label} stride {a}" for a in range(len(r.strides))]
    for k, (_, _, shape, strides, _) in enumerate(base.outputs):
        names += [f"model output {k} offset"] + [f"model output {k} dim {a}" for a in range(len(shape))] + \
                 [f"model output {k} stride {a}" for a in range(len(strides))]
    names += [f"storage {s} extent" for s in range(len(base.extents))]
    return lambda j: names[j]


def value_of(tensor: Any) -> np.ndarray:
    """A constant operand's values with broadcast (stride-0) dims kept at size 1."""
    index = tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                  for size, stride in zip(tensor.shape, tensor.strides))
    view = tensor[index] if index else tensor
    return np.ascontiguousarray(view.numpy())

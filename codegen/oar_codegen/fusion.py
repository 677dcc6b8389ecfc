"""Fusion: the launches of a trace grouped into fused kernels, and the order units run in.

Launches are taken in trace order. A fusable launch joins the open group that
produced one of its inputs when both iterate the same rows and columns and it
reads that group's values element for element; otherwise it opens a group.
So elementwise producers sink into a downstream reduction, and elementwise ops
after a reduction (its result broadcast along the row) join its group.

A group closes as soon as anything outside it reads one of its values, or
writes a storage it read: it then runs before that reader or writer, and
since nothing outside an open group depends on it, no fusion creates a cycle.
Units (groups, and launches that run as the plugin's own kernel) run in the
order of their last launch. A group's value is written to memory only when
something outside the group reads it, the caller can still see it after the
call, or it is the new content of a tensor that existed before the call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from oar_codegen.ir import TOTAL_SUM, Access, Expr, ExprBuilder
from oar_codegen.lower import Domain, LoweringRefused, access_of, domain_of, lower
from oar_codegen.trace import HOST_READ, Launch, Trace

__all__ = ["Store", "KernelSpec", "FusedUnit", "EagerUnit", "Plan", "plan_trace"]


@dataclass(frozen=True)
class Store:
    value: Expr
    buffer: int
    access: Access
    dtype: str


@dataclass
class KernelSpec:
    """One fused kernel: kind "row" (rows in parallel, reductions along each row), "flat" (one
    dense elementwise range) or "col" (columns in parallel, a sum down each column)."""
    kind: str
    rows: int
    cols: int
    buffer_slots: list[int]        # kernel argument i is the storage of this trace slot
    buffer_dtypes: list[str]
    stores: list[Store]
    ops: list[str]                 # the fused ops, for names and explain()

    @property
    def name(self) -> str:
        short = "_".join(dict.fromkeys(self.ops))[:48]
        return f"oar_{self.kind}_{short}"


@dataclass
class FusedUnit:
    members: list[int]
    kernel: KernelSpec


@dataclass
class EagerUnit:
    launch: int
    reason: str


@dataclass
class Plan:
    """The units of a trace in the order they run (each after its last launch)."""
    units: list
    refused: dict[int, str] = field(default_factory=dict)  # launch index -> why it is not fused

    @property
    def fused(self) -> list[FusedUnit]:
        return [u for u in self.units if isinstance(u, FusedUnit)]


@dataclass
class _Group:
    domain: Domain           # kind is "ew", "row" or "col" for the group as a whole
    members: list[int] = field(default_factory=list)
    split_of: dict[int, tuple] = field(default_factory=dict)   # member -> (iteration shape, split)
    out_access: dict[tuple, Access] = field(default_factory=dict)  # (launch, output index) -> access
    open: bool = True


class _Planner:
    def __init__(self, trace: Trace):
        self.trace = trace
        self.launches = trace.launches
        self.groups: list[_Group] = []
        self.group_of: dict[int, int] = {}
        self.producer: dict[int, tuple | None] = {}      # slot -> (launch, output index) of its current version
        self.readers: dict[int, set[int]] = {}           # slot -> launches that read its current version
        self.consumers: dict[tuple, set[int]] = {}       # (launch, output index) -> launches reading it
        self.version_of_input: dict[tuple, tuple | None] = {}  # (launch, input index) -> producer
        self.refused: dict[int, str] = {}

    # -- grouping ---------------------------------------------------------------------------
    def _close_group_of(self, launch: int | None) -> None:
        if launch is not None and launch in self.group_of:
            self.groups[self.group_of[launch]].open = False

    def _note_reads(self, index: int, launch: Launch) -> None:
        for k, ref in enumerate(launch.inputs):
            source = self.producer.get(ref.slot)
            self.version_of_input[(index, k)] = source
            if source is not None:
                self.consumers.setdefault(source, set()).add(index)
            self.readers.setdefault(ref.slot, set()).add(index)

    def _note_writes(self, index: int, launch: Launch, own_group: int | None) -> None:
        for k, ref in enumerate(launch.outputs):
            if not launch.fresh:  # overwriting: earlier readers and the old value's maker run first
                for reader in self.readers.get(ref.slot, ()):
                    if self.group_of.get(reader) != own_group:
                        self._close_group_of(reader)
                previous = self.producer.get(ref.slot)
                if previous is not None and self.group_of.get(previous[0]) != own_group:
                    self._close_group_of(previous[0])
            self.producer[ref.slot] = (index, k)
            self.readers[ref.slot] = set()

    def _try_join(self, group_id: int, index: int, launch: Launch, domain: Domain) -> bool:
        group = self.groups[group_id]
        g = group.domain
        if not group.open or g.kind == "col":
            return False
        if domain.kind == "ew":
            shape = domain.shape
            split = next((k for k in range(len(shape) + 1)
                          if math.prod(shape[:k]) == g.rows and math.prod(shape[k:]) == g.cols), None)
            if split is None and g.kind == "row" and math.prod(shape) == g.rows:
                split = len(shape)  # a function of per-row values (a reduction's result): one per row
            if split is None:
                return False
        elif (domain.rows, domain.cols) != (g.rows, g.cols):
            return False
        else:
            shape, split = domain.shape, domain.split
        accesses = self._input_accesses(launch, shape, split)
        if accesses is None or _gathers(launch, accesses):
            return False
        for k, ref in enumerate(launch.inputs):
            source = self.producer.get(ref.slot)
            if source is not None and self.group_of.get(source[0]) == group_id:
                if ref.wrapped or group.out_access.get(source) != accesses[k]:
                    return False
        out_accesses = self._output_accesses(launch, domain, shape, split)
        if out_accesses is None:
            return False
        if not launch.fresh:  # a store into a tensor the group read: only element for element
            slot = launch.outputs[0].slot
            for member in group.members:
                for k, ref in enumerate(self.launches[member].inputs):
                    if ref.slot == slot and self._member_access(member, k) != out_accesses[0]:
                        return False
        self._add(group_id, index, launch, shape, split, out_accesses)
        if g.kind == "ew" and domain.kind != "ew":  # a column sum joining a row kernel keeps it a row kernel
            group.domain = Domain(domain.kind, g.shape, g.split)
        return True

    def _member_access(self, member: int, k: int) -> Access | None:
        shape, split = self.groups[self.group_of[member]].split_of[member]
        return access_of(self.launches[member].inputs[k], shape, split)

    def _input_accesses(self, launch: Launch, shape, split) -> list | None:
        out = []
        for ref in launch.inputs:
            access = access_of(ref, shape, split)
            if access is None:
                return None
            out.append(access)
        return out

    def _output_accesses(self, launch: Launch, domain: Domain, shape, split) -> list | None:
        out = []
        for ref in launch.outputs:
            if domain.kind == "ew" or launch.op in ("softmax", "log_softmax", "cross_entropy_backward") \
                    or "norm" in launch.op:
                access = access_of(ref, shape, split)
            elif launch.op == "cross_entropy" and math.prod(ref.shape) == 1 and len(ref.shape) == 0:
                access = Access(ref.offset, 0, 0)  # the mean or sum over rows
            elif domain.kind == "row":  # one value per row, rows dense
                access = Access(ref.offset, 1 if math.prod(shape[:split]) > 1 else 0, 0)
                if math.prod(ref.shape) != math.prod(shape[:split]) or not ref.dense:
                    return None
            else:  # col: one value per column
                access = Access(ref.offset, 0, 1 if math.prod(shape[split:]) > 1 else 0)
                if math.prod(ref.shape) != math.prod(shape[split:]) or not ref.dense:
                    return None
            if access is None:
                return None
            out.append(access)
        return out

    def _add(self, group_id: int, index: int, launch: Launch, shape, split, out_accesses) -> None:
        group = self.groups[group_id]
        group.members.append(index)
        group.split_of[index] = (tuple(shape), split)
        for k, access in enumerate(out_accesses):
            group.out_access[(index, k)] = access
        self.group_of[index] = group_id

    def _new_group(self, index: int, launch: Launch, domain: Domain) -> bool:
        shape, split = domain.shape, domain.split
        accesses = self._input_accesses(launch, shape, split)
        outs = self._output_accesses(launch, domain, shape, split)
        if accesses is None or outs is None:
            self.refused[index] = f"{launch.op}: its operands' strides do not fold into rows and columns"
            return False
        if _gathers(launch, accesses):
            self.refused[index] = ("copy reads across rows (a transpose or a gather): the plugin's copy does it "
                                   "in cache-sized tiles, the ops after it fuse on dense values")
            return False
        self.groups.append(_Group(domain))
        self._add(len(self.groups) - 1, index, launch, shape, split, outs)
        return True

    def group(self) -> None:
        for index, launch in enumerate(self.launches):
            if launch.op == HOST_READ:
                for group in self.groups:
                    group.open = False
                self._note_reads(index, launch)
                continue
            try:
                domain = domain_of(launch)
            except LoweringRefused as why:
                self.refused[index] = str(why)
                domain = None
            joined = False
            if domain is not None:
                candidates = sorted({self.group_of[s[0]] for ref in launch.inputs
                                     if (s := self.producer.get(ref.slot)) is not None and s[0] in self.group_of},
                                    reverse=True)
                for group_id in candidates:
                    if self._try_join(group_id, index, launch, domain):
                        joined = True
                        break
                if not joined:
                    joined = self._new_group(index, launch, domain)
            own = self.group_of.get(index)
            for ref in launch.inputs:  # what this launch reads from other groups must run before it
                source = self.producer.get(ref.slot)
                if source is not None and self.group_of.get(source[0]) != own:
                    self._close_group_of(source[0])
            self._note_reads(index, launch)
            self._note_writes(index, launch, own)
            if own is not None and (domain.kind == "col" or _sums_all_rows(launch)):
                self.groups[own].open = False  # a column sum, or a sum over all rows, ends its group

    # -- kernels ----------------------------------------------------------------------------
    def kernel_of(self, group_id: int) -> KernelSpec:
        group = self.groups[group_id]
        members = set(group.members)
        b = ExprBuilder()
        slots: list[int] = []
        dtypes: list[str] = []
        buffer_of: dict[int, int] = {}
        values: dict[tuple, Expr] = {}
        stores: list[Store] = []
        last_write: dict[int, tuple] = {}
        for index in group.members:
            for k, ref in enumerate(self.launches[index].outputs):
                last_write[ref.slot] = (index, k)

        def buffer(slot: int, dtype: str) -> int:
            if slot not in buffer_of:
                buffer_of[slot] = len(slots)
                slots.append(slot)
                dtypes.append(dtype)
            return buffer_of[slot]

        for index in group.members:
            launch = self.launches[index]
            shape, split = group.split_of[index]
            ins = []
            for k, ref in enumerate(launch.inputs):
                source = self.version_of_input[(index, k)]
                if source is not None and source in values:
                    ins.append(values[source])
                else:
                    ins.append(b.load(buffer(ref.slot, ref.dtype), access_of(ref, shape, split), ref.dtype))
            column_sum = launch.op == "sum" and domain_of(launch).kind == "col"
            domain = Domain("col" if column_sum else "row", shape, split)
            outs = lower(b, launch, ins, domain)
            for k, (ref, expr) in enumerate(zip(launch.outputs, outs)):
                values[(index, k)] = expr
                readers_outside = any(c not in members for c in self.consumers.get((index, k), ()))
                final = last_write.get(ref.slot) == (index, k)
                keep = readers_outside or (final and (not launch.fresh or ref.slot in self.trace.observable))
                if keep:
                    stores.append(Store(expr, buffer(ref.slot, ref.dtype), group.out_access[(index, k)], ref.dtype))
        kind = group.domain.kind
        g = group.domain
        if kind == "ew":
            flat = _flattened(stores, g.rows, g.cols)
            kind, stores = ("flat", flat) if flat is not None else ("row", stores)
        return KernelSpec(kind, g.rows, g.cols, slots, dtypes, stores,
                          [self.launches[i].op for i in group.members])

    def plan(self) -> Plan:
        self.group()
        units: list[tuple[int, object]] = []
        for group_id, group in enumerate(self.groups):
            compute = [i for i in group.members if self.launches[i].op not in ("copy", "cast")]
            if len(group.members) == 1 or not compute:
                for i in group.members:
                    units.append((i, EagerUnit(i, "a group of one op runs as the plugin's kernel")))
                continue
            units.append((max(group.members), FusedUnit(list(group.members), self.kernel_of(group_id))))
        for index, launch in enumerate(self.launches):
            if launch.op != HOST_READ and index not in self.group_of:
                units.append((index, EagerUnit(index, self.refused.get(index, "not fusable"))))
        units.sort(key=lambda pair: pair[0])
        return Plan([u for _, u in units], dict(self.refused))


def _gathers(launch: Launch, accesses: list) -> bool:
    """A copy whose source elements are not adjacent along a row (a transpose made contiguous):
    a fused kernel would read it one scalar and one cache line per element."""
    return launch.op == "copy" and any(abs(a.col_stride) > 1 for a in accesses)


def _sums_all_rows(launch: Launch) -> bool:
    return launch.op == "cross_entropy" and launch.attrs.get("reduction", "mean") != "none"


def _flat_access(access: Access, rows: int, cols: int) -> Access | None:
    """The access of element i = r * cols + c in one flat range of rows * cols elements (the flat
    kernel's column index), or None when element (r, c) is not at offset + i (or one fixed place)."""
    row_stride = 0 if rows == 1 else access.row_stride   # r is always 0
    col_stride = 0 if cols == 1 else access.col_stride   # c is always 0
    if (row_stride, col_stride) == (0, 0):
        return Access(access.offset, 0, 0)
    if (cols == 1 and row_stride == 1 and col_stride == 0) or (rows == 1 and row_stride == 0 and col_stride == 1) \
            or (row_stride, col_stride) == (cols, 1):
        return Access(access.offset, 0, 1)
    return None


def _flattened(stores: list[Store], rows: int, cols: int) -> list[Store] | None:
    """An elementwise kernel's stores with every access rewritten for one flat range (so loads and
    stores index by the flat element, never by r, which the flat kernel holds at 0), or None when
    some access is not linear in the flat index or a value reads the column index."""
    b = ExprBuilder()
    memo: dict[Expr, Expr | None] = {}

    def rebuilt(e: Expr) -> Expr | None:
        if e in memo:
            return memo[e]
        if e.op == "load":
            buffer, access = e.args
            flat = _flat_access(access, rows, cols)
            out = None if flat is None else b.load(buffer, flat, "bool" if e.dtype == "bool" else "float32")
        elif e.op == "const":
            out = b.const(e.args[0])
        elif e.op == "col" or e.is_reduction or e.op == TOTAL_SUM:
            out = None  # not elementwise in the flat index
        else:
            args = [rebuilt(a) for a in e.args]
            out = None if any(a is None for a in args) else b.call(e.op, *args, dtype=e.dtype)
        memo[e] = out
        return out

    flat_stores = []
    for s in stores:
        access, value = _flat_access(s.access, rows, cols), rebuilt(s.value)
        if access is None or value is None:
            return None
        flat_stores.append(Store(value, s.buffer, access, s.dtype))
    return flat_stores


def plan_trace(trace: Trace) -> Plan:
    """Group the launches of a trace into fused kernels and eager launches, in run order."""
    return _Planner(trace).plan()

"""From a KernelSpec to the statements a target's templates place in their loops.

The statements are C-like and target-neutral: elementwise functions are calls
of ``oar_<name>`` helpers that each target's prelude template defines (so a
vendor's C dialect only restates the prelude), loads and stores index buffers
``b<i>`` by the spec's accesses.

A row kernel is a sequence of blocks per row: statements run once per row
(``row``), then loops over the row's columns. Loop k computes the reductions
whose inputs need only the reductions of earlier loops; the last loop computes
and stores the per-element outputs. Sums accumulate in float32 in lanes
within blocks of the row, blocks added pairwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from oar_codegen.fusion import KernelSpec
from oar_codegen.ir import COLUMN_SUM, TOTAL_SUM, Access, Expr, walk

__all__ = ["KernelModel", "model_of", "float_literal"]

# Integer buffers a kernel reads as float: class indices, and the int8 codes a cast from int8 loads.
_INTEGER_CTYPES = {"int8": "int8_t", "int32": "int32_t", "int64": "int64_t"}
# Outputs of at least this many elements (4 MiB of float32, more than a core's cache) may be
# written around the cache: reading their lines first (write-allocate) would cost a third more traffic.
_STREAM_MIN_ELEMENTS = 1 << 20
_HALF_LOADS = {"float16": "oar_f16_to_float", "bfloat16": "oar_bf16_to_float"}
_HALF_STORES = {"float16": "oar_float_to_f16", "bfloat16": "oar_float_to_bf16"}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
          "gt": ">", "ge": ">=", "logical_and": "&&", "logical_or": "||"}


def float_literal(value: float) -> str:
    """A float32 C literal that keeps the value (inf and NaN spelled as the prelude's macros)."""
    if math.isnan(value):
        return "OAR_NAN"
    if math.isinf(value):
        return "OAR_INF" if value > 0 else "(-OAR_INF)"
    return repr(float(value)) + "f" if "e" in repr(float(value)) or "." in repr(float(value)) else f"{value}.0f"


@dataclass
class Loop:
    """One pass over the columns of a row: reductions accumulated, or outputs stored."""
    body: list[str]
    reductions: list[dict] = field(default_factory=list)   # {var, kind, value}
    stores: list[str] = field(default_factory=list)
    # large dense float32 outputs a target may write with streaming (non-temporal) stores:
    # {n, index, value, row_base}: element c of the row is at b<index>[row_base + c]
    streamed: list[dict] = field(default_factory=list)


@dataclass
class KernelModel:
    """What a target template renders: name, kind, sizes, buffers, and blocks in order."""
    name: str
    kind: str
    rows: int
    cols: int
    buffers: list[dict]
    blocks: list[tuple[str, object]]   # ("row", [statements]) or ("loop", Loop)
    row_stores: list[str]
    col_sums: list[dict]               # col kernels: {var, value, store}
    summary: str = ""                  # the fused ops, for the source's comment
    points: int = 1                    # grid points x threads per point, as launched
    # row kernels on GPU targets: threads of one work-group (block) that share a row, a power of two
    # (the launch geometry sets it; 1: one thread per row)
    group_size: int = 1
    # float lanes a thread's row reductions keep (one vector register's worth): 16 on AVX-512 hosts
    lanes: int = 8
    prologue: list[str] = field(default_factory=list)   # before the rows: totals of loaded values
    epilogue: list[str] = field(default_factory=list)   # stage "_total": what needs the running totals
    totals: list[dict] = field(default_factory=list)    # running totals: {var, slot} in the scratch
    # column sums of computed values in a row kernel: each grid point sums its rows into its own
    # slice of the scratch, the second stage adds the slices up: {n, store (of colsum_total)}
    colsums: list[dict] = field(default_factory=list)
    scratch: int = -1                  # the buffer index of the scratch (-1: none)

    stages: list[str] = field(default_factory=lambda: [""])  # function name suffixes, launched in order

    @property
    def scratch_floats(self) -> int:
        """Per-row values of the running totals, then a slice per grid point of each column sum."""
        return len(self.totals) * self.rows + len(self.colsums) * self.points * self.cols


class _Writer:
    """Statements of a kernel: element-scope ones go to the lines a loop passes in, row-scope ones
    (values the same for every column) to ``pending``, emitted before the next loop."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.row_vars: dict[Expr, str] = {}
        self.pending: list[str] = []
        self.count = 0

    def _var(self) -> str:
        self.count += 1
        return f"t{self.count}"

    @staticmethod
    def address(buffer: int, access: Access, index: str) -> str:
        """Element (r, index) of buffer b<buffer> by access."""
        parts = [str(access.offset)] if access.offset else []
        if access.row_stride:
            parts.append(f"r * {access.row_stride}")
        if access.col_stride:
            parts.append(index if access.col_stride == 1 else f"{index} * {access.col_stride}")
        return f"b{buffer}[{' + '.join(parts) or '0'}]"

    def load(self, e: Expr, index: str) -> str:
        buffer, access = e.args
        dtype = self.spec.buffer_dtypes[buffer]
        address = self.address(buffer, access, index)
        if dtype == "bool":
            return f"({address} != 0)"
        if dtype in _HALF_LOADS:
            return f"{_HALF_LOADS[dtype]}({address})"
        return f"(float){address}" if dtype in _INTEGER_CTYPES else address

    def expression(self, e: Expr, lines: list[str], local: dict, index: str) -> str:
        """The name (or literal) of e's value, emitting its statements into lines (element scope) or
        the pending row statements (row scope)."""
        if e.per_row and e in self.row_vars:
            return self.row_vars[e]
        if e in local:
            return local[e]
        if e.op == "const":
            return float_literal(e.args[0])
        if e.op == TOTAL_SUM:
            raise AssertionError("a total used before it was computed")
        target_lines = self.pending if e.per_row else lines
        target_local = self.row_vars if e.per_row else local
        if e.op == "col":
            text = f"(float){index}"
        elif e.op == "load":
            text = self.load(e, index)
        elif e.is_reduction:
            raise AssertionError(f"reduction {e.op} used before it was computed")
        else:
            args = [self.expression(a, target_lines, target_local, index) for a in e.args]
            if e.op in _INFIX:
                text = f"({args[0]} {_INFIX[e.op]} {args[1]})"
            elif e.op == "where":
                text = f"({args[0]} ? {args[1]} : {args[2]})"
            elif e.op == "neg":
                text = f"(-{args[0]})"
            elif e.op == "logical_not":
                text = f"(!{args[0]})"
            elif e.op == "isnan":
                text = f"({args[0]} != {args[0]})"
            elif e.op == "float_of":
                text = f"({args[0]} ? 1.0f : 0.0f)"
            else:
                text = f"oar_{e.op}({', '.join(args)})"
        var = self._var()
        target_lines.append(f"const {'int' if e.dtype == 'bool' else 'float'} {var} = {text};")
        target_local[e] = var
        return var

    def store(self, store, value: str, index: str) -> str:
        address = self.address(store.buffer, store.access, index)
        if store.dtype == "bool":
            return f"{address} = (unsigned char)({value} != 0);"
        if store.dtype in _HALF_STORES:
            return f"{address} = {_HALF_STORES[store.dtype]}({value});"
        return f"{address} = {value};"


def _depth(e: Expr, memo: dict) -> int:
    if e in memo:
        return memo[e]
    if e.op in ("load", "const", "col"):
        memo[e] = 0
        return 0
    inner = max((_depth(a, memo) for a in e.args), default=0)
    memo[e] = inner + (1 if e.is_reduction else 0)
    return memo[e]


def _totals_in(e: Expr) -> list[Expr]:
    return [x for x in walk([e]) if x.op == TOTAL_SUM]


def _totals(w: "_Writer", spec: KernelSpec, index: str, memo: dict):
    """Totals of loaded values are summed before the rows (every grid point sums them itself);
    totals of computed values leave one value per row in the scratch, and the second stage adds
    them up and computes and stores what uses them."""
    found = dict.fromkeys(x for x in walk(s.value for s in spec.stores) if x.op == TOTAL_SUM)
    prologue, running_updates, running = [], [], set()
    for total in found:
        var = w._var()
        if _depth(total.args[0], memo) == 0:
            prologue.append(f"OAR_ACC {var} = 0;")
            saved = (w.row_vars, w.pending)
            w.row_vars, w.pending = {}, []
            value = w.expression(total.args[0], [], {}, index)
            prologue.append("for (int64_t r = 0; r < rows; ++r) {")
            prologue.extend("  " + line for line in w.pending)
            prologue.append(f"  {var} += {value};")
            prologue.append("}")
            w.row_vars, w.pending = saved
            w.row_vars[total] = f"(float){var}"
        else:
            running.add(total)
            running_updates.append((total, var))
    return prologue, running_updates, running


def _row_model(spec: KernelSpec, name: str, index: str) -> KernelModel:
    w = _Writer(spec)
    reductions = [r for r in walk(s.value for s in spec.stores) if r.is_reduction and r.op != "reduce_" + COLUMN_SUM]
    memo: dict = {}
    prologue, running_updates, running = _totals(w, spec, index, memo)
    by_depth: dict[int, list[Expr]] = {}
    for red in reductions:
        by_depth.setdefault(_depth(red, memo), []).append(red)
    blocks: list = []
    for depth in sorted(by_depth):
        w.pending = []
        loop = Loop(body=[])
        local: dict = {}
        for red in by_depth[depth]:
            value = w.expression(red.args[0], loop.body, local, index)
            var = w._var()
            loop.reductions.append({"var": var, "kind": red.op[len("reduce_"):], "value": value})
        blocks.append(("row", w.pending))
        blocks.append(("loop", loop))
        for red, entry in zip(by_depth[depth], loop.reductions):
            w.row_vars[red] = entry["var"]
    w.pending = []
    row_stores = []
    final = Loop(body=[])
    local = {}
    def once_per_row(s) -> bool:
        return s.value.per_row and s.access.col_stride == 0

    def after_rows(s) -> bool:
        return any(t in running for t in _totals_in(s.value))

    def column_sum(s) -> bool:
        return s.value.op == "reduce_" + COLUMN_SUM

    scratch = len(spec.buffer_dtypes)  # the executor appends the scratch buffer last
    colsums = []
    for s in spec.stores:
        if column_sum(s):
            value = w.expression(s.value.args[0], final.body, local, index)
            n = len(colsums)
            final.stores.append(f"b{scratch}[colsum{n}_base + {index}] += {value};")
            colsums.append({"n": n, "store": w.store(s, "colsum_total", index)})
    for s in spec.stores:
        if column_sum(s):
            continue
        if once_per_row(s) and not after_rows(s):
            row_stores.append(w.store(s, w.expression(s.value, [], {}, index), index))
    stream = spec.kind in ("row", "flat") and spec.rows * spec.cols >= _STREAM_MIN_ELEMENTS
    for s in spec.stores:
        if not once_per_row(s) and not after_rows(s) and not column_sum(s):
            value = w.expression(s.value, final.body, local, index)
            final.stores.append(w.store(s, value, index))
            if stream and s.dtype == "float32" and s.access.col_stride == 1:
                base = [str(s.access.offset)] + ([f"r * {s.access.row_stride}"] if s.access.row_stride else [])
                final.streamed.append({"n": len(final.streamed), "index": s.buffer, "value": value,
                                       "row_base": " + ".join(base)})
    if len(final.streamed) != len(final.stores):
        final.streamed = []  # all or nothing: the streamed form replaces the loop's stores
    for slot, (total, var) in enumerate(running_updates):
        row_stores.append(f"b{scratch}[{slot} * rows + r] = {w.expression(total.args[0], [], {}, index)};")
    blocks.append(("row", w.pending))
    if final.stores:
        blocks.append(("loop", final))
    epilogue: list[str] = []
    if running:
        w.row_vars = {e: v for e, v in w.row_vars.items() if e.op == TOTAL_SUM}  # before the rows
        w.row_vars.update({total: var for total, var in running_updates})
        w.pending = epilogue
        for s in spec.stores:
            if after_rows(s):
                if s.access != type(s.access)(s.access.offset, 0, 0):
                    raise AssertionError("a value of a sum over all rows is stored once, not per row")
                epilogue.append(w.store(s, w.expression(s.value, [], {}, index), index))
    buffers = _buffers(spec)
    extra = {}
    if running or colsums:
        buffers.append({"index": scratch, "ctype": "float"})
        extra = dict(totals=[{"var": var, "slot": slot} for slot, (_, var) in enumerate(running_updates)],
                     colsums=colsums, scratch=scratch, stages=["", "_total"])
    return KernelModel(name, spec.kind, spec.rows, spec.cols, buffers, blocks, row_stores, [],
                       " -> ".join(spec.ops), prologue=prologue, epilogue=epilogue, **extra)


def _buffers(spec: KernelSpec) -> list[dict]:
    def ctype(dtype: str) -> str:
        if dtype == "bool":
            return "unsigned char"
        return "uint16_t" if dtype in _HALF_LOADS else _INTEGER_CTYPES.get(dtype, "float")
    return [{"index": i, "ctype": ctype(d)} for i, d in enumerate(spec.buffer_dtypes)]


def _col_model(spec: KernelSpec, name: str, index: str) -> KernelModel:
    w = _Writer(spec)
    body: list[str] = []
    local: dict = {}
    sums, stores = [], []
    for s in spec.stores:
        if s.value.op == "reduce_" + COLUMN_SUM:
            value = w.expression(s.value.args[0], body, local, index)
            sums.append({"var": w._var(), "value": value, "store": s})
        else:
            stores.append(w.store(s, w.expression(s.value, body, local, index), index))
    for entry in sums:
        entry["store"] = w.store(entry["store"], f"(float){entry['var']}[{index} - c0]", index)
    return KernelModel(name, "col", spec.rows, spec.cols, _buffers(spec), [("row", w.pending), ("loop", Loop(body, [], stores))],
                       [], sums, " -> ".join(spec.ops))


def model_of(spec: KernelSpec, name: str, index: str = "c") -> KernelModel:
    """The template model of a kernel (index: the name of the column variable in the loops)."""
    if spec.kind == "col":
        return _col_model(spec, name, index)
    if spec.kind == "flat":
        flat = KernelSpec("flat", 1, spec.rows * spec.cols, spec.buffer_slots, spec.buffer_dtypes, spec.stores, spec.ops)
        return _row_model(flat, name, index)
    return _row_model(spec, name, index)

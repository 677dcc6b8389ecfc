"""The kernel IR: scalar expressions over one element of a fused group.

A fused kernel iterates a 2-d domain (rows r, columns c). Every value in it is
an :class:`Expr` evaluated at one (r, c): a load from a buffer, a constant, the
column index, an elementwise function of other expressions, or a row
reduction (a value per row, the same for every c). Expressions are hash-consed,
so a subexpression two ops share is computed once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

__all__ = ["Access", "Expr", "ExprBuilder", "ROW_REDUCTIONS", "COLUMN_SUM", "TOTAL_SUM", "walk"]

ROW_REDUCTIONS = ("sum", "max", "min")
COLUMN_SUM = "colsum"  # the sum over rows of a "col" kernel: one value per column
TOTAL_SUM = "total_sum"  # the sum over all rows of a per-row value: one value for the kernel


@dataclass(frozen=True)
class Access:
    """Where element (r, c) of a buffer lies: offset + r * row_stride + c * col_stride (elements)."""
    offset: int
    row_stride: int
    col_stride: int

    @property
    def per_row(self) -> bool:
        """The same element for every column (a row scalar, e.g. a keepdim reduction broadcast)."""
        return self.col_stride == 0


@dataclass(frozen=True)
class Expr:
    """op: "load" (args: buffer index, Access), "const" (args: the float), "col" (the column index),
    "reduce_<sum|max|min>" (args: the reduced expression), or an elementwise function name.
    dtype: "float" or "bool" (comparisons, where's condition)."""
    op: str
    args: tuple
    dtype: str = "float"
    per_row: bool = field(default=False, compare=False)

    @property
    def is_reduction(self) -> bool:
        return self.op.startswith("reduce_")


class ExprBuilder:
    """Makes expressions, sharing equal ones, and folds the trivial identities the lowering creates."""

    def __init__(self) -> None:
        self._interned: dict[Expr, Expr] = {}

    def _make(self, op: str, args: tuple, dtype: str, per_row: bool) -> Expr:
        expr = Expr(op, args, dtype, per_row)
        return self._interned.setdefault(expr, expr)

    def load(self, buffer: int, access: Access, dtype: str) -> Expr:
        return self._make("load", (buffer, access), "bool" if dtype == "bool" else "float", access.per_row)

    def total(self, value: Expr) -> Expr:
        """The sum over every row of a per-row value (cross_entropy's mean and its count)."""
        if not value.per_row:
            raise ValueError("a total sums a per-row value")
        return self._make(TOTAL_SUM, (value,), "float", True)

    def const(self, value: float) -> Expr:
        return self._make("const", (float(value),), "float", True)

    def col(self) -> Expr:
        return self._make("col", (), "float", False)

    def call(self, op: str, *args: Expr, dtype: str = "float") -> Expr:
        return self._make(op, tuple(args), dtype, all(a.per_row for a in args))

    def reduce(self, kind: str, value: Expr) -> Expr:
        if kind not in ROW_REDUCTIONS and kind != COLUMN_SUM:
            raise ValueError(f"no reduction {kind!r}")
        return self._make("reduce_" + kind, (value,), "float", kind != COLUMN_SUM)

    # Shorthands the op lowerings read like formulas with.
    def add(self, a: Expr, b: Expr) -> Expr:
        return self.call("add", a, b)

    def sub(self, a: Expr, b: Expr) -> Expr:
        return self.call("sub", a, b)

    def mul(self, a: Expr, b: Expr) -> Expr:
        return self.call("mul", a, b)

    def div(self, a: Expr, b: Expr) -> Expr:
        return self.call("div", a, b)


def walk(roots: Iterable[Expr]) -> Iterator[Expr]:
    """Every distinct expression the roots are made of, each once (the roots included)."""
    stack, seen = list(roots), set()
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        yield e
        if e.op not in ("load", "const", "col"):
            stack.extend(e.args)

"""The op set as autograd reads it: oar_opset's model (one Op per op of interface/ops.yaml).

``ops_schema()`` maps op name -> :class:`oar_opset.Op` (inputs and outputs with name,
optional, variadic; ``attr_names``, ``attr_defaults``, ``backward``). ``OpSpec`` and
``Port`` are the names the engine and the formula compiler have always imported: the
model's ``Op`` and ``Input``.
"""

from __future__ import annotations

import oar_opset
from oar_opset import Input as Port
from oar_opset import Op as OpSpec

__all__ = ["OpSpec", "Port", "ops_schema"]

_by_name: dict[str, OpSpec] | None = None


def ops_schema() -> dict[str, OpSpec]:
    """op name -> Op, of the op set the op functions were generated from."""
    global _by_name
    if _by_name is None:
        _by_name = {op.name: op for op in oar_opset.default()}
    return _by_name

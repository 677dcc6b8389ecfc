"""The op functions, one per op of interface/ops.yaml, generated at import.

``oar.ops.add(a, b)``, ``oar.ops.sum(x, dim=[1], keepdim=True)``: tensor
inputs positional (an absent optional input is None or left out), attrs by
keyword with the defaults of ops.yaml, or positional after the inputs
(``oar.ops.clamp(x, 0.0, 1.0)``; extra ints gather into a trailing ints attr:
``oar.ops.permute(x, 1, 0)``). Elementwise ops (kinds binary and ternary) take
Python numbers for their data inputs, typed like PyTorch's wrapped numbers.

Every non-view op runs through the C++ dispatch (``oar._C``): checks, dtype
promotion, output shapes, the plugin's kernel (looked up once per device, op
and dtypes) on the current stream, else the host fallback (:mod:`oar.fallback`).
View ops (reshape, transpose, permute, expand, slice, split, concat, setitem)
change metadata or use the copy kernel; they never reach a plugin as
themselves. Creation ops (full, arange, rand, randn) take ``shape``, ``dtype``
and ``device`` besides their attrs; :mod:`oar.tensor` has the friendly
factories (``oar.zeros``, ``oar.rand``, ...).

The op set is oar_opset's model of interface/ops.yaml (``oar.ops.opset``): the package's
checked ops.json, or the YAML file named by ``OAR_OPS_YAML``.
"""

from __future__ import annotations

import oar_opset

from oar import _C

__all__ = ["names", "schema", "opset"]

opset: oar_opset.OpSet = oar_opset.default()
_schemas: dict[str, dict] = {}
names: list[str] = []


def schema(name: str) -> dict:
    """The op's record as registered with the C++ core: kind, inputs [(name, role, optional)], attrs
    [(name, type, required, default)], dtypes, out_dtype, broadcast, nonempty_reduction, semantics,
    backward. The typed op is ``oar.ops.opset[name]``."""
    return _schemas[name]


def _record(op: oar_opset.Op) -> dict:
    return {
        "name": op.name,
        "kind": op.kind,
        "inputs": [(i.name, i.role, i.optional) for i in op.inputs],
        "variadic": op.variadic,
        "num_outputs": len(op.outputs),
        "output_names": [o.name for o in op.outputs],
        "attrs": [(a.name, a.type, a.required, list(a.default) if isinstance(a.default, tuple) else a.default)
                  for a in op.attrs],
        "dtypes": list(op.dtypes),
        "out_dtype": op.out_dtype,
        "broadcast": op.broadcast,
        "nonempty_reduction": op.nonempty_reduction,
        "semantics": op.semantics,
        "backward": dict(op.backward) or None,
    }


def _doc(s: dict) -> str:
    inputs = ", ".join(n + ("=None" if opt else "") for n, _, opt in s["inputs"])
    if s["variadic"]:
        inputs = s["inputs"][0][0]
    attrs = ", ".join(a if req else f"{a}={d!r}" for a, _, req, d in s["attrs"])
    if s["kind"] == "creation":
        head = f"{s['name']}(shape, *, {attrs + ', ' if attrs else ''}dtype=oar.float32, device=None)"
    else:
        head = f"{s['name']}({inputs}{', *, ' + attrs if attrs else ''})"
    return (f"{head}\n\n{s['semantics']}\n\nkind: {s['kind']}; dtypes: {', '.join(s['dtypes'])}; "
            f"out_dtype: {s['out_dtype']}{'; broadcast' if s['broadcast'] else ''}. "
            f"Generated from interface/ops.yaml.")


def _concat(tensors, dim: int = 0):
    return _C._concat(tensors, dim)


def _split(x, sizes, dim: int = 0):
    return _C._split(x, [int(s) for s in ([sizes] if isinstance(sizes, int) else sizes)], dim)


def _setitem(x, value, index):
    x[index] = value


_VIEW_FUNCTIONS = {"concat": _concat, "split": _split, "setitem": _setitem}


def _generate() -> None:
    namespace = globals()
    for op in opset:
        name = op.name
        s = _record(op)
        _schemas[name] = s
        function = _C._register_op(s)  # the C callable; some view ops get Python wrappers
        if name in _VIEW_FUNCTIONS:
            function = _VIEW_FUNCTIONS[name]
        function.__doc__ = _doc(s)
        function.__module__ = __name__
        if not isinstance(function, _C.OpFunction):
            function.__name__ = function.__qualname__ = name
        namespace[name] = function
        names.append(name)
    __all__.extend(names)


_generate()

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

The op set comes from the package's ``ops.json`` (ops.yaml parsed at build
time), or from the YAML file named by ``OAR_OPS_YAML``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from oar import _C

__all__ = ["names", "schema", "document"]

# Inputs whose dtype is not the op's `dtypes` (ops.yaml says so in prose): index and condition roles.
_INPUT_ROLES = {"indices": "index", "target": "index", "condition": "condition"}
# Reductions that must not be empty (ops.yaml: "an empty reduction is an error"; argmax has no answer).
_NONEMPTY_PHRASE = "empty reduction is an error"


def _load_document() -> dict:
    path = os.environ.get("OAR_OPS_YAML")
    here = os.path.dirname(os.path.abspath(__file__))
    if not path:
        packaged = os.path.join(here, "ops.json")
        if os.path.isfile(packaged):
            with open(packaged, encoding="utf-8") as f:
                return json.load(f)
        for candidate in (os.path.join(here, "ops.yaml"),
                          os.path.join(os.path.dirname(os.path.dirname(here)), "interface", "ops.yaml")):
            if os.path.isfile(candidate):
                path = candidate
                break
        else:
            raise FileNotFoundError(f"the op set is missing: neither {packaged} nor ops.yaml was found "
                                    "(reinstall oar, or set OAR_OPS_YAML to interface/ops.yaml)")
    import yaml  # only for OAR_OPS_YAML or a source tree

    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


document: dict = _load_document()
_dtype_sets: dict = document.get("dtype_sets") or {}
_schemas: dict[str, dict] = {}
names: list[str] = []


def schema(name: str) -> dict:
    """The normalized schema of an op: kind, inputs [(name, role, optional)], attrs
    [(name, type, required, default)], dtypes, out_dtype, broadcast, semantics."""
    return _schemas[name]


def _dtype_names(op: str, spec: Any) -> list[str]:
    if isinstance(spec, str):
        if spec not in _dtype_sets:
            raise ValueError(f"ops.yaml: op {op}: unknown dtype set {spec!r}")
        return list(_dtype_sets[spec])
    return [str(d) for d in spec]


def _normalize(name: str, spec: dict) -> dict:
    inputs, variadic = [], False
    for raw in spec.get("inputs") or []:
        text = str(raw)
        optional = text.endswith("?")
        if text.endswith("..."):
            text, variadic = text[:-3], True
        text = text.rstrip("?")
        inputs.append((text, _INPUT_ROLES.get(text, "data"), optional))
    attrs = []
    for attr_name, attr in (spec.get("attrs") or {}).items():
        required = "default" not in attr
        attrs.append((attr_name, attr["type"], required, None if required else attr["default"]))
    return {
        "name": name,
        "kind": spec["kind"],
        "inputs": inputs,
        "variadic": variadic,
        "num_outputs": len(spec.get("outputs") or []),
        "output_names": [str(o).rstrip(".") for o in spec.get("outputs") or []],
        "attrs": attrs,
        "dtypes": _dtype_names(name, spec["dtypes"]),
        "out_dtype": str(spec["out_dtype"]),
        "broadcast": bool(spec.get("broadcast", False)),
        "nonempty_reduction": _NONEMPTY_PHRASE in str(spec.get("semantics", "")) or name == "argmax",
        "semantics": str(spec.get("semantics", "")),
        "backward": spec.get("backward"),
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


def _creation_function(name: str):
    def op(shape, *, dtype=None, device=None, **attrs):
        from oar.tensor import _shape_tuple, resolve

        plugin, dev = resolve(device)
        return _C._create(name, list(_shape_tuple(shape)), "float32" if dtype is None else dtype,
                          plugin, dev.index, attrs)

    return op


def _concat(tensors, dim: int = 0):
    return _C._concat(tensors, dim)


def _split(x, sizes, dim: int = 0):
    return _C._split(x, [int(s) for s in ([sizes] if isinstance(sizes, int) else sizes)], dim)


def _setitem(x, value, index):
    x[index] = value


_VIEW_FUNCTIONS = {"concat": _concat, "split": _split, "setitem": _setitem}


def _generate() -> None:
    namespace = globals()
    for name, spec in document["ops"].items():
        s = _normalize(name, spec)
        _schemas[name] = s
        function = _C._register_op(s)  # the C callable; creation and some view ops get Python wrappers
        if s["kind"] == "creation":
            function = _creation_function(name)
        elif name in _VIEW_FUNCTIONS:
            function = _VIEW_FUNCTIONS[name]
        function.__doc__ = _doc(s)
        function.__module__ = __name__
        if not isinstance(function, _C.OpFunction):
            function.__name__ = function.__qualname__ = name
        namespace[name] = function
        names.append(name)
    __all__.extend(names)


_generate()

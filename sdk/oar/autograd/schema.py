"""The op set of interface/ops.yaml, read once, as the autograd engine needs it.

The document is the one the op functions were generated from (``oar.ops.document``);
without the runtime it is read from ``OAR_OPS_YAML``, the package's ``ops.yaml`` or
the source tree's ``interface/ops.yaml``. Only the fields autograd uses are parsed:
input names (optional ``?``, list ``...``), output names, attrs with their
defaults and order, and the ``backward`` expressions.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpSpec", "Port", "ops_schema", "ops_yaml_path"]


@dataclass(frozen=True)
class Port:
    """One tensor input or output of an op."""
    name: str
    optional: bool = False
    variadic: bool = False

    @staticmethod
    def parse(text: str) -> "Port":
        text = str(text)
        if text.endswith("..."):
            return Port(text[:-3], variadic=True)
        if text.endswith("?"):
            return Port(text[:-1], optional=True)
        return Port(text)


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    attr_names: tuple[str, ...]
    attr_defaults: dict[str, Any] = field(hash=False, compare=False)
    backward: dict[str, str] | None = field(default=None, hash=False, compare=False)


_lock = threading.Lock()
_cache: dict[str, OpSpec] | None = None


def ops_yaml_path() -> str:
    """Where ops.yaml is read from: OAR_OPS_YAML, the installed package, or the source tree."""
    env = os.environ.get("OAR_OPS_YAML")
    if env:
        return env
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../oar
    candidates = [
        os.path.join(here, "ops.yaml"),
        os.path.join(here, "interface", "ops.yaml"),
        os.path.join(os.path.dirname(os.path.dirname(here)), "interface", "ops.yaml"),  # sdk/oar -> repo
    ]
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError("interface/ops.yaml not found (looked in: " + ", ".join(candidates) +
                            "); set OAR_OPS_YAML to its path")


def _parse(document: dict) -> dict[str, OpSpec]:
    specs: dict[str, OpSpec] = {}
    for name, body in (document.get("ops") or {}).items():
        attrs = body.get("attrs") or {}
        defaults = {an: a["default"] for an, a in attrs.items() if isinstance(a, dict) and "default" in a}
        backward = body.get("backward")
        if backward is not None:
            backward = {str(k): str(v) for k, v in backward.items()}
        specs[name] = OpSpec(
            name=name,
            kind=str(body.get("kind", "")),
            inputs=tuple(Port.parse(p) for p in body.get("inputs") or []),
            outputs=tuple(Port.parse(p) for p in body.get("outputs") or []),
            attr_names=tuple(attrs),
            attr_defaults=defaults,
            backward=backward,
        )
    return specs


def _document() -> dict:
    try:
        from oar import ops
        return ops.document
    except ImportError:
        import yaml
        with open(ops_yaml_path(), encoding="utf-8") as f:
            return yaml.safe_load(f)


def ops_schema() -> dict[str, OpSpec]:
    """op name -> OpSpec, parsed on first use."""
    global _cache
    if _cache is None:
        with _lock:
            if _cache is None:
                _cache = _parse(_document())
    return _cache

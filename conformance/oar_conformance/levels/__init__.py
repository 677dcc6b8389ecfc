"""The levels of the suite, each a plug-in module of this package.

A level module registers its tests with :func:`oar_conformance.registry.conformance_test`
when imported, and defines:

- ``DESCRIPTION``: one line for listings and reports;
- ``SESSION_KIND``: how its worker reaches the plugin: ``"raw"`` (the cffi
  binding, :class:`oar.vendor.abi.RawPlugin`, the library's entry points called
  directly), ``"runtime"`` (through ``oar``'s runtime) or ``"collectives"``
  (raw, plus the rank processes of a communicator). A worker process serves
  one kind (two would share the library's state);
- ``open_session(config)``: called once per worker, lazily, before its first
  test; returns an object with ``context(test)`` (the argument a test gets; it
  has ``close()``, run after the test whatever happened) and ``close()``;
- ``NOTE`` (optional): why the level has no tests, shown in every report;
- ``quick_ids(test_ids)`` (optional): the level's ``--quick`` sample of its test ids (else quick.txt);
- ``report_extras(results)`` (optional): level-specific report data built from
  the results' details in the parent process (the ops matrix, loss curves).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["LEVEL_NAMES", "load", "load_all", "parse_levels"]

LEVEL_NAMES = ("abi", "ops", "models", "collectives", "torch")
# run only when named (``--level onnx``): a scoreboard of an external suite, where failures are
# expected and reported per op rather than a gate every vendor must pass
OPT_IN_LEVELS = ("onnx",)
_ALL = LEVEL_NAMES + OPT_IN_LEVELS


def load(name: str) -> ModuleType:
    if name not in _ALL:
        raise ValueError(f"unknown level {name!r}; levels: {', '.join(_ALL)}")
    return importlib.import_module(f"oar_conformance.levels.{name}")


def load_all(names=LEVEL_NAMES) -> dict[str, ModuleType]:
    return {name: load(name) for name in names}


def parse_levels(text: str | None) -> list[str]:
    """``"abi,ops"`` -> ["abi", "ops"], in the suite's order; None or "all" -> every level but the
    opt-in ones, which run when named ("all,onnx" adds one)."""
    if text is None or text.strip() in ("", "all"):
        return list(LEVEL_NAMES)
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if "all" in wanted:
        wanted = [name for name in wanted if name != "all"] + list(LEVEL_NAMES)
    unknown = [name for name in wanted if name not in _ALL]
    if unknown:
        raise ValueError(f"unknown level(s) {', '.join(unknown)}; levels: {', '.join(_ALL)}")
    return [name for name in _ALL if name in wanted]

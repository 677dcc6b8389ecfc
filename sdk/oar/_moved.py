"""Names that left ``oar.*`` and still work there because published material used them."""

from __future__ import annotations

import importlib
import warnings

# old name -> (new module, the material that promised the old name)
MOVED = {
    "DeviceBuffer": ("oar.raw", "examples/demo.py"),
    "kernel_query": ("oar.raw", "examples/demo.py"),
    "kernel_launch": ("oar.raw", "examples/demo.py"),
}


def __getattr__(name: str):
    """``oar.<name>`` for a moved name: the object from its new module, with a DeprecationWarning."""
    moved = MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'oar' has no attribute {name!r}")
    module = moved[0]
    warnings.warn(f"oar.{name} moved to {module}.{name}; the old name will go", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), name)

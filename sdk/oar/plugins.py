"""Plugins that ship inside the oar package (the ``oar.plugins`` entry points of oar itself)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["refcpu_path", "opencl_path", "opencl_library"]

_PLUGINS = Path(__file__).resolve().parent / "_plugins"


def refcpu_path() -> str:
    """The CPU reference plugin bundled with oar (``oar/_plugins/liboar_refcpu.so``)."""
    return str(_PLUGINS / "liboar_refcpu.so")


def opencl_library() -> str | None:
    """``oar/_plugins/liboar_opencl.so`` if this installation built the OpenCL reference
    plugin (it needs OpenCL headers and an ICD loader at build time), else None."""
    path = _PLUGINS / "liboar_opencl.so"
    return str(path) if path.is_file() else None


def opencl_path() -> str | None:
    """The entry point of the OpenCL reference plugin: its path, or None (not offered,
    no warning) when it was not built or ``OAR_OPENCL_DISABLE=1``."""
    if os.environ.get("OAR_OPENCL_DISABLE", "") == "1":
        return None
    return opencl_library()

"""Plugins that ship inside the oar package (the ``oar.plugins`` entry points of oar itself)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["refcpu_path", "opencl_path", "opencl_library", "opencl_driver_registered"]

_PLUGINS = Path(__file__).resolve().parent / "_plugins"


def refcpu_path() -> str:
    """The CPU reference plugin bundled with oar (``oar/_plugins/liboar_refcpu.so``)."""
    return str(_PLUGINS / "liboar_refcpu.so")


def opencl_library() -> str | None:
    """``oar/_plugins/liboar_opencl.so`` if this installation built the OpenCL reference
    plugin (it needs OpenCL headers and an ICD loader at build time), else None."""
    path = _PLUGINS / "liboar_opencl.so"
    return str(path) if path.is_file() else None


def opencl_driver_registered() -> bool:
    """Whether the OpenCL ICD loader has a driver to offer: a ``*.icd`` file in
    ``OCL_ICD_VENDORS`` (default ``/etc/OpenCL/vendors``) or ``OCL_ICD_FILENAMES`` set."""
    if os.environ.get("OCL_ICD_FILENAMES"):
        return True
    vendors = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    if os.path.isfile(vendors):
        return True
    try:
        return any(name.endswith(".icd") for name in os.listdir(vendors))
    except OSError:
        return False


def opencl_path() -> str | None:
    """The entry point of the OpenCL reference plugin: its path, or None (not offered,
    no record, no warning) when it was not built, no OpenCL driver is registered, or
    ``OAR_OPENCL_DISABLE=1``. (A registered driver that finds no device is a failed
    plugin with the reason, as any other.)"""
    if os.environ.get("OAR_OPENCL_DISABLE", "") == "1" or not opencl_driver_registered():
        return None
    return opencl_library()

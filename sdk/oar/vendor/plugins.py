"""Plugins that ship inside the oar package (the ``oar.plugins`` entry points of oar itself)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["refcpu_path", "opencl_path", "opencl_library", "opencl_driver_registered", "cuda_path", "cuda_library"]

_PLUGINS = Path(__file__).resolve().parents[1] / "_plugins"  # oar/_plugins


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


def cuda_library() -> str | None:
    """``oar/_plugins/liboar_cuda.so`` if this installation built the CUDA reference plugin
    (it needs a CUDA toolkit at build time), else None."""
    path = _PLUGINS / "liboar_cuda.so"
    return str(path) if path.is_file() else None


def _nvidia_wheel_lib_dirs() -> list[str]:
    """The lib directories of installed nvidia-* wheels (nvidia-cuda-nvrtc, nvidia-cublas,
    nvidia-nccl-cu*) that hold a library the CUDA plugin opens."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    dirs = []
    for root in (spec.submodule_search_locations or []) if spec else []:
        for lib in sorted(Path(root).glob("*/lib")) + sorted(Path(root).glob("*/*/lib")):
            if any(any(lib.glob(pattern)) for pattern in ("libnvrtc.so*", "libcublas.so*", "libnccl.so*")):
                dirs.append(str(lib))
    return dirs


def cuda_path() -> str | None:
    """The entry point of the CUDA reference plugin: its path, or None (not offered, no
    record, no warning) when it was not built, no CUDA driver is installed
    (``libcuda.so.1`` does not load), or ``OAR_CUDA_DISABLE=1``. (A driver without a GPU
    is a failed plugin with the reason, as any other.) Points ``OAR_CUDA_LIB_DIRS`` at the
    nvidia-* wheels' libraries (NVRTC, cuBLAS, NCCL) when it is unset."""
    if os.environ.get("OAR_CUDA_DISABLE", "") == "1":
        return None
    path = cuda_library()
    if path is None:
        return None
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if "OAR_CUDA_LIB_DIRS" not in os.environ:
        dirs = _nvidia_wheel_lib_dirs()
        if dirs:
            os.environ["OAR_CUDA_LIB_DIRS"] = os.pathsep.join(dirs)
    return path

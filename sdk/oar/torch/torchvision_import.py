"""Import torchvision's model code where its C++ ops cannot load.

The torchvision wheel on PyPI for torch 2.13 (torchvision 0.28.0) is a CUDA build: its ``_C.so``
links libtorch_cuda, so against the CPU torch it does not load, and ``import torchvision`` then stops
in ``_meta_registrations`` (``register_fake("torchvision::nms")`` on an operator that was never
defined). The models (ResNet, MobileNet, ViT, ...) need none of those ops. ``import_torchvision()``
defines the two schemas that import registers fakes for, with kernels that raise a clear error, so
the package imports and only the detection ops (nms) are unavailable.

Because a broken ``import torchvision`` also breaks transformers (it imports torchvision whenever it
is installed), the project's Makefile installs torchvision apart from site-packages, in
``<venv>/oar-torchvision``; ``OAR_TORCHVISION_PATH`` names another such folder. A torchvision
importable the usual way is used first.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["import_torchvision", "torchvision_ops_loaded"]

# torchvision 0.28's _meta_registrations registers fakes for these two without checking _has_ops()
_UNGUARDED_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_placeholders: list[torch.library.Library] = []  # kept alive: dropping it removes the schemas
_ops_loaded: list[bool] = []


def torchvision_ops_loaded() -> bool:
    """Whether torchvision's own C++ ops loaded (False: the CUDA wheel on a CPU torch)."""
    import_torchvision()
    return _ops_loaded[0]


def _c_library(spec: importlib.machinery.ModuleSpec) -> Path | None:
    for folder in spec.submodule_search_locations or []:
        found = sorted(Path(folder).glob("_C*.so")) + sorted(Path(folder).glob("_C*.pyd"))
        if found:
            return found[0]
    return None


def _define_placeholders(reason: str) -> None:
    library = torch.library.Library("torchvision", "DEF")
    for name, schema in _UNGUARDED_SCHEMAS.items():
        library.define(schema)

        def unavailable(*args, _name=name, **kwargs):
            raise RuntimeError(f"torchvision::{_name} is unavailable: torchvision's C++ ops did not load "
                               f"against torch {torch.__version__} ({reason}); its models work, its "
                               "detection ops do not")

        library.impl(name, unavailable, "CompositeExplicitAutograd")
    _placeholders.append(library)


def _apart_folder() -> Path:
    return Path(os.environ.get("OAR_TORCHVISION_PATH") or Path(sys.prefix) / "oar-torchvision")


def _find_spec() -> importlib.machinery.ModuleSpec:
    spec = importlib.util.find_spec("torchvision")
    if spec is not None:
        return spec
    folder = _apart_folder()
    if (folder / "torchvision").is_dir():
        sys.path.append(str(folder))
        spec = importlib.util.find_spec("torchvision")
    if spec is None:
        raise ImportError(f"torchvision is not installed (neither importable nor in {folder}): pip install "
                          f"--no-deps --target {folder} 'torchvision==0.28.0' (the release built for torch 2.13; "
                          "`make install` does this)")
    return spec


def import_torchvision() -> ModuleType:
    """``import torchvision``, working around a torchvision build whose C++ ops cannot load."""
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    spec = _find_spec()
    if not _ops_loaded:
        library = _c_library(spec)
        try:
            if library is None:
                raise OSError("the package has no _C library")
            torch.ops.load_library(str(library))  # what torchvision.extension does; loading twice is a no-op
            _ops_loaded.append(True)
        except (OSError, ImportError) as error:
            _ops_loaded.append(False)
            _define_placeholders(f"{type(error).__name__}: {str(error).splitlines()[0]}")
    return importlib.import_module("torchvision")

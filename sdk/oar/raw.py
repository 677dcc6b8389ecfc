"""The raw device layer: device memory, library kernels and modules, under the tensors.

For demos, tests and tools that speak to a plugin almost directly (``examples/demo.py``); a
model uses tensors and ops instead. ``oar.raw.DeviceBuffer`` is a block of device memory;
``kernel_query`` / ``kernel_launch`` run the plugin's library kernels on ``TensorDesc``
descriptors with ``Attrs``; ``module_compile`` / ``module_load`` / ``launch`` compile, load and
run generated code through the plugin's modules.
"""

from __future__ import annotations

from oar.kernels import (
    Attrs,
    DataType,
    Kernel,
    TensorDesc,
    TypedAttr,
    kernel_launch,
    kernel_query,
    launch,
    module_compile,
    module_load,
)
from oar.memory import DeviceBuffer

__all__ = [
    "Attrs", "DataType", "DeviceBuffer", "Kernel", "TensorDesc", "TypedAttr", "kernel_launch", "kernel_query",
    "launch", "module_compile", "module_load",
]

"""oar.torch: any Oar device as a PyTorch device (PrivateUse1), and ``torch.compile(backend="oar")``.

``import oar.torch`` checks the torch version; ``oar.torch.register("npu")`` makes the plugin's
device type torch's device (see docs/user/pytorch.md).
"""

from __future__ import annotations

from oar.torch.version_check import SUPPORTED_TORCH, check_torch_version

check_torch_version()

from oar.torch.bridge_tensor import from_torch, to_torch  # noqa: E402
from oar.torch.compile_backend import explain  # noqa: E402
from oar.torch.cpu_fallback import fallback_stats, reset_fallback_stats  # noqa: E402
from oar.torch.registration import register, registered_device  # noqa: E402

__all__ = ["SUPPORTED_TORCH", "explain", "fallback_stats", "from_torch", "register", "registered_device",
           "reset_fallback_stats", "to_torch"]

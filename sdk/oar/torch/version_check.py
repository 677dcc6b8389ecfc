"""The torch releases the bridge supports: it uses PyTorch's Python PrivateUse1 backend, whose API
(torch._C._acc) is experimental and may change in any release."""

from __future__ import annotations

SUPPORTED_TORCH = ("2.13",)  # major.minor releases tested


def check_torch_version(version: str | None = None) -> None:
    """Raise ImportError naming the installed and the supported torch versions if they differ."""
    if version is None:
        try:
            import torch
        except ImportError as error:
            raise ImportError("oar.torch needs PyTorch: pip install 'torch==2.13.*'") from error
        version = torch.__version__
    release = ".".join(version.split("+")[0].split(".")[:2])
    if release not in SUPPORTED_TORCH:
        raise ImportError(f"oar.torch supports torch {', '.join(v + '.x' for v in SUPPORTED_TORCH)}, but torch "
                          f"{version} is installed (the Python PrivateUse1 backend API changes between releases)")

"""The fixture every oar.torch test uses: the CPU reference plugin registered as torch's PrivateUse1."""

import pytest


@pytest.fixture(scope="module")
def npu(dev):
    """The device type the CPU reference plugin gives torch (e.g. "refcpu"), registered once."""
    import oar.torch

    kind = dev.split(":")[0]
    oar.torch.register(kind)
    return kind

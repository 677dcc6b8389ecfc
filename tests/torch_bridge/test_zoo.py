"""Real models (torchvision ResNet-18, MobileNetV3-small, a 2-layer ViT; Hugging Face BERT; small
sizes, random init) take one training step on the CPU plugin through oar.torch and on torch's CPU
from the same weights and batch, in float64 (exact to rounding: 1e-10 forward and loss, 1e-8
gradients and AdamW updates) and in float32 (forward 1e-4, loss rel 1e-5, gradients and updates
1e-3, or 10x torch's own float32 error; see torch_zoo.problems). ResNet-50 and ViT-B/16 itself run in the
conformance level's full size, not here (CI time)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from oar_conformance.levels import torch_zoo  # noqa: E402


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "vit_b_16", "bert"])
def test_zoo_train_step_matches_cpu(npu, name, dtype):
    result = torch_zoo.compare_train_step(name, npu, "quick", dtype)
    assert torch_zoo.problems(name, result) == []
    assert set(result.fallback_ops) == set()  # every ATen op of the zoo runs as Oar ops


def test_torchvision_detection_ops_say_why_they_are_missing():
    from oar.torch.torchvision_import import import_torchvision, torchvision_ops_loaded

    import_torchvision()
    if torchvision_ops_loaded():
        pytest.skip("this torchvision's C++ ops load: nms is real")
    with pytest.raises(RuntimeError, match="torchvision::nms is unavailable"):
        torch.ops.torchvision.nms(torch.rand(3, 4), torch.rand(3), 0.5)

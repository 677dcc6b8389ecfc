"""Real PyTorch models (torchvision, Hugging Face transformers; random init, no downloads) and one
training step of each on a torch device, for the ``torch`` level, the bridge tests and the bench.

Each model has a quick size (CI: seconds on 2 cores) and a full size (the real architecture on small
inputs). Dropout is off so the device and the CPU draw no random numbers; batch norm trains on
batch statistics, so each batch holds at least two images.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["ZooModel", "ZOO", "SIZES", "StepResult", "forward_backward", "compare_train_step"]

SIZES = ("quick", "full")


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[str], Any]                 # size -> torch.nn.Module (random init)
    batch: Callable[[Any, str], tuple]          # (torch, size) -> (inputs, target), CPU tensors
    loss: Callable[[Any, Any, tuple, Any], Any]  # (torch, model, inputs, target) -> scalar loss
    tolerance: float                            # relative to the largest element of each compared tensor


def _no_dropout(model: Any) -> Any:
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _torchvision_models() -> Any:
    from oar.torch.torchvision_import import import_torchvision

    return import_torchvision().models


def _image_batch(side: dict[str, int], classes: int = 10) -> Callable[[Any, str], tuple]:
    def make(torch: Any, size: str) -> tuple:
        return (torch.randn(2, 3, side[size], side[size]),), torch.randint(0, classes, (2,))

    return make


def _classify(torch: Any, model: Any, inputs: tuple, target: Any) -> Any:
    return torch.nn.functional.cross_entropy(model(*inputs), target)


def _resnet18(size: str) -> Any:
    return _torchvision_models().resnet18(num_classes=10)


def _resnet50(size: str) -> Any:
    return _torchvision_models().resnet50(num_classes=10)


def _mobilenet_v3_small(size: str) -> Any:
    return _no_dropout(_torchvision_models().mobilenet_v3_small(num_classes=10))


def _vit(size: str) -> Any:
    import torch

    models = _torchvision_models()
    if size == "full":  # ViT-B/16 itself (12 layers, width 768) on 32x32 images: 4 patches
        model = _no_dropout(models.vit_b_16(image_size=32, num_classes=10))
    else:
        from torchvision.models.vision_transformer import VisionTransformer

        model = VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                                  num_classes=10)
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts the head at 0: logits all 0
    return model


_BERT_SIZES = {"quick": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128),
               "full": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)}


def _bert(size: str) -> Any:
    import transformers

    config = transformers.BertConfig(vocab_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, num_labels=3, **_BERT_SIZES[size])
    return transformers.BertForSequenceClassification(config)


def _bert_batch(torch: Any, size: str) -> tuple:
    return (torch.randint(0, 128, (2, 16)),), torch.randint(0, 3, (2,))


def _bert_loss(torch: Any, model: Any, inputs: tuple, target: Any) -> Any:
    return model(input_ids=inputs[0], labels=target).loss


ZOO: dict[str, ZooModel] = {
    model.name: model for model in [
        ZooModel("resnet18", _resnet18, _image_batch({"quick": 32, "full": 64}), _classify, 1e-3),
        ZooModel("resnet50", _resnet50, _image_batch({"quick": 32, "full": 64}), _classify, 1e-3),
        ZooModel("mobilenet_v3_small", _mobilenet_v3_small, _image_batch({"quick": 32, "full": 64}), _classify, 1e-3),
        ZooModel("vit_b_16", _vit, _image_batch({"quick": 32, "full": 32}), _classify, 1e-3),
        ZooModel("bert", _bert, _bert_batch, _bert_loss, 1e-3),
    ]
}


@dataclass
class StepResult:
    loss: float                      # on the device
    cpu_loss: float
    logits_error: float              # max |device - cpu| of the forward output / max |cpu|
    grad_errors: dict[str, float]    # parameter -> max |device - cpu| of its gradient / its gradient scale
    update_errors: dict[str, float]  # parameter -> max |device - cpu| of its AdamW update / max |cpu update|
    fallback_ops: dict[str, int]     # ATen op -> calls that ran on the CPU fallback (forward, backward, step)


# A gradient's scale is its largest element, but at least this share of the model's largest gradient
# element: some gradients are zero but for rounding (a bias before a batch norm, BERT's key bias).
GRADIENT_FLOOR = 1e-3


def _relative(got: Any, expected: Any, floor: float = 0.0) -> float:
    scale = max(expected.abs().max().item(), floor)
    return (got.detach().cpu() - expected.detach()).abs().max().item() / (scale if scale > 0 else 1.0)


def forward_backward(torch: Any, entry: ZooModel, model: Any, inputs: tuple, target: Any) -> tuple[Any, Any]:
    """Forward and backward; returns (forward output, loss)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        output = model(*inputs)
        output = output.logits if hasattr(output, "logits") else output
        loss = entry.loss(torch, model, inputs, target)
        loss.backward()
    return output, loss


def adamw_step(torch: Any, parameters: list) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.01).step()


def compare_train_step(name: str, device: str, size: str = "quick") -> StepResult:
    """One training step of a zoo model on ``device`` against torch's CPU from the same weights and
    batch: forward output, loss and gradients against the CPU model's; the AdamW update on the device
    against torch's CPU AdamW applied to the device's own gradients (so rounding noise in a gradient
    that is zero in exact arithmetic does not flip an update's sign)."""
    import torch

    import oar.torch

    if size not in SIZES:
        raise ValueError(f"zoo size {size!r}: expected one of {SIZES}")
    entry = ZOO[name]
    torch.manual_seed(0)
    cpu_model = entry.build(size).train()
    device_model = entry.build(size).train()
    device_model.load_state_dict(cpu_model.state_dict())
    device_model.to(device)
    inputs, target = entry.batch(torch, size)
    cpu_output, cpu_loss = forward_backward(torch, entry, cpu_model, inputs, target)
    oar.torch.reset_fallback_stats()
    device_output, device_loss = forward_backward(torch, entry, device_model,
                                                  tuple(x.to(device) for x in inputs), target.to(device))
    named = [(param, p_cpu, p_dev) for (param, p_cpu), p_dev in zip(cpu_model.named_parameters(),
                                                                     device_model.parameters())
             if p_cpu.grad is not None]
    floor = GRADIENT_FLOOR * max(p_cpu.grad.abs().max().item() for _, p_cpu, _ in named)
    grads = {param: _relative(p_dev.grad, p_cpu.grad, floor) for param, p_cpu, p_dev in named}
    before = [p_dev.detach().cpu().clone() for _, _, p_dev in named]
    reference = [torch.nn.Parameter(b.clone()) for b in before]
    for ref, (_, _, p_dev) in zip(reference, named):
        ref.grad = p_dev.grad.cpu()
    adamw_step(torch, reference)
    adamw_step(torch, [p_dev for _, _, p_dev in named])
    updates = {param: _relative(p_dev.detach().cpu() - start, ref.detach() - start)
               for (param, _, p_dev), start, ref in zip(named, before, reference)}
    return StepResult(device_loss.item(), cpu_loss.item(), _relative(device_output, cpu_output), grads, updates,
                      oar.torch.fallback_stats())

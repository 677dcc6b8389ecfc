"""Real PyTorch models (torchvision, Hugging Face transformers; random init, no downloads) and one
training step of each on a torch device, for the ``torch`` level, the bridge tests and the bench.

Each model has a quick size (CI: seconds on 2 cores) and a full size (ViT-B/16 itself, a wider BERT,
larger images). Dropout is off so the device and the CPU draw no random numbers. Batch norm trains
on batch statistics over few values, which makes float32 gradients ill-conditioned (a ReLU after it
flips on rounding), so their float32 gradients are reported and float64 judges them (on 32x32 images
ResNet's 1x1 last-stage maps make even float64 differ by 1e-8, hence 64x64). ResNet-50 runs at the
full size only.

Tolerances (``problems``, ``TOLERANCES``), each against the same step in float64 on the CPU: in float32
the device's error must be within the bound or within ``CPU_FACTOR`` times torch's own float32 CPU
error (forward output 1e-4 of its largest element, loss rel 1e-5, gradients 1e-3 of the model's
largest gradient, judged for the nets without batch norm; AdamW updates 1e-3); in float64 the device runs in float64 too and must match to
rounding (1e-10 output and loss, 1e-8 gradients and updates, each of its own scale).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["ZooModel", "ZOO", "SIZES", "StepResult", "forward_backward", "compare_train_step", "problems"]

SIZES = ("quick", "full")


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[str], Any]                 # size -> torch.nn.Module (random init)
    batch: Callable[[Any, str], tuple]          # (torch, size) -> (inputs, target), CPU tensors
    loss: Callable[[Any, Any, tuple, Any], Any]  # (torch, model, inputs, target) -> scalar loss
    # float32 gradients are judged (else reported only): a batch-norm net's ReLUs flip on rounding, so
    # its float32 gradients differ from float64 chaotically (torch's CPU's too); float64 judges them
    float32_gradients_judged: bool = True
    sizes: tuple[str, ...] = SIZES  # ResNet-50 has the full size only: its quick step took ~30 s of CI


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
        ZooModel("resnet18", _resnet18, _image_batch({"quick": 64, "full": 96}), _classify, False),
        ZooModel("resnet50", _resnet50, _image_batch({"full": 96}), _classify, False, ("full",)),
        ZooModel("mobilenet_v3_small", _mobilenet_v3_small, _image_batch({"quick": 64, "full": 96}), _classify, False),
        ZooModel("vit_b_16", _vit, _image_batch({"quick": 32, "full": 32}), _classify),
        ZooModel("bert", _bert, _bert_batch, _bert_loss),
    ]
}


@dataclass
class StepResult:
    loss: float                      # on the device
    cpu_loss: float                  # torch's CPU, float32
    exact_loss: float                # torch's CPU, float64 (the reference the errors are measured from)
    logits_error: float              # max |device - float64| of the forward output / max |float64|
    cpu_logits_error: float          # the same for torch's CPU in float32
    grad_errors: dict[str, float]    # parameter -> max |device - float64| of its gradient / its gradient scale
    cpu_grad_errors: dict[str, float]  # the same for torch's CPU in float32
    update_errors: dict[str, float]  # parameter -> max |device - cpu| of its AdamW update / max |cpu update|
    fallback_ops: dict[str, int]     # ATen op -> calls that ran on the CPU fallback (forward, backward, step)
    dtype: str = "float32"


# A gradient's scale: in float64 its largest element, but at least 1e-3 of the model's largest gradient
# element (some gradients are zero but for rounding: a bias before a batch norm, BERT's key bias); in
# float32 the model's largest gradient element (a ReLU after a batch norm over few values flips where
# an input is within rounding of 0, which moves single gradient elements of torch's CPU as well).
GRADIENT_FLOOR = {"float64": 1e-3, "float32": 1.0}


def _relative(got: Any, expected: Any, floor: float = 0.0) -> float:
    expected = expected.detach().double()
    scale = max(expected.abs().max().item(), floor)
    return (got.detach().cpu().double() - expected).abs().max().item() / (scale if scale > 0 else 1.0)


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


def compare_train_step(name: str, device: str, size: str = "quick", dtype: str = "float32") -> StepResult:
    """One training step of a zoo model on ``device`` and on torch's CPU from the same weights and
    batch. Forward output, loss and gradients are measured against the same step in float64 on the
    CPU, for the device and for torch's CPU in float32 alike (a batch-norm net's rounding error is
    large for both, so the device's is judged beside the CPU's). The AdamW update on the device is
    measured against torch's CPU AdamW applied to the device's own gradients (so rounding noise in a
    gradient that is zero in exact arithmetic does not flip an update's sign). In float64 the device
    and the reference share one dtype, so the check is exact to rounding: it finds a wrong mapping that
    float32's rounding would hide."""
    import copy

    import torch

    import oar.torch

    if size not in SIZES:
        raise ValueError(f"zoo size {size!r}: expected one of {SIZES}")
    entry = ZOO[name]
    if size not in entry.sizes:
        raise ValueError(f"zoo model {name} has no {size!r} size (it has: {', '.join(entry.sizes)})")
    torch.manual_seed(0)
    if dtype not in GRADIENT_FLOOR:
        raise ValueError(f"zoo dtype {dtype!r}: expected one of {sorted(GRADIENT_FLOOR)}")
    torch_dtype = getattr(torch, dtype)
    cpu_model = entry.build(size).train().to(torch_dtype)
    device_model = entry.build(size).train().to(torch_dtype)
    device_model.load_state_dict(cpu_model.state_dict())
    device_model.to(device)
    inputs, target = entry.batch(torch, size)
    inputs = tuple(x.to(torch_dtype) if x.is_floating_point() else x for x in inputs)
    cpu_output, cpu_loss = forward_backward(torch, entry, cpu_model, inputs, target)
    oar.torch.reset_fallback_stats()
    device_output, device_loss = forward_backward(torch, entry, device_model,
                                                  tuple(x.to(device) for x in inputs), target.to(device))
    exact_model = copy.deepcopy(cpu_model).double()
    exact_model.zero_grad(set_to_none=True)
    exact_output, exact_loss = forward_backward(
        torch, entry, exact_model, tuple(x.double() if x.is_floating_point() else x for x in inputs), target)
    named = [(param, p_exact, p_cpu, p_dev) for (param, p_exact), p_cpu, p_dev in
             zip(exact_model.named_parameters(), cpu_model.parameters(), device_model.parameters())
             if p_exact.grad is not None]
    floor = GRADIENT_FLOOR[dtype] * max(p.grad.abs().max().item() for _, p, _, _ in named)
    grads = {param: _relative(p_dev.grad, p_exact.grad, floor) for param, p_exact, _, p_dev in named}
    cpu_grads = {param: _relative(p_cpu.grad, p_exact.grad, floor) for param, p_exact, p_cpu, _ in named}
    named = [(param, p_cpu, p_dev) for param, _, p_cpu, p_dev in named]
    before = [p_dev.detach().cpu().clone() for _, _, p_dev in named]
    reference = [torch.nn.Parameter(b.clone()) for b in before]
    for ref, (_, _, p_dev) in zip(reference, named):
        ref.grad = p_dev.grad.cpu()
    adamw_step(torch, reference)
    adamw_step(torch, [p_dev for _, _, p_dev in named])
    updates = {param: _relative(p_dev.detach().cpu() - start, ref.detach() - start)
               for (param, _, p_dev), start, ref in zip(named, before, reference)}
    return StepResult(device_loss.item(), cpu_loss.item(), exact_loss.item(), _relative(device_output, exact_output),
                      _relative(cpu_output, exact_output), grads, cpu_grads, updates, oar.torch.fallback_stats(), dtype)


# (forward output, loss, gradients and AdamW updates), relative to their scales
TOLERANCES = {"float32": (1e-4, 1e-5, 1e-3, 1e-3), "float64": (1e-10, 1e-10, 1e-8, 1e-8)}
CPU_FACTOR = 10.0


def problems(name: str, result: StepResult) -> list[str]:
    """What in a compared training step is outside the tolerances (empty: it matches)."""
    output_tolerance, loss_tolerance, tolerance, update_tolerance = TOLERANCES[result.dtype]
    found = []
    if result.logits_error > max(output_tolerance, CPU_FACTOR * result.cpu_logits_error):
        found.append(f"forward output differs from float64 by {result.logits_error:.2e} of its largest element "
                     f"(torch's CPU: {result.cpu_logits_error:.2e})")
    loss_bound = max(loss_tolerance * abs(result.exact_loss), CPU_FACTOR * abs(result.cpu_loss - result.exact_loss))
    if abs(result.loss - result.exact_loss) > loss_bound:
        found.append(f"loss {result.loss} on the device, {result.cpu_loss} on the CPU, {result.exact_loss} in float64")
    if result.dtype == "float64" or ZOO[name].float32_gradients_judged:
        found += [f"gradient of {p} differs from float64 by {e:.2e} (torch's CPU: {result.cpu_grad_errors[p]:.2e})"
                  for p, e in result.grad_errors.items() if e > max(tolerance, CPU_FACTOR * result.cpu_grad_errors[p])]
    found += [f"AdamW update of {p} differs by {e:.2e}" for p, e in result.update_errors.items() if e > update_tolerance]
    return found

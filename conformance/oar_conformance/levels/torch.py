"""Level ``torch``: PyTorch on the device through oar.torch (the plugin's device type registered as
torch's PrivateUse1 device).

``torch.aten.<op>``: every ATen overload the bridge maps to an Oar op, on sample float32 inputs,
against torch's CPU (rtol 1e-5, atol 1e-5). It passes when the result matches and ran as the Oar
op, reports ``fallback`` when it matched through the CPU fallback, fails otherwise.

``torch.model.<name>``: a small model (an MLP; Hugging Face Llama from a small config, random init)
takes a training step on the device and on torch's CPU with the same weights: loss within rel 1e-5
and every gradient within 1e-4 of its largest element. The ATen ops that fell back are listed in
the result.

``torch.zoo.<model>`` / ``torch.zoo_full.<model>`` (``conformance run --size full`` runs the second instead
of the first): real models (torchvision ResNet-18, ResNet-50,
MobileNetV3-small, ViT-B/16; Hugging Face BERT; random init) take a training step (forward, backward,
AdamW) on the device and on torch's CPU from the same weights and batch, at the zoo's quick size and
at its full size (see torch_zoo for the sizes and tolerances). Each passes (all ops native), reports
``fallback`` naming the ATen ops that ran on the CPU, or fails naming what differs; the details
hold the errors and the fallback counts.

``--quick`` (quick.txt) runs one per-op check per op family (op_family), the MLP and two zoo models at the
quick size.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable

from oar_conformance.levels.runtime_session import RuntimeContext, open_session  # noqa: F401
from oar_conformance.registry import Failure, Fallback, Skip, conformance_test

DESCRIPTION = "PyTorch through oar.torch: mapped ATen ops against torch's CPU, small models' training steps"
SESSION_KIND = "runtime"

_SAMPLES: dict[str, Callable[[Any], tuple]] = {
    # ATen overload: sample (args) from a torch module; the elementwise rest get generated samples
    "mm.default": lambda t: (t.randn(3, 4), t.randn(4, 5)),
    "full.default": lambda t: ([3, 4], 1.5),
    "arange.start_step": lambda t: (2, 20, 3),  # integer ranges map to Oar's arange; float ones fall back
    "constant_pad_nd.default": lambda t: (t.randn(2, 3, 4), [1, 2, 0, 1], 0.5),
    "bmm.default": lambda t: (t.randn(2, 3, 4), t.randn(2, 4, 5)),
    "sum.dim_IntList": lambda t: (t.randn(3, 4), [1], True),
    "sum.default": lambda t: (t.randn(3, 4),),
    "mean.dim": lambda t: (t.randn(3, 4), [0]),
    "mean.default": lambda t: (t.randn(3, 4),),
    "amax.default": lambda t: (t.randn(3, 4), [1]),
    "amin.default": lambda t: (t.randn(3, 4), [1]),
    "argmax.default": lambda t: (t.randn(3, 4), 1),
    "var.correction": lambda t: (t.randn(3, 4), [1]),
    "_softmax.default": lambda t: (t.randn(3, 4), 1, False),
    "_log_softmax.default": lambda t: (t.randn(3, 4), 1, False),
    "clamp.default": lambda t: (t.randn(3, 4), -0.5, 0.5),
    "gelu.default": lambda t: (t.randn(3, 4),),
    "gelu_backward.default": lambda t: (t.randn(3, 4), t.randn(3, 4)),
    "embedding.default": lambda t: (t.randn(6, 4), t.tensor([[0, 5], [2, 2]])),
    "convolution.default": lambda t: (t.randn(1, 2, 5, 5), t.randn(3, 2, 3, 3), t.randn(3), [1, 1], [1, 1],
                                      [1, 1], False, [0, 0], 1),
    "cat.default": lambda t: ([t.randn(2, 3), t.randn(1, 3)], 0),
    "where.self": lambda t: (t.randn(3, 4) > 0, t.randn(3, 4), t.randn(3, 4)),
    "tril.default": lambda t: (t.randn(4, 4),),
    "triu.default": lambda t: (t.randn(4, 4), 1),
    "gather.default": lambda t: (t.randn(3, 4), 1, t.tensor([[0, 1], [2, 3], [1, 1]])),
    "index_select.default": lambda t: (t.randn(3, 4), 0, t.tensor([2, 0])),
    "addmm.default": lambda t: (t.randn(5), t.randn(3, 4), t.randn(4, 5)),
    "bitwise_and.Tensor": lambda t: (t.rand(3, 4) > 0.5, t.rand(3, 4) > 0.5),
    "bitwise_or.Tensor": lambda t: (t.rand(3, 4) > 0.5, t.rand(3, 4) > 0.5),
    "bitwise_not.default": lambda t: (t.rand(3, 4) > 0.5,),
    "scatter.value": lambda t: (t.randn(3, 4), 1, t.tensor([[0], [2], [1]]), 2.5),
    "_adaptive_avg_pool2d.default": lambda t: (t.randn(2, 3, 4, 4), [1, 1]),
    "_adaptive_avg_pool2d_backward.default": lambda t: (t.randn(2, 3, 1, 1), t.randn(2, 3, 4, 4)),
    "all.dim": lambda t: (t.rand(3, 4) > 0.2, 1),
    "all.dims": lambda t: (t.rand(3, 4) > 0.2, [0, 1], True),
    "any.dim": lambda t: (t.rand(3, 4) > 0.8, 1),
    "any.dims": lambda t: (t.rand(3, 4) > 0.8, [0, 1], True),
    "convolution_backward_overrideable.default": lambda t: (t.randn(1, 3, 5, 5), t.randn(1, 2, 5, 5), t.randn(3, 2, 3, 3),
                                                            [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]),
    "embedding_dense_backward.default": lambda t: (t.randn(2, 3, 4), t.tensor([[0, 5, 2], [2, 2, 1]]), 6, 2, False),
    "_log_softmax_backward_data.default": lambda t: (t.randn(3, 4), t.randn(3, 4).log_softmax(1), 1, t.float32),
    "_softmax_backward_data.default": lambda t: (t.randn(3, 4), t.randn(3, 4).softmax(1), 1, t.float32),
    "native_batch_norm.default": lambda t: (t.randn(2, 3, 4, 4), t.randn(3), t.randn(3), t.zeros(3), t.ones(3), True,
                                            0.1, 1e-5),
    "native_batch_norm_backward.default": lambda t: _batch_norm_backward_sample(t),
    "_native_batch_norm_legit.default": lambda t: (t.randn(2, 3, 4, 4), t.randn(3), t.randn(3), t.zeros(3), t.ones(3),
                                                   True, 0.1, 1e-5),
    "_native_batch_norm_legit.no_stats": lambda t: (t.randn(2, 3, 4, 4), t.randn(3), t.randn(3), True, 0.1, 1e-5),
    "native_layer_norm.default": lambda t: (t.randn(3, 4), [4], t.randn(4), t.randn(4), 1e-5),
    "native_layer_norm_backward.default": lambda t: _layer_norm_backward_sample(t),
    "nll_loss_forward.default": lambda t: (t.randn(3, 4).log_softmax(1), t.tensor([0, 3, -100]), None, 1, -100),
    "nll_loss_backward.default": lambda t: (t.tensor(1.5), t.randn(3, 4).log_softmax(1), t.tensor([0, 3, -100]), None, 1,
                                            -100, t.tensor(2.0)),
    "convolution_backward.default": lambda t: (t.randn(1, 3, 5, 5), t.randn(1, 2, 5, 5), t.randn(3, 2, 3, 3), [3],
                                               [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]),
    "index.Tensor": lambda t: (t.randn(4, 3), [t.tensor([3, 0, 1])]),
    "index_put.default": lambda t: (t.randn(4, 3), [t.tensor([0, 2])], t.randn(2, 3), False),
    "_index_put_impl.default": lambda t: (t.randn(4, 3), [t.tensor([0, 2, 0])], t.randn(3, 3), True, False),
    "max_pool2d_with_indices.default": lambda t: (t.randn(1, 2, 6, 6), [2, 2], [2, 2], [0, 0], [1, 1], False),
    "max_pool2d_with_indices_backward.default": lambda t: _max_pool_backward_sample(t),
    "_native_batch_norm_legit_functional.default": lambda t: (t.randn(2, 3, 4, 4), t.randn(3), t.randn(3), t.zeros(3),
                                                              t.ones(3), True, 0.1, 1e-5),
}


def _max_pool_backward_sample(t: Any) -> tuple:
    x = t.randn(1, 2, 6, 6)
    out, indices = t.ops.aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2], [0, 0], [1, 1], False)
    return t.randn_like(out), x, [2, 2], [2, 2], [0, 0], [1, 1], False, indices


def _convolution_backward_reference(grad, x, weight, *rest):
    import torch

    return torch.ops.aten.convolution_backward.default(grad, x, weight, [weight.shape[0]], *rest)


# ATen ops whose CPU kernel is not the reference: torch's CPU runs convolution_backward instead (its
# extra argument: the bias size)
_CPU_REFERENCE = {"convolution_backward_overrideable.default": _convolution_backward_reference}


def _batch_norm_backward_sample(t: Any) -> tuple:
    x = t.randn(2, 3, 4, 4)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    return (t.randn(2, 3, 4, 4), x, t.randn(3), t.zeros(3), t.ones(3), mean, (var + 1e-5).rsqrt(), True, 1e-5,
            [True, True, True])


def _layer_norm_backward_sample(t: Any) -> tuple:
    x = t.randn(3, 4)
    mean, var = x.mean(1, keepdim=True), x.var(1, unbiased=False, keepdim=True)
    return t.randn(3, 4), x, [4], mean, (var + 1e-5).rsqrt(), t.randn(4), t.randn(4), [True, True, True]


def _generated_sample(torch: Any, op: Any) -> tuple:
    args = []
    for argument in op._schema.arguments:
        if argument.kwarg_only:
            continue
        kind = str(argument.type)
        if kind == "Tensor" and op._schema.name.startswith("aten::logical_"):
            args.append(torch.rand(3, 4) > 0.5)  # the Oar logical ops are defined on bool
        elif kind == "Tensor":
            args.append(torch.rand(3, 4) + 0.5)  # positive: log, sqrt, pow and div stay real
        elif kind in ("Scalar", "number"):
            args.append(0.75)
        else:
            raise Skip(f"no sample for argument {argument.name}: {kind}")
    return tuple(args)


def sample_inputs(torch: Any, name: str) -> tuple:
    """The CPU sample arguments of ATen overload ``name`` ("add.Tensor"); Skip where none can be made."""
    base, overload = name.split(".")
    op = getattr(getattr(torch.ops.aten, base), overload)
    return _SAMPLES[name](torch) if name in _SAMPLES else _generated_sample(torch, op)


def _to(torch: Any, value: Any, device: str) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def _register_bridge(ctx: RuntimeContext) -> str:
    import oar.torch

    return oar.torch.register(ctx.device.split(":")[0])


def run_aten(ctx: RuntimeContext, name: str) -> None:
    import torch

    from torch.utils._pytree import tree_leaves

    import oar.torch
    from oar.torch.aten_table import mapped_ops

    device = _register_bridge(ctx)
    base, overload = name.split(".")
    op = getattr(getattr(torch.ops.aten, base), overload)
    torch.manual_seed(0)
    sample = sample_inputs(torch, name)
    reference = _CPU_REFERENCE.get(name, op)
    expected = reference(*_to(torch, sample, "cpu"))
    before = sum(oar.torch.fallback_stats().values())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # creation ops take no tensor: the device comes as a keyword
            creates = not any(isinstance(v, torch.Tensor) for v in tree_leaves(sample))
            got = op(*sample, device=device) if creates else op(*_to(torch, sample, device))
    except Exception as error:  # noqa: BLE001 -- any error is this op failing on the device
        raise Failure(f"{name} (Oar op {mapped_ops()[name].oar_op}) raised {type(error).__name__}: {error}") from error
    fell_back = sum(oar.torch.fallback_stats().values()) > before
    pairs = zip(got, expected) if isinstance(expected, (tuple, list)) else [(got, expected)]
    for value, reference in pairs:
        value = value.cpu() if isinstance(value, torch.Tensor) else value
        try:
            torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-5, check_dtype=True)
        except AssertionError as error:
            raise Failure(f"{name}: {error}") from error
    ctx.details["oar_op"] = mapped_ops()[name].oar_op
    if fell_back:
        raise Fallback(f"{name} matched torch's CPU through the CPU fallback")


def _mlp():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def _llama():
    import transformers

    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=32, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config)


def _loss(torch: Any, name: str, model: Any, device: str) -> Any:
    torch.manual_seed(1)
    if name == "mlp":
        x, target = torch.randn(5, 8), torch.randint(0, 4, (5,))
        return torch.nn.functional.cross_entropy(model(x.to(device)), target.to(device))
    ids = torch.randint(0, 128, (2, 16)).to(device)
    return model(ids, labels=ids).loss


_MODELS = {"mlp": _mlp, "llama": _llama}


def run_model(ctx: RuntimeContext, name: str) -> None:
    import torch

    import oar.torch

    device = _register_bridge(ctx)
    torch.manual_seed(0)
    cpu_model = _MODELS[name]()
    device_model = _MODELS[name]()
    device_model.load_state_dict(cpu_model.state_dict())
    device_model.to(device)
    oar.torch.reset_fallback_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _loss(torch, name, cpu_model, "cpu")
        got = _loss(torch, name, device_model, device)
        expected.backward()
        got.backward()
    ctx.details["fallback_ops"] = sorted(oar.torch.fallback_stats())
    if abs(got.item() - expected.item()) > 1e-5 * abs(expected.item()):
        raise Failure(f"{name}: loss {got.item()} on {device}, {expected.item()} on the CPU")
    for (param, p_cpu), p_dev in zip(cpu_model.named_parameters(), device_model.parameters()):
        error = (p_dev.grad.cpu() - p_cpu.grad).abs().max().item()
        if error > 1e-4 * p_cpu.grad.abs().max().item() + 1e-8:
            raise Failure(f"{name}: gradient of {param} differs by {error}")


def run_zoo(ctx: RuntimeContext, name: str, size: str) -> None:
    from oar_conformance.levels import torch_zoo

    device = _register_bridge(ctx)
    ctx.details["size"] = size
    found: list[str] = []
    for dtype in ("float64", "float32"):  # float64: exact to rounding; float32: what models train in
        result = torch_zoo.compare_train_step(name, device, size, dtype)
        ctx.details[dtype] = {"loss": result.loss, "cpu_loss": result.cpu_loss, "float64_loss": result.exact_loss,
                              "max_output_error": result.logits_error, "cpu_max_output_error": result.cpu_logits_error,
                              "max_gradient_error": max(result.grad_errors.values()),
                              "cpu_max_gradient_error": max(result.cpu_grad_errors.values()),
                              "max_update_error": max(result.update_errors.values())}
        found += [f"{dtype}: {problem}" for problem in torch_zoo.problems(name, result)]
    ctx.details["fallback_ops"] = result.fallback_ops
    if found:
        raise Failure(f"{name} ({size}): " + "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else ""))
    if result.fallback_ops:
        raise Fallback(f"{name} ({size}) matches torch's CPU; {len(result.fallback_ops)} ATen ops ran on the CPU "
                       f"fallback: {', '.join(sorted(result.fallback_ops))}")


_ZOO_PREFIXES = {"quick": "torch.zoo", "full": "torch.zoo_full"}  # --size: which of a zoo model's tests run

# op families (quick.txt samples one per-op check of each): a regular expression on the ATen name
# of the test id (first match wins; the rest are elementwise)
_FAMILIES = (
    ("backward", r".*_backward"),
    ("matmul", r"(mm|bmm|addmm)_"),
    ("convolution_pooling", r"(convolution|adaptive_avg_pool|max_pool)"),
    ("normalization", r"native_(batch|layer)_norm"),
    ("softmax_loss", r"(softmax|log_softmax|nll_loss)"),
    ("reduction", r"(sum|mean|amax|amin|argmax|var|all|any|max|min)_(default|dim|dims|correction|intlist)"),
    ("indexing", r"(gather|index|scatter|embedding|cat|where|tril|triu)_"),
    ("comparison_logical", r"(eq|ne|lt|le|gt|ge|isnan|isneginf|logical_\w+|bitwise_\w+)_"),
)
def op_family(test_id: str) -> str:
    """The op family of a ``torch.aten.*`` test id (quick.txt holds one per-op check of each)."""
    name = test_id[len("torch.aten."):] if test_id.startswith("torch.aten.") else test_id
    for family, pattern in _FAMILIES:
        if re.match(pattern, name):
            return family
    return "elementwise"


def sized_ids(test_ids: list[str], size: str) -> list[str]:
    """The tests a run at ``--size SIZE`` keeps: the zoo at that size, every other test."""
    if size not in _ZOO_PREFIXES:
        raise ValueError(f"unknown size {size!r}; sizes: {', '.join(_ZOO_PREFIXES)}")
    other = [prefix + "." for key, prefix in _ZOO_PREFIXES.items() if key != size]
    return [t for t in test_ids if not any(t.startswith(prefix) for prefix in other)]


# how a per-op check's status reads in the report's ATen-op table
_OP_OUTCOME = {"pass": "native", "fallback": "fallback", "fail": "fail", "error": "fail", "skip": "skip"}


def report_extras(results: list[dict]) -> dict:
    """The report's tables: one row per model (size, float32 forward error, training-step status, the
    ATen ops that fell back, named) and one per ATen op (native / fallback / fail), with the counts."""
    models, ops = [], []
    for result in results:
        details = result.get("details") or {}
        kind, _, name = result["id"][len("torch."):].partition(".")
        if kind == "aten":
            ops.append({"op": name, "oar_op": details.get("oar_op"), "status": result["status"],
                        "outcome": _OP_OUTCOME.get(result["status"], result["status"]),
                        "message": result.get("message", "")})
        elif kind in ("model", "zoo", "zoo_full"):
            float32 = details.get("float32") or {}
            models.append({"model": name, "size": details.get("size", "small"), "status": result["status"],
                           "forward_error": float32.get("max_output_error"),
                           "fallback_ops": sorted(details.get("fallback_ops") or []),
                           "message": result.get("message", "")})
    models.sort(key=lambda row: (not row["fallback_ops"], row["model"]))  # models with fallbacks first
    counts: dict[str, int] = {}
    for row in ops:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    return {"models": models, "ops": sorted(ops, key=lambda row: row["op"]), "op_counts": counts}


def _register() -> None:
    from oar.torch.aten_table import mapped_ops

    for name in sorted(mapped_ops()):
        def aten(ctx: RuntimeContext, name: str = name) -> None:
            run_aten(ctx, name)

        aten.__name__ = "aten_" + name.replace(".", "_")
        aten.__doc__ = f"ATen {name} on the device against torch's CPU."
        conformance_test("torch.aten." + name.replace(".", "_").lower().strip("_"))(aten)
    for model in _MODELS:
        def train(ctx: RuntimeContext, model: str = model) -> None:
            run_model(ctx, model)

        train.__name__ = f"model_{model}"
        train.__doc__ = f"{model}: a training step on the device against torch's CPU."
        conformance_test(f"torch.model.{model}")(train)
    from oar_conformance.levels.torch_zoo import ZOO

    for model in ZOO:
        for size, prefix in [(size, prefix) for size, prefix in _ZOO_PREFIXES.items() if size in ZOO[model].sizes]:
            def zoo(ctx: RuntimeContext, model: str = model, size: str = size) -> None:
                run_zoo(ctx, model, size)

            zoo.__name__ = f"zoo_{model}_{size}"
            zoo.__doc__ = f"{model} ({size} size): a training step on the device against torch's CPU."
            conformance_test(f"{prefix}.{model}")(zoo)


try:
    import torch as _torch  # noqa: F401 -- the level exists only where torch is installed
except ImportError:  # pragma: no cover
    NOTE = "torch is not installed: pip install 'torch==2.13.*' to run the torch level"
else:
    _register()

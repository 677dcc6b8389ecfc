"""Parallelising layers: shard_layer, the Linear / Embedding split styles and a plan helper.

    mesh = ProcessMesh([0, 1], dim_names=["tp"])
    parallelize_module(model, mesh, {
        "layers.*.attn.wq": ColwiseParallel(), "layers.*.attn.wo": RowwiseParallel(),
        "layers.*.mlp.w1": ColwiseParallel(),  "layers.*.mlp.w2": RowwiseParallel(),
    })

A sharded parameter stays an ``nn.Parameter`` (the optimizer sees this rank's shard); the module
records its mesh, placements and global shape, so ``distributed_state_dict(model)`` gives DTensors
for the checkpoint. The styles replace the layer's forward by the same computation on DTensors
(placements derived by :mod:`.propagation`) and hand plain local tensors in and out:

- ColwiseParallel: weight [out, in] Shard(0); input replicated, output sharded on its last dim
  (``gather_output=True``: all-gathered).
- RowwiseParallel: weight Shard(1); input sharded on its last dim (a ColwiseParallel's output), the
  Partial output all-reduced (the bias added once, after).
- VocabParallelEmbedding: weight [vocab, dim] Shard(0); a masked local lookup, all-reduced.
- vocab_parallel_cross_entropy(logits_local, target, mesh): loss of class-sharded logits.

On a 2-d mesh a style acts along ``mesh_dim`` (default: the last); the other dims are for data
parallelism (DistributedDataParallel over ``mesh.group("dp")``).
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Sequence

import oar
from oar import nn
from oar.distributed import propagation
from oar.distributed.dtensor import DTensor, from_local, reshard, shard_tensor
from oar.distributed.mesh import ProcessMesh
from oar.distributed.placement import Placement, Replicate, Shard

__all__ = ["shard_layer", "shard_parameter", "distributed_parameters", "distributed_state_dict",
           "ColwiseParallel", "RowwiseParallel", "VocabParallelEmbedding", "parallelize_module",
           "vocab_parallel_cross_entropy", "line_mesh"]

_SPECS = "_dist_params"  # module attribute: parameter name -> (mesh, placements, global shape)


def line_mesh(mesh: ProcessMesh, mesh_dim: int | str | None = None) -> ProcessMesh:
    """The 1-d mesh of this rank's line along ``mesh_dim`` (default: the last dim) of ``mesh``."""
    if mesh.ndim == 1 and mesh_dim in (None, 0, mesh.dim_names[0]):
        return mesh
    m = mesh.dim_index(mesh.ndim - 1 if mesh_dim is None else mesh_dim)
    mesh.require_member()
    index = list(mesh.coordinate)
    index[m] = slice(None)
    return ProcessMesh(mesh.ranks[tuple(index)].tolist(), dim_names=[mesh.dim_names[m]])


def shard_parameter(module: nn.Module, name: str, mesh: ProcessMesh, placements: Sequence[Placement]) -> DTensor:
    """Replace ``module.<name>`` by this rank's shard of it (still an nn.Parameter) and record its layout."""
    param = module._parameters.get(name)
    if param is None:
        raise ValueError(f"shard_parameter: {type(module).__name__} has no parameter {name!r}")
    dt = shard_tensor(param.detach(), mesh, placements)
    setattr(module, name, nn.Parameter(dt.to_local(), requires_grad=param.requires_grad))
    specs = module.__dict__.setdefault(_SPECS, {})
    specs[name] = (mesh, dt.placements, dt.shape)
    return _as_dtensor(module, name)


def _as_dtensor(module: nn.Module, name: str) -> DTensor:
    mesh, placements, shape = module.__dict__[_SPECS][name]
    return DTensor(getattr(module, name), mesh, placements, shape)


def distributed_parameters(module: nn.Module, prefix: str = "") -> dict[str, DTensor]:
    """Dotted name -> DTensor (sharing the parameter's memory) of every sharded parameter."""
    out = {}
    for module_name, sub in module.named_modules():
        for name in sub.__dict__.get(_SPECS, {}):
            out[prefix + (f"{module_name}.{name}" if module_name else name)] = _as_dtensor(sub, name)
    return out


def distributed_state_dict(module: nn.Module) -> dict[str, Any]:
    """module.state_dict() with a DTensor (sharing memory) for each sharded parameter: what
    oar.distributed.checkpoint saves and loads into. Plain tensors count as replicated."""
    state = module.state_dict()
    state.update(distributed_parameters(module))
    return state


def shard_layer(layer: nn.Module, mesh: ProcessMesh,
                shard_fn: Callable[[str, nn.Module, ProcessMesh], None] | None = None,
                input_fn: Callable[[tuple, ProcessMesh], tuple] | None = None,
                output_fn: Callable[[Any, ProcessMesh], Any] | None = None) -> nn.Module:
    """Paddle's shard_layer: ``shard_fn(name, sublayer, mesh)`` for every sublayer (it calls
    shard_parameter for the parameters to split); ``input_fn(inputs, mesh)`` and
    ``output_fn(outputs, mesh)`` wrap the layer's forward. Returns the layer (changed in place)."""
    if not isinstance(layer, nn.Module):
        raise TypeError(f"shard_layer: layer must be an oar.nn.Module, not {type(layer).__name__}")
    if not isinstance(mesh, ProcessMesh):
        raise TypeError(f"shard_layer: mesh must be a ProcessMesh, not {type(mesh).__name__}")
    if shard_fn is not None:
        for name, sub in list(layer.named_modules()):
            shard_fn(name, sub, mesh)
    if input_fn is not None or output_fn is not None:
        forward = layer.forward

        def wrapped(*args, **kwargs):
            if input_fn is not None:
                args = tuple(input_fn(args, mesh))
            out = forward(*args, **kwargs)
            return output_fn(out, mesh) if output_fn is not None else out

        object.__setattr__(layer, "forward", wrapped)
    return layer


def _linear(x: DTensor, weight: DTensor, bias: DTensor | None) -> DTensor:
    out = propagation.dispatch("matmul", (x, propagation.dispatch("transpose", (weight,), {"dim0": 0, "dim1": 1})),
                               {})
    return out if bias is None else out + bias


def _local(x: Any) -> Any:
    return x.to_local() if isinstance(x, DTensor) else x


class _Style:
    def __init__(self, mesh_dim: int | str | None = None):
        self.mesh_dim = mesh_dim

    def apply(self, module: nn.Module, mesh: ProcessMesh) -> None:
        raise NotImplementedError

    def _check(self, module: nn.Module, kind: type) -> None:
        if not isinstance(module, kind):
            raise TypeError(f"{type(self).__name__} splits an nn.{kind.__name__}, not {type(module).__name__}")


class ColwiseParallel(_Style):
    """Linear split by output features: weight Shard(0), bias Shard(0); output Shard(-1)."""

    def __init__(self, mesh_dim: int | str | None = None, gather_output: bool = False):
        super().__init__(mesh_dim)
        self.gather_output = gather_output

    def apply(self, module: nn.Module, mesh: ProcessMesh) -> None:
        self._check(module, nn.Linear)
        line = line_mesh(mesh, self.mesh_dim)
        shard_parameter(module, "weight", line, [Shard(0)])
        has_bias = module._parameters.get("bias") is not None
        if has_bias:
            shard_parameter(module, "bias", line, [Shard(0)])
        gather = self.gather_output

        def forward(x):
            xd = x if isinstance(x, DTensor) else from_local(x, line, [Replicate()])
            out = _linear(xd, _as_dtensor(module, "weight"), _as_dtensor(module, "bias") if has_bias else None)
            return (out.full_tensor() if gather else out.to_local())

        object.__setattr__(module, "forward", forward)


class RowwiseParallel(_Style):
    """Linear split by input features: weight Shard(1), bias replicated; input Shard(-1), output
    all-reduced (replicated)."""

    def apply(self, module: nn.Module, mesh: ProcessMesh) -> None:
        self._check(module, nn.Linear)
        line = line_mesh(mesh, self.mesh_dim)
        shard_parameter(module, "weight", line, [Shard(1)])
        has_bias = module._parameters.get("bias") is not None

        def forward(x):
            xd = x if isinstance(x, DTensor) else from_local(x, line, [Shard(-1)])
            out = _linear(xd, _as_dtensor(module, "weight"), None)
            out = reshard(out, line, [Replicate()]).to_local()
            return out + module.bias if has_bias else out

        object.__setattr__(module, "forward", forward)


class VocabParallelEmbedding(_Style):
    """Embedding split by rows (the vocabulary): weight Shard(0); output all-reduced (replicated)."""

    def apply(self, module: nn.Module, mesh: ProcessMesh) -> None:
        self._check(module, nn.Embedding)
        line = line_mesh(mesh, self.mesh_dim)
        shard_parameter(module, "weight", line, [Shard(0)])

        def forward(indices):
            idx = from_local(indices, line, [Replicate()])
            out = propagation.dispatch("embedding", (_as_dtensor(module, "weight"), idx), {})
            return reshard(out, line, [Replicate()]).to_local()

        object.__setattr__(module, "forward", forward)


def vocab_parallel_cross_entropy(logits: Any, target: Any, mesh: ProcessMesh, mesh_dim: int | str | None = None,
                                 reduction: str = "mean", ignore_index: int = -100) -> Any:
    """Cross entropy of logits [..., C] whose last dim is sharded over ``mesh_dim`` (this rank's local
    [..., C/n], e.g. a ColwiseParallel head's output) and replicated int targets [...]: the loss,
    replicated, without gathering the logits."""
    line = line_mesh(mesh, mesh_dim)
    local = _local(logits)
    classes = int(local.shape[-1])
    local2 = oar.reshape(local, shape=[-1, classes])
    target = oar.reshape(_local(target), shape=[-1])
    return propagation.vocab_parallel_cross_entropy_local(local2, target, line.group(0), reduction=reduction,
                                                          ignore_index=ignore_index) \
        if line.shape[0] > 1 else oar.cross_entropy(local2, target, reduction=reduction, ignore_index=ignore_index)


def parallelize_module(module: nn.Module, mesh: ProcessMesh, plan: dict[str, _Style]) -> nn.Module:
    """Apply each style of ``plan`` (a glob of dotted submodule names -> style) to the submodules it
    matches; a pattern that matches nothing is an error (a typo never leaves a layer unsplit)."""
    modules = dict(module.named_modules())
    for pattern, style in plan.items():
        if not isinstance(style, _Style):
            raise TypeError(f"parallelize_module: plan[{pattern!r}] is a {type(style).__name__}, not a "
                            f"ColwiseParallel / RowwiseParallel / VocabParallelEmbedding")
        matched = [name for name in modules if name and fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ValueError(f"parallelize_module: plan pattern {pattern!r} matches no submodule of "
                             f"{type(module).__name__}")
        for name in matched:
            style.apply(modules[name], mesh)
    return module

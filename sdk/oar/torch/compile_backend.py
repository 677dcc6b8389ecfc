"""torch.compile(model, backend="oar"): AOT autograd with core-ATen decompositions; each forward and
backward graph runs on the device through the bridge's kernels, fused by oar_codegen.

oar_codegen.compile traces the Oar launches a graph makes and replays them as fused kernels; graph
nodes without an Oar mapping run eagerly on the CPU fallback (each one splits the fused plan).
``explain()`` lists, per compiled graph, the nodes lowered to Oar ops and those that were not.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from oar.torch import bridge_tensor as _bt

__all__ = ["oar_backend", "explain", "GraphReport", "reset"]

_lock = threading.Lock()
_reports: list["GraphReport"] = []


@dataclass
class GraphReport:
    kind: str                                   # "forward" or "backward"
    lowered: Counter = field(default_factory=Counter)    # ATen op -> nodes run as Oar ops
    eager: Counter = field(default_factory=Counter)      # ATen op -> nodes on the CPU fallback
    fused: bool = False                         # whether oar_codegen replays the graph
    reason: str = ""                            # why not, when not
    stats: Any = None                           # oar_codegen's CompileStats (traces, replays, kernels)

    def __str__(self) -> str:
        lines = [f"{self.kind} graph: {sum(self.lowered.values())} nodes lowered to Oar ops, "
                 f"{sum(self.eager.values())} eager (CPU fallback); "
                 + ("fused by oar_codegen" if self.fused else f"not fused: {self.reason or 'pending first call'}")]
        if self.stats is not None:
            lines.append(f"  oar_codegen: {self.stats}")
        if self.eager:
            lines.append("  eager: " + ", ".join(f"{op} x{n}" for op, n in sorted(self.eager.items())))
        return "\n".join(lines)


def explain() -> str:
    """What the oar backend did with every graph compiled so far."""
    with _lock:
        return "\n".join(str(r) for r in _reports) or "no graph compiled by backend='oar' yet"


def reset() -> None:
    with _lock:
        _reports.clear()


def _classify(gm: torch.fx.GraphModule, report: GraphReport) -> None:
    from oar.torch.dispatch import native_ops

    native = set(native_ops())
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        name = f"{node.target._schema.name.removeprefix('aten::')}.{node.target._overloadname}"
        if name in native or node.target.is_view:
            report.lowered[name] += 1
        else:
            report.eager[name] += 1


def _graph_compiler(kind: str):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        import oar_codegen
        from torch._functorch.aot_autograd import make_boxed_func

        report = GraphReport(kind)
        _classify(gm, report)
        with _lock:
            _reports.append(report)

        def on_oar(*oar_inputs: Any) -> tuple:
            args = [_bt.wrap(t) if _is_oar(t) else t for t in oar_inputs]
            results = gm(*args)
            return tuple(_bt.unwrap(r) if _bt.is_bridged(r) else r for r in results)

        fused = oar_codegen.compile(on_oar)

        def run(*args: Any) -> Any:
            if report.reason:
                return gm(*args)
            try:
                oar_args = [_bt.unwrap(a) if _bt.is_bridged(a) else a for a in args]
                results = fused(*oar_args)
                report.fused = True
                return [_bt.wrap(r) if _is_oar(r) else r for r in results]
            except Exception as error:  # noqa: BLE001 -- the graph still runs, eagerly, and explain() says why
                report.reason = f"{type(error).__name__}: {error}"
                return gm(*args)

        report.stats = fused.stats
        return make_boxed_func(run)

    return compile_graph


def _is_oar(value: Any) -> bool:
    import oar

    return oar.is_tensor(value)


def oar_backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Any:
    """The torch.compile backend "oar" (torch_dynamo_backends entry point)."""
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(fw_compiler=_graph_compiler("forward"), bw_compiler=_graph_compiler("backward"),
                           decompositions=core_aten_decompositions())
    return backend(gm, example_inputs, **kwargs)


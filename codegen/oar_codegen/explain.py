"""``oar.compile.explain(fn, *args)``: what compiling fn would fuse, and why the rest is not."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable

from oar_codegen.fusion import EagerUnit, FusedUnit, plan_trace
from oar_codegen.trace import HOST_READ, Recorder, observing

__all__ = ["Explanation", "explain"]


@dataclass
class Explanation:
    """What compiling fn on these arguments gives: fused kernels, launches left to the plugin's
    kernels with why, host reads that split the plan, or why nothing compiles."""
    launches: int
    kernels: list[tuple[str, list[str]]] = field(default_factory=list)   # (kernel name, fused ops)
    eager: list[tuple[str, str]] = field(default_factory=list)           # (op, why)
    host_reads: int = 0
    reason: str = ""
    stats: Any = None   # fn's CompileStats when fn is a compiled function: its replays and guard misses so far

    def __str__(self) -> str:
        lines = [f"{self.launches} launches -> {len(self.kernels)} fused kernels, {len(self.eager)} plugin kernels, "
                 f"{self.host_reads} host reads (each splits the plan)"]
        if self.reason:
            lines.append(f"not compiled: {self.reason}")
        for name, ops in self.kernels:
            lines.append(f"  fused {name}: {' -> '.join(ops)}")
        reasons = collections.Counter(self.eager)
        for (op, why), count in reasons.most_common():
            lines.append(f"  eager {op} x{count}: {why}")
        if self.stats is not None:
            s = self.stats
            lines.append(f"calls so far: {s.traces} traced, {s.replays} replayed ({s.plan_replays} from a validated "
                         f"launch plan), {s.guard_misses} guard misses (each fell back and traced again)")
            for why, count in s.miss_reasons.most_common(5):
                lines.append(f"  guard miss x{count}: {why}")
        return "\n".join(lines)


def explain(fn: Callable, *args, **kwargs) -> Explanation:
    """Run fn(*args, **kwargs) once eagerly, traced, and say what compiling it would do."""
    target_fn = getattr(fn, "fn", fn)  # a CompiledFunction: the function it compiles
    recorder = Recorder()
    result = observing(recorder, target_fn, *args, **kwargs)
    trace = recorder.finish()  # while the result is held: what the caller keeps is written
    del result
    launches = [l for l in trace.launches if l.op != HOST_READ]
    result = Explanation(len(launches), host_reads=len(trace.launches) - len(launches),
                         stats=getattr(fn, "stats", None) if target_fn is not fn else None)
    if not trace.device:
        result.reason = "the call used several devices (or none)"
        return result
    plan = plan_trace(trace)
    for unit in plan.units:
        if isinstance(unit, FusedUnit):
            result.kernels.append((unit.kernel.name, [trace.launches[i].op for i in unit.members]))
        elif isinstance(unit, EagerUnit):
            result.eager.append((trace.launches[unit.launch].op, unit.reason))
    return result

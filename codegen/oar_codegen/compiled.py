"""``oar.compile(fn)``: a function of tensors that runs as fused kernels after its first call.

The first call with a new signature (shapes, dtypes and devices of the tensor
arguments, and the other arguments' values where they are not floats) runs
eagerly and is traced; the trace is planned and its kernels built. Later calls
with that signature replay: the Python function runs again (so Python state such as
an optimizer's step count stays live), each launch is matched against the
trace and held, and the plan runs when the function returns. A call that
launches something else runs eagerly and is traced again; a signature keeps
up to ``max_traces`` traces, and the function up to ``max_signatures``
signatures (least recently used first out). Whatever cannot be compiled runs
eagerly; :func:`explain` says why.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from oar import _C

from oar_codegen import executor
from oar_codegen.fusion import EagerUnit, FusedUnit, plan_trace
from oar_codegen.targets import target_for
from oar_codegen.trace import HOST_READ, Recorder, Trace, observing, signature_of

__all__ = ["CompiledFunction", "CompileStats", "compile", "explain", "Explanation"]


@dataclass
class CompileStats:
    traces: int = 0
    replays: int = 0
    eager_calls: int = 0        # calls that ran (partly) eagerly after a replay stopped matching
    kernels_built: int = 0
    cache_hits: int = 0
    compile_seconds: float = 0.0


@dataclass
class _Entry:
    trace: Trace
    executable: executor.Executable | None
    reason: str = ""            # why there is no executable
    misses: int = 0             # replays in a row that another trace of the signature took


def _tensor_key(value: Any) -> Any:
    if isinstance(value, _C.TensorBase):
        return ("tensor", tuple(value.shape), value.dtype.name, str(value.device), value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_tensor_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _tensor_key(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))))
    if isinstance(value, float):
        return "float"          # numbers become wrapped tensors: their values may change between calls
    if isinstance(value, (int, str, bool, type(None))):
        return value
    return ("object", id(value))


class _Replay:
    """The launch observer of a replaying call: matches launches against candidate traces, takes
    them, and runs each unit of the plan as soon as the launches it covers have all been seen (so
    the device works while Python goes on), once one candidate is left."""

    def __init__(self, entries: list[_Entry]):
        self.alive = [(entry, {}, {}) for entry in entries]
        self.seen: list[tuple] = []
        self.recorder: Recorder | None = None
        self.units_run = 0
        self.covered: set[int] = set()   # launches (positions in seen) whose unit has run
        self.replayed: _Entry | None = None

    def _bind(self, binding: dict, reverse: dict, launch, tensors) -> bool:
        for ref, t in zip(launch.inputs + launch.outputs, tensors):
            ptr = t._storage_ptr()
            have = binding.get(ref.slot)
            if have is not None:
                if have != ptr:
                    return False
                continue
            if not ref.wrapped:
                if ptr in reverse:
                    return False
                reverse[ptr] = ref.slot
            binding[ref.slot] = ptr
        return True

    def _match(self, signature: tuple, tensors: tuple) -> bool:
        position = len(self.seen) - 1
        survivors = []
        for entry, binding, reverse in self.alive:
            launches = entry.trace.launches
            if position < len(launches) and launches[position].signature == signature and \
                    self._bind(binding, reverse, launches[position], tensors):
                survivors.append((entry, binding, reverse))
        self.alive = survivors
        return bool(survivors)

    def _run_ready(self) -> None:
        """Run the units whose launches have all been seen (only once a single candidate is left)."""
        if len(self.alive) != 1 or self.alive[0][0].executable is None:
            return
        entry, binding, _ = self.alive[0]
        executable = entry.executable
        seen = len(self.seen)
        while self.units_run < len(executable.unit_last) and executable.unit_last[self.units_run] < seen:
            executable.run_units(self.units_run, self.units_run + 1, binding, self.seen)
            self.covered.update(executable.unit_launches[self.units_run])
            self.units_run += 1

    def _run_uncovered(self, upto: int) -> None:
        executor.run_eagerly([entry for i, entry in enumerate(self.seen[:upto]) if i not in self.covered])

    def _diverge(self, current_runs_itself: bool = True) -> None:
        """Stop replaying: run what was taken and not yet run, one launch at a time as it was made,
        and trace the rest of the call (current_runs_itself: the launch being observed is let
        through, not run here)."""
        self._run_uncovered(len(self.seen) - 1 if current_runs_itself else len(self.seen))
        recorder = Recorder()
        for op, ins, outs, attrs, fresh in self.seen:
            if op == HOST_READ:
                recorder.before_host_read(ins[0])
            else:
                recorder.add(op, ins, outs, attrs, fresh)
        self.recorder = recorder

    def __call__(self, op: str, inputs, outputs, attrs: dict, fresh: bool) -> bool:
        if self.recorder is not None:
            return self.recorder(op, inputs, outputs, attrs, fresh)
        self.seen.append((op, inputs, outputs, attrs, fresh))
        if self._match(signature_of(op, inputs, outputs, attrs, fresh), inputs + outputs):
            self._run_ready()
            return True
        self._diverge()
        return False

    def before_host_read(self, tensor) -> None:
        if self.recorder is not None:
            self.recorder.before_host_read(tensor)
            return
        self.seen.append((HOST_READ, (tensor,), (), {}, True))
        signature = (HOST_READ, (tensor.shape, tensor.strides, tensor.storage_offset(), tensor.dtype.name,
                                 tensor._wrapped_number))
        if not self._match(signature, (tensor,)) or self.alive[0][0].executable is None:
            self._diverge(current_runs_itself=False)
            return
        self.alive = self.alive[:1]   # the units before this barrier run now: commit to one plan
        self._run_ready()

    def abandon(self) -> None:
        """The function raised: run what was taken so the state is what eager execution leaves."""
        if self.recorder is None:
            self._run_uncovered(len(self.seen))

    def observable_now(self) -> set[int]:
        """Fresh slots (of the matched trace) that the caller still references."""
        entry, binding, _ = self.alive[0]
        by_ptr = {ptr: slot for slot, ptr in binding.items() if entry.trace.slot_kinds[slot] == "fresh"}
        holds: dict[int, int] = collections.Counter()
        sample: dict[int, Any] = {}
        for _, ins, outs, _, _ in self.seen:
            for t in ins + outs:
                slot = by_ptr.get(t._storage_ptr())
                if slot is not None:
                    holds[slot] += 1
                    sample.setdefault(slot, t)
        return {slot for slot, t in sample.items() if t._storage_use_count() > holds[slot]}

    def finish(self) -> str | Trace:
        """Run the rest of the plan, or say why not: returns "replayed", or a new trace."""
        if self.recorder is not None:
            return self.recorder.finish()
        self.alive = [c for c in self.alive if len(c[0].trace.launches) == len(self.seen)][:1]
        if self.alive and self.alive[0][0].executable is not None:
            entry, binding, _ = self.alive[0]
            unwritten = self.observable_now() - entry.executable.stored_slots()
            if unwritten and self.units_run:
                # Units ran before the call returned: values this call keeps (the trace did not)
                # were never written. Say so; the next call traces again.
                warnings.warn(f"oar.compile: this call kept {len(unwritten)} tensor(s) made inside the compiled "
                              "function that the traced call did not keep; their values were fused away and are "
                              "unspecified. Return them (or keep them on every call) so they are written.",
                              RuntimeWarning, stacklevel=3)
                entry.executable = None
            if not unwritten or self.units_run:
                self._run_ready()
                self.replayed = entry
                self.seen = []
                return "replayed"
        self._diverge(current_runs_itself=False)
        return self.recorder.finish()


class CompiledFunction:
    """fn compiled: call it like fn. ``stats`` counts traces, replays and builds."""

    def __init__(self, fn: Callable, max_traces: int = 4, max_signatures: int = 8):
        self.fn = fn
        self.max_traces = max_traces
        self.max_signatures = max_signatures
        self.stats = CompileStats()
        self._entries: collections.OrderedDict[Any, list[_Entry]] = collections.OrderedDict()
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)

    def _signature(self, args, kwargs) -> Any:
        return (_tensor_key(args), _tensor_key(kwargs))

    def _plan(self, trace: Trace) -> _Entry:
        if not trace.device:
            return _Entry(trace, None, "the call used several devices (or none)")
        started = time.perf_counter()
        from oar.devices import resolve
        plugin, dev = resolve(trace.device)
        target = target_for(plugin, dev.index)
        if target is None:
            return _Entry(trace, None, f"no codegen target compiles for {trace.device}")
        plan = plan_trace(trace)
        if not plan.fused:
            return _Entry(trace, None, "nothing in it fuses")
        try:
            built = executor.build(trace, plan, target)
        except Exception as error:  # the call already ran eagerly; later ones will too
            warnings.warn(f"oar.compile: building the kernels of {getattr(self.fn, '__qualname__', self.fn)} "
                          f"for {trace.device} failed, it runs eagerly: {error}", RuntimeWarning, stacklevel=3)
            return _Entry(trace, None, f"building its kernels failed: {error}")
        self.stats.compile_seconds += time.perf_counter() - started
        self.stats.kernels_built += sum(not k.cache_hit for k in built.kernels.values())
        self.stats.cache_hits += sum(k.cache_hit for k in built.kernels.values())
        return _Entry(trace, built)

    def _remember(self, signature: Any, entry: _Entry) -> None:
        entries = self._entries.setdefault(signature, [])
        entries.insert(0, entry)
        del entries[self.max_traces:]
        self._entries.move_to_end(signature)
        while len(self._entries) > self.max_signatures:
            self._entries.popitem(last=False)

    def _note_replayed(self, signature: Any, used: _Entry) -> None:
        """Traces another trace keeps winning over are dropped (an optimizer's first step, which
        made its state): with one candidate left, units run while the function still runs."""
        with self._lock:
            entries = self._entries.get(signature, [])
            for entry in entries:
                entry.misses = 0 if entry is used else entry.misses + 1
            entries[:] = [e for e in entries if e.misses < 2]

    def __call__(self, *args, **kwargs):
        if os.environ.get("OAR_COMPILE_DISABLE") == "1":
            return self.fn(*args, **kwargs)
        signature = self._signature(args, kwargs)
        with self._lock:
            entries = self._entries.get(signature)
            if entries:
                self._entries.move_to_end(signature)
        if not entries:
            recorder = Recorder()
            result = observing(recorder, self.fn, *args, **kwargs)
            trace = recorder.finish()
            self.stats.traces += 1
            entry = self._plan(trace)
            with self._lock:
                self._remember(signature, entry)
            return result
        replay = _Replay([e for e in entries if e.executable is not None] or entries[:1])
        try:
            result = observing(replay, self.fn, *args, **kwargs)
        except BaseException:
            replay.abandon()
            raise
        outcome = replay.finish()
        if outcome == "replayed":
            self.stats.replays += 1
            self._note_replayed(signature, replay.replayed)
        else:
            self.stats.eager_calls += 1
            self.stats.traces += 1
            entry = self._plan(outcome)
            with self._lock:
                self._remember(signature, entry)
        return result


def compile(fn: Callable | None = None, *, max_traces: int = 4, max_signatures: int = 8):  # noqa: A001
    """Compile a function of tensors (or an nn.Module: its forward) into fused kernels for the
    device it runs on. Usable as ``oar.compile(fn)`` or as a decorator ``@oar.compile``."""
    if fn is None:
        return lambda f: compile(f, max_traces=max_traces, max_signatures=max_signatures)
    from oar.nn import Module

    if isinstance(fn, Module):
        return CompiledModule(fn, max_traces=max_traces, max_signatures=max_signatures)
    return CompiledFunction(fn, max_traces=max_traces, max_signatures=max_signatures)


class CompiledModule:
    """A module whose forward runs compiled, and the backward that follows it (the next
    ``backward()`` on this thread after a forward with grad enabled); attributes (parameters(),
    train(), ...) are the module's."""

    def __init__(self, module, **options):
        self.__dict__["module"] = module
        self.__dict__["forward"] = CompiledFunction(module.forward, **options)
        self.__dict__["backward_compiler"] = _BackwardCompiler(**options)

    def __call__(self, *args, **kwargs):
        from oar.autograd import engine, is_grad_enabled

        result = self.forward(*args, **kwargs)
        if is_grad_enabled():
            compiler = self.__dict__["backward_compiler"]
            engine._backward_compiler = compiler
            compiler.armed.value = True
        return result

    def __getattr__(self, name: str):
        return getattr(self.__dict__["module"], name)


class _BackwardCompiler:
    """Runs autograd's backward as a compiled function (its launches replayed like any other)."""

    def __init__(self, **options):
        from oar.autograd import engine

        self.armed = threading.local()
        self.compiled = CompiledFunction(
            lambda pairs, retain_graph: engine.run_backward(pairs, retain_graph=retain_graph), **options)

    def wants(self, pairs) -> bool:
        return getattr(self.armed, "value", False)

    def run(self, pairs, retain_graph: bool) -> None:
        self.armed.value = False
        self.compiled(list(pairs), retain_graph)


@dataclass
class Explanation:
    """What compiling fn on these arguments gives: fused kernels, launches left to the plugin's
    kernels with why, host reads that split the plan, or why nothing compiles."""
    launches: int
    kernels: list[tuple[str, list[str]]] = field(default_factory=list)   # (kernel name, fused ops)
    eager: list[tuple[str, str]] = field(default_factory=list)           # (op, why)
    host_reads: int = 0
    reason: str = ""

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
        return "\n".join(lines)


def explain(fn: Callable, *args, **kwargs) -> Explanation:
    """Run fn(*args, **kwargs) once eagerly, traced, and say what compiling it would do."""
    target_fn = fn.fn if isinstance(fn, CompiledFunction) else fn
    recorder = Recorder()
    observing(recorder, target_fn, *args, **kwargs)
    trace = recorder.finish()
    launches = [l for l in trace.launches if l.op != HOST_READ]
    result = Explanation(len(launches), host_reads=len(trace.launches) - len(launches))
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

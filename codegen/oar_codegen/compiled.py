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

import oar
from oar import autograd

from oar_codegen import executor
from oar_codegen.fusion import plan_trace
from oar_codegen.plan_replay import LaunchPlan, PlanReplay
from oar_codegen.replay import Entry, Replay
from oar_codegen.targets import target_for
from oar_codegen.trace import Recorder, Trace, observing

__all__ = ["CompiledFunction", "CompiledModule", "CompileStats", "compile"]


@dataclass
class CompileStats:
    traces: int = 0
    replays: int = 0
    eager_calls: int = 0        # calls that ran (partly) eagerly after a replay stopped matching
    kernels_built: int = 0
    cache_hits: int = 0
    compile_seconds: float = 0.0
    plan_replays: int = 0       # of the replays, those run from a validated trace's launch plan
    guard_misses: int = 0       # calls that left a launch plan (they traced again)
    miss_reasons: collections.Counter = field(default_factory=collections.Counter, repr=False)


def _tensor_key(value: Any) -> Any:
    if oar.is_tensor(value):
        return ("tensor", tuple(value.shape), value.dtype.name, str(value.device), value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_tensor_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _tensor_key(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))))
    if isinstance(value, float):
        return "float"          # numbers become wrapped tensors: their values may change between calls
    if isinstance(value, (int, str, bool, type(None))):
        return value
    # Other objects by type: what they change in the launches, the replay's matching catches.
    return ("object", type(value).__module__, type(value).__qualname__)


class CompiledFunction:
    """fn compiled: call it like fn. ``stats`` counts traces, replays and builds."""

    def __init__(self, fn: Callable, max_traces: int = 4, max_signatures: int = 8):
        self.fn = fn
        self.max_traces = max_traces
        self.max_signatures = max_signatures
        self.stats = CompileStats()
        self._entries: collections.OrderedDict[Any, list[Entry]] = collections.OrderedDict()
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)

    def _signature(self, args, kwargs) -> Any:
        return (_tensor_key(args), _tensor_key(kwargs))

    def _plan(self, trace: Trace) -> Entry:
        if not trace.device:
            return Entry(trace, None, "the call used several devices (or none)")
        started = time.perf_counter()
        from oar.devices import resolve
        plugin, dev = resolve(trace.device)
        target = target_for(plugin, dev.index)
        if target is None:
            return Entry(trace, None, f"no codegen target compiles for {trace.device}")
        plan = plan_trace(trace)
        if not plan.fused:
            return Entry(trace, None, "nothing in it fuses")
        try:
            built = executor.build(trace, plan, target)
        except Exception as error:  # the call already ran eagerly; later ones will too
            warnings.warn(f"oar.compile: building the kernels of {getattr(self.fn, '__qualname__', self.fn)} "
                          f"for {trace.device} failed, it runs eagerly: {error}", RuntimeWarning, stacklevel=3)
            return Entry(trace, None, f"building its kernels failed: {error}")
        self.stats.compile_seconds += time.perf_counter() - started
        self.stats.kernels_built += sum(not k.cache_hit for k in built.kernels.values())
        self.stats.cache_hits += sum(k.cache_hit for k in built.kernels.values())
        return Entry(trace, built)

    def _remember(self, signature: Any, entry: Entry) -> None:
        entries = self._entries.setdefault(signature, [])
        entries.insert(0, entry)
        del entries[self.max_traces:]
        self._entries.move_to_end(signature)
        while len(self._entries) > self.max_signatures:
            self._entries.popitem(last=False)

    def _note_replayed(self, signature: Any, used: Entry) -> None:
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
        validated = next((e for e in entries if e.launch_plan is not None and e.executable is not None), None)
        if validated is not None:
            replay = PlanReplay(validated.launch_plan)
        else:
            replay = Replay([e for e in entries if e.executable is not None] or entries[:1])
        try:
            result = observing(replay, self.fn, *args, **kwargs)
        except BaseException:
            replay.abandon()
            raise
        outcome = replay.finish()
        if outcome == "replayed":
            self.stats.replays += 1
            if validated is not None:
                self.stats.plan_replays += 1
            else:
                self._note_replayed(signature, replay.replayed)
                if replay.replayed.executable is not None and replay.replayed.launch_plan is None:
                    replay.replayed.launch_plan = LaunchPlan(replay.replayed)   # validated: later calls use it
        else:
            if validated is not None:
                self.stats.guard_misses += 1
                self.stats.miss_reasons[replay.miss] += 1
                validated.launch_plan = None   # the next call matches among all traces again
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
        result = self.forward(*args, **kwargs)
        if autograd.is_grad_enabled():
            compiler = self.__dict__["backward_compiler"]
            autograd.set_backward_compiler(compiler)
            compiler.armed.value = True
        return result

    def __getattr__(self, name: str):
        return getattr(self.__dict__["module"], name)


class _BackwardCompiler:
    """Runs autograd's backward as a compiled function (its launches replayed like any other)."""

    def __init__(self, **options):
        self.armed = threading.local()
        self.compiled = CompiledFunction(
            lambda roots, retain_graph, backward_pass: backward_pass(roots, retain_graph=retain_graph), **options)

    def wants(self, roots) -> bool:
        return getattr(self.armed, "value", False)

    def run(self, roots, retain_graph: bool, backward_pass) -> None:
        self.armed.value = False
        self.compiled(list(roots), retain_graph, backward_pass)

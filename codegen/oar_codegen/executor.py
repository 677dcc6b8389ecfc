"""A planned trace made runnable: fused kernels built (through the kernel cache) and loaded, then
run against the storages of a replayed call."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import oar
from oar import capture, profiler
from oar.devices import resolve
from oar.streams import current_stream

from oar_codegen import kernel_cache
from oar_codegen.fusion import EagerUnit, FusedUnit, Plan
from oar_codegen.render import model_of
from oar_codegen.targets import CompileRequest, Target, device_properties
from oar_codegen.trace import HOST_READ, Trace

__all__ = ["BuiltKernel", "Executable", "build", "run_eagerly"]


@dataclass
class BuiltKernel:
    name: str
    source: str
    launches: list[tuple]     # (a loaded module's function, grid, block) in order: the stages of the kernel
    buffer_slots: list[int]
    cache_hit: bool
    build_seconds: float
    scratch: object = None    # a device tensor the stages pass values through (sums over all rows)


@dataclass
class Executable:
    trace: Trace
    plan: Plan
    target: Target
    kernels: dict[int, BuiltKernel]   # unit index -> kernel
    device: str
    unit_last: list[int] = field(default_factory=list)        # unit -> its last launch (it runs after it)
    unit_launches: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.unit_launches = [list(u.members) if isinstance(u, FusedUnit) else [u.launch] for u in self.plan.units]
        self.unit_last = [max(members) for members in self.unit_launches]

    def stored_slots(self) -> set[int]:
        """The fresh slots whose final values some unit writes to memory."""
        written = set()
        for i, unit in enumerate(self.plan.units):
            if isinstance(unit, FusedUnit):
                written.update(unit.kernel.buffer_slots[s.buffer] for s in unit.kernel.stores)
            else:
                written.update(ref.slot for ref in self.trace.launches[unit.launch].outputs)
        return written

    def run_units(self, begin: int, end: int, binding, seen: list, stream=None, eager_ran: bool = False) -> None:
        """Run units [begin, end) of the plan: fused kernels on the bound storages (binding: slot ->
        storage address), the rest as the launches the replay took (eager_ran: those already ran,
        let through); on ``stream`` (default: the current stream of the plan's device). While this
        thread's profiler records, each launch is recorded (fused kernels by their function names,
        with the operands of the launches they fuse)."""
        stream = stream or launch_stream(self)
        profiled = profiler.records_this_thread()
        for i in range(begin, end):
            unit = self.plan.units[i]
            if isinstance(unit, EagerUnit):
                if eager_ran:
                    continue
                op, ins, outs, attrs = seen[unit.launch][:4]
                if profiled:
                    profiler.record_launch(op, self.device, lambda: capture.launch_now(op, ins, outs, attrs), ins, outs)
                else:
                    capture.launch_now(op, ins, outs, attrs)
                continue
            kernel = self.kernels[i]
            args = [("device_ptr", binding[slot]) for slot in kernel.buffer_slots]
            if kernel.scratch is not None:
                args.append(("device_ptr", capture.storage_address(kernel.scratch)))
            for function, grid, block in kernel.launches:
                if profiled:
                    first, last = seen[min(self.unit_launches[i])], seen[self.unit_last[i]]
                    profiler.record_launch(function.name, self.device,
                                           lambda: function.module.plugin.launch(stream, function, grid, block,
                                                                                 args, 0),
                                           first[1], last[2])
                else:
                    function.module.plugin.launch(stream, function, grid, block, args, 0)


def launch_stream(executable: Executable):
    """The plugin stream handle a plan's kernels go to: the current stream of its device."""
    return current_stream(executable.device)._c


def run_eagerly(seen: list) -> None:
    """Run taken launches one by one as they were made (a replay that stopped matching)."""
    for entry in seen:
        op, ins, outs, attrs = entry[:4]
        if op != HOST_READ:
            capture.launch_now(op, ins, outs, attrs)


def build(trace: Trace, plan: Plan, target: Target, cache: kernel_cache.KernelCache | None = None) -> Executable:
    """Render, compile (or fetch from the kernel cache) and load every fused kernel of a plan."""
    plugin, dev = resolve(trace.device)
    properties = device_properties(plugin, dev.index)
    cache = cache or kernel_cache.default_cache()
    identity = f"{plugin.device_type}:{plugin.version}:{properties.get('name')}:{properties.get('driver_version')}"
    kernels: dict[int, BuiltKernel] = {}
    modules: dict[str, object] = {}
    for i, unit in enumerate(plan.units):
        if not isinstance(unit, FusedUnit):
            continue
        spec = unit.kernel
        model = model_of(spec, spec.name)
        grid, block = target.geometry(model, properties)
        model.points = grid * block
        source = target.render(model)
        key = kernel_cache.CacheKey(
            source=source, target=target.name, lang=target.lang, compiler_identity=identity,
            flags=target.options, abi_version=str(plugin.abi_version),
            device_properties=tuple((k, str(properties.get(k))) for k in target.key_properties))
        started = time.perf_counter()
        binary, hit = cache.get_or_build(key, lambda: target.build(CompileRequest(source, target, plugin, dev.index)))
        digest = key.digest()
        module = modules.get(digest)
        if module is None:
            module = modules[digest] = plugin.module_load(dev.index, bytes(binary))
        launches = [(module.get_function(spec.name + stage), grid if not stage else 1, block if not stage else 1)
                    for stage in model.stages]
        scratch = None
        if model.scratch_floats:  # what the first stage leaves the second (sums over all rows, column sums)
            scratch = oar.empty([model.scratch_floats], dtype=oar.float32, device=trace.device)
        kernels[i] = BuiltKernel(spec.name, source, launches, list(spec.buffer_slots), hit,
                                 time.perf_counter() - started, scratch)
    return Executable(trace, plan, target, kernels, trace.device)

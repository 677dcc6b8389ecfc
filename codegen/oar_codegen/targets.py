"""Codegen targets: templates, a compile hook and launch-geometry rules per kernel language.

Built in: "c" (the CPU reference plugin's module lang), "opencl" and "cuda".
A vendor registers a target from their own package under the entry-point group
``oar.codegen_targets``; the entry point names a :class:`Target` or a function
returning one. Vendor targets are tried before the built-in ones; the first
whose lang the device's plugin compiles is used (``OAR_CODEGEN_TARGET`` names
one explicitly).
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable

import jinja2

from oar_codegen.render import KernelModel

__all__ = ["Target", "CompileRequest", "builtin_targets", "device_properties", "registered_targets", "register_target",
           "target_for", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "oar.codegen_targets"
_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


@dataclass(frozen=True)
class CompileRequest:
    """What a compile hook gets: the rendered source, the target, and the device to build for."""
    source: str
    target: "Target"
    plugin: Any        # the device's plugin (oar.devices.resolve)
    device: int        # the plugin's device index

    def compile_with_plugin(self) -> bytes:
        """The default compile: the plugin's module_compile for the target's lang."""
        return self.plugin.module_compile(self.device, self.target.lang, self.source, self.target.options or None)


Geometry = Callable[[KernelModel, dict], tuple[int, int]]


def _work_units(model: KernelModel) -> int:
    if model.kind == "flat":
        return max(1, math.ceil(model.cols / 16384))
    if model.kind == "col":
        return max(1, math.ceil(model.cols / 256))
    return max(1, model.rows)


def host_vector_floats() -> int:
    """float32 lanes of the host's widest vector registers, from the CPU flags the kernel reports
    (cpuid): 16 with AVX-512F, else 8 (AVX2, and what -march=native gives elsewhere)."""
    return 16 if "avx512f" in _cpu_flags() else 8


def host_options() -> str:
    """The C target's compile options for this host: -march=native (the plugin's default) picks the
    ISA from cpuid; on AVX-512 hosts GCC and clang still prefer 256-bit vectors unless told."""
    options = "-fno-math-errno"  # sqrtf inline and vectorizable; NaN and Inf are untouched (errno only)
    if host_vector_floats() == 16:
        options += " -mprefer-vector-width=512"
    return options


def host_geometry(model: KernelModel, properties: dict) -> tuple[int, int]:
    """CPU: grid points of at least 16 Ki elements each (a pool task costs microseconds), at most
    256, each a contiguous range of rows (or columns). Row reductions keep a vector register's
    worth of lanes (model.lanes)."""
    model.lanes = host_vector_floats()
    by_size = max(1, math.ceil(model.rows * model.cols / 16384))
    return min(_work_units(model), by_size, 256), 1


# Rows shorter than this keep one thread per row: a work-group's barriers would cost more than they share.
GROUP_MIN_COLUMNS = 64
# Threads per work-group for a row, at most; below the device's limit, enough for loads to coalesce.
GROUP_MAX_THREADS = 256
# When the device does not report max_threads_per_block: a size every OpenCL/CUDA device allows.
GROUP_FALLBACK_THREADS = 128


# CPU OpenCL devices (PoCL, Intel's and AMD's CPU runtimes) report the CPUID vendor string or a
# PoCL CPU driver's name prefix; the runtime exposes no CL_DEVICE_TYPE.
_CPU_VENDORS = ("GenuineIntel", "AuthenticAMD", "HygonGenuine", "CentaurHauls")
_CPU_NAME_PREFIXES = ("pthread-", "cpu-", "basic-", "tbb-")


def is_cpu_device(properties: dict) -> bool:
    """Whether an OpenCL/CUDA-language device is a CPU: there a work-group's barriers are loops
    over its work-items (PoCL measured 4x slower with a work-group per row), so one thread per row wins."""
    return (str(properties.get("vendor", "")) in _CPU_VENDORS
            or str(properties.get("name", "")).startswith(_CPU_NAME_PREFIXES))


def row_group_size(model: KernelModel, properties: dict) -> int:
    """Threads of one work-group that share a row (a power of two), or 1 for one thread per row:
    row kernels of one stage whose rows are long enough, on devices that are not CPUs. Capped by
    the device's max_threads_per_block and by the row's length."""
    if model.kind != "row" or model.stages != [""] or model.colsums or model.prologue:
        return 1
    if is_cpu_device(properties):
        return 1
    if model.cols < GROUP_MIN_COLUMNS:
        return 1
    try:
        limit = int(properties.get("max_threads_per_block") or GROUP_FALLBACK_THREADS)
    except (TypeError, ValueError):
        limit = GROUP_FALLBACK_THREADS
    wanted = min(limit, GROUP_MAX_THREADS, model.cols)
    return 1 << (max(wanted, 1).bit_length() - 1)


def gpu_group_geometry(model: KernelModel, properties: dict) -> tuple[int, int]:
    """GPU with work-group rows (the built-in opencl and cuda targets, whose templates define
    OAR_SHARED, OAR_GROUP_ID, OAR_GROUPS, OAR_LANE and OAR_BARRIER): a work-group per row for row
    kernels with long rows (row_group_size; it sets model.group_size), else as gpu_geometry."""
    group = row_group_size(model, properties)
    if group > 1:
        model.group_size = group
        return min(model.rows, 1 << 20), group
    return gpu_geometry(model, properties)


# On a CPU OpenCL device each work-item of a flat kernel takes a range of about this many elements:
# PoCL ran silu*mul over 720 Ki floats in 7.5-14 ms with a work-item per element, 0.6-0.7 ms so.
CPU_FLAT_ELEMENTS_PER_ITEM = 256


def gpu_geometry(model: KernelModel, properties: dict) -> tuple[int, int]:
    """GPU: one thread per element (flat kernels, up to 4 Mi threads; on a CPU device a range of
    CPU_FLAT_ELEMENTS_PER_ITEM elements each), per column (col) or per row (row); blocks of 128 threads."""
    model.group_size = 1
    if model.kind == "flat" and is_cpu_device(properties):
        threads = min(math.ceil(model.cols / CPU_FLAT_ELEMENTS_PER_ITEM), 1 << 12)
    elif model.kind == "flat":
        threads = min(model.cols, 1 << 22)
    else:
        threads = model.cols if model.kind == "col" else model.rows
    block = min(128, max(threads, 1))
    return math.ceil(max(threads, 1) / block), block


@dataclass(frozen=True)
class Target:
    """A kernel language Oar generates: name, the module lang given to module_compile, the
    templates (a loader that serves "kernel.j2"; the shared "common/" templates are added), the
    compile hook (default: the plugin's module_compile), the launch geometry, compile options,
    and the device properties that change the binary (they go into the cache key)."""
    name: str
    lang: str
    templates: jinja2.BaseLoader
    geometry: Geometry = host_geometry
    compile: Callable[[CompileRequest], bytes] | None = None
    options: str = ""
    key_properties: tuple[str, ...] = ("name", "vendor", "driver_version")
    _environment: list = field(default_factory=list, compare=False, repr=False)

    def environment(self) -> jinja2.Environment:
        if not self._environment:
            loader = jinja2.ChoiceLoader([self.templates, jinja2.FileSystemLoader(_HERE)])
            self._environment.append(jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                                                        keep_trailing_newline=True, autoescape=False))
        return self._environment[0]

    def render(self, model: KernelModel) -> str:
        return self.environment().get_template("kernel.j2").render(k=model)

    def build(self, request: CompileRequest) -> bytes:
        return (self.compile or CompileRequest.compile_with_plugin)(request)


def _cpu_flags() -> set[str]:
    """The host CPU's feature flags (Linux /proc/cpuinfo; empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_identity() -> str:
    """The host CPU's model and flags, hashed: -march=native binaries run on the same kind only."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features"))][:2]
    except OSError:
        lines = []
    return platform.machine() + ":" + hashlib.sha256("".join(lines).encode()).hexdigest()[:16]


def device_properties(plugin: Any, device: int) -> dict:
    """The device's properties as the plugin reports them, plus "host_cpu" (for -march=native)."""
    properties = dict(plugin.get_properties(device))
    properties["host_cpu"] = _cpu_identity()
    return properties


def builtin_targets() -> list[Target]:
    def loader(name: str) -> jinja2.BaseLoader:
        return jinja2.FileSystemLoader(os.path.join(_HERE, name))
    return [
        Target("c", "c", loader("c"), host_geometry, options=host_options(),
               key_properties=("name", "vendor", "driver_version", "host_cpu")),
        Target("opencl", "opencl", loader("opencl"), gpu_group_geometry),
        Target("cuda", "cuda", loader("cuda"), gpu_group_geometry),
    ]


_lock = threading.Lock()
_registered: list[Target] | None = None
_chosen: dict[tuple, Target | None] = {}


def registered_targets() -> list[Target]:
    """Vendor targets (entry points of oar.codegen_targets), then the built-in ones."""
    global _registered
    with _lock:
        if _registered is None:
            found: list[Target] = []
            for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
                try:
                    value = entry.load()
                    target = value() if callable(value) and not isinstance(value, Target) else value
                    if not isinstance(target, Target):
                        raise TypeError(f"it gave a {type(target).__name__}, not an oar_codegen.Target")
                    found.append(target)
                except Exception as error:  # a broken vendor package must not break compilation
                    warnings.warn(f"codegen target entry point {entry.name!r} ({entry.value}) was skipped: {error}",
                                  RuntimeWarning, stacklevel=2)
            _registered = found + builtin_targets()
        return list(_registered)


def register_target(target: Target) -> None:
    """Add a target in this process (tests, notebooks); entry points are the packaged way."""
    registered_targets()
    with _lock:
        assert _registered is not None
        _registered.insert(0, target)
        _chosen.clear()


def _probe_source(target: Target) -> str:
    return target.render(KernelModel("oar_probe", "flat", 1, 1, [{"index": 0, "ctype": "float"}],
                                     [("row", [])], [], []))


def target_for(plugin: Any, device: int) -> Target | None:
    """The target for a device: OAR_CODEGEN_TARGET if set, else the first whose lang the plugin
    compiles (probed once per plugin and device), or None."""
    wanted = os.environ.get("OAR_CODEGEN_TARGET")
    key = (id(plugin), device, wanted)
    with _lock:
        if key in _chosen:
            return _chosen[key]
    candidates = registered_targets()
    if wanted:
        candidates = [t for t in candidates if t.name == wanted]
        if not candidates:
            raise ValueError(f"OAR_CODEGEN_TARGET={wanted!r} names no codegen target (known: "
                             f"{', '.join(t.name for t in registered_targets())})")
    chosen = None
    for target in candidates:
        try:
            target.build(CompileRequest(_probe_source(target), target, plugin, device))
        except Exception as error:
            if getattr(error, "status", None) != "OAR_ERROR_NOT_SUPPORTED" and "NOT_SUPPORTED" not in str(error):
                warnings.warn(f"codegen target {target.name!r} cannot compile for {plugin.device_type}:{device}: "
                              f"{error}", RuntimeWarning, stacklevel=3)
            continue
        chosen = target
        break
    with _lock:
        _chosen[key] = chosen
    return chosen

"""Oar's compiler: fused kernels for any plugged device.

``oar.compile(fn)`` traces the launches fn makes (:mod:`oar_codegen.trace`),
groups elementwise ops around reductions (:mod:`oar_codegen.fusion`), lowers each
group to scalar expressions (:mod:`oar_codegen.lower`, :mod:`oar_codegen.ir`),
renders a kernel from a target's jinja2 templates (:mod:`oar_codegen.render`,
:mod:`oar_codegen.targets`), compiles it through the plugin's module_compile with
an on-disk cache (:mod:`oar_codegen.kernel_cache`) and replays fn's later calls
as those kernels (:mod:`oar_codegen.compiled`, :mod:`oar_codegen.replay`,
:mod:`oar_codegen.executor`); :mod:`oar_codegen.explain` says what fuses and why the rest does not.
"""

from oar_codegen.compiled import CompiledFunction, CompiledModule, CompileStats, compile
from oar_codegen.explain import Explanation, explain
from oar_codegen.targets import CompileRequest, Target, register_target

__all__ = ["CompiledFunction", "CompiledModule", "CompileStats", "CompileRequest", "Explanation", "Target",
           "compile", "explain", "register_target"]

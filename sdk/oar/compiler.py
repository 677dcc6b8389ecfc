"""``oar.compile``: the entry to Oar's compiler (the oar_codegen package), imported on first use."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["compile"]


class _Compile:
    """oar.compile(fn) / @oar.compile: fn (or an nn.Module's forward) run as fused kernels.
    oar.compile.explain(fn, *args) says what compiling it would fuse, and why the rest is not."""

    def __call__(self, fn: Callable | None = None, **options: Any):
        from oar_codegen import compile as compile_function

        return compile_function(fn, **options)

    def explain(self, fn: Callable, *args: Any, **kwargs: Any):
        from oar_codegen import explain

        return explain(fn, *args, **kwargs)

    def __repr__(self) -> str:
        return "<oar.compile>"


compile = _Compile()  # noqa: A001

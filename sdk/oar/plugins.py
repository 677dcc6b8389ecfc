"""Plugins that ship inside the oar package (the ``oar.plugins`` entry points of oar itself)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["refcpu_path"]


def refcpu_path() -> str:
    """The CPU reference plugin bundled with oar (``oar/_plugins/liboar_refcpu.so``)."""
    return str(Path(__file__).resolve().parent / "_plugins" / "liboar_refcpu.so")

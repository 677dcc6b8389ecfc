"""Grad mode: whether ops record a graph. A thread-local flag owned by the C++ core
(``oar._C.grad_enabled`` / ``set_grad_enabled``); this module only calls into it."""

from __future__ import annotations

import functools

from oar import _C

__all__ = ["is_grad_enabled", "no_grad", "enable_grad", "set_grad_enabled"]


def is_grad_enabled() -> bool:
    return _C.grad_enabled()


def _set_enabled(value: bool) -> None:
    _C.set_grad_enabled(bool(value))


class _GradModeContext:
    """A context manager and decorator that sets grad mode and restores it (re-entrant)."""

    _mode: bool

    def __init__(self):
        self._saved: list[bool] = []

    def __enter__(self):
        self._saved.append(is_grad_enabled())
        _set_enabled(self._mode)
        return self

    def __exit__(self, *exc):
        _set_enabled(self._saved.pop())
        return False

    def __call__(self, fn):
        mode = self._mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            previous = is_grad_enabled()
            _set_enabled(mode)
            try:
                return fn(*args, **kwargs)
            finally:
                _set_enabled(previous)
        return wrapper


class no_grad(_GradModeContext):
    """Ops inside record no graph: ``with oar.no_grad(): ...`` or ``@oar.no_grad()``."""
    _mode = False


class enable_grad(_GradModeContext):
    """Ops inside record a graph again (within a no_grad block)."""
    _mode = True


class set_grad_enabled(_GradModeContext):
    """``oar.set_grad_enabled(False)`` sets the mode now (called as a function);
    ``with oar.set_grad_enabled(mode):`` restores the previous mode at exit, and
    ``@oar.set_grad_enabled(mode)`` applies it around each call only."""

    def __init__(self, mode: bool):
        super().__init__()
        self._mode = bool(mode)
        self._before = is_grad_enabled()
        _set_enabled(self._mode)

    def __enter__(self):
        self._saved.append(self._before)
        return self

    def __call__(self, fn):
        _set_enabled(self._before)  # as a decorator it changes nothing until the call
        return super().__call__(fn)

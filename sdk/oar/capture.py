"""Capture: watch (and take) the kernel launches a piece of code makes.

This is the runtime's interface for compilers and tracers (``oar_codegen``
uses it to build ``oar.compile``). While an observer is installed on a
thread with :func:`observe`, every kernel launch the runtime makes on that
thread is offered to it first::

    class Printer(oar.capture.Observer):
        def launch(self, op, inputs, outputs, attrs, fresh_outputs):
            print(op, [tuple(t.shape) for t in inputs])
            return False                 # not taken: the kernel runs as usual

    with oar.capture.observe(Printer()):
        y = oar.relu(x) + 1

The observer protocol (subclass :class:`Observer`, or any object with both methods):

``launch(op, inputs, outputs, attrs, fresh_outputs) -> bool``
    ``op`` is the ops.yaml name; ``inputs`` and ``outputs`` are tuples of
    tensors as the kernel sees them (broadcast views; a Python number is a
    0-d tensor, see :func:`is_wrapped_number`); ``attrs`` a dict with the
    ops.yaml defaults filled in; ``fresh_outputs`` says the outputs were just
    allocated for this launch (False: it writes into an existing tensor).
    Return True to take the launch (its kernel does not run; the observer must
    run it or its equivalent later, e.g. with :func:`launch_now`), False to
    let it run.
``before_host_read(tensor) -> None``
    Called before the host reads device memory of ``tensor`` (``numpy()``,
    ``item()``, ...): an observer holding taken launches must run them now.

Launches the observer makes with :func:`launch_now` are not offered to it.
Storages are identified with :func:`storage_address` (stable while the
storage lives) and :func:`storage_refcount` says how many tensors still hold
one, so a tracer can tell which values escape the captured code.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from oar import _C

__all__ = ["Observer", "observe", "current_observer", "launch_now", "storage_address", "storage_refcount",
           "is_wrapped_number"]


class Observer:
    """Base class of launch observers: override :meth:`launch` and :meth:`before_host_read`.

    The runtime calls an installed observer object directly for each launch; a
    subclass's ``launch`` is made its ``__call__`` so that costs no extra frame."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__call__ = cls.launch  # the runtime calls observer(op, inputs, outputs, attrs, fresh_outputs)

    def launch(self, op: str, inputs: tuple, outputs: tuple, attrs: dict, fresh_outputs: bool) -> bool:
        """Offered every launch; True takes it (the kernel does not run)."""
        return False

    def before_host_read(self, tensor: Any) -> None:
        """The host is about to read tensor's device memory: run what was taken."""

    __call__ = launch


class _Adapter:
    """An observer that is not an :class:`Observer` subclass, in the runtime's calling shape."""
    __slots__ = ("observer", "before_host_read")

    def __init__(self, observer: Any) -> None:
        self.observer = observer
        self.before_host_read = observer.before_host_read

    def __call__(self, op, inputs, outputs, attrs, fresh_outputs):
        return self.observer.launch(op, inputs, outputs, attrs, fresh_outputs)


def _installable(observer: Any) -> Any:
    if observer is None or isinstance(observer, Observer):
        return observer
    missing = [name for name in ("launch", "before_host_read") if not callable(getattr(observer, name, None))]
    if missing:
        raise TypeError(f"oar.capture.observe: {type(observer).__qualname__} is not a launch observer: "
                        f"it has no {' and no '.join(missing)} method")
    return _Adapter(observer)


def _unwrap(installed: Any) -> Any:
    return installed.observer if isinstance(installed, _Adapter) else installed


class observe:
    """Install ``observer`` as this thread's launch observer for the ``with`` block (None: no
    observer); the previous one comes back afterwards, whatever happens. ``with`` yields the
    observer. Observers nest: the inner one sees the launches while it is installed."""

    __slots__ = ("observer", "_installed", "_previous")

    def __init__(self, observer: Any) -> None:
        self.observer = observer
        self._installed = _installable(observer)

    def __enter__(self) -> Any:
        self._previous = _C._set_launch_observer(self._installed)
        return self.observer

    def __exit__(self, *exc_info: object) -> None:
        _C._set_launch_observer(self._previous)


def current_observer() -> Any:
    """This thread's launch observer, or None."""
    installed = _C._set_launch_observer(None)
    _C._set_launch_observer(installed)
    return _unwrap(installed)


def launch_now(op: str, inputs: Sequence[Any], outputs: Sequence[Any], attrs: Mapping[str, Any]) -> None:
    """Enqueue op's kernel (or its host fallback) now on the current stream of the outputs'
    device, not offered to any observer: ``inputs`` as the kernel sees them (broadcast views),
    ``outputs`` allocated by the caller (at least one), ``attrs`` as an observer received them."""
    _C._launch_now(op, inputs, outputs, attrs if type(attrs) is dict else dict(attrs))


def storage_address(tensor: Any) -> int:
    """The device address of the storage under ``tensor`` (all its views share it): identifies the
    storage while it lives; the allocator may hand the address to a new storage afterwards."""
    return tensor._storage_ptr()


def storage_refcount(tensor: Any) -> int:
    """How many tensors (each view counts once) hold the storage under ``tensor``."""
    return tensor._storage_use_count()


def is_wrapped_number(tensor: Any) -> bool:
    """Whether ``tensor`` is a Python number the runtime made a 0-d tensor of (an operand like
    ``1`` in ``x + 1``): it takes part in dtype promotion as a weak scalar, and a compiler may treat
    its value as varying between calls."""
    return tensor._wrapped_number

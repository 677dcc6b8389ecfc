"""The torch.<device> module (like torch.cuda) of the registered Oar device, over oar's own API."""

from __future__ import annotations

from typing import Any

import oar
from oar.torch import bridge_tensor as _bt

__all__ = ["is_available", "is_initialized", "device_count", "current_device", "set_device", "synchronize",
           "Stream", "Event", "current_stream", "memory_allocated", "memory_reserved", "max_memory_allocated",
           "empty_cache", "manual_seed", "manual_seed_all", "initial_seed"]


def _spec(device: Any = None) -> str:
    if device is None:
        return _bt.oar_device(current_device())
    if isinstance(device, int):
        return _bt.oar_device(device)
    index = getattr(device, "index", None)
    if index is None and isinstance(device, str) and ":" in device:
        index = int(device.split(":")[1])
    return _bt.oar_device(index)


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return oar.device_count(_bt.device_type())


def current_device() -> int:
    current = oar.get_device()
    return current.index if current.type == _bt.device_type() else 0


def set_device(device: Any) -> None:
    oar.set_device(_spec(device))


def synchronize(device: Any = None) -> None:
    """Wait for all work queued on the device."""
    oar.synchronize(_spec(device))


Stream = oar.Stream
Event = oar.Event


def current_stream(device: Any = None) -> Any:
    return oar.current_stream(_spec(device))


def memory_allocated(device: Any = None) -> int:
    return oar.memory_allocated(_spec(device))


def max_memory_allocated(device: Any = None) -> int:
    return oar.max_memory_allocated(_spec(device))


def memory_reserved(device: Any = None) -> int:
    return oar.memory_reserved(_spec(device))


def empty_cache() -> None:
    oar.empty_cache(_spec())


def manual_seed(seed: int) -> None:
    """Seeds Oar's Philox generator (oar.manual_seed)."""
    oar.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    oar.manual_seed(seed)


def initial_seed() -> int:
    return oar.initial_seed()


def get_rng_state(device: Any = None) -> Any:
    return oar.get_rng_state()


def set_rng_state(state: Any, device: Any = None) -> None:
    oar.set_rng_state(state)

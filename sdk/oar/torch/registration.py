"""oar.torch.register: an Oar plugin's device type becomes torch's PrivateUse1 device."""

from __future__ import annotations

import os
import sys
import threading
import types

import torch

import oar
from oar.torch import bridge_tensor as _bt
from oar.torch import device_module as _device_module
from oar.torch.dispatch import install_kernels

__all__ = ["register", "registered_device"]

_lock = threading.Lock()


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return _device_module.is_available()

    def has_primary_context(self, device_index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _choose(device_type: str | None) -> str:
    if device_type:
        return device_type
    from_env = os.environ.get("OAR_TORCH_DEVICE")
    if from_env:
        return from_env
    types_ = [r.device_type for r in oar.plugin_manager.plugin_records() if r.status == "loaded"]
    if len(types_) != 1:
        raise RuntimeError("oar.torch.register(): name the device type (or set OAR_TORCH_DEVICE): the loaded "
                           f"Oar plugins provide {types_ or 'no device types'}")
    return types_[0]


def registered_device() -> str | None:
    """The device type registered with torch, or None."""
    return _bt._device_type[0] if _bt._device_type else None


def register(device_type: str | None = None) -> str:
    """Make an Oar device type a torch device: ``torch.device(device_type)``, ``tensor.to(device_type)``,
    ``torch.<device_type>`` (is_available, synchronize, memory stats, ...). Which type: the argument,
    else ``OAR_TORCH_DEVICE``, else the only loaded plugin's. Torch has one such slot (PrivateUse1):
    registering a second type is an error; registering the same type again does nothing."""
    name = _choose(device_type)
    with _lock:
        if _bt._device_type:
            if _bt._device_type[0] != name:
                raise RuntimeError(f"oar.torch: '{_bt._device_type[0]}' is already torch's Oar device; torch has "
                                   f"one PrivateUse1 slot, so '{name}' cannot be registered too (set "
                                   "OAR_TORCH_DEVICE to choose before the first register())")
            return name
        if oar.device_count(name) == 0:
            loaded = [r.device_type for r in oar.plugin_manager.plugin_records() if r.status == "loaded"]
            raise RuntimeError(f"oar.torch.register('{name}'): no loaded Oar plugin provides device type "
                               f"'{name}' (loaded: {loaded})")
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", name):
            raise RuntimeError(f"oar.torch.register('{name}'): torch's PrivateUse1 is already '{current}' "
                               "(another extension registered it)")
        if current != name:
            torch.utils.rename_privateuse1_backend(name)
            torch.utils.generate_methods_for_privateuse1_backend()
        module = types.ModuleType(f"torch.{name}")
        for attr in ("_is_in_bad_fork", "get_rng_state", "set_rng_state", *_device_module.__all__):
            setattr(module, attr, getattr(_device_module, attr))
        torch._register_device_module(name, module)
        sys.modules[f"torch.{name}"] = module
        torch._C._acc.register_python_privateuseone_hook(_Hooks())
        torch._C._acc.register_python_privateuseone_device_guard(_Guard())
        # Module.to(device) cannot shallow-copy a CPU tensor into a Python-backend one: swapping keeps
        # each Parameter object, so tied weights stay tied (the CUDA path keeps them through set_data)
        torch.__future__.set_swap_module_params_on_conversion(True)
        _bt._device_type.append(name)
        install_kernels()
    return name

"""Module: the base class of layers and models, as in PyTorch.

Attributes that are Parameters, Modules or registered buffers are found by
``named_parameters`` / ``named_modules`` / ``named_buffers`` in the order they
were set; ``state_dict`` names them with dotted paths (``layers.0.weight``).
``load_state_dict`` copies values into the existing tensors and refuses, naming
the key, a missing or unexpected name, a shape or a dtype that differs.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterator, NamedTuple

import oar
from oar.errors import OarError
from oar.nn.parameter import Parameter

__all__ = ["Module", "StateDictError", "IncompatibleKeys"]


class StateDictError(OarError, KeyError):
    """A state_dict does not fit a module: ``missing``, ``unexpected`` and
    ``mismatched`` ((key, what it is, what the module has)) say where."""

    def __init__(self, module_name: str, missing=(), unexpected=(), mismatched=()):
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = list(mismatched)
        lines = []
        if self.missing:
            lines.append("missing key(s): " + ", ".join(repr(k) for k in self.missing))
        if self.unexpected:
            lines.append("unexpected key(s): " + ", ".join(repr(k) for k in self.unexpected))
        for key, got, want in self.mismatched:
            lines.append(f"{key!r}: the state_dict has {got}, the module has {want}")
        self.message = f"state_dict does not fit {module_name}: " + "; ".join(lines)
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class IncompatibleKeys(NamedTuple):
    missing_keys: list
    unexpected_keys: list


def _describe(t) -> str:
    return f"shape {list(t.shape)} dtype {_dtype_name(t.dtype)}"


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).replace("oar.", "")


class Module:
    """Base class of every layer: subclasses set Parameters / Modules as attributes
    in ``__init__`` and compute in ``forward``; calling the module runs forward."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())

    # ---- attributes ---------------------------------------------------------------------

    def _check_init(self) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() before "
                                 f"setting parameters, buffers or submodules")

    def __setattr__(self, name: str, value: Any) -> None:
        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            self._check_init()
            self._remove_from(name, "_buffers", "_modules")
            self.__dict__.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            self._check_init()
            self._remove_from(name, "_parameters", "_buffers")
            self.__dict__.pop(name, None)
            self._modules[name] = value
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign a {type(value).__name__} to parameter {name!r} "
                                f"(an oar.nn.Parameter or None)")
            params[name] = None
        elif params is not None and name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign a {type(value).__name__} to submodule {name!r} "
                                f"(an oar.nn.Module or None)")
            self._modules[name] = None
        elif params is not None and name in self._buffers:
            if value is not None and not isinstance(value, oar.Tensor):
                raise TypeError(f"cannot assign a {type(value).__name__} to buffer {name!r} (an oar.Tensor or None)")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _remove_from(self, name: str, *registries: str) -> None:
        for registry in registries:
            self.__dict__[registry].pop(name, None)
        self._non_persistent.discard(name)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            table = d.get(registry)
            if table is not None and name in table:
                return table[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for registry in ("_parameters", "_buffers", "_modules"):
            table = self.__dict__.get(registry)
            if table is not None and name in table:
                del table[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._check_init()
        if "." in name or not name:
            raise KeyError(f"parameter name {name!r} must be non-empty and without '.'")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter({name!r}) takes an oar.nn.Parameter or None, "
                            f"not {type(param).__name__}")
        self._remove_from(name, "_buffers", "_modules")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """A tensor that belongs to the module's state but is not trained (running
        stats, masks). ``persistent=False`` leaves it out of state_dict."""
        self._check_init()
        if "." in name or not name:
            raise KeyError(f"buffer name {name!r} must be non-empty and without '.'")
        if tensor is not None and not isinstance(tensor, oar.Tensor):
            raise TypeError(f"register_buffer({name!r}) takes an oar.Tensor or None, not {type(tensor).__name__}")
        self._remove_from(name, "_parameters", "_modules")
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        self._check_init()
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module({name!r}) takes an oar.nn.Module or None, not {type(module).__name__}")
        if "." in name or not name:
            raise KeyError(f"module name {name!r} must be non-empty and without '.'")
        self._remove_from(name, "_parameters", "_buffers")
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target: str) -> "Module":
        module = self
        for part in target.split(".") if target else []:
            child = module._modules.get(part)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no submodule {part!r} (in {target!r})")
            module = child
        return module

    # ---- traversal -----------------------------------------------------------------------

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            yield from module.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self) -> Iterator["Module"]:
        for _, module in self.named_children():
            yield module

    def _named_members(self, registry: str, prefix: str, recurse: bool, remove_duplicate: bool = True,
                       persistent_only: bool = False):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse \
            else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in module.__dict__[registry].items():
                if value is None:
                    continue
                if persistent_only and name in module._non_persistent:
                    continue
                if remove_duplicate:
                    if id(value) in seen:
                        continue
                    seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # ---- modes, gradients, devices ---------------------------------------------------------

    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, bool):
            raise TypeError("train(mode) takes a bool")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with oar.no_grad():
                    p.grad.zero_()

    def _apply(self, convert: Callable) -> "Module":
        """Replaces every parameter, its gradient and every buffer by convert(tensor)."""
        with oar.no_grad():
            for module in self.modules():
                for name, p in list(module._parameters.items()):
                    if p is None:
                        continue
                    moved = convert(p)
                    if moved is p:
                        continue
                    new = Parameter(moved, requires_grad=p.requires_grad)
                    if p.grad is not None:
                        new.grad = convert(p.grad)
                    module._parameters[name] = new
                for name, b in list(module._buffers.items()):
                    if b is not None:
                        module._buffers[name] = convert(b)
        return self

    def to(self, device=None, dtype=None) -> "Module":
        """Moves parameters and buffers to ``device`` and/or casts floating ones to ``dtype``.
        The module's Parameters are replaced by new ones (create optimizers afterwards)."""
        if device is not None and (isinstance(device, oar.DType) or
                                   (isinstance(device, str) and device.removeprefix("oar.") in _DTYPE_NAMES)):
            device, dtype = None, device  # to(dtype) written positionally

        def convert(t):
            out = t
            if device is not None:
                out = out.to(device)
            if dtype is not None and _is_floating(out.dtype):
                out = out.to(dtype=dtype)
            return out
        return self._apply(convert)

    def float(self) -> "Module":
        return self.to(dtype=oar.float32)

    def double(self) -> "Module":
        return self.to(dtype=oar.float64)

    # ---- state ---------------------------------------------------------------------------------

    def state_dict(self, destination: dict | None = None, prefix: str = "", keep_vars: bool = False) -> dict:
        """name -> tensor for every parameter and persistent buffer (detached unless keep_vars)."""
        out = OrderedDict() if destination is None else destination
        for module_prefix, module in self.named_modules(prefix=prefix.rstrip(".")):
            for registry in ("_parameters", "_buffers"):
                for name, value in module.__dict__[registry].items():
                    if value is None or (registry == "_buffers" and name in module._non_persistent):
                        continue
                    key = f"{module_prefix}.{name}" if module_prefix else name
                    out[key] = value if keep_vars else value.detach()
        return out

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> IncompatibleKeys:
        """Copies the values of ``state_dict`` into the module's parameters and buffers.

        Raises StateDictError naming every key whose shape or dtype differs, and, with
        ``strict``, every missing or unexpected key; nothing is copied if it raises.
        """
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        mismatched = []
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            if not isinstance(value, oar.Tensor):
                mismatched.append((key, f"a {type(value).__name__}", "a tensor"))
                continue
            if tuple(value.shape) != tuple(target.shape) or _dtype_name(value.dtype) != _dtype_name(target.dtype):
                mismatched.append((key, _describe(value), _describe(target)))
        if mismatched or (strict and (missing or unexpected)):
            raise StateDictError(type(self).__name__, missing if strict else (), unexpected if strict else (),
                                 mismatched)
        with oar.no_grad():
            for key, target in own.items():
                if key in state_dict:
                    target.copy_(state_dict[key])
        return IncompatibleKeys(missing, unexpected)

    # ---- calling ---------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        extra = self.extra_repr()
        for name, module in self._modules.items():
            text = repr(module).replace("\n", "\n  ")
            lines.append(f"({name}): {text}")
        if not lines:
            return f"{type(self).__name__}({extra})"
        body = "\n  ".join(([extra] if extra else []) + lines)
        return f"{type(self).__name__}(\n  {body}\n)"

    def __getstate__(self):
        return self.__dict__.copy()

    def __setstate__(self, state):
        self.__dict__.update(state)


_DTYPE_NAMES = frozenset({"float16", "bfloat16", "float32", "float64", "int8", "int32", "int64", "bool"})


def _is_floating(dtype) -> bool:
    return _dtype_name(dtype) in ("float16", "bfloat16", "float32", "float64")

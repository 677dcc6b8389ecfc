"""Optimizer: parameter groups, per-parameter state, state_dict / load_state_dict.

Updates run on the parameters' device with in-place ops under no_grad: a step
enqueues kernels and never reads a value back to the host. Hyperparameters and
the step count live on the host as Python numbers.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

import oar
from oar.errors import OarError

__all__ = ["Optimizer", "OptimizerStateError"]


class OptimizerStateError(OarError, ValueError):
    """An optimizer state_dict does not fit the optimizer (groups, parameters, shapes)."""


class _Required:
    def __repr__(self) -> str:
        return "<required>"


required = _Required()


class Optimizer:
    """Base class: ``params`` is an iterable of tensors or of dicts (parameter groups
    with their own hyperparameters); ``defaults`` fills what a group leaves out."""

    def __init__(self, params: Iterable, defaults: dict):
        self.defaults = dict(defaults)
        self.state: dict[int, dict] = {}   # id(param) -> state
        self.param_groups: list[dict] = []
        if isinstance(params, oar.Tensor):
            raise TypeError("params is an iterable of tensors or of dicts, not a single tensor "
                            "(pass [tensor] or model.parameters())")
        params = list(params)
        if not params:
            raise ValueError("the optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict) -> None:
        group = dict(group)
        params = group["params"]
        params = [params] if isinstance(params, oar.Tensor) else list(params)
        for p in params:
            if not isinstance(p, oar.Tensor):
                raise TypeError(f"an optimizer parameter is an oar.Tensor, not {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("an optimizer can only update leaf tensors (parameters), not results of ops")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("a parameter appears in more than one parameter group")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter group lists a parameter twice")
        group["params"] = params
        for key, value in self.defaults.items():
            if value is required and key not in group:
                raise ValueError(f"parameter group is missing the required hyperparameter {key!r}")
            group.setdefault(key, value)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    with oar.no_grad():
                        p.grad.zero_()

    def step(self, closure=None):
        raise NotImplementedError

    def _state_of(self, p) -> dict:
        return self.state.setdefault(id(p), {})

    # ---- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """{"state": {index: {name: tensor or number}}, "param_groups": [{hyperparameters,
        "params": [indexes]}]}: parameters are numbered in group order (as in PyTorch)."""
        index = {}
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            packed["params"] = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                packed["params"].append(index[id(p)])
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                s = self.state.get(id(p))
                if s:
                    state[index[id(p)]] = {k: (v.detach() if isinstance(v, oar.Tensor) else v) for k, v in s.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores hyperparameters and state; tensors are copied to each parameter's device.
        Raises OptimizerStateError when groups, parameter counts or state shapes differ."""
        try:
            saved_groups = state_dict["param_groups"]
            saved_state = state_dict["state"]
        except (KeyError, TypeError):
            raise OptimizerStateError("an optimizer state_dict has the keys 'state' and 'param_groups'") from None
        if len(saved_groups) != len(self.param_groups):
            raise OptimizerStateError(f"the state_dict has {len(saved_groups)} parameter groups, the optimizer "
                                      f"{len(self.param_groups)}")
        by_index = {}
        for g, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise OptimizerStateError(f"parameter group {g}: the state_dict has {len(saved['params'])} "
                                          f"parameters, the optimizer {len(group['params'])}")
            for i, p in zip(saved["params"], group["params"]):
                by_index[int(i)] = p
        new_state = {}
        for key, values in saved_state.items():
            i = int(key)
            if i not in by_index:
                raise OptimizerStateError(f"state for parameter {i}, which no parameter group lists")
            p = by_index[i]
            restored = {}
            for name, value in values.items():
                if isinstance(value, oar.Tensor):
                    if name in self._param_shaped_state and tuple(value.shape) != tuple(p.shape):
                        raise OptimizerStateError(f"state[{i}][{name!r}] has shape {list(value.shape)}, the "
                                                  f"parameter {list(p.shape)}")
                    with oar.no_grad():
                        value = value.to(p.device)
                        if str(value.dtype) != str(p.dtype) and name in self._param_shaped_state:
                            value = value.to(dtype=p.dtype)
                        if value is values[name]:
                            value = oar.copy(value)  # own memory: step updates it in place
                restored[name] = value
            new_state[id(p)] = restored
        for saved, group in zip(saved_groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = copy.deepcopy(v)
        self.state = new_state

    _param_shaped_state: frozenset = frozenset()

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(group):
                if k != "params":
                    lines.append(f"    {k}: {group[k]}")
        lines.append(")")
        return "\n".join(lines)

"""Parameter initialization, PyTorch's defaults, drawn from Oar's seeded Philox
stream (the ``rand`` / ``randn`` ops) so a seed gives the same weights on every
device. Each draw takes the next counters of the global stream (:mod:`oar.random`):
``oar.manual_seed(s)`` then building the same model gives the same weights.
"""

from __future__ import annotations

import math

import oar

__all__ = [
    "manual_seed", "initial_seed",
    "uniform_", "normal_", "zeros_", "ones_", "constant_", "kaiming_uniform_", "kaiming_normal_",
    "xavier_uniform_", "xavier_normal_", "calculate_gain", "fan_in_and_fan_out",
]


def manual_seed(seed: int) -> None:
    """Seeds Oar's global Philox stream (weights, dropout masks, oar.rand); the same as oar.manual_seed."""
    oar.random.manual_seed(seed)


def initial_seed() -> int:
    return oar.random.initial_seed()


def _float_dtype(tensor):
    return tensor.dtype if tensor.dtype.name in ("float32", "float64") else oar.float32


def uniform_(tensor, a: float = 0.0, b: float = 1.0):
    """Fills tensor with U(a, b) from the next numbers of the global stream."""
    with oar.no_grad():
        values = oar.rand(list(tensor.shape), dtype=_float_dtype(tensor), device=tensor.device)
        tensor.copy_(values * (b - a) + a)
    return tensor


def normal_(tensor, mean: float = 0.0, std: float = 1.0):
    """Fills tensor with N(mean, std^2) from the next numbers of the global stream."""
    with oar.no_grad():
        values = oar.randn(list(tensor.shape), dtype=_float_dtype(tensor), device=tensor.device)
        tensor.copy_(values * std + mean)
    return tensor


def constant_(tensor, value: float):
    with oar.no_grad():
        tensor.fill_(value)
    return tensor


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def fan_in_and_fan_out(tensor) -> tuple[int, int]:
    shape = list(tensor.shape)
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a tensor of at least 2 dims, not {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid", "identity"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def _fan(tensor, mode: str) -> int:
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode is 'fan_in' or 'fan_out', not {mode!r}")
    return fan_in if mode == "fan_in" else fan_out


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
    fan = _fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    bound = math.sqrt(3.0) * gain / math.sqrt(fan) if fan else 0.0
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
    fan = _fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0
    return normal_(tensor, 0.0, std)


def xavier_uniform_(tensor, gain: float = 1.0):
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor, gain: float = 1.0):
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))

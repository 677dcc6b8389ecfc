"""Parameter initialization, PyTorch's defaults, drawn from Oar's seeded Philox
stream (the ``rand`` / ``randn`` ops) so a seed gives the same weights on every
device. Each draw takes the next ``numel`` counters of the default generator:
``oar.manual_seed(s)`` then building the same model gives the same weights.
"""

from __future__ import annotations

import math
import threading

import oar

__all__ = [
    "Generator", "default_generator", "manual_seed", "initial_seed",
    "uniform_", "normal_", "zeros_", "ones_", "constant_", "kaiming_uniform_", "kaiming_normal_",
    "xavier_uniform_", "xavier_normal_", "calculate_gain", "fan_in_and_fan_out",
]


class Generator:
    """A Philox key (seed) and the next unused counter (offset)."""

    def __init__(self, seed: int = 0):
        self._lock = threading.Lock()
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> "Generator":
        seed = int(seed)
        if not 0 <= seed < 2 ** 64:
            raise ValueError(f"seed must be in [0, 2**64), not {seed}")
        with self._lock:
            self.seed = seed
            self.offset = 0
        return self

    def initial_seed(self) -> int:
        return self.seed

    def next(self, count: int) -> tuple[int, int]:
        """(seed, offset) for ``count`` fresh numbers; the counters are taken in steps of 4
        (one Philox-4x32 block), so draws never overlap."""
        with self._lock:
            offset = self.offset
            self.offset += (int(count) + 3) // 4 * 4
            return self.seed, offset

    def get_state(self) -> dict:
        return {"seed": self.seed, "offset": self.offset}

    def set_state(self, state: dict) -> None:
        with self._lock:
            self.seed, self.offset = int(state["seed"]), int(state["offset"])


default_generator = Generator(0)


def manual_seed(seed: int) -> Generator:
    """Seeds the default generator (weights, dropout masks) and restarts its stream."""
    return default_generator.manual_seed(seed)


def initial_seed() -> int:
    return default_generator.initial_seed()


def _numel(tensor) -> int:
    return math.prod(tensor.shape)


def _draw(op: str, tensor, generator: Generator | None):
    generator = generator or default_generator
    seed, offset = generator.next(_numel(tensor))
    dtype = tensor.dtype if str(getattr(tensor.dtype, "name", tensor.dtype)) in ("float32", "float64") \
        else oar.float32
    values = getattr(oar, op)(list(tensor.shape), seed=seed, offset=offset, dtype=dtype, device=tensor.device)
    return values


def _assign(tensor, values):
    with oar.no_grad():
        tensor.copy_(values)
    return tensor


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator: Generator | None = None):
    """Fills tensor with U(a, b)."""
    with oar.no_grad():
        values = _draw("rand", tensor, generator)
        return _assign(tensor, values * (b - a) + a)


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator: Generator | None = None):
    """Fills tensor with N(mean, std^2)."""
    with oar.no_grad():
        values = _draw("randn", tensor, generator)
        return _assign(tensor, values * std + mean)


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


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Generator | None = None):
    fan = _fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    bound = math.sqrt(3.0) * gain / math.sqrt(fan) if fan else 0.0
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Generator | None = None):
    fan = _fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0
    return normal_(tensor, 0.0, std, generator)


def xavier_uniform_(tensor, gain: float = 1.0, generator: Generator | None = None):
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator: Generator | None = None):
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)

"""Learning-rate schedules: set each group's ``lr`` from its initial lr and the step count."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from oar.optim.optimizer import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "CosineWithWarmup", "cosine_with_warmup", "StepLR"]


class LRScheduler:
    """Call ``step()`` once per optimizer step (after ``optimizer.step()``)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__} schedules an oar.optim.Optimizer, not {type(optimizer).__name__}")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param group {i} has no 'initial_lr' to resume a schedule from")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def step(self) -> None:
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update({k: v for k, v in state_dict.items() if k not in ("optimizer", "lr_lambdas")})


class LambdaLR(LRScheduler):
    """lr = initial_lr * lr_lambda(step), one lambda for all groups or one per group."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable],
                 last_epoch: int = -1):
        n = len(optimizer.param_groups)
        if callable(lr_lambda):
            self.lr_lambdas = [lr_lambda] * n
        else:
            self.lr_lambdas = list(lr_lambda)
            if len(self.lr_lambdas) != n:
                raise ValueError(f"{len(self.lr_lambdas)} lr_lambdas for {n} parameter groups")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]


def cosine_with_warmup(warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> Callable[[int], float]:
    """The LambdaLR factor: a linear warm-up, step s < warmup_steps giving (s + 1) / warmup_steps
    (1 at s = warmup_steps - 1), then a cosine from 1 at warmup_steps down to ``min_lr_ratio``
    at ``total_steps``, and ``min_lr_ratio`` after."""
    if warmup_steps < 0 or total_steps <= 0 or warmup_steps > total_steps:
        raise ValueError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}), total > 0")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], not {min_lr_ratio}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        decay_steps = total_steps - warmup_steps
        if decay_steps == 0:
            return 1.0
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


class CosineWithWarmup(LambdaLR):
    """Linear warm-up over ``warmup_steps`` then cosine decay to ``min_lr_ratio * lr`` at ``total_steps``."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0,
                 last_epoch: int = -1):
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, min_lr_ratio
        super().__init__(optimizer, cosine_with_warmup(warmup_steps, total_steps, min_lr_ratio), last_epoch)


class StepLR(LRScheduler):
    """lr = initial_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]

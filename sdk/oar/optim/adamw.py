"""AdamW: Adam with decoupled weight decay and bias correction (Loshchilov & Hutter),
the update of torch.optim.AdamW."""

from __future__ import annotations

import math

import oar
from oar.autograd import enable_grad, no_grad
from oar.optim.optimizer import Optimizer

__all__ = ["AdamW", "Adam", "adam_update"]


class AdamW(Optimizer):
    """p *= 1 - lr * weight_decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""

    _param_shaped_state = frozenset({"exp_avg", "exp_avg_sq"})
    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, maximize: bool = False):
        if lr < 0.0:
            raise ValueError(f"invalid learning rate {lr}")
        if eps < 0.0:
            raise ValueError(f"invalid eps {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}")
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))

    @no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, weight_decay, maximize = group["lr"], group["eps"], group["weight_decay"], group["maximize"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if maximize:
                    g = oar.neg(g)
                state = self._state_of(p)
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = oar.zeros(list(p.shape), dtype=p.dtype, device=p.device)
                    state["exp_avg_sq"] = oar.zeros(list(p.shape), dtype=p.dtype, device=p.device)
                state["step"] += 1
                adam_update(p, g, state["exp_avg"], state["exp_avg_sq"], state["step"], lr=lr, beta1=beta1,
                            beta2=beta2, eps=eps, weight_decay=weight_decay, decoupled=self._decoupled)
        return loss


def adam_update(p, g, m, v, step: int, *, lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float, decoupled: bool, max_v=None) -> None:
    """One Adam (decoupled: AdamW) update of parameter p in place, torch's formulas: p, its
    gradient g (already negated for maximize), the moments m and v (updated in place), the step
    count after this step, and for AMSGrad the running maximum of v (max_v, updated in place)."""
    if weight_decay:
        if decoupled:
            p.mul_(1.0 - lr * weight_decay)
        else:
            g = oar.add(g, oar.mul(p, weight_decay))
    # m = b1 m + (1 - b1) g  as  m += (g - m) (1 - b1), torch's lerp
    m.add_(oar.mul(oar.sub(g, m), 1.0 - beta1))
    v.mul_(beta2)
    v.add_(oar.mul(oar.mul(g, g), 1.0 - beta2))
    if max_v is not None:
        max_v.copy_(oar.maximum(max_v, v))
        v = max_v
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2_sqrt = math.sqrt(1.0 - beta2 ** step)
    denom = oar.add(oar.div(oar.sqrt(v), bias_correction2_sqrt), eps)
    p.add_(oar.mul(oar.div(m, denom), -lr / bias_correction1))


class Adam(AdamW):
    """Adam: weight decay added to the gradient (L2), not decoupled."""

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, maximize)

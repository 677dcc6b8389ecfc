"""SGD with momentum and weight decay (PyTorch's formulation, nesterov off)."""

from __future__ import annotations

import oar
from oar.autograd import enable_grad, no_grad
from oar.optim.optimizer import Optimizer, required

__all__ = ["SGD"]


class SGD(Optimizer):
    """g = grad + weight_decay * p; with momentum: buf = momentum * buf + (1 - dampening) * g
    (buf = g at the first step), g = buf; p -= lr * g."""

    _param_shaped_state = frozenset({"momentum_buffer"})

    def __init__(self, params, lr: float = required, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"invalid learning rate {lr}")
        if momentum < 0.0:
            raise ValueError(f"invalid momentum {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay {weight_decay}")
        if nesterov:
            raise NotImplementedError("nesterov momentum is not implemented")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=False, maximize=maximize))

    @no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, dampening = group["lr"], group["momentum"], group["dampening"]
            weight_decay, maximize = group["weight_decay"], group["maximize"]
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if maximize:
                    g = oar.neg(g)
                if weight_decay:
                    g = oar.add(g, oar.mul(p, weight_decay))
                if momentum:
                    state = self._state_of(p)
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = oar.copy(g)
                    else:
                        buf.mul_(momentum)
                        buf.add_(g if dampening == 0 else oar.mul(g, 1.0 - dampening))
                    g = buf
                p.add_(oar.mul(g, -lr))
        return loss

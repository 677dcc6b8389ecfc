"""torch.optim's fused Adam and AdamW step (``fused=True``: ATen's ``_fused_adam_`` and
``_fused_adamw_``) as Oar ops on every parameter, instead of the CPU fallback (a copy of every
parameter and its state to the host and back each step).

The update is torch's: p -= lr * wd * p (AdamW) or g += wd * p (Adam); m = lerp(m, g, 1 - beta1);
v = beta2 v + (1 - beta2) g^2; p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps),
with v replaced by max(v_max, v) under amsgrad. The step counts t are read from the device once per
call. Gradient scaling (grad_scale, found_inf) and a tensor learning rate run on the CPU fallback.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

import oar
from oar.torch import bridge_tensor as _bt
from oar.torch import cpu_fallback as _cpu

__all__ = ["fused_optimizer_kernels"]


def _step_counts(steps: list) -> list[float]:
    """The step counts of state_steps (device 0-d tensors) in one read of the device."""
    if not steps:
        return []
    flat = oar.ops.concat([oar.ops.reshape(s, shape=[1]) for s in steps], dim=0)
    return [float(v) for v in _bt.to_cpu_torch(flat).tolist()]


def _kernel(op: Any, decoupled: bool) -> Callable[..., Any]:
    name = f"{op._schema.name.removeprefix('aten::')}.{op._overloadname}"

    def kernel(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
               weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None) -> None:
        arguments = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
        options = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad,
                       maximize=maximize, grad_scale=grad_scale, found_inf=found_inf)
        if grad_scale is not None or found_inf is not None:
            return _cpu.run_on_cpu(op, arguments, options)
        kind = _bt.device_type()
        p_, g_, m_, v_, vmax_, t_ = (_bt.unwrap_same_device(name, list(a), kind) for a in arguments)
        with oar.no_grad():
            for i, t in enumerate(_step_counts(t_)):
                g = oar.ops.neg(g_[i]) if maximize else g_[i]
                oar.optim.adam_update(p_[i], g, m_[i], v_[i], t, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                      weight_decay=weight_decay, decoupled=decoupled,
                                      max_v=vmax_[i] if amsgrad else None)
        return None

    return kernel


def fused_optimizer_kernels() -> dict[str, Callable[..., Any]]:
    """The kernels by ATen overload name (the float-lr overloads; a tensor lr runs on the CPU)."""
    return {"_fused_adamw_.default": _kernel(torch.ops.aten._fused_adamw_.default, decoupled=True),
            "_fused_adam_.default": _kernel(torch.ops.aten._fused_adam_.default, decoupled=False)}

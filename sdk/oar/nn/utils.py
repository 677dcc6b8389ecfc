"""Training utilities: gradient clipping."""

from __future__ import annotations

import math

import oar

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
    """Scales the gradients of ``parameters`` in place so that their joint norm is at most
    ``max_norm`` (coefficient max_norm / (norm + 1e-6), capped at 1, as torch); returns the norm
    before clipping as a 0-d tensor. norm_type: a positive float or inf."""
    if isinstance(parameters, oar.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    if not grads:
        return oar.zeros([], dtype=oar.float32)
    if norm_type <= 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be positive or inf, not {norm_type}")
    if norm_type == float("inf"):
        norms = [oar.max(oar.abs(g)) for g in grads]
        total = norms[0] if len(norms) == 1 else oar.max(oar.stack(norms))
    else:
        sums = [oar.sum(oar.pow(oar.abs(g), norm_type)) for g in grads]
        total = oar.pow(sums[0] if len(sums) == 1 else oar.sum(oar.stack(sums)), 1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(float(total.item())):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} is not finite")
    coef = oar.clamp(oar.div(float(max_norm), oar.add(total, 1e-6)), max=1.0)
    with oar.no_grad():
        for g in grads:
            g.mul_(oar.cast(coef, dtype=g.dtype))
    return total

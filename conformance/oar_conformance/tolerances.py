"""The tolerance contract: one row per dtype, kept here and nowhere else.

Values (the ops level): ``|got - want| <= atol + rtol * |want|``, NaN equal to
NaN, ``want`` being the numpy reference (:mod:`oar.reference`) cast to the
output's dtype. Accumulating ops (reductions, matmul, nn ops, scatter_add,
index_add, randn) get the second column.

Gradients (the ops level's ``grad`` cases): the device's autograd gradient
against a float64 host reference (central differences with Richardson
extrapolation on :mod:`oar.reference` evaluated in float64), with
``|got - want| <= atol * scale + rtol * |want|`` where ``scale`` is the
largest ``|want|`` (1 if all are 0): a gradient sums many terms, so its
absolute error follows the largest of them.

| dtype | elementwise | accumulating | gradient |
|---|---|---|---|
| float64 | rtol 1e-10, atol 1e-12 | rtol 1e-9, atol 1e-11 | rtol 1e-7, atol 1e-9 |
| float32 | rtol 1e-5, atol 1e-6 | rtol 1e-4, atol 1e-5 | rtol 1e-4, atol 1e-5 |
| float16 | rtol 2e-3, atol 2e-3 | rtol 4e-3, atol 4e-3 | rtol 4e-3, atol 4e-3 |
| bfloat16 | rtol 1.6e-2, atol 1.6e-2 | rtol 3.2e-2, atol 3.2e-2 | rtol 3.2e-2, atol 3.2e-2 |
| ints, bool | exact | exact | (no gradients) |

The float64 gradient tolerance is looser than its value tolerance because
the reference is numerical (its own error is about 1e-10 relative).

Forward outputs of models (the models level): the device's output ``y``
against an fp64 host run ``y64`` and an fp32 host run ``y32`` of the same
model and weights passes when ``rmse(y, y64) <= k * rmse(y32, y64) + eps *
rms(y64)`` (PyTorch's accuracy check, ``torch._dynamo.utils.same``), with
``k`` = ``FP64_MULTIPLIER`` of the model's dtype and ``eps`` the float32
machine epsilon (a floor for outputs the fp32 run gets exactly).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Tolerance", "CONTRACT", "FP64_MULTIPLIER", "FLOAT_DTYPES", "tolerance", "within"]


class Tolerance(NamedTuple):
    rtol: float
    atol: float


FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")

CONTRACT: dict[str, dict[str, Tolerance]] = {
    "float64": {"elementwise": Tolerance(1e-10, 1e-12), "accumulating": Tolerance(1e-9, 1e-11),
                "gradient": Tolerance(1e-7, 1e-9)},
    "float32": {"elementwise": Tolerance(1e-5, 1e-6), "accumulating": Tolerance(1e-4, 1e-5),
                "gradient": Tolerance(1e-4, 1e-5)},
    "float16": {"elementwise": Tolerance(2e-3, 2e-3), "accumulating": Tolerance(4e-3, 4e-3),
                "gradient": Tolerance(4e-3, 4e-3)},
    "bfloat16": {"elementwise": Tolerance(1.6e-2, 1.6e-2), "accumulating": Tolerance(3.2e-2, 3.2e-2),
                 "gradient": Tolerance(3.2e-2, 3.2e-2)},
}

# k of error(device vs fp64) <= k * error(fp32 host vs fp64): PyTorch's multipliers
FP64_MULTIPLIER = {"float64": 2.0, "float32": 2.0, "float16": 3.0, "bfloat16": 3.0}
FLOAT32_EPS = 2.0 ** -23


def tolerance(dtype: str, column: str) -> Tolerance | None:
    """The (rtol, atol) of a float dtype for ``elementwise``, ``accumulating`` or ``gradient``; None: exact."""
    row = CONTRACT.get(dtype)
    return None if row is None else row[column]


def within(got, want, tol: Tolerance, scale: float = 1.0):
    """Elementwise closeness (numpy bool array) under ``tol`` with atol multiplied by ``scale``."""
    import numpy as np

    return np.isclose(got, want, rtol=tol.rtol, atol=tol.atol * scale, equal_nan=True)

"""Level ``models``: the model zoo (:mod:`oar_conformance.zoo`: the MLP, the CNN and the
Llama-style decoder of :mod:`oar.models`) on the device, two tests per model.

``models.<model>.loss``: the model trains for a fixed number of deterministic
steps; per step the loss must satisfy ``|loss - golden| <= atol + rtol *
|golden|`` against the golden curve recorded on the CPU reference plugin
(the model's tolerance in its golden file: rtol 0.02, atol 1e-3); at most 1%
of the steps may miss (Megatron-LM's practice; one step of a 100-step curve),
and a NaN or infinite loss fails at once. The curve and the golden one are
kept in the result (``details``) and drawn in the HTML report.

``models.<model>.fp64``: the forward output of the initial weights on a fixed
batch, against an fp64 host run of the same model (a numpy twin of its
forward, in float64): ``rmse(device, fp64) <= k * rmse(fp32 host, fp64) +
eps * rms(fp64)``, with the fp32 host run the same twin in float32 and ``k``
the contract's multiplier (2 for float32; PyTorch's accuracy check). It
catches a device whose results are worse than float32 arithmetic allows even
where the loss curve stays within its tolerance.

Ops the runtime ran through its host fallback are listed in the result; the
model still passes if its numbers do.
"""

from __future__ import annotations

import math

import numpy as np

from oar_conformance import zoo
from oar_conformance.levels.launches import LaunchList
from oar_conformance.levels.runtime_session import RuntimeContext, open_session  # noqa: F401
from oar_conformance.registry import Failure, conformance_test
from oar_conformance.tolerances import FLOAT32_EPS, FP64_MULTIPLIER

DESCRIPTION = ("the oar.models zoo trained for fixed deterministic steps against golden loss curves, "
               "and its forward output against an fp64 host run")
SESSION_KIND = "runtime"


def allowed_outliers(fraction: float, steps: int) -> int:
    return int(fraction * steps + 1e-9)


def compare_curve(name: str, losses: list[float], golden: dict) -> tuple[int, str]:
    """(steps outside the tolerance, a message naming the first) or raise Failure."""
    metric = golden["metrics"]["loss"]
    values = metric["values"]
    tolerance = {**zoo.DEFAULT_TOLERANCE, **golden.get("tolerance", {})}
    steps = list(range(metric["start_step"], metric["end_step"] + 1, metric["step_interval"]))
    if len(losses) < steps[-1]:
        raise Failure(f"{name}: trained {len(losses)} steps, the golden curve has {steps[-1]}")
    outliers = []
    for step, want in zip(steps, values):
        got = losses[step - 1]
        if not math.isfinite(got):
            raise Failure(f"{name}: loss is {got} at step {step} (golden {want:.6g})")
        if abs(got - want) > tolerance["atol"] + tolerance["rtol"] * abs(want):
            outliers.append((step, got, want))
    allowed = allowed_outliers(tolerance["max_outlier_fraction"], len(steps))
    if len(outliers) > allowed:
        step, got, want = outliers[0]
        raise Failure(f"{name}: {len(outliers)} of {len(steps)} steps off the golden curve by more than rtol "
                      f"{tolerance['rtol']:g} (at most {allowed} may be); first at step {step}: loss {got:.6g}, "
                      f"golden {want:.6g}")
    message = ""
    if outliers:
        step, got, want = outliers[0]
        message = f"step {step}: loss {got:.6g}, golden {want:.6g}"
    return len(outliers), message


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    difference = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return float(np.sqrt(np.mean(difference * difference))) if difference.size else 0.0


def compare_fp64(name: str, got: np.ndarray, fp32: np.ndarray, fp64: np.ndarray, dtype: str = "float32",
                 details: dict | None = None) -> dict:
    """The fp64 check: its numbers (also put into ``details``); Failure when the device's error is too large."""
    if np.shape(got) != np.shape(fp64):
        raise Failure(f"{name}: forward output shape {np.shape(got)}, the host run's {np.shape(fp64)}")
    if not np.all(np.isfinite(np.asarray(got, dtype=np.float64))):
        raise Failure(f"{name}: the forward output has NaN or infinite values")
    multiplier = FP64_MULTIPLIER[dtype]
    error, reference_error = _rmse(got, fp64), _rmse(fp32, fp64)
    floor = FLOAT32_EPS * float(np.sqrt(np.mean(np.square(np.asarray(fp64, dtype=np.float64)))))
    numbers = {"rmse_device_fp64": error, "rmse_fp32_fp64": reference_error, "multiplier": multiplier,
               "floor": floor, "ratio": error / reference_error if reference_error else None}
    if details is not None:
        details.update(numbers)
    if not error <= multiplier * reference_error + floor:
        raise Failure(f"{name}: the forward output is {error:.3g} (rmse) from the fp64 host run, more than "
                      f"{multiplier:g} x the fp32 host run's {reference_error:.3g} (+ {floor:.2g})"
                      + (f": {error / reference_error:.3g} x" if reference_error else ""))
    return numbers


def _fallen_back(before: dict, after: dict) -> list[str]:
    return sorted(op for op, count in after.items() if count > before.get(op, 0))


def _record_ops(ctx: RuntimeContext, launches: LaunchList, fell_back: list[str]) -> None:
    """Which ops of the model ran on the device and which through the host fallback (for the report)."""
    ctx.details["model"] = ctx.details.get("model") or ctx.test.id.split(".")[1]
    ctx.details["device_ops"] = sorted(set(launches.distinct()) - set(fell_back))
    if fell_back:
        ctx.details["fallback_ops"] = fell_back


def run_loss(ctx: RuntimeContext, name: str) -> None:
    from oar import fallback

    model = zoo.MODELS[name]
    golden = zoo.load_golden(name)
    metric = golden["metrics"]["loss"]
    steps = list(range(metric["start_step"], metric["end_step"] + 1, metric["step_interval"]))
    ctx.details.update(model=name, steps=steps, golden=metric["values"],
                       rtol=golden.get("tolerance", model.tolerance)["rtol"])
    launches = LaunchList()
    try:
        module = model.build(ctx.device)
        before = fallback.fallback_stats()
        with ctx.oar.capture.observe(launches):
            losses = model.train(module, ctx.device, model.steps)
    except ctx.oar.OarError as error:
        raise Failure(f"{name}: training raised {type(error).__name__}: {error}") from error
    ctx.details["loss"] = [round(loss, 7) if math.isfinite(loss) else None for loss in losses]
    fell_back = _fallen_back(before, fallback.fallback_stats())
    _record_ops(ctx, launches, fell_back)
    outliers, first = compare_curve(name, losses, golden)
    ctx.details["outliers"] = outliers
    if first:
        ctx.details["first_outlier"] = first


def run_fp64(ctx: RuntimeContext, name: str) -> None:
    import oar
    from oar import fallback

    model = zoo.MODELS[name]
    inputs = model.sample()
    launches = LaunchList()
    try:
        module = model.build(ctx.device)
        before = fallback.fallback_stats()
        with oar.no_grad(), oar.capture.observe(launches):
            got = module(oar.tensor(inputs, device=ctx.device)).numpy()
    except oar.OarError as error:
        raise Failure(f"{name}: the forward raised {type(error).__name__}: {error}") from error
    fell_back = _fallen_back(before, fallback.fallback_stats())
    _record_ops(ctx, launches, fell_back)
    weights = model.weights()
    fp32 = model.host_forward(weights, inputs, np.float32)
    fp64 = model.host_forward(weights, inputs, np.float64)
    compare_fp64(name, got, fp32, fp64, model.dtype, ctx.details)


def _register(name: str) -> None:
    model = zoo.MODELS[name]

    def loss(ctx: RuntimeContext) -> None:
        run_loss(ctx, name)

    def fp64(ctx: RuntimeContext) -> None:
        run_fp64(ctx, name)

    loss.__name__, fp64.__name__ = f"model_{name}_loss", f"model_{name}_fp64"
    loss.__doc__ = f"{model.description}: {model.steps} steps against the golden loss curve."
    fp64.__doc__ = f"{model.description}: the forward output against an fp64 host run."
    conformance_test(f"models.{name}.loss")(loss)
    conformance_test(f"models.{name}.fp64")(fp64)


for _name in zoo.MODELS:
    _register(_name)


def report_extras(results: list[dict]) -> dict:
    """Loss curves against golden curves, for the HTML report."""
    curves = []
    for result in results:
        details = result.get("details") or {}
        if "steps" not in details:
            continue
        loss = details.get("loss") or []
        curves.append({"id": result["id"], "model": details.get("model"), "status": result["status"],
                       "message": result.get("message", ""), "steps": details["steps"],
                       "loss": [loss[s - 1] if s - 1 < len(loss) else None for s in details["steps"]],
                       "golden": details.get("golden", []), "rtol": details.get("rtol")})
    coverage: dict[str, dict[str, set]] = {}
    for result in results:
        details = result.get("details") or {}
        if "device_ops" not in details:
            continue
        model = coverage.setdefault(details.get("model") or result["id"].split(".")[1],
                                    {"device_ops": set(), "fallback_ops": set()})
        model["device_ops"].update(details["device_ops"])
        model["fallback_ops"].update(details.get("fallback_ops") or [])
    ops = [{"model": name, "fallback_ops": sorted(found["fallback_ops"]),
            "device_ops": sorted(found["device_ops"] - found["fallback_ops"])}
           for name, found in coverage.items()]
    ops.sort(key=lambda row: (not row["fallback_ops"], row["model"]))  # models with fallbacks first
    return {"curves": curves, "ops": ops}

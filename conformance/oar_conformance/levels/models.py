"""Level ``models``: the model zoo (:mod:`oar_conformance.zoo`) trained on the device for a
fixed number of deterministic steps, loss curves against golden curves recorded on
the reference plugin.

One test per model, ``models.<name>``. Per step the loss must satisfy
``|loss - golden| <= atol + rtol * |golden|`` (the golden file's tolerance:
rtol 0.02, atol 1e-3); at most 5% of the steps may miss (Megatron-LM's
practice), and a NaN or infinite loss fails at once. The curve and the golden
one are kept in the result (``details``) and drawn in the HTML report. Ops the
runtime ran through its host fallback during training are listed in the
result; the model still passes if its curve does.
"""

from __future__ import annotations

import math

from oar_conformance import zoo
from oar_conformance.levels.runtime_session import RuntimeContext, open_session  # noqa: F401
from oar_conformance.registry import Failure, conformance_test

DESCRIPTION = "models trained for a fixed number of deterministic steps, loss curves against golden curves"
SESSION_KIND = "runtime"


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
    allowed = int(tolerance["max_outlier_fraction"] * len(steps))
    if len(outliers) > allowed:
        step, got, want = outliers[0]
        raise Failure(f"{name}: {len(outliers)} of {len(steps)} steps off the golden curve by more than rtol "
                      f"{tolerance['rtol']:g} (at most {allowed} may be); first at step {step}: loss {got:.6g}, "
                      f"golden {want:.6g}")
    return len(outliers), ""


def run_model(ctx: RuntimeContext, name: str) -> None:
    from oar import fallback

    model = zoo.MODELS[name]
    golden = zoo.load_golden(name)
    before = fallback.fallback_stats()
    metric = golden["metrics"]["loss"]
    steps = list(range(metric["start_step"], metric["end_step"] + 1, metric["step_interval"]))
    ctx.details.update(model=name, steps=steps, golden=metric["values"],
                       rtol=golden.get("tolerance", zoo.DEFAULT_TOLERANCE)["rtol"])
    try:
        losses = model.train(ctx.device, model.steps)
    except ctx.oar.OarError as error:
        raise Failure(f"{name}: training raised {type(error).__name__}: {error}") from error
    ctx.details["loss"] = [round(loss, 7) if math.isfinite(loss) else None for loss in losses]
    after = fallback.fallback_stats()
    fell_back = sorted(op for op, count in after.items() if count > before.get(op, 0))
    if fell_back:
        ctx.details["fallback_ops"] = fell_back
    outliers, _ = compare_curve(name, losses, golden)
    ctx.details["outliers"] = outliers


def _register(name: str) -> None:
    def test(ctx: RuntimeContext) -> None:
        run_model(ctx, name)

    test.__name__ = f"model_{name}"
    test.__doc__ = f"{zoo.MODELS[name].description}: {zoo.MODELS[name].steps} steps against the golden loss curve."
    conformance_test(f"models.{name}")(test)


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
    return {"curves": curves}

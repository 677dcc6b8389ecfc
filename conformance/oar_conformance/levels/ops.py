"""Level ``ops``: every op of interface/ops.yaml x every dtype it lists x generated cases, on the device.

Test ids are ``ops.<op>.<dtype>.<case>``: ``ops.add.float32.broadcast``,
``ops.sum.int64.attr_keepdim``, ``ops.conv2d.float32.grad``. The cases come
from the op's fields in ops.yaml and a small table of what ops.yaml cannot say
(:mod:`oar_conformance.opcases`): basic, 0-d, empty, broadcast,
non-contiguous (transposed or sliced views), large, each defaulted attr at a
non-default value, each target dtype of a dtype attr, trailing optional
inputs left out, and for ops with a ``backward`` formula, the gradient.

A value case runs the op through oar's runtime on the device and compares
with the numpy reference of :mod:`oar.reference` (the host fallback's own
code) under the tolerance contract of :mod:`oar_conformance.tolerances`. A
``grad`` case differentiates the op on the device with oar's autograd
(seeded upstream gradient, every differentiable input) and compares each
gradient with a float64 host reference: central differences with Richardson
extrapolation of the same reference evaluated in float64, so the check is
independent of the backward formula and of the device.

Statuses: ``fallback`` when the result is right but the runtime's host
fallback computed it (the plugin has no kernel for that op and those dtypes:
the op's fallback counter moved; for a gradient, any op of the forward or
backward pass), ``fail`` when the values, shape or dtype differ or the op
raised, ``pass`` otherwise. View ops never reach a plugin and are not tested
here. rand, randn and dropout follow the Philox mapping of oar/refcpu.h bit
for bit (randn within float tolerance: libm's cos/sin/log1p may differ by an
ulp).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import oar_opset

from oar_conformance import opcases, repro
from oar_conformance.levels.launches import LaunchList
from oar_conformance.levels.runtime_session import RuntimeContext, open_session  # noqa: F401
from oar_conformance.registry import FAIL, ERROR, FALLBACK, PASS, SKIP, Failure, Fallback, conformance_test
from oar_conformance.tolerances import FLOAT_DTYPES, tolerance, within
from oar_opset import Op

DESCRIPTION = "every op of interface/ops.yaml x dtype x generated case (and gradient) against numpy references"
SESSION_KIND = "runtime"

FD_STEP = 1e-3          # the central differences' step; inputs of grad cases keep 0.1 away from kinks
FILLER = 99             # what lies between the elements of a sliced view (a kernel that reads it is caught)
SEVERITY = (ERROR, FAIL, FALLBACK, SKIP, PASS)  # worst first


def _numpy_dtype(name: str) -> np.dtype:
    from oar.tensor import numpy_dtype

    return np.dtype(numpy_dtype(name))


def device_tensor(array: np.ndarray, layout: str, device: str, requires_grad: bool = False):
    """``array`` on the device as a contiguous tensor, a permuted view of transposed storage
    (``permuted``), or every other element of the last dim of a larger buffer at an offset (``sliced``)."""
    from oar.tensor import to_tensor

    array = np.asarray(array)
    if layout == "permuted" and array.ndim >= 2:
        axes = tuple(reversed(range(array.ndim)))
        return to_tensor(np.ascontiguousarray(array.transpose(axes)), device=device).permute(*axes)
    if layout == "sliced" and array.ndim >= 1:
        shape = array.shape
        buffer = np.full([s + 1 for s in shape[:-1]] + [2 * shape[-1] + 1], FILLER).astype(array.dtype)
        index = tuple(slice(1, None) for _ in shape[:-1]) + (slice(1, None, 2),)
        buffer[index] = array
        return to_tensor(buffer, device=device)[index]
    return to_tensor(array, device=device, requires_grad=requires_grad)


def _host(array: np.ndarray) -> np.ndarray:
    """An input as a kernel's reference sees it: float16/bfloat16 widened to float32."""
    array = np.asarray(array)
    return array.astype(np.float32) if array.dtype.name in ("float16", "bfloat16") else array


def reference_result(op: str, spec: Op, case: opcases.Case) -> Any:
    from oar import reference

    function = getattr(reference, op)
    if spec.kind == "creation":
        return function(case.shape, _numpy_dtype(case.dtype), **case.attrs)
    host = [_host(x) for x in case.inputs]
    if spec.broadcast and op != "matmul":
        host = list(np.broadcast_arrays(*host))
    with np.errstate(all="ignore"):
        return function(*host, **case.attrs)


def compare(label: str, got: np.ndarray, want: np.ndarray, column: str) -> None:
    """Raise Failure unless got matches want under the contract's column for got's dtype (exact for ints)."""
    from oar import reference

    if got.shape != want.shape:
        raise Failure(f"{label}: output shape {got.shape}, the reference's {want.shape}")
    tol = tolerance(got.dtype.name, column)
    if tol is not None:
        w = want.astype(got.dtype).astype(np.float64) if column != "gradient" else want.astype(np.float64)
        g = got.astype(np.float64)
        scale = float(np.nanmax(np.abs(w))) if column == "gradient" and w.size else 1.0
        scale = scale if np.isfinite(scale) and scale > 0 else 1.0
        close = within(g, w, tol, scale)
        if not close.all():
            bad = np.argwhere(~close)
            first = tuple(int(i) for i in bad[0])
            error = np.nanmax(np.abs(g - w)[~close]) if np.isfinite(np.abs(g - w)[~close]).any() else np.inf
            atol = f"{tol.atol:g}" + (f" x {scale:.3g}" if scale != 1.0 else "")
            raise Failure(f"{label}: {len(bad)} of {g.size} values outside rtol {tol.rtol:g}, atol {atol}; "
                          f"first at {first}: got {g[first]:.9g}, want {w[first]:.9g}; max error {error:.3g}")
        return
    want_cast = reference.cast(want, got.dtype) if want.dtype.kind == "f" and got.dtype.kind in "iub" \
        else want.astype(got.dtype)
    differ = np.argwhere(got != want_cast)
    if differ.size:
        first = tuple(int(i) for i in differ[0])
        raise Failure(f"{label}: {len(differ)} of {got.size} values differ; first at {first}: "
                      f"got {got[first].item()!r}, want {want_cast[first].item()!r}")


def _fallback_moves(before: dict, after: dict) -> list[str]:
    return sorted(op for op, count in after.items() if count > before.get(op, 0))


def run_values(ctx: RuntimeContext, op: str, spec: Op, dtype: str, case: opcases.Case) -> None:
    import oar
    import oar.ops as ops

    label = f"{op} ({dtype}, {case.name})"
    function = getattr(ops, op)
    before = ctx.fallback_count(op)
    try:
        if spec.kind == "creation":
            result = function(case.shape, dtype=case.dtype, device=ctx.device, **case.attrs)
        else:
            tensors = [device_tensor(array, layout, ctx.device) for array, layout in zip(case.inputs, case.layouts)]
            result = function(*tensors, **case.attrs)
        outputs = result if isinstance(result, tuple) else (result,)
        got = [output.numpy() for output in outputs]
    except oar.OarError as error:
        raise Failure(f"{label} raised {type(error).__name__}: {error}") from error
    if case.out_dtype is not None and got[0].dtype.name != case.out_dtype:
        raise Failure(f"{label} gave a {got[0].dtype.name} output; ops.yaml's out_dtype "
                      f"{spec.out_dtype!r} gives {case.out_dtype}")
    want = reference_result(op, spec, case)
    wants = want if isinstance(want, tuple) else (want,)
    column = "accumulating" if opcases.is_accumulating(op, spec) else "elementwise"
    for index, (g, w) in enumerate(zip(got, wants)):
        compare(label if len(got) == 1 else f"{label} output {index}", g, np.asarray(w), column)
    ctx.details["output_dtype"] = got[0].dtype.name
    if ctx.fallback_count(op) - before:
        ctx.details["fallback"] = True
        raise Fallback(f"{label} ran through the host fallback: the plugin has no kernel for it")


def reference_gradients(op: str, spec: Op, case: opcases.Case, upstream: np.ndarray) -> list[np.ndarray]:
    """d sum(upstream * op(inputs)) / d input for each differentiable input, in float64: central
    differences of step h and h/2 combined by Richardson extrapolation (error O(h^4)) of the
    numpy reference evaluated on float64 inputs."""
    from oar import reference

    function = getattr(reference, op)
    upstream = np.asarray(upstream, dtype=np.float64)
    arrays = [np.array(a, dtype=np.float64) if np.asarray(a).dtype.name in FLOAT_DTYPES else np.asarray(a)
              for a in case.inputs]

    def loss() -> float:
        host = list(np.broadcast_arrays(*arrays)) if spec.broadcast and op != "matmul" else arrays
        with np.errstate(all="ignore"):
            return float(np.sum(upstream * np.asarray(function(*host, **case.attrs), dtype=np.float64)))

    gradients = []
    for index in case.differentiable:
        x = arrays[index] = np.array(arrays[index], order="C")  # a copy that keeps a 0-d input 0-d
        flat = x.reshape(-1)
        out = np.empty(x.size)
        for i in range(x.size):
            original = flat[i]

            def central(h: float) -> float:
                flat[i] = original + h
                plus = loss()
                flat[i] = original - h
                minus = loss()
                flat[i] = original
                return (plus - minus) / (2 * h)

            out[i] = (4.0 * central(FD_STEP / 2) - central(FD_STEP)) / 3.0
        gradients.append(out.reshape(x.shape))
    return gradients


def run_grad(ctx: RuntimeContext, op: str, spec: Op, dtype: str, case: opcases.Case,
             rng: np.random.Generator) -> None:
    import oar
    import oar.ops as ops
    from oar import fallback

    from oar import capture

    label = f"{op} ({dtype}) gradient"
    names = [i.name for i in spec.inputs]
    before = fallback.fallback_stats()
    launches = LaunchList()
    try:
        with capture.observe(launches):
            tensors = [device_tensor(array, "contiguous", ctx.device, requires_grad=index in case.differentiable)
                       for index, array in enumerate(case.inputs)]
            out = getattr(ops, op)(*tensors, **case.attrs)
            out_dtype = out.dtype.name
            upstream = opcases.values(rng, tuple(out.shape), out_dtype, -1.0, 1.0)
            out.backward(device_tensor(upstream, "contiguous", ctx.device))
        got = []
        for index in case.differentiable:
            grad = tensors[index].grad
            if grad is None:
                raise Failure(f"{label}: no gradient reached input {names[index]!r}")
            got.append(grad.numpy())
    except oar.OarError as error:
        raise Failure(f"{label} raised {type(error).__name__}: {error}; {launches.summary()}") from error
    ctx.details["kernels"] = launches.ops
    want = reference_gradients(op, spec, case, np.asarray(upstream).astype(np.float64))
    for index, g, w in zip(case.differentiable, got, want):
        if g.dtype.name != np.asarray(case.inputs[index]).dtype.name:
            raise Failure(f"{label}: the gradient of {names[index]!r} is {g.dtype.name}, the input "
                          f"{np.asarray(case.inputs[index]).dtype.name}")
        try:
            compare(f"{label} of {names[index]!r}", g, w, "gradient")
        except Failure as error:  # the bug may be in any kernel of the pass, not in the op's own
            raise Failure(f"{error}\n  {launches.summary()}") from None
    moved = _fallback_moves(before, fallback.fallback_stats())
    if moved:
        ctx.details["fallback_ops"] = moved
        raise Fallback(f"{label}: {', '.join(moved)} ran through the host fallback (the plugin has no kernel)")


def run_case(ctx: RuntimeContext, op: str, dtype: str, name: str = "basic") -> None:
    spec = oar_opset.default()[op]
    seed = zlib.crc32(ctx.test.id.encode())
    rng = np.random.default_rng(seed)
    case = opcases.build(op, spec, dtype, name, rng)
    ctx.details["case"] = name
    ctx.details["seed"] = seed
    try:
        if case.grad:
            run_grad(ctx, op, spec, dtype, case, rng)
        else:
            run_values(ctx, op, spec, dtype, case)
    except Failure as error:  # what reproduces it: the kernel's inputs as it saw them, attrs, seed
        names = [i.name for i in spec.inputs]
        raise Failure(f"{error}\n{repro.describe(ctx.test.id, seed, names, case)}") from None


def test_list() -> list[tuple[str, str, str]]:
    """(op, dtype, case) of every test of the level, in ops.yaml's order."""
    found = []
    for spec in oar_opset.default():
        for dtype in spec.dtypes:
            for name in opcases.case_names(spec.name, spec, dtype):
                found.append((spec.name, dtype, name))
    return found


def _register(op: str, dtype: str, name: str, semantics: str) -> None:
    def test(ctx: RuntimeContext) -> None:
        run_case(ctx, op, dtype, name)

    test.__name__ = f"op_{op}_{dtype}_{name}"
    test.__doc__ = f"{op} on {dtype}, case {name}: {semantics}"
    conformance_test(f"ops.{op}.{dtype}.{name}")(test)


def _register_all() -> None:
    opset = oar_opset.default()
    for op, dtype, name in test_list():
        _register(op, dtype, name, opset[op].semantics)


_register_all()


def worst(statuses) -> str:
    present = set(statuses)
    return next((status for status in SEVERITY if status in present), PASS)


def report_extras(results: list[dict]) -> dict:
    """The op x dtype matrix of the HTML report: per cell the worst status over its cases and the counts."""
    order = ["float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool"]
    statuses: dict[str, dict[str, list[str]]] = {}
    seen: set[str] = set()
    for result in results:
        parts = result["id"].split(".")
        if len(parts) < 4:
            continue
        op, dtype = parts[1], parts[2]
        statuses.setdefault(op, {}).setdefault(dtype, []).append(result["status"])
        seen.add(dtype)
    dtypes = [d for d in order if d in seen] + sorted(seen - set(order))
    rows = []
    for op, cells in statuses.items():
        rows.append({"op": op, "cells": {dtype: worst(found) for dtype, found in cells.items()},
                     "counts": {dtype: {status: found.count(status) for status in SEVERITY if status in found}
                                for dtype, found in cells.items()}})
    return {"matrix": {"dtypes": dtypes, "rows": rows}}

"""Level ``ops``: every op of interface/ops.yaml, for every dtype it lists, on the device.

One test per (op, dtype), id ``ops.<op>.<dtype>``. Each builds seeded inputs
in the op's domain (elementwise inputs as transposed, non-contiguous views;
binary and ternary ops broadcast), runs the op through oar's runtime on the
device, and compares with the numpy reference of :mod:`oar.reference` (the
host fallback's own code) under the tolerance contract below. The status is
``fallback`` when the result is right but the runtime's host fallback computed
it (the plugin has no kernel for that op and those dtypes: the fallback
counter of the op moved), ``fail`` when the values, shape or dtype differ or
the op raised, ``pass`` otherwise. View ops never reach a plugin and are not
tested here.

Tolerance contract (|got - want| <= atol + rtol * |want|, NaN equal to NaN):

| dtype | elementwise | accumulating ops (sums, matmul, conv, norms, softmax, losses) |
|---|---|---|
| float64 | rtol 1e-10, atol 1e-12 | rtol 1e-9, atol 1e-11 |
| float32 | rtol 1e-5, atol 1e-6 | rtol 1e-4, atol 1e-5 |
| float16 | rtol 2e-3, atol 2e-3 | rtol 4e-3, atol 4e-3 |
| bfloat16 | rtol 1.6e-2, atol 1.6e-2 | rtol 3.2e-2, atol 3.2e-2 |
| ints, bool | exact | exact |

rand, randn and dropout follow the Philox mapping of oar/refcpu.h bit for
bit (randn within float tolerance: libm's cos/sin/log1p may differ by an ulp).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oar_conformance.levels.runtime_session import RuntimeContext, open_session  # noqa: F401
from oar_conformance.registry import Failure, Fallback, conformance_test

DESCRIPTION = "every op of interface/ops.yaml on the device against numpy references, per dtype"
SESSION_KIND = "runtime"

FLOATS = ("float64", "float32", "float16", "bfloat16")
TOLERANCES = {
    "float64": ((1e-10, 1e-12), (1e-9, 1e-11)),
    "float32": ((1e-5, 1e-6), (1e-4, 1e-5)),
    "float16": ((2e-3, 2e-3), (4e-3, 4e-3)),
    "bfloat16": ((1.6e-2, 1.6e-2), (3.2e-2, 3.2e-2)),
}
ACCUMULATING = {
    "sum", "mean", "var", "softmax", "log_softmax", "matmul", "bmm", "conv2d", "conv2d_backward_input",
    "conv2d_backward_weight", "avg_pool2d", "avg_pool2d_backward", "layer_norm", "layer_norm_backward_input",
    "rms_norm", "rms_norm_backward_input", "cross_entropy", "cross_entropy_backward", "scatter_add", "index_add",
    "randn",
}
# Ops whose tests get no strided (transposed) input: their inputs have roles beyond elementwise data.
POSITIVE = {"log", "sqrt", "rsqrt"}


def _numpy_dtype(name: str) -> np.dtype:
    from oar.tensor import numpy_dtype

    return np.dtype(numpy_dtype(name))


@dataclass
class Case:
    inputs: list = field(default_factory=list)       # numpy arrays, in launch order
    attrs: dict = field(default_factory=dict)
    transposed: set = field(default_factory=set)     # indices of inputs passed as transposed views
    shape: tuple | None = None                       # creation ops: the output shape
    dtype: str | None = None                         # creation ops: the output dtype


def values(rng: np.random.Generator, shape, dtype: str, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Seeded values of a dtype: floats uniform in [low, high), ints in [-20, 20], bools half true."""
    target = _numpy_dtype(dtype)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in FLOATS:
        return rng.uniform(low, high, shape).astype(np.float32).astype(target)
    return rng.integers(max(int(low * 10), -20), min(int(high * 10), 20) + 1, shape).astype(target)


def small_set(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Values from a small set, so comparisons see equal pairs."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return rng.integers(-3, 4, shape).astype(_numpy_dtype(dtype))


def _indices(rng, shape, bound, dtype="int64"):
    return rng.integers(0, bound, shape).astype(_numpy_dtype(dtype))


def build_case(op: str, dtype: str, schema: dict, rng: np.random.Generator) -> Case:
    kind = schema["kind"]
    if kind == "creation":
        if op == "full":
            value = {"bool": 1.0}.get(dtype, 2.5 if dtype in FLOATS else 7.0)
            return Case(attrs={"value": value}, shape=(3, 17), dtype=dtype)
        if op == "arange":
            attrs = {"start": 1.5, "step": 0.5} if dtype in FLOATS else {"start": 2.0, "step": 3.0}
            return Case(attrs=attrs, shape=(19,), dtype=dtype)
        return Case(attrs={"seed": 1234567, "offset": 5}, shape=(4, 33), dtype=dtype)  # rand, randn
    if kind == "unary":
        low, high = (0.1, 4.0) if op in POSITIVE else (-2.0, 2.0)
        x = values(rng, (7, 5), dtype, low, high)
        if op == "reciprocal":
            x = (np.sign(x.astype(np.float64)) * np.abs(x.astype(np.float64)) + np.sign(x.astype(np.float64)) * 0.5)
            x = np.where(x == 0, 1.0, x).astype(_numpy_dtype(dtype))
        if op == "sign" or op == "logical_not":
            x = np.where(rng.random(x.shape) < 0.3, np.zeros((), x.dtype), x)
        if op == "isnan":
            x = np.where(rng.random(x.shape) < 0.3, np.array(np.nan, dtype=x.dtype), x)
        attrs: dict[str, Any] = {}
        if op == "clamp":
            attrs = {"min": -0.5, "max": 0.75} if dtype in FLOATS else {"min": -5.0, "max": 5.0}
        elif op == "cast":
            attrs = {"dtype": "int32" if dtype == "float32" else "float32"}
            if dtype == "float32":
                x = values(rng, (7, 5), dtype, -100.0, 100.0) * np.float32(10.0)
        elif op == "dropout":
            attrs = {"p": 0.25, "seed": 99, "offset": 3}
        return Case(inputs=[x], attrs=attrs, transposed={0})
    if kind in ("binary", "ternary"):
        if op == "where":
            condition = rng.random((4, 5, 6)) < 0.5
            return Case(inputs=[condition, values(rng, (4, 1, 6), dtype), values(rng, (5, 1), dtype)])
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            return Case(inputs=[small_set(rng, (4, 1, 6), dtype), small_set(rng, (5, 1), dtype)])
        if op == "gelu_backward":
            return Case(inputs=[values(rng, (5, 6), dtype), values(rng, (6, 5), dtype).T.copy()], transposed={1})
        a, b = values(rng, (4, 1, 6), dtype), values(rng, (5, 1), dtype)
        if op == "div":
            b = np.where(np.abs(b.astype(np.float64)) < 0.5, np.asarray(1.0, b.dtype), b)
        if op == "pow":
            a = values(rng, (4, 1, 6), dtype, 0.5, 2.0)
            b = values(rng, (5, 1), dtype, -1.5, 1.5)
        return Case(inputs=[a, b])
    if kind == "reduction":
        x = values(rng, (6, 33), dtype)
        attrs = {"sum": {"dim": [0], "keepdim": True}, "mean": {"dim": [1]}, "max": {"dim": [1]},
                 "min": {"dim": [0]}, "var": {"dim": [1]}, "argmax": {"dim": 1},
                 "softmax": {"dim": -1}, "log_softmax": {"dim": 0}}[op]
        return Case(inputs=[x], attrs=attrs)
    if op == "matmul":
        return Case(inputs=[values(rng, (7, 13), dtype, -1, 1), values(rng, (13, 5), dtype, -1, 1)])
    if op == "bmm":
        return Case(inputs=[values(rng, (3, 7, 13), dtype, -1, 1), values(rng, (3, 13, 5), dtype, -1, 1)])
    conv = {"padding": [1, 1]}
    if op == "conv2d":
        return Case(inputs=[values(rng, (2, 3, 9, 9), dtype, -1, 1), values(rng, (4, 3, 3, 3), dtype, -1, 1),
                            values(rng, (4,), dtype, -1, 1)], attrs=conv)
    if op == "conv2d_backward_input":
        return Case(inputs=[values(rng, (2, 4, 9, 9), dtype, -1, 1), values(rng, (4, 3, 3, 3), dtype, -1, 1)],
                    attrs={**conv, "input_shape": [2, 3, 9, 9]})
    if op == "conv2d_backward_weight":
        return Case(inputs=[values(rng, (2, 4, 9, 9), dtype, -1, 1), values(rng, (2, 3, 9, 9), dtype, -1, 1)],
                    attrs={**conv, "weight_shape": [4, 3, 3, 3]})
    if op in ("max_pool2d", "avg_pool2d"):
        return Case(inputs=[values(rng, (2, 3, 8, 8), dtype)], attrs={"kernel_size": [2, 2]})
    if op in ("max_pool2d_backward", "avg_pool2d_backward"):
        return Case(inputs=[values(rng, (2, 3, 4, 4), dtype), values(rng, (2, 3, 8, 8), dtype)],
                    attrs={"kernel_size": [2, 2]})
    if op == "layer_norm":
        return Case(inputs=[values(rng, (4, 16), dtype), values(rng, (16,), dtype), values(rng, (16,), dtype)])
    if op == "rms_norm":
        return Case(inputs=[values(rng, (4, 16), dtype), values(rng, (16,), dtype)])
    if op in ("layer_norm_backward_input", "rms_norm_backward_input"):
        return Case(inputs=[values(rng, (4, 16), dtype), values(rng, (4, 16), dtype), values(rng, (16,), dtype)])
    if op == "embedding":
        return Case(inputs=[values(rng, (10, 6), dtype), _indices(rng, (3, 4), 10)])
    if op == "cross_entropy":
        target = _indices(rng, (5,), 7)
        target[2] = -100  # ignore_index
        return Case(inputs=[values(rng, (5, 7), dtype), target])
    if op == "cross_entropy_backward":
        target = _indices(rng, (5,), 7)
        target[2] = -100
        return Case(inputs=[np.asarray(1.5, dtype=_numpy_dtype(dtype)), values(rng, (5, 7), dtype), target])
    if op == "gather":
        return Case(inputs=[values(rng, (4, 5), dtype), _indices(rng, (4, 3), 5)], attrs={"dim": 1})
    if op == "scatter":
        unique = np.stack([rng.permutation(5)[:3] for _ in range(4)]).astype(np.int64)  # no write order to agree on
        return Case(inputs=[values(rng, (4, 5), dtype), unique, values(rng, (4, 3), dtype)], attrs={"dim": 1})
    if op == "scatter_add":
        return Case(inputs=[values(rng, (4, 5), dtype), _indices(rng, (4, 3), 5), values(rng, (4, 3), dtype)],
                    attrs={"dim": 1})
    if op == "index_select":
        return Case(inputs=[values(rng, (5, 4), dtype), _indices(rng, (3,), 5)], attrs={"dim": 0})
    if op == "index_add":
        return Case(inputs=[values(rng, (5, 4), dtype), values(rng, (3, 4), dtype), _indices(rng, (3,), 5)],
                    attrs={"dim": 0})
    if op == "one_hot":
        return Case(inputs=[_indices(rng, (6,), 5, dtype)], attrs={"num_classes": 5})
    if op in ("tril", "triu"):
        return Case(inputs=[values(rng, (5, 6), dtype)], attrs={"diagonal": 1 if op == "tril" else -1},
                    transposed=set())
    raise NotImplementedError(f"the ops level has no input recipe for op {op!r}")


def reference_result(op: str, schema: dict, case: Case) -> Any:
    from oar import reference

    function = getattr(reference, op)
    if schema["kind"] == "creation":
        return function(case.shape, _numpy_dtype(case.dtype), **case.attrs)
    host = [np.asarray(x).astype(np.float32) if np.asarray(x).dtype.name in ("float16", "bfloat16") else x
            for x in case.inputs]
    if schema["broadcast"] and op != "matmul":
        host = list(np.broadcast_arrays(*host))
    with np.errstate(all="ignore"):
        return function(*host, **case.attrs)


def _as_host(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64) if array.dtype.kind == "V" or array.dtype.name == "bfloat16" else array


def compare(op: str, got: np.ndarray, want: np.ndarray, dtype_name: str) -> None:
    from oar.reference import _cast_array

    if got.shape != want.shape:
        raise Failure(f"{op}: output shape {got.shape}, the reference's {want.shape}")
    if got.dtype.name in FLOATS:
        want_cast = want.astype(got.dtype)
        rtol, atol = TOLERANCES[got.dtype.name][op in ACCUMULATING]
        g, w = got.astype(np.float64), want_cast.astype(np.float64)
        close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            bad = np.argwhere(~close)
            first = tuple(int(i) for i in bad[0])
            error = np.nanmax(np.abs(g - w)[~close])
            raise Failure(f"{op} ({dtype_name}): {len(bad)} of {g.size} values outside rtol {rtol:g}, atol {atol:g}; "
                          f"first at {first}: got {g[first]:.9g}, want {w[first]:.9g}; max error {error:.3g}")
        return
    want_cast = _cast_array(want, got.dtype) if want.dtype.kind == "f" and got.dtype.kind in "iub" \
        else want.astype(got.dtype)
    differ = np.argwhere(got != want_cast)
    if differ.size:
        first = tuple(int(i) for i in differ[0])
        raise Failure(f"{op} ({dtype_name}): {len(differ)} of {got.size} values differ; first at {first}: "
                      f"got {got[first].item()!r}, want {want_cast[first].item()!r}")


def run_case(ctx: RuntimeContext, op: str, dtype: str) -> None:
    import oar
    import oar.ops as ops
    from oar.tensor import to_tensor

    schema = ops.schema(op)
    rng = np.random.default_rng(zlib.crc32(ctx.test.id.encode()))
    case = build_case(op, dtype, schema, rng)
    function = getattr(ops, op)
    before = ctx.fallback_count(op)
    try:
        if schema["kind"] == "creation":
            result = function(case.shape, dtype=case.dtype, device=ctx.device, **case.attrs)
        else:
            tensors = []
            for index, array in enumerate(case.inputs):
                if index in case.transposed and np.ndim(array) == 2:
                    tensors.append(to_tensor(np.ascontiguousarray(array.T), device=ctx.device).T)
                else:
                    tensors.append(to_tensor(array, device=ctx.device))
            result = function(*tensors, **case.attrs)
        outputs = result if isinstance(result, tuple) else (result,)
        got = [output.numpy() for output in outputs]
    except oar.OarError as error:
        raise Failure(f"{op} ({dtype}) raised {type(error).__name__}: {error}") from error
    want = reference_result(op, schema, case)
    wants = want if isinstance(want, tuple) else (want,)
    for index, (g, w) in enumerate(zip(got, wants)):
        compare(op if len(got) == 1 else f"{op} output {index}", g, np.asarray(w), dtype)
    ctx.details["output_dtype"] = got[0].dtype.name
    fell_back = ctx.fallback_count(op) - before
    if fell_back:
        ctx.details["fallback"] = True
        raise Fallback(f"{op} ({dtype}) ran through the host fallback: the plugin has no kernel for it")


def _op_list() -> list[tuple[str, str, dict]]:
    import oar.ops as ops

    cases = []
    for name in ops.names:
        schema = ops.schema(name)
        if schema["kind"] == "view":
            continue
        for dtype in schema["dtypes"]:
            cases.append((name, dtype, schema))
    return cases


def _register(op: str, dtype: str, schema: dict) -> None:
    def test(ctx: RuntimeContext) -> None:
        run_case(ctx, op, dtype)

    test.__name__ = f"op_{op}_{dtype}"
    test.__doc__ = f"{op} on {dtype}: {schema['semantics']}"
    conformance_test(f"ops.{op}.{dtype}")(test)


for _op, _dtype, _schema in _op_list():
    _register(_op, _dtype, _schema)


def report_extras(results: list[dict]) -> dict:
    """The op x dtype matrix of the HTML report."""
    order = ["float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool"]
    rows: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for result in results:
        _, op, dtype = result["id"].split(".", 2)
        rows.setdefault(op, {})[dtype] = result["status"]
        seen.add(dtype)
    dtypes = [d for d in order if d in seen] + sorted(seen - set(order))
    return {"matrix": {"dtypes": dtypes, "rows": [{"op": op, "cells": cells} for op, cells in rows.items()]}}

"""What reproduces an ops-level test: its inputs' layouts for failure messages, and a standalone script.

:func:`describe` is the text an ops failure ends with (every input's shape,
strides, storage offset and dtype as the kernel sees them, the attrs, the
seed); :func:`script` is what ``conformance repro TEST_ID`` prints: a Python
script that needs only oar and numpy, carries the test's exact inputs and the
reference's answer, runs the op (and its backward, for a ``grad`` case) on
the plugin, and exits 1 with the first mismatch or 0 when it agrees.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

import numpy as np

__all__ = ["layout_of", "describe", "script"]

FILLER = 99  # the same filler as the ops level's sliced views


def _view(array: np.ndarray, layout: str) -> np.ndarray:
    """A numpy view laid out as the ops level lays out the device tensor (see levels.ops.device_tensor)."""
    if layout == "permuted" and array.ndim >= 2:
        axes = tuple(reversed(range(array.ndim)))
        return np.ascontiguousarray(array.transpose(axes)).transpose(axes)
    if layout == "sliced" and array.ndim >= 1:
        shape = array.shape
        buffer = np.full([s + 1 for s in shape[:-1]] + [2 * shape[-1] + 1], FILLER).astype(array.dtype)
        index = tuple(slice(1, None) for _ in shape[:-1]) + (slice(1, None, 2),)
        buffer[index] = array
        return buffer[index]
    return np.ascontiguousarray(array)


def layout_of(array: Any, layout: str) -> tuple[tuple, tuple, int]:
    """(shape, strides in elements, storage offset in elements) of the input as the kernel gets it."""
    array = np.asarray(array)
    view = _view(array, layout)
    item = view.itemsize
    strides = tuple(s // item for s in view.strides)
    offset = 0
    if view.base is not None and layout == "sliced":
        offset = (view.__array_interface__["data"][0] - view.base.__array_interface__["data"][0]) // item
    return tuple(view.shape), strides, offset


def describe(test_id: str, seed: int, names: list[str], case: Any) -> str:
    """The lines an ops failure ends with: what the kernel was given, and how to rerun it alone."""
    lines = []
    for name, array, layout in zip(names, case.inputs, case.layouts or ["contiguous"] * len(case.inputs)):
        array = np.asarray(array)
        shape, strides, offset = layout_of(array, layout)
        lines.append(f"  input {name}: {array.dtype.name} shape {shape} strides {strides} offset {offset} ({layout})")
    if case.shape is not None:
        lines.append(f"  output: {case.dtype} shape {tuple(case.shape)}")
    lines.append(f"  attrs: {case.attrs!r}; seed 0x{seed:08x} (crc32 of the test id)")
    lines.append(f"  reproduce: conformance repro {test_id}")
    return "\n".join(lines)


def _packed(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    return base64.b64encode(zlib.compress(array.tobytes(), 9)).decode("ascii")


def _array_literal(array: Any) -> str:
    array = np.asarray(array)
    return f"unpack({array.dtype.name!r}, {tuple(array.shape)!r}, {_packed(array)!r})"


_TEMPLATE = '''#!/usr/bin/env python3
"""Reproduces conformance test {test_id}: {summary}.

Standalone: needs oar and numpy only. Runs on the plugin {plugin!r}
(device type {device!r}); edit PLUGIN to try another build. Exit status 0 when
the plugin agrees with the reference, 1 with the first mismatch otherwise.
"""
import base64
import os
import sys
import zlib

import numpy as np

PLUGIN = {plugin!r}
DEVICE = {device!r}
os.environ["OAR_PLUGIN_PATH"] = os.pathsep.join(p for p in (PLUGIN, os.environ.get("OAR_PLUGIN_PATH", "")) if p)

import oar  # noqa: E402  (after OAR_PLUGIN_PATH, so the plugin above serves DEVICE)
import oar.ops  # noqa: E402
from oar.tensor import numpy_dtype, to_tensor  # noqa: E402


def unpack(dtype, shape, data):
    return np.frombuffer(zlib.decompress(base64.b64decode(data)), dtype=np.dtype(numpy_dtype(dtype))).reshape(shape).copy()


def device_tensor(array, layout, requires_grad=False):
    """The input laid out as the test lays it out: compact, a permuted view, or a strided slice at an offset."""
    if layout == "permuted" and array.ndim >= 2:
        axes = tuple(reversed(range(array.ndim)))
        return to_tensor(np.ascontiguousarray(array.transpose(axes)), device=DEVICE).permute(*axes)
    if layout == "sliced" and array.ndim >= 1:
        buffer = np.full([s + 1 for s in array.shape[:-1]] + [2 * array.shape[-1] + 1], {filler}).astype(array.dtype)
        index = tuple(slice(1, None) for _ in array.shape[:-1]) + (slice(1, None, 2),)
        buffer[index] = array
        return to_tensor(buffer, device=DEVICE)[index]
    return to_tensor(array, device=DEVICE, requires_grad=requires_grad)


def check(what, got, want, rtol, atol, exact):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        sys.exit(f"FAIL {{what}}: shape {{got.shape}}, the reference's {{want.shape}}")
    if exact:
        bad = np.argwhere(got != want.astype(got.dtype))
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        bad = np.argwhere(~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
    if bad.size:
        first = tuple(int(i) for i in bad[0])
        sys.exit(f"FAIL {{what}}: {{len(bad)}} of {{got.size}} values differ (rtol {{rtol:g}}, atol {{atol:g}}); "
                 f"first at {{first}}: got {{got[first].item()!r}}, want {{want[first].item()!r}}")


oar.set_device(DEVICE)
# name, value, layout; as the kernel gets it: {layouts}
INPUTS = [
{inputs}
]
ATTRS = {attrs!r}
{body}
print("ok: {test_id} agrees with the reference")
'''

_VALUES_BODY = '''tensors = [device_tensor(array, layout) for _, array, layout in INPUTS]
{call}
outputs = result if isinstance(result, tuple) else (result,)
WANT = [
{wants}
]
for index, (output, want) in enumerate(zip(outputs, WANT)):
    check(f"{op} output {{index}}", output.numpy(), want, rtol={rtol!r}, atol={atol!r}, exact={exact!r})
'''

_GRAD_BODY = '''DIFFERENTIABLE = {differentiable!r}
tensors = [device_tensor(array, "contiguous", requires_grad=index in DIFFERENTIABLE)
           for index, (_, array, _) in enumerate(INPUTS)]
out = oar.ops.{op}(*tensors, **ATTRS)
UPSTREAM = {upstream}
out.backward(device_tensor(UPSTREAM, "contiguous"))
WANT = [  # d sum(UPSTREAM * {op}(inputs)) / d input, float64 central differences of the host reference
{wants}
]
for index, want in zip(DIFFERENTIABLE, WANT):
    grad = tensors[index].grad
    if grad is None:
        sys.exit(f"FAIL no gradient reached input {{INPUTS[index][0]}}")
    scale = float(np.nanmax(np.abs(want))) if want.size else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0
    check(f"{op} gradient of {{INPUTS[index][0]}}", grad.numpy(), want, rtol={rtol!r}, atol={atol!r} * scale,
          exact=False)
'''


def script(test_id: str, plugin: str, device: str) -> str:
    """The standalone reproduction script of one ops-level test (see the module's docstring)."""
    import zlib as _zlib

    import oar_opset
    from oar_conformance import opcases
    from oar_conformance.levels import ops as level
    from oar_conformance.tolerances import tolerance

    parts = test_id.split(".")
    if len(parts) != 4 or parts[0] != "ops":
        raise ValueError(f"{test_id!r} is not an ops-level test id (ops.OP.DTYPE.CASE); repro covers the ops level")
    _, op, dtype, name = parts
    if op not in oar_opset.default():
        raise ValueError(f"{test_id!r}: no op {op!r} in ops.yaml")
    schema = oar_opset.default()[op]
    seed = _zlib.crc32(test_id.encode())
    rng = np.random.default_rng(seed)
    if dtype not in schema.dtypes or name not in opcases.case_names(op, schema, dtype):
        raise ValueError(f"{test_id!r}: no such case (see `conformance list --level ops`)")
    case = opcases.build(op, schema, dtype, name, rng)
    names = [i.name for i in schema.inputs][:len(case.inputs)]
    layouts = case.layouts or ["contiguous"] * len(case.inputs)
    input_lines = "\n".join(f"    ({n!r}, {_array_literal(a)}, {lay!r}),  # shape {s} strides {st} offset {off}"
                            for n, a, lay in zip(names, case.inputs, layouts)
                            for s, st, off in [layout_of(a, lay)])
    summary = f"{op} on {dtype}, case {name}, seed 0x{seed:08x}"
    if case.grad:
        reference_out = level.reference_result(op, schema, case)
        out = np.asarray(reference_out[0] if isinstance(reference_out, tuple) else reference_out)
        upstream = opcases.values(rng, tuple(out.shape), dtype, -1.0, 1.0)
        wants = level.reference_gradients(op, schema, case, np.asarray(upstream).astype(np.float64))
        tol = tolerance(dtype, "gradient")
        body = _GRAD_BODY.format(differentiable=list(case.differentiable), op=op, upstream=_array_literal(upstream),
                                 wants="\n".join(f"    {_array_literal(w)}," for w in wants),
                                 rtol=tol.rtol, atol=tol.atol)
    else:
        want = level.reference_result(op, schema, case)
        wants = want if isinstance(want, tuple) else (want,)
        column = "accumulating" if opcases.is_accumulating(op, schema) else "elementwise"
        out_dtype = case.out_dtype or (case.dtype if schema.kind == "creation" else dtype)
        tol = tolerance(out_dtype, column)
        exact = tol is None
        wants_cast = []
        for w in wants:
            w = np.asarray(w)
            if not exact and out_dtype in ("float16", "bfloat16", "float32", "float64"):
                w = w.astype(np.dtype(level._numpy_dtype(out_dtype))).astype(np.float64)
            wants_cast.append(w)
        if schema.kind == "creation":
            call = (f"result = oar.ops.{op}({tuple(case.shape)!r}, dtype={case.dtype!r}, device=DEVICE, **ATTRS)")
        else:
            call = f"result = oar.ops.{op}(*tensors, **ATTRS)"
        body = _VALUES_BODY.format(call=call, op=op, wants="\n".join(f"    {_array_literal(w)}," for w in wants_cast),
                                   rtol=tol.rtol if tol else 0.0, atol=tol.atol if tol else 0.0, exact=exact)
    return _TEMPLATE.format(test_id=test_id, summary=summary, plugin=plugin, device=device, filler=FILLER,
                            layouts="shape, strides and offset in elements", inputs=input_lines, attrs=case.attrs,
                            body=body)

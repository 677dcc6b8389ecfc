"""Control flow lowerings (If, Loop, Scan): run op by op, their bodies through the executor."""

from __future__ import annotations

import numpy as np

from oar import ops as O
from oar.onnx.lowering import lowering


def _flag(ctx, value) -> bool:
    return bool(ctx.np(value).reshape(-1)[0])


@lowering("If")
def _lower_if(ctx, attrs, inputs):
    branch = attrs["then_branch"] if _flag(ctx, inputs[0]) else attrs["else_branch"]
    return ctx.run_subgraph(branch, {}, ctx.env)


@lowering("Loop")
def _lower_loop(ctx, attrs, inputs):
    body = attrs["body"]
    max_trips = int(ctx.np(inputs[0]).reshape(())) if inputs[0] is not None else None
    keep_going = _flag(ctx, inputs[1]) if len(inputs) > 1 and inputs[1] is not None else True
    carried = list(inputs[2:])
    n_carried = len(carried)
    scans: list[list] = []
    trip = 0
    names = body.input_names
    while keep_going and (max_trips is None or trip < max_trips):
        feeds = {names[0]: np.asarray(trip, dtype=np.int64), names[1]: np.asarray(keep_going)}
        feeds.update(zip(names[2:], carried))
        outputs = ctx.run_subgraph(body, feeds, ctx.env)
        keep_going = _flag(ctx, outputs[0])
        carried = outputs[1:1 + n_carried]
        for k, value in enumerate(outputs[1 + n_carried:]):
            if len(scans) <= k:
                scans.append([])
            scans[k].append(value)
        trip += 1
    stacked = []
    for k in range(ctx.num_outputs - n_carried):
        values = [ctx.t(v) for v in scans[k]] if k < len(scans) else []
        if not values:
            raise NotImplementedError("Loop that runs no iteration but has scan outputs (their shape is unknown)")
        stacked.append(O.concat([O.reshape(v, shape=[1] + list(v.shape)) for v in values], dim=0))
    return carried + stacked


@lowering("Scan")
def _lower_scan(ctx, attrs, inputs):
    body = attrs["body"]
    n_scan_in = attrs["num_scan_inputs"]
    n_state = len(inputs) - n_scan_in
    state = list(inputs[:n_state])
    scan_inputs = [ctx.t(v) for v in inputs[n_state:]]
    in_axes = list(attrs.get("scan_input_axes", [0] * n_scan_in))
    in_dirs = list(attrs.get("scan_input_directions", [0] * n_scan_in))
    n_scan_out = ctx.num_outputs - n_state
    out_axes = list(attrs.get("scan_output_axes", [0] * n_scan_out))
    out_dirs = list(attrs.get("scan_output_directions", [0] * n_scan_out))
    length = scan_inputs[0].shape[in_axes[0] % len(scan_inputs[0].shape)]
    collected: list[list] = [[] for _ in range(n_scan_out)]
    names = body.input_names
    for step in range(length):
        feeds = dict(zip(names[:n_state], state))
        for k, x in enumerate(scan_inputs):
            axis = in_axes[k] % len(x.shape)
            i = length - 1 - step if in_dirs[k] else step
            piece = O.slice(x, dim=axis, start=i, stop=i + 1)
            feeds[names[n_state + k]] = O.reshape(piece, shape=[d for a, d in enumerate(x.shape) if a != axis])
        outputs = ctx.run_subgraph(body, feeds, ctx.env)
        state = outputs[:n_state]
        for k, value in enumerate(outputs[n_state:]):
            collected[k].append(ctx.t(value))
    results = []
    for k, values in enumerate(collected):
        if out_dirs[k]:
            values = values[::-1]
        rank = len(values[0].shape) + 1
        axis = out_axes[k] % rank
        results.append(O.concat([O.reshape(v, shape=list(v.shape[:axis]) + [1] + list(v.shape[axis:]))
                                 for v in values], dim=axis))
    return state + results

"""The recurrent cell ops (lstm_cell, gru_cell) and nn.LSTM/nn.GRU built on them, against torch:
the ops against torch's cell arithmetic (torch's fused cells run on CUDA only), the modules against
torch.nn.LSTM/GRU (forward 1e-5 in float32; every parameter's and the input's gradient 1e-10 in
float64) over layers, directions, batch_first, unbatched input and given initial states."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oar
from oar import nn
from oar import reference
from torch_compare import torch_gru_cell, torch_lstm_cell


def rnd(seed, *shape, scale=1.0):
    return np.random.default_rng(seed).uniform(-scale, scale, size=shape)


CELLS = {
    "lstm_cell": (torch_lstm_cell, lambda n, h: [(n, 4 * h), (n, h)]),
    "gru_cell": (torch_gru_cell, lambda n, h: [(n, 3 * h), (n, 3 * h), (n, h)]),
}


# ---- the ops -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(CELLS))
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-6), ("float64", 1e-14)])
def test_cell_op_matches_torch_and_the_reference(op, dtype, tol):
    torch_fn, shapes = CELLS[op]
    arrays = [rnd(k, *s, scale=4.0).astype(dtype) for k, s in enumerate(shapes(5, 33))]
    got = getattr(oar, op)(*[oar.tensor(a) for a in arrays]).numpy()
    want = torch_fn(*[torch.tensor(a) for a in arrays]).numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(getattr(reference, op)(*arrays), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", sorted(CELLS))
def test_cell_op_gradients_match_torch(op):
    torch_fn, shapes = CELLS[op]
    arrays = [rnd(10 + k, *s, scale=3.0) for k, s in enumerate(shapes(4, 6))]
    ours = [oar.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    w = rnd(20, *tuple(torch_fn(*theirs).shape))
    (getattr(oar, op)(*ours) * oar.tensor(w)).sum().backward()
    (torch_fn(*theirs) * torch.tensor(w)).sum().backward()
    for k, (o, t) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"input {k}")


@pytest.mark.parametrize("op", sorted(CELLS))
def test_fused_backward_op_and_the_recorded_backward_agree(op):
    """Plain backward runs the fused <op>_backward kernel; create_graph records the same arithmetic
    in ops. Both give torch's gradient, and the backward op matches oar.reference."""
    torch_fn, shapes = CELLS[op]
    arrays = [rnd(30 + k, *s, scale=3.0) for k, s in enumerate(shapes(3, 5))]
    w = rnd(40, *tuple(torch_fn(*[torch.tensor(a) for a in arrays]).shape))
    fused = getattr(oar, op + "_backward")(oar.tensor(w), *[oar.tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(fused, getattr(reference, op + "_backward")(w, *arrays), rtol=1e-13, atol=1e-13)
    ours = [oar.tensor(a, requires_grad=True) for a in arrays]
    recorded = oar.autograd.grad((getattr(oar, op)(*ours) * oar.tensor(w)).sum(), ours, create_graph=True)
    np.testing.assert_allclose(np.concatenate([g.numpy() for g in recorded], axis=1), fused, rtol=1e-13, atol=1e-13)


def test_cell_op_reads_strided_inputs():
    gates, c = rnd(1, 8, 3), rnd(2, 2, 3)  # gates stored transposed: a [3, 8] view with strides (1, 3)
    view = oar.transpose(oar.tensor(gates), dim0=0, dim1=1)
    np.testing.assert_allclose(oar.lstm_cell(view, oar.tensor(c.T.copy())).numpy(),
                               reference.lstm_cell(gates.T, c.T), rtol=1e-14, atol=1e-14)


def test_cell_op_shape_errors_name_the_input():
    with pytest.raises(oar.ShapeError, match=r"lstm_cell: input 'gates' must have shape \(2, 12\)"):
        oar.lstm_cell(oar.tensor(rnd(1, 2, 8)), oar.tensor(rnd(2, 2, 3)))
    with pytest.raises(oar.ShapeError, match=r"gru_cell: input 'hidden_gates' must have shape \(2, 9\)"):
        oar.gru_cell(oar.tensor(rnd(1, 2, 9)), oar.tensor(rnd(2, 3, 9)), oar.tensor(rnd(3, 2, 3)))
    with pytest.raises(oar.ShapeError, match="gru_cell: input 'h_prev' must be \\[N, H\\]"):
        oar.gru_cell(oar.tensor(rnd(1, 2, 9)), oar.tensor(rnd(2, 2, 9)), oar.tensor(rnd(3, 2, 3, 1)))


def test_cell_op_with_no_rows():
    out = oar.lstm_cell(oar.zeros([0, 8]), oar.zeros([0, 2]))
    assert out.shape == (0, 4)


# ---- the modules -------------------------------------------------------------------------------------

def _pair(kind, dtype, **config):
    torch.manual_seed(0)
    theirs = getattr(torch.nn, kind)(5, 6, dtype=getattr(torch, dtype), **config)
    ours = getattr(nn, kind)(5, 6, dtype=getattr(oar, dtype), **config)
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in theirs.named_parameters())
    with oar.no_grad():
        for name, p in theirs.named_parameters():
            getattr(ours, name).copy_(oar.tensor(p.detach().numpy()))
    return ours, theirs


def _states(kind, shape, seed, dtype):
    count = 2 if kind == "LSTM" else 1
    arrays = [rnd(seed + k, *shape).astype(dtype) for k in range(count)]
    return arrays if kind == "LSTM" else arrays[0]


def _as(states, make):
    return tuple(make(a) for a in states) if isinstance(states, list) else make(states)


def _flat(state):
    return list(state) if isinstance(state, tuple) else [state]


CONFIGS = [
    dict(num_layers=1),
    dict(num_layers=2, bidirectional=True),
    dict(num_layers=2, batch_first=True),
    dict(num_layers=3, batch_first=True, bidirectional=True, bias=False),
]
CONFIG_IDS = ["1layer", "2layers-bidir", "2layers-batch_first", "3layers-bidir-batch_first-nobias"]


def _run_both(kind, dtype, config, with_state, unbatched=False):
    ours, theirs = _pair(kind, dtype, **config)
    layers = config["num_layers"] * (2 if config.get("bidirectional") else 1)
    if unbatched:
        x, state_shape = rnd(1, 7, 5), (layers, 6)
    else:
        x = rnd(1, 3, 7, 5) if config.get("batch_first") else rnd(1, 7, 3, 5)
        state_shape = (layers, 3, 6)
    x = x.astype(dtype)
    state = _states(kind, state_shape, 40, dtype) if with_state else None
    ox, tx = oar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    o_state = None if state is None else _as(state, lambda a: oar.tensor(a, requires_grad=True))
    t_state = None if state is None else _as(state, lambda a: torch.tensor(a, requires_grad=True))
    return ours, theirs, (ox, o_state, *ours(ox, o_state)), (tx, t_state, *theirs(tx, t_state))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_module_forward_matches_torch_float32(kind, config, with_state):
    _, _, (_, _, o_out, o_final), (_, _, t_out, t_final) = _run_both(kind, "float32", config, with_state)
    assert o_out.shape == tuple(t_out.shape)
    np.testing.assert_allclose(o_out.numpy(), t_out.detach().numpy(), rtol=1e-5, atol=1e-5)
    for o, t in zip(_flat(o_final), _flat(t_final)):
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_module_gradients_match_torch_float64(kind, config):
    """Every parameter's, the input's and the initial state's gradient of a loss that reads the
    output and the final states."""
    ours, theirs, (ox, o_state, o_out, o_final), (tx, t_state, t_out, t_final) = _run_both(
        kind, "float64", config, with_state=True)
    weights = [rnd(60 + k, *tuple(t.shape)) for k, t in enumerate([t_out] + _flat(t_final))]
    sum(((o * oar.tensor(w)).sum() for o, w in zip([o_out] + _flat(o_final), weights))).backward()
    sum(((t * torch.tensor(w)).sum() for t, w in zip([t_out] + _flat(t_final), weights))).backward()
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(getattr(ours, name).grad.numpy(), p.grad.numpy(), rtol=1e-10, atol=1e-10,
                                   err_msg=name)
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-10, err_msg="input")
    for k, (o, t) in enumerate(zip(_flat(o_state), _flat(t_state))):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=f"state {k}")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_module_unbatched_input_matches_torch(kind):
    _, _, (_, _, o_out, o_final), (_, _, t_out, t_final) = _run_both(
        kind, "float64", dict(num_layers=2, bidirectional=True), with_state=True, unbatched=True)
    np.testing.assert_allclose(o_out.numpy(), t_out.detach().numpy(), rtol=1e-12, atol=1e-12)
    for o, t in zip(_flat(o_final), _flat(t_final)):
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_module_records_one_cell_op_per_step():
    """Each step is one fused cell: the autograd graph of a 4-step LSTM holds 4 lstm_cell nodes."""
    lstm = nn.LSTM(3, 4)
    out, _ = lstm(oar.tensor(rnd(1, 4, 2, 3).astype(np.float32)))
    seen, stack, cells = set(), [out.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        cells += type(node).__name__.lower().startswith("lstm_cell") or getattr(node, "op", None) == "lstm_cell"
        stack.extend(fn for fn, *_ in getattr(node, "next_functions", ()))
    assert cells == 4


# ---- ONNX LSTM/GRU lower onto the fused cells ---------------------------------------------------------

def _onnx_recurrent(kind, hidden, width, directions, linear_before_reset):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    gates = 4 if kind == "LSTM" else 3
    rng = np.random.default_rng(0)
    weights = {"W": rng.uniform(-0.5, 0.5, (directions, gates * hidden, width)),
               "R": rng.uniform(-0.5, 0.5, (directions, gates * hidden, hidden)),
               "B": rng.uniform(-0.5, 0.5, (directions, 2 * gates * hidden))}
    attrs = dict(hidden_size=hidden, direction="bidirectional" if directions == 2 else "forward")
    if kind == "GRU":
        attrs["linear_before_reset"] = linear_before_reset
    outs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    graph = helper.make_graph(
        [helper.make_node(kind, ["X", "W", "R", "B"], outs, **attrs)], "recurrent",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [5, 3, width])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None] * (4 if o == "Y" else 3)) for o in outs],
        [numpy_helper.from_array(a.astype(np.float32), name) for name, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("kind,directions,linear_before_reset,fused", [
    ("LSTM", 1, 0, True), ("LSTM", 2, 0, True), ("GRU", 2, 1, True),
    ("GRU", 1, 0, False),  # ONNX's default GRU applies r before the matmul: not torch's cell
])
def test_onnx_recurrent_layers_use_the_fused_cells(kind, directions, linear_before_reset, fused, monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    from oar import ops
    from oar.onnx.backend import OarBackend

    monkeypatch.setenv("OAR_ONNX_DEVICE", "refcpu")
    model = _onnx_recurrent(kind, 6, 4, directions, linear_before_reset)
    op = "lstm_cell" if kind == "LSTM" else "gru_cell"
    calls = []
    real = getattr(ops, op)
    monkeypatch.setattr(ops, op, lambda *args, **kw: calls.append(1) or real(*args, **kw))
    x = rnd(1, 5, 3, 4).astype(np.float32)
    got = OarBackend.prepare(model).run([x])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)
    assert len(calls) == (5 * directions if fused else 0)

"""Distributed tensors on 2 and 4 ranks (subprocesses on loopback, the CPU plugin's collectives):
every reshard transition, the propagation rules of ops.yaml's sharding section against numpy / torch
on the whole tensors, autograd through them against torch's gradients, the Linear / Embedding split
styles, a 2-d DP x TP mesh with ZeRO-1, and bad input raising on every rank (no hang).

Tolerances: float32 results of the sharded computation differ from the one-process ones only in
summation order (a matmul's inner dim split in two and the halves added), so 1e-5 relative."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_distributed import assert_all_ok, launch  # noqa: E402

pytest.importorskip("torch.distributed")

CHECKS = """
import torch
from oar.distributed import Shard, Replicate, Partial, ProcessMesh, shard_tensor, reshard, from_local
R = Replicate()
dist.init_process_group(timeout=60)
rank, n = dist.get_rank(), dist.get_world_size()
mesh = ProcessMesh(list(range(n)), dim_names=["tp"])
rng = np.random.default_rng(0)   # the same arrays on every rank

def close(name, got, want, tol=1e-5):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert np.allclose(got, want, rtol=tol, atol=tol), f"{name}: max |diff| {np.abs(got - want).max()}"

def part(array, dim):
    return np.split(array, n, axis=dim)[rank]

A = rng.standard_normal((4, 6)).astype(np.float32)
a = oar.tensor(A)
# transitions
s0 = shard_tensor(a, mesh, [Shard(0)])
assert list(s0.to_local().shape) == [4 // n, 6] and s0.shape == (4, 6)
close("shard", s0.to_local().numpy(), part(A, 0))
close("S->R all-gather", reshard(s0, mesh, [R]).to_local().numpy(), A)
close("S(0)->S(1) all-to-all", reshard(s0, mesh, [Shard(1)]).to_local().numpy(), part(A, 1))
close("R->S local slice", reshard(shard_tensor(a, mesh, [R]), mesh, [Shard(1)]).to_local().numpy(), part(A, 1))
p = from_local(oar.tensor(A * (rank + 1)), mesh, [Partial()])
total = A * sum(range(1, n + 1))
close("P->R all-reduce", reshard(p, mesh, [R]).to_local().numpy(), total)
close("P->S reduce-scatter", reshard(p, mesh, [Shard(0)]).to_local().numpy(), part(total, 0))
close("P(avg)->R", reshard(from_local(oar.tensor(A * (rank + 1)), mesh, [Partial("avg")]), mesh, [R]).to_local().numpy(),
      total / n)
close("R->P->R", reshard(reshard(shard_tensor(a, mesh, [R]), mesh, [Partial()]), mesh, [R]).to_local().numpy(), A)

# propagation, against numpy on the whole arrays
X = rng.standard_normal((8, 6)).astype(np.float32)
W = rng.standard_normal((4, 6)).astype(np.float32)
B = rng.standard_normal((6,)).astype(np.float32)
x_r, x_s0, x_s1 = (shard_tensor(oar.tensor(X), mesh, [pl]) for pl in (R, Shard(0), Shard(1)))
w_s0, w_s1 = shard_tensor(oar.tensor(W), mesh, [Shard(0)]), shard_tensor(oar.tensor(W), mesh, [Shard(1)])
col = x_r @ w_s0.T
assert col.placements == (Shard(1),), col.placements
close("column-parallel matmul", col.numpy(), X @ W.T)
row = x_s1 @ w_s1.T
assert row.placements == (Partial("sum"),), row.placements
close("row-parallel matmul", row.numpy(), X @ W.T)
data = x_s0 @ shard_tensor(oar.tensor(W), mesh, [R]).T
assert data.placements == (Shard(0),)
close("batch-sharded matmul", data.numpy(), X @ W.T)
biased = x_s0 + shard_tensor(oar.tensor(B), mesh, [R])
assert biased.placements == (Shard(0),)
close("elementwise broadcast", biased.numpy(), X + B)
close("elementwise S(0) * S(1) (resharded)", (x_s0 * x_s1).numpy(), X * X)
close("scalar", (x_s1 * 3.0 - 1.0).numpy(), X * 3 - 1)
summed = x_s0.sum(dim=[0])
assert summed.placements == (Partial("sum"),)
close("sum over the sharded dim", summed.numpy(), X.sum(0))
kept = x_s0.sum(dim=[1])
assert kept.placements == (Shard(0),)
close("sum over another dim", kept.numpy(), X.sum(1))
mean = x_s0.mean(dim=[0])
assert mean.placements == (Partial("avg"),)
close("mean over the sharded dim", mean.numpy(), X.mean(0))
close("max over the sharded dim", x_s0.max(dim=[0]).numpy(), X.max(0))
tX = torch.from_numpy(X)
soft = x_s0.softmax(dim=1)
assert soft.placements == (Shard(0),)
close("softmax over an unsharded dim", soft.numpy(), torch.softmax(tX, 1).numpy())
close("softmax over the sharded dim", x_s0.softmax(dim=0).numpy(), torch.softmax(tX, 0).numpy())
normed = x_s1.rms_norm(eps=1e-6)
close("rms_norm over the sharded dim", normed.numpy(),
      (tX / torch.sqrt((tX * tX).mean(-1, keepdim=True) + 1e-6)).numpy())
assert x_s0.rms_norm().placements == (Shard(0),)
V = rng.standard_normal((10, 4)).astype(np.float32)
ids = np.array([[0, 9, 4], [5, 2, 7]], dtype=np.int64)
emb = dist.propagation.dispatch("embedding", (shard_tensor(oar.tensor(V), mesh, [Shard(0)]),
                                              shard_tensor(oar.tensor(ids), mesh, [R])), {})
assert emb.placements == (Partial("sum"),)
close("vocab-parallel embedding", emb.numpy(), V[ids])
L = rng.standard_normal((8, 10)).astype(np.float32)
T = np.array([0, 9, 3, 5, 1, 7, 2, 8], dtype=np.int64)
ce_ref = torch.nn.functional.cross_entropy(torch.from_numpy(L), torch.from_numpy(T)).item()
ce_vocab = shard_tensor(oar.tensor(L), mesh, [Shard(1)]).cross_entropy(shard_tensor(oar.tensor(T), mesh, [R]))
assert ce_vocab.placements == (R,)
close("vocab-parallel cross entropy", ce_vocab.numpy(), ce_ref)
ce_rows = shard_tensor(oar.tensor(L), mesh, [Shard(0)]).cross_entropy(shard_tensor(oar.tensor(T), mesh, [Shard(0)]))
assert ce_rows.placements == (Partial("sum"),)
close("row-sharded cross entropy", ce_rows.numpy(), ce_ref)
shaped = x_s0.reshape(8, 2, 3)
assert shaped.placements == (Shard(0),) and shaped.shape == (8, 2, 3)
close("reshape keeping the shard", shaped.numpy(), X.reshape(8, 2, 3))
heads = x_s1.reshape(8, 2, 3)
assert heads.placements == (Shard(1),), heads.placements
close("reshape splitting the sharded dim", heads.numpy(), X.reshape(8, 2, 3))
close("reshape merging", heads.reshape(8, 6).numpy(), X)
tr = x_s0.transpose(0, 1)
assert tr.placements == (Shard(1),)
close("transpose", tr.numpy(), X.T)
close("permute", heads.permute(2, 0, 1).numpy(), X.reshape(8, 2, 3).transpose(2, 0, 1))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    low = x_s0.tril()
    x_s1.tril()
assert low.placements == (R,)
close("an op without a rule (replicated)", low.numpy(), np.tril(X))
assert dist.replicate_fallbacks["tril"] == 2
assert sum("tril has no sharding rule" in str(w.message) for w in caught) == 1, [str(w.message) for w in caught]

# autograd through the collectives, against torch
xg = shard_tensor(oar.tensor(X), mesh, [R]); xg.requires_grad_()
w0 = shard_tensor(oar.tensor(W), mesh, [Shard(0)]); w0.requires_grad_()
w1 = shard_tensor(oar.tensor(W.T.copy()), mesh, [Shard(1)]); w1.requires_grad_()
hidden = (xg @ w0.T).relu()                 # column-parallel: Shard(1)
out = hidden @ w1.T                          # row-parallel: Partial
loss = (out * out).mean()
loss.backward()
tx, tw0, tw1 = (torch.from_numpy(v.copy()).requires_grad_() for v in (X, W, W.T.copy()))
tloss = ((torch.relu(tx @ tw0.T) @ tw1.T) ** 2).mean()
tloss.backward()
close("loss", loss.numpy(), tloss.item())
close("grad of the replicated input", xg.grad.to_local().numpy(), tx.grad.numpy())
close("grad of the column shard", w0.grad.to_local().numpy(), part(tw0.grad.numpy(), 0))
close("grad of the row shard", w1.grad.to_local().numpy(), part(tw1.grad.numpy(), 1))
lg = shard_tensor(oar.tensor(L), mesh, [Shard(1)]); lg.requires_grad_()
lg.cross_entropy(shard_tensor(oar.tensor(T), mesh, [R])).backward()
tl = torch.from_numpy(L).requires_grad_()
torch.nn.functional.cross_entropy(tl, torch.from_numpy(T)).backward()
close("grad of vocab-parallel cross entropy", lg.grad.to_local().numpy(), part(tl.grad.numpy(), 1))
xs = shard_tensor(oar.tensor(X), mesh, [Shard(0)]); xs.requires_grad_()
wr = shard_tensor(oar.tensor(W), mesh, [R]); wr.requires_grad_()
(xs @ wr.T).sum().backward()
tx2, tw2 = torch.from_numpy(X).requires_grad_(), torch.from_numpy(W).requires_grad_()
(tx2 @ tw2.T).sum().backward()
close("grad of a replicated weight under sharded rows", wr.grad.to_local().numpy(), tw2.grad.numpy())
close("grad of sharded rows", xs.grad.to_local().numpy(), part(tx2.grad.numpy(), 0))

# the split styles on nn layers, against the unsplit layer
from oar import nn
ref = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 6))
par = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 6))
par.load_state_dict(ref.state_dict())
dist.parallelize_module(par, mesh, {"0": dist.ColwiseParallel(), "1": dist.RowwiseParallel()})
assert list(par[0].weight.shape) == [8 // n, 6] and list(par[1].weight.shape) == [6, 8 // n]
xin = oar.tensor(X)
close("Colwise + Rowwise Linear", par(xin).numpy(), ref(xin).numpy())
par(xin).sum().backward(); ref(xin).sum().backward()
close("Colwise weight grad", par[0].weight.grad.numpy(), part(ref[0].weight.grad.numpy(), 0))
close("Rowwise weight grad", par[1].weight.grad.numpy(), part(ref[1].weight.grad.numpy(), 1))
close("Rowwise bias grad", par[1].bias.grad.numpy(), ref[1].bias.grad.numpy())
emb_ref, emb_par = nn.Embedding(10, 4), nn.Embedding(10, 4)
emb_par.load_state_dict(emb_ref.state_dict())
dist.VocabParallelEmbedding().apply(emb_par, mesh)
close("VocabParallelEmbedding", emb_par(oar.tensor(ids)).numpy(), emb_ref(oar.tensor(ids)).numpy())
lin_ref, lin = nn.Linear(6, 4), nn.Linear(6, 4)
lin.load_state_dict(lin_ref.state_dict())
def split_rows(name, sub, mesh):
    if isinstance(sub, nn.Linear):
        dist.shard_parameter(sub, "weight", mesh, [Shard(0)])
        dist.shard_parameter(sub, "bias", mesh, [Shard(0)])
dist.shard_layer(lin, mesh, split_rows, output_fn=lambda out, mesh: from_local(out, mesh, [Shard(-1)]).full_tensor())
assert list(lin.weight.shape) == [4 // n, 6]
close("shard_layer with shard_fn and output_fn", lin(xin).numpy(), lin_ref(xin).numpy())
state = dist.distributed_state_dict(par)
assert isinstance(state["0.weight"], dist.DTensor) and state["0.weight"].shape == (8, 6)

# bad input: the same clear error on every rank, no hang
def raises(what, fn, words):
    try:
        fn()
    except (ValueError, TypeError) as e:
        assert all(w in str(e) for w in words), f"{what}: {e}"
        return str(e)
    raise AssertionError(f"{what}: no error")

errors = [
    raises("shard dim out of range", lambda: shard_tensor(a, mesh, [Shard(2)]), ["Shard(2)", "out of range", "[4, 6]"]),
    raises("uneven split", lambda: shard_tensor(oar.tensor(np.zeros((3, 4), np.float32)), mesh, [Shard(0)]),
           ["size 3", f"size {n}", "evenly"]),
    raises("too many placements", lambda: shard_tensor(a, mesh, [Shard(0), R]), ["2 placements", "1-d mesh"]),
]
other = ProcessMesh(list(reversed(range(n))), dim_names=["tp"])
y = shard_tensor(a, other, [Shard(0)])
errors.append(raises("different meshes", lambda: s0 + y, ["different meshes", "add"]))
errors.append(raises("unknown plan pattern", lambda: dist.parallelize_module(ref, mesh, {"nope": dist.ColwiseParallel()}),
                     ["nope", "matches no submodule"]))
dist.barrier()
report(ok=True, errors=errors)
dist.destroy_process_group()
"""


def test_opset_sharding_section_names_a_rule_for_the_op_classes():
    import oar_opset
    from oar.distributed.propagation import RULES
    from oar.ops import opset

    assert set(opset.sharding.rules) <= set(RULES)
    expected = {"add": "elementwise", "relu": "elementwise", "matmul": "matmul", "sum": "reduction",
                "softmax": "normalize_trailing", "rms_norm": "normalize_trailing", "embedding": "embedding",
                "cross_entropy": "cross_entropy", "reshape": "reshape", "tril": None, "gather": None}
    assert {name: opset.sharding_rule(name) for name in expected} == expected
    bad = {"schema_version": 1, "dtype_sets": {}, "sharding": {"rules": {"elementwise": "x", "bogus": "y"},
                                                              "by_kind": {"unary": "elemwise"}, "ops": {"nop": "bogus"}},
           "ops": {"neg": {"kind": "unary", "inputs": ["x"], "outputs": ["out"], "dtypes": ["float32"],
                           "out_dtype": "same"}}}
    problems = "\n".join(oar_opset.check(bad, "test.yaml"))
    assert "unknown rule 'bogus'" in problems
    assert "maps to 'elemwise', which is not one of the section's rules" in problems
    assert "unknown op 'nop'" in problems


def test_dtensor_two_ranks():
    results = launch(2, CHECKS, timeout=240)
    assert_all_ok(results)
    assert [r["result"]["ok"] for r in results] == [True, True]
    assert results[0]["result"]["errors"] == results[1]["result"]["errors"]


DP_TP = """
import torch
from oar import nn
from oar.distributed import Shard, Replicate, ProcessMesh, shard_tensor, reshard
dist.init_process_group(timeout=60)
rank = dist.get_rank()
mesh = ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "tp"])
rng = np.random.default_rng(0)
A = rng.standard_normal((4, 8)).astype(np.float32)
def close(name, got, want, tol=1e-5):
    assert np.allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol), f"{name}: {np.abs(np.asarray(got) - want).max()}"
# 2-d transitions: [S(0), S(1)] -> [S(1), S(0)] -> [R, R]
t = shard_tensor(oar.tensor(A), mesh, [Shard(0), Shard(1)])
i, j = mesh.coordinate
close("2-d shard", t.to_local().numpy(), A[i * 2:(i + 1) * 2, j * 4:(j + 1) * 4])
swapped = reshard(t, mesh, [Shard(1), Shard(0)])
close("2-d swap", swapped.to_local().numpy(), A[j * 2:(j + 1) * 2, i * 4:(i + 1) * 4])
close("2-d gather", swapped.full_tensor().numpy(), A)

# DP x TP: an MLP, TP over "tp", data parallel (DDP) over "dp", ZeRO-1 over "dp"; vs torch on the global batch
W1 = rng.standard_normal((16, 8)).astype(np.float32) * 0.3
W2 = rng.standard_normal((8, 16)).astype(np.float32) * 0.3
X = rng.standard_normal((8, 8)).astype(np.float32)
Y = rng.standard_normal((8, 8)).astype(np.float32)
model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 8, bias=False))
model.load_state_dict({"0.weight": oar.tensor(W1), "2.weight": oar.tensor(W2)})
dist.parallelize_module(model, mesh, {"0": dist.ColwiseParallel(mesh_dim="tp"), "2": dist.RowwiseParallel(mesh_dim="tp")})
ddp = dist.DistributedDataParallel(model, process_group=mesh.group("dp"))
opt = dist.ZeroRedundancyOptimizer(model.parameters(), oar.optim.AdamW, group=mesh.group("dp"), lr=0.05)
tm = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 8, bias=False))
with torch.no_grad():
    tm[0].weight.copy_(torch.from_numpy(W1)); tm[2].weight.copy_(torch.from_numpy(W2))
topt = torch.optim.AdamW(tm.parameters(), lr=0.05)
rows = slice(i * 4, (i + 1) * 4)
for step in range(3):
    out = ddp(oar.tensor(X[rows]))
    loss = ((out - oar.tensor(Y[rows])) * (out - oar.tensor(Y[rows]))).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    tl = ((tm(torch.from_numpy(X)) - torch.from_numpy(Y)) ** 2).mean()
    topt.zero_grad(); tl.backward(); topt.step()
w1_full = reshard(dist.distributed_parameters(model)["0.weight"], dist.line_mesh(mesh, "tp"), [Replicate()])
close("DP x TP + ZeRO-1 weights after 3 AdamW steps", w1_full.to_local().numpy(), tm[0].weight.detach().numpy(), 1e-4)
report(ok=True, state_numel=opt.state_numel(), params=sum(p.numel() for p in model.parameters()))
dist.destroy_process_group()
"""


def test_dp_x_tp_on_a_2d_mesh_four_ranks():
    results = launch(4, DP_TP, timeout=240)
    assert_all_ok(results)
    for r in results:
        assert r["result"]["ok"]
        # ZeRO-1: each rank of a dp pair holds AdamW state for one of its two weight shards (2 moments)
        assert r["result"]["state_numel"] < 2 * r["result"]["params"]


def test_llama_tensor_parallel_demo_follows_one_process_and_reloads():
    """examples/train_llama_tp_demo.py at a tiny size: TP=2 follows the 1-process loss curve, the
    TP=2 checkpoint reloads in one process, and the TP lines added stay within 20."""
    import subprocess
    from pathlib import Path

    demo = Path(__file__).resolve().parents[1] / "examples" / "train_llama_tp_demo.py"
    env = dict(os.environ, OAR_REFCPU_DEVICE_TYPE="npu")
    done = subprocess.run([sys.executable, str(demo), "--device", "npu", "--steps", "4", "--quick",
                           "--timeout", "200"], capture_output=True, text=True, env=env, timeout=450)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "OK: tensor-parallel training follows" in done.stdout
    lines = int(done.stdout.split("lines added to the single-device loop for tensor parallelism: ")[1].split()[0])
    assert 0 < lines <= 20
    difference = float(done.stdout.split("max |loss difference| over 4 steps: ")[1].split(";")[0])
    assert difference <= 1e-5, done.stdout

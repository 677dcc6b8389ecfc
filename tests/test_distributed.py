"""oar.distributed across processes: ranks are subprocesses on loopback (a free
port for the TCPStore, the CPU plugin's sockets on 127.0.0.1), each launch
bounded by a timeout that kills the ranks. Every collective's result, on the
plugin's communicators and host-staged through gloo (the CPU plugin with its
collectives hidden); sub-groups; DDP gradients against one process on the
global batch; and ranks that die or never come -> an error, not a hang."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch.distributed")

PRELUDE = """
import json, os, sys, warnings
import numpy as np
import oar, oar.distributed as dist
def report(**values):
    print("RESULT " + json.dumps(values), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nranks: int, body: str, env: dict | None = None, timeout: float = 120,
           ranks: list[int] | None = None) -> list[dict]:
    """Runs body as ranks 0..nranks-1 (or only `ranks`); returns per rank its exit code, output and
    the RESULT it reported. Ranks still running at the timeout are killed (and the test fails)."""
    port = free_port()
    script = PRELUDE + textwrap.dedent(body)
    processes = []
    for rank in (range(nranks) if ranks is None else ranks):
        environment = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nranks), LOCAL_RANK=str(rank),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OAR_REFCPU_SOCKET_ADDR="127.0.0.1",
                           OAR_REFCPU_STRICT="1", OAR_REFCPU_DEVICE_TYPE="refcpu", OAR_REFCPU_THREADS="1",
                           OAR_REFCPU_MEMORY_MB="1024", PYTHONWARNINGS="default", **(env or {}))
        environment.pop("OAR_PLUGIN_PATH", None)
        processes.append(subprocess.Popen([sys.executable, "-c", script], env=environment, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    results = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            out, err = process.communicate()
            pytest.fail(f"a rank still ran after {timeout} s (a hang): {err[-2000:]}")
        reported = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
        results.append({"code": process.returncode, "out": out, "err": err,
                        "result": reported[-1] if reported else None})
    return results


def assert_all_ok(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        assert r["code"] == 0, f"rank {rank} exited with {r['code']}:\n{r['err'][-4000:]}"


COLLECTIVES = """
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    world = dist.init_process_group(timeout=60)
rank, n = dist.get_rank(), dist.get_world_size()
dev = world.device

def values(r, count, dtype="float32"):
    return ((np.arange(count) * 7 + r * 13) % 11 - 5).astype(dtype)

def check(name, got, expected):
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape and np.array_equal(got, expected), f"{name}: {got} != {expected}"

# all_reduce: every op, float32 / int64 / bfloat16, sizes 0 .. several chunks
for dtype in ("float32", "int64", "bfloat16"):
    for count in (0, 1, 1003, 70001):
        every = np.stack([values(r, count) for r in range(n)])
        for op, reference in ((dist.ReduceOp.SUM, every.sum(0)), (dist.ReduceOp.PRODUCT, every.prod(0)),
                              (dist.ReduceOp.MAX, every.max(0)), (dist.ReduceOp.MIN, every.min(0)),
                              (dist.ReduceOp.AVG, every.sum(0) / n)):
            if count > 2000 and op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                continue
            if dtype == "int64" and op == dist.ReduceOp.AVG:
                reference = np.trunc(every.sum(0) / n)
            if dtype == "bfloat16" and op == dist.ReduceOp.AVG:
                continue  # rounding of sum / 3: checked in float32
            t = oar.tensor(values(rank, count), dtype=dtype, device=dev)
            dist.all_reduce(t, op=op)
            expected = reference.astype(np.float32) if dtype != "int64" else reference
            check(f"all_reduce {dtype} {op} {count}", t.numpy().astype(np.float64), expected)

# a strided view is reduced in place too
base = oar.tensor(np.stack([values(rank, 6)] * 2), device=dev)
column = base[:, 1]
dist.all_reduce(column)
check("all_reduce of a view", column.numpy(), [sum(values(r, 6)[1] for r in range(n))] * 2)

# broadcast from the last rank, reduce to rank 1
t = oar.tensor(values(rank, 5000), device=dev)
dist.broadcast(t, src=n - 1)
check("broadcast", t.numpy(), values(n - 1, 5000))
t = oar.tensor(values(rank, 100), device=dev)
dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
check("reduce", t.numpy(), np.stack([values(r, 100) for r in range(n)]).max(0) if rank == 1 else values(rank, 100))

# all_gather, into a tensor and into a list
src = oar.tensor(values(rank, 1000), device=dev)
out = oar.empty(n * 1000, device=dev)
dist.all_gather_into_tensor(out, src)
check("all_gather_into_tensor", out.numpy(), np.concatenate([values(r, 1000) for r in range(n)]))
parts = [oar.empty(4, 2, device=dev) for _ in range(n)]
dist.all_gather(parts, oar.tensor(values(rank, 8).reshape(4, 2), device=dev))
for r in range(n):
    check("all_gather", parts[r].numpy(), values(r, 8).reshape(4, 2))

# reduce_scatter: rank r gets the sum of everyone's block r
full = oar.tensor(values(rank, n * 300), device=dev)
mine = oar.empty(300, device=dev)
dist.reduce_scatter_tensor(mine, full)
total = np.stack([values(r, n * 300) for r in range(n)]).sum(0)
check("reduce_scatter_tensor", mine.numpy(), total[rank * 300:(rank + 1) * 300])
blocks = [oar.tensor(values(rank + 10 * j, 7), device=dev) for j in range(n)]
dist.reduce_scatter(mine[:7], blocks, op=dist.ReduceOp.MIN)
check("reduce_scatter", mine[:7].numpy(), np.stack([values(r + 10 * rank, 7) for r in range(n)]).min(0))

# all_to_all: block j of rank r goes to rank j, into block r
send = oar.tensor(np.concatenate([values(100 * rank + j, 50) for j in range(n)]), device=dev)
recv = oar.empty(n * 50, device=dev)
dist.all_to_all_single(recv, send)
check("all_to_all_single", recv.numpy(), np.concatenate([values(100 * r + rank, 50) for r in range(n)]))
outs = [oar.empty(3, device=dev) for _ in range(n)]
dist.all_to_all(outs, [oar.tensor(values(100 * rank + j, 3), device=dev) for j in range(n)])
for r in range(n):
    check("all_to_all", outs[r].numpy(), values(100 * r + rank, 3))

# send/recv around a ring: batched (both directions at once), then blocking in rank order
nxt, prev = (rank + 1) % n, (rank - 1) % n
inbox = oar.empty(200000, device=dev)
works = dist.batch_isend_irecv([dist.P2POp(dist.isend, oar.tensor(values(rank, 200000), device=dev), nxt),
                                dist.P2POp(dist.irecv, inbox, prev)])
for w in works:
    w.wait()
check("batch_isend_irecv", inbox.numpy(), values(prev, 200000))
if rank == 0:
    dist.send(oar.tensor(values(0, 10), device=dev), dst=1)
elif rank == 1:
    box = oar.empty(10, device=dev)
    assert dist.recv(box, src=0) == 0
    check("send/recv", box.numpy(), values(0, 10))

# async work, barrier
t = oar.tensor(values(rank, 10), device=dev)
work = dist.all_reduce(t, async_op=True)
work.wait()
assert work.is_completed()
check("async all_reduce", t.numpy(), np.stack([values(r, 10) for r in range(n)]).sum(0))
dist.barrier()

# sub-groups: ranks 0 and 2 (group ranks 0 and 1); rank 1 is not a member
sub = dist.new_group([0, 2])
if rank == 1:
    assert sub is dist.GroupMember.NON_GROUP_MEMBER and dist.get_rank(sub) == -1
else:
    assert dist.get_world_size(sub) == 2 and dist.get_rank(sub) == (0 if rank == 0 else 1)
    t = oar.tensor(values(rank, 64), device=dev)
    dist.all_reduce(t, group=sub)
    check("all_reduce in a sub-group", t.numpy(), values(0, 64) + values(2, 64))
    t = oar.tensor(values(rank, 8), device=dev)
    dist.broadcast(t, src=2, group=sub)
    check("broadcast in a sub-group", t.numpy(), values(2, 8))
dist.barrier()
fallback = [str(w.message) for w in caught if issubclass(w.category, dist.DistributedFallbackWarning)]
report(backend=dist.get_backend(), fallback_warnings=len(fallback))
dist.destroy_process_group()
assert not dist.is_initialized()
"""


@pytest.mark.parametrize("fallback", [False, True], ids=["plugin", "gloo_fallback"])
def test_every_collective_on_three_ranks(fallback):
    env = {"OAR_REFCPU_NO_COLLECTIVES": "1"} if fallback else {}
    results = launch(3, COLLECTIVES, env=env, timeout=240)
    assert_all_ok(results)
    for r in results:
        assert r["result"]["backend"] == ("gloo" if fallback else "oar")
        assert r["result"]["fallback_warnings"] == (1 if fallback else 0)  # warned once, only when staged


DDP = """
from oar import nn
world = dist.init_process_group(timeout=60)
rank, n = dist.get_rank(), dist.get_world_size()
dev = world.device

def make_model():
    oar.manual_seed(1234)
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3)).to(dev)

rng = np.random.default_rng(7)
x_all = rng.standard_normal((8, 12)).astype(np.float32)
y_all = rng.standard_normal((8, 3)).astype(np.float32)
local = slice(rank * 8 // n, (rank + 1) * 8 // n)

def loss_of(model, x, y):
    d = model(oar.tensor(x, device=dev)) - oar.tensor(y, device=dev)
    return (d * d).mean()

# the reference: one process, the global batch
reference = make_model()
loss_of(reference, x_all, y_all).backward()
expected = {name: p.grad.numpy() for name, p in reference.named_parameters()}

# rank 1 starts from other weights: DDP's broadcast makes every replica rank 0's
model = make_model()
if rank == 1:
    with oar.no_grad():
        for p in model.parameters():
            p.add_(1.0)
ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.004)  # several buckets
assert len(ddp._buckets) > 1
loss_of(ddp, x_all[local], y_all[local]).backward()
worst = max(float(np.max(np.abs(p.grad.numpy() - expected[name]))) for name, p in model.named_parameters())
assert worst < 1e-5, worst
# every bucket started reducing while backward still ran (each parameter gets a gradient here)
assert ddp.overlapped_buckets == len(ddp._buckets), (ddp.overlapped_buckets, len(ddp._buckets))

# a few SGD steps stay equal to the single-process run
opt = oar.optim.SGD(model.parameters(), lr=0.1)
ref_opt = oar.optim.SGD(reference.parameters(), lr=0.1)
opt.step(); ref_opt.step()
for step in range(3):
    opt.zero_grad(); ref_opt.zero_grad()
    loss_of(ddp, x_all[local], y_all[local]).backward()
    loss_of(reference, x_all, y_all).backward()
    opt.step(); ref_opt.step()
drift = max(float(np.max(np.abs(p.numpy() - q.numpy()))) for p, q in zip(model.parameters(), reference.parameters()))
assert drift < 1e-5, drift

# no_sync: gradients stay local
opt.zero_grad()
with ddp.no_sync():
    loss_of(ddp, x_all[local], y_all[local]).backward()
local_grad = next(iter(model.parameters())).grad.numpy().copy()
others = oar.tensor(local_grad, device=dev)
dist.all_reduce(others, op=dist.ReduceOp.MAX)
report(worst=worst, drift=drift, differs=bool(np.max(np.abs(others.numpy() - local_grad)) > 0))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("fallback", [False, True], ids=["plugin", "gloo_fallback"])
def test_ddp_gradients_equal_one_process_on_the_global_batch(fallback):
    env = {"OAR_REFCPU_NO_COLLECTIVES": "1"} if fallback else {}
    results = launch(2, DDP, env=env, timeout=180)
    assert_all_ok(results)
    for r in results:
        assert r["result"]["worst"] < 1e-5 and r["result"]["drift"] < 1e-5
    assert any(r["result"]["differs"] for r in results)  # under no_sync the ranks' gradients differ


DIES = """
import time
world = dist.init_process_group(timeout=float(os.environ["TEST_TIMEOUT"]))
rank = dist.get_rank()
dist.barrier()
if rank == 1:
    os._exit(3)  # a crash: no goodbye
time.sleep(0.2)
started = time.monotonic()
t = oar.ones(100000, device=world.device)
try:
    dist.all_reduce(t)
    t.numpy()
    report(error=None)
except Exception as error:
    report(error=type(error).__name__, message=str(error), seconds=time.monotonic() - started)
"""


@pytest.mark.parametrize("fallback", [False, True], ids=["plugin", "gloo_fallback"])
def test_a_rank_that_dies_is_an_error_not_a_hang(fallback):
    env = {"TEST_TIMEOUT": "5"}
    if fallback:
        env["OAR_REFCPU_NO_COLLECTIVES"] = "1"
    results = launch(2, DIES, env=env, timeout=90)
    assert results[1]["code"] == 3
    outcome = results[0]["result"]
    assert outcome is not None, results[0]["err"][-3000:]
    assert outcome["error"] is not None, "all_reduce with a dead peer succeeded"
    assert outcome["seconds"] < 5 + 5
    if not fallback:
        assert outcome["error"] == "DeviceError"
        assert "rank 1" in outcome["message"], outcome["message"]


NEVER = """
import time
started = time.monotonic()
try:
    dist.init_process_group(timeout=2)
    report(error=None)
except Exception as error:
    report(error=type(error).__name__, message=str(error), seconds=time.monotonic() - started)
"""


def test_a_rank_that_never_comes_fails_the_rendezvous_within_the_timeout():
    results = launch(2, NEVER, ranks=[0], timeout=60)  # rank 1 of 2 is never started
    outcome = results[0]["result"]
    assert outcome and outcome["error"] == "DeviceError", results[0]["err"][-3000:]
    assert "rank 1" in outcome["message"] and "OAR_ERROR_TIMEOUT" in outcome["message"]
    assert outcome["seconds"] < 2 + 5


MISMATCHED = """
world = dist.init_process_group(timeout=30)
rank = dist.get_rank()
outcomes = []
for count, dtype in (((4, 6)[rank], "float32"), (4, ("float32", "int32")[rank])):
    try:
        dist.all_reduce(oar.tensor(np.ones(count, dtype=dtype), device=world.device))
        outcomes.append(None)
    except ValueError as error:
        outcomes.append(str(error))
after = oar.tensor(np.full(3, rank + 1.0, dtype="float32"), device=world.device)
dist.all_reduce(after)  # the group still works
report(outcomes=outcomes, after=after.numpy().tolist())
"""


def test_gloo_fallback_refuses_mismatched_all_reduce_on_every_rank():
    results = launch(2, MISMATCHED, env={"OAR_REFCPU_NO_COLLECTIVES": "1"}, timeout=90)
    assert_all_ok(results)  # gloo used to abort a rank (SIGABRT) on the size mismatch
    for r in results:
        sizes, dtypes = r["result"]["outcomes"]
        assert sizes == ("all_reduce: the ranks' calls do not match (rank 0: all_reduce of 4 float32, op sum; "
                         "rank 1: all_reduce of 6 float32, op sum); every rank must pass the same element count "
                         "and dtype (and op and root)")
        assert "rank 0: all_reduce of 4 float32, op sum; rank 1: all_reduce of 4 int32, op sum" in dtypes
        assert r["result"]["after"] == [3.0, 3.0, 3.0]

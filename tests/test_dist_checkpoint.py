"""oar.distributed.checkpoint: saved on 2 ranks under one layout, loaded under other layouts, at 4
ranks and in one process (and from a plain oar.save file); async save; a rank that dies during a
save leaves the previous checkpoint loadable; a missing key or contradicting shape is a
CheckpointError naming both. Values are compared exactly (a checkpoint moves bytes)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_distributed import assert_all_ok, launch  # noqa: E402

pytest.importorskip("torch.distributed")

ARRAYS = """
rng = np.random.default_rng(0)
A = rng.standard_normal((8, 6)).astype(np.float32)
B = rng.standard_normal((4, 8)).astype(np.float32)
C = np.arange(12, dtype=np.int64).reshape(3, 4)
"""

SAVE = ARRAYS + """
from oar.distributed import Shard, Replicate, Partial, ProcessMesh, shard_tensor, from_local, checkpoint
dist.init_process_group(timeout=60)
rank, n = dist.get_rank(), dist.get_world_size()
mesh = ProcessMesh(list(range(n)), dim_names=["tp"])
directory = os.environ["CKPT"]
state = {"a": shard_tensor(oar.tensor(A), mesh, [Shard(0)]),
         "b": from_local(oar.tensor(B * (rank + 1)), mesh, [Partial()]),   # saved reduced: B * (1 + .. + n)
         "nested": {"c": oar.tensor(C)}}
handle = checkpoint.save(state, directory, async_save=True)
state["a"].to_local().mul_(0.0)            # training goes on: the snapshot is unaffected
handle.wait()
# load back under other placements on the same ranks
target = {"a": shard_tensor(oar.tensor(np.zeros_like(A)), mesh, [Shard(1)]),
          "b": shard_tensor(oar.tensor(np.zeros_like(B)), mesh, [Shard(0)]), "nested": {"c": oar.zeros(3, 4, dtype=oar.int64)}}
checkpoint.load(target, directory)
assert np.array_equal(target["a"].full_tensor().numpy(), A)
assert np.array_equal(target["b"].full_tensor().numpy(), B * sum(range(1, n + 1)))
assert np.array_equal(target["nested"]["c"].numpy(), C)
report(ok=True)
dist.destroy_process_group()
"""

LOAD4 = ARRAYS + """
from oar.distributed import Shard, Replicate, ProcessMesh, shard_tensor, checkpoint
dist.init_process_group(timeout=60)
mesh = ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "tp"])
target = {"a": shard_tensor(oar.tensor(np.zeros_like(A)), mesh, [Shard(1), Shard(0)]),
          "b": shard_tensor(oar.tensor(np.zeros_like(B)), mesh, [Replicate(), Shard(1)]),
          "nested": {"c": oar.zeros(3, 4, dtype=oar.int64)}}
checkpoint.load(target, os.environ["CKPT"])
assert np.array_equal(target["a"].full_tensor().numpy(), A)
assert np.array_equal(target["b"].full_tensor().numpy(), B * 3)
assert np.array_equal(target["nested"]["c"].numpy(), C)
report(ok=True)
dist.destroy_process_group()
"""

DIE = """
from oar.distributed import Shard, ProcessMesh, shard_tensor, checkpoint
dist.init_process_group(timeout=6)
rank = dist.get_rank()
mesh = ProcessMesh([0, 1], dim_names=["tp"])
state = {"a": shard_tensor(oar.tensor(np.full((8, 6), 7.0, np.float32)), mesh, [Shard(0)])}
if rank == 1:             # dies part-way: after agreeing on the save, while writing its file
    checkpoint._write_file = lambda *args: os._exit(3)
try:
    checkpoint.save(state, os.environ["CKPT"])
except checkpoint.CheckpointError as e:
    report(error=str(e))
    os._exit(0)
report(error=None)
"""


def _load_single(directory: str) -> dict:
    import oar
    from oar.distributed import checkpoint

    target = {"a": oar.zeros(8, 6), "b": oar.zeros(4, 8), "nested": {"c": oar.zeros(3, 4, dtype=oar.int64)}}
    checkpoint.load(target, directory)
    return target


def test_save_on_two_ranks_load_anywhere(tmp_path):
    exec(ARRAYS, globals())
    directory = str(tmp_path / "ckpt")
    results = launch(2, SAVE, env={"CKPT": directory}, timeout=180)
    assert_all_ok(results)
    index = json.loads((tmp_path / "ckpt" / "index.json").read_text())
    assert index["tensors"]["a"]["placements"] == ["Shard(0)"] and len(index["tensors"]["a"]["chunks"]) == 2
    assert len(index["tensors"]["nested.c"]["chunks"]) == 1  # replicated: written once
    # one process
    target = _load_single(directory)
    assert np.array_equal(target["a"].numpy(), A)  # noqa: F821 - from ARRAYS
    assert np.array_equal(target["b"].numpy(), B * 3)  # noqa: F821
    assert np.array_equal(target["nested"]["c"].numpy(), C)  # noqa: F821
    # four ranks, a 2-d mesh
    assert_all_ok(launch(4, LOAD4, env={"CKPT": directory}, timeout=180))


def test_plain_oar_save_file_loads(tmp_path):
    import oar
    from oar.distributed import checkpoint

    path = str(tmp_path / "plain.safetensors")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    oar.save({"w": oar.tensor(a), "n": oar.tensor(np.array([1, 2], np.int64))}, path)
    target = {"w": oar.zeros(3, 4), "n": oar.zeros(2, dtype=oar.int64)}
    checkpoint.load(target, path)
    assert np.array_equal(target["w"].numpy(), a) and target["n"].numpy().tolist() == [1, 2]


def test_missing_key_and_wrong_shape_name_both(tmp_path):
    import oar
    from oar.distributed import checkpoint

    directory = str(tmp_path / "c")
    checkpoint.save({"w": oar.ones(2, 3)}, directory)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.load({"w": oar.zeros(2, 3), "v": oar.zeros(1)}, directory)
    assert "'v' is not in the checkpoint" in str(caught.value) and directory in str(caught.value)
    assert "w" in str(caught.value)  # what it does hold
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.load({"w": oar.zeros(3, 3)}, directory)
    assert "[3, 3] in the state dict but [2, 3] in the checkpoint" in str(caught.value)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.load({"w": oar.zeros(2, 3)}, str(tmp_path / "nothing"))
    assert "no index.json" in str(caught.value)


def test_a_rank_dying_mid_save_leaves_the_previous_checkpoint(tmp_path):
    import oar
    from oar.distributed import checkpoint

    directory = str(tmp_path / "ckpt")
    previous = np.arange(48, dtype=np.float32).reshape(8, 6)
    checkpoint.save({"a": oar.tensor(previous)}, directory)  # generation 1, one process
    results = launch(2, DIE, env={"CKPT": directory}, timeout=120)
    assert results[1]["code"] == 3
    assert results[0]["code"] == 0, results[0]["err"][-3000:]
    error = results[0]["result"]["error"]
    assert error and "rank 1 did not" in error and "previous checkpoint" in error, error
    target = {"a": oar.zeros(8, 6)}
    checkpoint.load(target, directory)
    assert np.array_equal(target["a"].numpy(), previous)

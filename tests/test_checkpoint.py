"""oar.save / oar.load: safetensors checkpoints of state_dicts and nests, atomic writes,
and clear errors for files that are not valid checkpoints."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oar
import oar.nn as nn
import oar.optim as optim
from oar import CheckpointError


@pytest.fixture(autouse=True)
def _on_device(dev):
    oar.set_device(dev)


def rnd(seed, *shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def model():
    nn.init.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.LayerNorm(4), nn.Linear(4, 2))


def test_state_dict_round_trip(tmp_path, dev):
    m = model()
    path = tmp_path / "model.safetensors"
    oar.save(m.state_dict(), path)
    loaded = oar.load(path, device=dev)
    assert list(loaded) == list(m.state_dict())
    for key, value in m.state_dict().items():
        np.testing.assert_array_equal(loaded[key].numpy(), value.numpy())
        assert str(loaded[key].device) == str(value.device)
    other = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.LayerNorm(4), nn.Linear(4, 2))
    other.load_state_dict(loaded)
    x = oar.tensor(rnd(0, 2, 3))
    np.testing.assert_array_equal(other(x).numpy(), m(x).numpy())


def test_the_file_is_plain_safetensors(tmp_path):
    from safetensors.numpy import load_file
    m = model()
    path = tmp_path / "m.safetensors"
    oar.save(m.state_dict(), path)
    arrays = load_file(str(path))
    np.testing.assert_array_equal(arrays["0.weight"], m[0].weight.numpy())


def test_a_foreign_safetensors_file_loads_as_a_flat_dict(tmp_path):
    from safetensors.numpy import save_file
    path = tmp_path / "foreign.safetensors"
    save_file({"a": rnd(0, 2, 3), "b": np.arange(4, dtype=np.int64)}, str(path))
    loaded = oar.load(path)
    assert sorted(loaded) == ["a", "b"]
    np.testing.assert_array_equal(loaded["b"].numpy(), np.arange(4))


def test_nested_training_state_with_plain_values(tmp_path):
    m = model()
    opt = optim.AdamW(m.parameters(), lr=1e-3)
    oar.sum(m(oar.tensor(rnd(1, 5, 3)))).backward()
    opt.step()
    state = {"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 7, "loss": 1.25,
             "name": "run-1", "flags": (True, None, float("inf")), "history": [0.5, 0.25]}
    path = tmp_path / "train.safetensors"
    oar.save(state, path)
    back = oar.load(path)
    assert back["step"] == 7 and back["loss"] == 1.25 and back["name"] == "run-1"
    assert back["flags"] == (True, None, float("inf")) and back["history"] == [0.5, 0.25]
    assert set(back["optimizer"]["state"]) == {0, 1, 2, 3, 4, 5}  # int keys stay ints
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    np.testing.assert_array_equal(back["optimizer"]["state"][0]["exp_avg"].numpy(),
                                  opt.state_dict()["state"][0]["exp_avg"].numpy())
    opt2 = optim.AdamW(m.parameters(), lr=1e-3)
    opt2.load_state_dict(back["optimizer"])
    assert opt2.state_dict()["state"][0]["step"] == 1
    from safetensors import safe_open
    with safe_open(str(path), "numpy") as f:
        assert "optimizer.state.0.exp_avg" in f.keys() and "model.0.weight" in f.keys()


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "int8", "bool", "float16", "bfloat16"])
def test_dtypes_round_trip(tmp_path, dtype):
    base = oar.tensor(rnd(2, 3, 5, dtype=np.float32) * 4)
    t = base.to(dtype=getattr(oar, dtype))
    path = tmp_path / f"{dtype}.safetensors"
    oar.save({"t": t}, path)
    back = oar.load(path)["t"]
    assert str(back.dtype).endswith(dtype) and tuple(back.shape) == (3, 5)
    np.testing.assert_array_equal(back.to(dtype=oar.float64).numpy(), t.to(dtype=oar.float64).numpy())


def test_load_into_a_model_says_which_key_is_wrong(tmp_path):
    path = tmp_path / "m.safetensors"
    oar.save(model().state_dict(), path)
    wrong = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.LayerNorm(4), nn.Linear(4, 3))
    with pytest.raises(nn.StateDictError, match=r"'3.weight': the state_dict has shape \[2, 4\]"):
        wrong.load_state_dict(oar.load(path))


def test_truncated_file_raises_checkpoint_error_naming_it(tmp_path):
    path = tmp_path / "m.safetensors"
    oar.save(model().state_dict(), path)
    data = path.read_bytes()
    for cut in (0, 5, 20, len(data) - 3):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="truncated") as info:
            oar.load(bad)
        assert info.value.path == str(bad) and str(bad) in str(info.value)


def test_corrupt_files_raise_checkpoint_error(tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"this is not a checkpoint at all, not even close")
    with pytest.raises(CheckpointError, match="garbage.safetensors"):
        oar.load(garbage)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}).encode()
    wrong_size = tmp_path / "size.safetensors"
    wrong_size.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 12)
    with pytest.raises(CheckpointError, match="'w': 12 bytes for shape \\[2\\]"):
        oar.load(wrong_size)
    not_json = tmp_path / "json.safetensors"
    not_json.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(CheckpointError, match="not JSON"):
        oar.load(not_json)
    with pytest.raises(CheckpointError, match="no such file"):
        oar.load(tmp_path / "missing.safetensors")


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    oar.save({"w": oar.tensor(np.float32([1, 2, 3]))}, path)
    old = path.read_bytes()
    import safetensors

    def crash(specs, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors, "serialize_file", crash)
    with pytest.raises(CheckpointError, match="No space left.*previous file.*unchanged"):
        oar.save({"w": oar.tensor(np.float32([4, 5, 6]))}, path)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    np.testing.assert_array_equal(oar.load(path)["w"].numpy(), [1, 2, 3])


def test_rename_failure_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    oar.save({"w": oar.tensor(np.float32([1]))}, path)
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(CheckpointError):
        oar.save({"w": oar.tensor(np.float32([2]))}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    np.testing.assert_array_equal(oar.load(path)["w"].numpy(), [1])


def test_save_fsyncs_the_file_and_the_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    path = tmp_path / "c.safetensors"
    oar.save({"w": oar.tensor(np.float32([1]))}, path)
    assert len(synced) == 2
    assert os.path.basename(synced[0]).startswith(".c.safetensors.tmp-") and synced[1] == str(tmp_path)


def test_a_process_killed_mid_write_leaves_the_old_checkpoint_readable(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    oar.save({"w": oar.tensor(np.float32([1, 2, 3]))}, path)
    script = textwrap.dedent(f"""
        import os, signal, numpy as np, safetensors, oar
        def dying(specs, filename, metadata=None):
            with open(filename, "wb") as f:
                f.write(b"half a checkpoint")
                f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        safetensors.serialize_file = dying
        oar.save({{"w": oar.tensor(np.float32([9, 9, 9]))}}, {str(path)!r})
    """)
    env = dict(os.environ, OAR_REFCPU_STRICT="1")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()
    leftovers = [n for n in os.listdir(tmp_path) if n != "ckpt.safetensors"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".ckpt.safetensors.tmp-")  # the dead writer's temp
    np.testing.assert_array_equal(oar.load(path)["w"].numpy(), [1, 2, 3])
    oar.save({"w": oar.tensor(np.float32([4, 5, 6]))}, path)  # the next save removes it
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    np.testing.assert_array_equal(oar.load(path)["w"].numpy(), [4, 5, 6])


def test_unsupported_values_are_refused_before_writing(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(TypeError, match="cannot store a set"):
        oar.save({"a": {1, 2}}, path)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_load_onto_another_device_and_resume_there(tmp_path, dev):
    if oar.device_count() < 2:
        pytest.skip("needs two devices")
    other = f"{oar.device(dev).type}:1"
    m = model()
    opt = optim.AdamW(m.parameters(), lr=1e-3)
    oar.sum(m(oar.tensor(rnd(1, 5, 3)))).backward()
    opt.step()
    path = tmp_path / "train.safetensors"
    oar.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, path)
    back = oar.load(path, device=other)
    assert all(str(v.device) == other for v in back["model"].values())
    m2 = model().to(other)
    m2.load_state_dict(back["model"])
    opt2 = optim.AdamW(m2.parameters(), lr=1e-3)
    opt2.load_state_dict(back["optimizer"])
    assert str(opt2.state_dict()["state"][0]["exp_avg"].device) == other

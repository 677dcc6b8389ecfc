"""oar.load on malformed files: whatever is wrong with a file (its header length, its JSON, a
tensor entry, the offsets, oar's metadata tree, its kind), the one error is CheckpointError naming
the file; reads are bounded by the file's size and a FIFO never blocks. oar.save into a directory
it cannot write raises CheckpointError naming the path and writes nothing."""

from __future__ import annotations

import json
import os
import random
import stat
import struct
import threading

import numpy as np
import pytest

import oar
from oar import CheckpointError

F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def safetensors_bytes(header: object, body: bytes = b"\0" * 8, header_text: bytes | None = None) -> bytes:
    text = json.dumps(header).encode() if header_text is None else header_text
    return struct.pack("<Q", len(text)) + text + body


def with_tree(tree: object, *, meta: dict | None = None, tensors: dict | None = None) -> bytes:
    """A file with one float32 tensor "w" and oar's metadata holding ``tree``."""
    info = {"format": "oar.checkpoint", "version": 1, "tree": tree} if meta is None else meta
    header = {"__metadata__": {"oar": json.dumps(info)}, "w": F32_2, **(tensors or {})}
    return safetensors_bytes(header)


def deep(depth: int, open_: str, close: str, inner: str = "0") -> bytes:
    return (open_ * depth + inner + close * depth).encode()


def valid_checkpoint() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "valid.safetensors")
        oar.save({"model": {"w": oar.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)),
                            "b": oar.tensor(np.int64([1, 2]))},
                  "step": 3, "betas": (0.9, 0.999)}, path)
        with open(path, "rb") as file:
            return file.read()


# -- the malformed files, by what is wrong ---------------------------------------------------------

def header_cases() -> dict[str, bytes]:
    cases = {
        "empty": b"",
        "length only": struct.pack("<Q", 2),
        "huge header length": struct.pack("<Q", 2**63) + b"{}",
        "max header length": struct.pack("<Q", 2**64 - 1) + b"{}",
        "header length past the end": struct.pack("<Q", 100) + b"{}",
        "zero header length": struct.pack("<Q", 0) + b"{}",
        "not json": safetensors_bytes(None, header_text=b"{not json"),
        "invalid utf-8": safetensors_bytes(None, header_text=b'{"\xff\xfe": 1}'),
        "json list": safetensors_bytes([]),
        "json number": safetensors_bytes(1),
        "json null": safetensors_bytes(None),
        "json string": safetensors_bytes("x"),
        "deep lists": safetensors_bytes(None, header_text=deep(100_000, "[", "]")),
        "deep objects": safetensors_bytes(None, header_text=deep(100_000, '{"a":', "}")),
        "deep in an entry": safetensors_bytes(None, header_text=b'{"w":' + deep(50_000, "[", "]") + b"}"),
        "NaN literal": safetensors_bytes(None, header_text=b'{"w": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 8]}}'),
        "Infinity literal": safetensors_bytes(None, header_text=b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, Infinity]}}'),
    }
    entries = {
        "entry a list": [], "entry a number": 3, "entry a string": "F32", "entry null": None,
        "entry empty": {}, "no dtype": {"shape": [2], "data_offsets": [0, 8]},
        "no shape": {"dtype": "F32", "data_offsets": [0, 8]}, "no offsets": {"dtype": "F32", "shape": [2]},
        "dtype a number": {**F32_2, "dtype": 7}, "dtype a list": {**F32_2, "dtype": ["F32"]},
        "dtype null": {**F32_2, "dtype": None}, "dtype unknown": {**F32_2, "dtype": "F8"},
        "dtype lower case": {**F32_2, "dtype": "f32"}, "dtype U8 (not an oar dtype)": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
        "dtype U64": {"dtype": "U64", "shape": [1], "data_offsets": [0, 8]},
        "dtype I16": {"dtype": "I16", "shape": [4], "data_offsets": [0, 8]},
        "shape a number": {**F32_2, "shape": 2}, "shape a string": {**F32_2, "shape": "2"},
        "shape null": {**F32_2, "shape": None}, "shape a dict": {**F32_2, "shape": {"0": 2}},
        "shape negative": {**F32_2, "shape": [-2]}, "shape negative pair": {**F32_2, "shape": [-1, -2]},
        "shape float": {**F32_2, "shape": [2.0]}, "shape fraction": {**F32_2, "shape": [1.5]},
        "shape bool": {**F32_2, "shape": [True, True]}, "shape string dim": {**F32_2, "shape": ["2"]},
        "shape null dim": {**F32_2, "shape": [None]}, "shape nested": {**F32_2, "shape": [[2]]},
        "shape huge": {**F32_2, "shape": [2**70]}, "shape huge product": {**F32_2, "shape": [2**40, 2**40]},
        "shape wrong size": {**F32_2, "shape": [3]}, "shape zero dim": {**F32_2, "shape": [0]},
        "offsets a number": {**F32_2, "data_offsets": 8}, "offsets null": {**F32_2, "data_offsets": None},
        "offsets one": {**F32_2, "data_offsets": [8]}, "offsets three": {**F32_2, "data_offsets": [0, 8, 16]},
        "offsets empty": {**F32_2, "data_offsets": []}, "offsets a dict": {**F32_2, "data_offsets": {"0": 0, "1": 8}},
        "offsets negative": {**F32_2, "data_offsets": [-8, 0]}, "offsets reversed": {**F32_2, "data_offsets": [8, 0]},
        "offsets floats": {**F32_2, "data_offsets": [0.0, 8.0]}, "offsets strings": {**F32_2, "data_offsets": ["0", "8"]},
        "offsets bools": {**F32_2, "data_offsets": [False, True]}, "offsets nulls": {**F32_2, "data_offsets": [None, None]},
        "offsets past the data": {**F32_2, "data_offsets": [8, 16]}, "offsets huge": {**F32_2, "data_offsets": [2**64, 2**64 + 8]},
        "offsets 2**63": {**F32_2, "data_offsets": [2**63 - 8, 2**63]},
    }
    for name, entry in entries.items():
        cases[name] = safetensors_bytes({"w": entry})
    cases.update({
        "two tensors overlap": safetensors_bytes({"a": F32_2, "b": {**F32_2, "data_offsets": [4, 12]}}, b"\0" * 12),
        "two tensors share bytes": safetensors_bytes({"a": F32_2, "b": F32_2}, b"\0" * 16),
        "a gap before a tensor": safetensors_bytes({"a": {**F32_2, "data_offsets": [4, 12]}}, b"\0" * 12),
        "a gap between tensors": safetensors_bytes({"a": F32_2, "b": {**F32_2, "data_offsets": [12, 20]}}, b"\0" * 20),
        "bytes after the tensors": safetensors_bytes({"w": F32_2}, b"\0" * 9),
        "data shorter than the tensors": safetensors_bytes({"w": F32_2}, b"\0" * 7),
        "no data for a tensor": safetensors_bytes({"w": F32_2}, b""),
        "metadata a list": safetensors_bytes({"__metadata__": [], "w": F32_2}),
        "metadata a string": safetensors_bytes({"__metadata__": "oar", "w": F32_2}),
        "metadata value a number": safetensors_bytes({"__metadata__": {"oar": 1}, "w": F32_2}),
        "metadata value a dict": safetensors_bytes({"__metadata__": {"oar": {"tree": 1}}, "w": F32_2}),
        "metadata value null": safetensors_bytes({"__metadata__": {"oar": None}, "w": F32_2}),
    })
    return cases


def metadata_cases() -> dict[str, bytes]:
    good = {"format": "oar.checkpoint", "version": 1}
    cases = {
        "oar metadata not json": safetensors_bytes({"__metadata__": {"oar": "{not json"}, "w": F32_2}),
        "oar metadata a list": with_tree(None, meta=[]),
        "oar metadata a number": with_tree(None, meta=3),
        "oar metadata null": safetensors_bytes({"__metadata__": {"oar": "null"}, "w": F32_2}),
        "oar metadata deep": safetensors_bytes({"__metadata__": {"oar": deep(100_000, "[", "]").decode()}, "w": F32_2}),
        "oar metadata deep objects": safetensors_bytes({"__metadata__": {"oar": deep(100_000, '{"a":', "}").decode()},
                                                        "w": F32_2}),
        "format missing": with_tree(None, meta={"version": 1, "tree": None}),
        "format wrong": with_tree(None, meta={**good, "format": "torch", "tree": None}),
        "format a list": with_tree(None, meta={**good, "format": ["oar.checkpoint"], "tree": None}),
        "version a string": with_tree(None, meta={**good, "version": "one", "tree": None}),
        "version a float": with_tree(None, meta={**good, "version": 1.5, "tree": None}),
        "version huge float": safetensors_bytes({"__metadata__": {"oar": '{"format": "oar.checkpoint", "version": 1e400, "tree": null}'},
                                                 "w": F32_2}),
        "version infinity": safetensors_bytes({"__metadata__": {"oar": '{"format": "oar.checkpoint", "version": Infinity, "tree": null}'},
                                               "w": F32_2}),
        "version NaN": safetensors_bytes({"__metadata__": {"oar": '{"format": "oar.checkpoint", "version": NaN, "tree": null}'},
                                          "w": F32_2}),
        "version negative": with_tree(None, meta={**good, "version": -1, "tree": None}),
        "version a list": with_tree(None, meta={**good, "version": [1], "tree": None}),
        "version null": with_tree(None, meta={**good, "version": None, "tree": None}),
        "version newer": with_tree(None, meta={**good, "version": 2, "tree": None}),
        "tree missing": with_tree(None, meta=good),
    }
    trees = {
        "tree unknown key": {"__set__": [1]},
        "tree two keys": {"__list__": [], "__tuple__": []},
        "tree empty dict": {},
        "tree bare list": [1, 2],
        "tensor name missing": {"__tensor__": "missing"},
        "tensor name a list": {"__tensor__": ["w"]},
        "tensor name a dict": {"__tensor__": {"w": 1}},
        "tensor name a number": {"__tensor__": 1},
        "tensor name null": {"__tensor__": None},
        "dict a dict": {"__dict__": {"a": 1}},
        "dict a string": {"__dict__": "ab"},
        "dict of numbers": {"__dict__": [1, 2]},
        "dict of strings": {"__dict__": ["ab", "cd"]},
        "dict pair too short": {"__dict__": [["a"]]},
        "dict pair too long": {"__dict__": [["a", 1, 2]]},
        "dict key a list": {"__dict__": [[["a"], 1]]},
        "dict key a dict": {"__dict__": [[{"a": 1}, 1]]},
        "dict key null": {"__dict__": [[None, 1]]},
        "list a dict": {"__list__": {"0": 1}},
        "list a string": {"__list__": "abc"},
        "list a number": {"__list__": 3},
        "tuple a dict": {"__tuple__": {"0": 1}},
        "tuple null": {"__tuple__": None},
        "nested bad tensor": {"__list__": [{"__dict__": [["w", {"__tensor__": "nope"}]]}]},
        "nested unknown": {"__tuple__": [{"__list__": [{"what": 1}]}]},
    }
    for name, tree in trees.items():
        cases[name] = with_tree(tree)
    for depth in (20_000,):
        tree = '{"__list__": [' * depth + '{"__tensor__": "w"}' + "]}" * depth
        text = '{"format": "oar.checkpoint", "version": 1, "tree": ' + tree + "}"
        cases[f"tree nested {depth} deep"] = safetensors_bytes({"__metadata__": {"oar": text}, "w": F32_2})
    return cases


def truncated_cases() -> dict[str, bytes]:
    data = valid_checkpoint()
    (header_len,) = struct.unpack("<Q", data[:8])
    cuts = sorted({1, 4, 7, 8, 9, 10, 20, 8 + header_len // 2, 8 + header_len - 1, 8 + header_len,
                   8 + header_len + 1, len(data) - 8, len(data) - 1})
    return {f"truncated at {cut} of {len(data)}": data[:cut] for cut in cuts}


def random_cases() -> dict[str, bytes]:
    generator = random.Random(20)
    cases = {}
    for index in range(20):
        cases[f"random bytes {index}"] = bytes(generator.randrange(256) for _ in range(generator.randrange(1, 400)))
    for index in range(8):  # a plausible header length, random JSON-ish text
        text = bytes(generator.choice(b'{}[]":,0123456789 FI38shapedtyp') for _ in range(60))
        cases[f"random header {index}"] = struct.pack("<Q", len(text)) + text
    return cases


MUST_RAISE = {**header_cases(), **metadata_cases(), **truncated_cases(), **random_cases()}


@pytest.mark.parametrize("name", sorted(MUST_RAISE))
def test_a_malformed_file_raises_checkpoint_error(tmp_path, name):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(MUST_RAISE[name])
    with pytest.raises(CheckpointError) as info:
        oar.load(path)
    assert info.value.path == str(path) and str(path) in str(info.value)


def test_a_deep_but_valid_tree_loads(tmp_path):
    depth = 300
    text = ('{"format": "oar.checkpoint", "version": 1, "tree": ' + '{"__list__": [' * depth + '{"__tensor__": "w"}'
            + "]}" * depth + "}")
    path = tmp_path / "deep.safetensors"
    path.write_bytes(safetensors_bytes({"__metadata__": {"oar": text}, "w": F32_2}))
    value = oar.load(path)
    for _ in range(depth):
        value = value[0]
    np.testing.assert_array_equal(value.numpy(), np.zeros(2, np.float32))


def test_there_are_at_least_160_malformed_files():
    assert len(MUST_RAISE) >= 160


@pytest.mark.parametrize("seed", range(40))
def test_a_mutated_checkpoint_loads_or_raises_checkpoint_error(tmp_path, seed):
    """Bytes flipped in a valid file's length and header: it may still be a valid file, but the
    only error it can raise is CheckpointError."""
    data = bytearray(valid_checkpoint())
    (header_len,) = struct.unpack("<Q", data[:8])
    generator = random.Random(seed)
    for _ in range(generator.randrange(1, 4)):
        position = generator.randrange(0, 8 + header_len)
        data[position] = generator.choice([generator.randrange(256), ord("["), ord("}"), ord("-"), ord("9"), 0])
    path = tmp_path / "mutated.safetensors"
    path.write_bytes(bytes(data))
    try:
        oar.load(path)
    except CheckpointError as error:
        assert error.path == str(path)


# -- what the file is ------------------------------------------------------------------------------

def test_dev_zero_is_refused_without_reading_it():
    with pytest.raises(CheckpointError, match=r"checkpoint /dev/zero: not a regular file \(a device\)"):
        oar.load("/dev/zero")


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"not a regular file \(a directory\)"):
        oar.load(tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "ckpt.fifo"
    os.mkfifo(fifo)
    outcome = []

    def load():
        try:
            oar.load(fifo)
        except BaseException as error:  # noqa: BLE001 - the test inspects whatever it is
            outcome.append(error)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked in open(): give it a writer so the thread ends, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
        pytest.fail("oar.load blocked on a FIFO")
    assert len(outcome) == 1 and isinstance(outcome[0], CheckpointError)
    assert str(outcome[0]) == f"checkpoint {fifo}: not a regular file (a FIFO); a checkpoint is a file"


# -- saving where it cannot write ------------------------------------------------------------------

def test_saving_into_a_read_only_directory_raises_checkpoint_error(tmp_path):
    if os.geteuid() == 0:  # permission bits do not stop root; sysfs refuses new files to anyone
        directory = "/sys"
        if not os.path.isdir(directory):
            pytest.skip("no directory that root cannot write")
    else:
        directory = str(tmp_path / "readonly")
        os.mkdir(directory)
        os.chmod(directory, stat.S_IRUSR | stat.S_IXUSR)
    path = os.path.join(directory, "ckpt.safetensors")
    before = sorted(os.listdir(directory))
    with pytest.raises(CheckpointError) as info:
        oar.save({"w": oar.tensor(np.float32([1, 2]))}, path)
    assert str(info.value) == (f"checkpoint {path}: cannot write to directory {directory} (Permission denied); "
                               f"nothing was written")
    assert sorted(os.listdir(directory)) == before

"""The ONNX node test cases of the installed onnx package, generated once into a local cache.

onnx 1.23 builds its ~1,900 node cases in Python (about 30 s), so the first use writes each case
(model bytes, data sets, tolerances) under ``$OAR_ONNX_CASES_DIR`` (default
``~/.cache/oar/onnx-node-cases``) ``/<onnx version>/`` with
an index; later processes (every conformance worker) read the index only. Nothing is downloaded.
Also how a case's outputs compare and the quick tier's sample (importing this module registers no test).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oar_conformance.registry import Failure

INDEX = "index.json"


@dataclass(frozen=True)
class NodeCase:
    name: str       # onnx's test name, e.g. "test_add_bcast"
    op_type: str    # the op type of the case's last node ("Add")
    file: str       # the cached pickle: {"model": bytes, "data_sets": [(inputs, outputs)], ...}
    rtol: float
    atol: float

    def load(self) -> dict:
        with open(self.file, "rb") as handle:
            return pickle.load(handle)


def compare(name: str, got, want, rtol: float, atol: float) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise Failure(f"{name}: shape {list(got.shape)}, expected {list(want.shape)}")
    if want.dtype.kind in "fc" or "float" in want.dtype.name:  # ml_dtypes' bfloat16 has kind "V"
        got_f, want_f = got.astype(np.float64), want.astype(np.float64)
        both_nan = np.isnan(got_f) & np.isnan(want_f)
        close = np.isclose(got_f, want_f, rtol=rtol, atol=atol, equal_nan=True) | both_nan
    else:
        close = got == want
    if not np.all(close):
        bad = int(np.size(close) - np.count_nonzero(close))
        first = np.argwhere(~np.asarray(close))[0].tolist() if np.ndim(close) else []
        raise Failure(f"{name}: {bad} of {np.size(close)} elements differ (rtol {rtol}, atol {atol}); "
                      f"first at {first}: got {got[tuple(first)] if first else got}, "
                      f"expected {want[tuple(first)] if first else want}")


def one_case_per_op_type(test_ids: list[str]) -> list[str]:
    """One test id per ONNX op type (onnx.<op>.<case>), the one with the shortest id (the plain case, such as
    onnx.add.add, where there is one), ties broken alphabetically; deterministic for an onnx version."""
    chosen: dict[str, str] = {}
    for identifier in test_ids:
        op_type = identifier.split(".")[1]
        best = chosen.get(op_type)
        if best is None or (len(identifier), identifier) < (len(best), best):
            chosen[op_type] = identifier
    return sorted(chosen.values())


def as_array(value):
    """A data set value as numpy: onnx keeps some (the Cast cases') as TensorProto."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else value


def cache_dir() -> Path:
    import onnx

    root = os.environ.get("OAR_ONNX_CASES_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "oar",
                                                                  "onnx-node-cases")
    return Path(root) / onnx.__version__


def node_cases() -> list[NodeCase]:
    """Every node case, generating the cache on first use (written to a temp dir, then renamed)."""
    directory = cache_dir()
    index = directory / INDEX
    if not index.exists():
        _generate(directory)
    entries = json.loads(index.read_text())
    return [NodeCase(e["name"], e["op_type"], str(directory / e["file"]), e["rtol"], e["atol"]) for e in entries]


def _generate(directory: Path) -> None:
    from onnx.backend.test.loader import load_model_tests

    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=directory.parent))
    entries = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    for case in cases:
        model = case.model
        op_type = model.graph.node[-1].op_type if model.graph.node else "none"
        file = re.sub(r"[^A-Za-z0-9_]", "_", case.name) + ".pkl"
        with open(staging / file, "wb") as handle:
            pickle.dump({"model": model.SerializeToString(), "data_sets": case.data_sets}, handle)
        entries.append({"name": case.name, "op_type": op_type, "file": file, "rtol": case.rtol, "atol": case.atol})
    (staging / INDEX).write_text(json.dumps(entries))
    try:
        os.rename(staging, directory)
    except OSError:  # another process won the race: its copy is as good
        import shutil

        shutil.rmtree(staging, ignore_errors=True)

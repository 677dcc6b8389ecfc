"""The ONNX node test cases of the installed onnx package, generated once into a local cache.

onnx 1.23 builds its ~1,900 node cases in Python (about 30 s), so the first use writes each case
(model bytes, data sets, tolerances) under ``$OAR_ONNX_CASES_DIR`` (default
``~/.cache/oar/onnx-node-cases``) ``/<onnx version>/`` with
an index; later processes (every conformance worker) read the index only. Nothing is downloaded.
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

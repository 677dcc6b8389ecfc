"""The docs' Python snippets run as written, and the contract tables the docs copy agree with
their source. Each page's ``python`` blocks run in order in one fresh interpreter (a page reads as
one session), on the CPU reference plugin posing as "npu" with two devices, and with the
torchrun variables a single-rank world needs."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from oar_conformance.tolerances import CONTRACT

REPO = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/index.md", "docs/user/index.md", "docs/vendor/quickstart.md", "docs/compiler.md",
         "docs/user/onnx.md", "docs/user/jit.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: str) -> list[str]:
    return BLOCK.findall((REPO / page).read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("page", PAGES)
def test_the_python_snippets_of_a_page_run(page, tmp_path):
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python snippet"
    script = tmp_path / "snippets.py"
    script.write_text("\n".join(f"# ---- snippet {k + 1} of {page}\n{block}" for k, block in enumerate(blocks)))
    environment = dict(os.environ, OAR_REFCPU_DEVICE_TYPE="npu", OAR_REFCPU_DEVICE_COUNT="2",
                       OAR_CACHE_DIR=str(tmp_path / "cache"), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), PYTHONWARNINGS="ignore")
    environment.pop("OAR_PLUGIN_PATH", None)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=environment)
    assert done.returncode == 0, f"{page}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


def test_the_vendor_guide_states_the_tolerance_contract():
    """The table in docs/vendor/implement.md is CONTRACT of oar_conformance.tolerances."""
    text = (REPO / "docs" / "vendor" / "implement.md").read_text()
    rows = {}
    for dtype, *cells in re.findall(r"^\| (b?float\d+) \| (.+?) \| (.+?) \| (.+?) \|$", text, flags=re.M):
        rows[dtype] = {column: tuple(float(v) for v in re.fullmatch(r"rtol (\S+), atol (\S+)", cell).groups())
                       for column, cell in zip(("elementwise", "accumulating", "gradient"), cells)}
    assert rows == {dtype: {column: (t.rtol, t.atol) for column, t in row.items()} for dtype, row in CONTRACT.items()}

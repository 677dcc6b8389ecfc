"""The README and the docs stay inside the repository and name what exists (issue 20 §3): every
relative link resolves to a file or folder of the checkout, none leads outside it (the README once
pointed at a design file beside the repository), the ops a page names in backticks as kernels are
ops of interface/ops.yaml, and no page calls an existing level "to come"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import oar_opset

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", REPO / "conformance" / "README.md", *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
# Pages docs/hooks/reference.py writes at build time (never committed).
GENERATED = {REPO / "docs" / "reference" / "abi.md", REPO / "docs" / "reference" / "ops.md"}


def _relative_links(page: Path) -> list[str]:
    return [target.split("#")[0] for target in LINK.findall(page.read_text())
            if not re.match(r"^[a-z]+:", target) and not target.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_inside_the_repository(page):
    for target in _relative_links(page):
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(REPO), f"{page.relative_to(REPO)} links outside the repository: {target}"
        assert resolved.exists() or resolved in GENERATED, f"{page.relative_to(REPO)} links to a missing path: {target}"


def test_kernels_the_pages_name_are_ops():
    """'a `fill` kernel' was written where ops.yaml has `full`."""
    ops = {op.name for op in oar_opset.default()}
    for page in PAGES:
        text = page.read_text()
        for name in re.findall(r"`([a-z_0-9]+)` kernel", text):
            assert name in ops, f"{page.relative_to(REPO)} names a `{name}` kernel; ops.yaml has no op {name}"
        assert not re.search(r"`fill`|\bfill kernel", text), f"{page.relative_to(REPO)} names a fill kernel (the op is full)"


def test_no_page_calls_a_level_to_come():
    for page in PAGES:
        for line in page.read_text().splitlines():
            assert not re.search(r"\bto come\b", line), f"{page.relative_to(REPO)}: {line.strip()}"

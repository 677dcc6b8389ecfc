"""The generated references of docs/: the ABI reference covers every entry point of device_api.h
as its doc comments state it (required or optional, blocking, statuses), the op reference every
op of ops.yaml; and oar.vendor.abi_doc, which both the docs and ``oar new-backend`` read the header
with, agrees with the cffi binding. (``mkdocs build --strict`` itself runs in ``make test``.)"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path


from oar.vendor import abi, abi_doc

REPO = Path(__file__).resolve().parents[1]
HEADER = REPO / "interface" / "include" / "oar" / "device_api.h"


def hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", REPO / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def sections(markdown: str) -> dict[str, str]:
    """### heading -> its text, up to the next heading."""
    parts = re.split(r"^#{2,3} (.+)$", markdown, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_abi_doc_agrees_with_the_binding():
    text = HEADER.read_text()
    entries = abi_doc.entries(text)
    assert [entry.name for entry in entries] == abi.table_fields()
    assert [entry.name for entry in entries if entry.required] == abi.required_entries()
    for entry in entries:
        assert entry.summary and entry.requirement in ("REQUIRED", "OPTIONAL"), entry.name
        assert entry.result in ("oar_status", "const char*"), entry.name
        assert entry.status or entry.result != "oar_status", f"{entry.name}: no Status: line"
    grouped = [name for members in abi_doc.optional_groups(text).values() for name in members]
    assert sorted(grouped) == sorted(e.name for e in entries if not e.required)
    assert abi_doc.optional_groups(text)["collectives"][0] == "get_unique_id"


def test_the_abi_reference_has_every_entry_point():
    markdown = hook().abi_markdown(HEADER.read_text())
    found = sections(markdown)
    required = set(abi.required_entries())
    for entry in abi_doc.entries(HEADER.read_text()):
        assert entry.name in found, entry.name
        body = found[entry.name]
        assert f"(*{entry.name})(" in body, f"{entry.name}: no declaration"
        assert ("| requirement | **REQUIRED**" in body) == (entry.name in required), entry.name
        assert "| blocking |" in body and "| threads |" in body
        if entry.status:
            assert "Returns:" in body, entry.name
    for name in ("OAR_SUCCESS", "OAR_ERROR_NOT_INITIALIZED"):
        assert f"| `{name}` |" in markdown


def test_the_op_reference_has_every_op():
    markdown = hook().ops_markdown()
    found = sections(markdown)
    for op in hook()._opset().load(str(REPO / "interface" / "ops.yaml")):
        assert op.name in found, op.name
        for attr in op.attrs:
            assert f"| `{attr.name}` |" in found[op.name], (op.name, attr.name)
        assert ("| Tensor method |" in found[op.name]) == op.method, op.name

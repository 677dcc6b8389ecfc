"""The three reference plugins share one file layout by group of device_api.h's function table
(issue 20 §2; the table in docs/vendor/implement.md): each has plugin, device, memory, stream,
event, kernels and module sources; plugin.c/.cpp holds the entry point and the table only, and
init / finalize are defined in device.c/.cpp with the device entries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[1] / "reference_backends"
GROUP_FILES = ("plugin", "device", "memory", "stream", "event", "kernels", "module")
# A function definition at the start of a line (a declaration ends with ';' instead of '{').
DEFINITION = re.compile(r"^(?:extern\s+\"C\"\s+)?(?:static\s+)?(?:OAR_PLUGIN_EXPORT\s+)?[\w\s\*]+?\b(\w+)\([^;{]*\)\s*\{", re.M)


def _source(plugin: str, stem: str) -> Path:
    found = [p for p in (PLUGINS / plugin / "src").glob(f"{stem}.*") if p.suffix in (".c", ".cpp")]
    assert len(found) == 1, f"{plugin}: expected one src/{stem}.c or .cpp, found {found}"
    return found[0]


@pytest.mark.parametrize("plugin", ["cpu", "opencl", "cuda"])
def test_each_group_of_the_table_has_its_file(plugin):
    for stem in GROUP_FILES:
        _source(plugin, stem)


@pytest.mark.parametrize("plugin", ["cpu", "opencl", "cuda"])
def test_init_and_finalize_live_in_device_not_plugin(plugin):
    entry = DEFINITION.findall(_source(plugin, "plugin").read_text())
    device = DEFINITION.findall(_source(plugin, "device").read_text())
    assert "oar_plugin_init" in entry
    assert not [name for name in entry if re.search(r"_(init|finalize)$", name) and name != "oar_plugin_init"], entry
    assert {name for name in device if re.search(r"_(init|finalize)$", name)} >= {
        {"cpu": "refcpu", "opencl": "ocl", "cuda": "cu"}[plugin] + suffix for suffix in ("_init", "_finalize")}

"""The binary layout of the ABI's structs, as a C compiler lays them out.

``interface/abi/v<major>.<minor>.json`` records, for one released ABI version,
the size of every struct and the offset and size of every field, plus the
values of the header's integer constants. A later header may only append:
tests compile a probe against the current header and compare.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from .abi import C, cdef_source, ffi, header_path

RECORD_FORMAT = 1


def struct_names() -> list[str]:
    """Every named struct typedef of the header (``oar_*``), in declaration order."""
    names = []
    for line in cdef_source(header_path().read_text()).splitlines():
        line = line.strip()
        if line.startswith("} oar_") and line.endswith(";"):
            names.append(line[2:-1])
    return names


def data_model() -> str:
    """The C data model the layout was computed for; records of other models don't compare."""
    return {(4, 4): "ILP32", (8, 8): "LP64", (4, 8): "LLP64"}.get(
        (ffi.sizeof("long"), ffi.sizeof("void*")), "unknown")


def to_json(layout_record: dict) -> str:
    """Readable JSON: one line per field."""
    text = json.dumps(layout_record, indent=1)
    return re.sub(r"\[\s+(\"\w+\"),\s+(\d+),\s+(\d+)\s+\]", r"[\1, \2, \3]", text) + "\n"


def constant_names() -> list[str]:
    return sorted(name for name in dir(C) if name.startswith("OAR_"))


def probe_source(structs: list[str]) -> str:
    """A C program that prints ``struct field offset size`` lines and ``struct . size`` lines."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "oar/device_api.h"', "int main(void) {"]
    for struct in structs:
        lines.append(f'  printf("{struct} . 0 %zu\\n", sizeof({struct}));')
        for field, _ in ffi.typeof(struct).fields:
            lines.append(
                f'  printf("{struct} {field} %zu %zu\\n", offsetof({struct}, {field}), '
                f"sizeof((({struct}*)0)->{field}));"
            )
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def compiled_layout(include_dir: Path | None = None, compiler: str | None = None) -> dict:
    """Sizes and offsets as the system C compiler computes them for the current header."""
    include_dir = include_dir or header_path().parents[1]
    compiler = compiler or os.environ.get("CC", "cc")
    structs = struct_names()
    with tempfile.TemporaryDirectory(prefix="oar-abi-probe-") as work:
        source = Path(work) / "probe.c"
        binary = Path(work) / "probe"
        source.write_text(probe_source(structs))
        subprocess.run([compiler, "-std=c99", "-I", str(include_dir), str(source), "-o", str(binary)],
                       check=True, capture_output=True, text=True)
        output = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    layout: dict[str, dict] = {struct: {"size": 0, "fields": []} for struct in structs}
    for line in output.splitlines():
        struct, field, offset, size = line.split()
        if field == ".":
            layout[struct]["size"] = int(size)
        else:
            layout[struct]["fields"].append([field, int(offset), int(size)])
    return layout


def record(include_dir: Path | None = None) -> dict:
    return {
        "format": RECORD_FORMAT,
        "abi_version": f"{C.OAR_ABI_VERSION_MAJOR}.{C.OAR_ABI_VERSION_MINOR}",
        "data_model": data_model(),
        "structs": compiled_layout(include_dir),
        "constants": {name: getattr(C, name) for name in constant_names()},
    }


def append_only_violations(recorded: dict, current: dict) -> list[str]:
    """What ``current`` changed in ``recorded`` beyond appending; empty if nothing."""
    problems = []
    for struct, old in recorded["structs"].items():
        new = current["structs"].get(struct)
        if new is None:
            problems.append(f"{struct}: removed")
            continue
        if new["size"] < old["size"]:
            problems.append(f"{struct}: shrank from {old['size']} to {new['size']} bytes")
        new_fields = {name: (offset, size) for name, offset, size in new["fields"]}
        for name, offset, size in old["fields"]:
            if name not in new_fields:
                problems.append(f"{struct}.{name}: removed or renamed")
            elif new_fields[name] != (offset, size):
                problems.append(f"{struct}.{name}: moved from offset {offset} size {size} "
                                f"to offset {new_fields[name][0]} size {new_fields[name][1]}")
        for name, offset, _ in new["fields"]:
            if name not in {field[0] for field in old["fields"]} and offset < old["size"]:
                problems.append(f"{struct}.{name}: new field inside the old struct (offset {offset})")
    for name, value in recorded["constants"].items():
        if name in ("OAR_ABI_VERSION_MINOR",):
            continue  # the minor is meant to grow
        if current["constants"].get(name) != value:
            problems.append(f"constant {name}: was {value}, now {current['constants'].get(name)}")
    return problems


def main() -> None:
    """Write the layout of the current header: python -m oar.vendor.abi_layout OUT.json"""
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m oar.vendor.abi_layout OUT.json  (writes the current header's layout)")
    out = Path(sys.argv[1])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(to_json(record()))
    os.replace(tmp, out)


if __name__ == "__main__":
    main()

"""The header as a public spec: it compiles cleanly, its layout only ever grows,
and every entry point carries the doc comment that is its reference."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from oar.vendor import abi, abi_layout

REPO = Path(__file__).resolve().parents[1]
RECORDS = sorted((REPO / "interface" / "abi").glob("v*.json"))
HEADER = REPO / "interface" / "include" / "oar" / "device_api.h"

USES_EVERY_TYPE = """
#include "oar/device_api.h"
static oar_status probe_init(oar_plugin_params* params) { (void)params; return OAR_SUCCESS; }
/* static: zero-initialized without initializer lists, which C++ -Wextra flags */
static oar_device_table table;
static oar_dl_tensor tensor;
static oar_attr attr;
static oar_kernel_arg arg;
static oar_launch_config config;
static oar_device_properties props;
static oar_unique_id id;
static oar_profile_record record;
int main(void) {
  oar_plugin_init_fn init = probe_init;
  table.struct_size = sizeof table;
  (void)init; (void)tensor; (void)attr; (void)arg; (void)config; (void)props; (void)id; (void)record;
  return (int)(table.struct_size == 0);
}
"""


@pytest.mark.parametrize("compiler,flags,suffix", [
    ("cc", ["-std=c99"], ".c"),
    ("cc", ["-std=c11"], ".c"),
    ("c++", ["-std=c++17"], ".cpp"),
])
def test_header_compiles_pedantic(tmp_path, compiler, flags, suffix):
    source = tmp_path / f"uses_header{suffix}"
    source.write_text(USES_EVERY_TYPE)
    result = subprocess.run(
        [compiler, *flags, "-Wall", "-Wextra", "-Werror", "-pedantic", "-I", str(HEADER.parents[1]),
         str(source), "-o", str(tmp_path / "a.out")],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_header_includes_only_standard_headers():
    includes = re.findall(r"#include\s+[<\"]([^>\"]+)[>\"]", HEADER.read_text())
    assert set(includes) <= {"stddef.h", "stdint.h"}, includes


def test_released_versions_are_recorded():
    versions = {json.loads(path.read_text())["abi_version"] for path in RECORDS}
    assert f"{abi.C.OAR_ABI_VERSION_MAJOR}.0" in versions


@pytest.mark.parametrize("record_path", RECORDS, ids=lambda path: path.stem)
def test_layout_is_append_only(record_path):
    recorded = json.loads(record_path.read_text())
    current = abi_layout.record(HEADER.parents[1])
    if recorded["data_model"] != current["data_model"]:
        pytest.skip(f"record is for {recorded['data_model']}, this machine is {current['data_model']}")
    assert abi_layout.append_only_violations(recorded, current) == []


def test_layout_check_catches_a_moved_field():
    current = abi_layout.record(HEADER.parents[1])
    tampered = json.loads(json.dumps(current))
    fields = tampered["structs"]["oar_device_table"]["fields"]
    fields[3][1] += 8
    tampered["structs"]["oar_plugin_params"]["size"] += 8
    problems = abi_layout.append_only_violations(tampered, current)
    assert any("oar_device_table." in problem and "moved" in problem for problem in problems)
    assert any("oar_plugin_params: shrank" in problem for problem in problems)


def test_cffi_layout_matches_the_compiler():
    """The raw binding tests rely on agrees with a real compiler, field by field."""
    compiled = abi_layout.compiled_layout(HEADER.parents[1])
    for struct, layout in compiled.items():
        assert abi.ffi.sizeof(struct) == layout["size"], struct
        for field, offset, _ in layout["fields"]:
            assert abi.ffi.offsetof(struct, field) == offset, f"{struct}.{field}"


def test_dl_tensor_is_layout_identical_to_dlpack(tmp_path):
    torch = pytest.importorskip("torch", reason="DLPack's own dlpack.h comes with torch's headers")
    torch_include = Path(torch.__file__).parent / "include"
    found = [torch_include / name for name in ("dlpack/dlpack.h", "ATen/dlpack.h")
             if (torch_include / name).exists()]
    if not found:
        pytest.skip("this torch build ships no dlpack.h")
    checks = []
    for ours, theirs, fields in [
        ("oar_dl_device", "DLDevice", ["device_type", "device_id"]),
        ("oar_dl_data_type", "DLDataType", ["code", "bits", "lanes"]),
        ("oar_dl_tensor", "DLTensor",
         ["data", "device", "ndim", "dtype", "shape", "strides", "byte_offset"]),
    ]:
        checks.append(f"_Static_assert(sizeof({ours}) == sizeof({theirs}), \"{ours} size\");")
        for field in fields:
            checks.append(f"_Static_assert(offsetof({ours}, {field}) == offsetof({theirs}, {field}), "
                          f"\"{ours}.{field}\");")
    for ours, theirs in [("OAR_DL_CPU", "kDLCPU"),
                         ("OAR_DL_EXT_DEV", "kDLExtDev"), ("OAR_DL_INT", "kDLInt"),
                         ("OAR_DL_UINT", "kDLUInt"), ("OAR_DL_FLOAT", "kDLFloat"),
                         ("OAR_DL_BFLOAT", "kDLBfloat"), ("OAR_DL_BOOL", "kDLBool")]:
        checks.append(f"_Static_assert((int){ours} == (int){theirs}, \"{ours}\");")
    source = tmp_path / "dlpack_layout.c"
    source.write_text(f"#include <stddef.h>\n#include \"{found[0]}\"\n"
                      "#include \"oar/device_api.h\"\n"
                      + "\n".join(checks) + "\nint main(void) { return 0; }\n")
    result = subprocess.run(["cc", "-std=c11", "-I", str(HEADER.parents[1]),
                             str(source), "-o", str(tmp_path / "a.out")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_entry_point_is_documented():
    """Each entry has a doc comment; outside the collectives group, each states
    its requirement and its statuses (the ABI reference is generated from them)."""
    text = HEADER.read_text()
    table = text[text.index("typedef struct oar_device_table"):text.index("} oar_device_table;")]
    documented = dict()
    for match in re.finditer(r"/\*(.*?)\*/\s*(?:const char\*|oar_status)\s*\(\*(\w+)\)", table, re.S):
        documented[match.group(2)] = match.group(1)
    assert set(abi.table_fields()) <= set(documented) | {"group_end"}
    collective_entries = abi.table_fields()[abi.table_fields().index("get_unique_id"):
                                            abi.table_fields().index("group_end") + 1]
    for entry, comment in documented.items():
        if entry in collective_entries:
            continue
        assert "Requirement:" in comment, entry
        if entry != "get_last_error_message":
            assert "Status:" in comment, entry


def test_required_core_size():
    required = abi.required_entries()
    assert 25 <= len(required) <= 30
    assert 50 <= len(abi.table_fields()) <= 70
    assert required[0] == "init" and "kernel_launch" in required

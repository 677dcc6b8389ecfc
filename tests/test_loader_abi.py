"""The loader's version and table checks, each failure with its own clear error,
using plugins whose entry points are Python callables (oar.vendor.abi.PythonPlugin)."""

from __future__ import annotations

import subprocess

import pytest

import oar
from oar import _C
from oar.vendor import abi
from oar.vendor.abi import C, ffi


def minimal_entries(message: bytes = b"") -> dict:
    """Every REQUIRED entry, doing nothing successfully, on one device."""
    last_error = ffi.new("char[]", message)

    def device_count(count):
        count[0] = 1
        return C.OAR_SUCCESS

    def get_device(device):
        device[0] = 0
        return C.OAR_SUCCESS

    entries = {name: (lambda *args: C.OAR_SUCCESS) for name in abi.required_entries()}
    entries.update(get_last_error_message=lambda: last_error, device_count=device_count, get_device=get_device)
    entries["_keep"] = last_error
    return entries


def make_plugin(**options) -> abi.PythonPlugin:
    entries = options.pop("entries", None) or minimal_entries()
    keep = entries.pop("_keep", None)
    plugin = abi.PythonPlugin(entries, **options)
    plugin.keep = keep
    return plugin


def load(plugin: abi.PythonPlugin, origin: str = "test plugin"):
    return _C.load_from_init(plugin.init_address, origin)


def test_the_loaders_entry_list_is_the_headers():
    assert [name for name, _ in _C.entry_points()] == abi.table_fields()
    assert [name for name, required in _C.entry_points() if required] == abi.required_entries()


def test_a_minimal_plugin_loads_and_reports_what_it_lacks():
    python_plugin = make_plugin(device_type="pyminimal")
    loaded = load(python_plugin)
    assert loaded.device_type == "pyminimal"
    assert set(loaded.provided_entries()) == set(abi.required_entries())
    assert "module_compile" in loaded.missing_optional_entries()
    assert loaded.optional_entries() == []
    loaded.finalize()


@pytest.mark.parametrize("minor", [0, C.OAR_ABI_VERSION_MINOR, C.OAR_ABI_VERSION_MINOR + 7])
def test_any_minor_of_the_same_major_is_accepted(minor):
    loaded = load(make_plugin(device_type=f"pyminor{minor}", abi_minor=minor))
    assert loaded.abi_version == (C.OAR_ABI_VERSION_MAJOR, minor)
    loaded.finalize()


@pytest.mark.parametrize("major", [0, C.OAR_ABI_VERSION_MAJOR + 1])
def test_another_major_is_refused(major):
    with pytest.raises(oar.PluginLoadError, match=rf"speaks ABI {major}\.0, this Oar speaks "
                                                  rf"{C.OAR_ABI_VERSION_MAJOR}\."):
        load(make_plugin(abi_major=major))


def test_entries_beyond_an_older_tables_struct_size_are_not_provided():
    entries = minimal_entries()
    entries["profiler_start"] = lambda device: C.OAR_SUCCESS  # set in memory, but past struct_size
    older_size = ffi.offsetof("oar_device_table", "get_unique_id")
    loaded = load(make_plugin(entries=entries, device_type="pyolder", table_size=older_size))
    assert not loaded.provides("profiler_start")
    assert "profiler_start" in loaded.missing_optional_entries()
    loaded.finalize()


def test_a_table_too_small_for_the_required_core_is_refused():
    too_small = ffi.offsetof("oar_device_table", "kernel_launch")
    with pytest.raises(oar.PluginLoadError, match="struct too small"):
        load(make_plugin(table_size=too_small))


@pytest.mark.parametrize("missing", ["mem_alloc", "stream_wait_event", "kernel_launch"])
def test_a_missing_required_entry_is_named(missing):
    entries = minimal_entries()
    del entries[missing]
    with pytest.raises(oar.PluginLoadError, match=f"missing required entry points: .*{missing}"):
        load(make_plugin(entries=entries))


def test_no_table_is_refused():
    with pytest.raises(oar.PluginLoadError, match="table"):
        load(make_plugin(provide_table=False))


@pytest.mark.parametrize("name", ["", "NPU", "9npu", "n-p-u", "x" * 40])
def test_a_bad_device_type_is_refused(name):
    with pytest.raises(oar.PluginLoadError, match="invalid device_type"):
        load(make_plugin(device_type=name))


def test_plugin_init_failure_is_reported():
    with pytest.raises(oar.PluginLoadError, match="oar_plugin_init"):
        load(make_plugin(init_status=C.OAR_ERROR_NOT_SUPPORTED))


def test_init_failure_carries_the_plugins_message():
    entries = minimal_entries(b"no device node /dev/npu0")
    entries["init"] = lambda: C.OAR_ERROR_DEVICE_LOST
    with pytest.raises(oar.PluginLoadError, match="no device node /dev/npu0"):
        load(make_plugin(entries=entries, device_type="pyinitfail"))


def test_a_failing_call_becomes_a_device_error_naming_everything():
    entries = minimal_entries(b"arena exhausted on tile 3")
    entries["mem_alloc"] = lambda device, size, pointer: C.OAR_ERROR_OUT_OF_MEMORY
    loaded = load(make_plugin(entries=entries, device_type="pyoom"), origin="fault injection")
    with pytest.raises(oar.DeviceError) as caught:
        loaded.mem_alloc(0, 1024)
    error = caught.value
    assert error.call == "mem_alloc" and error.status == C.OAR_ERROR_OUT_OF_MEMORY
    assert error.status_name == "OAR_ERROR_OUT_OF_MEMORY"
    assert "arena exhausted on tile 3" in str(error) and "pyoom" in str(error)
    loaded.finalize()


def test_a_plugin_that_raises_inside_an_entry_point_gives_an_internal_error():
    entries = minimal_entries()

    def broken_count(count):
        raise RuntimeError("bug in the vendor's Python shim")

    entries["device_synchronize"] = broken_count
    python_plugin = make_plugin(entries=entries, device_type="pyraises")
    loaded = load(python_plugin)
    with pytest.raises(oar.DeviceError, match="OAR_ERROR_INTERNAL"):
        loaded.device_synchronize(0)
    assert [(name, str(error)) for name, error in python_plugin.errors] == \
        [("device_synchronize", "bug in the vendor's Python shim")]
    loaded.finalize()


def test_a_library_without_the_entry_symbol_is_refused(tmp_path):
    source = tmp_path / "not_a_plugin.c"
    source.write_text("int some_other_symbol(void) { return 1; }\n")
    library = tmp_path / "libnot_a_plugin.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    with pytest.raises(oar.PluginLoadError, match="oar_plugin_init") as caught:
        _C.load_plugin(str(library))
    assert str(library) in str(caught.value)


def test_a_file_that_is_not_a_library_is_refused(tmp_path):
    bogus = tmp_path / "libbogus.so"
    bogus.write_text("this is text, not ELF")
    with pytest.raises(oar.PluginLoadError, match=str(bogus)):
        _C.load_plugin(str(bogus))

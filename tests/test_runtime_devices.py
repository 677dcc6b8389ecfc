"""Device names, selection, counts, properties and memory info through the oar API."""

from __future__ import annotations

import threading

import pytest

import oar
from oar import _C
from oar.vendor import abi


def refcpu_type() -> str:
    for record in oar.plugin_manager.plugin_records():
        if record.status == "loaded" and record.path.endswith("liboar_refcpu.so"):
            return record.device_type
    pytest.skip("the CPU reference plugin is not loaded")


@pytest.fixture(scope="module")
def kind() -> str:
    return refcpu_type()


def test_entry_point_list_matches_the_header():
    assert [name for name, _ in _C.entry_points()] == abi.table_fields()
    assert [name for name, required in _C.entry_points() if required] == abi.required_entries()
    minimum = abi.ffi.offsetof("oar_device_table", "kernel_launch") + abi.ffi.sizeof("void*")
    assert _C.MINIMUM_TABLE_SIZE == minimum
    assert _C.TABLE_SIZE == abi.ffi.sizeof("oar_device_table")


def test_device_strings():
    assert str(oar.device("npu:1")) == "npu:1"
    assert oar.device("npu") == "npu"
    assert oar.device("npu").index is None
    assert oar.device("npu", 3) == oar.device("npu:3")
    assert oar.device("npu:0") != "npu:1"
    assert hash(oar.device("npu:2")) == hash(oar.device("npu", 2))
    assert repr(oar.device("x_1:4")) == "oar.device('x_1:4')"
    for bad in ("NPU", "npu:", "npu:-1", "npu:0:1", "9npu", "", "npu:x"):
        with pytest.raises(oar.InvalidDeviceError):
            oar.device(bad)
    with pytest.raises(oar.InvalidDeviceError):
        oar.device("npu:1", 2)
    with pytest.raises(TypeError):
        oar.device(3)


def test_set_and_get_device(kind):
    assert oar.set_device(f"{kind}:1") == f"{kind}:1"
    assert oar.get_device() == f"{kind}:1"
    assert oar.set_device(kind) == f"{kind}:0"
    assert oar.get_device() == oar.device(kind, 0)


def test_current_device_is_per_thread(kind):
    oar.set_device(f"{kind}:1")
    seen = []
    thread = threading.Thread(target=lambda: seen.append(str(oar.get_device())))
    thread.start()
    thread.join()
    assert seen == [f"{kind}:0"]  # a new thread starts on the default device
    assert oar.get_device() == f"{kind}:1"
    oar.set_device(f"{kind}:0")


def test_device_count(kind):
    assert oar.device_count(kind) == 2
    oar.set_device(kind)
    assert oar.device_count() == 2
    with pytest.raises(oar.InvalidDeviceError):
        oar.device_count(f"{kind}:0")


def test_unknown_device_type_names_what_is_loaded(kind):
    with pytest.raises(oar.InvalidDeviceError) as error:
        oar.set_device("nosuchdev:0")
    message = str(error.value)
    assert "no plugin provides device type 'nosuchdev'" in message
    assert f"loaded: {kind}" in message or kind in message
    assert isinstance(error.value, ValueError)


def test_bad_index(kind):
    with pytest.raises(oar.InvalidDeviceError, match="device index 7 is out of range"):
        oar.set_device(f"{kind}:7")
    plugin = oar.plugin_manager.plugin_for(kind)
    with pytest.raises(oar.InvalidDeviceError, match="out of range"):
        plugin.mem_alloc(2, 16)


def test_status_names_match_the_header():
    from oar.errors import STATUS_NAMES

    header_statuses = {getattr(abi.C, name): name for name in dir(abi.C) if name.startswith("OAR_ERROR_")}
    header_statuses[abi.C.OAR_SUCCESS] = "OAR_SUCCESS"
    assert STATUS_NAMES == header_statuses
    assert {code: _C.status_name(code) for code in header_statuses} == header_statuses
    assert _C.status_name(77) == "OAR_STATUS_77"


def test_properties(kind):
    props = oar.get_device_properties(f"{kind}:0")
    assert set(props) == {
        "name", "vendor", "driver_version", "total_memory", "compute_units", "clock_mhz", "max_grid",
        "max_block", "max_threads_per_block", "simd_width", "memory_alignment", "stream_priority_lowest",
        "stream_priority_highest", "max_shared_memory_bytes",
    }
    assert props["total_memory"] > 0
    assert len(props["max_grid"]) == 3
    assert isinstance(props["name"], str) and props["name"]


def test_memory_info_tracks_allocations(kind):
    free_before, total = oar.mem_get_info(f"{kind}:1")
    assert 0 < free_before <= total
    buffer = oar.raw.DeviceBuffer(1 << 20, f"{kind}:1")
    free_after, _ = oar.mem_get_info(f"{kind}:1")
    assert free_after <= free_before - (1 << 20)
    buffer.free()


def test_synchronize(kind):
    oar.synchronize(f"{kind}:0")
    oar.synchronize(f"{kind}:1")
    oar.set_device(kind)
    oar.synchronize()


def test_plugin_identity(kind):
    plugin = oar.plugin_manager.plugin_for(kind)
    assert plugin.abi_version == oar.HOST_ABI_VERSION
    assert plugin.initialized and not plugin.finalized
    assert "kernel_launch" in plugin.provided_entries()
    assert set(plugin.optional_entries()).isdisjoint(plugin.missing_optional_entries())
    assert plugin.provides("stream_add_callback")
    assert not plugin.provides("no_such_entry")

"""The loader's checks, each failure its own PluginLoadError naming the plugin and
the problem, plus the life cycle of a loaded plugin (finalize once, handles first).
Plugins here are assembled from Python callables (oar.vendor.abi.PythonPlugin)."""

from __future__ import annotations

import ctypes.util
import logging
import shutil
import threading

import pytest

import oar
from oar import _C
from oar.vendor.abi import C, PythonPlugin, ffi

MESSAGE = ffi.new("char[]", b"the device caught fire")


def base_entries(calls: list | None = None, device_count: int = 1) -> dict:
    """Every REQUIRED entry: succeeding, handing out fake handles, noting each call in `calls`."""
    calls = [] if calls is None else calls
    next_handle = [0x1000]

    def note(name, result=0):
        def entry(*args):
            calls.append(name)
            return result
        return entry

    def handing_out(name, cast):
        def entry(*args):
            calls.append(name)
            next_handle[0] += 0x10
            args[-1][0] = ffi.cast(cast, next_handle[0])
            return 0
        return entry

    def count(out):
        out[0] = device_count
        return 0

    entries = {name: note(name) for name, required in _C.entry_points() if required}
    entries.update({
        "get_last_error_message": lambda: MESSAGE,
        "device_count": count,
        "stream_create": handing_out("stream_create", "oar_stream"),
        "event_create": handing_out("event_create", "oar_event"),
        "mem_alloc": handing_out("mem_alloc", "void*"),
    })
    return entries


def load(plugin: PythonPlugin, origin: str = "python-plugin", initialize: bool = True):
    return _C.load_from_init(plugin.init_address, origin, initialize, owner=plugin)


# ---- the checks, one failure each ---------------------------------------------

def test_a_complete_plugin_loads():
    python_plugin = PythonPlugin(base_entries(), device_type="good", plugin_version="1.2.3", capabilities=2)
    plugin = load(python_plugin, "good-origin")
    assert (plugin.device_type, plugin.version, plugin.path, plugin.capabilities) == ("good", "1.2.3", "good-origin", 2)
    assert plugin.abi_version == oar.HOST_ABI_VERSION
    assert plugin.device_count() == 1
    assert plugin.optional_entries() == []
    assert "stream_add_callback" in plugin.missing_optional_entries()
    plugin.finalize()


def test_wrong_major_is_refused():
    with pytest.raises(oar.PluginLoadError) as error:
        load(PythonPlugin(base_entries(), abi_major=2, abi_minor=1), "/opt/vendor/libnpu.so")
    assert "/opt/vendor/libnpu.so" in str(error.value)
    assert "speaks ABI 2.1, this Oar speaks 1." in str(error.value)
    assert error.value.path == "/opt/vendor/libnpu.so"


@pytest.mark.parametrize("minor", [0, 7])
def test_any_minor_is_accepted(minor):
    plugin = load(PythonPlugin(base_entries(), abi_minor=minor, device_type=f"minor{minor}"))
    assert plugin.abi_version == (1, minor)
    plugin.finalize()


def test_table_too_small():
    with pytest.raises(oar.PluginLoadError, match=r"struct too small: .* is 200 bytes, .* at least "
                                                  rf"{_C.MINIMUM_TABLE_SIZE} \(through kernel_launch"):
        load(PythonPlugin(base_entries(), table_size=200))


def test_entries_beyond_struct_size_are_not_provided():
    entries = base_entries()
    entries["launch"] = lambda *args: 0
    entries["module_load"] = lambda *args: 0
    plugin = load(PythonPlugin(entries, table_size=_C.MINIMUM_TABLE_SIZE, device_type="short"))
    assert not plugin.provides("launch") and not plugin.provides("module_load")
    assert "kernel_launch" in plugin.provided_entries()
    plugin.finalize()


def test_missing_required_entries_are_named():
    entries = base_entries()
    del entries["mem_set"], entries["event_query"]
    with pytest.raises(oar.PluginLoadError, match="missing required entry points: mem_set, event_query"):
        load(PythonPlugin(entries))


def test_no_table():
    with pytest.raises(oar.PluginLoadError, match="no function table"):
        load(PythonPlugin(base_entries(), provide_table=False))


@pytest.mark.parametrize("name", ["NPU", "9npu", "n-p-u", "a" * 33, ""])
def test_invalid_device_type(name):
    with pytest.raises(oar.PluginLoadError, match=r"invalid device_type .*\[a-z\]\[a-z0-9_\]\{0,31\}"):
        load(PythonPlugin(base_entries(), device_type=name))


def test_plugin_init_failure():
    with pytest.raises(oar.PluginLoadError, match="oar_plugin_init failed with OAR_ERROR_NOT_SUPPORTED"):
        load(PythonPlugin(base_entries(), init_status=C.OAR_ERROR_NOT_SUPPORTED))


def test_init_failure_carries_the_plugin_message():
    entries = base_entries()
    entries["init"] = lambda: C.OAR_ERROR_DEVICE_LOST
    with pytest.raises(oar.PluginLoadError,
                       match="init failed with OAR_ERROR_DEVICE_LOST: the device caught fire"):
        load(PythonPlugin(entries))


def test_partial_optional_group_is_dropped_with_a_warning():
    entries = base_entries()
    entries["module_compile"] = lambda *args: 0  # without module_binary_free / module_load
    plugin = load(PythonPlugin(entries, device_type="partial"))
    assert not plugin.provides("module_compile")
    assert any("module_compile" in warning for warning in plugin.warnings)
    plugin.finalize()


def test_not_a_library(tmp_path):
    path = tmp_path / "libbroken.so"
    path.write_text("this is not an ELF file")
    with pytest.raises(oar.PluginLoadError, match="cannot load the library") as error:
        _C.load_plugin(str(path))
    assert str(path) in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(oar.PluginLoadError, match="cannot load the library"):
        _C.load_plugin(str(tmp_path / "nothing.so"))


def test_library_without_the_entry_symbol():
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to dlopen")
    with pytest.raises(oar.PluginLoadError, match="does not export oar_plugin_init"):
        _C.load_plugin(libm)


def test_explicit_load_of_a_taken_device_type(tmp_path):
    from oar.vendor.plugins import refcpu_path

    loaded = oar.plugin_manager.loaded_plugins()
    refcpu = next((p for p in loaded.values() if p.path.endswith("liboar_refcpu.so")), None)
    if refcpu is None:
        pytest.skip("the CPU reference plugin is not loaded")
    assert oar.load_plugin(refcpu.path) is refcpu  # the same file: the plugin already loaded
    copy = tmp_path / "liboar_refcpu_copy.so"
    shutil.copy(refcpu_path(), copy)
    with pytest.raises(oar.PluginLoadError, match=f"device type '{refcpu.device_type}' is already provided"):
        oar.load_plugin(copy)


# ---- calls and life cycle -------------------------------------------------------

def test_optional_entry_not_provided_is_not_supported():
    plugin = load(PythonPlugin(base_entries(), device_type="bare"))
    with pytest.raises(oar.DeviceError) as error:
        plugin.memory_info(0)
    assert error.value.status_name == "OAR_ERROR_NOT_SUPPORTED"
    assert error.value.call == "device_memory_info"
    assert "does not provide the optional entry point device_memory_info" in str(error.value)
    plugin.finalize()


def test_failed_call_reports_plugin_call_status_message():
    entries = base_entries()
    entries["device_synchronize"] = lambda device: C.OAR_ERROR_DEVICE_LOST
    plugin = load(PythonPlugin(entries, device_type="lost"), "/vendor/liblost.so")
    with pytest.raises(oar.DeviceError) as error:
        plugin.device_synchronize(0)
    assert (error.value.plugin, error.value.plugin_path, error.value.call) == ("lost", "/vendor/liblost.so",
                                                                               "device_synchronize")
    assert (error.value.status, error.value.status_name) == (7, "OAR_ERROR_DEVICE_LOST")
    assert error.value.plugin_message == "the device caught fire"
    assert str(error.value) == ("lost plugin (/vendor/liblost.so): device_synchronize failed with "
                                "OAR_ERROR_DEVICE_LOST: the device caught fire")


def test_finalize_releases_handles_first_and_runs_once():
    calls: list[str] = []
    plugin = load(PythonPlugin(base_entries(calls), device_type="lifecycle"))
    stream = plugin.stream_create(0)
    event = plugin.event_create(0)
    plugin.mem_alloc(0, 128)
    calls.clear()
    plugin.finalize()
    assert calls.index("stream_destroy") < calls.index("finalize")
    assert calls.index("event_destroy") < calls.index("finalize")
    assert calls.index("mem_free") < calls.index("finalize")
    assert calls.count("finalize") == 1
    plugin.finalize()
    assert calls.count("finalize") == 1
    assert plugin.finalized and not stream.alive and not event.alive
    with pytest.raises(oar.OarError, match="finalized"):
        stream.synchronize()
    with pytest.raises(oar.OarError, match="finalized"):
        plugin.mem_alloc(0, 16)
    del stream, event  # their destructors must not call into the finalized plugin
    assert calls.count("stream_destroy") == 1


def test_adopted_plugin_serves_its_device_type_until_unloaded():
    calls: list[str] = []
    plugin = load(PythonPlugin(base_entries(calls, device_count=3), device_type="adopted"), initialize=False)
    oar.plugin_manager.adopt(plugin, "test")
    assert oar.device_count("adopted") == 3
    assert oar.mem_get_info("adopted:2").free is None  # no device_memory_info: free is unknown
    stream = oar.Stream("adopted:1")
    oar.plugin_manager.unload("adopted")
    assert "finalize" in calls and not stream._c.alive
    with pytest.raises(oar.InvalidDeviceError, match="no plugin provides device type 'adopted'"):
        oar.device_count("adopted")


def test_log_messages_reach_the_oar_plugin_logger(caplog):
    python_plugin = PythonPlugin(base_entries(), device_type="chatty")
    sinks = {}

    def plugin_init(params):
        status = python_plugin._init(params)
        log, log_user_data = params.log, params.log_user_data  # params lives only during this call
        sinks["log"] = lambda level, message: log(log_user_data, level, message)
        return status

    init = ffi.callback("oar_plugin_init_fn", plugin_init, error=C.OAR_ERROR_INTERNAL)
    plugin = _C.load_from_init(int(ffi.cast("uintptr_t", init)), "chatty-origin", owner=(python_plugin, init))
    caplog.set_level(logging.DEBUG, logger="oar.plugin")
    sinks["log"](C.OAR_LOG_WARNING, b"hello from the main thread")
    thread = threading.Thread(target=lambda: sinks["log"](C.OAR_LOG_ERROR, b"hello from another \xff thread"))
    thread.start()
    thread.join()
    sinks["log"](C.OAR_LOG_DEBUG, ffi.NULL)
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name == "oar.plugin"]
    assert ("oar.plugin", logging.WARNING, "chatty: hello from the main thread") in records
    assert ("oar.plugin", logging.ERROR, "chatty: hello from another \ufffd thread") in records
    assert ("oar.plugin", logging.DEBUG, "chatty: ") in records
    plugin.finalize()

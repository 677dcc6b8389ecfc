"""Settings and fixtures every test shares."""

import os

import pytest

# The CPU reference plugin hands out device pointers in a PROT_NONE range, so any
# host dereference of one faults. Set before any plugin is loaded (loading is lazy).
os.environ["OAR_REFCPU_STRICT"] = "1"
# The bundled OpenCL plugin stays out of discovery, so every test sees the same plugins whether
# or not OpenCL is installed; tests/test_opencl_*.py load it explicitly (and test discovery).
os.environ.setdefault("OAR_OPENCL_DISABLE", "1")
# Likewise the bundled CUDA plugin (tests/test_cuda_plugin.py loads it explicitly).
os.environ.setdefault("OAR_CUDA_DISABLE", "1")

# tests/torch_bridge/ runs in a process of its own, started by tests/test_torch_bridge.py.
collect_ignore = [] if os.environ.get("OAR_RUN_TORCH_BRIDGE_TESTS") else ["torch_bridge"]


@pytest.fixture(scope="module")
def dev() -> str:
    """The first device of the bundled CPU reference plugin, e.g. "refcpu:0"."""
    import oar

    for record in oar.plugin_manager.plugin_records():
        if record.status == "loaded" and record.path.endswith("liboar_refcpu.so"):
            return f"{record.device_type}:0"
    pytest.skip("the CPU reference plugin is not loaded")


@pytest.fixture
def private_kernel_cache(tmp_path, monkeypatch, dev):
    """A kernel cache of the test's own, and dev as the current device, for compiler tests."""
    import oar

    monkeypatch.setenv("OAR_CACHE_DIR", str(tmp_path / "kernels"))
    previous = oar.get_device()
    oar.set_device(dev)
    yield
    oar.set_device(previous)


@pytest.fixture
def run_with_refcpu_faults():
    """Runs a Python script in a child process where the CPU plugin (as "refcpu") has its fault op
    (OAR_REFCPU_FAULT_INJECTION); asserts it exits 0 and returns its stdout lines."""
    import subprocess
    import sys

    def run(code: str) -> list[str]:
        env = dict(os.environ, OAR_REFCPU_FAULT_INJECTION="1", OAR_REFCPU_DEVICE_TYPE="refcpu")
        env.pop("OAR_PLUGIN_PATH", None)
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    return run


@pytest.fixture
def refcpu_without_fallback(dev):
    """dev as the current device for the test, and a failure if any op fell back to the host."""
    import oar

    previous = oar.get_device()
    oar.set_device(dev)
    oar.reset_fallback_stats()
    yield
    oar.set_device(previous)
    assert not oar.fallback_stats(), f"host fallback ran: {oar.fallback_stats()}"

"""oar.profiler: host ranges and device times of a small MLP training step on the CPU reference
plugin (through its profiler entries, and through timing events), the table, the Chrome trace,
nesting and exceptions, `oar profile script.py`, and one run on the OpenCL plugin (PoCL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oar
from oar import nn, optim, plugin_manager
from oar.vendor.plugins import opencl_library


@pytest.fixture(autouse=True)
def _current(dev):
    oar.set_device(dev)


def train_step(device: str, steps: int = 1):
    """SGD steps of a 4 -> 8 -> 2 MLP with an MSE loss; returns the losses."""
    nn.init.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    rng = np.random.default_rng(0)
    x = oar.tensor(rng.standard_normal((16, 4)).astype(np.float32), device=device)
    y = oar.tensor(rng.standard_normal((16, 2)).astype(np.float32), device=device)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return losses


def check_trace(document: dict, prof: oar.profiler.profile) -> None:
    """Lanes named by metadata; every X event inside its lane; device work within or after its launch."""
    events = document["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    complete = [e for e in events if e["ph"] == "X"]
    assert complete, "the trace has no complete events"
    host_by_correlation = {}
    for event in complete:
        assert (event["pid"], event["tid"]) in named and event["pid"] in processes, event
        assert event["dur"] >= 0 and event["ts"] >= 0, event
        if event["cat"] == "op":
            host_by_correlation[event["args"]["correlation"]] = event
    device = [e for e in complete if e["cat"] != "op"]
    assert device, "the trace has no device events"
    for event in device:
        assert event["pid"] != os.getpid(), "device work in the host process"
        correlation = event["args"].get("correlation")
        if correlation is not None:
            host = host_by_correlation[correlation]
            assert event["name"] == host["name"]
            assert event["ts"] >= host["ts"], f"{event} starts before its launch {host}"
    assert len(host_by_correlation) == len(prof.launches)


@pytest.mark.parametrize("device_timing", ["plugin", "events"])
def test_mlp_training_step_table_and_trace(dev, tmp_path, device_timing):
    expected_losses = train_step(dev, steps=2)
    with oar.profiler.profile(device_timing=device_timing) as prof:
        losses = train_step(dev, steps=2)
    assert losses == expected_losses  # profiling changes nothing that runs
    assert prof.device_timing == {dev: device_timing}
    launches = prof.launches
    ops = {launch.op for launch in launches}
    # forward (matmul, add, relu, sub, pow, mean), backward (matmul of the grads, sum over the batch)
    # and the optimizer's momentum update (mul, add) all pass through the profiler.
    assert {"matmul", "add", "relu", "mul"} <= ops, ops
    for launch in launches:
        assert launch.end_ns >= launch.start_ns
        assert launch.device == dev
    kernels = [launch for launch in launches if launch.activities]
    assert len(kernels) >= 0.9 * len(launches), "most launches have a device time"
    for launch in kernels:
        for activity in launch.activities:
            assert activity.start_ns >= launch.start_ns, "a kernel started before its launch"
            assert activity.end_ns >= activity.start_ns
    matmul = next(launch for launch in launches if launch.op == "matmul")
    assert matmul.input_shapes == ((16, 4), (4, 8)) and matmul.input_dtypes == ("float32", "float32")

    averages = prof.key_averages()
    rows = {row.name: row for row in averages}
    assert rows["matmul"].count == sum(1 for launch in launches if launch.op == "matmul")
    assert rows["matmul"].device_ns > 0 and rows["matmul"].host_ns > 0
    assert sum(row.device_ns for row in averages) == averages.total_device_ns
    text = averages.table(sort_by="device_time", row_limit=10)
    body = text.splitlines()
    assert "Device total" in text and "matmul" in text and "add" in text
    ordered = averages.sorted("device_time")
    assert [row.device_ns for row in ordered] == sorted((row.device_ns for row in ordered), reverse=True)
    first_row = body[next(k for k, line in enumerate(body) if "───" in line) + 1]  # under the header rule
    assert first_row.split()[0] == ordered[0].name, text
    if device_timing == "plugin":
        assert any(row.name.startswith("[memcpy]") for row in averages), "the plugin's copies are reported"

    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    document = json.loads(path.read_text())
    check_trace(document, prof)
    assert not [p for p in os.listdir(tmp_path) if p != "trace.json"], "the temporary file was left behind"


def test_backward_and_optimizer_launches_are_recorded(dev):
    nn.init.manual_seed(0)
    layer = nn.Linear(4, 3)
    x = oar.ones([5, 4], device=dev)
    opt = optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    loss = layer(x).sum()
    with oar.profiler.profile() as backward:
        loss.backward()
    # the gradient of weight.T is x.T @ grad: [4, 5] @ [5, 3]; the bias's is a sum over the batch
    assert any(launch.op == "matmul" and launch.input_shapes == ((4, 5), (5, 3)) for launch in backward.launches)
    assert any(launch.op == "sum" and launch.output_shapes == ((1, 3),) for launch in backward.launches)
    with oar.profiler.profile() as step:
        opt.step()
    updated = {launch.output_shapes for launch in step.launches if launch.op in ("add", "mul")}
    assert ((3, 4),) in updated and ((3,),) in updated, step.launches


def test_table_rejects_a_bad_sort_and_groups_by_shape(dev):
    with oar.profiler.profile() as prof:
        a = oar.ones([2, 3], device=dev)
        b = oar.ones([4], device=dev)
        a + 1.0, b + 1.0, b + 2.0
    with pytest.raises(ValueError, match="sort_by must be one of"):
        prof.key_averages().table(sort_by="speed")
    by_shape = {(row.name, row.input_shapes): row.count for row in prof.key_averages(group_by_input_shape=True)}
    assert by_shape[("add", "[[2, 3], [2, 3]]")] == 1 and by_shape[("add", "[[4], [4]]")] == 2


def test_nested_profile_is_an_error_and_exceptions_stop_the_profiler(dev):
    with oar.profiler.profile() as outer:
        with pytest.raises(RuntimeError, match="do not nest"):
            with oar.profiler.profile():
                pass
        oar.ones([3], device=dev) * 2.0
    assert [launch.op for launch in outer.launches if launch.op == "mul"] == ["mul"]

    with pytest.raises(ZeroDivisionError):
        with oar.profiler.profile() as failed:
            oar.ones([3], device=dev) + 1.0
            1 / 0
    assert not oar.profiler.is_active() and oar.capture.current_observer() is None
    assert [launch.op for launch in failed.launches][-1] == "add"
    with oar.profiler.profile():  # a new one starts after the failed block
        pass
    with pytest.raises(RuntimeError, match="results come after"):
        with oar.profiler.profile() as running:
            running.key_averages()


def test_an_inactive_profiler_installs_nothing(dev):
    prof = oar.profiler.profile()
    assert oar.capture.current_observer() is None and not oar.profiler.is_active()
    with prof:
        assert oar.capture.current_observer() is not None
    assert oar.capture.current_observer() is None


def test_an_enclosing_observer_still_sees_every_launch(dev):
    seen = []

    class Counter(oar.capture.Observer):
        def launch(self, op, inputs, outputs, attrs, fresh_outputs):
            seen.append(op)
            return False

    with oar.capture.observe(Counter()):
        with oar.profiler.profile() as prof:
            y = oar.relu(oar.ones([4], device=dev) - 2.0)
    assert seen == [launch.op for launch in prof.launches] and "relu" in seen
    np.testing.assert_array_equal(y.numpy(), np.zeros(4, np.float32))


def test_the_cli_profiles_a_script(dev, tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import oar
        assert __name__ == "__main__" and sys.argv[1:] == ["--n", "3"], (__name__, sys.argv)
        x = oar.ones([8, 8], device="{dev}")
        for _ in range(int(sys.argv[2])):
            x = oar.matmul(x, x) * 0.125
        print("result", float(x.sum().numpy()))
    """))
    trace = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "oar.cli", "profile", "--trace", str(trace), "--sort", "count",
                           "--limit", "5", str(script), "--n", "3"],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "140"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result 64.0" in done.stdout
    assert "by count" in done.stdout and "matmul" in done.stdout, done.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X" and e["cat"] == "op" and e["name"] == "matmul") == 3

    failing = tmp_path / "fails.py"
    failing.write_text(f"import oar, sys\noar.ones([2], device='{dev}') + 1.0\nsys.exit(3)\n")
    done = subprocess.run([sys.executable, "-m", "oar.cli", "profile", str(failing)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 3 and "add" in done.stdout, done.stdout + done.stderr


def test_opencl_plugin_through_its_profiler_entries():
    path = opencl_library()
    if path is None:
        pytest.skip("the OpenCL plugin is not built: oar was built without OpenCL headers and an ICD loader")
    # In a process of its own: the OpenCL tests before this one unloaded the plugin from this one.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import oar
        from test_profiler import check_trace, train_step
        try:
            plugin = oar.load_plugin({path!r})
        except oar.PluginLoadError as error:
            print(error)
            sys.exit(77)
        device = f"{{plugin.device_type}}:0"
        oar.set_device(device)  # the model's parameters are made on the current device
        expected = train_step(device)
        with oar.profiler.profile(device_timing="plugin") as prof:
            assert train_step(device) == expected
        assert prof.device_timing == {{device: "plugin"}}
        assert {{row.name: row for row in prof.key_averages()}}["matmul"].device_ns > 0
        check_trace(prof.chrome_trace(), prof)
        oar.synchronize(device)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    if done.returncode == 77:
        pytest.skip(f"no OpenCL device: {done.stdout.strip()}")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_busy_plugin_profiler_falls_back_to_events(dev):
    plugin, device = oar.devices.resolve(dev)
    plugin.profiler_start(device.index)  # another tool holds the plugin's profiler
    try:
        with oar.profiler.profile() as prof:
            oar.ones([4], device=dev) + 1.0
        assert prof.device_timing == {dev: "events"}
        assert all(launch.activities for launch in prof.launches)
        with pytest.raises(RuntimeError, match="profiler_start"):
            with oar.profiler.profile(device_timing="plugin"):
                oar.ones([4], device=dev) + 1.0
        assert not oar.profiler.is_active()
    finally:
        plugin.profiler_stop(device.index)
        plugin.profiler_collect(device.index)

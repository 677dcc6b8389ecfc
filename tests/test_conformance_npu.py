"""`conformance run --device npu` with the CPU reference plugin posing as npu
(OAR_REFCPU_DEVICE_TYPE=npu): the runtime serves npu with the bundled plugin, every
level runs through it and passes."""

from __future__ import annotations

from conformance_helpers import run_json


def test_the_reference_plugin_posing_as_npu_passes_every_level(tmp_path):
    from oar.vendor.plugins import refcpu_path

    done, document = run_json(tmp_path, "--device", "npu", "--jobs", "2", env={"OAR_REFCPU_DEVICE_TYPE": "npu"},
                              timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    plugin = document["environment"]["plugin"]
    assert plugin["device_type"] == "npu" and plugin["path"] == refcpu_path()
    assert document["run"]["options"]["device"] == "npu"
    levels = {level["name"]: level for level in document["levels"]}
    assert levels["ops"]["counts"]["pass"] >= 1500 and levels["models"]["counts"]["pass"] == 6
    assert levels["abi"]["counts"]["pass"] >= 130
    bad = [(t["id"], t["status"]) for t in document["tests"] if t["status"] not in ("pass", "skip")
           and not (t["id"].startswith("torch.zoo.") and t["status"] == "fallback")]  # correct, some ops on the CPU
    assert not bad, bad[:20]
    assert not [t for t in document["tests"] if t["level"] in ("ops", "models") and t["status"] != "pass"]

"""The status the suite will give each test on a plugin, predicted from what the plugin provides.

A tool that generates or describes a plugin (``oar vendor new-backend``) writes its
expected-results file from this rather than re-encoding the suite's rules. The rules are the
suite's own: the worker's metadata check (an entry a test requires not provided, a capability
not claimed, too few devices: skip), the ``abi`` level's optional-entry tests (skip when the
entry, or for ``abi.optional.collectives`` the whole group, is absent) and sticky-error tests
(skip without a fault-injection op), the ``collectives`` level (skips every case unless the
whole group is provided) and the ``ops`` level (``ops.<op>.<dtype>.<case>``: pass when the
plugin has the op's kernel for the dtype, ``fallback`` otherwise; a ``grad`` case also runs the
op's backward formula, made of other ops, so it is predicted ``fallback`` unless the plugin is
described as having every kernel). Everything else is predicted to pass: the prediction says
what a plugin that does what the header says gets. A wrong guess between pass, fallback and
skip is a DIFFERENCE in a run against the expected-results file, never a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oar_conformance.registry import FALLBACK, PASS, REGISTRY, SKIP, TestCase

__all__ = ["PluginDescription", "predict_status", "expected_statuses"]


@dataclass
class PluginDescription:
    """What a plugin provides, as the conformance suite sees it.

    entries: the function-table entries it provides (names as in ``device_api.h``);
    capabilities: the ``OAR_CAP_*`` bits it claims, by the names tests list (``"timing_events"``);
    device_count: how many devices it reports; kernels: op -> the dtypes its kernel library
    serves for that op's tests (``all_kernels``: every op at every dtype, e.g. a complete plugin);
    fault_op: a fault-injection op it offers (None: none)."""

    entries: set[str]
    capabilities: set[str] = field(default_factory=set)
    device_count: int = 1
    kernels: dict[str, set[str]] = field(default_factory=dict)
    fault_op: str | None = None
    all_kernels: bool = False

    @classmethod
    def from_probe(cls, info: dict, **known) -> "PluginDescription":
        """The entries, capabilities and device count a probe found
        (``oar_conformance.probe.run_probe("describe", path)``, which opens the library in a child
        process); ``known`` sets the rest (kernels, fault_op, all_kernels), which only running the
        plugin's kernels would tell."""
        if info.get("error"):
            raise ValueError(f"PluginDescription.from_probe: the probe of {info.get('path')} failed: {info['error']}")
        return cls(entries=set(info["entries"]["provided"]), capabilities=set(info.get("capabilities", ())),
                   device_count=int(info.get("device_count", 0)), **known)

    def has_kernel(self, op: str, dtype: str) -> bool:
        return self.all_kernels or dtype in self.kernels.get(op, ())


def predict_status(test: TestCase | str, plugin: PluginDescription) -> str:
    """The status (``pass``, ``skip`` or ``fallback``) the suite gives ``test`` (a registered
    TestCase or its id; its level is loaded if need be) on a plugin described by ``plugin``."""
    if isinstance(test, str):
        test = _registered(test)
    if any(entry not in plugin.entries for entry in test.requires):
        return SKIP
    if any(capability not in plugin.capabilities for capability in test.capabilities):
        return SKIP
    if test.devices > plugin.device_count:
        return SKIP
    parts = test.id.split(".")
    if parts[0] == "abi":
        from oar_conformance.levels import abi

        if parts[1] == "optional":
            wanted = abi.COLLECTIVES if parts[2] == "collectives" else (parts[2],)
            return PASS if all(entry in plugin.entries for entry in wanted) else SKIP
        if parts[1] == "sticky" and not plugin.fault_op:
            return SKIP
        return PASS
    if parts[0] == "collectives":
        from oar_conformance.levels.collectives import COLLECTIVE_ENTRIES

        return PASS if all(entry in plugin.entries for entry in COLLECTIVE_ENTRIES) else SKIP
    if parts[0] == "ops":
        op, dtype, case = parts[1], parts[2], ".".join(parts[3:])
        if case.startswith("grad"):
            return PASS if plugin.all_kernels else FALLBACK
        return PASS if plugin.has_kernel(op, dtype) else FALLBACK
    return PASS


def expected_statuses(plugin: PluginDescription, *, quick: bool = False,
                      levels: list[str] | None = None) -> dict[str, str]:
    """{test id: predicted status} of every registered test of ``levels`` (default: all levels),
    or of the quick tier, on ``plugin``: an expected-results file's ``tests`` mapping."""
    from oar_conformance import levels as level_modules, tiers

    names = list(level_modules.LEVEL_NAMES) if levels is None else list(levels)
    return {test.id: predict_status(test, plugin) for test in tiers.select(names, quick=quick)}


def _registered(test_id: str) -> TestCase:
    from oar_conformance import levels

    level = test_id.split(".", 1)[0]
    if level not in levels.LEVEL_NAMES:
        raise KeyError(f"predict_status: {test_id!r} is not a test id of a conformance level "
                       f"({', '.join(levels.LEVEL_NAMES)})")
    levels.load(level)
    if test_id not in REGISTRY:
        raise KeyError(f"predict_status: no test {test_id!r} is registered in level {level!r}")
    return REGISTRY.get(test_id)

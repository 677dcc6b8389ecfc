"""Oar's conformance suite: is a device plugin ready?

``conformance run --device npu`` runs registered tests against the plugin that
serves a device type, each in a worker process so a crashing or hanging plugin
fails one test and the run goes on, and writes JUnit, JSON and HTML reports.
Levels (plug-in modules under :mod:`oar_conformance.levels`): ``abi`` (every
entry point of ``oar/device_api.h``, bad inputs included), ``ops``, ``models``
and ``collectives``. See ``schema.md`` for the results format.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Version of the results JSON (schema.md, results.schema.json) and of the expected-results YAML.
RESULTS_SCHEMA_VERSION = 1
EXPECTED_SCHEMA_VERSION = 1

# What the suite will report for a described plugin (oar new-backend's expected-results file).
from oar_conformance.predict import PluginDescription, expected_statuses, predict_status  # noqa: E402

__all__ = ["__version__", "RESULTS_SCHEMA_VERSION", "EXPECTED_SCHEMA_VERSION", "PluginDescription",
           "expected_statuses", "predict_status"]

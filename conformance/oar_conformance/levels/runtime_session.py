"""The ``runtime`` session: the plugin served through oar's runtime in the worker.

The worker puts the plugin's path first on ``OAR_PLUGIN_PATH`` before oar
discovers plugins, so the plugin under test serves its device type (a file
reached twice loads once), then checks that it does. Tests get a
:class:`RuntimeContext`: the device name (``"npu:0"``), the runtime's host
fallback counters, and a sync at the end that surfaces failed work.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from oar_conformance.registry import Failure, TestCase

__all__ = ["RuntimeSession", "RuntimeContext", "open_session"]


def open_session(config: dict) -> "RuntimeSession":
    return RuntimeSession(config)


class RuntimeSession:
    def __init__(self, config: dict):
        self.config = config
        path = os.path.abspath(config["plugin"])
        existing = os.environ.get("OAR_PLUGIN_PATH", "")
        os.environ["OAR_PLUGIN_PATH"] = os.pathsep.join(p for p in (path, existing) if p)
        warnings.simplefilter("ignore")  # FallbackWarning and PluginWarning: the results say it
        import oar
        from oar import plugin_manager

        self.oar = oar
        device_type = config["device_type"]
        try:
            plugin = plugin_manager.plugin_for(device_type)
        except oar.OarError as error:
            raise Failure(f"the runtime does not serve device type '{device_type}': {error}") from error
        if os.path.realpath(plugin.path) != os.path.realpath(path):
            raise Failure(f"the runtime serves '{device_type}' with {plugin.path}, not with {path}")
        self.plugin = plugin
        self.device = f"{device_type}:0"

    def context(self, test: TestCase) -> "RuntimeContext":
        return RuntimeContext(self, test)

    def close(self) -> None:
        pass


class RuntimeContext:
    def __init__(self, session: RuntimeSession, test: TestCase):
        self.session = session
        self.test = test
        self.oar = session.oar
        self.device = session.device
        self.config = session.config
        self.details: dict[str, Any] = {}

    def fallback_count(self, op: str) -> int:
        from oar import fallback

        return fallback.fallback_stats().get(op, 0)

    def close(self) -> None:
        try:
            self.oar.synchronize(self.device)
        except Exception:  # noqa: BLE001 -- a late failure was the test's; it has already been reported
            pass

"""Level ``models``: the model zoo trained for N deterministic steps against golden loss curves
(registers no tests yet)."""

from __future__ import annotations

from oar_conformance.levels.raw_session import open_session  # noqa: F401 -- replaced by the runtime session

DESCRIPTION = "models trained for a fixed number of deterministic steps, loss curves against golden curves"
SESSION_KIND = "raw"
NOTE = "no tests yet: waits for the runtime's models (sdk/oar/models)"

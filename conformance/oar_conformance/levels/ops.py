"""Level ``ops``: every op of interface/ops.yaml against the numpy references (registers no tests yet)."""

from __future__ import annotations

from oar_conformance.levels.raw_session import open_session  # noqa: F401 -- replaced by the runtime session

DESCRIPTION = "every op of interface/ops.yaml on the device against numpy references, per dtype"
SESSION_KIND = "raw"
NOTE = "no tests yet: waits for the runtime (oar.Tensor, op dispatch, sdk/oar/reference.py)"

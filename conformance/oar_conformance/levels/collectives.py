"""Level ``collectives``: registered, with no tests yet.

Its issue comes later: multi-rank communicators over worker processes,
bit-exact verifiable inputs and nccl-tests' algbw/busbw figures. The abi level
already checks the collective entry points' presence (all or none) and their
argument checks on one rank.
"""

from __future__ import annotations

from oar_conformance.levels.raw_session import open_session  # noqa: F401 -- the level's session, when tests land

DESCRIPTION = "collective communication across ranks (all_reduce, all_gather, ...)"
SESSION_KIND = "raw"
NOTE = "no tests yet: the collectives level is a later issue (multi-rank runs, nccl-tests formulas)"

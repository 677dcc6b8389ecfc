"""Tests registered by name.

A test is a function of one argument (the level's per-test context) that
returns normally to pass, raises :class:`Failure` (or ``AssertionError``) to
fail, :class:`Skip` / :class:`NotProvided` to skip and :class:`Fallback` to
report that the work ran through the host fallback. Any other exception is an
``error`` (a harness or test bug, or a plugin answering outside the ABI).

Ids are dotted lower-case names whose first part is the level:
``abi.memory.mem_free.double_free``. What a test needs beyond the required
core is metadata, checked by the worker before the test runs: ``requires``
(optional entry points; absent -> skipped as "not provided", never failed),
``capabilities`` (``OAR_CAP_*`` bits by name) and ``devices`` (how many).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

__all__ = [
    "STATUSES", "PASS", "FAIL", "SKIP", "FALLBACK", "ERROR", "Failure", "Skip", "NotProvided", "Fallback",
    "TestCase", "Registry", "REGISTRY", "conformance_test",
]

PASS, FAIL, SKIP, FALLBACK, ERROR = "pass", "fail", "skip", "fallback", "error"
STATUSES = (PASS, FAIL, SKIP, FALLBACK, ERROR)

_ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")


class Failure(AssertionError):
    """The plugin does not do what the ABI says."""


class Skip(Exception):
    """The test does not apply to this plugin (reason in the message)."""


class NotProvided(Skip):
    """An optional entry point (or group) the test needs is absent."""

    def __init__(self, entries: Iterable[str]):
        self.entries = tuple(entries)
        super().__init__("not provided: " + ", ".join(self.entries))


class Fallback(Exception):
    """The work ran, correctly, through the host fallback rather than the plugin."""


@dataclass(frozen=True)
class TestCase:
    id: str
    function: Callable = field(compare=False, repr=False)
    requires: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    devices: int = 1
    # runs as the first and only test of a fresh worker (the plugin not yet initialized)
    isolated: bool = False
    doc: str = ""

    @property
    def level(self) -> str:
        return self.id.split(".", 1)[0]

    def metadata(self) -> dict:
        return {"requires": list(self.requires), "capabilities": list(self.capabilities),
                "devices": self.devices, "isolated": self.isolated}


class Registry:
    def __init__(self) -> None:
        self._tests: dict[str, TestCase] = {}

    def add(self, test: TestCase) -> TestCase:
        if not _ID.match(test.id):
            raise ValueError(f"test id {test.id!r} is not a dotted lower-case name")
        if test.id in self._tests:
            raise ValueError(f"test id {test.id!r} registered twice")
        self._tests[test.id] = test
        return test

    def get(self, test_id: str) -> TestCase:
        return self._tests[test_id]

    def __contains__(self, test_id: str) -> bool:
        return test_id in self._tests

    def tests(self, level: str | None = None) -> list[TestCase]:
        """Registered tests, sorted by id (the order of every listing and report)."""
        return sorted((t for t in self._tests.values() if level is None or t.level == level), key=lambda t: t.id)


REGISTRY = Registry()


def conformance_test(test_id: str, *, requires: Iterable[str] = (), capabilities: Iterable[str] = (),
                     devices: int = 1, isolated: bool = False, registry: Registry = REGISTRY) -> Callable:
    """Register the decorated function as test ``test_id``."""

    def decorate(function: Callable) -> Callable:
        doc = " ".join((function.__doc__ or "").split())
        registry.add(TestCase(test_id, function, tuple(requires), tuple(capabilities), devices, isolated, doc))
        return function

    return decorate

"""Selecting tests: levels, the quick tier (a frozen list in quick.txt, or a level's own
``quick_ids``), a regular expression."""

from __future__ import annotations

import os
import re

from oar_conformance import levels
from oar_conformance.registry import REGISTRY, TestCase

__all__ = ["QUICK_FILE", "SIZES", "quick_ids", "select"]

QUICK_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quick.txt")


def quick_ids() -> list[str]:
    """The frozen basic subset: one test id a line, '#' comments."""
    with open(QUICK_FILE, encoding="utf-8") as file:
        return [line.split("#", 1)[0].strip() for line in file if line.split("#", 1)[0].strip()]


SIZES = ("quick", "full")  # --size: the model sizes of a level that has several (the torch zoo)


def select(level_names: list[str], *, quick: bool = False, pattern: str | None = None,
           size: str | None = "quick") -> list[TestCase]:
    """Registered tests of the levels, in level order then id order, at the model size ``size``
    (a level's ``sized_ids``; None: every size); ValueError for a bad pattern."""
    for name in level_names:
        levels.load(name)
    regex = None
    if pattern:
        try:
            regex = re.compile(pattern)
        except re.error as error:
            raise ValueError(f"--filter {pattern!r} is not a regular expression: {error}") from error
    frozen = set(quick_ids()) if quick else None
    selected = []
    for name in level_names:
        wanted = frozen
        level_ids = [test.id for test in REGISTRY.tests(name)]
        sized = getattr(levels.load(name), "sized_ids", None)
        if sized is not None and size is not None:  # a level with models at several sizes keeps those of --size
            level_ids = sized(level_ids, size)
        sample = getattr(levels.load(name), "quick_ids", None)
        if quick and sample is not None:  # a generated level samples its own quick tier
            wanted = set(sample(level_ids))
        kept = set(level_ids)
        for test in REGISTRY.tests(name):
            if test.id not in kept:
                continue
            if wanted is not None and test.id not in wanted:
                continue
            if regex is not None and not regex.search(test.id):
                continue
            selected.append(test)
    return selected

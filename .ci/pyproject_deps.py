"""Print, shell-quoted, what `make` installs into .venv: pyproject.toml's build requirements, its
dependencies and the optional groups named on the command line (with --only: those groups alone).
The pins live in pyproject.toml only; the Makefile asks this script for them."""

import shlex
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    document = tomllib.load(f)
groups = sys.argv[1:]
only = "--only" in groups
groups = [g for g in groups if g != "--only"]
requirements = [] if only else document["build-system"]["requires"] + document["project"]["dependencies"]
optional = document["project"].get("optional-dependencies", {})
for group in groups:
    if group not in optional:
        sys.exit(f"pyproject.toml has no optional dependency group {group!r} (it has: {', '.join(optional)})")
    requirements += optional[group]
print(" ".join(shlex.quote(r) for r in dict.fromkeys(requirements)))

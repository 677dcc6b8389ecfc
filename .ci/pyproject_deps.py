"""Print, shell-quoted, what `make` installs into .venv: pyproject.toml's build requirements, its
dependencies and the optional groups named on the command line. The pins live in pyproject.toml
only; the Makefile asks this script for them."""

import shlex
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    document = tomllib.load(f)
requirements = document["build-system"]["requires"] + document["project"]["dependencies"]
optional = document["project"].get("optional-dependencies", {})
for group in sys.argv[1:]:
    if group not in optional:
        sys.exit(f"pyproject.toml has no optional dependency group {group!r} (it has: {', '.join(optional)})")
    requirements += optional[group]
print(" ".join(shlex.quote(r) for r in dict.fromkeys(requirements)))

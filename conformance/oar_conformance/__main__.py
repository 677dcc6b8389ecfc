"""``python -m oar_conformance`` is the ``conformance`` command."""

from oar_conformance.cli import main

main()

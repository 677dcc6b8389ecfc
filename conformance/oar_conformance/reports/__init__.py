"""Reports of a run: JUnit XML (:mod:`.junit`), JSON (:mod:`oar_conformance.results`), HTML (:mod:`.html`),
and the console (:mod:`.console`). Every string that came from a plugin is escaped for its medium."""

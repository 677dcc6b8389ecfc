"""Loading a plugin in a child process first: ``oar info`` and the conformance suite probe each
plugin this way before loading it themselves, so a plugin that crashes, exits or hangs in
``oar_plugin_init`` or ``init`` is reported (and skipped) instead of taking the command down.

``python -m oar.plugin_probe PATH`` loads and initialises PATH and exits 0; a plugin that merely
fails to load (a PluginLoadError) also exits 0: loading it in-process reports that itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from oar.terminal import printable

__all__ = ["probe", "PROBE_TIMEOUT_S"]

PROBE_TIMEOUT_S = 30.0
_OK = "oar.plugin_probe: loaded"


def probe(path: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when loading ``path`` in a child process finished (loaded, or refused with an error
    the caller will see again); otherwise what went wrong: a crash, an exit or a hang."""
    env = dict(os.environ, OAR_PLUGIN_PATH="")  # the child loads this plugin only
    try:
        done = subprocess.run([sys.executable, "-m", "oar.plugin_probe", path], capture_output=True,
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return (f"loading it did not finish within {timeout:g} s in a probe process (a hang in oar_plugin_init "
                f"or init); not loaded")
    if done.returncode == 0 and _OK in done.stdout.decode("utf-8", "replace"):
        return None
    if done.returncode < 0:
        try:
            how = f"crashed with {signal.Signals(-done.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-done.returncode}"
    else:
        how = f"exited with status {done.returncode}"
    tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
    detail = f" ({printable(' | '.join(tail))})" if tail else ""
    return f"the plugin {how} while loading in a probe process (oar_plugin_init or init){detail}; not loaded"


def _main(path: str) -> int:
    from oar import _C
    from oar.errors import PluginLoadError

    try:
        plugin = _C.load_plugin(path, initialize=True)
        plugin.finalize()
    except PluginLoadError:
        pass  # an orderly refusal: the caller's own load reports it
    print(_OK, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))

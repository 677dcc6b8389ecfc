"""A worker process: runs tests by id against the plugin, one at a time.

Started by :mod:`oar_conformance.runner` as ``python -m oar_conformance.worker``
with its configuration (JSON) in ``OAR_CONFORMANCE_WORKER``. It reads commands
from stdin, one JSON object a line (``{"op": "run", "id": ...}`` or
``{"op": "quit"}``), and answers on what was its stdout, one JSON object a line
(``{"event": "ready"}``, ``{"event": "started", "id": ...}``,
``{"event": "result", "result": {...}}``). Everything else written to fd 1 or
2 (the plugin's own prints, faulthandler's traceback when the plugin crashes
the process) goes to the log file the runner gave as stderr, where a line
``=== test <id>`` marks the start of each test.

The plugin is loaded once per worker (by the level's session); an isolated
test runs in a fresh worker that exits after it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback
from typing import Any

CONFIG_ENV = "OAR_CONFORMANCE_WORKER"


def _classify(error: BaseException) -> tuple[str, str, dict]:
    from oar_conformance.registry import ERROR, FAIL, FALLBACK, SKIP, Fallback, NotProvided, Skip

    if isinstance(error, NotProvided):
        return SKIP, str(error), {"not_provided": list(error.entries)}
    if isinstance(error, Skip):
        return SKIP, str(error), {}
    if isinstance(error, Fallback):
        return FALLBACK, str(error), {}
    if isinstance(error, AssertionError):
        return FAIL, str(error) or "assertion failed", {}
    frames = traceback.format_exception(type(error), error, error.__traceback__)
    return ERROR, f"{type(error).__name__}: {error}", {"traceback": "".join(frames[-6:])[-4000:]}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def run_test(sessions: dict, config: dict, test_id: str) -> dict:
    from oar_conformance import levels
    from oar_conformance.registry import PASS, REGISTRY

    level_name = test_id.split(".", 1)[0]
    started = time.monotonic()
    status, message, details = PASS, "", {}
    context = None
    try:
        module = levels.load(level_name)
        test = REGISTRY.get(test_id)
        session = sessions.get(module.SESSION_KIND)
        if session is None:
            session = sessions[module.SESSION_KIND] = module.open_session(config)
        context = session.context(test)
        try:
            test.function(context)
        finally:
            try:
                context.close()
            except Exception:  # noqa: BLE001 -- a failing cleanup must not hide the test's own outcome
                pass
        late_failure = getattr(context, "late_failure", None)  # e.g. a host overrun seen once streams drained
        if late_failure:
            from oar_conformance.registry import Failure
            raise Failure(late_failure)
    except BaseException as error:  # noqa: BLE001 -- every outcome becomes a result
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        status, message, details = _classify(error)
    if context is not None:
        details = {**{k: _jsonable(v) for k, v in getattr(context, "details", {}).items()}, **details}
    return {"id": test_id, "status": status, "message": message,
            "duration_s": round(time.monotonic() - started, 6), "details": details}


def main() -> int:
    config = json.loads(os.environ.get(CONFIG_ENV, "{}"))
    if config.get("sanitize"):
        from oar_conformance.sanitizer import quiet_children
        quiet_children()
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # the plugin's prints go to the log, never into the protocol
    sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    faulthandler.enable(file=sys.stderr, all_threads=True)

    def send(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    from oar_conformance.registry import REGISTRY

    sessions: dict = {}
    send({"event": "ready", "pid": os.getpid()})
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        command = json.loads(line)
        if command.get("op") == "quit":
            break
        test_id = command["id"]
        print(f"=== test {test_id}", file=sys.stderr, flush=True)
        send({"event": "started", "id": test_id})
        result = run_test(sessions, config, test_id)
        sys.stderr.flush()
        send({"event": "result", "result": result})
        if test_id in REGISTRY and REGISTRY.get(test_id).isolated:
            break
    protocol.flush()
    if config.get("sanitize"):  # the runner reads this worker's leak report; os._exit skips LSan's own check
        from oar_conformance.sanitizer import leak_check
        leak_check()
    # No finalize, no interpreter teardown: the plugin's threads may still be parked in it.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

"""Runs tests in a pool of worker processes.

Each of ``jobs`` slots holds a worker (:mod:`oar_conformance.worker`) that
loads the plugin once and runs tests one at a time. A worker that dies by a
signal, exits, or runs past ``timeout`` seconds on a test fails that test
(with the signal's name, the exit status or "timeout", and the tail of its
log: the plugin's prints and faulthandler's traceback), is replaced, and the
run goes on. A worker whose test failed is replaced too, so a plugin left in
a bad state never taints the next test; an isolated test gets a fresh worker
of its own. If the first 3 tests of a kind of worker all time out before any
finishes (a plugin that hangs while loading), the rest of that kind fail as
"not run" at once rather than one timeout each. Results come back in the order
of the tests given, whatever order they finished in.
"""

from __future__ import annotations

import collections
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from typing import Iterable

import oar_conformance
from oar_conformance import levels, sanitizer
from oar_conformance.registry import ERROR, FAIL, TestCase
from oar_conformance.worker import CONFIG_ENV

__all__ = ["run_tests", "Observer", "LOG_TAIL_CHARS"]

LOG_TAIL_CHARS = 3000
QUIT_GRACE_S = 5.0
HANG_LIMIT = 3


class Observer:
    """What the runner tells the outside (the CLI's progress display)."""

    def started(self, test: TestCase) -> None:
        pass

    def finished(self, result: dict) -> None:
        pass

    def warning(self, message: str) -> None:
        pass


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Worker:
    serial = 0

    def __init__(self, kind: str, env: dict, log_dir: str, sanitizer_library: str | None = None):
        _Worker.serial += 1
        self.kind = kind
        self.log_path = os.path.join(log_dir, f"worker-{_Worker.serial}.log")
        self.sanitizer_prefix = None
        if sanitizer_library:  # each worker's reports in files of its own, never cut off or interleaved
            self.sanitizer_prefix = sanitizer.report_path(log_dir, _Worker.serial)
            env = sanitizer.environment(env, sanitizer_library, self.sanitizer_prefix)
        self.tests_run: list[str] = []
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "oar_conformance.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, env=env, start_new_session=True, close_fds=True)
        os.set_blocking(self.process.stdout.fileno(), False)
        self.buffer = b""
        self.test: TestCase | None = None
        self.assigned_at = 0.0
        self.test_started = False
        self.used = False
        self.last_test: str | None = None

    @property
    def busy(self) -> bool:
        return self.test is not None

    def assign(self, test: TestCase) -> bool:
        self.test, self.used, self.test_started = test, True, False
        self.tests_run.append(test.id)
        self.assigned_at = time.monotonic()
        try:
            self.process.stdin.write((json.dumps({"op": "run", "id": test.id}) + "\n").encode())
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False  # dead already: the EOF on its stdout reports it

    def read(self) -> tuple[list[dict], bool]:
        """Messages available now, and whether the worker's end is closed."""
        eof = False
        while True:
            try:
                chunk = os.read(self.process.stdout.fileno(), 65536)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            self.buffer += chunk
        messages = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            try:
                messages.append(json.loads(line))
            except ValueError:
                continue  # not ours; the protocol fd is private, so this is a plugin writing to a stray fd
        return messages, eof

    def quit(self) -> None:
        try:
            self.process.stdin.write(b'{"op": "quit"}\n')
            self.process.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the worker's own session: it and its children
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(QUIT_GRACE_S)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, test_id: str | None) -> str:
        try:
            with open(self.log_path, "rb") as log:
                text = log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        if test_id:
            marker = f"=== test {test_id}\n"
            position = text.rfind(marker)
            if position >= 0:
                text = text[position + len(marker):]
        return text[-LOG_TAIL_CHARS:]

    def sanitizer_report(self) -> str:
        return sanitizer.read_reports(self.sanitizer_prefix) if self.sanitizer_prefix else ""

    def close_pipes(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


def worker_environment(config: dict) -> dict:
    env = dict(os.environ)
    env[CONFIG_ENV] = json.dumps(config)
    # the reference plugin's fault-injection op backs the abi.sticky.* tests; other plugins ignore it
    env.setdefault("OAR_REFCPU_FAULT_INJECTION", "1")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(oar_conformance.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_tests(tests: Iterable[TestCase], config: dict, *, jobs: int = 1, timeout: float = 60.0,
              observer: Observer | None = None, log_dir: str | None = None) -> list[dict]:
    """Run tests in a pool of ``jobs`` workers; one result dict per test, in the order given."""
    tests = list(tests)
    observer = observer or Observer()
    jobs = max(1, int(jobs))
    env = worker_environment(config)
    sanitizer_library = sanitizer.runtime_library(config["sanitize"]) if config.get("sanitize") else None
    kinds = {name: levels.load(name).SESSION_KIND for name in {test.level for test in tests}}
    pending = collections.deque(tests)
    results: dict[str, dict] = {}
    slots: list[_Worker | None] = [None] * jobs
    retiring: list[_Worker] = []
    selector = selectors.DefaultSelector()
    own_log_dir = log_dir is None
    log_dir = log_dir or tempfile.mkdtemp(prefix="oar-conformance-")

    completed_kinds: set[str] = set()  # kinds with a test that ended by itself (not killed)
    timeouts: collections.Counter = collections.Counter()

    def record(test: TestCase, result: dict) -> None:
        result = {**result, "id": test.id, "level": test.level, "metadata": test.metadata()}
        results[test.id] = result
        observer.finished(result)

    def timed_out(test: TestCase) -> None:
        """A plugin that hangs while loading would cost --timeout per test: after HANG_LIMIT timeouts
        of a kind before any of its tests ended by itself, the rest of that kind is not run."""
        kind = kinds[test.level]
        if kind in completed_kinds:
            return
        timeouts[kind] += 1
        if timeouts[kind] < HANG_LIMIT:
            return
        message = (f"not run: the first {HANG_LIMIT} tests that loaded the plugin this way ({kind}) all timed "
                   "out and none finished; the plugin seems to hang while loading (see their logs)")
        for other in [t for t in pending if kinds[t.level] == kind]:
            pending.remove(other)
            observer.started(other)
            record(other, {"status": FAIL, "message": message, "duration_s": 0.0, "details": {"not_run": True}})
        observer.warning(message)

    def attribute_leaks(worker: _Worker) -> None:
        """The leak check a worker ran at its orderly exit: its plugin leaks fail the tests it ran."""
        if not worker.sanitizer_prefix or worker.process.returncode != 0:
            return
        leaks = sanitizer.plugin_leaks(worker.sanitizer_report(), config["plugin"])
        if not leaks:
            return
        total = sum(leak["bytes"] for leak in leaks)
        objects = sum(leak["objects"] for leak in leaks)
        frames = "\n".join("  " + frame for frame in leaks[0]["frames"][:sanitizer.HEAD_FRAMES])
        ran = [test_id for test_id in worker.tests_run if test_id in results]
        message = (f"leak: LeakSanitizer found {total} bytes in {objects} objects allocated by the plugin and never "
                   f"freed, at the exit of the worker that ran {len(ran)} test(s) ({', '.join(ran[:5])}"
                   f"{', ...' if len(ran) > 5 else ''}); the first allocation:\n{frames}")
        for test_id in ran:
            result = results[test_id]
            if result["status"] in (FAIL, ERROR):
                continue
            results[test_id] = {**result, "status": FAIL, "message": message,
                                "details": {**result.get("details", {}), "leaks": leaks[:20]}}
        observer.warning(message.split("\n", 1)[0])

    def drop(index: int, *, kill: bool) -> None:
        worker = slots[index]
        slots[index] = None
        if worker is None:
            return
        try:
            selector.unregister(worker.process.stdout)
        except (KeyError, ValueError):
            pass
        if kill:
            worker.kill()
            worker.close_pipes()
        else:
            worker.quit()
            retiring.append(worker)

    def died(index: int) -> None:
        worker = slots[index]
        try:
            code = worker.process.wait(QUIT_GRACE_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.process.returncode
        test = worker.test
        if test is not None:
            how = (f"died by {signal_name(-code)}" if code is not None and code < 0
                   else f"exited with status {code}")
            when = "during the test" if worker.test_started else "before the test started (loading the plugin)"
            details = {"worker_exit": code, "log_tail": worker.log_tail(test.id if worker.test_started else None)}
            if code is not None and code < 0:
                details["signal"] = signal_name(-code)
            message = f"crashed: the worker {how} {when}"
            head = sanitizer.report_head(worker.sanitizer_report())
            if head:
                message += "\n" + head
                details["sanitizer_report"] = worker.sanitizer_report()[-LOG_TAIL_CHARS:]
            record(test, {"status": FAIL, "message": message,
                          "duration_s": round(time.monotonic() - worker.assigned_at, 6), "details": details})
        else:
            observer.warning(f"a worker exited (status {code}) while idle, after test {worker.last_test}")
        drop(index, kill=True)

    try:
        while pending or any(w is not None and w.busy for w in slots):
            for index in range(jobs):
                if not pending:
                    break
                worker = slots[index]
                if worker is not None and worker.busy:
                    continue
                test = pending[0]
                kind = kinds[test.level]
                if worker is not None and (worker.kind != kind or (test.isolated and worker.used)):
                    drop(index, kill=False)
                    worker = None
                if worker is None:
                    worker = slots[index] = _Worker(kind, env, log_dir, sanitizer_library)
                    selector.register(worker.process.stdout, selectors.EVENT_READ, index)
                pending.popleft()
                observer.started(test)
                worker.assign(test)

            for worker in [w for w in retiring if w.process.poll() is not None]:
                retiring.remove(worker)
                worker.close_pipes()
                attribute_leaks(worker)
            now = time.monotonic()
            deadlines = [w.assigned_at + timeout - now for w in slots if w is not None and w.busy]
            wait = max(0.0, min(deadlines + [0.25]))
            for key, _ in selector.select(wait):
                index = key.data
                worker = slots[index]
                if worker is None:
                    continue
                messages, eof = worker.read()
                for message in messages:
                    event = message.get("event")
                    if event == "started" and worker.test is not None:
                        worker.test_started = True
                    elif event == "result" and worker.test is not None:
                        test = worker.test
                        worker.test, worker.last_test = None, test.id
                        result = message["result"]
                        if result.get("id") != test.id:
                            result = {"status": ERROR, "message": f"the worker answered for {result.get('id')!r}",
                                      "details": {}}
                        record(test, result)
                        completed_kinds.add(worker.kind)
                        if result["status"] in (FAIL, ERROR) or test.isolated:
                            drop(index, kill=False)
                            break
                if eof and slots[index] is worker:
                    died(index)

            now = time.monotonic()
            for index, worker in enumerate(slots):
                if worker is not None and worker.busy and now - worker.assigned_at > timeout:
                    test = worker.test
                    tail = worker.log_tail(test.id if worker.test_started else None)
                    drop(index, kill=True)
                    record(test, {"status": FAIL, "message": f"timeout: no result after {timeout:g} s; the worker "
                                                             "was killed", "duration_s": round(now - worker.assigned_at, 6),
                                  "details": {"timeout_s": timeout, "log_tail": tail}})
                    timed_out(test)
    finally:
        for index in range(jobs):
            drop(index, kill=False)
        deadline = time.monotonic() + QUIT_GRACE_S
        for worker in retiring:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
            worker.close_pipes()
            attribute_leaks(worker)
        selector.close()
        if own_log_dir:
            for name in os.listdir(log_dir):
                os.unlink(os.path.join(log_dir, name))
            os.rmdir(log_dir)
    return [results[test.id] for test in tests if test.id in results]

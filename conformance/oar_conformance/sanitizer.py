"""``conformance run --sanitize address``: the workers under AddressSanitizer and LeakSanitizer.

The Python interpreter is not instrumented, so the sanitizer runtime is
preloaded (``LD_PRELOAD`` of the compiler's ``libasan.so``): it intercepts
malloc, free and memcpy for everything in the worker, and checks every access
of a plugin built with ``-fsanitize=address``. Each worker writes its reports
to a file of its own (``log_path``), so a report is never cut off by the
worker's death or mixed with another's; the runner reads the head of it (the
ERROR line and the first frames) into the failing test's message. At a
worker's orderly exit it runs a leak check (``__lsan_do_recoverable_leak_check``)
and the runner attributes the leaks whose stacks pass through the plugin to
the tests that ran in that worker.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess

__all__ = ["SANITIZERS", "SanitizerError", "runtime_library", "environment", "quiet_children", "report_path",
           "read_reports", "report_head", "plugin_leaks", "leak_check"]

SANITIZERS = ("address",)
HEAD_FRAMES = 8
# Python's own allocations reached only through pointers LSan cannot see (or freed by the interpreter at exit)
# are not the plugin's: a leak counts only when a frame of its allocation stack is in the plugin library.
# Every frame ends with "(module+offset)" (%M): a plugin built with debug info is symbolized to its source
# files, and its library's name would otherwise appear in no frame.
_OPTIONS = ("detect_leaks=1", "halt_on_error=1", "abort_on_error=0", "exitcode=86", "allocator_may_return_null=1",
            "symbolize=1", "print_summary=1", 'stack_trace_format="    #%n %p %F %L %M"')


class SanitizerError(RuntimeError):
    """The sanitizer runtime cannot be found."""


def runtime_library(sanitizer: str = "address") -> str:
    """The path of the compiler's sanitizer runtime (``gcc -print-file-name=libasan.so``)."""
    if sanitizer not in SANITIZERS:
        raise SanitizerError(f"unknown sanitizer {sanitizer!r}; known: {', '.join(SANITIZERS)}")
    tried = []
    for compiler in (os.environ.get("CC"), "gcc", "cc", "clang"):
        if not compiler or not shutil.which(compiler):
            continue
        try:
            done = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        path = done.stdout.strip()
        tried.append(f"{compiler}: {path or done.stderr.strip()!r}")
        if done.returncode == 0 and os.path.isabs(path) and os.path.exists(path):
            return os.path.realpath(path)
    raise SanitizerError("no AddressSanitizer runtime found (asked " + ("; ".join(tried) or "no C compiler on PATH")
                         + "); install the compiler's libasan (e.g. the libasan package of your distribution)")


def _cxx_runtime() -> str | None:
    """libstdc++, preloaded with the sanitizer: ASan's __cxa_throw interceptor needs it loaded at start-up
    (python itself does not link it), or the first C++ exception of the runtime aborts the worker."""
    for compiler in (os.environ.get("CXX"), "g++", "gcc", "c++"):
        if not compiler or not shutil.which(compiler):
            continue
        try:
            done = subprocess.run([compiler, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        path = done.stdout.strip()
        if done.returncode == 0 and os.path.isabs(path) and os.path.exists(path):
            return os.path.realpath(path)
    return None


def environment(env: dict, library: str, log_prefix: str | None) -> dict:
    """env with the runtime preloaded and reports going to files named log_prefix.PID."""
    env = dict(env)
    env["LD_PRELOAD"] = " ".join(p for p in (library, _cxx_runtime(), env.get("LD_PRELOAD", "")) if p)
    options = list(_OPTIONS)
    if log_prefix:
        options.append(f"log_path={log_prefix}")
    symbolizer = shutil.which("llvm-symbolizer")
    if symbolizer:
        options.append(f"external_symbolizer_path={symbolizer}")
    existing = env.get("ASAN_OPTIONS", "")
    env["ASAN_OPTIONS"] = ":".join(o for o in (":".join(options), existing) if o)  # the user's options win
    env["PYTHONMALLOC"] = "malloc"  # Python's objects where LSan can see the pointers they hold
    return env


def quiet_children() -> None:
    """In a worker, whose sanitizer runtime has read its options already: the processes it starts (the
    compiler a plugin's module_compile runs, say) still get the preload but no leak check, whose
    exitcode would fail them and whose reports are not the plugin's."""
    os.environ["ASAN_OPTIONS"] = ":".join(o for o in (os.environ.get("ASAN_OPTIONS", ""), "detect_leaks=0") if o)


def report_path(log_dir: str, serial: int) -> str:
    return os.path.join(log_dir, f"asan-worker-{serial}")


def read_reports(prefix: str) -> str:
    """Everything the sanitizer wrote for the worker with that log prefix (one file per process)."""
    text = []
    for path in sorted(glob.glob(glob.escape(prefix) + ".*")):
        try:
            with open(path, "rb") as file:
                text.append(file.read().decode("utf-8", errors="replace"))
        except OSError:
            continue
    return "\n".join(text)


def report_head(text: str, frames: int = HEAD_FRAMES) -> str:
    """The ERROR line, the access line and the first frames of the first report in text; "" if none."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "ERROR: AddressSanitizer" in line
                  or "ERROR: LeakSanitizer" in line), None)
    if start is None:  # the runtime's own failures ("AddressSanitizer: CHECK failed") have no ERROR prefix
        start = next((i for i, line in enumerate(lines) if re.search(r"(Address|Leak)Sanitizer:", line)), None)
    if start is None:
        return ""
    head = [re.sub(r"^=+\d+=+", "", lines[start]).strip()]
    shown = 0
    for line in lines[start + 1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            head.append("  " + stripped)
            shown += 1
            if shown >= frames:
                break
        elif shown:  # the end of the first stack
            break
        elif stripped:
            head.append(stripped)
    return "\n".join(head)


_LEAK = re.compile(r"^(Direct|Indirect) leak of (\d+) byte\(s\) in (\d+) object\(s\) allocated from:")


def plugin_leaks(text: str, plugin_path: str) -> list[dict]:
    """The leak records of text whose allocation stack has a frame in the plugin (by its file name)."""
    name = os.path.basename(plugin_path)
    leaks, current = [], None
    for line in text.splitlines():
        match = _LEAK.match(line.strip())
        if match:
            current = {"kind": match.group(1).lower(), "bytes": int(match.group(2)), "objects": int(match.group(3)),
                       "frames": []}
            leaks.append(current)
        elif current is not None and line.strip().startswith("#"):
            current["frames"].append(line.strip())
        elif current is not None and not line.strip():
            current = None
    return [leak for leak in leaks if any(name in frame for frame in leak["frames"])]


def leak_check() -> bool:
    """Run LeakSanitizer now (in a worker about to exit); False when the runtime is not loaded."""
    try:
        check = ctypes.CDLL(None).__lsan_do_recoverable_leak_check
    except (AttributeError, OSError):
        return False
    check.restype = ctypes.c_int
    check()
    return True

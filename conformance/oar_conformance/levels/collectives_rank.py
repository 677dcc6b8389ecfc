"""One rank of the collectives level: a process that opens the plugin and runs cases on command.

Started by :mod:`oar_conformance.levels.collectives_ranks` as
``python -m oar_conformance.levels.collectives_rank --plugin P --rank R --nranks N --device D``.
JSON lines: commands on stdin, events on a private copy of stdout (fd 1 is
pointed at stderr, so the plugin's prints land in the worker's log).

- at start: opens and initializes the plugin; rank 0 also makes the
  communicator's unique id. Event ``ready`` (with ``unique_id`` as hex on
  rank 0) or ``fatal``.
- ``{"op": "join", "unique_id": HEX, "timeout_ms": T}``: comm_init_rank and a
  stream; event ``joined`` or ``join_failed`` (status name, plugin message,
  seconds it took).
- ``{"op": "case", "case": {...}}``: builds its inputs, runs the call,
  synchronizes the stream and checks its own output buffers; event
  ``case_done`` with ``problems`` (wrong data: what differed) and ``errors``
  (calls that failed: call, status, message) and ``seconds`` (the call and its
  stream_synchronize).
- ``{"op": "quit"}`` or the end of stdin: comm_destroy, exit.

The rank dies with its worker (PR_SET_PDEATHSIG on Linux) and every wait it
makes for a peer is the plugin's, bounded by the communicator's timeout.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time

import numpy as np

from oar.vendor import abi
from oar.vendor.abi import C, ffi
from oar_conformance.levels.collectives_data import DTYPES, KINDS, SENTINEL_BYTE, Case, compare, expected_output, \
    rank_input

REDUCE_OPS = {"sum": C.OAR_REDUCE_SUM, "prod": C.OAR_REDUCE_PROD, "max": C.OAR_REDUCE_MAX,
              "min": C.OAR_REDUCE_MIN, "avg": C.OAR_REDUCE_AVG}
_STATUS_NAMES = {int(getattr(C, name)): name for name in dir(C) if name.startswith(("OAR_ERROR_", "OAR_SUCCESS"))}


def status_name(status: int) -> str:
    return _STATUS_NAMES.get(int(status), f"status {int(status)}")


def die_with_parent() -> None:
    """The worker's death (killed for a timeout) takes its ranks with it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the end of stdin and the communicator's timeout still end the rank


class CallFailed(Exception):
    def __init__(self, call: str, status: int, message: str):
        super().__init__(f"{call}: {status_name(status)}: {message}")
        self.record = {"call": call, "status": status_name(status), "message": message}


class Rank:
    def __init__(self, plugin_path: str, rank: int, nranks: int, device: int):
        self.rank, self.nranks, self.device = rank, nranks, device
        self.plugin = abi.RawPlugin(plugin_path)
        if self.plugin.init_status != C.OAR_SUCCESS:
            raise RuntimeError(f"oar_plugin_init returned {status_name(self.plugin.init_status)}")
        self.ok(self.plugin.call("init"), "init")
        self.comm = None
        self.stream = None
        self.memory: list = []

    # ---- plumbing ------------------------------------------------------------

    def ok(self, status: int, call: str) -> None:
        if status != C.OAR_SUCCESS:
            raise CallFailed(call, status, self.plugin.last_error())

    def call(self, entry: str, *args, what: str | None = None) -> None:
        self.ok(self.plugin.call(entry, *args), what or entry)

    def dtype(self, name: str):
        value = ffi.new("oar_dl_data_type*")
        _, code, bits, _ = DTYPES[name]
        value.code, value.bits, value.lanes = getattr(C, code), bits, 1
        return value[0]

    def alloc(self, nbytes: int, fill: np.ndarray | None = None):
        """Device memory of nbytes (NULL for 0), holding fill's bytes or the sentinel."""
        if nbytes == 0:
            return ffi.NULL
        out = ffi.new("void**")
        self.call("mem_alloc", self.device, nbytes, out, what=f"mem_alloc({nbytes})")
        self.memory.append(out[0])
        if fill is None:
            self.call("mem_set", self.device, out[0], SENTINEL_BYTE, nbytes)
        else:
            data = np.ascontiguousarray(fill).view(np.uint8)
            self.call("memcpy_h2d", self.device, out[0], ffi.from_buffer(data), nbytes)
        return out[0]

    def download(self, pointer, count: int, dtype: str) -> np.ndarray:
        storage = DTYPES[dtype][0]
        out = np.empty(count, dtype=storage)
        if count:
            self.call("memcpy_d2h", self.device, ffi.from_buffer(out.view(np.uint8)), pointer, out.nbytes)
        return out

    def free_all(self) -> None:
        for pointer in self.memory:
            self.plugin.call("mem_free", self.device, pointer)
        self.memory.clear()

    # ---- commands --------------------------------------------------------------

    def make_unique_id(self) -> str:
        unique = ffi.new("oar_unique_id*")
        self.call("get_unique_id", unique)
        return bytes(ffi.buffer(unique)).hex()

    def join(self, unique_hex: str, timeout_ms: int) -> dict:
        unique = ffi.new("oar_unique_id*")
        ffi.buffer(unique)[:] = bytes.fromhex(unique_hex)
        comm = ffi.new("oar_comm*")
        started = time.monotonic()
        status = self.plugin.call("comm_init_rank", self.device, self.nranks, unique, self.rank, timeout_ms, comm)
        elapsed = round(time.monotonic() - started, 3)
        if status != C.OAR_SUCCESS:
            return {"event": "join_failed", "status": status_name(status), "message": self.plugin.last_error(),
                    "elapsed_s": elapsed}
        self.comm = comm[0]
        stream = ffi.new("oar_stream*")
        self.call("stream_create", self.device, C.OAR_STREAM_DEFAULT, 0, stream)
        self.stream = stream[0]
        return {"event": "joined", "elapsed_s": elapsed}

    def run_case(self, case: Case) -> dict:
        problems: list[str] = []
        errors: list[dict] = []
        seconds = 0.0
        try:
            seconds = self._run(case, problems)
        except CallFailed as failure:
            errors.append(failure.record)
        finally:
            if self.stream is not None:
                self.plugin.call("stream_synchronize", self.stream)  # nothing may still use the memory
            self.free_all()
        return {"event": "case_done", "problems": problems, "errors": errors, "seconds": round(seconds, 6)}

    def _run(self, case: Case, problems: list[str]) -> float:
        r, n, count = self.rank, self.nranks, case.count
        dt, kind = self.dtype(case.dtype), case.kind
        itemsize = DTYPES[case.dtype][0].itemsize
        mine = rank_input(case, r, n)
        want, tolerant = expected_output(case, r, n)
        root = case.root(n)
        op = REDUCE_OPS.get(case.op) if case.op else None
        send = recv = ffi.NULL
        out_count = 0
        check_send = None  # out of place: the send buffer must come back unchanged

        if kind in ("all_reduce", "broadcast", "reduce"):
            if case.in_place:
                send = recv = self.alloc(mine.nbytes, mine)
            else:
                if kind != "broadcast" or r == root:
                    send = self.alloc(mine.nbytes, mine)
                    check_send = send
                if kind != "reduce" or r == root:
                    recv = self.alloc(mine.nbytes)
            out_count = count if want is not None else 0
        elif kind == "all_gather":
            recv = self.alloc(n * mine.nbytes)
            if case.in_place:
                send = self._at(recv, r * mine.nbytes)
                if count:
                    self.call("memcpy_h2d", self.device, send, ffi.from_buffer(mine.view(np.uint8)), mine.nbytes)
            else:
                send = check_send = self.alloc(mine.nbytes, mine)
            out_count = n * count
        elif kind == "reduce_scatter":
            send = self.alloc(mine.nbytes, mine)
            recv = self._at(send, r * count * itemsize) if case.in_place else self.alloc(count * itemsize)
            check_send = None if case.in_place else send
            out_count = count
        elif kind in ("all_to_all", "group_send_recv"):
            send = check_send = self.alloc(mine.nbytes, mine)
            recv = self.alloc(mine.nbytes)
            out_count = n * count
        elif kind == "send_recv":
            send = check_send = self.alloc(mine.nbytes, mine)
            recv = self.alloc(mine.nbytes)
            out_count = count
        else:
            raise ValueError(f"unknown collective kind {kind!r}")

        comm, stream = self.comm, self.stream
        started = time.perf_counter()
        if kind == "all_reduce":
            self.call("all_reduce", send, recv, count, dt, op, comm, stream)
        elif kind == "broadcast":
            self.call("broadcast", send, recv, count, dt, root, comm, stream)
        elif kind == "reduce":
            self.call("reduce", send, recv, count, dt, op, root, comm, stream)
        elif kind == "all_gather":
            self.call("all_gather", send, recv, count, dt, comm, stream)
        elif kind == "reduce_scatter":
            self.call("reduce_scatter", send, recv, count, dt, op, comm, stream)
        elif kind == "all_to_all":
            self.call("all_to_all", send, recv, count, dt, comm, stream)
        elif kind == "send_recv":
            # a ring without a group: rank 0 sends first, every other rank receives first
            after, before = (r + 1) % n, (r - 1) % n
            if r == 0:
                self.call("send", send, count, dt, after, comm, stream, what=f"send(to rank {after})")
                self.call("recv", recv, count, dt, before, comm, stream, what=f"recv(from rank {before})")
            else:
                self.call("recv", recv, count, dt, before, comm, stream, what=f"recv(from rank {before})")
                self.call("send", send, count, dt, after, comm, stream, what=f"send(to rank {after})")
        else:  # group_send_recv: block p to rank p, from rank p into block p, all pairs in one group
            self.call("group_start")
            try:
                for peer in range(n):
                    if peer != r:
                        block = peer * count * itemsize
                        self.call("send", self._at(send, block), count, dt, peer, comm, stream,
                                  what=f"send(to rank {peer}) in a group")
                        self.call("recv", self._at(recv, block), count, dt, peer, comm, stream,
                                  what=f"recv(from rank {peer}) in a group")
            finally:
                status = self.plugin.call("group_end")
            self.ok(status, "group_end")
        self.call("stream_synchronize", stream, what=f"stream_synchronize after {kind}")
        seconds = time.perf_counter() - started

        if want is not None:
            got = self.download(recv, out_count, case.dtype)
            problem = compare(got, want, case.dtype, ulps=2 if tolerant else 0)
            if problem:
                problems.append(f"rank {r}: output: {problem}")
        if check_send is not None and check_send != ffi.NULL:
            back = self.download(check_send, mine.size, case.dtype)
            problem = compare(back, mine, case.dtype)
            if problem:
                problems.append(f"rank {r}: the send buffer changed (out of place): {problem}")
        return seconds

    @staticmethod
    def _at(pointer, offset: int):
        return ffi.cast("char*", pointer) + offset if pointer != ffi.NULL else ffi.NULL

    def quit(self) -> None:
        if self.stream is not None:
            self.plugin.call("stream_synchronize", self.stream)
        if self.comm is not None:
            self.plugin.call("comm_destroy", self.comm)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plugin", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--nranks", type=int, required=True)
    parser.add_argument("--device", type=int, required=True)
    args = parser.parse_args()

    die_with_parent()
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)

    def send(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    try:
        rank = Rank(args.plugin, args.rank, args.nranks, args.device)
        unique = rank.make_unique_id() if args.rank == 0 else None
    except Exception as error:  # noqa: BLE001 -- reported to the harness, which fails the case with it
        send({"event": "fatal", "message": f"{type(error).__name__}: {error}"})
        os._exit(1)
    send({"event": "ready", "pid": os.getpid(), "unique_id": unique})
    for line in sys.stdin:
        command = json.loads(line)
        op = command.get("op")
        if op == "quit":
            break
        try:
            if op == "join":
                send(rank.join(command["unique_id"], int(command["timeout_ms"])))
            elif op == "case":
                send(rank.run_case(Case.from_json(command["case"])))
            else:
                send({"event": "fatal", "message": f"unknown command {op!r}"})
        except Exception as error:  # noqa: BLE001 -- a harness bug: say so rather than hang the harness
            send({"event": "fatal", "message": f"{type(error).__name__}: {error}"})
    rank.quit()
    protocol.flush()
    os._exit(0)  # no finalize, no interpreter teardown: the plugin's threads may still be parked in it


if __name__ == "__main__":
    sys.exit(main())

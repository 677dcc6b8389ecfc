"""Launching the ranks of a communicator for the collectives level, and talking to them with deadlines.

A :class:`RankGroup` is N processes of :mod:`oar_conformance.levels.collectives_rank`,
children of the conformance worker, one per rank: rank r runs on device r when
the plugin has at least N devices, else every rank runs on device 0.

Rendezvous goes through pipes, not the network: rank 0 makes the unique id and
reports its bytes to the worker, which hands them to every rank with the
``join`` command. (The runtime's ``oar.distributed`` ships the same bytes
through torch.distributed's TCPStore; here the harness owns every rank, so a
pipe is simpler and needs no port.)

Every wait is bounded: :meth:`RankGroup.collect` gives up at its deadline and
names the ranks that did not answer, or the rank that exited and how. The
ranks share the worker's process group, so the runner's kill of a timed-out
worker takes them too; :meth:`RankGroup.kill` is called on every other path.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

__all__ = ["RankGroup", "RankTrouble", "device_of"]

START_TIMEOUT_S = 60.0  # a rank's Python, numpy and the plugin's init (slow on a busy 2-core machine)
QUIT_GRACE_S = 5.0


class RankTrouble(Exception):
    """A rank did not answer in time, exited, or said something unexpected (the message says which)."""


def device_of(rank: int, nranks: int, device_count: int) -> int:
    return rank if device_count >= nranks else 0


class _Rank:
    def __init__(self, rank: int, command: list[str], env: dict):
        self.rank = rank
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                        close_fds=True)  # stderr: the worker's log
        os.set_blocking(self.process.stdout.fileno(), False)
        self.buffer = b""
        self.messages: list[dict] = []
        self.closed = False

    def send(self, message: dict) -> bool:
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def pump(self) -> None:
        while not self.closed:
            try:
                chunk = os.read(self.process.stdout.fileno(), 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            try:
                self.messages.append(json.loads(line))
            except ValueError:
                continue  # a stray write to the protocol fd; not ours

    def how_it_ended(self) -> str:
        try:
            code = self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            return "closed its output but is still running"
        if code < 0:
            try:
                return f"died by {signal.Signals(-code).name}"
            except ValueError:
                return f"died by signal {-code}"
        return f"exited with status {code}"


class RankGroup:
    """Processes for ranks ``ranks`` (default all) of a communicator of ``nranks`` ranks."""

    def __init__(self, plugin: str, nranks: int, device_count: int, ranks: list[int] | None = None):
        self.nranks = nranks
        self.ranks: dict[int, _Rank] = {}
        self.unique_id: str | None = None
        env = dict(os.environ)
        try:
            for rank in (range(nranks) if ranks is None else ranks):
                command = [sys.executable, "-m", "oar_conformance.levels.collectives_rank", "--plugin", plugin,
                           "--rank", str(rank), "--nranks", str(nranks),
                           "--device", str(device_of(rank, nranks, device_count))]
                self.ranks[rank] = _Rank(rank, command, env)
        except BaseException:
            self.kill()
            raise

    # ---- talking -------------------------------------------------------------

    def send(self, message: dict, ranks=None) -> None:
        for rank in (self.ranks if ranks is None else ranks):
            if not self.ranks[rank].send(message):
                raise RankTrouble(f"rank {rank} {self.ranks[rank].how_it_ended()} (its stdin is closed)")

    def collect(self, events: tuple[str, ...], timeout_s: float, what: str, ranks=None) -> dict[int, dict]:
        """The next message of each rank, one of events; RankTrouble at the deadline (naming the ranks still
        silent), when a rank exits, or for a ``fatal`` message."""
        wanted = list(self.ranks if ranks is None else ranks)
        answers: dict[int, dict] = {}
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            for rank in wanted:
                if not self.ranks[rank].closed:
                    selector.register(self.ranks[rank].process.stdout, selectors.EVENT_READ, rank)
            while True:
                for rank in wanted:
                    member = self.ranks[rank]
                    if rank in answers:
                        continue
                    member.pump()
                    if member.messages:
                        message = member.messages.pop(0)
                        if message.get("event") == "fatal":
                            raise RankTrouble(f"rank {rank} failed during {what}: {message.get('message')}")
                        if message.get("event") not in events:
                            raise RankTrouble(f"rank {rank} answered {message.get('event')!r} during {what}, "
                                              f"expected {' or '.join(events)}")
                        answers[rank] = message
                    elif member.closed:
                        raise RankTrouble(f"rank {rank} {member.how_it_ended()} during {what}")
                if len(answers) == len(wanted):
                    return answers
                left = deadline - time.monotonic()
                if left <= 0:
                    silent = [r for r in wanted if r not in answers]
                    raise RankTrouble(f"timed out: rank{'s' if len(silent) > 1 else ''} "
                                      f"{', '.join(map(str, silent))} gave no answer to {what} within {timeout_s:g} s")
                selector.select(min(left, 0.5))

    # ---- life cycle ------------------------------------------------------------

    def start(self, join_timeout_ms: int) -> dict[int, dict]:
        """Wait for every launched rank to load the plugin, hand rank 0's unique id to all, and join;
        returns each rank's join answer (``joined`` or ``join_failed``)."""
        ready = self.collect(("ready",), START_TIMEOUT_S, "start-up (loading the plugin)")
        if 0 not in ready or not ready[0].get("unique_id"):
            raise RankTrouble("rank 0 reported no unique id")
        self.unique_id = ready[0]["unique_id"]
        self.send({"op": "join", "unique_id": self.unique_id, "timeout_ms": int(join_timeout_ms)})
        return self.collect(("joined", "join_failed"), join_timeout_ms / 1000.0 + 30.0, "comm_init_rank")

    def kill_rank(self, rank: int) -> None:
        member = self.ranks[rank]
        try:
            member.process.kill()
            member.process.wait(QUIT_GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass

    def close(self) -> None:
        """Ask every rank to quit (comm_destroy), then kill those still running after a grace period."""
        for member in self.ranks.values():
            member.send({"op": "quit"})
        deadline = time.monotonic() + QUIT_GRACE_S
        for member in self.ranks.values():
            try:
                member.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        for member in self.ranks.values():
            if member.process.poll() is None:
                try:
                    member.process.kill()
                except ProcessLookupError:
                    pass
        for member in self.ranks.values():
            try:
                member.process.wait(QUIT_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            for stream in (member.process.stdin, member.process.stdout):
                try:
                    stream.close()
                except OSError:
                    pass

"""Replaying a traced call: the launch observer that matches each launch of a new call against
the traces of its signature, takes it, and runs each unit of the compiled plan as soon as all
its launches were seen (so the device works while Python goes on)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from oar import capture

from oar_codegen import executor
from oar_codegen.trace import HOST_READ, Recorder, Trace, host_read_signature, referenced_elsewhere, signature_of

__all__ = ["Entry", "Replay"]


@dataclass
class Entry:
    """A trace of a signature, and its plan made runnable (None: why in reason)."""
    trace: Trace
    executable: executor.Executable | None
    reason: str = ""            # why there is no executable
    misses: int = 0             # replays in a row that another trace of the signature took
    launch_plan: object = None  # a plan_replay.LaunchPlan, once a replay validated the trace


def recorder_of(seen: list) -> Recorder:
    """A Recorder holding the launches (and host reads) a diverged call has made so far: it traces the rest."""
    recorder = Recorder()
    for op, ins, outs, attrs, fresh in seen:
        if op == HOST_READ:
            recorder.before_host_read(ins[0])
        else:
            recorder.add(op, ins, outs, attrs, fresh)
    return recorder


class Replay(capture.Observer):
    """The launch observer of a replaying call: matches launches against candidate traces, takes
    them, and runs each unit of the plan as soon as the launches it covers have all been seen (so
    the device works while Python goes on), once one candidate is left."""

    def __init__(self, entries: list[Entry]):
        self.alive = [(entry, {}, {}) for entry in entries]
        self.seen: list[tuple] = []
        self.recorder: Recorder | None = None
        self.units_run = 0
        self.covered: set[int] = set()   # launches (positions in seen) whose unit has run
        self.replayed: Entry | None = None

    def _bind(self, binding: dict, reverse: dict, launch, tensors) -> bool:
        for ref, t in zip(launch.inputs + launch.outputs, tensors):
            ptr = capture.storage_address(t)
            have = binding.get(ref.slot)
            if have is not None:
                if have != ptr:
                    return False
                continue
            if not ref.wrapped:
                if ptr in reverse:
                    return False
                reverse[ptr] = ref.slot
            binding[ref.slot] = ptr
        return True

    def _match(self, signature: tuple, tensors: tuple) -> bool:
        position = len(self.seen) - 1
        survivors = []
        for entry, binding, reverse in self.alive:
            launches = entry.trace.launches
            if position < len(launches) and launches[position].signature == signature and \
                    self._bind(binding, reverse, launches[position], tensors):
                survivors.append((entry, binding, reverse))
        self.alive = survivors
        return bool(survivors)

    def _run_ready(self) -> None:
        """Run the units whose launches have all been seen (only once a single candidate is left)."""
        if len(self.alive) != 1 or self.alive[0][0].executable is None:
            return
        entry, binding, _ = self.alive[0]
        executable = entry.executable
        seen = len(self.seen)
        while self.units_run < len(executable.unit_last) and executable.unit_last[self.units_run] < seen:
            executable.run_units(self.units_run, self.units_run + 1, binding, self.seen)
            self.covered.update(executable.unit_launches[self.units_run])
            self.units_run += 1

    def _run_uncovered(self, upto: int) -> None:
        executor.run_eagerly([entry for i, entry in enumerate(self.seen[:upto]) if i not in self.covered])

    def _diverge(self, current_runs_itself: bool = True) -> None:
        """Stop replaying: run what was taken and not yet run, one launch at a time as it was made,
        and trace the rest of the call (current_runs_itself: the launch being observed is let
        through, not run here)."""
        self._run_uncovered(len(self.seen) - 1 if current_runs_itself else len(self.seen))
        self.recorder = recorder_of(self.seen)

    def launch(self, op: str, inputs, outputs, attrs: dict, fresh: bool) -> bool:
        if self.recorder is not None:
            return self.recorder.launch(op, inputs, outputs, attrs, fresh)
        self.seen.append((op, inputs, outputs, attrs, fresh))
        if self._match(signature_of(op, inputs, outputs, attrs, fresh), inputs + outputs):
            self._run_ready()
            return True
        self._diverge()
        return False

    def before_host_read(self, tensor) -> None:
        if self.recorder is not None:
            self.recorder.before_host_read(tensor)
            return
        self.seen.append((HOST_READ, (tensor,), (), {}, True))
        if not self._match(host_read_signature(tensor), (tensor,)) or self.alive[0][0].executable is None:
            self._diverge(current_runs_itself=False)
            return
        self.alive = self.alive[:1]   # the units before this barrier run now: commit to one plan
        self._run_ready()

    def abandon(self) -> None:
        """The function raised: run what was taken so the state is what eager execution leaves."""
        if self.recorder is None:
            self._run_uncovered(len(self.seen))

    def observable_now(self) -> set[int]:
        """Fresh slots (of the matched trace) that the caller still references."""
        entry, binding, _ = self.alive[0]
        fresh = {ptr: slot for slot, ptr in binding.items() if entry.trace.slot_kinds[slot] == "fresh"}
        return referenced_elsewhere((t for _, ins, outs, _, _ in self.seen for t in ins + outs), fresh)

    def finish(self) -> str | Trace:
        """Run the rest of the plan, or say why not: returns "replayed", or a new trace."""
        if self.recorder is not None:
            return self.recorder.finish()
        self.alive = [c for c in self.alive if len(c[0].trace.launches) == len(self.seen)][:1]
        if self.alive and self.alive[0][0].executable is not None:
            entry, binding, _ = self.alive[0]
            unwritten = self.observable_now() - entry.executable.stored_slots()
            if unwritten and self.units_run:
                # Units ran before the call returned: values this call keeps (the trace did not)
                # were never written. Say so; the next call traces again.
                warnings.warn(f"oar.compile: this call kept {len(unwritten)} tensor(s) made inside the compiled "
                              "function that the traced call did not keep; their values were fused away and are "
                              "unspecified. Return them (or keep them on every call) so they are written.",
                              RuntimeWarning, stacklevel=3)
                entry.executable = None
            if not unwritten or self.units_run:
                self._run_ready()
                self.replayed = entry
                self.seen = []
                return "replayed"
        self._diverge(current_runs_itself=False)
        return self.recorder.finish()

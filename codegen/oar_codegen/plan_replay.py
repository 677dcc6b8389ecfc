"""Replaying a validated trace from its launch plan: the per-step fast path of ``oar.compile``.

Once a trace has replayed through the matching observer (:mod:`oar_codegen.replay`), its later
calls run under :class:`PlanReplay`. The function's Python still runs (an optimizer's step count,
Python floats computed in it and the autograd graph stay live; a plan that skipped them would
bake in stale values), but each launch it makes is only compared with what the plan recorded at
that position: op, attrs, each operand's shape/strides/offset/dtype and its storage, against
values computed once from the trace (no signature is built, no candidates are matched). The
units of the plan run at positions known in advance, the fused kernels through the plugin's
launch directly; a launch the plan leaves to the plugin is let through (it runs as made, at its
place in the plan's order), only its storages checked. A launch that differs is a guard miss:
the call falls back to the matching observer's path (the taken launches run as they were made,
the rest of the call is traced and planned again) and the miss is counted with its reason.
"""

from __future__ import annotations

import warnings

from oar import capture, profiler

from oar_codegen import executor
from oar_codegen.fusion import EagerUnit
from oar_codegen.replay import Entry, recorder_of
from oar_codegen.trace import HOST_READ, Recorder, operand_key

__all__ = ["LaunchPlan", "PlanReplay"]


class LaunchPlan:
    """What a validated trace's replay checks and does at each launch position, computed once."""

    def __init__(self, entry: Entry):
        trace, executable = entry.trace, entry.executable
        self.entry = entry
        self.executable = executable
        self.ops = [launch.op for launch in trace.launches]
        self.attrs = [launch.attrs for launch in trace.launches]
        self.fresh = [launch.fresh for launch in trace.launches]
        # Positions the plan leaves to the plugin's kernel: let through (the runtime runs them as
        # made, so their shapes need no check); their storages are still bound, which catches a
        # call whose data flow between units differs from the trace's.
        self.let_through = [False] * len(trace.launches)
        for unit in executable.plan.units:
            if isinstance(unit, EagerUnit):
                self.let_through[unit.launch] = True
        # The operand keys checked: a fused launch's inputs, and outputs it writes into an existing
        # tensor (fresh outputs follow from the inputs and attrs); None: not checked.
        self.keys = [tuple(None if through or (k >= len(launch.inputs) and launch.fresh) else _ref_key(ref)
                           for k, ref in enumerate(launch.inputs + launch.outputs))
                     for launch, through in zip(trace.launches, self.let_through)]
        self.slots = [tuple(ref.slot for ref in launch.inputs + launch.outputs) for launch in trace.launches]
        self.wrapped = [tuple(ref.wrapped for ref in launch.inputs + launch.outputs) for launch in trace.launches]
        self.slot_count = len(trace.slot_kinds)
        # After position p was seen, units [.., units_after[p]) have all their launches seen: they run.
        self.units_after = []
        done = 0
        for seen in range(1, len(trace.launches) + 1):
            while done < len(executable.unit_last) and executable.unit_last[done] < seen:
                done += 1
            self.units_after.append(done)
        # Fresh values the plan fuses away: a call that keeps one must be told (as the matching path does).
        stored = executable.stored_slots()
        self.unstored_fresh = {slot for slot, kind in enumerate(trace.slot_kinds)
                               if kind == "fresh" and slot not in stored}
        self.holds: dict[int, int] = {}            # slot -> operand occurrences in the call
        self.first_use: dict[int, tuple[int, int]] = {}   # slot -> (position, operand index)
        for position, slots in enumerate(self.slots):
            for index, slot in enumerate(slots):
                if slot in self.unstored_fresh:
                    self.holds[slot] = self.holds.get(slot, 0) + 1
                    self.first_use.setdefault(slot, (position, index))


def _ref_key(ref) -> tuple:
    """operand_key of the tensor a traced operand was."""
    return (ref.shape, ref.strides, ref.offset, ref.dtype, ref.wrapped)


class PlanReplay(capture.Observer):
    """The launch observer of a call replayed from a :class:`LaunchPlan`: checks each launch against
    the plan's position, takes it, runs the units that became ready. On a miss: ``miss`` says why,
    and the call goes on as the matching observer's diverged call does (the rest is traced)."""

    def __init__(self, plan: LaunchPlan):
        self.plan = plan
        self.position = 0
        self.binding: list[int | None] = [None] * plan.slot_count
        self.reverse: dict[int, int] = {}     # storage address -> slot, for storages that are not numbers
        self.seen: list[tuple] = []
        self.units_run = 0
        self.stream = None
        self.recorder: Recorder | None = None
        self.miss = ""

    def _check(self, op: str, tensors: tuple, attrs: dict, fresh: bool) -> str:
        """Why the launch at this position differs from the plan's ("" when it matches); binds storages."""
        plan, p = self.plan, self.position
        if p >= len(plan.ops):
            return f"the call made more launches than the {len(plan.ops)} recorded"
        if op != plan.ops[p]:
            return f"launch {p} is {op}, the plan recorded {plan.ops[p]}"
        if fresh != plan.fresh[p] or (op != HOST_READ and not plan.let_through[p] and attrs != plan.attrs[p]):
            return f"launch {p} ({op}) has other attributes than recorded"
        keys = plan.keys[p]
        if len(tensors) != len(keys):
            return f"launch {p} ({op}) has {len(tensors)} operands, the plan recorded {len(keys)}"
        binding, reverse = self.binding, self.reverse
        for index, (tensor, key, slot, wrapped) in enumerate(zip(tensors, keys, plan.slots[p], plan.wrapped[p])):
            if key is not None and operand_key(tensor) != key:
                return (f"launch {p} ({op}) operand {index}: {operand_key(tensor)} (shape, strides, offset, dtype, "
                        f"number) where the plan recorded {key}")
            address = tensor._storage_ptr()
            have = binding[slot]
            if have is None:
                if not wrapped:
                    if reverse.setdefault(address, slot) != slot:
                        return f"launch {p} ({op}) operand {index} shares a storage the trace kept apart"
                binding[slot] = address
            elif have != address:
                return f"launch {p} ({op}) operand {index} is another storage than the trace had there"
        return ""

    def _taken(self) -> None:
        """The launch at this position was taken: run the units it completed."""
        self.position += 1
        ready = self.plan.units_after[self.position - 1]
        if ready > self.units_run:
            if self.stream is None:
                self.stream = executor.launch_stream(self.plan.executable)
            self.plan.executable.run_units(self.units_run, ready, self.binding, self.seen, self.stream,
                                           eager_ran=True)
            self.units_run = ready

    def launch(self, op: str, inputs, outputs, attrs: dict, fresh: bool) -> bool:
        if self.recorder is not None:
            return self.recorder.launch(op, inputs, outputs, attrs, fresh)
        self.seen.append((op, inputs, outputs, attrs, fresh))
        self.miss = self._check(op, inputs + outputs, attrs, fresh)
        if self.miss:
            self._diverge(current_runs_itself=True)
            return False
        through = self.plan.let_through[self.position]
        self._taken()
        if through and outputs and profiler.records_this_thread():  # a profiler outside sees it as eager
            profiler.record_launch(op, outputs[0].device, lambda: capture.launch_now(op, inputs, outputs, attrs),
                                   inputs, outputs)
            return True
        return not through   # a launch left to the plugin runs now, as made (its unit is this launch)

    def before_host_read(self, tensor) -> None:
        if self.recorder is not None:
            self.recorder.before_host_read(tensor)
            return
        self.seen.append((HOST_READ, (tensor,), (), {}, True))
        self.miss = self._check(HOST_READ, (tensor,), {}, True)
        if self.miss:
            self._diverge(current_runs_itself=False)
            return
        self._taken()

    def _run_uncovered(self, upto: int) -> None:
        covered = set()
        for members in self.plan.executable.unit_launches[:self.units_run]:
            covered.update(members)
        executor.run_eagerly([entry for i, entry in enumerate(self.seen[:upto]) if i not in covered])

    def _diverge(self, current_runs_itself: bool) -> None:
        """Leave the plan: run what was taken and not yet run, as it was made, and trace the call
        (current_runs_itself: the launch being observed is let through, not run here)."""
        self._run_uncovered(len(self.seen) - 1 if current_runs_itself else len(self.seen))
        self.recorder = recorder_of(self.seen)

    def abandon(self) -> None:
        """The function raised: run what was taken so the state is what eager execution leaves."""
        if self.recorder is None:
            self._run_uncovered(len(self.seen))

    def _kept_unstored(self) -> int:
        """How many values the plan fuses away this call still references (their storages are held
        by more tensors than this call's operands)."""
        plan, kept = self.plan, 0
        for slot, (position, index) in plan.first_use.items():
            _, ins, outs, _, _ = self.seen[position]
            if capture.storage_refcount((ins + outs)[index]) > plan.holds[slot]:
                kept += 1
        return kept

    def finish(self):
        """Run the rest of the plan: returns "replayed", or the new trace of a call that left it."""
        if self.recorder is None and self.position != len(self.plan.ops):
            self.miss = f"the call made {self.position} launches, the plan recorded {len(self.plan.ops)}"
            self._diverge(current_runs_itself=False)
        if self.recorder is not None:
            return self.recorder.finish()
        kept = self._kept_unstored()
        if kept:
            # Units ran before the call returned: values this call keeps (the trace did not) were
            # never written. Say so; the next call traces again.
            warnings.warn(f"oar.compile: this call kept {kept} tensor(s) made inside the compiled function that the "
                          "traced call did not keep; their values were fused away and are unspecified. Return them "
                          "(or keep them on every call) so they are written.", RuntimeWarning, stacklevel=3)
            self.plan.entry.executable = None
        self.seen = []
        return "replayed"

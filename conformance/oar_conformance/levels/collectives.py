"""Level ``collectives``: every collective of the ABI across ranks, with bit-exact verifiable data.

Each case (``collectives.<kind>[.<op>].<dtype>.<size>[.in_place|.out_of_place]``)
runs one call on ``--nranks`` ranks (default 2): all_reduce, reduce and
reduce_scatter with sum/prod/max/min/avg, broadcast, all_gather, all_to_all,
a ring of send/recv, and every pair's send/recv inside one
group_start/group_end; dtypes float32, float16, bfloat16, int32, int64; 0 to
2^20 elements; in place and out of place where the ABI allows both. Inputs
and expected outputs: :mod:`collectives_data` (exact in any reduction order,
compared bit for bit; avg of floats within 2 ULP). A failure names the rank,
the element, the expected and the received value.

The ranks are processes of their own (:mod:`collectives_ranks`), started by
the worker and kept across its cases: one communicator per worker, joined
once, so a case costs its call and its checks. A case that fails or times out
kills the ranks (the next case starts fresh ones); every wait for a rank has a
deadline, so a hung rank fails its case as "timed out" rather than hanging the
run. ``collectives.failure.*`` start their own ranks: a rank that never joins
(the others' comm_init_rank must fail with OAR_ERROR_TIMEOUT naming it) and a
rank killed mid-run (the survivors' next collective must fail, not hang).

A plugin without the collectives group skips every case ("the plugin provides
no collectives"), as the abi level reports an absent optional group.
"""

from __future__ import annotations

import re
import time

from oar_conformance.levels.collectives_data import SIZES, Case, all_cases, bus_bandwidth_factor, payload_bytes
from oar_conformance.levels.collectives_ranks import RankGroup, RankTrouble
from oar_conformance.levels.raw_session import RawSession
from oar_conformance.registry import Failure, NotProvided, conformance_test

DESCRIPTION = "collective communication across ranks (all_reduce, all_gather, ...)"
# Its own kind of worker: the plugin opened raw (as the abi level) plus the ranks the worker keeps.
SESSION_KIND = "collectives"

COLLECTIVE_ENTRIES = ("get_unique_id", "comm_init_rank", "comm_destroy", "all_reduce", "broadcast", "reduce",
                      "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "group_start", "group_end")
DEFAULT_NRANKS = 2
# The communicator's timeout (comm_init_rank's timeout_ms): the longest a rank waits for a silent peer.
COMM_TIMEOUT_MS = 10_000
# A case's deadline for every rank's answer: the plugin's own timeout first, then this harness's; shorter
# than the runner's per-test --timeout, so a hung rank fails its case as "timed out" from here.
CASE_TIMEOUT_S = COMM_TIMEOUT_MS / 1000.0 + 20.0
RUNNER_MARGIN_S = 3.0
# The failure cases' communicator timeout, short so the level stays quick, and the slack allowed past it
# for the plugin's detection delay and a busy machine.
FAILURE_TIMEOUT_MS = 2_000
FAILURE_SLACK_S = 3.0


class NoCollectives(NotProvided):
    def __init__(self, missing: list[str]):
        everything = len(missing) == len(COLLECTIVE_ENTRIES)
        super().__init__(["collectives"] if everything else missing)
        reason = ("the plugin provides no collectives" if everything else
                  "the plugin provides part of the collectives group, which the host ignores; missing "
                  + ", ".join(missing))
        self.args = (reason,)


def open_session(config: dict) -> "CollectivesSession":
    return CollectivesSession(config)


class CollectivesSession:
    """The worker's plugin (to see what it provides) and its ranks, kept across cases while they pass."""

    def __init__(self, config: dict):
        self.raw = RawSession(config)
        self.config = config
        self.nranks = int(config.get("nranks") or DEFAULT_NRANKS)
        self.group: RankGroup | None = None
        self.runner_timeout_s = float(config.get("timeout_s") or 120.0)

    def context(self, test) -> "CollectivesContext":
        raw_context = self.raw.context(test)  # opens the plugin once, checks what the test needs
        missing = [entry for entry in COLLECTIVE_ENTRIES if not raw_context.provides(entry)]
        if missing:
            raise NoCollectives(missing)
        return CollectivesContext(self, test)

    def ranks(self) -> RankGroup:
        """The joined ranks of this worker, started on first use."""
        if self.group is None:
            group = RankGroup(self.raw.path, self.nranks, self.raw.device_count)
            try:
                answers = group.start(COMM_TIMEOUT_MS)
                failed = [f"rank {rank}: comm_init_rank returned {answer['status']} after {answer['elapsed_s']} s: "
                          f"{answer['message']!r}" for rank, answer in sorted(answers.items())
                          if answer["event"] != "joined"]
                if failed:
                    raise Failure(f"{self.nranks} ranks could not make a communicator: " + "; ".join(failed))
            except RankTrouble as trouble:
                group.kill()
                raise Failure(f"starting {self.nranks} ranks: {trouble}") from None
            except BaseException:
                group.kill()
                raise
            self.group = group
        return self.group

    def discard_ranks(self) -> None:
        if self.group is not None:
            group, self.group = self.group, None
            group.kill()

    def close(self) -> None:
        if self.group is not None:
            group, self.group = self.group, None
            group.close()
        self.raw.close()


class CollectivesContext:
    def __init__(self, session: CollectivesSession, test):
        self.session = session
        self.test = test
        self.nranks = session.nranks
        self.details: dict = {"nranks": session.nranks}
        self._groups: list[RankGroup] = []
        self.started = time.monotonic()

    def case_timeout_s(self) -> float:
        """What is left of the runner's per-test deadline, less a margin (starting ranks may have used part
        of it on a busy machine), so a hung rank fails as "timed out" from here, not by the runner's kill."""
        left = self.session.runner_timeout_s - RUNNER_MARGIN_S - (time.monotonic() - self.started)
        return max(1.0, min(CASE_TIMEOUT_S, left))

    def own_group(self, ranks: list[int]) -> RankGroup:
        """Ranks of a communicator of nranks for this test alone (killed when it ends)."""
        group = RankGroup(self.session.raw.path, self.nranks, self.session.raw.device_count, ranks)
        self._groups.append(group)
        return group

    def close(self) -> None:
        for group in self._groups:
            group.kill()
        self._groups.clear()


# ---- the data cases ----------------------------------------------------------------

def _case_failure(case: Case, answers: dict[int, dict]) -> str | None:
    lines = []
    for rank, answer in sorted(answers.items()):
        lines += [f"rank {rank}: {e['call']} returned {e['status']}: {e['message']!r}" for e in answer["errors"]]
        lines += answer["problems"]
    if not lines:
        return None
    shown = lines[:6] + ([f"... and {len(lines) - 6} more"] if len(lines) > 6 else [])
    return f"{case.kind} on {len(answers)} ranks: " + "; ".join(shown)


def run_case(ctx: CollectivesContext, case: Case) -> dict[int, dict]:
    """Run case on the worker's ranks; Failure with what differed (or which rank hung) unless every rank
    got the right bits."""
    session = ctx.session
    group = session.ranks()
    try:
        group.send({"op": "case", "case": case.to_json()})
        answers = group.collect(("case_done",), ctx.case_timeout_s(), case.id)
    except RankTrouble as trouble:
        session.discard_ranks()
        raise Failure(str(trouble)) from None
    failure = _case_failure(case, answers)
    if failure:
        session.discard_ranks()  # the communicator may be broken; the next case starts fresh ranks
        raise Failure(failure)
    seconds = max(answer["seconds"] for answer in answers.values())
    if case.count and seconds > 0:
        size = payload_bytes(case, ctx.nranks)
        algbw = size / seconds / 1e9
        ctx.details.update({"bytes": size, "time_us": round(seconds * 1e6, 1), "algbw_gbs": round(algbw, 4),
                            "busbw_gbs": round(algbw * bus_bandwidth_factor(case.kind, ctx.nranks), 4)})
    return answers


def _register(case: Case) -> None:
    what = f"{case.kind}{'(' + case.op + ')' if case.op else ''} of {case.count} {case.dtype} elements"
    where = " in place" if case.in_place else ""

    def collective_case(ctx: CollectivesContext):
        run_case(ctx, case)

    collective_case.__doc__ = f"{what}{where} on every rank: bit-exact (avg: 2 ULP)."
    conformance_test(case.id)(collective_case)


for _case in all_cases():
    _register(_case)


# ---- failure cases -------------------------------------------------------------------

def _names_rank(message: str, rank: int) -> bool:
    return re.search(rf"(?<![0-9]){rank}(?![0-9])", message) is not None


@conformance_test("collectives.failure.rank_never_joins")
def rank_never_joins(ctx: CollectivesContext):
    """The last rank never calls comm_init_rank: every other rank's comm_init_rank fails with
    OAR_ERROR_TIMEOUT naming it, within its timeout plus the detection delay, and never hangs."""
    missing = ctx.nranks - 1
    group = ctx.own_group(list(range(missing)))
    started = time.monotonic()
    try:
        answers = group.start(FAILURE_TIMEOUT_MS)
    except RankTrouble as trouble:
        raise Failure(f"with rank {missing} absent: {trouble}") from None
    limit = FAILURE_TIMEOUT_MS / 1000.0 + FAILURE_SLACK_S
    ctx.details["join_seconds"] = {str(rank): answer["elapsed_s"] for rank, answer in answers.items()}
    problems = []
    for rank, answer in sorted(answers.items()):
        if answer["event"] == "joined":
            problems.append(f"rank {rank}: comm_init_rank succeeded although rank {missing} never joined")
            continue
        if answer["status"] != "OAR_ERROR_TIMEOUT":
            problems.append(f"rank {rank}: comm_init_rank returned {answer['status']}, the ABI says OAR_ERROR_TIMEOUT "
                            f"({answer['message']!r})")
        elif not _names_rank(answer["message"], missing):
            problems.append(f"rank {rank}: the timeout's message does not name rank {missing}: {answer['message']!r}")
        if answer["elapsed_s"] > limit:
            problems.append(f"rank {rank}: comm_init_rank took {answer['elapsed_s']} s with a timeout of "
                            f"{FAILURE_TIMEOUT_MS} ms (allowed: {limit:g} s)")
    ctx.details["seconds"] = round(time.monotonic() - started, 3)
    if problems:
        raise Failure("; ".join(problems))


@conformance_test("collectives.failure.rank_dies_mid_run")
def rank_dies_mid_run(ctx: CollectivesContext):
    """After a good all_reduce the last rank is killed (SIGKILL): the survivors' next all_reduce fails with
    OAR_ERROR_DEVICE_LOST or OAR_ERROR_TIMEOUT within the communicator's timeout, and never hangs."""
    victim = ctx.nranks - 1
    survivors = list(range(victim))
    group = ctx.own_group(list(range(ctx.nranks)))
    try:
        answers = group.start(FAILURE_TIMEOUT_MS)
    except RankTrouble as trouble:
        raise Failure(f"setting up {ctx.nranks} ranks: {trouble}") from None
    failed = [f"rank {rank}: {answer['status']} {answer['message']!r}" for rank, answer in sorted(answers.items())
              if answer["event"] != "joined"]
    if failed:
        raise Failure("comm_init_rank failed: " + "; ".join(failed))
    case = Case("all_reduce", "float32", "n1k", "sum")
    limit = FAILURE_TIMEOUT_MS / 1000.0 + FAILURE_SLACK_S
    try:
        group.send({"op": "case", "case": case.to_json()})
        first = group.collect(("case_done",), limit + 10.0, "the all_reduce before the kill")
        failure = _case_failure(case, first)
        if failure:
            raise Failure(f"before any rank died: {failure}")
        group.kill_rank(victim)
        started = time.monotonic()
        group.send({"op": "case", "case": case.to_json()}, ranks=survivors)
        after = group.collect(("case_done",), limit + 10.0, f"all_reduce with rank {victim} dead", ranks=survivors)
    except RankTrouble as trouble:
        raise Failure(f"with rank {victim} killed: {trouble}") from None
    elapsed = time.monotonic() - started
    ctx.details["seconds_to_error"] = round(elapsed, 3)
    problems = []
    for rank, answer in sorted(after.items()):
        statuses = [e["status"] for e in answer["errors"]]
        if not statuses:
            problems.append(f"rank {rank}: all_reduce with rank {victim} dead completed without an error")
        elif statuses[0] not in ("OAR_ERROR_DEVICE_LOST", "OAR_ERROR_TIMEOUT"):
            e = answer["errors"][0]
            problems.append(f"rank {rank}: {e['call']} returned {e['status']}, the ABI says OAR_ERROR_DEVICE_LOST "
                            f"or OAR_ERROR_TIMEOUT ({e['message']!r})")
    if elapsed > limit:
        problems.append(f"the survivors' error took {elapsed:.1f} s with a timeout of {FAILURE_TIMEOUT_MS} ms "
                        f"(allowed: {limit:g} s)")
    if problems:
        raise Failure("; ".join(problems))


# ---- report -----------------------------------------------------------------------------

def report_extras(results: list[dict]) -> dict:
    """nccl-tests' figures of the largest cases that passed: bytes, time, algbw and busbw (GB/s)."""
    largest = max(SIZES, key=SIZES.get)
    rows = [{"id": r["id"], **{k: r["details"][k] for k in ("bytes", "time_us", "algbw_gbs", "busbw_gbs")}}
            for r in results if r["status"] == "pass" and f".{largest}" in r["id"] and "busbw_gbs" in r.get("details", {})]
    return {"bandwidth": rows}

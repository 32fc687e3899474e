"""Facts about the whole job, computed across ranks from the events of one input (or job).

Input: parsed events (and signal events). Output: :class:`JobFacts`, offered to rule
conditions (``facts:``) and to advice templates: which ranks were seen and timed out (and so
which did not), whether the ranks that timed out were in step, collectives that disagree at
the same SeqNum, the configured timeout against the time the work ran, the data moved, the
first rank to die according to torchrun, and the first rank that failed of its own accord.

In step or not. Within one process group, every rank numbers its collectives the same way.
Ranks stuck at the same SeqNum with different ops or sizes ran different collectives
(``mismatched_collective``). Ranks stuck two or more SeqNums apart issued different numbers
of collectives (``out_of_step``). One SeqNum apart is a rank simply behind (``late_ranks``)
when the one ahead already completed the collective the other is stuck in: that collective
ran on every rank, and the late rank stopped afterwards (a save, an evaluation, a hang); it
is out of step when nothing says so.

Flight-recorder dumps, when a job has them, add their own facts (``fr_*``, computed by
:mod:`nccl_triage.flightrec` and joined by :func:`add_dump_facts`): the ranks they blame lead
``culprit_ranks``, so rules that look for a culprit's activity look on those ranks first.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from nccl_triage.model import Event, Kind, is_failure
from nccl_triage.model.fields import LAST_OUTPUT, PROGRESS
from nccl_triage.model.report import ASSUMED_ELEMENT_BYTES, UNSET_NUMEL, JobFacts

# Collectives whose per-rank input sizes legitimately differ.
_UNEVEN = ("ALLTOALL", "ALLTOALL_BASE", "GATHER", "SCATTER", "SEND", "RECV")
# Signals that say a rank failed of its own accord, the kind of failure they stand for.
_CRASHES = {"cuda_oom": "oom", "gpu_fault": "gpu", "python_exception": "exception"}


def compute_facts(events: Iterable[Event]) -> JobFacts:
    """Compute the job facts from one input's (or one job's) events."""
    facts = JobFacts()
    seen: set[int] = set()
    timed_out: set[int] = set()
    nranks: list[int] = []
    versions: set[str] = set()
    groups: dict[str, list[Event]] = defaultdict(list)
    ops: list[str] = []
    failed: set[int] = set()
    child_root: Event | None = None
    worker_failures: list[Event] = []
    crashes: list[Event] = []
    device_errors: set[object] = set()
    outputs: list[Event] = []  # each rank's own lines and progress bars near the failures
    first_failure: dict[str, int] = {}  # per input: the line of its first failure
    for ev in events:
        if ev.kind in (LAST_OUTPUT, PROGRESS):
            outputs.append(ev)
            continue
        if is_failure(ev) and ev.line < first_failure.get(ev.source, ev.line + 1):
            first_failure[ev.source] = ev.line
        if ev.rank is not None:
            seen.add(ev.rank)
        if ev.kind in _DEVICE_ERROR_KINDS and _DEVICE_ERROR.search(ev.text):
            device_errors.add(_who(ev.rank, ev.text))
            device_errors.update(_who(o.rank, o.text) for o in ev.occurrences)
        d = ev.detail
        n = d.get("nranks") if ev.kind == Kind.NCCL_INFO else d.get("expected")
        if isinstance(n, int):
            nranks.append(n)  # NCCL's INIT line, or the store's "k/n clients joined"
        v = d.get("nccl_version")
        if isinstance(v, str):
            versions.add(nccl_release(v))
        if ev.kind == Kind.WATCHDOG_TIMEOUT:
            _count_timeout(facts, ev)
            if ev.rank is not None:
                timed_out.add(ev.rank)
            if ev.op_type and ev.op_type not in ops:
                ops.append(ev.op_type)
            if ev.seq is not None:
                groups[_group_of(ev)].append(ev)
        elif ev.kind == Kind.CHILD_FAILED and ev.form == "root_cause":
            child_root = child_root or ev
        elif ev.kind == Kind.WORKER_FAILED and d.get("exit_code") is not None:
            worker_failures.append(ev)
        elif ev.kind in _CRASHES:
            crashes.append(ev)
        if ev.kind in (Kind.CHILD_FAILED, Kind.WORKER_FAILED) and ev.rank is not None:
            failed.add(ev.rank)
    if len(groups) > 1 and "default" in groups:
        # A watchdog line alone does not name its process group: compare it with each group
        # the log does name (the status lines that would have named it may be cut off).
        unnamed = groups.pop("default")
        for evs in groups.values():
            evs.extend(unnamed)
    facts.ranks_seen = sorted(seen)
    facts.device_error_processes = len(device_errors - {None})
    facts.ranks_timed_out = sorted(timed_out)
    facts.op_types = ops
    facts.nccl_versions = sorted(versions)
    facts.failed_ranks = sorted(failed)
    plausible = [n for n in nranks if 0 < n <= MAX_WORLD]  # a damaged count names no job
    if plausible:
        facts.world_size = max(plausible)
    if timed_out:
        # Without NCCL's nranks the log may be an excerpt: only ranks it shows are named.
        universe = set(range(facts.world_size)) if facts.world_size else seen
        facts.ranks_not_timed_out = sorted(universe - timed_out)
        facts.ranks_unseen = sorted(universe - timed_out - seen)
    _in_step(facts, groups)
    if facts.max_numel is not None:
        facts.max_bytes = facts.max_numel * ASSUMED_ELEMENT_BYTES
    _first_failure(facts, child_root, worker_failures)
    _first_crash(facts, crashes)
    facts.culprit_ranks = _culprits(facts)
    facts.rank_activity = _activity(facts, outputs, first_failure)
    return facts


def _bar_line(ev: Event) -> int:
    return int(ev.detail.get("last_line") or ev.line)


MAX_ACTIVITY = (
    64  # ranks described in rank_activity (culprits and the ranks that did not wait first)
)
_TEXT = 240  # characters of a line kept in rank_activity


def _activity(
    facts: JobFacts, outputs: Iterable[Event], first_failure: dict[str, int]
) -> list[dict[str, Any]]:
    """What each rank printed last: its last own line and its last bar before it failed."""
    last: dict[int | None, Event] = {}
    bars: dict[int | None, Event] = {}
    for ev in outputs:
        if ev.kind == PROGRESS and ev.line >= first_failure.get(ev.source, ev.line + 1):
            continue  # own lines are cut at a rank's first failure already (diagnose/context)
        who = ev.rank if ev.rank is not None else ev.local_rank
        if ev.kind == LAST_OUTPUT:
            if who not in last or last[who].line <= ev.line:
                last[who] = ev
        elif who not in bars or _bar_line(bars[who]) <= _bar_line(ev):
            bars[who] = ev
    ranks = set(last) | set(bars)
    if any(r is not None for r in ranks):
        ranks.discard(None)  # lines without a rank say nothing of one when others do
    timed_out = set(facts.ranks_timed_out)
    culprits = {r: i for i, r in enumerate(facts.culprit_ranks)}

    def order(r: int | None) -> tuple[int, int, int]:
        rank = -1 if r is None else r
        return (culprits.get(rank, len(culprits)), rank in timed_out, rank)

    out: list[dict[str, Any]] = []
    for r in sorted(ranks, key=order)[:MAX_ACTIVITY]:
        row: dict[str, Any] = {"rank": r, "timed_out": r in timed_out}
        own = last.get(r)
        row["line"] = own.line if own is not None else None
        row["text"] = own.text[:_TEXT] if own is not None else None
        bar = bars.get(r)
        row["progress"] = (
            None
            if bar is None
            else {
                "desc": bar.detail.get("desc"),
                "n": bar.detail.get("n"),
                "total": bar.detail.get("total"),
                "percent": bar.detail.get("percent"),
                "elapsed_s": bar.detail.get("elapsed_s"),
                "line": _bar_line(bar),
            }
        )
        out.append(row)
    return out


# Device-level CUDA errors as NCCL ("Cuda failure 700 'an illegal memory access ...'"), the
# watchdog ("... terminated with exception: CUDA error: ...") or PyTorch report them.
_DEVICE_ERROR = re.compile(
    r"illegal memory access|illegal instruction|misaligned address|Cuda failure 7(?:00|15|16)\b"
)
_DEVICE_ERROR_KINDS = frozenset(
    {Kind.CUDA_ERROR, Kind.NCCL_WARN, Kind.NCCL_ERROR, Kind.WATCHDOG_EXCEPTION, Kind.TERMINATE}
)


_ORIGIN = re.compile(r"([\w.-]+):(\d+):\d+ \[\d+\]")  # NCCL's host:pid:tid [device]


def _who(rank: int | None, text: str) -> object:
    """A process: its rank, else NCCL's host and pid on the line, else None (unknown)."""
    if rank is not None:
        return rank
    m = _ORIGIN.search(text)
    return (m[1], m[2]) if m else None


MAX_WORLD = 1 << 20  # the most ranks a job is taken to have (its ranks are listed one by one)


def nccl_release(version: str) -> str:
    """NCCL's release as ``major.minor.patch``, however PyTorch printed it.

    PyTorch 1.10-1.11 printed NCCL's version code (major*10000 + minor*100 + patch for 2.9+)
    split the old way, as code/1000.code%1000/100.code%100: NCCL 2.10.3 appears as
    ``21.0.3``. A major above 9 can only be such a code. ``+cuda12.1`` suffixes are dropped.
    """
    release = version.split("+")[0]
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", release)
    if m is None or int(m[1]) < 10:
        return release
    code = int(m[1]) * 1000 + int(m[2]) * 100 + int(m[3])
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def _count_timeout(facts: JobFacts, ev: Event) -> None:
    facts.timeouts += 1
    if ev.timeout_ms is not None:
        facts.timeout_ms = min(facts.timeout_ms or ev.timeout_ms, ev.timeout_ms)
    if ev.ran_for_ms is not None:
        facts.ran_for_ms = max(facts.ran_for_ms or 0, ev.ran_for_ms)
    for numel in (ev.numel_in, ev.numel_out):
        if numel is not None and numel != UNSET_NUMEL:
            facts.max_numel = max(facts.max_numel or 0, numel)
    if ev.rank is not None and ev.last_completed is not None:
        facts.last_completed[ev.rank] = ev.last_completed
    if ev.rank is not None and ev.seq is not None:
        facts.last_seq[ev.rank] = max(ev.seq, facts.last_seq.get(ev.rank, ev.seq))


def _group_of(ev: Event) -> str:
    """The process group a timeout belongs to; lines that name none share one group."""
    if ev.pg_guid is not None:
        return f"guid:{ev.pg_guid}"
    if ev.pg is not None and ev.pg not in ("0", "default_pg"):
        return f"pg:{ev.pg}"
    return "default"


def _in_step(facts: JobFacts, groups: dict[str, list[Event]]) -> None:
    """Mismatched collectives at one SeqNum; ranks out of step, or simply late."""
    all_seqs = [e.seq for evs in groups.values() for e in evs if e.seq is not None]
    if all_seqs:
        facts.min_seq, facts.max_seq = min(all_seqs), max(all_seqs)
    late: set[int] = set()
    for group, evs in _unmixed(groups).items():
        by_seq: dict[int, list[Event]] = defaultdict(list)
        for e in evs:
            by_seq[e.seq or 0].append(e)
        for seq, at in sorted(by_seq.items()):
            disagreement = _disagreement(at)
            if disagreement:
                facts.mismatched_collective = True
                facts.mismatch.append(
                    {
                        "pg": None if group.startswith("default") else group.split(":", 1)[1],
                        "seq": seq,
                        "ranks": {
                            str(e.rank): f"{e.op_type}(NumelIn={e.numel_in})"
                            for e in at
                            if e.rank is not None
                        },
                    }
                )
        if len(by_seq) < 2:
            continue
        low, high = min(by_seq), max(by_seq)
        facts.seq_spread = max(facts.seq_spread, high - low)
        behind = sorted({e.rank for e in by_seq[low] if e.rank is not None})
        facts.furthest_behind = sorted(set(facts.furthest_behind) | set(behind))
        ahead_completed = [e.last_completed for e in by_seq[high] if e.last_completed is not None]
        if high - low == 1 and ahead_completed and min(ahead_completed) >= low:
            late.update(behind)  # the collective it is stuck in completed on the others
        else:
            facts.out_of_step = True
    facts.late_ranks = sorted(late)
    facts.desync = facts.mismatched_collective or facts.out_of_step


def _unmixed(groups: dict[str, list[Event]]) -> dict[str, list[Event]]:
    """Split the lines that name no process group where they must be several groups.

    A rank runs one collective per group at a time: one rank stuck at two SeqNums among
    lines that do not say their group is in two groups (or timed out twice), so its SeqNums
    cannot be compared with each other's; each SeqNum is then a group of its own.
    """
    unnamed = groups.get("default", [])
    seqs: dict[int, set[int]] = defaultdict(set)
    for e in unnamed:
        if e.rank is not None and e.seq is not None:
            seqs[e.rank].add(e.seq)
    if all(len(s) < 2 for s in seqs.values()):
        return groups
    out = {k: v for k, v in groups.items() if k != "default"}
    for e in unnamed:
        out.setdefault(f"default@{e.seq}", []).append(e)
    return out


def _disagreement(at: list[Event]) -> bool:
    """Tell whether the ranks stuck at one SeqNum ran different collectives."""
    ops = {e.op_type for e in at if e.op_type is not None}
    if len(ops) > 1:
        return True
    if ops and next(iter(ops)).upper().startswith(_UNEVEN):
        return False
    numels = {e.numel_in for e in at if e.numel_in is not None and e.numel_in != UNSET_NUMEL}
    return len(numels) > 1


def _first_failure(facts: JobFacts, child_root: Event | None, failures: list[Event]) -> None:
    """The first rank to die, as torchrun reports it (its ChildFailedError root cause)."""
    first = child_root or (failures[0] if failures else None)
    if first is None:
        return
    code = first.detail.get("exit_code")
    sig = first.detail.get("signal")
    facts.first_failure_rank = first.rank if first.rank is not None else first.local_rank
    facts.first_failure_exit_code = code if isinstance(code, int) else None
    facts.first_failure_signal = sig if isinstance(sig, str) else None


def _first_crash(facts: JobFacts, crashes: list[Event]) -> None:
    """The first rank that failed of its own accord: an exception, a fatal signal, an OOM."""
    if not crashes:
        return
    first = min(crashes, key=lambda e: (e.ts is None, e.ts or 0.0, e.line))
    facts.crashed_rank = first.rank
    facts.crash_kind = _CRASHES.get(first.kind)
    facts.crash_line = first.line
    facts.crash_text = first.text[:300]


def _culprits(facts: JobFacts) -> list[int]:
    """Ranks most likely at fault, most likely first.

    The rank that failed of its own accord, ranks shown but not timing out, ranks furthest
    behind, torchrun's first failure.
    """
    order: list[int] = []
    timed_out = set(facts.ranks_timed_out)
    candidates = [
        [facts.crashed_rank] if facts.crashed_rank is not None else [],
        [r for r in facts.ranks_not_timed_out if r in set(facts.ranks_seen)],
        facts.furthest_behind if facts.seq_spread else [],
        [facts.first_failure_rank]
        if facts.first_failure_rank is not None and facts.first_failure_rank not in timed_out
        else [],
    ]
    for group in candidates:
        order.extend(r for r in group if r is not None and r not in order)
    return order


_FR_FACTS = frozenset(f.name for f in dataclasses.fields(JobFacts) if f.name.startswith("fr_"))


def add_dump_facts(facts: JobFacts, values: Mapping[str, Any]) -> JobFacts:
    """Join what a job's flight-recorder dumps say to the facts of its log.

    Args:
        facts: the log's facts (changed in place).
        values: plain ``fr_*`` values (``FlightRecorder.facts()``); other keys are ignored.

    Returns:
        ``facts``, whose ``culprit_ranks`` now start with the ranks the dumps blame.
    """
    for name, value in values.items():
        if name in _FR_FACTS:
            setattr(facts, name, list(value) if isinstance(value, list | tuple) else value)
    blamed = list(facts.fr_culprit_ranks)
    facts.culprit_ranks = blamed + [r for r in facts.culprit_ranks if r not in blamed]
    return facts

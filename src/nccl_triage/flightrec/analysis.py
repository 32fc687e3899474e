"""Find which ranks hung a job from its flight-recorder dumps, on which side, and where in code.

Input: the per-rank :class:`~nccl_triage.flightrec.reader.FrDump` objects of one job (any
subset of its ranks). Output: an :class:`FrAnalysis`: per process group, the first collective
that went wrong and why (ranks missing, a mismatch, completed on some ranks only, ...); across
groups, the smallest set of ranks that explains every stuck group, each with its side (``cpu``:
the rank never enqueued the collective; ``gpu``: it enqueued it but the device never started or
finished it) and the stack frames of its last record.

How groups are read. A process group is identified by its name and its member ranks (from each
rank's ``pg_config``; the same name can carry different members on different ranks after
``split_group``). When no rank recorded a group's members (the gloo backend records none), the
members are the ranks with records in that group, and for the default group every rank seen.
Collective records are aligned by ``collective_seq_id``, which every member numbers the same
way; point-to-point ops are matched by their peer.

Progress of a rank in a group: the last collective it enqueued (its records, the collective
number its send/recv records carry, and ``pg_status``, which outlives the ring buffer) and the
last one it finished (records completed or retired: gloo retires finished work without marking
it completed); when start events were recorded, the last one started. ``pg_status`` is keyed by
the rank's own process-group id and counts the last work of any kind, so it is not read for
collectives in a group that also carries send/recv. A dump of unfinished entries only (the
watchdog's ``onlyActive`` dump) finished everything it does not list. A group is stuck at the
first collective that not every member finished, when some member enqueued it.

Why one rank and not another. Each rank's oldest unfinished op is where it is blocked. A rank
missing from a stuck collective is a culprit only when nothing of its own is unfinished (its
device is idle: the CPU side); one with unfinished work elsewhere is waiting there, and that
group explains it. When every member enqueued the collective, a rank that did not finish (or
start) it while others did, and for which it is the oldest unfinished work, points to its
device (the GPU side). A collective or a send/recv that nothing tells apart is explained by any
member that first waits for older work elsewhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

from nccl_triage.flightrec.findings import find, resolve_waiting
from nccl_triage.flightrec.groups import build_groups, oldest_pending
from nccl_triage.flightrec.records import FrDump, FrRecord
from nccl_triage.flightrec.result import (
    TIER,
    Culprit,
    FindingKind,
    FrAnalysis,
    GroupFinding,
    Side,
    describe,
    user_frame,
)
from nccl_triage.model.ranks import format_ranks

_EXACT_SEARCH_LIMIT = 40


def analyse(dumps: Sequence[FrDump], unreadable_ranks: Iterable[int] = ()) -> FrAnalysis:
    """Analyse one job's dumps.

    Args:
        dumps: at most one dump per rank.
        unreadable_ranks: ranks whose dump file exists but could not be read (they count as
            members without a dump of the default group).

    Returns:
        The analysis; ``culprit_ranks`` is empty when no group is stuck.
    """
    by_rank = {d.rank: d for d in dumps}
    groups, notes = build_groups(by_rank, set(unreadable_ranks))
    blocked = oldest_pending(groups)
    findings = [f for g in groups if (f := find(g, blocked)) is not None]
    findings = resolve_waiting(findings, blocked)
    culprit_ranks, unresolved = _hitting_set(findings)
    notes.extend(
        f"process group {f.label}: {f.summary}; the dumps cannot tell which of ranks "
        f"{format_ranks(f.suspects)} is at fault"
        for f in unresolved
    )
    culprits = [_culprit(rank, findings, by_rank) for rank in culprit_ranks]
    sides = {c.side for c in culprits}
    stuck = _primary(findings, culprits)
    members = {r for g in groups for r in g.members}
    first = culprits[0] if culprits else None
    return FrAnalysis(
        culprit_ranks=culprit_ranks,
        side=sides.pop() if len(sides) == 1 else None,
        culprits=culprits,
        groups=findings,
        stuck=stuck,
        frames=first.frames if first else (),
        user_frame=first.user_frame if first else None,
        dump_ranks=sorted(by_rank),
        ranks_without_dump=sorted(members - set(by_rank)),
        notes=notes,
    )


def _hitting_set(findings: Sequence[GroupFinding]) -> tuple[list[int], list[GroupFinding]]:
    """The fewest ranks that meet every root finding's suspects, strongest evidence first.

    Returns:
        The culprits, and the root findings they leave unexplained because the evidence
        cannot tell their suspects apart.
    """
    chosen: set[int] = set()
    unresolved: list[GroupFinding] = []
    for tier in (0, 1, 2):
        pending = [
            f for f in findings if f.root and TIER[f.kind] == tier and not chosen & set(f.suspects)
        ]
        picked = _min_cover([frozenset(f.suspects) for f in pending])
        chosen |= picked
        unresolved.extend(f for f in pending if not picked & set(f.suspects))
    return sorted(chosen), unresolved


def _min_cover(sets: Sequence[frozenset[int]]) -> set[int]:
    """The smallest set of ranks meeting every set, or what all such smallest sets share."""
    forced = {next(iter(s)) for s in sets if len(s) == 1}
    rest = [s for s in sets if not s & forced]
    if not rest:
        return forced
    candidates = sorted(set().union(*rest))
    if len(candidates) <= _EXACT_SEARCH_LIMIT:
        for size in range(1, min(len(rest), 4) + 1):
            solutions = [
                set(combo)
                for combo in itertools.combinations(candidates, size)
                if all(s.intersection(combo) for s in rest)
            ]
            if solutions:
                return forced | set.intersection(*solutions)
    common = frozenset.intersection(*rest)
    return forced | (set(common) if len(common) == 1 else set())


def _culprit(rank: int, findings: Sequence[GroupFinding], by_rank: Mapping[int, FrDump]) -> Culprit:
    own = sorted((f for f in findings if f.root and rank in f.suspects), key=_preference)
    kind = own[0].kind
    dump = by_rank.get(rank)
    record: FrRecord | None = None
    if dump is not None and dump.entries:
        status = next((s for s in own[0].ranks if s.rank == rank), None)
        if (
            kind in (FindingKind.MISSING, FindingKind.NO_DUMP)
            or status is None
            or not status.record
        ):
            record = dump.entries[-1]
        else:
            record = status.record
    side = {
        FindingKind.MISSING: Side.CPU,
        FindingKind.MISMATCH: Side.CPU,
        FindingKind.INCOMPLETE: Side.GPU,
        FindingKind.NOT_STARTED: Side.GPU,
        FindingKind.UNDETERMINED: Side.GPU,
    }.get(kind)
    reason = _reason(rank, kind, own[0], record)
    return Culprit(
        rank=rank,
        side=side,
        kind=kind,
        reason=reason,
        groups=tuple(f.label for f in own),
        record=record,
        user_frame=user_frame(record.frames) if record else None,
    )


def _reason(rank: int, kind: FindingKind, finding: GroupFinding, record: FrRecord | None) -> str:
    where = f"{finding.op} #{finding.seq} of process group {finding.label}"
    last = (
        f" (its last record: {describe(record)} #{record.collective_seq_id} of group {record.pg_name})"
        if record
        else ""
    )
    if kind is FindingKind.MISSING:
        return f"never enqueued {where} and had no work left on its device{last}"
    if kind is FindingKind.MISMATCH:
        mine = describe(record) if record else "a different collective"
        sizes = "x".join(str(list(x)) for x in finding.input_sizes) or "[]"
        theirs = f"{finding.op} {sizes} {','.join(sorted(set(finding.input_dtypes))) or '-'}"
        return f"called {mine} as collective #{finding.seq} of process group {finding.label}, where the others called {theirs}"
    if kind is FindingKind.INCOMPLETE:
        return f"enqueued {where} but its device never finished it while others did"
    if kind is FindingKind.NOT_STARTED:
        return f"enqueued {where} but its device never started it while others did"
    if kind is FindingKind.NO_DUMP:
        return f"left no dump; every rank with a dump enqueued {where}"
    return f"enqueued {where}; no member completed it and nothing else tells them apart"


def _preference(finding: GroupFinding) -> tuple[int, bool, int, str]:
    """Sort key for a culprit's findings.

    Strongest evidence first, then the hang it alone explains (no member waiting elsewhere),
    then the largest group.
    """
    return (TIER[finding.kind], bool(finding.waiting_in), -len(finding.members), finding.pg_name)


def _primary(findings: Sequence[GroupFinding], culprits: Sequence[Culprit]) -> GroupFinding | None:
    if culprits:
        first = culprits[0]
        own = [f for f in findings if f.root and first.rank in f.suspects]
        if own:
            return min(own, key=_preference)
    ordered = [f for f in findings if f.root] + [f for f in findings if not f.root]
    return ordered[0] if ordered else None

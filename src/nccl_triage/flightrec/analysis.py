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

import dataclasses
import functools
import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from nccl_triage.flightrec.reader import Frame, FrDump, FrRecord, PgConfig, RecordState

# Collectives whose per-rank sizes legitimately differ (splits, root-only buffers).
_UNEVEN_INPUT = ("all_to_all", "scatter", "_v", "alltoall")
_UNEVEN_OUTPUT = ("all_to_all", "gather", "_v", "alltoall")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?/(?!site-packages/|dist-packages/)")
_DEFAULT_PG_NAMES = ("0",)
_EXACT_SEARCH_LIMIT = 40


class Side(StrEnum):
    """Where a culprit rank stopped: its CPU never enqueued the work, or its device never ran it."""

    CPU = "cpu"
    GPU = "gpu"


class FindingKind(StrEnum):
    """What is wrong with a group's first bad collective."""

    MISSING = "missing"  # some members never enqueued it
    MISMATCH = "mismatch"  # members enqueued different ops, sizes or dtypes at that number
    INCOMPLETE = "incomplete"  # finished on some members, not on others that enqueued it
    NOT_STARTED = "not_started"  # enqueued everywhere, started on some members only
    NO_DUMP = "no_dump"  # every member with a dump enqueued it; the others left no dump
    UNDETERMINED = "undetermined"  # enqueued everywhere, finished nowhere, nothing tells apart


_TIER = {
    FindingKind.MISSING: 0,
    FindingKind.MISMATCH: 0,
    FindingKind.INCOMPLETE: 1,
    FindingKind.NOT_STARTED: 1,
    FindingKind.NO_DUMP: 2,
    FindingKind.UNDETERMINED: 2,
}


@dataclass(frozen=True, slots=True)
class RankStatus:
    """One member of a stuck group, at the group's bad collective.

    ``role`` is ``ok``, ``missing``, ``mismatch``, ``incomplete``, ``not_started``,
    ``undetermined``,
    ``no_dump`` or ``waiting`` (missing here because its own work is pending elsewhere).
    """

    rank: int
    has_dump: bool
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    record: FrRecord | None
    role: str
    note: str

    def to_dict(self) -> dict[str, Any]:
        """Return the status as plain JSON values."""
        return {
            "rank": self.rank,
            "has_dump": self.has_dump,
            "last_enqueued": self.last_enqueued,
            "last_started": self.last_started,
            "last_completed": self.last_completed,
            "role": self.role,
            "note": self.note,
            "record": _record_dict(self.record) if self.record else None,
        }


@dataclass(frozen=True, slots=True)
class GroupFinding:
    """The first collective that went wrong in one process group.

    ``suspects`` are the ranks this group alone points to; ``root`` says whether they count
    for the culprits (False when every missing rank is waiting in another group, named in
    ``waiting_in``). ``op``, sizes and dtypes describe what most members enqueued.
    """

    pg_name: str
    pg_desc: str
    members: tuple[int, ...]
    members_from: str
    kind: FindingKind
    seq: int
    p2p: bool
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    missing_ranks: tuple[int, ...]
    mismatch_ranks: tuple[int, ...]
    suspects: tuple[int, ...]
    root: bool
    waiting_in: Mapping[int, str]
    ranks: tuple[RankStatus, ...]
    summary: str

    @property
    def label(self) -> str:
        """The group as people name it: ``0 (default_pg)``."""
        return f"{self.pg_name} ({self.pg_desc})" if self.pg_desc else self.pg_name

    def to_dict(self) -> dict[str, Any]:
        """Return the finding as plain JSON values."""
        return {
            "pg_name": self.pg_name,
            "pg_desc": self.pg_desc,
            "members": list(self.members),
            "members_from": self.members_from,
            "kind": str(self.kind),
            "seq": self.seq,
            "p2p": self.p2p,
            "op": self.op,
            "input_sizes": [list(s) for s in self.input_sizes],
            "output_sizes": [list(s) for s in self.output_sizes],
            "input_dtypes": list(self.input_dtypes),
            "output_dtypes": list(self.output_dtypes),
            "missing_ranks": list(self.missing_ranks),
            "mismatch_ranks": list(self.mismatch_ranks),
            "suspects": list(self.suspects),
            "root": self.root,
            "waiting_in": {str(r): where for r, where in self.waiting_in.items()},
            "summary": self.summary,
            "ranks": [r.to_dict() for r in self.ranks],
        }


@dataclass(frozen=True, slots=True)
class Culprit:
    """A rank that explains stuck groups, with its side and the code it was last seen in."""

    rank: int
    side: Side | None
    kind: FindingKind
    reason: str
    groups: tuple[str, ...]
    record: FrRecord | None
    user_frame: Frame | None

    @property
    def frames(self) -> tuple[Frame, ...]:
        """The stack frames of the record quoted for this rank (innermost first)."""
        return self.record.frames if self.record else ()

    def to_dict(self) -> dict[str, Any]:
        """Return the culprit as plain JSON values."""
        return {
            "rank": self.rank,
            "side": str(self.side) if self.side else None,
            "kind": str(self.kind),
            "reason": self.reason,
            "groups": list(self.groups),
            "record": _record_dict(self.record) if self.record else None,
            "frames": [_frame_dict(f) for f in self.frames],
            "user_frame": _frame_dict(self.user_frame) if self.user_frame else None,
        }


@dataclass(frozen=True, slots=True)
class FrAnalysis:
    """Everything the dumps say about a hang.

    ``culprit_ranks`` is the smallest set of ranks that explains every stuck group; ``side``
    is theirs when they share one. ``stuck`` is the finding of the first culprit (else the
    first stuck group) and ``frames``/``user_frame`` are the first culprit's.
    """

    culprit_ranks: list[int]
    side: Side | None
    culprits: list[Culprit]
    groups: list[GroupFinding]
    stuck: GroupFinding | None
    frames: tuple[Frame, ...]
    user_frame: Frame | None
    dump_ranks: list[int]
    ranks_without_dump: list[int]
    notes: list[str] = field(default_factory=list)

    @property
    def hung(self) -> bool:
        """True when some process group is stuck or mismatched."""
        return bool(self.groups)

    def to_dict(self) -> dict[str, Any]:
        """Return the analysis as plain JSON values."""
        return {
            "hung": self.hung,
            "culprit_ranks": list(self.culprit_ranks),
            "side": str(self.side) if self.side else None,
            "stuck": self.stuck.to_dict() if self.stuck else None,
            "user_frame": _frame_dict(self.user_frame) if self.user_frame else None,
            "culprits": [c.to_dict() for c in self.culprits],
            "groups": [g.to_dict() for g in self.groups],
            "dump_ranks": list(self.dump_ranks),
            "ranks_without_dump": list(self.ranks_without_dump),
            "notes": list(self.notes),
        }

    def facts(self) -> dict[str, Any]:
        """Return flat facts (plain values only) for the rule engine's job facts.

        Returns:
            ``culprit_ranks`` and ``fr_*`` keys: side, kind, stuck group/op/seq, missing and
            mismatched ranks, the culprit's user frame, counts of dumps and stuck groups.
        """
        stuck = self.stuck
        frame = self.user_frame
        return {
            "culprit_ranks": list(self.culprit_ranks),
            "fr_hung": self.hung,
            "fr_side": str(self.side) if self.side else None,
            "fr_cpu_ranks": [c.rank for c in self.culprits if c.side is Side.CPU],
            "fr_gpu_ranks": [c.rank for c in self.culprits if c.side is Side.GPU],
            "fr_kind": str(stuck.kind) if stuck else None,
            "fr_stuck_pg": stuck.pg_name if stuck else None,
            "fr_stuck_pg_desc": stuck.pg_desc if stuck else None,
            "fr_stuck_op": stuck.op if stuck else None,
            "fr_stuck_seq": stuck.seq if stuck else None,
            "fr_stuck_p2p": stuck.p2p if stuck else None,
            "fr_missing_ranks": sorted({r for g in self.groups if g.root for r in g.missing_ranks}),
            "fr_mismatch_ranks": sorted({r for g in self.groups for r in g.mismatch_ranks}),
            "fr_frame": str(frame) if frame else None,
            "fr_frame_file": frame.filename if frame else None,
            "fr_frame_line": frame.line if frame else None,
            "fr_frame_function": frame.name if frame else None,
            "fr_stuck_groups": len(self.groups),
            "fr_dumps": len(self.dump_ranks),
            "fr_ranks_without_dump": list(self.ranks_without_dump),
        }


def is_user_frame(frame: Frame) -> bool:
    """Tell whether a frame is the job's own code (not torch, not the standard library, not C++).

    Args:
        frame: a captured frame.

    Returns:
        True for Python files outside ``torch/`` and the interpreter's standard library.
    """
    path = frame.filename.replace("\\", "/")
    if not path or path.startswith("<") or ".py" not in path:
        return False
    return "/torch/" not in path and not path.startswith("torch/") and not _STDLIB.search(path)


def user_frame(frames: Iterable[Frame]) -> Frame | None:
    """Return the innermost frame in the job's own code, or None.

    Args:
        frames: frames as recorded, innermost first.

    Returns:
        The first frame for which :func:`is_user_frame` holds.
    """
    return next((f for f in frames if is_user_frame(f)), None)


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
    groups, notes = _build_groups(by_rank, set(unreadable_ranks))
    blocked = _oldest_pending(groups)
    findings = [f for g in groups if (f := _find(g, blocked)) is not None]
    findings = _resolve_waiting(findings, blocked)
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


@dataclass(slots=True)
class _Progress:
    """One rank's records and counters in one group."""

    enqueued: int
    completed: int
    started: int | None
    by_seq: dict[int, list[FrRecord]]
    p2p: list[FrRecord]


@dataclass(slots=True)
class _Group:
    name: str
    desc: str
    members: tuple[int, ...]
    members_from: str
    dumped: frozenset[int]
    progress: dict[int, _Progress]
    # Ranks whose dump lists unfinished work only (onlyActive) and none in this group: their
    # counters are unknown, but nothing of theirs is pending here.
    silent: frozenset[int]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.desc})" if self.desc else self.name


def _build_groups(
    by_rank: Mapping[int, FrDump], unreadable: set[int]
) -> tuple[list[_Group], list[str]]:
    configs: dict[str, list[PgConfig]] = defaultdict(list)
    for dump in by_rank.values():
        for cfg in dump.pg_config:
            if dump.rank in cfg.ranks:
                configs[cfg.name].append(cfg)
    records: dict[tuple[str, tuple[int, ...] | None], dict[int, list[FrRecord]]] = defaultdict(
        lambda: defaultdict(list)
    )
    descs: dict[str, str] = {}
    for dump in by_rank.values():
        keys: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        for record in dump.entries:
            key = keys.get(record.pg_name)
            if key is None:
                own = _config_for(configs, record.pg_name, dump.rank)
                key = keys[record.pg_name] = (record.pg_name, own.ranks if own else None)
                descs.setdefault(record.pg_name, record.pg_desc)
            records[key][dump.rank].append(record)
    for name, cfgs in configs.items():
        for cfg in cfgs:
            records.setdefault((name, cfg.ranks), defaultdict(list))
            descs.setdefault(name, cfg.desc)
    world = set(by_rank) | unreadable
    world |= set(range(max(world) + 1)) if world else set()
    inferred_groups: list[str] = []
    groups: list[_Group] = []
    for (name, ranks), per_rank in sorted(records.items(), key=lambda kv: _name_key(kv[0][0])):
        desc = descs.get(name, "")
        if ranks is not None:
            members, source = tuple(sorted(ranks)), "pg_config"
        else:
            inferred = set(per_rank)
            if name in _DEFAULT_PG_NAMES or desc == "default_pg":
                inferred |= world
            members, source = tuple(sorted(inferred)), "records"
            inferred_groups.append(f"{name} ({format_ranks(members)})")
        hint = Counter(r.pg_id for rs in per_rank.values() for r in rs).most_common(1)
        p2p_group = any(r.is_p2p for rs in per_rank.values() for r in rs)
        progress: dict[int, _Progress] = {}
        for rank in members:
            if rank in by_rank:
                p = _progress(
                    by_rank[rank], per_rank.get(rank, []), hint[0][0] if hint else None, p2p_group
                )
                if p is not None:
                    progress[rank] = p
        dumped = frozenset(r for r in members if r in by_rank)
        silent = frozenset(r for r in dumped - set(progress) if by_rank[r].only_active)
        groups.append(_Group(name, desc, members, source, dumped, progress, silent))
    notes = []
    if inferred_groups:
        notes.append(
            "no dump recorded the members of process groups "
            f"{', '.join(inferred_groups)}: taken from the ranks that have records in them"
        )
    return groups, notes


def _config_for(configs: Mapping[str, list[PgConfig]], name: str, rank: int) -> PgConfig | None:
    return next((c for c in configs.get(name, []) if rank in c.ranks), None)


def _name_key(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _progress(
    dump: FrDump, records: list[FrRecord], pg_id_hint: int | None, p2p_group: bool
) -> _Progress | None:
    """One rank's progress in one group, or None when its dump says nothing about the group."""
    by_seq: dict[int, list[FrRecord]] = defaultdict(list)
    p2p: list[FrRecord] = []
    for record in records:
        if record.is_p2p:
            p2p.append(record)
        else:
            by_seq[record.collective_seq_id].append(record)
    # pg_status is keyed by the rank's own process-group id; a rank with no record in the
    # group takes the id the other members use (groups are created in the same order).
    ids = {r.pg_id for r in records}
    pg_id = (ids.pop() if len(ids) == 1 else None) if records else pg_id_hint
    status = dump.pg_status.get(str(pg_id)) if pg_id is not None else None
    if p2p_group:
        # pg_status counts the last work of any kind, so in a group that also carries
        # send/recv its numbers may be point-to-point sequence numbers, on every member.
        status = None
    if not records and status is None:
        if dump.only_active or dump.dropped_entries:
            return None
        return _Progress(0, 0, None, {}, [])
    seqs = list(by_seq)
    pending = [s for s, rs in by_seq.items() if not all(r.finished for r in rs)]
    enqueued = max(
        [*seqs, *(r.collective_seq_id for r in p2p), status.last_enqueued if status else 0, 0]
    )
    done = [s for s in seqs if s not in pending]
    done.append(status.last_completed if status else 0)
    if dump.only_active:
        # A dump of unfinished entries only: every collective it does not list has finished.
        done.append(min(pending) - 1 if pending else enqueued)
    elif seqs and dump.dropped_entries:
        # The ring buffer overwrote the oldest entries: those had finished long ago.
        done.append(min(seqs) - 1)
    completed = min(max(done), enqueued)
    started_seqs = [
        s
        for s, rs in by_seq.items()
        if any(r.state is not RecordState.SCHEDULED or r.time_started_ns for r in rs)
    ]
    timing = bool(started_seqs) and any(r.time_started_ns for rs in by_seq.values() for r in rs)
    if status and status.last_started >= 0:
        timing = True
    started = (
        max([*started_seqs, status.last_started if status else 0, completed]) if timing else None
    )
    return _Progress(enqueued, completed, started, dict(by_seq), p2p)


def _oldest_pending(groups: Sequence[_Group]) -> dict[int, tuple[str, int, bool]]:
    """Map each rank with unfinished work to where its oldest unfinished op is.

    Returns:
        rank -> (group label, sequence number, is point-to-point).
    """
    best: dict[int, tuple[int, tuple[str, int, bool]]] = {}
    for group in groups:
        for rank, p in group.progress.items():
            candidates: list[tuple[int, tuple[str, int, bool]]] = []
            if p.enqueued > p.completed:
                seq = p.completed + 1
                recs = p.by_seq.get(seq)
                order = min(r.record_id for r in recs) if recs else -1
                candidates.append((order, (group.label, seq, False)))
            candidates.extend(
                (r.record_id, (group.label, r.p2p_seq_id, True)) for r in p.p2p if not r.finished
            )
            for candidate in candidates:
                if rank not in best or candidate[0] < best[rank][0]:
                    best[rank] = candidate
    return {rank: where for rank, (_, where) in best.items()}


def _signature(records: Sequence[FrRecord]) -> tuple[object, ...]:
    return tuple(
        _op_signature(r.base_op, r.input_sizes, r.output_sizes, r.input_dtypes, r.output_dtypes)
        for r in records
    )


@functools.lru_cache(maxsize=4096)
def _op_signature(
    op: str,
    input_sizes: tuple[tuple[int, ...], ...],
    output_sizes: tuple[tuple[int, ...], ...],
    input_dtypes: tuple[str, ...],
    output_dtypes: tuple[str, ...],
) -> tuple[object, ...]:
    """What must agree across members for one op (sizes of uneven collectives may differ)."""
    return (
        op,
        None if any(k in op for k in _UNEVEN_INPUT) else input_sizes,
        None if any(k in op for k in _UNEVEN_OUTPUT) else output_sizes,
        input_dtypes if input_sizes and "scatter" not in op else None,
        output_dtypes if output_sizes and "gather" not in op else None,
    )


def _first_mismatch(
    group: _Group, last: int
) -> tuple[int, dict[tuple[object, ...], list[int]]] | None:
    seqs = sorted({s for p in group.progress.values() for s in p.by_seq if s <= last})
    for seq in seqs:
        classes: dict[tuple[object, ...], list[int]] = defaultdict(list)
        for rank, p in group.progress.items():
            recs = p.by_seq.get(seq)
            if recs:
                classes[_signature(recs)].append(rank)
        if len(classes) > 1:
            return seq, classes
    return None


def _find(group: _Group, blocked: Mapping[int, tuple[str, int, bool]]) -> GroupFinding | None:
    prog = group.progress
    if not prog:
        return None
    seq = min(p.completed for p in prog.values()) + 1
    reached = [r for r, p in prog.items() if p.enqueued >= seq]
    max_enq = max(p.enqueued for p in prog.values())
    mismatch = _first_mismatch(group, seq if reached else max_enq)
    if mismatch is not None:
        return _mismatch_finding(group, *mismatch)
    if reached:
        return _hang_finding(group, seq, reached, blocked)
    return _p2p_finding(group, blocked)


def _majority(group: _Group, seq: int) -> FrRecord | None:
    recs = [p.by_seq[seq][0] for p in group.progress.values() if p.by_seq.get(seq)]
    if not recs:
        return None
    common, _ = Counter(_signature([r]) for r in recs).most_common(1)[0]
    return next(r for r in recs if _signature([r]) == common)


def _statuses(
    group: _Group,
    seq: int,
    roles: Mapping[int, tuple[str, str]],
    p2p_rows: Mapping[int, FrRecord] | None,
) -> tuple[RankStatus, ...]:
    """One row per member at collective ``seq``; for a send/recv, only its two sides."""
    rows: list[RankStatus] = []
    ranks = group.members if p2p_rows is None else sorted({*p2p_rows, *roles})
    for rank in ranks:
        p = group.progress.get(rank)
        role, note = roles.get(rank, ("ok", ""))
        if p is None:
            has_dump = rank in group.dumped
            if rank not in roles:
                role, note = ("unknown", "no record of this group") if has_dump else ("no_dump", "")
            rows.append(RankStatus(rank, has_dump, None, None, None, None, role, note))
            continue
        if p2p_rows is not None:
            record = p2p_rows.get(rank)
        else:
            record = p.by_seq[seq][0] if p.by_seq.get(seq) else None
        rows.append(RankStatus(rank, True, p.enqueued, p.started, p.completed, record, role, note))
    return tuple(rows)


def _make(
    group: _Group,
    kind: FindingKind,
    seq: int,
    ref: FrRecord | None,
    *,
    missing: Sequence[int] = (),
    mismatch: Sequence[int] = (),
    suspects: Sequence[int] = (),
    waiting: Mapping[int, str] | None = None,
    roles: Mapping[int, tuple[str, str]],
    summary: str,
    p2p_rows: Mapping[int, FrRecord] | None = None,
) -> GroupFinding:
    return GroupFinding(
        pg_name=group.name,
        pg_desc=group.desc,
        members=group.members,
        members_from=group.members_from,
        kind=kind,
        seq=seq,
        p2p=p2p_rows is not None,
        op=ref.op if ref else "?",
        input_sizes=ref.input_sizes if ref else (),
        output_sizes=ref.output_sizes if ref else (),
        input_dtypes=ref.input_dtypes if ref else (),
        output_dtypes=ref.output_dtypes if ref else (),
        missing_ranks=tuple(sorted(missing)),
        mismatch_ranks=tuple(sorted(mismatch)),
        suspects=tuple(sorted(suspects)),
        root=bool(suspects),
        waiting_in=dict(waiting or {}),
        ranks=_statuses(group, seq, roles, p2p_rows),
        summary=summary,
    )


def _mismatch_finding(
    group: _Group, seq: int, classes: Mapping[tuple[object, ...], list[int]]
) -> GroupFinding:
    ordered = sorted(classes.values(), key=lambda ranks: (-len(ranks), min(ranks)))
    top = len(ordered[0])
    tied = [ranks for ranks in ordered if len(ranks) == top]
    odd = (
        sorted(r for ranks in ordered for r in ranks)
        if len(tied) > 1
        else sorted(r for ranks in ordered[1:] for r in ranks)
    )
    ref = group.progress[ordered[0][0]].by_seq[seq][0]
    roles = {r: ("mismatch", _describe(group.progress[r].by_seq[seq][0])) for r in odd}
    expected = "no majority" if len(tied) > 1 else f"the others called {_describe(ref)}"
    summary = (
        f"collective #{seq}: rank(s) {format_ranks(odd)} called "
        f"{_describe(group.progress[odd[0]].by_seq[seq][0])}; {expected}"
    )
    return _make(
        group,
        FindingKind.MISMATCH,
        seq,
        ref,
        mismatch=odd,
        suspects=odd,
        roles=roles,
        summary=summary,
    )


def _hang_finding(
    group: _Group, seq: int, reached: Sequence[int], blocked: Mapping[int, tuple[str, int, bool]]
) -> GroupFinding:
    prog = group.progress
    ref = _majority(group, seq)
    what = f"{ref.op if ref else 'collective'} #{seq}"
    # A silent rank would list the collective among its unfinished work had it enqueued it.
    missing = sorted([r for r in prog if r not in reached] + list(group.silent))
    undumped = sorted(set(group.members) - set(prog) - group.silent)
    roles: dict[int, tuple[str, str]] = {
        r: ("no_dump", "no dump") if r not in group.dumped else ("unknown", "no record of group")
        for r in undumped
    }
    if missing:
        idle = [r for r in missing if r not in blocked]
        waiting = {r: _where(blocked[r]) for r in missing if r in blocked}
        for r in missing:
            last = f"#{prog[r].enqueued}" if r in prog else "unknown, nothing unfinished here"
            if r in waiting:
                roles[r] = ("waiting", f"never enqueued it (last {last}); waits in {waiting[r]}")
            else:
                roles[r] = ("missing", f"never enqueued it (last {last}); all its work finished")
        summary = f"{what}: rank(s) {format_ranks(missing)} never enqueued it"
        if waiting and not idle:
            summary += ", waiting on unfinished work in another group"
        return _make(
            group,
            FindingKind.MISSING,
            seq,
            ref,
            missing=missing,
            suspects=idle,
            waiting=waiting,
            roles=roles,
            summary=summary,
        )
    if undumped:
        summary = (
            f"{what}: every rank with a record of the group enqueued it; nothing from "
            f"{format_ranks(undumped)}"
        )
        return _make(
            group, FindingKind.NO_DUMP, seq, ref, suspects=undumped, roles=roles, summary=summary
        )
    done = [r for r in reached if prog[r].completed >= seq]
    started = [r for r in reached if (prog[r].started or 0) >= seq]
    timing = any(prog[r].started is not None for r in reached)
    odd = [r for r in reached if r not in started]
    if done:
        roles.update(dict.fromkeys(done, ("ok", "finished it")))
        kind, odd = FindingKind.INCOMPLETE, [r for r in reached if r not in done]
        summary = f"{what}: finished on {format_ranks(done)}, not on {format_ranks(odd)}"
        note = "enqueued, never finished while others did"
    elif timing and started and odd:
        kind = FindingKind.NOT_STARTED
        summary = f"{what}: started on {format_ranks(started)}, never on {format_ranks(odd)}"
        note = "enqueued, never started while others did"
    else:
        kind, odd = FindingKind.UNDETERMINED, list(reached)
        state = "started" if timing and started else "enqueued"
        summary = f"{what}: {state} on every rank, completed on none"
        note = f"{state}, not completed"
    local = [r for r in odd if blocked.get(r, (group.label, seq, False))[:2] == (group.label, seq)]
    waiting = {r: _where(blocked[r]) for r in odd if r not in local and r in blocked}
    for r in odd:
        roles[r] = (str(kind), note) if r in local else ("waiting", f"waits in {waiting.get(r)}")
    if kind is FindingKind.UNDETERMINED and waiting:
        # Nothing tells the members apart, and some cannot run it before older work elsewhere
        # finishes: that older work holds the collective up, not the members waiting here.
        local = []
        summary += f"; rank(s) {format_ranks(waiting)} first wait elsewhere"
    elif not local:
        summary += "; every such rank has older unfinished work elsewhere"
    return _make(
        group, kind, seq, ref, suspects=local, waiting=waiting, roles=roles, summary=summary
    )


def _p2p_finding(
    group: _Group, blocked: Mapping[int, tuple[str, int, bool]]
) -> GroupFinding | None:
    """Find the send/recv that holds a group up.

    First a pending op whose peer never posted the matching one (or left nothing about the
    group); else the oldest op posted on both sides and finished on neither. Its sides are
    suspects only when it is the oldest unfinished work of both: a side that first waits for
    older work elsewhere explains it.
    """
    members = group.members
    pairs: list[tuple[int, int, FrRecord, FrRecord]] = []
    for rank, p in sorted(group.progress.items()):
        for record in p.p2p:
            local_peer = record.peer
            if record.finished or local_peer is None or local_peer >= len(members):
                continue
            peer = members[local_peer]
            want = "recv" if record.base_op == "send" else "send"
            where = f"{record.op} (p2p #{record.p2p_seq_id}) on rank {rank}"
            peer_prog = group.progress.get(peer)
            rows = {rank: record}
            if peer_prog is None and peer not in group.silent:
                return _make(
                    group,
                    FindingKind.NO_DUMP,
                    record.p2p_seq_id,
                    record,
                    suspects=[peer],
                    roles={peer: ("no_dump", "no record of the group")},
                    summary=f"{where}: peer {peer} left nothing about this group",
                    p2p_rows=rows,
                )
            me = members.index(rank)
            match = next(
                (
                    q
                    for q in (peer_prog.p2p if peer_prog else [])
                    if q.base_op == want and q.peer == me and not q.finished
                ),
                None,
            )
            if match is not None:
                pairs.append((record.time_created_ns or record.record_id, rank, record, match))
                continue
            idle = peer not in blocked
            waiting = {} if idle else {peer: _where(blocked[peer])}
            note = f"never posted the matching {want}"
            return _make(
                group,
                FindingKind.MISSING,
                record.p2p_seq_id,
                record,
                missing=[peer],
                suspects=[peer] if idle else [],
                waiting=waiting,
                roles={
                    peer: ("missing", note)
                    if idle
                    else ("waiting", f"{note}; waits in {waiting[peer]}")
                },
                summary=f"{where}: rank {peer} never posted the matching {want}",
                p2p_rows=rows,
            )
    if not pairs:
        return None
    _, rank, record, match = min(pairs, key=lambda item: (item[0], item[1]))
    peer = members[record.peer or 0]
    local = [r for r in (rank, peer) if _waits_here(r, group, blocked)]
    waiting = {r: _where(blocked[r]) for r in (rank, peer) if r not in local and r in blocked}
    roles = {r: ("waiting", f"waits in {where}") for r, where in waiting.items()}
    if waiting:
        # One side cannot run its half before older work elsewhere finishes: the other side
        # only waits for it.
        local = []
    roles.update(dict.fromkeys(local, ("undetermined", "posted, not finished")))
    summary = (
        f"{record.op} (p2p #{record.p2p_seq_id}) between ranks {rank} and {peer}: "
        "posted on both, finished on neither"
    )
    return _make(
        group,
        FindingKind.UNDETERMINED,
        record.p2p_seq_id,
        record,
        suspects=local,
        waiting=waiting,
        roles=roles,
        summary=summary,
        p2p_rows={rank: record, peer: match},
    )


def _waits_here(rank: int, group: _Group, blocked: Mapping[int, tuple[str, int, bool]]) -> bool:
    """True when the rank's oldest unfinished work is a send/recv of this group."""
    where = blocked.get(rank)
    return where is not None and where[0] == group.label and where[2]


def _resolve_waiting(
    findings: list[GroupFinding], blocked: Mapping[int, tuple[str, int, bool]]
) -> list[GroupFinding]:
    """Keep non-root findings only when the groups they wait on lead to a root; else make them root.

    Two groups whose missing ranks wait on each other (ranks calling the groups' collectives in
    different orders) would otherwise explain each other and leave no culprit.
    """
    by_label = {f.label: f for f in findings}

    def leads_to_root(finding: GroupFinding, seen: frozenset[str]) -> bool:
        if finding.root:
            return True
        if finding.label in seen:
            return False
        targets = {blocked[r][0] for r in finding.waiting_in if r in blocked}
        return any(
            t in by_label and leads_to_root(by_label[t], seen | {finding.label}) for t in targets
        )

    resolved: list[GroupFinding] = []
    for f in findings:
        if f.root or leads_to_root(f, frozenset()):
            resolved.append(f)
            continue
        suspects = tuple(sorted(f.missing_ranks or f.waiting_in))
        resolved.append(dataclasses.replace(f, suspects=suspects, root=bool(suspects)))
    return resolved


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
            f for f in findings if f.root and _TIER[f.kind] == tier and not chosen & set(f.suspects)
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
        f" (its last record: {_describe(record)} #{record.collective_seq_id} of group {record.pg_name})"
        if record
        else ""
    )
    if kind is FindingKind.MISSING:
        return f"never enqueued {where} and had no work left on its device{last}"
    if kind is FindingKind.MISMATCH:
        mine = _describe(record) if record else "a different collective"
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
    return (_TIER[finding.kind], bool(finding.waiting_in), -len(finding.members), finding.pg_name)


def _primary(findings: Sequence[GroupFinding], culprits: Sequence[Culprit]) -> GroupFinding | None:
    if culprits:
        first = culprits[0]
        own = [f for f in findings if f.root and first.rank in f.suspects]
        if own:
            return min(own, key=_preference)
    ordered = [f for f in findings if f.root] + [f for f in findings if not f.root]
    return ordered[0] if ordered else None


def _where(blocked: tuple[str, int, bool]) -> str:
    label, seq, p2p = blocked
    return f"group {label} {'p2p ' if p2p else ''}#{seq}"


def _describe(record: FrRecord | None) -> str:
    if record is None:
        return "?"
    sizes = "x".join(str(list(s)) for s in record.input_sizes) or "[]"
    dtypes = ",".join(sorted(set(record.input_dtypes))) or "-"
    return f"{record.op} {sizes} {dtypes}"


def format_ranks(ranks: Iterable[int]) -> str:
    """Write ranks compactly.

    Args:
        ranks: rank numbers, in any order.

    Returns:
        Runs joined by commas: ``0-3,6``.
    """
    values = sorted(set(ranks))
    parts: list[str] = []
    for _, run in itertools.groupby(enumerate(values), key=lambda item: item[1] - item[0]):
        items = [v for _, v in run]
        parts.append(str(items[0]) if len(items) == 1 else f"{items[0]}-{items[-1]}")
    return ",".join(parts)


def _frame_dict(frame: Frame) -> dict[str, Any]:
    return {"name": frame.name, "filename": frame.filename, "line": frame.line}


def _record_dict(record: FrRecord) -> dict[str, Any]:
    return {
        "record_id": record.record_id,
        "pg_id": record.pg_id,
        "pg_name": record.pg_name,
        "pg_desc": record.pg_desc,
        "collective_seq_id": record.collective_seq_id,
        "p2p_seq_id": record.p2p_seq_id,
        "op": record.op,
        "is_p2p": record.is_p2p,
        "input_sizes": [list(s) for s in record.input_sizes],
        "output_sizes": [list(s) for s in record.output_sizes],
        "input_dtypes": list(record.input_dtypes),
        "output_dtypes": list(record.output_dtypes),
        "state": str(record.state),
        "time_created_ns": record.time_created_ns,
        "time_started_ns": record.time_started_ns,
        "time_completed_ns": record.time_completed_ns,
    }

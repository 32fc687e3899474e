"""The process groups of a job, as its dumps show them, and each rank's progress in each.

Input: the dumps of one job by rank. Output: groups with their members and every member's
records and counters (enqueued, started, finished), and each rank's oldest unfinished op.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nccl_triage.flightrec.records import FrDump, FrRecord, PgConfig, RecordState
from nccl_triage.model.ranks import format_ranks

# Collectives whose per-rank sizes legitimately differ (splits, root-only buffers).
_UNEVEN_INPUT = ("all_to_all", "scatter", "_v", "alltoall")
_UNEVEN_OUTPUT = ("all_to_all", "gather", "_v", "alltoall")

_DEFAULT_PG_NAMES = ("0",)


@dataclass(slots=True)
class _Progress:
    """One rank's records and counters in one group."""

    enqueued: int
    completed: int
    started: int | None
    by_seq: dict[int, list[FrRecord]]
    p2p: list[FrRecord]


@dataclass(slots=True)
class Group:
    """One process group: its members and every member's progress in it."""

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
        """The group's name, and its description when it has one: ``3 (tp_2_3)``."""
        return f"{self.name} ({self.desc})" if self.desc else self.name


# the most ranks a job is taken to have: the ranks below the highest dump are its members
MAX_WORLD = 1 << 20


def build_groups(
    by_rank: Mapping[int, FrDump], unreadable: set[int]
) -> tuple[list[Group], list[str]]:
    """The process groups of a job and their members, and notes on what the dumps lack."""
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
    if world and max(world) < MAX_WORLD:  # a rank number past any job's size is not filled in
        world |= set(range(max(world) + 1))
    inferred_groups: list[str] = []
    groups: list[Group] = []
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
        groups.append(Group(name, desc, members, source, dumped, progress, silent))
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


def oldest_pending(groups: Sequence[Group]) -> dict[int, tuple[str, int, bool]]:
    """Per rank, its oldest unfinished op: (group label, sequence number, point-to-point)."""
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


def signature(records: Sequence[FrRecord]) -> tuple[object, ...]:
    """What must match across ranks for one collective: the op, sizes and dtypes."""
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


def first_mismatch(
    group: Group, last: int
) -> tuple[int, dict[tuple[object, ...], list[int]]] | None:
    """The first sequence number at which members recorded different collectives."""
    seqs = sorted({s for p in group.progress.values() for s in p.by_seq if s <= last})
    for seq in seqs:
        classes: dict[tuple[object, ...], list[int]] = defaultdict(list)
        for rank, p in group.progress.items():
            recs = p.by_seq.get(seq)
            if recs:
                classes[signature(recs)].append(rank)
        if len(classes) > 1:
            return seq, classes
    return None

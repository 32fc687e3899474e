"""What the analysis says: the culprits, their side, the stuck collective of each group.

Input: nothing (plain data, built by :mod:`~nccl_triage.flightrec.analysis`). Output: the
frozen dataclasses of an :class:`FrAnalysis`, their JSON form, and the user frame of a stack.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from nccl_triage.flightrec.records import Frame, FrRecord

_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?/(?!site-packages/|dist-packages/)")


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


# Roles of a stuck group's members that never enqueued its stuck collective.
_NOT_REACHED = frozenset({"missing", "waiting", "no_dump", "unknown"})

TIER = {
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
            ``fr_*`` keys, each a field of the job facts: the culprits and their side, the
            kind of the stuck collective and its group, op, number, sizes and dtypes, the
            ranks that reached it, the missing and mismatched ranks, the culprit's user frame, counts of dumps
            and stuck groups.
        """
        stuck = self.stuck
        frame = self.user_frame
        first = self.culprits[0] if self.culprits else None
        # the members that enqueued the stuck collective (those missing from it did not)
        reached = [s.rank for s in stuck.ranks if s.role not in _NOT_REACHED] if stuck else []
        return {
            "fr_culprit_ranks": list(self.culprit_ranks),
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
            "fr_stuck_sizes": sizes_text(stuck.input_sizes) if stuck else None,
            "fr_stuck_dtypes": ",".join(sorted(set(stuck.input_dtypes))) or None if stuck else None,
            "fr_reached_ranks": reached,
            "fr_missing_ranks": sorted({r for g in self.groups if g.root for r in g.missing_ranks}),
            "fr_mismatch_ranks": sorted({r for g in self.groups for r in g.mismatch_ranks}),
            "fr_reason": first.reason if first else None,
            "fr_culprit_op": describe(first.record) if first and first.record else None,
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


def sizes_text(sizes: Iterable[Iterable[int]]) -> str:
    """Tensor sizes for people: ``[8]``, ``[1024, 4096]x[8]``; ``[]`` for none."""
    return "x".join(str(list(s)) for s in sizes) or "[]"


def describe(record: FrRecord | None) -> str:
    """One record for people: the op, its input sizes and dtypes."""
    if record is None:
        return "?"
    sizes = sizes_text(record.input_sizes)
    dtypes = ",".join(sorted(set(record.input_dtypes))) or "-"
    return f"{record.op} {sizes} {dtypes}"


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

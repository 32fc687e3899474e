"""Flight-recorder dumps as plain, typed data: records, frames, process groups, one dump.

Input: nothing (this module does no I/O). Output: the frozen dataclasses that
:mod:`~nccl_triage.flightrec.reader` builds and :mod:`~nccl_triage.flightrec.analysis` reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

_INT_TEXT = re.compile(r"-?[0-9]{1,19}")


class RecordState(StrEnum):
    """Where a collective was when the dump was taken, as the flight recorder saw it."""

    SCHEDULED = "scheduled"
    STARTED = "started"
    COMPLETED = "completed"


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python stack frame captured when the collective was enqueued."""

    name: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} in {self.name}"


@dataclass(frozen=True, slots=True)
class FrRecord:
    """One flight-recorder entry: a collective or point-to-point op as enqueued on one rank.

    ``op`` is the profiling name without its backend (``all_reduce``, ``send 0->1``);
    ``peer`` is the other side of a send/recv as a rank of the process group (not global).
    Times are nanoseconds since the epoch on the dumping host, None when not recorded.
    """

    record_id: int
    pg_id: int
    pg_name: str
    pg_desc: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    backend: str
    op: str
    is_p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    state: RecordState
    retired: bool
    time_created_ns: int | None
    time_started_ns: int | None
    time_completed_ns: int | None
    timeout_ms: int | None
    duration_ms: float | None
    frames: tuple[Frame, ...]

    @property
    def base_op(self) -> str:
        """The op's name without its peer (``send 0->1`` -> ``send``)."""
        return self.op.split(" ", 1)[0]

    @property
    def peer(self) -> int | None:
        """The group rank on the other side of a send or recv, else None."""
        parts = self.op.split(" ", 1)
        if len(parts) != 2:
            return None
        if parts[0] == "send" and "->" in parts[1]:
            text = parts[1].split("->", 1)[1]
        elif parts[0] == "recv" and "<-" in parts[1]:
            text = parts[1].split("<-", 1)[1]
        else:
            return None
        return int(text) if _INT_TEXT.fullmatch(text.strip()) else None

    @property
    def completed(self) -> bool:
        """True when the recorder saw this op finish on the device."""
        return self.state is RecordState.COMPLETED

    @property
    def finished(self) -> bool:
        """True when the op is over: completed, or retired.

        Gloo retires finished work but leaves its state at ``scheduled``.
        """
        return self.completed or self.retired


@dataclass(frozen=True, slots=True)
class PgConfig:
    """A process group as one rank recorded it: its name, description and global member ranks."""

    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PgStatus:
    """A process group's progress counters on one rank (-1 when the counter is not kept)."""

    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass(frozen=True, slots=True)
class FrDump:
    """The flight-recorder dump of one rank."""

    path: str
    rank: int
    version: str
    format: str
    comm_lib_version: str
    pg_config: tuple[PgConfig, ...]
    pg_status: Mapping[str, PgStatus]
    entries: tuple[FrRecord, ...]
    skipped_entries: int

    @property
    def only_active(self) -> bool:
        """True for a dump of unfinished entries only (``onlyActive``, as watchdogs dump).

        Such a dump lists no completed or retired entry, and its first record id is past 0.
        """
        if any(e.finished for e in self.entries):
            return False
        return not self.entries or self.entries[0].record_id > 0

    @property
    def dropped_entries(self) -> int:
        """How many older entries the ring buffer had already overwritten (0 when none)."""
        return self.entries[0].record_id if self.entries else 0


@dataclass(frozen=True, slots=True)
class FrLoad:
    """What :func:`load_dumps` read: the dumps, one line per problem, ranks of unreadable files."""

    dumps: tuple[FrDump, ...]
    problems: tuple[str, ...]
    unreadable_ranks: tuple[int, ...]

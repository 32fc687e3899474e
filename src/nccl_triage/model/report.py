"""What triage says about an input: job facts, the engine's reasoning, and the report.

Input: nothing (this module does no I/O). Output: the dataclasses a :class:`Report` is made
of; :mod:`nccl_triage.render` turns a report into text, markdown or JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nccl_triage.model.events import Event
from nccl_triage.model.rules import Finding, Rule

if TYPE_CHECKING:
    # Plain frozen data built by flightrec/, which sits above this package.
    from nccl_triage.flightrec.job import FlightRecorder

SCHEMA = "nccl-triage/1.1"  # 1.1: flight_recorder, the fr_* facts, rank_activity and more

# NumelIn/NumelOut count elements, not bytes, and the dtype is not in the line. Mixed-precision
# training moves bf16/fp16 (2 bytes) in its big collectives; that is what the estimate assumes.
ASSUMED_DTYPE = "bf16/fp16"
ASSUMED_ELEMENT_BYTES = 2
UNSET_NUMEL = 18446744073709551615  # COALESCED in 2.2-2.4 prints -1 as an unsigned 64-bit value


@dataclass
class JobFacts:
    """What the log shows about the job as a whole."""

    world_size: int | None = None
    ranks_seen: list[int] = field(default_factory=list)
    ranks_timed_out: list[int] = field(default_factory=list)
    ranks_not_timed_out: list[int] = field(default_factory=list)
    ranks_unseen: list[int] = field(default_factory=list)  # of those, never in the log at all
    timeouts: int = 0
    op_types: list[str] = field(default_factory=list)
    min_seq: int | None = None
    max_seq: int | None = None
    seq_spread: int = 0  # max - min SeqNum over the timed-out works of one process group
    last_completed: dict[int, int] = field(default_factory=dict)
    last_seq: dict[int, int] = field(default_factory=dict)  # per rank: the SeqNum it timed out in
    furthest_behind: list[int] = field(default_factory=list)
    mismatched_collective: bool = False  # same SeqNum, different op or size
    mismatch: list[dict[str, Any]] = field(default_factory=list)
    out_of_step: bool = False  # ranks issued different numbers of collectives
    late_ranks: list[int] = field(default_factory=list)  # one behind, the others completed it
    desync: bool = False  # mismatched_collective or out_of_step
    crashed_rank: int | None = None  # the first rank that failed of its own accord
    crash_kind: str | None = None  # exception | oom | gpu
    crash_line: int | None = None
    crash_text: str | None = None
    culprit_ranks: list[int] = field(default_factory=list)  # most likely at fault, first first
    # processes (ranks, or host:pid where no rank is printed) that report a device-level CUDA
    # error (an illegal memory access or instruction, a misaligned address): one is a GPU that
    # failed, every one is more often a kernel, a library or a build that fails everywhere
    device_error_processes: int = 0
    timeout_ms: int | None = None
    ran_for_ms: int | None = None
    max_numel: int | None = None
    max_bytes: int | None = None
    assumed_dtype: str = ASSUMED_DTYPE
    first_failure_rank: int | None = None
    first_failure_exit_code: int | None = None
    first_failure_signal: str | None = None
    nccl_versions: list[str] = field(default_factory=list)
    failed_ranks: list[int] = field(default_factory=list)
    # what each rank printed last, culprits first: {rank, timed_out, line, text, progress}
    # (progress: its last bar or counter, {desc, n, total, percent, elapsed_s, line})
    rank_activity: list[dict[str, Any]] = field(default_factory=list)
    # What the job's flight-recorder dumps say (triage --fr, dumps beside a job in batch);
    # empty, 0 or None without dumps. Culprits: ranks that never enqueued the stuck collective
    # (CPU side) or whose device never finished it while others did (GPU side).
    fr_dumps: int = 0  # dumps read
    fr_hung: bool = False  # a process group is stuck (or its members disagree) per the dumps
    fr_culprit_ranks: list[int] = field(default_factory=list)  # also lead culprit_ranks
    fr_side: str | None = None  # cpu | gpu, when the culprits share one
    fr_cpu_ranks: list[int] = field(default_factory=list)
    fr_gpu_ranks: list[int] = field(default_factory=list)
    fr_kind: str | None = None  # missing | mismatch | incomplete | not_started | no_dump | ...
    fr_stuck_pg: str | None = None  # the stuck collective's process group (name)
    fr_stuck_pg_desc: str | None = None  # its description (default_pg, tp_2_3)
    fr_stuck_op: str | None = None  # all_reduce, _allgather_base, send 0->1 ...
    fr_stuck_seq: int | None = None  # its collective number (the log's SeqNum)
    fr_stuck_p2p: bool | None = None
    fr_stuck_sizes: str | None = None  # input sizes: "[8]", "[1024, 4096]x[8]"
    fr_stuck_dtypes: str | None = None  # "Float", "BFloat16"
    fr_reached_ranks: list[int] = field(default_factory=list)  # members that enqueued it
    fr_missing_ranks: list[int] = field(default_factory=list)  # members that never did
    fr_mismatch_ranks: list[int] = field(default_factory=list)
    fr_reason: str | None = None  # why the dumps blame the first culprit, in one sentence
    fr_culprit_op: str | None = None  # its record quoted: "broadcast [4] Float"
    fr_frame: str | None = None  # the first culprit's last user frame: "file:line in function"
    fr_frame_file: str | None = None
    fr_frame_line: int | None = None
    fr_frame_function: str | None = None
    fr_stuck_groups: int = 0
    fr_ranks_without_dump: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the facts as plain data (for templates, JSON and rule conditions).

        A copy: lists and mappings are new (as ``dataclasses.asdict`` gives them, at a tenth
        of its cost: a batch asks for them once per job).
        """
        out = {name: _plain(getattr(self, name)) for name in _FACT_NAMES}
        out["last_completed"] = {str(k): v for k, v in self.last_completed.items()}
        out["last_seq"] = {str(k): v for k, v in self.last_seq.items()}
        return out


_FACT_NAMES = tuple(JobFacts.__dataclass_fields__)


def _plain(value: Any) -> Any:
    """``value`` with its lists, tuples and mappings copied (scalars are immutable)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


@dataclass
class Unparsed:
    """A candidate line that the grammar could not read."""

    line: int
    text: str


@dataclass
class Explanation:
    """Why a rule did or did not fire (``--explain``)."""

    rule: Rule
    fired: bool
    reason: str
    finding: Finding | None = None  # kept even when an "unknown" finding is left out of the report


@dataclass
class Correlation:
    """The engine's answer: findings in order, and the reasoning for every rule."""

    findings: list[Finding] = field(default_factory=list)
    explanations: list[Explanation] = field(default_factory=list)


@dataclass
class Report:
    """What triage found in one input (a log file, or one job made of per-rank files)."""

    source: str
    verdict: str  # clean | nccl_timeout | nccl_error
    findings: list[Finding]
    events: list[Event]  # grammar events, deduplicated
    signals: list[Event]  # context signal events
    facts: JobFacts
    lines: int = 0
    unparsed: list[Unparsed] = field(default_factory=list)
    correlation: Correlation | None = None
    notes: list[str] = field(default_factory=list)  # about the input: empty, binary, skipped
    flight_recorder: FlightRecorder | None = None  # the job's dumps, when some were given

    def culprit(self) -> tuple[int | None, Event | None]:
        """The rank most likely at fault, and the line that shows it.

        The top diagnosis's evidence names it when it can (a rank that did not time out: the
        one saving, crashing, out of memory); else the facts do (the rank that failed of its
        own accord, a rank the log shows not timing out, the furthest behind). A rank the log
        never shows is never a culprit: nothing says what it did. Flight-recorder dumps say
        it directly: a rank they blame is the culprit, quoted by the top diagnosis's evidence
        on that rank when there is some.
        """
        timed_out = set(self.facts.ranks_timed_out)
        top = self.findings[0] if self.findings else None
        line = top.evidence[0] if top and top.evidence else None
        blamed = self.facts.fr_culprit_ranks
        if blamed:
            shown = next((ev for ev in top.evidence if ev.rank in blamed), None) if top else None
            return (shown.rank, shown) if shown is not None else (blamed[0], line)
        if top is not None:
            for ev in top.evidence:
                if ev.rank is not None and ev.rank not in timed_out:
                    return ev.rank, ev
        if self.facts.crashed_rank is not None:
            return self.facts.crashed_rank, line
        if len(self.facts.culprit_ranks) == 1:  # several: the log does not single one out
            return self.facts.culprit_ranks[0], line
        if not timed_out and self.facts.first_failure_rank is not None:
            return self.facts.first_failure_rank, line
        return None, line

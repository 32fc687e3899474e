"""PyTorch flight-recorder dumps: read them, find the ranks that hung the job, render the result.

Input: per-rank dump files (pickle or JSON). Output: :class:`FrAnalysis` (culprit ranks, CPU or
GPU side, the stuck collective per process group, the culprits' user frames, ``facts()`` for
the rule engine), text or JSON renderings, and the ``fr`` click command in ``cli``.
"""

from __future__ import annotations

from nccl_triage.flightrec.analysis import analyse
from nccl_triage.flightrec.reader import load_dumps, parse_dump, read_dump
from nccl_triage.flightrec.records import (
    Frame,
    FrDump,
    FrLoad,
    FrRecord,
    PgConfig,
    PgStatus,
    RecordState,
)
from nccl_triage.flightrec.result import (
    Culprit,
    FindingKind,
    FrAnalysis,
    GroupFinding,
    RankStatus,
    Side,
)

__all__ = [
    "Culprit",
    "FindingKind",
    "FrAnalysis",
    "FrDump",
    "FrLoad",
    "FrRecord",
    "Frame",
    "GroupFinding",
    "PgConfig",
    "PgStatus",
    "RankStatus",
    "RecordState",
    "Side",
    "analyse",
    "load_dumps",
    "parse_dump",
    "read_dump",
]

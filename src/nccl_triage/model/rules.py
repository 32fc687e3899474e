"""Rules and findings: what rule and signal files say, and what a rule that fired found.

Input: nothing (this module does no I/O; :mod:`nccl_triage.ruleset` builds these from YAML).
Output: frozen dataclasses for rules, signals, clauses and conditions, and :class:`Finding`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nccl_triage.model.events import Event


class Severity(StrEnum):
    """How bad a diagnosis is (a rule's ``severity``)."""

    INFO = "info"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Location:
    """Where a rule or signal was defined, for error messages."""

    source: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line}"


@dataclass(frozen=True, slots=True)
class Pattern:
    """One regular expression of a signal (RE2 syntax: linear time, no backreferences)."""

    name: str
    regex: str
    anchors: tuple[str, ...] = ()  # literals that every match contains, for the chunk scan
    on_message: bool = False  # the regex reads the message (prefixes peeled), not the whole line


@dataclass(frozen=True, slots=True)
class LineExample:
    """A real line a signal must recognise (``match``), or a near-miss it must not."""

    line: str
    expect: str  # match | no-match
    source: Location
    origin: str | None = None  # where the line was seen (a thread's URL)


@dataclass(frozen=True, slots=True)
class Signal:
    """A named family of context patterns (``rules/signals/*.yaml``)."""

    id: str
    description: str
    patterns: tuple[Pattern, ...]
    ignore_case: bool
    source: Location
    exclude: tuple[str, ...] = ()  # near-misses: a line matching one is not this signal
    examples: tuple[LineExample, ...] = ()


class Operator(StrEnum):
    """How a condition tests a field (``where:`` and ``facts:``)."""

    EQ = "eq"
    NE = "ne"
    IN = "in"
    GT = "gt"
    GE = "ge"
    LT = "lt"
    LE = "le"
    MATCHES = "matches"  # an RE2 search
    NOT_MATCHES = "not_matches"  # the RE2 search finds nothing (a missing field passes)
    EXISTS = "exists"  # true: the field is set; false: it is not


class Direction(StrEnum):
    """Where a context clause looks, relative to the trigger."""

    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"


@dataclass(frozen=True, slots=True)
class Condition:
    """A test on one field: equality, membership, comparison or an RE2 match."""

    field: str
    op: Operator
    value: Any
    line: int = dataclasses.field(default=0, compare=False)  # where the rule file says it


@dataclass(frozen=True, slots=True)
class Clause:
    """A context clause: an event or signal near the trigger, or its absence."""

    event: str
    where: tuple[Condition, ...] = ()
    lines: int | None = None
    seconds: float | None = None
    direction: Direction = Direction.BEFORE
    present: bool = True
    same_rank: bool = False
    other_rank: bool = False
    name: str | None = None  # templates refer to the evidence by it (``evidence.save``)
    culprit: bool = False  # the event must be on a culprit rank (or on a rank the line hides)
    running: bool = False  # it began before the collective was entered and had not ended
    outside_nccl: bool = False  # not on a line read as NCCL's own error (a crash inside NCCL)
    optional: bool = False  # quoted (and weighed) when present; the rule fires without it
    fr_culprit: bool = False  # on a rank the flight-recorder dumps blame (never without dumps)


@dataclass(frozen=True, slots=True)
class Example:
    """An example log a rule must (``match``) or must not (``no-match``) fire on.

    ``dumps`` are the job's flight-recorder dumps, read with the log (``triage --fr``).
    """

    name: str
    expect: str  # match | no-match
    log: str | None
    file: str | None
    source: Location
    evidence: tuple[str, ...] = ()  # parts of the lines the finding must quote (match only)
    dumps: tuple[str, ...] = ()  # the job's flight-recorder dumps: directories or files
    advice: tuple[str, ...] = ()  # parts the rendered advice must hold (match only)


@dataclass(frozen=True, slots=True)
class Rule:
    """One diagnosis rule (``rules/<id>.yaml``)."""

    id: str
    title: str
    cause: str
    severity: Severity
    confidence: float
    description: str
    match: Clause
    context: tuple[Clause, ...]
    facts: tuple[Condition, ...]
    advice: str  # template file name in templates/
    references: tuple[str, ...]
    examples: tuple[Example, ...]
    source: Location
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class Weight:
    """How convincing one piece of evidence is, feature by feature (each 0..1)."""

    proximity: float  # how near the trigger it is, in lines or seconds
    timing: float  # it began before the collective was entered (and was still running)
    rank: float  # it is on a rank that did not time out, or failed first
    running: float  # a loop still unfinished when the watchdog fired

    @property
    def score(self) -> float:
        """The evidence's strength: the mean of its features."""
        return round((self.proximity + self.timing + self.rank + self.running) / 4, 3)


@dataclass(slots=True)
class Finding:
    """A rule that fired: its trigger and the context events that made it fire."""

    rule: Rule
    trigger: Event
    evidence: list[Event]
    confidence: float
    specificity: int
    names: dict[str, int] = dataclasses.field(default_factory=dict)  # clause name -> index
    weights: list[Weight] = dataclasses.field(default_factory=list)  # one per evidence event
    prior: float = 0.0  # the rule's own confidence, before the evidence is weighed

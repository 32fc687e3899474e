"""The one pipeline everyone calls: an input and a ruleset in, a :class:`Report` out.

Input: a path (``-`` for stdin, compressed or not) or a string, and a :class:`Ruleset`.
Output: a :class:`Report`: verdict, ordered findings, events, job facts. Rendering is left to
:mod:`nccl_triage.render.core`, so batch runs can skip it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO

from nccl_triage.diagnose.engine import FAILURE_KINDS, Correlation, correlate
from nccl_triage.diagnose.facts import JobFacts, compute_facts
from nccl_triage.diagnose.signals import SignalClassifier, scan_anchors
from nccl_triage.ingest.anchors import ANCHORS
from nccl_triage.ingest.reader import display_name, iter_chunks, open_binary, segments
from nccl_triage.ingest.scan import Candidate, regex_anchor, scan
from nccl_triage.model import Event, Finding, Kind, Line
from nccl_triage.parse.anatomy import peel
from nccl_triage.parse.core import Unparsed, _Parser
from nccl_triage.ruleset.core import Ruleset

SCHEMA = "nccl-triage/1"


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


def verdict_of(events: Iterable[Event]) -> str:
    """``nccl_timeout`` if a collective timed out, ``nccl_error`` for any other NCCL failure."""
    kinds = {e.kind for e in events}
    if Kind.WATCHDOG_TIMEOUT in kinds:
        return "nccl_timeout"
    if kinds & FAILURE_KINDS:
        return "nccl_error"
    return "clean"


class Triage:
    """Incremental triage of one input: feed candidates, then ask for the report."""

    def __init__(self, source: str, ruleset: Ruleset) -> None:
        self.source = source
        self.ruleset = ruleset
        self._parser = _Parser(source)
        self._signals = SignalClassifier(ruleset.signals)
        self.lines = 0

    def feed(self, cand: Candidate) -> None:
        """Take one candidate line: grammar events and signals."""
        self._parser.feed(cand)
        if self.ruleset.signals:
            for seg in segments(cand.raw):
                self._signals.feed(peel(Line(self.source, cand.lineno, seg)))

    def report(self) -> Report:
        """Correlate what was fed so far into a report."""
        return build_report(
            self.source,
            self.ruleset,
            self._parser.dedupe.events(),
            list(self._signals.events),
            self.lines,
            self._parser.unparsed,
        )

    def prune_signals(self, before_line: int, keep: Callable[[Event], bool] | None = None) -> int:
        """Forget signal events that ended before ``before_line``; return how many.

        Live triage calls this so memory stays bounded however long a job runs: no rule looks
        further back than its window. ``keep`` spares old events it returns True for (those
        near a failure already seen, whose diagnosis must not fade).
        """
        events = self._signals.events
        kept = [
            e
            for e in events
            if int(e.detail.get("last_line") or e.line) >= before_line
            or (keep is not None and keep(e))
        ]
        dropped = len(events) - len(kept)
        events[:] = kept
        self._signals.forget_before(before_line)
        return dropped


def build_report(
    source: str,
    ruleset: Ruleset,
    events: list[Event],
    signals: list[Event],
    lines: int,
    unparsed: list[Unparsed],
) -> Report:
    """Compute facts, verdict and findings from parsed events and signal events."""
    everything = sorted([*events, *signals], key=lambda e: (e.source, e.line))
    facts = compute_facts(everything)
    verdict = verdict_of(events)
    correlation = Correlation()
    if verdict != "clean":
        correlation = correlate(everything, facts, ruleset.rules)
    return Report(
        source=source,
        verdict=verdict,
        findings=correlation.findings,
        events=events,
        signals=signals,
        facts=facts,
        lines=lines,
        unparsed=unparsed,
        correlation=correlation,
    )


def scan_patterns(ruleset: Ruleset) -> tuple[str, ...]:
    """Return the anchors of the chunk scan.

    The grammar's literals, the signals' literals, and the signal patterns that have no
    literal anchor (as regular expressions).
    """
    literals, regexes = scan_anchors(ruleset.signals)
    return tuple(dict.fromkeys((*ANCHORS, *literals, *(regex_anchor(r) for r in regexes))))


def triage_path(path: str, ruleset: Ruleset, stdin: IO[bytes] | None = None) -> Report:
    """Triage one input: a path, ``-`` for stdin, plain or compressed."""
    name = display_name(path)
    stats: dict[str, int] = {}
    state = Triage(name, ruleset)
    with open_binary(path, stdin) as fh:
        for cand in scan(iter_chunks(fh), scan_patterns(ruleset), stats):
            state.feed(cand)
    state.lines = stats.get("lines", 0)
    return state.report()


def triage_job(paths: list[str], ruleset: Ruleset, name: str | None = None) -> Report:
    """Triage several files of one job (per-rank logs) as one input, so facts span ranks.

    Line numbers stay per file (every event keeps its ``source``); context windows in lines
    apply within a file, and across files the seconds window applies when both lines carry a
    time (see :mod:`nccl_triage.diagnose.engine`).

    Raises:
        InputError: one of the files cannot be read.
    """
    from nccl_triage.parse.core import Deduper

    dedupe = Deduper()
    signals: list[Event] = []
    unparsed: list[Unparsed] = []
    lines = 0
    parse_only = Ruleset(rules=[], signals=ruleset.signals)
    for path in paths:
        part = triage_path(path, parse_only)
        for ev in part.events:
            dedupe.add(ev)
        signals.extend(part.signals)
        unparsed.extend(part.unparsed)
        lines += part.lines
    source = name or (paths[0] if len(paths) == 1 else f"{len(paths)} files")
    return build_report(source, ruleset, dedupe.events(), signals, lines, unparsed)


def triage_text(text: str, ruleset: Ruleset, source: str = "<text>") -> Report:
    """Triage a log given as a string (rule examples, tests)."""
    stats: dict[str, int] = {}
    state = Triage(source, ruleset)
    for cand in scan([text.encode("utf-8", "surrogateescape")], scan_patterns(ruleset), stats):
        state.feed(cand)
    state.lines = stats.get("lines", 0)
    return state.report()

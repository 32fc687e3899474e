"""The verdict and the report of a job: its events and signals in, a :class:`Report` out.

Input: the events the grammar read, the signal events of the context, the ruleset, and the
job's flight-recorder dumps when it has some. Output: the verdict (``nccl_timeout``,
``nccl_error`` or ``clean``), the job facts and the findings of the rules, in one report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from nccl_triage.diagnose.engine import correlate
from nccl_triage.diagnose.facts import add_dump_facts, compute_facts
from nccl_triage.model import Correlation, Event, Kind, Report, Unparsed, is_failure
from nccl_triage.ruleset import Ruleset

if TYPE_CHECKING:
    from nccl_triage.flightrec.job import FlightRecorder

# NCCL's own log lines: an error they report is the job's failure unless the job went on.
_LIBRARY_LINES = frozenset({Kind.NCCL_WARN, Kind.NCCL_INFO})
TRAINING_PROGRESS = "training_progress"  # the signal of the training loop reporting progress


def verdict_of(events: Iterable[Event], context: Iterable[Event] = ()) -> str:
    """``nccl_timeout`` if a collective timed out, ``nccl_error`` for any other NCCL failure.

    An error that only NCCL's own log lines report (no timeout, no error raised by the
    framework) is no failure of the job when the training loop reported progress after it,
    in the same input: NCCL recovered (a retried connection, a helper thread's allocation).
    """
    failures = [e for e in events if is_failure(e)]
    if any(e.kind == Kind.WATCHDOG_TIMEOUT for e in failures):
        return "nccl_timeout"
    if failures and all(e.kind in _LIBRARY_LINES for e in failures):
        last = {
            src: max(e.line for e in failures if e.source == src)
            for src in {e.source for e in failures}
        }
        went_on = [
            c
            for c in context
            if c.kind == TRAINING_PROGRESS and c.line > last.get(c.source, 1 << 62)
        ]
        if len(went_on) >= 1 and sum(int(c.detail.get("count") or 1) for c in went_on) >= 2:
            return "clean"
    return "nccl_error" if failures else "clean"


def build_report(
    source: str,
    ruleset: Ruleset,
    events: list[Event],
    signals: list[Event],
    lines: int,
    unparsed: list[Unparsed],
    ends: Mapping[str, int] | None = None,
    flight_recorder: FlightRecorder | None = None,
) -> Report:
    """Compute facts, verdict and findings from parsed events and signal events.

    ``ends`` is the number of lines of each input (file of a job); ``flight_recorder`` the
    job's dumps, whose facts join the log's. The verdict is the log's: dumps alone do not make
    a failure (a note says when they show a hang the log does not).
    """
    everything = sorted([*events, *signals], key=lambda e: (e.source, e.line))
    facts = compute_facts(everything)
    if flight_recorder is not None:
        add_dump_facts(facts, flight_recorder.facts())
    verdict = verdict_of(events, signals)
    correlation = Correlation()
    if verdict != "clean" and ruleset.rules:
        correlation = correlate(everything, facts, ruleset.rules, ends)
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
        flight_recorder=flight_recorder,
    )

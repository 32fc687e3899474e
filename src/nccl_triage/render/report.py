"""A report as text for a terminal, Markdown for an issue, or the JSON of the public contract.

Input: a :class:`~nccl_triage.model.Report` and the template directories. Output: strings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nccl_triage.model import SCHEMA, Event, Finding, Kind, Report
from nccl_triage.model.ranks import format_ranks
from nccl_triage.render.advice import advice_or_failure
from nccl_triage.render.text import clip

# ----------------------------------------------------------------------------- formats


def report_json(report: Report, template_dirs: Sequence[Path]) -> dict[str, Any]:
    """The report object of ``docs/json-output.md``."""
    diagnoses = []
    for f in report.findings:
        evidence = [{"line": e.line, "rank": e.rank, "text": e.text} for e in _evidence_events(f)]
        diagnoses.append(
            {
                "rule": f.rule.id,
                "cause": f.rule.cause,
                "severity": f.rule.severity.value,
                "confidence": f.confidence,
                "title": f.rule.title,
                "evidence": evidence,
                "advice": advice_or_failure(f, report.facts, template_dirs),
                "references": list(f.rule.references),
            }
        )
    timeouts = [e for e in report.events if e.kind == Kind.WATCHDOG_TIMEOUT]
    return {
        "schema": SCHEMA,
        "source": report.source,
        "verdict": report.verdict,
        "notes": list(report.notes),
        "diagnoses": diagnoses,
        "events": [e.to_dict() for e in report.events],
        "summary": {
            "lines": report.lines,
            "ranks_seen": report.facts.ranks_seen,
            "ranks_timed_out": report.facts.ranks_timed_out,
            "op_types": report.facts.op_types,
            "first_timeout_line": min((e.line for e in timeouts), default=None),
            "world_size": report.facts.world_size,
            "ranks_not_timed_out": report.facts.ranks_not_timed_out,
            "fr_culprit_ranks": report.facts.fr_culprit_ranks,
            "fr_side": report.facts.fr_side,
        },
        "facts": report.facts.to_dict(),
        "flight_recorder": fr.to_dict() if (fr := report.flight_recorder) is not None else None,
    }


def _evidence_events(f: Finding) -> list[Event]:
    seen: dict[tuple[str, int], Event] = {}
    for ev in (f.trigger, *f.evidence):  # a signal on the trigger's own line is one line
        seen.setdefault((ev.source, ev.line), ev)
    return sorted(seen.values(), key=lambda e: (e.source, e.line))


_COLORS = {"critical": "1;31", "high": "31", "medium": "33", "low": "36", "info": "37"}


def render_text(report: Report, template_dirs: Sequence[Path], color: bool = False) -> str:
    """Human-readable report for a terminal."""

    def paint(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if color else text

    lines: list[str] = []
    notes = [f"   note: {note}" for note in report.notes]
    dumps = [f"   {line}" for line in _dump_lines(report)]
    if report.verdict == "clean":
        lines.append(paint(headline(report), "32"))
        return "\n".join([*lines, *notes, *dumps]) + "\n"
    lines.append(paint(headline(report), "1"))
    lines.extend(notes)
    lines.append(_summary_line(report))
    lines.extend(dumps)
    lines.extend(f"   {row}" for row in activity_lines(report))
    for i, f in enumerate(report.findings, 1):
        sev = f.rule.severity.value
        lines.append("")
        lines.append(
            paint(f"{i}. [{f.rule.cause}] {f.rule.title}", "1")
            + f"  ({sev}, confidence {f.confidence:.2f}, rule {f.rule.id})"
        )
        for ev in _evidence_events(f):
            rank = "" if ev.rank is None else f" rank {ev.rank}"
            text = clip(ev.text)
            lines.append(
                paint(f"   {report.source}:{ev.line}{rank}: ", _COLORS.get(sev, "0")) + text
            )
        lines.append("")
        advice = advice_or_failure(f, report.facts, template_dirs)
        lines.extend("   " + a if a else "" for a in advice.rstrip().splitlines())
    return "\n".join(lines) + "\n"


def headline(report: Report) -> str:
    """The first line: the input, the verdict and, when the log shows one, the likely cause.

    ``job.log: nccl_timeout, likely cause oom_hidden on rank 2 (line 10)``.
    """
    head = f"{report.source}: {report.verdict}"
    if report.verdict == "clean":
        return f"{head} (no NCCL failure in {report.lines} lines)"
    top = report.findings[0] if report.findings else None
    rank, shown = report.culprit()
    if top is None or top.rule.cause == "unknown":
        first = shown or (top.trigger if top else _first_failure(report))
        where = f" (first failure at line {first.line})" if first else ""
        return f"{head}, cause unknown{where}"
    on = f" on rank {rank}" if rank is not None else ""
    line = (shown or top.trigger).line
    return f"{head}, likely cause {top.rule.cause}{on} (line {line})"


def _dump_lines(report: Report) -> list[str]:
    """What the flight-recorder dumps say, in a few lines (none without dumps)."""
    fr = report.flight_recorder
    return fr.summary_lines() if fr is not None else []


def _first_failure(report: Report) -> Event | None:
    from nccl_triage.model import is_failure

    return next((e for e in report.events if is_failure(e)), None)


def _summary_line(report: Report) -> str:
    facts = report.facts
    parts = []
    if facts.culprit_ranks:
        parts.append(f"likely culprit(s): {format_ranks(facts.culprit_ranks)}")
    if facts.timeouts:
        ops = ", ".join(facts.op_types) or "?"
        parts.append(f"{facts.timeouts} timeout(s) in {ops}")
        if facts.ranks_timed_out:
            parts.append(f"ranks timed out: {format_ranks(facts.ranks_timed_out)}")
        shown = [r for r in facts.ranks_not_timed_out if r not in set(facts.ranks_unseen)]
        if shown:
            parts.append(f"did not: {format_ranks(shown)}")
        if facts.ranks_unseen:
            parts.append(f"not in the log: {format_ranks(facts.ranks_unseen)}")
    if facts.world_size:
        parts.append(f"world size {facts.world_size}")
    if facts.first_failure_rank is not None:
        parts.append(
            f"first to die: rank {facts.first_failure_rank} ({facts.first_failure_signal or facts.first_failure_exit_code})"
        )
    return "   " + "; ".join(parts) if parts else ""


ACTIVITY_SHOWN = 6  # ranks in the "last printed" block of text and Markdown reports


def activity_lines(report: Report, width: int = 150) -> list[str]:
    """What each rank printed last (the culprits first), a line each, under a heading."""
    rows = report.facts.rank_activity
    if not rows:
        return []
    out = ["what each rank printed last (culprits first):"]
    for row in rows[:ACTIVITY_SHOWN]:
        who = "the log" if row["rank"] is None else f"rank {row['rank']}"
        state = " (timed out)" if row["timed_out"] else ""
        if row["text"]:
            out.append(clip(f"  {who}{state}, line {row['line']}: {row['text'].strip()}", width))
        bar = row["progress"]
        if bar:
            done = f"{bar['n']}/{bar['total']}" if bar["total"] else f"{bar['n']}"
            pct = f" ({bar['percent']}%)" if bar["percent"] is not None else ""
            after = f" after {_duration(bar['elapsed_s'])}" if bar["elapsed_s"] else ""
            desc = f"{bar['desc']} " if bar["desc"] else ""
            out.append(
                f"  {who}{state}, its last bar (line {bar['line']}): {desc}{done}{pct}{after}"
            )
    if len(rows) > ACTIVITY_SHOWN:
        out.append(
            f"  ... and {len(rows) - ACTIVITY_SHOWN} more (--format json: facts.rank_activity)"
        )
    return out


def _duration(seconds: int) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds} s"


def render_markdown(report: Report, template_dirs: Sequence[Path]) -> str:
    """A report to paste into an issue."""
    out = [f"### nccl-triage: `{headline(report)}`", ""]
    dumps = _dump_lines(report)
    block = ["```", *dumps, "```", ""] if dumps else []
    if report.verdict == "clean":
        out.append(f"No NCCL failure in {report.lines} lines.")
        out += [f"> note: {note}" for note in report.notes]
        out += ["", *block] if block else []
        return "\n".join(out) + "\n"
    summary = _summary_line(report).strip()
    if summary:
        out += [summary, ""]
    out += block
    activity = activity_lines(report)
    if activity:
        out += [activity[0], "", *(f"- {row.strip()}" for row in activity[1:]), ""]
    out += [f"> note: {note}" for note in report.notes] + ([""] if report.notes else [])
    for i, f in enumerate(report.findings, 1):
        out.append(
            f"**{i}. {f.rule.title}** — cause `{f.rule.cause}`, confidence {f.confidence:.2f} (rule `{f.rule.id}`)"
        )
        out.append("")
        out.append("```")
        for ev in _evidence_events(f):
            rank = "" if ev.rank is None else f" rank {ev.rank}"
            out.append(f"{ev.line}{rank}: {ev.text}")
        out.append("```")
        out.append("")
        out.append(advice_or_failure(f, report.facts, template_dirs).rstrip())
        if f.rule.references:
            out.append("")
            out.append("References: " + ", ".join(f.rule.references))
        out.append("")
    return "\n".join(out) + "\n"


def render_json_line(report: Report, template_dirs: Sequence[Path]) -> str:
    """One report as one line of JSON."""
    return json.dumps(report_json(report, template_dirs), ensure_ascii=False)

"""Rules x events x job facts -> findings, most likely first.

Input: the events of one input or job (grammar events and signal events, in line order), its
:class:`JobFacts`, and the rules of a :class:`Ruleset`. Output: :class:`Finding` objects and,
for ``--explain``, why each rule did or did not fire.

A rule fires on its first trigger event (``match``) for which every context clause holds: an
event or signal of the named kind within the window (lines and/or seconds, before, after or
around the trigger, optionally on the same or another rank), or its absence
(``present: false``), and for which the job facts satisfy ``facts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nccl_triage.ingest.regex import compile_regex
from nccl_triage.model import (
    Clause,
    Condition,
    Correlation,
    Direction,
    Event,
    Explanation,
    Finding,
    JobFacts,
    Kind,
    Rule,
    is_failure,
)
from nccl_triage.model.fields import ANY_FAILURE

_TRIGGER_ORDER: dict[str, int] = {Kind.NCCL_WARN: 2}


def correlate(
    events: Sequence[Event],
    facts: JobFacts,
    rules: Iterable[Rule],
    ends: Mapping[str, int] | None = None,
) -> Correlation:
    """Evaluate every rule against the events and facts of one input.

    ``ends`` gives the number of lines of each file of a job: lines of different files are
    compared by their distance from their file's end (the files of one job end together).
    """
    by_kind: dict[str, list[Event]] = {}
    for ev in events:
        by_kind.setdefault(ev.kind, []).append(ev)
        if is_failure(ev):
            by_kind.setdefault(ANY_FAILURE, []).append(ev)
    fact_values = facts.to_dict()
    out = Correlation()
    for rule in rules:
        finding, reason = _evaluate(rule, by_kind, fact_values, ends or {})
        out.explanations.append(Explanation(rule, finding is not None, reason, finding))
        if finding is not None:
            out.findings.append(finding)
    if any(f.rule.cause != "unknown" for f in out.findings):
        out.findings = [f for f in out.findings if f.rule.cause != "unknown"]
    out.findings.sort(key=lambda f: (-f.confidence, -f.specificity, f.trigger.line, f.rule.id))
    return out


def _evaluate(
    rule: Rule, by_kind: dict[str, list[Event]], facts: dict[str, Any], ends: Mapping[str, int]
) -> tuple[Finding | None, str]:
    for cond in rule.facts:
        if not holds(cond, facts.get(cond.field)):
            return None, f"fact {_describe(cond)} does not hold (it is {facts.get(cond.field)!r})"
    triggers = [e for e in by_kind.get(rule.match.event, []) if _all_hold(rule.match.where, e)]
    # For "any failure", the failure itself (a timeout, an exception) is the trigger to quote
    # before the library warnings that accompany it.
    triggers.sort(key=lambda e: (_TRIGGER_ORDER.get(e.kind, 1), e.source, e.line))
    if not triggers:
        what = rule.match.event + (
            " matching " + _describe_all(rule.match.where) if rule.match.where else ""
        )
        return None, f"no {what} event"
    last_reason = ""
    for trigger in triggers:
        evidence: list[Event] = []
        failed = ""
        for i, clause in enumerate(rule.context):
            hits = [
                c for c in by_kind.get(clause.event, []) if _in_context(c, trigger, clause, ends)
            ]
            if clause.present and not hits:
                failed = f"context[{i}]: no {clause.event} {_window(clause)} of line {trigger.line}"
                break
            if not clause.present and hits:
                failed = f"context[{i}]: {clause.event} at line {hits[0].line} rules it out"
                break
            if clause.present:
                evidence.append(_episode_start(hits, trigger, clause))
        if failed:
            last_reason = failed
            continue
        confidence = rule.confidence - (0.05 if trigger.partial else 0.0)
        specificity = (
            sum(1 for c in rule.context if c.present)
            + len(rule.match.where)
            + len(rule.facts)
            + sum(len(c.where) for c in rule.context)
        )
        finding = Finding(rule, trigger, evidence, round(max(confidence, 0.0), 2), specificity)
        return finding, f"fired on line {trigger.line}"
    return None, last_reason


EPISODE_GAP_LINES = 500  # context lines closer than this to each other are one episode


def _episode_start(hits: list[Event], trigger: Event, clause: Clause) -> Event:
    """Pick the context event to quote.

    The nearest one, or for ``before`` clauses the start of the episode it belongs to (the
    first line of a save that printed several): how long before the timeout it began is what
    the advice needs.
    """
    same = sorted((c for c in hits if c.source == trigger.source), key=lambda c: c.line)
    nearest = min(
        hits, key=lambda c: abs(c.line - trigger.line) if c.source == trigger.source else 1 << 60
    )
    if clause.direction != Direction.BEFORE or nearest not in same:
        return nearest
    i = same.index(nearest)
    while i > 0 and same[i].line - same[i - 1].line <= EPISODE_GAP_LINES:
        i -= 1
    return same[i]


def _in_context(c: Event, trigger: Event, clause: Clause, ends: Mapping[str, int]) -> bool:
    if c is trigger:
        return False
    if c.source == trigger.source:
        delta: int | None = c.line - trigger.line
    elif c.ts is not None and trigger.ts is not None:
        delta = None  # another file of the job with times on both lines: the times decide
    elif c.source in ends and trigger.source in ends:
        # Another file (another rank's log) without times: the files of one job end together,
        # so lines compare by their distance from their file's end.
        delta = (ends[trigger.source] - trigger.line) - (ends[c.source] - c.line)
    else:
        return False  # nothing says how far apart they are
    if delta is not None:
        if clause.direction == Direction.BEFORE and delta > 0:
            return False
        if clause.direction == Direction.AFTER and delta < 0:
            return False
        if clause.lines is not None and abs(delta) > clause.lines:
            return False
    elif not _ordered_in_time(c, trigger, clause):
        return False
    return (
        _in_seconds(c, trigger, clause)
        and _rank_ok(c, trigger, clause)
        and _all_hold(clause.where, c)
    )


def _ordered_in_time(c: Event, trigger: Event, clause: Clause) -> bool:
    if c.ts is None or trigger.ts is None:
        return True
    if clause.direction == Direction.BEFORE:
        return c.ts <= trigger.ts
    if clause.direction == Direction.AFTER:
        return c.ts >= trigger.ts
    return True


def _in_seconds(c: Event, trigger: Event, clause: Clause) -> bool:
    if clause.seconds is None or c.ts is None or trigger.ts is None:
        return True
    return abs(trigger.ts - c.ts) <= clause.seconds


def _rank_ok(c: Event, trigger: Event, clause: Clause) -> bool:
    if clause.same_rank and (c.rank is None or trigger.rank is None or c.rank != trigger.rank):
        return False
    return not (
        clause.other_rank and (c.rank is None or trigger.rank is None or c.rank == trigger.rank)
    )


def _all_hold(conditions: Iterable[Condition], ev: Event) -> bool:
    return all(holds(cond, field_value(ev, cond.field)) for cond in conditions)


def field_value(ev: Event, name: str) -> Any:
    """Look a field up on an event: a dataclass attribute, else a ``detail`` entry."""
    if name in ev.__dataclass_fields__ and name not in ("detail", "occurrences"):
        return getattr(ev, name)
    return ev.detail.get(name)


def holds(cond: Condition, value: Any) -> bool:
    """Test one condition against a value (None fails every test but ``exists: false``)."""
    op, want = cond.op, cond.value
    if op == "exists":
        return (value is not None and value != [] and value != "") == bool(want)
    if value is None:
        return op == "ne"
    if op == "eq":
        return bool(value == want)
    if op == "ne":
        return bool(value != want)
    if op == "in":
        return value in want
    if op == "matches":
        return compile_regex(str(want)).search(str(value)) is not None
    if isinstance(value, list | tuple | dict):
        value = len(value)
    if not isinstance(value, int | float):
        return False
    if op == "gt":
        return bool(value > want)
    if op == "ge":
        return bool(value >= want)
    if op == "lt":
        return bool(value < want)
    if op == "le":
        return bool(value <= want)
    return False


def _describe(cond: Condition) -> str:
    return f"{cond.field} {cond.op} {cond.value!r}"


def _describe_all(conds: Iterable[Condition]) -> str:
    return ", ".join(_describe(c) for c in conds)


def _window(clause: Clause) -> str:
    parts = []
    if clause.lines is not None:
        parts.append(f"{clause.lines} lines")
    if clause.seconds is not None:
        parts.append(f"{clause.seconds:g} s")
    within = " within " + " / ".join(parts) if parts else ""
    return f"{clause.direction}{within}"

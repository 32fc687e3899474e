"""Rules x events x job facts -> findings, most likely first.

Input: the events of one input or job (grammar events and signal events, in line order), its
:class:`JobFacts`, and the rules of a :class:`Ruleset`. Output: :class:`Finding` objects and,
for ``--explain``, why each rule did or did not fire.

A rule fires on its first trigger event (``match``) for which every context clause holds: an
event or signal of the named kind within the window (lines and/or seconds, before, after or
around the trigger, optionally on the same or another rank), or its absence
(``present: false``), and for which the job facts satisfy ``facts``.

Flight-recorder dumps, when the job has them, weigh in: evidence on a rank they blame counts
fully, evidence on a rank whose dump shows it reached the stuck collective counts as little
as a rank that timed out (the dumps clear it), and ``fr_culprit`` clauses keep only events
on the blamed ranks. Without dumps nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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
    Weight,
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
    own = frozenset((e.source, e.line) for e in by_kind.get(ANY_FAILURE, []))
    ranks = Ranks.of(fact_values)
    out = Correlation()
    for rule in rules:
        finding, reason = _evaluate(rule, by_kind, fact_values, ends or {}, own, ranks)
        out.explanations.append(Explanation(rule, finding is not None, reason, finding))
        if finding is not None:
            out.findings.append(finding)
    if any(f.rule.cause != "unknown" for f in out.findings):
        out.findings = [f for f in out.findings if f.rule.cause != "unknown"]
    out.findings.sort(key=lambda f: (-f.confidence, -f.specificity, f.trigger.line, f.rule.id))
    return out


MAX_TRIGGERS = 256  # triggers tried per rule (the events are deduplicated: a job has few)


def _evaluate(
    rule: Rule,
    by_kind: dict[str, list[Event]],
    facts: dict[str, Any],
    ends: Mapping[str, int],
    own: frozenset[tuple[str, int]],
    ranks: Ranks,
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
    tried = triggers[:MAX_TRIGGERS]
    first = rule.context[0] if rule.context else None
    if first is not None and first.present and not first.optional and not by_kind.get(first.event):
        # no event of the first clause's kind at all: every trigger fails there (as _try says)
        return None, _missing(0, first, tried[-1])
    best: Finding | None = None
    last_reason = ""
    for trigger in tried:
        finding, reason = _try(rule, trigger, by_kind, ends, ranks, own)
        if finding is None:
            last_reason = reason
        elif best is None or finding.confidence > best.confidence + 0.005:
            best = finding  # (near ties go to the earlier failure: the first is the root)
    if best is None:
        return None, last_reason
    return best, f"fired on line {best.trigger.line}"


@dataclass(frozen=True, slots=True)
class Ranks:
    """What the job facts say about ranks, as evidence is weighed against them."""

    culprits: frozenset[int]  # the log's likely culprits, the dumps' first
    timed_out: frozenset[int]
    blamed: frozenset[int] = frozenset()  # blamed by the flight-recorder dumps
    cleared: frozenset[int] = frozenset()  # their dumps show they reached the stuck collective

    @classmethod
    def of(cls, facts: Mapping[str, Any]) -> Ranks:
        """Read the ranks out of the job facts (plain values)."""
        blamed = frozenset(facts.get("fr_culprit_ranks") or ())
        return cls(
            frozenset(facts.get("culprit_ranks") or ()),
            frozenset(facts.get("ranks_timed_out") or ()),
            blamed,
            frozenset(facts.get("fr_reached_ranks") or ()) - blamed,
        )


def _try(
    rule: Rule,
    trigger: Event,
    by_kind: dict[str, list[Event]],
    ends: Mapping[str, int],
    ranks: Ranks,
    own: frozenset[tuple[str, int]] = frozenset(),
) -> tuple[Finding | None, str]:
    """Try one trigger: ``own`` are the lines of the failures themselves (``outside_nccl``)."""
    evidence: list[Event] = []
    weights: list[Weight] = []
    names: dict[str, int] = {}
    for i, clause in enumerate(rule.context):
        hits = [c for c in by_kind.get(clause.event, []) if _in_context(c, trigger, clause, ends)]
        if clause.culprit:
            hits = [c for c in hits if c.rank is None or c.rank in ranks.culprits]
        if clause.fr_culprit:
            hits = [c for c in hits if c.rank in ranks.blamed]
        if clause.running:
            hits = [c for c in hits if _running(c, trigger) is not False]
        if clause.outside_nccl:
            hits = [c for c in hits if (c.source, c.line) not in own]
        if clause.present and not hits:
            if clause.optional:
                continue
            return None, _missing(i, clause, trigger)
        if not clause.present and hits:
            return None, f"context[{i}]: {clause.event} at line {hits[0].line} rules it out"
        if clause.present:
            scored = [(weigh(c, trigger, ends, ranks), c) for c in hits]
            # the strongest evidence; among near equals, one before the trigger, then the nearest
            weight, hit = max(
                scored,
                key=lambda wc: (
                    round(wc[0].score, 1),
                    _before(wc[1], trigger),
                    -_distance(wc[1], trigger),
                ),
            )
            if clause.name:
                names[clause.name] = len(evidence)
            evidence.append(_episode_start(hits, hit, trigger, clause))
            weights.append(weight)
    strength = sum(w.score for w in weights) / len(weights) if weights else 1.0
    prior = rule.confidence - (0.05 if trigger.partial else 0.0)
    confidence = prior * (0.55 + 0.45 * strength)
    specificity = (
        sum(1 for c in rule.context if c.present)
        + len(rule.match.where)
        + len(rule.facts)
        + sum(len(c.where) for c in rule.context)
    )
    finding = Finding(
        rule,
        trigger,
        evidence,
        round(max(confidence, 0.0), 3),
        specificity,
        names,
        weights,
        prior,
    )
    return finding, f"fired on line {trigger.line}"


EPISODE_GAP_LINES = 500  # context lines closer than this to each other are one episode


def _episode_start(hits: list[Event], best: Event, trigger: Event, clause: Clause) -> Event:
    """Pick the context event to quote: the best one, or the start of its episode.

    For ``before`` clauses, the first line of the episode the best hit belongs to (the first
    line of a save that printed several): how long before the timeout it began is what the
    advice needs.
    """
    if clause.direction != Direction.BEFORE or best.source != trigger.source:
        return best
    same = sorted((c for c in hits if c.source == best.source and c.kind == best.kind), key=_line)
    i = same.index(best) if best in same else 0
    while i > 0 and same[i].line - same[i - 1].line <= EPISODE_GAP_LINES:
        i -= 1
    return same[i] if same else best


def _line(ev: Event) -> int:
    return ev.line


def _before(c: Event, trigger: Event) -> bool:
    return c.source == trigger.source and c.line < trigger.line


def _distance(c: Event, trigger: Event) -> int:
    return abs(c.line - trigger.line) if c.source == trigger.source else 1 << 30


def weigh(c: Event, trigger: Event, ends: Mapping[str, int], ranks: Ranks) -> Weight:
    """How convincing a context event is as evidence for a trigger (see :class:`Weight`)."""
    if c.source == trigger.source:
        gap = trigger.line - _end_line(c)
        # a cause comes before its effects: a line after the trigger counts twice as far
        proximity = 1 / (1 + (gap if gap >= 0 else -2 * gap) / 400)
    elif c.ts is not None and trigger.ts is not None:
        proximity = 1 / (1 + abs(trigger.ts - c.ts) / 900)
    elif c.source in ends and trigger.source in ends:
        gap = (ends[trigger.source] - trigger.line) - (ends[c.source] - _end_line(c))
        proximity = 1 / (1 + abs(gap) / 400)
    else:
        proximity = 0.3
    entered = _entered(trigger)
    began_before = None if entered is None or c.ts is None else c.ts <= entered + 120
    timing = 0.7 if began_before is None else 1.0 if began_before else 0.6
    if c.rank is None:
        rank = 0.7
    elif c.rank in ranks.blamed:
        rank = 1.0
    elif c.rank in ranks.cleared:
        rank = 0.4  # its dump shows it reached the collective the others are stuck in
    elif c.rank in ranks.culprits:
        rank = 1.0
    elif c.rank in ranks.timed_out:
        rank = 0.4
    else:
        rank = 0.6
    state = _running(c, trigger)
    running = 1.0 if state else 0.7 if state is None else 0.5
    return Weight(round(proximity, 3), timing, rank, running)


def _end_line(ev: Event) -> int:
    """The last line of a context event (a run of lines ends later than it starts)."""
    last = ev.detail.get("last_line")
    return last if isinstance(last, int) else ev.line


def _entered(trigger: Event) -> float | None:
    """When the trigger's rank entered the collective (its fire time minus the time waited)."""
    if trigger.ts is None or trigger.ran_for_ms is None:
        return None
    return trigger.ts - trigger.ran_for_ms / 1000


def _running(c: Event, trigger: Event) -> bool | None:
    """Whether a context event was still going on when the trigger fired (None: unknown).

    A progress bar short of its total is still running; any event that began after the
    collective was entered, or whose last line came long before the trigger, is not.
    """
    finished = c.detail.get("finished")
    if finished:
        return False
    elapsed = c.detail.get("elapsed_s")
    if isinstance(elapsed, int) and trigger.ran_for_ms is not None:
        # A loop that kept busy one rank while the others waited went on through the wait: its
        # bar had run at least about as long. One that had run for a fraction of it stopped
        # when the collective did (every rank stuck), long before the watchdog fired.
        return elapsed >= 0.5 * trigger.ran_for_ms / 1000
    if finished is not None:
        return True
    entered = _entered(trigger)
    if entered is not None and c.ts is not None and c.ts > entered + 120:
        return False
    return None


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
        return op in ("ne", "not_matches")
    if op == "eq":
        return bool(value == want)
    if op == "ne":
        return bool(value != want)
    if op == "in":
        return value in want
    if op == "matches":
        return compile_regex(str(want)).search(str(value)) is not None
    if op == "not_matches":
        return compile_regex(str(want)).search(str(value)) is None
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


def _missing(i: int, clause: Clause, trigger: Event) -> str:
    """Why a trigger fails: no event of a clause that must be present."""
    return f"context[{i}]: no {clause.event} {_window(clause)} of line {trigger.line}"


def _window(clause: Clause) -> str:
    parts = []
    if clause.lines is not None:
        parts.append(f"{clause.lines} lines")
    if clause.seconds is not None:
        parts.append(f"{clause.seconds:g} s")
    within = " within " + " / ".join(parts) if parts else ""
    return f"{clause.direction}{within}"

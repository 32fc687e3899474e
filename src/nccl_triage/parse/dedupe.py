"""Deduplication: one event per distinct timeout (rank, work) or message.

Input: events as the grammar makes them, in line order. Output: the same events with repeats
folded in (their lines kept as ``occurrences``, their count in ``repeats``): a timeout seen in
a watchdog line, a status line and a ``what():`` line is one event.
"""

from __future__ import annotations

import re
from typing import Any

from nccl_triage.model import Event, Kind, Occurrence, evolve

MAX_OCCURRENCES = 50  # extra evidence lines kept per event (the count goes on in ``repeats``)

_MERGE_FIELDS = (
    "pg",
    "pg_guid",
    "pg_desc",
    "pg_rank",
    "seq",
    "op_type",
    "numel_in",
    "numel_out",
    "tensor_shape",
    "timeout_ms",
    "ran_for_ms",
    "last_enqueued",
    "last_started",
    "last_completed",
    "host",
    "pid",
    "local_rank",
    "time",
    "ts",
)
_FORM_RANK = {
    "watchdog": 0,
    "blocking_wait": 1,
    "caught": 2,
    "thread_death": 3,
    "aborted": 4,
    "what": 5,
    "timeout_at": 6,
    "exception_detected": 6,
    "failure_detected": 6,
    "desync_timeout_at": 6,
    "dump_signal": 7,
    "damaged": 8,
}
_MASK = re.compile(r"\d+")
# Lines that name a timed-out work but not its sizes or timeout: a timeout of their own is partial.
_STATUS_FORMS = ("timeout_at", "exception_detected", "failure_detected", "desync_timeout_at")


class Deduper:
    """Collapses repeats: one event per distinct timeout (rank, work) or message.

    Events are frozen: folding a repeat in replaces the kept event by a merged copy.
    """

    def __init__(self) -> None:
        self._events: list[Event] = []  # in the order first seen
        self._timeouts: list[int] = []  # indexes into _events
        self._by_seq: dict[int | None, list[int]] = {}
        # the same, per global rank too: a line of rank r can only be a timeout of rank r or of
        # a line that named no rank (512 ranks stuck at one SeqNum are 512 events)
        self._by_seq_rank: dict[tuple[int | None, int | None], list[int]] = {}
        self._others: dict[tuple[Any, ...], int] = {}
        # repeats of _events[i] not folded into it yet (once, when it is next read whole)
        self._repeats: dict[int, list[Event]] = {}

    def add(self, ev: Event) -> None:
        """Keep a new event, or fold it into the one it repeats."""
        if ev.kind in (Kind.WATCHDOG_TIMEOUT, Kind.WATCHDOG_STATUS):
            self._add_timeout(ev)
            return
        if ev.form == "raised_from_watchdog":
            # the C++ trace under a watchdog's death: a line of that event when it was seen
            death = next(
                (
                    i
                    for i in range(len(self._events) - 1, -1, -1)
                    if self._events[i].form == "thread_death"
                    and (ev.rank is None or self._events[i].rank in (None, ev.rank))
                ),
                None,
            )
            if death is not None:
                self._repeats.setdefault(death, []).append(ev)
                return
        key: tuple[Any, ...] = (
            ev.kind,
            ev.rank,
            ev.pg_rank,
            ev.detail.get("form"),
            ev.form,
            _MASK.sub("#", _strip_header(ev.text)),
        )
        if ev.kind == Kind.CHILD_FAILED:
            key = (ev.kind, ev.rank, ev.form, ev.detail.get("exit_code"), ev.pid)
        same = self._others.get(key)
        if same is None:
            self._others[key] = len(self._events)
            self._events.append(ev)
        else:
            self._repeats.setdefault(same, []).append(ev)

    def _fold(self, i: int) -> None:
        """Fold the repeats of ``_events[i]`` seen so far into it."""
        repeats = self._repeats.pop(i, None)
        if repeats:
            self._events[i] = _with_occurrences(self._events[i], repeats)

    def _candidates(self, seq: int | None, rank: int | None) -> list[int]:
        """The timeouts a line of ``seq`` and ``rank`` may be another line of, in input order."""
        if seq is None:
            return self._timeouts
        if rank is None:
            return self._by_seq.get(seq, [])
        own = self._by_seq_rank.get((seq, rank), [])
        unranked = self._by_seq_rank.get((seq, None), [])
        return sorted(own + unranked) if unranked else own

    def _index(self, i: int, seq: int | None) -> None:
        self._by_seq.setdefault(seq, []).append(i)
        self._by_seq_rank.setdefault((seq, self._events[i].rank), []).append(i)

    def _add_timeout(self, ev: Event) -> None:
        events = self._events
        candidates = self._candidates(ev.seq, ev.rank)
        match = next((i for i in candidates if _same_timeout(events[i], ev)), None)
        if match is None and ev.seq is not None:
            unseq = self._by_seq.get(None, [])
            match = next((i for i in unseq if _same_timeout(events[i], ev)), None)
            if match is not None:
                unseq.remove(match)
                self._index(match, ev.seq)
        if match is None:
            # only the work number in a status line: no op type, sizes or timeout
            partial = ev.partial or ev.form in _STATUS_FORMS
            i = len(events)
            events.append(evolve(ev, kind=Kind.WATCHDOG_TIMEOUT, partial=partial))
            self._timeouts.append(i)
            self._index(i, ev.seq)
            return
        self._fold(match)
        before = events[match].rank
        events[match] = _merged_timeout(events[match], ev)
        if events[match].rank != before and events[match].seq is not None:
            # it learnt its rank: lines of that rank find it there too
            self._by_seq_rank.setdefault((events[match].seq, events[match].rank), []).append(match)

    def events(self) -> list[Event]:
        """All events, in input order."""
        for i in list(self._repeats):
            self._fold(i)
        return sorted(self._events, key=lambda e: e.line)


# A c10 or glog header's end: the text up to the first one is dropped
_HEADER_END = re.compile(r"\d\d:\d\d:\d\d\.\d+\s+\S+:\d+\]\s*")
# What every header's end holds, found fast (a literal first): most texts have none
_HEADER_TAIL = re.compile(r":\d+\]")


def _strip_header(text: str) -> str:
    """The text after its first c10/glog header, the text itself without one (one line)."""
    if "]" not in text or _HEADER_TAIL.search(text) is None:
        return text
    m = _HEADER_END.search(text)
    if m is None or "\n" in text[: m.start()]:  # ("^.*?" stops at a newline)
        return text
    return text[m.end() :]


def _same_timeout(a: Event, b: Event) -> bool:
    if a.rank is not None and b.rank is not None:
        if a.rank != b.rank:
            return False
    elif a.pg_rank is not None and b.pg_rank is not None and a.pg_rank != b.pg_rank:
        # without a global rank, "[Rank N]" is all there is to tell ranks apart (the same work
        # can show two different "[Rank N]" in its watchdog and status lines: corpus 006)
        return False
    for name in ("seq", "op_type", "timeout_ms"):
        x, y = getattr(a, name), getattr(b, name)
        if x is not None and y is not None and x != y:
            return False
    return not (a.pg is not None and b.pg is not None and a.pg != b.pg)


def _merged_timeout(into: Event, ev: Event) -> Event:
    """The timeout ``into`` with another line of it (``ev``) folded in."""
    changes: dict[str, Any] = {}
    occurrences = list(into.occurrences)
    repeats = into.repeats
    better = _FORM_RANK.get(ev.form or "", 9) < _FORM_RANK.get(into.form or "", 9)
    if better:
        # the more informative line becomes the event's own line; the old one an occurrence
        occurrences.insert(0, Occurrence(into.line, into.rank, into.text))
        changes.update(line=ev.line, text=ev.text, form=ev.form)
        if ev.time is not None:  # the time of the event's own line
            changes.update(time=ev.time, ts=ev.ts)
        partial = ev.partial and into.partial
    else:
        if len(occurrences) < MAX_OCCURRENCES:
            occurrences.append(Occurrence(ev.line, ev.rank, ev.text))
        repeats += max(ev.repeats, 0)
        partial = into.partial
        if not ev.partial and ev.ran_for_ms is not None and partial:
            partial = into.ran_for_ms is None and ev.ran_for_ms is None
    for name in _MERGE_FIELDS:
        if getattr(into, name) is None and getattr(ev, name) is not None and name not in changes:
            changes[name] = getattr(ev, name)
    if into.rank is None:
        changes["rank"] = ev.rank

    def value(n: str) -> Any:
        return changes.get(n, getattr(into, n))

    if partial and all(value(n) is not None for n in ("op_type", "timeout_ms", "ran_for_ms")):
        partial = False
    era = into.pytorch_era
    if ev.pytorch_era and (era is None or len(ev.pytorch_era) < len(era)):
        era = ev.pytorch_era
    occurrences.sort(key=lambda o: o.line)
    return evolve(
        into,
        **changes,
        partial=partial,
        repeats=max(repeats, ev.repeats),
        pytorch_era=era,
        occurrences=tuple(occurrences),
    )


def _with_occurrences(into: Event, repeats: list[Event]) -> Event:
    """The event ``into`` with its repeats counted, in the order seen."""
    occurrences = list(into.occurrences)
    count = into.repeats
    for ev in repeats:
        if len(occurrences) < MAX_OCCURRENCES:
            occurrences.append(Occurrence(ev.line, ev.rank, ev.text))
        count += max(ev.repeats, 0)
    return evolve(into, occurrences=tuple(occurrences), repeats=count)

"""Deduplication: one event per distinct timeout (rank, work) or message.

Input: events as the grammar makes them, in line order. Output: the same events with repeats
folded in (their lines kept as ``occurrences``, their count in ``repeats``): a timeout seen in
a watchdog line, a status line and a ``what():`` line is one event.
"""

from __future__ import annotations

import re
from typing import Any

from nccl_triage.model import Event, Kind, Occurrence

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
    "dump_signal": 7,
    "damaged": 8,
}
_MASK = re.compile(r"\d+")


class Deduper:
    """Collapses repeats: one event per distinct timeout (rank, work) or message."""

    def __init__(self) -> None:
        self.timeouts: list[Event] = []
        self._by_seq: dict[int | None, list[Event]] = {}
        self._others: dict[tuple[Any, ...], Event] = {}
        self._order: list[Event] = []

    def add(self, ev: Event) -> None:
        """Keep a new event, or fold it into the one it repeats."""
        if ev.kind in (Kind.WATCHDOG_TIMEOUT, Kind.WATCHDOG_STATUS):
            self._add_timeout(ev)
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
            self._others[key] = ev
            self._order.append(ev)
        else:
            _add_occurrence(same, ev)

    def _add_timeout(self, ev: Event) -> None:
        candidates = self._by_seq.get(ev.seq, []) if ev.seq is not None else self.timeouts
        match = next((t for t in candidates if _same_timeout(t, ev)), None)
        if match is None and ev.seq is not None:
            match = next((t for t in self._by_seq.get(None, []) if _same_timeout(t, ev)), None)
            if match is not None:
                self._by_seq[None].remove(match)
                self._by_seq.setdefault(ev.seq, []).append(match)
        if match is None:
            ev.kind = Kind.WATCHDOG_TIMEOUT
            if ev.form in ("timeout_at", "exception_detected", "failure_detected"):
                ev.partial = True  # only the work number: no op type, sizes or timeout
            self.timeouts.append(ev)
            self._by_seq.setdefault(ev.seq, []).append(ev)
            self._order.append(ev)
            return
        _merge_timeout(match, ev)

    def events(self) -> list[Event]:
        """All events, in input order."""
        return sorted(self._order, key=lambda e: e.line)


def _strip_header(text: str) -> str:
    return re.sub(r"^.*?\d\d:\d\d:\d\d\.\d+\s+\S+:\d+\]\s*", "", text)


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


def _merge_timeout(into: Event, ev: Event) -> None:
    better = _FORM_RANK.get(ev.form or "", 9) < _FORM_RANK.get(into.form or "", 9)
    if better:
        # the more informative line becomes the event's own line; the old one an occurrence
        into.occurrences.insert(0, Occurrence(into.line, into.rank, into.text))
        into.line, into.text, into.form = ev.line, ev.text, ev.form
        if ev.time is not None:  # the time of the event's own line
            into.time, into.ts = ev.time, ev.ts
        into.partial = ev.partial and into.partial
    else:
        _add_occurrence(into, ev)
        if not ev.partial and ev.ran_for_ms is not None and into.partial:
            into.partial = into.ran_for_ms is None and ev.ran_for_ms is None
    for name in _MERGE_FIELDS:
        if getattr(into, name) is None and getattr(ev, name) is not None:
            setattr(into, name, getattr(ev, name))
    if into.rank is None:
        into.rank = ev.rank
    if into.partial and all(
        getattr(into, n) is not None for n in ("op_type", "timeout_ms", "ran_for_ms")
    ):
        into.partial = False
    into.repeats = max(into.repeats, ev.repeats)
    if ev.pytorch_era and (into.pytorch_era is None or len(ev.pytorch_era) < len(into.pytorch_era)):
        into.pytorch_era = ev.pytorch_era
    into.occurrences.sort(key=lambda o: o.line)


def _add_occurrence(into: Event, ev: Event) -> None:
    if len(into.occurrences) < MAX_OCCURRENCES:
        into.occurrences.append(Occurrence(ev.line, ev.rank, ev.text))
    into.repeats += max(ev.repeats, 0)

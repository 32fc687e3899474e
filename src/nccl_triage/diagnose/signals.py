"""Context signals: lines that are not NCCL failures but explain them (a save, an OOM, ...).

Input: peeled :class:`Line` objects and the :class:`Signal` families of the ruleset (YAML).
Output: signal :class:`Event` objects whose ``kind`` is the signal id and whose ``detail``
holds the pattern name and its named groups. A burst of the same signal from one rank (a
progress bar redrawn a thousand times) becomes one event with ``count`` and ``last_line``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import re2

from nccl_triage.model import Event, Line, Signal

RUN_GAP_LINES = 50  # the same signal again within this many lines extends the same event


@dataclass(frozen=True, slots=True)
class _Compiled:
    signal_id: str
    name: str
    regex: Any
    on_message: bool
    exclude: Any  # one RE2 alternation of the signal's near-misses, or None


@cache
def _compile(signals: tuple[Signal, ...]) -> tuple[_Compiled, ...]:
    out: list[_Compiled] = []
    for sig in signals:
        options = re2.Options()
        options.case_sensitive = not sig.ignore_case
        exclude = (
            re2.compile("|".join(f"(?:{x})" for x in sig.exclude), options) if sig.exclude else None
        )
        out.extend(
            _Compiled(sig.id, p.name, re2.compile(p.regex, options), p.on_message, exclude)
            for p in sig.patterns
        )
    return tuple(out)


def scan_anchors(signals: Iterable[Signal]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return (literal anchors, regexes without anchors) for the whole-chunk candidate scan."""
    literals: list[str] = []
    regexes: list[str] = []
    for sig in signals:
        for p in sig.patterns:
            if p.anchors and not sig.ignore_case:
                literals.extend(p.anchors)
            else:
                # no literal every match holds: the scan runs the pattern itself (RE2, linear)
                regexes.append(f"(?i:{p.regex})" if sig.ignore_case else f"(?:{p.regex})")
    return tuple(dict.fromkeys(literals)), tuple(dict.fromkeys(regexes))


class SignalClassifier:
    """Turns lines into signal events, merging bursts of the same signal."""

    def __init__(self, signals: Iterable[Signal]) -> None:
        self._patterns = _compile(tuple(signals))
        self._open: dict[tuple[str, int | None, str], Event] = {}
        self.events: list[Event] = []

    def prune(self, before_line: int, keep: Callable[[Event], bool] | None = None) -> int:
        """Forget events that ended before ``before_line`` (unless ``keep``); return how many."""
        kept = [
            e
            for e in self.events
            if int(e.detail.get("last_line") or e.line) >= before_line
            or (keep is not None and keep(e))
        ]
        dropped = len(self.events) - len(kept)
        self.events[:] = kept
        for key, ev in list(self._open.items()):  # runs that ended can no longer be extended
            if int(ev.detail.get("last_line") or ev.line) < before_line:
                del self._open[key]
        return dropped

    def feed(self, line: Line) -> list[Event]:
        """Classify one line; return the signal events it started (not those it extended)."""
        started: list[Event] = []
        text = line.text
        seen: set[str] = set()
        for pat in self._patterns:
            if pat.signal_id in seen:
                continue
            m = pat.regex.search(line.message if pat.on_message else text)
            if m is None:
                continue
            seen.add(pat.signal_id)
            if pat.exclude is not None and pat.exclude.search(text):
                continue
            key = (pat.signal_id, line.rank, pat.name)
            run = self._open.get(key)
            if (
                run is not None
                and line.lineno - int(run.detail.get("last_line") or run.line) <= RUN_GAP_LINES
            ):
                run.detail["last_line"] = line.lineno
                run.detail["count"] = int(run.detail.get("count") or 1) + 1
                if line.time is not None:
                    run.detail["last_time"] = line.time
                    if line.ts is not None and run.ts is not None:
                        run.detail["duration_s"] = round(line.ts - run.ts)
                continue
            detail: dict[str, str | int | None] = {"pattern": pat.name, "count": 1}
            detail.update({k: v for k, v in m.groupdict().items() if v is not None})
            ev = Event(
                kind=pat.signal_id,
                source=line.source,
                line=line.lineno,
                text=text.strip(),
                rank=line.rank,
                local_rank=line.local_rank,
                host=line.host,
                pid=line.pid,
                time=line.time,
                ts=line.ts,
                detail=detail,
            )
            self._open[key] = ev
            self.events.append(ev)
            started.append(ev)
        return started

"""Every line near a failure, read in full: context signals, progress, what each rank did last.

Input: the peeled lines of the windows around failures (the pipeline hands them over in line
order, each once), and the signal families of the ruleset. Output: events for the engine and
the facts: signal events of every family (also the patterns too broad for the whole-log scan),
``progress`` events (a bar or counter: its description, count, total, percentage, elapsed and
remaining time, the activities its line names; a redrawn bar is one event holding its latest
state), and one ``last_output`` event per rank: the last line it printed before its first
failure message that is not a traceback frame or a launcher line: what an engineer reads first
by hand.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from nccl_triage.diagnose.progress import Progress, parse_progress
from nccl_triage.diagnose.signals import Searched, SignalClassifier, event_of
from nccl_triage.model import Event, Line, PrefixKind, Signal
from nccl_triage.model.fields import LAST_OUTPUT, PROGRESS

# Lines that are no rank's own output: tracebacks, C++ frames, separators, launcher chatter.
_NOT_OUTPUT = re.compile(
    r"^\s*(?:$|File \"|Traceback \(most recent|frame #\d|#\d+ |\d+\s+0x[\da-f]+ |-{4,}|={4,}"
    r"|\^+$|\[\w+\]$|warnings\.warn|During handling of|The above exception|Exception raised from"
    r"|terminate called|what\(\):|W\d{4} |E\d{4} |I\d{4} |\*{4,})"
)
# The digits _NOT_OUTPUT writes out (a frame's address), masked as line shapes are (every digit
# a 0): where a shape holds none of them, no ASCII digit decides the match (a test checks it;
# shapes mask ASCII digits only, and \d takes every one of them).
_NOT_OUTPUT_DIGITS = (b"0x",)


class Searcher(Protocol):
    """A compiled pattern (``re`` or RE2): does it match somewhere in a text."""

    def search(self, text: str) -> object:
        """Something true (a match, True) when the pattern is in ``text``, else None or False."""


class ContextClassifier:
    """Reads the lines of one input's failure windows, in line order."""

    def __init__(self, signals: Iterable[Signal], failure_text: Searcher) -> None:
        self._signals = SignalClassifier(signals)
        self._failure_text = failure_text  # lines the grammar reads: failures, not output
        self._progress: dict[tuple[int | None, str], Event] = {}
        # per process (its local rank, where a tee prefix gives one, else its rank): its last
        # own line before its first failure line
        # (the line and the signals it started; its event is built when asked for)
        self._last: dict[tuple[str, int | None], tuple[Line, str]] = {}
        self._failed: set[tuple[str, int | None]] = set()

    def feed(
        self, line: Line, hits: list[int] | None = None, known: Searched | None = None
    ) -> None:
        """Classify one line of a window.

        ``hits``: :meth:`SignalClassifier.hits`, if known; ``known``: what the searches of a
        line of the same shape found (see :meth:`SignalClassifier.feed`).
        """
        started = self._signals.feed(line, hits, known=known)
        text = line.message or line.text
        lead = ""
        for p in line.prefixes:
            if p.kind == PrefixKind.LEAD:
                lead = p.text
                break
        bar = parse_progress(lead + text) if ("%" in text or "/" in text or lead) else None
        if bar is not None:
            self._note_progress(line, bar, [e.kind for e in started])
        who = ("local", line.local_rank) if line.local_rank is not None else ("rank", line.rank)
        if who in self._failed:
            return
        failure = known.failure_text if known is not None else None
        if failure is None:
            failure = bool(self._failure_text.search(text))
        if failure:
            self._failed.add(who)
            return
        other = known.not_output if known is not None else None
        if other is None:
            other = _NOT_OUTPUT.match(text) is not None
        if not other:
            self._last[who] = (line, _ids(e.kind for e in started) if started else "")

    def learn(self, line: Line, learn: Searched, masked: bytes, failure_blind: bool) -> None:
        """Note in ``learn`` what this classifier's searches find in ``line``, for its shape.

        For the lines of the shape (``masked``: its bytes with every digit a ``0``), where no
        digit decides them; ``failure_blind``: the caller knows that no digit decides the
        failure text's search in this shape.
        """
        text = line.message or line.text
        if failure_blind:
            learn.failure_text = bool(self._failure_text.search(text))
        if not any(d in masked for d in _NOT_OUTPUT_DIGITS):
            learn.not_output = _NOT_OUTPUT.match(text) is not None

    def _note_progress(self, line: Line, bar: Progress, activities: list[str]) -> None:
        key = (line.rank, _bar_key(bar.desc))
        old = self._progress.get(key)
        first_line = old.detail.get("first_line") if old is not None else line.lineno
        first_time = old.detail.get("first_time") if old is not None else line.time
        detail: dict[str, str | int | None] = {
            "desc": bar.desc,
            "n": round(bar.n),
            "total": round(bar.total) if bar.total is not None else None,
            "percent": round(bar.percent) if bar.percent is not None else None,
            "elapsed_s": round(bar.elapsed_s) if bar.elapsed_s is not None else None,
            "remaining_s": round(bar.remaining_s) if bar.remaining_s is not None else None,
            "rate": bar.rate,
            "finished": int(bar.finished),
            "bar_form": bar.form,
            "activity": _ids(activities)
            or (str(old.detail.get("activity") or "") if old is not None else ""),
            "last_line": line.lineno,
            "first_line": first_line,
            "first_time": first_time,
        }
        ev = event_of(line, PROGRESS, detail)
        self._progress[key] = ev

    def events(self) -> list[Event]:
        """Signal, progress and last-output events, in line order."""
        last = [event_of(line, LAST_OUTPUT, {"signals": ids}) for line, ids in self._last.values()]
        out = [*self._signals.events, *self._progress.values(), *last]
        return sorted(out, key=lambda e: e.line)


def _ids(kinds: Iterable[str]) -> str:
    return ",".join(dict.fromkeys(kinds))


def _bar_key(desc: str) -> str:
    """One key for the readings of one bar (a description without its changing numbers)."""
    return re.sub(r"\d+", "#", desc)[:60]

"""Context signals: lines that are not NCCL failures but explain them (a save, an OOM, ...).

Input: peeled :class:`Line` objects and the :class:`Signal` families of the ruleset (YAML).
Output: signal :class:`Event` objects whose ``kind`` is the signal id and whose ``detail``
holds the pattern name and its named groups. A burst of the same signal from one rank (a
progress bar redrawn a thousand times) becomes one event with ``count`` and ``last_line``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Generic, TypeVar

from nccl_triage.ingest.regex import BytesSearcher, RegexSet, bytes_searcher, compile_set
from nccl_triage.model import Detail, Event, Line, Signal, evolve

RUN_GAP_LINES = 50  # the same signal again within this many lines extends the same event


@dataclass(frozen=True, slots=True)
class _Compiled:
    """One pattern of a signal, compiled."""

    signal_id: str
    name: str
    regex: BytesSearcher  # over the UTF-8 bytes of the text
    on_message: bool
    exclude: BytesSearcher | None  # one RE2 alternation of the signal's near-misses
    source: str = ""  # the pattern's text
    ignore_case: bool = False


@cache
def _compile(signals: tuple[Signal, ...]) -> tuple[_Compiled, ...]:
    out: list[_Compiled] = []
    for sig in signals:
        exclude = (
            bytes_searcher("|".join(f"(?:{x})" for x in sig.exclude), sig.ignore_case)
            if sig.exclude
            else None
        )
        out.extend(
            _Compiled(
                sig.id,
                p.name,
                bytes_searcher(p.regex, sig.ignore_case),
                p.on_message,
                exclude,
                p.regex,
                sig.ignore_case,
            )
            for p in sig.patterns
        )
    return tuple(out)


@cache
def _prefilters(patterns: tuple[_Compiled, ...]) -> tuple[RegexSet, RegexSet, list[int], list[int]]:
    """One set of the patterns over whole lines, one over messages, with their indices."""
    on_text = [i for i, p in enumerate(patterns) if not p.on_message]
    on_message = [i for i, p in enumerate(patterns) if p.on_message]
    return (
        compile_set(tuple((patterns[i].source, patterns[i].ignore_case) for i in on_text)),
        compile_set(tuple((patterns[i].source, patterns[i].ignore_case) for i in on_message)),
        on_text,
        on_message,
    )


_T = TypeVar("_T")


class PerSignals(Generic[_T]):
    """Values made once per list of signals (and ``extra``), found again by its members' identity.

    A dataclass hashes all its fields at every call (a third of opening an input): the key is
    their ids instead, and the signals are kept with the value so that no other object takes
    one of those ids while it is held. At most ``limit`` lists are held.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held: dict[tuple[object, ...], tuple[tuple[Signal, ...], _T]] = {}

    def get(
        self,
        signals: Iterable[Signal],
        make: Callable[[tuple[Signal, ...]], _T],
        extra: object = None,
    ) -> _T:
        """The value for these signals, made by ``make`` the first time."""
        sigs = tuple(signals)
        key = (extra, *map(id, sigs))
        hit = self._held.get(key)
        if hit is None:
            if len(self._held) >= self._limit:
                self._held.clear()
            hit = self._held[key] = (sigs, make(sigs))
        return hit[1]


_Prefilters = tuple[RegexSet, RegexSet, list[int], list[int]]
# per pattern: blind to digits; per signal: its exclusions blind; the others with their anchors
# (masked), and one pattern finding any of those anchors (None: one of them has none)
_Seeing = tuple[list[tuple[int, tuple[bytes, ...]]], "re.Pattern[bytes] | None"]
_Shapes = tuple[list[bool], dict[str, bool], _Seeing]
_Bundle = tuple[tuple[_Compiled, ...], _Prefilters, dict[bytes, tuple[int, ...]], _Shapes]


def _bundle(sigs: tuple[Signal, ...]) -> _Bundle:
    patterns = _compile(sigs)
    return patterns, _prefilters(patterns), _by_anchor(sigs), _shapes(sigs)


# The compiled patterns, prefilters and shapes' facts of the signal lists seen.
_BUNDLES: PerSignals[_Bundle] = PerSignals(64)


def _compiled(signals: Iterable[Signal]) -> _Bundle:
    return _BUNDLES.get(signals, _bundle)


_ESCAPE = re.compile(r"\\.")
_COUNT = re.compile(r"\{\d+(?:,\d*)?\}")


def digit_blind(regex: str) -> bool:
    r"""Whether a regular expression treats every ASCII digit alike.

    That is when no digit is in it but in a repetition count: ``\d``, ``\w``, ``.`` and a
    range between two non-digits take all ten or none. A digit in an escape (``\x30``) or
    in a class (``[0-5]``) counts as seeing digits.
    """
    return not any(c.isdigit() for c in _COUNT.sub("", _ESCAPE.sub("", regex)))


def _shapes(signals: tuple[Signal, ...]) -> _Shapes:
    blind: list[bool] = []
    seeing: list[tuple[int, tuple[bytes, ...]]] = []
    mask = bytes.maketrans(b"123456789", b"000000000")
    for sig in signals:
        for p in sig.patterns:
            anchors = p.anchors if not sig.ignore_case else ()
            ok = digit_blind(p.regex) and not any(c.isdigit() for a in anchors for c in a)
            if not ok:
                seeing.append((len(blind), tuple(a.encode().translate(mask) for a in anchors)))
            blind.append(ok)
    excludes = {sig.id: all(digit_blind(x) for x in sig.exclude) for sig in signals}
    masked = sorted({a for _i, some in seeing for a in some}, key=len, reverse=True)
    # literals only (escaped): a linear search, whatever the rules say
    any_anchor = (
        re.compile(b"|".join(re.escape(a) for a in masked))
        if masked and all(some for _i, some in seeing)
        else None
    )
    return blind, excludes, (seeing, any_anchor)


def _by_anchor(signals: tuple[Signal, ...]) -> dict[bytes, tuple[int, ...]]:
    """The patterns (their indices) each anchor of the scan stands for, as the scan names it.

    A literal for the patterns listing it; a regular expression (:func:`scan_anchors`) for
    the pattern written without literals.
    """
    out: dict[bytes, list[int]] = {}
    i = 0
    for sig in signals:
        for p in sig.patterns:
            if p.anchors and not sig.ignore_case:
                for a in p.anchors:
                    out.setdefault(a.encode(), []).append(i)
            else:
                regex = f"(?i:{p.regex})" if sig.ignore_case else f"(?:{p.regex})"
                out.setdefault(regex.encode(), []).append(i)
            i += 1
    return {a: tuple(dict.fromkeys(ids)) for a, ids in out.items()}


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
        self._patterns, prefilters, self._by_anchor, shapes = _compiled(signals)
        self._text_set, self._message_set, self._on_text, self._on_message = prefilters
        self._blind, self._blind_exclude, self._seeing = shapes
        self._events: list[Event] = []
        self._open: dict[tuple[str, int | None, str], int] = {}  # run -> index in _events
        self._grown: dict[int, _Growth] = {}  # runs extended since their event was built
        self._in_order = True  # the events' lines ascend (prune then bisects)
        self._last_start = 0

    @property
    def events(self) -> list[Event]:
        """The signal events so far, in the order they started."""
        self._build()
        return list(self._events)

    def _build(self) -> None:
        """Write the lines that extended runs into their events (once, not per line)."""
        for i, growth in self._grown.items():
            self._events[i] = growth.applied(self._events[i])
        self._grown.clear()

    def prune(self, before_line: int, keep: Callable[[Event], bool] | None = None) -> int:
        """Forget events that ended before ``before_line`` (unless ``keep``); return how many.

        Where the events came in the order of their lines, only those that started before
        ``before_line`` are looked at (an event ends where it starts or later).
        """
        self._build()
        events = self._events
        n = bisect.bisect_left(events, before_line, key=_start) if self._in_order else len(events)
        open_runs = {i: key for key, i in self._open.items()}
        still_open: dict[tuple[str, int | None, str], int] = {}
        kept: list[Event] = []
        for i, e in enumerate(events[:n]):
            ended = int(e.detail.get("last_line") or e.line) < before_line
            if ended and not (keep is not None and keep(e)):
                continue
            if i in open_runs and not ended:  # runs that ended can no longer be extended
                still_open[open_runs[i]] = len(kept)
            kept.append(e)
        dropped = n - len(kept)
        for key, i in self._open.items():
            if i >= n:  # started at or after the line: not ended
                still_open[key] = i - dropped
        self._open = still_open
        if dropped:
            self._events = kept + events[n:]
        return dropped

    def hits(self, line: Line) -> list[int]:
        """The patterns whose prefilter matches a line (one pass over it for all of them).

        Classifiers of the same signals agree on these numbers: a line read twice (as a
        candidate and in a context window) is matched once.
        """
        text = line.text.encode("utf-8")
        message = line.message
        on_text = [self._on_text[j] for j in self._text_set.matching(text)]
        if not self._on_message:
            return on_text
        found = self._message_set.matching(
            text if message == line.text else message.encode("utf-8")
        )
        return sorted(on_text + [self._on_message[j] for j in found])

    def anchor_hits(self, anchors: Iterable[bytes]) -> list[int]:
        """The patterns that may match a text holding these anchors of the scan (no other can).

        A superset of :meth:`hits` for the text (a pattern's every match holds one of its
        anchors): :meth:`feed` searches each, so both give the same events. Not for a line
        whose message is not part of its text (a JSON log line's payload).
        """
        by_anchor = self._by_anchor
        found: set[int] = set()
        for a in anchors:
            ids = by_anchor.get(a)
            if ids:
                found.update(ids)
        return sorted(found)

    def feed(
        self,
        line: Line,
        hits: list[int] | None = None,
        known: Searched | None = None,
        learn: Searched | None = None,
    ) -> list[Event]:
        """Classify one line; return the signal events it started (not those it extended).

        ``known``: what the searches of a line of the same shape found (the same, where the
        search cannot tell digits apart: :meth:`shape_blind`); ``learn`` receives those
        searches' results for the lines of its shape to come.
        """
        if hits is None:
            hits = self.hits(line)
        started: list[Event] = []
        if not hits:
            return started
        # the line's bytes are encoded when a search needs them (a line of a known shape and
        # an open run needs none)
        text_b: bytes | None = None
        message_b: bytes | None = None
        seen: set[str] | None = None
        patterns, blind = self._patterns, self._blind
        spans_known = known.spans if known is not None else None
        for i in hits:
            pat = patterns[i]
            sid = pat.signal_id
            if seen is not None and sid in seen:
                continue
            data: bytes | None = None
            if spans_known is not None and i in spans_known:
                spans = spans_known[i]
            else:
                if pat.on_message:
                    if message_b is None:
                        message_b = line.message.encode("utf-8")
                    data = message_b
                else:
                    if text_b is None:
                        text_b = line.text.encode("utf-8")
                    data = text_b
                spans = pat.regex.spans(data)
                if learn is not None and blind[i]:
                    learn.spans[i] = spans
            if spans is None:
                continue
            if seen is None:
                seen = {sid}
            else:
                seen.add(sid)
            if pat.exclude is not None:
                if known is not None and sid in known.excluded:
                    if known.excluded[sid]:
                        continue
                else:
                    if text_b is None:
                        text_b = line.text.encode("utf-8")
                    if self._excluded(pat, text_b, learn):
                        continue
            key = (sid, line.rank, pat.name)
            run = self._open.get(key)
            if run is not None:
                growth = self._grown.get(run)
                if growth is not None:
                    last = growth.last_line
                else:
                    detail = self._events[run].detail
                    last = int(detail.get("last_line") or self._events[run].line)
                if line.lineno - last <= RUN_GAP_LINES:
                    if growth is None:
                        growth = self._grown[run] = _Growth()
                    growth.add(line, self._events[run].ts)
                    continue
            if data is None:
                data = line.message.encode("utf-8") if pat.on_message else line.text.encode("utf-8")
            detail_new: dict[str, str | int | None] = {"pattern": pat.name, "count": 1}
            detail_new.update(pat.regex.named(data, spans))
            ev = event_of(line, sid, detail_new)
            self._open[key] = len(self._events)
            self._in_order = self._in_order and line.lineno >= self._last_start
            self._last_start = line.lineno
            self._events.append(ev)
            started.append(ev)
        return started

    def _excluded(self, pat: _Compiled, text_b: bytes, learn: Searched | None) -> bool:
        """Whether the signal's near-miss patterns match the line (learnt for its shape)."""
        assert pat.exclude is not None
        out = pat.exclude.spans(text_b) is not None
        if learn is not None and self._blind_exclude.get(pat.signal_id, False):
            learn.excluded[pat.signal_id] = out
        return out

    def shape_blind(self, i: int) -> bool:
        """Whether pattern ``i`` finds the same spans in two texts that differ only in digits.

        Its regex is :func:`digit_blind` and its anchors hold no digit.
        """
        return self._blind[i]

    def shape_candidates(self, masked: bytes) -> list[int]:
        """The patterns, not :meth:`shape_blind`, that may match a text masked as ``masked``.

        ``masked`` is the text's bytes with every digit a ``0``: a pattern whose anchors,
        masked alike, are not in it cannot match (nor one without anchors be ruled out).
        """
        seeing, any_anchor = self._seeing
        if any_anchor is not None and any_anchor.search(masked) is None:
            return []  # (most lines: none of their anchors)
        return [i for i, anchors in seeing if not anchors or any(a in masked for a in anchors)]


@dataclass(slots=True)
class Searched:
    """What the searches of one line found, for the lines of its shape (digits aside)."""

    spans: dict[int, list[tuple[int, int]] | None] = field(default_factory=dict)
    excluded: dict[str, bool] = field(default_factory=dict)
    # the context classifier's own searches (a failure's text; not a rank's own output), where
    # they cannot tell the lines of the shape apart (None: search each line)
    failure_text: bool | None = None
    not_output: bool | None = None
    anchored: bool | None = None  # whether the grammar's anchors are in the line's text


@dataclass(slots=True)
class _Growth:
    """The lines that extended a run of a signal since its event was last built."""

    lines: int = 0
    last_line: int = 0
    last_time: str | None = None
    duration_s: int | None = None

    def add(self, line: Line, start_ts: float | None) -> None:
        self.lines += 1
        self.last_line = line.lineno
        if line.time is not None:
            self.last_time = line.time
            if line.ts is not None and start_ts is not None:
                self.duration_s = round(line.ts - start_ts)

    def applied(self, run: Event) -> Event:
        """The run's event with these lines (as if it had been extended line by line)."""
        detail = dict(run.detail)
        detail["last_line"] = self.last_line
        detail["count"] = int(detail.get("count") or 1) + self.lines
        if self.last_time is not None:
            detail["last_time"] = self.last_time
            if self.duration_s is not None:
                detail["duration_s"] = self.duration_s
        return evolve(run, detail=Detail(detail))


def _start(event: Event) -> int:
    return event.line


def event_of(line: Line, kind: str, detail: dict[str, str | int | None]) -> Event:
    """An event of ``kind`` on ``line``: its place, rank, process and time, and ``detail``."""
    return Event(
        kind=kind,
        source=line.source,
        line=line.lineno,
        text=line.text.strip(),
        rank=line.rank,
        local_rank=line.local_rank,
        host=line.host,
        pid=line.pid,
        time=line.time,
        ts=line.ts,
        detail=Detail(detail),
    )

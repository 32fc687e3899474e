"""The one pipeline everyone calls: bytes of one or more inputs in, a :class:`Report` out.

Input: bytes pushed in chunks (:class:`Triage`), or a path, a string or a job of files (the
helpers below), and a :class:`Ruleset`. Output: a :class:`Report`: verdict, ordered findings,
events, job facts. ``triage``, ``parse``, ``batch``, ``watch``/``run`` and the rule examples
all go through :class:`Triage`; rendering is left to :mod:`nccl_triage.render`, so batch runs
can skip it.

Stages, per input: the candidate scan (:mod:`nccl_triage.ingest.scan`), the grammar with line
joining and deduplication (:mod:`nccl_triage.parse`), the context signals
(:mod:`nccl_triage.diagnose.signals`); then, for the whole job, the facts across ranks and the
rule engine (:mod:`nccl_triage.diagnose`). A job's flight-recorder dumps, when it has some
(:mod:`nccl_triage.flightrec`), are read once for the job and join its facts.

Each candidate line is read once, for the grammar, the signals and the context windows. A
line holding only a signal's anchor skips the grammar, and is read by its shape (the line with
its digits masked): the first line of a shape in full, the next ones from what it found (see
:meth:`Triage._by_shape`). Most candidate lines of a real log are such lines: the training
loop's progress, printed thousands of times.
"""

from __future__ import annotations

import gc
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, TYPE_CHECKING, cast

from nccl_triage.diagnose.context import ContextClassifier
from nccl_triage.diagnose.signals import (
    PerSignals,
    Searched,
    SignalClassifier,
    digit_blind,
    scan_anchors,
)
from nccl_triage.diagnose.verdict import build_report
from nccl_triage.ingest.anchors import ANCHORS, REGEX_ANCHORS
from nccl_triage.ingest.reader import (
    display_name,
    is_plain,
    iter_chunks,
    open_binary,
    segment_bounds,
)
from nccl_triage.ingest.scan import MAX_LINE, Candidate, Prescanned, Scanner, regex_anchor
from nccl_triage.model import (
    Event,
    Line,
    Prefix,
    PrefixKind,
    Report,
    Signal,
    Unparsed,
    evolve,
)
from nccl_triage.parse.anatomy import peel
from nccl_triage.parse.dedupe import Deduper
from nccl_triage.parse.lines import ANCHOR_RE, LineParser, peel_raw, peel_segments
from nccl_triage.ruleset import Ruleset

if TYPE_CHECKING:
    from nccl_triage.flightrec.job import FlightRecorder


def grammar_patterns() -> tuple[str, ...]:
    """The grammar's anchors, as the chunk scan takes them."""
    return tuple(dict.fromkeys((*ANCHORS, *(regex_anchor(r) for r in REGEX_ANCHORS))))


_SCAN_PATTERNS: PerSignals[tuple[str, ...]] = PerSignals(64)


def scan_patterns(ruleset: Ruleset) -> tuple[str, ...]:
    """Return the anchors of the chunk scan.

    The grammar's literals, the signals' literals, and the signal patterns that have no
    literal anchor (as regular expressions). Computed once per list of signals.
    """
    return _SCAN_PATTERNS.get(ruleset.signals, _scan_patterns)


def _scan_patterns(signals: tuple[Signal, ...]) -> tuple[str, ...]:
    literals, regexes = scan_anchors(signals)
    regexes = (*REGEX_ANCHORS, *regexes)
    return tuple(dict.fromkeys((*ANCHORS, *literals, *(regex_anchor(r) for r in regexes))))


# The bytes of an input's start looked at to tell a binary file from a log.
SNIFF_BYTES = 65536
_CONTROL_BYTES = bytes([*range(9), 11, 12, *range(14, 27), *range(28, 32), 127])
# Candidate lines read in full per input by default: enough for any real log; a dense one of
# millions (1 GB of repeated NCCL lines) is read at its start and end.
MAX_CANDIDATES = 500_000
MIN_FILE_CANDIDATES = 20_000  # per file of a job of many files

# Lines repeated byte for byte are peeled once: at most this many remembered, this long each.
SAME_LINES = 4096
SAME_LINE_BYTES = 2048

# Lines holding only a signal's anchor are read by shape (their digits masked): this many shapes
# remembered per triage, of lines this long at most, each with this many prefixes' texts.
SHAPES = 2048
SHAPE_BYTES = 4096
SHAPE_PREFIXES = 64
# Shapes are given up for SHAPE_PAUSE lines when most of the last SHAPE_SAMPLE were new ones.
SHAPE_SAMPLE = 4096
SHAPE_PAUSE = 65536
_MASK = bytes.maketrans(b"123456789", b"000000000")
_UNKNOWN = object()
_GRAMMAR_KEY = b"\n"  # after a grammar's line's shape (no line holds a newline)
# Whether the grammar's anchors find the same in every line of a shape: when their regexes are
# blind to digits and the shape holds none of the literals with a digit (masked alike).
_ANCHORS_BLIND = all(digit_blind(r) for r in REGEX_ANCHORS)
_DIGIT_ANCHORS = tuple(
    a.encode("utf-8").translate(_MASK) for a in ANCHORS if any(c.isdigit() for c in a)
)


# The shapes learnt, per list of signals (by the identity of its members, kept alive here) and
# scan engine: a batch's jobs and a live job's updates share them, as the grammar's message
# shapes are shared (a shape depends on nothing else).
_SHAPES_OF: PerSignals[dict[bytes, _Shape | None]] = PerSignals(16)


def _shapes_of(ruleset: Ruleset) -> dict[bytes, _Shape | None]:
    from nccl_triage.errors import TriageError
    from nccl_triage.ingest.engines import engine_choice

    try:
        engine = engine_choice()
    except TriageError:  # said when the scan starts
        engine = "?"
    return _SHAPES_OF.get(ruleset.signals, lambda _signals: {}, extra=engine)


# What a line's prefixes say: Line's fields after ``message``, in their order.
_LineFields = tuple[
    tuple[Prefix, ...],  # prefixes
    int | None,  # rank
    int | None,  # local_rank
    str | None,  # role
    str | None,  # host
    int | None,  # pid
    str | None,  # severity
    str | None,  # time
    float | None,  # ts
    str | None,  # clock
]


def _line_fields(line: Line) -> _LineFields:
    """What a line's prefixes say (see :data:`_LineFields`)."""
    return (
        line.prefixes,
        line.rank,
        line.local_rank,
        line.role,
        line.host,
        line.pid,
        line.severity,
        line.time,
        line.ts,
        line.clock,
    )


def _json_like(text: str) -> bool:
    """Whether peeling would try the text as a JSON log line (as anatomy does)."""
    return (
        text.startswith("{")
        and text.rstrip().endswith("}")
        and text[1:].lstrip(" \t\n\r")[:1] in ('"', "}")
    )


# The window of lines read in full around each failure: the last few thousand lines before it
# (bounded too by the scanner's history: a few MiB) and a few hundred after it.
CONTEXT_BEFORE = 3000
CONTEXT_AFTER = 300
# Candidate lines held back from the long-range signal classifier at an input's start: an input
# whose every candidate falls in the windows read needs none of its events (the windows' own
# reading has them). More than a window's worth: classified, and every later line at once.
DEFER_LINES = CONTEXT_BEFORE + CONTEXT_AFTER + 1


@dataclass(frozen=True, slots=True)
class _Read:
    """A candidate line's segments that hold an anchor, peeled, and their signal hits."""

    count: int  # segments of the line
    at: list[int]  # the positions of those read
    lines: list[Line]
    hits: list[list[int]]
    # where each line's text lies in the raw line, when it is those bytes unchanged
    spans: list[tuple[int, int]] | None = None


@dataclass(slots=True)
class _Part:
    """One part of a line shape: where it lies, and what peeling and searching it found."""

    start: int
    stop: int
    plen: int  # characters of prefixes before the message
    fields: dict[str, _LineFields]  # prefixes' text -> what they say
    hits: list[int]  # patterns to try: the blind ones the first line's had, and the others
    searched: Searched  # what the searches blind to digits found


@dataclass(slots=True)
class _Shape:
    """A signal's line with its digits masked: the lines of one shape are read alike."""

    count: int
    parts: list[_Part]
    hits: list[list[int]] = field(init=False)  # the parts' (as the context windows take them)
    searched: list[Searched] = field(init=False)

    def __post_init__(self) -> None:
        self.hits = [part.hits for part in self.parts]
        self.searched = [part.searched for part in self.parts]


@dataclass
class _Input:
    """What the pipeline keeps for one input (one file of a job, or the one stream)."""

    source: str
    scanner: Scanner
    parser: LineParser
    signals: SignalClassifier  # the candidate lines anywhere in the input (the long range)
    context: ContextClassifier  # every line of the windows around failures
    rank_hint: int | None = None
    candidates: int = 0
    windows: list[list[int]] = field(default_factory=list)  # [first, end) not yet read
    read_to: int = 0  # lines up to here were given to the context classifier
    read: list[tuple[int, int]] = field(default_factory=list)  # [first, end) ranges it read
    failures_seen: int = 0  # of parser.failure_lines
    # candidates peeled and matched (per segment), kept until the windows are read
    # (and, for a line read by its shape, what its searches found)
    peeled: dict[int, tuple[list[Line], list[list[int]], list[Searched] | None]] = field(
        default_factory=dict
    )
    # the same bytes seen on another line (a log that repeats a line verbatim): peeled and
    # matched once
    same: dict[bytes, _Read] = field(default_factory=dict)
    sniffed: int = 0  # bytes looked at for NULs (the first SNIFF_BYTES)
    nul_bytes: int = 0  # control bytes no text log has (NUL, BEL, ...; not tab, ESC, CR, LF)
    held: deque[Candidate] = field(default_factory=deque)  # the last ones, past the budget
    # lines looked up by shape lately, those of a new shape, and lines to read without shapes
    # (where shapes do not repeat, learning each costs more than it saves)
    shape_tries: int = 0
    shape_new: int = 0
    shape_pause: int = 0
    skipped: int = 0  # candidates past the budget that were not read
    # candidate lines not yet given to ``signals`` (in line order, with their hits and what
    # their shape's searches found); None once every line goes to it at once
    deferred: list[tuple[Line, list[int], Searched | None]] | None = field(default_factory=list)


class Triage:
    """Incremental triage of one input or of one job made of several (per-rank files).

    Feed bytes (per source when there are several), close each input, ask for the report at
    any time. ``diagnose=False`` parses only (no signals, facts or rules: ``parse``).
    """

    def __init__(
        self,
        ruleset: Ruleset,
        source: str = "<text>",
        *,
        diagnose: bool = True,
        max_candidates: int | None = None,
    ) -> None:
        """Start a triage.

        ``max_candidates``: read at most this many candidate lines per input (the first ones,
        and the last fifth of the budget at the end); None or 0 reads them all.
        """
        self.source = source
        self.ruleset = ruleset if diagnose else Ruleset(rules=[], signals=[])
        self.max_candidates = max_candidates or None
        self._anchors = scan_patterns(self.ruleset)
        # the grammar's own anchors: the other candidates hold only a signal's, and no
        # grammar reads them (nor the lines around them)
        self._grammar_anchors = grammar_patterns() if self.ruleset.signals else None
        self._inputs: dict[str, _Input] = {}
        # by masked line (None: read each), shared by every triage of the same signals
        self._shapes = _shapes_of(self.ruleset)
        # learns the searches of a new shape's first line while its classifier's lines wait
        self._learner = SignalClassifier(self.ruleset.signals)
        self._learnt = 0  # lines it learnt from
        self.flight_recorder: FlightRecorder | None = None

    def read_dumps(self, sources: Sequence[str]) -> FlightRecorder:
        """Read the job's flight-recorder dumps (directories, globs, files); they join its facts.

        A dump that cannot be read is one line in the result's ``problems``, never an error.
        """
        from nccl_triage.flightrec.job import read_flight_recorder  # only jobs with dumps

        self.flight_recorder = read_flight_recorder(sources)
        return self.flight_recorder

    # -- input

    def open(self, source: str | None = None, rank_hint: int | None = None) -> None:
        """Start an input (a file of a job); ``rank_hint`` is its rank from the file's name."""
        name = self.source if source is None else source
        if name not in self._inputs:
            self._inputs[name] = _Input(
                name,
                Scanner(self._anchors, neighbours=self._grammar_anchors),
                LineParser(name),
                SignalClassifier(self.ruleset.signals),
                ContextClassifier(self.ruleset.signals, ANCHOR_RE),
                rank_hint,
            )

    def scan_anchors(self) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
        """The anchors of each input's scan, and the grammar's among them (None: all).

        :meth:`Prescanner.make` builds from them a prescanner for another process.
        """
        return self._anchors, self._grammar_anchors

    def discard(self, source: str) -> None:
        """Forget an input that could not be read to its end (its partial events too)."""
        self._inputs.pop(source, None)

    def _input(self, source: str | None) -> _Input:
        name = self.source if source is None else source
        if name not in self._inputs:
            self.open(name)
        return self._inputs[name]

    def feed(
        self,
        data: bytes,
        source: str | None = None,
        now: float = 0.0,
        pre: Prescanned | None = None,
    ) -> int:
        """Take the next bytes of an input; return how many candidate lines they completed.

        ``pre``: their candidate scan, done elsewhere (see :meth:`scan_anchors`).
        """
        inp = self._input(source)
        if inp.sniffed < SNIFF_BYTES:
            head = data[: SNIFF_BYTES - inp.sniffed]
            inp.sniffed += len(head)
            inp.nul_bytes += len(head) - len(head.translate(None, _CONTROL_BYTES))
        return self._take(inp, inp.scanner.feed(data, now, pre))

    def skip(
        self, nbytes: int, newlines: int, tail: bytes, source: str | None = None, now: float = 0.0
    ) -> int:
        """Bytes of a stream that were not seen (see :meth:`Scanner.skip`)."""
        inp = self._input(source)
        return self._take(inp, inp.scanner.skip(nbytes, newlines, tail, now))

    def flush(self, found_before: float, source: str | None = None) -> int:
        """Hand on candidates still waiting for their look-ahead since before ``found_before``."""
        inp = self._input(source)
        return self._take(inp, inp.scanner.flush(found_before))

    def close(self, source: str | None = None) -> None:
        """End of an input."""
        inp = self._input(source)
        self._take(inp, inp.scanner.close(), final=True)
        if inp.deferred is not None:
            inside = _inside(inp.read)
            if all(inside(ln.lineno) for ln, _h, _k in inp.deferred):
                # every candidate in the windows read, and no other line classified: the
                # classifier's events would all be left out (the windows have them)
                inp.deferred = None
            else:
                self._undefer(inp)

    def _take(self, inp: _Input, cands: list[Candidate], final: bool = False) -> int:
        budget = self.max_candidates
        if budget is not None:
            cands = self._within_budget(inp, cands, budget, final)
        shaped = bool(self.ruleset.signals)
        for cand in cands:
            inp.candidates += 1
            if shaped and self._by_shape(inp, cand):
                continue
            known = inp.same.get(cand.raw)
            if known is not None:
                read = replace(known, lines=[evolve(x, lineno=cand.lineno) for x in known.lines])
            else:
                # once, for the grammar, the signals and the context windows
                read = self._read(inp, cand)
                if len(cand.raw) <= SAME_LINE_BYTES:
                    if len(inp.same) >= SAME_LINES:
                        inp.same.clear()
                    inp.same[cand.raw] = read
            if cand.grammar:
                inp.parser.feed(cand, read.lines, read.at, read.count)
            if self.ruleset.signals:
                if len(read.lines) == read.count:  # all of it: the context windows reuse it
                    inp.peeled[cand.lineno] = (read.lines, read.hits, None)
                for line, found in zip(read.lines, read.hits, strict=True):
                    self._signal(inp, line, found)
        if self.ruleset.signals:
            self._open_windows(inp)
            self._read_windows(inp, final)
        return len(cands)

    def _signal(
        self, inp: _Input, line: Line, hits: list[int], known: Searched | None = None
    ) -> None:
        """Give a candidate line to the input's signal classifier, or hold it back."""
        deferred = inp.deferred
        if deferred is None:
            inp.signals.feed(line, hits, known=known)
            return
        deferred.append((line, hits, known))
        if len(deferred) > DEFER_LINES:
            self._undefer(inp)

    def _learn(self, line: Line, hits: list[int], searched: Searched) -> None:
        """Learn the searches of a new shape's first line (held back from its classifier).

        What a classifier's searches find does not depend on the lines it has seen; the
        learner's own events are of no use (and it is replaced before they pile up).
        """
        self._learnt += 1
        if self._learnt > DEFER_LINES:
            self._learner, self._learnt = SignalClassifier(self.ruleset.signals), 0
        self._learner.feed(line, hits, learn=searched)

    @staticmethod
    def _undefer(inp: _Input) -> None:
        """Give the lines held back to the signal classifier, and every line from now on."""
        deferred, inp.deferred = inp.deferred, None
        for line, hits, known in deferred or ():
            inp.signals.feed(line, hits, known=known)

    def _by_shape(self, inp: _Input, cand: Candidate) -> bool:
        """Read a candidate line as the first line of its shape was.

        The shape is the line with its digits masked (``0``): peeling depends on digits only
        in the prefixes (a time, a rank: kept per prefix text), and a pattern or exclusion
        without digits (:func:`~nccl_triage.diagnose.signals.digit_blind`) finds the same
        spans in every line of a shape, so they are searched once; patterns with digits are
        searched in every line. A line the grammar reads (one segment) goes to it from here,
        peeled so. Return False for a line left to :meth:`_read`.
        """
        raw = cand.raw
        if len(raw) > SHAPE_BYTES:
            return False
        if inp.shape_pause:
            inp.shape_pause -= 1
            return False
        inp.shape_tries += 1
        if inp.shape_tries >= SHAPE_SAMPLE:
            if inp.shape_new * 2 > inp.shape_tries:  # most lines of a new shape: pause
                inp.shape_pause = SHAPE_PAUSE
            inp.shape_tries = inp.shape_new = 0
        key = raw.translate(_MASK)
        if cand.grammar:  # (a digit may decide whether a line holds a grammar's anchor)
            key += _GRAMMAR_KEY
        shape = self._shapes.get(key, _UNKNOWN)
        if shape is _UNKNOWN:
            inp.shape_new += 1
            return self._learn_shape(inp, cand, key)
        if shape is None:
            return False
        assert isinstance(shape, _Shape)
        source, lineno = inp.source, cand.lineno
        parts = shape.parts
        if len(parts) == 1:  # (most lines)
            part = parts[0]
            text = raw if part.stop - part.start == len(raw) else raw[part.start : part.stop]
            text_s = text.decode("utf-8")
            line = self._shaped_line(source, lineno, text_s, part)
            if line is None:
                return False
            if cand.grammar:
                inp.parser.feed(cand, [line], anchored=part.searched.anchored)
            self._signal(inp, line, part.hits, part.searched)
            if shape.count == 1:  # all of it: the context windows reuse it
                inp.peeled[lineno] = ([line], shape.hits, shape.searched)
            return True
        lines: list[Line] = []  # (a line redrawn in parts: never the grammar's, one part each)
        for part in parts:
            line_or_none = self._shaped_line(
                source, lineno, raw[part.start : part.stop].decode("utf-8"), part
            )
            if line_or_none is None:
                return False
            lines.append(line_or_none)
        for line, part in zip(lines, parts, strict=True):
            self._signal(inp, line, part.hits, part.searched)
        if len(lines) == shape.count:  # all of it: the context windows reuse it
            inp.peeled[lineno] = (lines, shape.hits, shape.searched)
        return True

    @staticmethod
    def _shaped_line(source: str, lineno: int, text: str, part: _Part) -> Line | None:
        """A part's line, its prefixes' fields reused where the same prefix text was seen."""
        head = text[: part.plen]
        fields = part.fields.get(head)
        if fields is not None:
            return Line(source, lineno, text, text[part.plen :], *fields)
        line = peel(Line(source, lineno, text))
        if line.message != text[part.plen :]:
            return None  # (cannot be: a shape's prefixes end at the same place)
        if len(part.fields) < SHAPE_PREFIXES:  # not a time that changes at every line
            part.fields[head] = _line_fields(line)
        return line

    def _learn_shape(self, inp: _Input, cand: Candidate, key: bytes) -> bool:
        """Read the first line of a shape in full, and keep its shape when lines can share it."""
        read = self._read(inp, cand)
        if cand.grammar:
            inp.parser.feed(cand, read.lines, read.at, read.count)
        signals = inp.signals
        # (a line the grammar reads: one segment, one message)
        one = not cand.grammar or (read.count == 1 and len(read.lines) == 1)
        parts: list[_Part] | None = [] if read.spans is not None and one else None
        for i, line in enumerate(read.lines):
            searched = Searched()
            if inp.deferred is None:
                signals.feed(line, read.hits[i], learn=searched)
            else:
                self._learn(line, read.hits[i], searched)
                self._signal(inp, line, read.hits[i], searched)
            if parts is None or read.spans is None:
                continue
            text, message = line.text, line.message
            if (
                not text.endswith(message)
                or any(p.kind == PrefixKind.JSON for p in line.prefixes)
                or _json_like(text)  # a JSON object's numbers decide whether it parses
            ):
                parts = None
                continue
            start, stop = read.spans[i]
            plen = len(text) - len(message)
            blind = [h for h in read.hits[i] if signals.shape_blind(h)]
            others = signals.shape_candidates(key[start:stop])
            hits = sorted({*blind, *others})
            parts.append(
                _Part(start, stop, plen, {text[:plen]: _line_fields(line)}, hits, searched)
            )
            masked = key[start:stop]
            found_alike = _ANCHORS_BLIND and not any(a in masked for a in _DIGIT_ANCHORS)
            inp.context.learn(line, searched, masked, found_alike)  # (windows read them alike)
            if found_alike and cand.grammar:
                searched.anchored = bool(ANCHOR_RE.search(text))
        if len(read.lines) == read.count:
            inp.peeled[cand.lineno] = (read.lines, read.hits, None)
        if len(self._shapes) >= SHAPES:
            self._shapes.clear()
        self._shapes[key] = _Shape(read.count, parts) if parts else None
        return True

    def _read(self, inp: _Input, cand: Candidate) -> _Read:
        """Peel a candidate line's segments that hold an anchor and match them with the signals.

        A progress bar redrawn with carriage returns is one physical line of many segments,
        and the anchor is in one of them (the loss printed after the bar): the others are
        neither messages nor signals, and are left to the context windows. Where the
        segments' text is not the line's bytes (invalid UTF-8, terminal codes) and for lines
        cut to MAX_LINE, every segment is read.
        """
        raw = cand.raw
        if b"\r" not in raw:  # one segment (most lines)
            lines = peel_segments(inp.source, cand)
            hits = [inp.signals.hits(line) for line in lines] if self.ruleset.signals else []
            spans = None
            if len(lines) == 1 and is_plain(raw) and lines[0].text == raw.decode("utf-8"):
                spans = [(0, len(raw))]
            return _Read(len(lines), list(range(len(lines))), lines, hits, spans)
        fast = self._redrawn(inp, cand)
        if fast is not None:
            return fast
        bounds = segment_bounds(cand.raw) if len(cand.raw) < MAX_LINE else None
        if bounds is None or len(bounds) == 1:
            lines = peel_segments(inp.source, cand)
            at = list(range(len(lines)))
            count = len(lines)
        else:
            at = inp.scanner.engine.parts_with_anchors(cand.raw, bounds)
            lines = [
                peel(Line(inp.source, cand.lineno, cand.raw[s:e].decode("utf-8")))
                for s, e in (bounds[i] for i in at)
            ]
            count = len(bounds)
        hits = [inp.signals.hits(line) for line in lines] if self.ruleset.signals else []
        return _Read(count, at, lines, hits)

    def _redrawn(self, inp: _Input, cand: Candidate) -> _Read | None:
        """:meth:`_read` of a plain line redrawn with carriage returns, its parts never empty.

        One search of the line finds the parts holding an anchor; the others are never
        split out. None for any other line.
        """
        raw = cand.raw
        end = len(raw.rstrip(b"\r")) if raw.endswith(b"\r") else len(raw)
        if (
            end >= MAX_LINE
            or raw.find(b"\r", 1, end) < 0  # one part (or a leading carriage return)
            or raw.startswith(b"\r")
            or raw.find(b"\r\r", 0, end) >= 0  # an empty part: the parts are not numbered by CRs
            or not is_plain(raw)
        ):
            return None
        engine = inp.scanner.engine
        spans: list[tuple[int, int, set[bytes] | None]] | None
        spans = cast(
            "list[tuple[int, int, set[bytes] | None]] | None", engine.redrawn_parts(raw, end)
        )
        if spans is None:  # the engine cannot name the anchors: each part searched alone
            bounds = segment_bounds(raw) or []
            spans = [(*bounds[i], None) for i in engine.parts_with_anchors(raw, bounds)]
        source, lineno = inp.source, cand.lineno
        lines = [peel(Line(source, lineno, raw[s:e].decode("utf-8"))) for s, e, _a in spans]
        hits = []
        if self.ruleset.signals:
            signals = inp.signals
            for line, (_s, _e, anchors) in zip(lines, spans, strict=True):
                json = line.prefixes and line.prefixes[0].kind == PrefixKind.JSON
                # the message of a JSON line is not its text: its anchors may be escaped there
                if anchors is None or json:
                    hits.append(signals.hits(line))
                else:
                    hits.append(signals.anchor_hits(anchors))
        at = [raw.count(b"\r", 0, s) for s, _e, _a in spans]
        bounds = [(s, e) for s, e, _a in spans]
        return _Read(raw.count(b"\r", 0, end) + 1, at, lines, hits, bounds)

    @staticmethod
    def _within_budget(
        inp: _Input, cands: list[Candidate], budget: int, final: bool
    ) -> list[Candidate]:
        """The candidates to read now, within the budget.

        The first ones of the budget are read as they come; of the rest, the last fifth of the
        budget is held until the input ends (where its failure usually is).
        """
        tail = max(1, budget // 5)
        head = budget - tail
        out: list[Candidate] = []
        for cand in cands:
            if inp.candidates + len(out) < head:
                out.append(cand)
                continue
            inp.held.append(cand)
            if len(inp.held) > tail:
                inp.held.popleft()
                inp.skipped += 1
        if final:
            out.extend(inp.held)
            inp.held.clear()
        return out

    def _open_windows(self, inp: _Input) -> None:
        """A window around each failure read since last time (overlapping ones merged)."""
        failures = inp.parser.failure_lines
        for line in failures[inp.failures_seen :]:
            lo, hi = max(1, line - CONTEXT_BEFORE), line + CONTEXT_AFTER + 1
            if inp.windows and lo <= inp.windows[-1][1]:
                inp.windows[-1][1] = max(inp.windows[-1][1], hi)
            else:
                inp.windows.append([lo, hi])
        inp.failures_seen = len(failures)

    def _read_windows(self, inp: _Input, final: bool) -> None:
        """Give the context classifier the lines of the windows that the history holds."""
        history = inp.scanner.history
        first, end = history.first_line, history.next_line
        while inp.windows and first is not None and end is not None:
            w = inp.windows[0]
            lo, hi = max(w[0], inp.read_to + 1, first), min(w[1], end)
            if lo < hi:
                for lineno, raw in history.lines(lo, hi):
                    kept = inp.peeled.get(lineno)
                    if kept is None:
                        for line in peel_raw(inp.source, lineno, raw):
                            inp.context.feed(line)
                    else:
                        lines, hits, searched = kept
                        for i, line in enumerate(lines):
                            inp.context.feed(line, hits[i], searched[i] if searched else None)
                inp.read_to = hi - 1
                if inp.read and inp.read[-1][1] >= lo:
                    inp.read[-1] = (inp.read[-1][0], hi)
                else:
                    inp.read.append((lo, hi))
            if w[1] <= end or final:
                inp.windows.pop(0)  # read to its end (or the input ended)
            else:
                break
        # a candidate before both the history and what was read can no longer be in a window
        floor = max(inp.read_to + 1, first) if first is not None else inp.read_to + 1
        if inp.peeled and (final or next(iter(inp.peeled)) < floor):
            inp.peeled = {} if final else {k: v for k, v in inp.peeled.items() if k >= floor}

    # -- state

    @property
    def lines(self) -> int:
        """Physical lines read so far, over every input."""
        return sum(i.scanner.lines for i in self._inputs.values())

    @property
    def bytes(self) -> int:
        """Bytes read so far, over every input."""
        return sum(i.scanner.bytes for i in self._inputs.values())

    @property
    def candidates(self) -> int:
        """Candidate lines handed to the grammar so far."""
        return sum(i.candidates for i in self._inputs.values())

    def complete_lines(self, source: str | None = None) -> int:
        """Lines of an input that ended with a newline so far."""
        return self._input(source).scanner.complete_lines

    def oldest_pending(self, source: str | None = None) -> float | None:
        """When the oldest candidate still waiting for its look-ahead was found, or None."""
        return self._input(source).scanner.oldest_pending

    def prune_signals(self, before_line: int, keep: Callable[[Event], bool] | None = None) -> int:
        """Forget signal events that ended before ``before_line``; return how many.

        Live triage calls this so memory stays bounded however long a job runs: no rule looks
        further back than its window. ``keep`` spares old events it returns True for (those
        near a failure already seen, whose diagnosis must not fade).
        """
        for inp in self._inputs.values():
            self._undefer(inp)
        return sum(i.signals.prune(before_line, keep) for i in self._inputs.values())

    # -- the report

    def events(self) -> list[Event]:
        """The grammar's events of every input, deduplicated (across the files of a job too)."""
        inputs = list(self._inputs.values())
        if len(inputs) == 1:
            return inputs[0].parser.dedupe.events()
        job = Deduper()
        for inp in inputs:
            for ev in _with_file_rank(inp.parser.dedupe.events(), inp):
                job.add(ev)
        return job.events()

    def report(self) -> Report:
        """Correlate what was fed so far into a report."""
        inputs = list(self._inputs.values())
        signals: list[Event] = []
        unparsed: list[Unparsed] = []
        for inp in inputs:
            self._undefer(inp)  # (an input not closed yet: its lines so far, as they were)
            sigs = _signals_of(inp)
            signals.extend(_with_file_rank(sigs, inp) if len(inputs) > 1 else sigs)
            unparsed.extend(inp.parser.unparsed)
        ends = {i.source: i.scanner.lines for i in inputs}
        report = build_report(
            self.source,
            self.ruleset,
            self.events(),
            signals,
            self.lines,
            unparsed,
            ends,
            self.flight_recorder,
        )
        report.notes = [note for inp in inputs for note in _notes(inp, len(inputs) > 1)]
        fr = self.flight_recorder
        if fr is not None and fr.hung and report.verdict == "clean":
            report.notes.append(
                "the flight-recorder dumps show a stuck process group, but the log shows no "
                "NCCL failure: is it the same run's log, and did it end before the timeout?"
            )
        return report


def _notes(inp: _Input, named: bool) -> list[str]:
    """What a reader of the report should know about how an input was read."""
    where = f"{inp.source}: " if named else ""
    notes = []
    if inp.scanner.bytes == 0:
        notes.append(f"{where}empty input (0 bytes)")
    elif inp.nul_bytes > max(1, inp.sniffed // 20):
        notes.append(
            f"{where}binary data, not a text log ({inp.nul_bytes:,} control bytes in the "
            f"first {inp.sniffed:,}): is it the right file, or a compressed format not "
            "recognised?"
        )
    if inp.skipped:
        read = inp.candidates
        notes.append(
            f"{where}{inp.skipped:,} of {read + inp.skipped:,} candidate lines were skipped "
            f"(the budget reads the first and the last ones; --max-candidates to read more)"
        )
    return notes


def _signals_of(inp: _Input) -> list[Event]:
    """The input's context events.

    Those of the windows read in full, and the candidate lines' signals outside them (inside,
    the windows' own reading has them).
    """
    inside = _inside(inp.read)
    outside = [e for e in inp.signals.events if not inside(e.line)]
    return sorted([*outside, *inp.context.events()], key=lambda e: e.line)


def _inside(ranges: list[tuple[int, int]]) -> Callable[[int], bool]:
    """A test of whether a line number lies in one of ``ranges`` (sorted, disjoint, ends excluded)."""
    if len(ranges) == 1:  # (a small log: one window)
        lo, hi = ranges[0]
        return lambda n: lo <= n < hi
    starts = [lo for lo, _hi in ranges]

    def inside(n: int) -> bool:
        i = bisect_right(starts, n) - 1
        return i >= 0 and n < ranges[i][1]

    return inside


def _with_file_rank(events: list[Event], inp: _Input) -> list[Event]:
    """Events of one file of a job, those without a rank given the file's rank.

    The file's rank is the one rank its lines name, or else the hint from its name.
    """
    named = {e.rank for e in events if e.rank is not None}
    own = next(iter(named)) if len(named) == 1 else (inp.rank_hint if not named else None)
    if own is None:
        return events
    return [e if e.rank is not None else evolve(e, rank=own) for e in events]


# ----------------------------------------------------------------------------- entry points


def settle_collector() -> None:
    """Tune Python's cycle collector for a process that reads a big log, once it has started.

    Reading a log allocates millions of short-lived objects; with the default thresholds the
    collector runs every 700 of them and keeps walking everything start-up built (rules,
    grammar, compiled patterns): about a fifth of the time of a triage of a 1.2 GB log. What
    exists now is frozen out of its walks, and it runs every 20,000 allocations. Only the
    command line, the live analyser and the batch's own worker processes call this: a program
    that imports the library keeps its own settings.
    """
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def feed_file(
    triage: Triage, path: str, source: str | None = None, stdin: IO[bytes] | None = None
) -> None:
    """Read one file (a path, ``-`` for stdin, plain or compressed) into ``triage``."""
    name = display_name(path) if source is None else source
    with open_binary(path, stdin) as fh:
        for chunk in iter_chunks(fh):
            triage.feed(chunk, name)
    triage.close(name)


def triage_path(
    path: str,
    ruleset: Ruleset,
    stdin: IO[bytes] | None = None,
    max_candidates: int | None = MAX_CANDIDATES,
    dumps: FlightRecorder | Sequence[str] | None = None,
) -> Report:
    """Triage one input: a path, ``-`` for stdin, plain or compressed.

    ``max_candidates`` bounds the work on a huge dense log (see :class:`Triage`). ``dumps``
    are the job's flight-recorder dumps: sources to read, or dumps already read (a command
    joins the same dumps to several logs).

    Raises:
        InputError: the input cannot be read.
    """
    name = display_name(path)
    triage = Triage(ruleset, name, max_candidates=max_candidates)
    _with_dumps(triage, dumps)
    feed_file(triage, path, name, stdin)
    return triage.report()


def triage_job(
    paths: list[str],
    ruleset: Ruleset,
    name: str | None = None,
    dumps: FlightRecorder | Sequence[str] | None = None,
) -> Report:
    """Triage several files of one job (per-rank logs) as one input, so facts span ranks.

    Line numbers stay per file (every event keeps its ``source``); context windows in lines
    apply within a file, and across files the seconds window applies when both lines carry a
    time (see :mod:`nccl_triage.diagnose.engine`). ``dumps`` as for :func:`triage_path`.

    Raises:
        InputError: one of the files cannot be read.
    """
    source = name or (paths[0] if len(paths) == 1 else f"{len(paths)} files")
    triage = Triage(ruleset, source, max_candidates=job_budget(len(paths)))
    _with_dumps(triage, dumps)
    for path in paths:
        feed_file(triage, path)
    return triage.report()


def _with_dumps(triage: Triage, dumps: FlightRecorder | Sequence[str] | None) -> None:
    if dumps is None:
        return
    if isinstance(dumps, str):
        triage.read_dumps([dumps])
    elif isinstance(dumps, Sequence):
        if dumps:
            triage.read_dumps([str(d) for d in dumps])
    else:
        triage.flight_recorder = dumps


def job_budget(files: int) -> int:
    """The candidate lines read per file of a job of ``files`` files: one budget per job."""
    return max(MIN_FILE_CANDIDATES, MAX_CANDIDATES // max(1, files))


def triage_text(
    text: str,
    ruleset: Ruleset,
    source: str = "<text>",
    dumps: FlightRecorder | Sequence[str] | None = None,
) -> Report:
    """Triage a log given as a string (rule examples, tests); ``dumps`` as for triage_path."""
    triage = Triage(ruleset, source)
    _with_dumps(triage, dumps)
    triage.feed(text.encode("utf-8", "surrogateescape"))
    triage.close()
    return triage.report()


def parse_path(path: str, stdin: IO[bytes] | None = None) -> Report:
    """Read one input and parse its events only (no signals, no diagnosis): ``parse``.

    Raises:
        InputError: the input cannot be read.
    """
    name = display_name(path)
    triage = Triage(Ruleset(rules=[], signals=[]), name, diagnose=False)
    feed_file(triage, path, name, stdin)
    return triage.report()


def parse_text(text: str, source: str = "<text>") -> Report:
    """Parse a log given as a string (tests)."""
    triage = Triage(Ruleset(rules=[], signals=[]), source, diagnose=False)
    triage.feed(text.encode("utf-8", "surrogateescape"))
    triage.close()
    return triage.report()

"""The candidate scan: only lines holding an anchor phrase go on to the grammar and signals.

Input: bytes, pushed in chunks of any size (a file read in 8 MiB pieces, a pipe read as data
arrives). Output: :class:`Candidate` lines with their physical line numbers and a few
neighbouring lines (terminals hard-wrap long messages, so the parser may need to join them;
a line holding none of the grammar's anchors, only a context signal's, comes without them),
and a bounded :class:`History` of the most recent complete lines, from which the diagnosis
reads the context of a failure.

One scanner serves files and streams. One search engine (:mod:`nccl_triage.ingest.engines`: a
Hyperscan database, or an RE2 alternation where Hyperscan is not installed, with the same
lines) runs over each chunk where it lies (no copy of the chunk): only the line that straddles
two chunks is joined. Python code runs per candidate line, never per line; newlines are
counted by ``bytes.count`` on small ranges and by ``numpy`` on large ranges of large inputs
(about 3x faster; its import costs 0.05 s): one comparison per range into a reused buffer, then
every newline found where candidates are dense (their line numbers and bounds by one search),
or those between candidates counted where they are sparse. A line of many megabytes is never
held whole (see :class:`_LongLine`), so memory stays bounded whatever the line lengths.

The scan of a chunk can also be done in another process (:class:`Prescanner`, run by the
live pump) and handed to the scanner with the chunk (:class:`Prescanned`, plain bytes on the
wire); the scanner uses it only for the very range it would scan itself.
"""

from __future__ import annotations

import itertools
import operator
import struct
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from nccl_triage.ingest.anchors import ANCHORS
from nccl_triage.ingest.engines import (
    REGEX_PREFIX,
    Engine,
    HyperscanEngine,
    scan_engine,
    split_anchors,
)
from nccl_triage.ingest.regex import compile_bytes_alternation

LOOKBEHIND = 2  # physical lines kept before a candidate (a message wrapped before its anchor)
LOOKAHEAD = 16  # physical lines kept after it (wrapped messages, the ChildFailedError block)
MAX_LINE = 64 << 10  # longer lines are cut: a candidate around its anchor, others to their start
LONG_LINE = 1 << 20  # an unfinished line longer than this is scanned as it grows, never held
HISTORY_BYTES = 4 << 20  # complete lines kept for context windows (at least the last region)
_NL = 10
_NUMPY_AFTER = 256 << 20  # numpy is imported once an input has been this large
_VECTOR = 64 << 10  # a range this large has its candidates' line numbers worked out by numpy
_DENSE = 4 << 10  # ... by finding every newline where a candidate falls at least this often
# a small range (at most _SPLIT_MOST bytes) where a candidate falls at least every
# _SPLIT_DENSE bytes is split at its newlines: a small log's lines are nearly all candidates
# (loss dicts), which one split finds faster than one search before and after each
_SPLIT_DENSE = 256
_SPLIT_MOST = 1 << 20
_np: Any = None  # the numpy module, once imported


@dataclass(slots=True)
class Candidate:
    r"""A physical line that holds an anchor, with its neighbours (raw bytes, no ``\n``).

    Never changed once made (not frozen: a frozen dataclass costs twice as much to build,
    and the scan builds one per candidate line).
    """

    lineno: int
    raw: bytes
    before: tuple[bytes, ...]  # closest last
    after: tuple[bytes, ...]  # closest first
    # whether the grammar may read it: False for a line holding none of the scanner's
    # ``neighbours`` anchors (only a context signal's), which goes without neighbours
    grammar: bool = True


@cache
def _marks(engine: HyperscanEngine, neighbours: tuple[str, ...]) -> list[bool]:
    return engine.marks(neighbours)


def regex_anchor(regex: str) -> str:
    """Mark a regular expression as an anchor of the scan."""
    return REGEX_PREFIX + regex


@cache
def compile_anchors(anchors: tuple[str, ...]) -> Any:
    """Compile anchors into one RE2 alternation over bytes.

    Literals, and regular expressions marked by :func:`regex_anchor`.
    """
    return compile_bytes_alternation(*split_anchors(anchors))


def load_numpy() -> None:
    """Import numpy for the newline counts of large inputs now (else after _NUMPY_AFTER)."""
    global _np
    if _np is None:
        import numpy  # pandas' dependency

        _np = numpy


class _Newlines:
    """A range's newlines as numpy sees them, compared into one reused buffer.

    A fresh buffer per range would be fresh pages for the kernel to zero at every chunk (a
    third of the scan's time on a stream of 1 MiB chunks).
    """

    def __init__(self) -> None:
        self._mask: Any = None

    def mask(self, buf: bytes, start: int, end: int) -> Any:
        """Which bytes of ``buf[start:end]`` are newlines, valid until the next call."""
        n = end - start
        if self._mask is None or len(self._mask) < n:
            self._mask = _np.empty(n, dtype=_np.bool_)
        view = _np.frombuffer(buf, dtype=_np.uint8, count=n, offset=start)
        return _np.equal(view, _NL, out=self._mask[:n])


def _clip(buf: bytes, start: int, end: int, at: int | None = None) -> bytes:
    """The line ``buf[start:end]``: MAX_LINE bytes around offset ``at``, or from its start."""
    if end - start <= MAX_LINE:
        return buf[start:end]
    if at is None:
        return buf[start : start + MAX_LINE]
    lo = start + max(0, min(at - start - MAX_LINE // 2, end - start - MAX_LINE))
    return buf[lo : lo + MAX_LINE]


def _lines_before(buf: bytes, line_start: int, n: int, floor: int) -> list[bytes]:
    """Up to ``n`` lines ending just before ``line_start``, none starting before ``floor``."""
    out: list[bytes] = []
    end = line_start - 1  # the newline that ends the previous line
    while len(out) < n and end >= floor:
        start = max(buf.rfind(b"\n", floor, end) + 1, floor)
        out.append(_clip(buf, start, end))
        end = start - 1
    out.reverse()
    return out


def _lines_of(
    buf: bytes, start: int, end: int, found: list[int], newlines: _Newlines
) -> tuple[list[tuple[int, int, int, int]], int | None]:
    """The lines of ``buf[start:end]`` that ``found`` (ascending offsets) fall in, once each.

    As ``(offset, index, line_start, line_end)`` (``line_end`` at its newline), and the
    newlines of the whole range. Where numpy is loaded (large inputs) and the range is large,
    ``index`` is the line's number in the range and the count is the total: one comparison of
    the range with a newline, then either every newline found (dense offsets, at least one per
    :data:`_DENSE` bytes) or the newlines between sparse candidates' lines counted. A small
    dense range is split at its newlines (:func:`_lines_split`), with the same index and count.
    Else ``index`` is -1 and the count None: the caller counts as it goes.
    """
    rows: list[tuple[int, int, int, int]] = []
    numpy = _np is not None and end - start >= _VECTOR
    if not numpy and found and end - start <= min(_SPLIT_MOST, len(found) * _SPLIT_DENSE):
        return _lines_split(buf, start, end, found)
    if numpy and found and len(found) * _DENSE >= end - start:
        nl = _np.flatnonzero(newlines.mask(buf, start, end))
        index = _np.searchsorted(nl, _np.asarray(found) - start)
        ends = nl[index]  # the range ends with a newline: every offset has one after it
        starts = _np.where(index > 0, nl[index - 1] + 1, 0)
        last = -1
        for at, i, a, b in zip(found, index.tolist(), starts.tolist(), ends.tolist(), strict=True):
            if i != last:
                rows.append((at, i, start + a, start + b))
                last = i
        return rows, len(nl)
    pos = start
    rfind, find = buf.rfind, buf.find
    # sparse: with numpy, the newlines between candidates' lines counted, not found
    eq = newlines.mask(buf, start, end) if numpy else None
    count: Any = _np.count_nonzero if numpy else None
    index, counted = -1, 0
    for at in found:
        if at < pos:
            continue  # another anchor of the line just read
        line_start = max(rfind(b"\n", start, at) + 1, start)
        line_end = find(b"\n", at, end)
        line_end = end - 1 if line_end < 0 else line_end
        if eq is not None:
            index = max(index, 0) + int(count(eq[counted : line_start - start]))
            counted = line_start - start
        rows.append((at, index, line_start, line_end))
        pos = line_end + 1
    if eq is None:
        return rows, None
    return rows, max(index, 0) + int(count(eq[counted:]))


def _lines_split(
    buf: bytes, start: int, end: int, found: list[int]
) -> tuple[list[tuple[int, int, int, int]], int]:
    """:func:`_lines_of` for a small range where most lines hold an offset (a small log).

    One split of the range gives every newline (their offsets summed up without a Python
    loop); each offset's line is found among them by bisection. Its rows are those of the
    other ways, with each line's index in the range, and the range's newlines.
    """
    lengths = map(len, buf[start:end].split(b"\n"))
    # offset of the newline that ends each line (the last piece has none)
    nl = list(map(operator.add, itertools.accumulate(lengths), itertools.count()))
    nl.pop()
    rows: list[tuple[int, int, int, int]] = []
    last = -1
    for at in found:
        k = bisect_left(nl, at - start)
        if k == last:
            continue  # another anchor of the line just read
        last = k
        line_start = start + nl[k - 1] + 1 if k else start
        line_end = start + nl[k] if k < len(nl) else end - 1
        rows.append((at, k, line_start, line_end))
    return rows, len(nl)


def _lines_from(buf: bytes, pos: int, n: int, end: int) -> list[bytes]:
    """Up to ``n`` lines starting at ``pos``, none past ``end`` (each ends with a newline)."""
    out: list[bytes] = []
    while len(out) < n and pos < end:
        nl = buf.find(b"\n", pos, end)
        if nl < 0:
            nl = end
        out.append(_clip(buf, pos, nl))
        pos = nl + 1
    return out


class _Ahead:
    """The LOOKAHEAD lines after each candidate of one buffer, split in bulk.

    One split of a window of the buffer gives them (lines are mostly short); a window too
    small for them grows (up to _AHEAD_MAX), past which long lines are read one by one.
    """

    def __init__(self, buf: bytes, end: int) -> None:
        self._buf, self._end = buf, end
        self._window = _AHEAD_WINDOW

    def lines(self, pos: int) -> list[bytes]:
        """Up to LOOKAHEAD lines starting at ``pos``."""
        buf, end, n = self._buf, self._end, LOOKAHEAD
        if n <= 0:
            return []
        while True:
            stop = min(end, pos + self._window)
            parts = buf[pos:stop].split(b"\n", n)
            if len(parts) > n:  # n complete lines, and what follows them
                del parts[n:]
                break
            parts.pop()  # after the window's last newline: the buffer's end, or a cut line
            if stop == end:
                break
            if self._window >= _AHEAD_MAX:
                done = pos + sum(len(x) + 1 for x in parts)
                return [_cut(x) for x in parts] + _lines_from(buf, done, n - len(parts), end)
            self._window *= 4
        if self._window <= MAX_LINE:
            return parts  # no line is longer than the window
        return [_cut(x) for x in parts]


_AHEAD_WINDOW = 8 << 10  # the first window split for a candidate's lines after
_AHEAD_MAX = 256 << 10  # the largest


def _cut(line: bytes) -> bytes:
    """A neighbour line: its first MAX_LINE bytes."""
    return line if len(line) <= MAX_LINE else line[:MAX_LINE]


# ----------------------------------------------------------------------------- history


@dataclass(frozen=True, slots=True)
class _Region:
    """Complete lines of the history, as they lie in one chunk's buffer."""

    first: int  # number of the region's first line
    count: int  # how many lines it holds (each ends with a newline in buf)
    buf: bytes
    start: int
    end: int


class History:
    """The most recent complete lines of one input, for the context of a failure.

    Holds whole scanned regions by reference (no copy) and drops the oldest once more than
    ``limit`` bytes are held, always keeping the newest region. A line too long to hold is
    kept as its first MAX_LINE bytes.
    """

    def __init__(self, limit: int = HISTORY_BYTES) -> None:
        self.limit = limit
        self._regions: deque[_Region] = deque()
        self._size = 0

    @property
    def first_line(self) -> int | None:
        """The oldest line still held, or None when nothing is."""
        return self._regions[0].first if self._regions else None

    @property
    def next_line(self) -> int | None:
        """The number after the newest line held, or None when nothing is."""
        last = self._regions[-1] if self._regions else None
        return last.first + last.count if last is not None else None

    def add(self, first: int, count: int, buf: bytes, start: int, end: int) -> None:
        """Keep ``count`` lines (``buf[start:end]``, ending with a newline) from line ``first``."""
        if count <= 0:
            return
        nxt = self.next_line
        if nxt is not None and nxt != first:
            self.clear()  # a gap (skipped bytes): the lines before it are no context any more
        self._regions.append(_Region(first, count, buf, start, end))
        self._size += end - start
        while len(self._regions) > 1 and self._size > self.limit:
            old = self._regions.popleft()
            self._size -= old.end - old.start

    def clear(self) -> None:
        """Forget every line held."""
        self._regions.clear()
        self._size = 0

    def lines(self, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """The lines numbered ``lo`` to ``hi - 1`` that are still held, clipped to MAX_LINE."""
        out: list[tuple[int, bytes]] = []
        for r in self._regions:
            a, b = max(lo, r.first), min(hi, r.first + r.count)
            if a >= b:
                continue
            pos = self._offset(r, a - r.first)
            # (one split for the lines, the rest of the region after them in one piece)
            raws = r.buf[pos : r.end].split(b"\n", b - a)
            for n, raw in zip(range(a, b), raws, strict=False):
                out.append((n, raw if len(raw) <= MAX_LINE else raw[:MAX_LINE]))
        return out

    @staticmethod
    def _offset(r: _Region, k: int) -> int:
        """Offset in ``r.buf`` where the region's ``k``-th line starts (from the nearer end)."""
        if k <= r.count - k:
            pos = r.start
            for _ in range(k):
                pos = r.buf.find(b"\n", pos, r.end) + 1
            return pos
        pos = r.end - 1  # the newline of the last line
        for _ in range(r.count - k):
            pos = r.buf.rfind(b"\n", r.start, pos)
        return pos + 1


# ----------------------------------------------------------------------------- scanned elsewhere


_PRESCANNED = struct.Struct("!QQQ?")


@dataclass(frozen=True, slots=True)
class Prescanned:
    """The candidate scan of a chunk's complete lines, done in another process (a live pump).

    ``start``/``end``: the range of the chunk scanned, as :meth:`Scanner.feed` cuts it;
    ``found`` and ``marked`` as :meth:`HyperscanEngine.marked_hits` gives them (``marking``:
    whether lines holding a grammar's anchor were marked). A scanner uses them only for that
    very range, and only where it would mark lines alike; else it scans the chunk itself.
    """

    start: int
    end: int
    found: list[int]
    marked: list[int]
    marking: bool

    def encode(self) -> bytes:
        """Plain bytes: a header and two arrays of 64-bit offsets."""
        head = _PRESCANNED.pack(self.start, self.end, len(self.found), self.marking)
        return head + array("q", self.found + self.marked).tobytes()

    @classmethod
    def decode(cls, payload: bytes) -> Prescanned | None:
        """What :meth:`encode` wrote; None for bytes of any other form."""
        size = _PRESCANNED.size
        if len(payload) < size or (len(payload) - size) % 8:
            return None
        start, end, n, marking = _PRESCANNED.unpack_from(payload)
        offsets = array("q")
        offsets.frombytes(payload[size:])
        if n > len(offsets):
            return None
        found, marked = offsets[:n].tolist(), offsets[n:].tolist()
        for some in (found, marked):
            if some and (some[0] < start or some[-1] >= end or some != sorted(some)):
                return None
        return cls(start, end, found, marked, marking)


class Prescanner:
    """The candidate scan of a stream's chunks, for the :class:`Scanner` of another process.

    Built from the anchors that scanner looks for (Hyperscan only: :meth:`make` gives None
    for another engine).
    """

    def __init__(self, engine: HyperscanEngine, marks: list[bool] | None) -> None:
        self.engine = engine
        self._marks = marks

    @classmethod
    def make(cls, anchors: Sequence[str], neighbours: Sequence[str] | None) -> Prescanner | None:
        """The prescanner of a :class:`Scanner` of these arguments (None: not Hyperscan's).

        Raises:
            TriageError: ``NCCL_TRIAGE_SCAN`` names no engine.
        """
        engine = scan_engine(tuple(anchors))
        if not isinstance(engine, HyperscanEngine):
            return None
        marks = _marks(engine, tuple(neighbours)) if neighbours is not None else None
        return cls(engine, marks)

    def scan(self, data: bytes, starts_line: bool) -> Prescanned | None:
        """What a scanner fed ``data`` finds in its complete lines (None: it has none).

        ``starts_line``: the stream's bytes before ``data`` end with a newline (or there are
        none): its first line is whole.
        """
        first = data.find(b"\n")
        start, end = (0 if starts_line else first + 1), data.rfind(b"\n") + 1
        if first < 0 or start >= end:
            return None
        marks = self._marks
        marked: set[int] | None = set() if marks is not None else None
        found = self.engine.marked_hits(data, start, end, marked, marks or ())
        return Prescanned(start, end, found, sorted(marked or ()), marks is not None)


# ----------------------------------------------------------------------------- the scanner


@dataclass(slots=True)
class _Pending:
    """A candidate line waiting for its look-ahead lines."""

    lineno: int
    raw: bytes
    before: tuple[bytes, ...]
    after: list[bytes]
    since: float
    wants: int  # lines after it that it waits for (LOOKAHEAD; 0 for a signal's line)
    grammar: bool = True  # as Candidate.grammar

    def done(self) -> Candidate:
        return Candidate(self.lineno, self.raw, self.before, tuple(self.after), self.grammar)


class Scanner:
    """The candidate scan of one input, fed chunk by chunk.

    Yields the same candidates however the input is cut into chunks; :meth:`flush` hands out
    candidates that waited long enough with the look-ahead they have (a job that hangs after
    its timeout lines never prints sixteen more), and :meth:`skip` accounts for bytes a live
    pump had to drop, so line numbers stay right.
    """

    def __init__(
        self,
        anchors: Sequence[str] = ANCHORS,
        history: int = HISTORY_BYTES,
        engine: str | None = None,
        neighbours: Sequence[str] | None = None,
    ) -> None:
        """Start a scan for ``anchors``; ``engine`` as ``NCCL_TRIAGE_SCAN`` (None: the variable).

        ``neighbours``: the anchors whose lines the grammar reads (None: all of them). A
        candidate holding none of them (only a context signal's anchor) comes at once, without
        the lines around it: nothing reads them, and gathering them is most of a candidate's
        cost in the scan. A line holding a terminal code counts as holding one (removing the
        code may join an anchor's words).
        """
        self._anchors = tuple(anchors)
        self.engine: Engine = scan_engine(self._anchors, engine)
        self._sparse = neighbours is not None  # some candidates go without neighbours
        self._newlines = _Newlines()
        # which of the engine's anchors are the grammar's: the scan itself then marks the
        # lines holding one (Hyperscan); else each line is searched for them (RE2)
        self._marks: list[bool] | None = None
        self._grammar: Engine | None = None
        if neighbours is not None and isinstance(self.engine, HyperscanEngine):
            self._marks = _marks(self.engine, tuple(neighbours))
        elif neighbours is not None:
            self._grammar = scan_engine(tuple(neighbours), engine)
        self._partial = b""  # the unfinished last line, while it is short
        self._long: _LongLine | None = None  # the unfinished last line once it is long
        self._prev: deque[bytes] = deque(maxlen=LOOKBEHIND)  # last complete lines, clipped
        self._lineno = 1  # number of the line being assembled
        self._pending: deque[_Pending] = deque()
        self._done: list[Candidate] = []  # complete, in order, before any pending one
        self.bytes = 0
        self.history = History(history)

    @property
    def lines(self) -> int:
        """Physical lines so far, counting an unfinished last line."""
        return self._lineno - 1 + (1 if self._partial or self._long is not None else 0)

    @property
    def complete_lines(self) -> int:
        """Lines that ended with a newline so far."""
        return self._lineno - 1

    @property
    def oldest_pending(self) -> float | None:
        """When the oldest held candidate was found, or None."""
        return self._pending[0].since if self._pending else None

    def feed(self, data: bytes, now: float = 0.0, pre: Prescanned | None = None) -> list[Candidate]:
        """Take the next bytes; return the candidates whose look-ahead is complete.

        ``pre``: these bytes' scan, done by a :class:`Prescanner` (used where it fits).
        """
        if not data:
            return []
        self.bytes += len(data)
        if self.bytes > _NUMPY_AFTER and _np is None:
            load_numpy()
        first = data.find(b"\n")
        if first < 0:
            self._grow(data, now)
            return []
        last = data.rfind(b"\n")
        if not self._partial and self._long is None:  # the data starts a line: one scan
            self._scan(data, 0, last + 1, now, pre=pre)
        else:
            self._finish_line(data, first, now)
            if last > first:
                self._scan(data, first + 1, last + 1, now, pre=pre)
        self._grow(data[last + 1 :], now)
        return self._ready()

    def skip(self, nbytes: int, newlines: int, tail: bytes, now: float = 0.0) -> list[Candidate]:
        """Account for ``nbytes`` bytes holding ``newlines`` newlines that were not seen.

        ``tail`` is the end of the skipped bytes after their last newline (the start of the
        line that continues after the gap). Held candidates are handed out at once: the lines
        after them are gone, and so is the context before the gap.
        """
        self.bytes += nbytes
        if newlines <= 0:
            return []  # the middle of the unfinished line is missing; the line goes on
        self._finish_line(b"", 0, now)
        self._lineno += newlines - 1
        self._prev.clear()
        self.history.clear()
        out = self._all()
        self._grow(tail, now)
        return out

    def flush(self, found_before: float) -> list[Candidate]:
        """Hand out every held candidate once the oldest was found before ``found_before``.

        They go with the look-ahead they have, all together: a burst of timeout lines stays
        in one report. A candidate inside an unfinished line stays: its line may still grow.
        """
        if not self._pending or self._pending[0].since > found_before:
            return []
        return self._all()

    def close(self) -> list[Candidate]:
        """End of input: the unfinished line is the last line; hand out everything."""
        if self._partial or self._long is not None:
            self._finish_line(b"", 0, 0.0)  # the last line had no newline of its own
        self._newlines = _Newlines()  # its buffer goes (a job keeps its inputs' scanners)
        return self._all()

    def _grow(self, data: bytes, now: float) -> None:
        """Add bytes to the unfinished last line (never holding more than LONG_LINE of it)."""
        if not data:
            return
        if self._long is not None:
            self._long.feed(data)
            return
        self._partial += data
        if len(self._partial) > LONG_LINE:
            literal = [a for a in self._anchors if not a.startswith(REGEX_PREFIX)]
            overlap = max((len(a.encode()) for a in literal), default=1) - 1
            self._long = _LongLine(self.engine.pattern, overlap)
            self._long.feed(self._partial)
            self._partial = b""

    def _finish_line(self, data: bytes, nl: int, now: float) -> None:
        """Complete the line being assembled with ``data[:nl]`` and scan it."""
        if self._long is not None:
            long_line, self._long = self._long, None
            long_line.feed(memoryview(data)[:nl])
            head, window = long_line.essence()
            lineno, before = self._lineno, tuple(self._prev)
            # the line as a neighbour and as context is its start
            self._scan(head + b"\n", 0, len(head) + 1, now, scan=False)
            if window is not None:
                self._pending.append(_Pending(lineno, window, before, [], now, LOOKAHEAD))
        else:
            line = self._partial + data[:nl] + b"\n"
            self._partial = b""
            self._scan(line, 0, len(line), now)

    def _scan(
        self,
        buf: bytes,
        start: int,
        end: int,
        now: float,
        scan: bool = True,
        pre: Prescanned | None = None,
    ) -> None:
        """Scan the complete lines of ``buf[start:end]`` (which ends with a newline)."""
        if self._pending and LOOKAHEAD:
            need = max(p.wants - len(p.after) for p in self._pending)
            if need > 0:
                head = _lines_from(buf, start, need, end)
                for p in self._pending:
                    p.after.extend(head[: p.wants - len(p.after)])
            # those now complete go first (the candidates of this range need not queue)
            pending = self._pending
            while pending and len(pending[0].after) >= pending[0].wants:
                self._done.append(pending.popleft().done())
        first = self._lineno
        lineno, counted = first, start
        ahead = _Ahead(buf, end)
        marks = self._marks
        marked: set[int] | None = None
        if not scan:
            found: list[int] = []
        elif (
            pre is not None
            and (pre.start, pre.end) == (start, end)
            and pre.marking == (marks is not None)
            and isinstance(self.engine, HyperscanEngine)
        ):
            found = pre.found
            marked = set(pre.marked) if marks is not None else None
        elif marks is not None and isinstance(self.engine, HyperscanEngine):
            marked = set()
            found = self.engine.marked_hits(buf, start, end, marked, marks)
        else:
            found = self.engine.hits(buf, start, end)
        rows, newlines = _lines_of(buf, start, end, found, self._newlines)
        for at, index, line_start, line_end in rows:
            if line_end - line_start > MAX_LINE:
                at = self.engine.leftmost(buf, line_start, line_end)  # the window is around it
            if index < 0:
                lineno += buf.count(b"\n", counted, line_start)
                counted = line_start
            else:
                lineno = first + index
            raw = _clip(buf, line_start, line_end, at)
            if not self._wants_neighbours(buf, line_start, line_end, marked):
                if self._pending:  # after the held ones, in order
                    self._pending.append(_Pending(lineno, raw, (), [], now, 0, False))
                else:
                    self._done.append(Candidate(lineno, raw, (), (), False))
                continue
            before = _lines_before(buf, line_start, LOOKBEHIND, start)
            missing = LOOKBEHIND - len(before)
            if missing > 0 and self._prev:
                before = list(self._prev)[-missing:] + before
            after = ahead.lines(line_end + 1)
            if len(after) >= LOOKAHEAD and not self._pending:
                self._done.append(Candidate(lineno, raw, tuple(before), tuple(after)))
            else:  # its lines after are in the next chunk
                self._pending.append(_Pending(lineno, raw, tuple(before), after, now, LOOKAHEAD))
        if newlines is None:  # counted up to the last candidate line: the rest now
            newlines = (lineno - first) + buf.count(b"\n", counted, end)
        total = newlines
        if LOOKBEHIND:
            self._prev.extend(_lines_before(buf, end, LOOKBEHIND, start))
        self.history.add(first, total, buf, start, end)
        self._lineno = first + total

    def _wants_neighbours(
        self, buf: bytes, line_start: int, line_end: int, marked: set[int] | None
    ) -> bool:
        """Whether the grammar may read the line ``buf[line_start:line_end]``.

        ``marked``: the starts of the lines the scan saw a grammar's anchor in, if it did.
        """
        if not self._sparse or line_end - line_start > MAX_LINE:
            return True
        if buf.find(b"\x1b", line_start, line_end) >= 0:
            return True
        if marked is not None:
            return line_start in marked
        return self._grammar is None or bool(self._grammar.hits(buf, line_start, line_end + 1))

    def _ready(self) -> list[Candidate]:
        out, self._done = self._done, []
        while self._pending and len(self._pending[0].after) >= self._pending[0].wants:
            out.append(self._pending.popleft().done())
        return out

    def _all(self) -> list[Candidate]:
        """Every candidate found, complete or not."""
        out, self._done = self._done, []
        out.extend(p.done() for p in self._pending)
        self._pending.clear()
        return out


def scan(
    chunks: Iterable[bytes],
    anchors: tuple[str, ...] = ANCHORS,
    stats: dict[str, int] | None = None,
    engine: str | None = None,
) -> Iterator[Candidate]:
    r"""Yield every physical line of the byte stream that holds one of ``anchors``.

    Lines are split on ``\n`` only (a ``\r`` stays in the line) and numbered from 1; a last
    line without ``\n`` counts. Each candidate comes once, in order, with up to
    ``LOOKBEHIND`` lines before it and ``LOOKAHEAD`` after it. A line longer than
    ``MAX_LINE`` is cut to ``MAX_LINE`` bytes: around its first anchor when it is the
    candidate, from its start when it is a neighbour.

    ``stats`` (when given) receives ``lines``: the number of physical lines, and ``bytes``.
    ``engine`` as ``NCCL_TRIAGE_SCAN`` (None: the variable decides).
    """
    scanner = Scanner(anchors, history=0, engine=engine)
    for data in chunks:
        yield from scanner.feed(data)
    yield from scanner.close()
    if stats is not None:
        stats["bytes"] = scanner.bytes
        stats["lines"] = scanner.lines


# ----------------------------------------------------------------------------- long lines


class _LongLine:
    """An unfinished line too long to hold: its start, and the window around its first anchor.

    Pieces are searched where they lie; only ``overlap`` bytes on each side of a boundary are
    joined, to see an anchor split between two pieces.
    """

    def __init__(self, pattern: Any, overlap: int) -> None:
        self.pattern = pattern
        self.overlap = overlap  # longest anchor - 1
        self.length = 0
        self.head = b""
        self.at = -1  # offset of the first anchor in the line
        self.window = b""  # the line from window_start, as far as the candidate needs
        self.window_start = 0
        self.recent = b""  # the last MAX_LINE + overlap bytes before the next piece

    def _window_end(self) -> int:
        return max(self.at + MAX_LINE - MAX_LINE // 2, MAX_LINE)

    def feed(self, piece: bytes | memoryview) -> None:
        if not len(piece):
            return
        if len(self.head) < MAX_LINE:
            self.head += bytes(piece[: MAX_LINE - len(self.head)])
        if self.at < 0:
            self._find(piece)
        else:
            need = self._window_end() - (self.window_start + len(self.window))
            if need > 0:
                self.window += bytes(piece[:need])
        keep = MAX_LINE + self.overlap
        self.recent = (self.recent + bytes(piece[-keep:]))[-keep:]
        self.length += len(piece)

    def _find(self, piece: bytes | memoryview) -> None:
        k = min(self.overlap, len(self.recent))  # a match across the boundary starts here
        m = None
        if k:
            m = self.pattern.search(self.recent[-k:] + bytes(piece[: self.overlap]))
            if m is not None and m.start() >= k:
                m = None  # wholly inside the piece: the search below finds it (or an earlier one)
        if m is not None:
            self.at = self.length - k + m.start()
        else:
            m = self.pattern.search(piece)
            if m is None:
                return
            self.at = self.length + m.start()
        self.window_start = max(0, self.at - MAX_LINE)
        end = self._window_end()
        if self.window_start >= self.length:
            self.window = bytes(piece[self.window_start - self.length : end - self.length])
        else:  # it begins in recent, the bytes before the piece
            before = self.recent[len(self.recent) - (self.length - self.window_start) :]
            self.window = before + bytes(piece[: end - self.length])

    def essence(self) -> tuple[bytes, bytes | None]:
        """The line's first MAX_LINE bytes, and its candidate window (None: no anchor)."""
        if self.at < 0:
            return self.head, None
        lo = max(0, min(self.at - MAX_LINE // 2, self.length - MAX_LINE))
        i = lo - self.window_start
        return self.head, self.window[i : i + MAX_LINE]

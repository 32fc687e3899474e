"""Whole-chunk candidate scan: only lines holding an anchor phrase go on to the grammar.

Input: a binary stream and a list of literal anchor phrases. Output: :class:`Candidate` lines
with their physical line numbers and a few neighbouring lines (terminals hard-wrap long
messages, so the parser may need to join them).

One compiled RE2 alternation runs over each 8 MiB chunk where it lies (no copy of the chunk):
only the few lines around a chunk boundary are joined in a small seam buffer. Python code runs
per match, never per line. Each byte is counted for newlines once, by ``bytes.count`` on small
ranges and by ``numpy`` on large ranges of large inputs (2-3x faster; its import costs 0.15 s).
Lines of many megabytes leave the buffer (see :func:`_set_aside`), so memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import re2

from nccl_triage.ingest.reader import CHUNK_SIZE

# Literal phrases that start (or survive the hard-wrapping of) every message family of the
# format reference. A line holding none of them never reaches the grammar. Several phrases
# cover one family on purpose: a terminal may wrap a message in the middle of any one of them.
ANCHORS: tuple[str, ...] = (
    # family 1: watchdog timeout, every era; blocking wait
    "Watchdog caught",
    "ollective operation timeout",
    "WorkNCCL(",
    "timed out in blocking wait",
    # family 2: status lines, desync report, flight-recorder traceback
    "Timeout at NCCL work",
    "either an error or timeout",
    "detected by watchdog",
    "watchdog at work",
    "last enqueued",
    "To our best knowledge",
    "joined but didn't finish",
    "didn't join collective",
    "Snapshot of ranks' latest states",
    "] started ",  # "[0, 1, 2, 3] started ALLREDUCE" in the desync snapshot
    "] finished ",
    "started ranks:",
    "finished ranks:",
    "Timeout at collective",
    "DESYNC_DEBUG report",
    "Stack trace of the failed collective",
    "flight recorder dumps to finish",
    "Not all ranks joining collective",
    # family 3: tear-down
    "Some NCCL operations have failed",
    "To avoid data inconsistency",
    "watchdog thread terminated",
    "terminate called after throwing",
    # family 4: heartbeat monitor, dump signals, fatal termination
    "watchdog got stuck",
    "Heartbeat monitor timed out",
    "no heartbeat of its watchdog",
    "monitor thread timeout",
    "dump signal",
    "signal dumping",
    "Received a global",
    "preparing to dump debug info",
    "Terminating the process after",
    "onitor thread is disabled",
    "onitor Thread is disabled",
    "should dump",
    "Could not acquire GIL",
    # family 5: NCCL errors through PyTorch, libnccl's own lines
    "NCCL error",
    "NCCL timeout in",
    "communicator was aborted",
    "ncclInvalidUsage",
    "ncclRemoteError",
    "ncclSystemError",
    "ncclInternalError",
    "ncclUnhandledCudaError",
    "ncclInvalidArgument",
    "Unknown NCCL error",
    "Last error:",
    "NCCL WARN",
    ".cc:",  # libnccl's error traces "NCCL INFO init.cc:82 -> 3" (its sources are .cc files)
    "Init COMPLETE",
    "NCCL version",
    "NET/Socket : Using",
    "NET/IB : Using",
    "Bootstrap : Using",
    "set by environment to",
    "CUDA error",
    "Cuda failure",
    "Detected mismatch between collectives",
    "CollectiveFingerPrint",
    # family 6: torchrun agent and ChildFailedError
    "failed (exitcode:",
    "closing signal",
    "death signal",
    "got signal:",
    "ChildFailedError",
    "Root Cause",
    "Failures:",
    "Worker group",
    "FAILED with no error file",
    # family 7: stores, rendezvous, sockets
    "waiting for clients",
    "store based barrier",
    "client socket has timed out",
    "client failed to connect",
    "NCCL communicator and retr",
    "Socket Timeout",
    "wait timeout after",
    "Timeout waiting for key",
    "socket has failed to",
    "recvValue failed",
    "ailed to recv, got 0 bytes",
    "RendezvousTimeoutError",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    # family 8: Gloo
    "operation to complete",
    "Connection closed by peer",
    "Read error [",
    "caused pair closure",
    "Unable to find address for",
    # environment variables
    "is deprecated; use TORCH_",
    "has no effect when TORCH_",
)

LOOKBEHIND = 2  # physical lines kept before a candidate (a message wrapped before its anchor)
LOOKAHEAD = 16  # physical lines kept after it (wrapped messages, the ChildFailedError block)
MAX_LINE = (
    64 << 10
)  # longer lines are cut: a candidate to a window around its anchor, others to their start
LONG_LINE = (
    8 * MAX_LINE
)  # lines longer than this leave the buffer when it overflows (see _set_aside)
MAX_BUFFER = CHUNK_SIZE  # unfinished lines held back before long lines are set aside
_NL = 10
_SMALL = 64 << 10  # below this many bytes, bytes.count counts newlines; above, numpy
_BLOCK = 256 << 10  # numpy compares this many bytes at a time (the temporary stays in cache)
_NUMPY_AFTER = 256 << 20  # numpy is imported once an input has been this large
_np: Any = None  # the numpy module, once imported

# Overrides: line number -> (the line's first MAX_LINE bytes, its candidate window or None),
# for lines too long to keep in the buffer, which holds a one-byte placeholder line instead.
_Overrides = dict[int, tuple[bytes, bytes | None]]


@dataclass(frozen=True, slots=True)
class Candidate:
    r"""A physical line that holds an anchor, with its neighbours (raw bytes, no ``\n``)."""

    lineno: int
    raw: bytes
    before: tuple[bytes, ...]  # closest last
    after: tuple[bytes, ...]  # closest first


# An anchor starting with this is an RE2 regular expression rather than a literal (a signal
# pattern written without literal anchors, or one that ignores case).
REGEX_PREFIX = "\x00re:"


def regex_anchor(regex: str) -> str:
    """Mark a regular expression as an anchor of the scan."""
    return REGEX_PREFIX + regex


@cache
def compile_anchors(anchors: tuple[str, ...]) -> Any:
    """Compile anchors into one RE2 alternation over bytes.

    Literals, and regular expressions marked by :func:`regex_anchor`.
    """
    options = re2.Options()
    options.never_capture = True
    literals = sorted({a for a in anchors if not a.startswith(REGEX_PREFIX)}, key=len, reverse=True)
    regexes = [a[len(REGEX_PREFIX) :] for a in dict.fromkeys(anchors) if a.startswith(REGEX_PREFIX)]
    parts = [re2.escape(a.encode()) for a in literals] + [
        b"(?:" + r.encode() + b")" for r in regexes
    ]
    return re2.compile(b"|".join(parts), options)


@cache
def _placeholder(anchors: tuple[str, ...]) -> bytes:
    """A byte that no anchor holds: a placeholder line made of it can never match."""
    literal = (a for a in anchors if not a.startswith(REGEX_PREFIX))
    used = set(b"".join(a.encode() for a in literal)) | {_NL}
    return bytes([next(b for b in range(256) if b not in used)])


def scan(
    chunks: Iterable[bytes], anchors: tuple[str, ...] = ANCHORS, stats: dict[str, int] | None = None
) -> Iterator[Candidate]:
    r"""Yield every physical line of the byte stream that holds one of ``anchors``.

    Lines are split on ``\n`` only (a ``\r`` stays in the line) and numbered from 1; a last
    line without ``\n`` counts. Each candidate comes once, in order, with up to
    ``LOOKBEHIND`` lines before it and ``LOOKAHEAD`` after it. A line longer than
    ``MAX_LINE`` is cut to ``MAX_LINE`` bytes: around its first anchor when it is the
    candidate, from its start when it is a neighbour. Memory stays bounded whatever the line
    lengths (about ``MAX_BUFFER`` plus one chunk).

    ``stats`` (when given) receives ``lines``: the number of physical lines, and ``bytes``.
    """
    pattern = compile_anchors(anchors)
    lb, la = LOOKBEHIND, LOOKAHEAD
    ov: _Overrides = {}
    # The tail of the stream not yet done with: LOOKBEHIND scanned lines (context), then
    # unscanned lines from tail_scan on, the last one maybe unfinished.
    tail = b""
    tail_scan = 0
    tail_base = 1  # line number of the tail's first line
    long_line: _LongLine | None = None  # an unfinished line being set aside piece by piece
    total = 0
    for data in chunks:
        if not data:
            continue
        total += len(data)
        if total > _NUMPY_AFTER and _np is None:
            _load_numpy()
        if long_line is not None:
            nl = data.find(b"\n")
            if nl < 0:
                long_line.feed(data)
                continue
            long_line.feed(memoryview(data)[:nl])
            ov[long_line.lineno] = long_line.essence()
            long_line = None
            tail += _placeholder(anchors)
            data = data[nl:]
        fronts = _first_newlines(data, lb + la + 1)
        mid = fronts[lb] if fronts is not None else -1  # from here on, context is in data
        cut = _cut_point(data, mid) if fronts is not None else -1
        if fronts is not None and cut >= 0:
            # Fast path: no copy of the chunk. The lines of the tail and the first lb + 1 lines
            # of data are scanned in a small seam buffer, the rest of data where it is.
            seam = tail + data[: fronts[-1]]
            yield from _scan_region(pattern, seam, tail_scan, len(tail) + mid, 0, tail_base, ov)
            lineno = tail_base + _count_newlines(tail, 0, len(tail)) + lb + 1
            done = yield from _scan_region(pattern, data, mid, cut, mid, lineno, ov)
            tail, tail_scan, tail_base = _next_tail(data, cut, done)
        else:
            buf = tail + data if tail else data
            cut = _cut_point(buf, tail_scan)
            if cut < 0:  # too few complete lines yet: read on
                tail = buf
            else:
                done = yield from _scan_region(pattern, buf, tail_scan, cut, 0, tail_base, ov)
                tail, tail_scan, tail_base = _next_tail(buf, cut, done)
        if len(tail) > MAX_BUFFER:  # long lines: hold only what the output needs of them
            tail, tail_scan, long_line = _set_aside(anchors, tail, tail_scan, tail_base, ov)
        if ov:
            for k in [k for k in ov if k < tail_base]:
                del ov[k]
    if long_line is not None:
        ov[long_line.lineno] = long_line.essence()
        tail += _placeholder(anchors)
    yield from _scan_region(pattern, tail, tail_scan, len(tail), 0, tail_base, ov)
    if stats is not None:
        stats["bytes"] = total
        unfinished = 1 if tail and not tail.endswith(b"\n") else 0
        stats["lines"] = tail_base - 1 + _count_newlines(tail, 0, len(tail)) + unfinished


def _first_newlines(buf: bytes, n: int) -> list[int] | None:
    """Offsets just past each of the first ``n`` newlines, or None if there are fewer."""
    out: list[int] = []
    pos = 0
    for _ in range(n):
        nl = buf.find(b"\n", pos)
        if nl < 0:
            return None
        pos = nl + 1
        out.append(pos)
    return out


def _cut_point(buf: bytes, scan_from: int) -> int:
    """Offset up to which lines are complete and have LOOKAHEAD lines after them, or -1."""
    pos = len(buf)
    for _ in range(LOOKAHEAD + 1):
        pos = buf.rfind(b"\n", scan_from, pos)
        if pos < 0:
            return -1
    return pos + 1


def _next_tail(buf: bytes, cut: int, done: tuple[int, int]) -> tuple[bytes, int, int]:
    """The new tail after scanning up to ``cut``: LOOKBEHIND lines before it and the rest."""
    keep = cut
    for _ in range(LOOKBEHIND):
        if keep <= 0:
            break
        keep = buf.rfind(b"\n", 0, keep - 1) + 1
    counted_to, lineno = done  # line number of the line starting at counted_to
    if keep >= counted_to:
        lineno += _count_newlines(buf, counted_to, keep)
    else:
        lineno -= _count_newlines(buf, keep, counted_to)
    return buf[keep:], cut - keep, lineno


def _load_numpy() -> None:
    global _np
    if _np is None:
        import numpy  # pandas' dependency

        _np = numpy


def _count_newlines(buf: bytes, start: int, end: int) -> int:
    if _np is None or end - start < _SMALL:
        return buf.count(b"\n", start, end)
    view = _np.frombuffer(buf, dtype=_np.uint8, count=end - start, offset=start)
    return sum(
        int(_np.count_nonzero(view[i : i + _BLOCK] == _NL)) for i in range(0, len(view), _BLOCK)
    )


def _scan_region(
    pattern: Any, buf: bytes, start: int, end: int, counted_to: int, lineno: int, ov: _Overrides
) -> Generator[Candidate, None, tuple[int, int]]:
    """Yield the candidates among the lines that start in ``buf[start:end]``.

    ``lineno`` is the number of the line starting at ``counted_to`` (<= ``start``). Returns the
    last such pair reached, so that the caller counts the remaining newlines only once.
    """
    pending = (
        sorted(k for k, (_, raw) in ov.items() if raw is not None and k >= lineno) if ov else []
    )
    pos = start
    while pos < end:
        m = pattern.search(buf, pos, end)
        if m is None:
            break
        at = m.start()
        line_start = buf.rfind(b"\n", 0, at) + 1
        line_no = lineno + _count_newlines(buf, counted_to, line_start)
        if pending and pending[0] < line_no:
            yield from _set_aside_candidates(buf, counted_to, lineno, line_no, end, pending, ov)
        counted_to, lineno = line_start, line_no
        line_end = buf.find(b"\n", at)
        if line_end < 0:
            line_end = len(buf)
        yield Candidate(
            lineno=line_no,
            raw=_window(buf, line_start, line_end, at),
            before=_lines_before(buf, line_start, LOOKBEHIND, line_no, ov),
            after=_lines_after(buf, line_end, LOOKAHEAD, line_no, ov),
        )
        pos = line_end + 1
    if pending:
        counted_to, lineno = yield from _set_aside_candidates(
            buf, counted_to, lineno, 1 << 62, end, pending, ov
        )
    return counted_to, lineno


def _set_aside_candidates(
    buf: bytes,
    counted_to: int,
    lineno: int,
    below: int,
    end: int,
    pending: list[int],
    ov: _Overrides,
) -> Generator[Candidate, None, tuple[int, int]]:
    """Yield the set-aside candidates numbered below ``below`` whose lines start before ``end``."""
    while pending and pending[0] < below:
        k = pending[0]
        pos = counted_to
        for _ in range(k - lineno):
            nl = buf.find(b"\n", pos)
            if nl < 0:
                return counted_to, lineno
            pos = nl + 1
        if pos >= end:
            break
        pending.pop(0)
        head, raw = ov[k]
        assert raw is not None
        ov[k] = (head, None)  # yielded: a neighbour from now on
        line_end = buf.find(b"\n", pos)
        if line_end < 0:
            line_end = len(buf)
        yield Candidate(
            lineno=k,
            raw=raw,
            before=_lines_before(buf, pos, LOOKBEHIND, k, ov),
            after=_lines_after(buf, line_end, LOOKAHEAD, k, ov),
        )
        counted_to, lineno = pos, k
    return counted_to, lineno


def _window(buf: bytes, start: int, end: int, at: int) -> bytes:
    """The line ``buf[start:end]``, or MAX_LINE bytes of it around offset ``at``."""
    if end - start <= MAX_LINE:
        return buf[start:end]
    lo = start + max(0, min(at - start - MAX_LINE // 2, end - start - MAX_LINE))
    return buf[lo : lo + MAX_LINE]


def _neighbour(buf: bytes, start: int, end: int, lineno: int, ov: _Overrides) -> bytes:
    if ov:
        aside = ov.get(lineno)
        if aside is not None:
            return aside[0]
    return buf[start : min(end, start + MAX_LINE)]


def _lines_before(
    buf: bytes, line_start: int, n: int, lineno: int, ov: _Overrides
) -> tuple[bytes, ...]:
    out: list[bytes] = []
    end = line_start - 1  # the newline that ends the previous line
    while len(out) < n and end >= 0:
        start = buf.rfind(b"\n", 0, end) + 1
        lineno -= 1
        out.append(_neighbour(buf, start, end, lineno, ov))
        end = start - 1
    out.reverse()
    return tuple(out)


def _lines_after(
    buf: bytes, line_end: int, n: int, lineno: int, ov: _Overrides
) -> tuple[bytes, ...]:
    out: list[bytes] = []
    pos = line_end + 1
    while len(out) < n and pos < len(buf):
        nl = buf.find(b"\n", pos)
        if nl < 0:
            nl = len(buf)
        lineno += 1
        out.append(_neighbour(buf, pos, nl, lineno, ov))
        pos = nl + 1
    return tuple(out)


# ----------------------------------------------------------------------------- long lines
# Only inputs with lines of many megabytes (or too few newlines to fill LOOKAHEAD) come here.


class _LongLine:
    """An unfinished line too long to hold: its start, and the window around its first anchor.

    Pieces are searched where they lie; only ``overlap`` bytes on each side of a boundary are
    joined, to see an anchor split between two pieces.
    """

    def __init__(self, lineno: int, pattern: Any, overlap: int) -> None:
        self.lineno = lineno
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


def _set_aside(
    anchors: tuple[str, ...], buf: bytes, scan_from: int, lineno: int, ov: _Overrides
) -> tuple[bytes, int, _LongLine | None]:
    """Replace each line of ``buf`` longer than LONG_LINE by a placeholder line.

    What the output needs of such a line goes to ``ov``. An unfinished last line that long
    becomes a :class:`_LongLine`, fed with the next chunks until its newline comes. ``buf`` is
    a tail, so it holds at most LOOKBEHIND + LOOKAHEAD + 1 lines, or fewer than that after
    ``scan_from`` (no cut point was found).
    """
    pattern = compile_anchors(anchors)
    placeholder = _placeholder(anchors)
    overlap = max((len(a.encode()) for a in anchors), default=1) - 1
    out: list[bytes] = []
    size = 0
    new_scan_from = -1
    long_line: _LongLine | None = None
    pos = 0
    while True:
        if pos == scan_from:
            new_scan_from = size
        nl = buf.find(b"\n", pos)
        end = len(buf) if nl < 0 else nl
        if end - pos > LONG_LINE and nl < 0:
            long_line = _LongLine(lineno, pattern, overlap)
            long_line.feed(memoryview(buf)[pos:])
            break
        if end - pos > LONG_LINE:
            raw = None
            if pos >= scan_from:
                m = pattern.search(buf, pos, end)
                if m is not None:
                    raw = _window(buf, pos, end, m.start())
            ov[lineno] = (buf[pos : pos + MAX_LINE], raw)
            part = placeholder + b"\n"
        else:
            part = buf[pos : nl + 1] if nl >= 0 else buf[pos:]
        out.append(part)
        size += len(part)
        if nl < 0:
            break
        pos = nl + 1
        lineno += 1
    if new_scan_from < 0:
        new_scan_from = size
    return b"".join(out), new_scan_from, long_line

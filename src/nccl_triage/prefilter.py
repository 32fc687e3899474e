"""Whole-chunk candidate scan: only lines holding an anchor phrase go on to the grammar.

Input: a binary stream and a list of literal anchor phrases. Output: :class:`Candidate` lines
with their physical line numbers and a few neighbouring lines (terminals hard-wrap long
messages, so the parser may need to join them).

One compiled RE2 alternation runs over 8 MiB chunks; Python code only runs per match, never per
line. Newlines are counted with ``numpy`` on large chunks (``bytes.count`` is 2-3x slower).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import re2

from nccl_triage.reader import CHUNK_SIZE, Reader

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
MAX_LINE = 64 << 10  # a candidate line longer than this is cut to a window around the anchor
_NL = 10
_OVERLAP = 4096  # longer than any anchor: a match across a piece boundary is still seen


@dataclass(frozen=True, slots=True)
class Candidate:
    """A physical line that holds an anchor, with its neighbours (raw bytes, no ``\\n``)."""

    lineno: int
    raw: bytes
    before: tuple[bytes, ...]  # closest last
    after: tuple[bytes, ...]  # closest first


@cache
def compile_anchors(anchors: tuple[str, ...]) -> Any:
    """Compile literal anchors into one RE2 alternation over bytes."""
    options = re2.Options()
    options.never_capture = True
    pattern = b"|".join(re2.escape(a.encode()) for a in sorted(set(anchors), key=len, reverse=True))
    return re2.compile(pattern, options)


def _count_newlines(buf: bytes, start: int, end: int) -> int:
    if end - start < 1 << 20:
        return buf.count(b"\n", start, end)
    import numpy as np  # pandas' dependency; only worth its import time on big inputs

    view = np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=start)
    return int(np.count_nonzero(view == _NL))


def _lines_before(buf: bytes, line_start: int, n: int) -> tuple[bytes, ...]:
    out: list[bytes] = []
    end = line_start - 1  # the newline that ends the previous line
    while len(out) < n and end >= 0:
        start = buf.rfind(b"\n", 0, end) + 1
        out.append(_clip(buf[start:end]))
        end = start - 1
    out.reverse()
    return tuple(out)


def _lines_after(buf: bytes, line_end: int, n: int) -> tuple[bytes, ...]:
    out: list[bytes] = []
    pos = line_end + 1
    while len(out) < n and pos < len(buf):
        nl = buf.find(b"\n", pos)
        if nl < 0:
            nl = len(buf)
        out.append(_clip(buf[pos:nl]))
        pos = nl + 1
    return tuple(out)


def _clip(raw: bytes, anchor_at: int = 0) -> bytes:
    if len(raw) <= MAX_LINE:
        return raw
    lo = max(0, min(anchor_at - MAX_LINE // 2, len(raw) - MAX_LINE))
    return raw[lo : lo + MAX_LINE]


def scan(
    chunks: Iterable[bytes], anchors: tuple[str, ...] = ANCHORS, stats: dict[str, int] | None = None
) -> Iterator[Candidate]:
    """Yield every physical line of the byte stream that holds one of ``anchors``.

    ``stats`` (when given) receives ``lines``: the number of physical lines, and ``bytes``.
    """
    pattern = compile_anchors(anchors)
    carry = b""  # lines kept from the previous buffer (already scanned) + the unfinished line
    scan_from = 0  # offset in the next buffer where unscanned text starts
    base = 1  # line number of the first line in the buffer
    total_bytes = 0
    eof = False
    it = iter(chunks)
    while not eof:
        data = next(it, b"")
        eof = not data
        total_bytes += len(data)
        buf = carry + data if carry else data
        if eof:
            cut = len(buf)
        else:
            cut = _cut_point(buf, scan_from)
            if cut < 0:  # not enough complete lines yet: read on
                if len(buf) > 4 * CHUNK_SIZE:  # a line of many megabytes: scan it piecewise
                    limit = len(buf) - _OVERLAP
                    yield from _scan_region(pattern, buf, scan_from, limit, base)
                    base += _count_newlines(buf, 0, limit)
                    carry = buf[limit:]
                    scan_from = 0
                else:
                    carry = buf
                continue
        yield from _scan_region(pattern, buf, scan_from, cut, base)
        # keep LOOKBEHIND lines before the cut (already scanned) for the next buffer's context
        keep = cut
        for _ in range(LOOKBEHIND):
            if keep <= 0:
                break
            keep = buf.rfind(b"\n", 0, keep - 1) + 1
        base += _count_newlines(buf, 0, keep)
        carry = buf[keep:]
        scan_from = cut - keep
    if stats is not None:
        stats["bytes"] = total_bytes
        # base counts newlines before the kept tail; add those in the tail and the last line
        tail_newlines = carry.count(b"\n")
        unfinished = 1 if carry and not carry.endswith(b"\n") else 0
        stats["lines"] = base - 1 + tail_newlines + unfinished


def _cut_point(buf: bytes, scan_from: int) -> int:
    """Offset up to which lines are complete and have LOOKAHEAD lines after them, or -1."""
    pos = len(buf)
    for _ in range(LOOKAHEAD + 1):
        pos = buf.rfind(b"\n", scan_from, pos)
        if pos < 0:
            return -1
    return pos + 1


def _scan_region(pattern: Any, buf: bytes, start: int, end: int, base: int) -> Iterator[Candidate]:
    lineno = base
    counted_to = 0
    pos = start
    while pos < end:
        m = pattern.search(buf, pos, end)
        if m is None:
            return
        at = m.start()
        line_start = buf.rfind(b"\n", 0, at) + 1
        line_end = buf.find(b"\n", at)
        if line_end < 0:
            line_end = len(buf)
        lineno += _count_newlines(buf, counted_to, line_start)
        counted_to = line_start
        yield Candidate(
            lineno=lineno,
            raw=_clip(buf[line_start:line_end], at - line_start),
            before=_lines_before(buf, line_start, LOOKBEHIND),
            after=_lines_after(buf, line_end, LOOKAHEAD),
        )
        pos = line_end + 1

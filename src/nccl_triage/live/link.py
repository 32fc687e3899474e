"""The pipe from the pump to the analyser: frames, a bounded backlog, the analyser's start.

Input: stream bytes from the pump; the analyser's one line on its standard output (the anchors
its scan looks for). Output: frames on a non-blocking pipe, each chunk's candidate scan ahead
of it when the pump has time for it; when the analyser falls behind, the oldest unsent bytes
are dropped (never the output) and a gap frame tells it how many bytes and lines it missed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from nccl_triage.ingest.scan import MAX_LINE, Prescanner
from nccl_triage.live.triage import (
    BACKLOG_LIMIT,
    CATCH_UP_S,
    DRAIN_TIMEOUT_S,
    EXIT_USAGE,
    PIPE_SIZE,
    STARTING_BACKLOG,
)

# ----------------------------------------------------------------------------- pump <-> analyser
#
# Frames on the pipe from the pump to the analyser: a kind byte, a 4-byte big-endian length,
# the payload. D: stream bytes. H: the candidate scan of the D frame that follows (see
# Prescanned). G: bytes the pump dropped (count, newlines, then the tail after their last
# newline). E: end of input (JSON: reason, status, signal).
#
# The analyser's standard output comes back to the pump: one JSON line once it is ready,
# {"anchors": [...], "neighbours": [...]}, the anchors its scan looks for. With them the pump
# scans each chunk it sends while it has time to spare, and sends the result in an H frame: the
# pump holds every byte anyway, and the scan is then done on another core than the analysis.

_HEAD = struct.Struct("!cI")
GAP = struct.Struct("!QQ")
FRAME_DATA, FRAME_HITS, FRAME_GAP, FRAME_END = b"D", b"H", b"G", b"E"
ANNOUNCE_MAX = 1 << 20  # the analyser's line longer than this is not listened to


class FrameReader:
    """Cuts the analyser's input into frames; an incomplete frame at the end is ignored."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def push(self, chunk: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Take bytes from the pipe; yield every frame they complete."""
        buf = self._buf
        if not buf and len(chunk) >= _HEAD.size:
            # nothing held: frames are read where they lie, the rest kept
            return iter(self._cut(chunk, keep=True))
        buf += chunk
        return iter(self._cut(buf, keep=False))

    def _cut(self, data: bytes | bytearray, keep: bool) -> list[tuple[bytes, bytes]]:
        """The frames ``data`` completes; what follows them stays in the buffer."""
        frames: list[tuple[bytes, bytes]] = []
        pos = 0
        with memoryview(data) as view:
            while len(data) - pos >= _HEAD.size:
                kind, size = _HEAD.unpack_from(data, pos)
                if len(data) - pos - _HEAD.size < size:
                    break
                start = pos + _HEAD.size
                frames.append((kind, bytes(view[start : start + size])))  # one copy
                pos = start + size
        if keep:
            self._buf += data[pos:]
        else:
            del self._buf[:pos]
        return frames


def encode_frame(kind: bytes, payload: bytes) -> bytes:
    """One frame for the analyser's pipe."""
    return _HEAD.pack(kind, len(payload)) + payload


def set_pipe_size(fd: int) -> None:
    """Ask Linux for a larger pipe buffer (fewer wake-ups); ignored where it cannot be had."""
    setsz = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsz is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, setsz, PIPE_SIZE)


class AnalyserLink:
    """The pump's end of the pipe to the analyser: never blocks, drops the oldest when full.

    It holds up to ``limit`` bytes the analyser has not taken; up to ``starting`` while the
    analyser starts (until it says what it scans for, or closes its output) and catches up
    (until it is within a quarter of ``limit``, and not once bytes had to be dropped after it
    started: a job printing faster than the analysis reads gets ``limit`` again soon); for at
    most :data:`CATCH_UP_S` in all.

    Once the analyser has said what it scans for, each chunk is scanned for it as it is sent,
    while the pump has time to spare (:attr:`spare`).
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        limit: int = BACKLOG_LIMIT,
        starting: int = STARTING_BACKLOG,
    ) -> None:
        assert proc.stdin is not None
        self.proc = proc
        self._stdin = proc.stdin
        self.fd = proc.stdin.fileno()
        os.set_blocking(self.fd, False)
        set_pipe_size(self.fd)
        # the analyser's word on what to scan for (its standard output), until it is heard
        self.hear_fd: int | None = None
        if proc.stdout is not None:
            self.hear_fd = proc.stdout.fileno()
            os.set_blocking(self.hear_fd, False)
        self._heard = b""
        self._prescanner: Prescanner | None = None
        self._limit = limit
        self._cap = max(limit, starting) if self.hear_fd is not None else limit
        self._since = time.monotonic()  # the starting backlog is given up CATCH_UP_S after
        self._dropped_then: int | None = None  # what had been dropped when the analyser started
        # stream bytes not sent yet, each with whether a line starts with them
        self._queue: deque[tuple[bytes, bool]] = deque()
        self._line_open = False  # the bytes queued last end inside a line
        # whether the pump has time to scan what it sends for the analyser (set by the pump)
        self.spare = True
        self._queued = 0
        self._gap: list[Any] | None = None  # [bytes, newlines, tail] dropped before the queue
        self._out = memoryview(b"")  # what is left of the frame being written (no copies)
        self.alive = True
        self.dropped_bytes = 0

    def wants_write(self) -> bool:
        """Whether there is something to send (poll the descriptor for POLLOUT)."""
        return self.alive and bool(self._out or self._gap or self._queue)

    def hear(self) -> None:
        """Read what the analyser says (poll :attr:`hear_fd` for input).

        Once it has said what it scans for, the pump can scan for it (:meth:`send`).
        """
        if self.hear_fd is None:
            return
        try:
            chunk = os.read(self.hear_fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self._heard += chunk
        line, nl, _rest = self._heard.partition(b"\n")
        if chunk and not nl and len(self._heard) <= ANNOUNCE_MAX:
            return
        self._stop_hearing()  # one line, the end, or too much: listened enough
        if nl and self.alive:
            try:
                self._prescanner = _prescanner(line)
            except Exception as exc:  # noqa: BLE001 - the output goes on, unscanned
                say(f"the pump cannot scan for the analysis ({exc}); it scans alone")

    def _stop_hearing(self) -> None:
        self.hear_fd = None
        self._heard = b""
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()

    def send(self, data: bytes) -> None:
        """Queue stream bytes for the analyser and send what the pipe takes now."""
        if not self.alive or not data:
            return
        self._queue.append((data, not self._line_open))
        self._line_open = not data.endswith(b"\n")
        self._queued += len(data)
        while self._queued > self._cap and self._queue:
            self._drop(self._queue.popleft()[0])
        self.pump()
        if self._cap > self._limit:
            self._catching_up()

    def _catching_up(self) -> None:
        """Keep the starting backlog while the analyser starts and catches up."""
        if time.monotonic() - self._since > CATCH_UP_S:
            self._cap = self._limit  # a minute is enough for both
        if self.hear_fd is not None:
            return  # still starting
        if self._dropped_then is None:
            self._dropped_then = self.dropped_bytes
        if self._queued <= self._limit // 4:
            self._cap = self._limit  # caught up
        elif self.dropped_bytes > self._dropped_then:
            self._cap = self._limit  # the job prints faster than it reads, even now: no use

    def _drop(self, data: bytes) -> None:
        self._queued -= len(data)
        self.dropped_bytes += len(data)
        newlines = data.count(b"\n")
        if self._gap is None:
            self._gap = [0, 0, b""]
        gap = self._gap
        gap[0] += len(data)
        gap[1] += newlines
        tail = data[data.rfind(b"\n") + 1 :] if newlines else gap[2] + data
        gap[2] = tail[-MAX_LINE:]

    def _next_frame(self) -> bytes:
        if self._gap is not None:
            nbytes, newlines, tail = self._gap
            self._gap = None
            return encode_frame(FRAME_GAP, GAP.pack(nbytes, newlines) + tail)
        if self._queue:
            data, starts_line = self._queue.popleft()
            self._queued -= len(data)
            pre = None
            if self._prescanner is not None and self.spare:
                try:
                    pre = self._prescanner.scan(data, starts_line)
                except Exception as exc:  # noqa: BLE001 - the output goes on, unscanned
                    self._prescanner = None
                    say(f"the pump cannot scan for the analysis ({exc}); it scans alone")
            if pre is not None:
                hits = pre.encode()
                return b"".join(
                    (
                        _HEAD.pack(FRAME_HITS, len(hits)),
                        hits,
                        _HEAD.pack(FRAME_DATA, len(data)),
                        data,
                    )
                )
            return encode_frame(FRAME_DATA, data)
        return b""

    def pump(self) -> None:
        """Write as much as the pipe takes without blocking."""
        while self.alive:
            if not self._out:
                self._out = memoryview(self._next_frame())
                if not self._out:
                    return
            try:
                n = os.write(self.fd, self._out)
            except BlockingIOError:
                return
            except OSError:  # the analyser is gone (EPIPE): output goes on without it
                self._abandon()
                return
            self._out = self._out[n:]

    def _abandon(self) -> None:
        self.alive = False
        self._queue.clear()
        self._queued = 0
        self._gap = None
        self._out = memoryview(b"")
        self._prescanner = None

    def finish(self, end: dict[str, Any], timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Send the backlog and the end frame (within ``timeout``), then close the pipe."""
        self.spare = False  # the backlog goes as it is: scanning it would delay the end
        if self.alive:
            frames: list[bytes | memoryview] = [self._out] if self._out else []
            while nxt := self._next_frame():
                frames.append(nxt)
            frames.append(encode_frame(FRAME_END, json.dumps(end).encode()))
            self._out = memoryview(b"")
            deadline = time.monotonic() + timeout
            for frame in frames:
                view = memoryview(frame)
                while view and self.alive:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [self.fd], [], left)[1]:
                        self.alive = False  # the analyser does not read: give up on it
                        break
                    try:
                        view = view[os.write(self.fd, view) :]
                    except BlockingIOError:
                        continue
                    except OSError:
                        self.alive = False
        with contextlib.suppress(OSError):
            self._stdin.close()
        self._abandon()
        self._stop_hearing()

    def kill(self) -> None:
        """Stop the analyser without a word (the reader of our output went away)."""
        self._abandon()
        self._stop_hearing()
        with contextlib.suppress(OSError):
            self._stdin.close()
        with contextlib.suppress(OSError):
            self.proc.terminate()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the analyser; its status (2 when it cannot be waited for)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return EXIT_USAGE


@dataclass
class AnalyserConfig:
    """What the analyser process needs to know (passed as JSON on its command line)."""

    source: str = "<stdin>"
    fmt: str = "text"  # text | markdown | json
    report: str | None = None  # a file; None: standard error
    color: bool = False
    rules: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)
    command: str | None = None  # the job's name under `run`

    def to_json(self) -> str:
        """Serialise for the analyser's command line."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> AnalyserConfig:
        """Read what :meth:`to_json` wrote."""
        return cls(**json.loads(text))


def start_analyser(config: AnalyserConfig) -> AnalyserLink | None:
    """Start the analyser process; None (after a one-line message) when it cannot start.

    It inherits standard error (for its reports), ignores Ctrl-C and runs in its own session,
    so that a signal sent to our process group (a terminal's Ctrl-C, GNU ``timeout``, a job
    scheduler) does not reach it: the pump decides when the input ends, and the analyser then
    makes its final report.
    """
    code = (
        "import sys; from nccl_triage.live.analyser import analyser_main; sys.exit(analyser_main())"
    )
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec: ignored
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, config.to_json()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # what it scans for: see AnalyserLink.hear
            bufsize=0,
            start_new_session=True,
        )
    except OSError as exc:
        say(f"cannot start the analysis ({exc.strerror or exc}); passing output through only")
        return None
    finally:
        signal.signal(signal.SIGINT, old)
    return AnalyserLink(proc)


def _prescanner(line: bytes) -> Prescanner | None:
    """The prescanner for the anchors the analyser announced.

    None when there is none to have (another engine, a line of another form).
    """
    from nccl_triage.errors import TriageError

    try:
        said = json.loads(line)
        anchors, neighbours = said["anchors"], said["neighbours"]
        if not isinstance(anchors, list) or not (
            neighbours is None or isinstance(neighbours, list)
        ):
            return None
        if not all(isinstance(a, str) for a in [*anchors, *(neighbours or ())]):
            return None
        return Prescanner.make(anchors, neighbours)
    except (ValueError, TypeError, KeyError, RecursionError, TriageError):
        return None


def announce(anchors: tuple[str, ...], neighbours: tuple[str, ...] | None, fd: int = 1) -> None:
    """The analyser's side of :meth:`AnalyserLink.hear`: say what its scan looks for."""
    line = json.dumps({"anchors": list(anchors), "neighbours": neighbours}) + "\n"
    with contextlib.suppress(OSError):
        write_all(fd, line.encode())
    with contextlib.suppress(OSError):  # said once: the pump sees the end, nothing else goes there
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def say(message: str) -> None:
    """One line on standard error, as every message of the tool."""
    with contextlib.suppress(OSError):
        write_all(2, f"nccl-triage: {message}\n".encode())


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte, waiting when the descriptor is non-blocking and full.

    Raises:
        BrokenPipeError: the reader went away.
    """
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]

"""The pipe from the pump to the analyser: frames, a bounded backlog, the analyser's start.

Input: stream bytes from the pump. Output: frames on a non-blocking pipe; when the analyser
falls behind, the oldest unsent bytes are dropped (never the output) and a gap frame tells it
how many bytes and lines it missed.
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

from nccl_triage.ingest.scan import MAX_LINE
from nccl_triage.live.triage import BACKLOG_LIMIT, DRAIN_TIMEOUT_S, EXIT_USAGE, PIPE_SIZE

# ----------------------------------------------------------------------------- pump <-> analyser
#
# Frames on the pipe from the pump to the analyser: a kind byte, a 4-byte big-endian length,
# the payload. D: stream bytes. G: bytes the pump dropped (count, newlines, then the tail after
# their last newline). E: end of input (JSON: reason, status, signal).

_HEAD = struct.Struct("!cI")
GAP = struct.Struct("!QQ")
FRAME_DATA, FRAME_GAP, FRAME_END = b"D", b"G", b"E"


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
    """The pump's end of the pipe to the analyser: never blocks, drops the oldest when full."""

    def __init__(self, proc: subprocess.Popen[bytes], limit: int = BACKLOG_LIMIT) -> None:
        assert proc.stdin is not None
        self.proc = proc
        self._stdin = proc.stdin
        self.fd = proc.stdin.fileno()
        os.set_blocking(self.fd, False)
        set_pipe_size(self.fd)
        self._limit = limit
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._gap: list[Any] | None = None  # [bytes, newlines, tail] dropped before the queue
        self._out = memoryview(b"")  # what is left of the frame being written (no copies)
        self.alive = True
        self.dropped_bytes = 0

    def wants_write(self) -> bool:
        """Whether there is something to send (poll the descriptor for POLLOUT)."""
        return self.alive and bool(self._out or self._gap or self._queue)

    def send(self, data: bytes) -> None:
        """Queue stream bytes for the analyser and send what the pipe takes now."""
        if not self.alive or not data:
            return
        self._queue.append(data)
        self._queued += len(data)
        while self._queued > self._limit and self._queue:
            self._drop(self._queue.popleft())
        self.pump()

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
            data = self._queue.popleft()
            self._queued -= len(data)
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

    def finish(self, end: dict[str, Any], timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Send the backlog and the end frame (within ``timeout``), then close the pipe."""
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

    def kill(self) -> None:
        """Stop the analyser without a word (the reader of our output went away)."""
        self._abandon()
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
            stdout=subprocess.DEVNULL,
            bufsize=0,
            start_new_session=True,
        )
    except OSError as exc:
        say(f"cannot start the analysis ({exc.strerror or exc}); passing output through only")
        return None
    finally:
        signal.signal(signal.SIGINT, old)
    return AnalyserLink(proc)


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

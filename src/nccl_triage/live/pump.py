"""The pump: a job's output passed through unchanged, a copy handed to the analyser.

Input: standard input (``watch``) or a command's stdout and stderr (``run``). Output: every
byte on the descriptor it would have gone to, at once; signals forwarded to the command; the
command's own exit status.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import IO, Any, cast

from nccl_triage.live.link import AnalyserLink, say, set_pipe_size, write_all
from nccl_triage.live.triage import (
    DRAIN_TIMEOUT_S,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    FORWARDED_SIGNALS,
    LONG_LINE,
    READ_SIZE,
    SPARE_SHARE,
    SPARE_WINDOW_S,
)

# ----------------------------------------------------------------------------- the pump


SAME_SIGNAL_S = 0.5


class _Signals:
    """Signals turned into events of the poll loop (a self-pipe), never into exceptions.

    A second SIGINT or SIGTERM while one is being handled raises KeyboardInterrupt, so that
    a user can always get out, even of a write that the reader of our output never takes.
    The same signal again within :data:`SAME_SIGNAL_S` is one signal sent twice: GNU
    ``timeout`` signals the process and then its process group.
    """

    def __init__(self, signums: Sequence[int], escalate: bool) -> None:
        self.received: list[int] = []
        self._escalate = escalate
        self._stops = 0
        self._first: tuple[int, float] | None = None
        self._r, self._w = os.pipe()
        for fd in (self._r, self._w):
            os.set_blocking(fd, False)
        self.fd = self._r
        self._old_wakeup = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._handle) for s in signums}

    def _handle(self, signum: int, frame: object) -> None:
        if signum in (signal.SIGINT, signal.SIGTERM):
            now = time.monotonic()
            first = self._first
            if first is not None and first[0] == signum and now - first[1] < SAME_SIGNAL_S:
                return  # the same signal delivered twice (to us, then to our group)
            self._first = self._first or (signum, now)
            self._stops += 1
            if self._escalate and self._stops > 1:
                raise KeyboardInterrupt
        self.received.append(signum)

    def take(self) -> list[int]:
        """The signals received since the last call."""
        with contextlib.suppress(OSError):
            while os.read(self._r, 512):
                pass
        out, self.received = self.received, []
        return out

    def restore(self) -> None:
        """Put the previous handlers back."""
        signal.set_wakeup_fd(self._old_wakeup)
        for s, old in self._old.items():
            signal.signal(s, old)
        for fd in (self._r, self._w):
            os.close(fd)


def _quiet_stdout() -> None:
    # our stdout's reader is gone or done: point fd 1 at /dev/null so nothing (not even the
    # interpreter's exit flush) writes to it again, and the reader sees end of file at once
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def watch_stream(link: AnalyserLink | None, in_fd: int = 0, out_fd: int = 1) -> int:
    """``watch``: copy ``in_fd`` to ``out_fd`` byte for byte, feeding the analyser on the side.

    Returns the exit status: the analyser's verdict (0 clean, 1 failure, 2 no diagnosis) at
    end of input, 130 after Ctrl-C (143 after SIGTERM), 0 when our output was closed.
    """
    set_pipe_size(in_fd)
    set_pipe_size(out_fd)
    sigs = _Signals((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), escalate=True)
    poller = select.poll()
    poller.register(in_fd, select.POLLIN)
    poller.register(sigs.fd, select.POLLIN)
    polls = _LinkPolls(poller)
    spare = _Spare()
    stop: int | None = None
    try:
        while stop is None:
            if link is not None:
                polls.update(link, spare)
            for fd, _ev in spare.poll(poller):
                if fd == in_fd:
                    data = _read(in_fd)
                    if not data:
                        stop = 0
                        break
                    write_all(out_fd, data)
                    if link is not None:
                        link.send(data)
                elif fd == sigs.fd:
                    got = sigs.take()
                    if got:
                        stop = got[0]
                elif link is not None and fd == link.fd:
                    link.pump()
                elif link is not None and fd == polls.hearing:
                    link.hear()
    except BrokenPipeError:
        _quiet_stdout()
        if link is not None:
            link.kill()
            link.wait(DRAIN_TIMEOUT_S)
        sigs.restore()
        return 0
    except KeyboardInterrupt:
        stop = signal.SIGINT
    try:
        if out_fd == 1:
            _quiet_stdout()  # the reader of our output sees its end now, not after the report
        if link is None:
            return 128 + stop if stop else EXIT_USAGE
        end = {"reason": "interrupted"} if stop else {"reason": "eof"}
        link.finish(end, timeout=DRAIN_TIMEOUT_S if not stop else 1.0)
        status = link.wait()
    except KeyboardInterrupt:  # a second Ctrl-C while the analyser finishes: leave now
        if link is not None:
            link.kill()
        return 130
    finally:
        sigs.restore()
    if stop:
        return 128 + stop
    return status if status in (0, 1) else EXIT_USAGE


class _LinkPolls:
    """The analyser link's descriptors in a poll set.

    Its pipe while it has frames to write; its standard output until it has said what it
    scans for.
    """

    def __init__(self, poller: select.poll) -> None:
        self._poller = poller
        self._writing = False
        self.hearing: int | None = None  # the descriptor polled for the analyser's word

    def update(self, link: AnalyserLink, spare: _Spare) -> None:
        """Poll what the link needs now; tell it whether the pump has time to spare."""
        link.spare = spare.spare
        if link.wants_write() != self._writing:
            self._writing = not self._writing
            if self._writing:
                self._poller.register(link.fd, select.POLLOUT)
            else:
                self._poller.unregister(link.fd)
        if self.hearing != link.hear_fd:
            if self.hearing is not None:
                self._poller.unregister(self.hearing)
            self.hearing = link.hear_fd
            if self.hearing is not None:
                self._poller.register(self.hearing, select.POLLIN)


class _Spare:
    """Whether the pump has time to spare: the share of its time it waits in ``poll``.

    A moving average over the last :data:`SPARE_WINDOW_S` or so, each turn of the loop
    weighed by its length; time to spare while at least :data:`SPARE_SHARE` of it is waiting.
    Then the pump scans what it sends for the analyser; a job printing faster than the pump
    can also scan passes through at full speed.
    """

    def __init__(self) -> None:
        self._share = 1.0
        self._woke = time.monotonic()

    def poll(self, poller: select.poll, timeout: float | None = None) -> list[tuple[int, int]]:
        """``poller.poll(timeout)``, timed."""
        before = time.monotonic()
        events = poller.poll(timeout)
        after = time.monotonic()
        turn = after - self._woke
        if turn > 0:
            weight = min(1.0, turn / SPARE_WINDOW_S)
            self._share += weight * ((after - before) / turn - self._share)
        self._woke = after
        return events

    @property
    def spare(self) -> bool:
        """Whether the pump has time to spare now."""
        return self._share >= SPARE_SHARE


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, READ_SIZE)
    except BlockingIOError:  # an inherited non-blocking descriptor with nothing in it yet
        select.select([fd], [], [])
        return _read(fd)
    except OSError as exc:
        if exc.errno == errno.EIO:  # a terminal that went away
            return b""
        raise


class _LineJoiner:
    """Cuts one stream of ``run`` at line ends, so stdout and stderr interleave by lines."""

    def __init__(self) -> None:
        self.partial = b""

    def push(self, data: bytes) -> bytes:
        nl = data.rfind(b"\n")
        if nl < 0:
            self.partial += data
            if len(self.partial) <= LONG_LINE:
                return b""
            out, self.partial = self.partial, b""  # an endless line: pass it on as it comes
            return out
        out = self.partial + data[: nl + 1]
        self.partial = data[nl + 1 :]
        return out

    def close(self) -> bytes:
        out, self.partial = self.partial, b""
        return out


class _Merged:
    """stdout and stderr of ``run`` as one stream of whole lines: to the archive and analyser."""

    def __init__(self, link: AnalyserLink | None, log: IO[bytes] | None, log_name: str) -> None:
        self.link = link
        self.log = log
        self._log_name = log_name
        self._open_by: int | None = None  # the stream whose last piece ended mid-line
        self.dirty = False  # archive bytes not flushed yet

    def write(self, stream: int, data: bytes) -> None:
        """Add whole lines of ``stream`` (or the pieces of an endless line, or its last line)."""
        if not data:
            return
        if self._open_by is not None and self._open_by != stream:
            data = b"\n" + data  # keep the other stream's unfinished line apart from this one
        self._open_by = None if data.endswith(b"\n") else stream
        if self.log is not None:
            try:
                self.log.write(data)
                self.dirty = True
            except OSError as exc:
                say(f"{self._log_name}: {exc.strerror or exc}; no longer archiving the output")
                with contextlib.suppress(OSError):
                    self.log.close()
                self.log = None
        if self.link is not None:
            self.link.send(data)

    def flush_log(self) -> None:
        """Make the archive readable as far as it goes (called when the job is idle)."""
        if self.dirty and self.log is not None:
            with contextlib.suppress(OSError):
                self.log.flush()
        self.dirty = False


def open_archive(path: str) -> IO[bytes]:
    """Open ``--log FILE`` for writing: gzip for ``.gz``, zstd for ``.zst``, else plain.

    Raises:
        OSError: the file cannot be created.
    """
    if path.endswith(".gz"):
        import gzip

        return cast("IO[bytes]", gzip.open(path, "wb", compresslevel=6))
    if path.endswith(".zst"):
        import zstandard

        raw = open(path, "wb")  # noqa: SIM115 - the stream writer closes it
        writer: IO[bytes] = zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=True)
        return writer
    return open(path, "wb")


def signal_name(signum: int) -> str:
    """``6`` -> ``SIGABRT``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def run_command(
    argv: Sequence[str],
    link: AnalyserLink | None,
    log: IO[bytes] | None = None,
    log_name: str = "",
    env: dict[str, str] | None = None,
) -> int:
    """``run``: start ``argv``, pass its stdout and stderr through, forward signals.

    Returns the command's exit status (128+N when a signal N ended it; 127 when it cannot be
    found, 126 when it cannot be executed).
    """
    sigs = _Signals(FORWARDED_SIGNALS, escalate=False)
    try:
        try:
            child = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # our Ctrl-C is forwarded, not delivered twice
                bufsize=0,
                env=env,
            )
        except OSError as exc:
            say(f"cannot run {argv[0]}: {exc.strerror or exc}")
            if link is not None:
                link.kill()
                link.wait(DRAIN_TIMEOUT_S)
            if log is not None:
                log.close()
            return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        merged = _Merged(link, log, log_name)
        _pump_child(child, merged, sigs)
        status = _wait_child(child, sigs)
    finally:
        sigs.restore()
    if merged.log is not None:
        try:
            merged.log.close()
        except OSError as exc:
            say(f"{log_name}: {exc.strerror or exc}")
    code = 128 - status if status < 0 else status
    end: dict[str, Any] = {"reason": "exit", "status": code}
    if status < 0:
        end["signal"] = signal_name(-status)
    if link is not None:
        try:
            link.finish(end)
            link.wait()
        except KeyboardInterrupt:
            link.kill()
    return code


def _forward(child: subprocess.Popen[bytes], sigs: _Signals) -> None:
    for signum in sigs.take():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)


def _wait_child(child: subprocess.Popen[bytes], sigs: _Signals) -> int:
    # the job may outlive its output (it closed stdout and stderr): keep forwarding signals
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            _forward(child, sigs)


def _pump_child(child: subprocess.Popen[bytes], merged: _Merged, sigs: _Signals) -> None:
    assert child.stdout is not None and child.stderr is not None
    streams: dict[int, tuple[int, _LineJoiner, IO[bytes]]] = {}
    for pipe, out_fd in ((child.stdout, 1), (child.stderr, 2)):
        set_pipe_size(pipe.fileno())
        streams[pipe.fileno()] = (out_fd, _LineJoiner(), pipe)
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    poller.register(sigs.fd, select.POLLIN)
    link = merged.link
    polls = _LinkPolls(poller)
    spare = _Spare()
    exited_at: float | None = None
    last_data = time.monotonic()

    def close(fd: int) -> None:
        out_fd, joiner, pipe = streams.pop(fd)
        merged.write(out_fd, joiner.close())
        poller.unregister(fd)
        pipe.close()

    while streams:
        if link is not None:
            polls.update(link, spare)
        events = spare.poll(poller, 250)
        if not events:
            merged.flush_log()
            if exited_at is None and child.poll() is not None:
                exited_at = time.monotonic()
            # The job is gone but something it started still holds its output open: stop
            # listening once that has been quiet for a second.
            if exited_at is not None and time.monotonic() - max(exited_at, last_data) > 1.0:
                for fd in list(streams):
                    close(fd)
            continue
        for fd, _ev in events:
            if fd == sigs.fd:
                _forward(child, sigs)
            elif link is not None and fd == link.fd:
                link.pump()
            elif link is not None and fd == polls.hearing:
                link.hear()
            elif fd in streams:
                out_fd, joiner, _pipe = streams[fd]
                data = _read(fd)
                if not data:
                    close(fd)
                    continue
                last_data = time.monotonic()
                try:
                    write_all(out_fd, data)
                except BrokenPipeError:
                    # Our reader went away (`| head`): stop reading this stream, so that the
                    # job meets the closed pipe on its next write, as it would without us.
                    if out_fd == 1:
                        _quiet_stdout()
                    close(fd)
                    continue
                merged.write(out_fd, joiner.push(data))

"""Live triage: pass a running job's output through unchanged and diagnose it as it goes.

Input: a byte stream (``watch``: standard input) or a command's stdout and stderr (``run``).
Output: every byte, unchanged and at once, on the same descriptor it would have gone to; and
diagnoses (the reports of :mod:`nccl_triage.render.core`) on stderr or in a report file, as soon as
the evidence is in, updated when the picture changes, and once more at the end.

Two processes, so that pass-through never depends on parsing:

* the **pump** (the command's own process) only copies bytes with ``os.read``/``os.write`` on
  the raw descriptors, and hands a copy to the analyser through a non-blocking pipe with a
  bounded backlog. When the analyser falls behind, the *oldest* unsent bytes are dropped (the
  newest matter most to a live diagnosis) and the analyser is told how many bytes and lines it
  missed, so line numbers stay right and the report says what was skipped. Output never waits
  for the analyser.
* the **analyser** (a child process, niced, ignoring Ctrl-C) runs the same pipeline as
  ``triage``: an incremental candidate scan (:class:`~nccl_triage.ingest.scan.Scanner`), the grammar and signals
  (:class:`nccl_triage.pipeline.Triage`), and :class:`LiveTriage` deciding when to report.

A thread would not do for the analyser: parsing holds the GIL, and a pump waiting up to the
interpreter's switch interval (5 ms) for it twice per 64 KiB read copies a few MB/s at best.

Memory is bounded: the backlog is capped, the scanner keeps a few lines and at most a window of
an endless line, signal events older than the largest rule window are pruned (except near a
failure, so a diagnosis does not fade), and the grammar's events are deduplicated.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from nccl_triage.ingest.scan import MAX_LINE

if TYPE_CHECKING:
    from nccl_triage.model import Report
    from nccl_triage.pipeline import Triage
    from nccl_triage.ruleset.core import Ruleset

# ----------------------------------------------------------------------------- tuning

READ_SIZE = 1 << 20  # bytes per os.read; a read returns what is there, so big costs no delay
PIPE_SIZE = 1 << 20  # ask Linux for 1 MiB pipes (fewer wake-ups); silently ignored elsewhere
BACKLOG_LIMIT = 64 << 20  # bytes the pump holds for a slow analyser before dropping the oldest
LONG_LINE = 1 << 20  # run: an unfinished line longer than this is passed on as it comes
HOLD_S = 0.25  # a candidate waits this long at most for its look-ahead lines
SETTLE_S = 0.2  # report once the picture has not changed for this long...
MAX_WAIT_S = 0.5  # ...or this long after it first changed, whichever comes first
MIN_INTERVAL_S = 1.0  # at most one live report per second
EVAL_INTERVAL_S = 0.1  # re-correlate at most this often while candidates come in
UNBOUNDED_WINDOW = 200_000  # look-back kept for a rule clause without a ``lines`` window
ANALYSER_NICE = 5  # the analyser yields CPU to the job and the pump, but not all of it
DRAIN_TIMEOUT_S = 5.0  # at the end, wait this long at most for the analyser to take its backlog

EXIT_USAGE = 2
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

# Signals `run` passes on to the job's process group (the job is in its own session, so the
# terminal's Ctrl-C reaches only us). USR1/USR2: batch systems warn of pre-emption with them.
FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)

# ----------------------------------------------------------------------------- live triage


@dataclass
class LiveStatus:
    """What a report sink is told besides the report itself."""

    final: bool
    update: int  # 1 for the first report, 2 for the next, ...
    line: int  # lines seen when the report was made
    dropped_bytes: int = 0  # bytes the analyser skipped because it fell behind
    dropped_lines: int = 0
    dropped_from: int | None = None  # first and last line numbers touched by a skip
    dropped_to: int | None = None
    end: dict[str, Any] | None = None  # how the input ended (final report only)
    unchanged: bool = False  # final report: same picture as the last live report

    def to_dict(self) -> dict[str, Any]:
        """The ``live`` object of a JSON report."""
        return asdict(self)


Sink = Callable[["Report", LiveStatus], None]


def lookback_lines(ruleset: Ruleset) -> int:
    """How many lines back any rule may look from its trigger: the signal window to keep."""
    window = 0
    for rule in ruleset.rules:
        for clause in rule.context:
            window = max(window, UNBOUNDED_WINDOW if clause.lines is None else clause.lines)
    return max(window, 1000)


def picture(report: Report) -> tuple[Any, ...]:
    """What a reader of the live reports cares about: a new report only when this changes."""
    return (
        report.verdict,
        tuple(sorted(f.rule.id for f in report.findings)),
        report.findings[0].rule.cause if report.findings else None,
        tuple(report.facts.ranks_timed_out),
    )


class LiveTriage:
    """Incremental triage with a debounced report: feed bytes, call :meth:`tick` often.

    A report is made when the picture (verdict, findings, top cause, ranks that timed out)
    differs from the last one reported and has been still for ``settle`` seconds (or has been
    changing for ``max_wait``), at most once per ``interval``; and once more by :meth:`finish`.
    A clean picture is only reported at the end.
    """

    def __init__(
        self,
        source: str,
        ruleset: Ruleset,
        sink: Sink,
        *,
        hold: float = HOLD_S,
        settle: float = SETTLE_S,
        max_wait: float = MAX_WAIT_S,
        interval: float = MIN_INTERVAL_S,
        window: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from nccl_triage.pipeline import Triage

        self.triage: Triage = Triage(ruleset, source)
        self.window = window if window is not None else lookback_lines(ruleset)
        self._sink = sink
        self._hold, self._settle, self._max_wait = hold, settle, max_wait
        self._interval = interval
        self._clock = clock
        self._fed = False  # candidates fed since the last evaluation
        self._last_eval = -1e18
        self._report: Report | None = None
        self._shown: tuple[Any, ...] | None = None  # the picture last reported
        self._seen: tuple[Any, ...] | None = None  # the picture last evaluated
        self._changed_at = 0.0
        self._differs_since: float | None = None
        self._last_emit = -1e18
        self._pruned_to = 0
        self._failure_lines: list[int] = []
        self.updates = 0
        self.status = LiveStatus(final=False, update=0, line=0)

    # -- input

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the stream."""
        self._took(self.triage.feed(data, now=self._clock()))

    def skip(self, nbytes: int, newlines: int, tail: bytes) -> None:
        """Bytes the analyser did not get (see :meth:`Scanner.skip`)."""
        st = self.status
        first = self.triage.complete_lines() + 1
        st.dropped_bytes += nbytes
        st.dropped_lines += newlines
        st.dropped_from = first if st.dropped_from is None else st.dropped_from
        st.dropped_to = first + newlines
        self._took(self.triage.skip(nbytes, newlines, tail, now=self._clock()))

    def _took(self, candidates: int) -> None:
        if candidates:
            self._fed = True
            self._prune()

    # -- time

    def tick(self) -> float | None:
        """Do what is due; return how long until something else will be (None: nothing)."""
        now = self._clock()
        self._took(self.triage.flush(now - self._hold))
        if self._fed and now - self._last_eval >= EVAL_INTERVAL_S:
            self._evaluate(now)
        due = self._emit_due()
        if due is not None and now >= due:
            if self._fed:
                self._evaluate(now)
            if self._differs_since is not None and self._report is not None:
                self._emit(self._report, now, final=False)
            due = None
        deadlines = [d for d in (due, self._flush_due(), self._eval_due()) if d is not None]
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _flush_due(self) -> float | None:
        since = self.triage.oldest_pending()
        return None if since is None else since + self._hold

    def _eval_due(self) -> float | None:
        return self._last_eval + EVAL_INTERVAL_S if self._fed else None

    def _emit_due(self) -> float | None:
        if self._differs_since is None:
            return None
        ready = min(self._changed_at + self._settle, self._differs_since + self._max_wait)
        return max(ready, self._last_emit + self._interval)

    def _evaluate(self, now: float) -> None:
        self._fed = False
        self._last_eval = now
        report = self.triage.report()
        self._report = report
        self._note_failures(report)
        seen = picture(report)
        if seen != self._seen:
            self._seen = seen
            self._changed_at = now
        if seen == self._shown or report.verdict == "clean":
            self._differs_since = None  # nothing new to say (a clean picture waits for the end)
        elif self._differs_since is None:
            self._differs_since = now

    def _note_failures(self, report: Report) -> None:
        from nccl_triage.diagnose.engine import FAILURE_KINDS

        lines = sorted({e.line for e in report.events if e.kind in FAILURE_KINDS})
        self._failure_lines = lines

    def _prune(self) -> None:
        # Forget signals no rule can reach any more: older than the window before the current
        # line, and not within the window of a failure already seen (its diagnosis must not
        # fade while the job goes on).
        before = self.triage.complete_lines() - self.window
        if before - self._pruned_to < max(self.window // 10, 1):
            return
        self._pruned_to = before
        failures, window = self._failure_lines, self.window

        def near_failure(ev: Any) -> bool:
            start = int(ev.line)
            last = int(ev.detail.get("last_line") or ev.line)
            i = bisect.bisect_left(failures, start - window)
            return i < len(failures) and failures[i] <= last + window

        self.triage.prune_signals(before, keep=near_failure)

    def _emit(self, report: Report, now: float, final: bool) -> None:
        self.status.unchanged = final and self.updates > 0 and picture(report) == self._shown
        self.updates += 1
        self._last_emit = now
        self._shown = picture(report)
        self._differs_since = None
        self.status.final = final
        self.status.update = self.updates
        self.status.line = report.lines
        self._sink(report, self.status)

    # -- end

    def finish(self, end: dict[str, Any] | None = None) -> Report:
        """End of input: hand out every held candidate and make the final report."""
        self.triage.close()
        report = self.triage.report()
        self.status.end = end or {"reason": "eof"}
        self._emit(report, self._clock(), final=True)
        return report


# ----------------------------------------------------------------------------- pump <-> analyser
#
# Frames on the pipe from the pump to the analyser: a kind byte, a 4-byte big-endian length,
# the payload. D: stream bytes. G: bytes the pump dropped (count, newlines, then the tail after
# their last newline). E: end of input (JSON: reason, status, signal).

_HEAD = struct.Struct("!cI")
_GAP = struct.Struct("!QQ")
FRAME_DATA, FRAME_GAP, FRAME_END = b"D", b"G", b"E"


class FrameReader:
    """Cuts the analyser's input into frames; an incomplete frame at the end is ignored."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def push(self, chunk: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Take bytes from the pipe; yield every frame they complete."""
        self._buf += chunk
        pos = 0
        buf = self._buf
        while len(buf) - pos >= _HEAD.size:
            kind, size = _HEAD.unpack_from(buf, pos)
            if len(buf) - pos - _HEAD.size < size:
                break
            start = pos + _HEAD.size
            yield kind, bytes(buf[start : start + size])
            pos = start + size
        del buf[:pos]


def encode_frame(kind: bytes, payload: bytes) -> bytes:
    """One frame for the analyser's pipe."""
    return _HEAD.pack(kind, len(payload)) + payload


def _set_pipe_size(fd: int) -> None:
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
        _set_pipe_size(self.fd)
        self._limit = limit
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._gap: list[Any] | None = None  # [bytes, newlines, tail] dropped before the queue
        self._out = b""  # the frame being written
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
            return encode_frame(FRAME_GAP, _GAP.pack(nbytes, newlines) + tail)
        if self._queue:
            data = self._queue.popleft()
            self._queued -= len(data)
            return encode_frame(FRAME_DATA, data)
        return b""

    def pump(self) -> None:
        """Write as much as the pipe takes without blocking."""
        while self.alive:
            if not self._out:
                self._out = self._next_frame()
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
        self._out = b""

    def finish(self, end: dict[str, Any], timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Send the backlog and the end frame (within ``timeout``), then close the pipe."""
        if self.alive:
            frames = [self._out] if self._out else []
            while frame := self._next_frame():
                frames.append(frame)
            frames.append(encode_frame(FRAME_END, json.dumps(end).encode()))
            self._out = b""
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

    It inherits standard error (for its reports) and ignores Ctrl-C: the pump decides when the
    input ends, and the analyser then makes its final report.
    """
    code = "import sys; from nccl_triage.live.core import analyser_main; sys.exit(analyser_main())"
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec: ignored
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, config.to_json()],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            bufsize=0,
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


# ----------------------------------------------------------------------------- the analyser


class ReportSink:
    """Writes live and final reports to standard error or a file, in one format of the spec."""

    def __init__(self, config: AnalyserConfig, template_dirs: Sequence[Path]) -> None:
        self._config = config
        self._dirs = list(template_dirs)
        self._closed = False

    def __call__(self, report: Report, status: LiveStatus) -> None:
        """Render and write one report (never raises: the job matters more than the report)."""
        if self._closed:
            return
        from nccl_triage.errors import TriageError

        try:
            text = self.render(report, status)
        except TriageError as exc:
            say(str(exc))
            return
        try:
            if self._config.report:
                with open(self._config.report, "a", encoding="utf-8") as fh:
                    fh.write(text)
            else:
                write_all(2, text.encode("utf-8", "replace"))
        except OSError as exc:
            self._closed = True  # standard error gone, disk full: stop reporting, quietly
            if not isinstance(exc, BrokenPipeError):
                say(f"cannot write the report: {exc.strerror or exc}")

    def render(self, report: Report, status: LiveStatus) -> str:
        """The report in the configured format, with its live status."""
        from nccl_triage.render.core import render_markdown, render_text, report_json

        fmt = self._config.fmt
        if fmt == "json":
            obj = report_json(report, self._dirs)
            obj["live"] = status.to_dict()
            return json.dumps(obj, ensure_ascii=False) + "\n"
        head = self.headline(report, status)
        if fmt == "text" and status.final and status.unchanged:
            # the advice is just above: end with a summary, not the same page again
            head += "; unchanged since the live diagnosis above"
            return f"nccl-triage: {head}\n{self.summary(report)}{self._dropped_note(status)}"
        body = (
            render_markdown(report, self._dirs)
            if fmt == "markdown"
            else render_text(report, self._dirs, color=self._config.color)
        )
        if fmt == "markdown":
            return f"<!-- nccl-triage: {head} -->\n{body}{self._dropped_note(status)}\n"
        return f"nccl-triage: {head}\n{body}{self._dropped_note(status)}"

    def headline(self, report: Report, status: LiveStatus) -> str:
        """What kind of report this is: live (and which update), final, interrupted."""
        if not status.final:
            more = "" if status.update == 1 else f", update {status.update}"
            return f"live diagnosis at line {report.lines}{more} (the job is still running)"
        end = status.end or {}
        reason = end.get("reason")
        if reason == "interrupted":
            return f"interrupted after {report.lines} lines; what is known so far:"
        if reason == "exit":
            name = self._config.command or "the command"
            how = f"status {end.get('status')}"
            if end.get("signal"):
                how += f" ({end['signal']})"
            return f"final diagnosis: {name} exited with {how} after {report.lines} lines"
        return f"final diagnosis at end of input ({report.lines} lines)"

    def summary(self, report: Report) -> str:
        """Verdict, the summary line and the causes found, without evidence and advice."""
        from nccl_triage.render.core import render_text

        lines = render_text(report, self._dirs, color=self._config.color).splitlines()[:2]
        for i, f in enumerate(report.findings, 1):
            lines.append(
                f"   {i}. [{f.rule.cause}] {f.rule.title}  (confidence {f.confidence:.2f},"
                f" rule {f.rule.id})"
            )
        return "\n".join(line for line in lines if line) + "\n"

    @staticmethod
    def _dropped_note(status: LiveStatus) -> str:
        if not status.dropped_bytes:
            return ""
        mib = status.dropped_bytes / (1 << 20)
        where = (
            f" (lines {status.dropped_from}-{status.dropped_to})"
            if status.dropped_from is not None
            else ""
        )
        return (
            f"nccl-triage: note: the analysis fell behind the output and skipped {mib:.1f} MiB,"
            f" {status.dropped_lines} lines{where}; every byte was still passed through, but"
            " evidence in those lines is missing from this report.\n"
        )


def analyser_main(argv: Sequence[str] | None = None) -> int:
    """The analyser process: frames on standard input, reports out; exit 0 clean, 1, 2.

    Runs until the pump closes the pipe, whatever happens to the reports.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    config = AnalyserConfig.from_json(args[0])
    from nccl_triage.errors import TriageError
    from nccl_triage.ruleset.core import load_ruleset

    try:
        ruleset = load_ruleset(config.rules, only=config.only, disable=config.disable)
    except TriageError as exc:
        for line in str(exc).splitlines():
            say(line)
        say("no diagnosis: output is passed through only")
        return EXIT_USAGE
    for notice in ruleset.notices:
        say(notice)
    try:
        sink = ReportSink(config, ruleset.template_dirs)
        warm_up(ruleset, sink)
        # Start-up (about a second of CPU) competes fairly, so that the analysis is ready long
        # before a job fails even on a busy node; from then on it yields to the job.
        with contextlib.suppress(OSError):
            os.nice(ANALYSER_NICE)
        live = LiveTriage(config.source, ruleset, sink)
        end = serve(0, live)
        report = live.finish(end)
    except Exception:  # noqa: BLE001 - a bug must not look like a diagnosis (exit 1)
        import traceback

        say("internal error in the analysis; output is passed through only:")
        traceback.print_exc()
        return 3
    return 0 if report.verdict == "clean" else 1


_WARM_UP_LOG = (
    "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB.\n"
    "[rank0]:[E108 14:47:33.690127466 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=4812, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.\n"
)


def warm_up(ruleset: Ruleset, sink: ReportSink) -> None:
    """Build the grammar's parser and load the templates now, not when the job fails.

    The first timeout line would otherwise pay ~0.2 s for the LALR tables, and the first
    report for Jinja, out of the one second a diagnosis has to appear.
    """
    from nccl_triage.errors import TriageError
    from nccl_triage.pipeline import triage_text

    with contextlib.suppress(TriageError):  # a broken template is said at the first report
        report = triage_text(_WARM_UP_LOG, ruleset, source="<warm-up>")
        sink.render(report, LiveStatus(final=False, update=1, line=report.lines))


def serve(fd: int, live: LiveTriage) -> dict[str, Any]:
    """Read frames from ``fd`` into ``live`` until end of input; return the end frame."""
    reader = FrameReader()
    end: dict[str, Any] = {"reason": "eof"}
    while True:
        wait = live.tick()
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            continue
        chunk = os.read(fd, READ_SIZE)
        if not chunk:
            return end
        for kind, payload in reader.push(chunk):
            if kind == FRAME_DATA:
                live.feed(payload)
            elif kind == FRAME_GAP:
                nbytes, newlines = _GAP.unpack_from(payload)
                live.skip(nbytes, newlines, payload[_GAP.size :])
            elif kind == FRAME_END:
                end = json.loads(payload)


# ----------------------------------------------------------------------------- the pump


class _Signals:
    """Signals turned into events of the poll loop (a self-pipe), never into exceptions.

    A second SIGINT or SIGTERM while one is being handled raises KeyboardInterrupt, so that
    a user can always get out, even of a write that the reader of our output never takes.
    """

    def __init__(self, signums: Sequence[int], escalate: bool) -> None:
        self.received: list[int] = []
        self._escalate = escalate
        self._stops = 0
        self._r, self._w = os.pipe()
        for fd in (self._r, self._w):
            os.set_blocking(fd, False)
        self.fd = self._r
        self._old_wakeup = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._handle) for s in signums}

    def _handle(self, signum: int, frame: object) -> None:
        if signum in (signal.SIGINT, signal.SIGTERM):
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
    _set_pipe_size(in_fd)
    sigs = _Signals((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), escalate=True)
    poller = select.poll()
    poller.register(in_fd, select.POLLIN)
    poller.register(sigs.fd, select.POLLIN)
    polling_link = False
    stop: int | None = None
    try:
        while stop is None:
            if link is not None and link.wants_write() != polling_link:
                polling_link = not polling_link
                if polling_link:
                    poller.register(link.fd, select.POLLOUT)
                else:
                    poller.unregister(link.fd)
            for fd, _ev in poller.poll():
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
        _set_pipe_size(pipe.fileno())
        streams[pipe.fileno()] = (out_fd, _LineJoiner(), pipe)
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    poller.register(sigs.fd, select.POLLIN)
    link = merged.link
    polling_link = False
    exited_at: float | None = None
    last_data = time.monotonic()

    def close(fd: int) -> None:
        out_fd, joiner, pipe = streams.pop(fd)
        merged.write(out_fd, joiner.close())
        poller.unregister(fd)
        pipe.close()

    while streams:
        if link is not None and link.wants_write() != polling_link:
            polling_link = not polling_link
            if polling_link:
                poller.register(link.fd, select.POLLOUT)
            else:
                poller.unregister(link.fd)
        events = poller.poll(250)
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

"""Live triage: the pipeline fed as bytes arrive, and the debounced report.

Input: a stream's bytes (and the stretches a pump had to drop), and the clock. Output: a
report through a sink when the picture (verdict, findings, top cause, ranks that timed out)
changes and has settled, at most once a second, and a final one at the end.
"""

from __future__ import annotations

import bisect
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nccl_triage.ingest.scan import Prescanned
    from nccl_triage.model import Report
    from nccl_triage.pipeline import Triage
    from nccl_triage.ruleset import Ruleset


# ----------------------------------------------------------------------------- tuning

READ_SIZE = 1 << 20  # bytes per os.read; a read returns what is there, so big costs no delay
PIPE_SIZE = 1 << 20  # ask Linux for 1 MiB pipes (fewer wake-ups); silently ignored elsewhere
BACKLOG_LIMIT = 64 << 20  # bytes the pump holds for a slow analyser before dropping the oldest
# ...and while the analyser starts (half a second under load) and catches up, until it is within
# a quarter of the limit, or bytes had to be dropped after it started, or CATCH_UP_S passed
STARTING_BACKLOG = 384 << 20
CATCH_UP_S = 60.0
SPARE_SHARE = 0.25  # the pump scans for the analyser while it waits this share of its time...
SPARE_WINDOW_S = 0.05  # ...over about this long
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

    def feed(self, data: bytes, pre: Prescanned | None = None) -> None:
        """Take the next bytes of the stream (``pre``: their scan, done by the pump)."""
        self._took(self.triage.feed(data, now=self._clock(), pre=pre))

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
        from nccl_triage.model import is_failure

        lines = sorted({e.line for e in report.events if is_failure(e)})
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

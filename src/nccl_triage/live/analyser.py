"""The analyser process: frames in, live reports out.

Input: frames on standard input (stream bytes, the pump's scan of them, gaps, the end).
Output: one line on standard output, once started (the anchors its scan looks for: the pump
then scans for it); reports on stderr or in a report file, in any format of the JSON contract.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nccl_triage.model import Report
    from nccl_triage.ruleset import Ruleset

from nccl_triage.live.link import (
    FRAME_DATA,
    FRAME_END,
    FRAME_GAP,
    FRAME_HITS,
    GAP,
    AnalyserConfig,
    FrameReader,
    announce,
    say,
    write_all,
)
from nccl_triage.live.triage import ANALYSER_NICE, EXIT_USAGE, READ_SIZE, LiveStatus, LiveTriage
from nccl_triage.pipeline import settle_collector

# ----------------------------------------------------------------------------- the analyser

WARM_AFTER_S = 0.02  # input quiet this long: time to build what the first report needs


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
        from nccl_triage.render.report import render_markdown, render_text, report_json

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
        from nccl_triage.render.report import render_text

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
    from nccl_triage.ingest.engines import check_choice
    from nccl_triage.ruleset import load_ruleset

    try:
        ruleset = load_ruleset(config.rules, only=config.only, disable=config.disable)
        check_choice()
    except TriageError as exc:
        for line in str(exc).splitlines():
            say(line)
        say("no diagnosis: output is passed through only")
        return EXIT_USAGE
    for notice in ruleset.notices:
        say(notice)
    try:
        sink = ReportSink(config, ruleset.template_dirs)
        settle_collector()
        live = LiveTriage(config.source, ruleset, sink)
        announce(*live.triage.scan_anchors())
        from nccl_triage.ingest.scan import load_numpy

        load_numpy()  # while the pump gets ready to scan: half a second less at 500 MB/s
        # Start-up competes fairly, so that the analysis is ready long before a job fails even
        # on a busy node; from then on it yields to the job. The rest of the warm-up (the
        # collector settled again after it) waits for a moment without input: a job printing
        # from its first instant is read first.
        with contextlib.suppress(OSError):
            os.nice(ANALYSER_NICE)

        def warm() -> None:
            warm_up(ruleset, sink)
            settle_collector()

        end = serve(0, live, warm=warm)
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


def serve(fd: int, live: LiveTriage, warm: Callable[[], None] | None = None) -> dict[str, Any]:
    """Read frames from ``fd`` into ``live`` until end of input; return the end frame.

    ``warm``: done once, at the first moment no input has come for :data:`WARM_AFTER_S`.
    """
    from nccl_triage.ingest.scan import Prescanned

    reader = FrameReader()
    end: dict[str, Any] = {"reason": "eof"}
    pre: Prescanned | None = None  # the scan of the next data frame, done by the pump
    while True:
        wait = live.tick()
        quiet = False  # whether this wait is the warm-up's
        if warm is not None and (wait is None or wait >= WARM_AFTER_S):
            wait, quiet = WARM_AFTER_S, True
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            if warm is not None and quiet:
                warm()
                warm = None
            continue
        chunk = os.read(fd, READ_SIZE)
        if not chunk:
            return end
        for kind, payload in reader.push(chunk):
            if kind == FRAME_DATA:
                live.feed(payload, pre)
                pre = None
            elif kind == FRAME_HITS:
                pre = Prescanned.decode(payload)
            elif kind == FRAME_GAP:
                pre = None
                nbytes, newlines = GAP.unpack_from(payload)
                live.skip(nbytes, newlines, payload[GAP.size :])
            elif kind == FRAME_END:
                end = json.loads(payload)
